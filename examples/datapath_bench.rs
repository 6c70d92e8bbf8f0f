//! Packet rate of a dlcp datapath: one process sends class-6 datagrams through
//! the socket or the DPDK datapath for a while, another receives them on a
//! socket datapath and counts. `scripts/bench_datapath.sh` runs both datapaths
//! on the same veth pair (two network namespaces) in one run and prints a table.
//!
//! ```text
//! datapath_bench recv BIND_ADDR SECS
//! datapath_bench send|lend socket FROM TO SECS SIZE
//! datapath_bench send|lend dpdk   FROM TO SECS SIZE EAL_ARG...
//! ```
//! `send` hands each datagram over as one buffer that the datapath copies
//! (`Datapath::send`); `lend` as dlcpd does, 256 at a time, each lent as a
//! 64-byte header, a payload slice of one large tensor and a 16-byte tag
//! (`Datapath::send_batch`: no user-space copy on the socket datapath, one
//! copy into the mbuf on DPDK). The DPDK sender knows its destination's MAC
//! statically, so a `net_null` port (which answers no ARP) works too. Each
//! prints one line of JSON.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dlcp::datapath::socket::{SocketConfig, SocketDatapath};
use dlcp::datapath::{Datapath, Outgoing, SendOutcome};
use dlcp::proto::class::Class;

fn usage() -> ! {
    eprintln!("usage: datapath_bench recv BIND SECS | send|lend socket|dpdk FROM TO SECS SIZE [EAL_ARG...]");
    std::process::exit(2)
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    match a.first().map(String::as_str) {
        Some("recv") if a.len() == 3 => recv(a[1].parse().unwrap_or_else(|_| usage()), secs(&a[2])),
        Some(how @ ("send" | "lend")) if a.len() >= 6 => {
            let from: SocketAddr = a[2].parse().unwrap_or_else(|_| usage());
            let to: SocketAddr = a[3].parse().unwrap_or_else(|_| usage());
            let size: usize = a[5].parse().unwrap_or_else(|_| usage());
            let dp = open(&a[1], from, to, &a[6..]);
            send(dp, to, secs(&a[4]), size, how == "lend")
        }
        _ => usage(),
    }
}

fn secs(s: &str) -> Duration {
    Duration::from_secs_f64(s.parse().unwrap_or_else(|_| usage()))
}

fn open(kind: &str, from: SocketAddr, to: SocketAddr, eal: &[String]) -> Box<dyn Datapath> {
    match kind {
        "socket" => {
            let cfg = SocketConfig { max_datagram: 9000, ..SocketConfig::new(from) };
            Box::new(SocketDatapath::new(cfg).expect("socket datapath"))
        }
        "dpdk" => open_dpdk(from, to, eal),
        _ => usage(),
    }
}

#[cfg(dpdk)]
fn open_dpdk(from: SocketAddr, to: SocketAddr, eal: &[String]) -> Box<dyn Datapath> {
    use dlcp::datapath::dpdk::{DpdkConfig, DpdkDatapath};
    use dlcp::datapath::frame::Mac;
    let (SocketAddr::V4(local), SocketAddr::V4(peer)) = (from, to) else {
        panic!("DPDK datapath: IPv4 only")
    };
    let cfg = DpdkConfig {
        eal_args: eal.to_vec(),
        port_id: 0,
        rx_queues: 1,
        tx_queues: 1,
        rx_burst: 32,
        tx_burst: 32,
        rx_ring_size: 1024,
        tx_ring_size: 1024,
        mbuf_pool_size: 8191,
        class_tx_queue: [0; 8],
        dscp: dlcp::config::schema::DEFAULT_DSCP,
        local,
        neighbours: vec![(*peer.ip(), Mac([0x02, 0, 0, 0, 0, 0x01]))],
        mtu: 9000,
        paths: 1,
    };
    Box::new(DpdkDatapath::new(cfg).expect("DPDK datapath"))
}

#[cfg(not(dpdk))]
fn open_dpdk(_from: SocketAddr, _to: SocketAddr, _eal: &[String]) -> Box<dyn Datapath> {
    eprintln!("this build has no DPDK datapath ({})", dlcp_ffi::DPDK_PROBE);
    std::process::exit(1)
}

fn send(mut dp: Box<dyn Datapath>, to: SocketAddr, dur: Duration, size: usize, lend: bool) {
    let class = Class::new(6).expect("class");
    let payload = vec![0x5a_u8; size];
    // Resolve the neighbour (DPDK: ARP) before the clock starts.
    let t0 = Instant::now();
    let _ = dp.send(to, class, &payload);
    while t0.elapsed() < Duration::from_secs(3) {
        let _ = dp.flush();
        let _ = dp.recv(&mut |_, _| {});
        let d = dp.detail_json();
        // Only DPDK has a neighbour table (the socket datapath's detail has
        // none: the kernel resolves); waiting for one there would hold the
        // start 3 s, past a receiver that counts from the first datagram.
        if d.is_none_or(|d| d.get("neighbours").is_none_or(|n| n.as_u64().unwrap_or(0) > 0)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Lent datagrams: header and tag per datagram, payloads consecutive
    // slices of one large buffer (an op's tensor), as dlcpd lends them.
    const LENT: usize = 256;
    let body = size.saturating_sub(80);
    let tensor = vec![0x3c_u8; body * LENT];
    let heads = vec![0xa5_u8; 64 * LENT];
    let tags = vec![0x0f_u8; 16 * LENT];
    let batch: Vec<Outgoing<'_>> = (0..LENT)
        .map(|i| Outgoing {
            dst: to,
            class,
            path: 0,
            parts: [
                &heads[64 * i..64 * (i + 1)],
                &tensor[body * i..body * (i + 1)],
                &tags[16 * i..16 * (i + 1)],
            ],
        })
        .collect();
    let before = dp.stats().tx_packets[6];
    let start = Instant::now();
    let mut blocked = 0u64;
    let mut i = 0u64;
    while start.elapsed() < dur {
        if lend {
            dp.send_batch(&batch).expect("send_batch");
            if dp.wants_writable() {
                blocked += 1;
                while dp.wants_writable() && start.elapsed() < dur {
                    let _ = dp.recv(&mut |_, _| {}); // a looped-back port (net_ring) drains here
                    let _ = dp.flush();
                }
            }
        } else {
            for _ in 0..LENT {
                match dp.send(to, class, &payload).expect("send") {
                    SendOutcome::Sent => {}
                    SendOutcome::WouldBlock => {
                        blocked += 1;
                        let _ = dp.recv(&mut |_, _| {});
                        let _ = dp.flush();
                    }
                }
            }
        }
        i += 1;
        if i % 16 == 0 || lend {
            let _ = dp.recv(&mut |_, _| {}); // ARP and the like; a looped-back port's frames
        }
    }
    let _ = dp.flush();
    let secs = start.elapsed().as_secs_f64();
    let sent = dp.stats().tx_packets[6] - before;
    println!(
        "{}",
        serde_json::json!({
            "datapath": dp.describe(), "mode": if lend { "lend" } else { "send" }, "sent": sent, "secs": secs,
            "pps": sent as f64 / secs, "would_block": blocked, "size": size, "detail": dp.detail_json(),
        })
    );
}

fn recv(bind: SocketAddr, dur: Duration) {
    // Room for jumbo datagrams, as the sender's (a smaller slot truncates them).
    let mut cfg = SocketConfig { max_datagram: 9000, ..SocketConfig::new(bind) };
    cfg.recv_buffer_bytes = 16 << 20;
    let mut dp = SocketDatapath::new(cfg).expect("socket datapath");
    let mut n = 0u64;
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let start = Instant::now();
    loop {
        let got = dp.recv(&mut |_, _| n += 1).unwrap_or(0);
        let now = Instant::now();
        if got > 0 {
            first.get_or_insert(now);
            last = now;
        } else {
            let idle = now.duration_since(last);
            let done =
                first.is_some_and(|f| now.duration_since(f) > dur) && idle > Duration::from_millis(300);
            if done || (first.is_none() && start.elapsed() > dur * 4 + Duration::from_secs(10)) {
                break;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    println!(
        "{}",
        serde_json::json!({"received": n, "secs": secs, "pps": if secs > 0.0 { n as f64 / secs } else { 0.0 }})
    );
}
