//! A hostile local user against real daemons, with default timers (issue 15,
//! holes 1, 2, 5 and 8): idle admin and silent control connections must not
//! freeze the event loop, a member of the socket's group reads but cannot
//! reload, an attach for another job or beyond the attachment limit costs no
//! shared memory, an oversized tensor is refused naming the limit, secrets
//! others may read are refused, and a silent metrics client holds up no scrape.

mod daemon_common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use daemon_common::*;
use dlcp::shm::{AttachError, RejectReason, Status, SubmitOptions, TrainerChannel};

/// A cluster like [`Cluster::start`], with each rank's configuration passed
/// through `edit` first.
fn start_with(hosts: u32, edit: impl Fn(String) -> String) -> Cluster {
    let dir = tempfile::Builder::new().prefix("dlcp-adversary-").tempdir().unwrap();
    let ports = free_ports(hosts as usize, false);
    let mut c = Cluster { dir, daemons: Vec::new(), ports };
    let o = Options { hosts, ..Options::default() };
    for r in 0..hosts {
        let socket = c.dir.path().join(format!("d{r}.sock"));
        let config = c.dir.path().join(format!("d{r}.toml"));
        write_config(&config, &edit(config_text(r, &c.ports, &socket, &o)));
        let log = c.dir.path().join(format!("d{r}.log"));
        c.daemons.push(Daemon { rank: r, config, socket, child: None, log });
        c.spawn(r, 0.0);
    }
    for r in 0..hosts {
        c.wait_ready(r);
    }
    c
}

/// One admin request straight over the socket (no dlcpctl process).
fn admin(socket: &Path, request: &str) -> serde_json::Value {
    let mut s = UnixStream::connect(dlcp::service::admin_path(socket)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

fn pid(c: &Cluster, r: u32) -> u32 {
    c.daemons[r as usize].child.as_ref().unwrap().id()
}

/// The daemon's shared-memory segments: (how many memfds it holds, their bytes).
fn segments(pid: u32) -> (usize, u64) {
    let mut n = (0, 0);
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else { continue };
        if target.to_string_lossy().starts_with("/memfd:dlcp-seg") {
            n.0 += 1;
            n.1 += std::fs::metadata(e.path()).map(|m| m.len()).unwrap_or(0);
        }
    }
    n
}

/// Polls `f` until it is true, at most `within`.
fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// One allreduce of `x` from a trainer on `socket` (local world 1): status,
/// result and how long the op took from submit to completion.
fn allreduce(socket: &Path, seq: u64, x: &[f32]) -> (Status, Vec<f32>, Duration) {
    let mut cl = TrainerChannel::attach(socket, u64::from(JOB), 0, 1).unwrap();
    let t = cl.alloc("g", x.len() as u64).unwrap();
    cl.write(&t, x).unwrap();
    cl.set_next_op_seq(seq);
    let t0 = Instant::now();
    cl.submit(&t, SubmitOptions { tensor_id: 1, budget_ppm: 0, ..Default::default() }).unwrap();
    let done = cl.wait_completion(Duration::from_secs(30)).expect("a completion");
    let took = t0.elapsed();
    (done.status, cl.read(&t).unwrap(), took)
}

#[test]
fn idle_admin_and_silent_control_connections_delay_neither_heartbeats_nor_an_allreduce() {
    let c = start_with(2, |t| t);
    let (s0, s1) = (c.daemons[0].socket.clone(), c.daemons[1].socket.clone());
    assert!(eventually(Duration::from_secs(10), || admin(&s1, "status")["peers"][0]["up"] == true));
    // The attacker: 50 admin connections and one control connection to daemon
    // 0, all silent, renewed every 2.5 s (past their 2 s deadline).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attacker = {
        let (stop, admin_path) = (stop.clone(), dlcp::service::admin_path(&s0));
        let control = s0.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let held: Vec<UnixStream> =
                    (0..50).filter_map(|_| UnixStream::connect(&admin_path).ok()).collect();
                let silent = UnixStream::connect(&control).unwrap();
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_millis(2500)
                    && !stop.load(std::sync::atomic::Ordering::Relaxed)
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                drop((held, silent));
            }
        })
    };
    // Meanwhile: how daemon 1 hears daemon 0 (heartbeats every 100 ms, and
    // the allreduce's data), polled every few milliseconds.
    let heard = |v: &serde_json::Value| v["protocol"]["rx_packets_per_peer"][0].as_u64().unwrap();
    let x = data(3, 100_000);
    let mut op = None;
    let (mut last, mut last_at, mut worst) = (heard(&admin(&s1, "stats")), Instant::now(), Duration::ZERO);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(6) {
        if op.is_none() && t0.elapsed() > Duration::from_secs(1) {
            let (a, b, x0, x1) = (s0.clone(), s1.clone(), x.clone(), x.clone());
            op = Some((
                std::thread::spawn(move || allreduce(&a, 1, &x0)),
                std::thread::spawn(move || allreduce(&b, 1, &x1)),
            ));
        }
        let now_heard = heard(&admin(&s1, "stats"));
        let now = Instant::now();
        if now_heard != last {
            worst = worst.max(now - last_at);
            (last, last_at) = (now_heard, now);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    worst = worst.max(last_at.elapsed());
    let (h0, h1) = op.unwrap();
    let ((st0, out0, took0), (st1, out1, took1)) = (h0.join().unwrap(), h1.join().unwrap());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    attacker.join().unwrap();
    eprintln!(
        "largest gap in what daemon 1 heard from daemon 0: {worst:?}; allreduce took {took0:?} / {took1:?}"
    );
    // The old loop served each admin connection blocking for up to 200 ms and
    // a silent trainer for 2 s: gaps of seconds.
    assert!(worst < Duration::from_millis(500), "daemon 0 went quiet for {worst:?}");
    assert_eq!((st0, st1), (Status::Ok, Status::Ok));
    assert!(took0 < Duration::from_secs(2) && took1 < Duration::from_secs(2), "{took0:?} {took1:?}");
    let want: Vec<f32> = x.iter().map(|v| v + v).collect();
    assert!(out0 == want && out1 == want, "wrong sum");
    // The caps and deadlines did the work, and said so (once the attacker's
    // connections are gone, the admin socket answers again).
    let mut s = serde_json::Value::Null;
    assert!(eventually(Duration::from_secs(5), || {
        s = admin(&s0, "stats");
        s.get("error").is_none() && s["trainers"] == 0
    }));
    let refused = &s["service"]["connections_refused"];
    assert!(refused["admin_busy"].as_u64().unwrap() >= 34, "{refused}");
    assert!(refused["admin_timeout"].as_u64().unwrap() >= 16, "{refused}");
    assert!(refused["attach_timeout"].as_u64().unwrap() >= 1, "{refused}");
}

/// A copy of dlcpctl another user can run, and `dir` open to everyone.
fn dlcpctl_for_others(dir: &Path) -> PathBuf {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.join("dlcpctl");
    std::fs::copy(env!("CARGO_BIN_EXE_dlcpctl"), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}

#[test]
fn a_member_of_the_socket_group_reads_but_cannot_reload() {
    if !rustix::process::getuid().is_root() {
        eprintln!("skipped: needs root to run dlcpctl as another user (setpriv)");
        return;
    }
    // Sockets in group 65534 (nogroup), mode 0660; the daemon runs as root.
    let c = start_with(1, |t| {
        t.replace("socket_mode = \"0600\"", "socket_mode = \"0660\"\nsocket_group = \"65534\"")
    });
    let exe = dlcpctl_for_others(c.dir.path());
    let sock = c.daemons[0].socket.clone();
    let as_user = |ids: &[&str], args: &[&str]| {
        let o = Command::new("setpriv")
            .args(ids)
            .arg(&exe)
            .arg("--socket")
            .arg(&sock)
            .args(args)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let primary = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    let supplementary = ["--reuid=65534", "--regid=1", "--groups=65534"];
    for ids in [&primary[..], &supplementary[..]] {
        let (code, out, err) = as_user(ids, &["stats", "--json"]);
        assert_eq!(code, Some(0), "{ids:?}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["rank"], 0);
        let (code, _, err) = as_user(ids, &["status"]);
        assert_eq!(code, Some(0), "{ids:?}: {err}");
        let (code, out, err) = as_user(ids, &["reload"]);
        assert_eq!(code, Some(1), "{ids:?}: {out}{err}");
        assert!(
            out.contains("permission denied: reload changes the running daemon and is for its own user (uid 0) and root only; uid 65534 may read"),
            "{ids:?}: {out}"
        );
    }
    // Nothing was reloaded; the daemon's own user (root here) may.
    let s = admin(&sock, "stats");
    assert_eq!(s["service"]["connections_refused"]["admin_denied"], 2, "{}", s["service"]);
    assert_eq!((&s["service"]["reloads_ok"], &s["service"]["reloads_failed"]), (&0.into(), &0.into()));
    let v = admin(&sock, "reload");
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(admin(&sock, "stats")["service"]["reloads_ok"], 1);
}

#[test]
fn an_attach_for_another_job_creates_no_segment_and_names_both_jobs() {
    let c = start_with(1, |t| t);
    let (sock, pid) = (c.daemons[0].socket.clone(), pid(&c, 0));
    let before = segments(pid);
    for _ in 0..10 {
        let e = TrainerChannel::attach(&sock, u64::from(JOB) + 1, 0, 1).unwrap_err();
        assert!(
            matches!(e, AttachError::Rejected(RejectReason::JobMismatch { daemon_job, trainer_job })
                if daemon_job == u64::from(JOB) && trainer_job == u64::from(JOB) + 1),
            "{e:?}"
        );
        let shown = e.to_string();
        assert!(
            shown.contains(&format!("registered for job {} but this daemon serves job {JOB}", JOB + 1)),
            "{shown}"
        );
    }
    assert_eq!(segments(pid), before, "a segment was made for a trainer of another job");
    let s = admin(&sock, "stats");
    assert_eq!((&s["service"]["trainers_refused"], &s["shm"]["attached"]), (&10.into(), &0.into()));
    // The measure sees a real attach.
    let _ok = TrainerChannel::attach(&sock, u64::from(JOB), 0, 1).unwrap();
    assert_eq!(segments(pid).0, before.0 + 1);
}

#[test]
fn attachments_beyond_the_limit_are_refused_and_shared_memory_stays_bounded() {
    const ARENA: u64 = 8 << 20;
    let c = start_with(1, |t| {
        t.replace(
            "[shm]\narena_bytes = 134217728\nmax_tensor_bytes = 134217728\n",
            &format!(
                "[shm]\narena_bytes = {ARENA}\nmax_tensor_bytes = {ARENA}\nearly_buffer_bytes = {ARENA}\nmax_attachments = 4\n"
            ),
        )
    });
    let (sock, pid) = (c.daemons[0].socket.clone(), pid(&c, 0));
    let mut held: Vec<TrainerChannel> =
        (0..4).map(|r| TrainerChannel::attach(&sock, u64::from(JOB), r, 64).unwrap()).collect();
    let (n, bytes) = segments(pid);
    assert_eq!(n, 4);
    for r in 4..40 {
        let e = TrainerChannel::attach(&sock, u64::from(JOB), r, 64).unwrap_err();
        assert!(
            matches!(
                e,
                AttachError::Rejected(RejectReason::TooManyAttachments { limit: 4, per_user: false })
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("already serves 4 attachments, its limit (shm.max_attachments)"),
            "{e}"
        );
    }
    assert_eq!(segments(pid), (n, bytes), "refused attaches cost no shared memory");
    assert!(bytes <= 4 * (ARENA + (1 << 20)), "{bytes}");
    // One leaves; there is room for one more.
    held.remove(0);
    assert!(eventually(Duration::from_secs(5), || admin(&sock, "stats")["trainers"] == 3));
    held.push(TrainerChannel::attach(&sock, u64::from(JOB), 0, 64).unwrap());
    assert_eq!(segments(pid).0, 4);
}

#[test]
fn a_tensor_above_max_tensor_bytes_is_refused_naming_the_limit_and_others_go_on() {
    let c = start_with(2, |t| {
        t.replace(
            "[shm]\narena_bytes = 134217728\nmax_tensor_bytes = 134217728\n",
            "[shm]\narena_bytes = 4194304\nmax_tensor_bytes = 65536\nearly_buffer_bytes = 4194304\n",
        )
    });
    let (s0, s1) = (c.daemons[0].socket.clone(), c.daemons[1].socket.clone());
    let x = data(5, 16_384);
    // Host 1's trainer runs op 2 meanwhile.
    let other = {
        let (s1, x) = (s1.clone(), x.clone());
        std::thread::spawn(move || allreduce(&s1, 2, &x))
    };
    let mut cl = TrainerChannel::attach(&s0, u64::from(JOB), 0, 1).unwrap();
    let big = cl.alloc("big", 262_144).unwrap();
    cl.set_next_op_seq(1);
    cl.submit(&big, SubmitOptions { tensor_id: 9, ..Default::default() }).unwrap();
    let done = cl.wait_completion(Duration::from_secs(10)).unwrap();
    assert_eq!((done.status, done.op_seq), (Status::InvalidDescriptor, 1));
    assert_eq!(done.detail, dlcp::shm::DescError::TensorTooLarge { bytes: 0, max: 0 }.code());
    assert!(
        eventually(Duration::from_secs(5), || c
            .log(0)
            .contains("tensor of 1048576 bytes exceeds the daemon's limit shm.max_tensor_bytes = 65536")),
        "{}",
        c.log(0)
    );
    // The same trainer and the other host's go on.
    let small = cl.alloc("small", x.len() as u64).unwrap();
    cl.write(&small, &x).unwrap();
    cl.set_next_op_seq(2);
    cl.submit(&small, SubmitOptions { tensor_id: 1, ..Default::default() }).unwrap();
    let done = cl.wait_completion(Duration::from_secs(30)).unwrap();
    assert_eq!(done.status, Status::Ok);
    let (st, out, _) = other.join().unwrap();
    assert_eq!(st, Status::Ok);
    let want: Vec<f32> = x.iter().map(|v| v + v).collect();
    assert_eq!(cl.read(&small).unwrap(), want);
    assert_eq!(out, want);
    assert_eq!(admin(&s0, "stats")["service"]["submissions_rejected"], 1);
}

#[test]
fn secrets_others_may_read_are_refused_naming_the_file_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_ports(1, false)[0];
    let body = format!(
        "[[peers]]\nrank = 0\naddress = \"127.0.0.1\"\nport = {port}\n[control]\nsocket_path = \"{}\"\n[metrics]\nenabled = false\n",
        dir.path().join("d.sock").display()
    );
    let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    // dlcpd, killed if it is still running after 10 s (a daemon that accepted the file).
    let dlcpd = |args: &[&str], cfg: &Path| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dlcpd"))
            .args(args)
            .arg(cfg)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while child.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let o = child.wait_with_output().unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    // A group-readable secret file.
    let secret = dir.path().join("job.secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef").unwrap();
    mode(&secret, 0o640);
    let cfg = dir.path().join("file.toml");
    std::fs::write(&cfg, format!("[node]\nrank = 0\njob_id = 1\njob_secret_file = \"job.secret\"\n{body}"))
        .unwrap();
    mode(&cfg, 0o644);
    for args in [&["--config"][..], &["check-config"][..]] {
        let (code, err) = dlcpd(args, &cfg);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.starts_with(&format!("{}:4:19: node.job_secret_file: ", cfg.display())), "{err}");
        assert!(
            err.contains(&format!("{} is accessible by group or others (mode 0640)", secret.display())),
            "{err}"
        );
        assert!(err.contains(&format!("run `chmod 600 {}`", secret.display())), "{err}");
    }
    mode(&secret, 0o600);
    assert_eq!(dlcpd(&["check-config"], &cfg).0, Some(0), "the fix works");
    // An inline secret in a config file everyone may read.
    let inline = dir.path().join("inline.toml");
    std::fs::write(
        &inline,
        format!("[node]\nrank = 0\njob_id = 1\njob_secret = \"0123456789abcdef0123\"\n{body}"),
    )
    .unwrap();
    mode(&inline, 0o644);
    for args in [&["--config"][..], &["check-config"][..]] {
        let (code, err) = dlcpd(args, &inline);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.starts_with(&format!("{}:4:14: node.job_secret: ", inline.display())), "{err}");
        assert!(err.contains("which group or others may access (mode 0644)"), "{err}");
        assert!(err.contains(&format!("run `chmod 600 {}`", inline.display())), "{err}");
    }
    mode(&inline, 0o600);
    assert_eq!(dlcpd(&["check-config"], &inline).0, Some(0), "the fix works");
}

#[test]
fn a_silent_metrics_client_holds_up_no_scrape() {
    let c = start_with(1, |t| t);
    let v = admin(&c.daemons[0].socket, "status");
    let addr = v["ops"]["metrics"]["address"].as_str().unwrap().to_owned();
    // Connect and say nothing; and one that trickles a byte at a time.
    let _silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let mut trickle = TcpStream::connect(&addr).unwrap();
    trickle.write_all(b"G").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..3 {
        let t0 = Instant::now();
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let took = t0.elapsed();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n") && out.contains("dlcp_build_info"), "{out}");
        // The old server read each client in turn with a 2 s timeout.
        assert!(took < Duration::from_secs(1), "a scrape waited {took:?} behind silent clients");
        trickle.write_all(b"E").unwrap();
    }
}
