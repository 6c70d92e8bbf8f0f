//! Snapshot of completion time and delivered fraction over a loss × budget grid
//! (smoltcp-style netsim table). The simulation is deterministic, so the table
//! is exact; a change in protocol behaviour shows up as a diff to review.
//! Regenerate with `DLCP_UPDATE_SNAPSHOTS=1 cargo test -p dlcp-proto --test loss_grid`.

mod common;

use common::*;
use dlcp_proto::endpoint::{Event, OpId, OpOptions};
use dlcp_proto::sim::NetConfig;
use dlcp_proto::time::Duration;
use std::fmt::Write;

const WORLD: u32 = 4;
const LEN: usize = 256 * 1024; // 1 MiB of f32
const OPS: u64 = 5;

fn run_cell(loss: f64, budget_ppm: u32) -> String {
    let seed = 1000 + (loss * 1000.0) as u64 * 7 + u64::from(budget_ppm);
    let cfgs = (0..WORLD)
        .map(|r| {
            let mut c = endpoint_config(r, WORLD, 1);
            c.chunk_bytes = 1392;
            c.timers.hard_timeout = Duration::from_secs(2);
            c
        })
        .collect();
    let mut c = Cluster::with_configs(NetConfig::default().with_seed(seed).with_loss(loss), cfgs);
    let mut times = Vec::new();
    let (mut min_frac, mut sum_frac, mut n_frac) = (1.0f64, 0.0f64, 0u32);
    let mut failed = 0;
    let x = inputs(seed, WORLD, LEN);
    for seq in 0..OPS {
        let o = OpOptions { budget_ppm, ..OpOptions::default() };
        let out = c.allreduce(OpId { run: 1, seq, tensor: 0 }, &x, o, Duration::from_secs(10));
        for r in out {
            match r {
                Ok((_, rep)) => {
                    times.push(rep.duration());
                    for t in rep.scatter.iter().chain(&rep.gather) {
                        min_frac = min_frac.min(t.delivered_fraction());
                        sum_frac += t.delivered_fraction();
                        n_frac += 1;
                    }
                }
                Err(_) => failed += 1,
            }
        }
    }
    let _ = Event::PeerDown { rank: 0 };
    times.sort();
    let p50 = times.get(times.len() / 2).copied().unwrap_or_default();
    let max = times.last().copied().unwrap_or_default();
    let st = |f: fn(&dlcp_proto::endpoint::Stats) -> u64| -> u64 {
        (0..WORLD).map(|r| f(c.sim.node(r).stats())).sum()
    };
    let repairs = st(|s| s.repairs_sent);
    let deadlines = st(|s| s.deadlines_fired);
    let switch_drops: u64 = c.sim.stats().switch_drops.iter().sum();
    let data_sent: u64 = (0..WORLD).map(|r| c.sim.node(r).stats().tx_packets[..7].iter().sum::<u64>()).sum();
    format!(
        "| {:>5.1}% | {:>4.1}% | {:>9.1} | {:>9.1} | {:>8.4} | {:>8.4} | {:>7} | {:>6.2}% | {:>6} | {:>9} | {:>6} |",
        loss * 100.0,
        f64::from(budget_ppm) / 1e4,
        p50.as_secs_f64() * 1e6,
        max.as_secs_f64() * 1e6,
        min_frac,
        sum_frac / f64::from(n_frac.max(1)),
        repairs,
        100.0 * repairs as f64 / data_sent.max(1) as f64,
        switch_drops,
        deadlines,
        failed,
    )
}

#[test]
fn loss_budget_grid_snapshot() {
    let mut table = String::new();
    writeln!(table, "# Loss × budget grid (deterministic simulation)\n").unwrap();
    writeln!(
        table,
        "{WORLD} ranks, 1 MiB f32 allreduce, 1392-byte chunks, 10 Gbit/s links, 5 µs hops, {OPS} ops per cell \
         (times are virtual, per rank and op; fractions per transfer; gather budget 0). \
         `loss` is random loss; `switch drops` are packets the simulated switch's 256-packet \
         priority queues dropped under incast (congestion loss, which the budget also absorbs).\n"
    )
    .unwrap();
    writeln!(
        table,
        "| loss | budget | p50 µs | max µs | min delivered | mean delivered | repairs | repair % | switch drops | deadlines | failed |"
    )
    .unwrap();
    writeln!(table, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|").unwrap();
    for loss in [0.0, 0.001, 0.01, 0.05, 0.10, 0.30] {
        for budget in [0u32, 10_000, 50_000] {
            writeln!(table, "{}", run_cell(loss, budget)).unwrap();
        }
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots/loss_grid.md");
    if std::env::var_os("DLCP_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(path, &table).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed != table {
        let new = format!("{path}.new");
        std::fs::write(&new, &table).unwrap();
        panic!(
            "loss grid differs from {path}; review {new} and rerun with DLCP_UPDATE_SNAPSHOTS=1 to accept:\n{table}"
        );
    }
}
