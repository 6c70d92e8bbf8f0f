//! The sections of the configuration file, their fields and their defaults.
//!
//! Every struct here is one TOML table. All of them reject unknown keys
//! (`deny_unknown_fields`) and every field except `[node]`'s identity and the
//! `[[peers]]` list has a default, so a file holding only `[node]` and
//! `[[peers]]` is a complete configuration. The defaults are the `DEFAULT_*`
//! constants and the `Default` impls below; `deploy/dlcp.toml` documents them
//! for operators.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use dlcp_proto::class::{Class, ClassSet};
use dlcp_proto::priority::ClassifierConfig;
use dlcp_proto::wire::PPM;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

// ---------------------------------------------------------------------------
// Limits and defaults
// ---------------------------------------------------------------------------

pub use crate::budget::MAX_BUDGET;
/// Default `loss.budget`: 1 % of a transfer's packets may be given up.
pub const DEFAULT_BUDGET: f64 = 0.01;
/// Minimum length of the job secret, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;
/// Maximum size of a `job_secret_file` that is read.
pub const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;
/// Default `network.mtu`.
pub const DEFAULT_MTU: u32 = 1500;
/// IPv4 (20) + UDP (8) header bytes.
pub const IPV4_UDP_OVERHEAD: u32 = 28;
/// IPv6 (40) + UDP (8) header bytes.
pub const IPV6_UDP_OVERHEAD: u32 = 48;
/// dlcp header plus authentication tag, per DATA packet.
pub const DLCP_OVERHEAD: u32 = dlcp_proto::wire::OVERHEAD as u32;
/// Smallest `network.chunk_bytes` accepted.
pub const MIN_CHUNK_BYTES: u32 = 64;
/// Default control socket path.
pub const DEFAULT_SOCKET_PATH: &str = "/run/dlcp/dlcpd.sock";
/// Default metrics (Prometheus text) listen address.
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9464";
/// Default class → DSCP map (see [`Priority::dscp`]).
pub const DEFAULT_DSCP: [u8; 8] = [10, 10, 18, 26, 34, 40, 46, 48];
/// Default class → `SO_PRIORITY` map (see [`Priority::so_priority`]).
pub const DEFAULT_SO_PRIORITY: [u8; 8] = [0, 1, 2, 3, 4, 5, 5, 6];

/// The payload size of a DATA packet that fills an MTU-sized IP packet:
/// `mtu − IP/UDP headers − dlcp header and tag`, rounded down to a multiple of 4
/// (so an `f32` never straddles two packets). Zero if the MTU is too small.
pub fn default_chunk_bytes(mtu: u32, ipv6: bool) -> u32 {
    max_chunk_bytes(mtu, ipv6) & !3
}

/// The largest payload a DATA packet can carry within `mtu` (not rounded), capped
/// at the wire format's 16-bit payload length.
pub fn max_chunk_bytes(mtu: u32, ipv6: bool) -> u32 {
    let ip = if ipv6 { IPV6_UDP_OVERHEAD } else { IPV4_UDP_OVERHEAD };
    mtu.saturating_sub(ip + DLCP_OVERHEAD).min(dlcp_proto::wire::MAX_PAYLOAD as u32)
}

// ---------------------------------------------------------------------------
// [node]
// ---------------------------------------------------------------------------

/// `[node]`: who this daemon is. Restart-only.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// This daemon's rank; must be one of the `[[peers]]` ranks. Required.
    pub rank: u32,
    /// Job identifier carried in every packet; packets of other jobs are dropped. Required.
    pub job_id: u32,
    /// The per-job MAC secret inline (its UTF-8 bytes, at least 16). Exactly one of
    /// `job_secret` and `job_secret_file` must be set. A configuration file holding
    /// it must be readable by its owner alone (mode 0600 or 0400), or `Config::load`
    /// refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_secret: Option<Secret>,
    /// A file holding the per-job MAC secret, used byte for byte (a trailing newline
    /// is part of the secret). Relative paths are relative to the config file's
    /// directory. Like ssh with its keys, a file that its group or others may
    /// access (any of the mode bits 0077) is refused: keep it 0600 or 0400.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_secret_file: Option<PathBuf>,
    /// Generation announced to peers, for people (logs, `dlcpctl status`):
    /// peers do not order incarnations by it (each start draws a random
    /// session, verified by a HELLO challenge); `"auto"` (default) derives
    /// one from the clock at every start.
    #[serde(default)]
    pub generation: Generation,
}

/// The job secret. Its `Debug` output and its serialization never show the bytes.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// A secret from raw bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }

    /// The secret bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True if the secret is empty (never the case in a loaded config).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What a redacted secret looks like in `Config::to_toml_string` output.
pub const REDACTED: &str = "<redacted>";

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes redacted>)", self.0.len())
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(REDACTED)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| Secret(s.into_bytes()))
    }
}

/// `node.generation`: `"auto"` or a fixed number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Generation {
    /// Derived by the daemon at every start (so a restarted daemon is told apart
    /// from its previous incarnation).
    #[default]
    Auto,
    /// A fixed generation, 1 ..= 4294967295 (0 is reserved for "unknown").
    Fixed(u32),
}

impl Serialize for Generation {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Generation::Auto => s.serialize_str("auto"),
            Generation::Fixed(g) => s.serialize_u32(*g),
        }
    }
}

const GENERATION_ALLOWED: &str = "allowed: \"auto\" or an integer 1 ..= 4294967295";

impl<'de> Deserialize<'de> for Generation {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Generation;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"auto\" or an integer 1 ..= 4294967295")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Generation, E> {
                if v == "auto" {
                    Ok(Generation::Auto)
                } else {
                    Err(E::custom(format_args!("invalid value {v:?} ({GENERATION_ALLOWED})")))
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Generation, E> {
                match u32::try_from(v) {
                    Ok(g) if g > 0 => Ok(Generation::Fixed(g)),
                    _ => Err(E::custom(format_args!("invalid value {v} ({GENERATION_ALLOWED})"))),
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Generation, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(-1))
            }
        }
        d.deserialize_any(V)
    }
}

// ---------------------------------------------------------------------------
// [[peers]]
// ---------------------------------------------------------------------------

/// One `[[peers]]` entry: a daemon of the job. Restart-only.
///
/// The ranks of all entries must be exactly `0 .. N`, where N (the world size)
/// is the number of entries. After loading, `Config::peers` is sorted by rank, so
/// `peers[r]` is rank `r`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    /// The peer's rank.
    pub rank: u32,
    /// The peer's IP address: an IPv4 or IPv6 literal (all peers in one family).
    #[serde(deserialize_with = "de_ip")]
    pub address: IpAddr,
    /// The peer's UDP port (1 ..= 65535).
    pub port: u16,
}

impl Peer {
    /// The peer's UDP endpoint.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }
}

// ---------------------------------------------------------------------------
// [network]
// ---------------------------------------------------------------------------

/// `[network]`: addressing and packet sizes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Network {
    /// Local address to bind (the port is this node's `[[peers]]` port). Default:
    /// this node's `[[peers]]` address; after loading it is always set. Restart-only.
    #[serde(deserialize_with = "de_opt_ip", skip_serializing_if = "Option::is_none")]
    pub bind_address: Option<IpAddr>,
    /// IP MTU of the path between hosts, in bytes (576 ..= 65535; IPv6 needs
    /// ≥ 1280). Default 1500. Restart-only.
    pub mtu: u32,
    /// Payload bytes per DATA packet. Default: derived from the MTU, see
    /// [`default_chunk_bytes`] (1372 for IPv4 at MTU 1500); after loading it is
    /// always set. Must be a multiple of 4 and fit the MTU. Restart-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunk_bytes: Option<u32>,
    /// Interval between HELLO/heartbeat packets to every peer, ms. Default 100. Runtime.
    pub heartbeat_interval_ms: u32,
    /// A peer silent this long is declared down, ms (≥ 2 × heartbeat interval).
    /// Default 3000. Runtime.
    pub peer_timeout_ms: u32,
    /// Receiver-driven flow control: bytes of DATA datagrams this daemon lets
    /// all senders have in flight towards it (shared evenly among them; a
    /// sender waits for the receiver's GRANT beyond its share). 0 turns flow
    /// control off; otherwise 65536 ..= 1 GiB, and at most half of
    /// `datapath.socket.recv_buffer_bytes` × 2 (what the kernel lets the
    /// socket hold) is sensible. Must be the same on every daemon of the job
    /// (announced in HELLO). Default 2097152 (2 MiB). Restart-only.
    pub flow_window_bytes: u64,
    /// Paths per peer pair (1 ..= 256): this daemon sends from the UDP source
    /// ports `port .. port + paths` of its `[[peers]]` entry (one socket set
    /// each; the DPDK datapath writes the port into the header), so ECMP
    /// switches spread a peer pair's datagrams over up to that many paths,
    /// and it accepts datagrams of every configured peer from that peer's
    /// range (the same `paths` on every daemon). The endpoint picks a path per
    /// datagram by path health (`dlcp_proto::paths`). 1: today's single
    /// 5-tuple. Ranges of peers on one address must not overlap. Default 16.
    /// Restart-only.
    pub paths: u16,
}

/// Default of [`Network::paths`].
pub const DEFAULT_PATHS: u16 = 16;

impl Default for Network {
    fn default() -> Self {
        Network {
            bind_address: None,
            mtu: DEFAULT_MTU,
            chunk_bytes: None,
            heartbeat_interval_ms: 100,
            peer_timeout_ms: 3000,
            flow_window_bytes: dlcp_proto::flow::FlowConfig::DEFAULT_WINDOW_BYTES,
            paths: DEFAULT_PATHS,
        }
    }
}

impl Network {
    /// Heartbeat interval.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms.into())
    }

    /// Peer timeout.
    pub fn peer_timeout(&self) -> Duration {
        Duration::from_millis(self.peer_timeout_ms.into())
    }

    /// The flow-control configuration for datagrams of `chunk_bytes` of payload.
    pub fn flow(&self, chunk_bytes: u32) -> dlcp_proto::flow::FlowConfig {
        if self.flow_window_bytes == 0 {
            return dlcp_proto::flow::FlowConfig::OFF;
        }
        dlcp_proto::flow::FlowConfig::for_window_bytes(self.flow_window_bytes, chunk_bytes as usize)
    }
}

// ---------------------------------------------------------------------------
// [datapath]
// ---------------------------------------------------------------------------

/// `[datapath]`: how packets reach the wire. Restart-only.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Datapath {
    /// Which datapath to use. Default `auto`.
    pub kind: DatapathKind,
    /// Settings of the socket datapath.
    pub socket: SocketDatapath,
    /// Settings of the DPDK datapath.
    pub dpdk: DpdkDatapath,
}

/// `datapath.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DatapathKind {
    /// DPDK if the daemon was built with it and the EAL initializes, else sockets.
    #[default]
    Auto,
    /// Kernel UDP sockets (`sendmmsg`/`recvmmsg`, optionally UDP GSO).
    Socket,
    /// DPDK poll-mode driver; failure to initialize is an error.
    Dpdk,
}

/// `[datapath.socket]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SocketDatapath {
    /// Use UDP GSO (`UDP_SEGMENT`) when the kernel supports it. Default true.
    pub gso: bool,
    /// At most this many segments per GSO send (one class per super-packet, so
    /// this bounds how long a low class can sit ahead of a high one), 1 ..= 64.
    /// Default 16.
    pub gso_max_segments: u32,
    /// Datagrams per `sendmmsg`/`recvmmsg` call, 1 ..= 1024. Default 32.
    pub batch: u32,
    /// `SO_SNDBUF` in bytes; 0 keeps the kernel default. Default 4 MiB.
    pub send_buffer_bytes: u32,
    /// `SO_RCVBUF` in bytes; 0 keeps the kernel default. Default 4 MiB.
    pub recv_buffer_bytes: u32,
}

impl Default for SocketDatapath {
    fn default() -> Self {
        SocketDatapath {
            gso: true,
            gso_max_segments: 16,
            batch: 32,
            send_buffer_bytes: 4 << 20,
            recv_buffer_bytes: 4 << 20,
        }
    }
}

/// `[datapath.dpdk]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DpdkDatapath {
    /// Extra EAL arguments (e.g. `["-l", "2", "--no-huge"]`). Default `[]`: no
    /// development-mode flags are implied.
    pub eal_args: Vec<String>,
    /// DPDK port id. Default 0.
    pub port_id: u16,
    /// RX queues, 1 ..= 64. Default 1.
    pub rx_queues: u16,
    /// TX queues, 1 ..= 64. Default 1.
    pub tx_queues: u16,
    /// Packets per `rte_eth_rx_burst`, 1 ..= 512 and ≤ `rx_ring_size`. Default 32.
    pub rx_burst: u16,
    /// Packets per `rte_eth_tx_burst`, 1 ..= 512 and ≤ `tx_ring_size`. Default 32.
    pub tx_burst: u16,
    /// RX descriptors per queue, a power of two in 64 ..= 32768. Default 1024.
    pub rx_ring_size: u32,
    /// TX descriptors per queue, a power of two in 64 ..= 32768. Default 1024.
    pub tx_ring_size: u32,
    /// Mbufs in the pool; at least all ring descriptors plus one burst per queue.
    /// Default 8191 (2^n − 1 is the mempool's sweet spot).
    pub mbuf_pool_size: u32,
    /// TX queue of each class (index = class), each < `tx_queues`. Default all 0.
    pub class_tx_queue: [u16; 8],
    /// Static neighbour entries `"IPv4 MAC"` (e.g. `"10.0.0.2 02:00:00:00:00:02"`):
    /// these peers need no ARP. Default `[]`: dlcp resolves every peer by ARP.
    pub neighbours: Vec<String>,
}

impl DpdkDatapath {
    /// Parse one `neighbours` entry `"IPv4 MAC"`; `None` if malformed.
    pub fn parse_neighbour(s: &str) -> Option<(std::net::Ipv4Addr, [u8; 6])> {
        let mut w = s.split_whitespace();
        let (ip, mac) = (w.next()?, w.next()?);
        if w.next().is_some() {
            return None;
        }
        let ip = ip.parse().ok()?;
        let mut out = [0u8; 6];
        let mut parts = mac.split([':', '-']);
        for b in &mut out {
            let p = parts.next()?;
            if p.len() != 2 {
                return None;
            }
            *b = u8::from_str_radix(p, 16).ok()?;
        }
        parts.next().is_none().then_some((ip, out))
    }
}

impl Default for DpdkDatapath {
    fn default() -> Self {
        DpdkDatapath {
            eal_args: Vec::new(),
            port_id: 0,
            rx_queues: 1,
            tx_queues: 1,
            rx_burst: 32,
            tx_burst: 32,
            rx_ring_size: 1024,
            tx_ring_size: 1024,
            mbuf_pool_size: 8191,
            class_tx_queue: [0; 8],
            neighbours: Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------
// [priority]
// ---------------------------------------------------------------------------

/// `[priority]`: the classifier and the class → network marking tables. Runtime.
///
/// See `dlcp_proto::priority` for the classification rules.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Priority {
    /// Classes `[lo, hi]` of reduce-scatter chunks. Default `[0, 3]`.
    pub scatter_band: [u8; 2],
    /// Classes `[lo, hi]` of all-gather chunks; wholly above `scatter_band` and
    /// at most 6 (7 is control). Default `[4, 6]`.
    pub gather_band: [u8; 2],
    /// Levels layer position is cut into, 1 ..= 64. Default 2 (front half /
    /// back half). Layers are compared by level, not by raw index: within one
    /// level, chunk magnitude decides; set it to at least the model's layer
    /// count for strict layer order.
    pub layer_levels: u8,
    /// Levels chunk magnitude rank is cut into, 1 ..= 64 (1 ignores magnitude).
    /// Default 2 (larger half / smaller half).
    pub magnitude_levels: u8,
    /// Classes whose chunks may count against the loss budget (0 ..= 6, no
    /// duplicates). Default `[0, 1, 2, 3, 4]`.
    pub droppable: Vec<u8>,
    /// DSCP (0 ..= 63) of each class, index = class. Default
    /// `[10, 10, 18, 26, 34, 40, 46, 48]`: AF11 (classes 0 and 1), AF21, AF31,
    /// AF41, CS5, EF for data, CS6 (network control) for class 7. No class is
    /// marked CS0, best effort's DSCP: gradient data the loss budget cannot give
    /// up would wait there on other traffic's drops (classes 0 and 1 share a
    /// switch queue instead; the budget still gives up class 0 first). The IP
    /// precedence (top three bits) never falls as the class rises, so switches
    /// that queue by precedence keep the order. Not required to be ascending.
    pub dscp: [u8; 8],
    /// Linux `SO_PRIORITY` of each class, 0 ..= 15. Default `[0, 1, 2, 3, 4, 5, 5, 6]`.
    /// Values above 6 need `CAP_NET_ADMIN` (the daemon fails to set them without
    /// it); the defaults stay within 0 ..= 6.
    pub so_priority: [u8; 8],
}

impl Default for Priority {
    fn default() -> Self {
        let c = ClassifierConfig::default();
        Priority {
            scatter_band: [c.scatter_band.0, c.scatter_band.1],
            gather_band: [c.gather_band.0, c.gather_band.1],
            layer_levels: c.layer_levels,
            magnitude_levels: c.magnitude_levels,
            droppable: Class::all().filter(|&k| c.droppable.contains(k)).map(Class::get).collect(),
            dscp: DEFAULT_DSCP,
            so_priority: DEFAULT_SO_PRIORITY,
        }
    }
}

impl Priority {
    /// The classifier parameters.
    pub fn classifier(&self) -> ClassifierConfig {
        ClassifierConfig {
            scatter_band: (self.scatter_band[0], self.scatter_band[1]),
            gather_band: (self.gather_band[0], self.gather_band[1]),
            layer_levels: self.layer_levels,
            magnitude_levels: self.magnitude_levels,
            droppable: self.droppable_set(),
        }
    }

    /// The droppable classes as a set.
    pub fn droppable_set(&self) -> ClassSet {
        ClassSet::from_classes(self.droppable.iter().filter_map(|&c| Class::new(c)))
    }

    /// DSCP of a class.
    pub fn dscp_of(&self, class: Class) -> u8 {
        self.dscp[class.index()]
    }

    /// `SO_PRIORITY` of a class.
    pub fn so_priority_of(&self, class: Class) -> u8 {
        self.so_priority[class.index()]
    }
}

// ---------------------------------------------------------------------------
// [loss]
// ---------------------------------------------------------------------------

/// `[loss]`: the bounded-loss contract. Runtime.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Loss {
    /// Fraction of a reduce-scatter transfer's packets that may be given up
    /// (only droppable classes count), 0.0 ..= 0.10. 0 means reliable and
    /// bit-exact. Default 0.01. In the file also a percentage string (`"1%"`).
    #[serde(deserialize_with = "crate::budget::de_budget")]
    pub budget: f64,
    /// Budget of the all-gather phase, 0.0 ..= `budget`. Default 0.0 (repaired in
    /// full); above 0, all ranks apply one agreed loss mask. In the file also a
    /// percentage string.
    #[serde(deserialize_with = "crate::budget::de_budget")]
    pub gather_budget: f64,
    /// What replaces a lost chunk. Default `zero`.
    pub fill: Fill,
    /// Rescale each element by (contributors / delivered) to keep the sum
    /// unbiased. Default false.
    pub rescale: bool,
    /// Lower bound of the adaptive per-transfer deadline, ms (≥ 1). Default 1.
    pub deadline_min_ms: u32,
    /// Upper bound of the adaptive deadline, ms (≥ `deadline_min_ms`). Default 250.
    pub deadline_max_ms: u32,
    /// A peer silent this long within an op fails the op (an error to the
    /// trainer, never a hang), ms (≥ `deadline_max_ms` and ≥ `probe_timeout_max_ms`).
    /// A peer that is up, took part in earlier ops of the run and has not
    /// started this one (its trainer late) is waited for instead, until
    /// `op_deadline_ms` (when that is 0, the hard timeout applies to it too).
    /// Default 10000.
    pub hard_timeout_ms: u32,
    /// An op still unfinished this long after it started fails, however it is
    /// progressing (a peer that trickles data cannot hold it forever), ms: 0
    /// (none) or `hard_timeout_ms` ..= 86400000. Default 120000.
    pub op_deadline_ms: u32,
    /// Lower bound of the probe (repair request) timeout, ms (≥ 1). Default 1.
    pub probe_timeout_min_ms: u32,
    /// Upper bound of the probe timeout, ms (≥ `probe_timeout_min_ms`). Default 200.
    pub probe_timeout_max_ms: u32,
    /// Initial per-chunk time estimate of the deadline estimator, µs
    /// (1 ..= 1000000). Default 10.
    pub initial_per_chunk_us: u32,
    /// How long a receiver holds the acknowledgement of an all-gather it
    /// received whole, to send one ACK per owner for every op completed
    /// meanwhile (wire version 10), ms (0 ..= 1000; 0 acknowledges each
    /// op at once). Default 25.
    pub ack_delay_ms: u32,
}

impl Default for Loss {
    fn default() -> Self {
        Loss {
            budget: DEFAULT_BUDGET,
            gather_budget: 0.0,
            fill: Fill::Zero,
            rescale: false,
            deadline_min_ms: 1,
            deadline_max_ms: 250,
            hard_timeout_ms: 10_000,
            op_deadline_ms: 120_000,
            probe_timeout_min_ms: 1,
            probe_timeout_max_ms: 200,
            initial_per_chunk_us: 10,
            ack_delay_ms: 25,
        }
    }
}

/// A fraction as parts per million, rounded to nearest and clamped to `0..=PPM`.
pub fn fraction_to_ppm(f: f64) -> u32 {
    if f.is_nan() {
        return 0;
    }
    (f.clamp(0.0, 1.0) * f64::from(PPM)).round() as u32
}

impl Loss {
    /// `budget` in parts per million (as carried on the wire).
    pub fn budget_ppm(&self) -> u32 {
        fraction_to_ppm(self.budget)
    }

    /// `gather_budget` in parts per million.
    pub fn gather_budget_ppm(&self) -> u32 {
        fraction_to_ppm(self.gather_budget)
    }

    /// Deadline lower bound.
    pub fn deadline_min(&self) -> Duration {
        Duration::from_millis(self.deadline_min_ms.into())
    }

    /// Deadline upper bound.
    pub fn deadline_max(&self) -> Duration {
        Duration::from_millis(self.deadline_max_ms.into())
    }

    /// Hard timeout.
    pub fn hard_timeout(&self) -> Duration {
        Duration::from_millis(self.hard_timeout_ms.into())
    }

    /// The absolute op deadline (zero: none).
    pub fn op_deadline(&self) -> Duration {
        Duration::from_millis(self.op_deadline_ms.into())
    }

    /// Probe timeout lower bound.
    pub fn probe_timeout_min(&self) -> Duration {
        Duration::from_millis(self.probe_timeout_min_ms.into())
    }

    /// Probe timeout upper bound.
    pub fn probe_timeout_max(&self) -> Duration {
        Duration::from_millis(self.probe_timeout_max_ms.into())
    }

    /// Initial per-chunk estimate.
    pub fn initial_per_chunk(&self) -> Duration {
        Duration::from_micros(self.initial_per_chunk_us.into())
    }

    /// The ACK delay.
    pub fn ack_delay(&self) -> Duration {
        Duration::from_millis(self.ack_delay_ms.into())
    }
}

/// `loss.fill`: the value of a chunk that was given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Fill {
    /// Missing contributions count as zero.
    #[default]
    Zero,
    /// Keep this rank's local value for the missing elements.
    Local,
}

// ---------------------------------------------------------------------------
// [pacing]
// ---------------------------------------------------------------------------

/// `[pacing]`: token-bucket pacing of this daemon's sends. Runtime.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Pacing {
    /// Send rate in Mbit/s (10^6 bit/s, IP bytes), 0 ..= 1000000; 0 = unpaced.
    /// With `adapt`, the starting rate and ceiling. Default 0.
    pub rate_mbps: u32,
    /// Token bucket depth in bytes (≥ `network.mtu` when paced). Default 65536.
    pub burst_bytes: u32,
    /// Loss-driven rate adaptation (back off on loss, probe up when clean);
    /// needs `rate_mbps` > 0. Default false.
    pub adapt: bool,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing { rate_mbps: 0, burst_bytes: 64 * 1024, adapt: false }
    }
}

impl Pacing {
    /// The rate in bytes per second, `None` if unpaced.
    pub fn rate_bytes_per_sec(&self) -> Option<u64> {
        (self.rate_mbps > 0).then(|| u64::from(self.rate_mbps) * 1_000_000 / 8)
    }
}

// ---------------------------------------------------------------------------
// [shm]
// ---------------------------------------------------------------------------

/// `[shm]`: shared memory between trainers and the daemon. Restart-only.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Shm {
    /// Tensor arena per attached trainer, bytes: a multiple of 4096 in
    /// 1 MiB ..= [`MAX_ARENA_BYTES`] (16 GiB, the shared-memory layout's
    /// limit). Default 256 MiB.
    pub arena_bytes: u64,
    /// Entries of each submission/completion ring, a power of two in 2 ..= 65536.
    /// Default 256.
    pub ring_entries: u32,
    /// Largest tensor one op may carry, bytes, 1 ..= `arena_bytes`. Default 64 MiB.
    pub max_tensor_bytes: u64,
    /// Cap on bytes buffered for ops a peer started before this node did (beyond
    /// it, such packets are dropped and repaired later; each datagram counts
    /// with 64 bytes of bookkeeping). 0 ..= `arena_bytes`. Default 16 MiB.
    pub early_buffer_bytes: u64,
    /// Trainers attached at once (each holds a segment of `arena_bytes`), 1 ..=
    /// [`MAX_ATTACHMENTS`]; an attach beyond it is refused with a reason naming
    /// this setting, before any memory is set aside. Default 64.
    pub max_attachments: u32,
    /// Attachments one user (uid) may hold at once, 0 ..= `max_attachments`;
    /// 0 sets no per-user cap (only `max_attachments`). Default 0.
    pub max_attachments_per_user: u32,
    /// Local ops the daemon holds at once, over all its trainers (collecting
    /// contributions, waiting for their run, or in flight), 1 ..= 65536.
    /// Beyond it, further descriptors stay on the trainers' submission rings
    /// until ops finish: back-pressure, nothing is dropped. (Each trainer is
    /// also held to as many ops as its completion ring has room for.)
    /// Default 256.
    pub max_ops_in_flight: u32,
}

/// Largest `shm.arena_bytes` accepted: the shared-memory layout's limit.
pub const MAX_ARENA_BYTES: u64 = 16 << 30;

/// Largest `shm.max_attachments` accepted.
pub const MAX_ATTACHMENTS: u32 = 4096;

impl Default for Shm {
    fn default() -> Self {
        Shm {
            arena_bytes: 256 << 20,
            ring_entries: 256,
            max_tensor_bytes: 64 << 20,
            early_buffer_bytes: 16 << 20,
            max_attachments: 64,
            max_attachments_per_user: 0,
            max_ops_in_flight: 256,
        }
    }
}

// ---------------------------------------------------------------------------
// [control], [metrics], [log]
// ---------------------------------------------------------------------------

/// `[control]`: the Unix control socket trainers attach through. Restart-only.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Control {
    /// Absolute socket path (≤ 107 bytes). Default `/run/dlcp/dlcpd.sock`.
    pub socket_path: PathBuf,
    /// Socket file mode as an octal string, `"0000"` ..= `"0775"` (world-writable
    /// is refused: any local user could attach). Default `"0660"`.
    pub socket_mode: String,
    /// Group (name or numeric gid) given to the socket; default: the daemon's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket_group: Option<String>,
    /// Admin connections (`dlcpctl`) served at once, 1 ..= [`MAX_LOCAL_CONNECTIONS`];
    /// more are closed at once and counted. Default 16.
    pub max_admin_connections: u32,
    /// Trainer connections in the attach handshake at once, 1 ..=
    /// [`MAX_LOCAL_CONNECTIONS`]; more are refused at once and counted. Default 16.
    pub max_pending_attaches: u32,
    /// How long a connection on the control or admin socket has to finish its
    /// exchange (an attach handshake; an admin request and its reply), ms,
    /// 100 ..= 60000. A connection still unfinished is closed and counted.
    /// Default 2000.
    pub request_timeout_ms: u32,
}

/// Largest `control.max_admin_connections` / `control.max_pending_attaches` accepted.
pub const MAX_LOCAL_CONNECTIONS: u32 = 1024;

impl Default for Control {
    fn default() -> Self {
        Control {
            socket_path: DEFAULT_SOCKET_PATH.into(),
            socket_mode: "0660".into(),
            socket_group: None,
            max_admin_connections: 16,
            max_pending_attaches: 16,
            request_timeout_ms: 2000,
        }
    }
}

impl Control {
    /// `socket_mode` as a number (valid in a loaded config; 0o660 otherwise).
    pub fn mode(&self) -> u32 {
        parse_mode(&self.socket_mode).unwrap_or(0o660)
    }

    /// `request_timeout_ms` as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms.into())
    }
}

/// Parse an octal mode string of 3 or 4 digits (`"660"`, `"0660"`), ≤ 0o777.
pub(crate) fn parse_mode(s: &str) -> Option<u32> {
    if !(3..=4).contains(&s.len()) || !s.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return None;
    }
    u32::from_str_radix(s, 8).ok().filter(|&m| m <= 0o777)
}

/// `[metrics]`: Prometheus text exposition. Restart-only.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Metrics {
    /// Serve metrics at all. Default true.
    pub enabled: bool,
    /// Listen address `ip:port`. Default `127.0.0.1:9464`.
    #[serde(deserialize_with = "de_socket_addr")]
    pub address: SocketAddr,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics { enabled: true, address: SocketAddr::from(([127, 0, 0, 1], 9464)) }
    }
}

/// `[security]`: how datagrams between the daemons are authenticated. Restart-only.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Security {
    /// The per-packet MAC: `"aes-128-gmac"` (the default: a 16-byte tag per
    /// datagram, keyed from the job secret) or `"none"` (no tag: only for an
    /// isolated fabric where nothing else can send to the daemons' ports; it
    /// must be set explicitly, is warned about at start and shown in `dlcpctl
    /// status` and the metrics). Every daemon of the job must use the same.
    pub packet_auth: PacketAuthMode,
}

/// `security.packet_auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
pub enum PacketAuthMode {
    /// AES-128-GCM used as a MAC over every datagram (see `dlcp_proto::wire`).
    #[default]
    #[serde(rename = "aes-128-gmac")]
    AesGmac,
    /// No authentication.
    #[serde(rename = "none")]
    None,
}

impl PacketAuthMode {
    /// The mode on the wire.
    pub fn wire(self) -> dlcp_proto::wire::PacketAuth {
        match self {
            PacketAuthMode::AesGmac => dlcp_proto::wire::PacketAuth::AesGmac,
            PacketAuthMode::None => dlcp_proto::wire::PacketAuth::None,
        }
    }

    /// The mode's name as in the config file.
    pub fn as_str(self) -> &'static str {
        self.wire().name()
    }
}

/// `[log]`. Runtime.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Log {
    /// Maximum level logged. Default `info`.
    pub level: LogLevel,
}

/// `log.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// Informational messages and above.
    #[default]
    Info,
    /// Debugging messages and above.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// The level's name as in the config file (and the `log` crate).
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

// ---------------------------------------------------------------------------
// serde helpers with messages in the "(allowed: ...)" style
// ---------------------------------------------------------------------------

fn de_ip<'de, D: Deserializer<'de>>(d: D) -> Result<IpAddr, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(|_| {
        de::Error::custom(format_args!(
            "invalid value {s:?} (allowed: an IPv4 or IPv6 address literal, e.g. \"10.77.0.1\" or \"fd00::1\")"
        ))
    })
}

fn de_opt_ip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
    de_ip(d).map(Some)
}

fn de_socket_addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(|_| {
        de::Error::custom(format_args!(
            "invalid value {s:?} (allowed: \"ip:port\", e.g. \"127.0.0.1:9464\" or \"[::1]:9464\")"
        ))
    })
}
