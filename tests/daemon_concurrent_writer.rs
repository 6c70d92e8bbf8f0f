//! A trainer that keeps rewriting its tensor while its op runs (a bug in a
//! training script, or a hostile local user): real `dlcpd` processes on
//! loopback, two trainers per host, the writer on host 0. The daemon reads a
//! contribution once, into its own memory, and sends and repairs only from
//! there, so every op still ends — within the hard timeout, never in an
//! endless repair loop — and every other trainer, on every host including the
//! writer's, holds the same result bytes.

mod daemon_common;
mod prereq;

use std::time::{Duration, Instant};

use daemon_common::*;
use dlcp::shm::{Status, SubmitOptions, TrainerChannel};

const HOSTS: u32 = 4;
const TRAINERS: u32 = 2;
const OPS: usize = 6;
const LEN: usize = 1 << 20;
const HARD_TIMEOUT_MS: u32 = 3000;

/// One trainer: `OPS` ops of `LEN` elements at `budget_ppm`; the writer
/// rewrites its tensor with fresh values until the op's completion arrives.
/// Returns each op's result (the writer's: none, its arena is its own) and how
/// long it took.
fn trainer(socket: std::path::PathBuf, h: u32, k: u32, budget_ppm: u32) -> Vec<(Option<Vec<f32>>, Duration)> {
    let writer = h == 0 && k == 0;
    let mut cl = TrainerChannel::attach(&socket, u64::from(JOB), k, TRAINERS).expect("attach");
    let mut out = Vec::new();
    for i in 0..OPS {
        let t = cl.alloc(&format!("t{i}"), LEN as u64).expect("alloc");
        let seed = (u64::from(h) << 32) | (u64::from(k) << 16) | i as u64;
        cl.write(&t, &data(seed, LEN)).expect("write");
        let opts =
            SubmitOptions { tensor_id: i as u32, layer: 0, layers: 1, budget_ppm, ..Default::default() };
        cl.submit(&t, opts).expect("submit");
        let start = Instant::now();
        let done = if writer {
            let mut round = 0u64;
            loop {
                if let Some(done) = cl.try_completion().expect("completion") {
                    break done;
                }
                round += 1;
                cl.write(&t, &data(seed ^ (round << 40), LEN)).expect("rewrite");
                assert!(start.elapsed() < Duration::from_secs(30), "op {i}: no completion");
            }
        } else {
            cl.wait_completion(Duration::from_secs(30)).expect("completion")
        };
        let took = start.elapsed();
        assert_eq!(done.status, Status::Ok, "host {h} trainer {k} op {i}: {done:?}");
        out.push(((!writer).then(|| cl.read(&t).expect("read")), took));
        cl.free(&t.name).expect("free");
    }
    out
}

fn run(budget_ppm: u32) {
    let o = Options { hosts: HOSTS, hard_timeout_ms: HARD_TIMEOUT_MS, ..Options::default() };
    let c = Cluster::start(&o);
    let mut handles = Vec::new();
    for h in 0..HOSTS {
        for k in 0..TRAINERS {
            let socket = c.daemons[h as usize].socket.clone();
            handles.push(std::thread::spawn(move || trainer(socket, h, k, budget_ppm)));
        }
    }
    let results: Vec<Vec<(Option<Vec<f32>>, Duration)>> =
        handles.into_iter().map(|t| t.join().expect("trainer thread")).collect();
    for i in 0..OPS {
        let slowest = results.iter().map(|r| r[i].1).max().unwrap();
        assert!(
            slowest < Duration::from_millis(u64::from(HARD_TIMEOUT_MS)),
            "op {i} took {slowest:?}, past the hard timeout"
        );
        let bits: Vec<Vec<u32>> = results
            .iter()
            .filter_map(|r| r[i].0.as_ref())
            .map(|v| v.iter().map(|x| x.to_bits()).collect())
            .collect();
        assert_eq!(bits.len(), (HOSTS * TRAINERS - 1) as usize);
        assert!(bits.windows(2).all(|w| w[0] == w[1]), "op {i}: replicas differ");
    }
    for h in 0..HOSTS {
        let s = c.stats(h).unwrap();
        assert_eq!(s["service"]["ops_completed"], OPS as u64, "host {h}: {s}");
        assert_eq!(s["protocol"]["hard_timeouts"], 0, "host {h}: {s}");
    }
}

#[test]
fn a_trainer_rewriting_its_tensor_mid_op_leaves_every_replica_identical_reliable() {
    run(0);
}

#[test]
fn a_trainer_rewriting_its_tensor_mid_op_leaves_every_replica_identical_with_budget() {
    run(10_000);
}
