//! A switch egress queue: strict priority by class, pushing out the newest
//! packet of the lowest class when full.

use std::collections::VecDeque;

use crate::class::Class;

/// Outcome of offering a packet to a full-or-not [`PrioQueue`].
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Admit<T> {
    Queued,
    /// Queued, after pushing out this packet of this (lower) class.
    PushedOut(Class, T),
    /// Not queued.
    Rejected(T),
}

/// A strict-priority queue with push-out of the lowest class.
#[derive(Debug)]
pub(super) struct PrioQueue<T> {
    queues: [VecDeque<T>; Class::COUNT],
    pub(super) len: usize,
}

impl<T> PrioQueue<T> {
    pub(super) fn new() -> Self {
        PrioQueue { queues: Default::default(), len: 0 }
    }

    pub(super) fn push(&mut self, class: Class, item: T, cap: usize) -> Admit<T> {
        if self.len < cap {
            self.queues[class.index()].push_back(item);
            self.len += 1;
            return Admit::Queued;
        }
        let Some(low) = (0..class.index()).find(|&c| !self.queues[c].is_empty()) else {
            return Admit::Rejected(item);
        };
        let victim = self.queues[low].pop_back().expect("non-empty class queue");
        self.queues[class.index()].push_back(item);
        Admit::PushedOut(Class::new(low as u8).expect("class index in range"), victim)
    }

    /// Whether [`PrioQueue::push`] would queue a packet of `class`.
    pub(super) fn admits(&self, class: Class, cap: usize) -> bool {
        self.len < cap || self.queues[..class.index()].iter().any(|q| !q.is_empty())
    }

    pub(super) fn pop(&mut self) -> Option<T> {
        let item = self.queues.iter_mut().rev().find_map(VecDeque::pop_front)?;
        self.len -= 1;
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cls(c: u8) -> Class {
        Class::new(c).unwrap()
    }

    #[test]
    fn prio_queue_serves_highest_class_fifo() {
        let mut q = PrioQueue::new();
        for (c, v) in [(1, 'a'), (5, 'b'), (1, 'c'), (5, 'd'), (3, 'e')] {
            assert_eq!(q.push(cls(c), v, 10), Admit::Queued);
        }
        let order: Vec<char> = core::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ['b', 'd', 'e', 'a', 'c']);
        assert_eq!(q.len, 0);
    }

    #[test]
    fn prio_queue_pushes_out_newest_of_lowest_class() {
        let mut q = PrioQueue::new();
        for (c, v) in [(2, 'a'), (1, 'b'), (1, 'c'), (4, 'd')] {
            assert_eq!(q.push(cls(c), v, 4), Admit::Queued);
        }
        // Full: a class-3 arrival evicts the most recent class-1 packet.
        assert_eq!(q.push(cls(3), 'e', 4), Admit::PushedOut(cls(1), 'c'));
        assert_eq!(q.push(cls(3), 'f', 4), Admit::PushedOut(cls(1), 'b'));
        assert_eq!(q.push(cls(3), 'g', 4), Admit::PushedOut(cls(2), 'a'));
        // Nothing lower than 3 is left: same class or lower is rejected.
        assert_eq!(q.push(cls(3), 'h', 4), Admit::Rejected('h'));
        assert_eq!(q.push(cls(0), 'i', 4), Admit::Rejected('i'));
        assert_eq!(q.push(cls(7), 'j', 4), Admit::PushedOut(cls(3), 'g'));
        let order: Vec<char> = core::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ['j', 'd', 'e', 'f']);
    }

    #[test]
    fn prio_queue_zero_capacity_rejects() {
        let mut q = PrioQueue::new();
        assert_eq!(q.push(cls(6), 1, 0), Admit::Rejected(1));
    }
}
