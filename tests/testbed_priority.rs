//! Priority under congestion on the emulated cluster of `scripts/testbed.sh`:
//! host 1's switch port is a 200 Mbit/s bottleneck; the daemons' traffic into
//! host 1 competes with iperf3 UDP best-effort cross traffic (DSCP 0) from
//! host 2. Two cases, each asserting that the port really dropped packets (htb
//! counters), that every higher class lost a smaller fraction than class 0
//! (best effort), that of a front and a back tensor submitted at the same
//! moment (the back one first), the front one completes first (completion
//! order and the daemons' report durations), and that results stay exact
//! (budget 0):
//!
//! - with the default `[priority].dscp`, which marks no class with best
//!   effort's DSCP 0 (classes 0 and 1 share AF11's queue), dlcp's data is
//!   served above the cross traffic: the daemons send at class 0 too (their
//!   per-class counters) and AF11's queue counts classes 0 and 1 into host 1,
//!   and host 1 has to repair next to nothing of either layer;
//! - with class 0 marked DSCP 0 (`dscp = [0, 10, ...]`, the back layer's
//!   smaller chunks queue with best effort), the daemons' own reports agree
//!   with the port: host 1 had to repair a smaller fraction of the front
//!   layer's chunks than of the back layer's.
//!
//! Needs root, network namespaces and iperf3; where namespaces are unavailable it
//! fails under `DLCP_REQUIRE_NETNS=1` / `DLCP_CI=1` and is reported as skipped
//! otherwise (see `tests/prereq`).

mod prereq;
mod testbed_common;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use dlcp::shm::{Status, SubmitOptions, TrainerChannel};
use testbed_common::*;

const PREFIX: &str = "dlcptbq";
const PREFIX_SHARED: &str = "dlcptba";
const HOSTS: usize = 3;
const N: usize = 1 << 19;
const ROUNDS: usize = 3;
/// Each daemon's send rate: two senders into host 1 stay below its port rate,
/// so the congestion comes from the best-effort cross traffic.
const PACING_MBPS: u32 = 70;

fn frac(m: &BTreeMap<u8, (u64, u64)>, classes: &[u8]) -> (u64, u64, f64) {
    let (s, d) = classes.iter().filter_map(|c| m.get(c)).fold((0, 0), |(s, d), &(a, b)| (s + a, d + b));
    (s, d, if s + d == 0 { 0.0 } else { d as f64 / (s + d) as f64 })
}

/// Repairs at host 1 allowed with the default marks, of either layer's chunks
/// (in every transfer into host 1): dlcp's own traffic stays below the port
/// rate, so only a burst meeting a full queue of its own class loses (seen: 20
/// of 6,120 front-layer chunks in one run, none in another).
const DEFAULT_REPAIRS: f64 = 0.02;

#[test]
fn bottleneck_with_cross_traffic_dlcp_goes_above_best_effort_and_front_completes_first() {
    congested_port(PREFIX, None);
}

#[test]
fn bottleneck_with_class_0_marked_best_effort_front_layer_loses_less() {
    congested_port(PREFIX_SHARED, Some("0,10,18,26,34,40,46,48"));
}

/// One run of the congested port. `shared`: a class → DSCP map (for every
/// daemon and the switch) that marks class 0 with best effort's DSCP 0.
fn congested_port(prefix: &'static str, shared: Option<&str>) {
    let mut extra = format!("[pacing]\nrate_mbps = {PACING_MBPS}\n");
    let mut args = vec!["--rate", "200", "--rate-ports", "1"];
    if let Some(map) = shared {
        extra += &format!("[priority]\ndscp = [{}]\n", map.replace(',', ", "));
        args.extend(["--dscp", map]);
    }
    let shared = shared.is_some();
    let Some(mut bed) = Bed::start_with(prefix, HOSTS, &args, 10_000, &extra) else { return };
    // Cross traffic: best effort UDP from host 2 into host 1, above the port rate.
    let server = Command::new("ip")
        .args(["netns", "exec", &bed.ns(1), "iperf3", "-s", "-p", "5301", "-1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 (apt-get install iperf3)");
    bed.others.push(server);
    bed.wait_tcp_listen(1, 5301);
    let before = htb_classes(prefix, "p1");
    let mut client = Command::new("ip")
        .args(["netns", "exec", &bed.ns(2), "iperf3", "-u", "-c", "10.77.0.2", "-p", "5301", "--tos", "0"])
        .args(["-b", "300M", "-l", "1400", "-t", "15"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    if let Some(st) = client.try_wait().unwrap() {
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut client.stderr.take().unwrap(), &mut err);
        panic!("the iperf3 cross-traffic client exited before the run ({st}): {err}");
    }
    bed.others.push(client);

    // Every round, every host submits the back layer's tensor, then at once
    // the front layer's (layers = 2: layer 0 is the front).
    let hs: Vec<_> = (0..HOSTS)
        .map(|h| {
            let s = bed.sockets[h].clone();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&s, u64::from(JOB), 0, 1).expect("attach");
                let mut rounds = Vec::new();
                for r in 0..ROUNDS {
                    let back = cl.alloc(&format!("back{r}"), N as u64).unwrap();
                    let front = cl.alloc(&format!("front{r}"), N as u64).unwrap();
                    cl.write(&back, &data(seed(h, 2 * r), N)).unwrap();
                    cl.write(&front, &data(seed(h, 2 * r + 1), N)).unwrap();
                    let o = |tensor_id, layer| SubmitOptions {
                        tensor_id,
                        layer,
                        layers: 2,
                        budget_ppm: 0,
                        ..Default::default()
                    };
                    let sb = cl.submit(&back, o(2 * r as u32, 1)).unwrap();
                    let sf = cl.submit(&front, o(2 * r as u32 + 1, 0)).unwrap();
                    let mut order = Vec::new();
                    for _ in 0..2 {
                        let d = cl.wait_completion(Duration::from_secs(20)).expect("a completion");
                        assert_eq!(d.status, Status::Ok, "host {h} round {r}: {d:?}");
                        order.push(d.op_seq);
                    }
                    let (ob, of) = (cl.read(&back).unwrap(), cl.read(&front).unwrap());
                    cl.free(&back.name).unwrap();
                    cl.free(&front.name).unwrap();
                    rounds.push((sb, sf, order, ob, of));
                }
                rounds
            })
        })
        .collect();
    let results: Vec<_> = hs.into_iter().map(|h| h.join().expect("trainer thread")).collect();
    let after = htb_classes(prefix, "p1");
    let cross = bed.others.last_mut().unwrap().try_wait().unwrap();
    assert!(
        cross.is_none(),
        "the iperf3 cross traffic stopped during the run ({cross:?}): the congestion was not there throughout"
    );
    let delta: BTreeMap<u8, (u64, u64)> = after
        .iter()
        .map(|(c, &(s, d))| {
            let (s0, d0) = before.get(c).copied().unwrap_or((0, 0));
            (*c, (s - s0, d - d0))
        })
        .collect();

    eprintln!("switch port p1 (200 Mbit/s into host 1), per htb class during the run:");
    eprintln!("  class  sent_pkts  dropped  drop%");
    for (c, (s, d)) in &delta {
        let f = if s + d == 0 { 0.0 } else { 100.0 * *d as f64 / (s + d) as f64 };
        eprintln!("  {c:>5}  {s:>9}  {d:>7}  {f:>5.2}");
    }
    let mut front_first = 0;
    // The daemon's own view of the loss: chunks host 1 (behind the bottleneck)
    // received only by repair, per tensor, over every transfer into it.
    let (mut front_rep, mut front_chunks, mut back_rep, mut back_chunks) = (0u64, 0u64, 0u64, 0u64);
    for (h, rounds) in results.iter().enumerate() {
        for (r, (sb, sf, order, ob, of)) in rounds.iter().enumerate() {
            let rb = bed.report(h, *sb, 2 * r as u32);
            let rf = bed.report(h, *sf, 2 * r as u32 + 1);
            if h == 1 {
                for (rep, chunks, report) in
                    [(&mut back_rep, &mut back_chunks, &rb), (&mut front_rep, &mut front_chunks, &rf)]
                {
                    for t in report["scatter"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .chain(report["gather"].as_array().unwrap())
                    {
                        *rep += t["repaired"].as_u64().unwrap();
                        *chunks += t["chunks"].as_u64().unwrap();
                    }
                }
            }
            let (db, df) = (rb["duration_us"].as_u64().unwrap(), rf["duration_us"].as_u64().unwrap());
            eprintln!(
                "host {h} round {r}: completion order {order:?} (back {sb}, front {sf}); durations back {db} us, front {df} us"
            );
            front_first += usize::from(order[0] == *sf && df < db);
            for (name, got, base) in [("back", ob, 2 * r), ("front", of, 2 * r + 1)] {
                let mut want = data(seed(0, base), N);
                for k in 1..HOSTS {
                    want.iter_mut().zip(data(seed(k, base), N)).for_each(|(a, b)| *a += b);
                }
                assert!(
                    got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "host {h} round {r}: {name} tensor not exact under congestion (budget 0)"
                );
            }
        }
    }
    let (_, port_drops, _) = frac(&delta, &[0, 1, 2, 3, 4, 5, 6, 7]);
    assert!(
        port_drops > 0,
        "the bottleneck port dropped nothing: no congestion, the test proves nothing: {delta:?}"
    );
    let (_, _, low) = frac(&delta, &[0]);
    assert!(low > 0.0, "class 0 (best effort) lost nothing: {delta:?}");
    // Every daemon sends at every class, class 0 included, whatever its mark.
    let mut low_into_h1 = 0;
    for h in 0..HOSTS {
        let st = bed.stats(h);
        let sent = &st["protocol"]["tx_packets_per_class"];
        let at =
            |c: usize| sent[c].as_u64().unwrap_or_else(|| panic!("host {h}: no tx_packets_per_class: {st}"));
        eprintln!("host {h}: datagrams sent per class {:?}", (0..8).map(at).collect::<Vec<_>>());
        for c in 0..=7 {
            assert!(at(c) > 0, "host {h} sent nothing at class {c}");
        }
        // Classes 0 and 1 are reduce-scatter: half of each sender's go to host 1.
        if h != 1 {
            low_into_h1 += (at(0) + at(1)) / 2;
        }
    }
    // Which queue dlcp's class 0 took: with the default marks AF11's (queue 1,
    // with class 1), so queue 1 counted both classes' datagrams into host 1;
    // marked DSCP 0, class 0 went to queue 0 and queue 1 counted about half.
    let (q1s, q1d, _) = frac(&delta, &[1]);
    eprintln!(
        "queue 1 (AF11) counted {} datagrams; dlcp sent about {low_into_h1} of classes 0 and 1 into host 1",
        q1s + q1d
    );
    if !shared {
        assert!(
            (q1s + q1d) as f64 >= 0.9 * low_into_h1 as f64,
            "queue 1 counted {} datagrams, but dlcp sent about {low_into_h1} of classes 0 and 1 into host 1: class 0 was not served in AF11's queue",
            q1s + q1d
        );
    }
    for c in 1..=7u8 {
        let (sent, dropped, f) = frac(&delta, &[c]);
        assert!(sent > 0, "no packets of class {c} crossed the port: {delta:?}");
        assert!(
            f < low,
            "class {c} lost {dropped} of {} ({:.2}%), not less than class 0 ({:.2}%): {delta:?}",
            sent + dropped,
            100.0 * f,
            100.0 * low
        );
    }
    let (fs, fd, ff) = frac(&delta, &[2, 3, 5, 6]);
    // With the default marks, queue 1 carries dlcp's classes 0 and 1, queue 0
    // only the cross traffic.
    let (bs, bd, bf) = frac(&delta, if shared { &[0, 1, 4] } else { &[1, 4] });
    eprintln!(
        "front layer classes 2,3,5,6: {fd} of {} dropped ({:.2}%); back layer classes {}: {bd} of {} ({:.2}%)",
        fs + fd,
        100.0 * ff,
        if shared { "0,1,4 (+ cross traffic in 0)" } else { "1,4" },
        bs + bd,
        100.0 * bf
    );
    let (fr, br) =
        (front_rep as f64 / front_chunks.max(1) as f64, back_rep as f64 / back_chunks.max(1) as f64);
    eprintln!(
        "daemon reports at host 1: front tensor {front_rep} of {front_chunks} chunks arrived only by repair ({:.2}%), back tensor {back_rep} of {back_chunks} ({:.2}%)",
        100.0 * fr,
        100.0 * br
    );
    if shared {
        assert!(
            back_rep > 0,
            "the daemon repaired nothing of the back layer behind the bottleneck: no loss seen"
        );
        assert!(
            fr < br,
            "the front layer needed as many repairs ({:.2}%) as the back layer ({:.2}%): priority did not protect it",
            100.0 * fr,
            100.0 * br
        );
    } else {
        // Neither layer meets the cross traffic: the order of the two is not
        // tested here (a burst may hit either), only that both got through.
        for (name, f) in [("back", br), ("front", fr)] {
            assert!(
                f <= DEFAULT_REPAIRS,
                "with no class marked best effort, host 1 still repaired {:.2}% of the {name} layer's chunks (at most {:.2}% allowed)",
                100.0 * f,
                100.0 * DEFAULT_REPAIRS
            );
        }
    }
    assert_eq!(
        front_first,
        HOSTS * ROUNDS,
        "the front layer's tensor did not always complete first (completion order and report durations above)"
    );
}
