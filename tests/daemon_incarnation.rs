//! Incarnations of real daemons (wire version 4, issues 15 and 17): a
//! stopping daemon announces its shutdown and its peers mark it down at once
//! (not after the peer timeout); a daemon restarted with a lower generation
//! (a wall clock stepped back, or a smaller fixed `node.generation`) is
//! accepted by its peers and new runs include it.

mod daemon_common;

use std::time::{Duration, Instant};

use daemon_common::*;
use dlcp::shm::{Status, SubmitOptions, TrainerChannel};

const N: usize = 5_000;

/// One allreduce of `x` with a trainer on every host, attached for this op
/// alone (a run of its own); every host's result.
fn one_run(c: &Cluster, x: &[f32], hosts: u32) -> Vec<(Status, Vec<f32>)> {
    let threads: Vec<_> = (0..hosts as usize)
        .map(|h| {
            let sock = c.daemons[h].socket.clone();
            let x = x.to_vec();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&sock, u64::from(JOB), 0, 1).unwrap();
                let t = cl.alloc("g", x.len() as u64).unwrap();
                cl.write(&t, &x).unwrap();
                cl.submit(&t, SubmitOptions { tensor_id: 1, budget_ppm: 0, ..Default::default() }).unwrap();
                let done = cl.wait_completion(Duration::from_secs(30)).expect("a completion, not a hang");
                (done.status, cl.read(&t).unwrap())
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn a_stopping_daemon_says_goodbye_and_is_marked_down_at_once() {
    let mut c = Cluster::start(&Options { hosts: 2, ..Options::default() });
    let t0 = Instant::now();
    while c.status(0)["peers"][1]["up"] != true {
        assert!(t0.elapsed() < Duration::from_secs(10), "rank 1 never came up: {}", c.status(0));
        std::thread::sleep(Duration::from_millis(20));
    }
    c.kill(1, 15);
    let t = Instant::now();
    while c.status(0)["peers"][1]["up"] != false {
        assert!(t.elapsed() < Duration::from_secs(5), "never marked down: {}", c.status(0));
        std::thread::sleep(Duration::from_millis(10));
    }
    // The test daemons' peer timeout is 1 s: silence alone takes that long.
    let took = t.elapsed();
    assert!(took < Duration::from_millis(600), "marked down after {took:?}: by silence, not by its goodbye");
    assert_eq!(c.wait_exit(1, Duration::from_secs(5)).expect("exits").code(), Some(0));
    let log = c.log(0);
    assert!(log.contains("peer 1 announced its shutdown"), "{log}");
    assert_eq!(c.stats(0).unwrap()["protocol"]["rejected"]["unverified_session"], 0);
}

#[test]
fn a_daemon_restarted_with_a_lower_generation_is_accepted() {
    let mut c = Cluster::start(&Options { hosts: 2, ..Options::default() });
    let x: Vec<f32> = (0..N).map(|i| (i % 97) as f32 * 0.25).collect();
    for (st, out) in one_run(&c, &x, 2) {
        assert_eq!(st, Status::Ok);
        assert!(out.iter().zip(&x).all(|(a, b)| a.to_bits() == (b + b).to_bits()));
    }
    let before = c.status(0)["peers"][1]["generation"].as_u64().expect("rank 1's generation");
    assert!(before > 1000, "auto generations come from the clock: {before}");
    // Rank 1 comes back with generation 7: far below the one its peers know.
    c.kill(1, 9);
    c.wait_exit(1, Duration::from_secs(5)).expect("killed");
    let cfg = std::fs::read_to_string(&c.daemons[1].config).unwrap();
    write_config(&c.daemons[1].config, &cfg.replace("generation = \"auto\"", "generation = 7"));
    c.spawn(1, 0.0);
    c.wait_ready(1);
    let t = Instant::now();
    while c.status(0)["peers"][1]["generation"] != 7 || c.status(0)["peers"][1]["up"] != true {
        assert!(t.elapsed() < Duration::from_secs(10), "the restart was not accepted: {}", c.status(0));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(c.log(0).contains(&format!("peer 1 restarted (generation {before} -> 7)")), "{}", c.log(0));
    for (st, out) in one_run(&c, &x, 2) {
        assert_eq!(st, Status::Ok);
        assert!(out.iter().zip(&x).all(|(a, b)| a.to_bits() == (b + b).to_bits()));
    }
}
