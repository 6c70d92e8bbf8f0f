//! What the endpoint knows about ops that are not in flight: the ids of
//! finished ops (a late packet of one is stale, and its id cannot be started
//! again), completed ops that still answer late PROBEs and BITMAPs for a
//! while ([`Linger`]), failed ops that answer their peers' packets with a
//! failing DONE for as long ([`Failed`], wire version 5), and datagrams that
//! arrived for ops this rank has not started yet (bounded, replayed when it
//! starts them).

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

use crate::bitmap::Bitmap;
use crate::endpoint::api::{OpId, OpKind};
use crate::time::{Duration, Instant};
use crate::wire::{self, FailReason};

/// A completed op that still answers late PROBEs and BITMAPs.
#[derive(Debug)]
pub(crate) struct Linger {
    /// Until when.
    pub until: Instant,
    /// Chunks of this rank's shard (a reduce-scatter DONE names them).
    pub own_chunks: u32,
    /// The agreed mask of this rank's shard (an all-gather DONE carries it).
    pub mask: Bitmap,
    /// The op's element type and reduction, which its answers carry.
    pub kind: OpKind,
    /// Its all-gather was exact (no mask): a late report needs no answer.
    pub exact: bool,
}

/// A failed op that still tells its peers so (a failing DONE) when their
/// PROBEs, BITMAPs or DATA for it arrive.
#[derive(Debug)]
pub(crate) struct Failed {
    /// Until when (the linger time after the failure).
    pub until: Instant,
    /// Why it failed, as the notice says.
    pub reason: FailReason,
    /// The op's element type and reduction, which the notice carries.
    pub kind: OpKind,
    /// The peers told so far and when last: at most one notice per peer per
    /// probe interval ([`History::notice_due`]).
    told: Vec<(u32, Instant)>,
}

impl Failed {
    /// Op failed for `reason`, remembered until `until`.
    pub(crate) fn new(until: Instant, reason: FailReason) -> Failed {
        Failed { until, reason, kind: Default::default(), told: Vec::new() }
    }
}

/// Bound on remembered finished op ids (older ones count as stale by age).
const FINISHED_CAP: usize = 1 << 16;

/// Bound on remembered failed ops (the oldest is forgotten first: its peers'
/// packets are then only stale, as before version 5).
const FAILED_CAP: usize = 1 << 12;

/// What one buffered datagram costs beyond its bytes (its `Vec`, the
/// allocator's header, its share of the map entry): the early buffer's cap
/// counts it, so many tiny datagrams cannot hold more memory than the cap.
pub(crate) const EARLY_OVERHEAD: usize = 64;

/// What a buffered datagram of `len` bytes counts against the cap.
fn cost(len: usize) -> usize {
    len + EARLY_OVERHEAD
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct History {
    lingering: BTreeMap<OpId, Linger>,
    /// `(until, id)` of every lingering op: the next to end first.
    linger_order: BTreeSet<(Instant, OpId)>,
    failed: BTreeMap<OpId, Failed>,
    /// `(until, id)` of every remembered failed op: the next to end first.
    failed_order: BTreeSet<(Instant, OpId)>,
    finished: VecDeque<(Instant, OpId)>,
    finished_set: HashSet<OpId>,
    early: BTreeMap<OpId, (Instant, Vec<Vec<u8>>)>,
    /// `(first buffered, id)` of every op with buffered datagrams.
    early_order: BTreeSet<(Instant, OpId)>,
    /// What the buffered datagrams count against the cap ([`EARLY_OVERHEAD`] each included).
    early_bytes: usize,
}

/// What became of a datagram offered to the early buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Early {
    /// Kept for when the op starts.
    Buffered,
    /// The buffer is full: dropped.
    Dropped,
}

impl History {
    /// Whether op `id` finished recently (or still lingers).
    pub(crate) fn knows(&self, id: &OpId) -> bool {
        self.finished_set.contains(id) || self.lingering.contains_key(id) || self.failed.contains_key(id)
    }

    /// Why op `id` failed here, while that is remembered.
    pub(crate) fn failure(&self, id: &OpId) -> Option<FailReason> {
        self.failed.get(id).map(|f| f.reason)
    }

    /// The kind of failed op `id`, if remembered.
    pub(crate) fn failed_kind(&self, id: &OpId) -> Option<OpKind> {
        self.failed.get(id).map(|f| f.kind)
    }

    /// Op `id` failed at `now`: remembered as `f` (bounded by
    /// [`FAILED_CAP`], the oldest forgotten first) and as finished.
    pub(crate) fn failed(&mut self, now: Instant, id: OpId, f: Failed) {
        self.failed_order.insert((f.until, id));
        if let Some(old) = self.failed.insert(id, f) {
            self.failed_order.remove(&(old.until, id));
        }
        while self.failed.len() > FAILED_CAP {
            let Some((_, old)) = self.failed_order.pop_first() else { break };
            self.failed.remove(&old);
        }
        self.finished(now, id);
    }

    /// Whether failed op `id` should tell `peer` so now: not if it is not
    /// remembered as failed, or told `peer` less than `interval` ago. If
    /// so, it counts as told at `now`.
    pub(crate) fn notice_due(&mut self, id: &OpId, peer: u32, now: Instant, interval: Duration) -> bool {
        let Some(f) = self.failed.get_mut(id) else { return false };
        match f.told.iter_mut().find(|(p, _)| *p == peer) {
            Some((_, at)) if now < *at + interval => false,
            Some((_, at)) => {
                *at = now;
                true
            }
            None => {
                f.told.push((peer, now));
                true
            }
        }
    }

    /// Whether op `id` is remembered as finished.
    pub(crate) fn is_finished(&self, id: &OpId) -> bool {
        self.finished_set.contains(id)
    }

    /// The lingering answers of completed op `id`.
    pub(crate) fn lingering(&self, id: &OpId) -> Option<&Linger> {
        self.lingering.get(id)
    }

    /// Op `id` completed at `now`: it lingers as `linger`.
    pub(crate) fn completed(&mut self, now: Instant, id: OpId, linger: Linger) {
        self.linger_order.insert((linger.until, id));
        if let Some(old) = self.lingering.insert(id, linger) {
            self.linger_order.remove(&(old.until, id));
        }
        self.finished(now, id);
    }

    /// Op `id` finished (completed or failed) at `now`.
    pub(crate) fn finished(&mut self, now: Instant, id: OpId) {
        if self.finished_set.insert(id) {
            self.finished.push_back((now, id));
        }
        while self.finished.len() > FINISHED_CAP {
            if let Some((_, old)) = self.finished.pop_front() {
                self.finished_set.remove(&old);
            }
        }
    }

    /// Keep a DATA datagram for op `id`, not started here yet, within `cap` bytes in all.
    pub(crate) fn buffer(&mut self, now: Instant, id: OpId, datagram: &[u8], cap: usize) -> Early {
        if self.early_bytes + cost(datagram.len()) > cap {
            return Early::Dropped;
        }
        self.early_bytes += cost(datagram.len());
        let order = &mut self.early_order;
        let entry = self.early.entry(id).or_insert_with(|| {
            order.insert((now, id));
            (now, Vec::new())
        });
        entry.1.push(datagram.to_vec());
        Early::Buffered
    }

    /// The datagrams buffered for op `id`, now starting: each leaves the
    /// buffer's count when [`History::replayed`] says so.
    pub(crate) fn take_early(&mut self, id: &OpId) -> Vec<Vec<u8>> {
        let Some((at, v)) = self.early.remove(id) else { return Vec::new() };
        self.early_order.remove(&(at, *id));
        v
    }

    /// A datagram of `len` bytes from [`History::take_early`] is being replayed.
    pub(crate) fn replayed(&mut self, len: usize) {
        self.early_bytes -= cost(len);
    }

    /// Drop every buffered datagram from rank `src` (it restarted).
    pub(crate) fn forget_early_from(&mut self, src: u32) {
        self.early.retain(|_, (_, v)| {
            v.retain(|d| wire::Packet::new_checked(&d[..]).map(|p| p.src() != src).unwrap_or(false));
            !v.is_empty()
        });
        self.early_bytes = self.early.values().flat_map(|(_, v)| v).map(|d| cost(d.len())).sum();
        self.early_order = self.early.iter().map(|(id, (at, _))| (*at, *id)).collect();
    }

    /// Age out at `now`: lingering and failed ops, finished ids older than
    /// `linger + hard_timeout`, and buffered datagrams older than `hard_timeout`.
    /// Returns how many buffered datagrams expired.
    pub(crate) fn expire(&mut self, now: Instant, linger: Duration, hard_timeout: Duration) -> u64 {
        while let Some(&(until, id)) = self.linger_order.first() {
            if until > now {
                break;
            }
            self.linger_order.pop_first();
            self.lingering.remove(&id);
        }
        while let Some(&(until, id)) = self.failed_order.first() {
            if until > now {
                break;
            }
            self.failed_order.pop_first();
            self.failed.remove(&id);
        }
        while let Some(&(at, id)) = self.finished.front() {
            if at + linger + hard_timeout > now {
                break;
            }
            self.finished.pop_front();
            self.finished_set.remove(&id);
        }
        let mut expired = 0;
        while let Some(&(at, id)) = self.early_order.first() {
            if at + hard_timeout > now {
                break;
            }
            self.early_order.pop_first();
            if let Some((_, v)) = self.early.remove(&id) {
                expired += v.len() as u64;
                self.early_bytes -= v.iter().map(|d| cost(d.len())).sum::<usize>();
            }
        }
        expired
    }

    /// When [`History::expire`] has something to do next. O(1): the
    /// endpoint asks on every turn of the event loop.
    pub(crate) fn next_timeout(&self, linger: Duration, hard_timeout: Duration) -> Option<Instant> {
        [
            self.linger_order.first().map(|&(until, _)| until),
            self.failed_order.first().map(|&(until, _)| until),
            self.finished.front().map(|(at, _)| *at + linger + hard_timeout),
            self.early_order.first().map(|&(at, _)| at + hard_timeout),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Bytes of buffered datagrams.
    pub(crate) fn early_bytes(&self) -> usize {
        self.early_bytes
    }

    /// Bytes of lingering and failed ops and finished ids (for the endpoint's footprint).
    pub(crate) fn bytes(&self) -> usize {
        self.lingering.values().map(|l| size_of::<Linger>() + l.mask.heap_bytes()).sum::<usize>()
            + self.failed.values().map(|f| size_of::<Failed>() + f.told.capacity() * 16).sum::<usize>()
            + self.failed_order.len() * size_of::<(Instant, OpId)>()
            + self.finished.capacity() * size_of::<(Instant, OpId)>()
            + self.finished_set.capacity() * size_of::<OpId>()
            + (self.linger_order.len() + self.early_order.len()) * size_of::<(Instant, OpId)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(seq: u64) -> OpId {
        OpId { run: 1, seq, tensor: 0 }
    }

    #[test]
    fn the_early_cap_counts_each_datagram_with_its_overhead() {
        let mut h = History::default();
        let t = Instant::ZERO;
        // A 4 KiB cap holds 4000 bytes of one datagram, but not 100 of 40-byte ones.
        let mut kept = 0;
        for i in 0..100 {
            kept += usize::from(h.buffer(t, id(i), &[0u8; 40], 4096) == Early::Buffered);
        }
        assert_eq!(kept, 4096 / cost(40));
        assert_eq!(h.early_bytes(), kept * cost(40));
        for i in 0..kept as u64 {
            for d in h.take_early(&id(i)) {
                h.replayed(d.len());
            }
        }
        assert_eq!(h.early_bytes(), 0);
    }

    #[test]
    fn failed_ops_notify_each_peer_once_per_interval_and_age_out() {
        let (mut h, t, ms) = (History::default(), Instant::ZERO, Duration::from_millis);
        h.failed(t, id(1), Failed::new(t + ms(50), FailReason::Timeout));
        assert!(h.knows(&id(1)) && h.is_finished(&id(1)));
        assert_eq!(h.failure(&id(1)), Some(FailReason::Timeout));
        assert!(!h.notice_due(&id(2), 1, t, ms(1)), "not failed here");
        assert!(h.notice_due(&id(1), 1, t, ms(1)));
        assert!(!h.notice_due(&id(1), 1, t + Duration::from_micros(999), ms(1)), "within the interval");
        assert!(h.notice_due(&id(1), 2, t, ms(1)), "another peer");
        assert!(h.notice_due(&id(1), 1, t + ms(1), ms(1)), "the interval passed");
        assert_eq!(h.next_timeout(ms(1000), ms(1000)), Some(t + ms(50)));
        h.expire(t + ms(50), ms(1000), ms(1000));
        assert_eq!(h.failure(&id(1)), None);
        assert!(h.is_finished(&id(1)), "still a finished id");
        // Bounded: the oldest failure is forgotten first.
        for i in 0..FAILED_CAP as u64 + 1 {
            h.failed(t, id(100 + i), Failed::new(t + ms(1000) + Duration::from_nanos(i), FailReason::Other));
        }
        assert_eq!((h.failed.len(), h.failure(&id(100))), (FAILED_CAP, None));
        assert_eq!(h.failure(&id(101)), Some(FailReason::Other));
    }

    #[test]
    fn expiry_follows_the_order_of_deadlines() {
        let (mut h, t, ms) = (History::default(), Instant::ZERO, Duration::from_millis);
        let linger = |until| Linger {
            until,
            own_chunks: 1,
            mask: Bitmap::new(1),
            kind: Default::default(),
            exact: false,
        };
        h.completed(t, id(1), linger(t + ms(30)));
        h.completed(t, id(2), linger(t + ms(10)));
        h.buffer(t + ms(5), id(7), &[1, 2, 3], 1 << 20);
        assert_eq!(h.next_timeout(ms(1000), ms(1000)), Some(t + ms(10)));
        assert_eq!(h.expire(t + ms(10), ms(1000), ms(1000)), 0);
        assert!(h.lingering(&id(2)).is_none() && h.lingering(&id(1)).is_some());
        assert_eq!(h.next_timeout(ms(1000), ms(20)), Some(t + ms(25)), "the early datagram, at 5 + 20 ms");
        assert_eq!(h.expire(t + ms(25), ms(1000), ms(20)), 1);
        assert_eq!((h.early_bytes(), h.next_timeout(ms(1000), ms(20))), (0, Some(t + ms(30))));
    }
}
