//! The socket datapath's settings ([`SocketConfig`], with their limits and
//! validation), why it may fail to open ([`DatapathError`]) and its own
//! counters ([`SocketStats`]).

use std::io;
use std::net::SocketAddr;

use dlcp_proto::class::Class;

/// Number of classes.
const CLASSES: usize = Class::COUNT;

/// Largest `gso_max_segments` accepted (the kernel's `UDP_MAX_SEGMENTS` on
/// older kernels; newer ones allow 128).
pub const MAX_GSO_SEGMENTS: usize = 64;
/// Largest `batch` accepted.
pub const MAX_BATCH: usize = 1024;
/// Largest UDP payload over IPv4 (65535 − 20 − 8).
pub const MAX_UDP_PAYLOAD_V4: usize = 65_507;
/// Largest UDP payload over IPv6 without jumbograms (65535 − 8).
pub const MAX_UDP_PAYLOAD_V6: usize = 65_527;

/// Settings of a [`SocketDatapath`](super::SocketDatapath).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketConfig {
    /// Local address and port (IPv4 or IPv6); port 0 picks a free port.
    pub bind: SocketAddr,
    /// DSCP (0 ..= 63) per class; the TOS/traffic-class byte is `dscp << 2`.
    pub dscp: [u8; CLASSES],
    /// `SO_PRIORITY` per class (values above 6 need `CAP_NET_ADMIN`; failing
    /// to set one is logged and counted, not fatal).
    pub so_priority: [u32; CLASSES],
    /// `SO_SNDBUF` of each class socket in bytes; 0 keeps the kernel default.
    pub send_buffer_bytes: usize,
    /// `SO_RCVBUF` of the receive socket in bytes; 0 keeps the kernel default.
    pub recv_buffer_bytes: usize,
    /// Messages per `sendmmsg`/`recvmmsg` call, 1 ..= [`MAX_BATCH`].
    pub batch: usize,
    /// Use UDP GSO (`UDP_SEGMENT`) when the kernel has it.
    pub gso: bool,
    /// Segments per GSO message, 1 ..= [`MAX_GSO_SEGMENTS`].
    pub gso_max_segments: usize,
    /// Largest datagram sent or received (UDP payload bytes), 1 ..=
    /// [`MAX_UDP_PAYLOAD_V4`] (IPv4) or [`MAX_UDP_PAYLOAD_V6`] (IPv6).
    pub max_datagram: usize,
    /// Receive with UDP GRO (`UDP_GRO`) when the kernel has it: fewer receive
    /// calls, at the cost of 64 KiB receive buffers (`batch` of them).
    pub gro: bool,
    /// Paths, 1 ..= [`MAX_PATHS`]: one set of sockets on each of the ports
    /// `bind.port() .. bind.port() + paths` (the bind port must not be 0
    /// with more than one); a datagram on path `p` leaves from port
    /// `bind.port() + p` (see `dlcp_proto::paths`).
    pub paths: usize,
}

/// Most paths (source ports) a socket datapath binds.
pub const MAX_PATHS: usize = dlcp_proto::paths::MAX_PATHS as usize;

impl SocketConfig {
    /// The defaults of `dlcp.toml` (`[priority]` DSCP and `SO_PRIORITY` maps,
    /// `[datapath.socket]`, MTU 1500) for `bind`.
    pub fn new(bind: SocketAddr) -> SocketConfig {
        let d = dlcp_config::SocketDatapath::default();
        let overhead = if bind.is_ipv6() {
            dlcp_config::schema::IPV6_UDP_OVERHEAD
        } else {
            dlcp_config::schema::IPV4_UDP_OVERHEAD
        };
        SocketConfig {
            bind,
            dscp: dlcp_config::schema::DEFAULT_DSCP,
            so_priority: dlcp_config::schema::DEFAULT_SO_PRIORITY.map(u32::from),
            send_buffer_bytes: d.send_buffer_bytes as usize,
            recv_buffer_bytes: d.recv_buffer_bytes as usize,
            batch: d.batch as usize,
            gso: d.gso,
            gso_max_segments: d.gso_max_segments as usize,
            max_datagram: (dlcp_config::schema::DEFAULT_MTU - overhead) as usize,
            gro: true,
            paths: 1,
        }
    }

    /// The settings a loaded daemon configuration asks for: bind address,
    /// `[priority]` maps, `[datapath.socket]`, and the largest datagram that
    /// fits `network.mtu`.
    pub fn from_config(cfg: &dlcp_config::Config) -> SocketConfig {
        let bind = cfg.bind_addr();
        let s = &cfg.datapath.socket;
        let overhead = if bind.is_ipv6() {
            dlcp_config::schema::IPV6_UDP_OVERHEAD
        } else {
            dlcp_config::schema::IPV4_UDP_OVERHEAD
        };
        SocketConfig {
            bind,
            dscp: cfg.priority.dscp,
            so_priority: cfg.priority.so_priority.map(u32::from),
            send_buffer_bytes: s.send_buffer_bytes as usize,
            recv_buffer_bytes: s.recv_buffer_bytes as usize,
            batch: s.batch as usize,
            gso: s.gso,
            gso_max_segments: s.gso_max_segments as usize,
            max_datagram: cfg.network.mtu.saturating_sub(overhead) as usize,
            gro: true,
            paths: usize::from(cfg.network.paths),
        }
    }

    /// The largest UDP payload of the bind address's family.
    pub(super) fn max_payload(&self) -> usize {
        if self.bind.is_ipv6() { MAX_UDP_PAYLOAD_V6 } else { MAX_UDP_PAYLOAD_V4 }
    }

    /// Checks every value is in range.
    pub fn validate(&self) -> Result<(), DatapathError> {
        let bad = |field: &'static str, reason: String| Err(DatapathError::InvalidConfig { field, reason });
        if let Some(c) = self.dscp.iter().position(|&d| d > 63) {
            return bad("dscp", format!("class {c}: DSCP {} is above 63", self.dscp[c]));
        }
        if !(1..=MAX_BATCH).contains(&self.batch) {
            return bad("batch", format!("{} is not in 1 ..= {MAX_BATCH}", self.batch));
        }
        if !(1..=MAX_GSO_SEGMENTS).contains(&self.gso_max_segments) {
            return bad(
                "gso_max_segments",
                format!("{} is not in 1 ..= {MAX_GSO_SEGMENTS}", self.gso_max_segments),
            );
        }
        if !(1..=self.max_payload()).contains(&self.max_datagram) {
            return bad(
                "max_datagram",
                format!("{} is not in 1 ..= {}", self.max_datagram, self.max_payload()),
            );
        }
        if !(1..=MAX_PATHS).contains(&self.paths) {
            return bad("paths", format!("{} is not in 1 ..= {MAX_PATHS}", self.paths));
        }
        let last = usize::from(self.bind.port()) + self.paths - 1;
        if self.paths > 1 && (self.bind.port() == 0 || last > 65535) {
            return bad(
                "paths",
                format!(
                    "{} ports from port {} do not fit (a fixed port, at most 65535 − paths + 1)",
                    self.paths,
                    self.bind.port()
                ),
            );
        }
        Ok(())
    }
}

/// Why a [`SocketDatapath`](super::SocketDatapath) could not be created.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// A [`SocketConfig`] value is out of range: fix the configuration.
    #[error("invalid socket datapath setting `{field}`: {reason}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The bind address cannot be bound: another process holds the port, or
    /// the address is not configured on this host.
    #[error("cannot bind UDP {addr}: {source} (port in use, or address not on this host?)")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// A socket could not be created or configured (e.g. out of file
    /// descriptors, or the kernel lacks IPv6).
    #[error("socket datapath on {addr}: cannot {what}: {source}")]
    Socket {
        /// The bind address.
        addr: SocketAddr,
        /// The step that failed.
        what: String,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
}

/// Counters and state specific to the socket datapath (beyond
/// [`DatapathStats`](crate::datapath::DatapathStats)).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SocketStats {
    /// Classes whose `SO_PRIORITY` could not be set (e.g. `EPERM` above 6
    /// without `CAP_NET_ADMIN`).
    pub so_priority_failures: u64,
    /// The kernel accepted `UDP_SEGMENT` at start-up and the config asked for GSO.
    pub gso_available: bool,
    /// GSO is in use now (false after a fallback).
    pub gso_active: bool,
    /// Times the kernel refused a GSO message and GSO was switched off.
    pub gso_fallbacks: u64,
    /// GSO messages (super-packets) handed to the kernel.
    pub gso_sends: u64,
    /// Datagrams carried in GSO messages.
    pub gso_segments: u64,
    /// UDP GRO is on for the sockets read.
    pub gro_active: bool,
    /// Coalesced receives (a `UDP_GRO` control message with several datagrams).
    pub gro_packets: u64,
    /// Datagrams that arrived in coalesced receives (`gro_segments ÷
    /// gro_packets` datagrams per coalesced receive; their share of all
    /// received datagrams says how much of the traffic GRO merged).
    pub gro_segments: u64,
    /// Incoming datagrams are steered to the receive socket by a reuseport BPF
    /// program (else every socket is read).
    pub rx_steered: bool,
    /// Datagrams `send_batch` handed to the kernel from the caller's memory
    /// (no copy in user space).
    pub tx_lent: u64,
    /// Datagrams copied into a class queue: by `send`, or by `send_batch`
    /// when the class's socket would block (or its queue still held some).
    pub tx_copied: u64,
    /// Datagrams queued per class (every path's queue), not yet handed to
    /// the kernel.
    pub tx_queued: [usize; CLASSES],
    /// Paths: socket sets on consecutive ports.
    pub paths: usize,
}
