//! f32, f16 and bf16 allreduce, by sum and by average (wire version 6), end
//! to end: 4 real `dlcpd` processes on loopback, 2 trainers each on shared
//! memory, each (dtype, op):
//! - budget 0: every trainer gets exactly the reference — each trainer's
//!   values of the type, each host's local sum accumulated in f32 and
//!   rounded once to the type (the host's contribution), the hosts' sum in
//!   f32 in rank order, divided by the 8 trainers for an average, rounded
//!   once to the type;
//! - 1% receive loss in every daemon, budget 1%: identical bytes on every
//!   trainer, equal to the oracle recomputed from the owners' delivery
//!   bitmaps (`dlcpctl report`), every transfer within the budget.
//!
//! A numpy reference of the same contract, computed independently in Python,
//! is `tests/client_python_dtypes.rs`.

mod daemon_common;
mod prereq;

use std::time::Duration;

use daemon_common::*;
use dlcp::proto::elem;
use dlcp::proto::endpoint::{DType, OpOptions, ReduceOp};
use dlcp::shm::{ElemType, Reduce, Status, SubmitOptions, TrainerChannel};

const HOSTS: u32 = 4;
const TRAINERS: u32 = 2;
/// Payload bytes per chunk at the default MTU (1500 − 28 − 96).
const CHUNK_BYTES: usize = 1372;
/// Elements per op: odd, so shards and chunks do not divide evenly.
const SIZES: [usize; 2] = [100_003, 7];
/// The lossy test's: large enough that a 1% budget lets a chunk go (a
/// transfer of fewer than 100 chunks is repaired in full).
const LOSSY_SIZES: [usize; 2] = [1_000_003, 7];

/// Every (dtype, reduction).
fn kinds() -> Vec<(DType, ReduceOp)> {
    DType::ALL.iter().flat_map(|&d| ReduceOp::ALL.map(|r| (d, r))).collect()
}

fn shm_kind(dtype: DType, reduce: ReduceOp) -> (ElemType, Reduce) {
    let t = match dtype {
        DType::F32 => ElemType::F32,
        DType::F16 => ElemType::F16,
        DType::Bf16 => ElemType::Bf16,
    };
    (t, if reduce == ReduceOp::Average { Reduce::Average } else { Reduce::Sum })
}

fn seed(host: u32, local: u32, op: usize) -> u64 {
    (u64::from(host) << 32) | (u64::from(local) << 16) | op as u64 | 0xD7 << 56
}

/// Trainer `k` of host `h`'s values for op `i`: the test data rounded to the
/// type (what a trainer of that type holds).
fn trainer_input(h: u32, k: u32, i: usize, n: usize, dtype: DType) -> Vec<f32> {
    let mut v = data(seed(h, k, i), n);
    elem::round_all(dtype, &mut v);
    v
}

/// Host `h`'s contribution: its trainers' values summed in f32 in local-rank
/// order (what the daemon hands the endpoint; the endpoint rounds it once).
fn host_input(h: u32, i: usize, n: usize, dtype: DType) -> Vec<f32> {
    let mut local = trainer_input(h, 0, i, n, dtype);
    for k in 1..TRAINERS {
        local.iter_mut().zip(trainer_input(h, k, i, n, dtype)).for_each(|(a, b)| *a += b);
    }
    local
}

/// The exact result of op `i` (see the module docs).
fn reference(i: usize, n: usize, dtype: DType, reduce: ReduceOp) -> Vec<f32> {
    let mut global = vec![0f32; n];
    for h in 0..HOSTS {
        let mut local = host_input(h, i, n, dtype);
        elem::round_all(dtype, &mut local);
        if h == 0 {
            global = local;
        } else {
            global.iter_mut().zip(&local).for_each(|(a, b)| *a += *b);
        }
    }
    if reduce == ReduceOp::Average {
        global.iter_mut().for_each(|x| *x /= (HOSTS * TRAINERS) as f32);
    }
    elem::round_all(dtype, &mut global);
    global
}

/// One op per (kind, size) on every trainer; each trainer's results as f32
/// values and its delivered ppm, in op order.
fn run_ops(c: &Cluster, budget_ppm: u32, sizes: [usize; 2]) -> Vec<Vec<(Vec<f32>, u32)>> {
    let mut handles = Vec::new();
    for h in 0..HOSTS {
        for k in 0..TRAINERS {
            let socket = c.daemons[h as usize].socket.clone();
            handles.push(std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&socket, u64::from(JOB), k, TRAINERS).expect("attach");
                let mut out = Vec::new();
                for (i, dtype, reduce, n) in ops(sizes) {
                    let (elem_type, r) = shm_kind(dtype, reduce);
                    let t = cl.alloc_typed(&format!("t{i}"), n as u64, elem_type).expect("alloc");
                    let mut bytes = vec![0u8; n * dtype.size()];
                    elem::encode(dtype, &trainer_input(h, k, i, n, dtype), &mut bytes);
                    cl.write_bytes(&t, &bytes).expect("write");
                    let opts =
                        SubmitOptions { tensor_id: i as u32, budget_ppm, reduce: r, ..Default::default() };
                    cl.submit(&t, opts).expect("submit");
                    let done = cl.wait_completion(Duration::from_secs(30)).expect("completion");
                    assert_eq!(
                        done.status,
                        Status::Ok,
                        "host {h} trainer {k} op {i} {dtype:?} {reduce:?}: {done:?}"
                    );
                    let mut res = vec![0f32; n];
                    elem::decode(dtype, &cl.read_bytes(&t).expect("read"), &mut res);
                    out.push((res, done.delivered_ppm));
                    cl.free(&t.name).expect("free");
                }
                out
            }));
        }
    }
    handles.into_iter().map(|h| h.join().expect("trainer thread")).collect()
}

/// The ops in the order `run_ops` submits them: (index, dtype, reduce, n).
fn ops(sizes: [usize; 2]) -> Vec<(usize, DType, ReduceOp, usize)> {
    let all = kinds().into_iter().flat_map(|kind| sizes.map(|n| (kind, n)));
    all.enumerate().map(|(i, ((d, r), n))| (i, d, r, n)).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_dtype_and_op_reliable_is_bit_exact() {
    let c = Cluster::start(&Options { hosts: HOSTS, ..Options::default() });
    let results = run_ops(&c, 0, SIZES);
    for (i, dtype, reduce, n) in ops(SIZES) {
        let want = reference(i, n, dtype, reduce);
        if dtype != DType::F32 && n > 100 {
            // The type's rounding acts: the f32 result of the same values differs.
            let wide = reference(i, n, DType::F32, reduce);
            assert!(
                want.iter().zip(&wide).any(|(a, b)| a != b),
                "op {i} {dtype:?}: rounding changed nothing"
            );
        }
        for (t, r) in results.iter().enumerate() {
            assert!(
                bits(&r[i].0) == bits(&want),
                "trainer {t} op {i} ({dtype:?} {reduce:?}, {n}): not bit-exact"
            );
            assert_eq!(r[i].1, 1_000_000, "budget 0 must deliver everything");
        }
    }
    for h in 0..HOSTS {
        let s = c.stats(h).unwrap();
        assert_eq!(s["service"]["ops_completed"], ops(SIZES).len() as u64, "host {h}: {s}");
        assert_eq!(s["protocol"]["rejected"]["op_kind_mismatch"], 0, "host {h}: {s}");
    }
}

#[test]
fn every_dtype_and_op_under_1pct_receive_loss_matches_the_oracle_and_ranks_agree() {
    let c = Cluster::start(&Options { hosts: HOSTS, rx_loss_pct: 1.0, ..Options::default() });
    let results = run_ops(&c, 10_000, LOSSY_SIZES);
    let mut lossy_ops = 0;
    for (i, dtype, reduce, n) in ops(LOSSY_SIZES) {
        // Op sequence numbers are the client's: 1, 2, 3, … in submission order.
        let reports: Vec<_> = (0..HOSTS).map(|h| c.report(h, i as u64 + 1, i as u32)).collect();
        for (h, r) in reports.iter().enumerate() {
            for t in r["scatter"].as_array().unwrap().iter().chain(r["gather"].as_array().unwrap()) {
                let f = t["delivered_fraction"].as_f64().unwrap();
                assert!(f >= 0.99, "host {h} op {i}: a transfer delivered only {f}: {t}");
            }
        }
        let owners: Vec<_> = reports.iter().map(dlcp::service::report_from_json).collect();
        lossy_ops += usize::from(owners.iter().any(|o| o.scatter.iter().any(|t| !t.delivered.is_full())));
        let inputs: Vec<Vec<f32>> = (0..HOSTS).map(|h| host_input(h, i, n, dtype)).collect();
        let ins: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let refs: Vec<_> = owners.iter().collect();
        let divisor = HOSTS * TRAINERS;
        let opts =
            OpOptions { budget_ppm: 10_000, dtype, reduce, contributors: divisor, ..Default::default() };
        let want = dlcp::proto::oracle::recompute(&ins, &refs, opts, CHUNK_BYTES / dtype.size());
        for (t, r) in results.iter().enumerate() {
            assert!(
                bits(&r[i].0) == bits(&want),
                "trainer {t} op {i} ({dtype:?} {reduce:?}): differs from the oracle"
            );
            assert!(r[i].1 >= 990_000, "trainer {t} op {i}: delivered {} ppm", r[i].1);
        }
    }
    assert!(lossy_ops > 0, "1% receive loss never left a chunk missing: the test proves nothing");
    let dropped: u64 =
        (0..HOSTS).map(|h| c.stats(h).unwrap()["service"]["rx_debug_dropped"].as_u64().unwrap()).sum();
    assert!(dropped > 0, "the receive-loss knob dropped nothing");
}
