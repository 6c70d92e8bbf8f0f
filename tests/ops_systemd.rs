//! systemd integration without systemd: a real `dlcpd` started with
//! `NOTIFY_SOCKET` pointing at a datagram socket this test listens on (and
//! `WATCHDOG_USEC`), and `systemd-analyze verify`/`security` on the shipped
//! unit (with the binary path pointed at the built `dlcpd`).

mod daemon_common;
mod prereq;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use daemon_common::*;

struct Reaper(std::process::Child);
impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn recv(rx: &UnixDatagram, timeout: Duration) -> Option<String> {
    rx.set_read_timeout(Some(timeout)).unwrap();
    let mut buf = [0u8; 4096];
    rx.recv(&mut buf).ok().map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[test]
fn readiness_after_the_control_socket_watchdog_pings_reload_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.sock");
    let rx = UnixDatagram::bind(&notify).unwrap();
    let socket = dir.path().join("d.sock");
    let config = dir.path().join("d.toml");
    let port = free_ports(1, false)[0];
    write_config(&config, &config_text(0, &[port], &socket, &Options { hosts: 1, ..Options::default() }));
    let log = dir.path().join("d.log");
    let logf = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_dlcpd"))
        .arg("--config")
        .arg(&config)
        .env("NOTIFY_SOCKET", &notify)
        .env("WATCHDOG_USEC", "200000")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut child = Reaper(child);
    let logtext = || std::fs::read_to_string(&log).unwrap_or_default();

    // The first message is READY=1, and when it arrives the control and admin
    // sockets exist and answer.
    let first =
        recv(&rx, Duration::from_secs(20)).unwrap_or_else(|| panic!("no notification; log:\n{}", logtext()));
    let ready_seen = Instant::now();
    assert!(first.lines().any(|l| l == "READY=1"), "first message {first:?}");
    assert!(first.contains(&format!("MAINPID={pid}")), "{first:?}");
    assert!(first.lines().any(|l| l.starts_with("STATUS=rank 0/1 job 7: socket")), "{first:?}");
    assert!(socket.exists(), "READY=1 before the control socket exists");
    let admin = dlcp::service::admin_path(&socket);
    assert!(std::os::unix::net::UnixStream::connect(&admin).is_ok(), "admin socket not accepting at READY=1");
    assert!(
        std::os::unix::net::UnixStream::connect(&socket).is_ok(),
        "control socket not accepting at READY=1"
    );
    // The datapath owns its port (exclusively: see the socket datapath's steering).
    assert!(std::net::UdpSocket::bind(("127.0.0.1", port)).is_err(), "datapath port not bound at READY=1");

    // WATCHDOG=1 every ~100 ms (half of WATCHDOG_USEC) while idle.
    let mut pings = Vec::new();
    while ready_seen.elapsed() < Duration::from_millis(1200) {
        match recv(&rx, Duration::from_millis(500)) {
            Some(m) if m == "WATCHDOG=1" => pings.push(Instant::now()),
            Some(m) => panic!("unexpected {m:?}"),
            None => break,
        }
    }
    assert!(pings.len() >= 6, "only {} watchdog pings in ~1.2 s", pings.len());
    let max_gap = pings.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(max_gap < Duration::from_millis(200), "a gap of {max_gap:?} would trip a 200 ms watchdog");

    // SIGHUP: RELOADING=1 (with MONOTONIC_USEC) then READY=1.
    assert!(Command::new("kill").args(["-HUP", &pid.to_string()]).status().unwrap().success());
    let mut seen = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) && !seen.iter().any(|m: &String| m.starts_with("READY=1")) {
        if let Some(m) = recv(&rx, Duration::from_secs(1)) {
            if m != "WATCHDOG=1" {
                seen.push(m);
            }
        }
    }
    assert!(seen.len() >= 2, "{seen:?}");
    assert!(seen[0].starts_with("RELOADING=1\nMONOTONIC_USEC="), "{seen:?}");
    assert!(seen[1].starts_with("READY=1\nSTATUS=configuration reloaded"), "{seen:?}");

    // SIGTERM: STOPPING=1, then a clean exit.
    assert!(Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success());
    let t0 = Instant::now();
    let mut stopping = false;
    while t0.elapsed() < Duration::from_secs(5) && !stopping {
        stopping = recv(&rx, Duration::from_secs(1)).is_some_and(|m| m.starts_with("STOPPING=1"));
    }
    assert!(stopping, "no STOPPING=1; log:\n{}", logtext());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "dlcpd did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
}

fn systemd_analyze() -> Option<&'static str> {
    let ok = Command::new("systemd-analyze").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        prereq::skip(
            prereq::Prereq::Systemd,
            "systemd-analyze --version failed (scripts/test.sh installs systemd)",
        );
        return None;
    }
    Some("systemd-analyze")
}

/// The shipped unit with its binary paths pointed at this build.
fn unit_copy(dir: &Path, extra: &str) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let unit = std::fs::read_to_string(root.join("deploy/dlcpd.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/dlcpd --config /etc/dlcp/dlcp.toml"));
    let unit = unit.replace("/usr/bin/dlcpd", env!("CARGO_BIN_EXE_dlcpd"));
    let path = dir.join("dlcpd.service");
    std::fs::write(&path, format!("{unit}\n{extra}")).unwrap();
    path
}

fn verify(unit: &Path) -> (bool, String) {
    let out = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(unit).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success() && text.trim().is_empty(), text)
}

#[test]
fn systemd_analyze_verify_passes_cleanly_on_the_unit_and_its_dpdk_drop_in() {
    let Some(_) = systemd_analyze() else { return };
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_copy(dir.path(), "");
    let (ok, text) = verify(&unit);
    assert!(ok, "systemd-analyze verify: {text}");
    let u = std::fs::read_to_string(&unit).unwrap();
    for want in [
        "Type=notify",
        "WatchdogSec=",
        "RuntimeDirectory=dlcp",
        "RemoveIPC=no",
        "LimitMEMLOCK=infinity",
        "User=dlcp",
        "CapabilityBoundingSet=\n",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ] {
        assert!(u.contains(want), "unit lacks {want:?}");
    }
    // The DPDK drop-in's settings parse too (appended: later assignments win,
    // as a drop-in's do).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dropin = std::fs::read_to_string(root.join("deploy/systemd/dpdk.conf")).unwrap();
    let dir2 = tempfile::tempdir().unwrap();
    let both = unit_copy(dir2.path(), &dropin);
    let (ok, text) = verify(&both);
    assert!(ok, "unit + dpdk.conf: {text}");
    // The check can fail: a misspelt key is reported.
    let dir3 = tempfile::tempdir().unwrap();
    let bad = unit_copy(dir3.path(), "[Service]\nWatchdogSex=5s\n");
    assert!(!verify(&bad).0, "systemd-analyze verify accepted an unknown key");
}

#[test]
fn systemd_analyze_security_rates_the_unit_ok() {
    let Some(_) = systemd_analyze() else { return };
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_copy(dir.path(), "");
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&unit)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line =
        text.lines().find(|l| l.contains("Overall exposure level")).unwrap_or_else(|| panic!("{text}"));
    let score: f64 = line.split(':').nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    eprintln!("{line}");
    // Issue 15 keeps it at 1.5 at most (1.4 today: "OK").
    assert!(score <= 1.5, "exposure {score} (0 = locked down, 10 = unprotected): {line}");
}
