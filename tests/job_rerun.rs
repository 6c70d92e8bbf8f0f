//! Jobs rerun cleanly (issues 15 and 17): the same two-trainer job (two
//! daemons on loopback, one Python trainer each, `examples/numpy_allreduce.py`
//! with budget 0, default timers) runs twice back to back — the second
//! started as soon as the first ends, well inside the linger time during
//! which the first run's op ids are remembered — then once with a trainer
//! killed mid-training (and its partner stopped, as a launcher does), then
//! again. Every complete run succeeds and ends with the same final weights
//! (the job is deterministic and exact), and each run is agreed under a new
//! run id.
//!
//! Needs Debian's `/usr/bin/python3` with `python3-numpy` and a
//! `libdlcp_client.so` of this profile; skipped otherwise unless
//! `DLCP_REQUIRE_PYTHON=1` / `DLCP_CI=1` (see `tests/prereq`).

mod daemon_common;
mod prereq;
mod python_common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use daemon_common::*;
use python_common::{PYTHON, numpy_and_client_lib};

const HOSTS: u32 = 2;
const STEPS: usize = 8;

fn trainer(cluster: &Cluster, lib: &Path, h: u32, steps: usize) -> Child {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    Command::new(PYTHON)
        .arg(root.join("examples/numpy_allreduce.py"))
        .arg("--socket")
        .arg(&cluster.daemons[h as usize].socket)
        .args(["--job", &JOB.to_string(), "--local-rank", "0", "--local-world", "1"])
        .args(["--steps", &steps.to_string(), "--budget", "0", "--lr", "0.2"])
        .env("DLCP_LIB", lib)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Run the job once to completion; every trainer's final-weights digest.
fn run_job(cluster: &Cluster, lib: &Path) -> Vec<String> {
    let children: Vec<Child> = (0..HOSTS).map(|h| trainer(cluster, lib, h, STEPS)).collect();
    children
        .into_iter()
        .enumerate()
        .map(|(h, child)| {
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let all = format!("{stdout}\n--- stderr ---\n{}", String::from_utf8_lossy(&out.stderr));
            assert!(
                out.status.success(),
                "trainer {h} failed:\n{all}\n--- daemon log ---\n{}",
                cluster.log(h as u32)
            );
            assert!(stdout.contains("delivered 1.0000"), "budget 0 delivers everything:\n{all}");
            let digest =
                stdout.lines().find_map(|l| l.strip_prefix("final weights sha256 ")).map(str::to_owned);
            digest.unwrap_or_else(|| panic!("no digest:\n{all}"))
        })
        .collect()
}

/// The run id daemon 0 agreed for its current run, once agreed.
fn agreed_run(cluster: &Cluster) -> Option<String> {
    cluster.status(0)["run"]["id"].as_str().map(str::to_owned)
}

#[test]
fn a_job_reruns_at_once_and_after_a_trainer_was_killed_mid_training() {
    let Some(lib) = numpy_and_client_lib() else { return };
    // The default hard timeout, so ops linger (and their ids are remembered) as long as in production.
    let cluster = Cluster::start(&Options { hosts: HOSTS, hard_timeout_ms: 10_000, ..Options::default() });

    let first = run_job(&cluster, &lib);
    assert!(first.iter().all(|d| *d == first[0]), "replicas drifted apart: {first:?}");
    let t_end = Instant::now();
    // The second run starts at once: the first run's op ids are still
    // remembered (linger, 10 s by default); a new run never collides with them.
    let second = run_job(&cluster, &lib);
    assert!(t_end.elapsed() < Duration::from_secs(10), "the rerun should start within the linger time");
    assert_eq!(second, first, "the same exact job gives the same weights");

    // A third run: trainer 1 is killed while training; trainer 0, stuck in
    // an op with it, is stopped as a launcher stops the rest of the job.
    let mut victims: Vec<Child> = (0..HOSTS).map(|h| trainer(&cluster, &lib, h, 10_000)).collect();
    let stdout = victims[1].stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let started = Instant::now();
    loop {
        let line = lines.next().expect("trainer 1 ended before training").unwrap();
        if line.starts_with("step  20") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "trainer 1 never reached step 20");
    }
    let during = agreed_run(&cluster);
    victims[1].kill().unwrap();
    victims[1].wait().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    victims[0].kill().unwrap();
    victims[0].wait().unwrap();

    let fourth = run_job(&cluster, &lib);
    assert_eq!(fourth, first, "after the killed run, the job runs exactly again");
    let after = agreed_run(&cluster);
    // Daemon 0's trainer has detached: status shows no run; the run during
    // the killed job was agreed under an id of its own.
    assert!(during.is_some(), "the killed run was agreed");
    assert!(after.is_none(), "no trainer attached, no run: {after:?}");
    let log = cluster.log(0);
    let begins = log.matches("begins (first trainer attached)").count();
    let ends = log.matches("ends (last trainer detached)").count();
    assert_eq!((begins, ends), (4, 4), "four runs begin and end on daemon 0:\n{log}");
}
