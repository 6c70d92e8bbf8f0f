//! Control packets as they are sent: a queued HELLO, PROBE, BITMAP, DONE
//! (a failing one too), GRANT or GOODBYE written, from the state of its transfer (or of the peer) at that
//! moment, into the room a transmit batch gives it.

use crate::class::Class;
use crate::endpoint::Endpoint;
use crate::endpoint::allreduce::Side;
use crate::endpoint::api::{OpId, OpKey};
use crate::endpoint::batch::TxBatch;
use crate::endpoint::tx::{TxItem, TxKind};
use crate::time::Instant;
use crate::transfer::{fill_done, fill_mask};
use crate::wire::{self, Header, PacketType, Phase, Settings};

impl Endpoint {
    /// A PROBE or BITMAP `h` of op `id`, which completed here and lingers:
    /// answer what its peer still needs to hear.
    pub(super) fn answer_lingering(&mut self, id: OpId, h: &Header) {
        let Some(l) = self.history.lingering(&id) else { return };
        let key = OpKey::outside(id);
        match (h.ty, h.phase) {
            (PacketType::Probe, Phase::Scatter) => {
                let kind = TxKind::Done { seg: 0 };
                self.sh.tx.push(TxItem { op: key, phase: Phase::Scatter, peer: h.src, kind });
            }
            // A receiver missed the agreed mask (an exact all-gather has
            // none: a late copy of a report needs no answer).
            (PacketType::Bitmap, Phase::Gather) if !l.exact => {
                self.sh.tx.push_mask(key, h.src, &l.mask, self.sh.cfg.chunk_bytes);
            }
            // An exact all-gather (no mask): this rank held every chunk of
            // the owner's shard, or it would not have completed.
            (PacketType::Probe, Phase::Gather) => {
                let kind = TxKind::Complete { n: h.chunk_count, seq: h.seq };
                self.sh.tx.push(TxItem { op: key, phase: Phase::Gather, peer: h.src, kind });
            }
            _ => self.sh.stats.rejected.late += 1,
        }
    }

    /// Add control packet `item` to `batch` (header and payload; the tag is
    /// computed with the batch's). False if it is no longer due.
    pub(super) fn encode_control(&mut self, now: Instant, item: TxItem, batch: &mut TxBatch) -> bool {
        let room = batch.inline_room(wire::OVERHEAD + self.sh.seg_bytes().max(wire::ACK_ENTRY_LEN));
        match self.write_control(now, item, room) {
            Some(n) => {
                let probe = item.kind == TxKind::Probe;
                let path = self.sh.pick_path(item.peer, None, probe, now);
                batch.push_inline(item.peer, Class::CONTROL, path, n);
                self.sh.count_transmit(item.peer, Class::CONTROL, n);
                true
            }
            None => {
                batch.drop_room();
                false
            }
        }
    }

    /// Write control packet `item` (untagged) into `buf`; its length.
    fn write_control(&mut self, now: Instant, item: TxItem, buf: &mut [u8]) -> Option<usize> {
        let seg_bytes = self.sh.seg_bytes();
        let mut h = self.sh.header(PacketType::Hello, Class::CONTROL, item.phase, item.op.id(), item.peer);
        if item.phase != Phase::None {
            // Every packet of an op carries its kind (versions 6 and 7).
            let id = item.op.id();
            let kind = self.ops.by_key(item.op).map(|op| op.kind());
            let kind = kind.or_else(|| self.history.lingering(&id).map(|l| l.kind));
            if let Some(kind) = kind.or_else(|| self.history.failed_kind(&id)) {
                kind.stamp(&mut h);
            }
        }
        if !matches!(item.kind, TxKind::Hello | TxKind::Goodbye) {
            h.credit = self.credit_for(item.peer);
        }
        let (op, peer) = (self.ops.by_key_mut(item.op), item.peer);
        match item.kind {
            TxKind::Goodbye => {
                h.ty = PacketType::Goodbye;
                h.op = 0;
                h.tensor = 0;
                h.payload_len = 0;
            }
            TxKind::Hello => {
                h.op = 0;
                h.tensor = 0;
                h.seq = self.peers.hello_seq();
                h.payload_len = wire::SETTINGS_LEN as u16;
            }
            TxKind::Probe => {
                let transfers = op?.transfers_mut();
                transfers.sender_mut(item.phase, peer)?.fill_probe(&mut h, now, &self.sh.retry())?;
                self.timers.reindex(transfers, item.op.id(), Side::send(item.phase), peer, false);
                self.sh.stats.probes_sent += 1;
                // How many DATA datagrams went to the receiver before this
                // PROBE: it waits for those it has not seen yet.
                h.payload_len = wire::GRANT_LEN as u16;
                let count = self.sh.flow.sent(peer);
                return self.sh.seal(&h, buf, |p| wire::emit_grant(count, p));
            }
            TxKind::Bitmap { seg } => {
                op?.transfers().receiver(item.phase, peer)?.fill_bitmap(&mut h, seg, seg_bytes, buf)?
            }
            TxKind::Complete { n, seq } => {
                h.ty = PacketType::Bitmap;
                h.flags = wire::Flags::COMPLETE;
                (h.chunk_count, h.required, h.budget_ppm, h.seq) = (n, 0, 0, seq);
            }
            TxKind::Done { seg } => match (op, self.history.lingering(&item.op.id())) {
                (Some(op), _) => op.fill_done(item.phase, peer, seg, &mut h, buf, seg_bytes)?,
                (None, Some(l)) if item.phase == Phase::Scatter => fill_done(&mut h, l.own_chunks, 0),
                (None, Some(l)) => fill_mask(&mut h, &l.mask, seg, seg_bytes, buf)?,
                (None, None) => return None,
            },
            TxKind::Failed => {
                let reason = self.fill_failure(item, &mut h)?;
                return self.sh.seal(&h, buf, |p| wire::emit_failure(reason, p));
            }
            TxKind::Grant { request } => {
                let count = self.fill_grant(&mut h, peer, request);
                return self.sh.seal(&h, buf, |p| wire::emit_grant(count, p));
            }
            TxKind::Ack => {
                // As many entries as a BITMAP segment's bytes hold (the
                // datagram stays within the chunk size's MTU), at least one.
                let max = self.sh.seg_bytes() / wire::ACK_ENTRY_LEN;
                let (run, entries) = self.sh.acks.take(peer, now, max)?;
                h.ty = PacketType::Ack;
                h.phase = Phase::Gather;
                h.run = self.sh.runs.id_of(run)?;
                (h.op, h.tensor, h.dtype) = (0, 0, wire::DType::F32);
                h.reduce = wire::ReduceOp::Sum;
                h.collective = wire::Collective::Allreduce;
                h.chunk_count = entries.len() as u32;
                h.payload_len = (entries.len() * wire::ACK_ENTRY_LEN) as u16;
                self.sh.stats.acks_sent += 1;
                return self.sh.seal(&h, buf, |p| {
                    wire::emit_acks(&entries, p);
                });
            }
            TxKind::Data { .. } => return None,
        }
        self.sh.seal(&h, buf, |p| {
            if h.ty == PacketType::Hello {
                let (run_nonce, fresh, run_echo) = self.sh.runs.announce(peer);
                let (challenge, echo) = self.peers.handshake(peer);
                Settings {
                    version: wire::VERSION,
                    auth: h.auth,
                    chunk_bytes: self.sh.cfg.chunk_bytes as u32,
                    flow_window: self.sh.flow.config().wire_window(),
                    digest: self.digest,
                    generation: self.sh.cfg.generation,
                    run_flags: if fresh { wire::RUN_FRESH } else { 0 },
                    run_nonce,
                    run_echo,
                    challenge,
                    echo,
                }
                .emit(p)
            }
        })
    }
}
