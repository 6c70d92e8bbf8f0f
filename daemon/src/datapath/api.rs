//! What every datapath is to the event loop: the [`Datapath`] trait, its
//! counters ([`DatapathStats`]), what it sends ([`Outgoing`]) and the send
//! outcome of its copying path ([`SendOutcome`]), and the
//! boxed datapath that forwards to its content.

use std::io;
use std::net::SocketAddr;

use dlcp_proto::class::Class;
use dlcp_proto::stats::{By, Desc};

const DATAPATH_ERRORS: &str = "Datapath errors and would-blocks, by kind";
const DROPPED: &str = "Received datagrams dropped, by reason";

dlcp_proto::counters! {
    /// Per-class and total counters of a datapath (`datapath_counters` in
    /// `dlcpctl stats --json`; the ones a metric exports say so in their
    /// description).
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct DatapathStats {
        /// Datagrams handed to the kernel/NIC per class.
        pub tx_packets: [u64; 8] => [Desc::new(
            "tx_packets_per_class",
            "datapath_tx_packets",
            "Datagrams the datapath handed to the kernel or NIC, per priority class",
        )
        .by(By::Class)],
        /// Bytes handed to the kernel/NIC per class.
        pub tx_bytes: [u64; 8] => [Desc::new(
            "tx_bytes_per_class",
            "datapath_tx_bytes",
            "Bytes the datapath handed to the kernel or NIC, per priority class",
        )
        .by(By::Class)],
        /// Datagrams received.
        pub rx_packets: u64 => [Desc::new("rx_packets", "datapath_rx_packets", "Datagrams the datapath received")],
        /// Bytes received.
        pub rx_bytes: u64 => [Desc::new("rx_bytes", "datapath_rx_bytes", "Bytes the datapath received")],
        /// Sends refused because the socket/queue was full (retried later).
        pub tx_would_block: u64 => [Desc::new("tx_would_block", "datapath_errors", DATAPATH_ERRORS)
            .fixed(&[("kind", "tx_would_block")])],
        /// Send errors other than would-block (e.g. unreachable), per errno, summed.
        pub tx_errors: u64 => [Desc::new("tx_errors", "datapath_errors", DATAPATH_ERRORS).fixed(&[("kind", "tx")])],
        /// Receive errors other than would-block.
        pub rx_errors: u64 => [Desc::new("rx_errors", "datapath_errors", DATAPATH_ERRORS).fixed(&[("kind", "rx")])],
        /// Datagrams received that were truncated (larger than the receive buffer).
        pub rx_truncated: u64 => [Desc::new("rx_truncated", "rx_dropped", DROPPED).by(By::Reason("truncated"))],
        /// Datagrams the kernel dropped because the daemon's socket receive
        /// buffers were full (`RcvbufErrors`, counted per socket: `SO_MEMINFO`'s
        /// drop count, the drops column of /proc/net/udp, of the datapath's sockets).
        pub rx_rcvbuf_drops: u64 => [Desc::new("rx_rcvbuf_drops", "rx_dropped", DROPPED)
            .by(By::Reason("socket_buffer"))],
        /// Frames the NIC dropped because its receive ring or the mbuf pool
        /// was exhausted (DPDK `imissed + rx_nombuf`).
        pub rx_ring_overruns: u64 => [Desc::new("rx_ring_overruns", "rx_dropped", DROPPED).by(By::Reason("nic_ring"))],
        /// Send system calls (sendmsg/sendmmsg).
        pub tx_syscalls: u64 => [Desc::new("tx_syscalls", "datapath_syscalls", "Datapath system calls, by direction")
            .fixed(&[("direction", "tx")])],
        /// Receive system calls (recvmsg/recvmmsg).
        pub rx_syscalls: u64 => [Desc::new("rx_syscalls", "datapath_syscalls", "Datapath system calls, by direction")
            .fixed(&[("direction", "rx")])],
    }
}

/// Outcome of [`Datapath::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOutcome {
    /// Accepted (queued for the wire, or sent).
    Sent,
    /// The queue for this class is full: keep the datagram and retry when the
    /// datapath is writable again (see [`Datapath::wants_writable`]).
    WouldBlock,
}

/// One datagram to send: to `dst`, marked with `class`'s DSCP, on `path`, its bytes the
/// concatenation of `parts` (dlcpd lends a datagram as header, payload and
/// tag, where each lies: see `dlcp_proto::endpoint::TxView`).
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// Destination.
    pub dst: SocketAddr,
    /// Priority class.
    pub class: Class,
    /// The path: it leaves from source port `local port + path`
    /// (`dlcp_proto::paths`; a path the datapath does not have wraps round).
    pub path: u8,
    /// The datagram's bytes, in three slices sent back to back.
    pub parts: [&'a [u8]; 3],
}

impl<'a> Outgoing<'a> {
    /// A datagram that is one slice, on path 0.
    pub fn whole(dst: SocketAddr, class: Class, datagram: &'a [u8]) -> Outgoing<'a> {
        Outgoing { dst, class, path: 0, parts: [datagram, &[], &[]] }
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.parts.iter().map(|p| p.len()).sum()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its bytes, copied into one buffer (for a datapath that must keep it).
    pub fn to_vec(&self) -> Vec<u8> {
        self.parts.concat()
    }
}

/// Moves datagrams between the event loop and the network. Non-blocking:
/// no method waits.
///
/// Two ways to send: [`send_batch`](Datapath::send_batch), the event loop's,
/// hands datagrams to the kernel or NIC at once from where they lie, in the
/// order given; [`send`](Datapath::send) copies one datagram into the
/// datapath's per-class queues, which [`flush`](Datapath::flush) empties
/// highest class first.
pub trait Datapath {
    /// A human-readable name with the reason it was chosen, e.g.
    /// `"socket (udp 10.0.0.1:7700, 8 class sockets, GSO off)"`.
    fn describe(&self) -> String;

    /// The local address peers send to.
    fn local_addr(&self) -> SocketAddr;

    /// Queue or send one datagram to `dst`, marked with `class`'s DSCP.
    /// Errors other than would-block are counted and reported as `Ok(Sent)`
    /// after logging (a lost datagram is the protocol's business); `Err` is
    /// returned only for failures that make the datapath unusable.
    fn send(&mut self, dst: SocketAddr, class: Class, datagram: &[u8]) -> io::Result<SendOutcome>;

    /// Push batched datagrams to the kernel/NIC (e.g. one `sendmmsg`).
    fn flush(&mut self) -> io::Result<()>;

    /// Hand `batch` to the kernel or NIC now, without copying it first
    /// (scatter-gather), **in the order given**: datagrams of one class keep
    /// their order, and a datagram never reaches the kernel before one of
    /// another class given ahead of it — except that within a run of
    /// consecutive datagrams of one class, datagrams to different
    /// destinations may be regrouped by destination (each destination's in
    /// order), so that GSO carries runs. Datagrams still queued from earlier
    /// ([`send`](Datapath::send), or refused before) go first.
    ///
    /// Never refuses: a datagram the kernel or NIC will not take now
    /// (would-block, an empty mbuf pool) is copied into the datapath's queue
    /// of its class, and every later datagram of that class follows it there,
    /// until [`flush`](Datapath::flush) empties the queue;
    /// [`wants_writable`](Datapath::wants_writable) says so, and the caller
    /// should hold further datagrams back until it clears. Errors other than
    /// would-block are counted and the datagram dropped, as in `send`; `Err`
    /// only for failures that make the datapath unusable.
    fn send_batch(&mut self, batch: &[Outgoing<'_>]) -> io::Result<()>;

    /// Receive every datagram available now (up to an internal batch limit per
    /// call), calling `f(source, bytes)` for each. Returns how many were delivered.
    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize>;

    /// True if the last [`Datapath::recv`] stopped at its per-call limit rather
    /// than because nothing was left: call it again before waiting for readiness
    /// (edge-triggered registrations will not report the rest).
    fn rx_pending(&self) -> bool {
        false
    }

    /// True if a send returned [`SendOutcome::WouldBlock`] and the loop should
    /// wait for writability before sending more.
    fn wants_writable(&self) -> bool;

    /// Register the datapath's file descriptors with a mio registry, using
    /// tokens from `first_token` upward; returns how many tokens it used.
    fn register(&mut self, registry: &mio::Registry, first_token: usize) -> io::Result<usize>;

    /// Counters.
    fn stats(&self) -> DatapathStats;

    /// How soon the event loop must poll this datapath again even if no file
    /// descriptor is ready: `None` (the default) when readiness events suffice;
    /// a poll-mode datapath without descriptors (DPDK) returns a short interval,
    /// zero while packets keep coming, backing off when idle.
    fn poll_hint(&self) -> Option<std::time::Duration> {
        None
    }

    /// Datapath-specific counters (e.g. per NIC queue) for `dlcpctl stats --json`.
    fn detail_json(&self) -> Option<serde_json::Value> {
        None
    }

    /// Change the class → DSCP and class → `SO_PRIORITY` maps from now on (a
    /// configuration reload). Returns `Ok(false)` if this datapath cannot change
    /// them while running (the reload then reports them as needing a restart).
    fn set_marking(&mut self, dscp: [u8; 8], so_priority: [u8; 8]) -> io::Result<bool> {
        let _ = (dscp, so_priority);
        Ok(false)
    }

    /// Fault injection, for tests (call it through
    /// [`FaultInjector::would_block`](super::fault::FaultInjector::would_block)): the next `attempts` hand-overs
    /// of `class`'s queued datagrams to the kernel or NIC fail as if its
    /// buffer were full, without reaching it, so the datapath's own
    /// would-block path runs. Returns false if this datapath has no such point
    /// (the default).
    fn refuse_handovers(&mut self, class: Class, attempts: u32) -> bool {
        let _ = (class, attempts);
        false
    }
}

/// A boxed datapath is a datapath (so [`FaultInjector`](super::fault::FaultInjector)
/// can wrap the `Box<dyn Datapath>` that [`open`](super::open) returns). Every method is forwarded,
/// the defaulted ones included.
impl<D: Datapath + ?Sized> Datapath for Box<D> {
    fn describe(&self) -> String {
        (**self).describe()
    }

    fn local_addr(&self) -> SocketAddr {
        (**self).local_addr()
    }

    fn send(&mut self, dst: SocketAddr, class: Class, datagram: &[u8]) -> io::Result<SendOutcome> {
        (**self).send(dst, class, datagram)
    }

    fn flush(&mut self) -> io::Result<()> {
        (**self).flush()
    }

    fn send_batch(&mut self, batch: &[Outgoing<'_>]) -> io::Result<()> {
        (**self).send_batch(batch)
    }

    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
        (**self).recv(f)
    }

    fn rx_pending(&self) -> bool {
        (**self).rx_pending()
    }

    fn wants_writable(&self) -> bool {
        (**self).wants_writable()
    }

    fn register(&mut self, registry: &mio::Registry, first_token: usize) -> io::Result<usize> {
        (**self).register(registry, first_token)
    }

    fn stats(&self) -> DatapathStats {
        (**self).stats()
    }

    fn poll_hint(&self) -> Option<std::time::Duration> {
        (**self).poll_hint()
    }

    fn detail_json(&self) -> Option<serde_json::Value> {
        (**self).detail_json()
    }

    fn set_marking(&mut self, dscp: [u8; 8], so_priority: [u8; 8]) -> io::Result<bool> {
        (**self).set_marking(dscp, so_priority)
    }

    fn refuse_handovers(&mut self, class: Class, attempts: u32) -> bool {
        (**self).refuse_handovers(class, attempts)
    }
}
