//! What the endpoint knows about ops that are not in flight: the ids of
//! finished ops (a late packet of one is stale, and its id cannot be started
//! again), completed ops that still answer late PROBEs and BITMAPs for a
//! while ([`Linger`]), and datagrams that arrived for ops this rank has not
//! started yet (bounded, replayed when it starts them).

use std::collections::{BTreeMap, HashSet, VecDeque};

use crate::bitmap::Bitmap;
use crate::endpoint::api::OpId;
use crate::time::{Duration, Instant};
use crate::wire;

/// A completed op that still answers late PROBEs and BITMAPs.
#[derive(Debug)]
pub(crate) struct Linger {
    /// Until when.
    pub until: Instant,
    /// Chunks of this rank's shard (a reduce-scatter DONE names them).
    pub own_chunks: u32,
    /// The agreed mask of this rank's shard (an all-gather DONE carries it).
    pub mask: Bitmap,
}

/// Bound on remembered finished op ids (older ones count as stale by age).
const FINISHED_CAP: usize = 1 << 16;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct History {
    lingering: BTreeMap<OpId, Linger>,
    finished: VecDeque<(Instant, OpId)>,
    finished_set: HashSet<OpId>,
    early: BTreeMap<OpId, (Instant, Vec<Vec<u8>>)>,
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
        self.finished_set.contains(id) || self.lingering.contains_key(id)
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
        self.lingering.insert(id, linger);
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
        if self.early_bytes + datagram.len() > cap {
            return Early::Dropped;
        }
        self.early_bytes += datagram.len();
        self.early.entry(id).or_insert_with(|| (now, Vec::new())).1.push(datagram.to_vec());
        Early::Buffered
    }

    /// The datagrams buffered for op `id`, now starting: each leaves the
    /// buffer's count when [`History::replayed`] says so.
    pub(crate) fn take_early(&mut self, id: &OpId) -> Vec<Vec<u8>> {
        self.early.remove(id).map(|(_, v)| v).unwrap_or_default()
    }

    /// A datagram of `len` bytes from [`History::take_early`] is being replayed.
    pub(crate) fn replayed(&mut self, len: usize) {
        self.early_bytes -= len;
    }

    /// Drop every buffered datagram from rank `src` (it restarted).
    pub(crate) fn forget_early_from(&mut self, src: u32) {
        self.early.retain(|_, (_, v)| {
            v.retain(|d| wire::Packet::new_checked(&d[..]).map(|p| p.src() != src).unwrap_or(false));
            !v.is_empty()
        });
        self.early_bytes = self.early.values().flat_map(|(_, v)| v).map(Vec::len).sum();
    }

    /// Age out at `now`: lingering ops, finished ids older than `linger +
    /// hard_timeout`, and buffered datagrams older than `hard_timeout`.
    /// Returns how many buffered datagrams expired.
    pub(crate) fn expire(&mut self, now: Instant, linger: Duration, hard_timeout: Duration) -> u64 {
        self.lingering.retain(|_, l| l.until > now);
        while let Some(&(at, id)) = self.finished.front() {
            if at + linger + hard_timeout > now {
                break;
            }
            self.finished.pop_front();
            self.finished_set.remove(&id);
        }
        let before = self.early.len();
        let mut expired_bytes = 0;
        let mut expired = 0;
        self.early.retain(|_, (at, v)| {
            let keep = *at + hard_timeout > now;
            if !keep {
                expired += v.len() as u64;
                expired_bytes += v.iter().map(Vec::len).sum::<usize>();
            }
            keep
        });
        if self.early.len() != before {
            self.early_bytes -= expired_bytes;
        }
        expired
    }

    /// When [`History::expire`] has something to do next.
    pub(crate) fn next_timeout(&self, linger: Duration, hard_timeout: Duration) -> Option<Instant> {
        [
            self.lingering.values().map(|l| l.until).min(),
            self.finished.front().map(|(at, _)| *at + linger + hard_timeout),
            self.early.values().map(|(at, _)| *at + hard_timeout).min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Bytes of buffered datagrams.
    pub(crate) fn early_bytes(&self) -> usize {
        self.early_bytes
    }

    /// Bytes of lingering ops and finished ids (for the endpoint's footprint).
    pub(crate) fn bytes(&self) -> usize {
        self.lingering.values().map(|l| size_of::<Linger>() + l.mask.heap_bytes()).sum::<usize>()
            + self.finished.capacity() * size_of::<(Instant, OpId)>()
            + self.finished_set.capacity() * size_of::<OpId>()
    }
}
