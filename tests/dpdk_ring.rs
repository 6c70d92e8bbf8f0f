//! DPDK on `net_ring0` (a virtual device that loops TX back to RX), without
//! hugepages or a NIC: frames built by dlcp's `frame` module leave through the
//! dlcp-ffi wrappers (mempool, port, queues, mbuf) and come back with the right
//! Ethernet/IPv4/UDP headers, DSCP and checksums. EAL is once per process, so
//! this file holds exactly one test (its own test binary). Without DPDK in the
//! build the test fails under `DLCP_REQUIRE_DPDK=1`, else it is reported as skipped.

mod prereq;

#[cfg(dpdk)]
use std::net::SocketAddrV4;
#[cfg(dpdk)]
use std::time::{Duration, Instant};

#[cfg(dpdk)]
use dlcp::datapath::frame::{self, Checksum, Mac, Parsed, UdpFrame};
#[cfg(dpdk)]
use dlcp_ffi::dpdk::{Eal, Mempool, Port, PortConfig};

/// Checks a header's Internet checksum independently of `frame`: the ones-complement
/// sum over it (checksum field included) must be 0xffff.
#[cfg(dpdk)]
fn folds_to_ffff(words: &[u8]) -> bool {
    let mut s: u32 = words.chunks(2).map(|c| u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0))).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s == 0xffff
}

/// A build without DPDK: fails under `DLCP_REQUIRE_DPDK=1` / `DLCP_CI=1`, else
/// reported as skipped (see `tests/prereq`).
#[cfg(not(dpdk))]
#[test]
fn frames_leave_and_come_back_on_net_ring() {
    prereq::skip(prereq::Prereq::Dpdk, dlcp_ffi::DPDK_PROBE);
}

#[cfg(dpdk)]
#[test]
fn frames_leave_and_come_back_on_net_ring() {
    let args: Vec<String> = [
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
    let eal = Eal::init(&args).expect("EAL on net_ring0 without hugepages");
    assert!(matches!(Eal::init(&args), Err(dlcp_ffi::dpdk::Error::EalAlreadyTried { .. })), "EAL twice");
    assert_eq!(eal.port_count(), 1);
    let pool = Mempool::new(eal, "dlcp_test", 1023, 32, Mempool::default_data_room(), -1).expect("mempool");
    let before = pool.available();
    let cfg = PortConfig {
        rx_queues: 2,
        tx_queues: 2,
        rx_ring_size: 256,
        tx_ring_size: 256,
        tx_cksum_offload: true,
        promiscuous: false,
    };
    let missing = Port::open(eal, 7, pool, &cfg).unwrap_err();
    assert!(missing.to_string().contains("port 7 does not exist"), "{missing}");
    let mut port = Port::open(eal, 0, pool, &cfg).expect("open net_ring0");
    assert_eq!(port.info().name, "net_ring0");
    assert!(!port.info().tx_cksum_offload, "net_ring offers no checksum offload");
    assert!(port.link_up());

    // One frame per class with the default DSCP of that class, payload lengths varied.
    let dscp = dlcp::config::schema::DEFAULT_DSCP;
    let src: SocketAddrV4 = "10.99.0.1:7700".parse().unwrap();
    let dst: SocketAddrV4 = "10.99.0.2:7701".parse().unwrap();
    let mut sent = Vec::new();
    for (class, &d) in dscp.iter().enumerate() {
        let payload: Vec<u8> = (0..(10 + class * 180)).map(|i| (i * 31 + class) as u8).collect();
        let f = UdpFrame {
            src_mac: Mac(port.info().mac),
            dst_mac: Mac([2, 0, 0, 0, 0, 2]),
            src,
            dst,
            dscp: d,
            ident: class as u16,
            ttl: 64,
        };
        let mut m = pool.alloc().expect("mbuf");
        let len = UdpFrame::len_for(payload.len()).max(frame::MIN_FRAME);
        let buf = m.append(len as u16).expect("tailroom");
        assert_eq!(f.write(buf, &payload, Checksum::Software), Some(len));
        let queue = u16::from(class >= 4);
        let mut v = vec![m];
        assert_eq!(port.tx_burst(queue, &mut v), 1);
        assert!(v.is_empty());
        sent.push((d, payload));
    }

    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < sent.len() && Instant::now() < deadline {
        // net_ring loops TX queue i into RX queue i.
        if port.rx_burst(0, &mut got, 32) + port.rx_burst(1, &mut got, 32) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert_eq!(got.len(), sent.len(), "every frame came back ({:?})", port.stats());
    let mut seen = Vec::new();
    for m in &got {
        let b = m.data();
        assert_eq!(m.segments(), 1);
        assert_eq!(&b[6..12], &port.info().mac, "source MAC");
        assert_eq!(&b[12..14], &[0x08, 0x00], "EtherType IPv4");
        assert!(folds_to_ffff(&b[14..34]), "IPv4 header checksum");
        let ulen = usize::from(u16::from_be_bytes([b[38], b[39]]));
        let mut pseudo = Vec::from(&b[26..34]);
        pseudo.extend_from_slice(&[0, 17]);
        pseudo.extend_from_slice(&(ulen as u16).to_be_bytes());
        pseudo.extend_from_slice(&b[34..34 + ulen]);
        assert!(folds_to_ffff(&pseudo), "UDP checksum");
        let Parsed::Udp(u) = frame::parse(b, true) else { panic!("not a valid UDP frame: {b:?}") };
        assert_eq!((u.src, u.dst), (src, dst));
        seen.push((u.dscp, b[u.payload].to_vec()));
    }
    // Two TX queues loop into one RX queue: order across queues is not promised.
    seen.sort();
    sent.sort();
    assert_eq!(seen, sent, "DSCP and payload of every frame");
    drop(got);
    let s = port.stats();
    assert_eq!((s.opackets, s.ipackets), (8, 8));
    drop(port);
    assert!(pool.available() >= before - 32, "mbufs returned to the pool (up to one lcore cache)");
}
