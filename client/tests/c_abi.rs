//! The C ABI called from Rust: the happy path against the fake reducer, and every
//! entry point with NULL pointers, garbage and detached handles, bad tensors —
//! each must give its documented error code and a message, never UB or a panic.

mod common;

use std::ffi::{CStr, CString, c_char, c_int};
use std::ptr::{null, null_mut};

use ::dlcp_client::ErrorCode;
use ::dlcp_client::capi::*;
use common::{FakeReducer, HOLD_BUDGET_PPM, PEER_DOWN_BUDGET_PPM, data};

const E_NULL: c_int = ErrorCode::NullArg as c_int;
const E_HANDLE: c_int = ErrorCode::BadHandle as c_int;
const E_ARG: c_int = ErrorCode::InvalidArg as c_int;

fn s(p: *const c_char) -> String {
    assert!(!p.is_null());
    // SAFETY: the library's strings are NUL-terminated and valid until the next call on this thread.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned()
}

fn last(c: *mut dlcp_client) -> String {
    s(dlcp_last_error(c))
}

fn attach(path: &std::path::Path, job: u64) -> *mut dlcp_client {
    let p = CString::new(path.to_str().unwrap()).unwrap();
    let mut c = null_mut();
    assert_eq!(dlcp_attach(p.as_ptr(), job, 0, 1, &mut c), DLCP_OK, "{}", last(null_mut()));
    assert!(!c.is_null());
    c
}

#[test]
fn happy_path_writes_in_place_and_reads_the_result_in_place() {
    let fake = FakeReducer::start();
    let c = attach(fake.socket(), 1);
    let mut t: dlcp_tensor = 99;
    assert_eq!(dlcp_alloc(c, c"grad".as_ptr(), 256, &mut t), DLCP_OK);
    assert_eq!(t, 0);
    let mut n = 0u64;
    assert_eq!(dlcp_tensor_len(c, t, &mut n), DLCP_OK);
    assert_eq!(n, 256);
    let p = dlcp_tensor_data(c, t);
    assert!(!p.is_null());
    assert_eq!(p as usize % 64, 0, "tensors are cache-line aligned");
    let x = data(1, 256);
    // SAFETY: `p` points to 256 f32 of the arena; no op is in flight.
    unsafe { std::ptr::copy_nonoverlapping(x.as_ptr(), p, 256) };
    let mut seq = 0u64;
    assert_eq!(dlcp_submit(c, t, 1, 3, 10_000, 0, &mut seq), DLCP_OK);
    assert_eq!(seq, 1);
    let mut done = dlcp_completion::default();
    assert_eq!(dlcp_wait(c, 10_000, &mut done), DLCP_OK);
    assert_eq!((done.op_seq, done.tensor, done.status), (seq, t, 0));
    assert_eq!(s(dlcp_status_str(done.status)), "ok");
    let mut back = vec![0f32; 256];
    // SAFETY: as above; the completion was received, so the daemon is done with the buffer.
    unsafe { std::ptr::copy_nonoverlapping(p, back.as_mut_ptr(), 256) };
    assert_eq!(back, x.iter().map(|v| v * 2.0).collect::<Vec<_>>());
    // allreduce = submit + wait; out is optional.
    assert_eq!(dlcp_allreduce(c, t, 0, 1, 0, DLCP_FLAG_RESCALE_FOR_TEST, 10_000, null_mut()), DLCP_OK);
    // Submit with the optional op_seq pointer NULL, then wait for that op.
    assert_eq!(dlcp_submit(c, t, 0, 1, 0, 0, null_mut()), DLCP_OK);
    assert_eq!(dlcp_wait_op(c, 3, 10_000, &mut done), DLCP_OK);
    assert_eq!(done.op_seq, 3);
    assert_eq!(last(c), "", "no failure on this handle yet");
    assert_eq!(dlcp_detach(c), DLCP_OK);
    assert_eq!(dlcp_detach(c), E_HANDLE, "double detach is an error, not UB");
}

/// Whether `fd` is readable within `ms` milliseconds (`poll`, as a C caller of
/// `dlcp_wait_fds` would).
fn readable(fd: c_int, ms: c_int) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
    n == 1 && p.revents & libc::POLLIN != 0
}

#[test]
fn wait_fds_wake_a_poller_for_each_completion_and_for_the_daemon_gone() {
    let mut fake = FakeReducer::start();
    let c = attach(fake.socket(), 1);
    let mut fds = dlcp_fds { completion: -1, control: -1 };
    assert_eq!(dlcp_wait_fds(null_mut(), &mut fds), E_NULL);
    assert_eq!(dlcp_wait_fds(c, null_mut()), E_NULL);
    assert_eq!(dlcp_wait_fds(c, &mut fds), DLCP_OK, "{}", last(c));
    assert!(fds.completion >= 0 && fds.control >= 0 && fds.completion != fds.control, "{fds:?}");
    let mut t: dlcp_tensor = 0;
    assert_eq!(dlcp_alloc(c, c"grad".as_ptr(), 64, &mut t), DLCP_OK);
    let mut done = dlcp_completion::default();
    for round in 1..=3u64 {
        // Nothing in flight: a poller sleeps, and a zero-timeout wait drains.
        assert_eq!(dlcp_wait(c, 0, &mut done), ErrorCode::Timeout as c_int);
        assert!(!readable(fds.completion, 50), "round {round}: readable with nothing completed");
        assert_eq!(dlcp_submit(c, t, 0, 1, 0, 0, null_mut()), DLCP_OK);
        // The completion wakes the poller, which takes it without blocking.
        assert!(readable(fds.completion, 10_000), "round {round}: no wake-up for the completion");
        assert_eq!(dlcp_wait(c, 0, &mut done), DLCP_OK, "{}", last(c));
        assert_eq!((done.op_seq, done.status), (round, 0));
    }
    // The daemon gone: the control socket wakes the poller, and a short wait says so.
    assert_eq!(dlcp_submit(c, t, 0, 1, HOLD_BUDGET_PPM, 0, null_mut()), DLCP_OK);
    fake.stop();
    assert!(readable(fds.control, 10_000), "no wake-up for the daemon gone");
    assert_eq!(dlcp_wait(c, 5, &mut done), ErrorCode::DaemonGone as c_int, "{}", last(c));
    assert_eq!(dlcp_detach(c), DLCP_OK);
    assert_eq!(dlcp_wait_fds(c, &mut fds), E_HANDLE, "a detached handle");
}

/// `DLCP_FLAG_RESCALE` from the header.
const DLCP_FLAG_RESCALE_FOR_TEST: u32 = 0x1;

#[test]
fn null_pointers_give_null_arg_with_a_message() {
    let fake = FakeReducer::start();
    let path = CString::new(fake.socket().to_str().unwrap()).unwrap();
    let mut c = null_mut();
    assert_eq!(dlcp_attach(null(), 1, 0, 1, &mut c), E_NULL);
    assert!(last(null_mut()).contains("dlcp_attach: socket_path is NULL"), "{}", last(null_mut()));
    assert_eq!(dlcp_attach(path.as_ptr(), 1, 0, 1, null_mut()), E_NULL);
    let c = attach(fake.socket(), 2);
    let mut t = 0;
    let mut n = 0u64;
    let mut done = dlcp_completion::default();
    // A NULL handle everywhere.
    assert_eq!(dlcp_alloc(null_mut(), c"x".as_ptr(), 4, &mut t), E_NULL);
    assert!(last(null_mut()).contains("client handle is NULL"));
    assert_eq!(dlcp_tensor_len(null_mut(), 0, &mut n), E_NULL);
    assert!(dlcp_tensor_data(null_mut(), 0).is_null());
    assert_eq!(dlcp_submit(null_mut(), 0, 0, 1, 0, 0, null_mut()), E_NULL);
    assert_eq!(dlcp_wait(null_mut(), 0, &mut done), E_NULL);
    assert_eq!(dlcp_wait_op(null_mut(), 1, 0, &mut done), E_NULL);
    assert_eq!(dlcp_allreduce(null_mut(), 0, 0, 1, 0, 0, 0, null_mut()), E_NULL);
    let (o, l) = (null_mut(), null_mut());
    assert_eq!(dlcp_reduce_scatter(null_mut(), 0, 0, 1, 0, 0, 0, 0, null_mut(), o, l), E_NULL);
    assert_eq!(dlcp_allgather(null_mut(), 0, 0, 1, 0, 0, null_mut(), o, l), E_NULL);
    assert_eq!(dlcp_broadcast(null_mut(), 0, 0, 0, 1, 0, 0, null_mut()), E_NULL);
    assert_eq!(dlcp_barrier(null_mut(), 0, null_mut()), E_NULL);
    assert!(last(null_mut()).contains("dlcp_barrier"), "{}", last(null_mut()));
    assert_eq!(dlcp_next_op_seq(null_mut(), &mut n), E_NULL);
    assert_eq!(dlcp_set_next_op_seq(null_mut(), 5), E_NULL);
    assert_eq!(dlcp_next_op_seq(c, null_mut()), E_NULL);
    let mut w = dlcp_world::default();
    assert_eq!(dlcp_get_world(null_mut(), &mut w), E_NULL);
    assert_eq!(dlcp_get_world(c, null_mut()), E_NULL);
    assert_eq!(dlcp_attach_env(null(), 1, 0, 1, null_mut()), E_NULL);
    assert_eq!(dlcp_detach(null_mut()), DLCP_OK, "detach(NULL) is a no-op like free(NULL)");
    // NULL arguments on a live handle: refused before anything happens.
    assert_eq!(dlcp_alloc(c, null(), 4, &mut t), E_NULL);
    assert!(last(c).contains("dlcp_alloc: name is NULL"), "{}", last(c));
    assert_eq!(dlcp_alloc(c, c"x".as_ptr(), 4, null_mut()), E_NULL);
    assert!(last(c).contains("out_tensor is NULL"), "{}", last(c));
    assert_eq!(dlcp_alloc(c, c"x".as_ptr(), 4, &mut t), DLCP_OK, "the refused call allocated nothing");
    assert_eq!(dlcp_tensor_len(c, t, null_mut()), E_NULL);
    assert_eq!(dlcp_wait(c, 0, null_mut()), E_NULL);
    assert_eq!(dlcp_wait_op(c, 1, 0, null_mut()), E_NULL);
    // A misaligned output pointer is refused too.
    let mut buf = [0u64; 2];
    let mis = (buf.as_mut_ptr() as *mut u8).wrapping_add(1) as *mut u64;
    assert_eq!(dlcp_tensor_len(c, t, mis), E_ARG);
    assert!(last(c).contains("misaligned"), "{}", last(c));
    // ... before the op runs: a shard out-param too.
    let before = dlcp_next_op_seq(c, &mut n);
    assert_eq!(dlcp_reduce_scatter(c, t, 0, 1, 0, 0, 0, 1000, null_mut(), mis, null_mut()), E_ARG);
    assert!(last(c).contains("out_shard_offset"), "{}", last(c));
    let mut m = 0u64;
    assert_eq!((before, dlcp_next_op_seq(c, &mut m), m), (DLCP_OK, DLCP_OK, n), "nothing was submitted");
    assert_eq!(dlcp_detach(c), DLCP_OK);
}

#[test]
fn garbage_and_detached_handles_give_bad_handle() {
    let fake = FakeReducer::start();
    let c = attach(fake.socket(), 3);
    assert_eq!(dlcp_detach(c), DLCP_OK);
    let garbage = [c, 0xdead_beef_usize as *mut dlcp_client, 8 as *mut dlcp_client, usize::MAX as *mut _];
    for h in garbage {
        let mut t = 0;
        let mut n = 0u64;
        let mut done = dlcp_completion::default();
        assert_eq!(dlcp_alloc(h, c"x".as_ptr(), 4, &mut t), E_HANDLE);
        assert!(last(null_mut()).contains("is not a live dlcp_client handle"), "{}", last(null_mut()));
        assert!(last(h).contains("is not a live dlcp_client handle"));
        assert_eq!(dlcp_tensor_len(h, 0, &mut n), E_HANDLE);
        assert!(dlcp_tensor_data(h, 0).is_null());
        assert_eq!(dlcp_submit(h, 0, 0, 1, 0, 0, null_mut()), E_HANDLE);
        assert_eq!(dlcp_wait(h, 0, &mut done), E_HANDLE);
        assert_eq!(dlcp_wait_op(h, 1, 0, &mut done), E_HANDLE);
        assert_eq!(dlcp_allreduce(h, 0, 0, 1, 0, 0, 0, null_mut()), E_HANDLE);
        assert_eq!(dlcp_next_op_seq(h, &mut n), E_HANDLE);
        assert_eq!(dlcp_set_next_op_seq(h, 5), E_HANDLE);
        assert_eq!(dlcp_get_world(h, &mut dlcp_world::default()), E_HANDLE);
        assert_eq!(dlcp_detach(h), E_HANDLE);
    }
    // A new attachment gets a new handle value, never the detached one.
    // (Another job: the fake reducer may not have noticed the detach yet, so job 3 rank 0 can still be taken.)
    let c2 = attach(fake.socket(), 33);
    assert_ne!(c2, c);
    assert_eq!(dlcp_detach(c2), DLCP_OK);
}

#[test]
fn bad_arguments_and_failed_ops_give_their_codes_and_messages() {
    let fake = FakeReducer::start();
    let c = attach(fake.socket(), 4);
    let mut t = 0;
    assert_eq!(dlcp_alloc(c, c"w".as_ptr(), 8, &mut t), DLCP_OK);
    let mut t2 = 77;
    assert_eq!(dlcp_alloc(c, c"w".as_ptr(), 8, &mut t2), ErrorCode::NameInUse as c_int);
    assert_eq!(t2, 77, "output untouched on failure");
    assert!(last(c).contains("\"w\""), "{}", last(c));
    assert_eq!(dlcp_alloc(c, c"\xff\xfe".as_ptr(), 8, &mut t2), E_ARG);
    assert!(last(c).contains("UTF-8"));
    assert_eq!(dlcp_alloc(c, c"z".as_ptr(), 0, &mut t2), E_ARG);
    assert_eq!(dlcp_alloc(c, c"big".as_ptr(), u64::MAX, &mut t2), ErrorCode::ArenaFull as c_int);
    let mut n = 0u64;
    assert_eq!(dlcp_tensor_len(c, 5, &mut n), E_ARG);
    assert!(dlcp_tensor_data(c, 5).is_null());
    assert!(last(c).contains("dlcp_tensor_data: no tensor with id 5"), "{}", last(c));
    assert_eq!(dlcp_submit(c, 5, 0, 1, 0, 0, null_mut()), E_ARG);
    assert_eq!(dlcp_submit(c, t, 1, 1, 0, 0, null_mut()), E_ARG);
    assert_eq!(dlcp_submit(c, t, 0, 1, 0, 0x80, null_mut()), E_ARG);
    assert!(last(c).contains("unknown flag bits 0x80"), "{}", last(c));
    let mut done = dlcp_completion::default();
    assert_eq!(dlcp_wait(c, 0, &mut done), ErrorCode::Timeout as c_int, "nothing in flight: poll times out");
    // An op that completes with PEER_DOWN: OP_FAILED and the completion is filled in.
    let rc = dlcp_allreduce(c, t, 0, 1, PEER_DOWN_BUDGET_PPM, 0, 10_000, &mut done);
    assert_eq!(rc, ErrorCode::OpFailed as c_int);
    assert_eq!(done.status, 3);
    assert_eq!(s(dlcp_status_str(done.status)), "peer_down");
    assert!(last(c).contains("peer_down"), "{}", last(c));
    // A descriptor the daemon rejects: the message names the field.
    let rc = dlcp_allreduce(c, t, 0, 1, 150_000, 0, 10_000, &mut done);
    assert_eq!((rc, done.status), (ErrorCode::OpFailed as c_int, 1));
    assert!(last(c).contains("field budget_ppm: loss budget 150000 ppm exceeds the cap"), "{}", last(c));
    // An op that never completes: TIMEOUT, then the tensor is busy.
    let rc = dlcp_allreduce(c, t, 0, 1, HOLD_BUDGET_PPM, 0, 30, &mut done);
    assert_eq!(rc, ErrorCode::Timeout as c_int);
    assert_eq!(dlcp_submit(c, t, 0, 1, 0, 0, null_mut()), ErrorCode::TensorBusy as c_int);
    assert!(last(c).contains("in flight"), "{}", last(c));
    let mut next = 0u64;
    assert_eq!(dlcp_next_op_seq(c, &mut next), DLCP_OK);
    assert_eq!(dlcp_set_next_op_seq(c, next - 1), E_ARG, "onto the held op");
    assert!(last(c).contains("still in flight"), "{}", last(c));
    assert_eq!(dlcp_set_next_op_seq(c, next + 10), DLCP_OK);
    assert_eq!(dlcp_detach(c), DLCP_OK);
    // Attach failures: per-thread last error.
    let mut h = 0x1234 as *mut dlcp_client;
    assert_eq!(
        dlcp_attach(c"/nonexistent/dlcpd.sock".as_ptr(), 1, 0, 1, &mut h),
        ErrorCode::Connect as c_int
    );
    assert!(h.is_null(), "*out is NULL after a failed attach");
    assert!(
        last(null_mut()).starts_with("dlcp_attach: attach failed: cannot connect"),
        "{}",
        last(null_mut())
    );
    assert_eq!(dlcp_attach(c"/x".as_ptr(), 1, 2, 2, &mut h), E_ARG);
}

#[test]
fn get_world_tells_rank_and_size() {
    let fake = FakeReducer::start();
    let p = CString::new(fake.socket().to_str().unwrap()).unwrap();
    let mut c = null_mut();
    assert_eq!(dlcp_attach_env(p.as_ptr(), 6, 2, 3, &mut c), DLCP_OK, "{}", last(null_mut()));
    let mut w = dlcp_world::default();
    assert_eq!(dlcp_get_world(c, &mut w), DLCP_OK);
    let want = dlcp_world { rank: 2, size: 3, node_rank: 0, nodes: 1, local_rank: 2, local_world: 3 };
    assert_eq!(w, want);
    assert_eq!(size_of::<dlcp_world>(), 24);
    assert_eq!(dlcp_detach(c), DLCP_OK);
}

#[test]
fn strerror_and_status_str_cover_every_value() {
    assert_eq!(s(dlcp_strerror(DLCP_OK)), "success");
    for code in ErrorCode::ALL {
        let m = s(dlcp_strerror(code as c_int));
        assert_eq!(m, code.message().to_str().unwrap());
        assert!(!m.is_empty());
    }
    for bad in [1, -17, i32::MIN, i32::MAX] {
        assert_eq!(s(dlcp_strerror(bad)), "unknown dlcp error code");
    }
    let names: Vec<String> = (0..6).map(|st| s(dlcp_status_str(st))).collect();
    assert_eq!(names, ["ok", "invalid_descriptor", "timeout", "peer_down", "shutdown", "unknown"]);
    assert_eq!(s(dlcp_status_str(u32::MAX)), "unknown");
    assert_eq!(s(dlcp_version()), ::dlcp_client::VERSION);
}

#[test]
fn a_handle_is_usable_from_several_threads() {
    let fake = FakeReducer::start();
    let c = attach(fake.socket(), 5) as usize;
    let threads: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let c = c as *mut dlcp_client;
                let name = CString::new(format!("t{i}")).unwrap();
                let mut t = 0;
                assert_eq!(dlcp_alloc(c, name.as_ptr(), 32, &mut t), DLCP_OK);
                for _ in 0..10 {
                    assert_eq!(dlcp_allreduce(c, t, 0, 1, 0, 0, 10_000, null_mut()), DLCP_OK, "{}", last(c));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(fake.served(), 40);
    assert_eq!(dlcp_detach(c as *mut dlcp_client), DLCP_OK);
}

#[test]
fn a_thread_waiting_does_not_hold_up_other_calls_on_the_handle() {
    use std::time::{Duration, Instant};
    let fake = FakeReducer::start();
    let c = attach(fake.socket(), 6) as usize;
    let mut t: dlcp_tensor = 0;
    assert_eq!(dlcp_alloc(c as *mut dlcp_client, c"w".as_ptr(), 32, &mut t), DLCP_OK);

    // A waiter sleeps in dlcp_wait (up to 5 s) with nothing in flight; this
    // thread's submit goes through at once, and the waiter gets its completion.
    let waiter = std::thread::spawn(move || {
        let mut done = dlcp_completion::default();
        let t0 = Instant::now();
        let rc = dlcp_wait(c as *mut dlcp_client, 5_000, &mut done);
        (rc, done, t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let mut seq = 0u64;
    assert_eq!(dlcp_submit(c as *mut dlcp_client, t, 0, 1, 0, 0, &mut seq), DLCP_OK);
    let submit_took = t0.elapsed();
    assert!(submit_took < Duration::from_secs(1), "submit waited {submit_took:?} for the waiting thread");
    let (rc, done, waited) = waiter.join().unwrap();
    assert_eq!(rc, DLCP_OK, "{}", last(c as *mut dlcp_client));
    assert_eq!((done.op_seq, done.status), (seq, 0));
    assert!(waited < Duration::from_secs(3), "the waiter took {waited:?} to see the completion");

    // A timed wait still times out on time.
    let mut done = dlcp_completion::default();
    let t0 = Instant::now();
    assert_eq!(dlcp_wait(c as *mut dlcp_client, 300, &mut done), ErrorCode::Timeout as c_int);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "a 300 ms wait took {took:?}"
    );

    // Another thread detaching the handle ends a wait (within a second) with
    // DLCP_ERR_BAD_HANDLE, not at its timeout.
    // (The fake reducer never completes an op with HOLD_BUDGET_PPM.)
    assert_eq!(dlcp_submit(c as *mut dlcp_client, t, 0, 1, HOLD_BUDGET_PPM, 0, &mut seq), DLCP_OK);
    let waiter = std::thread::spawn(move || {
        let mut done = dlcp_completion::default();
        let t0 = Instant::now();
        (dlcp_wait_op(c as *mut dlcp_client, seq, 8_000, &mut done), t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(dlcp_detach(c as *mut dlcp_client), DLCP_OK);
    let (rc, waited) = waiter.join().unwrap();
    assert_eq!(rc, E_HANDLE, "wait_op on a handle detached meanwhile");
    assert!(waited < Duration::from_secs(4), "the waiter noticed the detach only after {waited:?}");
}
