//! Failure notices (wire version 5): a rank that failed an op tells the
//! peers still at it, and a rank told so fails the op at once.
//!
//! When this rank fails an op (its hard timeout, its op deadline, a peer
//! that left or is incompatible, or a peer's own notice), it remembers the
//! op and why for the linger time (`history`'s `Failed`). A PROBE, BITMAP
//! or DATA of that op from a peer is still dropped (`rejected.stale_op`),
//! and answered with one failing DONE — a DONE with [`Flags::FAILED`] whose
//! payload is the reason ([`FailReason`]) — at most once per peer per probe
//! interval, so a flood of DATA does not become a flood of DONEs. The peer
//! fails the op with [`OpError::PeerFailed`] naming this rank, instead of
//! probing it until its own hard timeout.
//!
//! A failing DONE is never answered: for an op this rank already ended
//! (completed, or failed) it is ignored and counted
//! (`rejected.failure_notice_ignored`), for an op it does not know it is
//! stale (`rejected.stale_op`). Only the peer's verified session can send
//! one (its tag, and control packets must be newer than the last), so a
//! replayed notice is `rejected.stale_control`.

use crate::endpoint::Endpoint;
use crate::endpoint::api::{OpError, OpId, OpKey, OpKind, OpOptions};
use crate::endpoint::history::Failed;
use crate::endpoint::tx::{TxItem, TxKind};
use crate::time::Instant;
use crate::wire::{FailReason, Flags, Header, PacketType};

impl Endpoint {
    /// This rank will never start op `id` (of options `opts`): a trainer of
    /// its host that held or owed a contribution to it is gone. The op is
    /// remembered as failed (reason [`FailReason::Other`]) for the linger
    /// time, so a peer that sends this rank its DATA or a PROBE of the op gets
    /// a failing DONE and fails it at once — without it the peer would take
    /// this rank, up but never starting the op, for a late one and wait until
    /// its op deadline. Nothing happens for an op started or ended here.
    pub fn abandon(&mut self, now: Instant, id: OpId, opts: &OpOptions) {
        self.now = now;
        if self.ops.contains(&id) || self.held.contains(&id) || self.history.knows(&id) {
            return;
        }
        let mut failed = Failed::new(now + self.sh.cfg.timers.linger, FailReason::Other);
        failed.kind = OpKind::of(opts);
        self.history.failed(now, id, failed);
        self.sh.stats.ops_abandoned += 1;
    }

    /// A failing DONE from `h.src` about op `id`.
    pub(super) fn on_failure_notice(&mut self, id: OpId, h: &Header, payload: &[u8]) {
        let reason = crate::wire::parse_failure(payload).unwrap_or(FailReason::Other);
        if let Some(slot) = self.ops.slot(&id)
            && let Some(op) = self.ops.at_mut(slot, &id)
            && op.is_delivered()
        {
            // Its result is out; the peer that failed will not acknowledge
            // this rank's all-gather: stop waiting for it.
            self.sh.stats.rejected.failure_notice_ignored += 1;
            op.unawaited(OpKey::new(id, slot), h.src, &mut self.sh);
            self.check_complete(id);
        } else if self.ops.contains(&id) {
            self.sh.stats.failure_notices_received += 1;
            self.fail(id, OpError::PeerFailed { rank: h.src, reason });
        } else if self.history.knows(&id) {
            self.sh.stats.rejected.failure_notice_ignored += 1;
        } else {
            self.sh.stats.rejected.stale_op += 1;
        }
    }

    /// A packet `h` for op `id`, which finished here: if it failed here and
    /// `h` is a PROBE, BITMAP or DATA, queue a failing DONE for its sender
    /// unless one went to it within the probe interval.
    pub(super) fn notify_failure(&mut self, now: Instant, id: OpId, h: &Header) {
        let asks = matches!(h.ty, PacketType::Probe | PacketType::Bitmap | PacketType::Data);
        if asks && self.history.notice_due(&id, h.src, now, self.sh.rtt.timeout()) {
            let item = TxItem { op: OpKey::outside(id), phase: h.phase, peer: h.src, kind: TxKind::Failed };
            self.sh.tx.push(item);
        }
    }

    /// Write the failing DONE of queued `item` into `h`: its flag and
    /// fields; the reason to put in its payload (`None`: the failure is no
    /// longer remembered, nothing to send).
    pub(super) fn fill_failure(&mut self, item: TxItem, h: &mut Header) -> Option<FailReason> {
        let reason = self.history.failure(&item.op.id())?;
        h.ty = PacketType::Done;
        h.flags = Flags::FAILED;
        h.chunk_index = 0;
        h.chunk_count = 1;
        h.payload_len = crate::wire::FAILURE_LEN as u16;
        self.sh.stats.failure_notices_sent += 1;
        Some(reason)
    }
}
