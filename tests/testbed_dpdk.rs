//! Wire compatibility of the DPDK datapath, on the emulated cluster of
//! `scripts/testbed.sh`: 4 hosts, host 0's dlcpd drives its veth through DPDK
//! (`net_af_packet` inside its namespace, no hugepages; the kernel holds no
//! address on that veth, so dlcp answers ARP itself), hosts 1..3 run on sockets.
//!
//! * `dpdk_host_budget_zero_bit_exact_and_dscp_on_the_wire`: 12 allreduce ops
//!   are bit-exact everywhere, and a capture on host 0's switch port shows every
//!   dlcp datagram host 0 sent marked with its class's DSCP (data classes of both
//!   phases and control).
//! * `dpdk_host_one_pct_loss_within_budget`: 1% random loss on every link (host
//!   0's included: a bridge rule on its switch port, since af_packet sees frames
//!   before the host's nftables input hook), budget 1%: every op completes within
//!   budget and equals the oracle's recomputation on every rank.
//!
//! Needs root, network namespaces and a build with DPDK; where one is missing the
//! tests fail under `DLCP_REQUIRE_<NAME>=1` / `DLCP_CI=1`, else they are reported
//! as skipped (see `tests/prereq`).

mod prereq;
#[cfg(dpdk)]
mod testbed_common;

#[cfg(dpdk)]
use std::collections::BTreeMap;
#[cfg(dpdk)]
use std::process::{Command, Stdio};
#[cfg(dpdk)]
use std::time::{Duration, Instant};

#[cfg(dpdk)]
use testbed_common::*;

#[cfg(dpdk)]
const HOSTS: usize = 4;

#[cfg(dpdk)]
fn size(i: usize) -> usize {
    [65_536, 100_003, 180_001, 262_144][i % 4]
}

#[cfg(dpdk)]
fn sh(ns: &str, args: &[&str]) {
    let out = Command::new("ip").args(["netns", "exec", ns]).args(args).output().unwrap();
    assert!(out.status.success(), "{ns}: {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// The testbed with host 0 restarted on DPDK; waits until every host sees every peer up.
#[cfg(dpdk)]
fn dpdk_bed(prefix: &'static str, args: &[&str]) -> Option<Bed> {
    let mut bed = Bed::start(prefix, HOSTS, args, 10_000)?;
    bed.kill9(0);
    let (h0, sw) = (bed.ns(0), format!("{prefix}-sw"));
    // DPDK owns host 0's veth: the kernel must not answer for its address.
    sh(&h0, &["ip", "addr", "flush", "dev", "eth0"]);
    // Frames from the other hosts' kernels cross the veths with checksums left to
    // an offload (CHECKSUM_PARTIAL); a real wire carries complete ones. The switch
    // port towards host 0 without TX checksum offload completes them.
    sh(&sw, &["ethtool", "-K", "p0", "tx", "off"]);
    bed.host_extra[0] = format!(
        "[datapath]\nkind = \"dpdk\"\n[datapath.dpdk]\neal_args = [\"--no-huge\", \"--no-pci\", \"--no-shconf\", \"--no-telemetry\", \"-m\", \"256\", \"-l\", \"0\", \"--file-prefix\", \"{prefix}\", \"--vdev=net_af_packet0,iface=eth0\"]\nrx_ring_size = 1024\ntx_ring_size = 1024\n"
    );
    bed.spawn(0);
    bed.wait_ready(0);
    // The other kernels knew host 0's MAC from before: make them ask again (dlcp answers).
    for h in 1..HOSTS {
        sh(&bed.ns(h), &["ip", "neigh", "flush", "all"]);
    }
    let d = bed.status(0)["datapath"].as_str().unwrap_or_default().to_string();
    assert!(d.starts_with("dpdk (port 0 net_af_packet0"), "host 0 is not on DPDK: {d}");
    let t0 = Instant::now();
    loop {
        let all_up = (0..HOSTS).all(|h| {
            bed.status(h)["peers"]
                .as_array()
                .is_some_and(|p| p.iter().all(|p| p["up"].as_bool() == Some(true)))
        });
        if all_up {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "peers did not all come up with host 0 on DPDK");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(bed)
}

/// A build without DPDK: fails under `DLCP_REQUIRE_DPDK=1` / `DLCP_CI=1`, else
/// reported as skipped (see `tests/prereq`).
#[cfg(not(dpdk))]
#[test]
fn dpdk_host_budget_zero_bit_exact_and_dscp_on_the_wire() {
    prereq::skip(prereq::Prereq::Dpdk, dlcp_ffi::DPDK_PROBE);
}

#[cfg(dpdk)]
#[test]
fn dpdk_host_budget_zero_bit_exact_and_dscp_on_the_wire() {
    let prefix = "dpdkr";
    let Some(mut bed) = dpdk_bed(prefix, &[]) else { return };
    let cap = bed.capture("p0", &["-Q", "in"]); // frames host 0 sent

    let sizes: Vec<usize> = (0..12).map(size).collect();
    let results = run_ops(&bed, &sizes, 0);
    for (i, &n) in sizes.iter().enumerate() {
        let mut want = data(seed(0, i), n);
        for h in 1..HOSTS {
            want.iter_mut().zip(data(seed(h, i), n)).for_each(|(a, b)| *a += b);
        }
        let want: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
        for (h, r) in results.iter().enumerate() {
            let got: Vec<u32> = r[i].0.iter().map(|x| x.to_bits()).collect();
            assert!(got == want, "host {h} op {i} ({n} elems): budget 0 result is not bit-exact");
            assert_eq!(r[i].1.delivered_ppm, 1_000_000, "host {h} op {i}");
        }
    }
    std::thread::sleep(Duration::from_millis(300)); // heartbeats (class 7) too

    let dscp = dlcp::config::schema::DEFAULT_DSCP;
    let marks = dlcp_marks(&bed.finish_capture(cap), PORT);
    let mut per_class: BTreeMap<u8, u64> = BTreeMap::new();
    let mut wrong = Vec::new();
    for &Mark { tos, class, src, .. } in &marks {
        assert_eq!(src, [10, 77, 0, 1], "a frame into p0 from someone else than host 0");
        *per_class.entry(class).or_default() += 1;
        if usize::from(class) >= 8 || tos != dscp[usize::from(class)] << 2 {
            wrong.push((class, tos >> 2));
        }
    }
    let s0 = bed.stats(0);
    eprintln!("host 0 (DPDK) datagrams on the wire per class: {per_class:?}");
    eprintln!("host 0 datapath counters: {}", s0["datapath_counters"]);
    assert!(marks.len() > 200, "only {} dlcp datagrams from host 0 captured", marks.len());
    assert!(
        wrong.is_empty(),
        "{} of {} datagrams with a wrong DSCP: {:?}",
        wrong.len(),
        marks.len(),
        &wrong[..wrong.len().min(10)]
    );
    assert!(per_class.contains_key(&7), "no control packets captured: {per_class:?}");
    assert!((0..=3).any(|c| per_class.contains_key(&c)), "no reduce-scatter data: {per_class:?}");
    assert!((4..=6).any(|c| per_class.contains_key(&c)), "no all-gather data: {per_class:?}");
    let detail = &s0["datapath_counters"]["detail"];
    assert!(detail["arp_replies_sent"].as_u64().unwrap_or(0) > 0, "host 0 answered no ARP: {detail}");
    assert_eq!(detail["rx_bad_udp_checksum"], 0, "{detail}");
    assert_eq!(detail["rx_bad_ip_checksum"], 0, "{detail}");
    for h in 0..HOSTS {
        let s = bed.stats(h);
        assert_eq!(s["service"]["ops_failed"], 0, "host {h}: {s}");
        assert_eq!(s["protocol"]["hard_timeouts"], 0, "host {h}: {s}");
    }
}

/// A build without DPDK: fails under `DLCP_REQUIRE_DPDK=1` / `DLCP_CI=1`, else
/// reported as skipped (see `tests/prereq`).
#[cfg(not(dpdk))]
#[test]
fn dpdk_host_one_pct_loss_within_budget() {
    prereq::skip(prereq::Prereq::Dpdk, dlcp_ffi::DPDK_PROBE);
}

#[cfg(dpdk)]
#[test]
fn dpdk_host_one_pct_loss_within_budget() {
    const BUDGET: u32 = 10_000;
    let prefix = "dpdkl";
    let Some(bed) = dpdk_bed(prefix, &["--loss", "1"]) else { return };
    // Host 0's inbound loss: af_packet takes frames before nftables' inet input
    // hook, so drop 1% of what the switch forwards to p0 instead.
    let rules = "table bridge dpdkloss {\n counter seen {}\n counter dropped {}\n chain tohost0 {\n  type filter hook forward priority 0; policy accept;\n  oifname \"p0\" counter name seen\n  oifname \"p0\" numgen random mod 10000 < 100 counter name dropped drop\n }\n}\n";
    let mut nft = Command::new("ip")
        .args(["netns", "exec", &format!("{prefix}-sw"), "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    nft.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
    assert!(nft.wait().unwrap().success(), "nft bridge loss rule failed");

    let sizes: Vec<usize> = (0..16).map(size).collect();
    let results = run_ops(&bed, &sizes, BUDGET);
    let (_, lossy) = check_against_oracle(&bed, &sizes, &results, BUDGET);
    let (seen, dropped) = bed.loss_counters();
    let p0 = Command::new("ip")
        .args([
            "netns",
            "exec",
            &format!("{prefix}-sw"),
            "nft",
            "list",
            "counter",
            "bridge",
            "dpdkloss",
            "dropped",
        ])
        .output()
        .unwrap();
    let p0 = String::from_utf8_lossy(&p0.stdout);
    eprintln!(
        "loss: {dropped} of {seen} dropped at hosts 1..3, towards host 0: {}; {lossy} of {} ops lost a chunk",
        p0.trim(),
        sizes.len()
    );
    assert!(dropped > 0 && lossy > 0, "1% loss left nothing missing: the test proves nothing");
    assert!(!p0.contains("packets 0 "), "no loss towards the DPDK host: {p0}");
    for h in 0..HOSTS {
        let s = bed.stats(h);
        assert_eq!(s["service"]["ops_failed"], 0, "host {h}: {s}");
        assert_eq!(s["protocol"]["hard_timeouts"], 0, "host {h}: {s}");
    }
}
