//! PyTorch DDP over dlcp on the emulated cluster of `scripts/testbed.sh`: 4
//! hosts with 1% random loss on every link (nftables), one real `dlcpd` and one
//! `examples/ddp_train.py` rank per host, DDP with the `dlcp.torch` hook at a 1%
//! budget; then the same training with Gloo's own allreduce on the same lossy
//! testbed. Asserts:
//! - every rank's hook reported every bucket of every step (op sequence numbers
//!   consecutive, the same ops on every rank), and each host's daemon has a
//!   report for each of those ops: the hook really carried the gradients;
//! - the injected loss shows: nftables dropped packets, some ops delivered less
//!   than all of a bucket, none less than the budget allows, repairs happened;
//! - the replicas' parameters are bit-identical on all ranks (both backends);
//! - dlcp's final test accuracy is within 1 percentage point of Gloo's;
//! - no op failed or hit the hard timeout.
//!
//! Needs root and network namespaces and Debian's python3-torch, python3-sklearn;
//! without them it fails under `DLCP_REQUIRE_NETNS=1` / `DLCP_REQUIRE_TORCH=1` /
//! `DLCP_CI=1` and is reported as skipped otherwise (see `tests/prereq`).

mod prereq;
mod python_common;
mod testbed_common;
mod torch_common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use testbed_common::*;
use torch_common::*;

const PREFIX: &str = "torchd";
const HOSTS: usize = 4;
const BUDGET: f64 = 0.01;
const EPOCHS: &str = "10";

fn train(bed: &Bed, lib: &std::path::Path, backend: &str, port: u16) -> Vec<serde_json::Value> {
    let mut ranks = Ranks::default();
    for h in 0..HOSTS {
        let out = bed.dir.path().join(format!("{backend}{h}.json"));
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &bed.ns(h), PYTHON])
            .arg(example())
            .args(["--task", "digits", "--backend", backend])
            .args(["--rank", &h.to_string(), "--world-size", &HOSTS.to_string()])
            .args(["--master-addr", "10.77.0.1", "--master-port", &port.to_string(), "--ifname", "eth0"])
            .arg("--socket")
            .arg(&bed.sockets[h])
            .args(["--job", &JOB.to_string(), "--budget", &BUDGET.to_string(), "--epochs", EPOCHS])
            .arg("--out")
            .arg(&out)
            .env("DLCP_LIB", lib);
        ranks.spawn(h, cmd, bed.dir.path().join(format!("{backend}{h}.log")));
    }
    let done = ranks.wait_all(Duration::from_secs(420));
    let mut res = Vec::new();
    for f in done {
        assert!(f.ok, "{backend} rank {} failed:\n{}", f.rank, f.output);
        eprintln!(
            "{backend} rank {} done in {:.1?}: {}",
            f.rank,
            f.elapsed,
            f.output.lines().last().unwrap_or("")
        );
        let p = bed.dir.path().join(format!("{backend}{}.json", f.rank));
        res.push(serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap());
    }
    res
}

fn identical_replicas(backend: &str, res: &[serde_json::Value]) {
    let d: Vec<&str> = res.iter().map(|r| r["params_sha256"].as_str().unwrap()).collect();
    assert!(d.iter().all(|x| *x == d[0]), "{backend}: replicas' parameters differ across ranks: {d:?}");
}

#[test]
fn ddp_over_dlcp_at_one_pct_loss_matches_gloo_accuracy() {
    let Some(lib) = prerequisites() else { return };
    let Some(bed) = Bed::start(PREFIX, HOSTS, &["--loss", "1"], 10_000) else { return };

    let dl = train(&bed, &lib, "dlcp", 29531);
    identical_replicas("dlcp", &dl);
    let (seen0, dropped0) = bed.loss_counters();

    // Every bucket of every step, on every rank, the same ops everywhere.
    let steps = dl[0]["steps"].as_u64().unwrap();
    let mut ops: Vec<(u64, u64)> = Vec::new(); // (op_seq, tensor_id) of rank 0
    let (mut min_delivered, mut lossy, mut repairs, mut n_ops) = (1.0f64, 0, 0u64, 0);
    for (h, r) in dl.iter().enumerate() {
        let reps = r["reports"].as_array().unwrap();
        let mut per_step: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (i, rep) in reps.iter().enumerate() {
            assert_eq!(
                rep["op_seq"].as_u64(),
                Some(i as u64 + 1),
                "rank {h}: op sequence has a gap at {rep}"
            );
            per_step.entry(rep["step"].as_u64().unwrap()).or_default().push(rep["bucket"].as_u64().unwrap());
            let d = rep["delivered"].as_f64().unwrap();
            assert!(d >= 1.0 - BUDGET - 1e-9, "rank {h}: an op delivered {d} < 1 - budget: {rep}");
            min_delivered = min_delivered.min(d);
            lossy += usize::from(d < 1.0);
            repairs += rep["repairs"].as_u64().unwrap();
        }
        assert_eq!(
            per_step.len() as u64,
            steps,
            "rank {h}: reports of {} steps, trained {steps}",
            per_step.len()
        );
        assert_eq!(per_step.keys().next_back(), Some(&(steps - 1)), "rank {h}: step numbers");
        // DDP runs its first step with one bucket, then rebuilds them.
        let buckets = per_step[&1].len() as u64;
        assert!(buckets >= 2, "expected several DDP buckets, got {buckets}");
        for (s, b) in &per_step {
            let mut sorted = b.clone();
            sorted.sort();
            let want: Vec<u64> = if *s == 0 { (0..b.len() as u64).collect() } else { (0..buckets).collect() };
            assert_eq!(sorted, want, "rank {h} step {s}: buckets reported {b:?}");
        }
        // Front layers rank first: a bucket's layer position falls as its index grows.
        let st1: Vec<&serde_json::Value> = reps.iter().filter(|r| r["step"] == 1).collect();
        for w in st1.windows(2) {
            assert!(w[0]["layer"].as_u64() > w[1]["layer"].as_u64(), "layer positions: {:?}", st1);
        }
        let these: Vec<(u64, u64)> =
            reps.iter().map(|r| (r["op_seq"].as_u64().unwrap(), r["tensor_id"].as_u64().unwrap())).collect();
        if h == 0 {
            ops = these;
        } else {
            assert_eq!(these, ops, "rank {h} ran other ops than rank 0");
        }
        n_ops += reps.len();
    }
    // Each daemon has a report for every op (it keeps the last 1024).
    assert!(ops.len() <= 1024, "{} ops: more than the daemon keeps reports for", ops.len());
    let mut missing_chunks = 0u64;
    let mut repaired = 0u64;
    for h in 0..HOSTS {
        for &(op, tensor) in &ops {
            let r = bed.report(h, op, tensor as u32);
            for t in r["scatter"].as_array().unwrap().iter().chain(r["gather"].as_array().unwrap()) {
                let f = t["delivered_fraction"].as_f64().unwrap();
                assert!(f >= 1.0 - BUDGET - 1e-9, "host {h} op {op}: a transfer delivered {f}: {t}");
                missing_chunks += t["missing"].as_array().unwrap().len() as u64;
                repaired += t["repaired"].as_u64().unwrap_or(0);
            }
        }
        let s = bed.stats(h);
        assert_eq!(s["service"]["ops_failed"], 0, "host {h}: an op failed: {s}");
        assert_eq!(s["protocol"]["hard_timeouts"], 0, "host {h}: an op hit the hard timeout: {s}");
    }
    eprintln!(
        "dlcp: {steps} steps, {} ops per rank ({n_ops} hook reports), min delivered {min_delivered:.4}, \
         {lossy} hook reports below 100%, repairs {repairs} (hook) / {repaired} (daemon reports), \
         {missing_chunks} chunks given up; nftables dropped {dropped0} of {seen0}",
        ops.len()
    );
    assert!(dropped0 > 0, "the testbed's 1% loss dropped nothing: the test proves nothing");
    assert!(
        lossy > 0 && missing_chunks > 0,
        "1% loss never left a chunk missing: the budget was not exercised"
    );
    assert!(repairs > 0, "1% loss and no repair: the loss did not reach dlcp");

    let gl = train(&bed, &lib, "gloo", 29532);
    identical_replicas("gloo", &gl);
    let acc = |r: &[serde_json::Value]| r[0]["final_acc"].as_f64().unwrap();
    let (a_dl, a_gl) = (acc(&dl), acc(&gl));
    let secs = |r: &[serde_json::Value]| r[0]["train_seconds"].as_f64().unwrap();
    eprintln!(
        "final test accuracy: dlcp {:.2}% (budget 1%, {:.1} s), gloo {:.2}% ({:.1} s), 1% loss on every link",
        100.0 * a_dl,
        secs(&dl),
        100.0 * a_gl,
        secs(&gl)
    );
    assert!(
        (a_dl - a_gl).abs() <= 0.01 + 1e-9,
        "dlcp's accuracy {a_dl} is not within 1 point of gloo's {a_gl}"
    );
}
