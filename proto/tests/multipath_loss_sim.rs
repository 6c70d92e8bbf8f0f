//! Random loss over several paths of equal delay: a receiver that never saw
//! its senders' datagrams arrive late after a LAST or PROBE does not wait
//! for the ones it found missing (`dlcp_proto::flow`'s reordering window),
//! so an op costs about what it costs over one path. Waiting a probe
//! timeout for every DATA datagram really lost, as a receiver did before
//! the wait was measured, made every op on the 4-host testbed (16 paths,
//! 1% loss) ~30 times slower, and here too (seed 51: a median op of 62 ms
//! over 8 paths against 2.2 ms over one; 2.3 ms with the measured wait).

mod common;

use common::*;
use dlcp_proto::endpoint::OpOptions;
use dlcp_proto::sim::PathConfig;
use dlcp_proto::time::Duration;

const WORLD: u32 = 4;
const LEN: usize = 256 * 1024; // 1 MiB of f32 per rank
const OPS: u64 = 12;
/// Ops before the times are compared (the path weights settle).
const WARMUP: u64 = 2;

/// Median op time (µs, every rank's report) after the warm-up, `paths`
/// paths of equal delay, each losing 1% of what it carries, budget 1%.
fn median_op_us(paths: u16, seed: u64) -> f64 {
    let lossy = PathConfig { loss: 0.01, ..PathConfig::clean() };
    let mut c = Cluster::multipath(WORLD, vec![lossy; usize::from(paths)], seed);
    let o = OpOptions { budget_ppm: 10_000, gather_budget_ppm: 10_000, ..OpOptions::default() };
    let x = inputs(seed, WORLD, LEN);
    let mut times = Vec::new();
    for seq in 0..OPS {
        let out = c.checked_allreduce(seq, &x, o, Duration::from_secs(10));
        if seq >= WARMUP {
            times.extend(out.iter().map(|(_, r)| r.duration().as_secs_f64() * 1e6));
        }
    }
    let stats = c.sim.node(0).stats();
    assert_eq!(stats.deadline_closes, 0, "{paths} paths: no transfer closed by its deadline");
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

#[test]
fn random_loss_over_paths_of_equal_delay_costs_what_it_costs_over_one() {
    for seed in [51, 52] {
        let one = median_op_us(1, seed);
        let eight = median_op_us(8, seed);
        eprintln!("seed {seed}: median op {one:.0} µs over 1 path, {eight:.0} µs over 8 (1% loss each)");
        assert!(eight < one * 1.15, "seed {seed}: 8 paths {eight:.0} µs against 1 path {one:.0} µs");
    }
}
