//! Op identity across runs and incarnations (wire version 4): a job rerun on
//! the same endpoints reuses its op ids without colliding, a run's captured
//! datagrams replayed into the next run are rejected and counted, a restarted
//! peer is verified by the HELLO challenge whatever generation it announces,
//! a GOODBYE marks a peer down at once, and a peer with other settings is
//! refused naming both digests.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::*;
use dlcp_proto::endpoint::{Endpoint, Event, Mismatch, OpError, OpId};
use dlcp_proto::run::Waiting;
use dlcp_proto::sim::{NetConfig, TraceEvent};
use dlcp_proto::time::Duration;

const SECOND: Duration = Duration::from_secs(1);

/// A datagram seen on the wire: (source rank, destination rank, bytes).
type Captured = (u32, u32, Vec<u8>);

/// End every rank's local run and begin the next (its trainers re-attached).
fn rerun(c: &mut Cluster) -> u64 {
    let now = c.sim.now();
    let mut epoch = 0;
    for r in 0..c.world {
        let e = c.sim.node_mut(r);
        e.end_run(now);
        epoch = e.begin_run(now);
    }
    c.agree_run();
    epoch
}

fn events(e: &mut Endpoint) -> Vec<Event> {
    std::iter::from_fn(|| e.poll_event()).collect()
}

/// The same op ids in two runs, the second started at once after the
/// first: both exact, and the two runs carry different run ids.
#[test]
fn a_rerun_reuses_op_ids_without_colliding() {
    let world = 3;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(11));
    let first = c.sim.node(0).run().unwrap().1;
    let x = inputs(11, world, 5000);
    let want = bits(&reference_sum(&x));
    let res = all_ok(c.allreduce(OpId { run: 1, seq: 1, tensor: 0 }, &x, opts(0), SECOND));
    assert!(res.iter().all(|(v, _)| bits(v) == want));
    assert_eq!(rerun(&mut c), 2);
    let second = c.sim.node(0).run().unwrap().1;
    assert!(second != 0 && second != first, "a new run id");
    assert!((0..world).all(|r| c.sim.node(r).run() == Some((2, second))));
    let y = inputs(12, world, 5000);
    let res = all_ok(c.allreduce(OpId { run: 2, seq: 1, tensor: 0 }, &y, opts(0), SECOND));
    assert!(res.iter().all(|(v, _)| bits(v) == bits(&reference_sum(&y))));
}

/// Every datagram of run 1, captured on the wire and replayed into run 2
/// (same endpoints, same op ids, fixed generations), is rejected and
/// counted; run 2's results stay exact.
#[test]
fn a_captured_run_replayed_into_the_next_changes_nothing() {
    let world = 3;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(12));
    let captured: Rc<RefCell<Vec<Captured>>> = Rc::default();
    let cap = Rc::clone(&captured);
    c.sim.set_trace(Some(Box::new(move |rec| {
        if rec.event == TraceEvent::Sent {
            cap.borrow_mut().push((rec.src, rec.dst, rec.datagram.to_vec()));
        }
    })));
    let x = inputs(21, world, 6000);
    all_ok(c.allreduce(OpId { run: 1, seq: 1, tensor: 0 }, &x, opts(0), SECOND));
    c.sim.set_trace(None);
    let replay = std::mem::take(&mut *captured.borrow_mut());
    assert!(replay.len() > 100, "captured {}", replay.len());
    rerun(&mut c);
    let y = inputs(22, world, 6000);
    let id = OpId { run: 2, seq: 1, tensor: 0 };
    let now = c.sim.now();
    let rx_before: Vec<u64> = (0..world).map(|r| c.sim.node(r).stats().rx_packets.iter().sum()).collect();
    for r in 0..world {
        c.sim.node_mut(r).start_allreduce(now, id, y[r as usize].clone(), opts(0)).unwrap();
    }
    // The whole capture, delivered to its destinations before run 2's own traffic.
    for (src, dst, d) in &replay {
        c.sim.node_mut(*dst).handle_datagram_from(now, d, Some(*src));
    }
    let accepted: u64 = (0..world)
        .map(|r| c.sim.node(r).stats().rx_packets.iter().sum::<u64>() - rx_before[r as usize])
        .sum();
    c.run(SECOND);
    for r in 0..world {
        let ev = events(c.sim.node_mut(r));
        let done = ev.iter().find_map(|e| match e {
            Event::OpComplete { id: i, result, .. } if *i == id => Some(result.clone()),
            _ => None,
        });
        assert_eq!(bits(&done.expect("run 2's op completed")), bits(&reference_sum(&y)), "rank {r}");
    }
    // Every replayed datagram is counted where it stopped: a control packet
    // as stale (older than the last one taken from its sender: it answers
    // nothing), DATA as late (its op, of run 1, lingers) — none reaches run 2.
    let control = replay.iter().filter(|(_, _, d)| d[3] != dlcp_proto::wire::PacketType::Data as u8).count();
    let (stale, late) = (0..world).fold((0, 0), |(a, b), r| {
        let s = &c.sim.node(r).stats().rejected;
        (a + s.stale_control, b + s.late + s.stale_op + s.duplicate + s.other_run)
    });
    assert_eq!(stale as usize, control, "every replayed control packet");
    assert!(late as usize >= replay.len() - control, "{late} of {} DATA", replay.len() - control);
    assert_eq!(accepted as usize, replay.len() - control, "DATA counted on arrival, then dropped as late");
}

/// A peer that restarts announcing a *lower* generation (a wall clock
/// stepped back) is verified by the handshake and accepted: its restart is
/// reported, and new runs include it.
#[test]
fn a_restart_with_a_lower_generation_is_accepted() {
    let world = 2;
    let cfgs = vec![endpoint_config(0, world, 1), endpoint_config(1, world, 9)];
    let mut c = Cluster::with_configs(NetConfig::default().with_seed(13), cfgs);
    let now = c.sim.now();
    let mut restarted = Endpoint::new(endpoint_config(1, world, 3), now);
    restarted.begin_run(now);
    c.sim.replace_node(1, restarted);
    // Rank 0's trainers start a new run once the restart is known.
    c.sim.run_until(now + SECOND, |s| s.node(0).peer_session(1) == Some(session(1, 3)));
    let now = c.sim.now();
    c.sim.node_mut(0).end_run(now);
    c.sim.node_mut(0).begin_run(now);
    c.agree_run();
    assert_eq!(c.sim.node(0).peer_generation(1), Some(3));
    assert_eq!(c.sim.node(0).peer_session(1), Some(session(1, 3)));
    let ev = events(c.sim.node_mut(0));
    assert!(ev.contains(&Event::PeerRestarted { rank: 1, old: 9, new: 3 }), "{ev:?}");
    let x = inputs(31, world, 3000);
    let (e0, e1) = (c.sim.node(0).run().unwrap().0, c.sim.node(1).run().unwrap().0);
    assert_eq!((e0, e1), (2, 1));
    // Ranks number their local runs themselves: each starts the op under its own epoch.
    let now = c.sim.now();
    c.sim
        .node_mut(0)
        .start_allreduce(now, OpId { run: 2, seq: 1, tensor: 0 }, x[0].clone(), opts(0))
        .unwrap();
    c.sim
        .node_mut(1)
        .start_allreduce(now, OpId { run: 1, seq: 1, tensor: 0 }, x[1].clone(), opts(0))
        .unwrap();
    c.run(SECOND);
    for r in 0..world {
        let ev = events(c.sim.node_mut(r));
        assert!(ev.iter().any(|e| matches!(e, Event::OpComplete { .. })), "rank {r}: {ev:?}");
    }
}

/// A run that began before a peer restarted never includes the new
/// incarnation: ops of it fail at the hard timeout naming the restart.
#[test]
fn a_run_begun_before_a_peer_restart_fails_naming_it() {
    let world = 2;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(14));
    let now = c.sim.now();
    let mut restarted = Endpoint::new(endpoint_config(1, world, 2), now);
    restarted.begin_run(now);
    c.sim.replace_node(1, restarted);
    c.sim.run_to(now + Duration::from_millis(50));
    let now = c.sim.now();
    let x = inputs(41, world, 1000);
    c.sim
        .node_mut(0)
        .start_allreduce(now, OpId { run: 1, seq: 7, tensor: 0 }, x[0].clone(), opts(0))
        .unwrap();
    assert_eq!(c.sim.node(0).ops_held(), 1);
    c.run(SECOND);
    let ev = events(c.sim.node_mut(0));
    let err = ev.iter().find_map(|e| match e {
        Event::OpFailed { error, .. } => Some(error.clone()),
        _ => None,
    });
    match err {
        Some(OpError::NoRun { waiting, .. }) => {
            assert_eq!(waiting, vec![Waiting::RestartedSinceRunBegan(1)]);
            let text = OpError::NoRun { waiting, timeout: Duration::ZERO }.to_string();
            assert!(text.contains("rank 1's daemon restarted after this run began"), "{text}");
        }
        other => panic!("{other:?} in {ev:?}"),
    }
}

/// A GOODBYE marks the peer down at once (long before the peer timeout)
/// and fails the ops that include it; a replay of it changes nothing more.
#[test]
fn a_goodbye_marks_the_peer_down_at_once() {
    let world = 3;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(15));
    let x = inputs(51, world, 200_000);
    let id = OpId { run: 1, seq: 1, tensor: 0 };
    let now = c.sim.now();
    for r in 0..world {
        c.sim.node_mut(r).start_allreduce(now, id, x[r as usize].clone(), opts(0)).unwrap();
    }
    c.sim.run_until(now + Duration::from_micros(30), |_| false);
    let captured: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let cap = Rc::clone(&captured);
    c.sim.set_trace(Some(Box::new(move |rec| {
        if rec.event == TraceEvent::Sent && rec.datagram[3] == dlcp_proto::wire::PacketType::Goodbye as u8 {
            cap.borrow_mut().push(rec.datagram.to_vec());
        }
    })));
    c.sim.node_mut(2).goodbye();
    let t0 = c.sim.now();
    c.sim.run_until(t0 + Duration::from_millis(5), |s| !s.node(0).peer_up(2) && !s.node(1).peer_up(2));
    assert!(c.sim.now() < t0 + Duration::from_millis(5), "not marked down within 5 ms");
    for r in 0..2 {
        let ev = events(c.sim.node_mut(r));
        assert!(ev.contains(&Event::PeerLeft { rank: 2 }), "rank {r}: {ev:?}");
        assert!(
            ev.contains(&Event::OpFailed { id, error: OpError::PeerLeft { rank: 2 } }),
            "rank {r}: {ev:?}"
        );
    }
    let goodbyes = captured.borrow().clone();
    assert_eq!(goodbyes.len(), 2, "one GOODBYE per peer");
    let before = c.sim.node(0).stats().rejected.unverified_session;
    let now = c.sim.now();
    for d in goodbyes.iter().filter(|d| d[23] == 0) {
        c.sim.node_mut(0).handle_datagram_from(now, d, Some(2));
    }
    assert_eq!(c.sim.node(0).stats().rejected.unverified_session, before + 1, "the replayed GOODBYE");
    assert!(events(c.sim.node_mut(0)).is_empty());
}

/// A peer whose class bands differ is refused, reported with both digests,
/// and no run is agreed with it.
#[test]
fn a_peer_with_other_class_bands_is_refused_naming_both_digests() {
    let world = 2;
    let mut other = endpoint_config(1, world, 1);
    other.classifier.magnitude_levels = 3;
    let theirs = dlcp_proto::endpoint::settings_digest(&other);
    let ours = dlcp_proto::endpoint::settings_digest(&endpoint_config(0, world, 1));
    assert_ne!(theirs, ours);
    let mut c =
        Cluster::with_configs(NetConfig::default().with_seed(16), vec![endpoint_config(0, world, 1), other]);
    let ev = events(c.sim.node_mut(0));
    let m = Mismatch::SettingsDigest { theirs, ours };
    assert!(ev.contains(&Event::PeerIncompatible { rank: Some(1), mismatch: m }), "{ev:?}");
    assert_eq!(c.sim.node(0).peer_mismatch(1), Some(m));
    assert!(
        m.to_string().contains(&format!("{theirs:016x}")) && m.to_string().contains(&format!("{ours:016x}"))
    );
    assert_eq!(c.sim.node(0).run().map(|r| r.1), Some(0), "no run agreed with it");
}

/// Ranks out of step in one run (rank 0 in op 5, rank 1 in op 6): each
/// fails at the hard timeout naming the rank it waited on and the op that
/// rank was last heard in.
#[test]
fn ranks_out_of_step_are_named_with_the_op_each_used() {
    let world = 2;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(17));
    let x = inputs(61, world, 4000);
    let now = c.sim.now();
    let ids = [OpId { run: 1, seq: 5, tensor: 0 }, OpId { run: 1, seq: 6, tensor: 0 }];
    for r in 0..world {
        c.sim.node_mut(r).start_allreduce(now, ids[r as usize], x[r as usize].clone(), opts(0)).unwrap();
    }
    c.run(SECOND);
    for r in 0..world {
        let other = 1 - r;
        let err = events(c.sim.node_mut(r))
            .into_iter()
            .find_map(|e| match e {
                Event::OpFailed { error, .. } => Some(error),
                _ => None,
            })
            .unwrap_or_else(|| panic!("rank {r} did not fail"));
        match &err {
            OpError::Timeout { waiting_on, elsewhere, .. } => {
                assert_eq!(waiting_on, &vec![other]);
                assert_eq!(elsewhere, &vec![(other, ids[other as usize].seq, 0)]);
            }
            other => panic!("{other:?}"),
        }
        let text = err.to_string();
        let want = format!("rank {other} last sent op {} tensor 0", ids[other as usize].seq);
        assert!(text.contains(&want) && text.contains(&format!("waiting on ranks [{other}]")), "{text}");
    }
}
