//! The repaired set is exactly what the budget requires: every missing
//! non-droppable chunk, then droppable ones highest class first (ties: lowest
//! index), until ⌊n·p⌋ remain missing — no more. First-pass chunks are dropped
//! by a filter at the receiver (repairs are never dropped), and the repairs on
//! the wire are compared with the set computed from the classes and flags the
//! sender put on the first pass.

mod common;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use common::*;
use dlcp_proto::class::{Class, ClassSet};
use dlcp_proto::endpoint::{Endpoint, OpId, OpOptions, Transmit, allowed_missing};
use dlcp_proto::sim::{NetConfig, Node, Sim, TraceEvent};
use dlcp_proto::time::{Duration, Instant};
use dlcp_proto::wire::{Flags, Packet, PacketType, Phase};

/// An endpoint that loses the first copy of chosen scatter chunks addressed to it.
struct Lossy {
    inner: Endpoint,
    drop: BTreeSet<u32>,
}

impl Node for Lossy {
    fn handle_datagram(&mut self, now: Instant, d: &[u8]) {
        if let Ok(p) = Packet::new_checked(d)
            && p.raw_type() == PacketType::Data as u8
            && p.raw_phase() == Phase::Scatter as u8
            && !p.flags().contains(Flags::REPAIR)
            && self.drop.contains(&p.chunk_index())
        {
            return;
        }
        self.inner.handle_datagram(now, d)
    }
    fn handle_timeout(&mut self, now: Instant) {
        self.inner.handle_timeout(now)
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.inner.poll_transmit(now, buf)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.inner.poll_timeout()
    }
}

#[derive(Default)]
struct Seen {
    /// chunk → (class, required) of first-pass scatter DATA 1 → 0.
    first: BTreeMap<u32, (u8, bool)>,
    /// Repaired chunks 1 → 0, in send order.
    repairs: Vec<u32>,
}

fn run(budget_ppm: u32, drop: BTreeSet<u32>, layer: u32) -> (Seen, u32) {
    let world = 2;
    let nodes = (0..world)
        .map(|r| Lossy {
            inner: Endpoint::new(
                {
                    // Classes by magnitude only (4 levels over scatter classes
                    // 0..=3), class 3 not droppable: the dropped set mixes
                    // required chunks and droppable chunks of three classes.
                    let mut c = endpoint_config(r, world, 1);
                    c.classifier.layer_levels = 1;
                    c.classifier.magnitude_levels = 4;
                    c.classifier.droppable = ClassSet::from_classes((0..=2).filter_map(Class::new));
                    c
                },
                Instant::ZERO,
            ),
            drop: if r == 0 { drop.clone() } else { BTreeSet::new() },
        })
        .collect();
    let mut sim = Sim::new(NetConfig::default().with_seed(3), nodes);
    let seen = Rc::new(RefCell::new(Seen::default()));
    let s2 = seen.clone();
    sim.set_trace(Some(Box::new(move |rec| {
        let p = Packet::new_checked(rec.datagram).unwrap();
        if std::env::var_os("DBG").is_some()
            && (p.raw_type() != 1 || p.flags().contains(Flags::REPAIR))
            && rec.event != TraceEvent::Enqueued
            && p.raw_type() != 5
        {
            eprintln!(
                "{:>8} {:?} {}->{} ty{} ph{} ci{} seq{} fl{:x} cl{}",
                rec.time.as_nanos(),
                rec.event,
                rec.src,
                rec.dst,
                p.raw_type(),
                p.raw_phase(),
                p.chunk_index(),
                p.seq(),
                p.flags().0,
                p.raw_class()
            );
        }
        if rec.event != TraceEvent::Sent || rec.src != 1 || rec.dst != 0 {
            return;
        }
        if p.raw_type() != PacketType::Data as u8 || p.raw_phase() != Phase::Scatter as u8 {
            return;
        }
        let mut s = s2.borrow_mut();
        if p.flags().contains(Flags::REPAIR) {
            s.repairs.push(p.chunk_index());
        } else {
            s.first.insert(p.chunk_index(), (p.raw_class(), p.flags().contains(Flags::REQUIRED)));
        }
    })));
    let x = inputs(17, world, 40_000);
    let o = OpOptions { layer, layers: 4, budget_ppm, ..OpOptions::default() };
    for r in 0..world {
        sim.node_mut(r).inner.begin_run(Instant::ZERO);
    }
    sim.run_until(Instant::ZERO + Duration::from_millis(100), |s| {
        (0..world).all(|r| s.node(r).inner.run().is_some_and(|(_, id)| id != 0))
    });
    let now = sim.now();
    for r in 0..world {
        sim.node_mut(r)
            .inner
            .start_allreduce(now, OpId { run: 1, seq: 1, tensor: 1 }, x[r as usize].clone(), o)
            .unwrap();
    }
    sim.run_until(now + Duration::from_secs(1), |s| (0..world).all(|r| s.node(r).inner.ops_in_flight() == 0));
    let n = seen.borrow().first.len() as u32;
    drop_unused(&mut sim);
    (std::mem::take(&mut *seen.borrow_mut()), n)
}

fn drop_unused(sim: &mut Sim<Lossy>) {
    for r in 0..2 {
        while let Some(ev) = sim.node_mut(r).inner.poll_event() {
            assert!(
                matches!(
                    ev,
                    dlcp_proto::endpoint::Event::OpComplete { .. }
                        | dlcp_proto::endpoint::Event::PeerUp { .. }
                ),
                "{ev:?}"
            );
        }
    }
}

/// The repair set the contract demands.
fn expected(seen: &Seen, dropped: &BTreeSet<u32>, allowed: u32) -> Vec<u32> {
    let mut required: Vec<u32> = dropped.iter().copied().filter(|c| seen.first[c].1).collect();
    let mut optional: Vec<u32> = dropped.iter().copied().filter(|c| !seen.first[c].1).collect();
    optional.sort_by(|a, b| seen.first[b].0.cmp(&seen.first[a].0).then(a.cmp(b)));
    let excess = optional.len().saturating_sub(allowed as usize);
    required.extend_from_slice(&optional[..excess]);
    required.sort();
    required
}

#[test]
fn repairs_exactly_what_the_budget_requires_highest_class_first() {
    // (layer, budget, drop every k-th chunk): 14% dropped against budgets of
    // 0–10%, and 2% dropped against 5%, where only the required chunks among
    // the dropped ones may be repaired.
    for (layer, budget, every) in
        [(3u32, 50_000u32, 7u32), (3, 10_000, 7), (0, 100_000, 7), (3, 0, 7), (3, 50_000, 50)]
    {
        let dropped: BTreeSet<u32> = (0..400).filter(|c| c % every == 3).collect();
        let (seen, n) = run(budget, dropped.clone(), layer);
        let dropped: BTreeSet<u32> = dropped.into_iter().filter(|c| *c < n).collect();
        let allowed = allowed_missing(n, budget);
        let want = expected(&seen, &dropped, allowed);
        let mut got = seen.repairs.clone();
        got.sort();
        got.dedup();
        assert_eq!(
            got, want,
            "layer {layer} budget {budget}: repaired set differs (n {n}, allowed {allowed})"
        );
        assert_eq!(
            seen.repairs.len(),
            want.len(),
            "layer {layer} budget {budget}: a chunk was repaired twice"
        );
        let classes: BTreeSet<u8> = dropped.iter().map(|c| seen.first[c].0).collect();
        assert!(classes.len() >= 2, "dropped chunks span classes {classes:?}: ordering untested");
        assert!(dropped.iter().any(|c| seen.first[c].1), "no required chunk was dropped: untested");
        assert!(budget == 0 || want.len() < dropped.len(), "budget {budget} allowed nothing to stay missing");
    }
}
