//! Daemons that cannot talk refuse each other, say why naming both sides, and
//! count it: another `[security] packet_auth`, and a datagram of wire version 6
//! or 5 (golden vectors of `proto/tests/golden/v6` and `v5`, the previous
//! releases) sent from a peer's address.

mod daemon_common;

use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use daemon_common::*;

/// `dlcpctl status` (human, or JSON with `--json`) of daemon `r`.
fn status(c: &Cluster, r: u32, json: bool) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlcpctl"));
    cmd.arg("--socket").arg(&c.daemons[r as usize].socket).arg("status");
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Daemon `r`'s Prometheus exposition.
fn metrics(c: &Cluster, r: u32) -> String {
    let v: serde_json::Value = serde_json::from_str(&status(c, r, true)).unwrap();
    let addr = v["ops"]["metrics"]["address"].as_str().unwrap_or_else(|| panic!("no metrics address: {v}"));
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Wait up to 15 s for `ok` on daemon `r`'s log.
fn wait_log(c: &Cluster, r: u32, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let t0 = Instant::now();
    loop {
        let log = c.log(r);
        if ok(&log) {
            return log;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "dlcpd {r}: no {what} in its log:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A golden vector file: hex, `#` comments ignored.
fn golden_of(version: &str, name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("proto/tests/golden/{version}/{name}.hex"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let hex: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.chars())
        .filter(|c| !c.is_whitespace())
        .collect();
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn daemons_with_different_packet_auth_refuse_each_other_naming_both() {
    let mut c = Cluster::start(&Options { hosts: 2, late: vec![1], ..Options::default() });
    // Rank 1 opts out of packet authentication; rank 0 keeps the default.
    let cfg = &c.daemons[1].config;
    let text = std::fs::read_to_string(cfg).unwrap() + "\n[security]\npacket_auth = \"none\"\n";
    std::fs::write(cfg, text).unwrap();
    c.spawn(1, 0.0);
    c.wait_ready(1);
    let addr = |r: usize| format!("127.0.0.1:{}", c.ports[r]);

    let log0 = wait_log(&c, 0, "refusal", |l| l.contains("packet_auth"));
    let want0 = format!(
        "rank 1 ({}) sends datagrams with packet_auth = \"none\"; this daemon has packet_auth = \"aes-128-gmac\"",
        addr(1)
    );
    assert!(log0.contains(&want0), "{log0}");
    let log1 = wait_log(&c, 1, "refusal", |l| l.contains("sends datagrams with"));
    let want1 = format!(
        "rank 0 ({}) sends datagrams with packet_auth = \"aes-128-gmac\"; this daemon has packet_auth = \"none\"",
        addr(0)
    );
    assert!(log1.contains(&want1), "{log1}");
    assert!(log1.contains("security.packet_auth = \"none\": datagrams are not authenticated"), "{log1}");
    assert!(!log0.contains("datagrams are not authenticated"), "{log0}");

    // Counted by reason, never accepted, never a plain bad tag; both peers stay down.
    for (r, peer) in [(0usize, 1usize), (1, 0)] {
        let st = c.stats(r as u32).unwrap();
        let p = &st["protocol"];
        assert!(p["rejected"]["auth_mismatch"].as_u64().unwrap() > 0, "{p}");
        assert_eq!(p["rejected"]["bad_tag"], 0, "{p}");
        assert_eq!(p["rx_packets_per_peer"][peer], 0, "{p}");
    }
    let s0 = status(&c, 0, false);
    assert!(s0.contains(&format!("REFUSED: {want0}")), "{s0}");
    assert!(s0.contains("packet auth: aes-128-gmac"), "{s0}");
    let s1 = status(&c, 1, false);
    assert!(s1.contains(&format!("REFUSED: {want1}")), "{s1}");
    assert!(s1.contains("packet auth: none — datagrams are NOT authenticated"), "{s1}");
    assert!(s0.contains("peers: 0/1 up") && s1.contains("peers: 0/1 up"), "{s0}\n{s1}");
    let m1 = metrics(&c, 1);
    assert!(m1.contains("dlcp_packet_auth{mode=\"none\"} 1\n"), "{m1}");
    let m0 = metrics(&c, 0);
    assert!(m0.contains("dlcp_packet_auth{mode=\"aes-128-gmac\"} 1\n"), "{m0}");
}

/// A datagram of wire version 9 (the previous release) or 8 (the one before).
#[test]
fn a_version_8_or_9_datagram_is_counted_and_reported_naming_both_versions() {
    for old in [9u8, 8] {
        old_version_is_refused(old);
    }
}

fn old_version_is_refused(old: u8) {
    // Rank 1 never starts: the test sends from its configured address.
    let c = Cluster::start(&Options { hosts: 2, late: vec![1], ..Options::default() });
    let peer = UdpSocket::bind(("127.0.0.1", c.ports[1])).unwrap();
    let dgram = golden_of(&format!("v{old}"), "data");
    assert_eq!(dgram[2], old, "a version {old} datagram");
    for _ in 0..3 {
        peer.send_to(&dgram, ("127.0.0.1", c.ports[0])).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let want = format!(
        "rank 1 (127.0.0.1:{}) speaks dlcp wire version {old}; this daemon speaks version 10",
        c.ports[1]
    );
    let log = wait_log(&c, 0, "version report", |l| l.contains(&format!("wire version {old}")));
    assert!(log.contains(&want), "{log}");
    let t0 = Instant::now();
    let st = loop {
        let st = c.stats(0).unwrap();
        if st["protocol"]["rejected"]["version_mismatch"] == 3 || t0.elapsed() > Duration::from_secs(10) {
            break st;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let p = &st["protocol"];
    assert_eq!(p["rejected"]["version_mismatch"], 3, "{p}");
    assert_eq!(p["rejected"]["malformed"], 0, "{p}");
    assert_eq!(p["rx_dropped_packets_per_peer"][1], 3, "{p}");
    // Reported once (rate-limited per peer), shown for that peer in the status.
    let says = format!("speaks dlcp wire version {old}");
    assert_eq!(c.log(0).matches(&says).count(), 1, "{}", c.log(0));
    let s = status(&c, 0, false);
    assert!(s.contains(&format!("REFUSED: {want}")), "{s}");
    // The metrics sample the counters periodically.
    let t0 = Instant::now();
    let line = "dlcp_rx_dropped_total{reason=\"version_mismatch\"} 3\n";
    let mut m = metrics(&c, 0);
    while !m.contains(line) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        m = metrics(&c, 0);
    }
    assert!(m.contains(line), "{m}");
}

/// Daemons with another flow-control window cannot talk (a sender starts at
/// its receiver's window): each refuses the other naming both windows, and
/// `dlcpctl status` shows the window and the refusal.
#[test]
fn daemons_with_different_flow_windows_refuse_each_other_naming_both() {
    let mut c = Cluster::start(&Options { hosts: 2, late: vec![1], ..Options::default() });
    let cfg = &c.daemons[1].config;
    let text = std::fs::read_to_string(cfg)
        .unwrap()
        .replace("[network]\n", "[network]\nflow_window_bytes = 1048576\n");
    std::fs::write(cfg, text).unwrap();
    c.spawn(1, 0.0);
    c.wait_ready(1);
    let addr = |r: usize| format!("127.0.0.1:{}", c.ports[r]);
    // 2 MiB and 1 MiB of 1472-byte datagrams.
    let want0 =
        format!("rank 1 ({}) has a flow-control window of 712 datagrams; this daemon has 1424", addr(1));
    let log0 = wait_log(&c, 0, "refusal", |l| l.contains("flow-control window"));
    assert!(log0.contains(&want0), "{log0}");
    let want1 =
        format!("rank 0 ({}) has a flow-control window of 1424 datagrams; this daemon has 712", addr(0));
    let log1 = wait_log(&c, 1, "refusal", |l| l.contains("flow-control window"));
    assert!(log1.contains(&want1), "{log1}");
    let s0 = status(&c, 0, false);
    assert!(s0.contains("flow control: receive window 1424 datagrams"), "{s0}");
    assert!(s0.contains(&format!("REFUSED: {want0}")), "{s0}");
    let s1 = status(&c, 1, false);
    assert!(s1.contains("flow control: receive window 712 datagrams"), "{s1}");
    for r in [0u32, 1] {
        let st = c.stats(r).unwrap();
        assert!(st["protocol"]["rejected"]["settings_mismatch"].as_u64().unwrap() > 0, "{st}");
    }
}
