//! What a trainer learns from real `dlcpd` processes, in Python and in C: its
//! place in the job (global rank and world size from the attach reply), and
//! for a failed op the daemon's reason — the descriptor field it rejected, the
//! ranks a timeout waited on — in the text the trainer receives
//! (`OpFailedError`'s message, `dlcp_last_error`).
//!
//! Two daemons on loopback with a 1 s hard timeout; the trainers attach to
//! daemon 0 and nobody submits on daemon 1, so daemon 0's op times out waiting
//! on rank 1.
//!
//! Needs Debian's `/usr/bin/python3` with `python3-numpy`, `cc`, and
//! `libdlcp_client.so` built for the same profile as this test
//! (`cargo build [--release] -p dlcp-client`); without them the test fails under
//! `DLCP_REQUIRE_PYTHON=1` / `DLCP_CI=1` and is reported as skipped otherwise.

mod daemon_common;
mod prereq;
mod python_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use daemon_common::*;
use python_common::{PYTHON, numpy_and_client_lib};

/// A trainer in Python: prints its world and, in mode "all", the messages of
/// a rejected descriptor (layer count above the daemon's limit) and of a
/// timed-out op.
const PY_TRAINER: &str = r#"
import sys
import numpy as np
import dlcp

sock, job, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with dlcp.attach(sock, job=job, local_rank=0, local_world=1) as c:
    w = c.world
    print(f"world rank {w.rank} size {w.size} node {w.node_rank}/{w.nodes} local {w.local_rank}/{w.local_world}")
    assert (c.rank, c.world_size) == (w.rank, w.size)
    if mode == "all":
        g = c.tensor("grad", 1024)
        g[:] = np.arange(1024, dtype=np.float32)
        for what, kw in (("descriptor", dict(layers=1 << 20)), ("timeout", dict(timeout=60))):
            try:
                c.allreduce(g, budget=0, **kw)
                sys.exit(f"{what}: the op succeeded")
            except dlcp.OpFailedError as e:
                print(f"{what} status {e.status}: {e}", flush=True)
"#;

fn output(what: &str, out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn python(lib: &Path, socket: &Path, mode: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(PYTHON)
        .args(["-c", PY_TRAINER])
        .arg(socket)
        .args([&JOB.to_string(), mode])
        .env("DLCP_LIB", lib)
        .env("PYTHONPATH", root.join("client/python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    output(&format!("python trainer ({mode})"), &out)
}

/// Compiles `tests/c/trainer_errors.c` against `dlcp.h` and the library in `lib_dir`.
fn build_c(lib_dir: &Path, out: &Path) -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = out.join("trainer_errors");
    let r = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
        .arg(root.join("client/include"))
        .arg(root.join("tests/c/trainer_errors.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(lib_dir)
        .args(["-ldlcp_client", &format!("-Wl,-rpath,{}", lib_dir.display())])
        .output()
        .map_err(|e| format!("cc: {e}"))?;
    if !r.status.success() {
        return Err(format!("cc failed:\n{}", String::from_utf8_lossy(&r.stderr)));
    }
    Ok(exe)
}

fn c_trainer(exe: &Path, socket: &Path, mode: &str) -> String {
    let out = Command::new(exe)
        .arg(socket)
        .args([&JOB.to_string(), mode])
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    output(&format!("C trainer ({mode})"), &out)
}

/// Waits until daemon `r` has noticed that its trainers left (local rank 0 is free again).
fn wait_detached(cluster: &Cluster, r: u32) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if cluster.stats(r).is_ok_and(|s| s["trainers"] == 0) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("daemon {r} still counts trainers: {:?}", cluster.stats(r));
}

fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix:?} line in:\n{out}"))
}

#[test]
fn failures_reach_python_and_c_trainers_with_their_reasons() {
    let Some(lib) = numpy_and_client_lib() else { return };
    let cluster = Cluster::start(&Options { hosts: 2, hard_timeout_ms: 1000, ..Options::default() });
    let exe = build_c(lib.parent().unwrap(), cluster.dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let (d0, d1) = (&cluster.daemons[0].socket, &cluster.daemons[1].socket);

    // Global rank and world size: one trainer per host on 2 daemons.
    let world1 = "world rank 1 size 2 node 1/2 local 0/1";
    assert_eq!(line(&python(&lib, d1, "world"), "world"), world1);
    wait_detached(&cluster, 1);
    assert_eq!(line(&c_trainer(&exe, d1, "world"), "world"), world1);

    // Python on daemon 0: the rejected field, then the rank waited on.
    let py = python(&lib, d0, "all");
    assert_eq!(line(&py, "world"), "world rank 0 size 2 node 0/2 local 0/1");
    let desc = line(&py, "descriptor");
    assert!(desc.starts_with("descriptor status invalid_descriptor: allreduce: op "), "{py}");
    assert!(desc.contains("field layers: layer count 1048576 is not in 1..=65536"), "{py}");
    let timeout = line(&py, "timeout");
    assert!(timeout.starts_with("timeout status timeout: allreduce: op "), "{py}");
    assert!(timeout.contains("completed with status timeout"), "{py}");
    assert!(timeout.contains("waiting on ranks [1]"), "{py}\n--- daemon 0 ---\n{}", cluster.log(0));

    // The same from C, in dlcp_last_error.
    wait_detached(&cluster, 0);
    let c = c_trainer(&exe, d0, "all");
    let desc = line(&c, "descriptor");
    assert!(desc.starts_with("descriptor rc -13 status 1: dlcp_allreduce: op "), "{c}");
    assert!(desc.contains("field budget_ppm: loss budget 200000 ppm exceeds the cap 100000 ppm"), "{c}");
    let timeout = line(&c, "timeout");
    assert!(timeout.starts_with("timeout rc -13 status 2: dlcp_allreduce: op "), "{c}");
    assert!(timeout.contains("waiting on ranks [1]"), "{c}\n--- daemon 0 ---\n{}", cluster.log(0));
    eprintln!("python:\n{py}C:\n{c}");
}
