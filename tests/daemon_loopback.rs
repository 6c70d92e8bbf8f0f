//! End to end on loopback: real `dlcpd` processes, real trainers attached over
//! shared memory, real UDP.

mod daemon_common;
mod prereq;

use std::time::Duration;

use daemon_common::*;
use dlcp::shm::{Status, SubmitOptions, TrainerChannel};

const HOSTS: u32 = 4;
const TRAINERS: u32 = 2;

/// 20 ops, element counts from 1 KiB to 64 MiB of f32 (odd sizes included).
const SIZES: [usize; 20] = [
    256,
    1000,
    4099,
    65_536,
    250_001,
    1 << 20,
    256,
    1000,
    4099,
    65_536,
    250_001,
    1 << 20,
    77,
    3,
    12_345,
    999_999,
    2 << 20,
    4 << 20,
    1 << 24,
    256,
];
/// The ops of the lossy test (its reports are checked one by one).
const LOSSY_OPS: usize = 8;

fn trainer_seed(host: u32, local: u32, op: usize) -> u64 {
    (u64::from(host) << 32) | (u64::from(local) << 16) | op as u64
}

/// Run `SIZES` ops with every trainer on every host; return each trainer's results.
fn run_ops(c: &Cluster, budget_ppm: u32, flags: u32, ops: usize) -> Vec<Vec<(Vec<f32>, u32)>> {
    let mut handles = Vec::new();
    for h in 0..HOSTS {
        for k in 0..TRAINERS {
            let socket = c.daemons[h as usize].socket.clone();
            handles.push(std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&socket, u64::from(JOB), k, TRAINERS).expect("attach");
                let mut out = Vec::new();
                for (i, &n) in SIZES.iter().enumerate().take(ops) {
                    let t = cl.alloc(&format!("t{i}"), n as u64).expect("alloc");
                    cl.write(&t, &data(trainer_seed(h, k, i), n)).expect("write");
                    let opts = SubmitOptions {
                        tensor_id: i as u32,
                        layer: 0,
                        layers: 1,
                        budget_ppm,
                        flags,
                        ..Default::default()
                    };
                    cl.submit(&t, opts).expect("submit");
                    let done = cl.wait_completion(Duration::from_secs(30)).expect("completion");
                    assert_eq!(done.status, Status::Ok, "host {h} trainer {k} op {i}: {done:?}");
                    out.push((cl.read(&t).expect("read"), done.delivered_ppm));
                    cl.free(&t.name).expect("free");
                }
                out
            }));
        }
    }
    handles.into_iter().map(|h| h.join().expect("trainer thread")).collect()
}

/// The exact value: local sums in local-rank order, then hosts in rank order.
fn reference(i: usize) -> Vec<f32> {
    let n = SIZES[i];
    let mut global: Option<Vec<f32>> = None;
    for h in 0..HOSTS {
        let mut local = data(trainer_seed(h, 0, i), n);
        for k in 1..TRAINERS {
            for (a, b) in local.iter_mut().zip(data(trainer_seed(h, k, i), n)) {
                *a += b;
            }
        }
        match global.as_mut() {
            None => global = Some(local),
            Some(g) => g.iter_mut().zip(&local).for_each(|(a, b)| *a += *b),
        }
    }
    global.unwrap()
}

#[test]
fn four_daemons_two_trainers_each_reliable_is_bit_exact() {
    let c = Cluster::start(&Options { hosts: HOSTS, ..Options::default() });
    let results = run_ops(&c, 0, 0, SIZES.len());
    for (i, _) in SIZES.iter().enumerate() {
        let want: Vec<u32> = reference(i).iter().map(|x| x.to_bits()).collect();
        for (t, r) in results.iter().enumerate() {
            let got: Vec<u32> = r[i].0.iter().map(|x| x.to_bits()).collect();
            assert!(got == want, "trainer {t} op {i} ({} elems): not bit-exact", SIZES[i]);
            assert_eq!(r[i].1, 1_000_000, "budget 0 must deliver everything");
        }
    }
    for h in 0..HOSTS {
        let s = c.stats(h).unwrap();
        assert_eq!(s["service"]["ops_completed"], SIZES.len() as u64, "host {h}: {s}");
        assert_eq!(s["service"]["trainers_attached"], u64::from(TRAINERS));
    }
}

/// A host's input: its trainers' contributions summed in local-rank order.
fn host_input(h: u32, i: usize) -> Vec<f32> {
    let n = SIZES[i];
    let mut local = data(trainer_seed(h, 0, i), n);
    for k in 1..TRAINERS {
        for (a, b) in local.iter_mut().zip(data(trainer_seed(h, k, i), n)) {
            *a += b;
        }
    }
    local
}

fn dlcpctl_report(c: &Cluster, h: u32, op: u64, tensor: u32) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
        .arg("--socket")
        .arg(&c.daemons[h as usize].socket)
        .args(["report", &op.to_string(), &tensor.to_string(), "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "dlcpctl report: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `dlcpctl report OP TENSOR` without `--json`: text for people, not JSON.
fn check_report_text(c: &Cluster, h: u32, op: u64, tensor: u32) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
        .arg("--socket")
        .arg(&c.daemons[h as usize].socket)
        .args(["report", &op.to_string(), &tensor.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "dlcpctl report: {}", String::from_utf8_lossy(&out.stderr));
    assert!(serde_json::from_slice::<serde_json::Value>(&out.stdout).is_err(), "JSON without --json: {text}");
    assert!(text.starts_with(&format!("op {op} tensor {tensor} at rank {h}: ")), "{text}");
    assert!(text.contains("\nstarted at ") && !text.contains("started at null"), "{text}");
    assert!(text.contains("\nown shard: "), "{text}");
    for title in ["\nreduce-scatter into this rank's shard:\n", "\nall-gather:\n"] {
        let table = text.split(title).nth(1).unwrap_or_else(|| panic!("no {title:?}: {text}"));
        let rows: Vec<&str> = table.lines().skip(1).take_while(|l| !l.is_empty()).collect();
        let senders: Vec<u32> =
            rows.iter().filter_map(|l| l.split_whitespace().next()?.parse().ok()).collect();
        assert_eq!(senders.len(), HOSTS as usize - 1, "one row per other rank: {text}");
        assert!(!senders.contains(&h), "{text}");
    }
}

#[test]
fn receive_loss_1pct_budget_1pct_matches_recomputation_and_ranks_agree() {
    let c = Cluster::start(&Options { hosts: HOSTS, rx_loss_pct: 1.0, ..Options::default() });
    let results = run_ops(&c, 10_000, 0, LOSSY_OPS);
    let mut lossy_ops = 0;
    for i in 0..LOSSY_OPS {
        // Op sequence numbers are the client's: 1, 2, 3, … in submission order.
        let reports: Vec<_> = (0..HOSTS).map(|h| dlcpctl_report(&c, h, i as u64 + 1, i as u32)).collect();
        if i == 0 {
            check_report_text(&c, 1, 1, 0);
        }
        for (h, r) in reports.iter().enumerate() {
            for t in r["scatter"].as_array().unwrap().iter().chain(r["gather"].as_array().unwrap()) {
                let f = t["delivered_fraction"].as_f64().unwrap();
                assert!(f >= 0.99, "host {h} op {i}: a transfer delivered only {f}: {t}");
            }
        }
        let owners: Vec<_> = reports.iter().map(dlcp::service::report_from_json).collect();
        lossy_ops += usize::from(owners.iter().any(|o| o.scatter.iter().any(|t| !t.delivered.is_full())));
        let inputs: Vec<Vec<f32>> = (0..HOSTS).map(|h| host_input(h, i)).collect();
        let ins: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let refs: Vec<_> = owners.iter().collect();
        let opts = dlcp::proto::endpoint::OpOptions { budget_ppm: 10_000, ..Default::default() };
        let want: Vec<u32> =
            dlcp::proto::oracle::recompute(&ins, &refs, opts, 1372 / 4).iter().map(|x| x.to_bits()).collect();
        for (t, r) in results.iter().enumerate() {
            let got: Vec<u32> = r[i].0.iter().map(|x| x.to_bits()).collect();
            assert!(got == want, "trainer {t} op {i}: result differs from the recomputation");
            assert!(r[i].1 >= 990_000, "trainer {t} op {i}: delivered {} ppm", r[i].1);
        }
    }
    assert!(lossy_ops > 0, "1% receive loss never left a chunk missing: the test proves nothing");
    let dropped: u64 =
        (0..HOSTS).map(|h| c.stats(h).unwrap()["service"]["rx_debug_dropped"].as_u64().unwrap()).sum();
    assert!(dropped > 0, "the receive-loss knob dropped nothing");
}

#[test]
fn loss_driven_pacing_cuts_the_rate_under_loss_and_results_stay_exact() {
    let o = Options {
        hosts: 2,
        rx_loss_pct: 10.0,
        extra: "[pacing]\nrate_mbps = 8000\nadapt = true\n".into(),
        ..Options::default()
    };
    let c = Cluster::start(&o);
    let x: Vec<f32> = data(77, 1 << 20);
    let hs: Vec<_> = (0..2)
        .map(|h| {
            let sock = c.daemons[h].socket.clone();
            let x = x.clone();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&sock, u64::from(JOB), 0, 1).unwrap();
                let t = cl.alloc("g", x.len() as u64).unwrap();
                let mut outs = Vec::new();
                for _ in 0..3 {
                    cl.write(&t, &x).unwrap();
                    cl.submit(&t, SubmitOptions { budget_ppm: 0, ..Default::default() }).unwrap();
                    let d = cl.wait_completion(Duration::from_secs(60)).unwrap();
                    assert_eq!(d.status, Status::Ok);
                    outs.push(cl.read(&t).unwrap());
                }
                outs
            })
        })
        .collect();
    let joined: Vec<_> = hs.into_iter().map(|h| h.join()).collect();
    if joined.iter().any(|j| j.is_err()) {
        for h in 0..2 {
            eprintln!("STATS {h}: {}", c.stats(h).unwrap());
        }
    }
    for h in joined {
        for out in h.unwrap() {
            assert!(
                out.iter().zip(&x).all(|(a, b)| a.to_bits() == (b + b).to_bits()),
                "reliable mode not exact"
            );
        }
    }
    for h in 0..2 {
        let s = c.stats(h).unwrap();
        let cuts = s["pacing_rate_cuts"].as_u64().expect("adaptation enabled");
        let rate = s["pacing_rate_bytes_per_sec"].as_u64().unwrap();
        assert!(cuts > 0, "host {h}: 10% loss never cut the rate: {s}");
        assert!(rate < 8_000_000_000 / 8, "host {h}: rate {rate} still at the maximum");
    }
}

#[test]
fn ipv6_daemons_are_bit_exact() {
    if let Err(e) = std::net::UdpSocket::bind("[::1]:0") {
        return prereq::skip(prereq::Prereq::Ipv6, &format!("cannot bind [::1]:0: {e}"));
    }
    let c = Cluster::start(&Options { hosts: 3, ipv6: true, ..Options::default() });
    let x = data(66, 100_003);
    let hs: Vec<_> = (0..3)
        .map(|h| {
            let sock = c.daemons[h].socket.clone();
            let x = x.clone();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&sock, u64::from(JOB), 0, 1).unwrap();
                let t = cl.alloc("v6", x.len() as u64).unwrap();
                cl.write(&t, &x).unwrap();
                cl.submit(&t, SubmitOptions::default()).unwrap();
                let d = cl.wait_completion(Duration::from_secs(30)).unwrap();
                assert_eq!(d.status, Status::Ok);
                cl.read(&t).unwrap()
            })
        })
        .collect();
    for h in hs {
        let out = h.join().unwrap();
        assert!(out.iter().zip(&x).all(|(a, b)| a.to_bits() == ((b + b) + b).to_bits()));
    }
    let s = c.stats(0).unwrap();
    assert!(s["datapath"].as_str().unwrap().contains("::1"), "{s}");
}

/// The trainer's per-op flags reach the protocol: with `FLAG_FILL_LOCAL |
/// FLAG_RESCALE` (the daemon's `[loss]` config left at zero fill, no rescale),
/// results equal the recomputation with local fill and rescaling, and differ
/// from the zero-fill recomputation wherever a chunk was given up.
#[test]
fn per_op_fill_local_and_rescale_flags_are_applied() {
    use dlcp::proto::endpoint::{Fill, OpOptions};
    use dlcp::shm::layout::{FLAG_FILL_LOCAL, FLAG_RESCALE};
    const BUDGET: u32 = 50_000;
    let c = Cluster::start(&Options { hosts: HOSTS, rx_loss_pct: 3.0, ..Options::default() });
    let results = run_ops(&c, BUDGET, FLAG_FILL_LOCAL | FLAG_RESCALE, LOSSY_OPS);
    let mut differs_from_zero_fill = 0;
    for i in 0..LOSSY_OPS {
        let reports: Vec<_> = (0..HOSTS).map(|h| dlcpctl_report(&c, h, i as u64 + 1, i as u32)).collect();
        let owners: Vec<_> = reports.iter().map(dlcp::service::report_from_json).collect();
        let inputs: Vec<Vec<f32>> = (0..HOSTS).map(|h| host_input(h, i)).collect();
        let ins: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let refs: Vec<_> = owners.iter().collect();
        let recompute = |opts: OpOptions| -> Vec<u32> {
            dlcp::proto::oracle::recompute(&ins, &refs, opts, 1372 / 4).iter().map(|x| x.to_bits()).collect()
        };
        let base = OpOptions { budget_ppm: BUDGET, ..Default::default() };
        let want = recompute(OpOptions { fill: Fill::Local, rescale: true, ..base });
        let zero = recompute(base);
        differs_from_zero_fill += usize::from(want != zero);
        for (t, r) in results.iter().enumerate() {
            let got: Vec<u32> = r[i].0.iter().map(|x| x.to_bits()).collect();
            assert!(got == want, "trainer {t} op {i}: result is not the local-fill, rescaled recomputation");
        }
    }
    assert!(
        differs_from_zero_fill > 0,
        "no op gave a chunk up, so local fill and zero fill agree: the test proves nothing"
    );
}
