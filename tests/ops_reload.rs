//! Hot reload end to end: real `dlcpd` processes re-reading their TOML on
//! SIGHUP and on `dlcpctl reload`. A changed budget changes the next op; a
//! broken file is rejected (file:line:col logged), the old config kept, and an
//! op in flight across the reload completes; a new DSCP map re-marks the class
//! sockets.

mod daemon_common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use daemon_common::*;
use dlcp::shm::{Completion, Status, SubmitOptions, TrainerChannel};

const N: usize = 200_000;

/// A cluster whose config files are `edit`ed before the daemons start.
fn cluster(hosts: u32, rx_loss_pct: f64, edit: impl Fn(String) -> String) -> Cluster {
    let late: Vec<u32> = (0..hosts).collect();
    let mut c =
        Cluster::start(&Options { hosts, hard_timeout_ms: 3000, late, rx_loss_pct, ..Options::default() });
    for r in 0..hosts {
        let path = c.daemons[r as usize].config.clone();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, edit(text)).unwrap();
        c.spawn(r, rx_loss_pct);
    }
    for r in 0..hosts {
        c.wait_ready(r);
    }
    c
}

fn set_budget(text: &str, budget: &str) -> String {
    let t = text.replace("[loss]\n", &format!("[loss]\nbudget = {budget}\n"));
    assert_ne!(t, text);
    t
}

fn dlcpctl(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dlcpctl")).arg("--socket").arg(socket).args(args).output().unwrap()
}

fn status(c: &Cluster, r: u32) -> serde_json::Value {
    let out = dlcpctl(&c.daemons[r as usize].socket, &["status", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// One op on every host (one trainer each): (completion, result) per host.
fn allreduce(c: &Cluster, seq: u64, budget_ppm: u32) -> Vec<(Completion, Vec<f32>)> {
    let handles: Vec<_> = c
        .daemons
        .iter()
        .map(|d| {
            let (socket, h) = (d.socket.clone(), d.rank);
            std::thread::spawn(move || submit(&socket, h, seq, budget_ppm, Duration::ZERO))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn submit(socket: &Path, h: u32, seq: u64, budget_ppm: u32, delay: Duration) -> (Completion, Vec<f32>) {
    let mut cl = TrainerChannel::attach(socket, u64::from(JOB), 0, 1).expect("attach");
    let t = cl.alloc("g", N as u64).unwrap();
    cl.write(&t, &data(u64::from(h) << 20 | seq, N)).unwrap();
    std::thread::sleep(delay);
    cl.set_next_op_seq(seq);
    cl.submit(&t, SubmitOptions { tensor_id: 1, budget_ppm, ..Default::default() }).unwrap();
    let done = cl.wait_completion(Duration::from_secs(30)).expect("a completion, not a hang");
    (done, cl.read(&t).unwrap())
}

fn exact_sum(hosts: u32, seq: u64) -> Vec<u32> {
    let mut sum = data(seq, N);
    for h in 1..hosts {
        for (a, b) in sum.iter_mut().zip(data(u64::from(h) << 20 | seq, N)) {
            *a += b;
        }
    }
    sum.iter().map(|x| x.to_bits()).collect()
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn reload_with_a_changed_budget_changes_the_next_op() {
    // 5% of received datagrams dropped; loss.budget 10% lets ops give most of it up.
    let mut c = cluster(2, 5.0, |t| set_budget(&t, "0.10"));
    let before = allreduce(&c, 1, 100_000);
    for (h, (done, _)) in before.iter().enumerate() {
        assert_eq!(done.status, Status::Ok, "host {h}");
        assert!(
            done.delivered_ppm < 1_000_000,
            "host {h}: with 5% loss and a 10% budget something is given up"
        );
        assert!(done.delivered_ppm >= 900_000, "host {h}: {done:?}");
    }
    // New files: budget 0 (runtime) and a bigger arena (restart-only).
    for d in &c.daemons {
        let t = std::fs::read_to_string(&d.config).unwrap();
        let t = t
            .replace("budget = 0.10", "budget = 0.0")
            .replace("arena_bytes = 134217728", "arena_bytes = 268435456");
        std::fs::write(&d.config, t).unwrap();
    }
    // Host 0 through dlcpctl, host 1 through SIGHUP.
    let out = dlcpctl(&c.daemons[0].socket, &["reload", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let o: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(o["ok"], true, "{o}");
    let applied = o["applied"].to_string();
    let restart = o["needs_restart"].to_string();
    assert!(applied.contains("loss.budget: 0.1 -> 0.0 (runtime)"), "{o}");
    assert!(restart.contains("shm.arena_bytes: 134217728 -> 268435456 (restart)"), "{o}");
    assert!(!applied.contains("arena"), "{o}");
    c.kill(1, 1);
    wait_for("host 1's reload", Duration::from_secs(10), || status(&c, 1)["ops"]["reloads_ok"] == 1);
    for r in 0..2 {
        let s = status(&c, r);
        assert_eq!(s["ops"]["budget"], 0.0, "{s}");
        assert_eq!(s["ops"]["reloads_failed"], 0, "{s}");
    }
    // The trainer still asks for 10%: the cap now makes the op reliable.
    let after = allreduce(&c, 2, 100_000);
    let want = exact_sum(2, 2);
    for (h, (done, result)) in after.iter().enumerate() {
        assert_eq!(done.status, Status::Ok, "host {h}");
        assert_eq!(done.delivered_ppm, 1_000_000, "host {h}: budget 0 repairs everything");
        assert!(result.iter().map(|x| x.to_bits()).eq(want.iter().copied()), "host {h}: not bit-exact");
    }
    // Human-readable reload output, and the logs.
    let out = dlcpctl(&c.daemons[0].socket, &["reload"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("needs a restart (not applied):") && text.contains("shm.arena_bytes"), "{text}");
    for r in 0..2 {
        let log = c.log(r);
        assert!(log.contains("reload: applied loss.budget: 0.1 -> 0.0 (runtime)"), "{log}");
        assert!(log.contains("reload: needs restart, not applied: shm.arena_bytes"), "{log}");
    }
    for r in 0..2 {
        c.kill(r, 15);
        assert!(c.wait_exit(r, Duration::from_secs(10)).is_some_and(|s| s.success()));
    }
}

#[test]
fn reload_of_a_broken_file_keeps_the_running_config_and_the_op_in_flight() {
    let mut c = cluster(2, 0.0, |t| set_budget(&t, "0.02"));
    let good0 = std::fs::read_to_string(&c.daemons[0].config).unwrap();
    // Host 0's trainer submits now; host 1's only after the reloads: the op is
    // in flight on host 0 across both of them.
    let s0 = c.daemons[0].socket.clone();
    let s1 = c.daemons[1].socket.clone();
    let t0 = std::thread::spawn(move || submit(&s0, 0, 1, 0, Duration::ZERO));
    wait_for("host 0's submission", Duration::from_secs(10), || {
        c.stats(0).unwrap()["service"]["submissions"] == 1
    });
    // 1. A value above the cap, through dlcpctl: exit 1, error with file:line:col.
    let cfg0 = c.daemons[0].config.clone();
    std::fs::write(&cfg0, good0.replace("budget = 0.02", "budget = 0.25")).unwrap();
    let line = good0.lines().position(|l| l == "budget = 0.02").unwrap() + 1;
    let out = dlcpctl(&c.daemons[0].socket, &["reload"]);
    assert_eq!(out.status.code(), Some(1), "a rejected reload fails dlcpctl");
    let text = String::from_utf8_lossy(&out.stdout);
    let loc = format!("{}:{line}:10: loss.budget: 0.25 exceeds the hard cap", cfg0.display());
    assert!(text.contains("reload REJECTED, running configuration kept") && text.contains(&loc), "{text}");
    // 2. A syntax error, through SIGHUP.
    std::fs::write(&cfg0, good0.replace("budget = 0.02", "budget = = 0.01")).unwrap();
    c.kill(0, 1);
    wait_for("the SIGHUP reload", Duration::from_secs(10), || status(&c, 0)["ops"]["reloads_failed"] == 2);
    let log = c.log(0);
    assert!(log.contains(&loc), "{log}");
    assert!(
        log.contains(&format!("reload of {} rejected, running configuration kept", cfg0.display())),
        "{log}"
    );
    assert!(
        log.contains(&format!("{}:{line}:", cfg0.display())) && log.contains("TOML syntax error"),
        "{log}"
    );
    let s = status(&c, 0);
    assert_eq!(s["ops"]["budget"], 0.02, "old config kept: {s}");
    assert_eq!(s["ops"]["reloads_ok"], 0);
    assert_eq!(s["ops"]["last_reload"]["outcome"]["ok"], false);
    // The op in flight completes, exactly (budget 0 asked).
    let (d1, r1) = submit(&s1, 1, 1, 0, Duration::ZERO);
    let (d0, r0) = t0.join().unwrap();
    let want = exact_sum(2, 1);
    for (done, r) in [(d0, r0), (d1, r1)] {
        assert_eq!(done.status, Status::Ok, "{done:?}");
        assert!(r.iter().map(|x| x.to_bits()).eq(want.iter().copied()));
    }
    // Fixing the file makes the next reload succeed; an unchanged file is a no-op.
    std::fs::write(&cfg0, &good0).unwrap();
    let out = dlcpctl(&c.daemons[0].socket, &["reload"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("no changes"));
    assert_eq!(status(&c, 0)["ops"]["reloads_ok"], 1);
}

/// A new DSCP / SO_PRIORITY map reaches the class sockets of a running
/// socket datapath (read back with getsockopt).
#[test]
fn set_marking_re_marks_the_class_sockets() {
    use dlcp::datapath::Datapath;
    use dlcp::datapath::socket::{SocketConfig, SocketDatapath};
    use dlcp::proto::class::Class;
    for bind in ["127.0.0.1:0", "[::1]:0"] {
        let mut dp = SocketDatapath::new(SocketConfig::new(bind.parse().unwrap())).unwrap();
        let tos = |dp: &SocketDatapath, c: u8| {
            let fd = dp.class_socket(Class::new(c).unwrap());
            let s = socket2::SockRef::from(&fd);
            if bind.starts_with('[') { s.tclass_v6().unwrap() } else { s.tos_v4().unwrap() }
        };
        let prio = |dp: &SocketDatapath, c: u8| {
            socket2::SockRef::from(&dp.class_socket(Class::new(c).unwrap())).priority().unwrap()
        };
        assert_eq!(tos(&dp, 7), 48 << 2);
        let dscp = [8, 9, 10, 11, 12, 13, 14, 15];
        let so = [6, 5, 4, 3, 2, 1, 0, 0];
        assert!(dp.set_marking(dscp, so).unwrap());
        for c in 0..8u8 {
            assert_eq!(tos(&dp, c), u32::from(dscp[c as usize]) << 2, "{bind} class {c}");
            assert_eq!(prio(&dp, c), u32::from(so[c as usize]), "{bind} class {c}: SO_PRIORITY after TOS");
        }
        assert!(dp.set_marking([64, 0, 0, 0, 0, 0, 0, 0], so).is_err());
    }
}

/// A running daemon told a new DSCP map applies it (not "needs restart").
#[test]
fn dscp_map_is_a_runtime_setting_of_the_socket_datapath() {
    let c = cluster(1, 0.0, |t| t);
    let cfg = &c.daemons[0].config;
    let t = std::fs::read_to_string(cfg).unwrap();
    std::fs::write(cfg, format!("{t}\n[priority]\ndscp = [0, 8, 16, 24, 32, 40, 46, 56]\n")).unwrap();
    let out = dlcpctl(&c.daemons[0].socket, &["reload", "--json"]);
    let o: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(o["ok"], true, "{o}");
    assert!(o["applied"].to_string().contains("priority.dscp"), "{o}");
    assert_eq!(o["not_applied"], serde_json::json!([]), "{o}");
}

/// log.level is applied at runtime: at "warn" a reload's info lines vanish,
/// back at "info" they return.
#[test]
fn log_level_is_a_runtime_setting() {
    let c = cluster(1, 0.0, |t| t);
    let cfg = &c.daemons[0].config;
    let base = std::fs::read_to_string(cfg).unwrap();
    std::fs::write(cfg, base.replace("level = \"info\"", "level = \"warn\"\n")).unwrap();
    assert!(dlcpctl(&c.daemons[0].socket, &["reload"]).status.success());
    std::fs::write(cfg, base.replace("[loss]\n", "[loss]\ndeadline_max_ms = 300\n")).unwrap();
    assert!(dlcpctl(&c.daemons[0].socket, &["reload"]).status.success());
    let log = c.log(0);
    assert!(!log.contains("reload: applied log.level: \"info\" -> \"warn\""), "logged at warn level: {log}");
    assert!(log.contains("reload: applied log.level: \"warn\" -> \"info\""), "{log}");
    assert!(log.contains("reload: applied loss.deadline_max_ms: 250 -> 300 (runtime)"), "{log}");
    assert_eq!(status(&c, 0)["ops"]["log_level"], "info");
}
