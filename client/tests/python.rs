//! The Python package as a real, separate trainer process (Debian's
//! `/usr/bin/python3` with `python3-numpy`) against the fake reducer (see
//! `common`): `client/python/tests/test_client.py` and `examples/numpy_allreduce.py`.
//!
//! Without numpy the tests fail under `DLCP_REQUIRE_PYTHON=1` / `DLCP_CI=1` and
//! are reported as skipped otherwise (the workspace's `tests/prereq`).

mod common;
#[path = "../../tests/prereq/mod.rs"]
mod prereq;

use std::path::Path;
use std::process::{Command, Output};

use common::{FakeReducer, lib_dir, workspace_root};

const PYTHON: &str = "/usr/bin/python3";

/// True if `/usr/bin/python3` can import numpy; otherwise `prereq::skip` (a
/// failure under `DLCP_REQUIRE_PYTHON=1` / `DLCP_CI=1`).
fn python_ready() -> bool {
    let ok = Command::new(PYTHON)
        .args(["-c", "import numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        prereq::skip(
            prereq::Prereq::Python,
            &format!("{PYTHON} cannot import numpy (apt-get install -y python3-numpy)"),
        );
    }
    ok
}

fn python(script: &Path, args: &[&str], socket: &Path) -> Output {
    let root = workspace_root();
    // A second server, for job 7 only: the wrong-job rejection.
    let job7 = FakeReducer::for_job(7);
    Command::new(PYTHON)
        .arg(script)
        .args(args)
        .env("DLCP_LIB", lib_dir().join("libdlcp_client.so"))
        .env("DLCP_TEST_SOCKET", socket)
        .env("DLCP_TEST_JOB7_SOCKET", job7.socket())
        // attach()'s defaults come from these: the tests set them themselves.
        .env_remove("DLCP_SOCKET")
        .env_remove("DLCP_JOB")
        .env_remove("LOCAL_RANK")
        .env_remove("LOCAL_WORLD_SIZE")
        .env("PYTHONPATH", root.join("client/python"))
        // Keep __pycache__ out of the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(&root)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!("{}\n--- stderr ---\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn python_package_tests_pass_in_a_separate_process() {
    if !python_ready() {
        return;
    }
    let fake = FakeReducer::start();
    let script = workspace_root().join("client/python/tests/test_client.py");
    let out = python(&script, &["-v"], fake.socket());
    let t = text(&out);
    assert!(out.status.success(), "python tests failed:\n{t}");
    assert!(t.contains("\nOK"), "{t}");
    assert!(!t.contains("skipped"), "{t}");
    // 7 allreduces, and 3 dtypes x (reduce-scatter, allgather, broadcast) + a barrier.
    assert_eq!(fake.served(), 17, "ops the fake reducer doubled for the Python trainer");
    eprintln!("{t}");
}

#[test]
fn numpy_example_trains() {
    if !python_ready() {
        return;
    }
    let fake = FakeReducer::start();
    let script = workspace_root().join("examples/numpy_allreduce.py");
    let sock = fake.socket().to_str().unwrap();
    // The fake reducer doubles each gradient, i.e. it is the sum over two identical
    // trainers: with --world-size 2 the average is this trainer's own gradient.
    let out = python(
        &script,
        &["--socket", sock, "--steps", "30", "--world-size", "2", "--lr", "0.2"],
        fake.socket(),
    );
    let t = text(&out);
    assert!(out.status.success(), "example failed:\n{t}");
    let losses: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split("loss ").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(losses.len(), 30, "{t}");
    assert!(losses[29] < losses[0] * 0.5, "loss should fall: {losses:?}");
    assert_eq!(fake.served(), 60);
}
