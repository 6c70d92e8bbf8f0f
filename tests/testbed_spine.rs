//! The leaf–spine fabric of `scripts/testbed.sh up --spines 2` (issue 19): 4 hosts
//! on 2 leaves (h0, h2 on leaf0; h1, h3 on leaf1) joined by 2 spines, L3 with
//! ECMP hashed on the 5-tuple.
//!
//! * UDP from 256 source ports h0 → h1 spreads over both spines (each carries
//!   50% ± 15%, by the spines' counters), while one 5-tuple stays on one spine —
//!   the one `ip route get … sport P` names on the leaf, for a port of each spine.
//! * `link spine1 --loss 20` loses datagrams on spine 1 only: every datagram of a
//!   source port the leaf routes through spine 0 arrives, spine 0 drops nothing,
//!   and what the receiver misses is what spine 1 dropped.
//! * `down` leaves no namespace, no root-namespace link and no state behind.
//! * dlcpd runs on the fabric: allreduce ops are exact, their datagrams cross the
//!   spines.
//!
//! Needs root and network namespaces; where they are unavailable it fails under
//! `DLCP_REQUIRE_NETNS=1` / `DLCP_CI=1` and is reported as skipped otherwise (see
//! `tests/prereq`). Needs python3 (the UDP sender and receiver).

mod prereq;
mod testbed_common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use testbed_common::*;

/// Namespace prefix of the fabric test (distinct from the other tests').
const PREFIX: &str = "dlcptbs";
/// The prefix of the test that runs dlcpd on the fabric.
const PREFIX_DLCP: &str = "dlcptbd";
/// Where the datagrams go: host 1 (on leaf1), UDP port `DPORT`.
const DST: &str = "10.77.0.2";
const DPORT: u16 = 9999;
/// Source ports of the spread: `FIRST_PORT ..FIRST_PORT + PORTS`, `PER_PORT` each.
const FIRST_PORT: u16 = 20_000;
const PORTS: u16 = 256;
const PER_PORT: u32 = 8;

/// Sends `per` datagrams from each source port `first..first + n` to `DST:DPORT`,
/// round robin, pausing briefly every 64 (no queue overflows on the way).
const SENDER: &str = r#"
import socket, sys, time
first, n, per = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
socks = []
for p in range(first, first + n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("", p))
    socks.append(s)
sent = 0
for _ in range(per):
    for s in socks:
        s.sendto(b"x" * 200, (sys.argv[4], int(sys.argv[5])))
        sent += 1
        if sent % 64 == 0:
            time.sleep(0.001)
print(sent)
"#;

/// Counts datagrams per source port on UDP port argv[1] until 1.5 s pass without
/// one (after the first); prints "ready" once bound, then "port count" lines.
const RECEIVER: &str = r#"
import socket, sys, collections
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind(("", int(sys.argv[1])))
print("ready", flush=True)
s.settimeout(30)
n = collections.Counter()
while True:
    try:
        _, (_, port) = s.recvfrom(2048)
    except socket.timeout:
        break
    n[port] += 1
    s.settimeout(1.5)
for p, c in sorted(n.items()):
    print(p, c)
"#;

/// The fabric, torn down on drop (also when the test fails).
struct Fabric;

impl Drop for Fabric {
    fn drop(&mut self) {
        testbed(PREFIX, &["down"]);
    }
}

/// `testbed.sh counters` of the testbed `prefix`, parsed (not echoed, unlike
/// [`testbed`]: the JSON is long).
fn counters_of(prefix: &str) -> serde_json::Value {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed.sh");
    let out = Command::new(script).arg("counters").env("DLCPTB_PREFIX", prefix).output().unwrap();
    assert!(out.status.success(), "testbed.sh counters failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("counters: not JSON")
}

fn counters() -> serde_json::Value {
    counters_of(PREFIX)
}

/// `(udp packets seen, packets dropped)` of each spine.
fn spine_udp() -> Vec<(u64, u64)> {
    counters()["spines"]
        .as_array()
        .expect("spines array")
        .iter()
        .map(|s| (s["seen_udp_packets"].as_u64().unwrap(), s["dropped_packets"].as_u64().unwrap()))
        .collect()
}

fn delta(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    a.iter().zip(b).map(|(x, y)| (y.0 - x.0, y.1 - x.1)).collect()
}

fn in_ns(host: usize, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &format!("{PREFIX}-h{host}")]).args(args);
    c
}

/// Send from h0: `per` datagrams from each of `n` ports starting at `first`.
fn send(first: u16, n: u16, per: u32) -> u64 {
    let out = in_ns(0, &["python3", "-c", SENDER])
        .args([first.to_string(), n.to_string(), per.to_string(), DST.into(), DPORT.to_string()])
        .output()
        .expect("python3 not found (apt-get install python3)");
    assert!(out.status.success(), "sender failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("sender's count")
}

/// A receiver on h1, bound (it said "ready") before this returns.
fn receiver() -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = in_ns(1, &["python3", "-c", RECEIVER, &DPORT.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 not found");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "receiver did not start");
    (child, out)
}

/// The receiver's datagram counts per source port, once it went idle.
fn received(mut r: (Child, BufReader<std::process::ChildStdout>)) -> BTreeMap<u16, u32> {
    let mut m = BTreeMap::new();
    for line in r.1.lines() {
        let line = line.unwrap();
        let mut w = line.split_whitespace().map(|x| x.parse::<u32>().unwrap());
        m.insert(w.next().unwrap() as u16, w.next().unwrap());
    }
    assert!(r.0.wait().unwrap().success(), "receiver failed");
    m
}

/// The spine leaf0 routes h0 → h1 UDP from source port `sport` through, by
/// `ip route get` (the kernel's own multipath hash).
fn route_spine(sport: u16) -> usize {
    let out = Command::new("ip")
        .args(["-n", &format!("{PREFIX}-leaf0"), "route", "get", DST, "from", "10.77.0.1", "iif", "p0"])
        .args(["ipproto", "udp", "sport", &sport.to_string(), "dport", &DPORT.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let w: Vec<&str> = text.split_whitespace().collect();
    let dev = w.iter().position(|x| *x == "dev").map(|i| w[i + 1]).unwrap_or("");
    dev.strip_prefix('s').and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("route get: {text}"))
}

fn root_links() -> String {
    let out = Command::new("ip").args(["-br", "link"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn our_namespaces(prefix: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .map(String::from)
        .collect()
}

#[test]
fn ecmp_spreads_by_l4_hash_and_loss_stays_on_its_spine() {
    if let Err(why) = namespaces_available(PREFIX) {
        prereq::skip(prereq::Prereq::Netns, &why);
        return;
    }
    testbed(PREFIX, &["down"]);
    let links_before = root_links();
    let t0 = Instant::now();
    let fabric = Fabric;
    let up = testbed(PREFIX, &["up", "--hosts", "4", "--spines", "2"]);
    assert!(up.status.success(), "up --spines 2 failed");
    let mut names = our_namespaces(PREFIX);
    names.sort();
    assert_eq!(
        names,
        ["h0", "h1", "h2", "h3", "leaf0", "leaf1", "spine0", "spine1"].map(|n| format!("{PREFIX}-{n}")),
        "namespaces of a 4-host, 2-leaf, 2-spine fabric"
    );
    let c = counters();
    assert_eq!(c["fabric"], true, "{c}");
    assert_eq!(c["spines"].as_array().unwrap().len(), 2, "{c}");
    // The DSCP scheduler on every port: 4 host ports, 2 x 2 uplinks, 2 x 2 downlinks.
    assert_eq!(c["ports"].as_array().unwrap().len(), 12, "{c}");
    assert!(
        c["ports"].as_array().unwrap().iter().all(|p| p["classes"].as_array().unwrap().len() == 8),
        "{c}"
    );

    // 1. Many source ports: both spines carry 50% ± 15%.
    let a = spine_udp();
    let sent = send(FIRST_PORT, PORTS, PER_PORT);
    let d = delta(&a, &spine_udp());
    let total: u64 = d.iter().map(|x| x.0).sum();
    eprintln!("{sent} datagrams from {PORTS} source ports: spine0 {} spine1 {}", d[0].0, d[1].0);
    assert!(total * 100 >= sent * 99, "the spines saw only {total} of {sent} datagrams");
    for (s, x) in d.iter().enumerate() {
        let share = x.0 as f64 / total as f64;
        assert!((0.35..=0.65).contains(&share), "spine{s} carried {:.1}% of {total}", share * 100.0);
    }

    // 2. One 5-tuple stays on one spine: the one the leaf's hash names, for a
    // port that hashes to each spine.
    let mut by_spine: [Option<u16>; 2] = [None, None];
    for p in 30_000..30_100u16 {
        by_spine[route_spine(p)].get_or_insert(p);
    }
    for (s, p) in by_spine.iter().enumerate() {
        let p = p.unwrap_or_else(|| panic!("no port of 100 hashes to spine{s}: no ECMP"));
        let a = spine_udp();
        let sent = send(p, 1, 500);
        let d = delta(&a, &spine_udp());
        eprintln!("source port {p} (ip route get: spine{s}): spine0 {} spine1 {}", d[0].0, d[1].0);
        assert!(d[s].0 >= sent * 99 / 100, "port {p}: spine{s} saw only {} of {sent}", d[s].0);
        assert_eq!(d[1 - s].0, 0, "port {p}: a single 5-tuple also crossed spine{}", 1 - s);
    }

    // 3. 20% loss on spine 1 only.
    let out = testbed(PREFIX, &["link", "spine1", "--loss", "20"]);
    assert!(out.status.success(), "link spine1 --loss 20 failed");
    assert_eq!(counters()["spines"][1]["loss"], "20");
    let via: BTreeMap<u16, usize> = (FIRST_PORT..FIRST_PORT + PORTS).map(|p| (p, route_spine(p))).collect();
    let a = spine_udp();
    let rx = receiver();
    let sent = send(FIRST_PORT, PORTS, PER_PORT);
    let got = received(rx);
    let d = delta(&a, &spine_udp());
    let lost_on: Vec<u64> = (0..2)
        .map(|s| {
            via.iter()
                .filter(|&(_, &v)| v == s)
                .map(|(p, _)| u64::from(PER_PORT - got.get(p).copied().unwrap_or(0)))
                .sum()
        })
        .collect();
    eprintln!(
        "spine1 at 20% loss: spine0 saw {} dropped {}, spine1 saw {} dropped {}; receiver missed {} of the \
         ports via spine0, {} of those via spine1",
        d[0].0, d[0].1, d[1].0, d[1].1, lost_on[0], lost_on[1]
    );
    assert_eq!(d[0].1, 0, "spine0 has no loss set but dropped {}", d[0].1);
    assert_eq!(lost_on[0], 0, "datagrams routed through spine0 were lost");
    let seen1 = d[1].0;
    assert!(
        d[1].1 * 100 >= seen1 * 12 && d[1].1 * 100 <= seen1 * 28,
        "spine1 dropped {} of {seen1} (20% set)",
        d[1].1
    );
    // What the receiver missed is what spine 1 dropped (the counter counts
    // every packet it dropped, datagrams only here).
    assert_eq!(lost_on[1], d[1].1, "receiver's losses on spine1's ports vs spine1's drop counter");
    assert_eq!(sent - got.values().map(|&c| u64::from(c)).sum::<u64>(), d[1].1);
    let out = testbed(PREFIX, &["link", "spine1", "--loss", "0"]);
    assert!(out.status.success());

    // 4. down leaves nothing.
    drop(fabric);
    assert!(our_namespaces(PREFIX).is_empty(), "namespaces left: {:?}", our_namespaces(PREFIX));
    assert_eq!(root_links(), links_before, "the root namespace's links changed");
    assert!(!std::path::Path::new(&format!("/run/dlcptb/{PREFIX}")).exists(), "state dir left behind");
    let st = testbed(PREFIX, &["status"]);
    assert!(String::from_utf8_lossy(&st.stdout).contains("down"), "status after down");
    eprintln!("fabric test done in {:?}", t0.elapsed());
}

#[test]
fn dlcpd_allreduce_is_exact_across_the_fabric() {
    let Some(bed) = Bed::start(PREFIX_DLCP, 4, &["--spines", "2"], 10_000) else { return };
    let seen = |v: &serde_json::Value| -> u64 {
        v["spines"].as_array().unwrap().iter().map(|s| s["seen_udp_packets"].as_u64().unwrap()).sum()
    };
    let read = || counters_of(PREFIX_DLCP);
    let before = seen(&read());
    let sizes = [65_536, 100_003, 262_144];
    let results = run_ops(&bed, &sizes, 0);
    for (i, &n) in sizes.iter().enumerate() {
        let mut want = data(seed(0, i), n);
        for h in 1..bed.hosts {
            want.iter_mut().zip(data(seed(h, i), n)).for_each(|(a, b)| *a += b);
        }
        for (h, r) in results.iter().enumerate() {
            assert!(
                r[i].0.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "host {h} op {i}: not the exact sum"
            );
        }
    }
    let c = read();
    let crossed = seen(&c) - before;
    // h0 and h2 share leaf0, h1 and h3 leaf1: two thirds of every host's chunks
    // cross a spine (about 2 x 2/3 x 3/4 of each tensor per host, in 1372-byte chunks).
    let chunks: usize = sizes.iter().map(|n| n * 4 / 1372).sum();
    eprintln!("dlcp datagrams through the spines: {crossed} (~{} chunks per host)", chunks);
    assert!(crossed as usize >= chunks * 4, "only {crossed} UDP datagrams crossed the spines: {c}");
}
