//! From 8 ranks, an all-gather transfer to a rank that had not reduced when
//! it began goes at the op's lowest reduce-scatter class, all of its first
//! pass (its chunks keep their order), so that at the rank's strict-priority
//! port it does not overtake the contributions the rank still waits for; its
//! repairs go at the all-gather's own class once the rank's all-gather has
//! arrived (the lowest class may be class 0, which best-effort traffic
//! shares). See `Op::network_class`, which also says why not below 8 ranks.
//!
//! Eight ranks on 1 Gbit/s links, back-to-back 1 MiB ops of a back layer
//! (`layer = 1` of 2: reduce-scatter classes 0 and 1, all-gather class 4).
//! Asserted, clean: every result exact and as the oracle recomputes it;
//! every transfer's first pass at one class, a reduce-scatter class exactly
//! when its receiver had not reduced when it began, and some of each kind.
//! At 1% loss: every all-gather repair sent after its receiver's all-gather
//! arrived at class 4 (session 43's rule sent them at class 0), every one
//! before at a reduce-scatter class. And below 8 ranks nothing is demoted.

mod common;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use common::*;
use dlcp_proto::endpoint::OpOptions;
use dlcp_proto::sim::{NetConfig, TraceEvent};
use dlcp_proto::time::Duration;
use dlcp_proto::wire::{self, Flags, PacketType, Phase};

const LEN: usize = 256 * 1024; // 1 MiB of f32 per rank
const LINK: u64 = 1_000_000_000;
const OPS: u64 = 12;

/// All-gather DATA on the wire, by whether its receiver had reduced.
#[derive(Default, Debug)]
struct Seen {
    /// (op, at, from): `from`'s all-gather reached `at`.
    reduced: BTreeSet<(u64, u32, u32)>,
    /// Per transfer (op, from, to): whether its receiver had reduced when
    /// its first chunk left, and the classes of its first pass.
    first_pass: BTreeMap<(u64, u32, u32), (bool, BTreeSet<u8>)>,
    /// Repairs sent before the receiver's all-gather arrived, and those of
    /// them not at a reduce-scatter class.
    early_repairs: u64,
    early_wrong: u64,
    /// Repairs sent after, and those not at class 4.
    late_repairs: u64,
    late_wrong: u64,
}

/// Run `OPS` back-layer ops on `world` ranks at 1 Gbit/s with `loss`: the
/// median op in link-limit transfer times, and what the all-gathers did.
fn run(world: u32, loss: f64, seed: u64) -> (f64, Seen) {
    let net = NetConfig { loss, ..NetConfig::default().with_seed(seed).with_link_rate(LINK) };
    let mut c = Cluster::new(world, net);
    let seen: Rc<RefCell<Seen>> = Rc::default();
    let s = seen.clone();
    c.sim.set_trace(Some(Box::new(move |rec| {
        let Ok(p) = wire::Packet::new_checked(rec.datagram) else { return };
        if p.raw_type() != PacketType::Data as u8 || p.raw_phase() != Phase::Gather as u8 {
            return;
        }
        let mut s = s.borrow_mut();
        let (op, src, dst, class) = (p.op(), p.src(), p.dst(), p.raw_class());
        match rec.event {
            TraceEvent::Delivered => {
                s.reduced.insert((op, dst, src));
            }
            TraceEvent::Sent => {
                let reduced = s.reduced.contains(&(op, src, dst));
                if p.flags().contains(Flags::REPAIR) {
                    if reduced {
                        s.late_repairs += 1;
                        s.late_wrong += u64::from(class != 4);
                    } else {
                        s.early_repairs += 1;
                        s.early_wrong += u64::from(class > 3);
                    }
                } else {
                    s.first_pass.entry((op, src, dst)).or_insert((reduced, BTreeSet::new())).1.insert(class);
                }
            }
            _ => {}
        }
    })));
    let o = OpOptions { layer: 1, layers: 2, ..opts(0) };
    let x = inputs(11, world, LEN);
    let mut times = Vec::new();
    for seq in 0..OPS {
        let out = c.checked_allreduce(seq, &x, o, Duration::from_secs(5));
        // The first op pays for the handshake's timing; measure the rest.
        if seq > 0 {
            times.extend(out.iter().map(|(_, r)| r.duration().as_secs_f64()));
        }
    }
    times.sort_by(f64::total_cmp);
    // One transfer at the link limit: the (world - 1) / world of the tensor
    // a rank sends in one phase, with headers, tags and framing.
    let chunks = (LEN * 4).div_ceil(CHUNK_BYTES) as f64 * f64::from(world - 1) / f64::from(world);
    let frame = (CHUNK_BYTES + wire::HEADER_LEN + wire::TAG_LEN + 42) as f64;
    let transfer = chunks * frame * 8.0 / LINK as f64;
    drop(c);
    let seen = Rc::try_unwrap(seen).expect("the trace hook is gone").into_inner();
    (times[times.len() / 2] / transfer, seen)
}

#[test]
fn an_all_gather_to_a_rank_not_yet_reduced_goes_below_its_contributions() {
    let (p50, s) = run(8, 0.0, 3);
    let demoted = s.first_pass.values().filter(|(reduced, _)| !reduced).count();
    eprintln!(
        "8 ranks: p50 {p50:.2} transfer times; {} all-gather transfers, {demoted} begun before their receiver reduced",
        s.first_pass.len()
    );
    for (t, (reduced, classes)) in &s.first_pass {
        assert_eq!(classes.len(), 1, "transfer {t:?}: its first pass changed class: {classes:?}");
        let class = *classes.first().unwrap();
        if *reduced {
            assert_eq!(class, 4, "transfer {t:?} began after its receiver reduced: at its own class");
        } else {
            assert!(class <= 3, "transfer {t:?} began before its receiver reduced: at class {class}");
        }
    }
    assert!(demoted > 0 && demoted < s.first_pass.len(), "transfers of both kinds: {demoted} demoted");
}

#[test]
fn an_all_gather_repairs_at_its_own_class_once_its_receiver_reduced() {
    let (p50, s) = run(8, 0.01, 4);
    eprintln!(
        "8 ranks, 1% loss: p50 {p50:.2} transfer times; repairs before reduced {} ({} wrong), after {} ({} wrong)",
        s.early_repairs, s.early_wrong, s.late_repairs, s.late_wrong
    );
    assert!(s.late_repairs > 0, "no all-gather repair after its receiver reduced");
    assert_eq!(s.late_wrong, 0, "repairs to a rank that had reduced not at the all-gather's class");
    assert_eq!(s.early_wrong, 0, "repairs to a rank not yet reduced above the reduce-scatter classes");
}

#[test]
fn below_eight_ranks_every_all_gather_goes_at_its_own_class() {
    let (p50, s) = run(4, 0.0, 3);
    eprintln!("4 ranks: p50 {p50:.2} transfer times");
    for (t, (_, classes)) in &s.first_pass {
        assert!(classes.iter().all(|&c| c == 4), "transfer {t:?} at classes {classes:?}, not its own 4");
    }
    assert!(!s.first_pass.is_empty());
}
