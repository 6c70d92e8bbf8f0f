//! Admission and back-pressure on the daemon side: handshakes read without
//! blocking (a silent peer holds nothing up), the job and the attachment limits
//! checked before any segment is created, and an attachment that takes no more
//! submissions than its completion ring (and arena) have room for.

mod common;

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{WAIT, config};
use dlcp_shm::layout::{FLAG_RESCALE, Opcode};
use dlcp_shm::{
    AcceptError, AttachError, Attachment, ElemType, Handshake, RejectReason, ShmServer, Status, SubmitDesc,
    TrainerChannel,
};

/// The next pending handshake (waits for the listener up to [`WAIT`]).
fn pending(server: &mut ShmServer) -> Handshake {
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no connection");
        server.wait_acceptable(Some(WAIT)).unwrap();
        if let Some(hs) = server.accept_pending().unwrap() {
            return hs;
        }
    }
}

/// Reads `hs` until its register message is complete.
fn complete(hs: &mut Handshake) {
    while !hs.read().unwrap() {
        assert!(hs.wait().unwrap(), "register message did not arrive");
    }
}

fn attach_in_thread(
    server: &ShmServer,
    job: u64,
    rank: u32,
    world: u32,
) -> std::thread::JoinHandle<Result<TrainerChannel, AttachError>> {
    let path = server.socket_path().to_owned();
    std::thread::spawn(move || TrainerChannel::attach(&path, job, rank, world))
}

#[test]
fn a_silent_peer_holds_no_one_up_and_a_busy_server_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.handshake_timeout = Duration::from_millis(300);
    let mut server = ShmServer::bind(cfg).unwrap();
    let _silent = UnixStream::connect(server.socket_path()).unwrap();
    let t0 = Instant::now();
    let mut silent = pending(&mut server);
    assert!(!silent.read().unwrap(), "nothing sent yet");
    assert!(t0.elapsed() < Duration::from_millis(200), "accept_pending waited: {:?}", t0.elapsed());
    // A real trainer attaches while the silent one is pending.
    let t = attach_in_thread(&server, 7, 0, 1);
    let mut hs = pending(&mut server);
    complete(&mut hs);
    let att = server.admit(hs).unwrap();
    let client = t.join().unwrap().unwrap();
    assert_eq!(client.attachment_id(), att.id());
    // The silent one runs out of time; the caller drops it.
    assert!(!silent.wait().unwrap(), "its deadline passes without data");
    assert!(Instant::now() >= silent.deadline());
    assert!(!silent.read().unwrap());
    drop(silent);
    // A server with too many handshakes pending turns one away with a reason.
    let t = attach_in_thread(&server, 7, 1, 2);
    let hs = pending(&mut server);
    server.refuse(hs, RejectReason::Busy);
    match t.join().unwrap() {
        Err(AttachError::Rejected(RejectReason::Busy)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(server.live_attachments(), 1);
}

#[test]
fn a_wrong_job_is_refused_before_a_segment_exists_naming_both_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.job_id = Some(7);
    let mut server = ShmServer::bind(cfg).unwrap();
    let t = attach_in_thread(&server, 9, 0, 1);
    let mut hs = pending(&mut server);
    complete(&mut hs);
    match server.admit(hs) {
        Err(AcceptError::Refused {
            reason: RejectReason::JobMismatch { daemon_job: 7, trainer_job: 9 },
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let e = t.join().unwrap().unwrap_err();
    assert!(
        matches!(e, AttachError::Rejected(RejectReason::JobMismatch { daemon_job: 7, trainer_job: 9 })),
        "{e:?}"
    );
    let shown = e.to_string();
    assert!(shown.contains("registered for job 9 but this daemon serves job 7"), "{shown}");
    assert_eq!((server.stats().wrong_job, server.stats().attached, server.live_attachments()), (1, 0, 0));
    // No segment was made for it: the first attachment is number 1.
    let t = attach_in_thread(&server, 7, 0, 1);
    let mut hs = pending(&mut server);
    complete(&mut hs);
    let att = server.admit(hs).unwrap();
    assert_eq!(att.id(), 1);
    drop(t.join().unwrap().unwrap());
}

/// Attaches through `server` (blocking accept); the trainer's result.
fn try_attach(
    server: &mut ShmServer,
    job: u64,
    rank: u32,
    world: u32,
) -> Result<(Attachment, TrainerChannel), AttachError> {
    let t = attach_in_thread(server, job, rank, world);
    let deadline = Instant::now() + WAIT;
    let att = loop {
        assert!(Instant::now() < deadline, "no connection");
        server.wait_acceptable(Some(WAIT)).unwrap();
        match server.accept() {
            Ok(Some(a)) => break Some(a),
            Ok(None) => {}
            Err(_) => break None,
        }
    };
    let client = t.join().unwrap()?;
    Ok((att.expect("accepted"), client))
}

#[test]
fn attachments_beyond_the_limits_are_refused_with_the_limit_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.max_attachments = 2;
    let mut server = ShmServer::bind(cfg.clone()).unwrap();
    let a = try_attach(&mut server, 1, 0, 3).unwrap();
    let _b = try_attach(&mut server, 1, 1, 3).unwrap();
    let e = try_attach(&mut server, 1, 2, 3).map(|_| ()).unwrap_err();
    assert!(
        matches!(e, AttachError::Rejected(RejectReason::TooManyAttachments { limit: 2, per_user: false })),
        "{e:?}"
    );
    assert!(e.to_string().contains("2 attachments, its limit (shm.max_attachments)"), "{e}");
    assert_eq!((server.stats().over_limit, server.live_attachments()), (1, 2));
    // One leaves: there is room again.
    drop(a);
    let _c = try_attach(&mut server, 1, 2, 3).unwrap();
    drop(server);

    // Per user: this test's uid may hold one.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.max_attachments = 4;
    cfg.max_attachments_per_user = 1;
    let mut server = ShmServer::bind(cfg).unwrap();
    let first = try_attach(&mut server, 1, 0, 2).unwrap();
    let e = try_attach(&mut server, 1, 1, 2).map(|_| ()).unwrap_err();
    assert!(
        matches!(e, AttachError::Rejected(RejectReason::TooManyAttachments { limit: 1, per_user: true })),
        "{e:?}"
    );
    assert!(e.to_string().contains("shm.max_attachments_per_user"), "{e}");
    drop(first);
    // Released with the attachment, rank and user count alike.
    let _again = try_attach(&mut server, 1, 1, 2).unwrap();
}

fn desc(seq: u64, offset: u64, len_elems: u64) -> SubmitDesc {
    SubmitDesc {
        op_seq: seq,
        cookie: seq,
        arena_offset: offset,
        len_elems,
        tensor_id: 1,
        layer: 0,
        layers: 1,
        budget_ppm: 0,
        flags: FLAG_RESCALE,
        dtype: ElemType::F32 as u16,
        opcode: Opcode::AllReduce as u16,
        reduce: 0,
        reserved: [0; 3],
        root: 0,
    }
}

/// Takes every submission the attachment gives now.
fn take_all(att: &mut Attachment) -> Vec<dlcp_shm::Submission> {
    let _ = att.wait(Some(Duration::ZERO));
    std::iter::from_fn(|| att.next_submission().unwrap()).collect()
}

#[test]
fn no_more_ops_outstanding_than_the_completion_ring_holds_and_none_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.geometry = dlcp_shm::Geometry::new(16, 4, 8 << 20).unwrap();
    let mut server = ShmServer::bind(cfg).unwrap();
    let (mut att, mut client) = try_attach(&mut server, 1, 0, 1).unwrap();
    // A trainer ignoring its limit: 10 ops through a 4-entry completion ring.
    for seq in 1..=10 {
        if seq % 4 == 1 {
            client.debug_forget_in_flight();
        }
        client.debug_submit_raw(&desc(seq, 4096 * seq, 16)).unwrap();
    }
    let first = take_all(&mut att);
    assert_eq!(first.len(), 4, "as many as the completion ring holds");
    assert!(att.stats().throttled >= 1);
    assert_eq!(att.outstanding(), (4, 4 * 64));
    // Completing two does not make room while the trainer has not read them.
    for s in &first[..2] {
        att.complete_submission(s, Status::Ok, 1_000_000, 0, Duration::ZERO).unwrap();
    }
    assert!(take_all(&mut att).is_empty());
    for _ in 0..2 {
        assert_eq!(client.try_completion().unwrap().unwrap().status, Status::Ok);
    }
    let next = take_all(&mut att);
    assert_eq!(next.iter().map(|s| s.op_seq).collect::<Vec<_>>(), vec![5, 6]);
    // Every op is completed in the end, and no completion is ever dropped.
    let mut open: Vec<_> = first[2..].iter().chain(&next).copied().collect();
    let mut done = 2;
    while done < 10 {
        for s in open.drain(..) {
            att.complete_submission(&s, Status::Ok, 1_000_000, 0, Duration::ZERO).unwrap();
        }
        while let Some(c) = client.try_completion().unwrap() {
            assert_eq!(c.status, Status::Ok);
            done += 1;
        }
        open = take_all(&mut att);
    }
    assert_eq!((att.stats().completions, att.stats().completions_dropped), (10, 0));
    assert_eq!(att.outstanding(), (0, 0));
}

#[test]
fn no_more_than_an_arena_of_bytes_outstanding() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.geometry = dlcp_shm::Geometry::new(16, 16, 1 << 20).unwrap();
    let mut server = ShmServer::bind(cfg).unwrap();
    let (mut att, mut client) = try_attach(&mut server, 1, 0, 1).unwrap();
    // The same half-arena tensor submitted three times over.
    for seq in 1..=3 {
        client.debug_submit_raw(&desc(seq, 0, (1 << 20) / 8)).unwrap();
    }
    let taken = take_all(&mut att);
    assert_eq!(taken.len(), 2, "two halves make an arena");
    assert_eq!(att.outstanding(), (2, 1 << 20));
    att.complete_submission(&taken[0], Status::Ok, 1_000_000, 0, Duration::ZERO).unwrap();
    assert_eq!(take_all(&mut att).len(), 1, "room again");
}
