//! Peer failure on the emulated cluster of `scripts/testbed.sh`: 4 hosts run
//! allreduce ops in a loop; host 3's daemon is killed with SIGKILL mid-run.
//! The other hosts' trainers get `Status::Timeout` for the op in flight within
//! the hard timeout (no hang); once the daemon restarts (new generation) and
//! its peers see it up again, new ops across all hosts succeed bit-exactly.
//!
//! Needs root and network namespaces; prints a loud SKIPPED message and passes
//! where they are unavailable.

mod testbed_common;

use std::time::{Duration, Instant};

use dlcp::shm::{Client, Status, SubmitOptions};
use testbed_common::*;

const PREFIX: &str = "dlcptbm";
const HOSTS: usize = 4;
const VICTIM: usize = 3;
const HARD_MS: u32 = 1500;
const N: usize = 200_003;

/// What one trainer saw: per op (seq, status, submit-to-completion time), or
/// the client error that ended its loop.
type Log = (Vec<(u64, Status, Duration)>, Option<String>);

fn trainer_loop(socket: std::path::PathBuf, h: usize, max_ops: usize) -> Log {
    let mut cl = Client::attach(&socket, u64::from(JOB), 0, 1).expect("attach");
    let mut log = Vec::new();
    for i in 0..max_ops {
        let mut step = || -> Result<(u64, Status, Duration), String> {
            let t = cl.alloc(&format!("t{i}"), N as u64).map_err(|e| format!("{e:?}"))?;
            cl.write(&t, &data(seed(h, i), N)).map_err(|e| format!("{e:?}"))?;
            let t0 = Instant::now();
            let seq = cl.submit(&t, SubmitOptions { tensor_id: 1, budget_ppm: 0, ..Default::default() });
            let seq = seq.map_err(|e| format!("{e:?}"))?;
            let done = cl.wait_completion(Duration::from_secs(10)).map_err(|e| format!("{e:?}"))?;
            let took = t0.elapsed();
            cl.free(&t.name).map_err(|e| format!("{e:?}"))?;
            Ok((seq, done.status, took))
        };
        match step() {
            Ok(r) => {
                log.push(r);
                if r.1 != Status::Ok {
                    return (log, None);
                }
            }
            Err(e) => return (log, Some(e)),
        }
    }
    (log, None)
}

#[test]
fn sigkilled_peer_daemon_fails_ops_within_the_hard_timeout_and_its_restart_rejoins() {
    let hard = Duration::from_millis(u64::from(HARD_MS));
    let Some(mut bed) = Bed::start(PREFIX, HOSTS, &[], HARD_MS) else { return };
    let gen_before = bed.status(0)["peers"][VICTIM]["generation"].as_u64();
    let trainers: Vec<_> = (0..HOSTS)
        .map(|h| {
            let s = bed.sockets[h].clone();
            std::thread::spawn(move || trainer_loop(s, h, 2000))
        })
        .collect();
    // Mid-run: a few ops done everywhere, then SIGKILL host 3's dlcpd.
    let t0 = Instant::now();
    while bed.stats(0)["service"]["ops_completed"].as_u64().unwrap() < 5 {
        assert!(t0.elapsed() < Duration::from_secs(20), "the cluster never completed 5 ops before the kill");
        std::thread::sleep(Duration::from_millis(10));
    }
    bed.kill9(VICTIM);
    let logs: Vec<Log> = trainers.into_iter().map(|t| t.join().expect("trainer thread")).collect();
    let mut last_seq = 0;
    for (h, (log, err)) in logs.iter().enumerate() {
        last_seq = last_seq.max(log.last().map_or(0, |r| r.0));
        if h == VICTIM {
            continue;
        }
        assert!(err.is_none(), "host {h}: the client failed instead of reporting the op: {err:?}");
        let (seq, st, took) = *log.last().expect("host ran no op");
        assert!(
            log[..log.len() - 1].iter().all(|r| r.1 == Status::Ok),
            "host {h}: an op before the kill failed: {log:?}"
        );
        assert!(log.len() >= 5, "host {h}: only {} ops before the failure", log.len());
        assert_eq!(st, Status::Timeout, "host {h} op {seq}: expected Timeout after the peer's SIGKILL");
        assert!(
            took < hard + Duration::from_millis(1000),
            "host {h} op {seq}: Timeout took {took:?} (hard timeout {hard:?})"
        );
        eprintln!("host {h}: {} ops ok, op {seq} -> {st:?} after {took:?}", log.len() - 1);
    }
    // The peers mark the victim down, then it restarts with a new generation.
    let t = Instant::now();
    while (0..HOSTS).filter(|&h| h != VICTIM).any(|h| bed.status(h)["peers"][VICTIM]["up"] != false) {
        assert!(t.elapsed() < Duration::from_secs(5), "host {VICTIM} never marked down: {}", bed.status(0));
        std::thread::sleep(Duration::from_millis(50));
    }
    bed.spawn(VICTIM);
    bed.wait_ready(VICTIM);
    let t = Instant::now();
    while (0..HOSTS).filter(|&h| h != VICTIM).any(|h| bed.status(h)["peers"][VICTIM]["up"] != true) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "restarted host {VICTIM} never marked up: {}",
            bed.status(0)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let gen_after = bed.status(0)["peers"][VICTIM]["generation"].as_u64();
    assert!(
        gen_after > gen_before,
        "restart did not bring a new generation: {gen_before:?} -> {gen_after:?}"
    );
    // New ops, numbered alike on all hosts, succeed everywhere and are exact.
    let next = last_seq + 10;
    let x: Vec<Vec<f32>> = (0..HOSTS).map(|h| data(seed(h, 9999), N)).collect();
    let hs: Vec<_> = (0..HOSTS)
        .map(|h| {
            let s = bed.sockets[h].clone();
            let x = x[h].clone();
            std::thread::spawn(move || {
                let mut cl = Client::attach(&s, u64::from(JOB), 0, 1).expect("attach after restart");
                cl.set_next_op_seq(next);
                let mut outs = Vec::new();
                for k in 0..3u32 {
                    let t = cl.alloc(&format!("after{k}"), N as u64).unwrap();
                    cl.write(&t, &x).unwrap();
                    cl.submit(&t, SubmitOptions { tensor_id: 2 + k, budget_ppm: 0, ..Default::default() })
                        .unwrap();
                    let d =
                        cl.wait_completion(Duration::from_secs(10)).expect("a completion after the restart");
                    assert_eq!(
                        d.status,
                        Status::Ok,
                        "host {h} op {}: failed after the restart: {d:?}",
                        next + u64::from(k)
                    );
                    outs.push(cl.read(&t).unwrap());
                    cl.free(&t.name).unwrap();
                }
                outs
            })
        })
        .collect();
    let mut want = x[0].clone();
    for xh in &x[1..] {
        want.iter_mut().zip(xh).for_each(|(a, b)| *a += *b);
    }
    for (h, t) in hs.into_iter().enumerate() {
        for (k, out) in t.join().expect("trainer after the restart").iter().enumerate() {
            assert!(
                out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "host {h} op {} after the restart: not the exact sum",
                next + k as u64
            );
        }
    }
}
