//! End to end on loopback: real `dlcpd` processes, real trainers attached over
//! shared memory, real UDP.

mod daemon_common;

use std::time::Duration;

use daemon_common::*;
use dlcp::shm::{Client, Status, SubmitOptions};

const HOSTS: u32 = 4;
const TRAINERS: u32 = 2;

/// Element counts from 1 KiB to 4 MiB of f32 (odd sizes included).
const SIZES: [usize; 6] = [256, 1000, 4099, 65_536, 250_001, 1 << 20];

fn trainer_seed(host: u32, local: u32, op: usize) -> u64 {
    (u64::from(host) << 32) | (u64::from(local) << 16) | op as u64
}

/// Run `SIZES` ops with every trainer on every host; return each trainer's results.
fn run_ops(c: &Cluster, budget_ppm: u32) -> Vec<Vec<(Vec<f32>, u32)>> {
    let mut handles = Vec::new();
    for h in 0..HOSTS {
        for k in 0..TRAINERS {
            let socket = c.daemons[h as usize].socket.clone();
            handles.push(std::thread::spawn(move || {
                let mut cl = Client::attach(&socket, u64::from(JOB), k, TRAINERS).expect("attach");
                let mut out = Vec::new();
                for (i, &n) in SIZES.iter().enumerate() {
                    let t = cl.alloc(&format!("t{i}"), n as u64).expect("alloc");
                    cl.write(&t, &data(trainer_seed(h, k, i), n)).expect("write");
                    let opts = SubmitOptions {
                        tensor_id: i as u32,
                        layer: 0,
                        layers: 1,
                        budget_ppm,
                        ..Default::default()
                    };
                    cl.submit(&t, opts).expect("submit");
                    let done = cl.wait_completion(Duration::from_secs(30)).expect("completion");
                    assert_eq!(done.status, Status::Ok, "host {h} trainer {k} op {i}: {done:?}");
                    out.push((cl.read(&t).expect("read"), done.delivered_ppm));
                    cl.free(&t.name).expect("free");
                }
                out
            }));
        }
    }
    handles.into_iter().map(|h| h.join().expect("trainer thread")).collect()
}

/// The exact value: local sums in local-rank order, then hosts in rank order.
fn reference(i: usize) -> Vec<f32> {
    let n = SIZES[i];
    let mut global: Option<Vec<f32>> = None;
    for h in 0..HOSTS {
        let mut local = data(trainer_seed(h, 0, i), n);
        for k in 1..TRAINERS {
            for (a, b) in local.iter_mut().zip(data(trainer_seed(h, k, i), n)) {
                *a += b;
            }
        }
        match global.as_mut() {
            None => global = Some(local),
            Some(g) => g.iter_mut().zip(&local).for_each(|(a, b)| *a += *b),
        }
    }
    global.unwrap()
}

#[test]
fn four_daemons_two_trainers_each_reliable_is_bit_exact() {
    let c = Cluster::start(&Options { hosts: HOSTS, ..Options::default() });
    let results = run_ops(&c, 0);
    for (i, _) in SIZES.iter().enumerate() {
        let want: Vec<u32> = reference(i).iter().map(|x| x.to_bits()).collect();
        for (t, r) in results.iter().enumerate() {
            let got: Vec<u32> = r[i].0.iter().map(|x| x.to_bits()).collect();
            assert!(got == want, "trainer {t} op {i} ({} elems): not bit-exact", SIZES[i]);
            assert_eq!(r[i].1, 1_000_000, "budget 0 must deliver everything");
        }
    }
    for h in 0..HOSTS {
        let s = c.stats(h).unwrap();
        assert_eq!(s["service"]["ops_completed"], SIZES.len() as u64, "host {h}: {s}");
        assert_eq!(s["service"]["trainers_attached"], u64::from(TRAINERS));
    }
}
