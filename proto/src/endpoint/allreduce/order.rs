//! The order of an op's two phases where they meet: this rank sends its
//! all-gather only once its own reduce-scatter DATA left the queues, and
//! (with flow control) wants its peers' all-gather only once it reduced,
//! so that results never starve the contributions still on their way —
//! the owners' reduces are what every all-gather waits for.

use crate::endpoint::api::OpKey;
use crate::endpoint::shared::Shared;
use crate::endpoint::tx::{TxItem, TxKind};
use crate::time::{Duration, Instant};
use crate::wire::Phase;

use super::Op;

impl Op {
    /// Queue every chunk of every send transfer of `phase` once, interleaved
    /// across destinations so every path is busy at once, starting after this
    /// rank to spread incast.
    ///
    /// The all-gather's first pass waits while any of this op's
    /// reduce-scatter DATA is still queued here ([`Op::dequeued`]): its
    /// classes outrank the reduce-scatter's in this rank's queues, and
    /// sending it first would hold back the contributions other owners
    /// still wait for — the op ends with the last owner's reduce (4 ranks,
    /// 1.6 MB with credit: 3.18 ms, 3.71 without this order). A receiver gives
    /// credit for the reduce-scatter first ([`crate::flow`]).
    pub(super) fn first_pass(&mut self, key: OpKey, phase: Phase, sh: &mut Shared) {
        let world = sh.cfg.world;
        if phase == Phase::Gather {
            self.held_scan = 0;
            self.gather_held = !self.scatter_drained(world);
            if self.gather_held {
                return;
            }
        }
        self.first_pass_now(key, phase, sh);
    }

    /// Queue the first pass of `phase` (see [`Op::first_pass`]).
    fn first_pass_now(&mut self, key: OpKey, phase: Phase, sh: &mut Shared) {
        let (world, me) = (sh.cfg.world, sh.me());
        let max = self.transfers.senders(phase).map(|(_, st)| st.n()).max().unwrap_or(0);
        for chunk in 0..max {
            for k in 1..world {
                let j = (me + k) % world;
                let Some(st) = self.transfers.sender_mut(phase, j).filter(|st| chunk < st.n()) else {
                    continue;
                };
                st.queue(1);
                self.scatter_pass.0 += u32::from(phase == Phase::Scatter);
                let kind = TxKind::Data { chunk, repair: false, class: self.class_of(phase, j, chunk) };
                sh.tx.push_data(TxItem { op: key, phase, peer: j, kind });
            }
        }
    }

    /// Send the all-gather's first pass now if it was held for this op's
    /// reduce-scatter DATA ([`Op::first_pass`]). The owner of an exact
    /// all-gather calls this as it delivers, whatever is still queued: by
    /// then every other owner's all-gather has arrived, so its
    /// reduce-scatter sends are acknowledged and hold nothing back, and the
    /// delivery lets those senders go — the release in [`Op::dequeued`]
    /// once waited for them. (It did not come: an owner whose last
    /// reduce-scatter DATA was still queued when the others' all-gathers
    /// completed its receives delivered, moved on, and never sent its
    /// all-gather; every other rank waited for it until the hard timeout —
    /// budget 5% at 1% loss, once in 27,000 ops of DDP training.)
    pub(crate) fn release_gather(&mut self, key: OpKey, sh: &mut Shared) {
        if std::mem::take(&mut self.gather_held) {
            self.held_scan = sh.cfg.world;
            self.first_pass_now(key, Phase::Gather, sh);
        }
    }

    /// How much longer than the probe timeout the answer to a send
    /// transfer's LAST DATA of `phase` may take, once its last queued chunk
    /// left (at most `cap`). A reduce-scatter transfer is acknowledged by
    /// its owner's all-gather, which comes only after the owner reduced:
    /// when every rank's first pass into it is through, about when this
    /// rank's own is (every rank sends the same (N−1)/N of the data),
    /// estimated from the share of this rank's first-pass chunks gone so
    /// far; the owner's all-gather then takes about as long again. At least
    /// the time this rank's first pass took so far, as before the estimate:
    /// with that alone, at 1,024 ranks (one chunk per transfer) the
    /// transfers sent early in the pass were all probed before their
    /// acknowledgement could come (0.71 PROBEs and 0.35 DONEs per peer and
    /// op). A collective without an all-gather acknowledges with DONE at once.
    pub(super) fn ack_wait(&self, now: Instant, phase: Phase, cap: Duration) -> Duration {
        if !self.opts.collective.gathers() {
            return Duration::ZERO;
        }
        let elapsed = now - self.started;
        if phase != Phase::Scatter {
            return elapsed;
        }
        let (queued, gone) = self.scatter_pass;
        let pass = elapsed.as_nanos() * u128::from(queued) / u128::from(gone.max(1));
        let until = Duration::from_nanos(u64::try_from(2 * pass).unwrap_or(u64::MAX)).saturating_sub(elapsed);
        elapsed.max(until).min(cap.max(elapsed))
    }

    /// Whether none of this op's reduce-scatter DATA is queued here: the
    /// scan resumes where it last stopped (`held_scan`), so an op pays
    /// O(world) for it in all. (A repair queued behind the scan is not
    /// waited for: this only orders the first pass.)
    pub(super) fn scatter_drained(&mut self, world: u32) -> bool {
        while self.held_scan < world {
            let busy =
                self.transfers.sender(Phase::Scatter, self.held_scan).is_some_and(|st| st.queued() > 0);
            if busy {
                return false;
            }
            self.held_scan += 1;
        }
        true
    }

    /// This rank NACKs (sends a BITMAP for) a transfer of `phase` in
    /// answer to its sender's LAST DATA or PROBE, or at a receive deadline:
    /// a reduce-scatter repair before the reduce ends the all-gather hold
    /// (`wants_from`); its peers hear of the credit (`Shared::want_grew`).
    /// A quiet NACK (the sender went silent before its LAST) does not: the
    /// sender's first pass may not be over, and its tail is most often in
    /// this rank's port queue, where an all-gather let in would go first.
    pub(super) fn nacked(&mut self, phase: Phase, sh: &mut Shared) {
        if phase == Phase::Scatter && !self.reduced && !self.repairing {
            self.repairing = true;
            sh.want_grew = true;
        }
    }

    /// The DATA this rank still waits for from `peer` in this op, in chunks,
    /// for flow control's credit ([`crate::flow`]): `(true, k)` before this
    /// rank's reduce in a collective with both phases when `peer`'s
    /// all-gather to this rank is at most `hold_max` chunks, `k` the
    /// reduce-scatter chunks missing from `peer` (its all-gather must
    /// wait); otherwise `(false, k)`, `k` the chunks missing in every open
    /// receive transfer from `peer`.
    ///
    /// Only a short all-gather is held back: many of them land at once
    /// (every owner's, each within the senders' unscheduled credit) and
    /// starve the reduce-scatter tail at this rank's port; a long one is
    /// paced by credit as it goes, and holding it would only make its
    /// sender pour its rate into other ports (4 ranks × 16 MB: switch
    /// drops on a clean network). Nor is anything held once this rank
    /// NACKed a reduce-scatter chunk after its sender's LAST or PROBE
    /// (`nacked`): the first pass is over,
    /// the repair is a round trip away, and the all-gather may use the
    /// port meanwhile (8 ranks × 1 MB at 1% loss: 2.6 ms instead of 2.0
    /// while held until the reduce).
    pub(crate) fn wants_from(&self, peer: u32, hold_max: u32) -> (bool, u32) {
        let c = self.opts.collective;
        let open = |phase| self.transfers.receiver(phase, peer).filter(|r| r.is_open());
        let missing = |phase| open(phase).map_or(0, |r| r.got().count_zeros());
        let short = open(Phase::Gather).is_some_and(|r| r.got().len() <= hold_max);
        if !self.reduced && !self.repairing && c.scatters() && c.gathers() && short {
            return (true, missing(Phase::Scatter));
        }
        (false, missing(Phase::Scatter) + missing(Phase::Gather))
    }
}
