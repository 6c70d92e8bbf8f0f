//! The ops in flight, in a slab: an op lives in a slot for its whole life,
//! and what refers to it from a queue (a [`TxItem`](super::tx::TxItem)) keeps
//! the slot, so reaching it is an index, not a map lookup. A received
//! datagram names its op by [`OpId`]: one hash lookup finds the slot. The
//! map hashes with FxHash, not SipHash: its keys are the ops local trainers
//! started (a datagram only looks one up, it never adds one), so no peer
//! can choose colliding keys, and the lookup is per datagram.
//!
//! Iteration in [`OpId`] order (timers, restarts) sorts the few ids in flight;
//! it happens per event, not per datagram.

use rustc_hash::FxHashMap;

use crate::endpoint::allreduce::Op;
use crate::endpoint::api::{OpId, OpKey, Slot};

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct OpTable {
    slots: Vec<Option<(OpId, Op)>>,
    free: Vec<Slot>,
    index: FxHashMap<OpId, Slot>,
}

impl OpTable {
    /// Whether op `id` is in flight.
    pub(crate) fn contains(&self, id: &OpId) -> bool {
        self.index.contains_key(id)
    }

    /// The slot of op `id`.
    pub(crate) fn slot(&self, id: &OpId) -> Option<Slot> {
        self.index.get(id).copied()
    }

    /// Op `id`.
    pub(crate) fn get(&self, id: &OpId) -> Option<&Op> {
        self.at(self.slot(id)?, id)
    }

    /// Op `id`, to change.
    pub(crate) fn get_mut(&mut self, id: &OpId) -> Option<&mut Op> {
        self.at_mut(self.slot(id)?, id)
    }

    /// The op in `slot`, if it is op `id` (a slot is reused once its op ends).
    pub(crate) fn at(&self, slot: Slot, id: &OpId) -> Option<&Op> {
        match self.slots.get(slot as usize)? {
            Some((i, op)) if i == id => Some(op),
            _ => None,
        }
    }

    /// The op in `slot`, if it is op `id`, to change.
    pub(crate) fn at_mut(&mut self, slot: Slot, id: &OpId) -> Option<&mut Op> {
        match self.slots.get_mut(slot as usize)? {
            Some((i, op)) if i == id => Some(op),
            _ => None,
        }
    }

    /// The slot the next [`OpTable::insert`] fills.
    pub(crate) fn vacant(&self) -> Slot {
        self.free.last().copied().unwrap_or(self.slots.len() as Slot)
    }

    /// The op a queue item refers to, if it is still in flight.
    pub(crate) fn by_key(&self, key: OpKey) -> Option<&Op> {
        self.at(key.slot, &key.id())
    }

    /// The op a queue item refers to, to change.
    pub(crate) fn by_key_mut(&mut self, key: OpKey) -> Option<&mut Op> {
        self.at_mut(key.slot, &key.id())
    }

    /// Add op `id` (not in the table); returns its slot.
    pub(crate) fn insert(&mut self, id: OpId, op: Op) -> Slot {
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some((id, op));
                s
            }
            None => {
                self.slots.push(Some((id, op)));
                (self.slots.len() - 1) as Slot
            }
        };
        self.index.insert(id, slot);
        slot
    }

    /// Take op `id` out; its slot is free again.
    pub(crate) fn remove(&mut self, id: &OpId) -> Option<Op> {
        let slot = self.index.remove(id)?;
        let (_, op) = self.slots[slot as usize].take()?;
        self.free.push(slot);
        Some(op)
    }

    /// The ids in flight, in order.
    pub(crate) fn ids(&self) -> Vec<OpId> {
        let mut ids: Vec<OpId> = self.index.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Every op in flight (in no particular order).
    pub(crate) fn values(&self) -> impl Iterator<Item = &Op> {
        self.slots.iter().flatten().map(|(_, op)| op)
    }
}
