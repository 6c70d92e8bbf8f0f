//! Allreduce of f32, f16 and bf16, by sum and by average (wire version 6),
//! on the deterministic simulator: every element type × reduction
//! - with budget 0 is bit-exact against an independent reference (inputs
//!   of the type, `f32` accumulation in rank order, a division for an
//!   average, one rounding to nearest even) and against the oracle;
//! - under 1% loss with a 1% budget equals the value recomputed from the
//!   owners' delivery bitmaps (and the oracle's), identical on every rank;
//! - under 10% loss with a 10% budget, local fill and rescaling, the same;
//! - ends in an error within the hard timeout when a peer dies mid-op.
//!
//! Also: a 2-byte type puts twice the elements in a chunk (half the
//! datagrams of f32), and a DATA of another dtype or reduction than its op's
//! is refused and counted.

mod common;

use common::*;
use dlcp_proto::elem;
use dlcp_proto::endpoint::{DType, Event, Fill, OpId, OpOptions, ReduceOp};
use dlcp_proto::oracle;
use dlcp_proto::sim::NetConfig;
use dlcp_proto::time::Duration;

const SECOND: Duration = Duration::from_secs(1);

/// Every (dtype, reduction) pair.
fn kinds() -> Vec<(DType, ReduceOp)> {
    DType::ALL.iter().flat_map(|&d| ReduceOp::ALL.map(|r| (d, r))).collect()
}

fn kind_opts(budget_ppm: u32, dtype: DType, reduce: ReduceOp) -> OpOptions {
    OpOptions { budget_ppm, dtype, reduce, ..opts(budget_ppm) }
}

/// Inputs of the type: the random tensors rounded to it.
fn typed_inputs(seed: u64, world: u32, len: usize, dtype: DType) -> Vec<Vec<f32>> {
    let mut x = inputs(seed, world, len);
    x.iter_mut().for_each(|v| elem::round_all(dtype, v));
    x
}

/// The independent reference without loss: element by element, the inputs
/// added in rank order in `f32`, divided by the world size for an average,
/// rounded once to the type.
fn reference(x: &[Vec<f32>], dtype: DType, reduce: ReduceOp) -> Vec<f32> {
    (0..x[0].len())
        .map(|e| {
            let mut acc = x[0][e];
            for xj in &x[1..] {
                acc += xj[e];
            }
            if reduce == ReduceOp::Average {
                acc /= x.len() as f32;
            }
            elem::round(dtype, acc)
        })
        .collect()
}

/// The oracle's value for a finished op.
fn oracle_of(x: &[Vec<f32>], res: &[(Vec<f32>, dlcp_proto::endpoint::OpReport)], o: OpOptions) -> Vec<f32> {
    let inputs: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
    let reports: Vec<_> = res.iter().map(|(_, r)| r).collect();
    oracle::recompute(&inputs, &reports, o, CHUNK_BYTES / o.dtype.size())
}

#[test]
fn every_dtype_and_reduction_is_bit_exact_with_budget_zero() {
    for (k, (dtype, reduce)) in kinds().into_iter().enumerate() {
        let world = 4;
        let mut c = Cluster::new(world, NetConfig::default().with_seed(100 + k as u64));
        let x = typed_inputs(100 + k as u64, world, 5_003, dtype);
        let o = kind_opts(0, dtype, reduce);
        let res = all_ok(c.allreduce(OpId { run: 1, seq: 1, tensor: 4 }, &x, o, SECOND));
        let want = reference(&x, dtype, reduce);
        // Every value is of the type, and at least some differ from the f32 result (the rounding acts).
        assert!(want.iter().all(|&v| elem::round(dtype, v).to_bits() == v.to_bits()));
        if dtype != DType::F32 {
            let wide = reference(&x, DType::F32, reduce);
            assert!(want.iter().zip(&wide).any(|(a, b)| a != b), "{dtype:?}: rounding changed nothing");
        }
        assert_eq!(bits(&oracle_of(&x, &res, o)), bits(&want), "{dtype:?} {reduce:?}: oracle");
        for (r, (v, _)) in res.iter().enumerate() {
            assert!(bits(v) == bits(&want), "{dtype:?} {reduce:?}: rank {r} not bit-exact");
        }
        // Inputs that are not values of the type are rounded first: the same result.
        let raw = inputs(100 + k as u64, world, 5_003);
        let mut c = Cluster::new(world, NetConfig::default().with_seed(200 + k as u64));
        let res = all_ok(c.allreduce(OpId { run: 1, seq: 2, tensor: 4 }, &raw, o, SECOND));
        assert!(res.iter().all(|(v, _)| bits(v) == bits(&want)), "{dtype:?} {reduce:?}: raw inputs");
    }
}

#[test]
fn every_dtype_and_reduction_under_loss_equals_the_recomputed_value() {
    for (k, (dtype, reduce)) in kinds().into_iter().enumerate() {
        for (loss, budget) in [(0.01, 10_000u32), (0.10, 100_000)] {
            let world = 4;
            let seed = 300 + k as u64 + (loss * 1000.0) as u64;
            let mut c = Cluster::new(world, NetConfig::default().with_seed(seed).with_loss(loss));
            let x = typed_inputs(seed, world, 20_000, dtype);
            // The 10% case fills what is lost with the owner's own value and
            // rescales by the delivered count (in f32, before the one rounding).
            let (fill, rescale) = if loss > 0.05 { (Fill::Local, true) } else { (Fill::Zero, false) };
            let o = OpOptions { fill, rescale, ..kind_opts(budget, dtype, reduce) };
            let id = OpId { run: 1, seq: 3, tensor: 1 };
            let res = all_ok(c.allreduce(id, &x, o, SECOND * 5));
            check_lossy(&c, id, &x, o, &res);
            assert_eq!(bits(&oracle_of(&x, &res, o)), bits(&res[0].0), "{dtype:?} {reduce:?} {loss}: oracle");
            let lost = dlcp_proto::sim::NetStats::total(&c.sim.stats().lost);
            assert!(lost > 0, "{dtype:?} {reduce:?} {loss}: nothing lost, the test proves nothing");
        }
    }
}

#[test]
fn a_peer_dying_mid_op_ends_every_dtype_within_the_hard_timeout() {
    let hard = timers().hard_timeout;
    for (k, (dtype, reduce)) in kinds().into_iter().enumerate() {
        let world = 4;
        let mut c = Cluster::new(world, NetConfig::default().with_seed(500 + k as u64));
        let x = typed_inputs(500 + k as u64, world, 20_000, dtype);
        let id = OpId { run: 1, seq: 1, tensor: 0 };
        let now = c.sim.now();
        for r in 0..world {
            let o = kind_opts(10_000, dtype, reduce);
            c.sim.node_mut(r).start_allreduce(now, id, x[r as usize].clone(), o).unwrap();
        }
        c.sim.run_until(now + Duration::from_micros(40), |_| false);
        c.sim.set_silent(2, true);
        let t1 = c.sim.now();
        c.run(SECOND * 5);
        for r in [0u32, 1, 3] {
            let mut failed = false;
            while let Some(ev) = c.sim.node_mut(r).poll_event() {
                failed |= matches!(ev, Event::OpFailed { id: i, .. } if i == id);
            }
            assert!(failed, "{dtype:?} {reduce:?}: rank {r} did not fail the op rank 2 abandoned");
        }
        let took = c.sim.now() - t1;
        assert!(took <= hard + Duration::from_millis(20), "{dtype:?} {reduce:?}: ended after {took:?}");
    }
}

/// A 2-byte type puts twice the elements in a chunk: the same tensor takes
/// about half the DATA datagrams of f32.
#[test]
fn two_byte_types_send_half_the_datagrams() {
    let world = 4;
    let count = |dtype: DType| {
        let mut c = Cluster::new(world, NetConfig::default().with_seed(7));
        let x = typed_inputs(7, world, 64 * 1024, dtype);
        all_ok(c.allreduce(
            OpId { run: 1, seq: 1, tensor: 0 },
            &x,
            kind_opts(0, dtype, ReduceOp::Sum),
            SECOND,
        ));
        (0..world).map(|r| c.sim.node(r).stats().tx_packets[..7].iter().sum::<u64>()).sum::<u64>()
    };
    let (f32s, f16s, bf16s) = (count(DType::F32), count(DType::F16), count(DType::Bf16));
    assert_eq!(f16s, bf16s);
    assert_eq!(f32s, 2 * f16s, "f32 {f32s} DATA datagrams, f16 {f16s}");
}

/// Ranks whose trainers disagree on the dtype or the reduction: the DATA of
/// the other kind is refused and counted (`op_kind_mismatch`), never read as
/// the wrong format, and the op fails by the hard timeout.
#[test]
fn data_of_another_dtype_or_reduction_is_refused_and_counted() {
    for (odd_dtype, odd_reduce) in [(DType::Bf16, ReduceOp::Sum), (DType::F32, ReduceOp::Average)] {
        let world = 3;
        let mut c = Cluster::new(world, NetConfig::default().with_seed(9));
        let x = typed_inputs(9, world, 3_000, DType::Bf16);
        let id = OpId { run: 1, seq: 1, tensor: 0 };
        let now = c.sim.now();
        for r in 0..world {
            let o = if r == 1 {
                kind_opts(0, odd_dtype, odd_reduce)
            } else {
                kind_opts(0, DType::F32, ReduceOp::Sum)
            };
            c.sim.node_mut(r).start_allreduce(now, id, x[r as usize].clone(), o).unwrap();
        }
        c.run(SECOND * 5);
        for r in 0..world {
            let refused = c.sim.node(r).stats().rejected.op_kind_mismatch;
            assert!(refused > 0, "{odd_dtype:?} {odd_reduce:?}: rank {r} refused nothing");
            let mut failed = false;
            while let Some(ev) = c.sim.node_mut(r).poll_event() {
                assert!(!matches!(ev, Event::OpComplete { .. }), "rank {r} completed a mixed op");
                failed |= matches!(ev, Event::OpFailed { id: i, .. } if i == id);
            }
            assert!(failed, "rank {r} did not fail the mixed op");
        }
    }
}
