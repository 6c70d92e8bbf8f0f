//! The send side of a transfer: first pass, PROBE, repairs on the
//! receiver's bitmap (alone, or through the owner's joint decision).

use crate::bitmap::Bitmap;
use crate::class::{Class, ClassSet};
use crate::time::{Duration, Instant};
use crate::transfer::rules::{MAX_BACKOFF, Mode, Retry, allowed_missing, select_repairs, set_all};
use crate::wire::{Flags, Header, PacketType};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// DATA (first pass or repairs) queued.
    Sending,
    /// Everything queued went out; waiting for a bitmap or DONE.
    Probing,
}

/// The send side of one transfer.
#[derive(Debug)]
pub(crate) struct Sender {
    n: u32,
    required: u32,
    budget_ppm: u32,
    mode: Mode,
    stage: Stage,
    queued: u32,
    seq: u32,
    probe_sent: Option<(u32, Instant)>,
    probe_timer: Option<Instant>,
    /// The last chunk sent (carried in PROBE so the receiver can tell whether
    /// the PROBE overtook chunks still in flight).
    last_sent: u32,
    /// The last DATA sent carried LAST: the receiver decides on it, so the
    /// drained queue arms the probe timer instead of probing.
    last_flagged: bool,
    /// The data sequence number (low 32 bits) of the LAST DATA in flight
    /// and when it went out: a BITMAP that echoes it is a round-trip sample.
    last_data: Option<(u32, Instant)>,
    /// The data sequence number of the LAST DATA whose answer is being
    /// heard: every segment of a BITMAP answering it is a verdict, not only
    /// the first (which clears `last_data`). Cleared by the next round.
    answering_last: Option<u32>,
    backoff: u32,
    /// Chunks the receiver was known to hold when this report round began:
    /// a complete report that adds none means the last repairs were all lost.
    /// (`None` before the first complete report.)
    round_known: Option<u32>,
    have: Bitmap,
    segs_seen: Bitmap,
    /// [`Mode::Agreed`]: a complete report is in the owner's hands.
    reported: bool,
    done: bool,
    repairs: u32,
    /// With more than one path ([`crate::paths`]): the path each chunk was
    /// last sent on (one byte per chunk; empty with one path) ...
    path_of: Vec<u8>,
    /// ... and the chunks sent since the receiver's last verdict on them.
    outstanding: Bitmap,
}

/// What the sender learned about one chunk it sent on a path: delivered,
/// or reported missing (see [`crate::paths`]).
pub(crate) type Verdict<'a> = &'a mut dyn FnMut(u8, bool);

/// What a drained send queue leads to ([`Sender::dequeued`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drained {
    /// Chunks are still queued (or the transfer is done or probing).
    Busy,
    /// [`Mode::Agreed`]: the receiver is known to hold everything; report to
    /// the owner's decision without probing.
    Report,
    /// The receiver decides on the LAST-flagged DATA just sent (or the last
    /// repairs were all lost): probe only if its answer, or the implicit
    /// acknowledgement, is not here when the timer (armed, at this instant)
    /// fires.
    ProbeAt(Instant),
    /// Send [`PROBE_COPIES`] PROBEs now.
    Probe,
}

/// What a BITMAP or DONE told the sender.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Heard {
    /// A round-trip sample (it answered the PROBE in flight).
    pub rtt: Option<Duration>,
    /// The receiver holds chunks it was not known to hold (or closed): progress.
    pub news: bool,
    /// A complete report while probing: time to decide ([`Sender::decide_alone`],
    /// or the owner's joint decision in [`Mode::Agreed`]).
    pub round: bool,
}

impl Sender {
    /// A transfer of `n` chunks, `required` of them not droppable, whose
    /// receiver reports in BITMAP segments of `seg_bytes` bytes.
    /// With `multipath`, it remembers the path of every chunk it sends and
    /// gives a [`Verdict`] on it when the receiver reports.
    pub(crate) fn new(
        n: u32,
        required: u32,
        budget_ppm: u32,
        seg_bytes: usize,
        mode: Mode,
        multipath: bool,
    ) -> Sender {
        let per_chunk = if multipath { n } else { 0 };
        Sender {
            n,
            required,
            budget_ppm,
            mode,
            stage: Stage::Sending,
            queued: 0,
            seq: 0,
            probe_sent: None,
            probe_timer: None,
            last_sent: 0,
            last_flagged: false,
            last_data: None,
            answering_last: None,
            backoff: 0,
            round_known: None,
            have: Bitmap::new(n),
            segs_seen: Bitmap::new(Bitmap::segment_count(n, seg_bytes)),
            reported: false,
            done: false,
            repairs: 0,
            path_of: vec![0; per_chunk as usize],
            outstanding: Bitmap::new(per_chunk),
        }
    }

    /// Chunks in the transfer.
    pub(crate) fn n(&self) -> u32 {
        self.n
    }

    /// The receiver closed it (scatter), or the owner decided (gather).
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// [`Mode::Agreed`]: its complete report waits for the owner's decision.
    pub(crate) fn is_reported(&self) -> bool {
        self.reported
    }

    /// Heap and struct bytes (for the endpoint's footprint).
    pub(crate) fn bytes(&self) -> usize {
        size_of::<Sender>()
            + self.have.heap_bytes()
            + self.segs_seen.heap_bytes()
            + self.path_of.capacity()
            + self.outstanding.heap_bytes()
    }

    /// DATA of this transfer in the transmit queues (first pass and repairs).
    pub(crate) fn queued(&self) -> u32 {
        self.queued
    }

    /// `k` more first-pass chunks were queued.
    pub(crate) fn queue(&mut self, k: u32) {
        self.queued += k;
    }

    /// Whether a queued chunk still needs sending.
    pub(crate) fn wants(&self, chunk: u32) -> bool {
        !self.done && !self.have.get(chunk)
    }

    /// The transfer's fields of a DATA header.
    pub(crate) fn fill_data(&self, h: &mut Header) {
        h.chunk_count = self.n;
        h.required = self.required;
        h.budget_ppm = self.budget_ppm;
    }

    /// `chunk` goes out now, on `path`. Returns whether it is the last one
    /// queued of the first pass: its DATA carries LAST
    /// ([`crate::wire::Flags::LAST`]). A repair round ends in PROBEs
    /// instead: repairs happen only under loss, where the PROBE's copies
    /// (and its overtaking of the data, in the control class) end a round
    /// sooner than a LAST DATA, which is lost as often as any chunk
    /// (`dlcpd simulate`, 4 ranks at 10% loss: 2.9 ms against 2.1 ms per op
    /// with LAST on repairs too).
    ///
    /// A chunk sent again before any verdict on its last sending (a repair
    /// the receiver asked for in a report that was not the answer to a
    /// round: a NACK, or one overtaken by the round's answer) was lost on
    /// its last path: that is the [`Verdict`] on it. Without this, the
    /// report that follows the repair judged it delivered on the repair's
    /// path, and the loss went uncounted (half the losses or more in the
    /// all-gather, whose receivers NACK).
    pub(crate) fn sent(&mut self, chunk: u32, path: u8, verdict: Verdict<'_>) -> bool {
        self.last_sent = chunk;
        if let Some(p) = self.path_of.get_mut(chunk as usize) {
            let last = *p;
            *p = path;
            if self.outstanding.get(chunk) {
                verdict(last, false);
            }
            self.outstanding.set(chunk);
        }
        self.last_flagged = self.queued == 1 && self.repairs == 0;
        self.last_flagged
    }

    /// The path `chunk` was last sent on (`None` with one path).
    pub(crate) fn path_of(&self, chunk: u32) -> Option<u8> {
        self.path_of.get(chunk as usize).copied()
    }

    /// A verdict on every outstanding chunk in `first..first + len`:
    /// delivered if the receiver holds it.
    fn judge(&mut self, first: u32, len: u32, verdict: Verdict<'_>) {
        let end = first.saturating_add(len).min(self.outstanding.len());
        for c in first..end {
            if self.outstanding.clear(c) {
                let path = self.path_of[c as usize];
                if self.have.get(c) {
                    verdict(path, true);
                } else {
                    // (A run of losses on one path is one loss event:
                    // [`crate::paths`] merges it.)
                    verdict(path, false);
                }
            }
        }
    }

    /// A queued chunk left the queue (sent or no longer wanted): when the
    /// queue drains, the sender waits for the receiver's decision on its
    /// LAST DATA (or probes, if the last queued chunk was not sent). `ack`:
    /// how much longer than the probe timeout the answer may take — for
    /// [`Mode::Own`], the owner's gather that acknowledges the transfer
    /// implicitly comes only after it closed every transfer into its shard.
    ///
    /// `tail_probe`: the network has been lossy lately ([`crate::endpoint`]'s
    /// loss meter), so a PROBE follows the LAST DATA at once — in its
    /// copies and in the control class, it ends the round even when the
    /// LAST is lost, which would otherwise cost the receiver's quiet timer.
    pub(crate) fn dequeued(
        &mut self,
        now: Instant,
        retry: &Retry,
        ack: Duration,
        tail_probe: bool,
    ) -> Drained {
        self.queued = self.queued.saturating_sub(1);
        if self.queued > 0 || self.done || self.stage != Stage::Sending {
            return Drained::Busy;
        }
        self.stage = Stage::Probing;
        if self.mode == Mode::Agreed && self.have.is_full() {
            self.reported = true;
            return Drained::Report;
        }
        if self.last_flagged && !tail_probe {
            // The receiver answers the LAST DATA as it would a PROBE (a
            // BITMAP if it lacks chunks; a COMPLETE report in all-gather);
            // a reduce-scatter receiver that closes stays silent.
            let at = now + retry.backoff(self.backoff) + ack;
            self.probe_timer = Some(at);
            return Drained::ProbeAt(at);
        }
        if self.backoff > 0 {
            // The previous repairs were all lost: probe after the backed-off
            // timeout instead of at once, so a congested receiver is not
            // driven by a PROBE / BITMAP / repair loop at full speed.
            let at = now + retry.backoff(self.backoff);
            self.probe_timer = Some(at);
            return Drained::ProbeAt(at);
        }
        self.seq = self.seq.wrapping_add(1);
        Drained::Probe
    }

    /// Whether the receiver is known to hold every chunk (it answered with a
    /// COMPLETE bitmap): it is never probed again. A reduce-scatter receiver
    /// that holds everything has closed (its DONE ends the transfer); an
    /// all-gather one waits for the owner's mask, and a PROBE would only
    /// bring its COMPLETE bitmap again.
    pub(crate) fn receiver_complete(&self) -> bool {
        self.have.is_full()
    }

    /// Fill a PROBE about to be sent, and arm the probe timer (returned).
    /// `None`: no PROBE is due any more.
    pub(crate) fn fill_probe(&mut self, h: &mut Header, now: Instant, retry: &Retry) -> Option<Instant> {
        if self.done || self.stage != Stage::Probing || self.reported || self.receiver_complete() {
            return None;
        }
        h.ty = PacketType::Probe;
        h.chunk_index = self.last_sent.min(self.n.saturating_sub(1));
        h.chunk_count = self.n;
        h.required = self.required;
        h.budget_ppm = self.budget_ppm;
        h.seq = self.seq;
        self.probe_sent = Some((self.seq, now));
        let at = now + retry.backoff(self.backoff);
        self.probe_timer = Some(at);
        Some(at)
    }

    /// The LAST DATA went out at `now` as data sequence number `dseq`.
    pub(crate) fn last_sent_as(&mut self, dseq: u32, now: Instant) {
        self.last_data = Some((dseq, now));
    }

    /// A round-trip sample if `seq` answers the PROBE in flight (or the
    /// LAST DATA).
    fn answered(&self, seq: u32, now: Instant) -> Option<Duration> {
        let probe = self.probe_sent.filter(|&(s, _)| s == seq);
        probe.or(self.last_data.filter(|&(d, _)| d == seq)).map(|(_, at)| now - at)
    }

    /// A BITMAP segment (or a COMPLETE bitmap) from the receiver. The caller
    /// checked that it names this transfer's chunk count.
    ///
    /// With more than one path, a BITMAP is a [`Verdict`] on the chunks sent
    /// since the last one when it answers the current PROBE or the LAST DATA
    /// (every chunk queued went out before it, so one not here is lost or
    /// overtaken), or when it is COMPLETE.
    pub(crate) fn on_bitmap(
        &mut self,
        h: &Header,
        payload: &[u8],
        now: Instant,
        seg_bytes: usize,
        verdict: Verdict<'_>,
    ) -> Heard {
        // A BITMAP names the budget its receiver holds the transfer to (the
        // lower of its own and ours): repair to that.
        if self.mode == Mode::Own {
            self.budget_ppm = self.budget_ppm.min(h.budget_ppm);
        }
        // It answers the LAST DATA, or the PROBE of the current round (not
        // an unsolicited NACK: chunks may still have been in flight).
        let answers_last = self.last_data.is_some_and(|(d, _)| d == h.seq)
            || self.answering_last.is_some_and(|d| d == h.seq);
        if answers_last {
            self.answering_last = Some(h.seq);
        }
        let current = self.stage == Stage::Probing && (answers_last || (self.seq != 0 && h.seq == self.seq));
        let rtt = self.answered(h.seq, now);
        if rtt.is_some() {
            self.probe_sent = None;
            self.last_data = None;
        }
        let known = self.have.count_ones();
        if h.flags.contains(Flags::COMPLETE) {
            set_all(&mut self.have);
            set_all(&mut self.segs_seen);
            self.judge(0, self.n, verdict);
        } else {
            self.have.merge_segment(h.chunk_index, payload);
            self.segs_seen.set(h.chunk_index / (seg_bytes * 8) as u32);
            if current {
                self.judge(h.chunk_index, (seg_bytes * 8) as u32, verdict);
            }
        }
        // Only news is progress: an unchanged bitmap (a receiver nudging an
        // owner that waits for a dead rank) must not defer the hard timeout.
        let news = self.have.count_ones() != known;
        let round = self.stage == Stage::Probing && self.segs_seen.is_full() && !self.done;
        if round {
            // A complete report with news: probing starts from the base
            // timeout again. Without news the last repairs were all lost (a
            // congested path, or a receiver its own PROBEs and repairs keep
            // flooded): keep backing off, which also holds the next PROBE
            // after the repairs (see `dequeued`).
            let have = self.have.count_ones();
            if self.round_known.is_none_or(|k| have > k) {
                self.backoff = 0;
            } else {
                self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
            }
            self.round_known = Some(have);
            if self.mode == Mode::Agreed {
                self.reported = true;
                self.probe_timer = None;
            }
        }
        Heard { rtt, news, round }
    }

    /// [`Mode::Own`]: decide on a complete report. Returns the repairs to
    /// send (already counted as queued), highest class first; none means the
    /// receiver is within budget and closes on the next PROBE.
    pub(crate) fn decide_alone(
        &mut self,
        now: Instant,
        class_of: impl Fn(u32) -> Class,
        droppable: ClassSet,
    ) -> Vec<u32> {
        let allowed = allowed_missing(self.n, self.budget_ppm);
        let repairs = select_repairs(self.have.iter_zeros(), class_of, droppable, allowed);
        self.segs_seen = Bitmap::new(self.segs_seen.len());
        if repairs.is_empty() {
            // The receiver asked without being prompted (its deadline NACKs
            // after our PROBEs were lost): answer now, not at the backed-off
            // probe timer, so it closes on the PROBE rather than by its deadline.
            // (Not if it holds everything: then it closed without a PROBE.)
            if self.receiver_complete() {
                self.probe_timer = None;
            } else if self.probe_timer.is_some_and(|t| t > now) {
                self.probe_timer = Some(now);
            }
            return repairs;
        }
        self.repair(repairs.len() as u32);
        repairs
    }

    /// Chunks the receiver lacks as of its last report.
    pub(crate) fn missing(&self) -> impl Iterator<Item = u32> + '_ {
        self.have.iter_zeros()
    }

    /// [`Mode::Agreed`]: the owner's joint decision is to repair `repairs`
    /// (of the union of every receiver's missing chunks). Returns those this
    /// receiver lacks (queued); with none, its report stays valid.
    pub(crate) fn decide_jointly(&mut self, repairs: &[u32]) -> Vec<u32> {
        let mine: Vec<u32> = repairs.iter().copied().filter(|&c| !self.have.get(c)).collect();
        self.segs_seen = Bitmap::new(self.segs_seen.len());
        if mine.is_empty() {
            set_all(&mut self.segs_seen);
        } else {
            self.repair(mine.len() as u32);
        }
        mine
    }

    fn repair(&mut self, k: u32) {
        self.answering_last = None;
        self.reported = false;
        self.last_flagged = false;
        self.stage = Stage::Sending;
        self.probe_timer = None;
        self.queued += k;
        self.repairs += k;
    }

    /// [`Mode::Agreed`]: the owner announced the agreed mask; nothing more to send.
    pub(crate) fn finish(&mut self) {
        self.done = true;
        self.probe_timer = None;
    }

    /// Under a budget of 0 the receiver closed with every chunk: a
    /// [`Verdict`] of delivered on the outstanding ones (under a larger one
    /// it does not say which were lost: no verdict).
    fn all_delivered(&mut self, verdict: Verdict<'_>) {
        if allowed_missing(self.n, self.budget_ppm) == 0 {
            for c in 0..self.outstanding.len() {
                if self.outstanding.clear(c) {
                    verdict(self.path_of[c as usize], true);
                }
            }
        }
    }

    /// [`Mode::Own`]: the owner started its all-gather to this rank, which
    /// it does only after closing every transfer into its shard: this
    /// transfer is closed (its implicit acknowledgement). Whether it was
    /// news.
    pub(crate) fn acknowledged(&mut self, verdict: Verdict<'_>) -> bool {
        let news = !self.done;
        self.done = true;
        self.probe_sent = None;
        self.probe_timer = None;
        if news {
            self.all_delivered(verdict);
        }
        news
    }

    /// [`Mode::Own`]: the receiver's DONE.
    pub(crate) fn on_done(&mut self, seq: u32, now: Instant, verdict: Verdict<'_>) -> Heard {
        self.all_delivered(verdict);
        let heard = Heard { rtt: self.answered(seq, now), news: !self.done, round: false };
        self.done = true;
        self.probe_sent = None;
        self.probe_timer = None;
        heard
    }

    /// The probe timer, if it is live.
    pub(crate) fn timer(&self) -> Option<Instant> {
        self.probe_timer.filter(|_| {
            !self.done && self.stage == Stage::Probing && !self.reported && !self.receiver_complete()
        })
    }

    /// Timers due at `now`: true if the probe timer fired (send
    /// [`PROBE_COPIES`] PROBEs; the next round backs off further). A PROBE
    /// is sent only when the answer to a LAST DATA (or the implicit
    /// acknowledgement) is overdue — already a tail event, so both copies
    /// go out every time: a lost single copy would double that tail.
    pub(crate) fn on_timer(&mut self, now: Instant) -> bool {
        if self.timer().is_none_or(|t| t > now) {
            return false;
        }
        self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
        self.seq = self.seq.wrapping_add(1);
        self.probe_timer = None;
        true
    }
}
