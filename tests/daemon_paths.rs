//! Per-packet load balancing through real daemons on loopback (issue 19):
//! with `network.paths = 4` every daemon sends each peer's datagrams from
//! four source ports, the receivers see all four (counted per source port)
//! and the results stay bit-exact; a datagram from an address that is no
//! peer's, or from a port outside a peer's range, is rejected and counted,
//! and one from inside the range still needs a valid tag.

mod daemon_common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use daemon_common::*;
use dlcp::shm::{Status, SubmitOptions, TrainerChannel};

const HOSTS: u32 = 3;
const PATHS: u16 = 4;
const OPS: usize = 12;
const LEN: usize = 300_000;

/// `OPS` allreduces of `LEN` floats, one trainer per host: each host's result.
fn run_ops(c: &Cluster) -> Vec<Vec<Vec<f32>>> {
    let handles: Vec<_> = (0..HOSTS)
        .map(|h| {
            let socket = c.daemons[h as usize].socket.clone();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&socket, u64::from(JOB), 0, 1).expect("attach");
                let mut out = Vec::new();
                for i in 0..OPS {
                    let t = cl.alloc(&format!("t{i}"), LEN as u64).expect("alloc");
                    cl.write(&t, &data(seed(h, i), LEN)).expect("write");
                    let o = SubmitOptions { tensor_id: i as u32, budget_ppm: 0, ..Default::default() };
                    cl.submit(&t, o).expect("submit");
                    let done = cl.wait_completion(Duration::from_secs(30)).expect("completion");
                    assert_eq!(done.status, Status::Ok, "host {h} op {i}: {done:?}");
                    out.push(cl.read(&t).expect("read"));
                    cl.free(&t.name).expect("free");
                }
                out
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("trainer thread")).collect()
}

fn seed(host: u32, op: usize) -> u64 {
    (u64::from(host) << 32) | op as u64
}

fn list(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0)).collect()).unwrap_or_default()
}

#[test]
fn four_paths_four_source_ports_and_exact_results() {
    let c = Cluster::start(&Options { hosts: HOSTS, paths: Some(PATHS), ..Options::default() });
    let results = run_ops(&c);
    for i in 0..OPS {
        let mut want = data(seed(0, i), LEN);
        for h in 1..HOSTS {
            want.iter_mut().zip(data(seed(h, i), LEN)).for_each(|(a, b)| *a += b);
        }
        let want: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
        for (h, r) in results.iter().enumerate() {
            let got: Vec<u32> = r[i].iter().map(|x| x.to_bits()).collect();
            assert!(got == want, "host {h} op {i}: not bit-exact");
        }
    }
    for h in 0..HOSTS {
        let s = c.stats(h).unwrap();
        // What the receiver saw: datagrams from its peers' four source ports each.
        let rx = list(&s["service"]["rx_packets_per_path"]);
        let tx = list(&s["protocol"]["tx_packets_per_path"]);
        eprintln!("host {h}: received per source port {rx:?}, sent per path {tx:?}");
        assert_eq!(rx.len(), usize::from(PATHS), "host {h}: {s}");
        assert_eq!(tx.len(), usize::from(PATHS), "host {h}: {s}");
        // Paths are drawn per flowlet of 16 datagrams (`paths::FLOWLET`): a
        // host receives about 880 flowlets here, each path's count
        // Binomial(880, 1/4) (220 ± 12.8). A 16th (55 flowlets) is 13
        // standard deviations below it. (With flowlets of 128, until session
        // 40: 110 flowlets, 4.6 deviations; with 6 ops and a tenth as the
        // bar, one run in about 16 had failed by chance.)
        let total: u64 = rx.iter().sum();
        for (p, &n) in rx.iter().enumerate() {
            assert!(n * 16 > total, "host {h}: path {p} carried {n} of {total} received datagrams: {rx:?}");
        }
        assert!(tx.iter().all(|&n| n > 0), "host {h} sent on every path: {tx:?}");
        let weights = list(&s["protocol"]["weight_per_path"]);
        assert_eq!(weights.len(), usize::from(PATHS));
        assert_eq!(s["protocol"]["rejected"]["unknown_source"], 0u64, "host {h}: {s}");
        // Path health per peer: every other rank, every path, and the
        // receivers' verdicts on what was sent.
        let peers =
            s["paths_per_peer"].as_array().unwrap_or_else(|| panic!("host {h}: no paths_per_peer: {s}"));
        assert_eq!(peers.len(), HOSTS as usize - 1, "host {h}: {s}");
        for p in peers {
            let paths = p["paths"].as_array().unwrap();
            assert_eq!(paths.len(), usize::from(PATHS), "host {h}: {p}");
            let verdicts: u64 = paths.iter().map(|x| x["verdicts"].as_u64().unwrap()).sum();
            assert!(verdicts > 0, "host {h}: no verdicts from rank {}: {p}", p["rank"]);
            assert!(paths.iter().all(|x| x["losses"].as_u64() <= x["verdicts"].as_u64()), "{p}");
        }
    }
    // The same counters as metrics, labelled by path.
    let m = c.status(0);
    let addr = m["ops"]["metrics"]["address"].as_str().unwrap_or_else(|| panic!("no metrics address: {m}"));
    let body = http_get(addr, "/metrics");
    for series in ["dlcp_path_tx_packets_total{path=\"3\"}", "dlcp_path_rx_packets_total{path=\"3\"}"] {
        assert!(body.contains(series), "{series} missing:\n{body}");
    }
    assert!(body.contains("dlcp_path_weight{path=\"0\"}"), "{body}");
}

/// A plain HTTP/1.0 GET of `path` at `addr`: the body.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or(out)
}

#[test]
fn datagrams_from_outside_a_peers_address_and_ports_are_rejected_and_counted() {
    use dlcp_proto::class::Class;
    use dlcp_proto::wire::{self, Header, JobKey, PacketType, Phase};
    // Rank 1 starts late: until then the test may use its address and ports.
    let c = Cluster::start(&Options { hosts: 2, late: vec![1], paths: Some(PATHS), ..Options::default() });
    let forged = JobKey::new(b"not this job's secret");
    let mut h = Header::new(PacketType::Data, Class::new(3).unwrap(), Phase::Scatter);
    (h.job, h.run, h.src, h.dst, h.op, h.tensor, h.chunk_count) = (JOB, 1, 1, 0, 1, 1, 4);
    let mut buf = vec![0u8; 2048];
    let n = wire::encode(&forged, &h, &[0x5a; 300], &mut buf).unwrap();
    let datagram = &buf[..n];
    let dst = ("127.0.0.1", c.ports[0]);
    let p1 = c.ports[1];
    // From rank 1's address, the last port of its range (path 3) and the
    // first past it; and from another loopback address on rank 1's port.
    let in_range = UdpSocket::bind(("127.0.0.1", p1 + PATHS - 1)).unwrap();
    let past = UdpSocket::bind(("127.0.0.1", p1 + PATHS)).unwrap();
    let elsewhere = UdpSocket::bind(("127.0.0.2", p1)).ok();
    for _ in 0..3 {
        in_range.send_to(datagram, dst).unwrap();
        past.send_to(datagram, dst).unwrap();
        if let Some(s) = &elsewhere {
            s.send_to(datagram, dst).unwrap();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let outside = if elsewhere.is_some() { 6 } else { 3 };
    let t0 = Instant::now();
    let s = loop {
        let s = c.stats(0).unwrap();
        let r = &s["protocol"]["rejected"];
        let seen = r["unknown_source"].as_u64().unwrap_or(0) + r["bad_tag"].as_u64().unwrap_or(0);
        if seen >= 3 + outside || t0.elapsed() > Duration::from_secs(5) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let p = &s["protocol"];
    // Outside the range or the address: from no peer, so a datagram claiming
    // rank 1 is rejected before its tag is checked, and counted as unknown.
    assert_eq!(p["rejected"]["unknown_source"], outside, "{s}");
    assert_eq!(p["rx_dropped_unknown_peer"]["packets"], outside, "{s}");
    // Inside the range: taken as rank 1's, and then the tag decides.
    assert_eq!(p["rejected"]["bad_tag"], 3u64, "{s}");
    assert_eq!(list(&p["rx_dropped_packets_per_peer"]).get(1).copied(), Some(3), "{s}");
    assert_eq!(list(&s["service"]["rx_packets_per_path"]).get(3).copied(), Some(3), "{s}");
}
