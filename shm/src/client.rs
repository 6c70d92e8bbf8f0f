//! Trainer side: attach to the daemon, allocate named tensors in the arena,
//! submit operations and wait for their completions.
//!
//! (A later step moves this into the `client/` crate with a C ABI and Python
//! bindings; the ring and atomic code stays in Rust.)

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::alloc::ArenaAllocator;
use super::control::{self, BadReply, REPLY_FDS, REPLY_LEN, Registration, RejectReason, Reply};
use super::doorbell::{Doorbell, poll_readable};
use super::layout::{
    CompletionDesc, DESC_WORDS, ElemType, Geometry, GeometryError, Opcode, SegmentHeader, Status, SubmitDesc,
};
use super::mapping::Mapping;
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

/// A client operation failed.
#[derive(Debug, Error)]
pub enum ClientError {
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

/// A tensor allocated in the arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    /// Name given at allocation.
    pub name: String,
    /// Byte offset in the arena.
    pub offset: u64,
    /// Length in f32 elements.
    pub len_elems: u64,
}

/// Per-operation parameters of [`Client::submit`].
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
}

impl Default for SubmitOptions {
    fn default() -> Self {
        SubmitOptions { tensor_id: 0, layer: 0, layers: 1, budget_ppm: 0, flags: 0, cookie: 0 }
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
        }
    }
}

/// A trainer's attachment to the daemon.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    memfd: OwnedFd,
    map: Mapping,
    geometry: Geometry,
    attachment_id: u64,
    sq: Producer,
    cq: Consumer,
    submit_bell: Doorbell,
    complete_bell: Doorbell,
    alloc: ArenaAllocator,
    tensors: HashMap<String, Tensor>,
    next_seq: u64,
    in_flight: u32,
}

impl Client {
    /// Connects to the daemon's control socket, registers, receives and maps the
    /// segment, and checks its header. Waits at most 5 s for the daemon's reply.
    pub fn attach(
        socket_path: impl AsRef<Path>,
        job_id: u64,
        local_rank: u32,
        local_world: u32,
    ) -> Result<Client, AttachError> {
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
        let (attachment_id, geometry) = match Reply::decode(&buf)? {
            Reply::Accepted { attachment_id, geometry } => (attachment_id, geometry),
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
        Ok(Client {
            stream,
            memfd,
            map,
            geometry,
            attachment_id,
            sq: Producer::new(RingLayout { ctl: geometry.sq_offset, capacity: geometry.sq_capacity }),
            cq: Consumer::new(RingLayout { ctl: geometry.cq_offset, capacity: geometry.cq_capacity }),
            submit_bell: Doorbell::from_fd(submit),
            complete_bell: Doorbell::from_fd(complete),
            alloc: ArenaAllocator::new(geometry.arena_size),
            tensors: HashMap::new(),
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

    /// Operations submitted and not yet completed.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Allocates a named f32 tensor of `len_elems` elements in the arena.
    pub fn alloc(&mut self, name: &str, len_elems: u64) -> Result<Tensor, ClientError> {
        if self.tensors.contains_key(name) {
            return Err(ClientError::NameInUse(name.to_owned()));
        }
        if len_elems == 0 {
            return Err(ClientError::ZeroLength);
        }
        let bytes = len_elems.saturating_mul(ElemType::F32.size());
        let offset = self
            .alloc
            .alloc(bytes)
            .ok_or(ClientError::ArenaFull { requested: bytes, largest_free: self.alloc.largest_free() })?;
        let t = Tensor { name: name.to_owned(), offset, len_elems };
        self.tensors.insert(name.to_owned(), t.clone());
        Ok(t)
    }

    /// Frees a tensor by name (do not free a tensor with an op in flight).
    pub fn free(&mut self, name: &str) -> Result<(), ClientError> {
        let t = self.tensors.remove(name).ok_or_else(|| ClientError::UnknownTensor(name.to_owned()))?;
        self.alloc.free(t.offset, t.len_elems * ElemType::F32.size());
        Ok(())
    }

    /// The tensor of that name.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// Writes `data` into the tensor's arena buffer.
    pub fn write(&self, t: &Tensor, data: &[f32]) -> Result<(), ClientError> {
        if data.len() as u64 != t.len_elems {
            return Err(ClientError::LengthMismatch { expected: t.len_elems, got: data.len() as u64 });
        }
        self.map
            .copy_in_f32(self.geometry.arena_offset + t.offset, data)
            .map_err(|e| ClientError::Io(io::Error::other(e)))
    }

    /// Reads the tensor's arena buffer.
    pub fn read(&self, t: &Tensor) -> Result<Vec<f32>, ClientError> {
        let mut out = vec![0f32; t.len_elems as usize];
        self.map
            .copy_out_f32(self.geometry.arena_offset + t.offset, &mut out)
            .map_err(|e| ClientError::Io(io::Error::other(e)))?;
        Ok(out)
    }

    /// Set the op sequence number the next [`Client::submit`] uses. Every trainer
    /// of a job must submit the same sequence of ops; after a failed op (or when a
    /// replacement trainer joins a running job) the trainers agree on where to
    /// continue and say so here.
    pub fn set_next_op_seq(&mut self, seq: u64) {
        self.next_seq = seq;
    }

    /// The op sequence number the next [`Client::submit`] will use.
    pub fn next_op_seq(&self) -> u64 {
        self.next_seq
    }

    /// Submits an allreduce of `t`; returns its op_seq. The result replaces the
    /// tensor's contents when the completion arrives.
    pub fn submit(&mut self, t: &Tensor, o: SubmitOptions) -> Result<u64, ClientError> {
        let seq = self.next_seq;
        let d = SubmitDesc {
            op_seq: seq,
            cookie: o.cookie,
            arena_offset: t.offset,
            len_elems: t.len_elems,
            tensor_id: o.tensor_id,
            layer: o.layer,
            layers: o.layers,
            budget_ppm: o.budget_ppm,
            flags: o.flags,
            dtype: ElemType::F32 as u16,
            opcode: Opcode::AllReduce as u16,
            reserved: [0; 8],
        };
        self.submit_raw(&d)?;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Pushes any descriptor as-is (what a buggy or hostile trainer could do; used
    /// by tests). Counts it as in flight: the daemon completes every descriptor,
    /// valid or not, exactly once.
    #[doc(hidden)]
    pub fn submit_raw(&mut self, d: &SubmitDesc) -> Result<(), ClientError> {
        if self.in_flight >= self.geometry.cq_capacity {
            return Err(ClientError::TooManyInFlight(self.in_flight));
        }
        let words: [u64; DESC_WORDS] = d.to_words();
        if !self.sq.push(&self.map, &words)? {
            return Err(ClientError::RingFull);
        }
        self.in_flight += 1;
        self.submit_bell.ring()?;
        Ok(())
    }

    /// A completion if one is ready.
    pub fn try_completion(&mut self) -> Result<Option<Completion>, ClientError> {
        match self.cq.pop(&self.map)? {
            Some(w) => {
                self.in_flight = self.in_flight.saturating_sub(1);
                Ok(Some(CompletionDesc::from_words(w).into()))
            }
            None => Ok(None),
        }
    }

    /// Sleeps until a completion arrives (or `timeout`), without spinning.
    /// Fails with [`ClientError::DaemonGone`] if the daemon closes the control socket.
    pub fn wait_completion(&mut self, timeout: Duration) -> Result<Completion, ClientError> {
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
                return Err(ClientError::Timeout(timeout));
            }
            let ready = poll_readable(&[self.complete_bell.as_fd(), self.stream.as_fd()], Some(left))?;
            if ready[1] && self.daemon_gone() {
                // A daemon that drains and exits posts its last completions
                // just before closing: collect them first.
                if let Some(c) = self.try_completion()? {
                    return Ok(c);
                }
                return Err(ClientError::DaemonGone);
            }
        }
    }

    fn daemon_gone(&self) -> bool {
        let mut b = [0u8; 64];
        match io::Read::read(&mut &self.stream, &mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted,
        }
    }

    /// The segment's memfd (tests use it to check the seals hold).
    #[doc(hidden)]
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// Stores a raw value into the submission ring's shared `tail` (tests of a
    /// trainer corrupting the ring).
    #[doc(hidden)]
    pub fn debug_store_sq_tail(&self, tail: u32) {
        self.map
            .atomic_u32(self.geometry.sq_offset + super::layout::RING_TAIL_OFFSET)
            .store(tail, std::sync::atomic::Ordering::Release);
    }

    /// Restores the shared submission `tail` to this client's own shadow value.
    #[doc(hidden)]
    pub fn debug_restore_sq_tail(&self) {
        self.debug_store_sq_tail(self.sq.tail());
    }

    /// Stores a raw value into the completion ring's shared `head`.
    #[doc(hidden)]
    pub fn debug_store_cq_head(&self, head: u32) {
        self.map
            .atomic_u32(self.geometry.cq_offset + super::layout::RING_HEAD_OFFSET)
            .store(head, std::sync::atomic::Ordering::Release);
    }

    /// Restores the shared completion `head` to this client's own shadow value.
    #[doc(hidden)]
    pub fn debug_restore_cq_head(&self) {
        self.debug_store_cq_head(self.cq.head());
    }

    /// Rings the submit doorbell without submitting anything.
    #[doc(hidden)]
    pub fn debug_ring_doorbell(&self) -> io::Result<()> {
        self.submit_bell.ring()
    }

    /// Overwrites `len` f32 at an absolute segment byte offset (tests of a trainer
    /// scribbling on the header).
    #[doc(hidden)]
    pub fn debug_scribble(&self, abs_offset: u64, data: &[f32]) -> bool {
        self.map.copy_in_f32(abs_offset, data).is_ok()
    }
}
