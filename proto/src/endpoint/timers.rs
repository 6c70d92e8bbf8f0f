//! The index of transfer timers: one entry per transfer with a live timer
//! (a probe timer, receive deadline, grace, nudge or quiet timer), at or
//! before its earliest one, keyed by transfer.
//!
//! A transfer's entry is the instant its table records
//! ([`Transfers::reindex`](crate::endpoint::allreduce::Transfers::reindex)):
//! a timer armed earlier than the entry adds an entry there, and the older
//! one goes stale; a timer moved later (a receiver's quiet timer, on every
//! chunk) leaves the entry, which then comes due early: the transfer is
//! served, finds nothing due, and is indexed anew at its earliest timer. So
//! the per-datagram cost is one comparison, not a tree insertion, and a
//! transfer is served early at most once per timer period. Entries are
//! checked against the transfer's table when read (the caller's `live`
//! test), so stale ones — superseded, or of an op that ended — are skipped
//! and pruned. Keeps `poll_timeout` and `handle_timeout` from scanning every
//! transfer of every op (O(world) per event).

use std::collections::BTreeSet;

use crate::endpoint::allreduce::{Side, Transfers};
use crate::endpoint::api::OpId;
use crate::time::Instant;

/// `(when, op, side, peer)`: the index entry of one transfer.
pub(crate) type TimerEntry = (Instant, OpId, Side, u32);

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct TimerIndex {
    entries: BTreeSet<TimerEntry>,
}

impl TimerIndex {
    /// Index one transfer of op `id` after its timers may have changed:
    /// add the entry [`Transfers::reindex`] asks for, if any (`due`: its
    /// entry was just taken from the index).
    pub(crate) fn reindex(&mut self, transfers: &mut Transfers, id: OpId, side: Side, peer: u32, due: bool) {
        if let Some(at) = transfers.reindex(side, peer, due) {
            self.entries.insert((at, id, side, peer));
        }
    }

    /// The transfers with a live timer at or before `now`, in (op, side,
    /// peer) order, each once; their entries leave the index.
    pub(crate) fn pop_due(
        &mut self,
        now: Instant,
        live: impl Fn(&TimerEntry) -> bool,
    ) -> Vec<(OpId, Side, u32)> {
        let mut due = Vec::new();
        while let Some(&e) = self.entries.first() {
            if e.0 > now {
                break;
            }
            self.entries.pop_first();
            if live(&e) {
                due.push((e.1, e.2, e.3));
            }
        }
        due.sort_unstable();
        due.dedup();
        due
    }

    /// Drop stale entries from the front.
    pub(crate) fn prune(&mut self, live: impl Fn(&TimerEntry) -> bool) {
        while let Some(e) = self.entries.first() {
            if live(e) {
                break;
            }
            self.entries.pop_first();
        }
    }

    /// The earliest live timer (stale entries are skipped; the mutating entry
    /// points prune them, so this is usually the first).
    pub(crate) fn first_live(&self, live: impl Fn(&TimerEntry) -> bool) -> Option<Instant> {
        self.entries.iter().find(|e| live(e)).map(|e| e.0)
    }

    /// Bytes the index holds (for the endpoint's footprint).
    pub(crate) fn bytes(&self) -> usize {
        self.entries.len() * size_of::<TimerEntry>()
    }
}
