//! A hostile or buggy trainer against the daemon side of the channel, driven
//! step by step in one process (server, attachment and client in this test):
//! garbage descriptors written straight into the submission ring, wild ring
//! indices, a scribbled header, attempts to resize or reseal the memfd. Each is
//! rejected and counted, the daemon never panics, and the channel keeps working.

mod common;

use std::time::Duration;

use common::{WAIT, config, data, pair, transform};
use dlcp_shm::layout::{ARENA_ALIGN, FLAG_RESCALE, Opcode};
use dlcp_shm::{
    Attachment, ChannelError, CompleteError, DescError, ElemType, RingError, Status, SubmitDesc,
    TrainerChannel,
};
use rustix::fs::SealFlags;

/// Serves exactly one valid op on the daemon side, the way the daemon will.
fn serve_one(att: &mut Attachment) {
    let s = att.next_submission().unwrap().expect("a submission");
    let mut v = att.copy_from_arena(s.span.offset, s.span.len_elems).unwrap();
    v.iter_mut().for_each(|x| *x = transform(*x));
    att.copy_to_arena(s.span.offset, &v).unwrap();
    att.complete_submission(&s, Status::Ok, 1_000_000, 0, Duration::ZERO).unwrap();
}

/// A valid op round trip through `att` and `client`.
fn still_works(att: &mut Attachment, client: &mut TrainerChannel, seed: u64) {
    let name = format!("ok{seed}");
    let t = client.alloc(&name, 257).unwrap();
    let input = data(seed, 257);
    client.write(&t, &input).unwrap();
    let seq = client.submit(&t, Default::default()).unwrap();
    serve_one(att);
    let c = client.wait_completion(WAIT).unwrap();
    assert_eq!((c.status, c.op_seq), (Status::Ok, seq));
    assert_eq!(client.read(&t).unwrap(), input.into_iter().map(transform).collect::<Vec<_>>());
    client.free(&name).unwrap();
}

fn good(arena: u64) -> SubmitDesc {
    SubmitDesc {
        op_seq: 1,
        cookie: 0xBAD,
        arena_offset: arena - 4096,
        len_elems: 1024,
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

#[test]
fn garbage_descriptors_are_rejected_counted_and_answered() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mut att, mut client) = pair(config(dir.path()), 9);
    let arena = att.geometry().arena_size;
    let g = good(arena);
    let cases: Vec<(SubmitDesc, DescError)> = vec![
        (SubmitDesc { reserved: [0xff; 3], ..g }, DescError::ReservedNonZero),
        (SubmitDesc { opcode: 77, ..g }, DescError::UnknownOpcode(77)),
        (SubmitDesc { dtype: 0xdead, ..g }, DescError::UnknownDtype(0xdead)),
        (SubmitDesc { reduce: 9, ..g }, DescError::UnknownReduce(9)),
        (SubmitDesc { flags: 0xf000_0000, ..g }, DescError::UnknownFlags(0xf000_0000)),
        (
            SubmitDesc { opcode: Opcode::Broadcast as u16, reduce: 1, ..g },
            DescError::ReduceNotSum { opcode: Opcode::Broadcast, reduce: 1 },
        ),
        (SubmitDesc { root: 1, ..g }, DescError::RootNotZero { opcode: Opcode::AllReduce, root: 1 }),
        (SubmitDesc { len_elems: 0, ..g }, DescError::EmptyTensor),
        (
            SubmitDesc { len_elems: u64::MAX, ..g },
            DescError::LengthOverflow { offset: g.arena_offset, len_elems: u64::MAX },
        ),
        (SubmitDesc { arena_offset: 4, ..g }, DescError::Misaligned { offset: 4 }),
        (
            SubmitDesc { arena_offset: arena, len_elems: 16, ..g },
            DescError::OutOfArena { offset: arena, end: arena + 64, arena_size: arena },
        ),
        (
            SubmitDesc { arena_offset: 1 << 40, ..g },
            DescError::OutOfArena { offset: 1 << 40, end: (1 << 40) + 4096, arena_size: arena },
        ),
        (
            SubmitDesc { arena_offset: arena - ARENA_ALIGN, len_elems: 17, ..g },
            DescError::OutOfArena { offset: arena - 64, end: arena + 4, arena_size: arena },
        ),
        (
            SubmitDesc { tensor_id: u32::MAX, ..g },
            DescError::TensorIdOutOfRange { id: u32::MAX, max: 1 << 20 },
        ),
        (SubmitDesc { layers: 0, ..g }, DescError::BadLayerCount { layers: 0, max: 1 << 16 }),
        (SubmitDesc { layer: 7, layers: 7, ..g }, DescError::LayerOutOfRange { layer: 7, layers: 7 }),
        (
            SubmitDesc { budget_ppm: u32::MAX, ..g },
            DescError::BudgetOutOfRange { ppm: u32::MAX, max: 100_000 },
        ),
    ];
    let mut codes = vec![0u64; DescError::COUNT + 1];
    for (i, (bad, want)) in cases.iter().enumerate() {
        let bad = SubmitDesc { op_seq: 1000 + i as u64, cookie: i as u64, ..*bad };
        client.debug_submit_raw(&bad).unwrap();
        match att.next_submission() {
            Err(ChannelError::Rejected { op_seq, cookie, error }) => {
                assert_eq!(&error, want);
                assert_eq!((op_seq, cookie), (bad.op_seq, bad.cookie));
            }
            other => panic!("case {i}: expected a rejection, got {other:?}"),
        }
        codes[want.code() as usize] += 1;
        // The trainer hears about it: a completion with the error code.
        let c = client.wait_completion(WAIT).unwrap();
        assert_eq!(c.status, Status::InvalidDescriptor);
        assert_eq!((c.detail, c.cookie, c.op_seq), (want.code(), i as u64, bad.op_seq));
    }
    let st = att.stats();
    assert_eq!(st.rejected_by_code.to_vec(), codes, "every rejection counted under its code");
    assert_eq!(st.rejected(), cases.len() as u64);
    assert_eq!(st.submissions, 0);
    assert_eq!(client.in_flight(), 0);

    // A burst of random words (a trainer writing noise): all rejected or served,
    // never a panic, and the channel keeps serving.
    let mut s = 0x1234_5678_9abc_def1u64;
    let mut rand = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for _ in 0..200 {
        let d = SubmitDesc::from_words(core::array::from_fn(|_| rand()));
        client.debug_submit_raw(&d).unwrap();
        assert!(matches!(att.next_submission(), Err(ChannelError::Rejected { .. })));
        assert_eq!(client.wait_completion(WAIT).unwrap().status, Status::InvalidDescriptor);
    }
    assert_eq!(att.stats().rejected(), cases.len() as u64 + 200);
    still_works(&mut att, &mut client, 1);
}

#[test]
fn wild_submission_tail_is_reported_and_recoverable() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mut att, mut client) = pair(config(dir.path()), 9);
    let cap = att.geometry().sq_capacity;
    for wild in [cap + 1, 1 << 31, u32::MAX] {
        client.debug_store_sq_tail(wild);
        client.debug_ring_doorbell().unwrap();
        assert!(att.wait(Some(WAIT)).unwrap().doorbell);
        match att.next_submission() {
            Err(ChannelError::Ring(RingError::Corrupted { head: 0, tail, capacity })) => {
                assert_eq!((tail, capacity), (wild, cap));
            }
            other => panic!("tail {wild}: {other:?}"),
        }
    }
    assert_eq!(att.stats().ring_corruptions, 3);
    // Nothing was consumed; once the trainer behaves, service resumes.
    client.debug_restore_sq_tail();
    assert!(att.next_submission().unwrap().is_none());
    still_works(&mut att, &mut client, 2);
}

#[test]
fn wild_completion_head_is_reported_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mut att, mut client) = pair(config(dir.path()), 9);
    client.debug_store_cq_head(1000);
    let t = client.alloc("x", 16).unwrap();
    client.submit(&t, Default::default()).unwrap();
    let s = att.next_submission().unwrap().unwrap();
    assert!(matches!(
        att.complete_submission(&s, Status::Ok, 0, 0, Duration::ZERO),
        Err(CompleteError::Ring(RingError::Corrupted { head: 1000, tail: 0, .. }))
    ));
    assert_eq!(att.stats().completions_dropped, 1);
    assert_eq!(att.stats().ring_corruptions, 1);
    client.debug_restore_cq_head();
    att.complete_submission(&s, Status::Ok, 0, 0, Duration::ZERO).unwrap();
    assert_eq!(client.wait_completion(WAIT).unwrap().status, Status::Ok);
    still_works(&mut att, &mut client, 3);
}

#[test]
fn full_completion_ring_is_an_error_not_a_block() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mut att, mut client) = pair(config(dir.path()), 9);
    let cap = att.geometry().cq_capacity;
    let t = client.alloc("x", 16).unwrap();
    for _ in 0..cap {
        client.submit(&t, Default::default()).unwrap();
    }
    assert!(matches!(client.submit(&t, Default::default()), Err(dlcp_shm::TrainerError::TooManyInFlight(_))));
    // A hostile trainer ignores the limit; the daemon must not block or overwrite.
    let mut served = Vec::new();
    while let Some(s) = att.next_submission().unwrap() {
        served.push(s);
    }
    for s in &served {
        att.complete_submission(s, Status::Ok, 0, 0, Duration::ZERO).unwrap();
    }
    assert_eq!(
        att.complete_submission(&served[0], Status::Ok, 0, 0, Duration::ZERO),
        Err(CompleteError::Full)
    );
    for _ in 0..cap {
        client.wait_completion(WAIT).unwrap();
    }
}

#[test]
fn memfd_seals_stop_truncation_and_resealing() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mut att, mut client) = pair(config(dir.path()), 9);
    let size = att.geometry().total_size;
    let fd = client.debug_memfd();
    let seals = rustix::fs::fcntl_get_seals(fd).unwrap();
    assert!(seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL), "{seals:?}");
    assert_eq!(rustix::fs::ftruncate(fd, 0), Err(rustix::io::Errno::PERM), "shrink refused");
    assert_eq!(rustix::fs::ftruncate(fd, size / 2), Err(rustix::io::Errno::PERM));
    assert_eq!(rustix::fs::ftruncate(fd, size * 2), Err(rustix::io::Errno::PERM), "grow refused");
    assert_eq!(rustix::fs::fcntl_add_seals(fd, SealFlags::WRITE), Err(rustix::io::Errno::PERM));
    assert_eq!(rustix::fs::fstat(fd).unwrap().st_size as u64, size);
    // Reading the very last arena bytes on the daemon side is still fine (no SIGBUS).
    let arena = att.geometry().arena_size;
    assert_eq!(att.copy_from_arena(arena - 64, 16).unwrap().len(), 16);
    still_works(&mut att, &mut client, 4);
}

#[test]
fn daemon_arena_copies_are_bounds_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, att, _client) = pair(config(dir.path()), 9);
    let arena = att.geometry().arena_size;
    assert!(att.copy_from_arena(arena, 1).is_err());
    assert!(att.copy_from_arena(arena - 4, 2).is_err());
    assert!(att.copy_from_arena(u64::MAX - 3, 1).is_err());
    assert!(att.copy_from_arena(0, u64::MAX / 2).is_err());
    assert!(att.copy_from_arena(2, 1).is_err(), "misaligned");
    assert!(att.copy_to_arena(arena - 4, &[1.0, 2.0]).is_err());
    assert!(att.copy_to_arena(arena - 8, &[1.0, 2.0]).is_ok());
    assert_eq!(att.copy_from_arena(arena - 8, 2).unwrap(), vec![1.0, 2.0]);
    let mut buf = [0f32; 2];
    att.copy_from_arena_into(arena - 8, &mut buf).unwrap();
    assert_eq!(buf, [1.0, 2.0]);
    assert!(att.copy_from_arena_into(arena - 4, &mut buf).is_err());
}

#[test]
fn scribbled_header_does_not_affect_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mut att, mut client) = pair(config(dir.path()), 9);
    // Overwrite the whole header page with garbage (including the ring offsets).
    assert!(client.debug_scribble(0, &vec![f32::from_bits(0xffff_ffff); 1024]));
    still_works(&mut att, &mut client, 5);
    assert_eq!(att.geometry(), client.geometry());
}

#[test]
fn doorbell_spam_without_submissions_is_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mut att, mut client) = pair(config(dir.path()), 9);
    for _ in 0..1000 {
        client.debug_ring_doorbell().unwrap();
    }
    let w = att.wait(Some(Duration::from_millis(10))).unwrap();
    assert!(!w.control);
    assert!(att.next_submission().unwrap().is_none());
    // Drained: the next wait sleeps for its whole timeout instead of returning at once.
    let t0 = std::time::Instant::now();
    let w = att.wait(Some(Duration::from_millis(50))).unwrap();
    assert!(!w.doorbell && t0.elapsed() >= Duration::from_millis(45));
    still_works(&mut att, &mut client, 6);
}

#[test]
fn client_learns_the_daemon_is_gone_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let (server, att, mut client) = pair(config(dir.path()), 9);
    let t = client.alloc("x", 16).unwrap();
    client.submit(&t, Default::default()).unwrap();
    assert_eq!(server.live_attachments(), 1);
    drop(att); // the daemon reclaims the attachment (e.g. it is shutting down)
    assert_eq!(server.live_attachments(), 0);
    let t0 = std::time::Instant::now();
    assert!(matches!(client.wait_completion(WAIT), Err(dlcp_shm::TrainerError::DaemonGone)));
    assert!(t0.elapsed() < Duration::from_secs(2));
    // The client's own mapping stays valid after the daemon let go.
    assert_eq!(client.read(&t).unwrap().len(), 16);
}

#[test]
fn client_api_errors_are_typed() {
    use dlcp_shm::TrainerError;
    let dir = tempfile::tempdir().unwrap();
    let (_server, _att, mut client) = pair(config(dir.path()), 9);
    let arena = client.geometry().arena_size;
    let t = client.alloc("a", 10).unwrap();
    assert!(matches!(client.alloc("a", 10), Err(TrainerError::NameInUse(n)) if n == "a"));
    assert!(matches!(client.alloc("z", 0), Err(TrainerError::ZeroLength)));
    assert!(matches!(
        client.alloc("big", arena / 4),
        Err(TrainerError::ArenaFull { requested, largest_free }) if requested == arena && largest_free == arena - 64
    ));
    assert!(matches!(
        client.write(&t, &[1.0; 11]),
        Err(TrainerError::LengthMismatch { expected: 10, got: 11 })
    ));
    assert!(matches!(client.free("nope"), Err(TrainerError::UnknownTensor(_))));
    client.free("a").unwrap();
    assert!(client.tensor("a").is_none());
    let all = client.alloc("big", arena / 4).unwrap();
    assert_eq!(all.arena_offset, 0, "freed space is reused");
}
