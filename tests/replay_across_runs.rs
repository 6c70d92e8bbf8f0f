//! A captured run replayed into the next run of the same job, on the same
//! daemon processes, with a fixed `node.generation` (issue 15, hole 3).
//!
//! Two daemons on loopback talk through a relay the test owns: each daemon's
//! configured address for its peer is a relay socket, and the relay forwards
//! from the socket that is the *other* daemon's configured address, so every
//! datagram arrives from where the receiver expects it. The relay records run
//! 1 (three exact allreduces), then, once run 2 is agreed, replays every
//! recorded datagram into it from the same addresses — what an on-path
//! attacker without the key can do. Every replayed datagram must be rejected
//! and counted (another run's, a lingering op's, or control no newer than
//! the last taken), and run 2's ops — the same op ids as run 1's — must give
//! the exact sums of run 2's inputs.

mod daemon_common;

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use daemon_common::*;
use dlcp::shm::{Status, SubmitOptions, TrainerChannel};

const OPS: usize = 3;
const N: usize = 20_000;

/// Datagrams the relay saw: (sent towards daemon 0?, bytes).
type Recorded = Arc<Mutex<Vec<(bool, Vec<u8>)>>>;

struct Relay {
    /// Daemon 1's configured address for rank 0 (and what daemon 1 hears from).
    a: Arc<UdpSocket>,
    /// Daemon 0's configured address for rank 1.
    b: Arc<UdpSocket>,
    to0: SocketAddr,
    to1: SocketAddr,
    recorded: Recorded,
    recording: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    fn start(a: UdpSocket, b: UdpSocket, to0: SocketAddr, to1: SocketAddr) -> Relay {
        let r = Relay {
            a: Arc::new(a),
            b: Arc::new(b),
            to0,
            to1,
            recorded: Arc::default(),
            recording: Arc::new(AtomicBool::new(true)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        // From daemon 1 (arriving on a) to daemon 0, sent from b; and back.
        for (from, via, to, towards0) in [(&r.a, &r.b, to0, true), (&r.b, &r.a, to1, false)] {
            let (from, via) = (Arc::clone(from), Arc::clone(via));
            let (rec, recording, stop) =
                (Arc::clone(&r.recorded), Arc::clone(&r.recording), Arc::clone(&r.stop));
            from.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                while !stop.load(Ordering::Relaxed) {
                    let Ok(n) = from.recv(&mut buf) else { continue };
                    if recording.load(Ordering::Relaxed) {
                        rec.lock().unwrap().push((towards0, buf[..n].to_vec()));
                    }
                    let _ = via.send_to(&buf[..n], to);
                }
            });
        }
        r
    }

    /// Send every recorded datagram again, each from the address its
    /// receiver knows its peer by; how many.
    fn replay(&self) -> usize {
        let rec = self.recorded.lock().unwrap().clone();
        for (towards0, d) in &rec {
            let (via, to) = if *towards0 { (&self.b, self.to0) } else { (&self.a, self.to1) };
            via.send_to(d, to).unwrap();
            std::thread::sleep(Duration::from_micros(20));
        }
        rec.len()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Every datagram the daemon discarded on arrival, by any reason.
fn rejected(c: &Cluster, r: u32) -> u64 {
    let s = c.stats(r).unwrap();
    let rej = s["protocol"]["rejected"].as_object().unwrap().clone();
    rej.iter()
        .filter(|(k, _)| !k.starts_with("early_buffered") && *k != "early_expired")
        .map(|(_, v)| v.as_u64().unwrap())
        .sum()
}

/// One run: a trainer on each host, `OPS` allreduces of `inputs[host]` (op
/// seq 1.., tensor 0); each host's results. `before_submit` runs once both
/// trainers are attached and the run is agreed.
fn run(c: &Cluster, inputs: &[Vec<f32>; 2], before_submit: impl FnOnce()) -> Vec<Vec<Vec<f32>>> {
    let mut cls: Vec<TrainerChannel> =
        (0..2).map(|h| TrainerChannel::attach(&c.daemons[h].socket, u64::from(JOB), 0, 1).unwrap()).collect();
    let t = Instant::now();
    while (0..2).any(|r| c.status(r)["run"]["id"].as_str().is_none()) {
        assert!(t.elapsed() < Duration::from_secs(10), "run never agreed: {}", c.status(0));
        std::thread::sleep(Duration::from_millis(10));
    }
    before_submit();
    let tensors: Vec<Vec<_>> = cls
        .iter_mut()
        .enumerate()
        .map(|(h, cl)| {
            (0..OPS)
                .map(|i| {
                    let t = cl.alloc(&format!("g{i}"), N as u64).unwrap();
                    let x: Vec<f32> = inputs[h].iter().map(|v| v * (i as f32 + 1.0)).collect();
                    cl.write(&t, &x).unwrap();
                    cl.submit(&t, SubmitOptions { tensor_id: 0, budget_ppm: 0, ..Default::default() })
                        .unwrap();
                    t
                })
                .collect()
        })
        .collect();
    cls.iter_mut()
        .zip(&tensors)
        .map(|(cl, ts)| {
            for _ in 0..OPS {
                let d = cl.wait_completion(Duration::from_secs(30)).expect("a completion, not a hang");
                assert_eq!(d.status, Status::Ok, "op {}", d.op_seq);
            }
            ts.iter().map(|t| cl.read(t).unwrap()).collect()
        })
        .collect()
}

#[test]
fn a_captured_run_replayed_into_the_next_is_rejected_and_counted() {
    let mut c = Cluster::start(&Options { hosts: 2, late: vec![0, 1], ..Options::default() });
    // The relay's ports stand in for the peers' in the configurations: apart
    // from the daemons' blocks of ports (one per path), and from each other.
    let a = socket_apart(&c.ports);
    let b = socket_apart(&[c.ports[0], c.ports[1], a.local_addr().unwrap().port()]);
    let (pa, pb) = (a.local_addr().unwrap().port(), b.local_addr().unwrap().port());
    // Daemon 0 knows rank 1 at b; daemon 1 knows rank 0 at a. A fixed generation on both.
    let ports = [[c.ports[0], pb], [pa, c.ports[1]]];
    for (r, d) in c.daemons.iter().enumerate() {
        let o = Options { hosts: 2, ..Options::default() };
        let text = config_text(r as u32, &ports[r], &d.socket, &o)
            .replace("generation = \"auto\"", "generation = 5");
        write_config(&d.config, &text);
    }
    let to0: SocketAddr = format!("127.0.0.1:{}", c.ports[0]).parse().unwrap();
    let to1: SocketAddr = format!("127.0.0.1:{}", c.ports[1]).parse().unwrap();
    let relay = Relay::start(a, b, to0, to1);
    for r in 0..2 {
        c.spawn(r, 0.0);
    }
    for r in 0..2 {
        c.wait_ready(r);
    }
    let x0: Vec<f32> = (0..N).map(|i| (i % 17) as f32 * 0.5).collect();
    let x1: Vec<f32> = (0..N).map(|i| (i % 5) as f32 - 2.0).collect();
    let first = run(&c, &[x0.clone(), x1.clone()], || {});
    for (i, out) in first[0].iter().enumerate() {
        let k = i as f32 + 1.0;
        assert!(
            out.iter().zip(x0.iter().zip(&x1)).all(|(o, (a, b))| o.to_bits() == (a * k + b * k).to_bits())
        );
    }
    relay.recording.store(false, Ordering::Relaxed);
    // Run 2: the same op ids, other inputs; run 1 replayed into it first.
    let (y0, y1): (Vec<f32>, Vec<f32>) =
        (x1.iter().map(|v| v * 3.0).collect(), x0.iter().map(|v| v - 1.0).collect());
    let mut replayed = 0;
    let mut before = 0;
    let second = run(&c, &[y0.clone(), y1.clone()], || {
        before = rejected(&c, 0) + rejected(&c, 1);
        replayed = relay.replay();
        // Let the last of them arrive.
        std::thread::sleep(Duration::from_millis(200));
    });
    let after = rejected(&c, 0) + rejected(&c, 1);
    assert!(replayed > 3 * OPS, "captured {replayed} datagrams");
    // Every replayed datagram is rejected and counted (the daemons' own late
    // traffic of run 1, lingering, may add a few rejections of its own).
    assert!(
        after - before >= replayed as u64,
        "{} rejections for {replayed} replayed datagrams",
        after - before
    );
    for (h, outs) in second.iter().enumerate() {
        for (i, out) in outs.iter().enumerate() {
            let k = i as f32 + 1.0;
            assert!(
                out.iter()
                    .zip(y0.iter().zip(&y1))
                    .all(|(o, (a, b))| o.to_bits() == (a * k + b * k).to_bits()),
                "host {h} op {i}: run 2's result is not the sum of run 2's inputs"
            );
        }
    }
    let s = c.stats(0).unwrap();
    let r = &s["protocol"]["rejected"];
    eprintln!(
        "{replayed} replayed: other_run {} stale_control {} late {} stale_op {}",
        r["other_run"], r["stale_control"], r["late"], r["stale_op"]
    );
}
