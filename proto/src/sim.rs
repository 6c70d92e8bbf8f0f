//! Deterministic network simulator for testing the protocol core.
//!
//! A [`Sim`] drives `N` sans-IO endpoints (anything implementing [`Node`]) over a
//! simulated star network on virtual time. Every run is bit-for-bit reproducible
//! from [`NetConfig::seed`]: there are no clocks, no threads, and nothing that
//! affects results iterates a hash map.
//!
//! ## Model
//!
//! - **Uplinks.** Node `r` (its *rank* is its index) has an uplink to the switch at
//!   [`NetConfig::link_rate_bps`]. The simulator calls [`Node::poll_transmit`] only
//!   while that uplink is idle, which models NIC backpressure: the node keeps its own
//!   per-class queues and hands over its next datagram when the wire is free. A
//!   datagram of `len` bytes occupies the wire for the serialization time of
//!   `len + `[`NetConfig::frame_overhead`] bytes (rounded up to whole nanoseconds),
//!   then reaches the switch [`NetConfig::prop_delay`] later.
//! - **Switch.** One egress port per node, at the link rate or a lower per-port
//!   bottleneck rate ([`NetConfig::port_rates_bps`]), each with a **strict-priority
//!   queue** of [`NetConfig::port_queue_packets`] packets (not counting the one being
//!   serialized). The highest class is served first, FIFO within a class. When the
//!   queue is full, an arriving packet pushes out the *most recently queued* packet
//!   of the *lowest* class present if that class is lower than its own; otherwise the
//!   arriving packet is dropped. After the port serializes a packet it reaches the
//!   destination `prop_delay` later.
//! - **Faults.** Each datagram handed over by a node gets its own fault plan, drawn
//!   from a random stream keyed by `(seed, sender rank, sender's datagram counter)`,
//!   with a fixed number of draws. Fault decisions are therefore independent of how
//!   events of different nodes interleave, and changing one probability does not
//!   reshuffle the others. A datagram is
//!   - *lost* with probability [`NetConfig::loss`] on the uplink (it never reaches
//!     the switch; it is lost exactly once, end to end);
//!   - *reordered* with probability [`NetConfig::reorder`]: an extra delay uniform in
//!     `[0, reorder_delay]` after the switch;
//!   - *duplicated* with probability [`NetConfig::duplicate`]: a second copy is
//!     delivered uniformly `[0, duplicate_delay]` after the first;
//!   - *corrupted* with probability [`NetConfig::corrupt`], independently per
//!     delivered copy: one random bit is flipped (the receiver's MAC check rejects it).
//! - **Dead hosts.** [`Sim::set_silent`] freezes a node: it is no longer driven at all
//!   and every datagram to or from it that would be delivered while it is silent is
//!   dropped instead.
//!
//! ## Event loop
//!
//! A binary heap of events keyed by `(time, kind, insertion sequence)`. At equal
//! times, switch work comes first, then datagram deliveries, then uplinks freeing,
//! then timers, then wake-ups, so **datagrams are delivered before timers fire**.
//! After any call into a node the simulator pulls [`Node::poll_transmit`] if the
//! node's uplink is idle, then re-reads [`Node::poll_timeout`] (one pending timer
//! per node, lazily invalidated). A deadline at or before `now` fires at `now`. A
//! node that keeps asking for a timeout at the same instant after being handled,
//! while neither sending nor receiving, is stopped with a panic after
//! [`NetConfig::max_timer_spins`] calls (an infinite loop in virtual time is a bug in
//! the node). If such a node's uplink is busy, the simulator instead waits for the
//! uplink to free (a paced node whose next send is due but whose NIC is busy).
//!
//! ## Observation
//!
//! The [`DeliveryLog`] records, per destination, the first time each DATA chunk
//! ([`ChunkKey`]) was delivered uncorrupted; [`NetStats`] counts what happened per
//! class, per port; [`Sim::set_trace`] installs a hook that sees every datagram event
//! (pcap-style tracing can be built on it).

use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::fmt;

use crate::class::Class;
// `Transmit` is the endpoint's; re-exported as a temporary bridge for daemon/src/service.rs.
use crate::endpoint::Endpoint;
pub use crate::endpoint::Transmit;
// Temporary bridge: daemon/src/service.rs still names `sim::Rng`; new code uses `rng::Rng`.
pub use crate::rng::Rng;
use crate::time::{Duration, Instant};
use crate::wire::{self, PacketType, Phase};

/// What the simulator drives: a sans-IO endpoint.
pub trait Node {
    /// A datagram arrived from the network.
    fn handle_datagram(&mut self, now: Instant, datagram: &[u8]);
    /// A timer armed via [`Node::poll_timeout`] may have expired.
    fn handle_timeout(&mut self, now: Instant);
    /// The next datagram to send, if any (the NIC is free).
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit>;
    /// The earliest instant at which the node wants `handle_timeout` (or
    /// `poll_transmit`, when paced) to be called.
    fn poll_timeout(&self) -> Option<Instant>;
}

impl<T: Node + ?Sized> Node for Box<T> {
    fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        (**self).handle_datagram(now, datagram)
    }
    fn handle_timeout(&mut self, now: Instant) {
        (**self).handle_timeout(now)
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        (**self).poll_transmit(now, buf)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        (**self).poll_timeout()
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

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// Network parameters of a simulation. Build with [`NetConfig::default`] and the
/// `with_*` methods, or set the public fields directly.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConfig {
    /// Rate of every uplink and (unless overridden) every switch egress port, bits/s.
    pub link_rate_bps: u64,
    /// Per-port bottleneck rates (bits/s) overriding `link_rate_bps` for the egress
    /// port towards the given rank.
    pub port_rates_bps: BTreeMap<u32, u64>,
    /// One-way propagation delay of each hop (node → switch, switch → node).
    pub prop_delay: Duration,
    /// Bytes added to each datagram on the wire (IP + UDP + Ethernet headers).
    pub frame_overhead: usize,
    /// Capacity of each egress queue, in packets (excluding the one in service).
    pub port_queue_packets: usize,
    /// Probability that a datagram is lost (once, on its way to the switch).
    pub loss: f64,
    /// Probability that a datagram is delayed by an extra `[0, reorder_delay]`.
    pub reorder: f64,
    /// Largest extra delay of a reordered datagram.
    pub reorder_delay: Duration,
    /// Probability that a datagram is delivered twice.
    pub duplicate: f64,
    /// Largest delay of the second copy after the first.
    pub duplicate_delay: Duration,
    /// Probability that a delivered copy has one bit flipped.
    pub corrupt: f64,
    /// Seed of every random decision.
    pub seed: u64,
    /// Size of the buffer handed to [`Node::poll_transmit`].
    pub max_datagram: usize,
    /// How many times in a row a node may get `handle_timeout` at the same instant
    /// without sending or receiving before the simulator panics.
    pub max_timer_spins: u32,
}

impl Default for NetConfig {
    /// 10 Gbit/s links, 5 µs propagation, 42 bytes of framing, 256-packet port
    /// queues, no faults, seed 1.
    fn default() -> Self {
        NetConfig {
            link_rate_bps: 10_000_000_000,
            port_rates_bps: BTreeMap::new(),
            prop_delay: Duration::from_micros(5),
            frame_overhead: 28 + 14,
            port_queue_packets: 256,
            loss: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(50),
            duplicate: 0.0,
            duplicate_delay: Duration::from_micros(1),
            corrupt: 0.0,
            seed: 1,
            max_datagram: wire::MAX_PAYLOAD + wire::OVERHEAD,
            max_timer_spins: 1000,
        }
    }
}

impl NetConfig {
    /// Set the seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Set the link rate (bits/s) of every uplink and port.
    pub fn with_link_rate(mut self, bps: u64) -> Self {
        self.link_rate_bps = bps;
        self
    }
    /// Give the egress port towards `rank` a (bottleneck) rate in bits/s.
    pub fn with_port_rate(mut self, rank: u32, bps: u64) -> Self {
        self.port_rates_bps.insert(rank, bps);
        self
    }
    /// Set the per-hop propagation delay.
    pub fn with_prop_delay(mut self, d: Duration) -> Self {
        self.prop_delay = d;
        self
    }
    /// Set the per-datagram framing overhead in bytes.
    pub fn with_frame_overhead(mut self, bytes: usize) -> Self {
        self.frame_overhead = bytes;
        self
    }
    /// Set the capacity of every egress queue, in packets.
    pub fn with_queue(mut self, packets: usize) -> Self {
        self.port_queue_packets = packets;
        self
    }
    /// Set the random loss probability.
    pub fn with_loss(mut self, p: f64) -> Self {
        self.loss = p;
        self
    }
    /// Set the reorder probability and the largest extra delay.
    pub fn with_reorder(mut self, p: f64, max_delay: Duration) -> Self {
        self.reorder = p;
        self.reorder_delay = max_delay;
        self
    }
    /// Set the duplication probability.
    pub fn with_duplicate(mut self, p: f64) -> Self {
        self.duplicate = p;
        self
    }
    /// Set the corruption probability (per delivered copy).
    pub fn with_corrupt(mut self, p: f64) -> Self {
        self.corrupt = p;
        self
    }

    /// The rate of the egress port towards `rank`.
    pub fn port_rate(&self, rank: u32) -> u64 {
        self.port_rates_bps.get(&rank).copied().unwrap_or(self.link_rate_bps)
    }

    /// Wire time of a `len`-byte datagram (plus framing) at `bps`, rounded up to
    /// whole nanoseconds.
    pub fn serialization(&self, len: usize, bps: u64) -> Duration {
        Duration::from_nanos(ser_nanos(len + self.frame_overhead, bps))
    }

    fn validate(&self) {
        for (name, p) in [
            ("loss", self.loss),
            ("reorder", self.reorder),
            ("duplicate", self.duplicate),
            ("corrupt", self.corrupt),
        ] {
            assert!((0.0..=1.0).contains(&p), "NetConfig::{name} = {p} is not a probability in [0, 1]");
        }
        assert!(self.link_rate_bps > 0, "NetConfig::link_rate_bps must be positive");
        for (rank, &bps) in &self.port_rates_bps {
            assert!(bps > 0, "NetConfig::port_rates_bps[{rank}] must be positive");
        }
    }
}

fn ser_nanos(bytes: usize, bps: u64) -> u64 {
    let bits = bytes as u128 * 8 * 1_000_000_000;
    let ns = bits.div_ceil(u128::from(bps));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------
// Observation: delivery log, statistics, trace
// ---------------------------------------------------------------------------

/// Identity of one DATA chunk, as written in its packet header. Orders by
/// `(op, tensor, phase, src, chunk)`, so one transfer's chunks are contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkKey {
    /// Op sequence number.
    pub op: u64,
    /// Tensor id.
    pub tensor: u32,
    /// Phase.
    pub phase: Phase,
    /// Sender rank (header field).
    pub src: u32,
    /// Chunk index.
    pub chunk: u32,
}

/// For each destination rank, the first time each DATA chunk was delivered to it
/// uncorrupted. Corrupted copies, and copies dropped because a host was silent, are
/// not deliveries. The MAC is not checked; header fields are read with
/// [`wire::Packet::new_checked`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryLog {
    per_dst: Vec<BTreeMap<ChunkKey, Instant>>,
}

impl DeliveryLog {
    fn new(nodes: usize) -> DeliveryLog {
        DeliveryLog { per_dst: vec![BTreeMap::new(); nodes] }
    }

    fn record(&mut self, dst: u32, key: ChunkKey, now: Instant) {
        self.per_dst[dst as usize].entry(key).or_insert(now);
    }

    /// When `key` was first delivered to `dst`, if ever.
    pub fn first_delivery(&self, dst: u32, key: &ChunkKey) -> Option<Instant> {
        self.per_dst.get(dst as usize)?.get(key).copied()
    }

    /// The delivered chunks of one transfer to `dst`, as `(chunk index, first
    /// delivery)`, in chunk order.
    pub fn transfer(
        &self,
        dst: u32,
        op: u64,
        tensor: u32,
        phase: Phase,
        src: u32,
    ) -> impl Iterator<Item = (u32, Instant)> + '_ {
        let lo = ChunkKey { op, tensor, phase, src, chunk: 0 };
        let hi = ChunkKey { chunk: u32::MAX, ..lo };
        self.per_dst
            .get(dst as usize)
            .into_iter()
            .flat_map(move |m| m.range(lo..=hi))
            .map(|(k, &t)| (k.chunk, t))
    }

    /// Everything delivered to `dst`, in key order.
    pub fn delivered_to(&self, dst: u32) -> impl Iterator<Item = (&ChunkKey, Instant)> + '_ {
        self.per_dst.get(dst as usize).into_iter().flat_map(|m| m.iter()).map(|(k, &t)| (k, t))
    }

    /// Every delivery as `(dst, key, first delivery)`, by destination then key.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &ChunkKey, Instant)> + '_ {
        self.per_dst.iter().enumerate().flat_map(|(d, m)| m.iter().map(move |(k, &t)| (d as u32, k, t)))
    }

    /// Number of distinct chunks delivered to `dst`.
    pub fn count_to(&self, dst: u32) -> usize {
        self.per_dst.get(dst as usize).map_or(0, BTreeMap::len)
    }

    /// Number of distinct (destination, chunk) deliveries.
    pub fn len(&self) -> usize {
        self.per_dst.iter().map(BTreeMap::len).sum()
    }

    /// True if nothing was delivered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Per-class counters, indexed by [`Class::index`].
pub type PerClass = [u64; Class::COUNT];

/// Counters of one switch egress port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets that reached the port, per class.
    pub arrivals: PerClass,
    /// Packets dropped at the port (arriving and rejected, or pushed out), per class.
    pub drops: PerClass,
    /// The subset of `drops` that were pushed out of the queue by a higher class.
    pub pushed_out: PerClass,
    /// Deepest the queue got, in packets (excluding the one in service).
    pub max_queue: usize,
}

impl PortStats {
    /// Fraction of class `c` arrivals dropped at this port (0 if none arrived).
    pub fn drop_fraction(&self, c: Class) -> f64 {
        let a = self.arrivals[c.index()];
        if a == 0 { 0.0 } else { self.drops[c.index()] as f64 / a as f64 }
    }
}

/// What happened on the simulated network.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Datagrams handed over by nodes, per class.
    pub offered: PerClass,
    /// Bytes of those datagrams (without framing overhead).
    pub offered_bytes: u64,
    /// Datagrams lost by the random `loss` fault, per class.
    pub lost: PerClass,
    /// Datagrams reaching a switch port, per class (sum over ports).
    pub switch_arrivals: PerClass,
    /// Datagrams dropped by switch queues, per class (sum over ports; includes
    /// push-outs).
    pub switch_drops: PerClass,
    /// Datagrams pushed out of a full queue by a higher class, per class.
    pub pushed_out: PerClass,
    /// Copies handed to receivers (including duplicates and corrupted copies), per
    /// class.
    pub delivered: PerClass,
    /// Bytes of those copies.
    pub delivered_bytes: u64,
    /// Datagrams given an extra reordering delay.
    pub reordered: u64,
    /// Extra copies created by the duplicate fault.
    pub duplicated: u64,
    /// Copies delivered with a flipped bit.
    pub corrupted: u64,
    /// Copies dropped because their sender or receiver was silent.
    pub silent_drops: u64,
    /// Datagrams addressed to a rank that does not exist.
    pub misaddressed: u64,
    /// `handle_timeout` calls.
    pub timers_fired: u64,
    /// Per egress port, indexed by destination rank.
    pub ports: Vec<PortStats>,
}

impl NetStats {
    /// Sum of a per-class counter.
    pub fn total(counter: &PerClass) -> u64 {
        counter.iter().sum()
    }
}

/// What a [`TraceRecord`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceEvent {
    /// A node handed the datagram to its uplink.
    Sent,
    /// The datagram was lost by the random `loss` fault.
    Lost,
    /// Addressed to a rank that does not exist; dropped.
    Misaddressed,
    /// Queued at (or started service on) the destination's switch port.
    Enqueued,
    /// Dropped on arrival at a full switch queue.
    Dropped,
    /// Pushed out of a full switch queue by a higher class.
    PushedOut,
    /// Dropped because its sender or receiver is silent.
    DroppedSilent,
    /// Handed to the receiver intact.
    Delivered,
    /// Handed to the receiver with a flipped bit (the bytes shown are corrupted).
    DeliveredCorrupt,
}

/// One datagram event, as seen by a trace hook ([`Sim::set_trace`]).
#[derive(Debug, Clone, Copy)]
pub struct TraceRecord<'a> {
    /// Virtual time of the event.
    pub time: Instant,
    /// What happened.
    pub event: TraceEvent,
    /// Sending rank.
    pub src: u32,
    /// Destination rank (as given in the [`Transmit`]).
    pub dst: u32,
    /// Priority class.
    pub class: Class,
    /// The datagram bytes.
    pub datagram: &'a [u8],
}

/// A trace hook.
pub type TraceFn = Box<dyn FnMut(&TraceRecord<'_>)>;

/// A targeted-loss hook ([`Sim::set_drop`]): sees every datagram as it leaves
/// its sender (event [`TraceEvent::Sent`]) and returns true to lose it, in
/// addition to the random `loss` fault. For tests that must lose one
/// particular packet (a PROBE, a DONE) rather than a random one.
pub type DropFn = Box<dyn FnMut(&TraceRecord<'_>) -> bool>;

// ---------------------------------------------------------------------------
// Switch queue
// ---------------------------------------------------------------------------

/// Outcome of offering a packet to a full-or-not [`PrioQueue`].
#[derive(Debug, PartialEq, Eq)]
enum Admit<T> {
    Queued,
    /// Queued, after pushing out this packet of this (lower) class.
    PushedOut(Class, T),
    /// Not queued.
    Rejected(T),
}

/// A strict-priority queue with push-out of the lowest class.
#[derive(Debug)]
struct PrioQueue<T> {
    queues: [VecDeque<T>; Class::COUNT],
    len: usize,
}

impl<T> PrioQueue<T> {
    fn new() -> Self {
        PrioQueue { queues: Default::default(), len: 0 }
    }

    fn push(&mut self, class: Class, item: T, cap: usize) -> Admit<T> {
        if self.len < cap {
            self.queues[class.index()].push_back(item);
            self.len += 1;
            return Admit::Queued;
        }
        let Some(low) = (0..class.index()).find(|&c| !self.queues[c].is_empty()) else {
            return Admit::Rejected(item);
        };
        let victim = self.queues[low].pop_back().expect("non-empty class queue");
        self.queues[class.index()].push_back(item);
        Admit::PushedOut(Class::new(low as u8).expect("class index in range"), victim)
    }

    /// Whether [`PrioQueue::push`] would queue a packet of `class`.
    fn admits(&self, class: Class, cap: usize) -> bool {
        self.len < cap || self.queues[..class.index()].iter().any(|q| !q.is_empty())
    }

    fn pop(&mut self) -> Option<T> {
        let item = self.queues.iter_mut().rev().find_map(VecDeque::pop_front)?;
        self.len -= 1;
        Some(item)
    }
}

// ---------------------------------------------------------------------------
// The simulator
// ---------------------------------------------------------------------------

/// Fault decisions for one datagram, drawn when it is handed over.
#[derive(Debug, Clone, Copy)]
struct Faults {
    lost: bool,
    reorder: Option<u64>,
    duplicate: Option<u64>,
    /// Raw random bit position (reduced modulo the length) per copy.
    corrupt: [Option<u64>; 2],
}

#[derive(Debug)]
struct Pkt {
    src: u32,
    dst: u32,
    class: Class,
    data: Vec<u8>,
    faults: Faults,
}

#[derive(Debug)]
enum What {
    PortDone(u32),
    Arrive(Pkt),
    Deliver { pkt: Pkt, corrupt: Option<u64> },
    UplinkFree(u32),
    Timer { rank: u32, generation: u64 },
    Wake(u32),
}

impl What {
    /// Tie-break order at equal times: switch work, deliveries, uplinks, timers, wakes.
    fn kind(&self) -> u8 {
        match self {
            What::PortDone(_) => 0,
            What::Arrive(_) => 1,
            What::Deliver { .. } => 2,
            What::UplinkFree(_) => 3,
            What::Timer { .. } => 4,
            What::Wake(_) => 5,
        }
    }
}

/// A heap entry: the ordering key and the slot of its payload in
/// `Sim::slots` (the heap moves only these 24 bytes, not the packet).
#[derive(Debug)]
struct Event {
    at: Instant,
    kind: u8,
    seq: u64,
    slot: u32,
}

impl Event {
    fn key(&self) -> (Instant, u8, u64) {
        (self.at, self.kind, self.seq)
    }
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest event.
    fn cmp(&self, other: &Self) -> core::cmp::Ordering {
        other.key().cmp(&self.key())
    }
}

/// Per-node simulator state.
#[derive(Debug, Default)]
struct Host {
    silent: bool,
    uplink_busy: bool,
    /// Instant of the one live timer event, if any.
    timer_at: Option<Instant>,
    /// Generation of the live timer event; older ones are stale.
    timer_generation: u64,
    wake_pending: bool,
    /// Consecutive `handle_timeout` calls at `spin_at` without traffic.
    spins: u32,
    spin_at: Instant,
    /// Datagrams handed over so far (keys the fault stream).
    sent: u64,
}

#[derive(Debug)]
struct Port {
    rate_bps: u64,
    in_service: Option<Pkt>,
    queue: PrioQueue<Pkt>,
}

const POOL_MAX: usize = 4096;

/// A deterministic simulation of `N` nodes on a star network (see the
/// [module docs](self)).
pub struct Sim<N> {
    cfg: NetConfig,
    nodes: Vec<N>,
    hosts: Vec<Host>,
    ports: Vec<Port>,
    events: BinaryHeap<Event>,
    /// Payloads of pending events, indexed by `Event::slot`.
    slots: Vec<Option<What>>,
    /// Free indices of `slots`.
    free_slots: Vec<u32>,
    seq: u64,
    now: Instant,
    txbuf: Vec<u8>,
    pool: Vec<Vec<u8>>,
    log: DeliveryLog,
    stats: NetStats,
    trace: Option<TraceFn>,
    drop: Option<DropFn>,
}

impl<N> fmt::Debug for Sim<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim")
            .field("nodes", &self.nodes.len())
            .field("now", &self.now)
            .field("pending_events", &self.events.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<N: Node> Sim<N> {
    /// A simulation of `nodes` (rank = index) at time zero. Nothing runs until the
    /// first [`Sim::step`]; every node is then polled at time zero.
    ///
    /// # Panics
    /// If a probability in `config` is outside `[0, 1]` or a rate is zero.
    pub fn new(config: NetConfig, nodes: Vec<N>) -> Sim<N> {
        config.validate();
        let n = nodes.len();
        let ports = (0..n)
            .map(|r| Port { rate_bps: config.port_rate(r as u32), in_service: None, queue: PrioQueue::new() })
            .collect();
        let mut sim = Sim {
            txbuf: vec![0; config.max_datagram],
            hosts: (0..n).map(|_| Host::default()).collect(),
            ports,
            events: BinaryHeap::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            seq: 0,
            now: Instant::ZERO,
            pool: Vec::new(),
            log: DeliveryLog::new(n),
            stats: NetStats { ports: vec![PortStats::default(); n], ..NetStats::default() },
            trace: None,
            drop: None,
            nodes,
            cfg: config,
        };
        for r in 0..n as u32 {
            sim.schedule_wake(r);
        }
        sim
    }

    /// The network configuration.
    pub fn config(&self) -> &NetConfig {
        &self.cfg
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The node of rank `rank`.
    ///
    /// # Panics
    /// If `rank` is out of range (likewise for every method taking a rank).
    pub fn node(&self, rank: u32) -> &N {
        &self.nodes[rank as usize]
    }

    /// Mutable access to a node, e.g. to submit work. The simulator re-polls the
    /// node (transmit and timeout) at the current time on the next step.
    pub fn node_mut(&mut self, rank: u32) -> &mut N {
        self.schedule_wake(rank);
        &mut self.nodes[rank as usize]
    }

    /// All nodes, by rank.
    pub fn nodes(&self) -> &[N] {
        &self.nodes
    }

    /// Freeze (`true`) or revive (`false`) a node. A silent node is not driven at
    /// all (no timers, no polls, no datagrams), and every datagram from or to it that
    /// would be delivered while it is silent is dropped. A revived node is polled at
    /// the current time.
    pub fn set_silent(&mut self, rank: u32, silent: bool) {
        let h = &mut self.hosts[rank as usize];
        h.silent = silent;
        h.timer_at = None;
        h.spins = 0;
        if !silent {
            self.schedule_wake(rank);
        }
    }

    /// Whether a node is silent.
    pub fn is_silent(&self, rank: u32) -> bool {
        self.hosts[rank as usize].silent
    }

    /// Replace a node (a restarted daemon); returns the old one. Its pending timer is
    /// forgotten, its silent flag is kept, and the new node is polled at the current
    /// time. A datagram the old node was serializing still completes.
    pub fn replace_node(&mut self, rank: u32, node: N) -> N {
        let old = core::mem::replace(&mut self.nodes[rank as usize], node);
        let h = &mut self.hosts[rank as usize];
        h.timer_at = None;
        h.spins = 0;
        self.schedule_wake(rank);
        old
    }

    /// The delivery log.
    pub fn log(&self) -> &DeliveryLog {
        &self.log
    }

    /// Network counters.
    pub fn stats(&self) -> &NetStats {
        &self.stats
    }

    /// Install (or remove) a hook called for every datagram event.
    pub fn set_trace(&mut self, trace: Option<TraceFn>) {
        self.trace = trace;
    }

    /// Install (or remove) a targeted-loss hook; lost datagrams count in
    /// [`NetStats::lost`] and are traced as [`TraceEvent::Lost`].
    pub fn set_drop(&mut self, drop: Option<DropFn>) {
        self.drop = drop;
    }

    /// Time of the next scheduled event, if any.
    pub fn next_event_time(&self) -> Option<Instant> {
        self.events.peek().map(|e| e.at)
    }

    /// Process one event. Returns `false` if nothing is scheduled.
    ///
    /// # Panics
    /// If a node keeps requesting a timeout at the current instant without making
    /// progress (see [`NetConfig::max_timer_spins`]), or returns a [`Transmit`]
    /// longer than the buffer it was given.
    pub fn step(&mut self) -> bool {
        let Some(ev) = self.events.pop() else { return false };
        debug_assert!(ev.at >= self.now, "event in the past");
        self.now = ev.at;
        let what = self.slots[ev.slot as usize].take().expect("sim: event payload missing");
        self.free_slots.push(ev.slot);
        match what {
            What::PortDone(port) => self.on_port_done(port),
            What::Arrive(pkt) => self.on_arrive(pkt),
            What::Deliver { pkt, corrupt } => self.on_deliver(pkt, corrupt),
            What::UplinkFree(rank) => {
                self.hosts[rank as usize].uplink_busy = false;
                self.service(rank);
            }
            What::Timer { rank, generation } => self.on_timer(rank, generation),
            What::Wake(rank) => {
                self.hosts[rank as usize].wake_pending = false;
                self.service(rank);
            }
        }
        true
    }

    /// Run until `done` returns `true` (→ `true`), or until no event is scheduled at
    /// or before `limit` (→ `false`; the clock then advances to `limit` if events
    /// remain after it). `done` is checked before the first event and after every
    /// event.
    pub fn run_until(&mut self, limit: Instant, mut done: impl FnMut(&mut Sim<N>) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            match self.next_event_time() {
                None => return false,
                Some(t) if t > limit => {
                    self.now = self.now.max(limit);
                    return false;
                }
                Some(_) => {
                    self.step();
                }
            }
        }
    }

    /// Run every event scheduled at or before `limit`.
    pub fn run_to(&mut self, limit: Instant) {
        self.run_until(limit, |_| false);
    }

    // -- internals ---------------------------------------------------------

    fn push(&mut self, at: Instant, what: What) {
        let kind = what.kind();
        self.seq += 1;
        let slot = match self.free_slots.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(what);
                i
            }
            None => {
                self.slots.push(Some(what));
                u32::try_from(self.slots.len() - 1).expect("sim: more than 2^32 pending events")
            }
        };
        self.events.push(Event { at, kind, seq: self.seq, slot });
    }

    fn schedule_wake(&mut self, rank: u32) {
        let h = &mut self.hosts[rank as usize];
        if !h.wake_pending {
            h.wake_pending = true;
            self.push(self.now, What::Wake(rank));
        }
    }

    fn emit(&mut self, event: TraceEvent, src: u32, dst: u32, class: Class, datagram: &[u8]) {
        if let Some(t) = self.trace.as_mut() {
            t(&TraceRecord { time: self.now, event, src, dst, class, datagram });
        }
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < POOL_MAX {
            self.pool.push(buf);
        }
    }

    /// After any call into a node: pull a datagram if the uplink is idle, then
    /// re-arm the node's timer.
    fn service(&mut self, rank: u32) {
        let r = rank as usize;
        if self.hosts[r].silent {
            return;
        }
        if !self.hosts[r].uplink_busy {
            self.pull_transmit(rank);
        }
        self.rearm(rank);
    }

    fn rearm(&mut self, rank: u32) {
        let r = rank as usize;
        let now = self.now;
        let want = self.nodes[r].poll_timeout().map(|t| t.max(now));
        let h = &mut self.hosts[r];
        let want = match want {
            // Already handled at this instant and the NIC is busy: a paced node
            // whose send is due. The uplink freeing re-polls it.
            Some(t) if t == now && h.spin_at == now && h.spins > 0 && h.uplink_busy => None,
            w => w,
        };
        if want == h.timer_at {
            return;
        }
        h.timer_at = want;
        if let Some(at) = want {
            h.timer_generation += 1;
            let generation = h.timer_generation;
            self.push(at, What::Timer { rank, generation });
        }
    }

    fn on_timer(&mut self, rank: u32, generation: u64) {
        let r = rank as usize;
        let now = self.now;
        let cap = self.cfg.max_timer_spins;
        let h = &mut self.hosts[r];
        if h.timer_generation != generation || h.timer_at != Some(now) {
            return; // stale
        }
        h.timer_at = None;
        if h.silent {
            return;
        }
        if h.spin_at == now {
            h.spins += 1;
        } else {
            h.spin_at = now;
            h.spins = 1;
        }
        if h.spins > cap {
            panic!(
                "sim: node {rank} keeps asking for a timeout at {} ns without making progress \
                 (handle_timeout called {} times in a row at the same instant while it neither \
                 sent nor received; poll_timeout must move past `now` once the timer is handled)",
                now.as_nanos(),
                h.spins - 1,
            );
        }
        self.stats.timers_fired += 1;
        self.nodes[r].handle_timeout(now);
        self.service(rank);
    }

    fn draw_faults(&self, src: u32, n: u64) -> Faults {
        let c = &self.cfg;
        let mut rng = Rng::stream(c.seed, u64::from(src), n);
        // A fixed number of draws, so no probability shifts another's outcomes.
        let lost = rng.chance(c.loss);
        let reorder = rng.chance(c.reorder);
        let reorder_by = rng.below(nanos(c.reorder_delay).saturating_add(1));
        let dup = rng.chance(c.duplicate);
        let dup_by = rng.below(nanos(c.duplicate_delay).saturating_add(1));
        let corrupt0 = rng.chance(c.corrupt);
        let bit0 = rng.next_u64();
        let corrupt1 = rng.chance(c.corrupt);
        let bit1 = rng.next_u64();
        Faults {
            lost,
            reorder: reorder.then_some(reorder_by),
            duplicate: dup.then_some(dup_by),
            corrupt: [corrupt0.then_some(bit0), corrupt1.then_some(bit1)],
        }
    }

    fn pull_transmit(&mut self, rank: u32) {
        let r = rank as usize;
        let now = self.now;
        let Some(tx) = self.nodes[r].poll_transmit(now, &mut self.txbuf) else { return };
        assert!(
            tx.len <= self.txbuf.len(),
            "sim: node {rank} returned Transmit.len = {} but its buffer holds {} bytes",
            tx.len,
            self.txbuf.len()
        );
        let h = &mut self.hosts[r];
        let n = h.sent;
        h.sent += 1;
        h.spins = 0;
        h.uplink_busy = true;
        let ser = self.cfg.serialization(tx.len, self.cfg.link_rate_bps);
        self.push(now + ser, What::UplinkFree(rank));

        let c = tx.class.index();
        self.stats.offered[c] += 1;
        self.stats.offered_bytes += tx.len as u64;
        let mut data = self.pool.pop().unwrap_or_default();
        data.clear();
        data.extend_from_slice(&self.txbuf[..tx.len]);
        self.emit(TraceEvent::Sent, rank, tx.dst, tx.class, &data);

        if tx.dst as usize >= self.nodes.len() {
            self.stats.misaddressed += 1;
            self.emit(TraceEvent::Misaddressed, rank, tx.dst, tx.class, &data);
            self.recycle(data);
            return;
        }
        let faults = self.draw_faults(rank, n);
        let targeted = self.drop.as_mut().is_some_and(|d| {
            d(&TraceRecord {
                time: now,
                event: TraceEvent::Sent,
                src: rank,
                dst: tx.dst,
                class: tx.class,
                datagram: &data,
            })
        });
        if faults.lost || targeted {
            self.stats.lost[c] += 1;
            self.emit(TraceEvent::Lost, rank, tx.dst, tx.class, &data);
            self.recycle(data);
            return;
        }
        let pkt = Pkt { src: rank, dst: tx.dst, class: tx.class, data, faults };
        self.push(now + ser + self.cfg.prop_delay, What::Arrive(pkt));
    }

    fn start_port(&mut self, port: u32, pkt: Pkt) {
        let p = &mut self.ports[port as usize];
        let ser = self.cfg.serialization(pkt.data.len(), p.rate_bps);
        p.in_service = Some(pkt);
        self.push(self.now + ser, What::PortDone(port));
    }

    fn on_arrive(&mut self, pkt: Pkt) {
        let port = pkt.dst;
        let c = pkt.class.index();
        self.stats.switch_arrivals[c] += 1;
        self.stats.ports[port as usize].arrivals[c] += 1;
        if self.ports[port as usize].in_service.is_none() {
            self.emit(TraceEvent::Enqueued, pkt.src, pkt.dst, pkt.class, &pkt.data);
            self.start_port(port, pkt);
            return;
        }
        let cap = self.cfg.port_queue_packets;
        if self.ports[port as usize].queue.admits(pkt.class, cap) {
            self.emit(TraceEvent::Enqueued, pkt.src, pkt.dst, pkt.class, &pkt.data);
        }
        let dropped = match self.ports[port as usize].queue.push(pkt.class, pkt, cap) {
            Admit::Queued => None,
            Admit::PushedOut(vc, victim) => {
                self.stats.pushed_out[vc.index()] += 1;
                self.stats.ports[port as usize].pushed_out[vc.index()] += 1;
                Some((TraceEvent::PushedOut, victim))
            }
            Admit::Rejected(pkt) => Some((TraceEvent::Dropped, pkt)),
        };
        let depth = self.ports[port as usize].queue.len;
        let ps = &mut self.stats.ports[port as usize];
        ps.max_queue = ps.max_queue.max(depth);
        if let Some((ev, d)) = dropped {
            self.stats.switch_drops[d.class.index()] += 1;
            self.stats.ports[port as usize].drops[d.class.index()] += 1;
            self.emit(ev, d.src, d.dst, d.class, &d.data);
            self.recycle(d.data);
        }
    }

    fn on_port_done(&mut self, port: u32) {
        let p = &mut self.ports[port as usize];
        let pkt = p.in_service.take().expect("port done without a packet in service");
        if let Some(next) = p.queue.pop() {
            self.start_port(port, next);
        }
        let mut at = self.now + self.cfg.prop_delay;
        if let Some(extra) = pkt.faults.reorder {
            self.stats.reordered += 1;
            at += Duration::from_nanos(extra);
        }
        let copy = pkt.faults.duplicate.map(|d| {
            let mut data = self.pool.pop().unwrap_or_default();
            data.clear();
            data.extend_from_slice(&pkt.data);
            (d, Pkt { data, ..pkt })
        });
        let corrupt = pkt.faults.corrupt;
        self.push(at, What::Deliver { pkt, corrupt: corrupt[0] });
        if let Some((d, copy)) = copy {
            self.stats.duplicated += 1;
            self.push(at + Duration::from_nanos(d), What::Deliver { pkt: copy, corrupt: corrupt[1] });
        }
    }

    fn on_deliver(&mut self, mut pkt: Pkt, corrupt: Option<u64>) {
        let (src, dst, class) = (pkt.src, pkt.dst, pkt.class);
        if self.hosts[dst as usize].silent || self.hosts[src as usize].silent {
            self.stats.silent_drops += 1;
            self.emit(TraceEvent::DroppedSilent, src, dst, class, &pkt.data);
            self.recycle(pkt.data);
            return;
        }
        let bits = pkt.data.len() as u64 * 8;
        match corrupt {
            Some(raw) if bits > 0 => {
                let bit = raw % bits;
                pkt.data[(bit / 8) as usize] ^= 1 << (bit % 8);
                self.stats.corrupted += 1;
                self.emit(TraceEvent::DeliveredCorrupt, src, dst, class, &pkt.data);
            }
            _ => {
                if let Some(key) = data_key(&pkt.data) {
                    self.log.record(dst, key, self.now);
                }
                self.emit(TraceEvent::Delivered, src, dst, class, &pkt.data);
            }
        }
        self.stats.delivered[class.index()] += 1;
        self.stats.delivered_bytes += pkt.data.len() as u64;
        self.hosts[dst as usize].spins = 0;
        self.nodes[dst as usize].handle_datagram(self.now, &pkt.data);
        self.recycle(pkt.data);
        self.service(dst);
    }
}

/// The chunk a DATA datagram carries, read without verifying the MAC.
fn data_key(datagram: &[u8]) -> Option<ChunkKey> {
    let p = wire::Packet::new_checked(datagram).ok()?;
    if p.raw_type() != PacketType::Data as u8 {
        return None;
    }
    let phase = Phase::from_u8(p.raw_phase()).ok()?;
    Some(ChunkKey { op: p.op(), tensor: p.tensor(), phase, src: p.src(), chunk: p.chunk_index() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cls(c: u8) -> Class {
        Class::new(c).unwrap()
    }

    #[test]
    fn prio_queue_serves_highest_class_fifo() {
        let mut q = PrioQueue::new();
        for (c, v) in [(1, 'a'), (5, 'b'), (1, 'c'), (5, 'd'), (3, 'e')] {
            assert_eq!(q.push(cls(c), v, 10), Admit::Queued);
        }
        let order: Vec<char> = core::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ['b', 'd', 'e', 'a', 'c']);
        assert_eq!(q.len, 0);
    }

    #[test]
    fn prio_queue_pushes_out_newest_of_lowest_class() {
        let mut q = PrioQueue::new();
        for (c, v) in [(2, 'a'), (1, 'b'), (1, 'c'), (4, 'd')] {
            assert_eq!(q.push(cls(c), v, 4), Admit::Queued);
        }
        // Full: a class-3 arrival evicts the most recent class-1 packet.
        assert_eq!(q.push(cls(3), 'e', 4), Admit::PushedOut(cls(1), 'c'));
        assert_eq!(q.push(cls(3), 'f', 4), Admit::PushedOut(cls(1), 'b'));
        assert_eq!(q.push(cls(3), 'g', 4), Admit::PushedOut(cls(2), 'a'));
        // Nothing lower than 3 is left: same class or lower is rejected.
        assert_eq!(q.push(cls(3), 'h', 4), Admit::Rejected('h'));
        assert_eq!(q.push(cls(0), 'i', 4), Admit::Rejected('i'));
        assert_eq!(q.push(cls(7), 'j', 4), Admit::PushedOut(cls(3), 'g'));
        let order: Vec<char> = core::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ['j', 'd', 'e', 'f']);
    }

    #[test]
    fn prio_queue_zero_capacity_rejects() {
        let mut q = PrioQueue::new();
        assert_eq!(q.push(cls(6), 1, 0), Admit::Rejected(1));
    }

    #[test]
    fn serialization_is_exact_and_rounds_up() {
        let c = NetConfig::default();
        // 1208 + 42 = 1250 bytes = 10_000 bits = 1 µs at 10 Gbit/s.
        assert_eq!(c.serialization(1208, 10_000_000_000), Duration::from_nanos(1000));
        assert_eq!(c.serialization(1208, 5_000_000_000), Duration::from_nanos(2000));
        // 43 bytes = 344 bits = 34.4 ns → 35.
        assert_eq!(c.serialization(1, 10_000_000_000), Duration::from_nanos(35));
    }

    #[test]
    fn events_order_by_time_then_kind_then_seq() {
        let mk = |at, what: What, seq| Event { at: Instant::from_nanos(at), kind: what.kind(), seq, slot: 0 };
        let mut h = BinaryHeap::new();
        h.push(mk(5, What::Timer { rank: 0, generation: 0 }, 1));
        h.push(mk(5, What::Wake(0), 2));
        h.push(mk(5, What::UplinkFree(0), 3));
        h.push(mk(4, What::Wake(1), 4));
        h.push(mk(5, What::UplinkFree(1), 5));
        h.push(mk(5, What::PortDone(0), 6));
        let got: Vec<(u64, u8, u64)> =
            core::iter::from_fn(|| h.pop()).map(|e| (e.at.as_nanos(), e.kind, e.seq)).collect();
        assert_eq!(got, [(4, 5, 4), (5, 0, 6), (5, 3, 3), (5, 3, 5), (5, 4, 1), (5, 5, 2)]);
    }
}
