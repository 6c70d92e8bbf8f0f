//! `dlcpctl` against a running daemon (status, peers, stats, --json) and
//! against none: a missing socket, a stale one, one it may not open.

mod daemon_common;

use std::path::Path;
use std::process::Command;

use daemon_common::*;

fn dlcpctl(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dlcpctl")).arg("--socket").arg(socket).args(args).output().unwrap()
}

fn text(o: &std::process::Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn status_peers_and_stats_against_a_running_daemon() {
    let mut c = Cluster::start(&Options { hosts: 3, late: vec![2], ..Options::default() });
    let s0 = c.daemons[0].socket.clone();
    // Wait until rank 1 is up and rank 2 (never started) is not.
    let t0 = std::time::Instant::now();
    loop {
        let o = dlcpctl(&s0, &["peers", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        if v[1]["up"] == true {
            assert_eq!(v[2]["up"], false);
            assert_eq!(v[0]["self"], true);
            assert!(v[1]["rx_packets"].as_u64().unwrap() > 0, "{v}");
            break;
        }
        assert!(t0.elapsed().as_secs() < 10, "rank 1 never up: {v}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = dlcpctl(&s0, &["status"]);
    assert!(o.status.success());
    let (out, _) = text(&o);
    assert!(out.starts_with(&format!("dlcpd {}", dlcp::VERSION)), "{out}");
    assert!(out.contains("rank 0 of 3, job 7"), "{out}");
    assert!(out.contains("datapath: socket (udp 127.0.0.1:"), "{out}");
    assert!(out.contains("configured kind: auto — datapaths: socket (always)"), "{out}");
    assert!(out.contains(&format!("peers: 1/2 up; down: 2 (127.0.0.1:{})", c.ports[2])), "{out}");
    assert!(out.contains("trainers attached: 0"), "{out}");
    assert!(out.contains("metrics: http://127.0.0.1:"), "{out}");
    assert!(out.contains("reloads: 0 ok, 0 rejected"), "{out}");
    let o = dlcpctl(&s0, &["peers"]);
    let (out, _) = text(&o);
    let rows: Vec<&str> = out.lines().collect();
    assert!(rows[0].contains("rank") && rows[0].contains("state"), "{out}");
    assert!(rows[1].contains(" self ") && rows[2].contains(" up ") && rows[3].contains(" DOWN "), "{out}");
    let o = dlcpctl(&s0, &["stats"]);
    let (out, _) = text(&o);
    assert!(out.contains("ops: 0 started, 0 completed, 0 failed"), "{out}");
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("7 ") && l.split_whitespace().nth(1) != Some("0")),
        "class 7 heartbeats: {out}"
    );
    let o = dlcpctl(&s0, &["stats", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["protocol"]["tx_packets_per_class"][7].as_u64().unwrap() > 0);
    // Once rank 2 starts, it is up.
    c.spawn(2, 0.0);
    c.wait_ready(2);
}

#[test]
fn helpful_errors_without_a_daemon() {
    let dir = tempfile::tempdir().unwrap();
    // No socket at all.
    let missing = dir.path().join("nothing.sock");
    let o = dlcpctl(&missing, &["status"]);
    assert_eq!(o.status.code(), Some(2));
    let (_, err) = text(&o);
    assert!(
        err.contains("nothing.sock.admin: no such socket — is dlcpd running with control.socket_path ="),
        "{err}"
    );
    // A directory that does not exist is named.
    let o = dlcpctl(&dir.path().join("gone/d.sock"), &["stats"]);
    assert!(text(&o).1.contains("does not exist either"), "{}", text(&o).1);
    // A stale socket file: nobody listening.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(dlcp::service::admin_path(&stale)).unwrap());
    let o = dlcpctl(&stale, &["reload"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).1.contains("connection refused — dlcpd is not running (a stale socket file"),
        "{}",
        text(&o).1
    );
}

#[test]
fn helpful_error_when_the_socket_is_not_accessible() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = dir.path().join("d.sock");
    let admin = dlcp::service::admin_path(&sock);
    let _l = std::os::unix::net::UnixListener::bind(&admin).unwrap();
    std::fs::set_permissions(&admin, std::fs::Permissions::from_mode(0o600)).unwrap();
    let root = rustix::process::getuid().is_root();
    let o = if root {
        // root passes permission checks: ask as nobody (setpriv, util-linux), with
        // a copy of dlcpctl nobody can reach (the build tree may be under /root).
        let exe = dir.path().join("dlcpctl");
        std::fs::copy(env!("CARGO_BIN_EXE_dlcpctl"), &exe).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe)
            .arg("--socket")
            .arg(&sock)
            .arg("status")
            .output()
            .unwrap()
    } else {
        std::fs::set_permissions(&admin, std::fs::Permissions::from_mode(0o000)).unwrap();
        dlcpctl(&sock, &["status"])
    };
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("permission denied — run as the daemon's user (dlcp), root, or a member"), "{err}");
}
