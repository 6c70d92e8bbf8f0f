//! A late trainer, simulated: one rank starts an op long before the others
//! (their trainers busy: rank 0 evaluating, a checkpoint). The ranks it waits
//! on are up (heartbeats) but have sent nothing of the op, so the hard timeout
//! does not fail it: it waits for them up to the op deadline, and completes
//! exactly when they come, although the early datagrams it sent them expired
//! meanwhile (repaired on their PROBE). Without an op deadline, a late rank is
//! judged by the hard timeout as before; a late rank that goes down fails the
//! op within about two peer timeouts, and so does one whose run ended; ranks
//! that never come fail it at the op deadline; ranks that sent nothing of the
//! run yet are not late (the first op of a run is judged as before). (Found in the time-to-accuracy grid: rank 2 failed op 374 after
//! 10 s "waiting on ranks [0, 1, 3]", which started it 13 s late.)

mod common;

use common::*;
use dlcp_proto::endpoint::{Event, OpError, OpId};
use dlcp_proto::sim::NetConfig;
use dlcp_proto::time::{Duration, Instant};

const MS: Duration = Duration::from_millis(1);
const WORLD: u32 = 4;
const LEN: usize = 6_000;

/// Four ranks, hard timeout 200 ms (common timers), op deadline `deadline`,
/// their run agreed and no op run yet.
fn fresh(seed: u64, deadline: Duration) -> Cluster {
    let cfgs = (0..WORLD)
        .map(|r| {
            let mut c = endpoint_config(r, WORLD, 1);
            c.timers.op_deadline = deadline;
            c
        })
        .collect();
    Cluster::with_configs(NetConfig::default().with_seed(seed), cfgs)
}

/// [`fresh`], then op 1 run by all (so every rank has heard every other in an op).
fn cluster(seed: u64, deadline: Duration) -> Cluster {
    let mut c = fresh(seed, deadline);
    c.checked_allreduce(1, &inputs(seed, WORLD, LEN), opts(0), MS * 500);
    c
}

/// Rank 2 alone starts op `seq` (of run 1) with inputs drawn from `seed`:
/// the inputs, the op, and when it started.
fn rank_2_starts(c: &mut Cluster, seq: u64, seed: u64) -> (Vec<Vec<f32>>, OpId, Instant) {
    let x = inputs(seed, WORLD, LEN);
    let id = OpId { run: 1, seq, tensor: 0 };
    start(c, &[2], id, &x);
    (x, id, c.sim.now())
}

/// `ops` is exactly op `id` failed by the hard timeout, waiting on [0, 1, 3].
fn assert_timed_out_on_the_others(ops: &Outcomes, id: OpId) {
    match &ops[..] {
        [(i, Err(OpError::Timeout { waiting_on, .. }))] if *i == id => assert_eq!(waiting_on, &[0, 1, 3]),
        other => panic!("{other:?}"),
    }
}

/// Every op event of rank `r` so far: `(id, Ok(result) | Err(error))`, and
/// the `OpAwaitsLate` events (op, ranks).
type Outcomes = Vec<(OpId, Result<Vec<f32>, OpError>)>;
fn events(c: &mut Cluster, r: u32) -> (Outcomes, Vec<(OpId, Vec<u32>)>) {
    let (mut ops, mut late) = (Vec::new(), Vec::new());
    while let Some(e) = c.sim.node_mut(r).poll_event() {
        match e {
            Event::OpComplete { id, result, .. } => ops.push((id, Ok(result))),
            Event::OpFailed { id, error } => ops.push((id, Err(error))),
            Event::OpAwaitsLate { id, ranks } => late.push((id, ranks)),
            _ => {}
        }
    }
    (ops, late)
}

/// Start op `id` on `ranks` at the current virtual time.
fn start(c: &mut Cluster, ranks: &[u32], id: OpId, x: &[Vec<f32>]) {
    let now = c.sim.now();
    for &r in ranks {
        c.sim.node_mut(r).start_allreduce(now, id, x[r as usize].clone(), opts(0)).unwrap();
    }
}

/// Rank 2 starts op 2; ranks 0, 1 and 3 start it 700 ms later (3.5 hard
/// timeouts; rank 2's early datagrams to them expire after one). Rank 2
/// waits (one `OpAwaitsLate` naming [0, 1, 3], counted once), no hard
/// timeout fires anywhere, and every rank ends with the exact sum.
#[test]
fn a_rank_waits_for_late_ranks_and_the_op_completes_exactly() {
    let mut c = cluster(31, Duration::from_secs(3));
    let (x, id, t0) = rank_2_starts(&mut c, 2, 32);
    c.sim.run_to(t0 + MS * 700);
    assert_eq!(c.sim.node(2).ops_in_flight(), 1, "rank 2 still waits");
    start(&mut c, &[0, 1, 3], id, &x);
    c.run(MS * 1_000);
    let sum = reference_sum(&x);
    for r in 0..WORLD {
        let (ops, late) = events(&mut c, r);
        assert_eq!(ops.len(), 1, "rank {r}: {ops:?}");
        let (got, res) = &ops[0];
        assert_eq!(*got, id);
        let res = res.as_ref().unwrap_or_else(|e| panic!("rank {r} failed the op: {e}"));
        assert_eq!(bits(res), bits(&sum), "rank {r}: the exact sum");
        let s = c.sim.node(r).stats();
        assert_eq!(s.hard_timeouts, 0, "rank {r}");
        if r == 2 {
            assert_eq!(late, [(id, vec![0, 1, 3])]);
            assert_eq!(s.late_rank_waits, 1);
        } else {
            assert!(late.is_empty(), "rank {r}: {late:?}");
            assert_eq!(s.late_rank_waits, 0, "rank {r}");
        }
    }
    let expired: u64 = (0..WORLD).map(|r| c.sim.node(r).stats().rejected.early_expired).sum();
    assert!(expired > 0, "rank 2's early datagrams should have expired at the late ranks");
}

/// With no op deadline the hard timeout judges a late rank as any other:
/// rank 2 fails op 2 at 200 ms, waiting on [0, 1, 3] (as before the wait).
#[test]
fn without_an_op_deadline_late_ranks_fail_the_op_at_the_hard_timeout() {
    let mut c = cluster(33, Duration::ZERO);
    let (_, id, t0) = rank_2_starts(&mut c, 2, 34);
    c.sim.run_until(t0 + MS * 400, |s| s.node(2).ops_in_flight() == 0);
    let took = c.sim.now() - t0;
    assert!(took >= MS * 200 && took < MS * 201, "failed after {took:?}");
    let (ops, late) = events(&mut c, 2);
    assert!(late.is_empty());
    assert_timed_out_on_the_others(&ops, id);
    assert_eq!(c.sim.node(2).stats().late_rank_waits, 0);
}

/// A late rank that goes down (rank 3, silent from 300 ms) no longer holds
/// the op: rank 2 fails it with `Timeout` within two peer timeouts (150 ms
/// each) of that, long before the 3 s op deadline. And ranks that stay up and
/// never start an op are waited for until the op deadline, then fail it.
#[test]
fn a_late_rank_that_goes_down_fails_the_op_and_the_op_deadline_bounds_the_wait() {
    let mut c = cluster(35, Duration::from_secs(3));
    let (x, id, t0) = rank_2_starts(&mut c, 2, 36);
    c.sim.run_to(t0 + MS * 300);
    c.sim.set_silent(3, true);
    c.sim.run_until(t0 + MS * 3_000, |s| s.node(2).ops_in_flight() == 0);
    let took = c.sim.now() - t0;
    assert!(took <= MS * 300 + MS * 300 + MS, "failed after {took:?}");
    let (ops, late) = events(&mut c, 2);
    assert_eq!(late, [(id, vec![0, 1, 3])]);
    assert_timed_out_on_the_others(&ops, id);

    // Rank 3 comes back; ranks 0, 1 and 3 stay up and never start op 3:
    // rank 2 fails it at the op deadline.
    c.sim.set_silent(3, false);
    let t = c.sim.now();
    c.sim.run_until(t + MS * 500, |s| {
        s.node(2).ops_in_flight() == 0 && (0..WORLD).all(|r| s.node(r).ops_in_flight() == 0)
    });
    for r in 0..WORLD {
        events(&mut c, r);
    }
    let id = OpId { run: 1, seq: 3, tensor: 0 };
    start(&mut c, &[2], id, &x);
    let t1 = c.sim.now();
    let deadline = Duration::from_secs(3);
    c.sim.run_until(t1 + deadline + MS * 100, |s| s.node(2).ops_in_flight() == 0);
    let took = c.sim.now() - t1;
    let (ops, late) = events(&mut c, 2);
    assert_eq!(late.len(), 1, "{late:?}");
    match &ops[..] {
        [(i, Err(OpError::Deadline { .. }))] if *i == id => {}
        other => panic!("{other:?}"),
    }
    assert!(took >= deadline && took < deadline + MS, "failed after {took:?}");
}

/// A rank that will never start an op (a trainer of its host left before
/// it) abandons it: the ranks waiting for it are told when they next ask (a
/// failing DONE answers their DATA or PROBE) and fail it at once with
/// `PeerFailed`, instead of taking it for a late rank until the op deadline.
#[test]
fn an_abandoned_op_is_failed_at_once_by_the_ranks_that_ask() {
    let mut c = cluster(37, Duration::from_secs(3));
    let x = inputs(38, WORLD, LEN);
    let id = OpId { run: 1, seq: 2, tensor: 0 };
    start(&mut c, &[0, 1, 2], id, &x);
    let t0 = c.sim.now();
    c.sim.node_mut(3).abandon(t0, id, &opts(0));
    c.sim.run_until(t0 + MS * 1_000, |s| (0..3).all(|r| s.node(r).ops_in_flight() == 0));
    let took = c.sim.now() - t0;
    assert!(took < MS * 100, "the others failed the op after {took:?}");
    for r in 0..3 {
        let (ops, late) = events(&mut c, r);
        assert!(late.is_empty(), "rank {r}: {late:?}");
        match &ops[..] {
            [(i, Err(e @ OpError::PeerFailed { rank: 3, .. }))] if *i == id => {
                assert!(e.to_string().contains("a trainer of its host left"), "{e}")
            }
            other => panic!("rank {r}: {other:?}"),
        }
        assert_eq!(c.sim.node(r).stats().late_rank_waits, 0, "rank {r}");
    }
    assert_eq!(c.sim.node(3).stats().ops_abandoned, 1);
}

/// Ranks that sent nothing of the op's run yet are not late: they may never
/// have agreed on it (an asymmetric partition keeps a run from being agreed
/// on some ranks only, whose ops then fail held). The first op of a run is
/// judged by the hard timeout as before.
#[test]
fn ranks_that_took_no_part_in_the_run_are_not_waited_for() {
    let mut c = fresh(39, Duration::from_secs(3));
    let (_, id, t0) = rank_2_starts(&mut c, 1, 40);
    c.sim.run_until(t0 + MS * 1_000, |s| s.node(2).ops_in_flight() == 0);
    let took = c.sim.now() - t0;
    assert!(took >= MS * 200 && took < MS * 201, "failed after {took:?}");
    let (ops, late) = events(&mut c, 2);
    assert!(late.is_empty(), "{late:?}");
    assert!(matches!(&ops[..], [(i, Err(OpError::Timeout { .. }))] if *i == id), "{ops:?}");
}

/// A late rank whose run ends (its last trainer detached: it announces no
/// run any more) is not waited for: rank 2 fails the op within a peer
/// timeout or two of that, not at the 3 s op deadline.
#[test]
fn a_late_rank_whose_run_ended_fails_the_op() {
    let mut c = cluster(41, Duration::from_secs(3));
    let (_, id, t0) = rank_2_starts(&mut c, 2, 42);
    c.sim.run_to(t0 + MS * 300);
    let now = c.sim.now();
    c.sim.node_mut(3).end_run(now);
    c.sim.run_until(t0 + MS * 3_000, |s| s.node(2).ops_in_flight() == 0);
    let took = c.sim.now() - t0;
    assert!(took <= MS * 600, "failed after {took:?}");
    let (ops, late) = events(&mut c, 2);
    assert_eq!(late, [(id, vec![0, 1, 3])]);
    assert_timed_out_on_the_others(&ops, id);
}
