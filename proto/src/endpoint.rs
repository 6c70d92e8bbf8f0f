//! The allreduce endpoint: bounded-loss transfers and the allreduce state machine.
//!
//! One [`Endpoint`] per rank (per daemon). It is sans-IO, quinn-proto style:
//! feed it datagrams with [`Endpoint::handle_datagram`], expired timers with
//! [`Endpoint::handle_timeout`], take datagrams to send from
//! [`Endpoint::poll_transmit`], the next timer from [`Endpoint::poll_timeout`] and
//! results from [`Endpoint::poll_event`].
//!
//! ## Allreduce ("transpose" / colocated parameter server)
//!
//! A tensor of `L` elements is cut into `N` contiguous shards; rank `s` owns
//! shard `s`. Each shard is cut into chunks of `chunk_bytes / 4` elements (one DATA
//! packet each).
//!
//! 1. **Reduce-scatter**: every rank sends shard `s` of its input to rank `s`
//!    (one *transfer* per (op, tensor, phase, sender)). The owner reduces the
//!    contributions in rank order `0, 1, …, N−1`, filling a missing chunk with zero
//!    or with its own value ([`Fill`]), optionally rescaling by `N / delivered`.
//! 2. **All-gather**: the owner sends its reduced shard to every rank. Replicas
//!    must not diverge, so the owner collects every receiver's bitmap, repairs the
//!    union of what is missing until it fits the (stricter) gather budget, and
//!    then announces one agreed *mask* in DONE; every rank, the owner included,
//!    zero-fills exactly the masked chunks. With a gather budget of 0 the mask is
//!    always empty (full repair).
//!
//! ## Bounded-loss transfer
//!
//! The sender sends every chunk once, highest class first (per-class queues),
//! then a PROBE. The receiver closes the transfer when it holds every chunk, or —
//! on a PROBE or when its adaptive deadline fires — when it holds at least
//! `n − ⌊n·p⌋` chunks including every chunk of a non-droppable class (DATA
//! carries the REQUIRED flag and the header the count), and answers DONE.
//! Otherwise it answers with a BITMAP of what it holds; the sender then repairs
//! exactly the chunks needed to get inside the budget: every missing required
//! chunk, then missing droppable chunks highest class first
//! ([`select_repairs`]), and probes again. Probes are retransmitted on an
//! RTT-based timer ([`RttEstimator`]) with exponential backoff; the receiver's
//! deadline comes from a [`DeadlineEstimator`] over observed completion times.
//! If an op makes no progress for the hard timeout it fails with an error naming
//! the ranks it was waiting for — never a hang.
//!
//! ## Membership
//!
//! Ops are matched across ranks by (job, op sequence, tensor id). Every packet
//! carries its sender's generation; a higher generation means the peer's daemon
//! restarted: live ops fail with [`OpError::PeerRestarted`] and new ops include
//! the new incarnation. Packets of an older generation are dropped and counted.
//! Packets for ops this rank has not started yet are buffered (bounded) and
//! replayed when it starts them.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::ops::Range;

use crate::bitmap::Bitmap;
use crate::class::{Class, ClassSet};
use crate::estimator::{DeadlineEstimator, RttEstimator};
use crate::pacer::Pacer;
use crate::pool::BufferPool;
use crate::priority::{ChunkTraits, ClassifierConfig, classify};
use crate::sim::{Node, Transmit};
use crate::stats::RejectCounters;
pub use crate::stats::{PacketCount, RxDrops, Stats};
use crate::time::{Duration, Instant};
use crate::wire::{self, DType, Flags, Header, MacKey, PacketType, Phase, WireError};

/// The largest loss budget any transfer may have (10%), in ppm.
pub const MAX_BUDGET_PPM: u32 = 100_000;

/// Identity of an op: matched across ranks by (job, `seq`, `tensor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId {
    /// Op sequence number (the trainer's collective-call counter).
    pub seq: u64,
    /// Tensor id (bucket or parameter index).
    pub tensor: u32,
}

/// How a missing reduce-scatter contribution is filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Treat it as zero.
    Zero,
    /// Use the owner's own contribution in its place.
    Local,
}

/// The reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise mean over the world size.
    Average,
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
        }
    }
}

/// Timer settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    /// An op that makes no progress for this long fails.
    pub hard_timeout: Duration,
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
}

impl Default for Timers {
    fn default() -> Self {
        let ms = Duration::from_millis;
        Timers {
            hard_timeout: ms(10_000),
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
    /// This incarnation's generation (must increase across restarts).
    pub generation: u32,
    /// Packet authentication key.
    pub key: MacKey,
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
    /// Cap on bytes buffered for ops not started locally yet.
    pub early_buffer_bytes: usize,
}

impl EndpointConfig {
    /// A configuration with defaults for everything but identity and key.
    pub fn new(rank: u32, world: u32, job: u32, generation: u32, key: MacKey) -> Self {
        EndpointConfig {
            rank,
            world,
            job,
            generation,
            key,
            chunk_bytes: 1392,
            classifier: ClassifierConfig::default(),
            timers: Timers::default(),
            pacing_rate: 0,
            pacing_burst: 64 * 1024,
            early_buffer_bytes: 64 << 20,
        }
    }
}

/// Why an op could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
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
    #[error("no progress for {timeout:?} in the {phase:?} phase; waiting on ranks {waiting_on:?}")]
    Timeout {
        /// Phase the op was in.
        phase: Phase,
        /// Ranks it was waiting on.
        waiting_on: Vec<u32>,
        /// The hard timeout.
        timeout: Duration,
    },
    /// A peer's daemon restarted (new generation) while the op was running.
    #[error("rank {rank} restarted (generation {old} -> {new}) during the op")]
    PeerRestarted {
        /// The rank.
        rank: u32,
        /// Generation the op was running with.
        old: u32,
        /// New generation.
        new: u32,
    },
}

/// What one transfer delivered, as seen by its receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferReport {
    /// The sending rank (for gather: the shard's owner).
    pub peer: u32,
    /// Phase.
    pub phase: Phase,
    /// Chunks in the transfer.
    pub chunks: u32,
    /// Chunks that arrived before the transfer closed.
    pub delivered: Bitmap,
    /// Gather only: the agreed mask of zero-filled chunks.
    pub mask: Option<Bitmap>,
    /// Chunks that arrived as repairs.
    pub repaired: u32,
    /// True if the adaptive deadline fired.
    pub deadline_fired: bool,
    /// First packet of the transfer.
    pub first_at: Option<Instant>,
    /// When the transfer closed.
    pub closed_at: Instant,
}

impl TransferReport {
    /// Fraction of chunks whose data is in the result (gather: not masked).
    pub fn delivered_fraction(&self) -> f64 {
        if self.chunks == 0 {
            return 1.0;
        }
        let used = match &self.mask {
            Some(m) => self.chunks - m.count_ones(),
            None => self.delivered.count_ones(),
        };
        f64::from(used) / f64::from(self.chunks)
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
    /// A peer has been silent for the peer timeout.
    PeerDown {
        /// Rank.
        rank: u32,
    },
}

/// What an endpoint holds in memory ([`Endpoint::footprint`]).
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

/// Number of chunks that may be missing from `n` under `budget_ppm`.
pub fn allowed_missing(n: u32, budget_ppm: u32) -> u32 {
    (u64::from(n) * u64::from(budget_ppm.min(wire::PPM)) / u64::from(wire::PPM)) as u32
}

/// Choose which missing chunks to repair: every missing *required* chunk, then
/// missing droppable chunks by decreasing class (ties: lower index first) until
/// at most `allowed` remain missing. Returns them in that order. Pure.
pub fn select_repairs(
    missing: impl IntoIterator<Item = u32>,
    class_of: impl Fn(u32) -> Class,
    droppable: ClassSet,
    allowed: u32,
) -> Vec<u32> {
    let mut required = Vec::new();
    let mut optional = Vec::new();
    for c in missing {
        if droppable.contains(class_of(c)) { optional.push(c) } else { required.push(c) }
    }
    let excess = (optional.len() as u64).saturating_sub(u64::from(allowed)) as usize;
    optional.sort_by(|&a, &b| class_of(b).cmp(&class_of(a)).then(a.cmp(&b)));
    required.extend_from_slice(&optional[..excess]);
    required
}

/// Where a tensor's shards and chunks lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    len: usize,
    world: u32,
    chunk_elems: usize,
}

impl Layout {
    fn shard(&self, s: u32) -> Range<usize> {
        let (l, w) = (self.len as u128, u128::from(self.world));
        let a = (u128::from(s) * l / w) as usize;
        let b = ((u128::from(s) + 1) * l / w) as usize;
        a..b
    }

    fn chunks(&self, s: u32) -> u32 {
        self.shard(s).len().div_ceil(self.chunk_elems) as u32
    }

    /// Element range of chunk `c` of shard `s`, relative to the shard.
    fn chunk(&self, s: u32, c: u32) -> Range<usize> {
        let n = self.shard(s).len();
        let a = (c as usize * self.chunk_elems).min(n);
        a..(a + self.chunk_elems).min(n)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// DATA (first pass or repairs) queued.
    Sending,
    /// Everything queued went out; waiting for a bitmap or DONE.
    Probing,
}

#[derive(Debug)]
struct SendState {
    n: u32,
    required: u32,
    budget_ppm: u32,
    stage: Stage,
    queued: u32,
    seq: u32,
    probe_sent: Option<(u32, Instant)>,
    probe_timer: Option<Instant>,
    /// The last chunk sent (carried in PROBE so the receiver can tell whether
    /// the PROBE overtook chunks still in flight).
    last_sent: u32,
    backoff: u32,
    /// Chunks the receiver was known to hold when this report round began:
    /// a complete report that adds none means the last repairs were all lost.
    /// (`None` before the first complete report.)
    round_known: Option<u32>,
    have: Bitmap,
    segs_seen: Bitmap,
    reported: bool,
    done: bool,
    repairs: u32,
}

impl SendState {
    fn new(n: u32, required: u32, budget_ppm: u32, seg_bytes: usize) -> Self {
        SendState {
            n,
            required,
            budget_ppm,
            stage: Stage::Sending,
            queued: 0,
            seq: 0,
            probe_sent: None,
            probe_timer: None,
            last_sent: 0,
            backoff: 0,
            round_known: None,
            have: Bitmap::new(n),
            segs_seen: Bitmap::new(Bitmap::segment_count(n, seg_bytes)),
            reported: false,
            done: false,
            repairs: 0,
        }
    }
}

#[derive(Debug)]
struct RecvState {
    n: u32,
    required: Option<u32>,
    budget_ppm: u32,
    got: Bitmap,
    got_required: u32,
    buf: Vec<f32>,
    first_at: Option<Instant>,
    /// Arrival of the latest new chunk.
    last_at: Option<Instant>,
    deadline: Option<Instant>,
    deadline_fired: bool,
    deadline_backoff: u32,
    grace: Option<Instant>,
    /// While `grace` runs: the chunk whose arrival ends it early.
    awaited: Option<u32>,
    /// When the PROBE that set `awaited` arrived (to learn how far PROBEs
    /// overtake data queued in the network).
    probe_at: Option<Instant>,
    /// Gather: complete and waiting for the owner's DONE; re-send the
    /// COMPLETE bitmap on this RTT-based timer in case the DONE was lost.
    nudge: Option<(Instant, u32)>,
    closed_at: Option<Instant>,
    probe_seq: u32,
    repaired: u32,
    mask: Option<Bitmap>,
    mask_parts: Option<(Bitmap, Bitmap)>,
    complete_sent: bool,
}

impl RecvState {
    /// `buf`: the receive buffer (contents unspecified: only chunks marked in
    /// `got` are ever read).
    fn new(n: u32, buf: Vec<f32>) -> Self {
        RecvState {
            n,
            required: None,
            budget_ppm: 0,
            got: Bitmap::new(n),
            got_required: 0,
            buf,
            first_at: None,
            last_at: None,
            deadline: None,
            deadline_fired: false,
            deadline_backoff: 0,
            grace: None,
            awaited: None,
            probe_at: None,
            nudge: None,
            closed_at: None,
            probe_seq: 0,
            repaired: 0,
            mask: None,
            mask_parts: None,
            complete_sent: false,
        }
    }

    fn closable(&self) -> bool {
        let missing = self.got.count_zeros();
        missing == 0
            || (self.required.is_some_and(|r| self.got_required >= r)
                && missing <= allowed_missing(self.n, self.budget_ppm))
    }

    fn report(&self, peer: u32, phase: Phase) -> TransferReport {
        TransferReport {
            peer,
            phase,
            chunks: self.n,
            delivered: self.got.clone(),
            mask: self.mask.clone(),
            repaired: self.repaired,
            deadline_fired: self.deadline_fired,
            first_at: self.first_at,
            closed_at: self.closed_at.unwrap_or(Instant::ZERO),
        }
    }
}

#[derive(Debug)]
struct Op {
    opts: OpOptions,
    started: Instant,
    last_progress: Instant,
    layout: Layout,
    input: Vec<f32>,
    result: Vec<f32>,
    /// Classes of the chunks of each shard in reduce-scatter (empty for own shard).
    classes: Vec<Vec<Class>>,
    /// Classes of own shard's chunks in all-gather.
    gclasses: Vec<Class>,
    sends: Vec<Option<SendState>>,
    recvs: Vec<Option<RecvState>>,
    reduced: bool,
    gsends: Vec<Option<SendState>>,
    gmask: Option<Bitmap>,
    grecvs: Vec<Option<RecvState>>,
    repairs_sent: u32,
    peer_gen: Vec<Option<u32>>,
    /// The classifier when the op started (a reload changes only new ops).
    classifier: ClassifierConfig,
}

#[derive(Debug)]
struct Linger {
    until: Instant,
    own_chunks: u32,
    mask: Bitmap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxKind {
    Data { chunk: u32, repair: bool, class: Class },
    Probe,
    Bitmap { seg: u32 },
    Done { seg: u32 },
    Hello,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TxItem {
    id: OpId,
    phase: Phase,
    peer: u32,
    kind: TxKind,
}

#[derive(Debug, Clone, Default)]
struct PeerState {
    generation: Option<u32>,
    last_heard: Option<Instant>,
    up: bool,
}

/// One rank's protocol state machine. See the module docs.
#[derive(Debug)]
pub struct Endpoint {
    cfg: EndpointConfig,
    chunk_elems: usize,
    ops: BTreeMap<OpId, Op>,
    lingering: BTreeMap<OpId, Linger>,
    finished: VecDeque<(Instant, OpId)>,
    finished_set: HashSet<OpId>,
    early: BTreeMap<OpId, (Instant, Vec<Vec<u8>>)>,
    early_bytes: usize,
    queues: [VecDeque<TxItem>; 9],
    pacer: Pacer,
    peers: Vec<PeerState>,
    rtt: RttEstimator,
    deadlines: [DeadlineEstimator; 2],
    events: VecDeque<Event>,
    stats: Stats,
    next_heartbeat: Option<Instant>,
    hello_seq: u32,
    now: Instant,
    /// Buffers of finished ops, reused by the next ones (no page faults).
    pool: BufferPool,
    /// Inside [`Endpoint::poll_transmit_many`]: encode without tags (they
    /// are computed for the whole batch before it returns).
    defer_tags: bool,
    /// Index of transfer timers: every value a probe timer, receive deadline,
    /// grace or nudge was armed with, keyed by transfer. Entries are checked
    /// against the transfer when read ([`Endpoint::timer_live`]), so a timer
    /// that was re-armed, cleared or whose op ended leaves a stale entry that
    /// is skipped and pruned. Keeps `poll_timeout` and `handle_timeout` from
    /// scanning every transfer of every op (O(world) per event).
    timers: BTreeSet<TimerEntry>,
    /// How far PROBEs were recently seen to overtake the chunk they name
    /// (see [`Endpoint::close_grace`]).
    overtake: Duration,
    /// `(last heard, rank)` of every peer that is up, for the peer timeout.
    heard: BTreeSet<(Instant, u32)>,
}

/// A transfer's side, in the order `handle_timeout` serves them.
const SIDE_SCATTER_SEND: u8 = 0;
const SIDE_GATHER_SEND: u8 = 1;
const SIDE_SCATTER_RECV: u8 = 2;
const SIDE_GATHER_RECV: u8 = 3;

/// `(when, op, side, peer)`: one armed timer of one transfer.
type TimerEntry = (Instant, OpId, u8, u32);

/// The probe timer of a send transfer, if it is live.
fn send_timer(st: &SendState) -> Option<Instant> {
    st.probe_timer.filter(|_| !st.done && st.stage == Stage::Probing && !st.reported)
}

/// Every live timer of a receive transfer.
fn recv_timers(r: &RecvState) -> impl Iterator<Item = Instant> {
    let open = r.closed_at.is_none();
    [r.deadline, r.grace, r.nudge.map(|n| n.0)].into_iter().flatten().filter(move |_| open)
}

/// Index of the repair queue in `Endpoint::queues` (after the 8 class queues).
const REPAIR_QUEUE: usize = Class::COUNT;
/// Service order of the transmit queues: control, repairs, then data classes high to low.
const SERVICE_ORDER: [usize; 9] = [7, REPAIR_QUEUE, 6, 5, 4, 3, 2, 1, 0];

/// Largest exponent of the probe, nudge and deadline retry backoff (2^3 = 8×):
/// control packets are tiny, and under heavy random loss an unbounded backoff
/// turns a few consecutive losses into a long stall.
const MAX_BACKOFF: u32 = 3;

/// Copies of every PROBE a sender transmits (same sequence number; receivers
/// act on the first and count the rest). A PROBE is ~100 bytes per transfer
/// of up to thousands of chunks, and losing it costs a full probe timeout (or
/// a receive deadline): with independent loss `p` a second copy turns the
/// chance of that tail from `p` into `p²`.
pub const PROBE_COPIES: usize = 2;

/// Bound on remembered finished op ids (older ones count as stale by age).
const FINISHED_CAP: usize = 1 << 16;

impl Endpoint {
    /// A new endpoint at `now`.
    ///
    /// # Panics
    /// If `cfg.rank >= cfg.world`, or `chunk_bytes` is not a positive multiple of 4
    /// that fits in a datagram — configuration errors the caller validates first.
    pub fn new(cfg: EndpointConfig, now: Instant) -> Endpoint {
        assert!(cfg.rank < cfg.world, "rank {} outside world {}", cfg.rank, cfg.world);
        assert!(
            cfg.chunk_bytes >= 4 && cfg.chunk_bytes % 4 == 0 && cfg.chunk_bytes <= wire::MAX_PAYLOAD - 3,
            "chunk_bytes {} must be a positive multiple of 4 below 65536",
            cfg.chunk_bytes
        );
        let t = cfg.timers;
        let world = cfg.world as usize;
        Endpoint {
            chunk_elems: cfg.chunk_bytes / 4,
            ops: BTreeMap::new(),
            lingering: BTreeMap::new(),
            finished: VecDeque::new(),
            finished_set: HashSet::new(),
            early: BTreeMap::new(),
            early_bytes: 0,
            queues: Default::default(),
            pacer: Pacer::new(cfg.pacing_rate, cfg.pacing_burst, now),
            peers: vec![PeerState::default(); world],
            rtt: RttEstimator::new(t.probe_initial, t.probe_min, t.probe_max),
            deadlines: [
                DeadlineEstimator::new(t.initial_per_chunk, t.deadline_min, t.deadline_max),
                DeadlineEstimator::new(t.initial_per_chunk, t.deadline_min, t.deadline_max),
            ],
            events: VecDeque::new(),
            stats: Stats::new(world),
            next_heartbeat: (!t.heartbeat.is_zero() && cfg.world > 1).then_some(now),
            hello_seq: 0,
            now,
            cfg,
            pool: BufferPool::new(),
            defer_tags: false,
            timers: BTreeSet::new(),
            overtake: Duration::ZERO,
            heard: BTreeSet::new(),
        }
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.cfg.rank
    }

    /// The configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Number of ops in flight.
    pub fn ops_in_flight(&self) -> usize {
        self.ops.len()
    }

    /// Whether `rank` has been heard from within the peer timeout (false for
    /// this rank itself and for ranks never heard from).
    pub fn peer_up(&self, rank: u32) -> bool {
        self.peers.get(rank as usize).is_some_and(|p| p.up)
    }

    /// The last generation seen from `rank`, if any.
    pub fn peer_generation(&self, rank: u32) -> Option<u32> {
        self.peers.get(rank as usize).and_then(|p| p.generation)
    }

    /// How much memory this endpoint holds, and in how many open transfers.
    /// O(ops × world): for tests, benchmarks and diagnostics, not per packet.
    pub fn footprint(&self) -> Footprint {
        use std::mem::size_of;
        let mut f = Footprint::default();
        let send = |st: &SendState| size_of::<SendState>() + st.have.heap_bytes() + st.segs_seen.heap_bytes();
        let recv = |r: &RecvState| {
            size_of::<RecvState>()
                + r.got.heap_bytes()
                + r.mask.as_ref().map_or(0, Bitmap::heap_bytes)
                + r.mask_parts.as_ref().map_or(0, |(a, b)| a.heap_bytes() + b.heap_bytes())
        };
        for op in self.ops.values() {
            f.tensor_bytes += (op.input.capacity() + op.result.capacity()) * 4;
            f.state_bytes += size_of::<Op>()
                + (op.sends.capacity() + op.gsends.capacity()) * size_of::<Option<SendState>>()
                + (op.recvs.capacity() + op.grecvs.capacity()) * size_of::<Option<RecvState>>()
                + op.classes.iter().map(|c| c.capacity() + size_of::<Vec<Class>>()).sum::<usize>()
                + op.gclasses.capacity()
                + op.peer_gen.capacity() * size_of::<Option<u32>>()
                + op.gmask.as_ref().map_or(0, Bitmap::heap_bytes);
            for st in op.sends.iter().chain(&op.gsends).flatten() {
                f.state_bytes += send(st);
                f.open_transfers += u32::from(!st.done);
            }
            for r in op.recvs.iter().chain(&op.grecvs).flatten() {
                f.state_bytes += recv(r);
                f.tensor_bytes += r.buf.capacity() * 4;
                f.open_transfers += u32::from(r.closed_at.is_none());
            }
        }
        f.state_bytes +=
            self.lingering.values().map(|l| size_of::<Linger>() + l.mask.heap_bytes()).sum::<usize>()
                + self.finished.capacity() * size_of::<(Instant, OpId)>()
                + self.finished_set.capacity() * size_of::<OpId>()
                + self.queues.iter().map(|q| q.capacity() * size_of::<TxItem>()).sum::<usize>()
                + self.peers.capacity() * size_of::<PeerState>()
                + (self.stats.tx_packets_peer.capacity() + self.stats.rx_packets_peer.capacity()) * 8
                + self.timers.len() * size_of::<TimerEntry>()
                + self.heard.len() * size_of::<(Instant, u32)>();
        f.early_bytes = self.early_bytes;
        f.queued = self.queued();
        f
    }

    /// Datagrams waiting in the per-class transmit queues.
    pub fn queued(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    /// Change only the pacing rate (bytes per second, 0 = unpaced), from `now`.
    /// Used by the daemon's loss-driven rate adaptation.
    pub fn set_pacing_rate(&mut self, now: Instant, rate: u64) {
        self.cfg.pacing_rate = rate;
        self.pacer.set_rate(now, rate);
    }

    /// Current pacing rate in bytes per second (0 = unpaced).
    pub fn pacing_rate(&self) -> u64 {
        self.cfg.pacing_rate
    }

    /// Change the tunables a running daemon may reload: the classifier, the
    /// timers (deadline and probe bounds take effect for transfers armed from
    /// now; learned estimates are kept), the pacing rate and burst. An op in
    /// flight keeps the classes and droppable set it started with.
    pub fn set_tunables(
        &mut self,
        now: Instant,
        classifier: ClassifierConfig,
        timers: Timers,
        pacing_rate: u64,
        pacing_burst: u64,
    ) {
        self.cfg.classifier = classifier;
        self.cfg.timers = timers;
        self.cfg.pacing_rate = pacing_rate;
        self.cfg.pacing_burst = pacing_burst;
        self.pacer.set_rate(now, pacing_rate);
        self.pacer.set_burst(now, pacing_burst);
        self.rtt.set_bounds(timers.probe_min, timers.probe_max);
        for d in &mut self.deadlines {
            d.set_bounds(timers.deadline_min, timers.deadline_max);
        }
        if timers.heartbeat.is_zero() || self.cfg.world <= 1 {
            self.next_heartbeat = None;
        } else if self.next_heartbeat.is_none_or(|t| t > now + timers.heartbeat) {
            self.next_heartbeat = Some(now + timers.heartbeat);
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Start an allreduce of `data` (this rank's contribution).
    pub fn start_allreduce(
        &mut self,
        now: Instant,
        id: OpId,
        data: Vec<f32>,
        opts: OpOptions,
    ) -> Result<(), StartError> {
        self.now = now;
        if self.ops.contains_key(&id) || self.finished_set.contains(&id) || self.lingering.contains_key(&id) {
            return Err(StartError::Duplicate(id));
        }
        if data.is_empty() {
            return Err(StartError::Empty);
        }
        if opts.budget_ppm > MAX_BUDGET_PPM || opts.gather_budget_ppm > opts.budget_ppm {
            return Err(StartError::BadBudget {
                budget_ppm: opts.budget_ppm,
                gather_budget_ppm: opts.gather_budget_ppm,
            });
        }
        if opts.layers == 0 || opts.layer >= opts.layers {
            return Err(StartError::BadLayer { layer: opts.layer, layers: opts.layers });
        }
        let layout = Layout { len: data.len(), world: self.cfg.world, chunk_elems: self.chunk_elems };
        if (0..self.cfg.world).any(|s| u64::from(layout.chunks(s)) >= u64::from(u32::MAX)) {
            return Err(StartError::TooLarge);
        }
        let world = self.cfg.world as usize;
        let me = self.cfg.rank;
        let mut op = Op {
            opts,
            started: now,
            last_progress: now,
            layout,
            result: self.pool.take_zeroed(data.len()),
            input: data,
            classes: vec![Vec::new(); world],
            gclasses: Vec::new(),
            sends: (0..world).map(|_| None).collect(),
            recvs: (0..world).map(|_| None).collect(),
            reduced: false,
            gsends: (0..world).map(|_| None).collect(),
            gmask: None,
            grecvs: (0..world).map(|_| None).collect(),
            repairs_sent: 0,
            peer_gen: vec![None; world],
            classifier: self.cfg.classifier,
        };
        // Classes of every chunk this rank sends in reduce-scatter, ranked by
        // magnitude across the whole tensor.
        let mut norms = Vec::new();
        for s in (0..self.cfg.world).filter(|&s| s != me) {
            let shard = &op.input[layout.shard(s)];
            for c in 0..layout.chunks(s) {
                norms.push((s, c, sq_norm(&shard[layout.chunk(s, c)])));
            }
        }
        let ranks = rank_by_norm(&norms.iter().map(|x| x.2).collect::<Vec<_>>());
        for s in 0..self.cfg.world {
            if s != me {
                op.classes[s as usize] = vec![Class::default(); layout.chunks(s) as usize];
            }
        }
        for (i, &(s, c, _)) in norms.iter().enumerate() {
            op.classes[s as usize][c as usize] = classify(
                &self.cfg.classifier,
                &ChunkTraits {
                    phase: Phase::Scatter,
                    layer: opts.layer,
                    layers: opts.layers,
                    magnitude_rank: ranks[i],
                    chunks: norms.len() as u32,
                },
            );
        }
        let seg_bytes = self.cfg.chunk_bytes;
        let own_chunks = layout.chunks(me);
        for j in (0..self.cfg.world).filter(|&j| j != me) {
            let n = layout.chunks(j);
            if n > 0 {
                let required =
                    op.classes[j as usize].iter().filter(|&&c| !op.classifier.droppable.contains(c)).count()
                        as u32;
                op.sends[j as usize] = Some(SendState::new(n, required, opts.budget_ppm, seg_bytes));
            }
            if own_chunks > 0 {
                let buf = self.pool.take(layout.shard(me).len());
                op.recvs[j as usize] = Some(RecvState::new(own_chunks, buf));
            }
            let gn = layout.chunks(j);
            if gn > 0 {
                op.grecvs[j as usize] = Some(RecvState::new(gn, Vec::new()));
            }
        }
        // First pass of reduce-scatter, interleaved across destinations so every
        // path is busy at once, starting after this rank to spread incast.
        let max_chunks =
            (0..self.cfg.world).filter(|&s| s != me).map(|s| layout.chunks(s)).max().unwrap_or(0);
        for c in 0..max_chunks {
            for k in 1..self.cfg.world {
                let j = (me + k) % self.cfg.world;
                if let Some(st) = op.sends[j as usize].as_mut().filter(|st| c < st.n) {
                    st.queued += 1;
                    let class = op.classes[j as usize][c as usize];
                    self.push_data(TxItem {
                        id,
                        phase: Phase::Scatter,
                        peer: j,
                        kind: TxKind::Data { chunk: c, repair: false, class },
                    });
                }
            }
        }
        self.ops.insert(id, op);
        self.maybe_reduce(id);
        // Replay datagrams that arrived before this rank started the op.
        if let Some((_, early)) = self.early.remove(&id) {
            for d in early {
                self.early_bytes -= d.len();
                self.handle_datagram_impl(now, &d, true);
            }
        }
        self.check_complete(id);
        self.prune_timers();
        Ok(())
    }

    /// Process one received datagram. Never panics; every rejection is counted.
    /// A rejected datagram is attributed to the sender its header claims (see
    /// [`Endpoint::handle_datagram_from`] when the caller knows better).
    pub fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        self.handle_datagram_from(now, datagram, wire::peek_src(datagram));
    }

    /// Process one received datagram that came from peer rank `from` as far as
    /// the caller knows (its source address is that peer's configured address),
    /// or from no configured peer (`None`). Never panics; every rejection is
    /// counted by reason ([`Stats::rejected`]) and, if it discards the datagram,
    /// by class and by `from` ([`Stats::rx_dropped`]).
    pub fn handle_datagram_from(&mut self, now: Instant, datagram: &[u8], from: Option<u32>) {
        let before = self.stats.rejected.discarded_on_arrival();
        self.handle_datagram_impl(now, datagram, false);
        if self.stats.rejected.discarded_on_arrival() != before {
            self.count_dropped(datagram, from);
        }
        self.prune_timers();
    }

    /// Count a received datagram the caller discarded before handing it over
    /// (e.g. a source-address check) in [`Stats::rx_dropped`]: class from its
    /// header when readable, peer `from` (`None` or out of range: unknown).
    pub fn count_dropped(&mut self, datagram: &[u8], from: Option<u32>) {
        self.stats.count_dropped(datagram, from);
    }

    /// Process received datagrams, in order: the same outcome as
    /// [`handle_datagram`](Self::handle_datagram) on each, but their tags are
    /// checked together ([`MacKey::tag_many`], several times cheaper per
    /// MTU-sized datagram than one at a time).
    pub fn handle_datagrams(&mut self, now: Instant, datagrams: &[&[u8]]) {
        let batch: Vec<(&[u8], Option<u32>)> = datagrams.iter().map(|d| (*d, wire::peek_src(d))).collect();
        self.handle_datagrams_from(now, &batch);
    }

    /// [`handle_datagram_from`](Self::handle_datagram_from) on each
    /// `(datagram, from)`, in order, with the tags checked together as in
    /// [`handle_datagrams`](Self::handle_datagrams).
    pub fn handle_datagrams_from(&mut self, now: Instant, datagrams: &[(&[u8], Option<u32>)]) {
        self.now = now;
        // Structure first (as `wire::decode`): only well-formed packets are tagged.
        let mut auth: Vec<&[u8]> = Vec::with_capacity(datagrams.len());
        for (d, _) in datagrams {
            if wire::Packet::new_checked(*d).is_ok() {
                auth.push(&d[..d.len() - wire::TAG_LEN]);
            }
        }
        let mut tags = vec![[0u8; wire::TAG_LEN]; auth.len()];
        self.cfg.key.tag_many(&auth, &mut tags);
        let mut tags = tags.iter();
        for &(d, from) in datagrams {
            let before = self.stats.rejected.discarded_on_arrival();
            let want = if wire::Packet::new_checked(d).is_ok() { tags.next() } else { None };
            self.handle_tagged(now, d, want);
            if self.stats.rejected.discarded_on_arrival() != before {
                self.count_dropped(d, from);
            }
        }
        self.prune_timers();
    }

    /// One datagram of a batch: `want` is the tag it must carry, `None` if it
    /// is not a well-formed packet.
    fn handle_tagged(&mut self, now: Instant, d: &[u8], want: Option<&[u8; wire::TAG_LEN]>) {
        let Some(want) = want else {
            self.stats.rejected.malformed += 1;
            return;
        };
        if !wire::tags_equal(want, &d[d.len() - wire::TAG_LEN..]) {
            self.stats.rejected.bad_tag += 1;
            return;
        }
        let Ok(p) = wire::Packet::new_checked(d) else { return };
        let Ok(h) = Header::parse(&p) else {
            self.stats.rejected.malformed += 1;
            return;
        };
        let payload = &d[wire::HEADER_LEN..wire::HEADER_LEN + usize::from(h.payload_len)];
        self.handle_authenticated(now, h, payload, d, false);
    }

    /// `replay`: a datagram buffered before its op started, already counted.
    fn handle_datagram_impl(&mut self, now: Instant, datagram: &[u8], replay: bool) {
        self.now = now;
        let (h, payload) = match wire::decode(&self.cfg.key, datagram) {
            Ok(x) => x,
            Err(WireError::BadTag) => {
                self.stats.rejected.bad_tag += 1;
                return;
            }
            Err(_) => {
                self.stats.rejected.malformed += 1;
                return;
            }
        };
        self.handle_authenticated(now, h, payload, datagram, replay);
    }

    /// A datagram whose tag checked out, parsed into `h` and `payload`.
    fn handle_authenticated(
        &mut self,
        now: Instant,
        h: Header,
        payload: &[u8],
        datagram: &[u8],
        replay: bool,
    ) {
        if h.job != self.cfg.job {
            self.stats.rejected.wrong_job += 1;
            return;
        }
        if h.dst != self.cfg.rank || h.src >= self.cfg.world {
            self.stats.rejected.wrong_rank += 1;
            return;
        }
        if h.dtype != DType::F32 && h.ty == PacketType::Data {
            self.stats.rejected.mismatch += 1;
            return;
        }
        if !self.note_generation(now, h.src, h.generation) {
            self.stats.rejected.stale_generation += 1;
            return;
        }
        if !replay {
            self.stats.count_rx(h.src, h.class, datagram.len());
        }
        if h.ty == PacketType::Hello {
            return;
        }
        let id = OpId { seq: h.op, tensor: h.tensor };
        if self.ops.contains_key(&id) {
            self.on_op_packet(now, id, &h, payload);
            let side = match (h.ty, h.phase) {
                (PacketType::Bitmap | PacketType::Done, Phase::Scatter) => SIDE_SCATTER_SEND,
                (PacketType::Bitmap, _) => SIDE_GATHER_SEND,
                (_, Phase::Scatter) => SIDE_SCATTER_RECV,
                _ => SIDE_GATHER_RECV,
            };
            self.index_timers(id, side, h.src);
            self.check_complete(id);
        } else if let Some(l) = self.lingering.get(&id) {
            match (h.ty, h.phase) {
                (PacketType::Probe, Phase::Scatter) => {
                    self.push(TxItem {
                        id,
                        phase: Phase::Scatter,
                        peer: h.src,
                        kind: TxKind::Done { seg: 0 },
                    });
                }
                (PacketType::Bitmap, Phase::Gather) => {
                    let segs = mask_segments(&l.mask, self.cfg.chunk_bytes);
                    for seg in 0..segs {
                        self.push(TxItem {
                            id,
                            phase: Phase::Gather,
                            peer: h.src,
                            kind: TxKind::Done { seg },
                        });
                    }
                }
                _ => self.stats.rejected.late += 1,
            }
        } else if self.finished_set.contains(&id) {
            self.stats.rejected.stale_op += 1;
        } else if h.ty == PacketType::Data && h.phase == Phase::Scatter {
            if self.early_bytes + datagram.len() > self.cfg.early_buffer_bytes {
                self.stats.rejected.early_dropped += 1;
            } else {
                self.early_bytes += datagram.len();
                self.stats.rejected.early_buffered += 1;
                self.early.entry(id).or_insert_with(|| (now, Vec::new())).1.push(datagram.to_vec());
            }
        } else {
            // A control packet for an op not started here: the sender retries.
            self.stats.rejected.stale_op += 1;
        }
    }

    /// Returns false if the packet is from an older generation of `src`.
    fn note_generation(&mut self, now: Instant, src: u32, generation: u32) -> bool {
        let p = &mut self.peers[src as usize];
        match p.generation {
            Some(g) if generation < g => return false,
            Some(g) if generation > g => {
                p.generation = Some(generation);
                self.events.push_back(Event::PeerRestarted { rank: src, old: g, new: generation });
                // The restarted peer lost its state: every live op fails.
                let ids: Vec<OpId> = self.ops.keys().copied().collect();
                for id in ids {
                    self.fail(id, OpError::PeerRestarted { rank: src, old: g, new: generation });
                }
                self.early.retain(|_, (_, v)| {
                    v.retain(|d| wire::Packet::new_checked(&d[..]).map(|p| p.src() != src).unwrap_or(false));
                    !v.is_empty()
                });
                self.early_bytes = self.early.values().flat_map(|(_, v)| v).map(Vec::len).sum();
            }
            Some(_) => {}
            None => {
                p.generation = Some(generation);
            }
        }
        let p = &mut self.peers[src as usize];
        if p.up
            && let Some(h) = p.last_heard
        {
            self.heard.remove(&(h, src));
        }
        p.last_heard = Some(now);
        self.heard.insert((now, src));
        if !p.up {
            p.up = true;
            self.events.push_back(Event::PeerUp { rank: src, generation });
        }
        true
    }

    /// Queue a control packet (class 7).
    fn push(&mut self, item: TxItem) {
        debug_assert!(!matches!(item.kind, TxKind::Data { .. }));
        self.queues[Class::CONTROL.index()].push_back(item);
    }

    /// Queue a DATA item: repairs in the repair queue (served right after
    /// control: another rank is blocked on them), first-pass chunks by class.
    fn push_data(&mut self, item: TxItem) {
        let q = match item.kind {
            TxKind::Data { repair: true, .. } => REPAIR_QUEUE,
            TxKind::Data { class, .. } => class.index(),
            _ => Class::CONTROL.index(),
        };
        self.queues[q].push_back(item);
    }

    /// How long a receiver waits after a PROBE for chunks it may have overtaken:
    /// the configured `close_grace`, or longer when PROBEs were seen to
    /// overtake data by more (deep switch queues under incast). Answering
    /// before the queued chunks land would NACK chunks that are not lost, and
    /// their repairs would deepen the very queues that delayed them.
    fn close_grace(&self) -> Duration {
        let t = self.cfg.timers;
        if t.close_grace.is_zero() {
            return Duration::ZERO;
        }
        t.close_grace.max((self.overtake * 3 / 2).min(t.deadline_min))
    }

    fn on_op_packet(&mut self, now: Instant, id: OpId, h: &Header, payload: &[u8]) {
        let grace = self.close_grace();
        let me = self.cfg.rank;
        let chunk_bytes = self.cfg.chunk_bytes;
        let Some(op) = self.ops.get_mut(&id) else { return };
        match op.peer_gen[h.src as usize] {
            None => op.peer_gen[h.src as usize] = Some(h.generation),
            Some(g) if g != h.generation => {
                self.stats.rejected.stale_generation += 1;
                return;
            }
            _ => {}
        }
        let layout = op.layout;
        match (h.ty, h.phase) {
            (PacketType::Data, Phase::Scatter) => {
                let Some(r) = op.recvs[h.src as usize].as_mut() else {
                    self.stats.rejected.mismatch += 1;
                    return;
                };
                let range = layout.chunk(me, h.chunk_index);
                if !admit_chunk(r, h, payload.len(), range.len(), &mut self.stats.rejected) {
                    return;
                }
                op.last_progress = now;
                read_f32s(payload, &mut r.buf[range]);
                let overtake = accept_data_header(r, h, now, &self.deadlines[0], &mut self.stats);
                if let Some(d) = overtake {
                    observe_overtake(&mut self.overtake, d);
                }
                if r.got.is_full() {
                    self.close_scatter(now, id, h.src, false);
                }
            }
            (PacketType::Probe, Phase::Scatter) => {
                let Some(r) = op.recvs[h.src as usize].as_mut() else {
                    self.stats.rejected.mismatch += 1;
                    return;
                };
                if h.chunk_count != r.n {
                    self.stats.rejected.mismatch += 1;
                    return;
                }
                if h.seq != 0 && h.seq == r.probe_seq {
                    self.stats.probes_duplicate += 1;
                    return;
                }
                // Progress means new information: a repeated PROBE is not (a
                // peer probing forever must not keep a stuck op alive).
                if r.first_at.is_none() {
                    op.last_progress = now;
                }
                r.required = Some(h.required);
                r.budget_ppm = h.budget_ppm.min(MAX_BUDGET_PPM);
                r.probe_seq = r.probe_seq.max(h.seq);
                arm_deadline(r, now, &self.deadlines[0]);
                if r.closed_at.is_some() {
                    self.push(TxItem {
                        id,
                        phase: Phase::Scatter,
                        peer: h.src,
                        kind: TxKind::Done { seg: 0 },
                    });
                } else if let Some(at) = settle_until(r, now, grace, h.chunk_index) {
                    // Chunks may still be in flight behind the PROBE: answer
                    // (close or bitmap) once they had time to land.
                    r.grace.get_or_insert(at);
                    r.awaited = Some(h.chunk_index);
                    r.probe_at.get_or_insert(now);
                } else if r.closable() {
                    self.close_scatter(now, id, h.src, false);
                } else {
                    let segs = Bitmap::segment_count(r.n, chunk_bytes);
                    for seg in 0..segs {
                        self.push(TxItem {
                            id,
                            phase: Phase::Scatter,
                            peer: h.src,
                            kind: TxKind::Bitmap { seg },
                        });
                    }
                }
            }
            (PacketType::Bitmap, phase) => {
                let st = match phase {
                    Phase::Scatter => op.sends[h.src as usize].as_mut(),
                    _ => op.gsends[h.src as usize].as_mut(),
                };
                let Some(st) = st else {
                    self.stats.rejected.mismatch += 1;
                    return;
                };
                if h.chunk_count != st.n {
                    self.stats.rejected.mismatch += 1;
                    return;
                }
                if phase == Phase::Gather
                    && let Some(mask) = &op.gmask
                {
                    // The receiver missed our DONE: announce the mask again.
                    for seg in 0..mask_segments(mask, chunk_bytes) {
                        self.push(TxItem { id, phase, peer: h.src, kind: TxKind::Done { seg } });
                    }
                    return;
                }
                if let Some((seq, at)) = st.probe_sent
                    && h.seq == seq
                {
                    self.rtt.observe(now - at);
                    st.probe_sent = None;
                }
                let known = st.have.count_ones();
                if h.flags.contains(Flags::COMPLETE) {
                    for i in 0..st.n {
                        st.have.set(i);
                    }
                    for i in 0..st.segs_seen.len() {
                        st.segs_seen.set(i);
                    }
                } else {
                    st.have.merge_segment(h.chunk_index, payload);
                    let bits = (chunk_bytes * 8) as u32;
                    st.segs_seen.set(h.chunk_index / bits);
                }
                // Only news is progress: an unchanged bitmap (a receiver nudging
                // an owner that waits for a dead rank) must not defer the hard timeout.
                if st.have.count_ones() != known {
                    op.last_progress = now;
                }
                if st.stage == Stage::Probing && st.segs_seen.is_full() && !st.done {
                    // A complete report with news: probing starts from the base
                    // timeout again. Without news the last repairs were all lost
                    // (a congested path, or a receiver its own PROBEs and
                    // repairs keep flooded): keep backing off, which also holds
                    // the next PROBE after the repairs ([`Endpoint::data_dequeued`]).
                    let have = st.have.count_ones();
                    if st.round_known.is_none_or(|k| have > k) {
                        st.backoff = 0;
                    } else {
                        st.backoff = (st.backoff + 1).min(MAX_BACKOFF);
                    }
                    st.round_known = Some(have);
                    match phase {
                        Phase::Scatter => self.decide_scatter(now, id, h.src),
                        _ => {
                            st.reported = true;
                            st.probe_timer = None;
                            self.decide_gather(now, id);
                        }
                    }
                }
            }
            (PacketType::Done, Phase::Scatter) => {
                let Some(st) = op.sends[h.src as usize].as_mut() else {
                    self.stats.rejected.mismatch += 1;
                    return;
                };
                if let Some((seq, at)) = st.probe_sent
                    && h.seq == seq
                {
                    self.rtt.observe(now - at);
                }
                if !st.done {
                    op.last_progress = now;
                }
                st.done = true;
                st.probe_sent = None;
                st.probe_timer = None;
            }
            (PacketType::Data, Phase::Gather) => {
                let owner = h.src;
                let Some(r) = op.grecvs[owner as usize].as_mut() else {
                    self.stats.rejected.mismatch += 1;
                    return;
                };
                let range = layout.chunk(owner, h.chunk_index);
                if !admit_chunk(r, h, payload.len(), range.len(), &mut self.stats.rejected) {
                    return;
                }
                op.last_progress = now;
                let base = layout.shard(owner).start;
                read_f32s(payload, &mut op.result[base + range.start..base + range.end]);
                if let Some(d) = accept_data_header(r, h, now, &self.deadlines[1], &mut self.stats) {
                    observe_overtake(&mut self.overtake, d);
                }
                if r.got.is_full() && !r.complete_sent {
                    r.complete_sent = true;
                    // All data is here; only the DONE is missing: an RTT-scaled
                    // nudge replaces the size-scaled deadline.
                    r.nudge = Some((now + self.rtt.timeout(), 0));
                    r.deadline = None;
                    self.push(TxItem {
                        id,
                        phase: Phase::Gather,
                        peer: owner,
                        kind: TxKind::Bitmap { seg: 0 },
                    });
                }
            }
            (PacketType::Probe, Phase::Gather) => {
                let Some(r) = op.grecvs[h.src as usize].as_mut() else {
                    self.stats.rejected.mismatch += 1;
                    return;
                };
                if h.chunk_count != r.n {
                    self.stats.rejected.mismatch += 1;
                    return;
                }
                if h.seq != 0 && h.seq == r.probe_seq {
                    self.stats.probes_duplicate += 1;
                    return;
                }
                if r.first_at.is_none() {
                    op.last_progress = now;
                }
                r.probe_seq = r.probe_seq.max(h.seq);
                arm_deadline(r, now, &self.deadlines[1]);
                if r.closed_at.is_none() {
                    if let Some(at) = settle_until(r, now, grace, h.chunk_index) {
                        r.grace.get_or_insert(at);
                        r.awaited = Some(h.chunk_index);
                        r.probe_at.get_or_insert(now);
                        return;
                    }
                    let segs = if r.got.is_full() { 1 } else { Bitmap::segment_count(r.n, chunk_bytes) };
                    for seg in 0..segs {
                        self.push(TxItem {
                            id,
                            phase: Phase::Gather,
                            peer: h.src,
                            kind: TxKind::Bitmap { seg },
                        });
                    }
                }
            }
            (PacketType::Done, Phase::Gather) => {
                let owner = h.src;
                let Some(r) = op.grecvs[owner as usize].as_mut() else {
                    self.stats.rejected.mismatch += 1;
                    return;
                };
                if h.chunk_count != r.n || r.closed_at.is_some() {
                    if r.closed_at.is_some() {
                        self.stats.rejected.late += 1;
                    } else {
                        self.stats.rejected.mismatch += 1;
                    }
                    return;
                }
                op.last_progress = now;
                let seg_bits = (chunk_bytes * 8) as u32;
                let (mask, seen) = r.mask_parts.get_or_insert_with(|| {
                    (Bitmap::new(r.n), Bitmap::new(Bitmap::segment_count(r.n, chunk_bytes)))
                });
                if h.flags.contains(Flags::MASK_EMPTY) {
                    for i in 0..seen.len() {
                        seen.set(i);
                    }
                } else {
                    mask.merge_segment(h.chunk_index, payload);
                    seen.set(h.chunk_index / seg_bits);
                }
                if seen.is_full() {
                    let (mask, _) = r.mask_parts.take().unwrap_or((Bitmap::new(r.n), Bitmap::new(0)));
                    // Zero-fill the agreed mask, and (defensively) anything the
                    // owner believed we had but we do not.
                    let base = layout.shard(owner).start;
                    for c in 0..r.n {
                        if mask.get(c) || !r.got.get(c) {
                            let cr = layout.chunk(owner, c);
                            op.result[base + cr.start..base + cr.end].fill(0.0);
                        }
                    }
                    r.mask = Some(mask);
                    r.closed_at = Some(now);
                    r.deadline = None;
                    if let Some(first) = r.first_at {
                        self.deadlines[1].observe(now - first, r.n);
                    }
                }
            }
            _ => self.stats.rejected.mismatch += 1,
        }
    }

    fn close_scatter(&mut self, now: Instant, id: OpId, src: u32, by_deadline: bool) {
        let Some(op) = self.ops.get_mut(&id) else { return };
        let Some(r) = op.recvs[src as usize].as_mut() else { return };
        if r.closed_at.is_some() {
            return;
        }
        r.closed_at = Some(now);
        r.deadline = None;
        r.deadline_fired |= by_deadline;
        if !r.got.is_full() {
            self.stats.closed_within_budget += 1;
        }
        if let Some(first) = r.first_at
            && !by_deadline
        {
            self.deadlines[0].observe(now - first, r.n);
        }
        op.last_progress = now;
        self.push(TxItem { id, phase: Phase::Scatter, peer: src, kind: TxKind::Done { seg: 0 } });
        self.maybe_reduce(id);
    }

    /// Reduce this rank's shard once every reduce-scatter transfer closed, then
    /// start the all-gather.
    fn maybe_reduce(&mut self, id: OpId) {
        let me = self.cfg.rank;
        let world = self.cfg.world;
        let Some(op) = self.ops.get_mut(&id) else { return };
        if op.reduced || op.recvs.iter().flatten().any(|r| r.closed_at.is_none()) {
            return;
        }
        op.reduced = true;
        let layout = op.layout;
        let shard = layout.shard(me);
        let n = layout.chunks(me);
        let own = &op.input[shard.clone()];
        // Reduce straight into the result's own shard (every chunk is written:
        // rank 0's term is a copy or a fill).
        let out = &mut op.result[shard.clone()];
        for c in 0..n {
            let cr = layout.chunk(me, c);
            let mut delivered = 0u32;
            for j in 0..world {
                let present = j == me || op.recvs[j as usize].as_ref().is_some_and(|r| r.got.get(c));
                let src: Option<&[f32]> = if j == me {
                    Some(&own[cr.clone()])
                } else if present {
                    op.recvs[j as usize].as_ref().map(|r| &r.buf[cr.clone()])
                } else {
                    match op.opts.fill {
                        Fill::Local => Some(&own[cr.clone()]),
                        Fill::Zero => None,
                    }
                };
                if present {
                    delivered += 1;
                }
                let dst = &mut out[cr.clone()];
                match (j, src) {
                    (0, Some(s)) => dst.copy_from_slice(s),
                    (0, None) => dst.fill(0.0),
                    (_, Some(s)) => dst.iter_mut().zip(s).for_each(|(d, x)| *d += *x),
                    (_, None) => dst.iter_mut().for_each(|d| *d += 0.0),
                }
            }
            let dst = &mut out[cr];
            if op.opts.rescale && delivered < world {
                let f = world as f32 / delivered as f32;
                dst.iter_mut().for_each(|d| *d *= f);
            }
            if op.opts.reduce == ReduceOp::Average {
                let w = world as f32;
                dst.iter_mut().for_each(|d| *d /= w);
            }
        }
        let out = &op.result[shard.clone()];
        // Gather classes: rank own chunks by magnitude within the shard.
        let norms: Vec<f32> = (0..n).map(|c| sq_norm(&out[layout.chunk(me, c)])).collect();
        let ranks = rank_by_norm(&norms);
        op.gclasses = (0..n as usize)
            .map(|c| {
                classify(
                    &op.classifier,
                    &ChunkTraits {
                        phase: Phase::Gather,
                        layer: op.opts.layer,
                        layers: op.opts.layers,
                        magnitude_rank: ranks[c],
                        chunks: n,
                    },
                )
            })
            .collect();
        // The input stays: reduce-scatter sends to other owners may still need repairs.
        op.recvs.iter_mut().flatten().for_each(|r| r.buf = Vec::new());
        if n == 0 || world == 1 {
            op.gmask = Some(Bitmap::new(n));
            return;
        }
        let required = op.gclasses.iter().filter(|&&c| !op.classifier.droppable.contains(c)).count() as u32;
        let seg_bytes = self.cfg.chunk_bytes;
        for j in (0..world).filter(|&j| j != me) {
            op.gsends[j as usize] = Some(SendState::new(n, required, op.opts.gather_budget_ppm, seg_bytes));
        }
        let mut items = Vec::new();
        for c in 0..n {
            for k in 1..world {
                let j = (me + k) % world;
                if let Some(st) = op.gsends[j as usize].as_mut() {
                    st.queued += 1;
                }
                items.push(TxItem {
                    id,
                    phase: Phase::Gather,
                    peer: j,
                    kind: TxKind::Data { chunk: c, repair: false, class: op.gclasses[c as usize] },
                });
            }
        }
        for item in items {
            self.push_data(item);
        }
    }

    /// A reduce-scatter receiver's full bitmap arrived: repair just enough.
    fn decide_scatter(&mut self, now: Instant, id: OpId, dst: u32) {
        let Some(op) = self.ops.get_mut(&id) else { return };
        let droppable = op.classifier.droppable;
        let classes = &op.classes[dst as usize];
        let Some(st) = op.sends[dst as usize].as_mut() else { return };
        let allowed = allowed_missing(st.n, st.budget_ppm);
        let repairs = select_repairs(st.have.iter_zeros(), |c| classes[c as usize], droppable, allowed);
        st.segs_seen = Bitmap::new(st.segs_seen.len());
        if repairs.is_empty() {
            // Within budget: the receiver closes on our next PROBE. It asked
            // without being prompted (its deadline NACKs after our PROBEs were
            // lost): answer now, not at the backed-off probe timer, so it
            // closes on the PROBE rather than by its deadline.
            if st.probe_timer.is_some_and(|t| t > now) {
                st.probe_timer = Some(now);
            }
            return;
        }
        st.stage = Stage::Sending;
        st.probe_timer = None;
        st.queued += repairs.len() as u32;
        st.repairs += repairs.len() as u32;
        op.repairs_sent += repairs.len() as u32;
        let items: Vec<TxItem> = repairs
            .into_iter()
            .map(|c| TxItem {
                id,
                phase: Phase::Scatter,
                peer: dst,
                kind: TxKind::Data { chunk: c, repair: true, class: classes[c as usize] },
            })
            .collect();
        for item in items {
            self.push_data(item);
        }
    }

    /// Every gather receiver has reported: repair the union of what is missing
    /// until it fits the gather budget, or announce the agreed mask.
    fn decide_gather(&mut self, _now: Instant, id: OpId) {
        let seg_bytes = self.cfg.chunk_bytes;
        let Some(op) = self.ops.get_mut(&id) else { return };
        let droppable = op.classifier.droppable;
        if op.gmask.is_some() {
            return;
        }
        if op.gsends.iter().flatten().any(|st| !st.reported) {
            return;
        }
        let n = op.layout.chunks(self.cfg.rank);
        let mut union = Bitmap::new(n);
        for st in op.gsends.iter().flatten() {
            for c in st.have.iter_zeros() {
                union.set(c);
            }
        }
        let classes = &op.gclasses;
        let allowed = allowed_missing(n, op.opts.gather_budget_ppm);
        let repairs = select_repairs(union.iter_ones(), |c| classes[c as usize], droppable, allowed);
        if repairs.is_empty() {
            // Agreed mask: zero-fill it here and tell every receiver.
            let layout = op.layout;
            let base = layout.shard(self.cfg.rank).start;
            for c in union.iter_ones() {
                let cr = layout.chunk(self.cfg.rank, c);
                op.result[base + cr.start..base + cr.end].fill(0.0);
            }
            let segs = mask_segments(&union, seg_bytes);
            op.gmask = Some(union);
            let (world, me) = (self.cfg.world, self.cfg.rank);
            for j in (0..world).filter(|&j| j != me) {
                if let Some(st) = op.gsends[j as usize].as_mut() {
                    st.done = true;
                    st.probe_timer = None;
                }
            }
            for j in (0..world).filter(|&j| j != me) {
                for seg in 0..segs {
                    self.push(TxItem { id, phase: Phase::Gather, peer: j, kind: TxKind::Done { seg } });
                }
            }
            return;
        }
        let mut items = Vec::new();
        for (j, st) in op.gsends.iter_mut().enumerate() {
            let Some(st) = st.as_mut() else { continue };
            let mine: Vec<u32> = repairs.iter().copied().filter(|&c| !st.have.get(c)).collect();
            st.segs_seen = Bitmap::new(st.segs_seen.len());
            if mine.is_empty() {
                // Nothing to repair here: its report stays valid.
                for i in 0..st.segs_seen.len() {
                    st.segs_seen.set(i);
                }
                continue;
            }
            st.reported = false;
            st.stage = Stage::Sending;
            st.probe_timer = None;
            st.queued += mine.len() as u32;
            st.repairs += mine.len() as u32;
            op.repairs_sent += mine.len() as u32;
            for c in mine {
                items.push(TxItem {
                    id,
                    phase: Phase::Gather,
                    peer: j as u32,
                    kind: TxKind::Data { chunk: c, repair: true, class: classes[c as usize] },
                });
            }
        }
        for item in items {
            self.push_data(item);
        }
    }

    fn check_complete(&mut self, id: OpId) {
        let Some(op) = self.ops.get(&id) else { return };
        if !op.reduced || op.gmask.is_none() || op.grecvs.iter().flatten().any(|r| r.closed_at.is_none()) {
            return;
        }
        let Some(mut op) = self.ops.remove(&id) else { return };
        let now = self.now;
        let me = self.cfg.rank;
        let own_mask = op.gmask.take().unwrap_or_else(|| Bitmap::new(0));
        let mut report = OpReport {
            id,
            started: op.started,
            finished: now,
            scatter: Vec::new(),
            gather: Vec::new(),
            own_chunks: op.layout.chunks(me),
            own_mask: own_mask.clone(),
            repairs_sent: op.repairs_sent,
            deadline_fired: false,
        };
        for (j, r) in op.recvs.iter().enumerate() {
            if let Some(r) = r {
                report.scatter.push(r.report(j as u32, Phase::Scatter));
            }
        }
        for (j, r) in op.grecvs.iter().enumerate() {
            if let Some(r) = r {
                report.gather.push(r.report(j as u32, Phase::Gather));
            }
        }
        report.deadline_fired = report.scatter.iter().chain(&report.gather).any(|t| t.deadline_fired);
        self.stats.ops_completed += 1;
        self.lingering.insert(
            id,
            Linger { until: now + self.cfg.timers.linger, own_chunks: op.layout.chunks(me), mask: own_mask },
        );
        self.remember_finished(now, id);
        let result = std::mem::take(&mut op.result);
        self.release(op);
        self.events.push_back(Event::OpComplete { id, result, report: Box::new(report) });
    }

    /// Returns a finished op's input and receive buffers to the pool.
    fn release(&mut self, op: Op) {
        let now = self.now;
        self.pool.put(now, op.input);
        self.pool.put(now, op.result);
        for r in op.recvs.into_iter().flatten() {
            self.pool.put(now, r.buf);
        }
    }

    /// A buffer of `len` elements with unspecified contents, from the pool of
    /// finished ops' buffers when one fits (see [`crate::pool`]): for a caller
    /// that overwrites all of it, e.g. with the next op's input.
    pub fn take_buffer(&mut self, len: usize) -> Vec<f32> {
        self.pool.take(len)
    }

    /// Gives a buffer back to the pool, typically an [`Event::OpComplete`]
    /// result once the caller has copied it out.
    pub fn recycle(&mut self, buf: Vec<f32>) {
        self.pool.put(self.now, buf);
    }

    /// The buffer pool (for counters and tests).
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    fn fail(&mut self, id: OpId, error: OpError) {
        if let Some(op) = self.ops.remove(&id) {
            self.release(op);
            self.stats.ops_failed += 1;
            self.remember_finished(self.now, id);
            self.events.push_back(Event::OpFailed { id, error });
        }
    }

    fn remember_finished(&mut self, now: Instant, id: OpId) {
        if self.finished_set.insert(id) {
            self.finished.push_back((now, id));
        }
        while self.finished.len() > FINISHED_CAP {
            if let Some((_, old)) = self.finished.pop_front() {
                self.finished_set.remove(&old);
            }
        }
    }

    /// Process timers that expired at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        self.pool.expire(now);
        let t = self.cfg.timers;
        // Heartbeats.
        if let Some(hb) = self.next_heartbeat
            && hb <= now
        {
            let (world, me) = (self.cfg.world, self.cfg.rank);
            for j in (0..world).filter(|&j| j != me) {
                self.push(TxItem {
                    id: OpId { seq: 0, tensor: 0 },
                    phase: Phase::None,
                    peer: j,
                    kind: TxKind::Hello,
                });
            }
            self.hello_seq = self.hello_seq.wrapping_add(1);
            self.next_heartbeat = Some(now + t.heartbeat);
        }
        // Peers silent for the peer timeout (reported in rank order).
        let mut down = Vec::new();
        while let Some(&(h, j)) = self.heard.first() {
            if h + t.peer_timeout > now {
                break;
            }
            self.heard.pop_first();
            down.push(j);
        }
        down.sort_unstable();
        for j in down {
            self.peers[j as usize].up = false;
            self.events.push_back(Event::PeerDown { rank: j });
        }
        // Lingering ops and finished ids age out.
        self.lingering.retain(|_, l| l.until > now);
        while let Some(&(at, id)) = self.finished.front() {
            if at + t.linger + t.hard_timeout > now {
                break;
            }
            self.finished.pop_front();
            self.finished_set.remove(&id);
        }
        let before = self.early.len();
        let mut expired_bytes = 0;
        let mut expired = 0;
        self.early.retain(|_, (at, v)| {
            let keep = *at + t.hard_timeout > now;
            if !keep {
                expired += v.len() as u64;
                expired_bytes += v.iter().map(Vec::len).sum::<usize>();
            }
            keep
        });
        if self.early.len() != before {
            self.early_bytes -= expired_bytes;
            self.stats.rejected.early_expired += expired;
        }
        // Per-op timers: the transfers with a timer due, in (op, side, peer) order.
        let mut due: Vec<(OpId, u8, u32)> = Vec::new();
        while let Some(&e) = self.timers.first() {
            if e.0 > now {
                break;
            }
            self.timers.pop_first();
            if self.timer_live(&e) {
                due.push((e.1, e.2, e.3));
            }
        }
        due.sort_unstable();
        due.dedup();
        let ids: Vec<OpId> = self.ops.keys().copied().collect();
        for id in ids {
            let a = due.partition_point(|d| d.0 < id);
            let b = due.partition_point(|d| d.0 <= id);
            let keys: Vec<(u8, u32)> = due[a..b].iter().map(|d| (d.1, d.2)).collect();
            self.op_timers(now, id, &keys);
            for &(side, j) in &keys {
                self.index_timers(id, side, j);
            }
            self.check_complete(id);
        }
        self.prune_timers();
    }

    /// Index every live timer of one transfer (after it may have been armed).
    fn index_timers(&mut self, id: OpId, side: u8, peer: u32) {
        let Some(op) = self.ops.get(&id) else { return };
        let j = peer as usize;
        match side {
            SIDE_SCATTER_SEND | SIDE_GATHER_SEND => {
                let v = if side == SIDE_SCATTER_SEND { &op.sends } else { &op.gsends };
                if let Some(t) = v.get(j).and_then(Option::as_ref).and_then(send_timer) {
                    self.timers.insert((t, id, side, peer));
                }
            }
            _ => {
                let v = if side == SIDE_SCATTER_RECV { &op.recvs } else { &op.grecvs };
                if let Some(r) = v.get(j).and_then(Option::as_ref) {
                    for t in recv_timers(r) {
                        self.timers.insert((t, id, side, peer));
                    }
                }
            }
        }
    }

    /// Whether an index entry is still one of its transfer's live timers.
    fn timer_live(&self, &(at, id, side, peer): &TimerEntry) -> bool {
        let Some(op) = self.ops.get(&id) else { return false };
        let j = peer as usize;
        match side {
            SIDE_SCATTER_SEND | SIDE_GATHER_SEND => {
                let v = if side == SIDE_SCATTER_SEND { &op.sends } else { &op.gsends };
                v.get(j).and_then(Option::as_ref).and_then(send_timer) == Some(at)
            }
            _ => {
                let v = if side == SIDE_SCATTER_RECV { &op.recvs } else { &op.grecvs };
                v.get(j).and_then(Option::as_ref).is_some_and(|r| recv_timers(r).any(|t| t == at))
            }
        }
    }

    /// Drop stale entries from the front of the timer index.
    fn prune_timers(&mut self) {
        while let Some(e) = self.timers.first() {
            if self.timer_live(e) {
                break;
            }
            self.timers.pop_first();
        }
    }

    /// Serve the due timers of op `id`: `keys` are its transfers with a live
    /// timer at or before `now`, as (side, peer), sorted.
    fn op_timers(&mut self, now: Instant, id: OpId, keys: &[(u8, u32)]) {
        let t = self.cfg.timers;
        let me = self.cfg.rank;
        let rto = self.rtt.timeout();
        let Some(op) = self.ops.get_mut(&id) else { return };
        if op.last_progress + t.hard_timeout <= now {
            let phase = if op.reduced { Phase::Gather } else { Phase::Scatter };
            let waiting_on = waiting_on(op, me);
            self.stats.hard_timeouts += 1;
            self.fail(id, OpError::Timeout { phase, waiting_on, timeout: t.hard_timeout });
            return;
        }
        let mut pushes = Vec::new();
        let mut close = Vec::new();
        let mut grace_close = Vec::new();
        for &(side, j) in keys.iter().filter(|k| k.0 <= SIDE_GATHER_SEND) {
            let j = j as usize;
            let (phase, sends) = if side == SIDE_SCATTER_SEND {
                (Phase::Scatter, &mut op.sends)
            } else {
                (Phase::Gather, &mut op.gsends)
            };
            {
                let Some(st) = sends.get_mut(j).and_then(Option::as_mut) else { continue };
                if st.done || st.stage != Stage::Probing || st.reported {
                    continue;
                }
                if st.probe_timer.is_some_and(|pt| pt <= now) {
                    st.backoff = (st.backoff + 1).min(MAX_BACKOFF);
                    st.seq = st.seq.wrapping_add(1);
                    st.probe_timer = None;
                    for _ in 0..PROBE_COPIES {
                        pushes.push(TxItem { id, phase, peer: j as u32, kind: TxKind::Probe });
                    }
                }
            }
        }
        let seg_bytes = self.cfg.chunk_bytes;
        for &(side, j) in keys.iter().filter(|k| k.0 >= SIDE_SCATTER_RECV) {
            let j = j as usize;
            let (phase, recvs) = if side == SIDE_SCATTER_RECV {
                (Phase::Scatter, &mut op.recvs)
            } else {
                (Phase::Gather, &mut op.grecvs)
            };
            {
                let Some(r) = recvs.get_mut(j).and_then(Option::as_mut) else { continue };
                if r.closed_at.is_some() {
                    continue;
                }
                if r.grace.is_some_and(|g| g <= now) {
                    // The settle time after a PROBE is over: answer it now.
                    r.grace = None;
                    if phase == Phase::Scatter && r.closable() {
                        grace_close.push(j as u32);
                    } else {
                        let segs = if r.got.is_full() { 1 } else { Bitmap::segment_count(r.n, seg_bytes) };
                        for seg in 0..segs {
                            pushes.push(TxItem { id, phase, peer: j as u32, kind: TxKind::Bitmap { seg } });
                        }
                    }
                    continue;
                }
                if let Some((at, k)) = r.nudge
                    && at <= now
                {
                    let k = (k + 1).min(MAX_BACKOFF);
                    r.nudge = Some((now + rto.saturating_mul(1 << k).min(t.probe_max.max(rto)), k));
                    pushes.push(TxItem { id, phase, peer: j as u32, kind: TxKind::Bitmap { seg: 0 } });
                    continue;
                }
                if r.deadline.is_none_or(|d| d > now) {
                    continue;
                }
                // Past its estimate but still receiving (e.g. the sender serves
                // higher classes first), or the sender's PROBE was lost and its
                // retry (one probe timeout later) is due: the deadline waits for
                // an idle gap longer than the probe retry, so it fires only for
                // a sender that has gone quiet, not for one lost control packet.
                let gap = t.deadline_min.max(rto.saturating_mul(2)).min(t.deadline_max.max(t.deadline_min));
                if let Some(last) = r.last_at.or(r.first_at)
                    && now < last + gap
                {
                    r.deadline = Some(last + gap);
                    continue;
                }
                self.stats.deadlines_fired += 1;
                r.deadline_fired = true;
                let retry = t.deadline_min.max(rto).saturating_mul(1 << r.deadline_backoff.min(MAX_BACKOFF));
                // A closable transfer still NACKs once first: the sender answers
                // a within-budget BITMAP with a PROBE at once, and the transfer
                // closes on that PROBE. Only a sender still quiet one retry
                // later (dead, or its answers lost too) is closed by the deadline.
                let nacked_before = r.deadline_backoff > 0;
                r.deadline_backoff += 1;
                r.deadline = Some(now + retry.min(t.deadline_max.max(t.deadline_min)));
                if phase == Phase::Scatter && r.closable() && nacked_before {
                    self.stats.deadline_closes += 1;
                    close.push(j as u32);
                } else {
                    self.stats.deadline_nacks += 1;
                    let segs = if r.got.is_full() { 1 } else { Bitmap::segment_count(r.n, seg_bytes) };
                    for seg in 0..segs {
                        pushes.push(TxItem { id, phase, peer: j as u32, kind: TxKind::Bitmap { seg } });
                    }
                }
            }
        }
        for item in pushes {
            self.push(item);
        }
        for j in close {
            self.close_scatter(now, id, j, true);
        }
        for j in grace_close {
            self.close_scatter(now, id, j, false);
        }
    }

    /// The earliest instant at which [`Endpoint::handle_timeout`] (or, when paced,
    /// [`Endpoint::poll_transmit`]) should be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let t = self.cfg.timers;
        let mut next = Instant::MAX;
        let mut consider = |i: Instant| next = next.min(i);
        if let Some(hb) = self.next_heartbeat {
            consider(hb);
        }
        if let Some(&(h, _)) = self.heard.first() {
            consider(h + t.peer_timeout);
        }
        for l in self.lingering.values() {
            consider(l.until);
        }
        if let Some((at, _)) = self.finished.front() {
            consider(*at + t.linger + t.hard_timeout);
        }
        for (at, _) in self.early.values() {
            consider(*at + t.hard_timeout);
        }
        for op in self.ops.values() {
            consider(op.last_progress + t.hard_timeout);
        }
        // The earliest live transfer timer (stale entries are skipped; the
        // mutating entry points prune them, so this is usually the first).
        if let Some(e) = self.timers.iter().find(|e| self.timer_live(e)) {
            consider(e.0);
        }
        if self.queues.iter().any(|q| !q.is_empty()) && self.pacer.rate() > 0 {
            consider(self.pacer.ready_at(self.now, self.cfg.chunk_bytes + wire::OVERHEAD));
        }
        (next != Instant::MAX).then_some(next)
    }

    /// Up to `max` datagrams, exactly those that `max` calls of
    /// [`poll_transmit`](Self::poll_transmit) would return, written into `buf`
    /// at offsets `0, slot, 2·slot, …` (each `slot` bytes of room; `buf` grows
    /// as needed) and listed in `out` (cleared first) as (transmit, offset).
    /// Their tags are computed together ([`MacKey::tag_many`]), several times
    /// cheaper per MTU-sized datagram than one at a time.
    pub fn poll_transmit_many(
        &mut self,
        now: Instant,
        slot: usize,
        max: usize,
        buf: &mut Vec<u8>,
        out: &mut Vec<(Transmit, usize)>,
    ) {
        out.clear();
        if buf.len() < slot * max {
            buf.resize(slot * max, 0);
        }
        self.defer_tags = true;
        while out.len() < max {
            let off = out.len() * slot;
            match self.poll_transmit(now, &mut buf[off..off + slot]) {
                Some(t) => out.push((t, off)),
                None => break,
            }
        }
        self.defer_tags = false;
        let msgs: Vec<&[u8]> = out.iter().map(|(t, off)| &buf[*off..*off + t.len - wire::TAG_LEN]).collect();
        let mut tags = vec![[0u8; wire::TAG_LEN]; msgs.len()];
        self.cfg.key.tag_many(&msgs, &mut tags);
        for ((t, off), tag) in out.iter().zip(&tags) {
            buf[off + t.len - wire::TAG_LEN..off + t.len].copy_from_slice(tag);
        }
    }

    /// Write the next datagram to send into `buf` (which must hold at least
    /// `chunk_bytes + wire::OVERHEAD` bytes), highest class first. Returns `None`
    /// when nothing is queued or the pacer says wait (see `poll_timeout`).
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let tx = self.next_transmit(now, buf);
        self.prune_timers();
        tx
    }

    fn next_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.now = now;
        loop {
            let qi = SERVICE_ORDER.into_iter().find(|&i| !self.queues[i].is_empty())?;
            let item = *self.queues[qi].front()?;
            if !matches!(item.kind, TxKind::Data { .. }) {
                self.queues[qi].pop_front();
                if let Some(tx) = self.encode_control(now, item, buf) {
                    return Some(tx);
                }
                continue;
            }
            let TxKind::Data { chunk, repair, class } = item.kind else { continue };
            // Is the chunk still wanted?
            let wanted = self.data_wanted(item, chunk);
            if !wanted {
                self.queues[qi].pop_front();
                self.data_dequeued(now, item);
                continue;
            }
            let len = self.data_len(item, chunk) * 4 + wire::OVERHEAD;
            if !self.pacer.try_consume(now, len) {
                return None;
            }
            self.queues[qi].pop_front();
            let tx = self.encode_data(item, chunk, repair, class, buf);
            self.data_dequeued(now, item);
            if let Some(tx) = tx {
                return Some(tx);
            }
        }
    }

    fn data_wanted(&self, item: TxItem, chunk: u32) -> bool {
        let Some(op) = self.ops.get(&item.id) else { return false };
        let st = match item.phase {
            Phase::Scatter => op.sends[item.peer as usize].as_ref(),
            _ => op.gsends[item.peer as usize].as_ref(),
        };
        st.is_some_and(|st| !st.done && !st.have.get(chunk))
    }

    fn data_len(&self, item: TxItem, chunk: u32) -> usize {
        let Some(op) = self.ops.get(&item.id) else { return 0 };
        let owner = if item.phase == Phase::Scatter { item.peer } else { self.cfg.rank };
        op.layout.chunk(owner, chunk).len()
    }

    /// Bookkeeping after a DATA item left the queue: when a send transfer's
    /// queue drains, it probes.
    fn data_dequeued(&mut self, _now: Instant, item: TxItem) {
        let Some(op) = self.ops.get_mut(&item.id) else { return };
        let st = match item.phase {
            Phase::Scatter => op.sends[item.peer as usize].as_mut(),
            _ => op.gsends[item.peer as usize].as_mut(),
        };
        let Some(st) = st else { return };
        st.queued = st.queued.saturating_sub(1);
        if st.queued > 0 || st.done || st.stage != Stage::Sending {
            return;
        }
        st.stage = Stage::Probing;
        if item.phase == Phase::Gather && st.have.is_full() {
            st.reported = true;
            self.decide_gather(self.now, item.id);
            return;
        }
        if st.backoff > 0 {
            // The previous repairs were all lost: probe after the backed-off
            // timeout instead of at once, so a congested receiver is not
            // driven by a PROBE / BITMAP / repair loop at full speed.
            let rto = self.rtt.timeout();
            let wait = rto.saturating_mul(1 << st.backoff.min(MAX_BACKOFF));
            let at = self.now + wait.min(self.cfg.timers.probe_max.max(rto));
            st.probe_timer = Some(at);
            let side = if item.phase == Phase::Scatter { SIDE_SCATTER_SEND } else { SIDE_GATHER_SEND };
            self.timers.insert((at, item.id, side, item.peer));
            return;
        }
        st.seq = st.seq.wrapping_add(1);
        for _ in 0..PROBE_COPIES {
            self.push(TxItem { id: item.id, phase: item.phase, peer: item.peer, kind: TxKind::Probe });
        }
    }

    fn header(&self, ty: PacketType, class: Class, phase: Phase, id: OpId, peer: u32) -> Header {
        let mut h = Header::new(ty, class, phase);
        h.job = self.cfg.job;
        h.generation = self.cfg.generation;
        h.src = self.cfg.rank;
        h.dst = peer;
        h.op = id.seq;
        h.tensor = id.tensor;
        h
    }

    fn encode_data(
        &mut self,
        item: TxItem,
        chunk: u32,
        repair: bool,
        class: Class,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let me = self.cfg.rank;
        let op = self.ops.get(&item.id)?;
        let droppable = op.classifier.droppable;
        let (owner, st, data): (u32, &SendState, &[f32]) = match item.phase {
            Phase::Scatter => {
                (item.peer, op.sends[item.peer as usize].as_ref()?, &op.input[op.layout.shard(item.peer)])
            }
            _ => (me, op.gsends[item.peer as usize].as_ref()?, &op.result[op.layout.shard(me)]),
        };
        let cr = op.layout.chunk(owner, chunk);
        let mut h = self.header(PacketType::Data, class, item.phase, item.id, item.peer);
        h.chunk_index = chunk;
        h.chunk_count = st.n;
        h.required = st.required;
        h.budget_ppm = st.budget_ppm;
        h.payload_len = (cr.len() * 4) as u16;
        let mut flags = Flags::default();
        if repair {
            flags = flags.with(Flags::REPAIR);
        }
        if !droppable.contains(class) {
            flags = flags.with(Flags::REQUIRED);
        }
        h.flags = flags;
        let len = wire::encode_maybe_tagged((!self.defer_tags).then_some(&self.cfg.key), &h, buf, |p| {
            write_f32s(&data[cr], p)
        })
        .ok()?;
        if let Some(op) = self.ops.get_mut(&item.id) {
            let st = match item.phase {
                Phase::Scatter => op.sends[item.peer as usize].as_mut(),
                _ => op.gsends[item.peer as usize].as_mut(),
            };
            if let Some(st) = st {
                st.last_sent = chunk;
            }
        }
        if repair {
            self.stats.count_repair_sent(item.peer, class, len);
        }
        Some(self.count_tx(item.peer, class, len))
    }

    fn count_tx(&mut self, peer: u32, class: Class, len: usize) -> Transmit {
        self.stats.count_tx(peer, class, len);
        Transmit { dst: peer, len, class }
    }

    fn encode_control(&mut self, now: Instant, item: TxItem, buf: &mut [u8]) -> Option<Transmit> {
        let seg_bytes = self.cfg.chunk_bytes;
        let rto = self.rtt.timeout();
        let mut h = self.header(PacketType::Hello, Class::CONTROL, item.phase, item.id, item.peer);
        let mut seg_payload: Option<(u32, usize)> = None;
        match item.kind {
            TxKind::Hello => {
                h.op = 0;
                h.tensor = 0;
                h.seq = self.hello_seq;
            }
            TxKind::Probe => {
                let op = self.ops.get_mut(&item.id)?;
                let st = match item.phase {
                    Phase::Scatter => op.sends[item.peer as usize].as_mut()?,
                    _ => op.gsends[item.peer as usize].as_mut()?,
                };
                if st.done || st.stage != Stage::Probing || st.reported {
                    return None;
                }
                h.ty = PacketType::Probe;
                h.chunk_index = st.last_sent.min(st.n.saturating_sub(1));
                h.chunk_count = st.n;
                h.required = st.required;
                h.budget_ppm = st.budget_ppm;
                h.seq = st.seq;
                st.probe_sent = Some((st.seq, now));
                let backoff = rto.saturating_mul(1 << st.backoff.min(MAX_BACKOFF));
                let at = now + backoff.min(self.cfg.timers.probe_max.max(rto));
                st.probe_timer = Some(at);
                let side = if item.phase == Phase::Scatter { SIDE_SCATTER_SEND } else { SIDE_GATHER_SEND };
                self.timers.insert((at, item.id, side, item.peer));
                self.stats.probes_sent += 1;
            }
            TxKind::Bitmap { seg } => {
                let op = self.ops.get(&item.id)?;
                let r = match item.phase {
                    Phase::Scatter => op.recvs[item.peer as usize].as_ref()?,
                    _ => op.grecvs[item.peer as usize].as_ref()?,
                };
                if r.closed_at.is_some() {
                    return None;
                }
                h.ty = PacketType::Bitmap;
                h.chunk_count = r.n;
                h.required = r.required.unwrap_or(0).min(r.n);
                h.seq = r.probe_seq;
                if r.got.is_full() {
                    if seg != 0 {
                        return None;
                    }
                    h.flags = Flags::COMPLETE;
                } else {
                    seg_payload = Some((seg, 0));
                }
            }
            TxKind::Done { seg } => {
                h.ty = PacketType::Done;
                match item.phase {
                    Phase::Scatter => {
                        // Receiver → sender: the transfer is closed.
                        let (n, seq) = if let Some(op) = self.ops.get(&item.id) {
                            let r = op.recvs[item.peer as usize].as_ref()?;
                            (r.n, r.probe_seq)
                        } else {
                            (self.lingering.get(&item.id)?.own_chunks, 0)
                        };
                        h.chunk_count = n;
                        h.seq = seq;
                        h.flags = Flags::MASK_EMPTY;
                    }
                    _ => {
                        // Owner → receiver: the agreed mask.
                        let mask = if let Some(op) = self.ops.get(&item.id) {
                            op.gmask.clone()?
                        } else {
                            self.lingering.get(&item.id)?.mask.clone()
                        };
                        h.chunk_count = mask.len();
                        if mask.count_ones() == 0 {
                            if seg != 0 {
                                return None;
                            }
                            h.flags = Flags::MASK_EMPTY;
                        } else {
                            let (first, len) =
                                mask.write_segment(seg, seg_bytes, &mut buf[wire::HEADER_LEN..]);
                            h.chunk_index = first;
                            h.payload_len = len as u16;
                            let n = wire::encode_maybe_tagged(
                                (!self.defer_tags).then_some(&self.cfg.key),
                                &h,
                                buf,
                                |_| {},
                            )
                            .ok()?;
                            return Some(self.count_tx(item.peer, Class::CONTROL, n));
                        }
                    }
                }
            }
            TxKind::Data { .. } => return None,
        }
        if let Some((seg, _)) = seg_payload {
            let op = self.ops.get(&item.id)?;
            let r = match item.phase {
                Phase::Scatter => op.recvs[item.peer as usize].as_ref()?,
                _ => op.grecvs[item.peer as usize].as_ref()?,
            };
            if buf.len() < wire::OVERHEAD + seg_bytes {
                return None;
            }
            let (first, len) = r.got.write_segment(seg, seg_bytes, &mut buf[wire::HEADER_LEN..]);
            h.chunk_index = first;
            h.payload_len = len as u16;
        }
        let n =
            wire::encode_maybe_tagged((!self.defer_tags).then_some(&self.cfg.key), &h, buf, |_| {}).ok()?;
        Some(self.count_tx(item.peer, Class::CONTROL, n))
    }
}

/// Checks a DATA chunk against its receive transfer (layout, closed, already
/// there) and marks it arrived; every refusal is counted.
fn admit_chunk(
    r: &mut RecvState,
    h: &Header,
    payload_len: usize,
    chunk_elems: usize,
    rej: &mut RejectCounters,
) -> bool {
    if h.chunk_count != r.n || h.chunk_index >= r.n || payload_len != chunk_elems * 4 {
        rej.mismatch += 1;
        return false;
    }
    if r.closed_at.is_some() {
        rej.late += 1;
        return false;
    }
    if !r.got.set(h.chunk_index) {
        rej.duplicate += 1;
        return false;
    }
    true
}

/// A PROBE overtook the chunk it named by `d`: track the largest recent
/// overtake (jump up at once, decay by 1/8 per observation).
fn observe_overtake(est: &mut Duration, d: Duration) {
    *est = d.max(*est - *est / 8 + d / 8);
}

/// Returns how long ago the PROBE arrived if this is the chunk it overtook.
fn accept_data_header(
    r: &mut RecvState,
    h: &Header,
    now: Instant,
    est: &DeadlineEstimator,
    stats: &mut Stats,
) -> Option<Duration> {
    r.required = Some(h.required);
    r.budget_ppm = h.budget_ppm.min(MAX_BUDGET_PPM);
    if h.flags.contains(Flags::REQUIRED) {
        r.got_required += 1;
    }
    r.last_at = Some(now);
    let mut overtake = None;
    if r.awaited == Some(h.chunk_index) {
        // The chunk the PROBE overtook has landed: answer the PROBE now.
        r.awaited = None;
        r.grace = Some(now);
        // Only a first-pass chunk proves it was queued behind the PROBE; a
        // repair of a lost one says nothing about queueing.
        overtake = r.probe_at.take().filter(|_| !h.flags.contains(Flags::REPAIR)).map(|p| now - p);
    }
    if h.flags.contains(Flags::REPAIR) {
        r.repaired += 1;
        stats.count_repair_received(h.src, h.class, wire::OVERHEAD + usize::from(h.payload_len));
    }
    arm_deadline(r, now, est);
    overtake
}

/// When a PROBE finds an incomplete transfer whose last-sent chunk
/// (`last_sent`, carried in the PROBE) has not arrived while chunks were still
/// arriving within the last `grace`, the PROBE (control class) has probably
/// overtaken the tail of the transfer queued in the network: answer at the
/// returned instant instead of now. `None`: answer now.
fn settle_until(r: &RecvState, now: Instant, grace: Duration, last_sent: u32) -> Option<Instant> {
    if grace.is_zero() || r.got.is_full() {
        return None;
    }
    if r.grace.is_some() {
        return r.grace;
    }
    // The chunk the sender sent last has arrived: nothing the PROBE could have
    // overtaken is left in flight (per-class FIFO, lowest class last).
    if r.got.get(last_sent) {
        return None;
    }
    let streaming = r.last_at.is_some_and(|l| now < l + grace);
    streaming.then_some(now + grace)
}

/// Note the first packet of a receive transfer and arm its adaptive deadline.
fn arm_deadline(r: &mut RecvState, now: Instant, est: &DeadlineEstimator) {
    if r.first_at.is_none() {
        r.first_at = Some(now);
    }
    if r.deadline.is_none() && r.closed_at.is_none() && r.nudge.is_none() {
        r.deadline = Some(now + est.deadline(r.n));
    }
}

fn mask_segments(mask: &Bitmap, seg_bytes: usize) -> u32 {
    if mask.count_ones() == 0 { 1 } else { Bitmap::segment_count(mask.len(), seg_bytes) }
}

fn waiting_on(op: &Op, me: u32) -> Vec<u32> {
    let mut w = Vec::new();
    for j in 0..op.recvs.len() as u32 {
        if j == me {
            continue;
        }
        let j_ = j as usize;
        let scatter_in = op.recvs[j_].as_ref().is_some_and(|r| r.closed_at.is_none());
        let scatter_out = op.sends[j_].as_ref().is_some_and(|s| !s.done) && !op.reduced;
        let gather_in = op.grecvs[j_].as_ref().is_some_and(|r| r.closed_at.is_none());
        let gather_out = op.gsends[j_].as_ref().is_some_and(|s| !s.reported && !s.done);
        if scatter_in || scatter_out || gather_in || gather_out {
            w.push(j);
        }
    }
    w
}

fn sq_norm(x: &[f32]) -> f32 {
    let s: f32 = x.iter().map(|v| v * v).sum();
    if s.is_nan() { f32::INFINITY } else { s }
}

/// Position of each entry when sorted by decreasing value (ties by index).
fn rank_by_norm(norms: &[f32]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..norms.len() as u32).collect();
    order.sort_by(|&a, &b| norms[b as usize].total_cmp(&norms[a as usize]).then(a.cmp(&b)));
    let mut ranks = vec![0u32; norms.len()];
    for (pos, &i) in order.iter().enumerate() {
        ranks[i as usize] = pos as u32;
    }
    ranks
}

fn read_f32s(src: &[u8], dst: &mut [f32]) {
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

fn write_f32s(src: &[f32], dst: &mut [u8]) {
    for (s, b) in src.iter().zip(dst.chunks_exact_mut(4)) {
        b.copy_from_slice(&s.to_le_bytes());
    }
}

impl Node for Endpoint {
    fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        Endpoint::handle_datagram(self, now, datagram)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Endpoint::handle_timeout(self, now)
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        Endpoint::poll_transmit(self, now, buf)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Endpoint::poll_timeout(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_missing_floors() {
        assert_eq!(allowed_missing(100, 10_000), 1);
        assert_eq!(allowed_missing(99, 10_000), 0);
        assert_eq!(allowed_missing(1000, 0), 0);
        assert_eq!(allowed_missing(u32::MAX, 100_000), 429_496_729);
    }

    #[test]
    fn repairs_exactly_enough_highest_class_first() {
        let classes = [0u8, 3, 1, 3, 6, 2, 0, 5];
        let class_of = |c: u32| Class::new(classes[c as usize]).unwrap();
        let droppable = ClassSet::from_classes((0..=4).filter_map(Class::new));
        // Missing: 0,1,2,3,4(required),6,7(required). Allowed 2 → repair 4,7
        // then droppable by class: 1(3),3(3),2(1) until 2 remain (0 and 6).
        let r = select_repairs([0, 1, 2, 3, 4, 6, 7], class_of, droppable, 2);
        assert_eq!(r, vec![4, 7, 1, 3, 2]);
        // Allowed ≥ droppable missing: only required ones.
        assert_eq!(select_repairs([0, 4], class_of, droppable, 5), vec![4]);
    }

    #[test]
    fn layout_covers_tensor() {
        for (len, world, ce) in [(10usize, 3u32, 2usize), (1, 4, 3), (1000, 7, 13), (5, 5, 1)] {
            let l = Layout { len, world, chunk_elems: ce };
            let mut covered = 0;
            for s in 0..world {
                let sh = l.shard(s);
                assert_eq!(sh.start, covered);
                covered = sh.end;
                let total: usize = (0..l.chunks(s)).map(|c| l.chunk(s, c).len()).sum();
                assert_eq!(total, sh.len());
            }
            assert_eq!(covered, len);
        }
    }
}
