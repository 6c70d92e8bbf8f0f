//! One allreduce op (see the [endpoint docs](super) for the algorithm): its
//! transfers of both phases with every peer ([`table`]), where its shards
//! and chunks lie and their arithmetic ([`shard`]), and the decisions that
//! span transfers: classes by magnitude at the start, the reduction of this
//! rank's shard ([`Op::reduce`]), the repairs of reduce-scatter
//! ([`Op::decide_scatter`]) and the agreed mask of all-gather
//! ([`Op::decide_gather`]), completion and its report.
//!
//! The transfers themselves are [`crate::transfer`]'s: the op routes packets
//! and timers to them and acts on what they return, through the endpoint's
//! [`Shared`] pieces (queues, counters, estimators).
//!
//! ## The other collectives (wire version 7)
//!
//! [`OpOptions::collective`] picks one; each runs phases of the allreduce
//! above, with its loss contract:
//!
//! - **Reduce-scatter**: phase 1 only. Rank `s` ends with shard `s` reduced
//!   ([`shard_range`](crate::endpoint::shard_range)) and zero elsewhere; it completes once its shard is
//!   reduced *and* every owner said DONE to its own sends (no all-gather
//!   tells it so). Budget: `budget_ppm`.
//! - **Allgather**: phase 2 only, rank `s` sending shard `s` of its input.
//!   Budget: `gather_budget_ppm`, under the agreed mask (every rank holds
//!   the same bytes).
//! - **Broadcast** from `root`: the root sends each other owner its shard
//!   (phase 1, one sender), then every owner sends its shard to every other
//!   rank (phase 2), the root included so that it holds what every rank
//!   holds — van de Geijn's scatter + all-gather: the root's uplink carries
//!   the tensor about twice, not `N − 1` times. Exact with both budgets 0.
//! - **Barrier**: an exact reduce-scatter of one element per rank (the
//!   input is ignored): a rank leaves once every rank has entered.
//!
//! Every packet names its op's collective; ranks that disagree refuse each
//! other's packets (`op_kind_mismatch`) and the op fails by the hard timeout.

pub(crate) mod accumulate;
mod classes;
mod delivery;
mod gather;
mod order;
pub(crate) mod shard;
pub(crate) mod table;

use std::ops::Range;

use crate::bitmap::Bitmap;
use crate::class::Class;
use crate::elem;
use crate::endpoint::api::{Collective, DType, OpKey, OpKind, OpOptions};
use crate::endpoint::shared::Shared;
use crate::endpoint::tx::{TxItem, TxKind};
use crate::pool::BufferPool;
use crate::priority::ClassifierConfig;
use crate::time::{Duration, Instant};
use crate::transfer::{
    Answer, Arrived, Behind, Drained, Fired, Mode, Receiver, Refused, Sender, fill_done, fill_mask,
};
use crate::wire::{self, Flags, Header, PacketType, Phase};

use accumulate::{Accumulator, Shard};
pub(crate) use shard::Layout;
pub(crate) use table::{Side, Transfers};

/// One allreduce op (see the module docs).
#[derive(Debug)]
pub(crate) struct Op {
    opts: OpOptions,
    started: Instant,
    /// Last time the op learned something (the hard timeout counts from here).
    last_progress: Instant,
    /// The hard timeout found it waiting on late ranks (up, but not started
    /// on it): it is not judged again before this ([`Op::await_late`]).
    late_until: Option<Instant>,
    layout: Layout,
    /// This rank's contribution, rounded to the op's element type.
    input: Vec<f32>,
    result: Vec<f32>,
    /// f16/bf16 ops: the input as the wire carries it (reduce-scatter DATA
    /// is sent from here); empty for f32, whose DATA is sent from `input`.
    wire_input: Vec<u8>,
    /// f16/bf16 ops: this rank's reduced shard as the wire carries it
    /// (all-gather DATA is sent from here), once reduced; empty for f32.
    wire_result: Vec<u8>,
    /// First element of this rank's shard (where `wire_result` starts).
    own_start: usize,
    /// Classes of the chunks of each shard in reduce-scatter (empty for own shard).
    classes: Vec<Vec<Class>>,
    /// Classes of own shard's chunks in all-gather.
    gclasses: Vec<Class>,
    transfers: Transfers,
    /// The reduction of this rank's shard, as contributions arrive.
    acc: Accumulator,
    reduced: bool,
    /// The all-gather's first pass waits for this op's reduce-scatter DATA
    /// to leave the queues (`first_pass`).
    gather_held: bool,
    /// This rank asked for a reduce-scatter repair before its reduce: it
    /// no longer holds its peers' all-gather back (`wants_from`).
    repairing: bool,
    /// The first reduce-scatter sender that may still have DATA queued
    /// (`scatter_drained`).
    held_scan: u32,
    /// Reduce-scatter chunks queued by the first pass, and gone since (`ack_wait`).
    scatter_pass: (u32, u32),
    /// The agreed mask of own shard, once decided.
    gmask: Option<Bitmap>,
    repairs_sent: u32,
    peer_gen: Vec<Option<u64>>,
    /// The classifier when the op started (a reload changes only new ops).
    classifier: ClassifierConfig,
    /// Its result went to the caller (wire version 10): what is left is an
    /// exact all-gather waiting for its receivers' ACKs, sent from the copy
    /// of this rank's shard in `wire_result` ([`Op::deliver`]).
    delivered: bool,
    /// Peers whose all-gather from this rank goes below its class
    /// (`network_class`).
    gather_low: Bitmap,
    /// The lowest class of this op's reduce-scatter chunks (`network_class`).
    scatter_low: Option<Class>,
}

/// Which of an op's buffers a DATA payload is sent from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Buffer {
    /// The input (reduce-scatter: this rank's contribution to another shard).
    Input,
    /// The result (all-gather: this rank's reduced shard).
    Result,
}

/// What a packet handler did with it.
type Handled = Result<(), Refused>;

/// How a reduce-scatter transfer closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closing {
    /// On its data (every chunk, or within budget on the LAST DATA): the
    /// owner's all-gather acknowledges it.
    Silent,
    /// Answering a PROBE (the acknowledgement is overdue): DONE.
    Answered,
    /// By its deadline, after a NACK went unanswered: DONE.
    Deadline,
}

/// Count a refused packet.
fn refused(sh: &mut Shared, r: Refused) {
    let rej = &mut sh.stats.rejected;
    match r {
        Refused::Mismatch => rej.mismatch += 1,
        Refused::Late => rej.late += 1,
        Refused::Duplicate => rej.duplicate += 1,
        Refused::DuplicateProbe => sh.stats.probes_duplicate += 1,
    }
}

impl Op {
    /// Start op `key` on `input` at `now`: rank the chunks this rank sends by
    /// magnitude into classes, open every transfer and queue the first pass
    /// of reduce-scatter.
    pub(crate) fn start(
        now: Instant,
        key: OpKey,
        layout: Layout,
        mut input: Vec<f32>,
        opts: OpOptions,
        pool: &mut BufferPool,
        sh: &mut Shared,
    ) -> Op {
        let (world, me) = (sh.cfg.world, sh.me());
        // A contribution is a value of the op's type: rounded once here (a
        // no-op for values of that type), and sent as that type. A
        // broadcast's input is read at its root only.
        let reads_input = opts.collective != Collective::Broadcast || me == opts.root;
        if reads_input {
            elem::round_all(opts.dtype, &mut input);
        }
        let mut wire_input = Vec::new();
        if opts.dtype != DType::F32 && reads_input && opts.collective.scatters() {
            wire_input.resize(input.len() * opts.dtype.size(), 0);
            elem::encode(opts.dtype, &input, &mut wire_input);
        }
        let mut op = Op {
            opts,
            started: now,
            last_progress: now,
            late_until: None,
            layout: layout.clone(),
            // Every chunk of the result is written (own shard: the reduction or
            // the input; the others: gathered, or zero-filled by the agreed
            // mask, or (no all-gather) zero).
            result: pool.take(input.len()),
            input,
            wire_input,
            wire_result: Vec::new(),
            own_start: layout.shard(me).start,
            classes: vec![Vec::new(); world as usize],
            gclasses: Vec::new(),
            transfers: Transfers::new(world as usize),
            acc: Accumulator::new(layout.chunks(me), world),
            reduced: false,
            gather_held: false,
            held_scan: 0,
            scatter_pass: (0, 0),
            repairing: false,
            gmask: None,
            delivered: false,
            gather_low: Bitmap::new(world),
            scatter_low: None,
            repairs_sent: 0,
            peer_gen: vec![None; world as usize],
            classifier: sh.cfg.classifier,
        };
        let (scatters, gathers) = (opts.collective.scatters(), opts.collective.gathers());
        let others = || (0..world).filter(move |&s| s != me);
        if gathers {
            // Every owner's shard comes back in the all-gather (to a
            // broadcast's root too: so it holds what every rank holds, the
            // chunks lost on the way to an owner included).
            for j in others().filter(|&j| layout.chunks(j) > 0) {
                let r = Receiver::new(layout.chunks(j), Vec::new(), Mode::Agreed);
                op.transfers.set_receiver(Phase::Gather, j, r);
            }
        }
        if scatters {
            op.open_scatter(key, pool, sh);
        }
        op
    }

    /// Open the reduce-scatter: rank the chunks this rank sends by magnitude
    /// into classes, open a send and a receive transfer with every peer,
    /// add this rank's own term and queue the first pass.
    fn open_scatter(&mut self, key: OpKey, pool: &mut BufferPool, sh: &mut Shared) {
        let (world, me) = (sh.cfg.world, sh.me());
        let (layout, opts) = (self.layout.clone(), self.opts);
        // A broadcast's scatter runs from the root only: it sends every
        // other owner its shard of the tensor.
        let bcast = opts.collective == Collective::Broadcast;
        let sends = !bcast || me == opts.root;
        let hears = |j: u32| !bcast || j == opts.root;
        let others = || (0..world).filter(move |&s| s != me);
        if sends {
            // Classes of every chunk this rank sends in reduce-scatter, ranked
            // by magnitude across the whole tensor.
            for s in others() {
                self.classes[s as usize] = vec![Class::default(); layout.chunks(s) as usize];
            }
            let ranks = layout.magnitude_ranks(&self.input, others(), self.classifier.magnitude_levels);
            for &(s, c, rank) in &ranks {
                self.classes[s as usize][c as usize] =
                    self.classify(Phase::Scatter, rank, ranks.len() as u32);
            }
            self.scatter_low = self.classes.iter().flatten().copied().min_by_key(|c| c.get());
        }
        let own_chunks = layout.chunks(me);
        for j in others() {
            let n = layout.chunks(j);
            if n > 0 && sends {
                let required = self.required(&self.classes[j as usize]);
                let st = Sender::new(
                    n,
                    required,
                    opts.budget_ppm,
                    sh.seg_bytes(),
                    Mode::Own,
                    sh.paths.multipath(),
                );
                self.transfers.set_sender(Phase::Scatter, j, st);
            }
            if own_chunks > 0 && hears(j) {
                // A broadcast's chunks go straight into the result: no staging.
                let buf = if bcast { Vec::new() } else { pool.take(layout.shard(me).len()) };
                self.transfers.set_receiver(
                    Phase::Scatter,
                    j,
                    Receiver::new(own_chunks, buf, Mode::Own).capped(opts.budget_ppm),
                );
            }
        }
        if !bcast {
            // This rank's own term goes into the sum at once where it comes first.
            let own = &self.input[self.layout.shard(me)];
            let shard = Shard { layout: &self.layout, me, own, dtype: opts.dtype };
            let out = &mut self.result[self.layout.shard(me)];
            self.acc.start(shard, self.transfers.receivers(Phase::Scatter), out);
        }
        self.first_pass(key, Phase::Scatter, sh);
    }

    /// Reduce this rank's shard once every reduce-scatter transfer closed,
    /// then start the all-gather.
    pub(crate) fn reduce(&mut self, key: OpKey, sh: &mut Shared) {
        if self.reduced || self.transfers.any_open(Phase::Scatter) {
            return;
        }
        self.reduced = true;
        sh.want_grew = true;
        let (world, me) = (sh.cfg.world, sh.me());
        let layout = &self.layout;
        let dtype = self.opts.dtype;
        let collective = self.opts.collective;
        let own = layout.shard(me);
        let root = collective == Collective::Broadcast && me == self.opts.root;
        if collective == Collective::Broadcast && !root {
            // The root's values are in place as they came; what never came
            // (within the budget) is zero.
            if let Some(r) = self.transfers.receiver(Phase::Scatter, self.opts.root) {
                for c in (0..r.n()).filter(|&c| !r.got().get(c)) {
                    self.result[layout.chunk_in_tensor(me, c)].fill(0.0);
                }
            }
        } else if collective.scatters() && !root {
            let shard = Shard { layout, me, own: &self.input[own.clone()], dtype };
            let out = &mut self.result[own.clone()];
            self.acc.finish(shard, self.transfers.receivers(Phase::Scatter), &self.opts, out);
        } else {
            // Allgather, and a broadcast's root: this rank's shard is its input.
            self.result[own.clone()].copy_from_slice(&self.input[own.clone()]);
        }
        if !collective.gathers() {
            // Reduce-scatter: only this rank's shard is the op's; the rest
            // is zero (the pool's buffers hold old values).
            self.result[..own.start].fill(0.0);
            self.result[own.end..].fill(0.0);
            self.gmask = Some(Bitmap::new(layout.chunks(me)));
            return;
        }
        let out = &self.result[own];
        if dtype != DType::F32 {
            // The rounded shard as the all-gather carries it.
            self.wire_result.resize(out.len() * dtype.size(), 0);
            elem::encode(dtype, out, &mut self.wire_result);
        }
        // Gather classes: rank own chunks by magnitude within the shard.
        let n = layout.chunks(me);
        let ranks = layout.magnitude_ranks(&self.result, [me].into_iter(), self.classifier.magnitude_levels);
        self.gclasses = ranks.iter().map(|&(_, _, r)| self.classify(Phase::Gather, r, n)).collect();
        // The input stays: reduce-scatter sends to other owners may still need
        // repairs. The staging buffers stay too, and go back to the pool with
        // the op's other buffers (a buffer freed here would be a fresh
        // allocation, page faults included, for the next op).
        if n == 0 || world == 1 {
            self.gmask = Some(Bitmap::new(n));
            return;
        }
        let required = self.required(&self.gclasses);
        for j in (0..world).filter(|&j| j != me) {
            let st = Sender::new(
                n,
                required,
                self.opts.gather_budget_ppm,
                sh.seg_bytes(),
                Mode::Agreed,
                sh.paths.multipath(),
            );
            self.transfers.set_sender(Phase::Gather, j, st);
        }
        self.first_pass(key, Phase::Gather, sh);
    }

    /// A packet for this op from `h.src`, authenticated and of the current
    /// generation of its sender.
    pub(crate) fn on_packet(
        &mut self,
        now: Instant,
        key: OpKey,
        h: &Header,
        payload: &[u8],
        sh: &mut Shared,
    ) {
        let src = h.src as usize;
        if OpKind::of_header(h) != OpKind::of(&self.opts) {
            // Its ranks' trainers disagree about the op (wire versions 6, 7).
            sh.stats.rejected.op_kind_mismatch += 1;
            return;
        }
        match self.peer_gen[src] {
            None => self.peer_gen[src] = Some(h.session),
            Some(g) if g != h.session => {
                sh.stats.rejected.unverified_session += 1;
                return;
            }
            _ => {}
        }
        if self.delivered {
            return self.on_packet_delivered(key, h, payload, now, sh);
        }
        let handled = match (h.ty, h.phase) {
            (PacketType::Data, _) => self.on_data(now, key, h, payload, sh),
            (PacketType::Probe, _) => self.on_probe(now, key, h, payload, sh),
            (PacketType::Bitmap, _) => self.on_bitmap(now, key, h, payload, sh),
            (PacketType::Done, Phase::Scatter) => self.on_done(now, h, sh),
            (PacketType::Done, _) => self.on_mask(now, h, payload, sh),
            (PacketType::Hello | PacketType::Grant | PacketType::Goodbye | PacketType::Ack, _) => {
                Err(Refused::Mismatch)
            }
        };
        if let Err(r) = handled {
            refused(sh, r);
        }
    }

    /// A chunk (its payload authenticated, straight from the received
    /// datagram): gather, the owner's reduced value, into the result;
    /// scatter, a contribution to this rank's shard, added to the result at
    /// once when its turn in rank order has come, else staged (see
    /// [`accumulate`]).
    fn on_data(&mut self, now: Instant, key: OpKey, h: &Header, payload: &[u8], sh: &mut Shared) -> Handled {
        let (phase, peer, c) = (h.phase, h.src, h.chunk_index);
        let owner = if phase == Phase::Gather { peer } else { sh.me() };
        let r = self.transfers.receiver_mut(phase, peer).ok_or(Refused::Mismatch)?;
        let range = self.layout.chunk(owner, c);
        let dtype = self.opts.dtype;
        r.admit(h, payload.len(), range.len() * dtype.size())?;
        // A repair comes a NACK's round trip after the first pass: no pause.
        if r.has_data() && !h.flags.contains(Flags::REPAIR) {
            sh.flow.note_pause(peer, now);
        }
        sh.flow.new_chunk(peer, h.seq, h.class);
        self.last_progress = now;
        let layout = &self.layout;
        if phase == Phase::Gather || self.opts.collective == Collective::Broadcast {
            // The owner's value, or (broadcast) the root's: it is the result.
            elem::decode(dtype, payload, &mut self.result[layout.chunk_in_tensor(owner, c)]);
        } else if self.acc.is_next(c, peer) {
            let shard = Shard { layout, me: owner, own: &self.input[layout.shard(owner)], dtype };
            let out = &mut self.result[layout.shard(owner)];
            self.acc.add_now(c, payload, shard, self.transfers.receivers(Phase::Scatter), out);
        } else {
            elem::decode(dtype, payload, &mut r.buf_mut()[range]);
        }
        let r = self.transfers.receiver_mut(phase, peer).ok_or(Refused::Mismatch)?;
        if h.flags.contains(Flags::REPAIR) {
            sh.stats.count_repair_received(h.src, h.class, h.packet_len());
        }
        let est = &sh.deadlines[usize::from(phase == Phase::Gather)];
        let got = r.on_data(h, now, est, sh.rtt.timeout(), sh.flow.high(peer));
        if let Some(d) = got.overtake {
            sh.observe_overtake(d);
        }
        match got.then {
            Arrived::Nothing if h.flags.contains(Flags::LAST) => {
                // The LAST DATA is the sender's newest to this rank: what it
                // sent before is here unless its datagrams reorder. Where
                // they may (paths of different delays), its data sequence
                // number says how many it sent, and until all of those
                // arrived some are still on their way (or lost).
                let sent = sh.flow.extend(peer, h.seq) + 1;
                let b = sh.flow.behind(peer, sent, sh.paths.multipath(), sh.rtt.timeout(), now);
                let behind = Behind { sent: if b.reordering { sent } else { b.seen }, ..b };
                let answer = r.on_last(h, now, sh.close_grace(), sh.rtt.timeout(), Some(behind));
                self.answer(now, key, phase, peer, answer, sh);
            }
            Arrived::Nothing => {}
            Arrived::Close => self.close(now, key, peer, Closing::Silent, sh),
            Arrived::Complete => match r.close_complete(now) {
                None => sh.tx.push_bitmaps(key, phase, peer, 1),
                Some(closed) => {
                    // Exact: the owner waits only to hear that this rank has
                    // its shard. On a clean network that goes in one ACK per
                    // owner for every op completed within the ACK delay
                    // (wire version 10, `endpoint::acks`), written without
                    // the op, which may complete before it leaves. On a lossy
                    // one the owner PROBEs right after its LAST DATA, so the
                    // report goes at once, as the COMPLETE bitmap of version
                    // 8, in two copies like a PROBE: one loss costs no timeout
                    // (two copies from every receiver at once overflowed
                    // owners' queues at 256 ranks, so not on a clean one).
                    if sh.loss.lossy() {
                        let kind = TxKind::Complete { n: r.n(), seq: h.seq };
                        sh.tx.push(TxItem { op: key, phase, peer, kind });
                        sh.tx.push(TxItem { op: key, phase, peer, kind });
                    } else if sh.acks.add(peer, key.id(), h.seq, now) {
                        sh.tx.push(TxItem { op: key, phase, peer, kind: TxKind::Ack });
                    }
                    if let Some(took) = closed.took {
                        sh.deadlines[1].observe(took, r.n());
                    }
                    self.last_progress = now;
                }
            },
        }
        if phase == Phase::Gather {
            self.acknowledged(now, peer, sh);
        }
        Ok(())
    }

    /// The owner `peer` sent its all-gather (or its mask): it closed every
    /// transfer into its shard, ours included — the implicit acknowledgement
    /// of our reduce-scatter transfer to it.
    fn acknowledged(&mut self, now: Instant, peer: u32, sh: &mut Shared) {
        let Some(st) = self.transfers.sender_mut(Phase::Scatter, peer) else { return };
        if st.acknowledged(&mut |p, ok| sh.judge_path(peer, p, ok, now)) {
            self.last_progress = now;
        }
    }

    /// Act on a receiver's decision (on a PROBE, or on a LAST DATA).
    fn answer(&mut self, now: Instant, key: OpKey, phase: Phase, peer: u32, answer: Answer, sh: &mut Shared) {
        match answer {
            Answer::Nothing => {}
            Answer::Done => sh.tx.push(TxItem { op: key, phase, peer, kind: TxKind::Done { seg: 0 } }),
            Answer::Close => self.close(now, key, peer, Closing::Silent, sh),
            Answer::Bitmap => {
                let Some(r) = self.transfers.receiver(phase, peer) else { return };
                sh.tx.push_bitmaps(key, phase, peer, r.bitmap_segments(sh.seg_bytes()));
                self.nacked(phase, sh);
            }
        }
    }

    fn on_probe(&mut self, now: Instant, key: OpKey, h: &Header, payload: &[u8], sh: &mut Shared) -> Handled {
        let (phase, peer) = (h.phase, h.src);
        let grace = sh.close_grace();
        // How many DATA datagrams the sender had sent this rank before the
        // PROBE, and how many of them are here: the rest are in flight behind
        // it (or lost).
        let (multipath, rto) = (sh.paths.multipath(), sh.rtt.timeout());
        let sent = wire::parse_grant(payload).map(|sent| sh.flow.behind(peer, sent, multipath, rto, now));
        let r = self.transfers.receiver_mut(phase, peer).ok_or(Refused::Mismatch)?;
        let est = &sh.deadlines[usize::from(phase == Phase::Gather)];
        let probed = r.on_probe(h, now, grace, est, sent)?;
        if probed.progress {
            self.last_progress = now;
        }
        match probed.answer {
            // The sender probed: its acknowledgement is overdue, answer DONE.
            Answer::Close => self.close(now, key, peer, Closing::Answered, sh),
            answer => self.answer(now, key, phase, peer, answer, sh),
        }
        Ok(())
    }

    fn on_bitmap(
        &mut self,
        now: Instant,
        key: OpKey,
        h: &Header,
        payload: &[u8],
        sh: &mut Shared,
    ) -> Handled {
        self.heard_bitmap(now, key, h, payload, Duration::ZERO, sh)
    }

    /// A BITMAP, or (`held` > 0) an ACK entry read as a COMPLETE one: the
    /// round-trip sample it gives excludes the time it was held.
    fn heard_bitmap(
        &mut self,
        now: Instant,
        key: OpKey,
        h: &Header,
        payload: &[u8],
        held: Duration,
        sh: &mut Shared,
    ) -> Handled {
        let (phase, peer) = (h.phase, h.src);
        let exact = self.exact_gather(sh);
        let st = self.transfers.sender_mut(phase, peer).ok_or(Refused::Mismatch)?;
        if h.chunk_count != st.n() {
            return Err(Refused::Mismatch);
        }
        if phase == Phase::Gather
            && let Some(mask) = &self.gmask
        {
            // The receiver missed our DONE: announce the mask again (an
            // exact all-gather has none: its receivers closed on their own).
            if !exact {
                sh.tx.push_mask(key, peer, mask, sh.seg_bytes());
            }
            return Ok(());
        }
        let seg_bytes = sh.seg_bytes();
        let heard = st.on_bitmap(h, payload, now, seg_bytes, &mut |p, ok| sh.judge_path(peer, p, ok, now));
        if let Some(rtt) = heard.rtt {
            sh.rtt.observe(rtt.saturating_sub(held));
        }
        if heard.news {
            self.last_progress = now;
        }
        if heard.round {
            match phase {
                // Exact: repair this receiver at once, not after every
                // receiver reported (no mask to agree on).
                Phase::Gather if exact && !st.receiver_complete() => {
                    let missing: Vec<u32> = st.missing().collect();
                    let chunks = st.decide_jointly(&missing);
                    self.queue_repairs(key, Phase::Gather, peer, &chunks, sh);
                }
                Phase::Gather => self.decide_gather(key, sh),
                _ => self.decide_scatter(now, key, peer, sh),
            }
        }
        Ok(())
    }

    /// Reduce-scatter DONE: the receiver closed our transfer.
    fn on_done(&mut self, now: Instant, h: &Header, sh: &mut Shared) -> Handled {
        let st = self.transfers.sender_mut(Phase::Scatter, h.src).ok_or(Refused::Mismatch)?;
        let heard = st.on_done(h.seq, now, &mut |p, ok| sh.judge_path(h.src, p, ok, now));
        if let Some(rtt) = heard.rtt {
            sh.rtt.observe(rtt);
        }
        if heard.news {
            self.last_progress = now;
        }
        Ok(())
    }

    /// Close the reduce-scatter transfer from `peer` (`how`: whether by its
    /// deadline, whether DONE answers), and reduce once every one closed.
    /// The all-gather this rank then sends `peer` acknowledges it; a
    /// collective without one (reduce-scatter, barrier) answers DONE always.
    fn close(&mut self, now: Instant, key: OpKey, peer: u32, how: Closing, sh: &mut Shared) {
        let Some(r) = self.transfers.receiver_mut(Phase::Scatter, peer) else { return };
        let Some(closed) = r.close(now, how == Closing::Deadline) else { return };
        if closed.incomplete {
            sh.stats.closed_within_budget += 1;
        }
        if let Some(took) = closed.took {
            sh.deadlines[0].observe(took, r.n());
        }
        self.last_progress = now;
        if how != Closing::Silent || !self.opts.collective.gathers() {
            sh.tx.push(TxItem { op: key, phase: Phase::Scatter, peer, kind: TxKind::Done { seg: 0 } });
        }
        self.reduce(key, sh);
    }

    /// A reduce-scatter receiver's full bitmap arrived: repair just enough.
    fn decide_scatter(&mut self, now: Instant, key: OpKey, dst: u32, sh: &mut Shared) {
        let classes = &self.classes[dst as usize];
        let Some(st) = self.transfers.sender_mut(Phase::Scatter, dst) else { return };
        let repairs = st.decide_alone(now, |c| classes[c as usize], self.classifier.droppable);
        self.queue_repairs(key, Phase::Scatter, dst, &repairs, sh);
    }

    fn queue_repairs(&mut self, key: OpKey, phase: Phase, peer: u32, chunks: &[u32], sh: &mut Shared) {
        self.repairs_sent += chunks.len() as u32;
        sh.loss.lost(chunks.len() as u32);
        for &chunk in chunks {
            let kind = TxKind::Data { chunk, repair: true, class: self.class_of(phase, peer, chunk) };
            sh.tx.push_data(TxItem { op: key, phase, peer, kind });
        }
    }

    /// The op's transfers.
    pub(crate) fn transfers(&self) -> &Transfers {
        &self.transfers
    }

    /// The op's transfers, to change.
    pub(crate) fn transfers_mut(&mut self) -> &mut Transfers {
        &mut self.transfers
    }

    /// The phase the op is in.
    pub(crate) fn phase(&self) -> Phase {
        if self.reduced { Phase::Gather } else { Phase::Scatter }
    }

    /// Serve the due timers of this op: `keys` are its transfers with a live
    /// timer at or before `now`, as (side, peer), sorted.
    pub(crate) fn on_timers(&mut self, now: Instant, key: OpKey, keys: &[(Side, u32)], sh: &mut Shared) {
        for &(side, j) in keys.iter().filter(|k| k.0.is_send()) {
            if self.transfers.sender_mut(side.phase(), j).is_some_and(|st| st.on_timer(now)) {
                sh.tx.push_probes(key, side.phase(), j);
            }
        }
        let mut close = Vec::new();
        let mut grace_close = Vec::new();
        let (mut nacked, mut nacked_scatter) = (false, false);
        for &(side, j) in keys.iter().filter(|k| !k.0.is_send()) {
            let phase = side.phase();
            let Some(r) = self.transfers.receiver_mut(phase, j) else { continue };
            let arrived = r.probe_sent().map_or(0, |sent| sh.flow.arrived(j, sent, sh.paths.multipath()).0);
            let fired = r.on_timer(now, &sh.retry_from(j, now), sh.flow.seen(j), arrived);
            if let (Fired::Close { .. } | Fired::Bitmap { .. }, Some(sent)) = (fired, r.probe_sent()) {
                sh.flow.take_as_lost(j, sent);
            }
            if matches!(fired, Fired::Close { deadline: true } | Fired::Bitmap { deadline: true }) {
                sh.stats.deadlines_fired += 1;
            }
            match fired {
                Fired::Nothing => {}
                Fired::Close { deadline: true } => {
                    sh.stats.deadline_closes += 1;
                    close.push(j);
                }
                Fired::Close { deadline: false } => grace_close.push(j),
                Fired::Bitmap { deadline } => {
                    sh.stats.deadline_nacks += u64::from(deadline);
                    sh.tx.push_bitmaps(key, phase, j, r.bitmap_segments(sh.seg_bytes()));
                    nacked = true;
                }
                // A queue on the sender's path overflows: its tail was
                // dropped there, and repairs now would meet the same
                // queue; the sender's overdue PROBE (or the deadline)
                // recovers it, later.
                Fired::Quiet if sh.flow.congested(j) => {}
                // Not a NACK that ends the all-gather hold (`nacked`): a
                // sender quiet before its LAST is most often one whose tail
                // still waits in this rank's port queue, and letting every
                // owner's all-gather in now would queue it ahead of that
                // tail (64 ranks, 1 MB, clean: one op in three took 2.7 ms
                // instead of 1.9; 256 ranks: five in eight).
                Fired::Quiet => {
                    sh.stats.quiet_nacks += 1;
                    sh.tx.push_bitmaps(key, phase, j, r.bitmap_segments(sh.seg_bytes()));
                }
            }
            if std::mem::take(&mut nacked) {
                nacked_scatter |= phase == Phase::Scatter;
            }
        }
        if nacked_scatter {
            self.nacked(Phase::Scatter, sh);
        }
        for j in close {
            self.close(now, key, j, Closing::Deadline, sh);
        }
        for j in grace_close {
            // The grace after a PROBE (or a LAST DATA) ended: DONE answers
            // the PROBE (after a LAST DATA it is one spare packet).
            self.close(now, key, j, Closing::Answered, sh);
        }
    }

    /// Payload bytes of a chunk this rank sends to `peer` in `phase`.
    pub(crate) fn chunk_bytes(&self, phase: Phase, peer: u32, chunk: u32, me: u32) -> usize {
        let owner = if phase == Phase::Scatter { peer } else { me };
        self.layout.chunk(owner, chunk).len() * self.opts.dtype.size()
    }

    /// The op's kind, which every packet of it carries (wire versions 6, 7).
    pub(crate) fn kind(&self) -> OpKind {
        OpKind::of(&self.opts)
    }

    /// The header of DATA `item`, where its payload lies (elements `range`
    /// of `buffer`), and the path it goes on (a repair avoids the path its
    /// chunk was last sent on); the chunk counts as sent.
    pub(crate) fn data_header(
        &mut self,
        item: TxItem,
        now: Instant,
        sh: &mut Shared,
    ) -> Option<(Header, Buffer, Range<usize>, u8)> {
        let TxKind::Data { chunk, repair, class } = item.kind else { return None };
        let (phase, peer) = (item.phase, item.peer);
        let net_class = self.network_class(phase, peer, class, repair, sh);
        let st = self.transfers.sender_mut(phase, peer)?;
        let (owner, buffer) =
            if phase == Phase::Scatter { (peer, Buffer::Input) } else { (sh.me(), Buffer::Result) };
        let cr = self.layout.chunk_in_tensor(owner, chunk);
        let mut h = sh.header(PacketType::Data, net_class, phase, item.op.id(), peer);
        OpKind::of(&self.opts).stamp(&mut h);
        h.chunk_index = chunk;
        st.fill_data(&mut h);
        h.payload_len = (cr.len() * self.opts.dtype.size()) as u16;
        if repair {
            h.flags = h.flags.with(Flags::REPAIR);
        } else {
            sh.loss.sent();
        }
        if !self.classifier.droppable.contains(class) {
            h.flags = h.flags.with(Flags::REQUIRED);
        }
        let avoid = if repair { st.path_of(chunk) } else { None };
        let path = sh.pick_path(peer, avoid, false, now);
        if st.sent(chunk, path, &mut |p, ok| sh.judge_path(peer, p, ok, now)) {
            h.flags = h.flags.with(Flags::LAST);
        }
        Some((h, buffer, cr, path))
    }

    /// The LAST DATA of the transfer to `peer` in `phase` went out at `now`
    /// as data sequence number `dseq` (for round-trip samples).
    pub(crate) fn last_sent_as(&mut self, phase: Phase, peer: u32, dseq: u32, now: Instant) {
        if let Some(st) = self.transfers.sender_mut(phase, peer) {
            st.last_sent_as(dseq, now);
        }
    }

    /// The wire bytes of elements `start .. start + len` of the op's input
    /// or result, where DATA payloads are sent from: the `f32` memory itself
    /// for an f32 op, its encoded copy for f16/bf16 (the result's: this
    /// rank's shard only, which is all the all-gather sends).
    pub(crate) fn payload(&self, b: Buffer, start: usize, len: usize) -> &[u8] {
        let size = self.opts.dtype.size();
        let (wire, base) = match (self.opts.dtype, b) {
            (DType::F32, Buffer::Input) => return bytemuck::cast_slice(&self.input[start..start + len]),
            (DType::F32, Buffer::Result) if !self.delivered => {
                return bytemuck::cast_slice(&self.result[start..start + len]);
            }
            (_, Buffer::Input) => (&self.wire_input, 0),
            (_, Buffer::Result) => (&self.wire_result, self.own_start),
        };
        let at = start.saturating_sub(base) * size;
        wire.get(at..at + len * size).unwrap_or(&[])
    }

    /// A queued chunk for `peer` in `phase` left the queue. Returns a probe
    /// timer to index, if one was armed.
    pub(crate) fn dequeued(
        &mut self,
        now: Instant,
        key: OpKey,
        phase: Phase,
        peer: u32,
        sh: &mut Shared,
    ) -> Option<Instant> {
        let retry = sh.retry();
        if phase == Phase::Scatter {
            self.scatter_pass.1 = (self.scatter_pass.1 + 1).min(self.scatter_pass.0);
        }
        // How long the receiver's answer to the LAST DATA may take beyond a
        // round trip: the owner's all-gather (reduce-scatter), the ACK delay
        // (exact all-gather), nothing (a gather whose mask is agreed).
        let ack = match phase {
            // The receiver's last chunk from this rank may wait in its port
            // behind the other owners' all-gathers: allow as long again as
            // the op took so far, as for reduce-scatter.
            Phase::Gather if self.exact_gather(sh) => {
                sh.cfg.timers.ack_delay + (now - self.started).min(retry.deadline_cap())
            }
            Phase::Gather => Duration::ZERO,
            _ => self.ack_wait(now, phase, retry.deadline_cap()),
        };
        let drained =
            self.transfers.sender_mut(phase, peer).map(|st| st.dequeued(now, &retry, ack, sh.loss.lossy()));
        // Whether or not its transfer is still here: a delivered op has let
        // its reduce-scatter senders go, and a held all-gather must not wait
        // on them ([`Op::release_gather`]).
        if phase == Phase::Scatter && self.gather_held && self.scatter_drained(sh.cfg.world) {
            self.release_gather(key, sh);
        }
        match drained? {
            Drained::Busy => None,
            Drained::Report => {
                self.decide_gather(key, sh);
                None
            }
            Drained::ProbeAt(at) => Some(at),
            Drained::Probe => {
                sh.tx.push_probes(key, phase, peer);
                None
            }
        }
    }

    /// Fill DONE segment `seg` to `peer` in `phase`: scatter, this rank closed
    /// the transfer; gather, the agreed mask.
    pub(crate) fn fill_done(
        &self,
        phase: Phase,
        peer: u32,
        seg: u32,
        h: &mut Header,
        buf: &mut [u8],
        seg_bytes: usize,
    ) -> Option<()> {
        match phase {
            // Delivered (its receivers gone): it closed every one; `h.src`
            // is this rank, whose shard's chunks the DONE names.
            Phase::Scatter if self.delivered => {
                fill_done(h, self.layout.chunks(h.src), 0);
                Some(())
            }
            Phase::Scatter => {
                self.transfers.receiver(Phase::Scatter, peer)?.fill_done(h);
                Some(())
            }
            _ => fill_mask(h, self.gmask.as_ref()?, seg, seg_bytes, buf),
        }
    }

    /// State and tensor bytes and open transfers (for the endpoint's footprint).
    pub(crate) fn footprint(&self) -> (usize, usize, u32) {
        let (state, tensor, open) = self.transfers.footprint();
        let state = state
            + size_of::<Op>()
            + self.classes.iter().map(|c| c.capacity() + size_of::<Vec<Class>>()).sum::<usize>()
            + self.gclasses.capacity()
            + self.peer_gen.capacity() * size_of::<Option<u64>>()
            + self.acc.bytes()
            + self.gmask.as_ref().map_or(0, Bitmap::heap_bytes)
            + self.gather_low.heap_bytes();
        let wire = self.wire_input.capacity() + self.wire_result.capacity();
        (state, tensor + (self.input.capacity() + self.result.capacity()) * 4 + wire, open)
    }
}
