//! The all-gather's decisions at the owner and the agreed mask at a
//! receiver: exact (gather budget 0: no mask, receivers close on their
//! own) or agreed (a mask from every receiver's report).

use crate::bitmap::Bitmap;
use crate::endpoint::api::OpKey;
use crate::endpoint::shared::Shared;
use crate::time::Instant;
use crate::transfer::{Refused, allowed_missing, select_repairs};
use crate::wire::{Header, Phase};

use super::{Handled, Op};

impl Op {
    /// All-gather DONE: a segment of the owner's agreed mask.
    pub(super) fn on_mask(&mut self, now: Instant, h: &Header, payload: &[u8], sh: &mut Shared) -> Handled {
        let owner = h.src;
        let r = self.transfers.receiver_mut(Phase::Gather, owner).ok_or(Refused::Mismatch)?;
        let closed = r.on_mask(h, payload, now, sh.seg_bytes())?;
        self.last_progress = now;
        let Some(closed) = closed else {
            self.acknowledged(now, owner, sh);
            return Ok(());
        };
        // Zero-fill the agreed mask, and (defensively) anything the owner
        // believed we had but we do not.
        for c in 0..r.n() {
            if r.mask().is_some_and(|m| m.get(c)) || !r.got().get(c) {
                self.result[self.layout.chunk_in_tensor(owner, c)].fill(0.0);
            }
        }
        if let Some(took) = closed.took {
            sh.deadlines[1].observe(took, r.n());
        }
        self.acknowledged(now, owner, sh);
        Ok(())
    }

    /// Every gather receiver has reported: repair the union of what is
    /// missing until it fits the gather budget, or announce the agreed mask.
    pub(super) fn decide_gather(&mut self, key: OpKey, sh: &mut Shared) {
        let me = sh.me();
        let n = self.layout.chunks(me);
        if self.gmask.is_none() && self.exact_gather(sh) {
            // Every receiver that holds everything closed on its own: no
            // mask, no DONE; the shard is out once every one reported.
            for (_, st) in self.transfers.senders_mut(Phase::Gather) {
                if st.is_reported() && st.receiver_complete() {
                    st.finish();
                }
            }
            if self.transfers.senders(Phase::Gather).all(|(_, st)| st.is_done()) {
                self.gmask = Some(Bitmap::new(n));
            }
            return;
        }
        if self.gmask.is_some() || self.transfers.senders(Phase::Gather).any(|(_, st)| !st.is_reported()) {
            return;
        }
        let mut union = Bitmap::new(n);
        for (_, st) in self.transfers.senders(Phase::Gather) {
            for c in st.missing() {
                union.set(c);
            }
        }
        let classes = &self.gclasses;
        let allowed = allowed_missing(n, self.opts.gather_budget_ppm);
        let repairs =
            select_repairs(union.iter_ones(), |c| classes[c as usize], self.classifier.droppable, allowed);
        if repairs.is_empty() {
            // Agreed mask: zero-fill it here and tell every receiver.
            for c in union.iter_ones() {
                self.result[self.layout.chunk_in_tensor(me, c)].fill(0.0);
            }
            self.transfers.senders_mut(Phase::Gather).for_each(|(_, st)| st.finish());
            let peers: Vec<u32> = self.transfers.senders(Phase::Gather).map(|(j, _)| j).collect();
            for j in peers {
                sh.tx.push_mask(key, j, &union, sh.seg_bytes());
            }
            self.gmask = Some(union);
            return;
        }
        let mine: Vec<(u32, Vec<u32>)> = self
            .transfers
            .senders_mut(Phase::Gather)
            .map(|(j, st)| (j, st.decide_jointly(&repairs)))
            .collect();
        for (j, chunks) in mine {
            self.queue_repairs(key, Phase::Gather, j, &chunks, sh);
        }
    }

    /// Whether this rank's all-gather is exact: its gather budget allows no
    /// missing chunk of its shard (the default), so receivers close on
    /// their own and no mask is agreed ([`Receiver::exact`]).
    pub(crate) fn exact_gather(&self, sh: &Shared) -> bool {
        allowed_missing(self.layout.chunks(sh.me()), self.opts.gather_budget_ppm) == 0
    }
}
