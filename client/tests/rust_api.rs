//! The Rust API of `dlcp_client` against the fake reducer (see `common`).

mod common;

use std::time::Duration;

use common::{
    FAKE_DELIVERED_PPM, FAKE_REPAIRS, FakeReducer, HOLD_BUDGET_PPM, PEER_DOWN_BUDGET_PPM, WAIT, data,
    fake_shard,
};
use dlcp_client::{
    AttachArgs, BARRIER_TENSOR, Client, Error, ErrorCode, Opcode, Options, Reduce, Status, TensorId,
    TrainerError,
};

#[test]
fn allreduce_writes_the_result_back_and_reports() {
    let fake = FakeReducer::start();
    let mut c = Client::attach(fake.socket(), 1, 0, 1).unwrap();
    let a = c.alloc("a", 1000).unwrap();
    let b = c.alloc("b", 17).unwrap();
    assert_eq!((a, b), (TensorId(0), TensorId(1)), "ids in allocation order");
    assert_eq!(c.lookup("b"), Some(b));
    let t = c.tensor(b).unwrap();
    assert_eq!((t.name.as_str(), t.len_elems, t.arena_offset % 64), ("b", 17, 0));
    let x = data(1, 1000);
    c.write(a, &x).unwrap();
    let r = c.allreduce(a, Options::layer(2, 4).budget_ppm(10_000), WAIT).unwrap();
    assert_eq!((r.tensor, r.delivered_ppm, r.repairs), (a, FAKE_DELIVERED_PPM, FAKE_REPAIRS));
    assert_eq!(r.duration, Duration::from_micros(5));
    let want: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    assert_eq!(c.read(a).unwrap(), want);
    assert_eq!(c.in_flight(), 0);
    // A second op on the same tensor reduces the result again.
    let r2 = c.allreduce(a, Options::default(), WAIT).unwrap();
    assert!(r2.op_seq > r.op_seq);
    assert_eq!(c.read(a).unwrap(), x.iter().map(|v| v * 4.0).collect::<Vec<_>>());
    assert_eq!(fake.served(), 2);
}

#[test]
fn every_collective_is_submitted_as_asked_and_reports_its_shard() {
    let fake = FakeReducer::start();
    let mut c = Client::attach(fake.socket(), 1, 0, 1).unwrap();
    let a = c.alloc("a", 1000).unwrap();
    let x = data(1, 1000);
    c.write(a, &x).unwrap();
    let (off, len) = fake_shard(1000);
    let shard = off as usize..(off + len) as usize;
    let r = c.reduce_scatter(a, Options::default().reduce(Reduce::Average), WAIT).unwrap();
    assert_eq!((r.tensor, r.shard()), (a, shard.clone()));
    let r = c.allgather(a, Options::default(), WAIT).unwrap();
    assert_eq!(r.shard(), shard);
    let r = c.broadcast(a, 0, Options::default(), WAIT).unwrap();
    assert_eq!(r.shard(), 0..0, "no shard for a broadcast");
    let r = c.allreduce(a, Options::default(), WAIT).unwrap();
    assert_eq!(r.shard(), 0..0, "nor for an allreduce");
    // The fake doubled the tensor each time.
    assert_eq!(c.read(a).unwrap(), x.iter().map(|v| v * 16.0).collect::<Vec<_>>());
    // A barrier holds no tensor: `a` stays usable while one is in flight.
    let seq = c.submit_barrier(Options::default()).unwrap();
    c.write(a, &x).unwrap();
    let done = c.wait_for(seq, WAIT).unwrap();
    assert_eq!((done.status, done.tensor_id, done.shard_len), (Status::Ok, BARRIER_TENSOR.0, 0));
    let r = c.barrier(WAIT).unwrap();
    assert_eq!((r.tensor, r.op_seq), (BARRIER_TENSOR, seq + 1));
    assert_eq!(c.read(a).unwrap(), x, "the barriers left the tensor alone");
    // submit with a collective: the same as the convenience method.
    let seq = c.submit(a, Options::default().collective(Opcode::Allgather)).unwrap();
    assert_eq!(c.wait_for(seq, WAIT).unwrap().shard_len, len);
    assert_eq!(fake.served(), 7);
}

#[test]
fn data_ptr_is_the_shared_buffer() {
    let fake = FakeReducer::start();
    let mut c = Client::attach(fake.socket(), 2, 0, 1).unwrap();
    let t = c.alloc("grad", 64).unwrap();
    let p = c.data_ptr(t).unwrap();
    let x = data(2, 64);
    for (i, v) in x.iter().enumerate() {
        // SAFETY: `p` points to 64 f32 in the mapped arena (data_ptr's bounds check),
        // no op is in flight, and nothing else in this process accesses the tensor.
        unsafe { p.as_ptr().add(i).write_volatile(*v) };
    }
    assert_eq!(c.read(t).unwrap(), x, "written through the pointer, visible to the channel");
    c.allreduce(t, Options::default(), WAIT).unwrap();
    // SAFETY: as above; the completion was received, so the daemon is done with it.
    let back: Vec<f32> = (0..64).map(|i| unsafe { p.as_ptr().add(i).read_volatile() }).collect();
    assert_eq!(back, x.iter().map(|v| v * 2.0).collect::<Vec<_>>(), "result visible through the pointer");
}

#[test]
fn pipelined_ops_complete_in_any_order_and_wait_for_keeps_the_others() {
    let fake = FakeReducer::start();
    let mut c = Client::attach(fake.socket(), 3, 0, 1).unwrap();
    let ids: Vec<TensorId> = (0..4).map(|i| c.alloc(&format!("t{i}"), 100 + i).unwrap()).collect();
    for (i, &id) in ids.iter().enumerate() {
        c.write(id, &data(i as u64, 100 + i)).unwrap();
    }
    let seqs: Vec<u64> =
        ids.iter().enumerate().map(|(i, &id)| c.submit(id, Options::layer(i as u32, 4)).unwrap()).collect();
    assert_eq!(c.in_flight(), 4);
    // Busy while in flight: no second submit, no read, no write, no free.
    assert_eq!(c.submit(ids[0], Options::default()).unwrap_err().code(), ErrorCode::TensorBusy);
    assert!(matches!(c.read(ids[1]), Err(Error::TensorBusy { op_seq, .. }) if op_seq == seqs[1]));
    assert_eq!(c.write(ids[2], &[0.0; 102]).unwrap_err().code(), ErrorCode::TensorBusy);
    assert_eq!(c.free(ids[3]).unwrap_err().code(), ErrorCode::TensorBusy);
    // Wait for the last one first: the other three are kept.
    let last = c.wait_for(seqs[3], WAIT).unwrap();
    assert_eq!((last.op_seq, last.tensor_id, last.status), (seqs[3], 3, Status::Ok));
    let mut rest: Vec<u64> = (0..3).map(|_| c.wait(WAIT).unwrap().op_seq).collect();
    rest.sort();
    assert_eq!(rest, seqs[..3]);
    assert_eq!(c.try_completion().unwrap(), None);
    for (i, &id) in ids.iter().enumerate() {
        let want: Vec<f32> = data(i as u64, 100 + i).iter().map(|v| v * 2.0).collect();
        assert_eq!(c.read(id).unwrap(), want);
    }
    assert_eq!(c.wait_for(seqs[0], WAIT).unwrap_err().code(), ErrorCode::InvalidArg, "not in flight");
}

#[test]
fn argument_errors_are_typed_and_say_what_is_wrong() {
    let fake = FakeReducer::start();
    let mut c = Client::attach(fake.socket(), 4, 0, 1).unwrap();
    let t = c.alloc("w", 8).unwrap();
    let e = c.alloc("w", 8).unwrap_err();
    assert_eq!(e.code(), ErrorCode::NameInUse);
    assert!(e.to_string().contains("\"w\""), "{e}");
    assert_eq!(c.alloc("z", 0).unwrap_err().code(), ErrorCode::InvalidArg);
    let e = c.alloc("huge", 1 << 30).unwrap_err();
    assert_eq!(e.code(), ErrorCode::ArenaFull);
    assert!(e.to_string().contains("largest free"), "{e}");
    assert_eq!(c.submit(TensorId(7), Options::default()).unwrap_err().code(), ErrorCode::InvalidArg);
    assert_eq!(c.data_ptr(TensorId(7)).unwrap_err().code(), ErrorCode::InvalidArg);
    let e = c.submit(t, Options::layer(4, 4)).unwrap_err();
    assert!(e.to_string().contains("layer 4 is not below the layer count 4"), "{e}");
    assert_eq!(c.submit(t, Options::layer(0, 0)).unwrap_err().code(), ErrorCode::InvalidArg);
    assert_eq!(c.submit(t, Options::default().flags(1 << 9)).unwrap_err().code(), ErrorCode::InvalidArg);
    assert_eq!(c.write(t, &[1.0; 3]).unwrap_err().code(), ErrorCode::InvalidArg);
    assert_eq!(c.in_flight(), 0, "nothing was submitted");
    // Free, then the name and the space are available again; the old id is dead.
    c.free(t).unwrap();
    assert_eq!(c.read(t).unwrap_err().code(), ErrorCode::InvalidArg);
    let t2 = c.alloc("w", 8).unwrap();
    assert_ne!(t2, t);
    assert_eq!(Client::attach(fake.socket(), 4, 1, 1).unwrap_err().code(), ErrorCode::InvalidArg);
}

#[test]
fn failed_ops_timeouts_and_rejected_descriptors_are_errors() {
    let fake = FakeReducer::start();
    let mut c = Client::attach(fake.socket(), 5, 0, 1).unwrap();
    let t = c.alloc("t", 32).unwrap();
    let x = data(5, 32);
    c.write(t, &x).unwrap();
    // Completed with PeerDown: an OpFailed error carrying the completion; tensor untouched.
    let e = c.allreduce(t, Options::default().budget_ppm(PEER_DOWN_BUDGET_PPM), WAIT).unwrap_err();
    assert_eq!(e.code(), ErrorCode::OpFailed);
    assert!(e.to_string().contains("peer_down"), "{e}");
    match e {
        Error::OpFailed { completion, .. } => assert_eq!(completion.status, Status::PeerDown),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.read(t).unwrap(), x);
    // The daemon rejects a descriptor the client cannot judge (layer count above its limit).
    let e = c.allreduce(t, Options::layer(0, 1 << 20), WAIT).unwrap_err();
    assert!(e.to_string().contains("invalid_descriptor (detail 10: layer count out of range)"), "{e}");
    // ... and says why, naming the descriptor field and the values.
    assert!(
        e.to_string()
            .ends_with(": rejected descriptor: field layers: layer count 1048576 is not in 1..=65536"),
        "{e}"
    );
    match &e {
        Error::OpFailed { reason, .. } => assert!(reason.as_deref().unwrap().contains("layers")),
        other => panic!("{other:?}"),
    }
    // Through submit + wait: the completion comes back, its reason once on asking.
    let seq = c.submit(t, Options::default().budget_ppm(250_000)).unwrap();
    let done = c.wait_for(seq, WAIT).unwrap();
    assert_eq!(done.status, Status::InvalidDescriptor);
    let why = c.failure_reason(&done).unwrap();
    assert_eq!(
        why,
        "rejected descriptor: field budget_ppm: loss budget 250000 ppm exceeds the cap 100000 ppm"
    );
    assert_eq!(c.failure_reason(&done), None, "taken once");
    // Never completed: a timeout, and the tensor stays busy.
    let e = c
        .allreduce(t, Options::default().budget_ppm(HOLD_BUDGET_PPM), Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(e, Error::Channel(TrainerError::Timeout(d)) if d == Duration::from_millis(50)), "{e:?}");
    assert_eq!(e.code(), ErrorCode::Timeout);
    assert_eq!(c.in_flight(), 1);
    assert_eq!(c.submit(t, Options::default()).unwrap_err().code(), ErrorCode::TensorBusy);
    assert_eq!(c.try_completion().unwrap(), None);
    assert_eq!(c.wait(Duration::ZERO).unwrap_err().code(), ErrorCode::Timeout);
}

#[test]
fn attach_errors_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let e = Client::attach(dir.path().join("nobody.sock"), 1, 0, 1).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Connect);
    assert!(e.to_string().contains("is dlcpd running?"), "{e}");
    let fake = FakeReducer::start();
    let _first = Client::attach(fake.socket(), 6, 0, 2).unwrap();
    let e = Client::attach(fake.socket(), 6, 0, 2).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Rejected, "{e}");
    let e = Client::attach(fake.socket(), 6, 1, 3).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Rejected, "world size mismatch: {e}");
    assert!(Client::attach(fake.socket(), 6, 1, 2).is_ok());
}

#[test]
fn a_vanished_daemon_is_daemon_gone_not_a_hang() {
    let mut fake = FakeReducer::start();
    let mut c = Client::attach(fake.socket(), 7, 0, 1).unwrap();
    let t = c.alloc("t", 16).unwrap();
    c.submit(t, Options::default().budget_ppm(HOLD_BUDGET_PPM)).unwrap();
    fake.stop();
    let e = c.wait(WAIT).unwrap_err();
    assert_eq!(e.code(), ErrorCode::DaemonGone, "{e}");
}

#[test]
fn error_codes_are_distinct_negative_and_described() {
    let mut seen = std::collections::HashSet::new();
    for (i, code) in ErrorCode::ALL.into_iter().enumerate() {
        assert_eq!(code as i32, -(i as i32) - 1, "{code:?} numbered in order");
        assert_eq!(ErrorCode::from_raw(code as i32), Some(code));
        assert!(seen.insert(code.name()));
        assert!(code.name().starts_with("DLCP_ERR_"));
        assert!(!code.message().is_empty());
    }
    assert_eq!(ErrorCode::from_raw(0), None);
    assert_eq!(ErrorCode::from_raw(-17), None);
}

#[test]
fn op_seq_can_be_set_but_never_onto_an_op_in_flight() {
    let fake = FakeReducer::start();
    let mut c = Client::attach(fake.socket(), 8, 0, 1).unwrap();
    let t = c.alloc("t", 16).unwrap();
    let u = c.alloc("u", 16).unwrap();
    assert_eq!(c.next_op_seq(), 1);
    c.set_next_op_seq(50).unwrap();
    assert_eq!(c.allreduce(t, Options::default(), WAIT).unwrap().op_seq, 50);
    assert_eq!(c.next_op_seq(), 51);
    let held = c.submit(t, Options::default().budget_ppm(HOLD_BUDGET_PPM)).unwrap();
    assert_eq!(held, 51);
    for bad in [1, 51] {
        let e = c.set_next_op_seq(bad).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArg);
        assert!(e.to_string().contains("op 51 is still in flight"), "{e}");
    }
    c.set_next_op_seq(60).unwrap();
    assert_eq!(c.allreduce(u, Options::default(), WAIT).unwrap().op_seq, 60);
}

#[test]
fn world_and_rank_come_from_the_daemon_and_attach_env_takes_explicit_arguments_first() {
    let fake = FakeReducer::start();
    let args = AttachArgs {
        socket: Some(fake.socket().to_path_buf()),
        job: Some(21),
        local_rank: Some(1),
        local_world: Some(2),
    };
    // Explicit arguments: whatever the environment of this test process holds.
    let c = Client::attach_env(&args).unwrap();
    let w = c.world().unwrap();
    // The fake reducer is rank 0 of 1 daemon (ServerConfig's default place).
    assert_eq!((w.node_rank, w.nodes, w.local_rank, w.local_world), (0, 1, 1, 2));
    assert_eq!((w.rank(), w.size()), (1, 2));
    let bad = AttachArgs { socket: Some("/nonexistent/dlcpd.sock".into()), ..args };
    assert_eq!(Client::attach_env(&bad).unwrap_err().code(), ErrorCode::Connect);
}
