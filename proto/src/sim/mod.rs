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
//! - **Paths.** With [`NetConfig::paths`], every datagram goes on the path its
//!   sender named ([`Transmit::path`]) between its uplink and the switch
//!   (a spine of a leaf–spine fabric): lost with the path's probability
//!   (drawn from a stream of its own, so the other faults do not shift),
//!   serialized at the path's rate in one FIFO shared by every sender —
//!   dropped if [`PathConfig::queue_packets`] are already waiting there
//!   (drop-tail, counted in [`PathStats::dropped`]) — and delayed by the
//!   path's delay. Paths of different delays reorder a sender's datagrams.
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

use std::collections::BinaryHeap;
use std::fmt;

use crate::class::Class;
use crate::endpoint::{Endpoint, Transmit};
use crate::rng::Rng;
use crate::time::{Duration, Instant};

mod net;
mod observe;
mod switch;

use net::nanos;
pub use net::{NetConfig, PathConfig};
use observe::data_key;
pub use observe::{
    ChunkKey, DeliveryLog, DropFn, NetStats, PathStats, PerClass, PortStats, TraceEvent, TraceFn, TraceRecord,
};
use switch::{Admit, PrioQueue};

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
    /// Whether deliveries go into `log` ([`Sim::set_delivery_log`]).
    logging: bool,
    stats: NetStats,
    trace: Option<TraceFn>,
    drop: Option<DropFn>,
    /// Per path: when it is free to serialize the next datagram.
    path_free: Vec<Instant>,
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
            logging: true,
            stats: NetStats {
                ports: vec![PortStats::default(); n],
                paths: vec![PathStats::default(); config.paths.len()],
                ..NetStats::default()
            },
            trace: None,
            drop: None,
            path_free: vec![Instant::ZERO; config.paths.len()],
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

    /// Record DATA deliveries in the [`DeliveryLog`] (`true`, the default)
    /// or not: a caller that never reads the log saves a map insertion per
    /// delivered chunk and the log's memory (an entry per chunk per
    /// destination, growing for the whole run). Nothing else changes.
    pub fn set_delivery_log(&mut self, on: bool) {
        self.logging = on;
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
        let Some(at) = self.on_path(rank, n, tx, now + ser + self.cfg.prop_delay) else {
            self.stats.lost[c] += 1;
            self.emit(TraceEvent::Lost, rank, tx.dst, tx.class, &data);
            self.recycle(data);
            return;
        };
        let pkt = Pkt { src: rank, dst: tx.dst, class: tx.class, data, faults };
        self.push(at, What::Arrive(pkt));
    }

    /// Datagram `n` of `rank` (`tx`) enters its path at `at`: when it reaches
    /// the switch, or `None` if the path loses it (see the module docs).
    fn on_path(&mut self, rank: u32, n: u64, tx: Transmit, at: Instant) -> Option<Instant> {
        if self.cfg.paths.is_empty() {
            return Some(at);
        }
        let i = usize::from(tx.path) % self.cfg.paths.len();
        let path = &self.cfg.paths[i];
        let c = tx.class.index();
        self.stats.paths[i].offered[c] += 1;
        let mut rng = Rng::stream(self.cfg.seed ^ 0x9A7B_5EED, u64::from(rank), n);
        if rng.chance(path.loss) {
            self.stats.paths[i].lost[c] += 1;
            return None;
        }
        let done = if path.rate_bps == 0 {
            at
        } else {
            let ser = self.cfg.serialization(tx.len, path.rate_bps);
            let waiting = self.path_free[i].saturating_duration_since(at);
            // Drop-tail: the backlog ahead, in this datagram's own
            // serialization times, is the packets waiting (datagrams of one
            // peer pair are of one size but the last of a transfer).
            if path.queue_packets > 0 && waiting > ser * path.queue_packets as u32 {
                self.stats.paths[i].dropped[c] += 1;
                return None;
            }
            at.max(self.path_free[i]) + ser
        };
        self.path_free[i] = self.path_free[i].max(done);
        Some(done + path.delay)
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
                if self.logging
                    && let Some(key) = data_key(&pkt.data)
                {
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

#[cfg(test)]
mod tests {
    use super::*;

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
