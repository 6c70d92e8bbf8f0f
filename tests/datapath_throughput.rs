//! Loopback throughput of the socket datapath on one thread (sender and
//! receiver alternate, so one core does both sides): plain, GSO, GSO + GRO.
//! Ignored by default; run with
//! `cargo test --release --test datapath_throughput -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use dlcp::datapath::socket::{SocketConfig, SocketDatapath};
use dlcp::datapath::{Datapath, SendOutcome};
use dlcp::proto::class::Class;

fn run(gso: bool, gro: bool, size: usize, classes: usize) -> (f64, u64, u64) {
    let bind = "127.0.0.1:0".parse().unwrap();
    let cfg = SocketConfig { gso, gro, max_datagram: 9000, ..SocketConfig::new(bind) };
    let mut a = SocketDatapath::new(cfg.clone()).unwrap();
    let mut b = SocketDatapath::new(cfg).unwrap();
    let dst = b.local_addr();
    let payload = vec![0xa5u8; size];
    let chunk = 512;
    let mut sent = 0u64;
    let mut received = 0u64;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        for i in 0..chunk {
            let class = Class::new((i % classes) as u8).unwrap();
            assert_eq!(a.send(dst, class, &payload).unwrap(), SendOutcome::Sent);
        }
        sent += chunk as u64;
        a.flush().unwrap();
        while b.recv(&mut |_, d| assert_eq!(d.len(), size)).map(|n| n > 0).unwrap() {}
        received = b.stats().rx_packets;
    }
    let secs = start.elapsed().as_secs_f64();
    let st = a.stats();
    eprintln!(
        "gso {gso:5} gro {gro:5} size {size:5} classes {classes}: sent {sent}, received {received} ({:.1}%), \
         {:.0} datagrams/s received, {:.2} Gbit/s, tx_syscalls {}, rx_syscalls {}",
        100.0 * received as f64 / sent as f64,
        received as f64 / secs,
        received as f64 * size as f64 * 8.0 / secs / 1e9,
        st.tx_syscalls,
        b.stats().rx_syscalls
    );
    (received as f64 / secs, st.tx_syscalls, sent)
}

#[test]
#[ignore = "measurement; run with --ignored --nocapture"]
fn loopback_throughput() {
    for size in [1200, 8972] {
        for classes in [1, 8] {
            run(false, false, size, classes);
            run(true, false, size, classes);
            run(true, true, size, classes);
        }
    }
}
