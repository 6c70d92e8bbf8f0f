//! The `dlcp.torch` DDP hook against real `dlcpd` processes on loopback
//! (`examples/ddp_train.py` ranks as separate Python processes):
//! - several trainers per host: 2 daemons × 2 trainers, budget 0, train, every
//!   rank reports the same ops, each delivered in full, identical parameters;
//! - failure semantics: no daemon → the attach error names the op and the
//!   socket; a daemon killed mid-training → every rank's `backward()` raises a
//!   `DlcpHookError` naming the bucket, step and op and the reason (daemon gone,
//!   or the op's timeout on the surviving host), within a bound (no hang).
//!
//! Needs Debian's python3-torch and python3-sklearn: without them the tests fail
//! under `DLCP_REQUIRE_TORCH=1` / `DLCP_CI=1` and are reported as skipped
//! otherwise (see `tests/prereq`).

mod daemon_common;
mod prereq;
mod python_common;
mod torch_common;

use std::net::TcpListener;
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
        .args(["--world-size", "1", "--master-addr", "127.0.0.1"])
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
    for f in &done {
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
    eprintln!("both ranks raised within {took:?} of the daemon's death (hard timeout 2 s)");
}
