//! The endpoint's public vocabulary: op ids and options, timer settings and
//! configuration, errors, reports, events and the memory footprint.

use crate::bitmap::Bitmap;
use crate::flow::FlowConfig;
use crate::priority::ClassifierConfig;
use crate::rate::RateConfig;
use crate::time::{Duration, Instant};
use crate::transfer::TransferReport;
pub use crate::wire::{Collective, DType, ReduceOp};
use crate::wire::{FailReason, Header, JobKey, PacketAuth, Phase};

/// Identity of an op: matched across ranks by (job, run, `seq`, `tensor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId {
    /// The local run's epoch ([`Endpoint::begin_run`](crate::endpoint::Endpoint::begin_run);
    /// on the wire, the run id the job's daemons agreed for it, [`crate::run`]).
    pub run: u64,
    /// Op sequence number (the trainer's collective-call counter).
    pub seq: u64,
    /// Tensor id (bucket or parameter index).
    pub tensor: u32,
}

/// A slot of the endpoint's op table (its slab of ops in flight).
pub(crate) type Slot = u32;

/// No slot (an item about an op that is not in the table, e.g. a lingering one).
pub(crate) const NO_SLOT: Slot = u32::MAX;

/// An op as queues refer to it: its id, and the slot it has while in flight
/// (the id's fields side by side with the slot: 24 bytes, not 32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpKey {
    run: u64,
    seq: u64,
    tensor: u32,
    /// Its slot ([`NO_SLOT`]: not in flight).
    pub slot: Slot,
}

impl OpKey {
    /// Op `id` in `slot`.
    pub(crate) fn new(id: OpId, slot: Slot) -> OpKey {
        OpKey { run: id.run, seq: id.seq, tensor: id.tensor, slot }
    }

    /// An op that is not in the table (lingering, or none: a HELLO).
    pub(crate) fn outside(id: OpId) -> OpKey {
        OpKey::new(id, NO_SLOT)
    }

    /// The op.
    pub(crate) fn id(self) -> OpId {
        OpId { run: self.run, seq: self.seq, tensor: self.tensor }
    }
}

/// How a missing reduce-scatter contribution is filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Treat it as zero.
    Zero,
    /// Use the owner's own contribution in its place.
    Local,
}

/// Per-op options (what the trainer asks for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpOptions {
    /// Layer position of the tensor, 0 = front (input side).
    pub layer: u32,
    /// Number of layer positions.
    pub layers: u32,
    /// Loss budget of reduce-scatter transfers, ppm (0 = reliable).
    pub budget_ppm: u32,
    /// Loss budget of the gather mask, ppm; must be ≤ `budget_ppm`.
    pub gather_budget_ppm: u32,
    /// Fill rule for missing contributions.
    pub fill: Fill,
    /// Rescale each element by `N / delivered contributions`.
    pub rescale: bool,
    /// The reduction.
    pub reduce: ReduceOp,
    /// Element type: the input is rounded to it when the op starts (a no-op
    /// for values of that type), the owner accumulates in `f32` and rounds
    /// its shard once to it, and DATA carries it on the wire ([`crate::elem`]).
    pub dtype: DType,
    /// What [`ReduceOp::Average`] divides by: 0 for the world size (one
    /// contribution per rank); a caller whose contribution is already the sum
    /// of K local ones (a daemon with K trainers) passes world × K. Every
    /// rank of an op must pass the same.
    pub contributors: u32,
    /// The collective (wire version 7). The scatter phase (allreduce,
    /// reduce-scatter, a broadcast's root to each owner) takes `budget_ppm`,
    /// the all-gather phase (allreduce, allgather, broadcast) takes
    /// `gather_budget_ppm`: an allgather has only the latter; a barrier is
    /// exact whatever the budgets say. Allgather, broadcast and barrier do
    /// not reduce: `reduce` must be [`ReduceOp::Sum`].
    pub collective: Collective,
    /// Broadcast: the rank whose input every rank receives (ignored by the
    /// other collectives).
    pub root: u32,
}

impl OpOptions {
    /// Check the options of an op over `world` ranks: budgets, layer, the
    /// broadcast root and the reduction of a collective that does not reduce.
    pub(crate) fn check(&self, world: u32) -> Result<(), StartError> {
        let (collective, root) = (self.collective, self.root);
        if collective == Collective::Broadcast && root >= world {
            return Err(StartError::BadRoot { root, world });
        }
        if !collective.reduces() && self.reduce != ReduceOp::Sum {
            return Err(StartError::BadReduce { collective, reduce: self.reduce });
        }
        if self.budget_ppm > crate::transfer::MAX_BUDGET_PPM || self.gather_budget_ppm > self.budget_ppm {
            let (budget_ppm, gather_budget_ppm) = (self.budget_ppm, self.gather_budget_ppm);
            return Err(StartError::BadBudget { budget_ppm, gather_budget_ppm });
        }
        if self.layers == 0 || self.layer >= self.layers {
            return Err(StartError::BadLayer { layer: self.layer, layers: self.layers });
        }
        Ok(())
    }

    /// What a barrier runs as, whatever `opts` asked for: an exact f32 sum.
    pub(crate) fn barrier(opts: OpOptions) -> OpOptions {
        OpOptions {
            budget_ppm: 0,
            gather_budget_ppm: 0,
            fill: Fill::Zero,
            rescale: false,
            reduce: ReduceOp::Sum,
            dtype: DType::F32,
            contributors: 0,
            ..opts
        }
    }

    /// What an average divides by: [`OpOptions::contributors`], or `world`
    /// when it is 0.
    pub fn divisor(&self, world: u32) -> f32 {
        if self.contributors == 0 { world as f32 } else { self.contributors as f32 }
    }
}

impl Default for OpOptions {
    fn default() -> Self {
        OpOptions {
            layer: 0,
            layers: 1,
            budget_ppm: 10_000,
            gather_budget_ppm: 0,
            fill: Fill::Zero,
            rescale: false,
            reduce: ReduceOp::Sum,
            dtype: DType::F32,
            contributors: 0,
            collective: Collective::Allreduce,
            root: 0,
        }
    }
}

/// Timer settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    /// An op that makes no progress for this long fails.
    pub hard_timeout: Duration,
    /// An op still unfinished this long after it started fails, progress or
    /// not (zero: no such deadline).
    pub op_deadline: Duration,
    /// Lower bound of the adaptive receive deadline (also its re-arm interval).
    pub deadline_min: Duration,
    /// Upper bound of the adaptive receive deadline.
    pub deadline_max: Duration,
    /// Per-chunk completion time assumed before any observation.
    pub initial_per_chunk: Duration,
    /// Initial round-trip estimate for probes.
    pub probe_initial: Duration,
    /// Lower bound of the probe retransmission timer.
    pub probe_min: Duration,
    /// Upper bound of the probe retransmission timer.
    pub probe_max: Duration,
    /// Interval between HELLO heartbeats to every peer (zero disables them).
    pub heartbeat: Duration,
    /// A peer silent this long is reported down.
    pub peer_timeout: Duration,
    /// How long a completed op keeps answering late PROBEs and BITMAPs.
    pub linger: Duration,
    /// How long a receiver that is within budget but incomplete keeps accepting
    /// chunks after a PROBE before it closes: a PROBE travels in the control
    /// class and can overtake the transfer's last chunks queued in the network.
    pub close_grace: Duration,
    /// How long a receiver holds the acknowledgement of an exact all-gather
    /// to send it with later ones in one ACK (wire version 10,
    /// `endpoint::acks`).
    pub ack_delay: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        let ms = Duration::from_millis;
        Timers {
            hard_timeout: ms(10_000),
            op_deadline: Duration::ZERO,
            deadline_min: ms(2),
            deadline_max: ms(2_000),
            initial_per_chunk: Duration::from_micros(50),
            probe_initial: ms(1),
            probe_min: Duration::from_micros(200),
            probe_max: ms(500),
            heartbeat: ms(1_000),
            peer_timeout: ms(5_000),
            linger: ms(10_000),
            close_grace: Duration::from_micros(100),
            ack_delay: ms(25),
        }
    }
}

/// Static configuration of an endpoint.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world: u32,
    /// Job id (packets of other jobs are rejected).
    pub job: u32,
    /// This incarnation's generation: a number for people (logs, status),
    /// announced in HELLO; no peer orders incarnations by it (version 4).
    pub generation: u32,
    /// This incarnation's session: 64 random bits drawn from the operating
    /// system at every start (never reused: the packet key is derived from
    /// it, and packet numbers restart at 0; see `wire::mac`).
    pub session: u64,
    /// The job's packet key schedule, and so the packet authentication mode.
    pub key: JobKey,
    /// Payload bytes per DATA packet (a multiple of 4, ≤ 65532).
    pub chunk_bytes: usize,
    /// Priority classifier.
    pub classifier: ClassifierConfig,
    /// Timers.
    pub timers: Timers,
    /// Pacing rate in bytes per second (0 = unpaced).
    pub pacing_rate: u64,
    /// Pacing burst in bytes.
    pub pacing_burst: u64,
    /// Loss-driven adaptation of the pacing rate ([`crate::rate`]), starting
    /// at `pacing_rate` (None: the rate stays as set).
    pub rate_adapt: Option<RateConfig>,
    /// Cap on bytes buffered for ops not started locally yet.
    pub early_buffer_bytes: usize,
    /// Receiver-driven flow control ([`crate::flow`]); must agree across
    /// the job (announced in HELLO).
    pub flow: FlowConfig,
    /// Path candidates per peer, `1..=`[`crate::paths::MAX_PATHS`]: every
    /// datagram names the one it goes on ([`crate::endpoint::Transmit::path`]),
    /// chosen by path health ([`crate::paths`]). 1: one path (one 5-tuple).
    /// Peers need not agree on it.
    pub paths: u16,
}

impl EndpointConfig {
    /// A configuration with defaults for everything but identity and key.
    pub fn new(rank: u32, world: u32, job: u32, generation: u32, session: u64, key: JobKey) -> Self {
        EndpointConfig {
            rank,
            world,
            job,
            generation,
            session,
            key,
            chunk_bytes: 1372,
            classifier: ClassifierConfig::default(),
            timers: Timers::default(),
            pacing_rate: 0,
            pacing_burst: 64 * 1024,
            rate_adapt: None,
            early_buffer_bytes: 64 << 20,
            flow: FlowConfig::default(),
            paths: 1,
        }
    }
}

/// Why an op could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// The op's run is not this daemon's current local run
    /// ([`Endpoint::begin_run`](crate::endpoint::Endpoint::begin_run)).
    #[error("op of run epoch {epoch}, but the current local run is {current:?}")]
    NotCurrentRun {
        /// The op's epoch.
        epoch: u64,
        /// The current local run's epoch, if any.
        current: Option<u64>,
    },
    /// An op with this id is running or finished recently.
    #[error("op {0:?} is already running or finished recently; use a new op sequence number")]
    Duplicate(OpId),
    /// The tensor is empty.
    #[error("the tensor is empty")]
    Empty,
    /// The tensor has more chunks than the wire can number.
    #[error("the tensor is too large for the wire format")]
    TooLarge,
    /// A budget above the 10% hard cap, or a gather budget above the scatter budget.
    #[error(
        "budget {budget_ppm} ppm / gather {gather_budget_ppm} ppm invalid: need gather <= scatter <= 100000"
    )]
    BadBudget {
        /// Scatter budget.
        budget_ppm: u32,
        /// Gather budget.
        gather_budget_ppm: u32,
    },
    /// A broadcast root that is not a rank of the job.
    #[error("broadcast root {root} is not a rank of this job (ranks 0..{world})")]
    BadRoot {
        /// The root asked for.
        root: u32,
        /// Ranks in the job.
        world: u32,
    },
    /// A reduction other than sum for a collective that does not reduce.
    #[error("{} does not reduce: its reduction must be sum, not {}", .collective.name(), .reduce.name())]
    BadReduce {
        /// The collective.
        collective: Collective,
        /// The reduction asked for.
        reduce: ReduceOp,
    },
    /// The layer position is outside `0..layers`.
    #[error("layer {layer} outside 0..{layers}")]
    BadLayer {
        /// Layer.
        layer: u32,
        /// Layers.
        layers: u32,
    },
}

/// Why an op failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// No progress for the hard timeout; `waiting_on` lists the ranks still owing
    /// something (data, a bitmap or a DONE).
    #[error(
        "no progress for {timeout:?} in the {phase:?} phase; waiting on ranks {waiting_on:?}{}",
        OutOfStep(elsewhere)
    )]
    Timeout {
        /// Phase the op was in.
        phase: Phase,
        /// Ranks it was waiting on.
        waiting_on: Vec<u32>,
        /// The hard timeout.
        timeout: Duration,
        /// Of the ranks waited on, those whose last op packet to this rank
        /// (in the same run) was of another op: `(rank, op sequence,
        /// tensor)` — the ranks may be out of step.
        elsewhere: Vec<(u32, u64, u32)>,
    },
    /// A peer's daemon restarted (a new verified session) while the op was running.
    #[error("rank {rank} restarted (generation {old} -> {new}) during the op")]
    PeerRestarted {
        /// The rank.
        rank: u32,
        /// Generation the op was running with.
        old: u32,
        /// New generation.
        new: u32,
    },
    /// A peer's daemon announced its shutdown while the op was running.
    #[error("rank {rank}'s daemon shut down during the op")]
    PeerLeft {
        /// The rank.
        rank: u32,
    },
    /// A peer's settings disagree with ours: no op can run with it.
    #[error("rank {rank} {mismatch}")]
    PeerIncompatible {
        /// The rank.
        rank: u32,
        /// What differs.
        mismatch: Mismatch,
    },
    /// The job's daemons did not agree on a run for the op within the hard
    /// timeout ([`crate::run`]): the reasons, by rank.
    #[error(
        "no run agreed within {timeout:?}; waiting on ranks {:?}: {}",
        waiting.iter().filter_map(crate::run::Waiting::rank).collect::<Vec<_>>(),
        waiting.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    NoRun {
        /// Why, by rank.
        waiting: Vec<crate::run::Waiting>,
        /// The hard timeout.
        timeout: Duration,
    },
    /// The op was still unfinished at its absolute deadline
    /// ([`Timers::op_deadline`]), progressing or not.
    #[error(
        "not finished within its deadline of {deadline:?} in the {phase:?} phase; waiting on ranks {waiting_on:?}"
    )]
    Deadline {
        /// Phase the op was in.
        phase: Phase,
        /// Ranks it was waiting on.
        waiting_on: Vec<u32>,
        /// The deadline.
        deadline: Duration,
    },
    /// The op belongs to a local run that has ended.
    #[error("the op's run (epoch {epoch}) has ended")]
    RunEnded {
        /// The run's epoch.
        epoch: u64,
    },
    /// Another rank failed the op and said so (a failing DONE, wire version
    /// 5): it will send nothing more for it, so this rank fails it at once
    /// instead of waiting for its own hard timeout.
    #[error("rank {rank} gave up on this op: {reason}")]
    PeerFailed {
        /// The rank that failed it.
        rank: u32,
        /// Why, as it said.
        reason: FailReason,
    },
}

impl OpError {
    /// The reason a failing DONE gives for this failure, when a peer asks
    /// about the op afterwards.
    pub fn fail_reason(&self) -> FailReason {
        match self {
            OpError::Timeout { .. } => FailReason::Timeout,
            OpError::Deadline { .. } => FailReason::Deadline,
            OpError::PeerLeft { .. } | OpError::PeerRestarted { .. } => FailReason::PeerLeft,
            OpError::PeerIncompatible { .. } => FailReason::PeerIncompatible,
            OpError::PeerFailed { .. } => FailReason::PeerFailed,
            OpError::NoRun { .. } | OpError::RunEnded { .. } => FailReason::Other,
        }
    }
}

/// Renders [`OpError::Timeout::elsewhere`]: nothing, or which op each rank
/// waited on was last heard in.
struct OutOfStep<'a>(&'a [(u32, u64, u32)]);

impl core::fmt::Display for OutOfStep<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (i, (rank, seq, tensor)) in self.0.iter().enumerate() {
            let sep = if i == 0 { "; heard in other ops (out of step?): " } else { ", " };
            write!(f, "{sep}rank {rank} last sent op {seq} tensor {tensor}")?;
        }
        Ok(())
    }
}

/// What a completed op delivered: what arrived from whom.
#[derive(Debug, Clone, PartialEq)]
pub struct OpReport {
    /// The op.
    pub id: OpId,
    /// When this rank started it.
    pub started: Instant,
    /// When it completed.
    pub finished: Instant,
    /// Reduce-scatter into this rank's shard: one report per other rank.
    pub scatter: Vec<TransferReport>,
    /// All-gather of other ranks' shards: one report per other rank.
    pub gather: Vec<TransferReport>,
    /// The mask this rank decided for its own shard (zero-filled everywhere).
    pub own_mask: Bitmap,
    /// Chunks of this rank's shard.
    pub own_chunks: u32,
    /// Repair DATA packets this rank sent for the op.
    pub repairs_sent: u32,
    /// True if any receive deadline fired during the op.
    pub deadline_fired: bool,
}

impl OpReport {
    /// Time from local start to completion.
    pub fn duration(&self) -> Duration {
        self.finished - self.started
    }

    /// The least delivered fraction over this rank's transfers.
    pub fn min_delivered_fraction(&self) -> f64 {
        self.scatter.iter().chain(&self.gather).map(TransferReport::delivered_fraction).fold(1.0, f64::min)
    }
}

/// Something the application should know about.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// An allreduce finished; `result` is the reduced tensor.
    OpComplete {
        /// The op.
        id: OpId,
        /// The reduced tensor (identical bytes on every rank).
        result: Vec<f32>,
        /// What arrived from whom.
        report: Box<OpReport>,
    },
    /// An allreduce failed.
    OpFailed {
        /// The op.
        id: OpId,
        /// Why.
        error: OpError,
    },
    /// An op made no progress for the hard timeout, but some of the ranks it
    /// waits on are up, took part in earlier ops of its run and have not
    /// started it yet (their trainers are late): it waits for them, up to the
    /// op deadline. Once per op.
    OpAwaitsLate {
        /// The op.
        id: OpId,
        /// The late ranks.
        ranks: Vec<u32>,
    },
    /// First contact with a peer (or contact again after it was down).
    PeerUp {
        /// Rank.
        rank: u32,
        /// Its generation.
        generation: u32,
    },
    /// A peer came back with a new generation.
    PeerRestarted {
        /// Rank.
        rank: u32,
        /// Previous generation.
        old: u32,
        /// New generation.
        new: u32,
    },
    /// A peer's daemon announced its shutdown (GOODBYE).
    PeerLeft {
        /// Rank.
        rank: u32,
    },
    /// A peer has been silent for the peer timeout.
    PeerDown {
        /// Rank.
        rank: u32,
    },
    /// Datagrams from a peer that cannot talk to this one (another wire
    /// version, packet authentication mode or chunk size) were refused;
    /// reported at most once per [`MISMATCH_REPORT_INTERVAL`] per peer.
    PeerIncompatible {
        /// The peer, as the caller of `handle_datagram_from` knew it (`None`:
        /// another address).
        rank: Option<u32>,
        /// What differs.
        mismatch: Mismatch,
    },
}

/// How often at most a peer's incompatibility is reported as an event.
pub const MISMATCH_REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// A setting two daemons must agree on and do not: the peer's value, then ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// Another wire version (seen in a datagram's header).
    #[error("speaks dlcp wire version {theirs}; this daemon speaks version {ours}")]
    WireVersion {
        /// The peer's.
        theirs: u8,
        /// Ours.
        ours: u8,
    },
    /// Another packet authentication mode (`[security] packet_auth`).
    #[error(
        "sends datagrams with packet_auth = \"{theirs}\"; this daemon has packet_auth = \"{ours}\" \
         (set [security] packet_auth the same on every daemon)"
    )]
    PacketAuth {
        /// The peer's.
        theirs: PacketAuth,
        /// Ours.
        ours: PacketAuth,
    },
    /// Another chunk size (announced in HELLO): the peer's datagrams are
    /// refused until it announces ours.
    #[error(
        "cuts tensors into chunks of {theirs} bytes; this daemon uses {ours} \
         (set network.mtu / network.chunk_bytes the same on every daemon)"
    )]
    ChunkBytes {
        /// The peer's.
        theirs: u32,
        /// Ours.
        ours: u32,
    },
    /// Another flow-control window (announced in HELLO; senders start at
    /// their receivers' window, so it must agree).
    #[error(
        "has a flow-control window of {theirs} datagrams; this daemon has {ours} \
         (set flow.window the same on every daemon; 0 is off)"
    )]
    FlowWindow {
        /// The peer's.
        theirs: u16,
        /// Ours.
        ours: u16,
    },
    /// Another digest of the settings every host must share (class bands,
    /// droppable classes, layer and magnitude levels, the budget cap; see
    /// [`settings_digest`](crate::endpoint::settings_digest)).
    #[error(
        "has settings digest {theirs:016x}; this daemon has {ours:016x} \
         (set [classes] and the budget cap the same on every daemon)"
    )]
    SettingsDigest {
        /// The peer's.
        theirs: u64,
        /// Ours.
        ours: u64,
    },
}

/// What an endpoint holds in memory ([`Endpoint::footprint`](crate::endpoint::Endpoint::footprint)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Protocol state: ops, transfers, bitmaps, classes, transmit queues,
    /// timer index, peers, lingering and finished ops (heap capacity plus
    /// struct sizes; allocator overhead not counted).
    pub state_bytes: usize,
    /// Tensor data: inputs, results and reduce-scatter receive buffers
    /// (proportional to the tensor, not to the world).
    pub tensor_bytes: usize,
    /// Bytes of datagrams buffered for ops not started yet.
    pub early_bytes: usize,
    /// Transfers (send and receive, both phases) not yet closed.
    pub open_transfers: u32,
    /// Datagrams waiting in the transmit queues.
    pub queued: usize,
}

/// Element range of rank `rank`'s shard of a tensor of `len` elements over
/// `world` ranks: `rank·len/world .. (rank+1)·len/world`, rounded down. This
/// is the part a reduce-scatter leaves reduced at `rank` and the part an
/// allgather takes from `rank`'s input.
pub fn shard_range(len: usize, world: u32, rank: u32) -> std::ops::Range<usize> {
    let at = |r: u32| (u128::from(r) * len as u128 / u128::from(world.max(1))) as usize;
    at(rank.min(world))..at((rank + 1).min(world))
}

/// What every packet of an op says the op is (wire version 6: element type
/// and reduction; version 7: the collective too): a packet that disagrees
/// with its op is refused ([`crate::stats::Rejected::op_kind_mismatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct OpKind {
    /// Element type.
    pub dtype: DType,
    /// Reduction.
    pub reduce: ReduceOp,
    /// Collective.
    pub collective: Collective,
}

impl OpKind {
    /// The kind of `opts`.
    pub(crate) fn of(opts: &OpOptions) -> OpKind {
        OpKind { dtype: opts.dtype, reduce: opts.reduce, collective: opts.collective }
    }

    /// The kind a packet header claims.
    pub(crate) fn of_header(h: &Header) -> OpKind {
        OpKind { dtype: h.dtype, reduce: h.reduce, collective: h.collective }
    }

    /// Write it into `h`.
    pub(crate) fn stamp(self, h: &mut Header) {
        (h.dtype, h.reduce, h.collective) = (self.dtype, self.reduce, self.collective);
    }
}
