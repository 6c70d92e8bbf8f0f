//! Reduce-scatter, allgather, broadcast and barrier (issue 18) end to end: 4
//! real `dlcpd` processes on loopback, 2 trainers each on shared memory, in
//! f32, f16 and bf16, against references computed the way the contract says
//! (each trainer's values of the type; a host's input is its trainers' sum
//! accumulated in f32 in local-rank order and rounded once to the type):
//! - budget 0, bit-exact: a reduce-scatter (sum and average) leaves the
//!   allreduce's values in the host's shard and the trainer's own values
//!   elsewhere, and says which shard; an allgather gives every trainer each
//!   host's shard of that host's input; a broadcast from root 2 gives every
//!   trainer local rank 0 of host 2's tensor;
//! - 1% receive loss in every daemon and budget 1% for reduce-scatter and
//!   allgather: the result equals the oracle recomputed from the owners'
//!   delivery bitmaps and masks (`dlcpctl report`), the same on every trainer
//!   that holds it;
//! - a broadcast at budget 0 under that loss is exact on every trainer;
//! - a barrier holds every trainer until the last one enters it;
//! - the local trainers must agree on the collective and the root, and a
//!   broadcast root must be a daemon rank: refused with the field named.

mod daemon_common;
mod prereq;

use std::ops::Range;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use daemon_common::*;
use dlcp::proto::elem;
use dlcp::proto::endpoint::{Collective, DType, OpOptions, ReduceOp, shard_range};
use dlcp::shm::{Completion, ElemType, Opcode, Reduce, Status, SubmitOptions, TrainerChannel};

const HOSTS: u32 = 4;
const TRAINERS: u32 = 2;
/// Payload bytes per chunk at the default MTU (1500 − 28 − 96).
const CHUNK_BYTES: usize = 1372;
/// Elements per op: odd, so shards and chunks do not divide evenly.
const SIZES: [usize; 2] = [100_003, 7];
/// The lossy test's: large enough that a 1% budget lets a chunk go.
const LOSSY_SIZE: usize = 1_000_003;
/// The broadcast's root (not 0, so "the first host" cannot pass for it).
const ROOT: u32 = 2;

/// One op of a run: its index (tensor id; op sequence number − 1), what it is, and its length.
#[derive(Debug, Clone, Copy)]
struct Op {
    i: usize,
    opcode: Opcode,
    dtype: DType,
    reduce: ReduceOp,
    root: u32,
    n: usize,
}

fn elem_type(dtype: DType) -> ElemType {
    match dtype {
        DType::F32 => ElemType::F32,
        DType::F16 => ElemType::F16,
        DType::Bf16 => ElemType::Bf16,
    }
}

fn seed(host: u32, local: u32, op: usize) -> u64 {
    (u64::from(host) << 32) | (u64::from(local) << 16) | op as u64 | 0xC0 << 56
}

/// Trainer `k` of host `h`'s values for op `i`, rounded to the type.
fn trainer_input(h: u32, k: u32, i: usize, n: usize, dtype: DType) -> Vec<f32> {
    let mut v = data(seed(h, k, i), n);
    elem::round_all(dtype, &mut v);
    v
}

/// Host `h`'s input: its trainers' values summed in f32 in local-rank order
/// (the endpoint rounds it once to the type).
fn host_input(h: u32, i: usize, n: usize, dtype: DType) -> Vec<f32> {
    let mut local = trainer_input(h, 0, i, n, dtype);
    for k in 1..TRAINERS {
        local.iter_mut().zip(trainer_input(h, k, i, n, dtype)).for_each(|(a, b)| *a += b);
    }
    local
}

/// What an allreduce of op `o` gives (exact): the hosts' rounded inputs
/// summed in f32 in rank order, divided by the 8 trainers for an average,
/// rounded once.
fn allreduce_reference(o: &Op) -> Vec<f32> {
    let mut global = vec![0f32; o.n];
    for h in 0..HOSTS {
        let mut local = host_input(h, o.i, o.n, o.dtype);
        elem::round_all(o.dtype, &mut local);
        if h == 0 {
            global = local;
        } else {
            global.iter_mut().zip(&local).for_each(|(a, b)| *a += *b);
        }
    }
    if o.reduce == ReduceOp::Average {
        global.iter_mut().for_each(|x| *x /= (HOSTS * TRAINERS) as f32);
    }
    elem::round_all(o.dtype, &mut global);
    global
}

fn shard(n: usize, h: u32) -> Range<usize> {
    shard_range(n, HOSTS, h)
}

/// What trainer `k` of host `h` must hold after op `o` (budget 0), given
/// `reduced` (the allreduce reference, for a reduce-scatter).
fn reference(o: &Op, h: u32, k: u32, reduced: &[f32]) -> Vec<f32> {
    match o.opcode {
        Opcode::ReduceScatter => {
            let mut mine = trainer_input(h, k, o.i, o.n, o.dtype);
            let s = shard(o.n, h);
            mine[s.clone()].copy_from_slice(&reduced[s]);
            mine
        }
        Opcode::Allgather => gathered(o),
        Opcode::Broadcast => trainer_input(o.root, 0, o.i, o.n, o.dtype),
        other => panic!("no reference for {other:?}"),
    }
}

/// An exact allgather's result: each host's shard of its rounded input.
fn gathered(o: &Op) -> Vec<f32> {
    let mut out = vec![0f32; o.n];
    for h in 0..HOSTS {
        let mut input = host_input(h, o.i, o.n, o.dtype);
        elem::round_all(o.dtype, &mut input);
        let s = shard(o.n, h);
        out[s.clone()].copy_from_slice(&input[s]);
    }
    out
}

/// Every op of a run, per dtype each collective at each size (indices in submission order).
fn ops(sizes: &[usize], collectives: &[(Opcode, ReduceOp, u32)]) -> Vec<Op> {
    let mut v = Vec::new();
    for dtype in DType::ALL {
        for &(opcode, reduce, root) in collectives {
            for &n in sizes {
                v.push(Op { i: v.len(), opcode, dtype, reduce, root, n });
            }
        }
    }
    v
}

/// What one trainer saw of one op: its tensor afterwards and the completion.
type Seen = (Vec<f32>, Completion);

/// Every trainer runs `ops` in order with `budget_ppm`; each trainer's
/// results, trainers in (host, local rank) order.
fn run_ops(c: &Cluster, ops: &[Op], budget_ppm: u32) -> Vec<Vec<Seen>> {
    let mut handles = Vec::new();
    for h in 0..HOSTS {
        for k in 0..TRAINERS {
            let socket = c.daemons[h as usize].socket.clone();
            let ops = ops.to_vec();
            handles.push(std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&socket, u64::from(JOB), k, TRAINERS).expect("attach");
                let mut out = Vec::new();
                for o in ops {
                    let t =
                        cl.alloc_typed(&format!("t{}", o.i), o.n as u64, elem_type(o.dtype)).expect("alloc");
                    let mut bytes = vec![0u8; o.n * o.dtype.size()];
                    elem::encode(o.dtype, &trainer_input(h, k, o.i, o.n, o.dtype), &mut bytes);
                    cl.write_bytes(&t, &bytes).expect("write");
                    let reduce = if o.reduce == ReduceOp::Average { Reduce::Average } else { Reduce::Sum };
                    let opts = SubmitOptions {
                        tensor_id: o.i as u32,
                        budget_ppm,
                        reduce,
                        opcode: o.opcode,
                        root: o.root,
                        ..Default::default()
                    };
                    cl.submit(&t, opts).expect("submit");
                    let done = cl.wait_completion(Duration::from_secs(30)).expect("completion");
                    assert_eq!(done.status, Status::Ok, "host {h} trainer {k} {o:?}: {done:?}");
                    let mut res = vec![0f32; o.n];
                    elem::decode(o.dtype, &cl.read_bytes(&t).expect("read"), &mut res);
                    out.push((res, done));
                    cl.free(&t.name).expect("free");
                }
                out
            }));
        }
    }
    handles.into_iter().map(|h| h.join().expect("trainer thread")).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// (host, local rank) of trainer `t` in `run_ops` order.
fn place(t: usize) -> (u32, u32) {
    (t as u32 / TRAINERS, t as u32 % TRAINERS)
}

/// The shard a completion names.
fn told(done: &Completion) -> Range<usize> {
    done.shard_offset as usize..(done.shard_offset + done.shard_len) as usize
}

#[test]
fn every_collective_and_dtype_reliable_is_bit_exact() {
    let c = Cluster::start(&Options { hosts: HOSTS, ..Options::default() });
    let collectives = [
        (Opcode::ReduceScatter, ReduceOp::Sum, 0),
        (Opcode::ReduceScatter, ReduceOp::Average, 0),
        (Opcode::Allgather, ReduceOp::Sum, 0),
        (Opcode::Broadcast, ReduceOp::Sum, ROOT),
    ];
    let ops = ops(&SIZES, &collectives);
    let results = run_ops(&c, &ops, 0);
    for o in &ops {
        let reduced = allreduce_reference(o);
        for (t, r) in results.iter().enumerate() {
            let (h, k) = place(t);
            let (got, done) = &r[o.i];
            let want = reference(o, h, k, &reduced);
            assert!(bits(got) == bits(&want), "host {h} trainer {k} {o:?}: not bit-exact");
            assert_eq!(done.delivered_ppm, 1_000_000, "budget 0 must deliver everything");
            let shard = match o.opcode {
                Opcode::ReduceScatter | Opcode::Allgather => shard(o.n, h),
                _ => 0..0,
            };
            assert_eq!(told(done), shard, "host {h} trainer {k} {o:?}: the completion's shard");
        }
        if o.opcode == Opcode::Broadcast {
            // Not what host 2's other trainer or any other host holds.
            assert_ne!(bits(&reference(o, 0, 0, &reduced)), bits(&trainer_input(ROOT, 1, o.i, o.n, o.dtype)));
            assert_ne!(bits(&reference(o, 0, 0, &reduced)), bits(&trainer_input(0, 0, o.i, o.n, o.dtype)));
        }
        if o.n > 100 {
            // The reports name the collective.
            let r = c.report(0, o.i as u64 + 1, o.i as u32);
            assert_eq!(r["collective"], o.opcode.name(), "{o:?}: {r}");
        }
    }
    for h in 0..HOSTS {
        let s = c.stats(h).unwrap();
        assert_eq!(s["service"]["ops_completed"], ops.len() as u64, "host {h}: {s}");
        assert_eq!(s["protocol"]["rejected"]["op_kind_mismatch"], 0, "host {h}: {s}");
    }
}

#[test]
fn reduce_scatter_and_allgather_under_1pct_receive_loss_match_the_oracle() {
    let c = Cluster::start(&Options { hosts: HOSTS, rx_loss_pct: 1.0, ..Options::default() });
    let collectives = [(Opcode::ReduceScatter, ReduceOp::Sum, 0), (Opcode::Allgather, ReduceOp::Sum, 0)];
    let ops = ops(&[LOSSY_SIZE], &collectives);
    let results = run_ops(&c, &ops, 10_000);
    let mut lossy_ops = 0;
    for o in &ops {
        // Op sequence numbers are the client's: 1, 2, 3, … in submission order.
        let reports: Vec<_> = (0..HOSTS).map(|h| c.report(h, o.i as u64 + 1, o.i as u32)).collect();
        let mut missing = false;
        for (h, r) in reports.iter().enumerate() {
            assert_eq!(r["collective"], o.opcode.name(), "{o:?}");
            for t in r["scatter"].as_array().unwrap().iter().chain(r["gather"].as_array().unwrap()) {
                let f = t["delivered_fraction"].as_f64().unwrap();
                assert!(f >= 0.99, "host {h} {o:?}: a transfer delivered only {f}: {t}");
                missing |= !t["missing"].as_array().unwrap().is_empty();
            }
        }
        lossy_ops += usize::from(missing);
        let owners: Vec<_> = reports.iter().map(dlcp::service::report_from_json).collect();
        let inputs: Vec<Vec<f32>> = (0..HOSTS).map(|h| host_input(h, o.i, o.n, o.dtype)).collect();
        let ins: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let refs: Vec<_> = owners.iter().collect();
        let opts = OpOptions {
            budget_ppm: 10_000,
            gather_budget_ppm: 10_000,
            dtype: o.dtype,
            reduce: o.reduce,
            contributors: HOSTS * TRAINERS,
            collective: if o.opcode == Opcode::Allgather {
                Collective::Allgather
            } else {
                Collective::ReduceScatter
            },
            ..Default::default()
        };
        // A reduce-scatter's shard h is the oracle's shard h (zero elsewhere:
        // the rest of the trainer's tensor is its own); an allgather's result is all of it.
        let want = dlcp::proto::oracle::recompute(&ins, &refs, opts, CHUNK_BYTES / o.dtype.size());
        for (t, r) in results.iter().enumerate() {
            let (h, k) = place(t);
            let (got, done) = &r[o.i];
            let expect =
                if o.opcode == Opcode::ReduceScatter { reference(o, h, k, &want) } else { want.clone() };
            assert!(bits(got) == bits(&expect), "host {h} trainer {k} {o:?}: differs from the oracle");
            assert!(done.delivered_ppm >= 990_000, "host {h} trainer {k} {o:?}: {done:?}");
            assert_eq!(told(done), shard(o.n, h));
        }
    }
    assert!(lossy_ops > 0, "1% receive loss never left a chunk missing: the test proves nothing");
    let dropped: u64 =
        (0..HOSTS).map(|h| c.stats(h).unwrap()["service"]["rx_debug_dropped"].as_u64().unwrap()).sum();
    assert!(dropped > 0, "the receive-loss knob dropped nothing");
}

/// Parameters are broadcast exactly by default: with budget 0 under 1%
/// receive loss in every daemon, every trainer holds the root's tensor bit
/// for bit, and the loss was real (repairs were needed).
#[test]
fn a_broadcast_at_budget_0_under_1pct_receive_loss_is_exact() {
    let c = Cluster::start(&Options { hosts: HOSTS, rx_loss_pct: 1.0, ..Options::default() });
    let ops = ops(&[LOSSY_SIZE], &[(Opcode::Broadcast, ReduceOp::Sum, ROOT)]);
    let results = run_ops(&c, &ops, 0);
    for o in &ops {
        let want = bits(&trainer_input(ROOT, 0, o.i, o.n, o.dtype));
        for (t, r) in results.iter().enumerate() {
            let (h, k) = place(t);
            let (got, done) = &r[o.i];
            assert!(bits(got) == want, "host {h} trainer {k} {o:?}: not the root's tensor");
            assert_eq!(done.delivered_ppm, 1_000_000, "host {h} trainer {k} {o:?}: {done:?}");
        }
    }
    let repairs: u64 =
        (0..HOSTS).map(|h| c.stats(h).unwrap()["protocol"]["repairs_sent"].as_u64().unwrap()).sum();
    assert!(repairs > 0, "1% receive loss needed no repair: the test proves nothing");
}

#[test]
fn a_barrier_holds_every_trainer_until_the_last_enters() {
    let c = Cluster::start(&Options { hosts: HOSTS, hard_timeout_ms: 10_000, ..Options::default() });
    const LATE: (u32, u32) = (3, 1);
    const DELAY: Duration = Duration::from_millis(1500);
    let attached = Arc::new(Barrier::new((HOSTS * TRAINERS) as usize));
    let late_entered = Arc::new(Mutex::new(None::<Instant>));
    let mut handles = Vec::new();
    for h in 0..HOSTS {
        for k in 0..TRAINERS {
            let socket = c.daemons[h as usize].socket.clone();
            let (attached, late_entered) = (attached.clone(), late_entered.clone());
            handles.push(std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&socket, u64::from(JOB), k, TRAINERS).expect("attach");
                attached.wait();
                if (h, k) == LATE {
                    std::thread::sleep(DELAY);
                    *late_entered.lock().unwrap() = Some(Instant::now());
                }
                let entered = Instant::now();
                cl.submit_barrier(SubmitOptions::default()).expect("submit");
                let done = cl.wait_completion(Duration::from_secs(30)).expect("completion");
                assert_eq!(done.status, Status::Ok, "host {h} trainer {k}: {done:?}");
                (entered, Instant::now())
            }));
        }
    }
    let times: Vec<(Instant, Instant)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let late = late_entered.lock().unwrap().expect("the late trainer entered");
    for (t, (entered, left)) in times.iter().enumerate() {
        let (h, k) = place(t);
        assert!(*left >= late, "host {h} trainer {k} left the barrier before the last trainer entered it");
        if (h, k) != LATE {
            // It really waited: it entered long before the late one.
            assert!(late.duration_since(*entered) >= DELAY / 2, "host {h} trainer {k} entered late itself");
        }
    }
    for h in 0..HOSTS {
        let s = c.stats(h).unwrap();
        assert_eq!(s["service"]["ops_completed"], 1, "host {h}: {s}");
        assert_eq!(s["recent_ops"][0]["collective"], "barrier", "host {h}: {s}");
    }
}

#[test]
fn local_trainers_must_agree_on_collective_and_root_and_a_root_must_be_a_daemon() {
    let c = Cluster::start(&Options { hosts: 2, ..Options::default() });
    let socket = c.daemons[0].socket.clone();
    let mut cl: Vec<TrainerChannel> =
        (0..2).map(|k| TrainerChannel::attach(&socket, u64::from(JOB), k, 2).expect("attach")).collect();
    let submit = |cl: &mut TrainerChannel, opcode, root| {
        let t = cl.alloc(&format!("t{}", cl.next_op_seq()), 16).unwrap();
        cl.submit(&t, SubmitOptions { tensor_id: 0, opcode, root, ..Default::default() }).unwrap()
    };
    // Every case: trainer 0's op, trainer 1's op, the field the reason names
    // and the two values (in the order the daemon took the two submissions).
    let cases = [
        ((Opcode::Broadcast, 0), (Opcode::Broadcast, 1), ("root", "0", "1")),
        ((Opcode::ReduceScatter, 0), (Opcode::Allgather, 0), ("collective", "reduce-scatter", "allgather")),
        ((Opcode::AllReduce, 0), (Opcode::Broadcast, 0), ("collective", "allreduce", "broadcast")),
    ];
    for (a, b, (field, x, y)) in cases {
        let seq = submit(&mut cl[0], a.0, a.1);
        assert_eq!(submit(&mut cl[1], b.0, b.1), seq);
        for (k, t) in cl.iter_mut().enumerate() {
            let done = t.wait_completion(Duration::from_secs(10)).unwrap();
            assert_eq!(done.status, Status::InvalidDescriptor, "trainer {k}: {done:?}");
            let reason = t.failure_reason(done.op_seq, done.tensor_id).unwrap_or_default();
            let named = |p: &str, q: &str| reason.contains(&format!("{field} {p} vs {q}"));
            assert!(named(x, y) || named(y, x), "trainer {k}: {reason}");
        }
    }
    // A root that is not a daemon rank of the job (2 daemons), refused at the descriptor.
    let seq = submit(&mut cl[0], Opcode::Broadcast, 2);
    let done = cl[0].wait_completion(Duration::from_secs(10)).unwrap();
    assert_eq!((done.status, done.op_seq), (Status::InvalidDescriptor, seq));
    assert_eq!(done.detail, dlcp::shm::DescError::RootOutOfRange { root: 2, nodes: 2 }.code());
    let reason = cl[0].failure_reason(done.op_seq, done.tensor_id).unwrap_or_default();
    assert!(reason.contains("root: broadcast root 2 is not a daemon rank of this job (0..2)"), "{reason}");
    // An allgather that averages, likewise.
    let t = cl[0].alloc("avg", 16).unwrap();
    let o = SubmitOptions { opcode: Opcode::Allgather, reduce: Reduce::Average, ..Default::default() };
    cl[0].submit(&t, o).unwrap();
    let done = cl[0].wait_completion(Duration::from_secs(10)).unwrap();
    assert_eq!(done.status, Status::InvalidDescriptor);
    let reason = cl[0].failure_reason(done.op_seq, done.tensor_id).unwrap_or_default();
    assert!(reason.contains("reduce: allgather does not reduce"), "{reason}");
}
