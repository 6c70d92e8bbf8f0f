//! UDP GRO on the emulated cluster of `scripts/testbed.sh --host-gro`: GRO on
//! each host's own end (as a host's NIC has it; the switch still carries
//! wire-sized packets). 4 hosts, 8 allreduce ops of 1 Mi f32 with the default
//! 16 paths: every result equals the oracle's, and on every host most of the
//! datagrams dlcpd read arrived coalesced (`gro_segments` ≥ half of
//! `rx_packets`).
//!
//! This is the test of `UDP_GRO` on every socket of the port's reuseport group
//! (`daemon/src/datapath/socket`): the kernel's GRO picks the socket that
//! decides by the 4-tuple's hash, without the steering program, so with
//! `UDP_GRO` on the receive socket alone only the flows whose hash picked it
//! were coalesced (18% of host 0's datagrams in this test; 99% with every
//! socket set).
//!
//! Needs root, network namespaces and ethtool; where namespaces are unavailable
//! it fails under `DLCP_REQUIRE_NETNS=1` / `DLCP_CI=1` and is reported as
//! skipped otherwise (see `tests/prereq`).

mod prereq;
mod testbed_common;

use testbed_common::*;

const PREFIX: &str = "dlcptbg";
const HOSTS: usize = 4;

#[test]
fn with_host_gro_most_datagrams_arrive_coalesced_and_results_are_exact() {
    let Some(bed) = Bed::start(PREFIX, HOSTS, &["--host-gro"], 10_000) else { return };
    let sizes = vec![1 << 20; 8];
    let results = run_ops(&bed, &sizes, 0);
    check_against_oracle(&bed, &sizes, &results, 0);
    for h in 0..HOSTS {
        let st = bed.stats(h);
        let c = &st["datapath_counters"];
        let d = &c["detail"];
        assert_eq!(d["gro_active"], true, "host {h}: GRO not active: {d}");
        let rx = c["rx_packets"].as_u64().unwrap();
        let merged = d["gro_segments"].as_u64().unwrap();
        let receives = d["gro_packets"].as_u64().unwrap();
        let share = merged as f64 / rx as f64;
        eprintln!(
            "host {h}: {rx} datagrams read, {merged} ({:.1}%) in {receives} coalesced receives",
            100.0 * share
        );
        assert!(rx > 0 && merged <= rx, "host {h}: counters: {c}");
        assert!(
            share >= 0.5,
            "host {h}: only {:.1}% of {rx} datagrams arrived coalesced ({receives} coalesced receives)",
            100.0 * share
        );
    }
}
