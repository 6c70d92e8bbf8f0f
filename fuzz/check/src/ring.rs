//! A hostile trainer against the daemon side of the shared-memory channel
//! (`dlcp_shm::Attachment`): descriptors of any content pushed through the
//! submission ring, wild ring indices, and scribbles on the segment.
//!
//! Each input binds a real server with a geometry and limits it chooses,
//! attaches a trainer built from the public pieces a hostile process has (the
//! register message, the reply and its fds, the mapped segment, a ring
//! producer and consumer — no `TrainerChannel`), then runs a script of
//! trainer and daemon steps. Checked:
//! - nothing panics, and a submission the daemon takes passed
//!   `SubmitDesc::validate` with its arena and limits: its span lies inside
//!   the arena and can be copied out;
//! - while the trainer keeps honest indices, the daemon takes exactly the
//!   descriptors pushed, in order, each accepted or rejected as `validate`
//!   says; it takes none only when it holds ops (back-pressure);
//! - a submission-ring error comes only after a wild tail the daemon read;
//! - while the completion ring's head has always been honest, completing a
//!   taken submission never fails (no completion is ever dropped).

use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlcp_shm::control::{REPLY_LEN, Reply, recv_with_fds};
use dlcp_shm::layout::{DESC_WORDS, ElemType, Opcode, RING_HEAD_OFFSET, RING_TAIL_OFFSET};
use dlcp_shm::mapping::Mapping;
use dlcp_shm::ring::{Consumer, Producer, RingLayout};
use dlcp_shm::{
    Attachment, ChannelError, CompleteError, Geometry, Limits, Registration, ServerConfig, ShmServer, Status,
    Submission, SubmitDesc,
};

use crate::input::Input;

/// A valid descriptor for `len_elems` f32 at `offset`.
fn good(offset: u64, len_elems: u64) -> SubmitDesc {
    SubmitDesc {
        op_seq: 1,
        cookie: 7,
        arena_offset: offset,
        len_elems,
        tensor_id: 3,
        layer: 0,
        layers: 1,
        budget_ppm: 0,
        flags: 0,
        dtype: ElemType::F32 as u16,
        opcode: Opcode::AllReduce as u16,
        reduce: 0,
        reserved: [0; 3],
        root: 0,
    }
}

/// A descriptor from the input: a valid one with one field changed, or raw words.
fn descriptor(input: &mut Input<'_>, arena: u64) -> SubmitDesc {
    let mut d = good(64 * (input.u16() as u64 % (arena / 64)), 1 + input.u8() as u64);
    d.op_seq = u64::from(input.u8());
    d.cookie = u64::from(input.u8());
    let v = input.u64();
    match input.u8() % 14 {
        0 => d.arena_offset = v,
        1 => d.len_elems = v,
        2 => d.tensor_id = v as u32,
        3 => d.layer = v as u32,
        4 => d.layers = v as u32,
        5 => d.budget_ppm = v as u32,
        6 => d.flags = v as u32,
        7 => d.dtype = v as u16,
        8 => d.opcode = v as u16,
        9 => {
            d.reduce = v as u8;
            d.reserved.copy_from_slice(&v.to_le_bytes()[1..4]);
            d.root = u32::from_le_bytes(v.to_le_bytes()[4..].try_into().expect("4 bytes"));
        }
        10 => {
            let mut w = [0u64; DESC_WORDS];
            w.iter_mut().for_each(|x| *x = input.u64());
            d = SubmitDesc::from_words(w);
        }
        _ => {}
    }
    d
}

/// The trainer's side: its mapping, its ends of the rings, what it pushed.
struct Trainer {
    _stream: UnixStream,
    map: Mapping,
    g: Geometry,
    sq: Producer,
    cq: Consumer,
    /// Pushed and not yet taken, while the indices were honest.
    pushed: VecDeque<SubmitDesc>,
    /// The shared submission tail is not the producer's.
    wild_tail: bool,
    /// The completion head was ever wild: the daemon may have taken ops, and
    /// posted completions, on the strength of slots that were not free
    /// (documented: with wild completion indices only the ring's size bounds
    /// the ops), so a full or overfull ring later is the trainer's doing.
    head_lied: bool,
    /// The daemon read the ring under a wild tail: what it holds is unknown.
    desync: bool,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// Bind a server with `g` and `limits` and attach a trainer to it.
fn setup(g: Geometry, limits: Limits) -> (ShmServer, Attachment, Trainer) {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("dlcp-fuzz-ring-{}-{n}.sock", std::process::id()));
    let mut cfg = ServerConfig::new(&path, 0o600);
    cfg.geometry = g;
    cfg.limits = limits;
    cfg.handshake_timeout = Duration::from_secs(5);
    let mut server = ShmServer::bind(cfg).expect("bind the control socket");
    let mut stream = UnixStream::connect(&path).expect("connect");
    let reg = Registration { job_id: 1, local_rank: 0, local_world: 1 };
    stream.write_all(&reg.encode()).expect("send the register message");
    let att = loop {
        server.wait_acceptable(Some(Duration::from_secs(5))).expect("wait");
        if let Some(a) = server.accept().expect("accept") {
            break a;
        }
    };
    let mut reply = [0u8; REPLY_LEN];
    let fds = recv_with_fds(stream.as_fd(), &mut reply).expect("reply");
    let Ok(Reply::Accepted { geometry, .. }) = Reply::decode(&reply) else { panic!("refused") };
    assert_eq!(geometry, g);
    let map = Mapping::map(fds[0].as_fd(), g.total_size).expect("map the segment");
    let trainer = Trainer {
        _stream: stream,
        map,
        g,
        sq: Producer::new(RingLayout { ctl: g.sq_offset, capacity: g.sq_capacity }),
        cq: Consumer::new(RingLayout { ctl: g.cq_offset, capacity: g.cq_capacity }),
        pushed: VecDeque::new(),
        wild_tail: false,
        head_lied: false,
        desync: false,
    };
    (server, att, trainer)
}

/// Run one input.
pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    let cap = |input: &mut Input<'_>| 2u32 << input.below(5);
    let g = Geometry::new(cap(&mut input), cap(&mut input), 4096 * (1 + input.below(4) as u64))
        .expect("geometry");
    let limits = Limits {
        max_tensor_ids: input.pick(&[1 << 20, 4, 1]),
        max_layers: input.pick(&[1 << 16, 1, 3]),
        max_budget_ppm: input.pick(&[100_000, 0]),
        max_tensor_bytes: input.pick(&[u64::MAX, 4096, 64, 4]),
        nodes: input.pick(&[u32::MAX, 4, 1]),
    };
    let (_server, mut att, mut t) = setup(g, limits);
    let mut taken: Vec<Submission> = Vec::new();
    for _ in 0..96 {
        if input.is_empty() {
            break;
        }
        match input.u8() % 10 {
            0..=2 => {
                let d = descriptor(&mut input, g.arena_size);
                if t.sq.push(&t.map, &d.to_words()) == Ok(true) {
                    t.pushed.push_back(d);
                    t.wild_tail = false; // the push published the producer's own tail
                }
            }
            3 => {
                let v = input.u32();
                t.map.atomic_u32(g.sq_offset + RING_TAIL_OFFSET).store(v, Ordering::Release);
                t.wild_tail = v != t.sq.tail();
            }
            4 => {
                t.map.atomic_u32(g.sq_offset + RING_TAIL_OFFSET).store(t.sq.tail(), Ordering::Release);
                t.wild_tail = false;
            }
            5 => {
                let v = if input.bool() { input.u32() } else { t.cq.head() };
                t.map.atomic_u32(g.cq_offset + RING_HEAD_OFFSET).store(v, Ordering::Release);
                t.head_lied |= v != t.cq.head();
            }
            6 => {
                // Scribble on the header or the arena (the rings' words are the cases above).
                let words: Vec<u64> = (0..1 + input.below(8)).map(|_| input.u64()).collect();
                let off = if input.bool() {
                    8 * input.below(64) as u64
                } else {
                    g.arena_offset + 8 * input.below(512) as u64
                };
                let _ = t.map.store_words(off.min(g.total_size - 64), &words);
            }
            7 => {
                if t.cq.pop(&t.map).is_err() {
                    assert!(t.head_lied, "completion ring error with honest indices");
                }
            }
            8 if !taken.is_empty() => {
                let s = taken.swap_remove(input.below(taken.len()));
                let r = att.complete_submission(&s, Status::Ok, 1_000_000, 0, Duration::ZERO);
                match r {
                    Ok(()) => {}
                    Err(CompleteError::Full) => assert!(t.head_lied, "a completion was dropped: ring full"),
                    Err(CompleteError::Ring(e)) => assert!(t.head_lied, "{e}"),
                }
            }
            _ => take(&mut att, &mut t, &mut taken, &limits),
        }
    }
    let _ = att.liveness();
}

/// The daemon takes the next submission; check it against what was pushed.
fn take(att: &mut Attachment, t: &mut Trainer, taken: &mut Vec<Submission>, limits: &Limits) {
    let arena = t.g.arena_size;
    t.desync |= t.wild_tail;
    let honest = !t.desync;
    match att.next_submission() {
        Ok(Some(s)) => {
            assert!(s.span.offset % 64 == 0 && s.span.offset + s.span.bytes() <= arena, "{s:?}");
            assert!(s.span.bytes() <= limits.max_tensor_bytes && s.tensor_id < limits.max_tensor_ids);
            let v =
                att.copy_from_arena(s.span.offset, s.span.len_elems).expect("a validated span copies out");
            assert_eq!(v.len() as u64, s.span.len_elems);
            if honest {
                let d = t.pushed.pop_front().expect("the daemon took a descriptor never pushed");
                assert_eq!(d.validate(arena, limits), Ok(s));
            }
            taken.push(s);
        }
        Ok(None) => {
            let cq_tail = t.map.atomic_u32(t.g.cq_offset + RING_TAIL_OFFSET).load(Ordering::Acquire);
            let cq_full = cq_tail.wrapping_sub(t.cq.head()) >= t.g.cq_capacity;
            if honest && !t.head_lied && !cq_full && taken.is_empty() {
                assert!(t.pushed.is_empty(), "descriptors pushed, nothing outstanding, none taken");
            }
        }
        Err(ChannelError::Rejected { op_seq, cookie, error }) => {
            if honest {
                let d = t.pushed.pop_front().expect("the daemon rejected a descriptor never pushed");
                assert_eq!(d.validate(arena, limits), Err(error));
                assert_eq!((op_seq, cookie), (d.op_seq, d.cookie));
            }
        }
        // A wild tail now, or one the daemon read before (it may have taken
        // slots past the real tail: once the trainer restores it, the ring
        // reads as corrupted, rightly).
        Err(ChannelError::Ring(e)) => assert!(t.desync, "ring error with honest indices: {e}"),
    }
}
