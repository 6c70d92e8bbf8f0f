//! Soak and chaos on the emulated cluster (issue 15): four hosts of
//! `scripts/testbed.sh`, one trainer per host, rounds of allreduces (each
//! round a new run of the job: every trainer attaches, runs its ops and
//! detaches) under a rotating fault:
//!
//! clean · 5% loss · 30% loss · an asymmetric partition (host 1 cannot hear
//! host 2) · a flapping link (host 3's switch port down and up) · a trainer
//! that dies after its first op · a peer daemon killed and restarted between
//! rounds · a peer daemon killed in the middle of a round (its ops in the
//! gather phase or wherever they are) and restarted after it.
//!
//! Asserted every round: no hang (every op ends within the hard timeout plus
//! slack), every op that completed delivered at least 1 − budget, every op
//! completed on all hosts has the same result bytes everywhere, every failure
//! reaches its trainer with a reason. At the end: each daemon's RSS and open
//! fds stay within 10% (plus 4 MiB / 4 fds) of their level after warm-up, and
//! the daemons that never restarted count exactly the ops their trainers saw
//! complete. A summary goes to stderr and to `DLCP_SOAK_SUMMARY` if set.
//!
//! `#[ignore]`d in the normal run: `scripts/soak.sh --minutes M` runs it for M
//! minutes (`DLCP_SOAK_MINUTES`, default 2); CI runs 2 minutes. Needs root
//! and network namespaces (see `tests/prereq`).

mod prereq;
mod testbed_common;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlcp::shm::{Status, SubmitOptions, TrainerChannel};
use testbed_common::*;

const PREFIX: &str = "dlcpsk";
const HOSTS: usize = 4;
const HARD_MS: u32 = 2_000;
const OPS: usize = 4;
const ELEMS: usize = 150_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Clean,
    Loss(u32),
    Partition,
    Flap,
    TrainerDies,
    RestartBetween,
    KillMidRound,
}

const SCHEDULE: [Fault; 9] = [
    Fault::Clean,
    Fault::Loss(5),
    Fault::Partition,
    Fault::Clean,
    Fault::Loss(30),
    Fault::Flap,
    Fault::TrainerDies,
    Fault::RestartBetween,
    Fault::KillMidRound,
];

/// What a trainer saw of one op.
#[derive(Debug, Clone)]
struct Seen {
    ok: bool,
    status: String,
    reason: Option<String>,
    delivered_ppm: u32,
    budget_ppm: u32,
    digest: u64,
    took: Duration,
}

fn digest(v: &[f32]) -> u64 {
    v.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3))
}

/// Our own nftables table in host `h`'s namespace: random `loss` percent on
/// input, and datagrams from the hosts in `blocked` dropped.
fn set_faults(bed: &Bed, h: usize, loss: u32, blocked: &[usize]) {
    let mut rules = String::new();
    if loss > 0 {
        rules += &format!("    numgen random mod 100 < {loss} drop\n");
    }
    for &b in blocked {
        rules += &format!("    ip saddr 10.77.0.{} drop\n", b + 1);
    }
    let script = format!(
        "table inet soak {{\n  chain input {{\n    type filter hook input priority -310; policy accept;\n{rules}  }}\n}}\n"
    );
    let _ = Command::new("ip")
        .args(["netns", "exec", &bed.ns(h), "nft", "delete", "table", "inet", "soak"])
        .output();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &bed.ns(h), "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "nft on host {h}");
}

/// Wait until every other daemon has verified host `h`'s (new) incarnation:
/// the next run then includes it (a run begun before would not).
fn wait_up(bed: &Bed, h: usize) {
    let t0 = Instant::now();
    while (0..HOSTS).filter(|&o| o != h).any(|o| bed.status(o)["peers"][h]["up"] != true) {
        assert!(t0.elapsed() < Duration::from_secs(20), "host {h} never came back up at its peers");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn link(bed: &Bed, h: usize, up: bool) {
    let st = Command::new("ip")
        .args(["netns", "exec", &format!("{}-sw", bed.prefix), "ip", "link", "set", &format!("p{h}")])
        .arg(if up { "up" } else { "down" })
        .status()
        .unwrap();
    assert!(st.success());
}

/// One trainer's round: attach, `OPS` ops (budget alternating 0 and 1%),
/// detach. `stop_after`: the trainer dies (drops its channel) after that many.
fn trainer_round(socket: std::path::PathBuf, h: usize, round: usize, stop_after: usize) -> Vec<Seen> {
    let Ok(mut cl) = TrainerChannel::attach(&socket, u64::from(JOB), 0, 1) else { return Vec::new() };
    let mut out = Vec::new();
    for i in 0..OPS.min(stop_after) {
        let budget_ppm = if i % 2 == 0 { 0 } else { 10_000 };
        let Ok(t) = cl.alloc(&format!("t{i}"), ELEMS as u64) else { break };
        let _ = cl.write(&t, &data(seed(h, round * OPS + i) ^ round as u64, ELEMS));
        let o = SubmitOptions { tensor_id: i as u32, layer: 0, layers: 1, budget_ppm, ..Default::default() };
        let t0 = Instant::now();
        let seq = cl.next_op_seq();
        if cl.submit(&t, o).is_err() {
            break;
        }
        match cl.wait_completion(Duration::from_millis(u64::from(HARD_MS) * 3 + 5_000)) {
            Ok(d) => {
                let ok = d.status == Status::Ok;
                let result = if ok { cl.read(&t).unwrap_or_default() } else { Vec::new() };
                out.push(Seen {
                    ok,
                    status: format!("{:?}", d.status),
                    reason: if ok { None } else { cl.failure_reason(seq, i as u32) },
                    delivered_ppm: d.delivered_ppm,
                    budget_ppm,
                    digest: digest(&result),
                    took: t0.elapsed(),
                });
            }
            Err(e) => {
                out.push(Seen {
                    ok: false,
                    status: format!("no completion: {e}"),
                    reason: None,
                    delivered_ppm: 0,
                    budget_ppm,
                    digest: 0,
                    took: t0.elapsed(),
                });
                break;
            }
        }
        let _ = cl.free(&t.name);
    }
    out
}

/// (RSS KiB, open fds) of a process.
fn footprint(pid: u32) -> Option<(u64, u64)> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = st.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}

#[derive(Default)]
struct Tally {
    rounds: usize,
    ops: usize,
    ok: usize,
    failed: std::collections::BTreeMap<String, usize>,
    took_ok: Vec<Duration>,
    max_took: Duration,
    /// Per host: Ok completions its trainer saw since its daemon last started.
    ok_since_start: [u64; HOSTS],
    /// Per host: (pid, footprints after each round).
    footprints: Vec<(u32, Vec<(u64, u64)>)>,
}

#[test]
#[ignore = "soak: run by scripts/soak.sh (CI runs 2 minutes)"]
fn soak_under_rotating_faults() {
    let minutes: f64 = std::env::var("DLCP_SOAK_MINUTES").ok().and_then(|v| v.parse().ok()).unwrap_or(2.0);
    let Some(mut bed) = Bed::start(PREFIX, HOSTS, &[], HARD_MS) else { return };
    let deadline = Instant::now() + Duration::from_secs_f64(minutes * 60.0);
    let mut tally = Tally { footprints: vec![(0, Vec::new()); HOSTS], ..Tally::default() };
    let started = Instant::now();
    let mut round = 0;
    while Instant::now() < deadline {
        let fault = SCHEDULE[round % SCHEDULE.len()];
        for h in 0..HOSTS {
            set_faults(&bed, h, 0, &[]);
        }
        match fault {
            Fault::Loss(p) => (0..HOSTS).for_each(|h| set_faults(&bed, h, p, &[])),
            Fault::Partition => set_faults(&bed, 1, 0, &[2]),
            Fault::RestartBetween => {
                bed.kill9(2);
                bed.spawn(2);
                bed.wait_ready(2);
                wait_up(&bed, 2);
                tally.ok_since_start[2] = 0;
            }
            _ => {}
        }
        let seen: Arc<Mutex<Vec<Vec<Seen>>>> = Arc::new(Mutex::new(vec![Vec::new(); HOSTS]));
        let workers: Vec<_> = (0..HOSTS)
            .map(|h| {
                let socket = bed.sockets[h].clone();
                let seen = Arc::clone(&seen);
                let stop_after = if fault == Fault::TrainerDies && h == 1 { 1 } else { OPS };
                std::thread::spawn(move || {
                    let s = trainer_round(socket, h, round, stop_after);
                    seen.lock().unwrap()[h] = s;
                })
            })
            .collect();
        match fault {
            Fault::Flap => {
                std::thread::sleep(Duration::from_millis(150));
                link(&bed, 3, false);
                std::thread::sleep(Duration::from_millis(300));
                link(&bed, 3, true);
            }
            Fault::KillMidRound => {
                std::thread::sleep(Duration::from_millis(120));
                bed.kill9(3);
            }
            _ => {}
        }
        for w in workers {
            w.join().expect("a trainer thread panicked");
        }
        if fault == Fault::KillMidRound {
            bed.spawn(3);
            bed.wait_ready(3);
            wait_up(&bed, 3);
            tally.ok_since_start[3] = 0;
        }
        let seen = Arc::try_unwrap(seen).unwrap().into_inner().unwrap();
        check_round(round, fault, &seen, &mut tally);
        for h in 0..HOSTS {
            let pid = bed.daemons[h].as_ref().map(|c| c.id()).unwrap_or(0);
            if tally.footprints[h].0 != pid {
                tally.footprints[h] = (pid, Vec::new());
            }
            if let Some(f) = footprint(pid) {
                tally.footprints[h].1.push(f);
            }
        }
        round += 1;
        tally.rounds = round;
        if round % SCHEDULE.len() == 0 {
            eprintln!(
                "soak: {round} rounds, {} ops ({} ok) in {:.0} s",
                tally.ops,
                tally.ok,
                started.elapsed().as_secs_f64()
            );
        }
    }
    for h in 0..HOSTS {
        set_faults(&bed, h, 0, &[]);
    }
    check_end(&bed, &tally);
    summary(&tally, started.elapsed(), minutes);
}

/// Per-round checks (see the module docs).
fn check_round(round: usize, fault: Fault, seen: &[Vec<Seen>], tally: &mut Tally) {
    let slack = Duration::from_millis(u64::from(HARD_MS) * 2 + 3_000);
    for (h, ops) in seen.iter().enumerate() {
        for (i, s) in ops.iter().enumerate() {
            tally.ops += 1;
            tally.max_took = tally.max_took.max(s.took);
            assert!(s.took <= slack, "round {round} ({fault:?}) host {h} op {i} took {:?}: a hang", s.took);
            if s.ok {
                tally.ok += 1;
                tally.took_ok.push(s.took);
                tally.ok_since_start[h] += 1;
                assert!(
                    u64::from(s.delivered_ppm) + u64::from(s.budget_ppm) >= 1_000_000,
                    "round {round} host {h} op {i}: delivered {} ppm under budget {} ppm",
                    s.delivered_ppm,
                    s.budget_ppm
                );
            } else {
                *tally.failed.entry(format!("{fault:?}: {}", s.status)).or_default() += 1;
                // A trainer whose daemon is alive hears why its op failed.
                let daemon_killed = fault == Fault::KillMidRound && h == 3;
                if !daemon_killed && !s.status.starts_with("no completion") {
                    assert!(
                        s.reason.as_deref().is_some_and(|r| !r.is_empty()),
                        "round {round} host {h} op {i}: {s:?}"
                    );
                }
            }
        }
    }
    for i in 0..OPS {
        let all: Option<Vec<u64>> =
            seen.iter().map(|ops| ops.get(i).filter(|s| s.ok).map(|s| s.digest)).collect();
        if let Some(d) = all {
            assert!(
                d.iter().all(|x| *x == d[0]),
                "round {round} ({fault:?}) op {i}: results differ across hosts: {d:?}"
            );
        }
    }
    if fault == Fault::Clean {
        for (h, ops) in seen.iter().enumerate() {
            assert!(
                ops.len() == OPS && ops.iter().all(|s| s.ok),
                "round {round}: clean round failed on host {h}: {ops:?}"
            );
        }
    }
}

/// End checks: flat footprints, consistent counters.
fn check_end(bed: &Bed, tally: &Tally) {
    for (h, (pid, f)) in tally.footprints.iter().enumerate() {
        if f.len() < 6 {
            continue;
        }
        let warm = f[f.len() / 5];
        let (max_rss, max_fd) = f[f.len() / 5..].iter().fold((0, 0), |(r, d), &(a, b)| (r.max(a), d.max(b)));
        assert!(
            max_rss <= warm.0 + warm.0 / 10 + 4096,
            "host {h} (pid {pid}): RSS grew {} -> {max_rss} KiB",
            warm.0
        );
        assert!(max_fd <= warm.1 + warm.1 / 10 + 4, "host {h} (pid {pid}): fds grew {} -> {max_fd}", warm.1);
    }
    for h in [0, 1] {
        let s = bed.stats(h);
        assert_eq!(
            s["service"]["ops_completed"].as_u64(),
            Some(tally.ok_since_start[h]),
            "host {h}: the daemon's completed ops and its trainer's Ok completions differ"
        );
    }
}

fn summary(t: &Tally, wall: Duration, minutes: f64) {
    let mut took = t.took_ok.clone();
    took.sort();
    let p50 = took.get(took.len() / 2).copied().unwrap_or_default();
    let mut text = format!(
        "soak summary: {minutes} min requested, {:.1} s run, {} rounds of {SCHEDULE:?}\n\
         ops {} · ok {} · failed, by fault and status: {:?}\n\
         op time (ok) p50 {:.1} ms · max of any op {:.1} ms (hard timeout {HARD_MS} ms)\n",
        wall.as_secs_f64(),
        t.rounds,
        t.ops,
        t.ok,
        t.failed,
        p50.as_secs_f64() * 1e3,
        t.max_took.as_secs_f64() * 1e3,
    );
    for (h, (pid, f)) in t.footprints.iter().enumerate() {
        if let (Some(first), Some(last)) = (f.first(), f.last()) {
            let max = f.iter().map(|x| x.0).max().unwrap_or(0);
            text += &format!(
                "host {h} daemon pid {pid}: {} samples, RSS {} -> {} KiB (max {max}), fds {} -> {}\n",
                f.len(),
                first.0,
                last.0,
                first.1,
                last.1
            );
        }
    }
    eprint!("{text}");
    if let Ok(path) = std::env::var("DLCP_SOAK_SUMMARY") {
        std::fs::write(path, text).unwrap();
    }
}
