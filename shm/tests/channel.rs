//! The shared-memory channel end to end: a real control socket in a temp dir, a
//! daemon-side serving loop in a thread, and clients in this process and in child
//! processes (this test binary re-run with `DLCP_SHM_CHILD` set).

mod common;

use std::time::Duration;

use common::{ChildGuard, Event, HOLD_TENSOR, TestDaemon, WAIT, config, round_trip};
use dlcp_shm::{
    AttachError, Liveness, PeerPolicy, RejectReason, SubmitOptions, TrainerChannel, TrainerError,
};

const STRESS_OPS: u64 = 3000;
const SIZES: &[usize] = &[1, 15, 16, 17, 1000, 4096, 65_539, 1 << 20];

/// Child-process entry point: does nothing unless run by [`ChildGuard::spawn`].
#[test]
fn child_main() {
    let Ok(mode) = std::env::var("DLCP_SHM_CHILD") else { return };
    let sock = std::env::var("DLCP_SHM_SOCK").unwrap();
    let mut client = TrainerChannel::attach(&sock, 0x5151, 1, 2).unwrap();
    println!("CHILD:ATTACHED {}", client.attachment_id());
    match mode.as_str() {
        "roundtrip" => {
            round_trip(&mut client, 77, SIZES);
            println!("CHILD:DONE");
        }
        "stress" => {
            // Many small ops, four in flight: both rings wrap hundreds of times
            // across the process boundary; every result is checked.
            let ts: Vec<_> = (0..4u64).map(|i| client.alloc(&format!("s{i}"), 37 + i).unwrap()).collect();
            let mut pending = std::collections::VecDeque::new();
            let check =
                |client: &mut TrainerChannel,
                 pending: &mut std::collections::VecDeque<(u64, usize, Vec<f32>)>| {
                    let (seq, slot, input) = pending.pop_front().unwrap();
                    let c = client.wait_completion(WAIT).unwrap();
                    assert_eq!((c.op_seq, c.status), (seq, dlcp_shm::Status::Ok));
                    let want: Vec<f32> = input.into_iter().map(common::transform).collect();
                    assert_eq!(client.read(&ts[slot]).unwrap(), want, "op {seq}");
                };
            for op in 0..STRESS_OPS {
                let slot = (op % 4) as usize;
                if pending.len() == 4 {
                    check(&mut client, &mut pending);
                }
                let input = common::data(op, ts[slot].len_elems as usize);
                client.write(&ts[slot], &input).unwrap();
                let seq =
                    client.submit(&ts[slot], SubmitOptions { cookie: op, ..Default::default() }).unwrap();
                pending.push_back((seq, slot, input));
            }
            while !pending.is_empty() {
                check(&mut client, &mut pending);
            }
            println!("CHILD:DONE");
        }
        "reclaim" => {
            // Alone in this process: fds and mappings are exact. (The client attached
            // above holds one segment; its fds and mapping stay.)
            let dir = tempfile::tempdir().unwrap();
            let mut server = dlcp_shm::ShmServer::bind(config(dir.path())).unwrap();
            let (fds0, maps0) = (common::open_fds(), common::segment_mappings());
            for i in 0..20 {
                let (att, mut c) = common::attach_one(&mut server, 1, 0, 1);
                assert_eq!(common::segment_mappings(), maps0 + 2, "daemon and client map segment {i}");
                assert!(common::open_fds() >= fds0 + 8);
                assert_eq!(server.live_attachments(), 1);
                let t = c.alloc("x", 8).unwrap();
                c.submit(&t, Default::default()).unwrap();
                drop(c);
                drop(att);
            }
            assert_eq!(server.live_attachments(), 0);
            assert_eq!(common::segment_mappings(), maps0, "every segment unmapped");
            assert_eq!(common::open_fds(), fds0, "every memfd, eventfd and socket closed");
            println!("CHILD:DONE");
        }
        "garbage" => {
            // A hostile trainer process: garbage straight into the submission ring,
            // a wild ring index, an attempt to shrink the segment; then honest work.
            let arena = client.geometry().arena_size;
            let good = dlcp_shm::SubmitDesc {
                len_elems: 16,
                layers: 1,
                dtype: dlcp_shm::ElemType::F32 as u16,
                opcode: dlcp_shm::layout::Opcode::AllReduce as u16,
                ..Default::default()
            };
            let garbage = [
                dlcp_shm::SubmitDesc { arena_offset: arena, ..good },
                dlcp_shm::SubmitDesc { arena_offset: u64::MAX - 63, ..good },
                dlcp_shm::SubmitDesc { len_elems: u64::MAX / 2, ..good },
                dlcp_shm::SubmitDesc { dtype: 42, ..good },
                dlcp_shm::SubmitDesc { tensor_id: u32::MAX, ..good },
            ];
            for g in &garbage {
                client.debug_submit_raw(g).unwrap();
                let c = client.wait_completion(WAIT).unwrap();
                assert_eq!(c.status, dlcp_shm::Status::InvalidDescriptor);
            }
            let fd = client.debug_memfd();
            assert_eq!(rustix::fs::ftruncate(fd, 0), Err(rustix::io::Errno::PERM));
            client.debug_store_sq_tail(1 << 30);
            client.debug_ring_doorbell().unwrap();
            println!("CHILD:CORRUPTED");
            // Wait for the parent to see the corruption before repairing it.
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).unwrap();
            client.debug_restore_sq_tail();
            round_trip(&mut client, 12, &[100, 5000]);
            println!("CHILD:DONE");
        }
        "hang" => {
            // An op the daemon holds (in flight), then wait to be SIGKILLed.
            let t = client.alloc("held", 1024).unwrap();
            client.write(&t, &common::data(5, 1024)).unwrap();
            client.submit(&t, SubmitOptions { tensor_id: HOLD_TENSOR, ..Default::default() }).unwrap();
            println!("CHILD:SUBMITTED");
            std::thread::sleep(Duration::from_secs(60));
        }
        other => panic!("unknown child mode {other}"),
    }
}

#[test]
fn in_process_client_round_trips_tensors_of_many_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(config(dir.path()));
    let mut client = TrainerChannel::attach(&d.path, 42, 0, 1).unwrap();
    let (peer, reg) = d.expect("attach", |e| match e {
        Event::Attached { peer, reg, .. } => Some((*peer, *reg)),
        _ => None,
    });
    assert_eq!(peer.pid, std::process::id() as i32, "SO_PEERCRED pid is ours");
    assert_eq!(peer.uid, rustix::process::getuid().as_raw());
    assert_eq!((reg.job_id, reg.local_rank, reg.local_world), (42, 0, 1));
    round_trip(&mut client, 1, SIZES);

    // Several ops in flight at once, completed in order.
    let ts: Vec<_> = (0..8).map(|i| client.alloc(&format!("m{i}"), 300 + i).unwrap()).collect();
    for (i, t) in ts.iter().enumerate() {
        client.write(t, &common::data(100 + i as u64, t.len_elems as usize)).unwrap();
        client
            .submit(t, SubmitOptions { tensor_id: i as u32, cookie: i as u64, ..Default::default() })
            .unwrap();
    }
    assert_eq!(client.in_flight(), 8);
    for i in 0..8u64 {
        assert_eq!(client.wait_completion(WAIT).unwrap().cookie, i);
    }
    for (i, t) in ts.iter().enumerate() {
        let want: Vec<f32> =
            common::data(100 + i as u64, t.len_elems as usize).into_iter().map(common::transform).collect();
        assert_eq!(client.read(t).unwrap(), want);
    }
    assert!(matches!(client.wait_completion(Duration::from_millis(50)), Err(TrainerError::Timeout(_))));
}

#[test]
fn child_process_client_round_trips_and_its_pid_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(config(dir.path()));
    let mut child = ChildGuard::spawn("child_main", "roundtrip", &d.path);
    let (peer, reg) = d.expect("attach", |e| match e {
        Event::Attached { peer, reg, .. } => Some((*peer, *reg)),
        _ => None,
    });
    assert_eq!(peer.pid, child.pid(), "SO_PEERCRED names the child process");
    assert_eq!((reg.job_id, reg.local_rank, reg.local_world), (0x5151, 1, 2));
    child.expect_line("DONE");
    assert!(child.wait_success());
    // The child exiting closes its control socket: the daemon reclaims the segment.
    let (liveness, stats, live_after) = d.expect("detach", |e| match e {
        Event::Detached { liveness, stats, live_after, .. } => Some((*liveness, *stats, *live_after)),
        _ => None,
    });
    assert_eq!(liveness, Liveness::Gone);
    assert_eq!(stats.submissions, SIZES.len() as u64);
    assert_eq!(stats.completions, SIZES.len() as u64);
    assert_eq!(stats.rejected(), 0);
    assert_eq!(live_after, 0);
}

#[test]
fn sigkilled_client_is_detected_its_segment_reclaimed_and_a_new_client_attaches() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(config(dir.path()));
    // One healthy trainer stays attached throughout.
    let mut survivor = TrainerChannel::attach(&d.path, 0x5151, 0, 2).unwrap();
    let survivor_id = d.expect("survivor attach", |e| match e {
        Event::Attached { id, .. } => Some(*id),
        _ => None,
    });
    let mut child = ChildGuard::spawn("child_main", "hang", &d.path);
    let victim = d.expect("child attach", |e| match e {
        Event::Attached { id, peer, .. } if peer.pid == child.pid() => Some(*id),
        _ => None,
    });
    child.expect_line("SUBMITTED");
    d.expect("held op", |e| matches!(e, Event::Held { id, .. } if *id == victim).then_some(()));

    child.child.kill().unwrap(); // SIGKILL: no cleanup code runs in the child
    child.child.wait().unwrap();
    let (id, liveness, pending_failed, live_after) = d.expect("detach", |e| match e {
        Event::Detached { id, liveness, pending_failed, live_after, .. } => {
            Some((*id, *liveness, *pending_failed, *live_after))
        }
        _ => None,
    });
    assert_eq!(id, victim);
    assert!(matches!(liveness, Liveness::Gone | Liveness::Broken(_)), "{liveness:?}");
    assert_eq!(pending_failed, 1, "the killed trainer's in-flight op is failed");
    assert_eq!(live_after, 1, "only the survivor's segment is left");

    // The survivor is unaffected, and a new trainer can take the dead one's place.
    round_trip(&mut survivor, 2, &[10, 1000]);
    let mut fresh = TrainerChannel::attach(&d.path, 0x5151, 1, 2).unwrap();
    let fresh_id = d.expect("fresh attach", |e| match e {
        Event::Attached { id, .. } => Some(*id),
        _ => None,
    });
    assert!(fresh_id != victim && fresh_id != survivor_id);
    round_trip(&mut fresh, 3, &[1, 65_536]);
}

#[test]
fn peer_policy_refusal_is_sent_back_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    let me = rustix::process::getuid().as_raw();
    cfg.policy = PeerPolicy { uids: vec![me.wrapping_add(1)], gids: vec![], hook: None };
    let d = TestDaemon::start(cfg);
    match TrainerChannel::attach(&d.path, 1, 0, 1) {
        Err(AttachError::Rejected(RejectReason::PolicyDenied)) => {}
        other => panic!("expected a policy refusal, got {other:?}"),
    }
    let msg = d.expect("refusal", |e| match e {
        Event::AcceptFailed(m) => Some(m.clone()),
        _ => None,
    });
    assert!(msg.contains("refused by the peer policy") && msg.contains(&format!("uid {me}")), "{msg}");
}

#[test]
fn malformed_registration_and_missing_daemon_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    match TrainerChannel::attach(dir.path().join("nobody.sock"), 1, 0, 1) {
        Err(e @ AttachError::Connect(_)) => assert!(e.to_string().contains("is dlcpd running")),
        other => panic!("{other:?}"),
    }
    let d = TestDaemon::start(config(dir.path()));
    match TrainerChannel::attach(&d.path, 1, 2, 2) {
        Err(AttachError::Rejected(RejectReason::BadRequest)) => {}
        other => panic!("rank 2 of 2: {other:?}"),
    }
    // A peer that connects and sends garbage, then one that says nothing and hangs up.
    {
        use std::io::Write;
        let mut s = std::os::unix::net::UnixStream::connect(&d.path).unwrap();
        s.write_all(&[0xAB; 32]).unwrap();
        let _ = std::os::unix::net::UnixStream::connect(&d.path).unwrap();
    }
    let mut failures = 0;
    while failures < 3 {
        d.expect("failures", |e| matches!(e, Event::AcceptFailed(_)).then_some(()));
        failures += 1;
    }
    // And the daemon still serves.
    let mut c = TrainerChannel::attach(&d.path, 1, 0, 1).unwrap();
    round_trip(&mut c, 4, &[33]);
}

#[test]
fn bind_replaces_a_stale_socket_but_not_a_live_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    // A stale socket file from a "killed" daemon: bound, never accepted, listener dropped
    // without removing the file.
    drop(std::os::unix::net::UnixListener::bind(&cfg.socket_path).unwrap());
    assert!(cfg.socket_path.exists());
    let live = dlcp_shm::ShmServer::bind(cfg.clone()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&cfg.socket_path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket_mode applied");
    match dlcp_shm::ShmServer::bind(cfg.clone()) {
        Err(dlcp_shm::BindError::InUse(_)) => {}
        other => panic!("second daemon on a live socket: {other:?}"),
    }
    drop(live);
    assert!(!cfg.socket_path.exists(), "socket removed on drop");
    std::fs::write(&cfg.socket_path, b"not a socket").unwrap();
    assert!(matches!(dlcp_shm::ShmServer::bind(cfg), Err(dlcp_shm::BindError::NotASocket(_))));
}

#[test]
fn a_local_rank_is_held_until_its_trainer_is_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(config(dir.path()));
    let first = TrainerChannel::attach(&d.path, 7, 0, 2).unwrap();
    let first_id = d.expect("attach", |e| match e {
        Event::Attached { id, .. } => Some(*id),
        _ => None,
    });
    match TrainerChannel::attach(&d.path, 7, 0, 2) {
        Err(AttachError::Rejected(RejectReason::RankInUse { local_rank: 0 })) => {}
        other => panic!("same rank twice: {other:?}"),
    }
    match TrainerChannel::attach(&d.path, 7, 1, 3) {
        Err(AttachError::Rejected(RejectReason::WorldMismatch { job_world: 2, trainer_world: 3 })) => {}
        other => panic!("other world size: {other:?}"),
    }
    // Another job may use rank 0 and any world size.
    let _other_job = TrainerChannel::attach(&d.path, 8, 0, 3).unwrap();
    drop(first);
    d.expect("detach", |e| matches!(e, Event::Detached { id, .. } if *id == first_id).then_some(()));
    let mut again = TrainerChannel::attach(&d.path, 7, 0, 2).unwrap();
    round_trip(&mut again, 9, &[64]);
}

#[test]
fn a_silent_peer_only_delays_accept_by_the_handshake_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.handshake_timeout = Duration::from_millis(200);
    let mut server = dlcp_shm::ShmServer::bind(cfg).unwrap();
    let _silent = std::os::unix::net::UnixStream::connect(server.socket_path()).unwrap();
    assert!(server.wait_acceptable(Some(WAIT)).unwrap());
    let t0 = std::time::Instant::now();
    match server.accept() {
        Err(dlcp_shm::AcceptError::Handshake { peer, .. }) => {
            assert_eq!(peer.pid, std::process::id() as i32)
        }
        other => panic!("{other:?}"),
    }
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(150) && took < Duration::from_secs(3), "{took:?}");
    assert_eq!(server.stats().failed, 1);
    assert_eq!(server.live_attachments(), 0);
    // Only the socket itself is in the directory (no temporary bind name left).
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("dlcpd.sock")]);
}

#[test]
fn rings_wrap_many_times_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(config(dir.path()));
    let mut child = ChildGuard::spawn("child_main", "stress", &d.path);
    child.expect_line("DONE");
    assert!(child.wait_success());
    let stats = d.expect("detach", |e| match e {
        Event::Detached { stats, .. } => Some(*stats),
        _ => None,
    });
    assert_eq!(stats.submissions, STRESS_OPS);
    assert_eq!(stats.completions, STRESS_OPS);
    assert_eq!((stats.rejected(), stats.ring_corruptions, stats.completions_dropped), (0, 0, 0));
}

#[test]
fn a_refused_user_is_turned_away_before_the_handshake_and_hooks_see_the_registration() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.handshake_timeout = Duration::from_secs(5);
    let me = rustix::process::getuid().as_raw();
    cfg.policy = PeerPolicy { uids: vec![me.wrapping_add(1)], gids: vec![], hook: None };
    let mut server = dlcp_shm::ShmServer::bind(cfg.clone()).unwrap();
    // Connects and says nothing: refused at once, not after the 5 s handshake timeout.
    let _silent = std::os::unix::net::UnixStream::connect(server.socket_path()).unwrap();
    assert!(server.wait_acceptable(Some(WAIT)).unwrap());
    let t0 = std::time::Instant::now();
    assert!(matches!(server.accept(), Err(dlcp_shm::AcceptError::PolicyDenied { .. })));
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert_eq!(server.stats().policy_denied, 1);
    drop(server);

    // A hook refusing one job id: other jobs attach.
    cfg.policy = PeerPolicy::same_user();
    cfg.policy.hook =
        Some(std::sync::Arc::new(|_: &dlcp_shm::PeerCred, r: &dlcp_shm::Registration| r.job_id != 13));
    let d = TestDaemon::start(cfg);
    assert!(matches!(
        TrainerChannel::attach(&d.path, 13, 0, 1),
        Err(AttachError::Rejected(RejectReason::PolicyDenied))
    ));
    let mut ok = TrainerChannel::attach(&d.path, 14, 0, 1).unwrap();
    round_trip(&mut ok, 11, &[5]);
}

#[test]
fn dropped_attachments_release_every_fd_and_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(config(dir.path()));
    let mut child = ChildGuard::spawn("child_main", "reclaim", &d.path);
    child.expect_line("DONE");
    assert!(child.wait_success());
}

#[test]
fn a_hostile_trainer_process_is_rejected_counted_and_the_daemon_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(config(dir.path()));
    let mut bystander = TrainerChannel::attach(&d.path, 0x5151, 0, 2).unwrap();
    let mut child = ChildGuard::spawn("child_main", "garbage", &d.path);
    let hostile = d.expect("attach", |e| match e {
        Event::Attached { id, peer, .. } if peer.pid == child.pid() => Some(*id),
        _ => None,
    });
    child.expect_line("CORRUPTED");
    let mut codes = Vec::new();
    d.expect("corruption", |e| match e {
        Event::Rejected { id, code } if *id == hostile => {
            codes.push(*code);
            None
        }
        Event::Corrupted { id } if *id == hostile => Some(()),
        _ => None,
    });
    use dlcp_shm::DescError as E;
    let out_of_arena = E::OutOfArena { offset: 0, end: 0, arena_size: 0 }.code();
    let overflow = E::LengthOverflow { offset: 0, len_elems: 0 }.code();
    let dtype = E::UnknownDtype(0).code();
    let id = E::TensorIdOutOfRange { id: 0, max: 0 }.code();
    assert_eq!(codes, vec![out_of_arena, overflow, overflow, dtype, id]);
    // The bystander is served while the hostile trainer's ring is broken.
    round_trip(&mut bystander, 13, &[1000]);
    {
        use std::io::Write;
        let stdin = child.child.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
    }
    child.expect_line("DONE");
    assert!(child.wait_success());
    let stats = d.expect("detach", |e| match e {
        Event::Detached { id, stats, .. } if *id == hostile => Some(*stats),
        _ => None,
    });
    assert_eq!(stats.rejected(), 5);
    assert_eq!(stats.rejected_by_code[overflow as usize], 2);
    assert!(stats.ring_corruptions >= 1);
    assert_eq!(stats.submissions, 2, "honest work after the repair was served");
}
