//! Checksum offload on a device that offers it: in a network namespace of its
//! own, dlcpd 0 drives `net_tap0` through DPDK (the tap PMD offers IPv4/UDP TX
//! checksum offload, so dlcp leaves the checksums to the device), dlcpd 1 runs on
//! kernel sockets on the tap's kernel side. The kernel drops UDP with a wrong
//! checksum, so bit-exact allreduces prove the offloaded checksums are right; ARP
//! runs both ways (the kernel asks dlcp, dlcp asks the kernel).
//!
//! Needs a build with DPDK, root and network namespaces; where one is missing the
//! test fails under `DLCP_REQUIRE_<NAME>=1` / `DLCP_CI=1`, else it is reported as
//! skipped (see `tests/prereq`).

#[cfg(dpdk)]
mod daemon_common;
mod prereq;
#[cfg(dpdk)]
mod tap_common;

#[cfg(dpdk)]
use std::time::Duration;

#[cfg(dpdk)]
use daemon_common::{JOB, data};
#[cfg(dpdk)]
use tap_common::{Tap, ctl, ip};

#[cfg(dpdk)]
const NS: &str = "dpdktap";

/// A build without DPDK: fails under `DLCP_REQUIRE_DPDK=1` / `DLCP_CI=1`, else
/// reported as skipped (see `tests/prereq`).
#[cfg(not(dpdk))]
#[test]
fn offloaded_checksums_are_accepted_by_the_kernel() {
    prereq::skip(prereq::Prereq::Dpdk, dlcp_ffi::DPDK_PROBE);
}

#[cfg(dpdk)]
#[test]
fn offloaded_checksums_are_accepted_by_the_kernel() {
    let mut g = match Tap::new(NS, 7703) {
        Ok(g) => g,
        Err(why) => return prereq::skip(prereq::Prereq::Netns, &why),
    };
    let dpdk = g.dpdk_datapath("dtap0");
    let s0 = g.spawn(0, &dpdk);
    // The tap's kernel side: host 1's address (the kernel owns it, not DPDK).
    assert!(ip(&["-n", NS, "addr", "add", "10.78.0.1/24", "dev", "dtap0"]));
    assert!(ip(&["-n", NS, "link", "set", "dtap0", "up"]));
    let s1 = g.spawn(1, "");

    let st = ctl(&s0, &["stats", "--json"]).unwrap();
    let detail = &st["datapath_counters"]["detail"];
    assert_eq!(detail["tx_checksum_offload"], true, "net_tap should offer checksum offload: {st}");

    let n = 200_003;
    let handles: Vec<_> = [s0.clone(), s1.clone()]
        .into_iter()
        .enumerate()
        .map(|(r, sock)| {
            std::thread::spawn(move || {
                let mut cl = dlcp::shm::TrainerChannel::attach(&sock, u64::from(JOB), 0, 1).unwrap();
                let mut out = Vec::new();
                for i in 0..3u32 {
                    let t = cl.alloc(&format!("t{i}"), n as u64).unwrap();
                    cl.write(&t, &data(u64::from(r as u32 * 10 + i), n)).unwrap();
                    let o = dlcp::shm::SubmitOptions { tensor_id: i, budget_ppm: 0, ..Default::default() };
                    cl.submit(&t, o).unwrap();
                    let d = cl.wait_completion(Duration::from_secs(20)).unwrap();
                    assert_eq!(d.status, dlcp::shm::Status::Ok, "rank {r} op {i}");
                    out.push(cl.read(&t).unwrap());
                }
                out
            })
        })
        .collect();
    let got: Vec<Vec<Vec<f32>>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for i in 0..3u64 {
        let want: Vec<u32> = data(i, n).iter().zip(data(10 + i, n)).map(|(a, b)| (a + b).to_bits()).collect();
        for (r, g) in got.iter().enumerate() {
            let g: Vec<u32> = g[i as usize].iter().map(|x| x.to_bits()).collect();
            assert!(g == want, "rank {r} op {i}: not bit-exact");
        }
    }
    let st = ctl(&s0, &["stats", "--json"]).unwrap();
    let detail = &st["datapath_counters"]["detail"];
    eprintln!("DPDK side over net_tap: {detail}");
    assert!(detail["arp_replies_sent"].as_u64().unwrap() >= 1, "the kernel never asked dlcp: {detail}");
    assert!(detail["arp_requests_sent"].as_u64().unwrap() >= 1, "dlcp never asked the kernel: {detail}");
    assert_eq!(detail["rx_bad_udp_checksum"], 0, "{detail}");
    assert!(
        st["datapath_counters"]["tx_packets_per_class"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v.as_u64() > Some(100))
    );
}
