//! How an op ends at this rank: its result is final once it reduced and
//! every receive closed, and delivered then (an exact all-gather's owner
//! does not wait for its receivers' acknowledgements, wire version 10);
//! the op is complete, and leaves the table, once nothing more is owed for
//! it — in an exact all-gather, every receiver's ACK
//! ([`crate::endpoint::acks`]). Between the two the op keeps only its
//! all-gather sends that wait for an ACK and a copy of this rank's shard.

use crate::bitmap::Bitmap;
use crate::class::Class;
use crate::endpoint::allreduce::Op;
use crate::endpoint::api::{Collective, DType, OpId, OpKey, OpReport};
use crate::endpoint::shared::Shared;
use crate::endpoint::tx::{TxItem, TxKind};
use crate::pool::BufferPool;
use crate::time::{Duration, Instant};
use crate::transfer::Refused;
use crate::wire::{AckEntry, Flags, Header, PacketType, Phase};

use super::refused;

impl Op {
    /// Whether the op is over: reduced, its mask agreed and every gather
    /// transfer closed.
    pub(crate) fn is_complete(&self) -> bool {
        self.gmask.is_some() && self.is_received()
    }

    /// Whether the op's result is final: complete, or (`exact`: an exact
    /// all-gather, whose owner waits only for its receivers' ACKs) its
    /// receives done. The owner delivers then ([`Op::deliver`]).
    pub(crate) fn is_deliverable(&self, exact: bool) -> bool {
        !self.delivered && (self.gmask.is_some() || exact) && self.is_received()
    }

    /// Reduced, every gather receive closed, every scatter send known to
    /// have arrived.
    fn is_received(&self) -> bool {
        // In an allreduce, an owner's all-gather says it has this rank's
        // contribution. Without one (reduce-scatter, barrier), or where this
        // rank's all-gather does not wait for its scatter (a broadcast's
        // root), only the owners' DONEs say so.
        let sent = self.opts.collective == Collective::Allreduce
            || self.transfers.senders(Phase::Scatter).all(|(_, st)| st.is_done());
        self.reduced && !self.transfers.any_open(Phase::Gather) && sent
    }

    /// Chunks of this rank's shard.
    pub(crate) fn own_chunks(&self, me: u32) -> u32 {
        self.layout.chunks(me)
    }

    /// The agreed mask of this rank's shard (empty for an exact all-gather,
    /// which has none).
    pub(crate) fn own_mask(&self, me: u32) -> Bitmap {
        self.gmask.clone().unwrap_or_else(|| Bitmap::new(self.layout.chunks(me)))
    }

    /// Whether the result went to the caller already.
    pub(crate) fn is_delivered(&self) -> bool {
        self.delivered
    }

    /// Hand the result to the caller before the owner's all-gather is
    /// acknowledged (wire version 10): copy this rank's shard to where the
    /// all-gather's repairs are sent from (f16/bf16 ops have it there
    /// already), and give the input and staging buffers back to `pool` — the
    /// caller's next op wants them now, not an ACK delay later.
    pub(crate) fn deliver(&mut self, now: Instant, me: u32, pool: &mut BufferPool) -> Vec<f32> {
        if self.opts.dtype == DType::F32 {
            let own = &self.result[self.layout.shard(me)];
            self.wire_result.clear();
            self.wire_result.extend_from_slice(bytemuck::cast_slice(own));
        }
        self.delivered = true;
        self.last_progress = now;
        pool.put(now, std::mem::take(&mut self.input));
        for buf in self.transfers.trim_delivered() {
            pool.put(now, buf);
        }
        self.classes = Vec::new();
        std::mem::take(&mut self.result)
    }

    /// What a completed op delivered (the agreed mask leaves the op with it).
    pub(crate) fn report(&mut self, id: OpId, now: Instant, me: u32) -> OpReport {
        let (scatter, gather) =
            (self.transfers.reports(Phase::Scatter), self.transfers.reports(Phase::Gather));
        let deadline_fired = scatter.iter().chain(&gather).any(|t| t.deadline_fired);
        OpReport {
            id,
            started: self.started,
            finished: now,
            scatter,
            gather,
            own_chunks: self.layout.chunks(me),
            // An op delivered before its ACKs is exact: its mask is empty.
            own_mask: self.own_mask(me),
            repairs_sent: self.repairs_sent,
            deadline_fired,
        }
    }

    /// The op's buffers, for the pool: input, result, scatter receive buffers.
    pub(crate) fn into_buffers(self) -> impl Iterator<Item = Vec<f32>> {
        [self.input, self.result].into_iter().chain(self.transfers.into_buffers())
    }

    /// A packet for this op after its result was delivered, when only its
    /// all-gather sends that wait for an ACK are left: a receiver's BITMAP
    /// (a NACK, or a COMPLETE report) is served; a PROBE of a transfer into
    /// this rank, which closed before the result left, is answered as a
    /// completed op answers it (scatter: DONE; gather: COMPLETE); the rest
    /// is a late copy.
    pub(super) fn on_packet_delivered(
        &mut self,
        key: OpKey,
        h: &Header,
        payload: &[u8],
        now: Instant,
        sh: &mut Shared,
    ) {
        let (phase, peer) = (h.phase, h.src);
        let handled = match (h.ty, phase) {
            (PacketType::Bitmap, Phase::Gather) => self.on_bitmap(now, key, h, payload, sh),
            (PacketType::Probe, Phase::Scatter) => {
                sh.tx.push(TxItem { op: key, phase, peer, kind: TxKind::Done { seg: 0 } });
                Ok(())
            }
            (PacketType::Probe, _) => {
                let kind = TxKind::Complete { n: h.chunk_count, seq: h.seq };
                sh.tx.push(TxItem { op: key, phase, peer, kind });
                Ok(())
            }
            _ => Err(Refused::Late),
        };
        if let Err(r) = handled {
            refused(sh, r);
        }
    }

    /// An ACK entry from `src` (wire version 10): it holds every chunk of
    /// this rank's exact all-gather, as a COMPLETE bitmap would say, sent
    /// `held` after the DATA it echoes arrived. False if that was known.
    pub(crate) fn on_ack(
        &mut self,
        now: Instant,
        key: OpKey,
        src: u32,
        e: AckEntry,
        sh: &mut Shared,
    ) -> bool {
        if !self.exact_gather(sh) {
            return false;
        }
        let Some(st) = self.transfers.sender(Phase::Gather, src) else { return false };
        if st.is_done() || st.receiver_complete() {
            return false;
        }
        let mut h = sh.header(PacketType::Bitmap, Class::CONTROL, Phase::Gather, key.id(), sh.me());
        (h.src, h.flags, h.chunk_count, h.seq) = (src, Flags::COMPLETE, st.n(), e.echo);
        let held = Duration::from_micros(e.held_us.into());
        self.heard_bitmap(now, key, &h, &[], held, sh).is_ok()
    }

    /// A delivered op's receiver `peer` failed the op: it will not
    /// acknowledge this rank's all-gather, which no longer waits for it.
    pub(crate) fn unawaited(&mut self, key: OpKey, peer: u32, sh: &mut Shared) {
        if let Some(st) = self.transfers.sender_mut(Phase::Gather, peer) {
            st.finish();
            self.decide_gather(key, sh);
        }
    }

    /// When the op fails unless it learns something first (or is found
    /// waiting on late ranks again, [`Op::await_late`]).
    pub(crate) fn stalls_at(&self, timeout: Duration) -> Instant {
        (self.last_progress + timeout).max(self.late_until.unwrap_or(Instant::ZERO))
    }

    /// The hard timeout found the op waiting on ranks that have not started
    /// it: judge it again at `until`. Whether it is the first time.
    pub(crate) fn await_late(&mut self, until: Instant) -> bool {
        self.late_until.replace(until).is_none()
    }

    /// When the op fails for its absolute `deadline` (zero: never).
    pub(crate) fn deadline_at(&self, deadline: Duration) -> Instant {
        if deadline.is_zero() { Instant::MAX } else { self.started + deadline }
    }

    /// The ranks the op still waits on: data, a bitmap or a DONE.
    pub(crate) fn waiting_on(&self, me: u32) -> Vec<u32> {
        // Outside an allreduce, scatter sends still count once reduced.
        self.transfers.waiting_on(me, self.reduced && self.opts.collective == Collective::Allreduce)
    }
}
