//! Per-rank cost of an allreduce as the world grows: control packets, data
//! packets and protocol state per rank must grow at most linearly with the
//! number of peers (one transfer per peer and phase), not faster, and on a
//! clean network control stays near one packet per peer per op (wire
//! version 10: one ACK per peer for this one op). Runs the real endpoints on the deterministic simulator at 16
//! and 64 ranks.

use std::cell::RefCell;
use std::rc::Rc;

use dlcp_proto::endpoint::{Endpoint, EndpointConfig, Event, OpId, OpOptions};
use dlcp_proto::oracle;
use dlcp_proto::rng::Rng;
use dlcp_proto::sim::{NetConfig, Sim, TraceEvent};
use dlcp_proto::time::{Duration, Instant};
use dlcp_proto::wire::{JobKey, Packet};

const CHUNK_BYTES: usize = 1392;
const ELEMS: usize = 128 * 1024; // 512 KiB of f32

/// Per rank per op: (data packets, control packets, peak protocol state bytes).
fn run(world: u32) -> (f64, f64, usize) {
    let key = JobKey::new(b"scale test");
    let nodes = (0..world)
        .map(|r| {
            let mut c = EndpointConfig::new(r, world, 1, 1, u64::from(r), key.clone());
            c.chunk_bytes = CHUNK_BYTES;
            Endpoint::new(c, Instant::ZERO)
        })
        .collect();
    let mut sim = Sim::new(NetConfig::default().with_seed(7), nodes);
    let sent = Rc::new(RefCell::new([0u64; 9]));
    let s2 = Rc::clone(&sent);
    sim.set_trace(Some(Box::new(move |t| {
        if t.event == TraceEvent::Sent
            && let Ok(p) = Packet::new_checked(t.datagram)
        {
            s2.borrow_mut()[usize::from(p.raw_type()).min(8)] += 1;
        }
    })));
    let mut rng = Rng::new(u64::from(world));
    let inputs: Vec<Vec<f32>> =
        (0..world).map(|_| (0..ELEMS).map(|_| (rng.next_f64() * 2.0 - 1.0) as f32).collect()).collect();
    let id = OpId { run: 1, seq: 1, tensor: 0 };
    let o = OpOptions::default();
    // The daemons agree on the run first (HELLOs, not counted below).
    for r in 0..world {
        sim.node_mut(r).begin_run(Instant::ZERO);
    }
    let agreed = sim.run_until(Instant::ZERO + Duration::from_secs(1), |s| {
        (0..world).all(|r| s.node(r).run().is_some_and(|(_, id)| id != 0))
    });
    assert!(agreed, "{world} ranks did not agree on a run");
    *sent.borrow_mut() = [0; 9];
    let now = sim.now();
    for r in 0..world {
        sim.node_mut(r).start_allreduce(now, id, inputs[r as usize].clone(), o).unwrap();
    }
    let mut peak = 0usize;
    let mut steps = 0u64;
    let finished = sim.run_until(now + Duration::from_secs(5), |s| {
        steps += 1;
        if steps % 64 == 0 {
            peak = peak.max(s.node((steps / 64 % u64::from(world)) as u32).footprint().state_bytes);
        }
        (0..world).all(|r| s.node(r).ops_in_flight() == 0)
    });
    assert!(finished, "{world} ranks: the op did not finish within 5 s of virtual time");
    // Results are delivered before the receivers' ACKs (wire version 10,
    // sent up to the ACK delay later): count those too.
    let acked = sim.run_until(sim.now() + Duration::from_secs(1), |s| {
        (0..world).all(|r| s.node(r).ops_unacknowledged() == 0)
    });
    assert!(acked, "{world} ranks: the op's ACKs did not all arrive within 1 s of virtual time");
    let mut results = Vec::new();
    for r in 0..world {
        match sim.node_mut(r).poll_event_matching_op() {
            Some((v, rep)) => results.push((v, rep)),
            None => panic!("rank {r} has no result"),
        }
    }
    let reports: Vec<_> = results.iter().map(|x| &x.1).collect();
    let ins: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    let want = oracle::recompute(&ins, &reports, o, CHUNK_BYTES / 4);
    for (r, (v, _)) in results.iter().enumerate() {
        assert!(
            v.iter().map(|x| x.to_bits()).eq(want.iter().map(|x| x.to_bits())),
            "{world} ranks: rank {r} result differs from the oracle"
        );
    }
    let t = *sent.borrow();
    let n = f64::from(world);
    (t[1] as f64 / n, t[2..].iter().sum::<u64>() as f64 / n, peak)
}

trait PollOp {
    fn poll_event_matching_op(&mut self) -> Option<(Vec<f32>, dlcp_proto::endpoint::OpReport)>;
}

impl PollOp for Endpoint {
    fn poll_event_matching_op(&mut self) -> Option<(Vec<f32>, dlcp_proto::endpoint::OpReport)> {
        while let Some(ev) = self.poll_event() {
            if let Event::OpComplete { result, report, .. } = ev {
                return Some((result, *report));
            }
        }
        None
    }
}

#[test]
fn per_rank_packets_and_state_grow_at_most_linearly_in_peers() {
    let (d16, c16, s16) = run(16);
    let (d64, c64, s64) = run(64);
    let per_peer = |x: f64, world: u32| x / f64::from(world - 1);
    eprintln!(
        "16 ranks: data {d16:.1}, control {c16:.1} ({:.2}/peer), state {s16} B; \
         64 ranks: data {d64:.1}, control {c64:.1} ({:.2}/peer), state {s64} B",
        per_peer(c16, 16),
        per_peer(c64, 64)
    );
    // Wire version 10 on a clean network: a transfer ends on its LAST DATA,
    // the owner's all-gather acknowledges the reduce-scatter, and an exact
    // all-gather ends in one ACK per receiver and owner for every op of the
    // ACK delay — one control packet per peer for this one op (no PROBE, no
    // DONE, no BITMAP; this tensor fits the flow control window, so few
    // GRANTs). Version 7 sent about ten (two PROBE copies and a DONE or
    // BITMAP per transfer, the mask DONE).
    for (c, d, w) in [(c16, d16, 16), (c64, d64, 64)] {
        let share = c / (c + d);
        eprintln!("{w} ranks: control {:.1}% of packets", share * 100.0);
        assert!(per_peer(c, w) <= 1.5, "{w} ranks: {:.2} control packets per peer per op", per_peer(c, w));
        assert!(share <= 0.10, "{w} ranks: control is {:.1}% of packets", share * 100.0);
    }
    // Not super-linear: per-peer control at 64 ranks within 20% of 16 ranks'.
    assert!(
        per_peer(c64, 64) <= 1.2 * per_peer(c16, 16),
        "control per peer grew from {:.2} (16 ranks) to {:.2} (64 ranks)",
        per_peer(c16, 16),
        per_peer(c64, 64)
    );
    // Data: every chunk about once (the tensor is the same size at both
    // scales, so per-rank data stays flat up to chunk rounding and repairs).
    assert!(d64 <= 1.5 * d16, "data per rank grew from {d16:.1} to {d64:.1}");
    // Protocol state per rank: linear in peers (4× peers, at most 6× bytes).
    assert!(s64 <= 6 * s16, "protocol state per rank grew from {s16} B to {s64} B");
}

/// 384 daemons start at once behind the simulator's 256-packet port queues
/// and agree on a run. Their HELLO rounds start at the same instants; were
/// they all to begin with rank 0, each port would take a HELLO from every
/// rank at once, drop the same senders' every round, and above about 300
/// ranks no rank ever agreed (0 of 320 after 5 s). Each round goes in rank
/// order after the sender (`TxQueues::push_hellos`).
#[test]
fn four_hundred_ranks_starting_at_once_agree_on_a_run() {
    let world = 384;
    let key = JobKey::new(b"scale test");
    let nodes = (0..world)
        .map(|r| {
            let c = EndpointConfig::new(r, world, 1, 1, u64::from(r) + 1, key.clone());
            let mut e = Endpoint::new(c, Instant::ZERO);
            e.begin_run(Instant::ZERO);
            e
        })
        .collect();
    let net = NetConfig::default().with_seed(11);
    assert_eq!(net.port_queue_packets, 256, "the default queue is what this is about");
    let mut sim = Sim::new(net, nodes);
    let (mut next, limit) = (0, Instant::ZERO + Duration::from_secs(1));
    let agreed = sim.run_until(limit, |s| {
        while next < world && s.node(next).run().is_some_and(|(_, id)| id != 0) {
            next += 1;
        }
        next == world
    });
    let when = sim.now();
    assert!(agreed, "{next} of {world} ranks agreed on a run within a second of virtual time");
    eprintln!("{world} ranks agreed on a run after {when:?} of virtual time");
    let drops = dlcp_proto::sim::NetStats::total(&sim.stats().switch_drops);
    eprintln!("switch queue drops during the handshake: {drops}");
    assert!(when < Instant::ZERO + Duration::from_millis(100), "agreement took {when:?}");
}
