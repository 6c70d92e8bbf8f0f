//! Failure notices (wire version 5), simulated: a rank that failed an op
//! tells the ranks still at it (a failing DONE), they fail it at once naming
//! that rank instead of probing it until their own hard timeout; a notice is
//! never answered and is ignored for an op already ended; and a gather owner
//! does not re-probe a receiver that reported COMPLETE.

mod common;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use common::*;
use dlcp_proto::class::Class;
use dlcp_proto::endpoint::{Event, OpError, OpId};
use dlcp_proto::sim::{NetConfig, TraceEvent};
use dlcp_proto::time::{Duration, Instant};
use dlcp_proto::wire::{self, FailReason, Flags, Header, PacketType, Phase};

const MS: Duration = Duration::from_millis(1);

/// `(time, src, dst, type, phase, flags)` of every datagram a node sent.
type Sent = Rc<RefCell<Vec<(Instant, u32, u32, u8, u8, u8)>>>;

/// Record every datagram sent in `c` (replaces the cluster's own trace).
fn record_sent(c: &mut Cluster) -> Sent {
    let sent: Sent = Rc::default();
    let s = sent.clone();
    c.sim.set_trace(Some(Box::new(move |rec| {
        if rec.event != TraceEvent::Sent {
            return;
        }
        if let Ok(p) = wire::Packet::new_checked(rec.datagram) {
            s.borrow_mut().push((rec.time, rec.src, rec.dst, p.raw_type(), p.raw_phase(), p.flags().0));
        }
    })));
    sent
}

/// The failure of `id` among rank `r`'s events, if any.
fn failure(c: &mut Cluster, r: u32, id: OpId) -> Option<OpError> {
    std::iter::from_fn(|| c.sim.node_mut(r).poll_event()).find_map(|e| match e {
        Event::OpFailed { id: i, error } if i == id => Some(error),
        _ => None,
    })
}

/// Rank 3 is cut off from the others (every datagram to or from it lost)
/// during an op and fails it by its hard timeout (100 ms; the others' is
/// 200 ms); the partition heals just after. The others learn it from the
/// failing DONE that answers their next PROBE, BITMAP or DATA: they fail the
/// op within a few milliseconds with `PeerFailed` naming rank 3 and its
/// reason, long before their own hard timeout, and probe rank 3 only a few
/// times after its failure (before version 5: about every 0.8 ms until their
/// own timeout, over a hundred PROBEs each).
#[test]
fn a_rank_that_timed_out_tells_the_others_who_fail_at_once() {
    let world = 4;
    let cfgs = (0..world)
        .map(|r| {
            let mut c = endpoint_config(r, world, 1);
            if r == 3 {
                c.timers.hard_timeout = MS * 100;
            }
            c
        })
        .collect();
    let mut c = Cluster::with_configs(NetConfig::default().with_seed(91), cfgs);
    let sent = record_sent(&mut c);
    let cut = Rc::new(Cell::new(false));
    let cut2 = cut.clone();
    c.sim.set_drop(Some(Box::new(move |rec| cut2.get() && (rec.src == 3 || rec.dst == 3))));
    let x = inputs(91, world, 4_000);
    let id = OpId { run: 1, seq: 1, tensor: 0 };
    let t0 = c.sim.now();
    cut.set(true);
    for r in 0..world {
        c.sim.node_mut(r).start_allreduce(t0, id, x[r as usize].clone(), opts(0)).unwrap();
    }
    c.sim.run_until(t0 + MS * 150, |s| s.node(3).ops_in_flight() == 0);
    let failed_at = c.sim.now();
    match failure(&mut c, 3, id) {
        Some(OpError::Timeout { waiting_on, .. }) => assert_eq!(waiting_on, [0, 1, 2]),
        other => panic!("rank 3 should have timed out, got {other:?}"),
    }
    assert!(failed_at - t0 >= MS * 100 && failed_at - t0 < MS * 101, "rank 3 failed at {:?}", failed_at - t0);
    assert!((0..3).all(|r| c.sim.node(r).ops_in_flight() == 1), "the others are still at the op");
    cut.set(false);
    c.run(MS * 500);
    let took = c.sim.now() - failed_at;
    for r in 0..3 {
        let e = failure(&mut c, r, id).unwrap_or_else(|| panic!("rank {r} did not fail the op"));
        assert_eq!(e, OpError::PeerFailed { rank: 3, reason: FailReason::Timeout }, "rank {r}");
        assert_eq!(e.to_string(), "rank 3 gave up on this op: no progress within its hard timeout");
    }
    assert!(took < MS * 10, "the others failed {took:?} after rank 3, not within a few RTTs");
    let s3 = c.sim.node(3).stats();
    assert!(s3.failure_notices_sent >= 3, "{} notices for three ranks", s3.failure_notices_sent);
    for r in 0..3 {
        let s = c.sim.node(r).stats();
        assert_eq!((s.failure_notices_received, s.failure_notices_sent), (1, 0), "rank {r}: never answered");
        let probes = sent
            .borrow()
            .iter()
            .filter(|&&(t, src, dst, ty, ..)| {
                t >= failed_at && src == r && dst == 3 && ty == PacketType::Probe as u8
            })
            .count();
        assert!(probes < 50, "rank {r} sent rank 3 {probes} PROBEs after its failure");
    }
    // Every DONE rank 3 sent after its failure is a failing one, at most
    // one per peer per probe interval (the probe timer is ≥ 50 µs here).
    let notices: Vec<_> = sent
        .borrow()
        .iter()
        .filter(|&&(t, src, _, ty, ..)| t >= failed_at && src == 3 && ty == PacketType::Done as u8)
        .copied()
        .collect();
    assert!(notices.iter().all(|n| n.5 == Flags::FAILED.0), "{notices:?}");
    for r in 0..3 {
        let at: Vec<Instant> = notices.iter().filter(|n| n.2 == r).map(|n| n.0).collect();
        assert!(at.windows(2).all(|w| w[1] - w[0] >= Duration::from_micros(50)), "rank {r}: {at:?}");
    }
}

/// A failing DONE, authenticated and fresh, from rank 1 to rank 0: for an
/// op rank 0 completed it is ignored and counted (while the op lingers and
/// after), for an op rank 0 never knew it is stale, a replay of it is stale
/// control, and for an op in flight it fails the op (an unknown reason code
/// reads as "other") without any answer.
#[test]
fn a_failing_done_is_ignored_for_an_ended_op_and_stale_for_an_unknown_one() {
    let world = 2;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(92));
    let x = inputs(92, world, 1_000);
    let done = OpId { run: 1, seq: 1, tensor: 0 };
    all_ok(c.allreduce(done, &x, opts(0), MS * 1000));
    let run = c.sim.node(0).run().unwrap().1;
    let mut packet = 1u64 << 50;
    let mut notice = |seq: u64, code: u8| {
        let mut h = Header::new(PacketType::Done, Class::CONTROL, Phase::Scatter);
        (h.job, h.run, h.src, h.dst, h.op, h.tensor) = (77, run, 1, 0, seq, 0);
        (h.flags, h.chunk_count, h.session, h.packet) = (Flags::FAILED, 1, session(1, 1), packet);
        packet += 1;
        let mut buf = vec![0u8; 256];
        let n = wire::encode(&key(), &h, &[code], &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    let now = c.sim.now();
    let e = c.sim.node_mut(0);
    let before = e.stats().clone();
    let d = notice(1, FailReason::Timeout as u8);
    e.handle_datagram_from(now, &d, Some(1));
    assert_eq!(e.stats().rejected.failure_notice_ignored, before.rejected.failure_notice_ignored + 1);
    // The same datagram again: a replay.
    e.handle_datagram_from(now, &d, Some(1));
    assert_eq!(e.stats().rejected.stale_control, before.rejected.stale_control + 1);
    // An op rank 0 never heard of.
    e.handle_datagram_from(now, &notice(999, FailReason::Timeout as u8), Some(1));
    assert_eq!(e.stats().rejected.stale_op, before.rejected.stale_op + 1);
    assert!(std::iter::from_fn(|| e.poll_event()).all(|ev| !matches!(ev, Event::OpFailed { .. })));
    // Once the completed op no longer lingers, still ignored.
    c.sim.run_to(now + MS * 300);
    let (now, e) = (c.sim.now(), c.sim.node_mut(0));
    e.handle_datagram_from(now, &notice(1, FailReason::Deadline as u8), Some(1));
    assert_eq!(e.stats().rejected.failure_notice_ignored, before.rejected.failure_notice_ignored + 2);
    assert_eq!(e.stats().ops_failed, 0);
    // An op in flight fails at once; the notice is not answered.
    let live = OpId { run: 1, seq: 2, tensor: 0 };
    e.start_allreduce(now, live, x[0].clone(), opts(0)).unwrap();
    e.handle_datagram_from(now, &notice(2, 200), Some(1));
    let failed = std::iter::from_fn(|| e.poll_event()).find_map(|ev| match ev {
        Event::OpFailed { id, error } if id == live => Some(error),
        _ => None,
    });
    assert_eq!(failed, Some(OpError::PeerFailed { rank: 1, reason: FailReason::Other }));
    let mut buf = vec![0u8; 4096];
    while let Some(t) = e.poll_transmit(now, &mut buf) {
        let p = wire::Packet::new_checked(&buf[..t.len]).unwrap();
        assert!(!p.flags().contains(Flags::FAILED) || p.raw_type() != PacketType::Done as u8, "answered");
    }
    let s = e.stats();
    assert_eq!((s.failure_notices_received, s.failure_notices_sent, s.ops_failed), (1, 0, 1));
}

/// A gather owner waiting for one receiver (rank 3, whose all-gather
/// datagrams are all lost) does not probe the receivers that reported
/// COMPLETE: after a receiver's ACK (wire version 10; the only op here) or
/// COMPLETE BITMAP, no all-gather PROBE goes from the owner to it.
#[test]
fn a_gather_owner_does_not_reprobe_a_receiver_that_reported_complete() {
    let world = 4;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(93));
    let sent = record_sent(&mut c);
    c.sim.set_drop(Some(Box::new(|rec| {
        (rec.src == 3 || rec.dst == 3)
            && wire::Packet::new_checked(rec.datagram).is_ok_and(|p| p.raw_phase() == Phase::Gather as u8)
    })));
    let x = inputs(93, world, 4_000);
    let id = OpId { run: 1, seq: 1, tensor: 0 };
    let out = c.allreduce(id, &x, opts(0), MS * 1000);
    assert!(out.iter().all(Result::is_err), "rank 3's all-gather never arrives: {out:?}");
    let sent = sent.borrow();
    let gather = |&&(_, _, _, _, phase, _): &&(Instant, u32, u32, u8, u8, u8)| phase == Phase::Gather as u8;
    let mut completes = 0;
    for owner in 0..3u32 {
        for r in (0..3u32).filter(|&r| r != owner) {
            let complete = sent.iter().filter(gather).find(|&&(_, src, dst, ty, _, flags)| {
                let complete = ty == PacketType::Bitmap as u8 && flags & Flags::COMPLETE.0 != 0;
                src == r && dst == owner && (complete || ty == PacketType::Ack as u8)
            });
            let Some(&(at, ..)) = complete else { continue };
            completes += 1;
            let reprobes = sent
                .iter()
                .filter(gather)
                .filter(|&&(t, src, dst, ty, ..)| {
                    t > at && src == owner && dst == r && ty == PacketType::Probe as u8
                })
                .count();
            assert_eq!(reprobes, 0, "owner {owner} re-probed rank {r} after its ACK");
        }
    }
    assert!(completes >= 3, "only {completes} ACKs: the test proves nothing");
}
