//! What the simulator lets a test observe: the [`DeliveryLog`] of DATA
//! chunks, the network counters ([`NetStats`]), and datagram events for
//! trace and targeted-loss hooks ([`TraceRecord`]).

use std::collections::BTreeMap;

use crate::class::Class;
use crate::time::Instant;
use crate::wire::{self, PacketType, Phase};

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
    pub(super) fn new(nodes: usize) -> DeliveryLog {
        DeliveryLog { per_dst: vec![BTreeMap::new(); nodes] }
    }

    pub(super) fn record(&mut self, dst: u32, key: ChunkKey, now: Instant) {
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

/// Counters of one path ([`NetConfig::paths`](crate::sim::NetConfig::paths)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Datagrams handed over on this path, per class.
    pub offered: PerClass,
    /// Datagrams the path lost at random ([`PathConfig::loss`](crate::sim::PathConfig::loss)), per class.
    pub lost: PerClass,
    /// Datagrams dropped because the path's queue was full
    /// ([`PathConfig::queue_packets`](crate::sim::PathConfig::queue_packets)), per class.
    pub dropped: PerClass,
}

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
    /// Per path, when the network has paths ([`NetConfig::paths`](crate::sim::NetConfig::paths)).
    pub paths: Vec<PathStats>,
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

/// One datagram event, as seen by a trace hook ([`Sim::set_trace`](crate::sim::Sim::set_trace)).
#[derive(Debug, Clone, Copy)]
pub struct TraceRecord<'a> {
    /// Virtual time of the event.
    pub time: Instant,
    /// What happened.
    pub event: TraceEvent,
    /// Sending rank.
    pub src: u32,
    /// Destination rank (as given in the [`Transmit`](crate::endpoint::Transmit)).
    pub dst: u32,
    /// Priority class.
    pub class: Class,
    /// The datagram bytes.
    pub datagram: &'a [u8],
}

/// A trace hook.
pub type TraceFn = Box<dyn FnMut(&TraceRecord<'_>)>;

/// A targeted-loss hook ([`Sim::set_drop`](crate::sim::Sim::set_drop)): sees every datagram as it leaves
/// its sender (event [`TraceEvent::Sent`]) and returns true to lose it, in
/// addition to the random `loss` fault. For tests that must lose one
/// particular packet (a PROBE, a DONE) rather than a random one.
pub type DropFn = Box<dyn FnMut(&TraceRecord<'_>) -> bool>;

/// The chunk a DATA datagram carries, read without verifying the MAC.
pub(super) fn data_key(datagram: &[u8]) -> Option<ChunkKey> {
    let p = wire::Packet::new_checked(datagram).ok()?;
    if p.raw_type() != PacketType::Data as u8 {
        return None;
    }
    let phase = Phase::from_u8(p.raw_phase()).ok()?;
    Some(ChunkKey { op: p.op(), tensor: p.tensor(), phase, src: p.src(), chunk: p.chunk_index() })
}
