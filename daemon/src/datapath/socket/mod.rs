//! The socket datapath: kernel UDP sockets, one per priority class.
//!
//! # Design
//!
//! **Nine sockets, one port.** A receive socket is bound first to the configured
//! address; then one non-blocking send socket per class (8) is bound to the
//! *same* address and port with `SO_REUSEPORT`. Each class socket carries its
//! class's DSCP as a socket option (`IP_TOS` = DSCP << 2, or `IPV6_TCLASS`), set
//! *before* `SO_PRIORITY` because setting the TOS resets the priority. So:
//!
//! - (a) every datagram leaves from the configured port, whatever its class —
//!   peers identify each other by address and port;
//! - (b) a datagram's DSCP is its class's, fixed per socket: no per-packet cmsg
//!   can be forgotten, and a GSO super-packet is one class by construction;
//! - (c) each class has its own kernel send buffer and its own user-space queue,
//!   so a low class that fills its buffer (would-block) cannot hold up a higher
//!   class (measured on the development machines: one blocking socket that
//!   alternated its TOS gave the classes an even split under congestion — the
//!   shared send buffer equalises them), and [`flush`](Datapath::flush) serves
//!   the queues strictly highest class first.
//!
//! Why not one socket with a per-packet `IP_TOS` control message and software
//! queues: the kernel send buffer would still be shared, so a low-class burst
//! that fills it makes the next high-class send would-block too (the same
//! equalising trap, moved into the kernel), and a per-packet `SO_PRIORITY` needs a
//! control message only recent kernels accept. The price of socket-per-class
//! is one `sendmmsg` per non-empty class per flush (at most 8).
//!
//! **Receive steering.** With several sockets in one `SO_REUSEPORT` group the
//! kernel would spread *incoming* datagrams over all of them by a hash of the
//! 4-tuple. A one-instruction classic BPF program (`ret #0`) attached with
//! `SO_ATTACH_REUSEPORT_CBPF` to the receive socket *before* it is bound steers
//! every incoming datagram to socket 0 of the group, which is the receive socket
//! (it is bound first and lives as long as the datapath). Attaching before bind
//! also makes the receive socket's bind exclusive: a socket that already owns a
//! reuseport group conflicts with every existing socket on the port, so the
//! datapath never joins a stranger's group (not even for an ephemeral port 0).
//! The class sockets then join the group. If the kernel refuses the program
//! (Linux < 4.5), the datapath still works but [`recv`](Datapath::recv) reads
//! all nine sockets. Anything in the group may still be joined later by another
//! socket of the *same user* (the kernel's reuseport rule); with steering it
//! receives nothing.
//!
//! **Paths.** With `paths` > 1 (`network.paths`, per-packet load balancing,
//! see `dlcp_proto::paths`) the nine sockets are opened on each of the ports
//! `port .. port + paths` (`bind.rs`), and every class has a queue per path:
//! a datagram on path `p` ([`Outgoing::path`]) leaves from port `port + p`,
//! so ECMP switches hash a peer pair's datagrams onto up to `paths` fabric
//! paths. Within a class, each destination's datagrams leave in the order
//! given, whichever paths they take (`queue::order_by_path`: the fabric may
//! reorder them, but on one physical path a reordering of the sender's own
//! looks like a run of losses to the receiver's flow control), except when
//! a path's socket would block and its queue holds datagrams back; the
//! would-block contract below holds per path and class. Peers send to path 0's port, so
//! the other paths' receive sockets only see strays and are read every 16th
//! [`recv`](Datapath::recv).
//!
//! Unconnected UDP sockets ignore ICMP errors (no `IP_RECVERR`), so an
//! unreachable peer does not poison the sockets with `ECONNREFUSED`.
//!
//! **Sending, the event loop's way.** [`send_batch`](Datapath::send_batch)
//! takes datagrams lent as slices (header, payload, tag, wherever each lies)
//! and hands them to the kernel at once, without a user-space copy: one
//! `sendmmsg` iovec per slice, so the payload is read once, by the kernel's
//! copy. The batch goes in runs of one class, each run to its class's socket
//! before the next run, so datagrams reach the kernel in the order given
//! across class sockets (a PROBE after the data it follows). Within a run the
//! descriptors (not the bytes) are grouped by destination, each destination's
//! datagrams in order, and consecutive equal-size datagrams to one
//! destination (optionally ended by one shorter datagram) become one
//! `UDP_SEGMENT` message of at most `gso_max_segments` segments (and at most
//! one 64 KiB UDP payload), so a low class never has a long super-packet ahead
//! of a high class. Only what the kernel refuses with would-block is copied,
//! into its class's queue ([`SocketStats::tx_copied`]; lent datagrams sent:
//! [`SocketStats::tx_lent`]), and every later datagram of that class follows
//! it there until a flush empties the queue.
//!
//! **Sending, the copying way.** [`send`](Datapath::send) copies the
//! datagram into its class's queue; [`flush`](Datapath::flush) (and the start
//! of every `send_batch`) pushes every queue to its socket with `sendmmsg`
//! (`batch` messages per call), class 7 first, each queue grouped by
//! destination first when GSO is on. If the kernel refuses a GSO message
//! (`EINVAL`, `EIO`, `ENOPROTOOPT`, `EOPNOTSUPP`, `EMSGSIZE`), on either
//! path, GSO is switched off for the rest of the datapath's life, the
//! refusal is logged once and counted ([`SocketStats::gso_fallbacks`]), and
//! the same datagrams are sent again without it: nothing is lost.
//!
//! **Would-block contract** (precisely):
//!
//! - `send` returns `Ok(Sent)` when the datagram was copied into its class's
//!   queue (the caller may reuse its buffer). Accepted datagrams of one class
//!   to one destination leave in the order they were accepted (with GSO, a
//!   flush groups a class's queue by destination, so datagrams of a class to
//!   different destinations may be reordered between them), each exactly once, unless the
//!   kernel rejects one with a hard error (counted in `tx_errors`, logged at
//!   debug, dropped — never retried).
//! - `send` returns `Ok(WouldBlock)` only when the class's queue is full
//!   (`batch × gso_max_segments` datagrams, or `batch` without GSO) *and* a
//!   flush of all classes could not make room because the class's kernel send
//!   buffer is full. The datagram was **not** taken: nothing of it is queued;
//!   the caller keeps it and offers it again later. Other classes are unaffected.
//! - [`wants_writable`](Datapath::wants_writable) is true while any class holds
//!   queued datagrams its socket refused with `EWOULDBLOCK`; the caller then
//!   waits for a writable event on a class socket (edge-triggered; a class
//!   socket is registered for writable only while its queue is blocked, since
//!   a registration costs a kernel wake-up per datagram sent: `interest.rs`)
//!   and calls `flush`, which clears it once those queues drained.
//! - Datagrams still queued when the datapath is dropped get one best-effort
//!   flush; whatever the kernel still refuses then is lost.
//! - Call `flush` at the end of every event-loop turn: `send` itself only
//!   reaches the kernel when a queue is full.
//! - A loopback UDP socket never returns `EWOULDBLOCK` (the loopback driver
//!   releases each packet's send-buffer charge as it transmits), so the tests
//!   reach this path through
//!   [`FaultInjector::would_block`](super::fault::FaultInjector::would_block)
//!   (this datapath's [`Datapath::refuse_handovers`]).
//!
//! **Receiving.** `recvmmsg` into `batch` buffers. Without GRO each buffer
//! holds `max_datagram` bytes and a larger datagram (`MSG_TRUNC`) is counted
//! in `rx_truncated` and dropped, never delivered cut short. With `gro` (and a
//! kernel that accepts `UDP_GRO`), each buffer holds a full 64 KiB UDP payload:
//! the kernel may hand over several datagrams of one sender coalesced, with
//! their segment size in a `UDP_GRO` control message; they are split back at
//! that size (the last one may be shorter) before delivery, and any datagram
//! above `max_datagram` is still counted in `rx_truncated` and dropped.
//! `UDP_GRO` is set on every socket of the port's reuseport group, the send
//! sockets too, although only the receive socket is read: the kernel's GRO
//! picks the socket that decides whether a flow may be coalesced by the
//! 4-tuple's hash, without running the steering program, so a flow whose hash
//! picked a send socket was never coalesced (with GRO on the hosts' ends,
//! 18% of a testbed host's datagrams arrived coalesced, 99.3% with every
//! socket set: `tests/testbed_gro.rs`,
//! `bench/results/2026-12-06-gro-every-socket.md`). The coalesced packet is
//! then delivered as any other, steered to the receive socket. One
//! `recv` call reads until the kernel has nothing more or `8 × batch`
//! datagrams were taken; [`SocketDatapath::rx_drained`] tells which, so an
//! edge-triggered loop can call again. (A return of 0 after only truncated or
//! unparsable datagrams can leave more queued; the next arrival re-arms the edge.)
//!
//! IPv4 and IPv6: the bind address decides. An IPv6 datapath sends to an IPv4
//! destination as a v4-mapped address (works when bound to `::` with dual
//! stack, or to a v4-mapped address), sets `IP_TOS` as well as `IPV6_TCLASS`
//! for those, and reports v4-mapped sources as IPv4 addresses.
//!
//! **Files.** This file holds the datapath: sockets, the two ways of sending,
//! the receive loop, counters. `config.rs` holds its settings, errors and own
//! counters; `handover.rs` the `sendmmsg` loop of one class (planning, calls,
//! the kernel's answers); `queue.rs` the pure bookkeeping — a class's queue,
//! regrouping by destination, the plan of one `sendmmsg` call, the split of a
//! GRO buffer — and `sys.rs` the raw system calls (`sendmmsg`, `recvmmsg`,
//! control messages, `setsockopt`) with all of the datapath's `unsafe`.

use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use dlcp_proto::class::Class;
use log::{debug, warn};
use mio::Registry;
use socket2::{Domain, Socket};

use self::bind::bind_port;
use self::handover::{Link, Tally, hand_over};
use self::interest::Interests;
use self::queue::{ClassQueue, Group, Pending, Regroup, order_by_path, regroup, segments};
use self::sys::RxBatch;
use super::api::{Datapath, DatapathStats, Outgoing, SendOutcome};

mod bind;
mod config;
mod handover;
mod interest;
mod procfs;
mod queue;
mod sys;

#[doc(hidden)]
pub use self::queue::fuzzing;

pub use self::config::{
    DatapathError, MAX_BATCH, MAX_GSO_SEGMENTS, MAX_PATHS, MAX_UDP_PAYLOAD_V4, MAX_UDP_PAYLOAD_V6,
    SocketConfig, SocketStats,
};

/// Receive rounds (`recvmmsg` calls of `batch`) per [`Datapath::recv`] call.
const RX_ROUNDS: usize = 8;
/// The receive sockets of paths other than 0 (which peers do not send to)
/// are read once every this many [`Datapath::recv`] calls.
const RX_OTHER_PATHS_EVERY: u64 = 16;
/// Number of classes.
const CLASSES: usize = Class::COUNT;

/// Opens the socket datapath a loaded daemon configuration asks for
/// ([`SocketConfig::from_config`]).
pub fn open(cfg: &dlcp_config::Config) -> Result<SocketDatapath, DatapathError> {
    SocketDatapath::new(SocketConfig::from_config(cfg))
}

/// Where the socket datapath reads the datagrams the kernel dropped on its
/// sockets (`rx_rcvbuf_drops`), chosen once at creation.
#[derive(Debug)]
enum KernelDrops {
    /// `SO_MEMINFO` on each socket (Linux ≥ 4.6): one system call per
    /// socket, whatever else the network namespace holds.
    Meminfo,
    /// Older kernels: /proc/net/udp and /proc/net/udp6 by the sockets'
    /// inodes ([`procfs`]), a walk over every UDP socket of the namespace
    /// (about 0.35 ms with 150 sockets; longer on a host with many).
    Procfs(Vec<u64>),
}

/// The socket datapath: see the [module documentation](self).
#[derive(Debug)]
pub struct SocketDatapath {
    cfg: SocketConfig,
    local: SocketAddr,
    /// Receive socket per path (index = path; path 0's port is `local`'s).
    rx: Vec<Socket>,
    /// Send socket per path and class (index = path × 8 + class).
    tx: Vec<Socket>,
    /// Queue per path and class (index as `tx`).
    queues: Vec<ClassQueue>,
    /// [`Datapath::recv`] calls so far (the other paths' receive sockets
    /// are read every [`RX_OTHER_PATHS_EVERY`]th).
    rx_calls: u64,
    gso_max_payload: usize,
    stats: DatapathStats,
    extra: SocketStats,
    /// `batch` receive buffers of `max_datagram` bytes, or 64 KiB with GRO.
    rx_batch: RxBatch,
    rx_drained: bool,
    groups: Vec<Group>,
    regroup: Regroup,
    /// The descriptors of a `send_batch` run (kept for their capacity).
    lent: Vec<Pending>,
    oversize_logged: bool,
    /// Where [`Datapath::stats`] reads the kernel's drop counts of these sockets.
    kernel_drops: KernelDrops,
    /// The event loop's registrations, once [`Datapath::register`] made them.
    interests: Option<Interests>,
    /// Fault injection: this many hand-overs of a class's queue to its socket
    /// fail with would-block first, without a system call (see
    /// [`Datapath::refuse_handovers`]).
    refusals: [u32; CLASSES],
}

impl SocketDatapath {
    /// Creates the receive socket and the eight class sockets, all bound to
    /// `cfg.bind` (see the [module documentation](self)).
    pub fn new(cfg: SocketConfig) -> Result<SocketDatapath, DatapathError> {
        cfg.validate()?;
        let domain = if cfg.bind.is_ipv6() { Domain::IPV6 } else { Domain::IPV4 };
        let mut extra = SocketStats { rx_steered: true, paths: cfg.paths, ..SocketStats::default() };
        let (mut rx, mut tx) = (Vec::with_capacity(cfg.paths), Vec::with_capacity(cfg.paths * CLASSES));
        let mut local = cfg.bind;
        for p in 0..cfg.paths {
            // Path p on the port p above the first (whose port 0 resolves once).
            let addr = if p == 0 { cfg.bind } else { SocketAddr::new(local.ip(), local.port() + p as u16) };
            let port = bind_port(&cfg, addr, &mut extra)?;
            if p == 0 {
                local = port.local;
            }
            extra.rx_steered &= port.steered;
            rx.push(port.rx);
            tx.extend(port.tx);
        }

        extra.gso_available = cfg.gso && cfg.gso_max_segments > 1 && sys::probe_gso(domain);
        extra.gso_active = extra.gso_available;
        if cfg.gro {
            // UDP_GRO on every socket of each port's reuseport group, not only
            // on the receive socket that the steering program delivers to: the
            // kernel's GRO looks the socket up without the packet, so without
            // running the program, and picks a group member by the 4-tuple's
            // hash; only if that member has UDP_GRO does it coalesce. With it
            // on the receive socket alone, a flow coalesced only when its hash
            // happened to pick that socket (see the module docs).
            extra.gro_active = true;
            for s in rx.iter().chain(&tx) {
                if let Err(e) = sys::enable_gro(s.as_fd()) {
                    debug!("socket datapath {local}: UDP_GRO unavailable: {e}");
                    extra.gro_active = false;
                }
            }
            if !extra.gro_active {
                for s in rx.iter().chain(&tx) {
                    let _ = sys::disable_gro(s.as_fd());
                }
            }
        }
        let gso_max_payload = cfg.max_payload();
        // With GRO a buffer must hold any coalesced packet: a whole UDP payload.
        let rx_slot = if extra.gro_active { 1 << 16 } else { cfg.max_datagram };
        let rx_batch = RxBatch::new(cfg.batch, rx_slot);
        let kernel_drops = match sys::socket_drops(rx[0].as_fd()) {
            Ok(_) => KernelDrops::Meminfo,
            Err(e) => {
                debug!(
                    "socket datapath {local}: SO_MEMINFO unavailable ({e}): drop counts from /proc/net/udp"
                );
                KernelDrops::Procfs(rx.iter().chain(&tx).filter_map(|s| procfs::inode(s.as_fd())).collect())
            }
        };
        Ok(SocketDatapath {
            kernel_drops,
            interests: None,
            local,
            rx,
            queues: (0..tx.len()).map(|_| ClassQueue::default()).collect(),
            tx,
            cfg,
            rx_calls: 0,
            gso_max_payload,
            stats: DatapathStats::default(),
            extra,
            rx_batch,
            rx_drained: true,
            groups: Vec::new(),
            regroup: Regroup::default(),
            lent: Vec::new(),
            oversize_logged: false,
            refusals: [0; CLASSES],
        })
    }

    /// The configuration the datapath was created with (port 0 not resolved;
    /// see [`Datapath::local_addr`]).
    pub fn config(&self) -> &SocketConfig {
        &self.cfg
    }

    /// Counters and state beyond [`DatapathStats`].
    pub fn socket_stats(&self) -> SocketStats {
        let mut s = self.extra.clone();
        for (i, q) in self.queues.iter().enumerate() {
            s.tx_queued[i % CLASSES] += q.items.len();
        }
        s
    }

    /// True if the last [`Datapath::recv`] stopped because the kernel had no
    /// more datagrams (false: it stopped at its per-call limit; call again).
    pub fn rx_drained(&self) -> bool {
        self.rx_drained
    }

    /// The send socket of `class` on path 0 (for inspection, e.g.
    /// `getsockopt`). Token `first_token + 1 + class` in [`Datapath::register`]
    /// (path `p`'s: `first_token + 9p + 1 + class`).
    pub fn class_socket(&self, class: Class) -> BorrowedFd<'_> {
        self.tx[class.index()].as_fd()
    }

    /// The receive socket of path 0. Token `first_token` in
    /// [`Datapath::register`] (path `p`'s: `first_token + 9p`).
    pub fn rx_socket(&self) -> BorrowedFd<'_> {
        self.rx[0].as_fd()
    }

    /// Removes the sockets from a mio registry (dropping the datapath also
    /// removes them, by closing them).
    pub fn deregister(&mut self, registry: &Registry) -> io::Result<()> {
        match self.interests.take() {
            Some(i) => i.deregister(registry, &self.rx, &self.tx),
            None => Ok(()),
        }
    }

    /// Class sockets the event loop's poll watches for writable now: those
    /// whose queue holds datagrams the kernel refused (see `interest.rs`).
    pub fn watched_for_writable(&self) -> usize {
        self.interests.as_ref().map_or(0, Interests::watched)
    }

    /// Watch queue `qi`'s socket for writable exactly while the queue is
    /// blocked (nothing before [`Datapath::register`]).
    fn watch(&mut self, qi: usize) {
        if let Some(i) = self.interests.as_mut() {
            i.set_writable(qi, self.tx[qi].as_raw_fd(), self.queues[qi].blocked);
        }
    }

    /// Queue capacity of a class, in datagrams.
    fn queue_cap(&self) -> usize {
        if self.extra.gso_active { self.cfg.batch * self.cfg.gso_max_segments } else { self.cfg.batch }
    }

    /// `dst` in the sockets' family, if it can be reached from it.
    fn normalise(&self, dst: SocketAddr) -> Option<SocketAddr> {
        match (self.local, dst) {
            (SocketAddr::V4(_), SocketAddr::V4(_)) | (SocketAddr::V6(_), SocketAddr::V6(_)) => Some(dst),
            (SocketAddr::V6(_), SocketAddr::V4(d)) => {
                Some(SocketAddr::V6(SocketAddrV6::new(d.ip().to_ipv6_mapped(), d.port(), 0, 0)))
            }
            (SocketAddr::V4(_), SocketAddr::V6(d)) => {
                d.ip().to_ipv4_mapped().map(|ip| SocketAddr::new(IpAddr::V4(ip), d.port()))
            }
        }
    }

    /// Flushes every class, highest first (each class on every path).
    fn flush_all(&mut self) {
        for c in (0..CLASSES).rev() {
            for q in (c..self.queues.len()).step_by(CLASSES) {
                if !self.queues[q].items.is_empty() {
                    self.flush_queue(q);
                }
            }
        }
    }

    /// Hands queue `qi` (path `qi / 8`, class `qi % 8`) to its socket until
    /// it is empty or the socket would block.
    fn flush_queue(&mut self, qi: usize) {
        let c = qi % CLASSES;
        if self.extra.gso_active && self.cfg.gso_max_segments > 1 {
            self.queues[qi].group_by_destination(&mut self.regroup);
        }
        let link = link(&self.tx, &self.cfg, self.gso_max_payload, self.local, qi);
        let q = &self.queues[qi];
        let tally = Tally { stats: &mut self.stats, extra: &mut self.extra, refusals: &mut self.refusals[c] };
        let bytes = |it: &Pending| -> [&[u8]; 3] { [&q.buf[it.off..it.off + it.len], &[], &[]] };
        let handed = hand_over(&link, tally, &q.items, &bytes, &mut self.groups);
        let q = &mut self.queues[qi];
        q.consume(handed.done);
        q.blocked = handed.blocked && !q.items.is_empty();
        self.watch(qi);
    }

    /// `dst` in the sockets' family, for a datagram of `len` bytes; `None`
    /// (counted as an error) if it is too long or cannot be reached.
    fn admit(&mut self, dst: SocketAddr, len: usize) -> Option<SocketAddr> {
        if len > self.cfg.max_datagram {
            self.stats.tx_errors += 1;
            if !self.oversize_logged {
                self.oversize_logged = true;
                warn!(
                    "socket datapath {}: dropped a {len}-byte datagram above max_datagram {} (further ones counted only)",
                    self.local, self.cfg.max_datagram
                );
            }
            return None;
        }
        let normalised = self.normalise(dst);
        if normalised.is_none() {
            self.stats.tx_errors += 1;
            debug!("socket datapath {}: cannot reach {dst} from this address family", self.local);
        }
        normalised
    }

    /// Hand `run`, consecutive datagrams of class `c`, to the class's socket
    /// of each datagram's path, from where they lie (each path's regrouped by
    /// destination for GSO); what a socket refuses, and everything behind a
    /// queue that is not empty, is copied into the queue of its path and
    /// class.
    fn send_run(&mut self, c: usize, run: &[Outgoing<'_>]) {
        let mut items = std::mem::take(&mut self.lent);
        items.clear();
        for (k, d) in run.iter().enumerate() {
            if let Some(dst) = self.admit(d.dst, d.len()) {
                items.push(Pending { dst, off: k, len: d.len() });
            }
        }
        if self.extra.gso_active && self.cfg.gso_max_segments > 1 {
            regroup(&mut items, &mut self.regroup);
        }
        let paths = self.cfg.paths;
        let path = |it: &Pending| usize::from(run[it.off].path) % paths;
        // One path after the other where that keeps every destination's
        // order (else consecutive runs of a path, as given).
        if paths > 1 {
            order_by_path(&mut items, path, &mut self.regroup);
        }
        let mut at = 0;
        while at < items.len() {
            let p = path(&items[at]);
            let n = items[at..].iter().take_while(|it| path(it) == p).count();
            self.send_path_run(p * CLASSES + c, run, &items[at..at + n]);
            at += n;
        }
        self.lent = items;
    }

    /// [`SocketDatapath::send_run`] of the datagrams `items` (of `run`) on
    /// the path and class of queue `qi`.
    fn send_path_run(&mut self, qi: usize, run: &[Outgoing<'_>], items: &[Pending]) {
        let c = qi % CLASSES;
        let mut done = 0;
        if self.queues[qi].items.is_empty() {
            let link = link(&self.tx, &self.cfg, self.gso_max_payload, self.local, qi);
            let tally =
                Tally { stats: &mut self.stats, extra: &mut self.extra, refusals: &mut self.refusals[c] };
            let sent_before = tally.stats.tx_packets[c];
            let handed = hand_over(&link, tally, items, &|it: &Pending| run[it.off].parts, &mut self.groups);
            self.extra.tx_lent += self.stats.tx_packets[c] - sent_before;
            done = handed.done;
            self.queues[qi].blocked = handed.blocked;
        }
        let q = &mut self.queues[qi];
        for it in &items[done..] {
            q.push(it.dst, &run[it.off].parts);
        }
        self.extra.tx_copied += (items.len() - done) as u64;
        q.blocked &= !q.items.is_empty();
        self.watch(qi);
    }
}

/// The socket of queue `qi` (of `tx`: path `qi / 8`, class `qi % 8`) and
/// the settings a hand-over to it needs.
fn link<'a>(
    tx: &'a [Socket],
    cfg: &SocketConfig,
    gso_max_payload: usize,
    local: SocketAddr,
    qi: usize,
) -> Link<'a> {
    Link {
        fd: tx[qi].as_fd(),
        class: qi % CLASSES,
        batch: cfg.batch,
        gso_limits: (cfg.gso_max_segments, gso_max_payload),
        local,
    }
}

impl Datapath for SocketDatapath {
    fn rx_pending(&self) -> bool {
        !self.rx_drained
    }

    fn describe(&self) -> String {
        let ports = match self.rx.len() {
            1 => format!("udp {}", self.local),
            n => format!("udp {} + {} more source ports (paths)", self.local, n - 1),
        };
        format!(
            "socket ({ports}, 8 class sockets + 1 receive socket per port, receive {}, GSO {}, GRO {}, batch {})",
            if self.extra.rx_steered { "steered by reuseport BPF" } else { "from every socket" },
            if self.extra.gso_active {
                format!("on (max {} segments)", self.cfg.gso_max_segments)
            } else if self.cfg.gso && self.extra.gso_fallbacks > 0 {
                "off (kernel refused it)".to_string()
            } else if self.cfg.gso && self.cfg.gso_max_segments > 1 {
                "off (kernel lacks UDP_SEGMENT)".to_string()
            } else {
                "off".to_string()
            },
            if self.extra.gro_active { "on" } else { "off" },
            self.cfg.batch
        )
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn send(&mut self, dst: SocketAddr, class: Class, datagram: &[u8]) -> io::Result<SendOutcome> {
        let c = class.index();
        let Some(dst) = self.admit(dst, datagram.len()) else { return Ok(SendOutcome::Sent) };
        if self.queues[c].items.len() >= self.queue_cap() {
            self.flush_all();
            if self.queues[c].items.len() >= self.queue_cap() {
                self.stats.tx_would_block += 1;
                return Ok(SendOutcome::WouldBlock);
            }
        }
        self.queues[c].push(dst, &[datagram]);
        self.extra.tx_copied += 1;
        Ok(SendOutcome::Sent)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_all();
        Ok(())
    }

    /// Datagrams still queued go first (highest class first); then `batch`,
    /// in runs of one class, each run handed to its class's socket before the
    /// next (see the [module documentation](self)).
    fn send_batch(&mut self, batch: &[Outgoing<'_>]) -> io::Result<()> {
        self.flush_all();
        let mut i = 0;
        while i < batch.len() {
            let class = batch[i].class;
            let n = batch[i..].iter().take_while(|d| d.class == class).count();
            self.send_run(class.index(), &batch[i..i + n]);
            i += n;
        }
        Ok(())
    }

    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
        let limit = self.cfg.batch * RX_ROUNDS;
        let mut taken = 0;
        let mut delivered = 0;
        // Peers send to path 0's port: the other paths' receive sockets only
        // see strays, read every RX_OTHER_PATHS_EVERY calls. Unsteered, the
        // class sockets of every path are read too.
        let others = self.rx_calls % RX_OTHER_PATHS_EVERY == 0;
        self.rx_calls += 1;
        let rx_socks = if others { self.rx.len() } else { 1 };
        let sockets = rx_socks + if self.extra.rx_steered { 0 } else { self.tx.len() };
        self.rx_drained = true;
        for k in 0..sockets {
            let fd = if k < rx_socks { self.rx[k].as_fd() } else { self.tx[k - rx_socks].as_fd() };
            loop {
                if taken >= limit {
                    self.rx_drained = false;
                    return Ok(delivered);
                }
                self.stats.rx_syscalls += 1;
                let n = match self.rx_batch.recv(fd) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        self.stats.rx_errors += 1;
                        debug!("socket datapath {}: receive failed: {e}", self.local);
                        break;
                    }
                };
                for (i, m) in self.rx_batch.meta()[..n].iter().enumerate() {
                    if m.truncated {
                        taken += 1;
                        self.stats.rx_truncated += 1;
                        continue;
                    }
                    let Some(src) = m.src else {
                        taken += 1;
                        self.stats.rx_errors += 1;
                        continue;
                    };
                    let src = match src {
                        SocketAddr::V6(s) => match s.ip().to_ipv4_mapped() {
                            Some(ip) => SocketAddr::new(IpAddr::V4(ip), s.port()),
                            None => src,
                        },
                        v4 => v4,
                    };
                    if m.segment > 0 && m.len > m.segment {
                        self.extra.gro_packets += 1;
                        self.extra.gro_segments += m.len.div_ceil(m.segment) as u64;
                    }
                    let buf = self.rx_batch.datagram(i);
                    for r in segments(m.len, m.segment) {
                        taken += 1;
                        if r.len() > self.cfg.max_datagram {
                            self.stats.rx_truncated += 1;
                            continue;
                        }
                        self.stats.rx_packets += 1;
                        self.stats.rx_bytes += r.len() as u64;
                        delivered += 1;
                        f(src, &buf[r]);
                    }
                }
                if n < self.rx_batch.slots() {
                    break; // recvmmsg stopped early: the socket is drained
                }
            }
        }
        Ok(delivered)
    }

    fn wants_writable(&self) -> bool {
        self.queues.iter().any(|q| q.blocked)
    }

    /// Path `p`'s receive socket gets token `first_token + 9p`, its class
    /// sockets the eight after it. A class socket is watched for writable
    /// only while its queue is blocked (`interest.rs` says why).
    fn register(&mut self, registry: &Registry, first_token: usize) -> io::Result<usize> {
        let (interests, tokens) =
            Interests::register(registry, first_token, &self.rx, &self.tx, self.extra.rx_steered)?;
        self.interests = Some(interests);
        for qi in 0..self.queues.len() {
            self.watch(qi);
        }
        Ok(tokens)
    }

    /// The counters, with the kernel's receive-buffer drops on these
    /// sockets ([`KernelDrops`]; the loop asks a few times a second).
    fn stats(&self) -> DatapathStats {
        let rx_rcvbuf_drops = match &self.kernel_drops {
            KernelDrops::Meminfo => self
                .rx
                .iter()
                .chain(&self.tx)
                .filter_map(|s| sys::socket_drops(s.as_fd()).ok())
                .map(u64::from)
                .sum(),
            KernelDrops::Procfs(inodes) => procfs::drops(inodes),
        };
        DatapathStats { rx_rcvbuf_drops, ..self.stats.clone() }
    }

    /// The socket datapath's own counters ([`SocketStats`]: GSO and GRO use).
    fn detail_json(&self) -> Option<serde_json::Value> {
        serde_json::to_value(self.socket_stats()).ok()
    }

    /// Re-mark every class socket (`IP_TOS`/`IPV6_TCLASS`, then `SO_PRIORITY`,
    /// in that order as at creation). Datagrams already queued are flushed
    /// first, with the marks they were queued under.
    fn set_marking(&mut self, dscp: [u8; CLASSES], so_priority: [u8; CLASSES]) -> io::Result<bool> {
        if let Some(c) = dscp.iter().position(|&d| d > 63) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("class {c}: DSCP above 63")));
        }
        let _ = Datapath::flush(self);
        for (i, s) in self.tx.iter().enumerate() {
            let c = i % CLASSES;
            bind::mark(s, self.local, c, dscp[c])?;
            if let Err(e) = s.set_priority(u32::from(so_priority[c])) {
                self.extra.so_priority_failures += 1;
                warn!(
                    "socket datapath {}: cannot set SO_PRIORITY {} for class {c}: {e} \
                     (values above 6 need CAP_NET_ADMIN)",
                    self.local, so_priority[c]
                );
            }
        }
        self.cfg.dscp = dscp;
        self.cfg.so_priority = so_priority.map(u32::from);
        Ok(true)
    }

    /// The next `attempts` `sendmmsg` calls of `class`'s socket are not made
    /// and fail with would-block instead (a full kernel send buffer).
    fn refuse_handovers(&mut self, class: Class, attempts: u32) -> bool {
        self.refusals[class.index()] = attempts;
        true
    }
}

impl Drop for SocketDatapath {
    fn drop(&mut self) {
        self.flush_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_rejects_out_of_range() {
        let base = SocketConfig::new("127.0.0.1:0".parse().unwrap());
        assert!(base.validate().is_ok());
        for bad in [
            SocketConfig { batch: 0, ..base.clone() },
            SocketConfig { batch: MAX_BATCH + 1, ..base.clone() },
            SocketConfig { gso_max_segments: 0, ..base.clone() },
            SocketConfig { gso_max_segments: 65, ..base.clone() },
            SocketConfig { max_datagram: 0, ..base.clone() },
            SocketConfig { max_datagram: MAX_UDP_PAYLOAD_V4 + 1, ..base.clone() },
            SocketConfig { dscp: [64, 0, 0, 0, 0, 0, 0, 0], ..base.clone() },
        ] {
            let e = bad.validate().unwrap_err();
            assert!(matches!(e, DatapathError::InvalidConfig { .. }), "{e}");
        }
        let v6 = SocketConfig {
            max_datagram: MAX_UDP_PAYLOAD_V6,
            ..SocketConfig::new("[::1]:0".parse().unwrap())
        };
        assert!(v6.validate().is_ok());
    }
}
