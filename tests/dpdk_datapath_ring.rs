//! The DPDK datapath on `net_ring0` (TX queue i loops into RX queue i), no
//! hugepages: datagrams sent to our own address first wait for ARP, the ARP
//! request loops back and is answered by dlcp itself, the reply resolves the
//! neighbour and releases them; every class then arrives intact through its
//! configured TX queue, and the per-queue counters say so; a static neighbour
//! needs no ARP. One test: EAL is once per process. Without DPDK in the build the
//! test fails under `DLCP_REQUIRE_DPDK=1`, else it is reported as skipped.

mod prereq;

#[cfg(dpdk)]
use std::net::SocketAddr;
#[cfg(dpdk)]
use std::time::{Duration, Instant};

#[cfg(dpdk)]
use dlcp::datapath::dpdk::{DpdkConfig, DpdkDatapath};
#[cfg(dpdk)]
use dlcp::datapath::{Datapath, Outgoing, SendOutcome};
#[cfg(dpdk)]
use dlcp::proto::class::Class;

/// A build without DPDK: fails under `DLCP_REQUIRE_DPDK=1` / `DLCP_CI=1`, else
/// reported as skipped (see `tests/prereq`).
#[cfg(not(dpdk))]
#[test]
fn arp_resolves_itself_and_classes_use_their_queues() {
    prereq::skip(prereq::Prereq::Dpdk, dlcp_ffi::DPDK_PROBE);
}

#[cfg(dpdk)]
#[test]
fn arp_resolves_itself_and_classes_use_their_queues() {
    let eal_args: Vec<String> = [
        "--no-huge",
        "--no-pci",
        "--no-shconf",
        "--no-telemetry",
        "-m",
        "256",
        "-l",
        "0",
        "--vdev=net_ring0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let local = "10.98.0.1:7700".parse().unwrap();
    let cfg = DpdkConfig {
        eal_args,
        port_id: 0,
        rx_queues: 2,
        tx_queues: 2,
        rx_burst: 32,
        tx_burst: 8,
        rx_ring_size: 256,
        tx_ring_size: 256,
        mbuf_pool_size: 2047,
        class_tx_queue: [0, 0, 0, 0, 1, 1, 1, 1],
        dscp: dlcp::config::schema::DEFAULT_DSCP,
        local,
        // A static neighbour: no ARP for it.
        neighbours: vec![("10.98.0.7".parse().unwrap(), dlcp::datapath::frame::Mac([2, 0, 0, 0, 0, 7]))],
        mtu: 1500,
        // Four source ports: `send` uses path 0, `send_batch` each datagram's.
        paths: 4,
    };
    let mut dp = DpdkDatapath::new(cfg).expect("DPDK datapath on net_ring0");
    assert!(dp.describe().starts_with("dpdk (port 0 net_ring0"), "{}", dp.describe());
    assert_eq!(dp.register(&mio::Poll::new().unwrap().registry().try_clone().unwrap(), 10).unwrap(), 0);

    let me = SocketAddr::V4(local);
    let mut sent = Vec::new();
    for i in 0..40u32 {
        let class = Class::new((i % 8) as u8).unwrap();
        let d: Vec<u8> = (0..(100 + i * 30)).map(|j| (j ^ i) as u8).collect();
        assert_eq!(dp.send(me, class, &d).unwrap(), SendOutcome::Sent);
        sent.push(d);
    }
    let mut got: Vec<Vec<u8>> = Vec::new();
    let t0 = Instant::now();
    while got.len() < sent.len() && t0.elapsed() < Duration::from_secs(5) {
        dp.flush().unwrap();
        dp.recv(&mut |from, b| {
            assert_eq!(from, me);
            got.push(b.to_vec());
        })
        .unwrap();
        std::thread::sleep(dp.poll_hint().expect("a poll-mode datapath gives a poll hint"));
    }
    let s = dp.dpdk_stats();
    assert_eq!(got.len(), sent.len(), "datagrams delivered after ARP ({s:?})");
    got.sort();
    sent.sort();
    assert_eq!(got, sent, "payloads intact");
    assert_eq!(s.arp_requests_sent, 1, "one ARP request for one unresolved neighbour: {s:?}");
    assert_eq!(s.arp_replies_sent, 1, "dlcp answered the request for its own address: {s:?}");
    assert_eq!(s.tx_unresolved_dropped, 0);
    // Classes 0..3 on queue 0, 4..7 on queue 1: 20 datagrams each, plus the ARP
    // request and reply on the control class's queue (1).
    assert_eq!(s.tx_queues[0].packets, 20, "{s:?}");
    assert_eq!(s.tx_queues[1].packets, 22, "{s:?}");
    assert_eq!((s.tx_queues[0].classes, s.tx_queues[1].classes), (0x0f, 0xf0));
    assert_eq!(s.rx_queue_packets, vec![20, 22]);
    let st = dp.stats();
    assert_eq!(st.tx_packets, [5; 8]);
    assert_eq!(st.rx_packets, 40);
    // To the static neighbour: sent at once without ARP; it loops back to us and,
    // addressed to 10.98.0.7, is counted as not for us.
    let other: SocketAddr = "10.98.0.7:7700".parse().unwrap();
    assert_eq!(dp.send(other, Class::new(6).unwrap(), b"static").unwrap(), SendOutcome::Sent);
    dp.flush().unwrap();
    let t0 = Instant::now();
    while dp.dpdk_stats().rx_not_for_us == 0 && t0.elapsed() < Duration::from_secs(5) {
        assert_eq!(dp.recv(&mut |_, _| panic!("delivered a datagram not for us")).unwrap(), 0);
        std::thread::sleep(Duration::from_micros(100));
    }
    let s = dp.dpdk_stats();
    assert_eq!((s.rx_not_for_us, s.arp_requests_sent), (1, 1), "{s:?}");
    // A new DSCP map applies live (tests/dpdk_tap_reload.rs reads it on the
    // wire); an out-of-range one is refused and changes nothing. Frames built
    // after the change still pass dlcp's own checksum verification on receive.
    let mut bad = dlcp::config::schema::DEFAULT_DSCP;
    bad[3] = 64;
    assert!(dp.set_marking(bad, [0; 8]).is_err());
    assert!(dp.set_marking([8, 12, 20, 28, 36, 44, 38, 56], [0; 8]).unwrap(), "DPDK re-marks live");
    for c in Class::all() {
        assert_eq!(dp.send(me, c, b"re-marked").unwrap(), SendOutcome::Sent);
    }
    let mut n = 0;
    let t0 = Instant::now();
    while n < 8 && t0.elapsed() < Duration::from_secs(5) {
        dp.flush().unwrap();
        dp.recv(&mut |_, b| {
            assert_eq!(b, b"re-marked");
            n += 1;
        })
        .unwrap();
        std::thread::sleep(Duration::from_micros(100));
    }
    let s = dp.dpdk_stats();
    assert_eq!((n, s.rx_bad_ip_checksum, s.rx_bad_udp_checksum), (8, 0, 0), "{s:?}");
    // Per-packet load balancing: a datagram on path p leaves from source port
    // 7700 + p (a path beyond the four configured wraps round).
    let bodies: Vec<Vec<u8>> = (0..6u8).map(|p| vec![p; 64]).collect();
    let class5 = Class::new(5).unwrap();
    let batch: Vec<Outgoing<'_>> = bodies
        .iter()
        .enumerate()
        .map(|(p, b)| Outgoing { dst: me, class: class5, path: p as u8, parts: [b, &[], &[]] })
        .collect();
    dp.send_batch(&batch).unwrap();
    let mut seen: Vec<(u16, u8)> = Vec::new();
    let t0 = Instant::now();
    while seen.len() < bodies.len() && t0.elapsed() < Duration::from_secs(5) {
        dp.flush().unwrap();
        dp.recv(&mut |from, b| seen.push((from.port() - 7700, b[0]))).unwrap();
        std::thread::sleep(Duration::from_micros(100));
    }
    seen.sort();
    assert_eq!(seen, [(0, 0), (0, 4), (1, 1), (1, 5), (2, 2), (3, 3)], "source port = 7700 + path");
    // Idle: the hint backs off towards 1 ms.
    for _ in 0..20 {
        dp.recv(&mut |_, _| {}).unwrap();
    }
    assert_eq!(dp.poll_hint(), Some(Duration::from_millis(1)));
}
