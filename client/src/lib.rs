//! # dlcp-client — what trainers link
//!
//! A trainer process attaches to the local `dlcpd` over its Unix control socket,
//! allocates named f32 tensors in a shared-memory arena, writes gradients into
//! them, submits allreduce operations and waits for their completions; the
//! reduced result replaces the tensor's contents in place.
//!
//! ## What is here and what is in `dlcp_shm`
//!
//! The channel itself is [`dlcp_shm::TrainerChannel`]: the attach handshake, the
//! one mapping of the segment, the rings and doorbells, and the one tensor
//! registry (arena allocation, names, [`TensorId`]s). [`Client`] owns one and adds
//! only what a user of the channel needs on top, keeping no channel state of its
//! own: argument checks, the in-flight rules below (which op owns which tensor),
//! completions kept while [`Client::wait_for`] waits for another op, and errors
//! with stable codes. Raw pointers for in-place access
//! ([`Client::data_ptr`]) come from the channel's one mapping.
//!
//! This crate serves three audiences:
//!
//! - **Rust**: [`Client`] (this module);
//! - **C**: the ABI in [`capi`], declared by `client/include/dlcp.h`, built as
//!   `libdlcp_client.so` (cdylib) and `libdlcp_client.a` (staticlib);
//! - **Python**: `client/python/dlcp`, pure Python over the C ABI with ctypes;
//!   its tensors are numpy arrays that *are* the shared buffers (no copy).
//!
//! ```no_run
//! use std::time::Duration;
//! use dlcp_client::{Client, Options};
//!
//! let mut c = Client::attach("/run/dlcp/dlcpd.sock", 0x10b, 0, 1)?;
//! let grad = c.alloc("layer3.grad", 4096)?;
//! c.write(grad, &vec![0.5; 4096])?;
//! let report = c.allreduce(grad, Options::layer(3, 12).budget_ppm(10_000), Duration::from_secs(30))?;
//! println!("{} ppm delivered in {:?}", report.delivered_ppm, report.duration);
//! let reduced = c.read(grad)?;
//! # Ok::<(), dlcp_client::Error>(())
//! ```
//!
//! ## Collectives
//!
//! Besides [`Client::allreduce`]: [`Client::reduce_scatter`] (this host's
//! shard of the tensor reduced, the rest left as it was; [`Report::shard`]
//! says which), [`Client::allgather`] (each host contributes its shard,
//! everyone gets the whole tensor), [`Client::broadcast`] (every trainer gets
//! the tensor of local rank 0 on the host of daemon rank `root`; exact unless
//! a budget is given) and [`Client::barrier`] (no tensor). A host's shard is
//! the element range `r·len/nodes .. (r+1)·len/nodes` of its daemon's rank
//! `r` ([`World::node_rank`] of [`World::nodes`]); with several trainers on a
//! host, what the host contributes to an allgather is the sum of its
//! trainers' tensors over its shard. [`Options::collective`] and
//! [`Options::root`] pick a collective for [`Client::submit`].
//!
//! ## Tensor ids
//!
//! [`TensorId`]s are handed out in allocation order (0, 1, 2, …) and are also the
//! tensor id on the wire, which must name the same tensor on every rank: allocate
//! your tensors in the same order on every rank (same code ⇒ same order).
//!
//! ## In-flight rules
//!
//! Between [`Client::submit`] and the op's completion the daemon owns the
//! tensor's buffer: do not read or write it (the client refuses a second submit
//! of the same tensor with [`Error::TensorBusy`]). A completion that arrives while
//! [`Client::wait_for`] waits for another op is kept and returned by the next
//! [`Client::wait`] / [`Client::try_completion`].
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod capi;
pub mod env;

use std::collections::{HashMap, VecDeque};
use std::ffi::CStr;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

pub use dlcp_shm::layout::{FLAG_FILL_LOCAL, FLAG_RESCALE, KNOWN_FLAGS};
pub use dlcp_shm::{
    AttachError, Completion, ElemType, Geometry, Opcode, Reduce, Status, Tensor, TensorId, TrainerError,
};
use dlcp_shm::{SubmitOptions, TrainerChannel};
pub use env::{AttachArgs, DEFAULT_SOCKET, EnvError};
use thiserror::Error;

/// Longest single wait handed to the channel (its deadline arithmetic must not overflow).
const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// Per-operation parameters of [`Client::submit`] / [`Client::allreduce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Layer index of the tensor, `< layers` (priority input: front layers first).
    pub layer: u32,
    /// Number of layers of the model, `>= 1`.
    pub layers: u32,
    /// Loss budget in parts per million; 0 = reliable (bit-exact).
    pub budget_ppm: u32,
    /// [`FLAG_RESCALE`] / [`FLAG_FILL_LOCAL`] bits.
    pub flags: u32,
    /// Opaque value echoed in the completion.
    pub cookie: u64,
    /// The reduction: [`Reduce::Sum`], or [`Reduce::Average`] over every
    /// trainer of the job (the daemons divide once; the trainer does not).
    /// Only allreduce and reduce-scatter reduce: the others take only the sum.
    pub reduce: Reduce,
    /// The collective [`Client::submit`] asks for ([`Opcode::AllReduce`] by default).
    pub collective: Opcode,
    /// [`Opcode::Broadcast`]: the daemon rank of the host whose local rank 0
    /// sends its tensor; 0 for the other collectives.
    pub root: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            layer: 0,
            layers: 1,
            budget_ppm: 0,
            flags: 0,
            cookie: 0,
            reduce: Reduce::Sum,
            collective: Opcode::AllReduce,
            root: 0,
        }
    }
}

impl Options {
    /// Reliable op on layer `layer` of a `layers`-layer model.
    pub fn layer(layer: u32, layers: u32) -> Options {
        Options { layer, layers, ..Options::default() }
    }

    /// With a loss budget in parts per million (10_000 = 1%).
    pub fn budget_ppm(self, budget_ppm: u32) -> Options {
        Options { budget_ppm, ..self }
    }

    /// With `FLAG_*` bits.
    pub fn flags(self, flags: u32) -> Options {
        Options { flags, ..self }
    }

    /// With a cookie echoed in the completion.
    pub fn cookie(self, cookie: u64) -> Options {
        Options { cookie, ..self }
    }

    /// With a reduction (sum by default).
    pub fn reduce(self, reduce: Reduce) -> Options {
        Options { reduce, ..self }
    }

    /// With a collective (allreduce by default).
    pub fn collective(self, collective: Opcode) -> Options {
        Options { collective, ..self }
    }

    /// With a broadcast root (a daemon rank).
    pub fn root(self, root: u32) -> Options {
        Options { root, ..self }
    }
}

/// What a successful op reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The op's sequence number.
    pub op_seq: u64,
    /// The op's tensor (a barrier's is [`BARRIER_TENSOR`], which names none).
    pub tensor: TensorId,
    /// Fraction of the tensor that arrived, ppm (1_000_000 = all of it).
    pub delivered_ppm: u32,
    /// Packets repaired for this op.
    pub repairs: u32,
    /// Time the daemon spent on it.
    pub duration: Duration,
    /// A reduce-scatter or allgather: the first element of this host's shard.
    pub shard_offset: u64,
    /// A reduce-scatter or allgather: the elements of this host's shard (0 otherwise).
    pub shard_len: u64,
}

impl Report {
    /// This host's shard of the tensor, as an element range: what a
    /// reduce-scatter wrote, what an allgather took from this host (empty
    /// for the other collectives).
    pub fn shard(&self) -> std::ops::Range<usize> {
        let start = self.shard_offset as usize;
        start..start + self.shard_len as usize
    }
}

/// The tensor id a barrier carries on the wire (it has no tensor; its op
/// sequence number tells it apart).
pub const BARRIER_TENSOR: TensorId = TensorId(0);

/// Where a trainer stands in its job, from the daemon's attach reply.
///
/// The daemon knows its own rank and the number of daemons (its
/// configuration); every host is taken to run as many trainers as this one
/// (`local_world`, as torchrun's `--nproc-per-node`), so the trainer's global
/// rank is `node_rank * local_world + local_rank` of `nodes * local_world`.
/// (Each daemon sums its host's trainers first, so a job whose hosts run
/// different numbers of trainers still reduces correctly; only these two
/// numbers would then be wrong.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct World {
    /// The daemon's rank among the job's daemons (`node.rank`).
    pub node_rank: u32,
    /// The job's number of daemons (hosts).
    pub nodes: u32,
    /// This trainer's rank among the job's trainers on this host.
    pub local_rank: u32,
    /// The job's trainers on this host.
    pub local_world: u32,
}

impl World {
    /// This trainer's global rank: `node_rank * local_world + local_rank`.
    pub fn rank(&self) -> u32 {
        self.node_rank.saturating_mul(self.local_world).saturating_add(self.local_rank)
    }

    /// The job's trainers on all hosts: `nodes * local_world`.
    pub fn size(&self) -> u32 {
        self.nodes.saturating_mul(self.local_world)
    }
}

/// Stable numeric error codes, shared by the Rust [`Error::code`], the C ABI
/// (`DLCP_ERR_*` in `dlcp.h`, always negative) and the Python exceptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ErrorCode {
    /// A required pointer argument is NULL.
    NullArg = -1,
    /// The `dlcp_client*` is not a live handle (detached, or never attached).
    BadHandle = -2,
    /// An argument is invalid (unknown tensor, non-UTF-8 name, layer >= layers, unknown flags, ...).
    InvalidArg = -3,
    /// Cannot connect to the daemon's control socket.
    Connect = -4,
    /// The daemon refused the attachment (rank in use, world size mismatch, policy, resources).
    Rejected = -5,
    /// The attach handshake or the segment was invalid (version skew or a bug).
    Protocol = -6,
    /// No room in the arena for the tensor.
    ArenaFull = -7,
    /// A tensor of that name already exists.
    NameInUse = -8,
    /// Too many operations in flight, or the submission ring is full: wait for a completion.
    Busy = -9,
    /// The tensor already has an operation in flight: wait for its completion.
    TensorBusy = -10,
    /// No completion within the timeout (the op may still complete later).
    Timeout = -11,
    /// The daemon closed the control socket: it is gone, every op in flight is lost.
    DaemonGone = -12,
    /// The operation completed with a non-OK status (see the completion's status and detail).
    OpFailed = -13,
    /// An I/O error on a doorbell or the control socket.
    Io = -14,
    /// The shared ring indices are impossible: the segment is corrupted.
    Corrupted = -15,
    /// A bug in the library (a panic was caught); detach and report it.
    Internal = -16,
}

impl ErrorCode {
    /// Every code, in numeric order (-1, -2, ...).
    pub const ALL: [ErrorCode; 16] = [
        ErrorCode::NullArg,
        ErrorCode::BadHandle,
        ErrorCode::InvalidArg,
        ErrorCode::Connect,
        ErrorCode::Rejected,
        ErrorCode::Protocol,
        ErrorCode::ArenaFull,
        ErrorCode::NameInUse,
        ErrorCode::Busy,
        ErrorCode::TensorBusy,
        ErrorCode::Timeout,
        ErrorCode::DaemonGone,
        ErrorCode::OpFailed,
        ErrorCode::Io,
        ErrorCode::Corrupted,
        ErrorCode::Internal,
    ];

    /// The C name (`DLCP_ERR_*`).
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::NullArg => "DLCP_ERR_NULL_ARG",
            ErrorCode::BadHandle => "DLCP_ERR_BAD_HANDLE",
            ErrorCode::InvalidArg => "DLCP_ERR_INVALID_ARG",
            ErrorCode::Connect => "DLCP_ERR_CONNECT",
            ErrorCode::Rejected => "DLCP_ERR_REJECTED",
            ErrorCode::Protocol => "DLCP_ERR_PROTOCOL",
            ErrorCode::ArenaFull => "DLCP_ERR_ARENA_FULL",
            ErrorCode::NameInUse => "DLCP_ERR_NAME_IN_USE",
            ErrorCode::Busy => "DLCP_ERR_BUSY",
            ErrorCode::TensorBusy => "DLCP_ERR_TENSOR_BUSY",
            ErrorCode::Timeout => "DLCP_ERR_TIMEOUT",
            ErrorCode::DaemonGone => "DLCP_ERR_DAEMON_GONE",
            ErrorCode::OpFailed => "DLCP_ERR_OP_FAILED",
            ErrorCode::Io => "DLCP_ERR_IO",
            ErrorCode::Corrupted => "DLCP_ERR_CORRUPTED",
            ErrorCode::Internal => "DLCP_ERR_INTERNAL",
        }
    }

    /// A one-line description (what `dlcp_strerror` returns).
    pub fn message(self) -> &'static CStr {
        match self {
            ErrorCode::NullArg => c"a required pointer argument is NULL",
            ErrorCode::BadHandle => c"not a live dlcp_client handle (detached or never attached)",
            ErrorCode::InvalidArg => c"invalid argument",
            ErrorCode::Connect => c"cannot connect to the daemon's control socket (is dlcpd running?)",
            ErrorCode::Rejected => c"the daemon refused the attachment",
            ErrorCode::Protocol => c"invalid attach handshake or segment (client/daemon version skew?)",
            ErrorCode::ArenaFull => c"no room in the shared arena for the tensor",
            ErrorCode::NameInUse => c"a tensor of that name already exists",
            ErrorCode::Busy => c"too many operations in flight; wait for a completion first",
            ErrorCode::TensorBusy => c"the tensor has an operation in flight; wait for its completion first",
            ErrorCode::Timeout => c"no completion within the timeout",
            ErrorCode::DaemonGone => {
                c"the daemon closed the control socket; all operations in flight are lost"
            }
            ErrorCode::OpFailed => c"the operation completed with a non-OK status",
            ErrorCode::Io => c"I/O error on a doorbell or the control socket",
            ErrorCode::Corrupted => c"the shared rings are corrupted",
            ErrorCode::Internal => c"internal error in the dlcp client library (a bug)",
        }
    }

    /// The code for a raw value, if it is one.
    pub fn from_raw(raw: i32) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| *c as i32 == raw)
    }
}

/// Why a client call failed. [`Error::code`] gives its stable [`ErrorCode`].
#[derive(Debug, Error)]
pub enum Error {
    /// Attaching failed (connect, refused, bad handshake or segment).
    #[error("attach failed: {0}")]
    Attach(#[from] AttachError),
    /// The channel reported an error.
    #[error(transparent)]
    Channel(#[from] TrainerError),
    /// No tensor with this id.
    #[error("no tensor with id {0} (allocate it with alloc first)")]
    UnknownTensor(u32),
    /// The tensor has an op in flight.
    #[error("tensor {name:?} already has op {op_seq} in flight; wait for its completion before reusing it")]
    TensorBusy {
        /// Tensor name.
        name: String,
        /// The op in flight.
        op_seq: u64,
    },
    /// An argument the daemon would reject anyway.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The op completed, but not with [`Status::Ok`].
    #[error(
        "op {} on tensor {} completed with status {}{}",
        .completion.op_seq,
        .completion.tensor_id,
        describe_status(.completion),
        .reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default()
    )]
    OpFailed {
        /// The completion (status, detail).
        completion: Completion,
        /// Why, as the daemon said it (the ranks a timeout waited on, the
        /// descriptor field it rejected, ...); `None` if it did not say.
        reason: Option<String>,
    },
    /// An attach argument's environment variable is invalid.
    #[error("invalid argument: {0}")]
    Env(#[from] EnvError),
    /// The daemon did not tell its place in the job (it is older than this client).
    #[error("the daemon did not say its place in the job (world size, rank): it is older than this client")]
    NoWorld,
}

impl Error {
    /// The stable code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Attach(AttachError::Connect(_)) => ErrorCode::Connect,
            Error::Attach(AttachError::Rejected(_)) => ErrorCode::Rejected,
            Error::Attach(_) => ErrorCode::Protocol,
            Error::Channel(e) => match e {
                TrainerError::ArenaFull { .. } => ErrorCode::ArenaFull,
                TrainerError::ZeroLength => ErrorCode::InvalidArg,
                TrainerError::NameInUse(_) => ErrorCode::NameInUse,
                TrainerError::UnknownTensor(_)
                | TrainerError::TooManyTensors
                | TrainerError::NotF32(_)
                | TrainerError::LengthMismatch { .. } => ErrorCode::InvalidArg,
                TrainerError::TooManyInFlight(_) | TrainerError::RingFull => ErrorCode::Busy,
                TrainerError::Ring(_) => ErrorCode::Corrupted,
                TrainerError::Timeout(_) => ErrorCode::Timeout,
                TrainerError::DaemonGone => ErrorCode::DaemonGone,
                TrainerError::Io(_) => ErrorCode::Io,
            },
            Error::UnknownTensor(_) | Error::InvalidArgument(_) | Error::Env(_) => ErrorCode::InvalidArg,
            Error::NoWorld => ErrorCode::Protocol,
            Error::TensorBusy { .. } => ErrorCode::TensorBusy,
            Error::OpFailed { .. } => ErrorCode::OpFailed,
        }
    }
}

/// Name of a raw status (`"ok"`, `"invalid_descriptor"`, ...), as in `dlcp.h`.
pub fn status_name(status: Status) -> &'static str {
    match status {
        Status::Ok => "ok",
        Status::InvalidDescriptor => "invalid_descriptor",
        Status::Timeout => "timeout",
        Status::PeerDown => "peer_down",
        Status::Shutdown => "shutdown",
        Status::Unknown(_) => "unknown",
    }
}

/// What a [`Status::InvalidDescriptor`] detail code means (the daemon's `DescError::code`).
pub fn descriptor_error_name(detail: u32) -> &'static str {
    match detail {
        1 => "reserved bytes not zero",
        2 => "unknown opcode",
        3 => "unknown dtype",
        4 => "unknown flag bits",
        5 => "empty tensor",
        6 => "length overflows",
        7 => "misaligned arena offset",
        8 => "tensor outside the arena",
        9 => "tensor id above the daemon's limit",
        10 => "layer count out of range",
        11 => "layer not below the layer count",
        12 => "loss budget above the daemon's cap",
        13 => "tensor larger than the daemon's limit shm.max_tensor_bytes",
        14 => "unknown reduction",
        15 => "a collective that does not reduce with a reduction other than sum",
        16 => "a root given for a collective other than broadcast",
        17 => "broadcast root not a daemon rank of the job",
        _ => "unknown descriptor error",
    }
}

fn describe_status(c: &Completion) -> String {
    match c.status {
        Status::InvalidDescriptor => {
            format!("invalid_descriptor (detail {}: {})", c.detail, descriptor_error_name(c.detail))
        }
        Status::Unknown(raw) => format!("unknown status {raw} (detail {})", c.detail),
        s => format!("{} (detail {})", status_name(s), c.detail),
    }
}

/// A trainer's attachment to the local daemon.
///
/// Dropping it detaches: the daemon sees the control socket close and reclaims
/// the segment; pointers from [`Client::data_ptr`] become invalid.
#[derive(Debug)]
pub struct Client {
    /// The channel: mapping, rings, doorbells and the tensor registry.
    channel: TrainerChannel,
    /// op_seq → tensor (none for a barrier), for ops submitted and not yet
    /// completed. A tensor is busy (owned by the daemon) while an op on it is here.
    ops: HashMap<u64, Option<TensorId>>,
    /// Completions received while waiting for another op.
    ready: VecDeque<Completion>,
    /// As registered: local rank, local world.
    local: (u32, u32),
}

impl Client {
    /// Connects to the daemon's control socket at `socket_path`, registers as
    /// `local_rank` of `local_world` trainers of job `job_id` on this host, and maps
    /// the segment the daemon hands back. Waits at most 5 s for the daemon.
    pub fn attach(
        socket_path: impl AsRef<Path>,
        job_id: u64,
        local_rank: u32,
        local_world: u32,
    ) -> Result<Client, Error> {
        if local_world == 0 || local_rank >= local_world {
            return Err(Error::InvalidArgument(format!(
                "local rank {local_rank} is not below the local world size {local_world}"
            )));
        }
        let channel = TrainerChannel::attach(socket_path, job_id, local_rank, local_world)?;
        Ok(Client { channel, ops: HashMap::new(), ready: VecDeque::new(), local: (local_rank, local_world) })
    }

    /// [`Client::attach`] with each argument `args` leaves out taken from the
    /// environment: `DLCP_SOCKET`, `DLCP_JOB`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`
    /// (see [`AttachArgs`]), as the Python client and the PyTorch hook do.
    pub fn attach_env(args: &AttachArgs) -> Result<Client, Error> {
        let r = args.resolve()?;
        Client::attach(r.socket, r.job, r.local_rank, r.local_world)
    }

    /// Where this trainer stands in its job: its global rank and the job's
    /// world size (see [`World`]). [`Error::NoWorld`] from a daemon older
    /// than this client, which does not say.
    pub fn world(&self) -> Result<World, Error> {
        let place = self.channel.place();
        if place.nodes == 0 {
            return Err(Error::NoWorld);
        }
        let (local_rank, local_world) = self.local;
        Ok(World { node_rank: place.node_rank, nodes: place.nodes, local_rank, local_world })
    }

    /// The daemon's reason for a failed completion `c` (the ranks a timeout
    /// waited on, the descriptor field it rejected, ...), taken once; `None`
    /// for an OK completion or if the daemon did not say.
    pub fn failure_reason(&mut self, c: &Completion) -> Option<String> {
        if c.status == Status::Ok {
            return None;
        }
        self.channel.failure_reason(c.op_seq, c.tensor_id)
    }

    /// The report of completion `c` of tensor `id`, or [`Error::OpFailed`]
    /// with the daemon's reason if its status is not OK.
    pub fn check(&mut self, id: TensorId, c: Completion) -> Result<Report, Error> {
        let reason = self.failure_reason(&c);
        report(id, c).map_err(|_| Error::OpFailed { completion: c, reason })
    }

    /// The segment geometry (ring capacities, arena size).
    pub fn geometry(&self) -> Geometry {
        self.channel.geometry()
    }

    /// The daemon's id for this attachment.
    pub fn attachment_id(&self) -> u64 {
        self.channel.attachment_id()
    }

    /// Operations submitted whose completion has not been received yet.
    pub fn in_flight(&self) -> usize {
        self.ops.len()
    }

    /// The op sequence number the next [`submit`](Self::submit) uses (1 after attach).
    ///
    /// The daemon matches an op across trainers by (op_seq, tensor id): every
    /// trainer of a job must submit the same sequence of ops.
    pub fn next_op_seq(&self) -> u64 {
        self.channel.next_op_seq()
    }

    /// Sets the op sequence number the next [`submit`](Self::submit) uses: after a
    /// failed op, or when a replacement trainer joins a running job, the trainers
    /// agree on where to continue and say so here. Refused if an op in flight has
    /// a sequence number `>= seq` (the two would collide).
    pub fn set_next_op_seq(&mut self, seq: u64) -> Result<(), Error> {
        if let Some(s) = self.ops.keys().copied().filter(|&s| s >= seq).max() {
            return Err(Error::InvalidArgument(format!(
                "op {s} is still in flight: the next op_seq must be above it, not {seq}"
            )));
        }
        self.channel.set_next_op_seq(seq);
        Ok(())
    }

    /// Allocates a named f32 tensor of `len_elems` elements in the shared arena.
    /// Its contents start as whatever the arena held (zero for a fresh segment).
    pub fn alloc(&mut self, name: &str, len_elems: u64) -> Result<TensorId, Error> {
        Ok(self.channel.alloc(name, len_elems)?.id)
    }

    /// Allocates a named tensor of `len_elems` elements of `dtype` (f32, f16
    /// or bf16). An f16 or bf16 tensor is reduced with `f32` accumulation and
    /// one rounding to its type (to nearest even); its bytes are written and
    /// read with [`Client::write_bytes`] / [`Client::read_bytes`] (or in place
    /// through [`Client::data_ptr`], cast to 2-byte elements).
    pub fn alloc_typed(&mut self, name: &str, len_elems: u64, dtype: ElemType) -> Result<TensorId, Error> {
        Ok(self.channel.alloc_typed(name, len_elems, dtype)?.id)
    }

    /// Frees a tensor (refused while an op on it is in flight). Its id is not reused;
    /// pointers from [`Client::data_ptr`] to it must not be used any more.
    pub fn free(&mut self, id: TensorId) -> Result<(), Error> {
        let name = self.idle(id)?.name.clone();
        self.channel.free(&name)?;
        Ok(())
    }

    /// The tensor with this id.
    pub fn tensor(&self, id: TensorId) -> Option<&Tensor> {
        self.channel.tensor_by_id(id)
    }

    /// The id of the tensor with this name.
    pub fn lookup(&self, name: &str) -> Option<TensorId> {
        self.channel.tensor(name).map(|t| t.id)
    }

    fn known(&self, id: TensorId) -> Result<&Tensor, Error> {
        self.channel.tensor_by_id(id).ok_or(Error::UnknownTensor(id.0))
    }

    /// The tensor, if no op on it is in flight.
    fn idle(&self, id: TensorId) -> Result<&Tensor, Error> {
        let t = self.known(id)?;
        match self.ops.iter().find(|&(_, &busy)| busy == Some(id)) {
            Some((&op_seq, _)) => Err(Error::TensorBusy { name: t.name.clone(), op_seq }),
            None => Ok(t),
        }
    }

    /// Copies `data` into the tensor's buffer (refused while an op is in flight).
    pub fn write(&self, id: TensorId, data: &[f32]) -> Result<(), Error> {
        Ok(self.channel.write(self.idle(id)?, data)?)
    }

    /// Copies the tensor's buffer out (refused while an op is in flight).
    pub fn read(&self, id: TensorId) -> Result<Vec<f32>, Error> {
        Ok(self.channel.read(self.idle(id)?)?)
    }

    /// Copies the raw little-endian elements `data` (the tensor's bytes, any
    /// element type) into its buffer (refused while an op is in flight).
    pub fn write_bytes(&self, id: TensorId, data: &[u8]) -> Result<(), Error> {
        Ok(self.channel.write_bytes(self.idle(id)?, data)?)
    }

    /// Copies the tensor's buffer out as raw little-endian elements (refused
    /// while an op is in flight).
    pub fn read_bytes(&self, id: TensorId) -> Result<Vec<u8>, Error> {
        Ok(self.channel.read_bytes(self.idle(id)?)?)
    }

    /// Raw pointer to the tensor's `len_elems` f32 in the shared arena, for
    /// in-place access from C or Python (Rust code should prefer [`write`](Self::write)
    /// and [`read`](Self::read)). It points into the channel's one mapping of the
    /// segment ([`TrainerChannel::data_ptr`], which also explains why the rings'
    /// ordering covers it).
    ///
    /// Contract for whoever dereferences it: the pointer is valid until the client
    /// is dropped (or the tensor freed); the memory must not be read or written
    /// between [`submit`](Self::submit) of this tensor and the receipt of its
    /// completion (the daemon writes the result there); never form a Rust `&[f32]`
    /// over it while an op is in flight.
    pub fn data_ptr(&self, id: TensorId) -> Result<NonNull<f32>, Error> {
        let t = self.known(id)?;
        self.channel
            .data_ptr(t)
            .ok_or_else(|| Error::InvalidArgument(format!("tensor {} lies outside the arena", t.name)))
    }

    /// Submits `o.collective` (an allreduce by default) of tensor `id`;
    /// returns its op_seq. When its completion arrives (with [`Status::Ok`])
    /// the result has replaced the tensor's contents (a reduce-scatter's only
    /// in this host's shard; a barrier's not at all).
    pub fn submit(&mut self, id: TensorId, o: Options) -> Result<u64, Error> {
        check_options(&o)?;
        let t = self.idle(id)?.clone();
        let op_seq = self.channel.submit(&t, submit_options(id.0, o))?;
        self.ops.insert(op_seq, Some(id));
        Ok(op_seq)
    }

    /// Submits a barrier (no tensor; of `o` only the layer and cookie count);
    /// returns its op_seq. It completes once every trainer of the job has
    /// submitted it.
    pub fn submit_barrier(&mut self, o: Options) -> Result<u64, Error> {
        let o = Options {
            collective: Opcode::Barrier,
            budget_ppm: 0,
            flags: 0,
            root: 0,
            reduce: Reduce::Sum,
            ..o
        };
        check_options(&o)?;
        let op_seq = self.channel.submit_barrier(submit_options(BARRIER_TENSOR.0, o))?;
        self.ops.insert(op_seq, None);
        Ok(op_seq)
    }

    /// A completion if one is ready (never blocks).
    pub fn try_completion(&mut self) -> Result<Option<Completion>, Error> {
        if let Some(c) = self.ready.pop_front() {
            return Ok(Some(c));
        }
        let c = self.channel.try_completion()?;
        if let Some(c) = &c {
            self.ops.remove(&c.op_seq);
        }
        Ok(c)
    }

    /// The descriptors a completion waiter may `poll` without holding the
    /// client: the completion doorbell and the control socket (see
    /// [`TrainerChannel::completion_fds`]). When either is readable, call
    /// [`wait`](Self::wait) with a zero timeout (or a short one, for the
    /// control socket: that is how a daemon that closed it is noticed) until
    /// it times out; then poll again.
    pub fn completion_fds(&self) -> [BorrowedFd<'_>; 2] {
        self.channel.completion_fds()
    }

    /// Sleeps (no spinning) until any completion arrives, or fails with
    /// [`ErrorCode::Timeout`] after `timeout`, or [`ErrorCode::DaemonGone`].
    /// The completion may carry a non-OK status; [`allreduce`](Self::allreduce)
    /// turns that into [`Error::OpFailed`].
    pub fn wait(&mut self, timeout: Duration) -> Result<Completion, Error> {
        if let Some(c) = self.ready.pop_front() {
            return Ok(c);
        }
        let c = self.channel.wait_completion(timeout.min(MAX_WAIT))?;
        self.ops.remove(&c.op_seq);
        Ok(c)
    }

    /// Sleeps until the completion of op `op_seq` arrives; other completions that
    /// arrive meanwhile are kept for [`wait`](Self::wait) / [`try_completion`](Self::try_completion).
    pub fn wait_for(&mut self, op_seq: u64, timeout: Duration) -> Result<Completion, Error> {
        if let Some(i) = self.ready.iter().position(|c| c.op_seq == op_seq) {
            return Ok(self.ready.remove(i).expect("index from position"));
        }
        if !self.ops.contains_key(&op_seq) {
            return Err(Error::InvalidArgument(format!("op {op_seq} is not in flight")));
        }
        let timeout = timeout.min(MAX_WAIT);
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let c = match self.channel.wait_completion(left) {
                Ok(c) => c,
                Err(TrainerError::Timeout(_)) => return Err(TrainerError::Timeout(timeout).into()),
                Err(e) => return Err(e.into()),
            };
            self.ops.remove(&c.op_seq);
            if c.op_seq == op_seq {
                return Ok(c);
            }
            self.ready.push_back(c);
        }
    }

    /// Submits an allreduce (`o.collective`: see [`Client::submit`]) of
    /// tensor `id` and waits for it: `Ok` only if it completed with
    /// [`Status::Ok`], with the result in the tensor's buffer. On
    /// [`ErrorCode::Timeout`] the op is still in flight (the tensor stays
    /// busy until its completion is received).
    pub fn allreduce(&mut self, id: TensorId, o: Options, timeout: Duration) -> Result<Report, Error> {
        let op_seq = self.submit(id, o)?;
        let c = self.wait_for(op_seq, timeout)?;
        self.check(id, c)
    }

    /// Reduce-scatter tensor `id` (sum or average, budget as for an
    /// allreduce) and wait: this host's shard ([`Report::shard`]) of the
    /// tensor holds the reduced values, the rest is left as it was.
    pub fn reduce_scatter(&mut self, id: TensorId, o: Options, timeout: Duration) -> Result<Report, Error> {
        self.allreduce(id, o.collective(Opcode::ReduceScatter).root(0), timeout)
    }

    /// Allgather tensor `id` and wait: this host contributes its shard
    /// ([`Report::shard`]) of the tensor, and the whole tensor is replaced by
    /// every host's shard. `o.reduce` must be the sum; `o.budget_ppm` is the
    /// loss budget of its one (gather) phase.
    pub fn allgather(&mut self, id: TensorId, o: Options, timeout: Duration) -> Result<Report, Error> {
        self.allreduce(id, o.collective(Opcode::Allgather).root(0), timeout)
    }

    /// Broadcast tensor `id` from local rank 0 of the host of daemon rank
    /// `root` and wait: every trainer's tensor is replaced by it. Exact with
    /// `o.budget_ppm` 0 (the default); `o.reduce` must be the sum.
    pub fn broadcast(
        &mut self,
        id: TensorId,
        root: u32,
        o: Options,
        timeout: Duration,
    ) -> Result<Report, Error> {
        self.allreduce(id, o.collective(Opcode::Broadcast).root(root), timeout)
    }

    /// Wait until every trainer of the job has entered this barrier.
    pub fn barrier(&mut self, timeout: Duration) -> Result<Report, Error> {
        let op_seq = self.submit_barrier(Options::default())?;
        let c = self.wait_for(op_seq, timeout)?;
        self.check(BARRIER_TENSOR, c)
    }
}

/// The checks of [`Client::submit`] the daemon would make anyway.
fn check_options(o: &Options) -> Result<(), Error> {
    if o.layers == 0 || o.layer >= o.layers {
        return Err(Error::InvalidArgument(format!(
            "layer {} is not below the layer count {}",
            o.layer, o.layers
        )));
    }
    if o.flags & !KNOWN_FLAGS != 0 {
        return Err(Error::InvalidArgument(format!("unknown flag bits {:#x}", o.flags & !KNOWN_FLAGS)));
    }
    Ok(())
}

/// The channel's options for `o` on tensor id `tensor_id`.
fn submit_options(tensor_id: u32, o: Options) -> SubmitOptions {
    SubmitOptions {
        tensor_id,
        layer: o.layer,
        layers: o.layers,
        budget_ppm: o.budget_ppm,
        flags: o.flags,
        cookie: o.cookie,
        reduce: o.reduce,
        opcode: o.collective,
        root: o.root,
    }
}

/// The report of a completion, or [`Error::OpFailed`] (without the daemon's
/// reason: [`Client::check`] adds it) if its status is not OK.
pub fn report(id: TensorId, c: Completion) -> Result<Report, Error> {
    if c.status != Status::Ok {
        return Err(Error::OpFailed { completion: c, reason: None });
    }
    Ok(Report {
        op_seq: c.op_seq,
        tensor: id,
        delivered_ppm: c.delivered_ppm,
        repairs: c.repairs,
        duration: c.duration,
        shard_offset: c.shard_offset,
        shard_len: c.shard_len,
    })
}

/// The library version (crate version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
