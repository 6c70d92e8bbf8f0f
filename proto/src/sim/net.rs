//! The simulated network's parameters ([`NetConfig`]).

use std::collections::BTreeMap;

use crate::time::Duration;
use crate::wire;

/// One of several paths between the nodes and the switch (think of a spine
/// of a leaf–spine fabric): every datagram goes on the path its sender named
/// ([`Transmit::path`](crate::endpoint::Transmit::path)), after its uplink
/// and before the switch.
#[derive(Debug, Clone, PartialEq)]
pub struct PathConfig {
    /// Probability that a datagram on this path is lost.
    pub loss: f64,
    /// Extra one-way delay of the path.
    pub delay: Duration,
    /// Rate of the path, bits/s, shared by every sender in FIFO order
    /// (0: no limit of its own).
    pub rate_bps: u64,
    /// With a rate: the most datagrams its FIFO holds waiting; one that
    /// arrives to a full queue is dropped (drop-tail, as a switch port's
    /// pfifo). 0: no limit (the queue only delays).
    pub queue_packets: usize,
}

impl PathConfig {
    /// A path that loses nothing, adds no delay and has no rate limit.
    pub fn clean() -> PathConfig {
        PathConfig { loss: 0.0, delay: Duration::ZERO, rate_bps: 0, queue_packets: 0 }
    }
}

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
    /// Size of the buffer handed to [`Node::poll_transmit`](crate::sim::Node::poll_transmit).
    pub max_datagram: usize,
    /// How many times in a row a node may get `handle_timeout` at the same instant
    /// without sending or receiving before the simulator panics.
    pub max_timer_spins: u32,
    /// Paths between the nodes and the switch (empty: one path with no
    /// behaviour of its own). A datagram on path `i` takes `paths[i % len]`.
    pub paths: Vec<PathConfig>,
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
            paths: Vec::new(),
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

    /// Set the paths between the nodes and the switch.
    pub fn with_paths(mut self, paths: Vec<PathConfig>) -> Self {
        self.paths = paths;
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

    pub(super) fn validate(&self) {
        for (name, p) in [
            ("loss", self.loss),
            ("reorder", self.reorder),
            ("duplicate", self.duplicate),
            ("corrupt", self.corrupt),
        ] {
            assert!((0.0..=1.0).contains(&p), "NetConfig::{name} = {p} is not a probability in [0, 1]");
        }
        assert!(self.link_rate_bps > 0, "NetConfig::link_rate_bps must be positive");
        for (i, p) in self.paths.iter().enumerate() {
            assert!(
                (0.0..=1.0).contains(&p.loss),
                "NetConfig::paths[{i}].loss = {} is not a probability",
                p.loss
            );
        }
        for (rank, &bps) in &self.port_rates_bps {
            assert!(bps > 0, "NetConfig::port_rates_bps[{rank}] must be positive");
        }
    }
}

pub(super) fn ser_nanos(bytes: usize, bps: u64) -> u64 {
    let bits = bytes as u128 * 8 * 1_000_000_000;
    let ns = bits.div_ceil(u128::from(bps));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialization_is_exact_and_rounds_up() {
        let c = NetConfig::default();
        // 1208 + 42 = 1250 bytes = 10_000 bits = 1 µs at 10 Gbit/s.
        assert_eq!(c.serialization(1208, 10_000_000_000), Duration::from_nanos(1000));
        assert_eq!(c.serialization(1208, 5_000_000_000), Duration::from_nanos(2000));
        // 43 bytes = 344 bits = 34.4 ns → 35.
        assert_eq!(c.serialization(1, 10_000_000_000), Duration::from_nanos(35));
    }
}
