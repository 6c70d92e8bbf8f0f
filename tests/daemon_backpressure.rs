//! The daemon-wide cap on local ops (`shm.max_ops_in_flight`, issue 15 hole
//! 2): a trainer that submits more ops than the cap finds the rest left on
//! its submission ring (counted as `ops_throttled`), not taken into the
//! daemon's memory; nothing is dropped, and once its peer's trainer joins,
//! every op completes exactly.

mod daemon_common;

use std::time::{Duration, Instant};

use daemon_common::*;
use dlcp::shm::{Status, SubmitOptions, TrainerChannel};

const CAP: usize = 4;
const OPS: usize = 12;
const N: usize = 2_000;

fn submit_all(cl: &mut TrainerChannel, x: &[f32]) -> Vec<dlcp::shm::Tensor> {
    (0..OPS)
        .map(|i| {
            let t = cl.alloc(&format!("g{i}"), N as u64).unwrap();
            cl.write(&t, x).unwrap();
            let o = SubmitOptions { tensor_id: i as u32, budget_ppm: 0, ..Default::default() };
            cl.submit(&t, o).unwrap();
            t
        })
        .collect()
}

#[test]
fn ops_beyond_the_daemon_cap_wait_on_the_ring_and_all_complete() {
    let mut c = Cluster::start(&Options {
        hosts: 2,
        late: vec![0, 1],
        hard_timeout_ms: 20_000,
        ..Options::default()
    });
    for d in &c.daemons {
        let cfg = std::fs::read_to_string(&d.config).unwrap();
        write_config(&d.config, &cfg.replace("[shm]\n", &format!("[shm]\nmax_ops_in_flight = {CAP}\n")));
    }
    for r in 0..2 {
        c.spawn(r, 0.0);
    }
    for r in 0..2 {
        c.wait_ready(r);
    }
    let x: Vec<f32> = (0..N).map(|i| (i % 13) as f32 - 6.0).collect();
    // Host 0's trainer submits 12 ops; host 1 has no trainer yet, so none can finish.
    let mut cl0 = TrainerChannel::attach(&c.daemons[0].socket, u64::from(JOB), 0, 1).unwrap();
    let t0 = submit_all(&mut cl0, &x);
    let t = Instant::now();
    let s = loop {
        let s = c.stats(0).unwrap();
        if s["service"]["ops_throttled"].as_u64().unwrap_or(0) > 0 && s["local_ops"] == CAP as u64 {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "never throttled at the cap: {s}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(s["local_ops"], CAP as u64, "{s}");
    // The rest are still on the ring, not lost: host 1's trainer joins and
    // every op completes, exactly, in order.
    let mut cl1 = TrainerChannel::attach(&c.daemons[1].socket, u64::from(JOB), 0, 1).unwrap();
    let t1 = submit_all(&mut cl1, &x);
    for (cl, ts) in [(&mut cl0, &t0), (&mut cl1, &t1)] {
        let mut done = Vec::new();
        for _ in 0..OPS {
            let d = cl.wait_completion(Duration::from_secs(30)).expect("a completion, not a hang");
            assert_eq!(d.status, Status::Ok);
            done.push(d.op_seq);
        }
        assert_eq!(done.len(), OPS);
        for t in ts {
            let out = cl.read(t).unwrap();
            assert!(out.iter().zip(&x).all(|(a, b)| a.to_bits() == (b + b).to_bits()));
        }
    }
    let s = c.stats(0).unwrap();
    assert_eq!(s["local_ops"], 0, "{s}");
    assert_eq!(s["service"]["completions_dropped"], 0, "{s}");
}
