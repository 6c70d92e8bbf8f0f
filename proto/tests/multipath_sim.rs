//! Per-packet spraying over many paths ([`dlcp_proto::paths`]) in the
//! simulator's per-path network ([`NetConfig::paths`]): a lossy path is
//! steered away from while results stay exact (budget 0) or bounded (budget
//! 1%), and paths of different delays — which reorder a transfer's datagrams
//! and let a PROBE overtake its data — cost no exactness and no deadline
//! closure.

mod common;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use common::*;
use dlcp_proto::endpoint::OpOptions;
use dlcp_proto::sim::{PathConfig, TraceEvent};
use dlcp_proto::time::Duration;
use dlcp_proto::wire::{Packet, PacketType};

const WORLD: u32 = 4;
const LEN: usize = 256 * 1024; // 1 MiB of f32 per rank
const PATHS: u16 = 8;
const BAD: usize = 5;
/// Ops before the bad path's share is measured: the warm-up.
const WARMUP: u64 = 5;
const OPS: u64 = 20;

fn cluster(paths: Vec<PathConfig>, seed: u64) -> Cluster {
    assert_eq!(paths.len(), usize::from(PATHS));
    Cluster::multipath(WORLD, paths, seed)
}

/// DATA datagrams offered on each path so far.
fn data_per_path(c: &Cluster) -> Vec<u64> {
    c.sim.stats().paths.iter().map(|p| p.offered[..7].iter().sum()).collect()
}

/// Run `OPS` ops under `o` on 8 paths of which path `BAD` drops 20%: every
/// result is what the oracle computes from the delivery reports, and the bad
/// path's share of the DATA sent after the warm-up. Returns that share and
/// the smallest delivered fraction of any transfer.
fn lossy_path_run(o: OpOptions, seed: u64) -> (f64, f64) {
    let mut paths = vec![PathConfig::clean(); usize::from(PATHS)];
    paths[BAD].loss = 0.2;
    let mut c = cluster(paths, seed);
    let x = inputs(seed, WORLD, LEN);
    let lost_per_path = |c: &Cluster| -> Vec<u64> {
        (0..usize::from(PATHS))
            .map(|p| (0..WORLD).map(|r| c.sim.node(r).stats().lost_path[p]).sum())
            .collect()
    };
    let mut before = Vec::new();
    let mut lost_before = Vec::new();
    let mut min_frac = 1.0f64;
    for seq in 0..OPS {
        if seq == WARMUP {
            before = data_per_path(&c);
            lost_before = lost_per_path(&c);
        }
        let out = c.checked_allreduce(seq, &x, o, Duration::from_secs(10));
        if o.budget_ppm == 0 {
            assert!(bits(&out[0].0) == bits(&reference_sum(&x)), "op {seq}: exact under budget 0");
        }
        for (_, rep) in &out {
            for t in rep.scatter.iter().chain(&rep.gather) {
                min_frac = min_frac.min(t.delivered_fraction());
            }
        }
    }
    let after = data_per_path(&c);
    let sent: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let total: u64 = sent.iter().sum();
    let share = sent[BAD] as f64 / total as f64;
    // The endpoints' own per-path counters saw the losses on the bad path:
    // ten times those of any healthy path. In the first ops a receiver has
    // not yet measured how late a datagram sent before a LAST can come
    // (`flow::arrivals`), NACKs some that are only stuck behind higher
    // classes at its port, and their healthy paths are blamed (seed 42,
    // budget 1%: 37 chunks over the 7 healthy paths, at most 8 on one,
    // against 327 on the bad path); after the warm-up, next to none.
    let lost = lost_per_path(&c);
    let lost_late: Vec<u64> = lost.iter().zip(&lost_before).map(|(a, b)| a - b).collect();
    let weights: Vec<u64> = (0..usize::from(PATHS)).map(|p| c.sim.node(0).stats().path_weight[p]).collect();
    eprintln!("DATA per path after op {WARMUP}: {sent:?}; share of path {BAD}: {share:.4}");
    eprintln!(
        "chunks reported lost per path: {lost:?} ({lost_late:?} after op {WARMUP}); rank 0's lowest weights: {weights:?}"
    );
    let healthy = |v: &[u64]| v.iter().enumerate().filter(|p| p.0 != BAD).map(|p| *p.1).collect::<Vec<u64>>();
    assert!(
        lost[BAD] > 0 && healthy(&lost).iter().all(|&n| lost[BAD] > 10 * n),
        "the bad path's losses stand out from every healthy path's: {lost:?}"
    );
    assert!(
        healthy(&lost_late).iter().sum::<u64>() <= 2,
        "healthy paths blamed after the warm-up: {lost_late:?}"
    );
    for (p, &n) in sent.iter().enumerate().filter(|p| p.0 != BAD) {
        assert!(n as f64 > 0.10 * total as f64, "healthy path {p} carries its share: {sent:?}");
    }
    (share, min_frac)
}

#[test]
fn a_lossy_path_is_steered_away_from_and_results_stay_exact() {
    let (share, _) = lossy_path_run(opts(0), 41);
    assert!(share < 0.05, "the bad path's share of DATA after the warm-up: {share:.4}");
}

#[test]
fn a_lossy_path_is_steered_away_from_within_a_one_percent_budget() {
    let o = OpOptions { budget_ppm: 10_000, gather_budget_ppm: 10_000, ..OpOptions::default() };
    let (share, min_frac) = lossy_path_run(o, 42);
    assert!(min_frac >= 0.99, "every transfer within its 1% budget: {min_frac}");
    assert!(share < 0.05, "the bad path's share of DATA after the warm-up: {share:.4}");
}

/// Run `LONG_OPS` ops with budget 1% on paths of which the upper half lose
/// `lossy` and the others `clean`: every result the oracle's, every transfer
/// within budget. Returns the lossy half's share of the DATA from op `FROM`.
fn lossy_half_share(lossy: f64, clean: f64, seed: u64, len: usize, ops: u64) -> f64 {
    let (long_ops, from) = (ops, ops * 7 / 12);
    let paths: Vec<PathConfig> = (0..PATHS)
        .map(|p| PathConfig { loss: if p >= PATHS / 2 { lossy } else { clean }, ..PathConfig::clean() })
        .collect();
    let mut c = cluster(paths, seed);
    let x = inputs(seed, WORLD, len);
    let o = OpOptions { budget_ppm: 10_000, gather_budget_ppm: 10_000, ..OpOptions::default() };
    let mut before = Vec::new();
    for seq in 0..long_ops {
        if seq == from {
            before = data_per_path(&c);
        }
        let out = c.checked_allreduce(seq, &x, o, Duration::from_secs(10));
        for (_, rep) in &out {
            for t in rep.scatter.iter().chain(&rep.gather) {
                assert!(t.delivered_fraction() >= 0.99, "op {seq}: within the budget");
            }
        }
    }
    let after = data_per_path(&c);
    let sent: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let lossy: u64 = sent[usize::from(PATHS / 2)..].iter().sum();
    let share = lossy as f64 / sent.iter().sum::<u64>() as f64;
    eprintln!("DATA per path from op {from}: {sent:?}; the lossy half's share {share:.3}");
    let h = c.sim.node(0).path_health(1);
    eprintln!(
        "rank 0 -> 1 verdicts per path per op: {:?}; weights {:?}; cuts {:?}; long loss {:?}",
        h.iter().map(|x| x.verdicts / long_ops).collect::<Vec<_>>(),
        h.iter().map(|x| x.weight).collect::<Vec<_>>(),
        h.iter().map(|x| x.cuts).collect::<Vec<_>>(),
        h.iter().map(|x| (x.long_rate * 1e4).round() / 100.0).collect::<Vec<_>>()
    );
    share
}

/// Half the paths lose 2%, the other half 1% (a spine with 1% random loss,
/// and every link losing a little besides): a difference the short window
/// cannot see; the long window moves the DATA off the lossy half, and every
/// transfer stays within its 1% budget.
#[test]
fn a_lossy_half_of_the_paths_is_steered_away_from_by_the_long_window() {
    let share = lossy_half_share(0.02, 0.01, 44, LEN, 60);
    assert!(share < 0.2, "the lossy half carries under a fifth: {share:.3}");
}

/// The same with the losses under the budget (1.2% and 0.2%: 0.7% on
/// average, as on the leaf–spine testbed with one spine at 1%): receivers
/// close most transfers within budget, and the verdicts must still come.
#[test]
fn a_lossy_half_is_steered_away_from_while_losses_stay_within_budget() {
    let share = lossy_half_share(0.012, 0.002, 45, 16 * LEN, 24);
    assert!(share < 0.2, "the lossy half carries under a fifth: {share:.3}");
}

/// Transfer key of a DATA or PROBE datagram: (op, tensor, phase, src, dst).
type Key = (u64, u32, u8, u32, u32);

#[derive(Default)]
struct Order {
    /// Per transfer: DATA sent, DATA delivered.
    data: BTreeMap<Key, (u64, u64)>,
    /// PROBEs in flight: DATA of its transfer sent before it.
    probes: BTreeMap<(Key, u64), u64>,
    /// PROBEs delivered while DATA sent before them was still in flight.
    overtaken: u64,
}

#[test]
fn paths_of_different_delays_reorder_without_harm() {
    // Four paths 0, 30, 60 and 90 µs longer than the shortest: a transfer's
    // datagrams arrive reordered, and a PROBE on a short path overtakes DATA
    // on a long one. A little random loss (0.2%) makes the senders send a
    // PROBE right behind their LAST DATA (the loss meter): with flowlets of
    // 16 datagrams and no loss, flow control no longer mistakes the
    // reordering for loss runs, nothing is lost, and no PROBE goes out
    // before its transfer's data has landed.
    let paths = (0..u64::from(PATHS))
        .map(|i| PathConfig {
            delay: Duration::from_micros(30 * (i % 4)),
            loss: 0.002,
            ..PathConfig::clean()
        })
        .collect();
    let mut c = cluster(paths, 43);
    let order = Rc::new(RefCell::new(Order::default()));
    let o2 = order.clone();
    c.sim.set_trace(Some(Box::new(move |rec| {
        let Ok(p) = Packet::new_checked(rec.datagram) else { return };
        let ty = p.raw_type();
        let key = (p.op(), p.tensor(), p.raw_phase(), p.src(), p.dst());
        let mut o = o2.borrow_mut();
        let o = &mut *o;
        match (rec.event, ty) {
            (TraceEvent::Sent, t) if t == PacketType::Data as u8 => o.data.entry(key).or_default().0 += 1,
            (TraceEvent::Delivered, t) if t == PacketType::Data as u8 => {
                o.data.entry(key).or_default().1 += 1
            }
            (TraceEvent::Sent, t) if t == PacketType::Probe as u8 => {
                let sent = o.data.get(&key).map_or(0, |d| d.0);
                o.probes.insert((key, p.packet()), sent);
            }
            (TraceEvent::Delivered, t) if t == PacketType::Probe as u8 => {
                let sent = o.probes.remove(&(key, p.packet())).unwrap_or(0);
                if o.data.get(&key).map_or(0, |d| d.1) < sent {
                    o.overtaken += 1;
                }
            }
            _ => {}
        }
    })));
    let x = inputs(43, WORLD, LEN);
    for (seq, budget) in (0..10).zip([0, 10_000].into_iter().cycle()) {
        let o = OpOptions { budget_ppm: budget, gather_budget_ppm: budget, ..OpOptions::default() };
        let out = c.checked_allreduce(seq, &x, o, Duration::from_secs(10));
        let masked: u32 = out.iter().map(|(_, r)| r.own_mask.count_ones()).sum();
        let partial =
            out.iter().flat_map(|(_, r)| r.scatter.iter()).filter(|t| t.delivered_fraction() < 1.0).count();
        let w: Vec<u64> = c.sim.node(0).stats().path_weight.clone();
        eprintln!("op {seq}: masked {masked}, partial scatter transfers {partial}, weights {w:?}");
        if budget == 0 {
            assert!(bits(&out[0].0) == bits(&reference_sum(&x)), "op {seq}: exact");
        }
    }
    let st = |f: fn(&dlcp_proto::endpoint::Stats) -> u64| -> u64 {
        (0..WORLD).map(|r| f(c.sim.node(r).stats())).sum()
    };
    let overtaken = order.borrow().overtaken;
    let (closes, timeouts, repairs) =
        (st(|s| s.deadline_closes), st(|s| s.hard_timeouts), st(|s| s.repairs_sent));
    let cuts = st(|s| s.flow_window_cuts);
    let drops: u64 = c.sim.stats().switch_drops.iter().sum();
    eprintln!(
        "PROBEs that overtook their data: {overtaken}; repairs {repairs} (switch queue drops {drops}); \
         deadline closes {closes}; flow-control window cuts {cuts}"
    );
    assert!(overtaken > 0, "the paths' delays let PROBEs overtake their data");
    assert_eq!((closes, timeouts), (0, 0), "no spurious deadline closure");
}
