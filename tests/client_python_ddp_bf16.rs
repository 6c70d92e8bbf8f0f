//! The `dlcp.torch` DDP hook with bfloat16 gradient buckets (issue 18):
//! `examples/ddp_train.py --dtype bf16` (parameters, activations and so DDP's
//! buckets in torch's CPU bfloat16) on 2 daemons × 2 trainers, budget 0, 10
//! epochs of the digits task, against the same run in float32 (same seed,
//! same data order): every bucket went through dlcp as a bf16 tensor, the
//! bf16 replicas end identical, and the bf16 run's test accuracy is within 5
//! points of the f32 run's (measured: 0.9250 vs 0.9306; after 3 epochs the
//! bf16 run still lags, 0.7139 vs 0.7722: bf16 weight updates, not the
//! transport, which reduces every bucket bit-exactly at budget 0).
//!
//! The digits test set is small (one sample = 0.28 points); the ignored
//! `mnist1d_bf16_against_f32` runs the same comparison on the MNIST-1D task
//! (4.35 M parameters, 4,000 test samples: one = 0.025 points) for the
//! bench record (`cargo test --release --test client_python_ddp_bf16 --
//! --ignored --nocapture`; figures in bench/results/).
//!
//! Needs Debian's python3-torch and python3-sklearn: without them the test
//! fails under `DLCP_REQUIRE_TORCH=1` / `DLCP_CI=1` and is reported as skipped
//! otherwise (see `tests/prereq`).

mod daemon_common;
mod prereq;
mod python_common;
mod torch_common;

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use daemon_common::*;

/// Epochs of each run.
const EPOCHS: &str = "10";
use torch_common::*;

/// One training run of `dtype` on a fresh 2-daemon cluster, 2 trainers each,
/// `examples/ddp_train.py` with `task` (its arguments): every rank's `--out` JSON.
fn train(lib: &std::path::Path, dtype: &str, task: &[&str]) -> Vec<serde_json::Value> {
    let cluster = Cluster::start(&Options { hosts: 2, ..Options::default() });
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut ranks = Ranks::default();
    let mut outs = Vec::new();
    for h in 0..2usize {
        for k in 0..2usize {
            let out = cluster.dir.path().join(format!("{dtype}-r{h}{k}.json"));
            let mut cmd = Command::new(PYTHON);
            cmd.arg(example())
                .args(task)
                .args(["--dtype", dtype, "--budget", "0"])
                .args(["--rank", &(h * 2 + k).to_string(), "--world-size", "4"])
                .args(["--master-addr", "127.0.0.1", "--master-port", &port.to_string()])
                .arg("--socket")
                .arg(&cluster.daemons[h].socket)
                .args(["--job", &JOB.to_string(), "--local-rank", &k.to_string(), "--local-world", "2"])
                .arg("--out")
                .arg(&out)
                .env("DLCP_LIB", lib);
            ranks.spawn(h * 2 + k, cmd, cluster.dir.path().join(format!("{dtype}-r{h}{k}.log")));
            outs.push(out);
        }
    }
    for f in ranks.wait_all(Duration::from_secs(3600)) {
        assert!(
            f.ok,
            "{dtype} rank {} failed:\n{}\n--- daemon log ---\n{}",
            f.rank,
            f.output,
            cluster.log(0)
        );
    }
    outs.iter().map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()).collect()
}

/// Both runs' checks: identical replicas, every bucket a dlcp op of the
/// run's type delivered whole. Returns (f32, bf16) final accuracies.
fn compare(lib: &std::path::Path, task: &[&str]) -> (f64, f64) {
    let f32_run = train(lib, "f32", task);
    let bf16_run = train(lib, "bf16", task);
    for (dtype, res) in [("f32", &f32_run), ("bf16", &bf16_run)] {
        let digests: Vec<&str> = res.iter().map(|r| r["params_sha256"].as_str().unwrap()).collect();
        assert!(digests.iter().all(|d| *d == digests[0]), "{dtype}: replicas differ: {digests:?}");
        assert_eq!(res[0]["dtype"], dtype);
        for r in res {
            let reports = r["reports"].as_array().unwrap();
            assert!(!reports.is_empty(), "{dtype}: no dlcp ops");
            for x in reports {
                assert_eq!(x["delivered"].as_f64(), Some(1.0), "budget 0 delivers everything: {x}");
                let name = x["tensor"].as_str().unwrap();
                assert_eq!(name.ends_with(".bfloat16"), dtype == "bf16", "{dtype}: bucket tensor {name}");
            }
        }
    }
    let acc = |res: &[serde_json::Value]| res[0]["final_acc"].as_f64().unwrap();
    (acc(&f32_run), acc(&bf16_run))
}

#[test]
fn ddp_hook_bf16_buckets_train_as_well_as_f32() {
    let Some(lib) = prerequisites() else { return };
    let (a32, a16) = compare(&lib, &["--task", "digits", "--epochs", EPOCHS]);
    eprintln!(
        "digits, {EPOCHS} epochs, 2 daemons x 2 trainers, budget 0: f32 accuracy {a32:.4}, bf16 accuracy {a16:.4}"
    );
    assert!(
        a32 > 0.5 && a16 > 0.5,
        "{EPOCHS} epochs should reach > 50% (chance: 10%): f32 {a32}, bf16 {a16}"
    );
    assert!((a32 - a16).abs() <= 0.05, "bf16 accuracy {a16:.4} is not within 5 points of f32's {a32:.4}");
}

/// The same comparison on MNIST-1D (bench record, not CI: about ten
/// minutes on two cores). Steps from `DLCP_BF16_STEPS` (default 300).
#[test]
#[ignore]
fn mnist1d_bf16_against_f32() {
    let Some(lib) = prerequisites() else { return };
    let steps = std::env::var("DLCP_BF16_STEPS").unwrap_or_else(|_| "300".into());
    let (a32, a16) = compare(&lib, &["--task", "mnist1d", "--steps", &steps]);
    eprintln!(
        "mnist1d, {steps} steps, 2 daemons x 2 trainers, budget 0: f32 accuracy {a32:.4}, bf16 accuracy {a16:.4}"
    );
    assert!(a32 > 0.5 && a16 > 0.5, "f32 {a32}, bf16 {a16}");
}
