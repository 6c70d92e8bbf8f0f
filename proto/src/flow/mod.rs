//! Receiver-driven flow control: a receiver lets each sender have a bounded
//! number of DATA datagrams in flight towards it, and extends that credit as
//! the datagrams arrive.
//!
//! In the transpose allreduce every rank receives from all others at once
//! (incast). An open-loop pacer cannot know how fast a receiver drains —
//! its port, its CPU, its socket buffer — and a receiver short of any of
//! them overflows and drops what the senders then repair. Only the receiver
//! knows its capacity, so it decides: the scheme is credit-based pull as in
//! EQDS (Olteanu et al., "An edge-queued datagram service for all datacenter
//! traffic", NSDI 2022) and NDP's pull queue (Handley et al., SIGCOMM 2017),
//! with TCP's cumulative window edge so that lost credit repairs itself:
//!
//! - Every DATA datagram from `s` to `r` (first pass or repair, any op, any
//!   phase) carries the pair's **data sequence number** `dseq`, 0, 1, 2, …
//!   in the header's `seq` field (its low 32 bits; both ends keep 64).
//! - `r` grants `s` a cumulative **limit**: `s` sends DATA to `r` only while
//!   its next `dseq` is below the limit. Both ends start with the limit at
//!   the **unscheduled** window, a quarter of the sender's share of the
//!   window ([`FlowConfig::per_sender`]; at least `min_per_sender`): what a
//!   sender may send before it hears anything.
//! - **Credit rides on every packet** (wire version 9): each packet from `r`
//!   to `s` but HELLO and GOODBYE carries, in its `credit` field, the limit
//!   as of when it leaves (`Flow::piggyback`). In a collective every pair
//!   of ranks sends each other DATA both ways, so a GRANT packet is rarely
//!   needed (64 ranks, 1 MB: 0.6 GRANTs per peer and op, 2.0 when credit
//!   went only in GRANTs).
//! - **Credit by need.** The limit `r` gives is `highest dseq seen + 1 +
//!   want` (at most a window), `want` being what `r` still waits for from
//!   `s` — the missing chunks of its open transfers from `s` — plus the
//!   unscheduled window for `s`'s next op. Before `r` has reduced its own
//!   shard of an op, it wants only `s`'s reduce-scatter chunks, not its
//!   (short) all-gather: every owner done early would otherwise send its
//!   all-gather, whose classes outrank the reduce-scatter's, into `r`'s
//!   port at once, and the last contributions `r` waits for would wait
//!   behind it (64 ranks: 2.67 ms per clean op instead of 1.89). The hold
//!   ends when `r` reduces or NACKs a reduce-scatter chunk in answer to a
//!   LAST or PROBE (a repair is a round trip away; a NACK sent because a
//!   sender went quiet does not end it: that tail is most often still in
//!   `r`'s port queue), and is not used below 8 ranks, where it idles the
//!   port more than it saves (`Endpoint::wants`, `Op::wants_from`). A
//!   piggybacked limit allows one datagram more while `r` holds, so two
//!   ranks that hold each other still carry each other's credit. Where
//!   that one datagram is a whole all-gather (a shard of one chunk: 1,024
//!   ranks, 1 MB), the owner sends it, and the rest of an all-gather to a
//!   rank not yet known to have reduced, at the op's lowest reduce-scatter
//!   class (its repairs at their own class once `r`'s all-gather arrived),
//!   so at `r`'s port it waits behind the contributions `r` still waits
//!   for instead of overtaking them (`Op::network_class`; 1,024 ranks: 2.43
//!   → 1.88 ms per op).
//! - `r` also sends the limit in a GRANT when at most three quarters of the
//!   credit it wants to give are left and the sender said it has more
//!   waiting than its credit covers (the DATA flag BACKLOG), a quarter
//!   without BACKLOG, or when an op reduced and a held sender has no DATA
//!   of `r`'s on its way to carry the news. While DATA of `r`'s for the
//!   sender is queued and sendable (it carries the limit a little later),
//!   BACKLOG is not heeded (64 ranks, 1 MB, clean: GRANTs 0.41 → 0.05 per
//!   peer and op, op time unchanged; sending none then made 64 ranks ×
//!   64 MB 1.46× slower). (Granting at half a window left
//!   the senders idle for part of every round trip in the simulator: the
//!   4-rank allreduce of `flow_sim.rs` took 1.4× as long as without
//!   credit.) A limit is cumulative and idempotent, so a lost one is
//!   replaced by the next; the credit in flight towards `r` from all
//!   senders stays below [`FlowConfig::window`], which the datapath sizes
//!   below what `r` can hold unread (its socket buffer or NIC ring).
//! - Datagrams lost in the network do not leak credit while later ones
//!   arrive (the limit follows the highest `dseq`, not a count). When a
//!   sender has used all its credit and heard no GRANT for its retry
//!   timeout, it sends a credit REQUEST naming how many it sent; `r` takes
//!   everything below that as lost and grants by need again. The request
//!   backs off like a PROBE and is re-sent until credit comes: a transfer
//!   never waits on a lost GRANT or a lost tail for longer than a probe
//!   timeout.
//! - A peer that restarts (a new generation) starts over on both sides.
//! - Per sender, the receiver also records which of the last 1,024 data
//!   sequence numbers arrived, so that with several paths a LAST DATA or
//!   PROBE is compared with exactly what arrived of what was sent before
//!   it, and measures how late the ones it then found missing came: its
//!   reordering window, how long it waits for them ([`arrivals`]).
//!
//! - Per sender, the receiver also measures the longest pause within a
//!   transfer that the sender came back from (first-pass DATA after
//!   earlier DATA of the same transfer; remembered for one to two seconds,
//!   `Flow::pause`). A receive deadline takes a sender for quiet only
//!   after a silence of twice that: a daemon that is not scheduled for a
//!   few ms on a loaded host is alive, its datagrams on their way (8 hosts
//!   on 2 cores, clean: deadline NACKs 2,043 → 0 and deadline closes 5 → 0
//!   in 6 ops of 64 MiB; `bench/results/2026-12-04-deadline-pauses.md`).
//!   Where the network lost next to nothing lately (the endpoint's loss
//!   meter), chunks the sender sent and the receiver has not seen are taken
//!   for on their way for as long after the transfer's latest chunk: the
//!   grace after a PROBE or LAST and the quiet timer wait that out
//!   (`Retry::hold`; same runs: least delivered 99.66% → 100.00%, with the
//!   early-datagram credit below).
//! - DATA that arrives for an op the receiver has not started (its early
//!   buffer) counts against the sender's unscheduled window until it is
//!   replayed (`Flow::note_early`), and a credit REQUEST is granted by need
//!   like DATA: a sender an op ahead gets one unscheduled window into the
//!   early buffer, not a stream (simulator: 4,562 early datagrams → 63 for
//!   3 senders of 21).
//!
//! The receiver splits its window evenly among the ranks that may send to it;
//! the senders' own transmit queues keep the priority order (control, then
//! repairs, then classes high to low) within the credit each receiver gives.
//! The pacer remains as a ceiling on the sender's rate.
//!
//! A window sized for the receiver's socket buffer is far more than a slow
//! switch port's queue holds. So each sender's window also adapts, at the
//! receiver, to what its path carries: a run of three or more of the sender's
//! datagrams missing (a dseq gap: an overflowing queue drops runs, while
//! random loss rarely takes three in a row, so bounded random loss does not
//! shrink anything) halves that sender's window, at most once per window of
//! datagrams and never below a 64th of its share; it grows back by one
//! datagram per window of in-order arrivals, up to the configured share
//! (additive increase, multiplicative decrease, as in TCP's congestion
//! avoidance, but decided where the queue's effect is seen). A gap is judged
//! only after a reordering wait: what is still missing when the highest has
//! moved on is the run ([`Flow::note_data`]; session 40, before which a gap
//! within one path was judged at once and reordering between flowlets cut
//! windows spuriously). On the leaf-spine testbed (500
//! Mbit/s spine links, 50-packet queues: a few datagrams of bandwidth-delay
//! product per pair) a floor of an eighth (59 datagrams at MTU 1500) and an
//! increase per half window left 45-52k datagrams a run in the spines'
//! queues; a 64th and an increase per window, 9-16k (session 39,
//! `bench/results/2026-12-04-path-order.md`). The price is at heavy random
//! loss, whose runs now cut deeper: the simulator's 30% loss rows took
//! 1.2× as long (1.0-1.1× again with the reordering wait).
//!
//! This is a partial answer: a queue shared by many senders drops each
//! sender's datagrams one here and one there, which a run signal misses, so
//! a slow port still drops a share of what it receives (simulator, a port at
//! a third of the rate behind 50 packets: 47% of arrivals dropped, against
//! 74% without flow control; the emulated cluster, 8 hosts, a 500 Mbit/s
//! port: 0.18–1.29% of the datagrams into it, `bench/slow_port.py`). The
//! signal that would separate that queue's drops from random loss is its
//! delay (Swift) or ECN marks: on the two-core emulated cluster ECN has no
//! marking qdisc and a one-way-delay prototype measured ≥ 6.4 ms of host
//! (softirq) queueing on almost every datagram at every receiver, against
//! the slow port's 1.2 ms (`bench/results/2026-12-04-delay-signal.md`).

use std::collections::BTreeSet;

use crate::class::Class;
use crate::time::{Duration, Instant};

mod arrivals;

use arrivals::Arrivals;

/// Flow-control parameters of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowConfig {
    /// DATA datagrams this rank lets be in flight towards it from all
    /// senders together; 0 turns flow control off (senders are limited by
    /// the pacer alone).
    pub window: u32,
    /// The least credit any one sender gets, however many there are.
    pub min_per_sender: u32,
}

impl FlowConfig {
    /// No flow control.
    pub const OFF: FlowConfig = FlowConfig { window: 0, min_per_sender: 0 };

    /// A receive window of `window` datagrams, at least 2 per sender (so
    /// that a GRANT goes out once per datagram at most when the window is
    /// spread thin).
    pub const fn with_window(window: u32) -> FlowConfig {
        FlowConfig { window, min_per_sender: 2 }
    }

    /// Whether flow control is on.
    pub fn enabled(&self) -> bool {
        self.window > 0
    }

    /// The window as HELLO announces it (at most 65535).
    pub fn wire_window(&self) -> u16 {
        self.window.min(u32::from(u16::MAX)) as u16
    }

    /// The credit each of the `world - 1` possible senders gets: an even
    /// share of the window, at least `min_per_sender`, at least 1.
    pub fn per_sender(&self, world: u32) -> u32 {
        (self.window / world.saturating_sub(1).max(1)).max(self.min_per_sender).max(1)
    }
}

impl FlowConfig {
    /// The default receive window in bytes: 2 MiB, 1424 datagrams of
    /// 1472 bytes (MTU 1500) or 233 of 8972 (MTU 9000). That is several
    /// bandwidth-delay products of a 100 Gbit/s port with tens of µs of
    /// round trip, and what a 4 MiB socket buffer (dlcpd's default; the
    /// kernel counts twice the payload) holds with room for the kernel's
    /// per-datagram overhead.
    pub const DEFAULT_WINDOW_BYTES: u64 = 2 << 20;

    /// A window of `bytes` of datagrams carrying `chunk_bytes` of payload
    /// each (at least 1 datagram, at most 65535).
    pub fn for_window_bytes(bytes: u64, chunk_bytes: usize) -> FlowConfig {
        let per = (chunk_bytes + crate::wire::OVERHEAD) as u64;
        FlowConfig::with_window((bytes / per).clamp(1, u64::from(u16::MAX)) as u32)
    }
}

impl Default for FlowConfig {
    /// [`FlowConfig::DEFAULT_WINDOW_BYTES`] of dlcp's default chunks (1372 bytes).
    fn default() -> Self {
        FlowConfig::for_window_bytes(Self::DEFAULT_WINDOW_BYTES, 1372)
    }
}

/// The send side towards one receiver.
#[derive(Debug, Clone, Copy, Default)]
struct TxCredit {
    /// DATA datagrams sent to the receiver (the next `dseq`).
    sent: u64,
    /// The receiver's limit: `dseq < limit` may be sent.
    limit: u64,
    /// When to send a credit REQUEST, while out of credit.
    request_at: Option<Instant>,
    /// Fruitless requests in a row (the timer backs off).
    backoff: u32,
}

/// The receive side from one sender.
#[derive(Debug, Clone, Copy, Default)]
struct RxCredit {
    /// One past the highest `dseq` seen (or taken as lost on a REQUEST).
    high: u64,
    /// A gap within one path not judged yet: the data sequence numbers
    /// `.0...1` were missing when a datagram of the same path came past
    /// them; once the highest reaches `.2`, those still missing are a loss
    /// run ([`Flow::note_data`]).
    suspect: Option<(u64, u64, u64)>,
    /// The limit last granted.
    granted: u64,
    /// A GRANT to the sender is queued (it reads `granted` when it is sent).
    queued: bool,
    /// The sender's window now: at most the configured share, halved when
    /// a run of its datagrams is lost (see [`Flow::on_data`]).
    win: u64,
    /// In-order arrivals since the window last changed.
    clean: u64,
    /// No second cut before `high` passes this (one window after a cut).
    cut_until: u64,
    /// Per class, one past the highest `dseq` of a new chunk: one path
    /// keeps a class in order (a higher class may overtake a lower one in
    /// priority queues), so a chunk below it arrived reordered.
    class_high: [u64; Class::COUNT],
    /// `high` when a new chunk last arrived after a later-sent one of its
    /// class (the sender's datagrams take paths of different delays).
    late_at: Option<u64>,
    /// How far behind `high` such late chunks recently arrived (in data
    /// sequence numbers; jumps up, decays by 1/8 per late chunk): a gap no
    /// longer than this is taken for reordering, not for a loss run.
    late_depth: u64,
    /// DATA datagrams received (duplicates too).
    count: u64,
    /// The data sequence numbers below this that did not arrive are taken
    /// as lost, no longer as on their way ([`Flow::take_as_lost`]).
    lost_below: u64,
    /// When the sender's latest DATA arrived, and the one before it.
    last_at: Option<Instant>,
    prev_at: Option<Instant>,
    /// The longest pause within a transfer after which the sender went on
    /// sending ([`Flow::pause`]): in the current epoch and the one before.
    pauses: [Duration; 2],
    /// When the current epoch of `pauses` began.
    pause_epoch: Option<Instant>,
    /// DATA datagrams of the sender's that arrived for an op this rank had
    /// not started (kept in the early buffer, or dropped when it was full)
    /// and were not replayed into their op yet ([`Flow::note_early`]).
    early: u64,
}

impl RxCredit {
    /// A sender's window `per_sender`, `unscheduled` of it granted before
    /// it sent anything.
    fn new(per_sender: u64, unscheduled: u64) -> RxCredit {
        RxCredit { granted: unscheduled, win: per_sender, ..RxCredit::default() }
    }
}

/// Consecutive datagrams of one sender that must be missing for a receiver
/// to take their loss as congestion (and halve that sender's window).
const LOSS_RUN: u64 = 3;

/// A gap within one path is judged when the highest `dseq` has moved this
/// far past it, or as far as the reordering across paths seen lately if
/// that is further (at most [`SUSPECT_WAIT_MAX`]).
const SUSPECT_WAIT: u64 = 128;
const SUSPECT_WAIT_MAX: u64 = 256;
/// The longest gap within one path that is judged at all (with the wait,
/// within the arrival record's [`arrivals::ARRIVAL_WINDOW`]).
const SUSPECT_MAX: u64 = 512;

/// How many of a sender's DATA datagrams a reordering is remembered for
/// ([`Flow::reordering`]).
const REORDER_MEMORY: u64 = 1 << 16;

/// How long a sender's pauses are remembered ([`Flow::pause`]): the
/// longest of the current epoch and the one before.
const PAUSE_EPOCH: Duration = Duration::from_secs(1);

/// Largest exponent of the credit request backoff (as the probes').
const MAX_BACKOFF: u32 = 3;

/// Flow-control state of one endpoint towards and from every rank.
#[derive(Debug, Clone)]
pub(crate) struct Flow {
    cfg: FlowConfig,
    per_sender: u64,
    tx: Vec<TxCredit>,
    rx: Vec<RxCredit>,
    /// Per sender, which of its recent data sequence numbers arrived, and
    /// how late reordered ones come ([`arrivals`]).
    arrivals: Vec<Arrivals>,
    /// `(request_at, peer)` of every armed credit request timer (at most
    /// one per peer): `poll_timeout` and `handle_timeout` read the earliest
    /// without scanning every peer (O(world) per event).
    requests: BTreeSet<(Instant, u32)>,
    /// Times a sender's window was halved (a run of its datagrams lost).
    pub(crate) cuts: u64,
}

impl Flow {
    /// State for a world of `world` ranks, every pair at its unscheduled window.
    pub(crate) fn new(cfg: FlowConfig, world: u32) -> Flow {
        let cfg = FlowConfig { window: u32::from(cfg.wire_window()), ..cfg };
        let per_sender = u64::from(cfg.per_sender(world));
        let mut f = Flow {
            cfg,
            per_sender,
            tx: Vec::new(),
            rx: Vec::new(),
            arrivals: vec![Arrivals::default(); world as usize],
            requests: BTreeSet::new(),
            cuts: 0,
        };
        let u = f.unscheduled();
        f.tx = vec![TxCredit { limit: u, ..TxCredit::default() }; world as usize];
        f.rx = vec![RxCredit::new(per_sender, u); world as usize];
        f
    }

    /// Arm (`Some`) or clear `peer`'s credit request timer, keeping the
    /// index of armed timers in step.
    fn set_request(&mut self, peer: u32, at: Option<Instant>) {
        let Some(t) = self.tx.get_mut(peer as usize) else { return };
        if let Some(old) = std::mem::replace(&mut t.request_at, at) {
            self.requests.remove(&(old, peer));
        }
        if let Some(at) = at {
            self.requests.insert((at, peer));
        }
    }

    /// The least a sender's window is cut to: a 64th of its share (so heavy
    /// random loss, which also loses runs now and then, cannot starve a
    /// sender: 7 datagrams at MTU 1500 with 4 ranks, about a bandwidth-delay
    /// product of a 500 Mbit/s link), at least `min_per_sender`.
    fn floor(&self) -> u64 {
        (self.per_sender / 64).max(u64::from(self.cfg.min_per_sender)).max(1)
    }

    /// The configuration.
    pub(crate) fn config(&self) -> FlowConfig {
        self.cfg
    }

    /// Whether flow control is on.
    pub(crate) fn enabled(&self) -> bool {
        self.cfg.enabled()
    }

    /// Whether DATA may be sent to `peer` now.
    pub(crate) fn may_send(&self, peer: u32) -> bool {
        !self.enabled() || self.tx.get(peer as usize).is_none_or(|t| t.sent < t.limit)
    }

    /// A DATA datagram goes to `peer`: its `dseq` (low 32 bits).
    pub(crate) fn take_dseq(&mut self, peer: u32) -> u32 {
        let Some(t) = self.tx.get_mut(peer as usize) else { return 0 };
        let d = t.sent;
        t.sent += 1;
        d as u32
    }

    /// DATA for `peer` waits for credit: arm the request timer (unless it
    /// is armed) at `now` plus the retry timeout backed off. True if it was
    /// not armed: a new wait began.
    pub(crate) fn blocked(&mut self, peer: u32, now: Instant, rto: Duration, cap: Duration) -> bool {
        let Some(t) = self.tx.get_mut(peer as usize) else { return false };
        if t.request_at.is_some() {
            return false;
        }
        let wait = rto.saturating_mul(1 << t.backoff.min(MAX_BACKOFF)).min(cap.max(rto));
        self.set_request(peer, Some(now + wait));
        true
    }

    /// DATA datagrams `peer` lets this rank send now.
    pub(crate) fn credit(&self, peer: u32) -> usize {
        self.tx.get(peer as usize).map_or(0, |t| t.limit.saturating_sub(t.sent) as usize)
    }

    /// A GRANT from `peer` with `limit`: true if it gave new credit.
    pub(crate) fn on_grant(&mut self, peer: u32, limit: u64) -> bool {
        let Some(t) = self.tx.get_mut(peer as usize) else { return false };
        // A limit more than a window past what was sent cannot come from
        // this incarnation's receiver state: take at most a window.
        let limit = limit.min(t.sent + self.per_sender);
        if limit <= t.limit {
            return false;
        }
        t.limit = limit;
        t.backoff = 0;
        self.set_request(peer, None);
        true
    }

    /// Credit requests due at `now`: the peers to send one to (with how
    /// many DATA datagrams this rank sent them, [`Flow::sent`]), in peer
    /// order. Each one's timer is re-armed, backed off, when the request is
    /// sent ([`Flow::blocked`] after [`Flow::request_sent`]).
    pub(crate) fn requests_due(&self, now: Instant) -> Vec<u32> {
        let mut due: Vec<u32> = self.requests.range(..=(now, u32::MAX)).map(|&(_, p)| p).collect();
        due.sort_unstable();
        due
    }

    /// A credit request to `peer` was queued: the next one backs off.
    pub(crate) fn request_sent(&mut self, peer: u32) {
        self.set_request(peer, None);
        if let Some(t) = self.tx.get_mut(peer as usize) {
            t.backoff = (t.backoff + 1).min(MAX_BACKOFF);
        }
    }

    /// DATA datagrams sent to `peer` so far (a credit request's value).
    pub(crate) fn sent(&self, peer: u32) -> u64 {
        self.tx.get(peer as usize).map_or(0, |t| t.sent)
    }

    /// The earliest credit request timer.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        self.requests.first().map(|&(at, _)| at)
    }

    /// DATA with `dseq` (low 32 bits) arrived from `src`, which has more
    /// waiting than its credit covers if `backlog`, and this rank wants
    /// `want` more datagrams from it ([`Flow::piggyback`]): true if a GRANT
    /// is now due. ([`Flow::note_data`] then [`Flow::grant_due`].)
    #[cfg(test)]
    pub(crate) fn on_data(&mut self, src: u32, dseq: u32, backlog: bool, want: u64) -> bool {
        self.note_data(src, dseq, Instant::ZERO);
        self.grant_due(src, backlog, want)
    }

    /// DATA with `dseq` (low 32 bits) arrived from `src` at `now`: move its receive
    /// window (and halve it on a run of losses), and record it
    /// ([`arrivals`]).
    ///
    /// A gap of at least [`LOSS_RUN`] before a new highest `dseq` is not
    /// judged at once: its datagrams may be on a longer path (with flowlets
    /// on many paths, the next flowlet often takes another path) or of a
    /// lower class a priority queue holds back. The gap is remembered, and
    /// once the highest has moved [`SUSPECT_WAIT`] further (or as far as the
    /// reordering seen lately, `late_depth`, up to [`SUSPECT_WAIT_MAX`]),
    /// the gap's datagrams still missing are a run of losses if there are
    /// [`LOSS_RUN`] of them — as TCP's RACK waits a reordering window before
    /// it takes a hole for a loss (RFC 8985). One gap is judged at a time,
    /// and at most one cut per window (a gap that began within the window
    /// after a cut is the same congestion).
    ///
    /// Before (session 39): a gap between two datagrams of one path was a
    /// run at once, any other gap if longer than `late_depth`. That took
    /// another path's flowlet between two of one path's, and class
    /// reordering, for loss: in a lossless simulated fabric of 8 paths with
    /// 0-90 µs of extra delay, 310 window cuts in 10 ops with flowlets of
    /// 128 datagrams, 1,209 with 16; now 0 (`multipath_sim`). The path a
    /// datagram came by no longer matters, so the endpoint is not told it.
    pub(crate) fn note_data(&mut self, src: u32, dseq: u32, now: Instant) {
        // The highest dseq is kept with flow control off too: a PROBE names
        // how many DATA datagrams its sender had sent, and the receiver
        // compares ([`Flow::high`]).
        let enabled = self.enabled();
        let floor = self.floor();
        let (Some(r), Some(bits)) = (self.rx.get_mut(src as usize), self.arrivals.get_mut(src as usize))
        else {
            return;
        };
        r.count += 1;
        r.prev_at = r.last_at.replace(now);
        // Extend to 64 bits around the highest seen (serial arithmetic: the
        // window is far below 2^31).
        let delta = i64::from(dseq.wrapping_sub(r.high as u32) as i32);
        let d = r.high.saturating_add_signed(delta);
        bits.note(d, r.high, now);
        if d >= r.high {
            let (gap, missing) = (r.high, d - r.high);
            r.high = d + 1;
            if !enabled {
                return;
            }
            let mut run = false;
            if let Some((a, b, at)) = r.suspect
                && r.high >= at
            {
                r.suspect = None;
                // Still in the arrival record: judge what is still missing
                // (at most one cut per window: a gap that began within the
                // window after the last cut is the same congestion).
                if r.high <= a + arrivals::ARRIVAL_WINDOW && b >= r.cut_until {
                    run = (a..b).filter(|&x| !bits.has(x)).count() as u64 >= LOSS_RUN;
                }
            }
            if (LOSS_RUN..=SUSPECT_MAX).contains(&missing) && r.suspect.is_none() {
                let wait = (r.late_depth + 1).clamp(SUSPECT_WAIT, SUSPECT_WAIT_MAX);
                r.suspect = Some((gap, d, r.high + wait));
            }
            if run {
                // A run of lost datagrams: a queue on the way overflowed
                // (random loss rarely takes three in a row). Halve the window.
                r.cut_until = r.high + r.win;
                r.win = (r.win / 2).max(floor);
                r.clean = 0;
                self.cuts += 1;
            } else if r.win < self.per_sender {
                r.clean += 1;
                if r.clean >= r.win {
                    r.win += 1;
                    r.clean = 0;
                }
            }
        }
    }

    /// The DATA from `src` just noted ([`Flow::note_data`]) continued a
    /// transfer that had DATA already: the silence before it is a pause the
    /// sender came back from — it was alive and sending all along (a daemon
    /// not scheduled for a while on a loaded host, a sender serving higher
    /// classes or other receivers first). Not sampled across ops: the idle
    /// time between a job's steps is no pause within a transfer.
    pub(crate) fn note_pause(&mut self, src: u32, now: Instant) {
        let Some(r) = self.rx.get_mut(src as usize) else { return };
        let Some(prev) = r.prev_at else { return };
        let gap = now.saturating_duration_since(prev);
        match r.pause_epoch {
            Some(start) if now.saturating_duration_since(start) < PAUSE_EPOCH => {}
            Some(start) if now.saturating_duration_since(start) < PAUSE_EPOCH * 2 => {
                r.pauses = [Duration::ZERO, r.pauses[0]];
                r.pause_epoch = Some(now);
            }
            _ => {
                r.pauses = [Duration::ZERO; 2];
                r.pause_epoch = Some(now);
            }
        }
        r.pauses[0] = r.pauses[0].max(gap);
    }

    /// DATA from `src` arrived for an op this rank has not started: it took
    /// credit the sender's next op's unscheduled window gave, and the
    /// highest data sequence number moved past it. Until it is replayed,
    /// [`Flow::unscheduled_left`] is that much less, so the limit stays
    /// where it was: a sender that is an op ahead sends one unscheduled
    /// window into this rank's early buffer, not a stream (credit following
    /// the highest number would otherwise renew with every early datagram).
    pub(crate) fn note_early(&mut self, src: u32) {
        if let Some(r) = self.rx.get_mut(src as usize) {
            r.early += 1;
        }
    }

    /// An early datagram of `src` was replayed into the op it belongs to.
    pub(crate) fn early_replayed(&mut self, src: u32) {
        if let Some(r) = self.rx.get_mut(src as usize) {
            r.early = r.early.saturating_sub(1);
        }
    }

    /// The early buffer is empty: whatever was counted early was replayed,
    /// dropped or expired.
    pub(crate) fn clear_early(&mut self) {
        for r in &mut self.rx {
            r.early = 0;
        }
    }

    /// What is left of `src`'s unscheduled window for an op this rank has
    /// not started: [`Flow::unscheduled`] less its early datagrams.
    pub(crate) fn unscheduled_left(&self, src: u32) -> u64 {
        let early = self.rx.get(src as usize).map_or(0, |r| r.early);
        self.unscheduled().saturating_sub(early)
    }

    /// The longest pause `src` came back from within a transfer in the last
    /// one to two [`PAUSE_EPOCH`]s ([`Flow::note_pause`]): a receive
    /// deadline waits longer than that before it takes the sender for
    /// quiet, so a live sender's pauses cost no NACK and no close.
    pub(crate) fn pause(&self, src: u32, now: Instant) -> Duration {
        let Some(r) = self.rx.get(src as usize) else { return Duration::ZERO };
        match r.pause_epoch {
            Some(start) if now.saturating_duration_since(start) < PAUSE_EPOCH * 2 => {
                r.pauses[0].max(r.pauses[1])
            }
            _ => Duration::ZERO,
        }
    }

    /// After DATA from `src` was taken in: true if a GRANT is due, `src`
    /// having more waiting than its credit covers if `backlog`, and this
    /// rank wanting `want` more datagrams from it.
    pub(crate) fn grant_due(&mut self, src: u32, backlog: bool, want: u64) -> bool {
        if !self.enabled() {
            return false;
        }
        let Some(r) = self.rx.get_mut(src as usize) else { return false };
        let win = want.min(r.win);
        if r.high + win <= r.granted {
            // Nothing more to give than what was granted.
            return false;
        }
        let left = r.granted.saturating_sub(r.high);
        let due = if backlog { left <= win * 3 / 4 } else { left <= win / 4 };
        if !due {
            return false;
        }
        r.granted = r.granted.max(r.high + win);
        true
    }

    /// A packet to `src` is being sent: the credit it carries (version 9),
    /// a full window past the highest `dseq` seen, as a GRANT sent now
    /// would give (the low 32 bits; 0 with flow control off, which carries
    /// none). Every DATA and control packet to a sender is a GRANT too, so
    /// where two ranks send each other DATA, as every pair does in a
    /// collective, GRANT packets are rarely due.
    pub(crate) fn piggyback(&mut self, src: u32, want: u64) -> u32 {
        if !self.enabled() {
            return 0;
        }
        let Some(r) = self.rx.get_mut(src as usize) else { return 0 };
        r.granted = r.granted.max(r.high + want.min(r.win));
        r.granted as u32
    }

    /// The credit a packet from `peer` carried (`limit`, low 32 bits; 0:
    /// none): true if it gave new credit. Extended to 64 bits around the
    /// DATA sent to `peer` (a limit is never more than a window from it).
    pub(crate) fn on_credit(&mut self, peer: u32, limit: u32) -> bool {
        if limit == 0 || !self.enabled() {
            return false;
        }
        let Some(t) = self.tx.get(peer as usize) else { return false };
        let delta = i64::from(limit.wrapping_sub(t.sent as u32) as i32);
        let Some(limit) = t.sent.checked_add_signed(delta) else { return false };
        self.on_grant(peer, limit)
    }

    /// Whether `src` holds less credit than this rank wants from it
    /// (`want` more datagrams, [`Flow::piggyback`]): a GRANT now would give
    /// more. Raises the limit to give if so.
    pub(crate) fn short_of(&mut self, src: u32, want: u64) -> bool {
        let Some(r) = self.rx.get_mut(src as usize) else { return false };
        let target = r.high + want.min(r.win);
        if target <= r.granted {
            return false;
        }
        r.granted = target;
        true
    }

    /// A sender's share of this receiver's window, in datagrams.
    pub(crate) fn per_sender_limit(&self) -> u32 {
        u32::try_from(self.per_sender).unwrap_or(u32::MAX)
    }

    /// The credit a receiver keeps ready for a sender's next op (its
    /// unscheduled window): a quarter of the sender's share of the window,
    /// at least `min_per_sender`.
    pub(crate) fn unscheduled(&self) -> u64 {
        (self.per_sender / 4).max(u64::from(self.cfg.min_per_sender)).max(1)
    }

    /// A credit REQUEST from `src`, which sent `sent` DATA datagrams: all
    /// below that are here or lost; credit is granted by need as for DATA
    /// (`want` more datagrams, at most a window), and a GRANT always answers
    /// (the one answering the last request may have been lost). Granting a
    /// whole window regardless let a sender that is an op ahead of this rank
    /// stream its data into the early buffer, a window per request.
    pub(crate) fn on_request(&mut self, src: u32, sent: u64, want: u64) {
        let (Some(r), Some(bits)) = (self.rx.get_mut(src as usize), self.arrivals.get_mut(src as usize))
        else {
            return;
        };
        // Never believe more than a window beyond what was granted. What is
        // written off stays not arrived in the record ([`Flow::arrived`]):
        // it may still be on its way.
        let high = r.high.max(sent.min(r.granted));
        bits.advance(r.high, high);
        if high > r.high {
            r.suspect = None; // the new highest was written off, not seen
        }
        r.high = high;
        r.granted = r.granted.max(r.high + want.min(r.win));
    }

    /// A new chunk (not a duplicate) of `class` with `dseq` arrived from
    /// `src`: note whether it came after a later-sent chunk of its class
    /// (reordering: they took paths of different delays).
    pub(crate) fn new_chunk(&mut self, src: u32, dseq: u32, class: Class) {
        let Some(r) = self.rx.get_mut(src as usize) else { return };
        let d = r.high.saturating_add_signed(i64::from(dseq.wrapping_sub(r.high as u32) as i32));
        let high = &mut r.class_high[class.index()];
        if d + 1 < *high {
            r.late_at = Some(r.high);
            let depth = r.high - (d + 1);
            r.late_depth = depth.max(r.late_depth - r.late_depth / 8);
        }
        *high = (*high).max(d + 1);
    }

    /// Whether `src`'s datagrams were seen reordered within its last
    /// [`REORDER_MEMORY`] DATA datagrams: then its latest chunk having
    /// arrived does not mean the earlier ones did.
    pub(crate) fn reordering(&self, src: u32) -> bool {
        self.rx
            .get(src as usize)
            .and_then(|r| r.late_at.map(|at| r.high - at <= REORDER_MEMORY))
            .unwrap_or(false)
    }

    /// How far `src`'s DATA to this rank has come, to compare with the count
    /// a PROBE carries: [`Flow::high`], or while its datagrams arrive
    /// reordered ([`Flow::reordering`]), how many arrived (the highest says
    /// nothing of the ones before it that are still on slower paths).
    pub(crate) fn seen(&self, src: u32) -> u64 {
        if self.reordering(src) { self.rx.get(src as usize).map_or(0, |r| r.count) } else { self.high(src) }
    }

    /// One past the highest `dseq` received from `src` (or written off on
    /// its credit request): with no loss, how many DATA datagrams of `src`
    /// this rank has received.
    pub(crate) fn high(&self, src: u32) -> u64 {
        self.rx.get(src as usize).map_or(0, |r| r.high)
    }

    /// Whether `src`'s window is below its share: a run of its datagrams
    /// was lost lately (a queue on its path overflows), and it has not
    /// grown back yet.
    pub(crate) fn congested(&self, src: u32) -> bool {
        self.enabled() && self.rx.get(src as usize).is_some_and(|r| r.win < self.per_sender)
    }

    /// The limit to send `src` in a GRANT now.
    #[cfg(test)]
    pub(crate) fn grant(&self, src: u32) -> u64 {
        self.rx.get(src as usize).map_or(0, |r| r.granted)
    }

    /// A GRANT to `src` is about to be queued: false if one already is.
    pub(crate) fn mark_grant_queued(&mut self, src: u32) -> bool {
        self.rx.get_mut(src as usize).is_some_and(|r| !std::mem::replace(&mut r.queued, true))
    }

    /// The queued GRANT to `src` is being sent: its limit.
    pub(crate) fn take_grant(&mut self, src: u32) -> u64 {
        self.rx.get_mut(src as usize).map_or(0, |r| {
            r.queued = false;
            r.granted
        })
    }

    /// `peer` restarted: both directions start over at the unscheduled window.
    pub(crate) fn reset(&mut self, peer: u32) {
        let (per, u) = (self.per_sender, self.unscheduled());
        self.set_request(peer, None);
        if let Some(t) = self.tx.get_mut(peer as usize) {
            *t = TxCredit { limit: u, ..TxCredit::default() };
        }
        if let Some(r) = self.rx.get_mut(peer as usize) {
            *r = RxCredit::new(per, u);
        }
        if let Some(bits) = self.arrivals.get_mut(peer as usize) {
            *bits = Arrivals::default();
        }
    }

    /// Heap bytes (for the endpoint's footprint).
    pub(crate) fn bytes(&self) -> usize {
        self.tx.capacity() * size_of::<TxCredit>()
            + self.rx.capacity() * size_of::<RxCredit>()
            + self.arrivals.capacity() * size_of::<Arrivals>()
    }
}

#[cfg(test)]
mod tests;
