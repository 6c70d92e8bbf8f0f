//! Reduce-scatter, allgather, broadcast and barrier (wire version 7) on the
//! deterministic simulator:
//! - each collective × element type with budget 0 is bit-exact against an
//!   independent reference (inputs of the type; a reduce-scatter's shard
//!   accumulated in `f32` in rank order and rounded once) and the oracle;
//! - under 1% and 10% loss with a budget, equal to the value recomputed from
//!   the delivery bitmaps and agreed masks, identical where every rank
//!   holds the same tensor; a broadcast with budget 0 is exact under 10% loss;
//! - a barrier holds every rank until the last one enters, also under loss;
//! - a peer that dies mid-collective ends it with an error within the hard
//!   timeout; ranks that disagree on the collective refuse each other's
//!   packets (counted) and fail;
//! - the traffic is each collective's: a reduce-scatter sends half an
//!   allreduce's DATA, a broadcast an allgather's and the root's scatter,
//!   its root about twice its tensor.

mod common;

use common::*;
use dlcp_proto::elem;
use dlcp_proto::endpoint::{
    Collective, DType, Event, Fill, OpId, OpOptions, OpReport, ReduceOp, StartError, shard_range,
};
use dlcp_proto::oracle;
use dlcp_proto::sim::NetConfig;
use dlcp_proto::time::Duration;

const SECOND: Duration = Duration::from_secs(1);
const ROOT: u32 = 2;

/// The collectives with a tensor, as options (broadcast from [`ROOT`]).
fn collectives() -> [OpOptions; 3] {
    [Collective::ReduceScatter, Collective::Allgather, Collective::Broadcast].map(|collective| OpOptions {
        collective,
        root: ROOT,
        ..opts(0)
    })
}

/// `o` with budget `ppm` on the phase its collective has.
fn with_budget(o: OpOptions, ppm: u32) -> OpOptions {
    match o.collective {
        Collective::Allgather | Collective::Broadcast => {
            OpOptions { budget_ppm: ppm, gather_budget_ppm: ppm, ..o }
        }
        _ => OpOptions { budget_ppm: ppm, gather_budget_ppm: 0, ..o },
    }
}

fn typed_inputs(seed: u64, world: u32, len: usize, dtype: DType) -> Vec<Vec<f32>> {
    let mut x = inputs(seed, world, len);
    x.iter_mut().for_each(|v| elem::round_all(dtype, v));
    x
}

/// What rank `r` must hold without loss, computed independently of the
/// oracle: reduce-scatter, its shard of the rank-order `f32` sum (divided
/// for an average) rounded once, zero elsewhere; allgather, every rank's
/// shard of its own input; broadcast, the root's input.
fn reference(x: &[Vec<f32>], o: OpOptions, r: u32) -> Vec<f32> {
    let (world, len) = (x.len() as u32, x[0].len());
    match o.collective {
        Collective::ReduceScatter => {
            let mut out = vec![0.0; len];
            for e in shard_range(len, world, r) {
                let mut acc = x[0][e];
                for xj in &x[1..] {
                    acc += xj[e];
                }
                if o.reduce == ReduceOp::Average {
                    acc /= world as f32;
                }
                out[e] = elem::round(o.dtype, acc);
            }
            out
        }
        Collective::Allgather => (0..len)
            .map(|e| x[(0..world).find(|&s| shard_range(len, world, s).contains(&e)).unwrap() as usize][e])
            .collect(),
        Collective::Broadcast => x[o.root as usize].clone(),
        c => panic!("no reference for {c:?}"),
    }
}

/// What rank `r` must hold, recomputed from the reports (the oracle).
fn oracle_for(x: &[Vec<f32>], res: &[(Vec<f32>, OpReport)], o: OpOptions, r: u32) -> Vec<f32> {
    let inputs: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
    let reports: Vec<_> = res.iter().map(|(_, rep)| rep).collect();
    let mut all = oracle::recompute(&inputs, &reports, o, CHUNK_BYTES / o.dtype.size());
    if o.collective == Collective::ReduceScatter {
        let own = shard_range(all.len(), x.len() as u32, r);
        all[..own.start].fill(0.0);
        all[own.end..].fill(0.0);
    }
    all
}

fn name(o: OpOptions) -> String {
    format!("{} {:?} {}", o.collective.name(), o.dtype, o.reduce.name())
}

#[test]
fn every_collective_and_dtype_is_bit_exact_with_budget_zero() {
    let mut cases = Vec::new();
    for base in collectives() {
        for dtype in DType::ALL {
            cases.push(OpOptions { dtype, ..base });
        }
    }
    cases.push(OpOptions { reduce: ReduceOp::Average, dtype: DType::Bf16, ..collectives()[0] });
    for (k, o) in cases.into_iter().enumerate() {
        let world = 4;
        let seed = 700 + k as u64;
        let mut c = Cluster::new(world, NetConfig::default().with_seed(seed));
        let x = typed_inputs(seed, world, 5_003, o.dtype);
        let res = all_ok(c.allreduce(OpId { run: 1, seq: 1, tensor: 3 }, &x, o, SECOND));
        for (r, (v, rep)) in res.iter().enumerate() {
            let r = r as u32;
            let want = reference(&x, o, r);
            assert!(bits(v) == bits(&want), "{}: rank {r} not bit-exact", name(o));
            assert!(bits(&oracle_for(&x, &res, o, r)) == bits(&want), "{}: oracle, rank {r}", name(o));
            let (scatter, gather) = (rep.scatter.len(), rep.gather.len());
            match o.collective {
                Collective::ReduceScatter => assert_eq!((scatter, gather), (3, 0), "{}", name(o)),
                Collective::Allgather => assert_eq!((scatter, gather), (0, 3), "{}", name(o)),
                // Broadcast: an owner hears the root, then every other owner (the root too).
                _ => assert_eq!((scatter, gather), if r == ROOT { (0, 3) } else { (1, 3) }, "{}", name(o)),
            }
        }
    }
}

#[test]
fn every_collective_under_loss_equals_the_recomputed_value() {
    for (k, base) in collectives().into_iter().enumerate() {
        for (loss, budget) in [(0.01, 10_000u32), (0.10, 100_000)] {
            for dtype in [DType::F32, DType::Bf16] {
                let world = 4;
                let seed = 800 + 10 * k as u64 + (loss * 100.0) as u64 + dtype as u64;
                let mut c = Cluster::new(world, NetConfig::default().with_seed(seed).with_loss(loss));
                let x = typed_inputs(seed, world, 20_000, dtype);
                let (fill, rescale) = if loss > 0.05 { (Fill::Local, true) } else { (Fill::Zero, false) };
                let o = OpOptions { dtype, fill, rescale, ..with_budget(base, budget) };
                let id = OpId { run: 1, seq: 2, tensor: 1 };
                let res = all_ok(c.allreduce(id, &x, o, SECOND * 5));
                for (r, (v, rep)) in res.iter().enumerate() {
                    let want = oracle_for(&x, &res, o, r as u32);
                    assert!(
                        bits(v) == bits(&want),
                        "{} loss {loss}: rank {r} differs from the oracle",
                        name(o)
                    );
                    for t in rep.scatter.iter().chain(&rep.gather) {
                        let f = t.delivered_fraction();
                        assert!(f >= 1.0 - f64::from(budget) / 1e6 - 1e-12, "{}: delivered {f}", name(o));
                    }
                }
                if o.collective != Collective::ReduceScatter {
                    assert_identical(&res);
                }
                let lost = dlcp_proto::sim::NetStats::total(&c.sim.stats().lost);
                assert!(lost > 0, "{} {loss}: nothing lost, the test proves nothing", name(o));
            }
        }
    }
}

/// Parameters are broadcast exactly by default: budget 0 under 10% loss.
#[test]
fn a_broadcast_with_budget_zero_is_exact_under_loss() {
    let world = 5;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(31).with_loss(0.10));
    let x = typed_inputs(31, world, 30_000, DType::F32);
    let o = collectives()[2];
    let res = all_ok(c.allreduce(OpId { run: 1, seq: 1, tensor: 0 }, &x, o, SECOND * 5));
    for (r, (v, _)) in res.iter().enumerate() {
        assert!(bits(v) == bits(&x[ROOT as usize]), "rank {r} does not hold the root's tensor");
    }
    assert!(dlcp_proto::sim::NetStats::total(&c.sim.stats().lost) > 0);
}

/// Start `id` as a barrier on `ranks` at the simulator's now.
fn enter_barrier(c: &mut Cluster, id: OpId, ranks: &[u32]) {
    let now = c.sim.now();
    let o = OpOptions { collective: Collective::Barrier, budget_ppm: 50_000, ..opts(0) };
    for &r in ranks {
        c.sim.node_mut(r).start_allreduce(now, id, Vec::new(), o).unwrap();
    }
}

fn completed(c: &mut Cluster, r: u32, id: OpId) -> bool {
    let mut done = false;
    while let Some(ev) = c.sim.node_mut(r).poll_event() {
        match ev {
            Event::OpComplete { id: i, .. } if i == id => done = true,
            Event::OpFailed { id: i, error } if i == id => panic!("rank {r}: barrier failed: {error}"),
            _ => {}
        }
    }
    done
}

#[test]
fn a_barrier_holds_every_rank_until_the_last_enters() {
    for loss in [0.0, 0.10] {
        let world = 4;
        let mut c = Cluster::new(world, NetConfig::default().with_seed(41).with_loss(loss));
        let id = OpId { run: 1, seq: 1, tensor: 0 };
        enter_barrier(&mut c, id, &[0, 1, 3]);
        let until = c.sim.now() + Duration::from_millis(50);
        c.sim.run_until(until, |_| false);
        for r in [0, 1, 3] {
            assert!(
                !completed(&mut c, r, id),
                "loss {loss}: rank {r} left the barrier before rank 2 entered"
            );
        }
        enter_barrier(&mut c, id, &[2]);
        c.run(SECOND * 5);
        for r in 0..world {
            assert!(completed(&mut c, r, id), "loss {loss}: rank {r} never left the barrier");
        }
    }
}

#[test]
fn a_peer_dying_mid_collective_ends_it_within_the_hard_timeout() {
    let hard = timers().hard_timeout;
    let barrier = OpOptions { collective: Collective::Barrier, ..opts(0) };
    for (k, o) in collectives().into_iter().chain([barrier]).enumerate() {
        let world = 4;
        let mut c = Cluster::new(world, NetConfig::default().with_seed(900 + k as u64));
        let x = typed_inputs(900 + k as u64, world, 20_000, DType::F32);
        let id = OpId { run: 1, seq: 1, tensor: 0 };
        let now = c.sim.now();
        // A barrier is over within microseconds: its rank 1 dies before it enters.
        let barrier = o.collective == Collective::Barrier;
        c.sim.set_silent(1, barrier);
        for r in (0..world).filter(|&r| !barrier || r != 1) {
            c.sim.node_mut(r).start_allreduce(now, id, x[r as usize].clone(), o).unwrap();
        }
        c.sim.run_until(now + Duration::from_micros(40), |_| false);
        // The dead rank is not the broadcast's root: the others wait on it for nothing but its answers.
        c.sim.set_silent(1, true);
        let t1 = c.sim.now();
        c.run(SECOND * 5);
        for r in [0u32, 2, 3] {
            let mut outcome = None;
            while let Some(ev) = c.sim.node_mut(r).poll_event() {
                match ev {
                    Event::OpFailed { id: i, .. } if i == id => outcome = Some(false),
                    Event::OpComplete { id: i, .. } if i == id => outcome = Some(true),
                    _ => {}
                }
            }
            // A broadcast rank that had all of the root's tensor may complete; no rank may hang.
            assert!(outcome.is_some(), "{}: rank {r} neither completed nor failed", name(o));
            if o.collective != Collective::Broadcast || r == ROOT {
                assert_eq!(outcome, Some(false), "{}: rank {r} completed without rank 1", name(o));
            }
        }
        let took = c.sim.now() - t1;
        assert!(took <= hard + Duration::from_millis(20), "{}: ended after {took:?}", name(o));
    }
}

/// Ranks that disagree on the collective: each refuses the other's packets
/// (counted as `op_kind_mismatch`) and the op fails on every rank.
#[test]
fn ranks_that_disagree_on_the_collective_refuse_each_other() {
    let world = 3;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(51));
    let x = typed_inputs(51, world, 3_000, DType::F32);
    let id = OpId { run: 1, seq: 1, tensor: 0 };
    let now = c.sim.now();
    for r in 0..world {
        let collective = if r == 1 { Collective::ReduceScatter } else { Collective::Allreduce };
        let o = OpOptions { collective, ..opts(0) };
        c.sim.node_mut(r).start_allreduce(now, id, x[r as usize].clone(), o).unwrap();
    }
    c.run(SECOND * 5);
    for r in 0..world {
        assert!(c.sim.node(r).stats().rejected.op_kind_mismatch > 0, "rank {r} refused nothing");
        let mut failed = false;
        while let Some(ev) = c.sim.node_mut(r).poll_event() {
            assert!(!matches!(ev, Event::OpComplete { .. }), "rank {r} completed a mixed op");
            failed |= matches!(ev, Event::OpFailed { id: i, .. } if i == id);
        }
        assert!(failed, "rank {r} did not fail the mixed op");
    }
}

#[test]
fn bad_roots_and_reductions_are_refused_at_start() {
    let mut c = Cluster::new(3, NetConfig::default().with_seed(1));
    let now = c.sim.now();
    let node = c.sim.node_mut(0);
    let id = |seq| OpId { run: 1, seq, tensor: 0 };
    let bcast = OpOptions { collective: Collective::Broadcast, root: 3, ..opts(0) };
    assert_eq!(
        node.start_allreduce(now, id(1), vec![1.0; 8], bcast),
        Err(StartError::BadRoot { root: 3, world: 3 })
    );
    for collective in [Collective::Allgather, Collective::Broadcast] {
        let o = OpOptions { collective, root: 0, reduce: ReduceOp::Average, ..opts(0) };
        assert_eq!(
            node.start_allreduce(now, id(2), vec![1.0; 8], o),
            Err(StartError::BadReduce { collective, reduce: ReduceOp::Average })
        );
    }
    // A barrier needs no tensor, whatever its other options say.
    let o = OpOptions {
        collective: Collective::Barrier,
        reduce: ReduceOp::Average,
        dtype: DType::Bf16,
        ..opts(0)
    };
    assert_eq!(node.start_allreduce(now, id(3), Vec::new(), o), Ok(()));
}

/// DATA datagrams every rank sent (every class but the control class, 7).
fn data_sent(c: &Cluster) -> Vec<u64> {
    (0..c.world).map(|r| c.sim.node(r).stats().tx_packets[..7].iter().sum()).collect()
}

#[test]
fn each_collective_sends_its_own_traffic() {
    let world = 4;
    let len = 64 * 1024;
    let run = |o: OpOptions| {
        let mut c = Cluster::new(world, NetConfig::default().with_seed(61));
        let x = typed_inputs(61, world, len, DType::F32);
        all_ok(c.allreduce(OpId { run: 1, seq: 1, tensor: 0 }, &x, o, SECOND));
        data_sent(&c)
    };
    let all: u64 = run(opts(0)).iter().sum();
    let rs: u64 = run(collectives()[0]).iter().sum();
    let ag: u64 = run(collectives()[1]).iter().sum();
    assert_eq!(all, rs + ag, "allreduce DATA {all} != reduce-scatter {rs} + allgather {ag}");
    assert_eq!(rs, ag);
    // A broadcast moves an allgather's DATA and the root's scatter of the
    // other shards; the root sends about twice its tensor, not N−1 times it.
    let bc = run(collectives()[2]);
    let shard_chunks = |s: u32| shard_range(len, world, s).len().div_ceil(CHUNK_ELEMS) as u64;
    let scatter: u64 = (0..world).filter(|&s| s != ROOT).map(shard_chunks).sum();
    assert_eq!(bc.iter().sum::<u64>(), ag + scatter, "broadcast DATA {bc:?}");
    let root = bc[ROOT as usize];
    assert_eq!(root, scatter + shard_chunks(ROOT) * u64::from(world - 1), "broadcast DATA {bc:?}");
    let chunks = len.div_ceil(CHUNK_ELEMS) as u64;
    assert!(root < 2 * chunks, "broadcast: the root sent {root} DATA for {chunks} chunks");
}
