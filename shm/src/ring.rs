//! Single-producer single-consumer rings of 64-byte descriptors in a shared
//! mapping, as in iceoryx2 / machnet.
//!
//! A ring is a control block of two cache lines — `head` (written only by the
//! consumer) at +0 and `tail` (written only by the producer) at +64, each a
//! free-running `u32` — followed by `capacity` slots (a power of two). Slot of
//! index `i` is `i & (capacity - 1)`; `tail - head` (wrapping) is the fill level.
//!
//! **Shadow indices.** Each side keeps its own index in a private field and only
//! ever *stores* it to the shared word; it never reads its own index back. It
//! reads only the peer's index, and checks it: `tail - head` must be at most
//! `capacity`. A peer that writes a wild index is reported as
//! [`RingError::Corrupted`] — it can never make us read or write outside the ring,
//! or make us believe a slot is filled twice.
//!
//! **Sync points** (each atomic access below names its pair):
//! - producer: write slot words (Relaxed) → **Release**-store `tail` (S1);
//! - consumer: **Acquire**-load `tail` (pairs with S1, so the slot words written
//!   before S1 are visible) → read slot words (Relaxed) → **Release**-store `head` (S2);
//! - producer: **Acquire**-load `head` (pairs with S2, so the consumer's reads of a
//!   slot happen before we overwrite it).

use std::sync::atomic::Ordering;

use thiserror::Error;

use super::layout::{DESC_SIZE, DESC_WORDS, RING_HEAD_OFFSET, RING_TAIL_OFFSET};
use super::mapping::Mapping;

/// A ring's indices, as read from shared memory, are impossible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RingError {
    /// `tail - head` exceeds the capacity: the peer wrote a wild index.
    #[error(
        "ring indices corrupted: head {head}, tail {tail}, capacity {capacity} (peer wrote a wild index)"
    )]
    Corrupted {
        /// Head index (ours or the peer's).
        head: u32,
        /// Tail index (ours or the peer's).
        tail: u32,
        /// Ring capacity.
        capacity: u32,
    },
}

/// Where one ring lives in a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    /// Offset of the control block.
    pub ctl: u64,
    /// Slot count, a power of two.
    pub capacity: u32,
}

impl RingLayout {
    fn head(&self) -> u64 {
        self.ctl + RING_HEAD_OFFSET
    }
    fn tail(&self) -> u64 {
        self.ctl + RING_TAIL_OFFSET
    }
    fn slot(&self, index: u32) -> u64 {
        self.ctl + super::layout::RING_CTL_SIZE + (index & (self.capacity - 1)) as u64 * DESC_SIZE
    }
    fn check(&self, head: u32, tail: u32) -> Result<u32, RingError> {
        let used = tail.wrapping_sub(head);
        if used > self.capacity {
            return Err(RingError::Corrupted { head, tail, capacity: self.capacity });
        }
        Ok(used)
    }
}

/// The producing end of a ring (private tail shadow).
#[derive(Debug)]
pub struct Producer {
    layout: RingLayout,
    tail: u32,
}

impl Producer {
    /// A producer for a freshly initialised ring (both indices zero).
    pub fn new(layout: RingLayout) -> Producer {
        Producer { layout, tail: 0 }
    }

    /// Slots free right now.
    pub fn free_slots(&self, map: &Mapping) -> Result<u32, RingError> {
        // Acquire: pairs with the consumer's Release store of head (S2).
        let head = map.atomic_u32(self.layout.head()).load(Ordering::Acquire);
        Ok(self.layout.capacity - self.layout.check(head, self.tail)?)
    }

    /// Pushes one descriptor. `Ok(false)` if the ring is full.
    pub fn push(&mut self, map: &Mapping, words: &[u64; DESC_WORDS]) -> Result<bool, RingError> {
        if self.free_slots(map)? == 0 {
            return Ok(false);
        }
        map.store_words(self.layout.slot(self.tail), words).expect("slot offset inside a validated ring");
        self.tail = self.tail.wrapping_add(1);
        // Release (S1): the slot words above become visible to a consumer that
        // Acquire-loads this tail.
        map.atomic_u32(self.layout.tail()).store(self.tail, Ordering::Release);
        Ok(true)
    }

    /// This side's tail (what it last published).
    pub fn tail(&self) -> u32 {
        self.tail
    }
}

/// The consuming end of a ring (private head shadow).
#[derive(Debug)]
pub struct Consumer {
    layout: RingLayout,
    head: u32,
}

impl Consumer {
    /// A consumer for a freshly initialised ring (both indices zero).
    pub fn new(layout: RingLayout) -> Consumer {
        Consumer { layout, head: 0 }
    }

    /// Descriptors ready right now.
    pub fn available(&self, map: &Mapping) -> Result<u32, RingError> {
        // Acquire: pairs with the producer's Release store of tail (S1).
        let tail = map.atomic_u32(self.layout.tail()).load(Ordering::Acquire);
        self.layout.check(self.head, tail)
    }

    /// Pops one descriptor, copied out of the slot exactly once. `Ok(None)` if empty.
    pub fn pop(&mut self, map: &Mapping) -> Result<Option<[u64; DESC_WORDS]>, RingError> {
        if self.available(map)? == 0 {
            return Ok(None);
        }
        let mut words = [0u64; DESC_WORDS];
        map.load_words(self.layout.slot(self.head), &mut words).expect("slot offset inside a validated ring");
        self.head = self.head.wrapping_add(1);
        // Release (S2): our reads of the slot happen before the producer, after an
        // Acquire load of this head, reuses it.
        map.atomic_u32(self.layout.head()).store(self.head, Ordering::Release);
        Ok(Some(words))
    }

    /// This side's head (what it last published).
    pub fn head(&self) -> u32 {
        self.head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::create_and_map;

    const CAP: u32 = 8;

    fn ring() -> (std::os::fd::OwnedFd, Mapping, RingLayout) {
        let (fd, map) = create_and_map("dlcp-ring-test", 4096).unwrap();
        (fd, map, RingLayout { ctl: 0, capacity: CAP })
    }

    fn desc(n: u64) -> [u64; DESC_WORDS] {
        core::array::from_fn(|i| n * 100 + i as u64)
    }

    #[test]
    fn empty_ring_pops_nothing() {
        let (_fd, map, l) = ring();
        let mut c = Consumer::new(l);
        assert_eq!(c.available(&map), Ok(0));
        assert_eq!(c.pop(&map), Ok(None));
        assert_eq!(Producer::new(l).free_slots(&map), Ok(CAP));
    }

    #[test]
    fn fills_to_capacity_then_refuses() {
        let (_fd, map, l) = ring();
        let mut p = Producer::new(l);
        for n in 0..CAP as u64 {
            assert_eq!(p.push(&map, &desc(n)), Ok(true));
        }
        assert_eq!(p.free_slots(&map), Ok(0));
        assert_eq!(p.push(&map, &desc(99)), Ok(false), "full ring refuses");
        let mut c = Consumer::new(l);
        assert_eq!(c.available(&map), Ok(CAP));
        for n in 0..CAP as u64 {
            assert_eq!(c.pop(&map), Ok(Some(desc(n))), "FIFO order");
        }
        assert_eq!(c.pop(&map), Ok(None));
        assert_eq!(p.push(&map, &desc(100)), Ok(true), "space again after consuming");
    }

    #[test]
    fn wraps_around_many_times_including_u32_overflow() {
        let (_fd, map, l) = ring();
        let mut p = Producer::new(l);
        let mut c = Consumer::new(l);
        // Start near u32::MAX so the free-running indices wrap.
        let start = u32::MAX - 5;
        p.tail = start;
        c.head = start;
        map.atomic_u32(l.head()).store(start, Ordering::Relaxed);
        map.atomic_u32(l.tail()).store(start, Ordering::Relaxed);
        let mut next_in = 0u64;
        let mut next_out = 0u64;
        for round in 0..10 * CAP as u64 {
            let burst = 1 + round % CAP as u64;
            for _ in 0..burst {
                if p.push(&map, &desc(next_in)).unwrap() {
                    next_in += 1;
                }
            }
            while let Some(w) = c.pop(&map).unwrap() {
                assert_eq!(w, desc(next_out));
                next_out += 1;
            }
        }
        assert_eq!(next_in, next_out);
        assert!(next_in > 4 * CAP as u64);
        assert!(p.tail() < start, "tail wrapped past u32::MAX");
        assert_eq!(p.tail(), c.head());
    }

    #[test]
    fn wild_peer_indices_are_reported_not_followed() {
        let (_fd, map, l) = ring();
        let mut c = Consumer::new(l);
        // Producer (peer) claims capacity + 1 entries.
        map.atomic_u32(l.tail()).store(CAP + 1, Ordering::Release);
        assert_eq!(c.pop(&map), Err(RingError::Corrupted { head: 0, tail: CAP + 1, capacity: CAP }));
        map.atomic_u32(l.tail()).store(u32::MAX, Ordering::Release); // "behind" head
        assert!(c.pop(&map).is_err());
        assert_eq!(c.head(), 0, "shadow head untouched");
        // Exactly capacity is legal (a full ring).
        map.atomic_u32(l.tail()).store(CAP, Ordering::Release);
        assert_eq!(c.available(&map), Ok(CAP));

        let (_fd2, map2, l2) = ring();
        let mut p = Producer::new(l2);
        p.push(&map2, &desc(0)).unwrap();
        // Consumer (peer) claims to have consumed more than was produced.
        map2.atomic_u32(l2.head()).store(5, Ordering::Release);
        assert_eq!(p.push(&map2, &desc(1)), Err(RingError::Corrupted { head: 5, tail: 1, capacity: CAP }));
        assert_eq!(p.tail(), 1);
        map2.atomic_u32(l2.head()).store(1, Ordering::Release);
        assert_eq!(p.push(&map2, &desc(1)), Ok(true), "usable again once the peer behaves");
    }

    #[test]
    fn producer_and_consumer_threads_agree() {
        let (_fd, map, l) = ring();
        let n = 20_000u64;
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut p = Producer::new(l);
                let mut i = 0;
                while i < n {
                    if p.push(&map, &desc(i)).unwrap() {
                        i += 1;
                    } else {
                        std::thread::yield_now();
                    }
                }
            });
            let mut c = Consumer::new(l);
            let mut i = 0;
            while i < n {
                match c.pop(&map).unwrap() {
                    Some(w) => {
                        assert_eq!(w, desc(i));
                        i += 1;
                    }
                    None => std::thread::yield_now(),
                }
            }
        });
    }
}
