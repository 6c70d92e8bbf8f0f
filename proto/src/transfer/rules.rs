//! What both sides of a transfer agree on: the loss budget and which
//! chunks to repair, who decides ([`Mode`]), the retry timing ([`Retry`]),
//! and the wire form of bitmaps, masks and DONE.

use crate::bitmap::Bitmap;
use crate::class::{Class, ClassSet};
use crate::time::Duration;
use crate::wire::{self, Flags, Header, PacketType};

/// The largest loss budget any transfer may have (10%), in ppm.
pub const MAX_BUDGET_PPM: u32 = 100_000;

/// Copies of every PROBE a sender transmits (same sequence number; receivers
/// act on the first and count the rest). A PROBE is ~100 bytes per transfer
/// of up to thousands of chunks, and losing it costs a full probe timeout (or
/// a receive deadline): with independent loss `p` a second copy turns the
/// chance of that tail from `p` into `p²`.
pub const PROBE_COPIES: usize = 2;

/// Largest exponent of the probe, nudge and deadline retry backoff (2^3 = 8×):
/// control packets are tiny, and under heavy random loss an unbounded backoff
/// turns a few consecutive losses into a long stall.
pub(crate) const MAX_BACKOFF: u32 = 3;

/// Number of chunks that may be missing from `n` under `budget_ppm`.
pub fn allowed_missing(n: u32, budget_ppm: u32) -> u32 {
    (u64::from(n) * u64::from(budget_ppm.min(wire::PPM)) / u64::from(wire::PPM)) as u32
}

/// Choose which missing chunks to repair: every missing *required* chunk, then
/// missing droppable chunks by decreasing class (ties: lower index first) until
/// at most `allowed` remain missing. Returns them in that order. Pure.
pub fn select_repairs(
    missing: impl IntoIterator<Item = u32>,
    class_of: impl Fn(u32) -> Class,
    droppable: ClassSet,
    allowed: u32,
) -> Vec<u32> {
    let mut required = Vec::new();
    let mut optional = Vec::new();
    for c in missing {
        if droppable.contains(class_of(c)) { optional.push(c) } else { required.push(c) }
    }
    let excess = (optional.len() as u64).saturating_sub(u64::from(allowed)) as usize;
    optional.sort_by(|&a, &b| class_of(b).cmp(&class_of(a)).then(a.cmp(&b)));
    required.extend_from_slice(&optional[..excess]);
    required
}

/// Who decides how a transfer ends: the one difference between the phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Reduce-scatter: the sender repairs to its receiver's bitmap alone, and
    /// the receiver closes once it is within budget and answers DONE.
    Own,
    /// All-gather: replicas must not diverge, so the owner decides for every
    /// receiver of its shard at once. The sender hands each complete bitmap
    /// to that joint decision, and the receiver closes only on the owner's
    /// DONE carrying the agreed mask.
    Agreed,
}

/// Retry timing: the probe retransmission timeout and the configured bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Retry {
    /// The RTT-based probe timeout.
    pub rto: Duration,
    /// Upper bound of the probe timer.
    pub probe_max: Duration,
    /// Lower bound of the receive deadline (also its re-arm interval).
    pub deadline_min: Duration,
    /// Upper bound of the receive deadline.
    pub deadline_max: Duration,
    /// How long after a transfer's latest chunk a receiver still takes the
    /// chunks its sender sent and it has not seen for on their way, rather
    /// than NACKing them (its quiet timer, or the grace after a PROBE or
    /// LAST): twice the longest pause the sender was seen to come back from
    /// (`Flow::pause`), where the network lost next to nothing lately, else 0.
    pub hold: Duration,
}

impl Retry {
    /// The probe (or nudge) timeout after `k` fruitless rounds: `rto · 2^k`
    /// (`k` capped), at most `max(probe_max, rto)`.
    pub(crate) fn backoff(&self, k: u32) -> Duration {
        self.rto.saturating_mul(1 << k.min(MAX_BACKOFF)).min(self.probe_max.max(self.rto))
    }

    pub(crate) fn deadline_cap(&self) -> Duration {
        self.deadline_max.max(self.deadline_min)
    }

    /// The idle gap a deadline waits for: longer than a probe retry, so it
    /// fires only for a sender that has gone quiet, not for one lost PROBE.
    pub(crate) fn gap(&self) -> Duration {
        self.deadline_min.max(self.rto.saturating_mul(2)).min(self.deadline_cap())
    }

    /// How long a fired deadline waits before firing again, after `k` firings.
    pub(crate) fn deadline_retry(&self, k: u32) -> Duration {
        self.deadline_min.max(self.rto).saturating_mul(1 << k.min(MAX_BACKOFF)).min(self.deadline_cap())
    }
}

/// Why a packet was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// It does not fit the transfer (chunk count, index, length).
    Mismatch,
    /// It arrived after the transfer closed.
    Late,
    /// The chunk had already arrived.
    Duplicate,
    /// A redundant copy of a PROBE already acted on.
    DuplicateProbe,
}

pub(crate) fn set_all(b: &mut Bitmap) {
    for i in 0..b.len() {
        b.set(i);
    }
}

/// The bits of `map` in BITMAP/DONE segment `seg` of `seg_bytes` bytes,
/// written as the payload after the header in `buf`.
pub(crate) fn write_segment(h: &mut Header, map: &Bitmap, seg: u32, seg_bytes: usize, buf: &mut [u8]) {
    let (first, len) = map.write_segment(seg, seg_bytes, &mut buf[wire::HEADER_LEN..]);
    h.chunk_index = first;
    h.payload_len = len as u16;
}

/// DONE segments that carry `mask` (one when it is empty).
pub(crate) fn mask_segments(mask: &Bitmap, seg_bytes: usize) -> u32 {
    if mask.count_ones() == 0 { 1 } else { Bitmap::segment_count(mask.len(), seg_bytes) }
}

/// Fill an all-gather DONE: segment `seg` of the agreed `mask` (`None` past
/// its last segment).
pub(crate) fn fill_mask(
    h: &mut Header,
    mask: &Bitmap,
    seg: u32,
    seg_bytes: usize,
    buf: &mut [u8],
) -> Option<()> {
    h.ty = PacketType::Done;
    h.chunk_count = mask.len();
    if mask.count_ones() == 0 {
        if seg != 0 {
            return None;
        }
        h.flags = Flags::MASK_EMPTY;
    } else {
        write_segment(h, mask, seg, seg_bytes, buf);
    }
    Some(())
}

/// Fill a reduce-scatter DONE: the receiver closed the transfer of `n`
/// chunks; `seq` answers the PROBE round.
pub(crate) fn fill_done(h: &mut Header, n: u32, seq: u32) {
    h.ty = PacketType::Done;
    h.chunk_count = n;
    h.seq = seq;
    h.flags = Flags::MASK_EMPTY;
}
