//! The trainer's end of the channel: [`TrainerChannel`], one per attachment.
//!
//! It holds everything a trainer process has of the channel, once: the control
//! connection (the attach handshake; its closing is how each side learns that the
//! other is gone), the **one** shared mapping of the segment, the submission and
//! completion rings, the two doorbells, and the **one** tensor registry of the
//! arena (allocator, names, ids in allocation order).
//!
//! It speaks the channel and nothing more. It does not judge what it submits (the
//! daemon validates every descriptor) and does not enforce the in-flight rules
//! (a tensor owned by the daemon between submit and completion): that belongs to
//! the user API built on it, `dlcp_client::Client` (Rust, the C ABI and the
//! Python package), which adds typed handles, argument checks, busy tensors and
//! waits for one particular op, and keeps no state of the channel's own.
//!
//! Tensor bytes move either by copy ([`TrainerChannel::write`] /
//! [`TrainerChannel::read`]) or in place through [`TrainerChannel::data_ptr`], a
//! raw pointer into that same mapping (what C code and numpy views use).
//!
//! Hooks that let tests behave like a buggy or hostile trainer (push raw
//! descriptors, corrupt ring indices, ring the doorbell idly, scribble on the
//! segment, reach the memfd) exist only with the `debug-hooks` cargo feature,
//! which only test builds enable.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::alloc::ArenaAllocator;
use super::control::{self, BadReply, JobPlace, REPLY_FDS, REPLY_LEN, Registration, RejectReason, Reply};
use super::doorbell::{Doorbell, poll_readable};
use super::layout::{
    CompletionDesc, DESC_WORDS, ElemType, Geometry, GeometryError, Opcode, Reduce, SegmentHeader, Status,
    SubmitDesc,
};
use super::mapping::Mapping;
use super::notes::Inbox;
use super::ring::{Consumer, Producer, RingError, RingLayout};

/// Attaching to the daemon failed.
#[derive(Debug, Error)]
pub enum AttachError {
    /// No daemon at the socket path, or no permission to connect.
    #[error(
        "cannot connect to the daemon's control socket: {0} (is dlcpd running? check control.socket_path/socket_mode)"
    )]
    Connect(io::Error),
    /// The control exchange failed (daemon hung up or timed out).
    #[error("control socket I/O failed during attach: {0}")]
    Io(io::Error),
    /// The daemon refused us.
    #[error("daemon refused the attachment: {0}")]
    Rejected(RejectReason),
    /// The reply did not parse.
    #[error(transparent)]
    BadReply(#[from] BadReply),
    /// The reply came with the wrong number of fds.
    #[error("daemon sent {0} fds, expected {REPLY_FDS}")]
    MissingFds(usize),
    /// The memfd is not the size the reply announced.
    #[error("segment is {found} bytes, the daemon announced {expected}")]
    SizeMismatch {
        /// Size from fstat.
        found: u64,
        /// Size from the reply.
        expected: u64,
    },
    /// The segment header is invalid or disagrees with the reply.
    #[error("segment header invalid: {0}")]
    Header(#[from] GeometryError),
    /// The segment header names another attachment or registration.
    #[error("segment header identity disagrees with the reply (attachment id / job / rank)")]
    Identity,
    /// mmap failed.
    #[error("cannot map the segment: {0}")]
    Map(io::Error),
}

/// An operation on a [`TrainerChannel`] failed.
#[derive(Debug, Error)]
pub enum TrainerError {
    /// No free arena range large enough. Free tensors or ask for a bigger arena.
    #[error("arena has no free range of {requested} bytes (largest free {largest_free})")]
    ArenaFull {
        /// Bytes asked for.
        requested: u64,
        /// Largest free range.
        largest_free: u64,
    },
    /// A tensor of zero elements was asked for.
    #[error("a tensor needs at least one element")]
    ZeroLength,
    /// A tensor of this name is already allocated.
    #[error("tensor name {0:?} is already allocated")]
    NameInUse(String),
    /// No tensor of this name.
    #[error("no tensor named {0:?}")]
    UnknownTensor(String),
    /// Every tensor id (`u32`) of this attachment has been handed out; reattach.
    #[error("every tensor id of this attachment has been used; reattach")]
    TooManyTensors,
    /// An f32 read or write of a tensor of another element type (use the
    /// `_bytes` forms).
    #[error("the tensor's elements are {0:?}, not f32: read and write its bytes")]
    NotF32(ElemType),
    /// Data length differs from the tensor's.
    #[error("tensor has {expected} elements, data has {got}")]
    LengthMismatch {
        /// Tensor length.
        expected: u64,
        /// Data length.
        got: u64,
    },
    /// As many ops in flight as the completion ring holds; wait for one first.
    #[error("{0} operations already in flight; wait for a completion first")]
    TooManyInFlight(u32),
    /// The submission ring is full (the daemon is behind); wait for a completion.
    #[error("submission ring full; wait for a completion first")]
    RingFull,
    /// Ring indices are impossible (memory corruption).
    #[error(transparent)]
    Ring(#[from] RingError),
    /// No completion within the timeout.
    #[error("no completion within {0:?}")]
    Timeout(Duration),
    /// The daemon closed the control socket: it is gone, all ops are lost.
    #[error("the daemon closed the control socket")]
    DaemonGone,
    /// I/O on a doorbell or the control socket.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}

/// Handle of a tensor in one attachment's arena: ids are handed out in
/// allocation order (0, 1, 2, …) and never reused within the attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

/// A tensor allocated in the arena: an entry of the channel's tensor registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    /// Its id (allocation order).
    pub id: TensorId,
    /// Name given at allocation.
    pub name: String,
    /// Byte offset in the arena (a multiple of [`ARENA_ALIGN`](crate::layout::ARENA_ALIGN)).
    pub arena_offset: u64,
    /// Length in elements of `dtype`.
    pub len_elems: u64,
    /// Element type.
    pub dtype: ElemType,
}

impl Tensor {
    /// Bytes of the tensor.
    pub fn bytes(&self) -> u64 {
        self.len_elems * self.dtype.size()
    }
}

/// Per-operation parameters of [`TrainerChannel::submit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubmitOptions {
    /// Tensor id (same on every rank).
    pub tensor_id: u32,
    /// Layer index.
    pub layer: u32,
    /// Number of layers.
    pub layers: u32,
    /// Loss budget, ppm (0 = reliable).
    pub budget_ppm: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Echoed in the completion.
    pub cookie: u64,
    /// The reduction (sum by default; only sum for a collective that does not reduce).
    pub reduce: Reduce,
    /// The collective (allreduce by default).
    pub opcode: Opcode,
    /// [`Opcode::Broadcast`]: the root's daemon rank; 0 for the others.
    pub root: u32,
}

impl Default for SubmitOptions {
    fn default() -> Self {
        SubmitOptions {
            tensor_id: 0,
            layer: 0,
            layers: 1,
            budget_ppm: 0,
            flags: 0,
            cookie: 0,
            reduce: Reduce::Sum,
            opcode: Opcode::AllReduce,
            root: 0,
        }
    }
}

/// A completion, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The submission's op_seq.
    pub op_seq: u64,
    /// The submission's cookie.
    pub cookie: u64,
    /// The submission's tensor id.
    pub tensor_id: u32,
    /// Outcome.
    pub status: Status,
    /// Status detail (the descriptor error code for `InvalidDescriptor`).
    pub detail: u32,
    /// Fraction delivered, ppm.
    pub delivered_ppm: u32,
    /// Repairs.
    pub repairs: u32,
    /// Time the daemon spent.
    pub duration: Duration,
    /// A reduce-scatter or allgather: the first element of this host's shard.
    pub shard_offset: u64,
    /// A reduce-scatter or allgather: the elements of this host's shard (0 otherwise).
    pub shard_len: u64,
}

impl From<CompletionDesc> for Completion {
    fn from(c: CompletionDesc) -> Self {
        Completion {
            op_seq: c.op_seq,
            cookie: c.cookie,
            tensor_id: c.tensor_id,
            status: Status::from_raw(c.status),
            detail: c.detail,
            delivered_ppm: c.delivered_ppm,
            repairs: c.repairs,
            duration: Duration::from_nanos(c.duration_ns),
            shard_offset: c.shard_offset,
            shard_len: c.shard_len,
        }
    }
}

/// The trainer's end of one attachment to the daemon (see the module docs).
///
/// Dropping it detaches: the daemon sees the control socket close and reclaims
/// the segment; pointers from [`TrainerChannel::data_ptr`] become invalid.
#[derive(Debug)]
pub struct TrainerChannel {
    stream: UnixStream,
    /// Kept open only for the `debug_memfd` hook; otherwise closed once mapped
    /// (the mapping keeps the pages).
    #[cfg(feature = "debug-hooks")]
    memfd: OwnedFd,
    /// The one mapping of the segment: rings, header and arena.
    map: Mapping,
    geometry: Geometry,
    attachment_id: u64,
    place: JobPlace,
    /// Failure reasons the daemon sent on the control socket.
    inbox: Inbox,
    sq: Producer,
    cq: Consumer,
    submit_bell: Doorbell,
    complete_bell: Doorbell,
    /// Free ranges of the arena.
    alloc: ArenaAllocator,
    /// The tensor registry, indexed by [`TensorId`] (`None` once freed; ids are not reused).
    tensors: Vec<Option<Tensor>>,
    /// Name → id of every live tensor.
    by_name: HashMap<String, TensorId>,
    next_seq: u64,
    in_flight: u32,
}

impl TrainerChannel {
    /// Connects to the daemon's control socket, registers, receives and maps the
    /// segment, and checks its header. Waits at most 5 s for the daemon's reply.
    pub fn attach(
        socket_path: impl AsRef<Path>,
        job_id: u64,
        local_rank: u32,
        local_world: u32,
    ) -> Result<TrainerChannel, AttachError> {
        let stream = UnixStream::connect(socket_path).map_err(AttachError::Connect)?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(AttachError::Io)?;
        let reg = Registration { job_id, local_rank, local_world };
        // MSG_NOSIGNAL: a daemon that refuses us early closes the socket; that must be
        // an error here (then we read its reply), never a SIGPIPE in a C/Python host.
        let sent = control::send_with_fds(stream.as_fd(), &reg.encode(), &[]);
        let mut buf = [0u8; REPLY_LEN];
        let fds = match control::recv_with_fds(stream.as_fd(), &mut buf) {
            Ok(fds) => fds,
            Err(e) => return Err(AttachError::Io(sent.err().unwrap_or(e))),
        };
        let (attachment_id, geometry, place) = match Reply::decode(&buf)? {
            Reply::Accepted { attachment_id, geometry, place } => (attachment_id, geometry, place),
            Reply::Rejected(why) => return Err(AttachError::Rejected(why)),
        };
        let n = fds.len();
        let [memfd, submit, complete]: [OwnedFd; REPLY_FDS] =
            fds.try_into().map_err(|_| AttachError::MissingFds(n))?;
        let found = rustix::fs::fstat(&memfd).map_err(|e| AttachError::Map(e.into()))?.st_size as u64;
        if found != geometry.total_size {
            return Err(AttachError::SizeMismatch { found, expected: geometry.total_size });
        }
        let map = Mapping::map(memfd.as_fd(), geometry.total_size).map_err(AttachError::Map)?;
        let mut words = [0u64; 16];
        map.load_words(0, &mut words).map_err(|e| AttachError::Map(io::Error::other(e)))?;
        let header = SegmentHeader::from_words(words);
        let checked = Geometry::check_header(&header)?;
        if checked != geometry {
            return Err(AttachError::Header(GeometryError::Mismatch {
                field: "geometry",
                found: checked.total_size,
                expected: geometry.total_size,
            }));
        }
        if header.attachment_id != attachment_id
            || header.job_id != job_id
            || header.local_rank != local_rank as u64
            || header.local_world != local_world as u64
        {
            return Err(AttachError::Identity);
        }
        stream.set_nonblocking(true).map_err(AttachError::Io)?;
        Ok(TrainerChannel {
            stream,
            #[cfg(feature = "debug-hooks")]
            memfd,
            map,
            geometry,
            attachment_id,
            place,
            inbox: Inbox::default(),
            sq: Producer::new(RingLayout { ctl: geometry.sq_offset, capacity: geometry.sq_capacity }),
            cq: Consumer::new(RingLayout { ctl: geometry.cq_offset, capacity: geometry.cq_capacity }),
            submit_bell: Doorbell::from_fd(submit),
            complete_bell: Doorbell::from_fd(complete),
            alloc: ArenaAllocator::new(geometry.arena_size),
            tensors: Vec::new(),
            by_name: HashMap::new(),
            next_seq: 1,
            in_flight: 0,
        })
    }

    /// The segment geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// The daemon's id for this attachment.
    pub fn attachment_id(&self) -> u64 {
        self.attachment_id
    }

    /// The daemon's place in its job (rank and number of daemons; `nodes` 0
    /// from a daemon that does not say).
    pub fn place(&self) -> JobPlace {
        self.place
    }

    /// The daemon's reason for the failed op (`op_seq`, `tensor_id`), taken once:
    /// reads the notes waiting on the control socket without blocking (the
    /// daemon sends one just before the failed completion). `None` if it sent
    /// none (or had to drop it).
    pub fn failure_reason(&mut self, op_seq: u64, tensor_id: u32) -> Option<String> {
        self.inbox.read(self.stream.as_fd());
        self.inbox.take(op_seq, tensor_id)
    }

    /// Operations submitted and not yet completed.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Allocates a named f32 tensor of `len_elems` elements in the arena; its id is
    /// the next in allocation order.
    pub fn alloc(&mut self, name: &str, len_elems: u64) -> Result<Tensor, TrainerError> {
        self.alloc_typed(name, len_elems, ElemType::F32)
    }

    /// Allocates a named tensor of `len_elems` elements of `dtype` (f32, f16
    /// or bf16) in the arena; its id is the next in allocation order.
    pub fn alloc_typed(
        &mut self,
        name: &str,
        len_elems: u64,
        dtype: ElemType,
    ) -> Result<Tensor, TrainerError> {
        if self.by_name.contains_key(name) {
            return Err(TrainerError::NameInUse(name.to_owned()));
        }
        if len_elems == 0 {
            return Err(TrainerError::ZeroLength);
        }
        let id = TensorId(u32::try_from(self.tensors.len()).map_err(|_| TrainerError::TooManyTensors)?);
        let bytes = len_elems.saturating_mul(dtype.size());
        let arena_offset = self
            .alloc
            .alloc(bytes)
            .ok_or(TrainerError::ArenaFull { requested: bytes, largest_free: self.alloc.largest_free() })?;
        let t = Tensor { id, name: name.to_owned(), arena_offset, len_elems, dtype };
        self.by_name.insert(name.to_owned(), id);
        self.tensors.push(Some(t.clone()));
        Ok(t)
    }

    /// Frees a tensor by name (do not free a tensor with an op in flight). Its id is
    /// not reused.
    pub fn free(&mut self, name: &str) -> Result<(), TrainerError> {
        let id = self.by_name.remove(name).ok_or_else(|| TrainerError::UnknownTensor(name.to_owned()))?;
        let t = self.tensors[id.0 as usize].take().expect("the name index points at a live tensor");
        self.alloc.free(t.arena_offset, t.bytes());
        Ok(())
    }

    /// The live tensor of that name.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensor_by_id(*self.by_name.get(name)?)
    }

    /// The live tensor with that id.
    pub fn tensor_by_id(&self, id: TensorId) -> Option<&Tensor> {
        self.tensors.get(id.0 as usize)?.as_ref()
    }

    /// Writes the raw elements `data` (little-endian, `t.bytes()` of them:
    /// f16 and bf16 tensors are written this way) into the tensor's arena buffer.
    pub fn write_bytes(&self, t: &Tensor, data: &[u8]) -> Result<(), TrainerError> {
        if data.len() as u64 != t.bytes() {
            let got = data.len() as u64 / t.dtype.size();
            return Err(TrainerError::LengthMismatch { expected: t.len_elems, got });
        }
        self.map
            .copy_in_bytes(self.geometry.arena_offset + t.arena_offset, data, 2)
            .map_err(|e| TrainerError::Io(io::Error::other(e)))
    }

    /// Reads the tensor's arena buffer as raw little-endian elements.
    pub fn read_bytes(&self, t: &Tensor) -> Result<Vec<u8>, TrainerError> {
        let mut out = vec![0u8; t.bytes() as usize];
        self.map
            .copy_out_bytes(self.geometry.arena_offset + t.arena_offset, &mut out, 2)
            .map_err(|e| TrainerError::Io(io::Error::other(e)))?;
        Ok(out)
    }

    /// Writes `data` into the tensor's arena buffer (an f32 tensor; others:
    /// [`TrainerChannel::write_bytes`]).
    pub fn write(&self, t: &Tensor, data: &[f32]) -> Result<(), TrainerError> {
        if t.dtype != ElemType::F32 {
            return Err(TrainerError::NotF32(t.dtype));
        }
        if data.len() as u64 != t.len_elems {
            return Err(TrainerError::LengthMismatch { expected: t.len_elems, got: data.len() as u64 });
        }
        self.map
            .copy_in_f32(self.geometry.arena_offset + t.arena_offset, data)
            .map_err(|e| TrainerError::Io(io::Error::other(e)))
    }

    /// Reads the tensor's arena buffer (an f32 tensor; others:
    /// [`TrainerChannel::read_bytes`]).
    pub fn read(&self, t: &Tensor) -> Result<Vec<f32>, TrainerError> {
        if t.dtype != ElemType::F32 {
            return Err(TrainerError::NotF32(t.dtype));
        }
        let mut out = vec![0f32; t.len_elems as usize];
        self.map
            .copy_out_f32(self.geometry.arena_offset + t.arena_offset, &mut out)
            .map_err(|e| TrainerError::Io(io::Error::other(e)))?;
        Ok(out)
    }

    /// Raw pointer to the tensor's `len_elems` elements in the arena (f32; for
    /// an f16 or bf16 tensor, cast it to 2-byte elements), for in-place
    /// access from C or Python (Rust code should prefer [`write`](Self::write) and
    /// [`read`](Self::read)); `None` if `t` does not lie inside this arena.
    ///
    /// It points into the channel's one mapping of the segment, so the rings'
    /// synchronisation covers it: the trainer's stores through it happen before
    /// the `Release` store of the submission tail that [`submit`](Self::submit)
    /// makes on the same thread; the daemon's result stores happen before its
    /// `Release` of the completion tail, which [`try_completion`](Self::try_completion)
    /// loads with `Acquire` before returning the completion.
    ///
    /// Contract for whoever dereferences it: valid until the channel is dropped
    /// (or the tensor freed); not to be read or written between the submit of this
    /// tensor and the receipt of its completion (the daemon writes the result
    /// there); never form a Rust `&[f32]` over it while an op is in flight.
    pub fn data_ptr(&self, t: &Tensor) -> Option<NonNull<f32>> {
        // The arena is the last region of the segment, so a range inside the mapping
        // that starts in the arena lies inside the arena.
        let offset = self.geometry.arena_offset.checked_add(t.arena_offset)?;
        self.map.byte_ptr(offset, t.bytes(), 4).ok().map(NonNull::cast)
    }

    /// Set the op sequence number the next [`TrainerChannel::submit`] uses. Every trainer
    /// of a job must submit the same sequence of ops; after a failed op (or when a
    /// replacement trainer joins a running job) the trainers agree on where to
    /// continue and say so here.
    pub fn set_next_op_seq(&mut self, seq: u64) {
        self.next_seq = seq;
    }

    /// The op sequence number the next [`TrainerChannel::submit`] will use.
    pub fn next_op_seq(&self) -> u64 {
        self.next_seq
    }

    /// Submits `o.opcode` (an allreduce by default) of `t`; returns its
    /// op_seq. The result replaces the tensor's contents (a reduce-scatter's
    /// only in this host's shard) when the completion arrives.
    pub fn submit(&mut self, t: &Tensor, o: SubmitOptions) -> Result<u64, TrainerError> {
        self.submit_span(t.arena_offset, t.len_elems, t.dtype, o)
    }

    /// Submits a barrier (no tensor; `o.opcode` is ignored); returns its op_seq.
    pub fn submit_barrier(&mut self, o: SubmitOptions) -> Result<u64, TrainerError> {
        self.submit_span(0, 0, ElemType::F32, SubmitOptions { opcode: Opcode::Barrier, ..o })
    }

    fn submit_span(
        &mut self,
        offset: u64,
        len: u64,
        dtype: ElemType,
        o: SubmitOptions,
    ) -> Result<u64, TrainerError> {
        let seq = self.next_seq;
        let d = SubmitDesc {
            op_seq: seq,
            cookie: o.cookie,
            arena_offset: offset,
            len_elems: len,
            tensor_id: o.tensor_id,
            layer: o.layer,
            layers: o.layers,
            budget_ppm: o.budget_ppm,
            flags: o.flags,
            dtype: dtype as u16,
            opcode: o.opcode as u16,
            reduce: o.reduce as u8,
            reserved: [0; 3],
            root: o.root,
        };
        self.push(&d)?;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Pushes a descriptor as-is and rings the daemon. Counts it as in flight: the
    /// daemon completes every descriptor, valid or not, exactly once.
    fn push(&mut self, d: &SubmitDesc) -> Result<(), TrainerError> {
        if self.in_flight >= self.geometry.cq_capacity {
            return Err(TrainerError::TooManyInFlight(self.in_flight));
        }
        let words: [u64; DESC_WORDS] = d.to_words();
        if !self.sq.push(&self.map, &words)? {
            return Err(TrainerError::RingFull);
        }
        self.in_flight += 1;
        self.submit_bell.ring()?;
        Ok(())
    }

    /// A completion if one is ready.
    pub fn try_completion(&mut self) -> Result<Option<Completion>, TrainerError> {
        match self.cq.pop(&self.map)? {
            Some(w) => {
                self.in_flight = self.in_flight.saturating_sub(1);
                Ok(Some(CompletionDesc::from_words(w).into()))
            }
            None => Ok(None),
        }
    }

    /// Sleeps until a completion arrives (or `timeout`), without spinning.
    /// Fails with [`TrainerError::DaemonGone`] if the daemon closes the control socket.
    pub fn wait_completion(&mut self, timeout: Duration) -> Result<Completion, TrainerError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self.try_completion()? {
                return Ok(c);
            }
            // Drain, then re-check, then sleep: see the doorbell module's protocol.
            self.complete_bell.drain()?;
            if let Some(c) = self.try_completion()? {
                return Ok(c);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TrainerError::Timeout(timeout));
            }
            let ready = poll_readable(&[self.complete_bell.as_fd(), self.stream.as_fd()], Some(left))?;
            if ready[1] && self.daemon_gone() {
                // A daemon that drains and exits posts its last completions
                // just before closing: collect them first.
                if let Some(c) = self.try_completion()? {
                    return Ok(c);
                }
                return Err(TrainerError::DaemonGone);
            }
        }
    }

    /// What [`wait_completion`](Self::wait_completion) sleeps on: the
    /// completion doorbell (readable once the daemon posted a completion since
    /// the last drain) and the control socket (readable when the daemon wrote
    /// a note or closed it). Another thread may `poll` these without holding
    /// the channel, then call `wait_completion` with a zero timeout: that
    /// drains the doorbell before its last look at the ring, so a completion
    /// posted after it rings again (the doorbell module's protocol). Both stay
    /// open as long as the channel.
    pub fn completion_fds(&self) -> [BorrowedFd<'_>; 2] {
        [self.complete_bell.as_fd(), self.stream.as_fd()]
    }

    /// Reads the control socket (keeping the notes on it): true once the daemon closed it.
    fn daemon_gone(&mut self) -> bool {
        self.inbox.read(self.stream.as_fd())
    }
}

/// Hooks that let tests act as a buggy or hostile trainer. They exist only with
/// the `debug-hooks` feature (off by default; test builds enable it through a
/// dev-dependency), so no production build exposes them.
#[cfg(feature = "debug-hooks")]
impl TrainerChannel {
    /// Pushes any descriptor as-is (what a buggy or hostile trainer could do).
    /// Counts it as in flight: the daemon completes every descriptor, valid or
    /// not, exactly once.
    pub fn debug_submit_raw(&mut self, d: &SubmitDesc) -> Result<(), TrainerError> {
        self.push(d)
    }

    /// Forgets the ops in flight, so the next pushes go past the completion
    /// ring's size (a trainer ignoring the rule that keeps it within it).
    pub fn debug_forget_in_flight(&mut self) {
        self.in_flight = 0;
    }

    /// The segment's memfd (to check that its seals hold).
    pub fn debug_memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// Stores a raw value into the submission ring's shared `tail` (a trainer
    /// corrupting the ring).
    pub fn debug_store_sq_tail(&self, tail: u32) {
        self.map
            .atomic_u32(self.geometry.sq_offset + super::layout::RING_TAIL_OFFSET)
            .store(tail, std::sync::atomic::Ordering::Release);
    }

    /// Restores the shared submission `tail` to this channel's own shadow value.
    pub fn debug_restore_sq_tail(&self) {
        self.debug_store_sq_tail(self.sq.tail());
    }

    /// Stores a raw value into the completion ring's shared `head`.
    pub fn debug_store_cq_head(&self, head: u32) {
        self.map
            .atomic_u32(self.geometry.cq_offset + super::layout::RING_HEAD_OFFSET)
            .store(head, std::sync::atomic::Ordering::Release);
    }

    /// Restores the shared completion `head` to this channel's own shadow value.
    pub fn debug_restore_cq_head(&self) {
        self.debug_store_cq_head(self.cq.head());
    }

    /// Rings the submit doorbell without submitting anything.
    pub fn debug_ring_doorbell(&self) -> io::Result<()> {
        self.submit_bell.ring()
    }

    /// Overwrites `data.len()` f32 at an absolute segment byte offset (a trainer
    /// scribbling on the header); false if out of bounds.
    pub fn debug_scribble(&self, abs_offset: u64, data: &[f32]) -> bool {
        self.map.copy_in_f32(abs_offset, data).is_ok()
    }
}
