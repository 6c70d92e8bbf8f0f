//! The socket datapath's batch send (`Datapath::send_batch`, what dlcpd's
//! event loop uses) over real sockets on 127.0.0.1: datagrams lent as several
//! slices arrive whole; they reach the wire in the order given, across class
//! sockets; runs to interleaved destinations still become GSO super-packets;
//! nothing is copied unless the kernel refuses (would-block), and then what
//! was refused is kept, in order, and sent by the next flush.

mod prereq;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dlcp::datapath::fault::FaultInjector;
use dlcp::datapath::socket::{SocketConfig, SocketDatapath};
use dlcp::datapath::{Datapath, Outgoing};
use dlcp::proto::class::Class;
use prereq::{Prereq, skip};

const DEADLINE: Duration = Duration::from_secs(5);

fn config() -> SocketConfig {
    SocketConfig { max_datagram: 9000, ..SocketConfig::new("127.0.0.1:0".parse().unwrap()) }
}

fn class(c: u8) -> Class {
    Class::new(c).unwrap()
}

/// A datagram of `len` bytes: class, sequence number, then a pattern.
fn datagram(c: u8, seq: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|i| (i as u32 * 31 + seq * 7) as u8).collect();
    let head = [[c].as_slice(), &seq.to_be_bytes()].concat();
    let n = head.len().min(len);
    v[..n].copy_from_slice(&head[..n]);
    v
}

/// A datagram lent as three slices of `d`: 64 bytes, the middle, 16 bytes.
fn lent(dst: SocketAddr, c: u8, d: &[u8]) -> Outgoing<'_> {
    let (a, rest) = d.split_at(64.min(d.len()));
    let (b, t) = rest.split_at(rest.len().saturating_sub(16));
    Outgoing { dst, class: class(c), path: 0, parts: [a, b, t] }
}

/// Receives on `rx` until `want` datagrams arrived or the deadline passed.
fn drain(rx: &mut SocketDatapath, got: &mut Vec<Vec<u8>>, want: usize) {
    let end = Instant::now() + DEADLINE;
    while got.len() < want && Instant::now() < end {
        if rx.recv(&mut |_, d| got.push(d.to_vec())).unwrap() == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Data of class 3, a "PROBE" of class 7, more data, a class 6 run: the
/// receiver sees exactly this order (one receive socket, loopback keeps the
/// order of the kernel's hand-over), all sent from the caller's slices.
#[test]
fn the_order_given_is_the_order_on_the_wire_across_classes() {
    let mut a = SocketDatapath::new(config()).unwrap();
    let mut b = SocketDatapath::new(config()).unwrap();
    let dst = b.local_addr();
    let mut want: Vec<Vec<u8>> = Vec::new();
    for round in 0..20u32 {
        let mut msgs = Vec::new();
        for i in 0..10 {
            msgs.push((3, datagram(3, round * 100 + i, 1200)));
        }
        msgs.push((7, datagram(7, round * 100 + 50, 100)));
        for i in 60..65 {
            msgs.push((3, datagram(3, round * 100 + i, 1200)));
        }
        for i in 70..73 {
            msgs.push((6, datagram(6, round * 100 + i, 800)));
        }
        let batch: Vec<Outgoing<'_>> = msgs.iter().map(|(c, d)| lent(dst, *c, d)).collect();
        a.send_batch(&batch).unwrap();
        want.extend(msgs.iter().map(|(_, d)| d.clone()));
        let mut got = Vec::new();
        drain(&mut b, &mut got, msgs.len());
        assert_eq!(got.len(), msgs.len(), "round {round}");
        for (k, (g, (_, w))) in got.iter().zip(&msgs).enumerate() {
            assert!(g == w, "round {round}: datagram {k} out of order or altered");
        }
    }
    let s = a.socket_stats();
    assert_eq!((s.tx_lent, s.tx_copied), (want.len() as u64, 0), "{s:?}");
    assert!(!a.wants_writable());
}

/// Destinations interleaved chunk by chunk (as the protocol core emits a
/// first pass): each destination's datagrams arrive in order, and GSO still
/// carries runs (the descriptors are regrouped by destination, not the bytes).
#[test]
fn interleaved_destinations_become_gso_runs() {
    let cfg = SocketConfig { gso: true, gso_max_segments: 16, batch: 32, ..config() };
    let mut a = SocketDatapath::new(cfg).unwrap();
    let mut rxs: Vec<SocketDatapath> = (0..3).map(|_| SocketDatapath::new(config()).unwrap()).collect();
    let dsts: Vec<SocketAddr> = rxs.iter().map(|r| r.local_addr()).collect();
    let mut sent: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 3];
    for round in 0..4u32 {
        let mut msgs = Vec::new();
        for i in 0..30u32 {
            for k in 0..3 {
                let len = if i == 29 && round % 2 == 1 { 500 } else { 1200 };
                msgs.push((k, datagram(5, round * 1000 + i * 3 + k as u32, len)));
            }
        }
        let batch: Vec<Outgoing<'_>> = msgs.iter().map(|(k, d)| lent(dsts[*k], 5, d)).collect();
        a.send_batch(&batch).unwrap();
        for (k, d) in msgs {
            sent[k].push(d);
        }
        for (k, rx) in rxs.iter_mut().enumerate() {
            let mut got = Vec::new();
            drain(rx, &mut got, 30);
            assert!(got == sent[k][sent[k].len() - 30..], "round {round}, destination {k}");
        }
    }
    let s = a.socket_stats();
    eprintln!("interleaved destinations, lent: {s:?}, tx_syscalls {}", a.stats().tx_syscalls);
    assert_eq!((s.tx_lent, s.tx_copied), (360, 0));
    if !s.gso_available {
        return skip(Prereq::Gso, "GSO not available: only plain delivery was checked");
    }
    // Per batch and destination: 30 datagrams = one 16- and one 14-segment message.
    assert_eq!(s.gso_segments, 360);
    assert_eq!(s.gso_sends, 4 * 3 * 2, "gso_sends");
}

/// The kernel refuses class 1 (injected would-block): the refused run is
/// copied into class 1's queue, later class 1 datagrams follow it there, and
/// the class 7 datagram in the same batch is not held up. The next flush
/// sends the queue, in order, and the datapath is writable again.
#[test]
fn what_the_kernel_refuses_is_kept_in_order_and_sent_by_the_next_flush() {
    let cfg = SocketConfig { batch: 4, gso: false, ..config() };
    let mut a = FaultInjector::new(SocketDatapath::new(cfg).unwrap());
    let mut b = SocketDatapath::new(config()).unwrap();
    let dst = b.local_addr();
    assert!(a.would_block(class(1), 1));
    let low: Vec<Vec<u8>> = (0..6).map(|i| datagram(1, i, 1000)).collect();
    let urgent = datagram(7, 100, 64);
    let more: Vec<Vec<u8>> = (6..9).map(|i| datagram(1, i, 1000)).collect();
    let mut batch: Vec<Outgoing<'_>> = low.iter().map(|d| lent(dst, 1, d)).collect();
    batch.push(lent(dst, 7, &urgent));
    batch.extend(more.iter().map(|d| lent(dst, 1, d)));
    a.send_batch(&batch).unwrap();
    assert!(a.wants_writable(), "class 1 is blocked");
    let s = a.inner().socket_stats();
    assert_eq!((s.tx_lent, s.tx_copied, s.tx_queued[1]), (1, 9, 9), "{s:?}");
    let mut got = Vec::new();
    drain(&mut b, &mut got, 1);
    assert_eq!(got, vec![urgent], "the higher class was not held up");
    a.flush().unwrap();
    assert!(!a.wants_writable());
    got.clear();
    drain(&mut b, &mut got, 9);
    let want: Vec<Vec<u8>> = low.iter().chain(&more).cloned().collect();
    assert_eq!(got, want, "the refused datagrams, once each, in order");
    assert_eq!(a.stats().tx_packets[1], 9);
}
