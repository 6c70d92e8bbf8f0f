//! The receive side of a transfer: admission of chunks, answers to PROBEs
//! (close, bitmap, or wait for chunks the PROBE overtook), the adaptive
//! deadline, and for all-gather the owner's agreed mask.

use crate::bitmap::Bitmap;
use crate::estimator::DeadlineEstimator;
use crate::time::{Duration, Instant};
use crate::transfer::rules::{
    MAX_BACKOFF, MAX_BUDGET_PPM, Mode, Refused, Retry, allowed_missing, fill_done, set_all, write_segment,
};
use crate::wire::{self, Flags, Header, PacketType, Phase};

/// What one transfer delivered, as seen by its receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferReport {
    /// The sending rank (for gather: the shard's owner).
    pub peer: u32,
    /// Phase.
    pub phase: Phase,
    /// Chunks in the transfer.
    pub chunks: u32,
    /// Chunks that arrived before the transfer closed.
    pub delivered: Bitmap,
    /// Gather only: the agreed mask of zero-filled chunks.
    pub mask: Option<Bitmap>,
    /// Chunks that arrived as repairs.
    pub repaired: u32,
    /// True if the adaptive deadline fired.
    pub deadline_fired: bool,
    /// First packet of the transfer.
    pub first_at: Option<Instant>,
    /// When the transfer closed.
    pub closed_at: Instant,
}

impl TransferReport {
    /// Fraction of chunks whose data is in the result (gather: not masked).
    pub fn delivered_fraction(&self) -> f64 {
        if self.chunks == 0 {
            return 1.0;
        }
        let used = match &self.mask {
            Some(m) => self.chunks - m.count_ones(),
            None => self.delivered.count_ones(),
        };
        f64::from(used) / f64::from(self.chunks)
    }
}

/// What a PROBE (or a LAST DATA) said of its sender's DATA to this rank:
/// `sent` datagrams before it, of which `seen` arrived (one past the highest
/// data sequence number; or, where they may reorder, exactly how many of
/// those `sent` are here: see `Flow::arrived`); `reordering`: the sender's
/// datagrams may arrive out of order (they take paths of different delays,
/// [`crate::paths`]), so the arrival of the last chunk sent does not prove
/// that the earlier ones are not in flight; `wait`: then how long after it
/// to wait for them when none arrives (what the receiver measured of how
/// late the sender's reordered datagrams come, `Flow::reorder_wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Behind {
    pub sent: u64,
    pub seen: u64,
    pub reordering: bool,
    pub wait: Duration,
}

/// The receive side of one transfer.
#[derive(Debug)]
pub(crate) struct Receiver {
    n: u32,
    mode: Mode,
    required: Option<u32>,
    budget_ppm: u32,
    /// [`Mode::Agreed`]: the owner's budget as its DATA carries it. When it
    /// allows no missing chunk the owner repairs everything and announces
    /// no mask, so a receiver holding every chunk closes on its own
    /// ([`Receiver::exact`]).
    owner_budget_ppm: Option<u32>,
    /// This rank's own budget for the transfer: a sender's larger one is
    /// not taken (a drifted config closes no transfer more lossily than the
    /// receiver allows).
    cap_ppm: u32,
    got: Bitmap,
    got_required: u32,
    /// Reduce-scatter: the received contributions (contents unspecified:
    /// only chunks marked in `got` are ever read). All-gather: empty (the
    /// chunks go straight into the result).
    buf: Vec<f32>,
    first_at: Option<Instant>,
    /// Arrival of the latest new chunk.
    last_at: Option<Instant>,
    deadline: Option<Instant>,
    deadline_fired: bool,
    deadline_backoff: u32,
    /// Chunks that arrived (what `got` counts, without counting it).
    arrived: u32,
    /// [`Mode::Own`], before the LAST DATA: when the sender has been quiet
    /// for longer than its chunks' spacing explains, and that wait — the
    /// tail of the round (its LAST included) was probably lost: NACK.
    quiet: Option<(Instant, Duration)>,
    /// How far the sender's DATA to this rank had come when the quiet timer
    /// was armed (it waits while that moves).
    quiet_mark: u64,
    /// NACKs sent since a chunk last arrived: a NACK that brings nothing is
    /// sent again, backing off (it, or the repairs it asked for, was lost).
    quiet_k: u32,
    grace: Option<Instant>,
    /// While `grace` runs: the chunk whose arrival ends it early.
    awaited: Option<u32>,
    /// How long the grace after the PROBE that set `awaited` is, from when
    /// it last ran, and how far the sender's DATA to this rank had come then
    /// (it is renewed while the transfer's chunks keep landing, or the
    /// sender's DATA the PROBE overtook does: see [`Receiver::on_timer`]).
    settle: Option<(Duration, Instant, u64)>,
    /// While `settle` is set: when the PROBE or LAST DATA that began it
    /// arrived.
    settled_at: Instant,
    /// The sender's DATA count to this rank when it sent the last PROBE.
    probe_sent: Option<u64>,
    /// The last PROBE found the sender's datagrams arriving reordered
    /// ([`Behind::reordering`]): the chunk it names landing ends no settle.
    reordered: bool,
    /// How long after `settled_at` to wait for the sender's DATA sent
    /// before it while none arrives ([`Behind::wait`]).
    reorder_wait: Duration,
    /// How far the sender's DATA to this rank had come when the deadline
    /// last looked (a deadline waits while it moves).
    seen_mark: u64,
    /// When the PROBE that set `awaited` arrived (to learn how far PROBEs
    /// overtake data queued in the network).
    probe_at: Option<Instant>,
    /// [`Mode::Agreed`]: complete and waiting for the owner's DONE; re-send
    /// the COMPLETE bitmap on this RTT-based timer in case the DONE was lost.
    nudge: Option<(Instant, u32)>,
    closed_at: Option<Instant>,
    probe_seq: u32,
    /// What the next BITMAP's `seq` echoes: the round of the PROBE it
    /// answers, or the data sequence number of the LAST DATA it answers
    /// (so the sender takes a round-trip sample from either).
    echo: u32,
    repaired: u32,
    mask: Option<Bitmap>,
    mask_parts: Option<(Bitmap, Bitmap)>,
    complete_sent: bool,
}

/// What a new chunk leads to ([`Receiver::on_data`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrived {
    /// Nothing yet.
    Nothing,
    /// [`Mode::Own`]: every chunk is here: close.
    Close,
    /// [`Mode::Agreed`]: every chunk is here: tell the owner (a COMPLETE
    /// BITMAP; the nudge timer is armed).
    Complete,
}

/// The outcome of a new chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DataIn {
    /// How far the PROBE that named this chunk overtook it, if it did.
    pub overtake: Option<Duration>,
    /// What to do.
    pub then: Arrived,
}

/// How to answer a PROBE ([`Receiver::on_probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Nothing now (closed in [`Mode::Agreed`], or settling: the answer
    /// comes when the grace timer fires or the awaited chunk lands).
    Nothing,
    /// [`Mode::Own`], closed already: DONE again.
    Done,
    /// [`Mode::Own`], within budget: close (and answer DONE).
    Close,
    /// The bitmap of what arrived ([`Receiver::bitmap_segments`] segments).
    Bitmap,
}

/// The outcome of a PROBE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Probed {
    /// The first packet of the transfer: progress (a repeated PROBE is not,
    /// so a peer probing forever cannot keep a stuck op alive).
    pub progress: bool,
    /// The answer.
    pub answer: Answer,
}

/// A transfer just closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closed {
    /// Closed within budget but not complete.
    pub incomplete: bool,
    /// First packet to close, unless a deadline closed it: a sample for the
    /// phase's deadline estimator.
    pub took: Option<Duration>,
}

/// What a receive timer did ([`Receiver::on_timer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fired {
    /// No timer was due.
    Nothing,
    /// [`Mode::Own`]: close (`deadline`: the deadline closed it, after a
    /// NACK went unanswered; otherwise the grace after a PROBE ended).
    Close {
        /// Closed by the deadline.
        deadline: bool,
    },
    /// Send the bitmap (`deadline`: a deadline NACK; otherwise the answer
    /// to a PROBE after its grace, or a nudge of the owner).
    Bitmap {
        /// Sent because the deadline fired.
        deadline: bool,
    },
    /// [`Mode::Own`]: the sender went quiet before its LAST DATA: send the
    /// bitmap (a NACK).
    Quiet,
}

impl Receiver {
    /// The same receiver, taking at most budget `cap_ppm` from its sender.
    pub(crate) fn capped(mut self, cap_ppm: u32) -> Receiver {
        self.cap_ppm = cap_ppm.min(MAX_BUDGET_PPM);
        self
    }

    /// A transfer of `n` chunks, receiving into `buf` (see the field).
    pub(crate) fn new(n: u32, buf: Vec<f32>, mode: Mode) -> Receiver {
        Receiver {
            n,
            mode,
            required: None,
            budget_ppm: 0,
            owner_budget_ppm: None,
            cap_ppm: MAX_BUDGET_PPM,
            got: Bitmap::new(n),
            got_required: 0,
            buf,
            first_at: None,
            last_at: None,
            deadline: None,
            deadline_fired: false,
            deadline_backoff: 0,
            arrived: 0,
            quiet: None,
            quiet_mark: 0,
            quiet_k: 0,
            grace: None,
            settle: None,
            settled_at: Instant::ZERO,
            probe_sent: None,
            reordered: false,
            reorder_wait: Duration::ZERO,
            seen_mark: 0,
            awaited: None,
            probe_at: None,
            nudge: None,
            closed_at: None,
            probe_seq: 0,
            echo: 0,
            repaired: 0,
            mask: None,
            mask_parts: None,
            complete_sent: false,
        }
    }

    /// Chunks in the transfer.
    pub(crate) fn n(&self) -> u32 {
        self.n
    }

    /// Chunks that arrived.
    pub(crate) fn got(&self) -> &Bitmap {
        &self.got
    }

    /// [`Mode::Agreed`], closed: the agreed mask.
    pub(crate) fn mask(&self) -> Option<&Bitmap> {
        self.mask.as_ref()
    }

    /// Whether the transfer is still open.
    pub(crate) fn is_open(&self) -> bool {
        self.closed_at.is_none()
    }

    /// The receive buffer.
    pub(crate) fn buf(&self) -> &[f32] {
        &self.buf
    }

    /// The receive buffer, to write a chunk into.
    pub(crate) fn buf_mut(&mut self) -> &mut [f32] {
        &mut self.buf
    }

    /// Give the receive buffer up (to the pool, or dropped once reduced).
    pub(crate) fn take_buf(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.buf)
    }

    /// Heap and struct bytes, without the buffer (for the endpoint's footprint).
    pub(crate) fn bytes(&self) -> usize {
        size_of::<Receiver>()
            + self.got.heap_bytes()
            + self.mask.as_ref().map_or(0, Bitmap::heap_bytes)
            + self.mask_parts.as_ref().map_or(0, |(a, b)| a.heap_bytes() + b.heap_bytes())
    }

    /// Bytes of the receive buffer.
    pub(crate) fn buf_bytes(&self) -> usize {
        self.buf.capacity() * 4
    }

    /// Within budget: every chunk, or all required chunks and at most the
    /// allowed number missing.
    fn closable(&self) -> bool {
        let missing = self.got.count_zeros();
        missing == 0
            || (self.required.is_some_and(|r| self.got_required >= r)
                && missing <= allowed_missing(self.n, self.budget_ppm))
    }

    /// BITMAP segments that say what arrived (one, COMPLETE, when everything did).
    pub(crate) fn bitmap_segments(&self, seg_bytes: usize) -> u32 {
        if self.got.is_full() { 1 } else { Bitmap::segment_count(self.n, seg_bytes) }
    }

    /// Whether a chunk of this transfer arrived before.
    pub(crate) fn has_data(&self) -> bool {
        self.last_at.is_some()
    }

    /// Check a DATA chunk of `payload_len` bytes, for a chunk of `chunk_bytes`
    /// bytes (its elements times the op's element size), against the
    /// transfer, and mark it arrived.
    pub(crate) fn admit(
        &mut self,
        h: &Header,
        payload_len: usize,
        chunk_bytes: usize,
    ) -> Result<(), Refused> {
        if h.chunk_count != self.n || h.chunk_index >= self.n || payload_len != chunk_bytes {
            return Err(Refused::Mismatch);
        }
        if self.closed_at.is_some() {
            return Err(Refused::Late);
        }
        if !self.got.set(h.chunk_index) {
            return Err(Refused::Duplicate);
        }
        Ok(())
    }

    /// An admitted chunk's header ([`Receiver::admit`] first). `est`: the
    /// phase's deadline estimator; `rto`: the probe timeout (for the nudge
    /// and the quiet timer); `seen`: how far the sender's DATA to this rank
    /// has come, this chunk included.
    pub(crate) fn on_data(
        &mut self,
        h: &Header,
        now: Instant,
        est: &DeadlineEstimator,
        rto: Duration,
        seen: u64,
    ) -> DataIn {
        self.required = Some(h.required);
        self.budget_ppm = h.budget_ppm.min(self.cap_ppm);
        self.owner_budget_ppm.get_or_insert(h.budget_ppm);
        if h.flags.contains(Flags::REQUIRED) {
            self.got_required += 1;
        }
        self.last_at = Some(now);
        let mut overtake = None;
        if self.awaited == Some(h.chunk_index) && !self.reordered {
            // The chunk the PROBE overtook has landed: answer the PROBE now.
            self.awaited = None;
            self.settle = None;
            self.grace = Some(now);
            // Only a first-pass chunk proves it was queued behind the PROBE; a
            // repair of a lost one says nothing about queueing.
            overtake = self.probe_at.take().filter(|_| !h.flags.contains(Flags::REPAIR)).map(|p| now - p);
        } else if let Some(p) = self.probe_at
            && self.grace.is_some()
            && self.reordered
            && !h.flags.contains(Flags::REPAIR)
        {
            // The sender's datagrams take paths of different delays: the
            // PROBE overtook this chunk on a faster path, and the chunk it
            // names landing says nothing of the others (the settle goes on
            // while chunks land: see `on_timer`). Learn by how much, so the
            // grace after the next PROBE lasts long enough.
            overtake = Some(now - p);
        }
        if h.flags.contains(Flags::REPAIR) {
            self.repaired += 1;
        }
        self.arm_deadline(now, est);
        self.arrived += 1;
        self.arm_quiet(h, now, rto, seen);
        let then = match self.mode {
            Mode::Own if self.got.is_full() => Arrived::Close,
            Mode::Agreed if self.got.is_full() && !self.complete_sent => {
                self.complete_sent = true;
                // The COMPLETE report answers this DATA (a round-trip
                // sample for the owner if it is the one that carried LAST).
                self.echo = h.seq;
                // All data is here; only the DONE is missing: an RTT-scaled
                // nudge replaces the size-scaled deadline.
                self.nudge = Some((now + rto, 0));
                self.deadline = None;
                Arrived::Complete
            }
            _ => Arrived::Nothing,
        };
        DataIn { overtake, then }
    }

    /// A PROBE from the sender. `grace`: how long to wait for chunks it may
    /// have overtaken (see `settle_until`); `behind`: the sender's DATA to
    /// this rank as the PROBE counts it, and what of it arrived.
    pub(crate) fn on_probe(
        &mut self,
        h: &Header,
        now: Instant,
        grace: Duration,
        est: &DeadlineEstimator,
        behind: Option<Behind>,
    ) -> Result<Probed, Refused> {
        if h.chunk_count != self.n {
            return Err(Refused::Mismatch);
        }
        if h.seq != 0 && h.seq == self.probe_seq {
            return Err(Refused::DuplicateProbe);
        }
        let progress = self.first_at.is_none();
        if self.mode == Mode::Own {
            // Only a receiver that closes on its own needs the budget before
            // its first chunk (an all-gather receiver takes it from DATA).
            self.required = Some(h.required);
            self.budget_ppm = h.budget_ppm.min(self.cap_ppm);
        }
        self.probe_seq = self.probe_seq.max(h.seq);
        self.probe_sent = behind.map(|b| b.sent);
        self.reordered = behind.is_some_and(|b| b.reordering);
        self.reorder_wait = behind.map_or(Duration::ZERO, |b| b.wait);
        self.echo = self.probe_seq;
        self.arm_deadline(now, est);
        let answer = if self.closed_at.is_some() {
            match self.mode {
                Mode::Own => Answer::Done,
                // An exact all-gather receiver closed on its own: its
                // COMPLETE report was lost, say it again.
                Mode::Agreed if self.got.is_full() => Answer::Bitmap,
                Mode::Agreed => Answer::Nothing,
            }
        } else {
            self.decide(now, grace, h.chunk_index, behind)
        };
        Ok(Probed { progress, answer })
    }

    /// A DATA chunk that carried LAST arrived (after [`Receiver::on_data`],
    /// which did not close the transfer): everything its sender had queued
    /// is sent, so decide as on a PROBE. No chunk of the round can be behind
    /// it: the sender's queues and the switch serve classes high to low and
    /// FIFO within one, and the LAST chunk left its sender last (a chunk a
    /// parked queue or another op's traffic held back can still land after
    /// it: then the BITMAP asks for a chunk in flight, and its repair is
    /// refused as a duplicate — a wasted datagram, never a wrong result).
    /// A NACK ([`Answer::Bitmap`]) is sent again if nothing comes of it
    /// within twice the probe timeout `rto` (backing off): unlike a PROBE,
    /// the LAST DATA it answers is not repeated by its sender's timer until
    /// the implicit acknowledgement is overdue.
    ///
    /// `behind`: the sender's DATA to this rank as the LAST DATA's sequence
    /// number counts it; when its datagrams take paths of different delays
    /// (`reordering`), chunks sent before the LAST can still land after it,
    /// and the decision waits for them as after a PROBE.
    pub(crate) fn on_last(
        &mut self,
        h: &Header,
        now: Instant,
        grace: Duration,
        rto: Duration,
        behind: Option<Behind>,
    ) -> Answer {
        if self.closed_at.is_some() || (self.mode == Mode::Agreed && self.complete_sent) {
            return Answer::Nothing;
        }
        self.echo = h.seq;
        self.reordered = behind.is_some_and(|b| b.reordering);
        self.reorder_wait = behind.map_or(Duration::ZERO, |b| b.wait);
        self.probe_sent = behind.map(|b| b.sent);
        let answer = self.decide(now, grace, h.chunk_index, behind);
        if answer == Answer::Bitmap && self.mode == Mode::Own {
            self.renack(now, rto);
        }
        answer
    }

    /// Arm the quiet timer to NACK again unless a chunk arrives first (the
    /// sender's DATA to this rank moving does not defer it: the NACK asked
    /// for chunks, and their arrival re-arms the timer anyway).
    fn renack(&mut self, now: Instant, rto: Duration) {
        let wait = rto.saturating_mul(2 << self.quiet_k.min(MAX_BACKOFF));
        self.quiet = Some((now + wait, wait));
        self.quiet_mark = u64::MAX;
        self.quiet_k += 1;
    }

    /// The sender has sent everything it queued, the last being chunk
    /// `last_sent`: close within budget, answer with the bitmap, or (when
    /// chunks may still be in flight behind what said so) wait for them.
    fn decide(&mut self, now: Instant, grace: Duration, last_sent: u32, behind: Option<Behind>) -> Answer {
        if let Some(at) = self.settle_until(now, grace, last_sent, behind) {
            // Chunks may still be in flight behind the PROBE: answer (close
            // or bitmap) once they had time to land.
            self.grace.get_or_insert(at);
            if self.settle.is_none() {
                self.settle = Some((grace, now, behind.map_or(0, |b| b.seen)));
                self.settled_at = now;
            }
            self.awaited = Some(last_sent);
            self.probe_at.get_or_insert(now);
            Answer::Nothing
        } else if self.mode == Mode::Own && self.closable() {
            Answer::Close
        } else {
            Answer::Bitmap
        }
    }

    /// When a PROBE finds an incomplete transfer whose last-sent chunk
    /// (`last_sent`, carried in the PROBE) has not arrived while chunks were
    /// still arriving within the last `grace`, the PROBE (control class) has
    /// probably overtaken the tail of the transfer queued in the network:
    /// answer at the returned instant instead of now. `None`: answer now.
    fn settle_until(
        &self,
        now: Instant,
        grace: Duration,
        last_sent: u32,
        behind: Option<Behind>,
    ) -> Option<Instant> {
        if grace.is_zero() || self.got.is_full() {
            return None;
        }
        if self.grace.is_some() {
            return self.grace;
        }
        // The chunk the sender sent last has arrived: nothing the PROBE could
        // have overtaken is left in flight (per-class FIFO, lowest class last)
        // — unless its datagrams take paths of different delays: then wait
        // while chunks are still landing (below).
        let reordering = behind.is_some_and(|b| b.reordering);
        if self.got.get(last_sent) && !reordering {
            return None;
        }
        // The sender's DATA sent before the PROBE has not all arrived: what
        // the PROBE overtook is still on its way (or lost).
        if behind.is_some_and(|b| b.seen < b.sent) {
            return Some(now + grace);
        }
        let streaming = self.last_at.is_some_and(|l| now < l + grace);
        streaming.then_some(now + grace)
    }

    /// The tail of a round, its LAST DATA included, can be lost, and then
    /// only the sender's overdue PROBE would end the wait — late, since in
    /// reduce-scatter it allows for the owner's all-gather. So until the
    /// LAST arrives, a receiver expects the sender's next chunk within four
    /// of its chunks' mean spacing so far plus a probe timeout, and
    /// NACKs when none came (a sender still sending this rank DATA defers
    /// it; a NACK that races the tail costs the sender nothing before its
    /// first pass is out, and is no verdict on its paths).
    fn arm_quiet(&mut self, h: &Header, now: Instant, rto: Duration, seen: u64) {
        self.quiet_k = 0;
        if h.flags.contains(Flags::LAST) || self.got.is_full() {
            self.quiet = None;
            return;
        }
        let Some(first) = self.first_at.filter(|_| self.arrived >= 2) else { return };
        let spacing = (now - first) / (self.arrived - 1);
        let wait = spacing.saturating_mul(4) + rto;
        self.quiet = Some((now + wait, wait));
        self.quiet_mark = seen;
    }

    /// Note the first packet and arm the adaptive deadline.
    fn arm_deadline(&mut self, now: Instant, est: &DeadlineEstimator) {
        if self.first_at.is_none() {
            self.first_at = Some(now);
        }
        if self.deadline.is_none() && self.closed_at.is_none() && self.nudge.is_none() {
            self.deadline = Some(now + est.deadline(self.n));
        }
    }

    /// Close the transfer (`by_deadline`: its deadline closed it). `None` if
    /// it was closed already.
    pub(crate) fn close(&mut self, now: Instant, by_deadline: bool) -> Option<Closed> {
        if self.closed_at.is_some() {
            return None;
        }
        self.closed_at = Some(now);
        self.deadline = None;
        self.deadline_fired |= by_deadline;
        let took = self.first_at.filter(|_| !by_deadline).map(|first| now - first);
        Some(Closed { incomplete: !self.got.is_full(), took })
    }

    /// [`Mode::Agreed`]: whether the owner's budget allows no missing
    /// chunk (the default gather budget, 0): the owner repairs every
    /// receiver to every chunk and the agreed mask is empty.
    pub(crate) fn exact(&self) -> bool {
        self.owner_budget_ppm.is_some_and(|b| allowed_missing(self.n, b) == 0)
    }

    /// [`Mode::Agreed`], exact: every chunk is here, which is all the
    /// owner's empty mask would say: close now (its COMPLETE report tells
    /// the owner, which sends no DONE).
    pub(crate) fn close_complete(&mut self, now: Instant) -> Option<Closed> {
        if !(self.exact() && self.got.is_full()) {
            return None;
        }
        self.mask = Some(Bitmap::new(self.n));
        self.nudge = None;
        self.close(now, false)
    }

    /// [`Mode::Agreed`]: a DONE segment of the owner's agreed mask. Closes
    /// the transfer once every segment is in.
    pub(crate) fn on_mask(
        &mut self,
        h: &Header,
        payload: &[u8],
        now: Instant,
        seg_bytes: usize,
    ) -> Result<Option<Closed>, Refused> {
        if self.closed_at.is_some() {
            return Err(Refused::Late);
        }
        if h.chunk_count != self.n {
            return Err(Refused::Mismatch);
        }
        let n = self.n;
        let (mask, seen) = self
            .mask_parts
            .get_or_insert_with(|| (Bitmap::new(n), Bitmap::new(Bitmap::segment_count(n, seg_bytes))));
        if h.flags.contains(Flags::MASK_EMPTY) {
            set_all(seen);
        } else {
            mask.merge_segment(h.chunk_index, payload);
            seen.set(h.chunk_index / (seg_bytes * 8) as u32);
        }
        if !seen.is_full() {
            return Ok(None);
        }
        let (mask, _) = self.mask_parts.take().unwrap_or((Bitmap::new(n), Bitmap::new(0)));
        self.mask = Some(mask);
        Ok(self.close(now, false))
    }

    /// The sender's DATA count to this rank as the last PROBE (or LAST DATA)
    /// gave it.
    pub(crate) fn probe_sent(&self) -> Option<u64> {
        self.probe_sent
    }

    /// Serve the receive timers due at `now`. `seen`: how far the sender's
    /// DATA to this rank has come (one past its highest data sequence
    /// number); `arrived`: how many of the [`Receiver::probe_sent`] DATA
    /// datagrams it sent before the last PROBE or LAST DATA arrived (as
    /// [`Behind::seen`] counts them).
    pub(crate) fn on_timer(&mut self, now: Instant, retry: &Retry, seen: u64, arrived: u64) -> Fired {
        if self.closed_at.is_some() {
            return Fired::Nothing;
        }
        if self.grace.is_some_and(|g| g <= now) {
            // The chunk the PROBE named is still missing, but this transfer's
            // chunks are still landing as the grace ends (one in its last
            // half): the PROBE overtook a
            // queue that is still draining (a deep switch queue, or a
            // receiver that reads slower than its credit lets data come).
            // Wait another grace while they keep coming, up to the deadline
            // cap after the PROBE; only then answer with what is here.
            // Or the sender's DATA that the PROBE overtook is still coming in
            // (more of it arrived since the grace began, and not all).
            if let (Some((len, from, mark)), Some(probe)) = (self.settle, self.probe_at)
                && self.awaited.is_some()
                && now < probe + retry.deadline_cap()
            {
                let landing = self.last_at.is_some_and(|last| last > from && last + len / 2 > now);
                // Datagrams on paths of different delays land without a
                // steady stream (a slower path's may also wait behind higher
                // classes at this rank's port): while some sent before the
                // PROBE or LAST are missing, wait for them even when none
                // came this grace — for as long after it as the sender's
                // reordered datagrams were measured to lag (at most a probe
                // timeout, none while none were seen late: a datagram lost
                // costs no wait where the paths do not reorder).
                let missing = self.probe_sent.is_some_and(|sent| arrived < sent);
                let in_flight = self.reordered && now < self.settled_at + self.reorder_wait.min(retry.rto);
                let held = missing && self.last_at.is_some_and(|last| now < last + retry.hold);
                let draining = missing && (arrived > mark || in_flight || held);
                if landing || draining {
                    self.settle = Some((len, now, arrived));
                    self.grace = Some(now + len);
                    return Fired::Nothing;
                }
            }
            // The settle time after a PROBE is over: answer it now.
            self.grace = None;
            self.settle = None;
            return if self.mode == Mode::Own && self.closable() {
                Fired::Close { deadline: false }
            } else {
                Fired::Bitmap { deadline: false }
            };
        }
        if let Some((at, wait)) = self.quiet
            && at <= now
        {
            if seen > self.quiet_mark {
                self.quiet = Some((now + wait, wait));
                self.quiet_mark = seen;
                return Fired::Nothing;
            }
            // A pause of the kind the sender was seen to come back from.
            if let Some(until) = self.last_at.map(|last| last + retry.hold).filter(|&u| now < u) {
                self.quiet = Some((until, wait));
                return Fired::Nothing;
            }
            self.quiet = None;
            self.renack(now, retry.rto);
            return Fired::Quiet;
        }
        if let Some((at, k)) = self.nudge
            && at <= now
        {
            let k = (k + 1).min(MAX_BACKOFF);
            self.nudge = Some((now + retry.backoff(k), k));
            return Fired::Bitmap { deadline: false };
        }
        if self.deadline.is_none_or(|d| d > now) {
            return Fired::Nothing;
        }
        // The sender is still sending this rank DATA (of any transfer: they
        // share its credit and its queues): it is not quiet, and its PROBE
        // (or the PROBE's retry) comes when it is through. A deadline NACKs
        // and closes only once the sender went quiet.
        if seen > self.seen_mark {
            self.seen_mark = seen;
            self.deadline = Some(now + retry.gap());
            return Fired::Nothing;
        }
        // Past its estimate but still receiving (e.g. the sender serves
        // higher classes first), or the sender's PROBE was lost and its retry
        // (one probe timeout later) is due: wait for an idle gap longer than
        // the probe retry.
        let gap = retry.gap();
        if let Some(last) = self.last_at.or(self.first_at)
            && now < last + gap
        {
            self.deadline = Some(last + gap);
            return Fired::Nothing;
        }
        self.deadline_fired = true;
        // A closable transfer still NACKs once first: the sender answers a
        // within-budget BITMAP with a PROBE at once, and the transfer closes
        // on that PROBE. Only a sender still quiet one retry later (dead, or
        // its answers lost too) is closed by the deadline.
        let nacked_before = self.deadline_backoff > 0;
        let wait = retry.deadline_retry(self.deadline_backoff);
        self.deadline_backoff += 1;
        self.deadline = Some(now + wait);
        if self.mode == Mode::Own && self.closable() && nacked_before {
            Fired::Close { deadline: true }
        } else {
            Fired::Bitmap { deadline: true }
        }
    }

    /// The earliest live timer (what [`Receiver::timers`] yields, without
    /// building it: read per datagram).
    pub(crate) fn earliest_timer(&self) -> Option<Instant> {
        if self.closed_at.is_some() {
            return None;
        }
        let min = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, None) => x,
            (None, y) => y,
        };
        min(min(self.deadline, self.grace), min(self.nudge.map(|n| n.0), self.quiet.map(|q| q.0)))
    }

    /// Every live timer.
    #[cfg(test)]
    pub(crate) fn timers(&self) -> impl Iterator<Item = Instant> {
        let open = self.closed_at.is_none();
        let quiet = self.quiet.map(|q| q.0);
        [self.deadline, self.grace, self.nudge.map(|n| n.0), quiet]
            .into_iter()
            .flatten()
            .filter(move |_| open)
    }

    /// Fill BITMAP segment `seg` of what arrived (`None`: closed, or past
    /// the COMPLETE bitmap's only segment, or `buf` too small).
    pub(crate) fn fill_bitmap(
        &self,
        h: &mut Header,
        seg: u32,
        seg_bytes: usize,
        buf: &mut [u8],
    ) -> Option<()> {
        // A closed transfer sends no bitmap, but an exact all-gather
        // receiver's COMPLETE report (it closed on its own).
        if self.closed_at.is_some() && !(self.mode == Mode::Agreed && self.got.is_full()) {
            return None;
        }
        h.ty = PacketType::Bitmap;
        h.chunk_count = self.n;
        h.required = self.required.unwrap_or(0).min(self.n);
        // The budget this receiver holds the transfer to (its own until it
        // has heard the sender's): the sender repairs to it.
        h.budget_ppm = if self.required.is_some() { self.budget_ppm } else { self.cap_ppm };
        h.seq = self.echo;
        if self.got.is_full() {
            if seg != 0 {
                return None;
            }
            h.flags = Flags::COMPLETE;
        } else {
            if buf.len() < wire::OVERHEAD + seg_bytes {
                return None;
            }
            write_segment(h, &self.got, seg, seg_bytes, buf);
        }
        Some(())
    }

    /// Fill the DONE that answers for a closed [`Mode::Own`] transfer.
    pub(crate) fn fill_done(&self, h: &mut Header) {
        fill_done(h, self.n, self.probe_seq);
    }

    /// What the transfer delivered, from `peer` in `phase`.
    pub(crate) fn report(&self, peer: u32, phase: Phase) -> TransferReport {
        TransferReport {
            peer,
            phase,
            chunks: self.n,
            delivered: self.got.clone(),
            mask: self.mask.clone(),
            repaired: self.repaired,
            deadline_fired: self.deadline_fired,
            first_at: self.first_at,
            closed_at: self.closed_at.unwrap_or(Instant::ZERO),
        }
    }
}
