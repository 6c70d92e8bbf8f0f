//! The `dlcp.torch` DDP hook against real `dlcpd` processes on loopback
//! (`examples/ddp_train.py` ranks as separate Python processes):
//! - several trainers per host: 2 daemons × 2 trainers, budget 0, train, every
//!   rank reports the same ops, each delivered in full, identical parameters;
//! - the hook is asynchronous and priority acts (`tests/python/ddp_two_buckets.py`:
//!   two equal buckets per step, the back layer's submitted first, daemons paced
//!   so ops queue): the two ops' [start, finish] intervals in the daemons'
//!   reports overlap and the front layer's op finishes first in every step —
//!   and with every layer in one priority class (`layer_levels = 1`,
//!   `magnitude_levels = 1`) the intervals still overlap but the front layer's
//!   op finishes first in fewer than half of the steps (the order came from
//!   priority, not from submission order), and the daemons sent data in two
//!   classes only (one per phase) instead of more;
//! - the hook's completion waiter against a scripted client
//!   (`tests/python/test_hook_waiter.py`): futures returned at once, completed
//!   in any order, reports in hook order, a full ring waits for room, and an op
//!   past its timeout, a failed completion or the daemon gone fail every future
//!   in flight (none hangs) and every later hook call at once;
//! - `examples/ddp_train.py --no-overlap` (the measure of what overlap buys)
//!   runs a step's ops one after another on each daemon; without it they overlap;
//! - `examples/ddp_train.py` asks OpenBLAS for one thread per rank (its
//!   spinning workers took the CPU the transport needs), unless the caller set
//!   `OPENBLAS_NUM_THREADS`;
//! - failure semantics: no daemon → the attach error names the op and the
//!   socket; a daemon killed mid-training (one bucket in flight, or two) →
//!   every rank's `backward()` raises a `DlcpHookError` naming the bucket, step
//!   and op and the reason (daemon gone, or the op's failure on the surviving
//!   host), within a bound below the hook's own op timeout (no hang).
//!
//! Needs Debian's python3-torch and python3-sklearn: without them the tests fail
//! under `DLCP_REQUIRE_TORCH=1` / `DLCP_CI=1` and are reported as skipped
//! otherwise (see `tests/prereq`).

mod daemon_common;
mod prereq;
mod python_common;
mod torch_common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use daemon_common::*;
use torch_common::*;

/// A free TCP port on 127.0.0.1 for Gloo's store.
fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn rank_cmd(
    lib: &std::path::Path,
    cluster: &Cluster,
    host: usize,
    local: usize,
    locals: usize,
    port: u16,
) -> Command {
    let hosts = cluster.daemons.len();
    let mut cmd = Command::new(PYTHON);
    cmd.arg(example())
        .args(["--task", "digits"])
        .args(["--rank", &(host * locals + local).to_string(), "--world-size", &(hosts * locals).to_string()])
        .args(["--master-addr", "127.0.0.1", "--master-port", &port.to_string()])
        .arg("--socket")
        .arg(&cluster.daemons[host].socket)
        .args(["--job", &JOB.to_string(), "--local-rank", &local.to_string()])
        .args(["--local-world", &locals.to_string()])
        .env("DLCP_LIB", lib);
    cmd
}

#[test]
fn ddp_hook_two_trainers_per_host_identical_replicas() {
    let Some(lib) = prerequisites() else { return };
    let cluster = Cluster::start(&Options { hosts: 2, ..Options::default() });
    let port = free_tcp_port();
    let mut ranks = Ranks::default();
    let mut outs = Vec::new();
    for h in 0..2 {
        for k in 0..2 {
            let out = cluster.dir.path().join(format!("r{h}{k}.json"));
            let mut cmd = rank_cmd(&lib, &cluster, h, k, 2, port);
            cmd.args(["--budget", "0", "--epochs", "3"]).arg("--out").arg(&out);
            ranks.spawn(h * 2 + k, cmd, cluster.dir.path().join(format!("r{h}{k}.log")));
            outs.push(out);
        }
    }
    for f in ranks.wait_all(Duration::from_secs(300)) {
        assert!(f.ok, "rank {} failed:\n{}\n--- daemon log ---\n{}", f.rank, f.output, cluster.log(0));
    }
    let res: Vec<serde_json::Value> =
        outs.iter().map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()).collect();
    let digests: Vec<&str> = res.iter().map(|r| r["params_sha256"].as_str().unwrap()).collect();
    assert!(digests.iter().all(|d| *d == digests[0]), "replicas differ: {digests:?}");
    let ops = |r: &serde_json::Value| -> Vec<(u64, u64, u64, u64)> {
        r["reports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                assert_eq!(x["delivered"].as_f64(), Some(1.0), "budget 0 delivers everything: {x}");
                let f = |k: &str| x[k].as_u64().unwrap();
                (f("op_seq"), f("step"), f("bucket"), f("numel"))
            })
            .collect()
    };
    let first = ops(&res[0]);
    let steps = res[0]["steps"].as_u64().unwrap();
    assert_eq!(first.last().map(|o| o.1), Some(steps - 1), "the last step has reports");
    for r in &res[1..] {
        assert_eq!(ops(r), first, "ranks ran different ops");
    }
    let acc = res[0]["final_acc"].as_f64().unwrap();
    assert!(acc > 0.5, "3 epochs should reach > 50% test accuracy (chance: 10%), got {acc}");
    let curve: Vec<f64> =
        res[0]["curve"].as_array().unwrap().iter().map(|e| e["loss"].as_f64().unwrap()).collect();
    assert!(curve[curve.len() - 1] < curve[0], "training loss should fall: {curve:?}");
    let s = cluster.stats(0).unwrap();
    assert_eq!(s["service"]["ops_completed"].as_u64(), Some(first.len() as u64), "{s}");
    eprintln!(
        "4 DDP ranks on 2 daemons: {} ops each, identical parameters {}, accuracy {acc:.4}",
        first.len(),
        digests[0]
    );
}

#[test]
fn ddp_hook_raises_clear_errors_when_the_daemon_is_down_or_dies() {
    let Some(lib) = prerequisites() else { return };
    // No daemon at all: the state's attach fails at once, naming op and socket.
    let dir = tempfile::tempdir().unwrap();
    let nowhere = dir.path().join("no-dlcpd.sock");
    let mut ranks = Ranks::default();
    let mut cmd = Command::new(PYTHON);
    cmd.arg(example())
        .args(["--task", "digits", "--world-size", "1", "--master-addr", "127.0.0.1"])
        .args(["--master-port", &free_tcp_port().to_string(), "--job", "7", "--socket"])
        .arg(&nowhere)
        .env("DLCP_LIB", &lib);
    ranks.spawn(0, cmd, dir.path().join("nodaemon.log"));
    let f = ranks.wait_all(Duration::from_secs(60)).pop().unwrap();
    assert!(!f.ok, "training without a daemon succeeded?\n{}", f.output);
    assert!(
        f.output.contains("ConnectError: attach:") && f.output.contains("DLCP_ERR_CONNECT"),
        "no clear attach error:\n{}",
        f.output
    );

    // A daemon killed mid-training: both ranks raise (no hang).
    let mut cluster = Cluster::start(&Options { hosts: 2, hard_timeout_ms: 2000, ..Options::default() });
    let port = free_tcp_port();
    let mut ranks = Ranks::default();
    for h in 0..2 {
        let mut cmd = rank_cmd(&lib, &cluster, h, 0, 1, port);
        cmd.args(["--budget", "0.01", "--epochs", "50", "--op-timeout", "20"]);
        ranks.spawn(h, cmd, cluster.dir.path().join(format!("k{h}.log")));
    }
    let t0 = Instant::now();
    while !(0..2).all(|h| {
        std::fs::read_to_string(cluster.dir.path().join(format!("k{h}.log")))
            .unwrap_or_default()
            .contains("epoch 1 ")
    }) {
        assert!(t0.elapsed() < Duration::from_secs(120), "the ranks never reached epoch 1");
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster.kill(1, 9);
    let killed = Instant::now();
    let done = ranks.wait_all(Duration::from_secs(60));
    let took = killed.elapsed();
    assert_every_rank_raised(&done, took);
}

/// Every rank of a 2-daemon job whose daemon 1 was killed (9) raised a
/// `DlcpHookError` naming bucket, step and op and the reason, `took` after
/// the kill: less than the hook's op timeout (20 s), so the daemons' failure
/// (peer down, hard timeout 2 s, daemon gone), not the hook's own timeout,
/// ended the training.
fn assert_every_rank_raised(done: &[Finished], took: Duration) {
    for f in done {
        assert!(!f.ok, "rank {} finished although its peer's daemon died:\n{}", f.rank, f.output);
        let line = f.output.lines().find(|l| l.contains("DlcpHookError")).unwrap_or_else(|| {
            panic!("rank {}: no DlcpHookError:\n{}", f.rank, f.output);
        });
        assert!(
            line.contains("dlcp allreduce of DDP bucket") && line.contains("step ") && line.contains("op "),
            "rank {}: the error does not name bucket, step and op: {line}",
            f.rank
        );
        // Its own daemon gone, or (the survivor) the op failed: the silent peer
        // hit the hard timeout or was marked down.
        let reasons: &[&str] =
            if f.rank == 1 { &["DLCP_ERR_DAEMON_GONE"] } else { &["status 'timeout'", "status 'peer_down'"] };
        assert!(
            reasons.iter().any(|r| line.contains(r)),
            "rank {}: expected one of {reasons:?} in {line}",
            f.rank
        );
        eprintln!("rank {}: {line}", f.rank);
    }
    assert!(
        took < Duration::from_secs(15),
        "the ranks took {took:?} to raise (op timeout 20 s, hard timeout 2 s)"
    );
    eprintln!("both ranks raised within {took:?} of the daemon's death (hard timeout 2 s)");
}

#[test]
fn ddp_hook_completion_waiter_against_a_scripted_client() {
    if prerequisites().is_none() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/test_hook_waiter.py");
    let t0 = Instant::now();
    let out =
        Command::new(PYTHON).arg(script).arg("-v").env("PYTHONDONTWRITEBYTECODE", "1").output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "test_hook_waiter.py failed:\n{text}");
    assert!(text.contains("\nOK"), "{text}");
    let ran = text.lines().find(|l| l.starts_with("Ran ")).unwrap_or("?");
    eprintln!("test_hook_waiter.py: {ran}, OK ({:?})", t0.elapsed());
}

/// What `examples/ddp_train.py` leaves of OpenBLAS's threads: imports the
/// example as a module (its top level runs, `main()` does not), multiplies two
/// matrices and prints, for every OpenBLAS library mapped, its thread count.
const BLAS_THREADS: &str = r#"
import ctypes, importlib.util, sys
spec = importlib.util.spec_from_file_location("ddp_train", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
import torch
a = torch.randn(256, 256)
float((a @ a).sum())
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libopenblas" in l})
for p in libs:
    print("openblas", ctypes.CDLL(p).openblas_get_num_threads(), p)
"#;

/// The example asks OpenBLAS for one thread per rank, as it asks torch: Debian's
/// pthread OpenBLAS otherwise starts a worker per core that spins in
/// `sched_yield` between matrix products, taking the CPU from the transport
/// when several ranks share a machine (bench/results/2026-12-06-one-blas-thread.md).
/// The control run, with `OPENBLAS_NUM_THREADS=2` set by the caller (which
/// wins), shows that the count read is the one the variable sets.
#[test]
fn ddp_example_runs_one_blas_thread_per_rank() {
    if prerequisites().is_none() {
        return;
    }
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ddp_train.py");
    let counts = |env: Option<&str>| -> Vec<u32> {
        let mut cmd = Command::new(PYTHON);
        cmd.args(["-c", BLAS_THREADS]).arg(&example).env("PYTHONDONTWRITEBYTECODE", "1");
        match env {
            Some(v) => cmd.env("OPENBLAS_NUM_THREADS", v),
            None => cmd.env_remove("OPENBLAS_NUM_THREADS"),
        };
        let out = cmd.output().unwrap();
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "the thread-count script failed:\n{text}");
        eprintln!("OPENBLAS_NUM_THREADS={env:?}: {}", text.trim());
        text.lines().filter_map(|l| l.strip_prefix("openblas ")?.split(' ').next()?.parse().ok()).collect()
    };
    let default = counts(None);
    // Debian's python3-torch reaches OpenBLAS through libblas.so.3; another BLAS has no such pool.
    assert!(!default.is_empty(), "no OpenBLAS mapped after a matrix product (another BLAS?)");
    assert!(default.iter().all(|&n| n == 1), "OpenBLAS threads per rank: {default:?}, want 1");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus >= 2 {
        let control = counts(Some("2"));
        assert!(control.iter().all(|&n| n == 2), "with OPENBLAS_NUM_THREADS=2: {control:?}, want 2");
    }
}

/// Steps of `tests/python/ddp_two_buckets.py` (the first, before DDP rebuilds
/// its buckets, has one bucket and is not measured).
const TWO_BUCKET_STEPS: usize = 8;
/// The daemons' send rate: a 4 MiB bucket takes tens of milliseconds, so the
/// two buckets' chunks queue together and the classes decide who goes first.
const TWO_BUCKET_PACING: &str = "[pacing]\nrate_mbps = 200\n";
/// Every layer in one class: one layer level and one magnitude level.
const ONE_CLASS: &str = "[priority]\nlayer_levels = 1\nmagnitude_levels = 1\n";

fn two_buckets_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/ddp_two_buckets.py")
}

/// A rank of `ddp_two_buckets.py` on daemon `h` of a 2-daemon cluster.
fn two_buckets_cmd(lib: &Path, cluster: &Cluster, h: usize, port: u16, steps: usize, out: &Path) -> Command {
    let mut cmd = Command::new(PYTHON);
    cmd.arg(two_buckets_script())
        .args(["--rank", &h.to_string(), "--world-size", "2", "--master-port", &port.to_string()])
        .arg("--socket")
        .arg(&cluster.daemons[h].socket)
        .args(["--job", &JOB.to_string(), "--steps", &steps.to_string(), "--op-timeout", "20"])
        .arg("--out")
        .arg(out)
        .env("DLCP_LIB", lib);
    cmd
}

/// `dlcpctl report OP TENSOR --json` of daemon `h`: (started_us, finished_us).
fn op_interval(cluster: &Cluster, h: usize, op: u64, tensor: u64) -> (u64, u64) {
    let out = Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
        .arg("--socket")
        .arg(&cluster.daemons[h].socket)
        .args(["report", &op.to_string(), &tensor.to_string(), "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "dlcpctl report {op} {tensor}: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (s, f, d) = (v["started_us"].as_u64(), v["finished_us"].as_u64(), v["duration_us"].as_u64());
    let (Some(s), Some(f), Some(d)) = (s, f, d) else { panic!("no start/finish times in the report: {v}") };
    assert!(s > 0 && f >= s && (f - s).abs_diff(d) <= 1, "inconsistent times: {v}");
    (s, f)
}

/// One measured step on one daemon: the back layer's op (DDP bucket 0,
/// submitted first) and the front layer's (bucket 1), each [start, finish] µs.
#[derive(Debug)]
struct StepOps {
    step: u64,
    daemon: usize,
    back: (u64, u64),
    front: (u64, u64),
}

/// What a two-bucket run showed: the measured steps on both daemons, and each
/// daemon's data bytes sent per priority class (0..=6).
struct TwoBucketRun {
    steps: Vec<StepOps>,
    data_classes: Vec<Vec<u64>>,
}

/// Trains `ddp_two_buckets.py` on 2 daemons (paced, `[priority]` from
/// `priority`); checks the trainer side (same ops on both ranks, two equal
/// buckets per measured step with the right layer positions, the front
/// bucket's hook called while the back bucket's op was in flight, no future
/// done when its hook returned) and collects the daemons' op intervals.
fn two_bucket_run(priority: &str) -> Option<TwoBucketRun> {
    let lib = prerequisites()?;
    let extra = format!("{TWO_BUCKET_PACING}{priority}");
    let cluster = Cluster::start(&Options { hosts: 2, extra, ..Options::default() });
    let port = free_tcp_port();
    let mut ranks = Ranks::default();
    let outs: Vec<PathBuf> = (0..2).map(|h| cluster.dir.path().join(format!("two{h}.json"))).collect();
    for (h, out) in outs.iter().enumerate() {
        let cmd = two_buckets_cmd(&lib, &cluster, h, port, TWO_BUCKET_STEPS, out);
        ranks.spawn(h, cmd, cluster.dir.path().join(format!("two{h}.log")));
    }
    for f in ranks.wait_all(Duration::from_secs(240)) {
        assert!(f.ok, "rank {} failed:\n{}", f.rank, f.output);
    }
    let res: Vec<serde_json::Value> =
        outs.iter().map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()).collect();
    let u = |x: &serde_json::Value, k: &str| x[k].as_u64().unwrap_or_else(|| panic!("no {k} in {x}"));
    let ops = |r: &serde_json::Value| -> Vec<[u64; 6]> {
        let reps = r["reports"].as_array().unwrap();
        reps.iter()
            .map(|x| ["step", "bucket", "layer", "numel", "op_seq", "tensor_id"].map(|k| u(x, k)))
            .collect()
    };
    let ops0 = ops(&res[0]);
    assert_eq!(ops(&res[1]), ops0, "the ranks ran different ops");
    for r in &res {
        for c in r["calls"].as_array().unwrap() {
            assert_eq!(c["done"].as_bool(), Some(false), "a future was done when its hook returned: {c}");
            if u(c, "step") >= 1 && u(c, "bucket") == 1 {
                assert_eq!(
                    u(c, "in_flight"),
                    1,
                    "the front bucket's hook ran with the back bucket's op not in flight: {c}"
                );
            }
        }
    }
    let mut steps = Vec::new();
    for step in 1..TWO_BUCKET_STEPS as u64 {
        let of_step: Vec<&[u64; 6]> = ops0.iter().filter(|o| o[0] == step).collect();
        let [back, front] = of_step[..] else { panic!("step {step}: not two buckets: {of_step:?}") };
        assert_eq!((back[1], front[1]), (0, 1), "step {step}: DDP's buckets in hook order: {of_step:?}");
        assert_eq!((back[2], front[2]), (1, 0), "back layer position 1, front 0: {of_step:?}");
        assert_eq!(back[3], front[3], "equal buckets: {of_step:?}");
        for daemon in 0..2 {
            let back = op_interval(&cluster, daemon, back[4], back[5]);
            let front = op_interval(&cluster, daemon, front[4], front[5]);
            steps.push(StepOps { step, daemon, back, front });
        }
    }
    let data_classes = (0..2)
        .map(|h| {
            let s = cluster.stats(h).unwrap();
            let per_class = s["protocol"]["tx_bytes_per_class"].as_array().unwrap_or_else(|| panic!("{s}"));
            per_class[..7].iter().map(|b| b.as_u64().unwrap()).collect()
        })
        .collect();
    Some(TwoBucketRun { steps, data_classes })
}

/// The two ops of every measured step overlap on each daemon, and the back
/// layer's was started first (DDP readies it first).
fn assert_overlap(run: &TwoBucketRun) {
    for s in &run.steps {
        let (b, f) = (s.back, s.front);
        assert!(
            f.0 < b.1 && b.0 < f.1,
            "step {} daemon {}: the ops did not overlap: {s:?}",
            s.step,
            s.daemon
        );
        assert!(b.0 <= f.0, "step {} daemon {}: the front bucket started first: {s:?}", s.step, s.daemon);
    }
}

#[test]
fn ddp_hook_overlaps_two_buckets_and_the_front_layer_finishes_first() {
    let t0 = Instant::now();
    let Some(run) = two_bucket_run("") else { return };
    assert_overlap(&run);
    for s in &run.steps {
        assert!(
            s.front.1 < s.back.1,
            "step {} daemon {}: the back layer finished first: {s:?}",
            s.step,
            s.daemon
        );
    }
    for (h, classes) in run.data_classes.iter().enumerate() {
        let used = classes.iter().filter(|&&b| b > 0).count();
        assert!(used > 2, "daemon {h}: data went out in {used} classes only: {classes:?}");
    }
    let lead: Vec<u64> = run.steps.iter().map(|s| (s.back.1 - s.front.1) / 1000).collect();
    eprintln!(
        "front layer first in every step, by {lead:?} ms; data bytes per class {:?} ({:?})",
        run.data_classes,
        t0.elapsed()
    );
}

#[test]
fn ddp_hook_with_one_priority_class_keeps_no_front_first_order() {
    let t0 = Instant::now();
    let Some(run) = two_bucket_run(ONE_CLASS) else { return };
    assert_overlap(&run);
    let front_first = run.steps.iter().filter(|s| s.front.1 < s.back.1).count();
    assert!(
        2 * front_first < run.steps.len(),
        "one class for every layer, yet the front layer finished first in {front_first} of {} step-daemons: {:#?}",
        run.steps.len(),
        run.steps
    );
    // One class per phase: the scatter band's lowest (0) and the gather band's (4).
    for (h, classes) in run.data_classes.iter().enumerate() {
        let used: Vec<usize> = (0..7).filter(|&c| classes[c] > 0).collect();
        assert_eq!(used, [0, 4], "daemon {h}: data bytes per class {classes:?}");
    }
    eprintln!(
        "one class: front layer first in {front_first} of {} step-daemons ({:?})",
        run.steps.len(),
        t0.elapsed()
    );
}

#[test]
fn ddp_hook_fails_every_bucket_in_flight_when_a_peer_daemon_dies() {
    let Some(lib) = prerequisites() else { return };
    let extra = TWO_BUCKET_PACING.to_owned();
    let mut cluster =
        Cluster::start(&Options { hosts: 2, hard_timeout_ms: 2000, extra, ..Options::default() });
    let port = free_tcp_port();
    let mut ranks = Ranks::default();
    for h in 0..2 {
        let out = cluster.dir.path().join(format!("kill{h}.json"));
        let cmd = two_buckets_cmd(&lib, &cluster, h, port, 10_000, &out);
        ranks.spawn(h, cmd, cluster.dir.path().join(format!("kill{h}.log")));
    }
    let t0 = Instant::now();
    let log = |h: usize| {
        std::fs::read_to_string(cluster.dir.path().join(format!("kill{h}.log"))).unwrap_or_default()
    };
    while !(0..2).all(|h| log(h).contains("step 3 ")) {
        assert!(t0.elapsed() < Duration::from_secs(120), "the ranks never reached step 3");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Into the next step: both buckets' ops are in flight most of it (paced).
    std::thread::sleep(Duration::from_millis(100));
    cluster.kill(1, 9);
    let killed = Instant::now();
    let done = ranks.wait_all(Duration::from_secs(60));
    assert_every_rank_raised(&done, killed.elapsed());
}

/// `examples/ddp_train.py --no-overlap` (what `bench/time_to_accuracy.py`'s
/// `-sync` rows run to measure what overlap buys): every hook call waits for
/// its bucket, so on each daemon the ops of a step run one after another
/// (each starts after the one before finished). The control run, the same
/// example without the flag on the same paced daemons, overlaps some of them,
/// so the check can fail; both runs end with identical replicas.
#[test]
fn ddp_example_no_overlap_runs_one_bucket_at_a_time() {
    let Some(lib) = prerequisites() else { return };
    let cluster =
        Cluster::start(&Options { hosts: 2, extra: TWO_BUCKET_PACING.to_owned(), ..Options::default() });
    // Per step (from 1) and daemon: the ops' [start, finish] µs in hook order
    // (started: every local trainer had submitted it; finished: completed to them).
    type StepSpans = (u64, usize, Vec<(u64, u64)>);
    let run = |tag: &str, flags: &[&str]| -> Vec<StepSpans> {
        let port = free_tcp_port();
        let mut ranks = Ranks::default();
        let outs: Vec<PathBuf> = (0..2).map(|h| cluster.dir.path().join(format!("{tag}{h}.json"))).collect();
        for (h, out) in outs.iter().enumerate() {
            let mut cmd = rank_cmd(&lib, &cluster, h, 0, 1, port);
            cmd.args(["--budget", "0", "--epochs", "1"]).args(flags).arg("--out").arg(out);
            ranks.spawn(h, cmd, cluster.dir.path().join(format!("{tag}{h}.log")));
        }
        for f in ranks.wait_all(Duration::from_secs(240)) {
            assert!(f.ok, "{tag}: rank {} failed:\n{}", f.rank, f.output);
        }
        let res: Vec<serde_json::Value> = outs
            .iter()
            .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
            .collect();
        assert_eq!(res[0]["params_sha256"], res[1]["params_sha256"], "{tag}: replicas differ");
        assert_eq!(res[0]["overlap"].as_bool(), Some(flags.is_empty()), "{tag}: the run's record");
        let reports = res[0]["reports"].as_array().unwrap();
        let steps = res[0]["steps"].as_u64().unwrap();
        let mut out = Vec::new();
        // Step 0 has DDP's one initial bucket order; from step 1 its rebuilt buckets.
        for step in 1..steps {
            let ops: Vec<(u64, u64)> = reports
                .iter()
                .filter(|r| r["step"].as_u64() == Some(step))
                .map(|r| (r["op_seq"].as_u64().unwrap(), r["tensor_id"].as_u64().unwrap()))
                .collect();
            assert!(ops.len() >= 2, "{tag} step {step}: {} bucket(s), the check needs two", ops.len());
            for daemon in 0..2 {
                out.push((
                    step,
                    daemon,
                    ops.iter().map(|&(op, t)| op_interval(&cluster, daemon, op, t)).collect(),
                ));
            }
        }
        out
    };
    let overlapping = |spans: &[(u64, u64)]| spans.windows(2).filter(|w| w[1].0 < w[0].1).count();
    let sync = run("sync", &["--no-overlap"]);
    for (step, daemon, spans) in &sync {
        assert_eq!(
            overlapping(spans),
            0,
            "--no-overlap, step {step} daemon {daemon}: ops overlapped: {spans:?}"
        );
    }
    let control = run("async", &[]);
    let overlapped: usize = control.iter().map(|(_, _, s)| overlapping(s)).sum();
    assert!(overlapped > 0, "the asynchronous hook overlapped no ops either: {control:?}");
    eprintln!(
        "--no-overlap: {} step-daemons, ops one at a time; without it {overlapped} overlapping pairs",
        sync.len()
    );
}
