//! Delayed, aggregated acknowledgements of exact all-gathers (wire version 10).
//!
//! A receiver that holds every chunk of an owner's shard (gather budget 0)
//! closes the transfer on its own; the owner only needs to hear that it did,
//! to stop answering for the shard. Until version 9 it heard it at once, in
//! one COMPLETE report per transfer: one control packet per peer per op,
//! 1.0 of the 1.04 per peer per op left at 1,024 ranks (1 MB: one DATA each
//! way and phase, so 34% of all packets were control). Now the receiver
//! notes the transfer here and sends, per owner, one ACK listing every op it
//! completed within `ack_delay` of the first ([`crate::wire::AckEntry`], up
//! to [`MAX_ACKS`] per packet) — TCP's and QUIC's delayed ACK
//! (RFC 9000 §13.2: `max_ack_delay`, 25 ms by default, as here), applied
//! across ops. The owner delivers its result when its own receives are done
//! and keeps a copy of its shard until the ACKs arrive, probing for a
//! missing one only after `ack_delay` plus a probe timeout.

use std::collections::VecDeque;

use crate::endpoint::Endpoint;
use crate::endpoint::api::{OpId, OpKey};
use crate::endpoint::tx::{TxItem, TxKind};
use crate::time::{Duration, Instant};
use crate::wire::{self, AckEntry, Header, MAX_ACKS, Phase};

/// One completed transfer waiting to be acknowledged.
#[derive(Debug, Clone, Copy)]
struct Pending {
    id: OpId,
    echo: u32,
    at: Instant,
}

/// Per owner: the transfers it has not been told about yet.
#[derive(Debug, Default)]
pub(crate) struct Acks {
    pending: Vec<Vec<Pending>>,
    /// Owners with pending entries (each once), in the order their oldest
    /// entry arrived.
    owners: VecDeque<u32>,
    /// Per owner: an ACK is queued to it (not written yet), so its entries
    /// are not due again.
    queued: Vec<bool>,
}

impl Acks {
    /// For `world` ranks.
    pub(crate) fn new(world: u32) -> Acks {
        let n = world as usize;
        Acks {
            pending: (0..n).map(|_| Vec::new()).collect(),
            owners: VecDeque::new(),
            queued: vec![false; n],
        }
    }

    /// The all-gather of op `id` from `owner` arrived whole at `now`, its
    /// last DATA numbered `echo`. True when that owner has a full packet's
    /// worth waiting and no ACK queued: queue one now (it counts as queued).
    pub(crate) fn add(&mut self, owner: u32, id: OpId, echo: u32, now: Instant) -> bool {
        let o = owner as usize;
        let Some(p) = self.pending.get_mut(o) else { return false };
        if p.is_empty() {
            self.owners.push_back(owner);
        }
        p.push(Pending { id, echo, at: now });
        let full = p.len() >= MAX_ACKS && !self.queued[o];
        self.queued[o] |= full;
        full
    }

    /// When the oldest entry not already queued is due (`ack_delay` after
    /// it arrived). Owners are kept in the order their oldest entry arrived,
    /// so this is the first owner without a queued ACK: O(1) but for the
    /// queued ones, which leave as their ACKs are written.
    pub(crate) fn next_due(&self, ack_delay: Duration) -> Option<Instant> {
        let mut waiting = self.owners.iter().filter(|&&o| !self.queued[o as usize]);
        waiting.next().and_then(|&o| self.pending[o as usize].first()).map(|p| p.at + ack_delay)
    }

    /// Owners with an entry due by `now` (every owner with entries, if
    /// `all`) and no ACK queued: the caller queues one to each, and they
    /// count as queued until it is written ([`Acks::take`]). The scan stops
    /// at the first owner not due (they are in order of their oldest entry).
    pub(crate) fn due(&mut self, now: Instant, ack_delay: Duration, all: bool) -> Vec<u32> {
        let (pending, queued) = (&self.pending, &mut self.queued);
        let mut out = Vec::new();
        for &o in &self.owners {
            if queued[o as usize] {
                continue;
            }
            if !all && pending[o as usize].first().is_none_or(|p| p.at + ack_delay > now) {
                break;
            }
            queued[o as usize] = true;
            out.push(o);
        }
        out
    }

    /// ACK packets of at most `max` entries that `owner`'s entries fill.
    pub(crate) fn packets(&self, owner: u32, max: usize) -> usize {
        let n = self.pending.get(owner as usize).map_or(0, Vec::len);
        n.div_ceil(max.clamp(1, MAX_ACKS))
    }

    /// Take up to `max` (at most [`MAX_ACKS`]) of `owner`'s entries of one
    /// run (the first's) as they go out at `now`: the run and the entries.
    pub(crate) fn take(&mut self, owner: u32, now: Instant, max: usize) -> Option<(u64, Vec<AckEntry>)> {
        let max = max.clamp(1, MAX_ACKS);
        *self.queued.get_mut(owner as usize)? = false;
        let p = self.pending.get_mut(owner as usize)?;
        let run = p.first()?.id.run;
        let mut out = Vec::with_capacity(p.len().min(max));
        p.retain(|e| {
            if e.id.run != run || out.len() == max {
                return true;
            }
            let held = now.saturating_duration_since(e.at).as_micros();
            let held_us = u32::try_from(held).unwrap_or(u32::MAX);
            out.push(AckEntry { op: e.id.seq, tensor: e.id.tensor, echo: e.echo, held_us });
            false
        });
        // Keep the owners in the order of their oldest entry: one with
        // entries left (another run's, or past `max`) goes to the back.
        // ACKs are written in the order they were queued, so this owner is
        // usually the first: O(1).
        if self.owners.front() == Some(&owner) {
            self.owners.pop_front();
        } else {
            self.owners.retain(|&o| o != owner);
        }
        if !p.is_empty() {
            self.owners.push_back(owner);
        }
        Some((run, out))
    }

    /// Forget `owner`'s entries (it left: nothing waits for them).
    pub(crate) fn forget(&mut self, owner: u32) {
        if let Some(p) = self.pending.get_mut(owner as usize) {
            p.clear();
            self.queued[owner as usize] = false;
            self.owners.retain(|&o| o != owner);
        }
    }

    /// Entries waiting, over all owners.
    pub(crate) fn len(&self) -> usize {
        self.owners.iter().map(|&o| self.pending[o as usize].len()).sum()
    }

    /// Heap bytes (for the endpoint's footprint).
    pub(crate) fn bytes(&self) -> usize {
        self.pending.iter().map(|p| p.capacity() * size_of::<Pending>()).sum::<usize>()
            + self.pending.capacity() * size_of::<Vec<Pending>>()
    }
}

impl Endpoint {
    /// Queue an ACK to every owner whose oldest acknowledgement is due (to
    /// all that have one, if `all`).
    pub(super) fn flush_acks(&mut self, now: Instant, all: bool) {
        for owner in self.sh.acks.due(now, self.sh.cfg.timers.ack_delay, all) {
            // One item takes up to a packet's worth; queue as many as needed.
            let n = self.sh.acks.packets(owner, self.sh.seg_bytes() / wire::ACK_ENTRY_LEN);
            for _ in 0..n {
                let op = OpKey::outside(OpId { run: 0, seq: 0, tensor: 0 });
                self.sh.tx.push(TxItem { op, phase: Phase::Gather, peer: owner, kind: TxKind::Ack });
            }
        }
    }

    /// An ACK from `h.src`: the all-gathers of these ops arrived there whole.
    pub(super) fn on_ack(&mut self, now: Instant, h: &Header, payload: &[u8]) {
        let Some(run) = self.sh.runs.epoch_of(h.run) else {
            self.sh.stats.rejected.other_run += 1;
            return;
        };
        for e in wire::parse_acks(payload) {
            let id = OpId { run, seq: e.op, tensor: e.tensor };
            let Some(slot) = self.ops.slot(&id) else { continue };
            let key = OpKey::new(id, slot);
            let Some(op) = self.ops.at_mut(slot, &id) else { continue };
            if op.on_ack(now, key, h.src, e, &mut self.sh) {
                self.sh.stats.acks_received += 1;
            }
            self.check_complete(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(seq: u64) -> OpId {
        OpId { run: 1, seq, tensor: 0 }
    }

    #[test]
    fn one_packet_per_owner_covers_every_op_within_the_delay() {
        let mut a = Acks::new(4);
        let t0 = Instant::ZERO;
        let d = Duration::from_millis(25);
        assert!(!a.add(2, id(1), 7, t0));
        assert!(!a.add(2, id(2), 9, t0 + Duration::from_millis(10)));
        assert!(!a.add(3, id(2), 4, t0 + Duration::from_millis(12)));
        assert_eq!(a.next_due(d), Some(t0 + d));
        assert!(a.due(t0 + Duration::from_millis(24), d, false).is_empty());
        assert_eq!(a.due(t0 + d, d, false), vec![2]);
        // Queued: not due again until written; the other owner still is.
        assert_eq!(a.next_due(d), Some(t0 + Duration::from_millis(37)));
        assert_eq!(a.due(t0, d, true), vec![3]);
        let (run, es) = a.take(2, t0 + d, MAX_ACKS).unwrap();
        assert_eq!(run, 1);
        assert_eq!(
            es.iter().map(|e| (e.op, e.echo, e.held_us)).collect::<Vec<_>>(),
            [(1, 7, 25_000), (2, 9, 15_000)]
        );
        assert_eq!(a.len(), 1);
        assert_eq!(a.next_due(d), None, "owner 3's ACK is queued");
        a.forget(3);
        assert_eq!((a.len(), a.next_due(d)), (0, None));
    }

    #[test]
    fn a_full_packet_is_due_at_once_and_runs_are_not_mixed() {
        let mut a = Acks::new(2);
        let t0 = Instant::ZERO;
        for s in 0..MAX_ACKS as u64 - 1 {
            assert!(!a.add(1, id(s), 0, t0));
        }
        assert!(a.add(1, OpId { run: 2, seq: 0, tensor: 0 }, 0, t0), "the 64th entry");
        assert!(!a.add(1, id(99), 0, t0), "one ACK is queued already");
        assert_eq!(a.packets(1, MAX_ACKS), 2);
        assert_eq!(a.packets(1, 10), 7);
        let (run, es) = a.take(1, t0, MAX_ACKS).unwrap();
        assert_eq!((run, es.len()), (1, MAX_ACKS), "run 1's 63 and id 99");
        let (run, es) = a.take(1, t0, MAX_ACKS).unwrap();
        assert_eq!((run, es.len()), (2, 1));
        assert!(a.take(1, t0, MAX_ACKS).is_none());
    }
}
