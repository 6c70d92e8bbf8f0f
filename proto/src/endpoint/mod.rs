//! The collectives endpoint: one [`Endpoint`] per rank (per daemon).
//!
//! It is sans-IO, quinn-proto style: no sockets, no clock. Its methods are of
//! four kinds:
//!
//! - **getters** read state: [`Endpoint::stats`], [`Endpoint::peer_up`],
//!   [`Endpoint::footprint`], …;
//! - **`handle_*`** take network events in: a received datagram
//!   ([`Endpoint::handle_datagram`], batched: [`Endpoint::handle_datagrams`])
//!   or the passing of time ([`Endpoint::handle_timeout`]);
//! - **mutators** are the application's commands:
//!   [`Endpoint::start_allreduce`], [`Endpoint::set_tunables`],
//!   [`Endpoint::set_pacing_rate`], [`Endpoint::set_rate_adaptation`],
//!   [`Endpoint::recycle`];
//! - **`poll_*`** give the outputs: datagrams to send
//!   ([`Endpoint::poll_transmit_batch`], one at a time: [`Endpoint::poll_transmit`]),
//!   when to call again ([`Endpoint::poll_timeout`]) and what happened
//!   ([`Endpoint::poll_event`]).
//!
//! After every `handle_*` call or command, drain the outputs: call
//! `poll_transmit_batch` until it returns fewer datagrams than asked for (or
//! the NIC is full), sending each batch before the next call, take the
//! events, and arm a timer for `poll_timeout`; when it expires, call
//! `handle_timeout`, and drain again. A paced endpoint's `poll_timeout` also
//! says when `poll_transmit_batch` has something again. The datagrams come
//! in the order they must reach the network (a PROBE after the DATA it
//! follows); a DATA payload is lent from the op's memory, not copied
//! ([`TxView`]).
//!
//! ## Allreduce ("transpose" / colocated parameter server)
//!
//! A tensor of `L` elements is cut into `N` contiguous shards; rank `s` owns
//! shard `s`. Each shard is cut into chunks of `chunk_bytes / size` elements
//! (one DATA packet each), `size` the bytes of the op's element type: 4 for
//! f32, 2 for f16 and bf16 ([`OpOptions::dtype`]; wire version 6).
//!
//! 1. **Reduce-scatter**: every rank sends shard `s` of its input to rank `s`
//!    (one *transfer* per (op, tensor, phase, sender)). The owner reduces the
//!    contributions in rank order `0, 1, …, N−1`, filling a missing chunk with
//!    zero or with its own value ([`Fill`]), optionally rescaling by
//!    `N / delivered`, dividing once for an average, and rounding once to the
//!    op's element type (f16, bf16: accumulated in `f32`; [`crate::elem`]).
//! 2. **All-gather**: the owner sends its reduced shard to every rank. Replicas
//!    must not diverge, so the owner collects every receiver's bitmap, repairs
//!    the union of what is missing until it fits the (stricter) gather budget,
//!    and then announces one agreed *mask* in DONE; every rank, the owner
//!    included, zero-fills exactly the masked chunks. With a gather budget of 0
//!    the mask is always empty (full repair).
//!
//! Each transfer is bounded-loss ([`crate::transfer`]): the sender sends every
//! chunk once, the last one flagged LAST; on it the receiver closes within
//! its loss budget or answers with a BITMAP, and the sender repairs exactly
//! enough ([`select_repairs`]). A reduce-scatter transfer is acknowledged by
//! its owner's all-gather; a PROBE goes out only when an answer is overdue. If an op makes no progress for the hard timeout it
//! fails with an error naming the ranks it was waiting for — never a hang —
//! unless some of them are up, took part in earlier ops of the run and have
//! sent nothing of this one yet (late trainers, [`Event::OpAwaitsLate`]):
//! then it waits, up to the op deadline.
//! A rank that failed an op (for any reason) answers the PROBEs, BITMAPs and
//! DATA of the ranks still at it with a failing DONE (wire version 5, at most
//! one per peer per probe interval), and they fail it at once with
//! [`OpError::PeerFailed`] naming it; a failing DONE is never answered
//! (`failure.rs`).
//!
//! ## The other collectives (wire version 7)
//!
//! Reduce-scatter, allgather, broadcast and barrier ([`OpOptions::collective`])
//! run phases of the allreduce above, each with its loss contract: see the
//! `allreduce` module's docs (`endpoint/allreduce/mod.rs`).
//!
//! ## Membership
//!
//! Ops are matched across ranks by (job, op sequence, tensor id). Every packet
//! carries its sender's generation; a higher generation means the peer's daemon
//! restarted: live ops fail with [`OpError::PeerRestarted`] and new ops include
//! the new incarnation. Packets of an older generation are dropped and counted.
//! Packets for ops this rank has not started yet are buffered (bounded) and
//! replayed when it starts them.
//!
//! ## Inside
//!
//! The endpoint routes; its parts hold the state: the ops (`allreduce`: an
//! op's transfers, layout and decisions; `optable`: the slab they live in),
//! the transmit queues (`tx`) and the datagrams of one batch (`batch`), the
//! timer index (`timers`), peers (`membership`), finished and failed ops and
//! the early buffer (`history`), failure notices (`failure`), the receive entry points (`receive`), and what op handlers share with the endpoint —
//! configuration, queues, counters, estimators (`shared`).

use std::collections::VecDeque;

use crate::class::Class;
use crate::pacer::Pacer;
use crate::pool::BufferPool;
use crate::priority::ClassifierConfig;
use crate::rate::{RateAdapter, RateConfig, SendTotals};
use crate::time::Instant;
use crate::wire::{self, Header, KeyCache, PacketType, Phase, WireError};

mod acks;
pub(crate) mod allreduce;
pub(crate) mod api;
pub(crate) mod batch;
mod control;
mod credit;
mod digest;
mod ending;
mod failure;
mod held;
pub(crate) mod history;
mod incarnation;
pub(crate) mod membership;
pub(crate) mod optable;
mod receive;
pub(crate) mod shared;
pub(crate) mod timers;
pub(crate) mod tx;

pub use crate::stats::{PacketCount, RxDrops, Stats};
pub use crate::transfer::{MAX_BUDGET_PPM, PROBE_COPIES, TransferReport, allowed_missing, select_repairs};
pub use api::{
    Collective, DType, EndpointConfig, Event, Fill, Footprint, MISMATCH_REPORT_INTERVAL, Mismatch, OpError,
    OpId, OpOptions, OpReport, ReduceOp, StartError, Timers, shard_range,
};
pub use batch::{Datagram, TxBatch, TxView};
pub use digest::settings_digest;
pub use tx::Transmit;

use allreduce::{Layout, Op, Side};
use api::OpKey;
use held::{Held, HeldOp};
use history::{Early, History};
use membership::Peers;
use optable::OpTable;
use shared::Shared;
use timers::{TimerEntry, TimerIndex};
use tx::{TxItem, TxKind};

/// One rank's protocol state machine. See the module docs.
#[derive(Debug)]
pub struct Endpoint {
    /// Configuration, transmit queues, counters, estimators.
    sh: Shared,
    ops: OpTable,
    /// Finished ops, and datagrams for ops not started yet.
    history: History,
    pacer: Pacer,
    peers: Peers,
    events: VecDeque<Event>,
    now: Instant,
    /// Buffers of finished ops, reused by the next ones (no page faults).
    pool: BufferPool,
    timers: TimerIndex,
    /// The batch [`Endpoint::poll_transmit`] fills (kept for its buffers).
    scratch: TxBatch,
    /// The senders' packet keys, for checking received tags.
    keys: KeyCache,
    /// Loss-driven adaptation of the pacing rate, if configured.
    rate: Option<RateAdapter>,
    /// Ops submitted before their run was agreed.
    held: Held,
    /// While the local run is not agreed: when to announce it again.
    run_hello: Option<Instant>,
    /// [`settings_digest`] of the configuration, announced in HELLO.
    digest: u64,
}

/// How often a local run that is not agreed yet is announced again.
pub(crate) const RUN_HELLO_INTERVAL: crate::time::Duration = crate::time::Duration::from_millis(20);

impl Endpoint {
    /// A new endpoint at `now`.
    ///
    /// # Panics
    /// If `cfg.rank >= cfg.world`, or `chunk_bytes` is not a positive multiple of 4
    /// that fits in a datagram — configuration errors the caller validates first.
    pub fn new(cfg: EndpointConfig, now: Instant) -> Endpoint {
        assert!(cfg.rank < cfg.world, "rank {} outside world {}", cfg.rank, cfg.world);
        assert!(
            cfg.chunk_bytes >= 4 && cfg.chunk_bytes % 4 == 0 && cfg.chunk_bytes <= wire::MAX_PAYLOAD - 3,
            "chunk_bytes {} must be a positive multiple of 4 below 65536",
            cfg.chunk_bytes
        );
        let rate = cfg.rate_adapt.map(|r| RateAdapter::new(r, now, SendTotals::default()));
        Endpoint {
            rate,
            ops: OpTable::default(),
            history: History::default(),
            pacer: Pacer::new(cfg.pacing_rate, cfg.pacing_burst, now),
            peers: Peers::new(cfg.world, cfg.timers.heartbeat, now, cfg.session),
            held: Held::default(),
            run_hello: None,
            digest: settings_digest(&cfg),
            events: VecDeque::new(),
            now,
            pool: BufferPool::new(),
            timers: TimerIndex::default(),
            scratch: TxBatch::new(),
            keys: KeyCache::new(cfg.key.clone(), cfg.world),
            sh: Shared::new(cfg),
        }
    }

    /// Elements per chunk of an op of `dtype`: `chunk_bytes` of them (an f16
    /// or bf16 chunk holds twice the elements of an f32 one).
    pub fn chunk_elems(&self, dtype: DType) -> usize {
        self.sh.cfg.chunk_bytes / dtype.size()
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.sh.me()
    }

    /// The configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.sh.cfg
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.sh.stats
    }

    /// How each path towards `peer` stands ([`crate::paths`]).
    pub fn path_health(&self, peer: u32) -> Vec<crate::paths::PathHealth> {
        self.sh.paths.health(peer)
    }

    /// Number of ops in flight: started and not yet completed or failed
    /// (delivered ops waiting only for their all-gather's ACKs are not).
    pub fn ops_in_flight(&self) -> usize {
        self.ops.values().filter(|op| !op.is_delivered()).count()
    }

    /// Ops whose result was delivered and whose owner still waits for some
    /// receiver's ACK (wire version 10), or this rank still holds ACKs to
    /// send: the endpoint has something to finish.
    pub fn ops_unacknowledged(&self) -> usize {
        self.ops.values().filter(|op| op.is_delivered()).count() + self.sh.acks.len()
    }

    /// Whether `rank` has been heard from within the peer timeout (false for
    /// this rank itself and for ranks never heard from).
    pub fn peer_up(&self, rank: u32) -> bool {
        self.peers.is_up(rank)
    }

    /// Why `rank`'s datagrams were last refused as incompatible (another wire
    /// version, packet authentication mode or chunk size), unless its HELLO
    /// settings agreed since.
    pub fn peer_mismatch(&self, rank: u32) -> Option<Mismatch> {
        self.peers.mismatch(rank)
    }

    /// The generation the verified incarnation of `rank` announced, if any.
    pub fn peer_generation(&self, rank: u32) -> Option<u32> {
        self.peers.generation(rank)
    }

    /// The verified session (incarnation) of `rank`, if any.
    pub fn peer_session(&self, rank: u32) -> Option<u64> {
        self.peers.session(rank)
    }

    /// How much memory this endpoint holds, and in how many open transfers.
    /// O(ops × world): for tests, benchmarks and diagnostics, not per packet.
    pub fn footprint(&self) -> Footprint {
        let mut f = Footprint::default();
        for op in self.ops.values() {
            let (state, tensor, open) = op.footprint();
            f.state_bytes += state;
            f.tensor_bytes += tensor;
            f.open_transfers += open;
        }
        let stats = &self.sh.stats;
        f.state_bytes += self.history.bytes()
            + self.sh.tx.bytes()
            + self.peers.bytes()
            + (stats.tx_packets_peer.capacity() + stats.rx_packets_peer.capacity()) * 8
            + self.timers.bytes()
            + self.keys.bytes()
            + self.sh.flow.bytes()
            + self.sh.acks.bytes()
            + self.held.bytes();
        f.early_bytes = self.history.early_bytes();
        f.queued = self.queued();
        f
    }

    /// Datagrams waiting in the per-class transmit queues.
    pub fn queued(&self) -> usize {
        self.sh.tx.len()
    }

    /// Change only the pacing rate (bytes per second, 0 = unpaced), from `now`.
    pub fn set_pacing_rate(&mut self, now: Instant, rate: u64) {
        self.sh.cfg.pacing_rate = rate;
        self.pacer.set_rate(now, rate);
    }

    /// (Re)install loss-driven rate adaptation ([`crate::rate`]) from `now`,
    /// or turn it off (`None`; the pacing rate then stays where it is). A new
    /// adapter starts from the current pacing rate and counts from now.
    pub fn set_rate_adaptation(&mut self, now: Instant, cfg: Option<RateConfig>) {
        self.sh.cfg.rate_adapt = cfg;
        let totals = self.send_totals();
        self.rate = cfg.map(|c| RateAdapter::new(c, now, totals));
    }

    /// Rate cuts of the loss-driven adaptation so far (`None`: adaptation off).
    pub fn rate_cuts(&self) -> Option<u64> {
        self.rate.as_ref().map(RateAdapter::cuts)
    }

    /// DATA datagrams and repairs sent so far, what the rate adapter reads.
    fn send_totals(&self) -> SendTotals {
        let s = &self.sh.stats;
        SendTotals { data: s.tx_packets[..Class::CONTROL.index()].iter().sum(), repairs: s.repairs_sent }
    }

    /// Close the rate adapter's window if it is over and apply its verdict.
    fn adapt_rate(&mut self, now: Instant) {
        let (rate, totals) = (self.sh.cfg.pacing_rate, self.send_totals());
        if let Some(new) = self.rate.as_mut().and_then(|a| a.on_timeout(now, rate, totals)) {
            self.set_pacing_rate(now, new);
        }
    }

    /// Current pacing rate in bytes per second (0 = unpaced).
    pub fn pacing_rate(&self) -> u64 {
        self.sh.cfg.pacing_rate
    }

    /// Change the tunables a running daemon may reload: the classifier, the
    /// timers (deadline and probe bounds take effect for transfers armed from
    /// now; learned estimates are kept), the pacing rate and burst. An op in
    /// flight keeps the classes and droppable set it started with.
    pub fn set_tunables(
        &mut self,
        now: Instant,
        classifier: ClassifierConfig,
        timers: Timers,
        pacing_rate: u64,
        pacing_burst: u64,
    ) {
        let cfg = &mut self.sh.cfg;
        cfg.classifier = classifier;
        cfg.timers = timers;
        cfg.pacing_rate = pacing_rate;
        cfg.pacing_burst = pacing_burst;
        self.pacer.set_rate(now, pacing_rate);
        self.pacer.set_burst(now, pacing_burst);
        self.sh.rtt.set_bounds(timers.probe_min, timers.probe_max);
        for d in &mut self.sh.deadlines {
            d.set_bounds(timers.deadline_min, timers.deadline_max);
        }
        self.peers.set_heartbeat(now, timers.heartbeat);
        self.digest = settings_digest(&self.sh.cfg);
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Start an allreduce of `data` (this rank's contribution).
    pub fn start_allreduce(
        &mut self,
        now: Instant,
        id: OpId,
        data: Vec<f32>,
        opts: OpOptions,
    ) -> Result<(), StartError> {
        self.now = now;
        if self.ops.contains(&id) || self.history.knows(&id) || self.held.contains(&id) {
            return Err(StartError::Duplicate(id));
        }
        let (data, opts) = match opts.collective {
            // A barrier is an exact reduce-scatter of one element per rank.
            Collective::Barrier => (vec![0.0; self.sh.cfg.world as usize], OpOptions::barrier(opts)),
            _ => (data, opts),
        };
        if data.is_empty() {
            return Err(StartError::Empty);
        }
        opts.check(self.sh.cfg.world)?;
        let layout = Layout::new(data.len(), self.sh.cfg.world, self.chunk_elems(opts.dtype));
        if layout.too_large() {
            return Err(StartError::TooLarge);
        }
        if self.sh.runs.epoch() != Some(id.run) {
            return Err(StartError::NotCurrentRun { epoch: id.run, current: self.sh.runs.epoch() });
        }
        if self.sh.runs.agreed().is_none() {
            self.held.push(HeldOp { id, data, opts, since: now });
            return Ok(());
        }
        self.start_now(now, HeldOp { id, data, opts, since: now });
        Ok(())
    }

    /// Start a validated op of the agreed run.
    fn start_now(&mut self, now: Instant, h: HeldOp) {
        let HeldOp { id, data, opts, .. } = h;
        let layout = Layout::new(data.len(), self.sh.cfg.world, self.chunk_elems(opts.dtype));
        let key = OpKey::new(id, self.ops.vacant());
        let mut op = Op::start(now, key, layout, data, opts, &mut self.pool, &mut self.sh);
        op.reduce(key, &mut self.sh);
        self.ops.insert(id, op);
        // Replay datagrams that arrived before this rank started the op
        // (kept under the run id they carry).
        let wire_id = OpId { run: self.sh.runs.id_of(id.run).unwrap_or(0), ..id };
        for d in self.history.take_early(&wire_id) {
            self.history.replayed(d.len());
            self.handle_datagram_impl(now, &d, true, None);
        }
        if self.history.early_bytes() == 0 {
            self.sh.flow.clear_early();
        }
        self.check_complete(id);
        self.prune_timers();
    }

    /// A buffer of `len` elements with unspecified contents, from the pool of
    /// finished ops' buffers when one fits (see [`crate::pool`]): for a caller
    /// that overwrites all of it, e.g. with the next op's input.
    pub fn take_buffer(&mut self, len: usize) -> Vec<f32> {
        self.pool.take(len)
    }

    /// Gives a buffer back to the pool, typically an [`Event::OpComplete`]
    /// result once the caller has copied it out.
    pub fn recycle(&mut self, buf: Vec<f32>) {
        self.pool.put(self.now, buf);
    }

    /// The buffer pool (for counters and tests).
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// Process timers that expired at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        self.pool.expire(now);
        let t = self.sh.cfg.timers;
        let announce = self.run_hello.is_some_and(|at| at <= now);
        if self.peers.heartbeat_due(now, t.heartbeat) || announce {
            self.sh.tx.push_hellos(self.sh.cfg.world, self.sh.me());
        }
        let pending = self.sh.runs.agreed().is_none() && self.sh.runs.epoch().is_some();
        if pending && (announce || self.run_hello.is_none()) {
            self.run_hello = Some(now + RUN_HELLO_INTERVAL);
        } else if !pending {
            self.run_hello = None;
        }
        self.fail_held(now);
        for rank in self.peers.expire(now, t.peer_timeout) {
            self.events.push_back(Event::PeerDown { rank });
        }
        // Lingering ops, finished ids and early datagrams age out.
        self.sh.stats.rejected.early_expired += self.history.expire(now, t.linger, t.hard_timeout);
        if self.history.early_bytes() == 0 {
            self.sh.flow.clear_early();
        }
        // Per-op timers: the transfers with a timer due, in (op, side, peer) order.
        let ops = &self.ops;
        let due = self.timers.pop_due(now, |e| timer_live(ops, e));
        for id in self.ops.ids() {
            let a = due.partition_point(|d| d.0 < id);
            let b = due.partition_point(|d| d.0 <= id);
            let keys: Vec<(Side, u32)> = due[a..b].iter().map(|d| (d.1, d.2)).collect();
            self.op_timers(now, id, &keys);
            for &(side, j) in &keys {
                self.index_timers(id, side, j);
            }
            self.check_complete(id);
        }
        self.flush_acks(now, false);
        self.release_credit();
        self.flow_timeouts(now);
        self.prune_timers();
        self.adapt_rate(now);
    }

    /// Serve the due timers of op `id` (`keys`: its transfers with a live
    /// timer at or before `now`, sorted), or fail it by the hard timeout.
    fn op_timers(&mut self, now: Instant, id: OpId, keys: &[(Side, u32)]) {
        let t = self.sh.cfg.timers;
        let Some(slot) = self.ops.slot(&id) else { return };
        let Some(op) = self.ops.at_mut(slot, &id) else { return };
        if op.deadline_at(t.op_deadline) <= now {
            let (phase, waiting_on) = (op.phase(), op.waiting_on(self.sh.me()));
            self.sh.stats.hard_timeouts += 1;
            self.fail(id, OpError::Deadline { phase, waiting_on, deadline: t.op_deadline });
            return;
        }
        if op.stalls_at(t.hard_timeout) <= now {
            let (phase, waiting_on) = (op.phase(), op.waiting_on(self.sh.me()));
            // A rank that is up, still in the op's run and has sent packets
            // of earlier ops of it, but nothing of this one, is late, not
            // lost: its trainer is behind (an evaluation, a checkpoint). The
            // op waits for it (the ranks that did start may be silent only
            // because they wait for it too), judged again every peer timeout,
            // until the op deadline. It fails as before when a rank it waits
            // on is down or out of the run (its trainers left), or there is
            // no op deadline.
            let runs = &self.sh.runs;
            let gone = waiting_on.iter().any(|&r| !self.peers.is_up(r) || !runs.in_run(r, id.run));
            let late: Vec<u32> = if t.op_deadline.is_zero() || gone {
                Vec::new()
            } else {
                waiting_on.iter().copied().filter(|&r| self.peers.late_for(r, id)).collect()
            };
            if !late.is_empty() {
                if op.await_late(now + t.peer_timeout.min(t.hard_timeout)) {
                    self.sh.stats.late_rank_waits += 1;
                    self.events.push_back(Event::OpAwaitsLate { id, ranks: late });
                }
                op.on_timers(now, OpKey::new(id, slot), keys, &mut self.sh);
                return;
            }
            let elsewhere = waiting_on
                .iter()
                .filter_map(|&r| Some((r, self.peers.last_op(r)?)))
                .filter(|&(_, o)| o.run == id.run && o != id)
                .map(|(r, o)| (r, o.seq, o.tensor))
                .collect();
            self.sh.stats.hard_timeouts += 1;
            self.fail(id, OpError::Timeout { phase, waiting_on, timeout: t.hard_timeout, elsewhere });
            return;
        }
        op.on_timers(now, OpKey::new(id, slot), keys, &mut self.sh);
    }

    /// Index one transfer's timers after they came due ([`TimerIndex::reindex`]).
    fn index_timers(&mut self, id: OpId, side: Side, peer: u32) {
        let Some(op) = self.ops.get_mut(&id) else { return };
        self.timers.reindex(op.transfers_mut(), id, side, peer, true);
    }

    /// Drop stale entries from the front of the timer index.
    fn prune_timers(&mut self) {
        let ops = &self.ops;
        self.timers.prune(|e| timer_live(ops, e));
    }

    /// The earliest instant at which [`Endpoint::handle_timeout`] (or, when paced,
    /// [`Endpoint::poll_transmit`]) should be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let t = self.sh.cfg.timers;
        let ops = &self.ops;
        let candidates = [
            self.peers.next_timeout(t.peer_timeout),
            self.history.next_timeout(t.linger, t.hard_timeout),
            self.sh.acks.next_due(t.ack_delay),
            self.ops.values().map(|op| op.stalls_at(t.hard_timeout).min(op.deadline_at(t.op_deadline))).min(),
            self.timers.first_live(|e| timer_live(ops, e)),
            (!self.sh.tx.is_empty() && self.pacer.rate() > 0)
                .then(|| self.pacer.ready_at(self.now, self.sh.cfg.chunk_bytes + wire::OVERHEAD)),
            self.rate.as_ref().and_then(|a| a.next_timeout(self.send_totals())),
            self.sh.flow.next_timeout(),
            self.run_hello,
            self.held.next_deadline(t.hard_timeout),
        ];
        candidates.into_iter().flatten().min().filter(|&t| t != Instant::MAX)
    }

    /// The next datagrams to send, at most `max`, highest class first, in
    /// the order they must reach the network: a PROBE comes after the DATA it
    /// follows, so a datapath that keeps this order (as dlcpd's do) never lets
    /// a PROBE overtake its data on the host. Fewer (or none) when the queues
    /// run dry or the pacer says wait (see [`poll_timeout`](Self::poll_timeout)).
    ///
    /// The datagrams are written into `batch` (headers, tags and control
    /// payloads; its buffers are reused from call to call) and lent by the
    /// returned view, whose DATA payloads are slices of the ops' own memory:
    /// nothing is copied until the datapath sends them (see [`TxView`]).
    /// Exactly the datagrams, bytes and tags that `max` calls of
    /// [`poll_transmit`](Self::poll_transmit) would give.
    pub fn poll_transmit_batch<'a>(
        &'a mut self,
        now: Instant,
        max: usize,
        batch: &'a mut TxBatch,
    ) -> TxView<'a> {
        batch.clear(self.sh.key.auth());
        while batch.len() < max && self.next_transmit(now, batch) {}
        batch.seal(&self.sh.key, &self.ops);
        self.prune_timers();
        TxView::new(batch, &self.ops)
    }

    /// Write the next datagram to send into `buf` (which must hold at least
    /// `chunk_bytes + wire::OVERHEAD` bytes; a datagram that does not fit is
    /// dropped), highest class first. Returns `None` when nothing is queued
    /// or the pacer says wait (see `poll_timeout`). The one-datagram form of
    /// [`poll_transmit_batch`](Self::poll_transmit_batch) (the simulator's).
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let mut batch = std::mem::take(&mut self.scratch);
        let tx = {
            let view = self.poll_transmit_batch(now, 1, &mut batch);
            let d = view.iter().next();
            d.filter(|d| d.len() <= buf.len()).map(|d| Transmit {
                dst: d.dst,
                len: d.write_to(buf),
                class: d.class,
                path: d.path,
            })
        };
        self.scratch = batch;
        tx
    }

    /// Add the next datagram to `batch`; false when there is none now.
    fn next_transmit(&mut self, now: Instant, batch: &mut TxBatch) -> bool {
        self.now = now;
        loop {
            let Some((qi, item)) = self.sh.tx.front() else { return false };
            let TxKind::Data { chunk, .. } = item.kind else {
                self.sh.tx.pop(qi);
                if self.encode_control(now, item, batch) {
                    return true;
                }
                continue;
            };
            // Is the chunk still wanted?
            let wanted =
                |op: &&Op| op.transfers().sender(item.phase, item.peer).is_some_and(|st| st.wants(chunk));
            let Some(op) = self.ops.by_key(item.op).filter(wanted) else {
                self.sh.tx.pop(qi);
                self.dequeued(now, item);
                self.credit_unused(item.peer);
                continue;
            };
            if !self.may_send(item.peer) {
                self.park(qi, item.peer, now);
                continue;
            }
            let len = op.chunk_bytes(item.phase, item.peer, chunk, self.sh.me()) + wire::OVERHEAD;
            if !self.pacer.try_consume(now, len) {
                return false;
            }
            self.sh.tx.pop(qi);
            let sent = self.encode_data(item, batch);
            self.dequeued(now, item);
            if sent {
                return true;
            }
        }
    }

    /// Bookkeeping after a DATA item left the queue: when a send transfer's
    /// queue drains, it probes.
    fn dequeued(&mut self, now: Instant, item: TxItem) {
        let Some(op) = self.ops.by_key_mut(item.op) else { return };
        if op.dequeued(now, item.op, item.phase, item.peer, &mut self.sh).is_some() {
            self.timers.reindex(op.transfers_mut(), item.op.id(), Side::send(item.phase), item.peer, false);
        }
    }

    /// Add DATA `item` to `batch`: its header, and where its payload lies.
    fn encode_data(&mut self, item: TxItem, batch: &mut TxBatch) -> bool {
        let TxKind::Data { repair, class, .. } = item.kind else { return false };
        let now = self.now;
        let Some((h, buffer, range, path)) =
            self.ops.by_key_mut(item.op).and_then(|op| op.data_header(item, now, &mut self.sh))
        else {
            return false;
        };
        let (seq, credit) = (self.take_dseq(item.peer), self.credit_for(item.peer));
        let mut h = Header { packet: self.sh.take_packet(), seq, credit, ..h };
        if h.flags.contains(wire::Flags::LAST)
            && let Some(op) = self.ops.by_key_mut(item.op)
        {
            op.last_sent_as(item.phase, item.peer, h.seq, self.now);
        }
        if self.backlogged(item.peer) {
            h.flags = h.flags.with(wire::Flags::BACKLOG);
        }
        let mut header = [0u8; wire::HEADER_LEN];
        if h.emit(&mut header).is_err() {
            return false;
        }
        let len = h.packet_len();
        batch.push_data(batch::To { dst: item.peer, class: h.class, path }, &header, item.op, buffer, range);
        if repair {
            self.sh.stats.count_repair_sent(item.peer, class, len);
        }
        self.sh.count_transmit(item.peer, class, len);
        true
    }
}

/// Whether an index entry is its transfer's entry (a later one that an
/// earlier timer superseded is not).
fn timer_live(ops: &OpTable, &(at, id, side, peer): &TimerEntry) -> bool {
    ops.get(&id).is_some_and(|op| op.transfers().indexed(side, peer) == Some(at))
}
