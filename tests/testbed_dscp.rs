//! DSCP on the wire, on the emulated cluster of `scripts/testbed.sh`: two real
//! `dlcpd` in two host namespaces with a non-default class → DSCP map, a
//! capture on the switch port of host 1, and a check that every dlcp datagram's
//! DSCP equals the configured value of its class (the class is byte 5 of the
//! dlcp header) — control packets (class 7) included — and that the switch's
//! per-class htb counters saw the same datagrams.
//!
//! Needs root and network namespaces; where they are unavailable it fails under `DLCP_REQUIRE_NETNS=1` / `DLCP_CI=1`
//! and is reported as skipped otherwise (see `tests/prereq`). Needs tcpdump
//! (apt-get install tcpdump).

mod prereq;
mod testbed_common;

use std::collections::BTreeMap;
use std::time::Duration;

use dlcp::shm::{Status, SubmitOptions, TrainerChannel};
use testbed_common::*;

/// Namespace prefix of this test's testbed (distinct from the shell tests').
const PREFIX: &str = "dlcptbr";
/// A class → DSCP map unlike the default [0, 10, 18, 26, 34, 40, 46, 48].
const DSCP: [u8; 8] = [2, 14, 22, 30, 38, 42, 44, 56];
const HOSTS: usize = 2;

#[test]
fn dlcp_marks_every_datagram_with_its_class_dscp_on_the_wire() {
    let dscp: Vec<String> = DSCP.iter().map(|d| d.to_string()).collect();
    let priority = format!("[priority]\ndscp = [{}]\n", dscp.join(", "));
    let Some(mut bed) = Bed::start_with(PREFIX, HOSTS, &["--dscp", &dscp.join(",")], 10_000, &priority)
    else {
        return;
    };
    // Capture on switch port p1 (both directions of host 1's link), headers only.
    let cap = bed.capture("p1", &[]);

    // Tensors at every layer position, large and small values, reliable and
    // lossy budgets: reduce-scatter classes 0..3, all-gather 4..6, control 7.
    const LAYERS: u32 = 4;
    let workers: Vec<_> = bed
        .sockets
        .iter()
        .enumerate()
        .map(|(h, sock)| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&sock, u64::from(JOB), 0, 1).expect("attach");
                let mut out = Vec::new();
                for round in 0..3u32 {
                    for layer in 0..LAYERS {
                        let n = 50_000 + 1000 * layer as usize;
                        let name = format!("l{layer}r{round}");
                        let t = cl.alloc(&name, n as u64).expect("alloc");
                        let x = data(u64::from(layer * 10 + round), n);
                        cl.write(&t, &x).expect("write");
                        let o = SubmitOptions {
                            tensor_id: layer + LAYERS * round,
                            layer,
                            layers: LAYERS,
                            budget_ppm: if round == 1 { 10_000 } else { 0 },
                            ..Default::default()
                        };
                        cl.submit(&t, o).expect("submit");
                        let d = cl.wait_completion(Duration::from_secs(30)).expect("completion");
                        assert_eq!(d.status, Status::Ok, "host {h} op layer {layer} round {round}");
                        out.push(cl.read(&t).unwrap());
                        cl.free(&name).unwrap();
                    }
                }
                out
            })
        })
        .collect();
    let results: Vec<Vec<Vec<f32>>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(results[0], results[1], "ranks disagree");
    // Heartbeats (class 7) keep flowing; give the capture a moment to flush.
    std::thread::sleep(Duration::from_millis(400));
    let htb: BTreeMap<u8, u64> =
        htb_classes(PREFIX, "p1").into_iter().map(|(c, (sent, _))| (c, sent)).collect();
    let marks = dlcp_marks(&bed.finish_capture(cap), PORT);
    let mut per_class: BTreeMap<u8, u64> = BTreeMap::new();
    let mut to_h1: BTreeMap<u8, u64> = BTreeMap::new();
    let mut wrong = Vec::new();
    for &Mark { tos, class, dst, .. } in &marks {
        assert!(class < 8, "class byte {class} out of range");
        *per_class.entry(class).or_default() += 1;
        if dst == [10, 77, 0, 2] {
            *to_h1.entry(class).or_default() += 1;
        }
        if tos != DSCP[usize::from(class)] << 2 {
            wrong.push((class, tos >> 2, tos & 3));
        }
    }
    eprintln!("dlcp datagrams on p1 per class: {per_class:?}, of them to host 1: {to_h1:?}");
    eprintln!("htb packets on p1 (egress to host 1) per class: {htb:?}");
    assert!(marks.len() > 200, "only {} dlcp datagrams captured", marks.len());
    assert!(
        wrong.is_empty(),
        "{} of {} datagrams carry a wrong mark, first (class, dscp, ecn): {:?}",
        wrong.len(),
        marks.len(),
        &wrong[..wrong.len().min(10)]
    );
    assert!(per_class.contains_key(&7), "no control packets (class 7) captured: {per_class:?}");
    let scatter = (0..=3).filter(|c| per_class.contains_key(c)).count();
    let gather = (4..=6).filter(|c| per_class.contains_key(c)).count();
    assert!(scatter >= 2 && gather >= 2, "too few data classes on the wire: {per_class:?}");
    // The switch classified by those marks: the datagrams to host 1 left
    // through p1's htb classes; data classes are quiet once
    // the ops are done, so their counts agree exactly. Class 0's htb class
    // also takes unclassified traffic (ARP, neighbour discovery); class 7
    // (heartbeats) keeps flowing between the two readings.
    for c in 1..=6u8 {
        let wire = to_h1.get(&c).copied().unwrap_or(0);
        let sw = htb.get(&c).copied().unwrap_or(0);
        assert_eq!(sw, wire, "class {c}: htb class 1:1{c} counted {sw}, the capture {wire}");
    }
    assert!(htb.get(&0).copied().unwrap_or(0) >= to_h1.get(&0).copied().unwrap_or(0));
}
