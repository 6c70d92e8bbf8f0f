//! The DPDK datapath: dlcpd drives a NIC port through a poll-mode driver.
//!
//! * EAL is initialised from `datapath.dpdk.eal_args` (once per process).
//! * One mbuf pool sized by `mbuf_pool_size`, with a data room for `network.mtu`.
//! * `tx_queues` TX queues: class `c` goes to queue `class_tx_queue[c]`. Staged
//!   frames are handed to the NIC queue by queue, the queue carrying the highest
//!   class first (strict priority), in bursts of `tx_burst`.
//! * `rx_queues` RX queues polled in bursts of `rx_burst`.
//! * dlcp builds Ethernet/IPv4/UDP itself with the class's DSCP (changed live by
//!   [`Datapath::set_marking`] on a configuration reload); IPv4/UDP checksums
//!   are offloaded when the device offers it, computed in software otherwise, and
//!   verified in software on receive.
//! * ARP is answered and resolved by dlcp: requests for our address are answered;
//!   a datagram to an unresolved neighbour waits (bounded) while we ask.
//!
//! There is no file descriptor to wait on: [`Datapath::poll_hint`] tells the event
//! loop how soon to poll again — 0 while packets keep coming, backing off to 1 ms
//! when idle, so an idle daemon does not spin.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use dlcp_ffi::dpdk::{Eal, Mbuf, Mempool, Port, PortConfig};
use dlcp_proto::class::Class;

use super::api::{Datapath, DatapathStats, Outgoing, SendOutcome};
use super::frame::{self, Arp, ArpOp, Checksum, Ignore, Mac, Parsed, UdpFrame};
use super::neigh::Neighbours;

/// Datagrams kept per unresolved neighbour while ARP asks for it.
const ARP_PENDING_MAX: usize = 256;
/// Interval between ARP requests for one unresolved neighbour.
const ARP_RETRY: Duration = Duration::from_millis(200);
/// An unresolved neighbour's waiting datagrams are dropped after this long.
const ARP_GIVE_UP: Duration = Duration::from_secs(3);
/// Learned neighbours kept at most (a flood of ARP cannot grow the table).
const NEIGHBOURS_MAX: usize = 4096;
/// Longest idle poll interval.
const IDLE_POLL_MAX: Duration = Duration::from_millis(1);
/// First idle poll interval; doubles per empty poll up to [`IDLE_POLL_MAX`].
const IDLE_POLL_MIN: Duration = Duration::from_micros(16);

/// Settings of the DPDK datapath (from `[datapath.dpdk]`, `[priority]`, `[network]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpdkConfig {
    /// EAL arguments.
    pub eal_args: Vec<String>,
    /// Port id.
    pub port_id: u16,
    /// RX / TX queues.
    pub rx_queues: u16,
    /// TX queues.
    pub tx_queues: u16,
    /// Burst sizes.
    pub rx_burst: u16,
    /// TX burst size.
    pub tx_burst: u16,
    /// Descriptors per RX queue.
    pub rx_ring_size: u16,
    /// Descriptors per TX queue.
    pub tx_ring_size: u16,
    /// Mbufs in the pool.
    pub mbuf_pool_size: u32,
    /// TX queue of each class.
    pub class_tx_queue: [u16; Class::COUNT],
    /// DSCP of each class.
    pub dscp: [u8; Class::COUNT],
    /// Our IPv4 address and UDP port.
    pub local: SocketAddrV4,
    /// Static neighbour entries (no ARP needed for them).
    pub neighbours: Vec<(Ipv4Addr, Mac)>,
    /// IP MTU.
    pub mtu: u32,
    /// Paths, 1 ..= 256: a datagram on path `p` leaves from UDP source port
    /// `local.port() + p` (a path beyond wraps round; see `dlcp_proto::paths`).
    pub paths: u16,
}

impl DpdkConfig {
    /// The settings a loaded daemon configuration asks for; `Err` if the node's
    /// address is not IPv4 (the DPDK datapath speaks IPv4 only).
    pub fn from_config(cfg: &dlcp_config::Config) -> Result<DpdkConfig, DpdkError> {
        let d = &cfg.datapath.dpdk;
        let local = match cfg.bind_addr() {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(a) => return Err(DpdkError::NotIpv4 { addr: a }),
        };
        if local.ip().is_unspecified() {
            return Err(DpdkError::UnspecifiedAddress);
        }
        let ring = |v: u32| u16::try_from(v).unwrap_or(u16::MAX);
        Ok(DpdkConfig {
            eal_args: d.eal_args.clone(),
            port_id: d.port_id,
            rx_queues: d.rx_queues,
            tx_queues: d.tx_queues,
            rx_burst: d.rx_burst,
            tx_burst: d.tx_burst,
            rx_ring_size: ring(d.rx_ring_size),
            tx_ring_size: ring(d.tx_ring_size),
            mbuf_pool_size: d.mbuf_pool_size,
            class_tx_queue: d.class_tx_queue.map(u16::from),
            dscp: cfg.priority.dscp,
            local,
            neighbours: d
                .neighbours
                .iter()
                .filter_map(|n| dlcp_config::DpdkDatapath::parse_neighbour(n))
                .map(|(ip, mac)| (ip, Mac(mac)))
                .collect(),
            mtu: cfg.network.mtu,
            paths: cfg.network.paths,
        })
    }
}

/// Counters of one TX queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TxQueueStats {
    /// Classes served by this queue (bit c = class c).
    pub classes: u8,
    /// Frames the NIC queue accepted.
    pub packets: u64,
    /// Bytes (whole frames) the NIC queue accepted.
    pub bytes: u64,
    /// tx_burst calls that left frames behind (queue full).
    pub full: u64,
    /// Frames staged now, not yet handed to the NIC.
    pub staged: usize,
}

/// Counters specific to the DPDK datapath.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DpdkStats {
    /// Per TX queue.
    pub tx_queues: Vec<TxQueueStats>,
    /// Frames received per RX queue.
    pub rx_queue_packets: Vec<u64>,
    /// ARP requests we sent / replies we sent / ARP packets received.
    pub arp_requests_sent: u64,
    /// ARP replies sent (answers to requests for our address).
    pub arp_replies_sent: u64,
    /// ARP packets received.
    pub arp_received: u64,
    /// Neighbours known now.
    pub neighbours: usize,
    /// ARP replies or datagrams that named another MAC for a static
    /// neighbour (ignored: static entries are never replaced).
    pub arp_static_conflicts: u64,
    /// Datagrams dropped because their neighbour never answered ARP or the wait
    /// queue was full.
    pub tx_unresolved_dropped: u64,
    /// Sends deferred because the mbuf pool was empty.
    pub tx_pool_empty: u64,
    /// Received frames dropped, by reason.
    pub rx_ignored_other: u64,
    /// IPv4 header checksum wrong.
    pub rx_bad_ip_checksum: u64,
    /// UDP checksum wrong.
    pub rx_bad_udp_checksum: u64,
    /// UDP not addressed to our address and port.
    pub rx_not_for_us: u64,
    /// Multi-segment frames (larger than an mbuf).
    pub rx_multi_segment: u64,
    /// IPv4/UDP checksums are offloaded to the NIC.
    pub tx_checksum_offload: bool,
}

struct Pending {
    first: Instant,
    last_request: Instant,
    datagrams: Vec<(Class, SocketAddrV4, u8, Vec<u8>)>,
}

/// The DPDK datapath (see the module docs).
pub struct DpdkDatapath {
    cfg: DpdkConfig,
    port: Port,
    pool: Mempool,
    mac: Mac,
    cksum: Checksum,
    /// Staged frames per TX queue.
    staged: Vec<Vec<Mbuf>>,
    /// TX queues in service order (the one with the highest class first).
    queue_order: Vec<u16>,
    neighbours: Neighbours,
    pending: HashMap<Ipv4Addr, Pending>,
    /// Lent datagrams copied because the mbuf pool was empty (or earlier
    /// ones waited), staged first when mbufs are free again.
    unsent: VecDeque<(Class, SocketAddrV4, u8, Vec<u8>)>,
    rx_buf: Vec<Mbuf>,
    rx_more: bool,
    blocked: bool,
    idle_polls: u32,
    ident: u16,
    stats: DatapathStats,
    extra: DpdkStats,
}

impl std::fmt::Debug for DpdkDatapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Why the DPDK datapath could not start. Each message is one line.
#[derive(Debug, thiserror::Error)]
pub enum DpdkError {
    /// The node's address is IPv6.
    #[error("the DPDK datapath speaks IPv4 only; this node's address is {addr}")]
    NotIpv4 {
        /// The address.
        addr: std::net::SocketAddrV6,
    },
    /// `network.bind_address` is the unspecified address.
    #[error("the DPDK datapath needs this node's own IPv4 address (network.bind_address is 0.0.0.0)")]
    UnspecifiedAddress,
    /// EAL came up without a port to use.
    #[error(
        "EAL found no DPDK port (eal_args {eal_args:?}: add --vdev=... or -a <PCI address> of a NIC bound to vfio-pci)"
    )]
    NoPort {
        /// The EAL arguments used.
        eal_args: Vec<String>,
    },
    /// A DPDK call failed (EAL, mempool, port).
    #[error(transparent)]
    Dpdk(#[from] dlcp_ffi::dpdk::Error),
}

/// Open the DPDK datapath a loaded daemon configuration asks for: initialise EAL,
/// create the pool, configure and start the port.
pub fn open(cfg: &dlcp_config::Config) -> Result<DpdkDatapath, DpdkError> {
    DpdkDatapath::new(DpdkConfig::from_config(cfg)?)
}

impl DpdkDatapath {
    /// Initialise EAL and bring the port up with `cfg`.
    pub fn new(cfg: DpdkConfig) -> Result<DpdkDatapath, DpdkError> {
        let eal = Eal::init(&cfg.eal_args)?;
        if eal.port_count() == 0 {
            return Err(DpdkError::NoPort { eal_args: cfg.eal_args.clone() });
        }
        // Data room: DPDK's default (2048 + headroom), more for jumbo frames.
        let need = cfg.mtu as usize + frame::ETH_LEN + 128;
        let room = usize::from(Mempool::default_data_room()).max(need).min(usize::from(u16::MAX));
        let pool = Mempool::new(
            eal,
            "dlcp_pool",
            cfg.mbuf_pool_size,
            256.min(cfg.mbuf_pool_size / 8),
            room as u16,
            -1,
        )?;
        let pcfg = PortConfig {
            rx_queues: cfg.rx_queues,
            tx_queues: cfg.tx_queues,
            rx_ring_size: cfg.rx_ring_size,
            tx_ring_size: cfg.tx_ring_size,
            tx_cksum_offload: true,
            promiscuous: true,
        };
        let port = Port::open(eal, cfg.port_id, pool, &pcfg)?;
        let mac = Mac(port.info().mac);
        let cksum = if port.info().tx_cksum_offload { Checksum::Offload } else { Checksum::Software };
        let (queue_order, classes) = service_order(&cfg.class_tx_queue, cfg.tx_queues);
        let extra = DpdkStats {
            tx_queues: classes.iter().map(|&c| TxQueueStats { classes: c, ..Default::default() }).collect(),
            rx_queue_packets: vec![0; usize::from(cfg.rx_queues)],
            tx_checksum_offload: cksum == Checksum::Offload,
            ..Default::default()
        };
        log::info!(
            "dpdk: port {} ({}, driver {}) up, MAC {mac}, link {}, {} rx / {} tx queues, checksums {}",
            cfg.port_id,
            port.info().name,
            port.info().driver,
            if port.link_up() { "up" } else { "down" },
            cfg.rx_queues,
            cfg.tx_queues,
            if cksum == Checksum::Offload { "offloaded" } else { "in software" },
        );
        Ok(DpdkDatapath {
            staged: (0..cfg.tx_queues).map(|_| Vec::with_capacity(usize::from(cfg.tx_burst))).collect(),
            queue_order,
            neighbours: Neighbours::new(&cfg.neighbours, NEIGHBOURS_MAX),
            pending: HashMap::new(),
            unsent: VecDeque::new(),
            rx_buf: Vec::with_capacity(usize::from(cfg.rx_burst)),
            rx_more: false,
            blocked: false,
            idle_polls: 0,
            ident: 0,
            stats: DatapathStats::default(),
            extra,
            cfg,
            port,
            pool,
            mac,
            cksum,
        })
    }

    /// DPDK-specific counters (per queue, ARP, drops by reason).
    pub fn dpdk_stats(&self) -> DpdkStats {
        let mut s = self.extra.clone();
        for (q, st) in s.tx_queues.iter_mut().enumerate() {
            st.staged = self.staged[q].len();
        }
        s.neighbours = self.neighbours.len();
        s.arp_static_conflicts = self.neighbours.static_conflicts;
        s
    }

    /// Our MAC address.
    pub fn mac(&self) -> Mac {
        self.mac
    }

    /// Add a static neighbour entry (no ARP needed for `ip`).
    pub fn add_neighbour(&mut self, ip: Ipv4Addr, mac: Mac) {
        self.neighbours.add_static(ip, mac);
    }

    /// Build one UDP frame for `dst_mac` in a fresh mbuf and stage it on
    /// `class`'s queue: the datagram is the concatenation of `parts`, each
    /// copied once, into the mbuf. Returns false if the pool is empty.
    /// The source address of a datagram on `path`: the local port plus the
    /// path (per-packet load balancing: ECMP hashes the source port).
    fn source(&self, path: u8) -> SocketAddrV4 {
        let p = u16::from(path) % self.cfg.paths.max(1);
        SocketAddrV4::new(*self.cfg.local.ip(), self.cfg.local.port().wrapping_add(p))
    }

    fn stage_udp(
        &mut self,
        dst_mac: Mac,
        dst: SocketAddrV4,
        class: Class,
        path: u8,
        parts: &[&[u8]],
    ) -> bool {
        let Some(mut m) = self.pool.alloc() else {
            self.extra.tx_pool_empty += 1;
            return false;
        };
        self.ident = self.ident.wrapping_add(1);
        let f = UdpFrame {
            src_mac: self.mac,
            dst_mac,
            src: self.source(path),
            dst,
            dscp: self.cfg.dscp[class.index()],
            ident: self.ident,
            ttl: 64,
        };
        let datagram_len: usize = parts.iter().map(|p| p.len()).sum();
        let len = UdpFrame::len_for(datagram_len).max(frame::MIN_FRAME);
        let Some(buf) = u16::try_from(len).ok().and_then(|l| m.append(l)) else {
            // Larger than an mbuf: the protocol never sends that within the MTU.
            self.stats.tx_errors += 1;
            return true;
        };
        if f.write_parts(buf, parts, self.cksum).is_none() {
            self.stats.tx_errors += 1;
            return true;
        }
        if self.cksum == Checksum::Offload {
            m.request_cksum_offload(frame::ETH_LEN as u8, frame::IPV4_LEN as u8);
        }
        let q = usize::from(self.cfg.class_tx_queue[class.index()]);
        self.staged[q].push(m);
        self.stats.tx_packets[class.index()] += 1;
        self.stats.tx_bytes[class.index()] += datagram_len as u64;
        true
    }

    fn stage_arp(&mut self, eth_dst: Mac, arp: Arp) {
        let Some(mut m) = self.pool.alloc() else {
            self.extra.tx_pool_empty += 1;
            return;
        };
        if let Some(buf) = m.append(frame::MIN_FRAME as u16)
            && arp.write(eth_dst, buf).is_some()
        {
            let q = usize::from(self.cfg.class_tx_queue[Class::CONTROL.index()]);
            self.staged[q].push(m);
        }
    }

    fn request_arp(&mut self, ip: Ipv4Addr) {
        self.extra.arp_requests_sent += 1;
        let a = Arp {
            op: ArpOp::Request,
            sender_mac: self.mac,
            sender_ip: *self.cfg.local.ip(),
            target_mac: Mac::default(),
            target_ip: ip,
        };
        self.stage_arp(frame::BROADCAST, a);
    }

    /// Hand staged frames to the NIC, queue by queue in priority order. A queue
    /// that cannot take everything stops the lower ones (strict priority).
    fn push(&mut self) {
        for i in 0..self.queue_order.len() {
            if !self.push_queue(self.queue_order[i]) {
                break; // lower-priority queues wait for the next round
            }
        }
        let limit = usize::from(self.cfg.tx_ring_size);
        self.blocked = self.staged.iter().any(|s| s.len() >= limit) || !self.unsent.is_empty();
    }

    /// Hand TX queue `q`'s staged frames to the NIC; false if some are left
    /// (the NIC queue is full).
    fn push_queue(&mut self, q: u16) -> bool {
        let staged = &mut self.staged[usize::from(q)];
        let st = &mut self.extra.tx_queues[usize::from(q)];
        while !staged.is_empty() {
            let mut sizes = [0u16; 512];
            let n = staged.len().min(sizes.len());
            for (s, m) in sizes.iter_mut().zip(staged.iter()) {
                *s = m.data().len() as u16;
            }
            let sent = self.port.tx_burst(q, staged);
            self.stats.tx_syscalls += 1;
            st.packets += sent as u64;
            st.bytes += sizes[..sent].iter().map(|&b| u64::from(b)).sum::<u64>();
            if sent < n {
                st.full += 1;
                self.stats.tx_would_block += 1;
                break;
            }
        }
        staged.is_empty()
    }

    /// Stage one lent datagram (one copy, into its mbuf), or keep a copy of it
    /// for later: while its neighbour is unresolved (ARP), or when the pool
    /// is empty or earlier datagrams wait for it.
    fn stage_lent(&mut self, d: &Outgoing<'_>) {
        let SocketAddr::V4(dst) = d.dst else {
            self.stats.tx_errors += 1;
            return;
        };
        let q = usize::from(self.cfg.class_tx_queue[d.class.index()]);
        if self.staged[q].len() >= usize::from(self.cfg.tx_burst) {
            self.push_queue(q as u16);
        }
        match self.neighbours.get(dst.ip()) {
            Some(mac) if self.unsent.is_empty() => {
                if !self.stage_udp(mac, dst, d.class, d.path, &d.parts) {
                    self.unsent.push_back((d.class, dst, d.path, d.to_vec()));
                }
            }
            Some(_) => self.unsent.push_back((d.class, dst, d.path, d.to_vec())),
            None => self.wait_for_neighbour(Instant::now(), d.class, dst, d.path, d.to_vec()),
        }
    }

    /// Stage the datagrams kept because the pool was empty, in order, while
    /// the pool has mbufs.
    fn stage_unsent(&mut self) {
        while let Some((class, dst, path, d)) = self.unsent.pop_front() {
            let Some(mac) = self.neighbours.get(dst.ip()) else {
                self.wait_for_neighbour(Instant::now(), class, dst, path, d);
                continue;
            };
            if !self.stage_udp(mac, dst, class, path, &[&d]) {
                self.unsent.push_front((class, dst, path, d));
                return;
            }
        }
    }

    /// Keep datagram `d` for `dst` until ARP resolves its neighbour (asking if
    /// nobody asked yet); bounded.
    fn wait_for_neighbour(&mut self, now: Instant, class: Class, dst: SocketAddrV4, path: u8, d: Vec<u8>) {
        let ip = *dst.ip();
        let ask = match self.pending.entry(ip) {
            Entry::Vacant(v) => {
                v.insert(Pending { first: now, last_request: now, datagrams: vec![(class, dst, path, d)] });
                true
            }
            Entry::Occupied(mut o) => {
                let p = o.get_mut();
                if p.datagrams.len() < ARP_PENDING_MAX {
                    p.datagrams.push((class, dst, path, d));
                } else {
                    self.extra.tx_unresolved_dropped += 1;
                }
                false
            }
        };
        if ask {
            self.request_arp(ip);
        }
    }

    fn handle_arp(&mut self, a: Arp) {
        self.extra.arp_received += 1;
        if a.target_ip != *self.cfg.local.ip() || a.sender_ip.is_unspecified() {
            return;
        }
        // Static entries stay: a forged or stale reply cannot redirect a peer.
        self.neighbours.learn(a.sender_ip, a.sender_mac, true);
        if a.op == ArpOp::Request {
            self.extra.arp_replies_sent += 1;
            let reply = Arp {
                op: ArpOp::Reply,
                sender_mac: self.mac,
                sender_ip: *self.cfg.local.ip(),
                target_mac: a.sender_mac,
                target_ip: a.sender_ip,
            };
            self.stage_arp(a.sender_mac, reply);
        }
        if let Some(p) = self.pending.remove(&a.sender_ip) {
            for (class, dst, path, d) in p.datagrams {
                if !self.stage_udp(a.sender_mac, dst, class, path, &[&d]) {
                    self.extra.tx_unresolved_dropped += 1;
                }
            }
        }
    }

    fn age_pending(&mut self, now: Instant) {
        if self.pending.is_empty() {
            return;
        }
        let mut ask = Vec::new();
        self.pending.retain(|ip, p| {
            if now.duration_since(p.first) > ARP_GIVE_UP {
                log::warn!("dpdk: no ARP answer from {ip}; dropped {} datagrams", p.datagrams.len());
                self.extra.tx_unresolved_dropped += p.datagrams.len() as u64;
                return false;
            }
            if now.duration_since(p.last_request) >= ARP_RETRY {
                p.last_request = now;
                ask.push(*ip);
            }
            true
        });
        for ip in ask {
            self.request_arp(ip);
        }
    }
}

impl Datapath for DpdkDatapath {
    fn describe(&self) -> String {
        let i = self.port.info();
        format!(
            "dpdk (port {} {} driver {}, MAC {}, udp {}, {} rx / {} tx queues, checksums {})",
            self.cfg.port_id,
            i.name,
            i.driver,
            self.mac,
            self.cfg.local,
            self.cfg.rx_queues,
            self.cfg.tx_queues,
            if self.cksum == Checksum::Offload { "offloaded" } else { "software" }
        )
    }

    fn local_addr(&self) -> SocketAddr {
        SocketAddr::V4(self.cfg.local)
    }

    fn send(&mut self, dst: SocketAddr, class: Class, datagram: &[u8]) -> io::Result<SendOutcome> {
        let dst = match dst {
            SocketAddr::V4(d) => d,
            SocketAddr::V6(_) => {
                self.stats.tx_errors += 1;
                return Ok(SendOutcome::Sent);
            }
        };
        let q = usize::from(self.cfg.class_tx_queue[class.index()]);
        if self.staged[q].len() >= usize::from(self.cfg.tx_burst) {
            self.push();
            if self.blocked {
                return Ok(SendOutcome::WouldBlock);
            }
        }
        if let Some(mac) = self.neighbours.get(dst.ip()) {
            if !self.stage_udp(mac, dst, class, 0, &[datagram]) {
                self.push();
                self.blocked = true;
                return Ok(SendOutcome::WouldBlock);
            }
            return Ok(SendOutcome::Sent);
        }
        self.wait_for_neighbour(Instant::now(), class, dst, 0, datagram.to_vec());
        Ok(SendOutcome::Sent)
    }

    /// Each datagram copied once, into its frame's mbuf, and staged; when the
    /// next datagram goes to another TX queue, the frames staged before it
    /// are handed to the NIC first, so the NIC gets them in the order given.
    fn send_batch(&mut self, batch: &[Outgoing<'_>]) -> io::Result<()> {
        self.stage_unsent();
        let mut last = None;
        for d in batch {
            let q = self.cfg.class_tx_queue[d.class.index()];
            if let Some(l) = last.filter(|&l| l != q) {
                self.push_queue(l);
            }
            last = Some(q);
            self.stage_lent(d);
        }
        self.push();
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.age_pending(Instant::now());
        self.stage_unsent();
        self.push();
        Ok(())
    }

    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
        let burst = usize::from(self.cfg.rx_burst);
        let mut delivered = 0;
        let mut more = false;
        let mut got_any = false;
        for q in 0..self.cfg.rx_queues {
            let mut buf = std::mem::take(&mut self.rx_buf);
            let n = self.port.rx_burst(q, &mut buf, burst);
            self.stats.rx_syscalls += 1;
            more |= n == burst;
            got_any |= n > 0;
            self.extra.rx_queue_packets[usize::from(q)] += n as u64;
            for m in buf.drain(..) {
                if m.segments() != 1 {
                    self.extra.rx_multi_segment += 1;
                    self.stats.rx_truncated += 1;
                    continue;
                }
                match frame::parse(m.data(), true) {
                    Parsed::Udp(u) => {
                        if u.dst != self.cfg.local {
                            self.extra.rx_not_for_us += 1;
                            continue;
                        }
                        // A datagram from a neighbour also tells us its MAC.
                        self.neighbours.learn(*u.src.ip(), u.src_mac, false);
                        let p = &m.data()[u.payload];
                        self.stats.rx_packets += 1;
                        self.stats.rx_bytes += p.len() as u64;
                        delivered += 1;
                        f(SocketAddr::V4(u.src), p);
                    }
                    Parsed::Arp(a) => self.handle_arp(a),
                    Parsed::Ignored(Ignore::BadIpChecksum) => self.extra.rx_bad_ip_checksum += 1,
                    Parsed::Ignored(Ignore::BadUdpChecksum) => self.extra.rx_bad_udp_checksum += 1,
                    Parsed::Ignored(_) => self.extra.rx_ignored_other += 1,
                }
            }
            self.rx_buf = buf;
        }
        self.rx_more = more;
        self.idle_polls = if got_any { 0 } else { self.idle_polls.saturating_add(1) };
        Ok(delivered)
    }

    fn rx_pending(&self) -> bool {
        self.rx_more
    }

    fn wants_writable(&self) -> bool {
        self.blocked
    }

    fn register(&mut self, _registry: &mio::Registry, _first_token: usize) -> io::Result<usize> {
        Ok(0) // nothing to wait on: see poll_hint
    }

    fn poll_hint(&self) -> Option<Duration> {
        if self.rx_more {
            return Some(Duration::ZERO); // a full burst: more is waiting
        }
        if self.staged.iter().any(|s| !s.is_empty()) || !self.pending.is_empty() || !self.unsent.is_empty() {
            return Some(IDLE_POLL_MIN); // the NIC queue was full, or ARP is pending
        }
        let shift = self.idle_polls.min(10);
        Some((IDLE_POLL_MIN * (1u32 << shift)).min(IDLE_POLL_MAX))
    }

    /// The counters, with the NIC's receive drops (ring full or no mbuf)
    /// read from the port.
    fn stats(&self) -> DatapathStats {
        let p = self.port.stats();
        DatapathStats { rx_ring_overruns: p.imissed + p.rx_nombuf, ..self.stats.clone() }
    }

    /// dlcp writes each frame's IPv4 header itself, so a new class → DSCP map
    /// applies to every frame built from now on (frames already staged keep
    /// theirs); the header checksum is computed (or offloaded) per frame, over
    /// the new DSCP. `SO_PRIORITY` is a kernel socket option with no meaning
    /// here: accepted and ignored, as at start.
    fn set_marking(&mut self, dscp: [u8; Class::COUNT], so_priority: [u8; Class::COUNT]) -> io::Result<bool> {
        let _ = so_priority;
        if let Some(c) = dscp.iter().position(|&d| d > 63) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("class {c}: DSCP above 63")));
        }
        self.cfg.dscp = dscp;
        Ok(true)
    }

    fn detail_json(&self) -> Option<serde_json::Value> {
        let mut v = serde_json::to_value(self.dpdk_stats()).ok()?;
        let p = self.port.stats();
        v["port"] = serde_json::json!({
            "ipackets": p.ipackets, "opackets": p.opackets, "ibytes": p.ibytes, "obytes": p.obytes,
            "imissed": p.imissed, "ierrors": p.ierrors, "oerrors": p.oerrors, "rx_nombuf": p.rx_nombuf,
        });
        Some(v)
    }
}

/// The order in which TX queues are served — the queue carrying the highest class
/// first (queues without a class last) — and the classes of each queue (bit c = class c).
pub fn service_order(class_tx_queue: &[u16; Class::COUNT], tx_queues: u16) -> (Vec<u16>, Vec<u8>) {
    let mut top = vec![0u8; usize::from(tx_queues)];
    let mut classes = vec![0u8; usize::from(tx_queues)];
    for (c, &q) in class_tx_queue.iter().enumerate() {
        if let (Some(t), Some(m)) = (top.get_mut(usize::from(q)), classes.get_mut(usize::from(q))) {
            *t = (*t).max(c as u8 + 1);
            *m |= 1 << c;
        }
    }
    let mut order: Vec<u16> = (0..tx_queues).collect();
    order.sort_by_key(|&q| std::cmp::Reverse(top[usize::from(q)]));
    (order, classes)
}

impl Drop for DpdkDatapath {
    fn drop(&mut self) {
        self.push();
    }
}

#[cfg(test)]
mod tests {
    use super::service_order;

    #[test]
    fn queues_are_served_highest_class_first() {
        assert_eq!(service_order(&[0; 8], 1), (vec![0], vec![0xff]));
        assert_eq!(service_order(&[0, 0, 0, 0, 1, 1, 1, 1], 2), (vec![1, 0], vec![0x0f, 0xf0]));
        // Control alone on queue 0, data spread; an unused queue goes last.
        assert_eq!(
            service_order(&[2, 2, 1, 1, 3, 3, 3, 0], 5),
            (vec![0, 3, 1, 2, 4], vec![0x80, 0x0c, 0x03, 0x70, 0x00])
        );
    }
}
