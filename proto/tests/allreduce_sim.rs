//! Deterministic simulations of the allreduce endpoint: N ranks on virtual time
//! with seeded loss, reordering, duplication, corruption and a priority-aware
//! bottleneck. Every test here fails if the property it names breaks.

mod common;

use common::*;
use dlcp_proto::endpoint::{Event, OpId};
use dlcp_proto::sim::NetConfig;
use dlcp_proto::time::Duration;
use dlcp_proto::wire;

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn lossless_is_bit_exact_for_2_4_8_33_ranks() {
    for (world, len) in [(2u32, 1001usize), (4, 4099), (8, 777), (33, 3331)] {
        for budget in [0, 10_000] {
            let mut c = Cluster::new(world, NetConfig::default().with_seed(u64::from(world)));
            let x = inputs(u64::from(world), world, len);
            let res = all_ok(c.allreduce(OpId { run: 1, seq: 1, tensor: 3 }, &x, opts(budget), SECOND));
            let want = bits(&reference_sum(&x));
            for (r, (v, rep)) in res.iter().enumerate() {
                assert!(bits(v) == want, "world {world} budget {budget}: rank {r} not bit-exact");
                assert!(rep.own_mask.count_ones() == 0);
                assert!(!rep.deadline_fired, "world {world}: deadline fired on a clean network");
            }
        }
    }
}

/// `packet_auth = "none"`: datagrams end after their payload (no tag room),
/// and the same allreduces complete, bit-exact without loss and within the
/// budget under 3% loss. Every datagram sent is checked to carry no tag.
#[test]
fn unauthenticated_packets_carry_no_tag_and_allreduce_the_same() {
    for (loss, budget, seed) in [(0.0, 0u32, 31u64), (0.03, 10_000, 32)] {
        let world = 4;
        let cfgs = (0..world)
            .map(|r| {
                let mut c = endpoint_config(r, world, 1);
                c.key = wire::JobKey::unauthenticated();
                c
            })
            .collect();
        let mut c = Cluster::with_configs(NetConfig::default().with_seed(seed).with_loss(loss), cfgs);
        let x = inputs(seed, world, 5_000);
        let id = OpId { run: 1, seq: 9, tensor: 2 };
        let res = all_ok(c.allreduce(id, &x, opts(budget), SECOND));
        if loss == 0.0 {
            let want = bits(&reference_sum(&x));
            assert!(res.iter().all(|(v, _)| bits(v) == want), "not bit-exact without authentication");
        } else {
            check_lossy(&c, id, &x, opts(budget), &res);
        }
        let t = c.trace.borrow();
        assert!(t.sent > 100, "only {} datagrams seen", t.sent);
        assert_eq!(t.misframed, 0, "{} of {} datagrams were not header + payload long", t.misframed, t.sent);
    }
}

#[test]
fn random_loss_up_to_5pct_within_budget_1pct() {
    for (loss, seed) in [(0.001, 11u64), (0.01, 12), (0.03, 13), (0.05, 14)] {
        let world = 4;
        let net = NetConfig::default().with_seed(seed).with_loss(loss);
        let mut c = Cluster::new(world, net);
        let x = inputs(seed, world, 20_000);
        let o = opts(10_000);
        let id = OpId { run: 1, seq: 5, tensor: 1 };
        let res = all_ok(c.allreduce(id, &x, o, SECOND));
        check_lossy(&c, id, &x, o, &res);
        let lost = dlcp_proto::sim::NetStats::total(&c.sim.stats().lost);
        assert!(loss < 0.005 || lost > 0, "loss {loss}: the network lost nothing; the test proves nothing");
    }
}

#[test]
fn budget_zero_under_5pct_loss_is_bit_exact() {
    let world = 4;
    let net = NetConfig::default().with_seed(21).with_loss(0.05);
    let mut c = Cluster::new(world, net);
    let x = inputs(21, world, 30_011);
    let res = all_ok(c.allreduce(OpId { run: 1, seq: 9, tensor: 0 }, &x, opts(0), SECOND));
    let want = bits(&reference_sum(&x));
    for (r, (v, rep)) in res.iter().enumerate() {
        assert!(bits(v) == want, "rank {r} not bit-exact");
        assert!(rep.scatter.iter().all(|t| t.delivered.is_full()));
    }
    assert!(res.iter().any(|(_, rep)| rep.repairs_sent > 0), "5% loss but no repairs: loss not injected?");
    // Repairs per class and per peer, packets and bytes, add up to the totals,
    // and what one rank sent a peer is at least what that peer got new from it.
    let world_u = world as usize;
    for r in 0..world_u {
        let s = c.sim.node(r as u32).stats();
        let peers_sent: u64 = s.repairs_sent_peer.iter().map(|p| p.packets).sum();
        let peers_got: u64 = s.repairs_received_peer.iter().map(|p| p.packets).sum();
        assert_eq!(peers_sent, s.repairs_sent, "rank {r}");
        assert_eq!(peers_got, s.repairs_received, "rank {r}");
        assert_eq!(s.repairs_sent_per_class.iter().sum::<u64>(), s.repairs_sent, "rank {r}");
        let bytes_sent: u64 = s.repairs_sent_peer.iter().map(|p| p.bytes).sum();
        assert_eq!(bytes_sent, s.repair_bytes_sent_per_class.iter().sum::<u64>(), "rank {r}");
        let bytes_got: u64 = s.repairs_received_peer.iter().map(|p| p.bytes).sum();
        assert_eq!(bytes_got, s.repair_bytes_received_per_class.iter().sum::<u64>(), "rank {r}");
        assert!(bytes_sent >= s.repairs_sent * wire::OVERHEAD as u64, "rank {r}");
        assert_eq!((s.repairs_sent_peer[r].packets, s.repairs_received_peer[r].packets), (0, 0));
        for p in (0..world_u).filter(|&p| p != r) {
            let got = c.sim.node(p as u32).stats().repairs_received_peer[r].packets;
            assert!(s.repairs_sent_peer[p].packets >= got, "rank {r} -> {p}: sent < received new");
        }
    }
}

#[test]
fn gather_budget_uses_one_agreed_mask_and_replicas_stay_identical() {
    use dlcp_proto::endpoint::{Fill, OpOptions, ReduceOp};
    let world = 5;
    let mut masked_somewhere = false;
    for (seed, fill, rescale, reduce) in [
        (31u64, Fill::Zero, false, ReduceOp::Sum),
        (32, Fill::Local, false, ReduceOp::Average),
        (33, Fill::Zero, true, ReduceOp::Sum),
        (34, Fill::Local, true, ReduceOp::Average),
    ] {
        let net = NetConfig::default().with_seed(seed).with_loss(0.03);
        let mut c = Cluster::new(world, net);
        let x = inputs(seed, world, 40_000);
        // A back layer, so its gather chunks land in a droppable class (4).
        let o = OpOptions {
            layer: 3,
            layers: 4,
            budget_ppm: 50_000,
            gather_budget_ppm: 20_000,
            fill,
            rescale,
            reduce,
            ..OpOptions::default()
        };
        let id = OpId { run: 1, seq: 1, tensor: 2 };
        let res = all_ok(c.allreduce(id, &x, o, SECOND));
        check_lossy(&c, id, &x, o, &res);
        // Every receiver applied exactly the owner's mask.
        for (s, (_, owner)) in res.iter().enumerate() {
            masked_somewhere |= owner.own_mask.count_ones() > 0;
            for (r, (_, rep)) in res.iter().enumerate() {
                if r != s {
                    let t = rep.gather.iter().find(|t| t.peer == s as u32).unwrap();
                    assert_eq!(
                        t.mask.as_ref(),
                        Some(&owner.own_mask),
                        "rank {r} applied another mask for shard {s}"
                    );
                }
            }
        }
    }
    assert!(masked_somewhere, "3% loss with a 2% gather budget never produced a mask: test proves nothing");
}

#[test]
fn reordering_duplication_and_corruption_are_absorbed() {
    let world = 4;
    let net = NetConfig::default()
        .with_seed(41)
        .with_loss(0.01)
        .with_reorder(0.2, Duration::from_micros(200))
        .with_duplicate(0.05)
        .with_corrupt(0.02);
    let mut c = Cluster::new(world, net);
    let x = inputs(41, world, 25_000);
    let o = opts(10_000);
    let id = OpId { run: 1, seq: 3, tensor: 8 };
    let res = all_ok(c.allreduce(id, &x, o, SECOND));
    check_lossy(&c, id, &x, o, &res);
    let st = c.sim.stats();
    assert!(st.duplicated > 0 && st.corrupted > 0 && st.reordered > 0);
    let bad_tags: u64 = (0..world).map(|r| c.sim.node(r).stats().rejected.bad_tag).sum();
    let dups: u64 = (0..world).map(|r| c.sim.node(r).stats().rejected.duplicate).sum();
    assert!(bad_tags > 0, "corrupted datagrams must be rejected by the MAC and counted");
    assert!(dups > 0, "duplicated datagrams must be counted");
}

#[test]
fn loss_within_budget_completes_without_a_deadline() {
    let world = 4;
    for seed in [51u64, 52, 53] {
        let net = NetConfig::default().with_seed(seed).with_loss(0.005);
        let mut c = Cluster::new(world, net);
        let x = inputs(seed, world, 50_000);
        let id = OpId { run: 1, seq: 1, tensor: 1 };
        let res = all_ok(c.allreduce(id, &x, opts(50_000), SECOND));
        for (r, (_, rep)) in res.iter().enumerate() {
            assert!(
                !rep.deadline_fired,
                "seed {seed} rank {r}: a deadline fired although loss was within budget"
            );
        }
        let fired: u64 = (0..world).map(|r| c.sim.node(r).stats().deadlines_fired).sum();
        assert_eq!(fired, 0);
        let closed_early: u64 = (0..world).map(|r| c.sim.node(r).stats().closed_within_budget).sum();
        assert!(
            closed_early > 0,
            "seed {seed}: nothing was lost, so nothing closed early: test proves nothing"
        );
    }
}

#[test]
fn losing_one_copy_of_every_probe_costs_no_deadline_and_no_time() {
    use dlcp_proto::endpoint::PROBE_COPIES;
    use dlcp_proto::wire::{self, PacketType};
    use std::cell::RefCell;
    use std::collections::BTreeSet;
    use std::rc::Rc;
    const _: () = assert!(PROBE_COPIES >= 2, "the property needs redundant PROBEs");
    let world = 4;
    let len = 60_000;
    let x = inputs(61, world, len);
    let id = OpId { run: 1, seq: 1, tensor: 1 };
    // A lossy run (so transfers are incomplete), in which every first-pass
    // DATA that carries LAST is lost, so that PROBEs decide when transfers
    // close; once
    // as is and once with the first copy of every PROBE lost too.
    let run = |drop_first_copy: bool| {
        // (Seed 62: under seed 61 the random loss took the surviving copy of
        // one PROBE too — two copies lost, which this test does not claim
        // to survive.)
        let mut c = Cluster::new(world, NetConfig::default().with_seed(62).with_loss(0.005));
        // (src, dst, op, phase, seq) of every PROBE seen.
        type Seen = BTreeSet<(u32, u32, u64, u8, u32)>;
        let seen: Rc<RefCell<Seen>> = Rc::default();
        let dropped = Rc::new(RefCell::new(0u32));
        let (seen, dropped2) = (seen.clone(), dropped.clone());
        c.sim.set_drop(Some(Box::new(move |rec| {
            let Ok(p) = wire::Packet::new_checked(rec.datagram) else { return false };
            if p.flags().contains(wire::Flags::LAST) && !p.flags().contains(wire::Flags::REPAIR) {
                return true;
            }
            if !drop_first_copy || p.raw_type() != PacketType::Probe as u8 {
                return false;
            }
            let first = seen.borrow_mut().insert((p.src(), p.dst(), p.op(), p.raw_phase(), p.seq()));
            *dropped2.borrow_mut() += u32::from(first);
            first
        })));
        let res = all_ok(c.allreduce(id, &x, opts(10_000), SECOND));
        let fired: u64 = (0..world).map(|r| c.sim.node(r).stats().deadlines_fired).sum();
        let dups: u64 = (0..world).map(|r| c.sim.node(r).stats().probes_duplicate).sum();
        let slowest = res.iter().map(|(_, rep)| rep.duration()).max().unwrap();
        assert_identical(&res);
        (fired, dups, slowest, *dropped.borrow())
    };
    let (fired0, dups0, t0, _) = run(false);
    let (fired1, dups1, t1, dropped) = run(true);
    assert_eq!(fired0, 0, "a deadline fired in the reference run");
    assert!(dups0 > 0, "no redundant PROBE copy arrived in the reference run: nothing was sent twice");
    assert!(dropped > 0, "no PROBE was lost: the test proves nothing");
    assert_eq!(fired1, 0, "losing one PROBE copy made a receive deadline fire ({dropped} copies lost)");
    assert!(dups1 < dups0, "the lost copies should be missing from the duplicate count");
    // The surviving copy is one packet behind the lost one: at most a few
    // microseconds later, never a probe timeout (≥ 200 µs) or a deadline.
    assert!(
        t1 <= t0 + Duration::from_micros(100),
        "losing one copy of each PROBE slowed the op from {t0:?} to {t1:?}"
    );
}

#[test]
fn a_transfer_whose_end_signals_are_all_lost_closes_on_its_sender_not_by_its_deadline() {
    use dlcp_proto::wire::{self, Flags, PacketType, Phase};
    use std::cell::Cell;
    use std::collections::BTreeSet;
    use std::rc::Rc;
    // The case a testbed run hit once in ~2400 transfers: every copy of a
    // sender's first PROBE and of its retries is lost — and since wire
    // version 8 the DATA that carries LAST before them. The receiver holds
    // enough to close within budget but never heard the sender say it is done.
    // Its deadline must not end the transfer: it NACKs, the sender answers the
    // BITMAP (a PROBE at once when within budget, else repairs ending in
    // LAST), and that closes it.
    let world = 4;
    let len = 60_000;
    let x = inputs(67, world, len);
    let mut c = Cluster::new(world, NetConfig::default().with_seed(67).with_loss(0.005));
    // Every scatter PROBE and LAST DATA is lost until the receiver has
    // spoken (sent a BITMAP) to that sender: only a receive deadline can
    // then move it.
    let dropped = Rc::new(Cell::new(0u32));
    let d = dropped.clone();
    let mut spoke = BTreeSet::new();
    c.sim.set_drop(Some(Box::new(move |rec| {
        let Ok(p) = wire::Packet::new_checked(rec.datagram) else { return false };
        if p.raw_phase() != Phase::Scatter as u8 {
            return false;
        }
        if p.raw_type() == PacketType::Bitmap as u8 {
            spoke.insert((p.src(), p.dst(), p.op()));
        }
        let signal = p.raw_type() == PacketType::Probe as u8 || p.flags().contains(Flags::LAST);
        let lost = signal && !spoke.contains(&(p.dst(), p.src(), p.op()));
        d.set(d.get() + u32::from(lost));
        lost
    })));
    let res = all_ok(c.allreduce(OpId { run: 1, seq: 1, tensor: 1 }, &x, opts(10_000), SECOND));
    assert_identical(&res);
    assert!(dropped.get() > 0, "no PROBE was lost: the test proves nothing");
    let closable_without_probe: usize = res
        .iter()
        .flat_map(|(_, rep)| rep.scatter.iter())
        .filter(|t| t.delivered.count_ones() < t.chunks)
        .count();
    assert!(closable_without_probe > 0, "every transfer was complete: none needed a PROBE to close");
    let stats: Vec<_> = (0..world).map(|r| c.sim.node(r).stats().clone()).collect();
    // The receiver NACKs by its quiet timer (the tail stopped before a LAST)
    // or, failing that, by its deadline.
    let nacks: u64 = stats.iter().map(|s| s.deadline_nacks + s.quiet_nacks).sum();
    let closes: u64 = stats.iter().map(|s| s.deadline_closes).sum();
    assert!(nacks > 0, "no NACK: the lost end signals were not what the receivers waited for");
    assert_eq!(closes, 0, "{closes} transfers ended by their deadline ({nacks} deadline NACKs)");
}

#[test]
fn silent_rank_yields_errors_within_the_hard_timeout() {
    use dlcp_proto::endpoint::OpError;
    let world = 4;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(61));
    let x = inputs(61, world, 20_000);
    let hard = timers().hard_timeout;
    // Rank 2 dies before the op; the others must not hang.
    c.sim.set_silent(2, true);
    let t0 = c.sim.now();
    let out = c.allreduce(OpId { run: 1, seq: 1, tensor: 0 }, &x, opts(10_000), SECOND * 5);
    for r in [0u32, 1, 3] {
        match &out[r as usize] {
            Err(OpError::Timeout { waiting_on, .. }) => {
                assert!(waiting_on.contains(&2), "rank {r} blames {waiting_on:?}, not the silent rank 2");
            }
            other => panic!("rank {r}: expected a timeout error, got {other:?}"),
        }
    }
    let elapsed = c.sim.now() - t0;
    assert!(elapsed <= hard + Duration::from_millis(20), "errors took {elapsed:?}, hard timeout {hard:?}");
    // A rank dying mid-op (after the reduce-scatter started) also ends in errors.
    c.sim.set_silent(2, false);
    let ops = [(OpId { run: 1, seq: 2, tensor: 0 }, x.clone(), opts(10_000))];
    let now = c.sim.now();
    for r in 0..world {
        c.sim.node_mut(r).start_allreduce(now, ops[0].0, x[r as usize].clone(), ops[0].2).unwrap();
    }
    c.sim.run_until(now + Duration::from_micros(30), |_| false);
    c.sim.set_silent(1, true);
    let t1 = c.sim.now();
    c.run(SECOND * 5);
    for r in [0u32, 2, 3] {
        let mut failed = false;
        while let Some(ev) = c.sim.node_mut(r).poll_event() {
            if let dlcp_proto::endpoint::Event::OpFailed { id, .. } = ev {
                failed |= id == ops[0].0;
            }
        }
        assert!(failed, "rank {r} did not report the failure of the op rank 1 abandoned");
    }
    assert!(c.sim.now() - t1 <= hard + Duration::from_millis(20));
    // Waiting on a silent rank is what receive deadlines are for: they fired
    // and re-requested (NACKed) what was missing, and every firing is counted
    // as either a close or a NACK.
    for r in [0u32, 2, 3] {
        let s = c.sim.node(r).stats();
        assert!(s.deadline_nacks > 0, "rank {r}: no deadline NACKed the silent rank: {s:?}");
        assert_eq!(s.deadlines_fired, s.deadline_closes + s.deadline_nacks, "rank {r}");
    }
}

#[test]
fn priority_bottleneck_drops_low_classes_first_and_front_layers_finish_first() {
    use dlcp_proto::class::Class;
    use dlcp_proto::endpoint::OpOptions;
    let world = 4;
    // Every port is a 4 Gbit/s bottleneck behind 10 Gbit/s uplinks, with short queues.
    let mut net = NetConfig::default().with_seed(71).with_queue(24);
    for r in 0..world {
        net = net.with_port_rate(r, 4_000_000_000);
    }
    // Senders paced at 5 Gbit/s: each port is offered ~1.25× its rate.
    let cfgs = (0..world)
        .map(|r| {
            let mut cfg = endpoint_config(r, world, 1);
            cfg.pacing_rate = 5_000_000_000 / 8;
            cfg.pacing_burst = 16 * 1024;
            // Priority classes alone against an overloaded port: senders
            // held by their pacers only (flow control has its own
            // simulations, proto/tests/flow_sim.rs).
            cfg.flow = dlcp_proto::flow::FlowConfig::OFF;
            cfg
        })
        .collect();
    let mut c = Cluster::with_configs(net, cfgs);
    let layers = 4;
    let ops: Vec<_> = (0..layers)
        .map(|l| {
            let o = OpOptions { layer: l, layers, budget_ppm: 50_000, ..OpOptions::default() };
            (OpId { run: 1, seq: 1, tensor: l }, inputs(70 + u64::from(l), world, 30_000), o)
        })
        .collect();
    let out = c.allreduce_many(&ops, SECOND * 2);
    let mut results = Vec::new();
    for (i, per_rank) in out.into_iter().enumerate() {
        let res = all_ok(per_rank);
        check_lossy(&c, ops[i].0, &ops[i].1, ops[i].2, &res);
        results.push(res);
    }
    // The switch really dropped, and dropped low classes more than high ones.
    let st = c.sim.stats();
    let drop_frac = |cl: u8| {
        let cl = Class::new(cl).unwrap();
        let arr: u64 = st.ports.iter().map(|p| p.arrivals[cl.index()]).sum();
        let drp: u64 = st.ports.iter().map(|p| p.drops[cl.index()]).sum();
        (arr, drp as f64 / arr.max(1) as f64)
    };
    let total_drops: u64 = st.switch_drops.iter().sum();
    assert!(total_drops > 100, "the bottleneck dropped only {total_drops} packets: no congestion");
    let per_class: Vec<(u64, f64)> = (0..8).map(drop_frac).collect();
    eprintln!("per-class (arrivals, drop fraction): {per_class:?}");

    let group = |cls: std::ops::RangeInclusive<usize>| {
        let arr: u64 = cls.clone().map(|c| per_class[c].0).sum();
        let drp: f64 = cls.map(|c| per_class[c].0 as f64 * per_class[c].1).sum();
        drp / arr.max(1) as f64
    };
    let (low, high, control) = (group(0..=3), group(4..=6), group(7..=7));
    assert!(high < low, "classes 4-6 lost {high:.4}, classes 0-3 lost {low:.4}");
    assert!(control < 0.01 && control <= high, "control lost {control:.4}");
    // Of tensors submitted together, front layers complete first on every rank.
    for r in 0..world as usize {
        let finished: Vec<_> = results.iter().map(|res| res[r].1.finished).collect();
        assert!(
            finished[0] <= finished[layers as usize - 1],
            "rank {r}: front layer finished after back layer: {finished:?}"
        );
    }
}

#[test]
fn many_tensors_and_ops_in_flight_with_skewed_starts() {
    use dlcp_proto::endpoint::OpOptions;
    let world = 6;
    let net =
        NetConfig::default().with_seed(81).with_loss(0.01).with_reorder(0.05, Duration::from_micros(100));
    let mut c = Cluster::new(world, net);
    if std::env::var_os("DLCP_TRACE").is_some() {
        c.sim.set_trace(Some(Box::new(|rec| {
            let p = dlcp_proto::wire::Packet::new_checked(rec.datagram).unwrap();
            if p.op() == 1
                && p.tensor() == 4
                && (rec.src == 4 || rec.dst == 4)
                && (rec.src == 2 || rec.dst == 2)
            {
                eprintln!(
                    "{:>9} {:?} {}->{} ty{} ph{} ci{}/{} seq{} fl{:x}",
                    rec.time.as_nanos() / 1000,
                    rec.event,
                    rec.src,
                    rec.dst,
                    p.raw_type(),
                    p.raw_phase(),
                    p.chunk_index(),
                    p.chunk_count(),
                    p.seq(),
                    p.flags().0
                );
            }
        })));
    }
    let mut ops = Vec::new();
    for seq in 0..3u64 {
        for t in 0..8u32 {
            let o = OpOptions { layer: t, layers: 8, budget_ppm: 10_000, ..OpOptions::default() };
            let len = 1 + (t as usize * 2_311 + seq as usize * 97) % 9_000;
            ops.push((OpId { run: 1, seq, tensor: t }, inputs(seq * 100 + u64::from(t), world, len), o));
        }
    }
    // Rank r starts every op r × 300 µs late: its peers' data for ops it has not
    // started yet must be buffered and replayed, not lost.
    for r in 0..world {
        let at = c.sim.now() + Duration::from_micros(300 * u64::from(r));
        c.sim.run_until(at, |_| false);
        let now = c.sim.now();
        for (id, x, o) in &ops {
            c.sim.node_mut(r).start_allreduce(now, *id, x[r as usize].clone(), *o).unwrap();
        }
    }
    c.run(SECOND * 2);
    let mut outcomes: Vec<Vec<Option<_>>> = vec![vec![None; world as usize]; ops.len()];
    for r in 0..world {
        while let Some(ev) = c.sim.node_mut(r).poll_event() {
            match ev {
                dlcp_proto::endpoint::Event::OpComplete { id, result, report } => {
                    let i = ops.iter().position(|(x, _, _)| *x == id).unwrap();
                    outcomes[i][r as usize] = Some((result, *report));
                }
                dlcp_proto::endpoint::Event::OpFailed { id, error } => {
                    panic!("rank {r}: {id:?} failed: {error}")
                }
                _ => {}
            }
        }
    }
    for (i, per_rank) in outcomes.into_iter().enumerate() {
        let res: Vec<_> = per_rank.into_iter().map(|o| o.expect("op did not complete")).collect();
        check_lossy(&c, ops[i].0, &ops[i].1, ops[i].2, &res);
    }
    let buffered: u64 = (0..world).map(|r| c.sim.node(r).stats().rejected.early_buffered).sum();
    assert!(buffered > 0, "skewed starts buffered nothing: test proves nothing");
}

#[test]
fn restarted_peer_fails_live_ops_then_rejoins_with_new_generation() {
    use dlcp_proto::endpoint::{Endpoint, Event, OpError};
    use dlcp_proto::time::Instant;
    let world = 4;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(91));
    let x = inputs(91, world, 20_000);
    all_ok(c.allreduce(OpId { run: 1, seq: 1, tensor: 0 }, &x, opts(0), SECOND));
    // Op 2 starts everywhere; rank 3's daemon restarts mid-op with generation 2.
    let id2 = OpId { run: 1, seq: 2, tensor: 0 };
    let now = c.sim.now();
    for r in 0..world {
        c.sim.node_mut(r).start_allreduce(now, id2, x[r as usize].clone(), opts(0)).unwrap();
    }
    c.sim.run_until(now + Duration::from_micros(40), |_| false);
    let _ = Instant::ZERO;
    let restarted = Endpoint::new(endpoint_config(3, world, 2), c.sim.now());
    c.sim.replace_node(3, restarted);
    c.run(SECOND);
    for r in 0..3u32 {
        let mut saw = (false, false);
        while let Some(ev) = c.sim.node_mut(r).poll_event() {
            match ev {
                Event::OpFailed { id, error: OpError::PeerRestarted { rank: 3, old: 1, new: 2 } }
                    if id == id2 =>
                {
                    saw.0 = true
                }
                Event::PeerRestarted { rank: 3, old: 1, new: 2 } => saw.1 = true,
                _ => {}
            }
        }
        assert!(saw.0 && saw.1, "rank {r}: restart of rank 3 not reported ({saw:?})");
        assert_eq!(c.sim.node(r).peer_generation(3), Some(2));
    }
    // The run that began before the restart cannot include the new
    // incarnation: the trainers start a new run everywhere (epoch 2 on every
    // rank, also on the restarted one), and its ops succeed.
    let now = c.sim.now();
    assert!(c.sim.node(0).run_waiting().contains(&dlcp_proto::run::Waiting::RestartedSinceRunBegan(3)));
    for r in 0..world {
        let e = c.sim.node_mut(r);
        e.end_run(now);
        if r == 3 {
            e.begin_run(now);
            e.end_run(now);
        }
        assert_eq!(e.begin_run(now), 2);
    }
    c.agree_run();
    let id3 = OpId { run: 2, seq: 3, tensor: 0 };
    let res = all_ok(c.allreduce(id3, &x, opts(0), SECOND));
    let want = bits(&reference_sum(&x));
    assert!(res.iter().all(|(v, _)| bits(v) == want));
}

/// A rank dying at any point of an op — during reduce-scatter, between the
/// phases, or in the middle of the all-gather — must end the op on every other
/// rank with an error within the hard timeout: nudges and probes exchanged
/// among the survivors are not progress.
#[test]
fn a_rank_dying_at_any_phase_ends_the_op_within_the_hard_timeout() {
    use dlcp_proto::endpoint::Event;
    let world = 4;
    let hard = timers().hard_timeout;
    let x = inputs(63, world, 20_000);
    for kill_at_us in [10u64, 40, 70, 100, 130, 160, 190, 220] {
        let mut c = Cluster::new(world, NetConfig::default().with_seed(kill_at_us));
        let id = OpId { run: 1, seq: 1, tensor: 0 };
        let now = c.sim.now();
        for r in 0..world {
            c.sim.node_mut(r).start_allreduce(now, id, x[r as usize].clone(), opts(0)).unwrap();
        }
        c.sim.run_until(now + Duration::from_micros(kill_at_us), |_| false);
        c.sim.set_silent(3, true);
        let t1 = c.sim.now();
        c.run(SECOND * 5);
        for r in 0..3u32 {
            let mut ended = false;
            while let Some(ev) = c.sim.node_mut(r).poll_event() {
                ended |=
                    matches!(ev, Event::OpFailed { id: i, .. } | Event::OpComplete { id: i, .. } if i == id);
            }
            assert!(ended, "killed at {kill_at_us} µs: rank {r} never ended the op");
        }
        let took = c.sim.now() - t1;
        assert!(took <= hard + Duration::from_millis(20), "killed at {kill_at_us} µs: ended after {took:?}");
    }
}

/// Receivers take the lower of their own and the sender's budget: with
/// configs drifted (rank 0's trainer asks for budget 0, the others for 5%)
/// under 3% loss, every transfer into rank 0 closes complete, while the
/// others' close within their 5%.
#[test]
fn a_receiver_never_takes_a_larger_budget_than_its_own() {
    let world = 3;
    let net = NetConfig::default().with_seed(77).with_loss(0.03);
    let mut c = Cluster::new(world, net);
    let x = inputs(77, world, 60_000);
    let id = OpId { run: 1, seq: 1, tensor: 0 };
    let now = c.sim.now();
    for r in 0..world {
        let o = if r == 0 { opts(0) } else { opts(50_000) };
        c.sim.node_mut(r).start_allreduce(now, id, x[r as usize].clone(), o).unwrap();
    }
    c.run(SECOND * 5);
    let mut lossy = 0;
    for r in 0..world {
        let report = std::iter::from_fn(|| c.sim.node_mut(r).poll_event())
            .find_map(|e| match e {
                Event::OpComplete { report, .. } => Some(report),
                _ => None,
            })
            .unwrap_or_else(|| panic!("rank {r} did not complete"));
        for t in &report.scatter {
            if r == 0 {
                assert_eq!(t.delivered_fraction(), 1.0, "into rank 0 from {}: {t:?}", t.peer);
            } else {
                assert!(t.delivered_fraction() >= 0.95, "into rank {r} from {}: {t:?}", t.peer);
                lossy += usize::from(t.delivered_fraction() < 1.0);
            }
        }
    }
    assert!(lossy > 0, "no transfer into ranks 1-2 closed lossy: the test proves nothing");
}

/// The absolute op deadline: an op that keeps progressing, only slowly (a
/// 20 Mbit/s network for 2 MB), fails at its deadline on every rank, long
/// before the no-progress timeout would end it.
#[test]
fn a_progressing_op_fails_at_its_absolute_deadline() {
    use dlcp_proto::endpoint::OpError;
    let world = 3;
    let cfgs = (0..world)
        .map(|r| {
            let mut c = endpoint_config(r, world, 1);
            c.timers.hard_timeout = Duration::from_secs(5);
            c.timers.op_deadline = Duration::from_millis(100);
            c
        })
        .collect();
    let net = NetConfig::default().with_seed(88).with_link_rate(20_000_000);
    let mut c = Cluster::with_configs(net, cfgs);
    let x = inputs(88, world, 500_000);
    let t0 = c.sim.now();
    let out = c.allreduce(OpId { run: 1, seq: 1, tensor: 0 }, &x, opts(0), SECOND * 10);
    let took = c.sim.now() - t0;
    for (r, o) in out.iter().enumerate() {
        match o {
            Err(e @ OpError::Deadline { deadline, .. }) => {
                assert_eq!(*deadline, Duration::from_millis(100));
                assert!(e.to_string().contains("not finished within its deadline of 100ms"), "{e}");
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
    assert!(took < Duration::from_millis(200), "ended after {took:?}");
}

/// An exact all-gather (gather budget 0, the default) agrees no mask: a
/// receiver holding every chunk closes on its own and acknowledges it in an
/// ACK (wire version 10: one per owner for every op completed within the
/// ACK delay), and the owner delivers its result without waiting for it and
/// sends no DONE. When every ACK is lost the owner PROBEs once the ACK delay
/// and a probe timeout have passed, and the receiver — still in the op, or
/// completed and lingering — answers COMPLETE; every result stays exact,
/// nothing times out, and every owner ends with nothing unacknowledged.
#[test]
fn an_exact_all_gather_sends_no_mask_and_survives_lost_acks() {
    use dlcp_proto::wire::{Flags, PacketType, Phase};
    use std::cell::RefCell;
    use std::rc::Rc;
    let world = 4;
    let len = 60_000;
    let x = inputs(71, world, len);
    let mut c = Cluster::new(world, NetConfig::default().with_seed(71));
    // Drop every ACK; count gather DONEs, PROBEs and COMPLETE reports.
    #[derive(Default)]
    struct Seen {
        acks: u32,
        gather_done: u32,
        gather_probe: u32,
        complete: u32,
    }
    let seen: Rc<RefCell<Seen>> = Rc::default();
    let s2 = seen.clone();
    c.sim.set_drop(Some(Box::new(move |rec| {
        let Ok(p) = wire::Packet::new_checked(rec.datagram) else { return false };
        if p.raw_phase() != Phase::Gather as u8 {
            return false;
        }
        let mut s = s2.borrow_mut();
        match p.raw_type() {
            t if t == PacketType::Ack as u8 => {
                s.acks += 1;
                return true;
            }
            t if t == PacketType::Done as u8 => s.gather_done += 1,
            t if t == PacketType::Probe as u8 => s.gather_probe += 1,
            t if t == PacketType::Bitmap as u8 && p.flags().contains(Flags::COMPLETE) => s.complete += 1,
            _ => {}
        }
        false
    })));
    for seq in 0..3 {
        let res = all_ok(c.allreduce(OpId { run: 1, seq, tensor: 0 }, &x, opts(0), SECOND));
        assert_identical(&res);
        assert!(bits(&res[0].0) == bits(&reference_sum(&x)), "op {seq}: exact");
    }
    let now = c.sim.now();
    c.sim.run_to(now + Duration::from_millis(100));
    let s = seen.borrow();
    let pairs = world * (world - 1) * 3;
    assert!(s.acks >= world * (world - 1), "every receiver acknowledged every owner: {}", s.acks);
    assert!(s.acks < pairs, "an ACK covers several ops: {} for {pairs} transfers", s.acks);
    assert_eq!(s.gather_done, 0, "an exact all-gather announces no mask");
    assert!(s.gather_probe >= pairs, "every owner probed for its lost ACKs: {}", s.gather_probe);
    assert!(s.complete >= pairs, "every receiver answered COMPLETE: {}", s.complete);
    let timeouts: u64 = (0..world).map(|r| c.sim.node(r).stats().hard_timeouts).sum();
    assert_eq!(timeouts, 0);
    for r in 0..world {
        assert_eq!(c.sim.node(r).ops_unacknowledged(), 0, "rank {r}");
    }
}

/// On a clean network an exact all-gather costs one ACK per (receiver,
/// owner) for every op completed within the ACK delay, and nothing else
/// comes back: no COMPLETE report, no PROBE, no DONE. The owners deliver
/// their results before the ACKs arrive and retire the ops when they do.
#[test]
fn a_clean_all_gather_is_acknowledged_in_one_ack_per_owner_for_many_ops() {
    use dlcp_proto::wire::{PacketType, Phase};
    use std::cell::RefCell;
    use std::rc::Rc;
    let world = 4;
    let x = inputs(72, world, 40_000);
    let mut c = Cluster::new(world, NetConfig::default().with_seed(72));
    let counts: Rc<RefCell<[u32; 9]>> = Rc::default();
    let c2 = counts.clone();
    c.sim.set_drop(Some(Box::new(move |rec| {
        if let Ok(p) = wire::Packet::new_checked(rec.datagram)
            && p.raw_phase() == Phase::Gather as u8
        {
            c2.borrow_mut()[usize::from(p.raw_type()).min(8)] += 1;
        }
        false
    })));
    let ops = 6;
    for seq in 0..ops {
        let res = all_ok(c.allreduce(OpId { run: 1, seq, tensor: 0 }, &x, opts(0), SECOND));
        assert!(bits(&res[0].0) == bits(&reference_sum(&x)), "op {seq}: exact");
    }
    let delivered: usize = (0..world).map(|r| c.sim.node(r).ops_unacknowledged()).sum();
    assert!(delivered > 0, "owners delivered before their ACKs arrived");
    let now = c.sim.now();
    c.sim.run_to(now + Duration::from_millis(50));
    let n = *counts.borrow();
    let pairs = world * (world - 1);
    assert!(n[PacketType::Ack as usize] >= pairs, "{n:?}");
    assert!(n[PacketType::Ack as usize] < pairs * ops as u32 / 2, "several ops per ACK: {n:?}");
    for ty in [PacketType::Bitmap, PacketType::Probe, PacketType::Done] {
        assert_eq!(n[ty as usize], 0, "{ty:?} in the all-gather: {n:?}");
    }
    let acked: u64 = (0..world).map(|r| c.sim.node(r).stats().acks_received).sum();
    assert_eq!(acked, u64::from(pairs) * ops, "one entry per transfer");
    for r in 0..world {
        assert_eq!(c.sim.node(r).ops_unacknowledged(), 0, "rank {r}");
    }
}
