//! Faults end to end: a trainer killed mid-op, hostile descriptors and
//! datagrams, SIGTERM, a peer daemon killed and restarted. Nothing may hang,
//! crash the daemon, or go uncounted.

mod daemon_common;

use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use daemon_common::*;
use dlcp::shm::{Status, SubmitOptions, TrainerChannel};

const N: usize = 10_000;

/// Entry point of the child trainer process (a no-op in the normal test run).
#[test]
fn child_trainer_entry() {
    let Ok(socket) = std::env::var("DLCP_CHILD_SOCKET") else { return };
    let rank: u32 = std::env::var("DLCP_CHILD_RANK").unwrap().parse().unwrap();
    let _cl = TrainerChannel::attach(&socket, u64::from(JOB), rank, 2).expect("child attach");
    println!("ATTACHED");
    std::thread::sleep(Duration::from_secs(60));
}

fn spawn_child_trainer(socket: &std::path::Path, rank: u32) -> std::process::Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_trainer_entry", "--nocapture", "--test-threads=1"])
        .env("DLCP_CHILD_SOCKET", socket)
        .env("DLCP_CHILD_RANK", rank.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let out = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(out).lines();
    let t0 = Instant::now();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("ATTACHED") => break,
            Some(_) => {}
            None => panic!("child trainer exited before attaching"),
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "child trainer did not attach");
    }
    child
}

fn submit_and_wait(
    cl: &mut TrainerChannel,
    seq: u64,
    tensor: u32,
    x: &[f32],
    timeout: Duration,
) -> (Status, Vec<f32>) {
    let t = cl.alloc(&format!("op{seq}"), x.len() as u64).unwrap();
    cl.write(&t, x).unwrap();
    cl.set_next_op_seq(seq);
    cl.submit(&t, SubmitOptions { tensor_id: tensor, budget_ppm: 0, ..Default::default() }).unwrap();
    let done = cl.wait_completion(timeout).expect("a completion, not a hang");
    let out = cl.read(&t).unwrap();
    cl.free(&t.name).unwrap();
    (done.status, out)
}

#[test]
fn killed_trainer_fails_its_ops_cleanly_and_a_new_trainer_can_attach() {
    let hard = Duration::from_millis(1500);
    let mut c = Cluster::start(&Options { hosts: 2, hard_timeout_ms: 1500, ..Options::default() });
    let s0 = c.daemons[0].socket.clone();
    let s1 = c.daemons[1].socket.clone();
    // Host 0: trainer 0 here, trainer 1 a child process that attaches and is killed
    // before it submits. Host 1: two trainers here.
    let mut child = spawn_child_trainer(&s0, 1);
    let x = data(1, N);
    let h1: Vec<_> = (0..2)
        .map(|k| {
            let s1 = s1.clone();
            let x = x.clone();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&s1, u64::from(JOB), k, 2).unwrap();
                let first = submit_and_wait(&mut cl, 1, 0, &x, Duration::from_secs(30)).0;
                // Op 2 runs after host 0's replacement trainer joins.
                let second = submit_and_wait(&mut cl, 2, 0, &x, Duration::from_secs(30));
                (first, second)
            })
        })
        .collect();
    let mut t0 = TrainerChannel::attach(&s0, u64::from(JOB), 0, 2).unwrap();
    let tensor = t0.alloc("op1", N as u64).unwrap();
    t0.write(&tensor, &x).unwrap();
    t0.set_next_op_seq(1);
    t0.submit(&tensor, SubmitOptions::default()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    child.kill().unwrap();
    child.wait().unwrap();
    let started = Instant::now();
    let done = t0.wait_completion(Duration::from_secs(30)).expect("completion after the other trainer died");
    assert_eq!(done.status, Status::PeerDown, "{done:?}");
    // Why, as the daemon tells the trainer.
    let why = t0.failure_reason(done.op_seq, done.tensor_id).unwrap_or_default();
    assert!(why.starts_with("local rank 1 of this job on this host") && why.contains("detached"), "{why}");
    assert!(started.elapsed() < Duration::from_secs(2), "failure took {:?}", started.elapsed());
    t0.free("op1").unwrap();
    // A replacement trainer attaches as local rank 1; op 2 succeeds everywhere.
    let mut t1 = TrainerChannel::attach(&s0, u64::from(JOB), 1, 2).expect("a new trainer can attach");
    let r = std::thread::spawn(move || submit_and_wait(&mut t1, 2, 0, &data(1, N), Duration::from_secs(30)));
    let (st0, out0) = submit_and_wait(&mut t0, 2, 0, &x, Duration::from_secs(30));
    let (st1, out1) = r.join().unwrap();
    assert_eq!((st0, st1), (Status::Ok, Status::Ok));
    for h in h1 {
        let (first, (second, out)) = h.join().unwrap();
        // Host 1's op 1 could not complete without host 0, which abandoned it
        // when its trainer died and told host 1 so (a failing DONE): a peer-down error.
        assert_eq!(first, Status::PeerDown);
        assert_eq!(second, Status::Ok);
        assert!(out == out0 && out == out1, "ranks disagree on op 2");
    }
    let want: Vec<f32> = x.iter().map(|v| (v + v) + (v + v)).collect();
    assert!(out0.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
    let s = c.stats(0).unwrap();
    // The killed child, and the replacement trainer whose thread has ended.
    assert_eq!(s["service"]["trainers_gone"], 2, "{s}");
    assert_eq!(s["protocol"]["ops_abandoned"], 1, "{s}");
    assert!(s["service"]["ops_failed"].as_u64().unwrap() >= 1);
    let _ = hard;
    c.kill(0, 15);
    assert_eq!(
        c.wait_exit(0, Duration::from_secs(10)).map(|s| s.code()),
        Some(Some(0)),
        "SIGTERM must exit 0"
    );
}

#[test]
fn garbage_descriptors_and_random_datagrams_are_counted_and_service_continues() {
    let c = Cluster::start(&Options { hosts: 2, ..Options::default() });
    // Random datagrams, and datagrams that look like dlcp but carry a bad tag.
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut x = 0x1234_5678_9abc_def0u64;
    for i in 0..2000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = 1 + (x % 1500) as usize;
        let mut d: Vec<u8> = (0..len).map(|j| (x >> (j % 56)) as u8).collect();
        if i % 2 == 0 && len > 80 {
            d[0] = 0xD1;
            d[1] = 0xC9;
            d[2] = 1;
        }
        udp.send_to(&d, ("127.0.0.1", c.ports[(i % 2) as usize])).unwrap();
    }
    // Garbage descriptors straight into host 0's submission ring.
    let mut bad = TrainerChannel::attach(&c.daemons[0].socket, u64::from(JOB), 0, 1).unwrap();
    // (offset, length): length overflow, offset at the end of the address space, offset far past the arena.
    for (i, (offset, len)) in [(0u64, u64::MAX / 4), (u64::MAX - 8, 16), (1 << 40, 1)].into_iter().enumerate()
    {
        let d = dlcp::shm::SubmitDesc {
            op_seq: 100 + i as u64,
            cookie: 0,
            arena_offset: offset,
            len_elems: len,
            tensor_id: 7,
            layer: 0,
            layers: 1,
            budget_ppm: 0,
            flags: 0,
            dtype: 0,
            opcode: 1,
            reduce: 0,
            reserved: [0; 3],
            root: 0,
        };
        bad.debug_submit_raw(&d).unwrap();
        let done = bad.wait_completion(Duration::from_secs(10)).unwrap();
        assert_eq!(done.status, Status::InvalidDescriptor, "{done:?}");
    }
    drop(bad);
    std::thread::sleep(Duration::from_millis(300));
    let mut rejected = 0;
    for h in 0..2 {
        let s = c.stats(h).unwrap();
        let r = &s["protocol"]["rejected"];
        rejected += r["malformed"].as_u64().unwrap() + r["bad_tag"].as_u64().unwrap();
        // The half with the dlcp magic claim wire version 1.
        rejected += r["version_mismatch"].as_u64().unwrap();
        rejected += r["unknown_source"].as_u64().unwrap();
    }
    assert!(rejected >= 1900, "random datagrams not all counted: {rejected}");
    let s0 = c.stats(0).unwrap();
    assert!(s0["service"]["submissions_rejected"].as_u64().unwrap() >= 3, "{s0}");
    // And the daemons still reduce correctly.
    let x = data(9, N);
    let hs: Vec<_> = (0..2)
        .map(|h| {
            let sock = c.daemons[h].socket.clone();
            let x = x.clone();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&sock, u64::from(JOB), 0, 1).unwrap();
                submit_and_wait(&mut cl, 1, 3, &x, Duration::from_secs(30))
            })
        })
        .collect();
    for h in hs {
        let (st, out) = h.join().unwrap();
        assert_eq!(st, Status::Ok);
        assert!(out.iter().zip(&x).all(|(a, b)| a.to_bits() == (b + b).to_bits()));
    }
}

/// A trainer that floods rejected descriptors and never reads its control
/// socket: the daemon tells it why each failed until the socket is full, then
/// keeps a few notes, drops and counts the rest, and serves on unhindered.
#[test]
fn a_trainer_that_never_reads_its_reasons_costs_the_daemon_a_bounded_outbox() {
    let c = Cluster::start(&Options { hosts: 2, ..Options::default() });
    let mut bad = TrainerChannel::attach(&c.daemons[0].socket, u64::from(JOB), 0, 1).unwrap();
    const FLOOD: u64 = 3000;
    for seq in 1..=FLOOD {
        let d = dlcp::shm::SubmitDesc {
            op_seq: seq,
            cookie: 0,
            arena_offset: 0,
            len_elems: 16,
            tensor_id: 3,
            layer: 0,
            layers: 0, // refused: "field layers: layer count 0 is not in 1..=65536"
            budget_ppm: 0,
            flags: 0,
            dtype: dlcp::shm::ElemType::F32 as u16,
            opcode: 1,
            reduce: 0,
            reserved: [0; 3],
            root: 0,
        };
        bad.debug_submit_raw(&d).unwrap();
        // Only the completion ring is read (try_completion never reads the socket).
        let t0 = Instant::now();
        let done = loop {
            if let Some(done) = bad.try_completion().unwrap() {
                break done;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "op {seq}: no completion (daemon stuck?)");
            std::thread::yield_now();
        };
        assert_eq!((done.op_seq, done.status), (seq, Status::InvalidDescriptor));
    }
    let s = c.stats(0).unwrap();
    let dropped = s["shm"]["reasons_dropped"].as_u64().unwrap();
    assert!(dropped > 0 && dropped < FLOOD, "{s}");
    // The reasons that did fit are there (the trainer keeps the last 64 it read).
    assert_eq!(bad.failure_reason(FLOOD, 3), None, "the last ones were dropped");
    let kept: Vec<String> = (1..FLOOD).filter_map(|seq| bad.failure_reason(seq, 3)).collect();
    assert!(!kept.is_empty() && kept.len() <= dlcp::shm::notes::INBOX_NOTES, "{}", kept.len());
    assert!(
        kept.iter().all(|r| r == "rejected descriptor: field layers: layer count 0 is not in 1..=65536"),
        "{kept:?}"
    );
    // And the daemon still reduces correctly once the flooder is gone.
    drop(bad);
    let t0 = Instant::now();
    while c.stats(0).unwrap()["trainers"] != 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the flooder's detach was not noticed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let x = data(11, N);
    let hs: Vec<_> = (0..2)
        .map(|h| {
            let sock = c.daemons[h].socket.clone();
            let x = x.clone();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&sock, u64::from(JOB), 0, 1).unwrap();
                submit_and_wait(&mut cl, 1, 4, &x, Duration::from_secs(30))
            })
        })
        .collect();
    for h in hs {
        let (st, out) = h.join().unwrap();
        assert_eq!(st, Status::Ok);
        assert!(out.iter().zip(&x).all(|(a, b)| a.to_bits() == (b + b).to_bits()));
    }
}

#[test]
fn killed_peer_daemon_fails_ops_within_the_hard_timeout_and_its_restart_rejoins() {
    let hard = Duration::from_millis(1500);
    let mut c = Cluster::start(&Options { hosts: 3, hard_timeout_ms: 1500, ..Options::default() });
    let x = data(5, N);
    let run = |c: &Cluster, hosts: &[usize], seq: u64| {
        let hs: Vec<_> = hosts
            .iter()
            .map(|&h| {
                let sock = c.daemons[h].socket.clone();
                let x = x.clone();
                std::thread::spawn(move || {
                    let mut cl = TrainerChannel::attach(&sock, u64::from(JOB), 0, 1).unwrap();
                    let t0 = Instant::now();
                    let r = submit_and_wait(&mut cl, seq, 0, &x, Duration::from_secs(30));
                    (r, t0.elapsed())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    };
    assert!(run(&c, &[0, 1, 2], 1).iter().all(|((st, _), _)| *st == Status::Ok));
    // Rank 2's daemon dies (SIGKILL): ops on the others fail within the hard timeout.
    c.kill(2, 9);
    c.wait_exit(2, Duration::from_secs(5)).expect("killed");
    for ((st, _), took) in run(&c, &[0, 1], 2) {
        assert_eq!(st, Status::Timeout);
        assert!(took < hard + Duration::from_millis(1500), "error took {took:?}");
    }
    // Heartbeats have stopped: after the peer timeout (1 s) rank 0 shows rank 2 down.
    let status = |c: &Cluster| -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
            .arg("--socket")
            .arg(&c.daemons[0].socket)
            .args(["status", "--json"])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let t = Instant::now();
    while status(&c)["peers"][2]["up"] != false {
        assert!(t.elapsed() < Duration::from_secs(5), "rank 2 never marked down: {}", status(&c));
        std::thread::sleep(Duration::from_millis(50));
    }
    // It restarts with a new generation; new ops across all hosts succeed.
    std::thread::sleep(Duration::from_millis(150));
    c.spawn(2, 0.0);
    c.wait_ready(2);
    let t = Instant::now();
    while status(&c)["peers"][2]["up"] != true {
        assert!(t.elapsed() < Duration::from_secs(5), "restarted rank 2 never marked up: {}", status(&c));
        std::thread::sleep(Duration::from_millis(50));
    }
    let res = run(&c, &[0, 1, 2], 3);
    for ((st, out), _) in &res {
        assert_eq!(*st, Status::Ok);
        assert!(out.iter().zip(&x).all(|(a, b)| a.to_bits() == ((b + b) + b).to_bits()));
    }
}

#[test]
fn sigterm_drains_an_op_in_flight_then_exits_zero() {
    let mut c = Cluster::start(&Options { hosts: 2, ..Options::default() });
    let x = data(3, N);
    let s0 = c.daemons[0].socket.clone();
    let x0 = x.clone();
    let t0 = std::thread::spawn(move || {
        let mut cl = TrainerChannel::attach(&s0, u64::from(JOB), 0, 1).unwrap();
        submit_and_wait(&mut cl, 1, 0, &x0, Duration::from_secs(30))
    });
    // Daemon 0 has the op in flight (waiting for host 1) when SIGTERM arrives.
    let t = Instant::now();
    // (Held until host 1's trainer starts the run, or in flight.)
    let started = |s: serde_json::Value| {
        s["protocol"]["ops_in_flight"].as_u64().unwrap_or(0) + s["protocol"]["ops_held"].as_u64().unwrap_or(0)
    };
    while started(c.stats(0).unwrap()) != 1 {
        assert!(t.elapsed() < Duration::from_secs(20), "the op never started on daemon 0");
        std::thread::sleep(Duration::from_millis(10));
    }
    c.kill(0, 15);
    std::thread::sleep(Duration::from_millis(200));
    assert!(c.wait_exit(0, Duration::from_millis(10)).is_none(), "exited without draining its op");
    let mut cl = TrainerChannel::attach(&c.daemons[1].socket, u64::from(JOB), 0, 1).unwrap();
    let (st1, out1) = submit_and_wait(&mut cl, 1, 0, &x, Duration::from_secs(30));
    let (st0, out0) = t0.join().unwrap();
    assert_eq!((st0, st1), (Status::Ok, Status::Ok));
    assert!(out0 == out1);
    let st = c.wait_exit(0, Duration::from_secs(10)).expect("drained daemon exits");
    assert_eq!(st.code(), Some(0));
}

#[test]
fn a_peer_daemon_down_at_start_up_is_not_fatal() {
    let mut c = Cluster::start(&Options { hosts: 2, late: vec![1], ..Options::default() });
    let x = data(4, N);
    let s0 = c.daemons[0].socket.clone();
    let x0 = x.clone();
    let t0 = std::thread::spawn(move || {
        let mut cl = TrainerChannel::attach(&s0, u64::from(JOB), 0, 1).unwrap();
        submit_and_wait(&mut cl, 1, 0, &x0, Duration::from_secs(30))
    });
    // Host 1's daemon comes up half a second later; the op still completes.
    std::thread::sleep(Duration::from_millis(500));
    c.spawn(1, 0.0);
    c.wait_ready(1);
    let mut cl = TrainerChannel::attach(&c.daemons[1].socket, u64::from(JOB), 0, 1).unwrap();
    let (st1, out1) = submit_and_wait(&mut cl, 1, 0, &x, Duration::from_secs(30));
    let (st0, out0) = t0.join().unwrap();
    assert_eq!((st0, st1), (Status::Ok, Status::Ok));
    assert!(out0 == out1 && out0.iter().zip(&x).all(|(a, b)| a.to_bits() == (b + b).to_bits()));
    let s = c.stats(0).unwrap();
    assert_eq!(s["service"]["ops_completed"], 1, "{s}");
    // `dlcpctl status` shows the peer up, with its generation.
    let out = Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
        .arg("--socket")
        .arg(&c.daemons[0].socket)
        .args(["status", "--json"])
        .output()
        .unwrap();
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["peers"][1]["up"], true, "{st}");
    assert!(st["peers"][1]["generation"].as_u64().is_some(), "{st}");
    // ...and helpfully fails against no daemon.
    let out = Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
        .args(["--socket", "/nonexistent/d.sock", "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is dlcpd running"), "{out:?}");
}

/// A late trainer (rank 0 evaluating, a checkpoint) is waited for, not timed
/// out: host 1's trainer submits op 2 three hard timeouts after host 0's.
/// Host 0's daemon finds rank 1 up but not started on the op, logs it once
/// and counts it (`late_rank_waits`), and the op completes on both hosts with
/// the exact sum; no hard timeout fires. (Found in the time-to-accuracy grid,
/// where rank 2 failed an op after 10 s waiting on three ranks that started it
/// 13 s late.)
#[test]
fn a_late_trainer_is_waited_for_past_the_hard_timeout() {
    let hard = Duration::from_millis(1000);
    let c = Cluster::start(&Options { hosts: 2, hard_timeout_ms: 1000, ..Options::default() });
    let x = data(11, N);
    let hosts: Vec<_> = (0..2u32)
        .map(|h| {
            let sock = c.daemons[h as usize].socket.clone();
            let x = x.clone();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&sock, u64::from(JOB), 0, 1).unwrap();
                let first = submit_and_wait(&mut cl, 1, 0, &x, Duration::from_secs(30));
                assert_eq!(first.0, Status::Ok, "host {h} op 1");
                if h == 1 {
                    std::thread::sleep(3 * hard);
                }
                let t0 = Instant::now();
                let (st, out) = submit_and_wait(&mut cl, 2, 0, &x, Duration::from_secs(30));
                (st, out, t0.elapsed())
            })
        })
        .collect();
    let res: Vec<_> = hosts.into_iter().map(|h| h.join().unwrap()).collect();
    let want: Vec<f32> = x.iter().map(|v| v + v).collect();
    for (h, (st, out, took)) in res.iter().enumerate() {
        assert_eq!(*st, Status::Ok, "host {h}: op 2 failed\n--- daemon {h} ---\n{}", c.log(h as u32));
        assert!(
            out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "host {h}: not the exact sum"
        );
        eprintln!("host {h}: op 2 ok in {took:?}");
    }
    assert!(res[0].2 >= 3 * hard, "host 0 waited only {:?}", res[0].2);
    let s0 = c.stats(0).unwrap();
    assert_eq!(s0["protocol"]["late_rank_waits"], 1, "{s0}");
    for h in 0..2 {
        let s = c.stats(h).unwrap();
        assert_eq!(s["protocol"]["hard_timeouts"], 0, "host {h}: {s}");
    }
    let log = c.log(0);
    assert_eq!(log.matches("op 2/0 waits for ranks [1]").count(), 1, "{log}");
}
