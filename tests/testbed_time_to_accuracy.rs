//! The time-to-accuracy bench's CI smoke run: `bench/time_to_accuracy.py
//! --smoke` on the emulated cluster of `scripts/testbed.sh` (4 hosts, clean,
//! MTU 1500) trains DDP on MNIST-1D (4.4 M parameters, 40 steps, one seed) with
//! Gloo (cubic) and with dlcp (the asynchronous hook, budget 1%, real `dlcpd`
//! per host) against a fixed target of 20% (chance is 10%). Asserts that:
//! - both runs finished, trained really (the final test accuracy is above 15%,
//!   100 of 2,000 test samples beyond chance, and above the first evaluation's)
//!   and kept the replicas bit-identical;
//! - the results JSON has the time-to-accuracy fields (target, time to target,
//!   reached, the accuracy-against-time curve) and the per-step breakdown
//!   (compute and exposed communication), and the dlcp run's gradients went
//!   through dlcp (per-bucket reports);
//! - the markdown and the plot were written.
//!
//! Needs root and network namespaces, Debian's python3-torch and the mnist1d
//! package (scripts/test.sh installs both); without them it fails under
//! `DLCP_REQUIRE_NETNS=1` / `DLCP_REQUIRE_TORCH=1` / `DLCP_CI=1` and is reported
//! as skipped otherwise (see `tests/prereq`).

mod prereq;
mod python_common;
mod testbed_common;
mod torch_common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use prereq::{Prereq, skip};
use testbed_common::{namespaces_available, testbed};
use torch_common::{PYTHON, prerequisites};

const PREFIX: &str = "ttas";

/// Takes the testbed down when the test ends, even if the bench was killed.
struct Down;

impl Drop for Down {
    fn drop(&mut self) {
        testbed(PREFIX, &["down"]);
    }
}

#[test]
fn time_to_accuracy_smoke_trains_gloo_and_dlcp_and_reports_time_to_target() {
    let Some(lib) = prerequisites() else { return };
    let mnist1d = Command::new(PYTHON).args(["-c", "import mnist1d.data"]).output();
    if !mnist1d.is_ok_and(|o| o.status.success()) {
        skip(Prereq::Torch, "python3 cannot import mnist1d (pip install --no-deps mnist1d==0.0.2.post1)");
        return;
    }
    if let Err(why) = namespaces_available(PREFIX) {
        skip(Prereq::Netns, &why);
        return;
    }
    let _down = Down;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bindir = Path::new(env!("CARGO_BIN_EXE_dlcpd")).parent().unwrap();
    let out = tempfile::tempdir().unwrap();
    let log = out.path().join("bench.log");
    let mut child = Command::new(PYTHON)
        .arg(root.join("bench/time_to_accuracy.py"))
        .args(["--smoke", "--prefix", PREFIX, "--out"])
        .arg(out.path())
        .arg("--bindir")
        .arg(bindir)
        .arg("--lib")
        .arg(&lib)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(out.path().join("bench.err")).unwrap())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the smoke bench ran over 300 s:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let err = std::fs::read_to_string(out.path().join("bench.err")).unwrap_or_default();
    eprintln!("smoke bench done in {:.1?}:\n{text}{err}", t0.elapsed());
    assert!(status.success(), "bench/time_to_accuracy.py --smoke failed ({status})");

    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("time_to_accuracy-smoke.json")).unwrap(),
    )
    .unwrap();
    let target = doc["target"].as_f64().unwrap();
    assert!((target - 0.2).abs() < 1e-9, "smoke target {target}");
    let runs = doc["runs"].as_array().unwrap();
    let mut names: Vec<&str> = runs.iter().map(|r| r["transport"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["dlcp-b1", "gloo-cubic"], "the smoke runs one Gloo and one dlcp run");
    for r in runs {
        let t = r["transport"].as_str().unwrap();
        assert_eq!(r["ok"], true, "{t}: the run failed: {r}");
        assert_eq!(r["cond"], "clean1500");
        assert_eq!(r["identical_replicas"], true, "{t}: replicas differ");
        let curve = r["curve"].as_array().unwrap();
        assert!(curve.len() >= 3, "{t}: {} evaluations", curve.len());
        let acc = |e: &serde_json::Value| e["acc"].as_f64().unwrap();
        let (first, last) = (acc(&curve[0]), r["final_acc"].as_f64().unwrap());
        assert!(last > 0.15, "{t}: final accuracy {last}: not above chance (0.10)");
        assert!(last > first, "{t}: accuracy did not rise ({first} -> {last})");
        let times: Vec<f64> = curve.iter().map(|e| e["time"].as_f64().unwrap()).collect();
        assert!(times.windows(2).all(|w| w[1] > w[0]), "{t}: the training clock does not advance: {times:?}");
        // The time-to-accuracy fields: the first evaluation at or above the target.
        assert_eq!(r["target"].as_f64(), Some(target), "{t}: {r}");
        let reached = r["reached_target"].as_bool().unwrap();
        let tta = r["time_to_target"].as_f64();
        assert_eq!(reached, tta.is_some(), "{t}: reached {reached}, time to target {tta:?}");
        let want = curve.iter().find(|e| acc(e) >= target).map(|e| e["time"].as_f64().unwrap());
        assert_eq!(tta, want, "{t}: time to target is not the first evaluation at or above {target}");
        assert!(reached, "{t}: 40 steps never reached {target}: {curve:?}");
        let clock = r["train_clock"].as_f64().unwrap();
        assert!(tta.unwrap() <= clock, "{t}: time to target {tta:?} past the clock {clock}");
        // The per-step breakdown.
        let (compute, exposed) = (r["compute_ms"].as_f64().unwrap(), r["exposed_ms"].as_f64().unwrap());
        assert!(compute > 0.0 && exposed >= 0.0, "{t}: compute {compute} ms, exposed {exposed} ms");
        assert!(r["step_ms"].as_f64().unwrap() >= compute, "{t}: step shorter than its compute");
        if t == "dlcp-b1" {
            assert!(r["ops"].as_u64().unwrap() >= 40, "dlcp: {} bucket reports for 40 steps", r["ops"]);
            // The daemons' flow-control counters, summed over the four: every
            // daemon received DATA, so credit was granted (GRANT packets or
            // piggybacked on DATA).
            let flow = &r["daemon_flow"];
            let n =
                |k: &str| flow[k].as_u64().unwrap_or_else(|| panic!("dlcp: no {k} in daemon_flow: {flow}"));
            assert!(n("grants_sent") + n("credit_piggybacked") > 0, "dlcp: no credit given: {flow}");
            n("window_cuts");
            // The datapath counters, summed likewise: the four daemons sent
            // and received the allreduces' datagrams (17.4 MB of gradients a
            // step, each datagram at most 1,372 payload bytes at MTU 1500), in
            // fewer system calls than datagrams, and GSO messages of one or
            // more datagrams (bench/step_ab.py's ratios).
            let dp = &r["daemon_datapath"];
            let d =
                |k: &str| dp[k].as_f64().unwrap_or_else(|| panic!("dlcp: no {k} in daemon_datapath: {dp}"));
            let floor = 40.0 * 17.4e6 / 1372.0;
            assert!(d("tx_datagrams") > floor && d("rx_datagrams") > floor, "dlcp: too few datagrams: {dp}");
            assert!(d("tx_syscalls") > 0.0 && d("tx_syscalls") < d("tx_datagrams"), "dlcp: {dp}");
            assert!(d("rx_syscalls") > 0.0 && d("rx_syscalls") < d("rx_datagrams"), "dlcp: {dp}");
            assert!(
                d("gso_segments") >= d("gso_messages") && d("gso_segments") <= d("tx_datagrams"),
                "dlcp: {dp}"
            );
        } else {
            assert!(r.get("daemon_flow").is_none(), "{t}: daemon counters for a Gloo run");
            assert!(r.get("daemon_datapath").is_none(), "{t}: datapath counters for a Gloo run");
        }
        eprintln!(
            "{t}: final accuracy {:.2}%, time to 20% {:.1} s, clock {clock:.1} s, compute {compute:.0} ms/step, \
             exposed communication {exposed:.0} ms/step",
            100.0 * last,
            tta.unwrap()
        );
    }
    let md = std::fs::read_to_string(out.path().join("time_to_accuracy-smoke.md")).unwrap();
    assert!(md.contains("time to target") && md.contains("dlcp budget 1%"), "markdown:\n{md}");
    assert!(out.path().join("time_to_accuracy-smoke_curves.png").exists(), "no plot");
}

/// The report's rule for a run that reaches the target only at its first
/// evaluation past the time cap (a run stops there): not reached, in the run's
/// record and in the median. Until session 45 `time_to` took any evaluation,
/// and the grid counted two congested-port runs (928.8 and 946.8 s against a
/// 900 s cap) as reaching the target. Needs only python3.
#[test]
fn time_to_target_ignores_evaluations_past_the_cap() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = r#"
import sys
sys.path.insert(0, sys.argv[1])
import time_to_accuracy as t
curve = [{"time": 450.0, "acc": 0.80}, {"time": 899.0, "acc": 0.85}, {"time": 946.8, "acc": 0.90}]
late = {"curve": curve}
early = {"curve": [{"time": 300.0, "acc": 0.90}]}
print(t.time_to(curve, 0.89, 900.0), t.time_to(curve, 0.89, 1000.0), t.time_to(curve, 0.84, 900.0))
print(t.median_tta([late, late, early], 0.89, 900.0), t.median_tta([early, early, late], 0.89, 900.0))
"#;
    let out = Command::new(PYTHON)
        .args(["-c", script])
        .arg(root.join("bench"))
        .stderr(Stdio::inherit())
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "python3 failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines, ["None 946.8 899.0", "None 300.0"], "time_to / median_tta with a 900 s cap");
}
