//! Peer failure on the emulated cluster of `scripts/testbed.sh`: 4 hosts run
//! allreduce ops in a loop; host 3's daemon is killed with SIGKILL mid-run.
//! The other hosts' trainers get `Status::Timeout` for the op in flight within
//! the hard timeout (no hang); once the daemon restarts (new generation) and
//! its peers see it up again, new ops across all hosts succeed bit-exactly.
//!
//! Needs root and network namespaces; where they are unavailable it fails under `DLCP_REQUIRE_NETNS=1` / `DLCP_CI=1`
//! and is reported as skipped otherwise (see `tests/prereq`).

mod prereq;
mod testbed_common;

use std::time::{Duration, Instant};

use dlcp::shm::{Status, SubmitOptions, TrainerChannel};
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
    let mut cl = TrainerChannel::attach(&socket, u64::from(JOB), 0, 1).expect("attach");
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
    restart_and_rejoin(&mut bed, HOSTS, VICTIM, gen_before, last_seq, N);
}
