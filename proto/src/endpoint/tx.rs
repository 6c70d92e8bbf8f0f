//! What the endpoint has to send: per-class queues of packet requests, and
//! the [`Transmit`] that [`super::Endpoint::poll_transmit`] returns.
//!
//! A queued [`TxItem`] names a packet (which transfer, which kind); its bytes
//! are written only when it is sent, from the transfer's state at that time,
//! so a queued chunk that is no longer wanted costs nothing, and a queued
//! BITMAP says what arrived by the time it leaves.

use std::collections::VecDeque;

use crate::bitmap::Bitmap;
use crate::class::Class;
use crate::endpoint::api::{OpId, OpKey};
use crate::transfer::{PROBE_COPIES, mask_segments};
use crate::wire::Phase;

/// One datagram an endpoint wants to send: `len` bytes written into the
/// buffer passed to [`super::Endpoint::poll_transmit`], to rank `dst`, with
/// priority `class`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination rank.
    pub dst: u32,
    /// Datagram length.
    pub len: usize,
    /// Priority class (the simulated switch serves and drops by it).
    pub class: Class,
}

/// The kind of a queued packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxKind {
    /// A chunk, first pass or repair.
    Data { chunk: u32, repair: bool, class: Class },
    /// A PROBE of a send transfer.
    Probe,
    /// Segment `seg` of a receive transfer's bitmap.
    Bitmap { seg: u32 },
    /// A DONE (scatter: `seg` 0; gather: segment `seg` of the agreed mask).
    Done { seg: u32 },
    /// A heartbeat.
    Hello,
}

/// A queued packet: of `kind`, for the transfer of op `op` in `phase` with `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TxItem {
    pub op: OpKey,
    pub phase: Phase,
    pub peer: u32,
    pub kind: TxKind,
}

/// Index of the repair queue (after the 8 class queues).
const REPAIR_QUEUE: usize = Class::COUNT;
/// Service order of the transmit queues: control, repairs, then data classes high to low.
const SERVICE_ORDER: [usize; 9] = [7, REPAIR_QUEUE, 6, 5, 4, 3, 2, 1, 0];

/// The transmit queues: one per class, and one for repairs.
#[derive(Debug, Default)]
pub(crate) struct TxQueues {
    queues: [VecDeque<TxItem>; 9],
}

impl TxQueues {
    /// Queue a control packet (class 7).
    pub(crate) fn push(&mut self, item: TxItem) {
        debug_assert!(!matches!(item.kind, TxKind::Data { .. }));
        self.queues[Class::CONTROL.index()].push_back(item);
    }

    /// Queue a DATA item: repairs in the repair queue (served right after
    /// control: another rank is blocked on them), first-pass chunks by class.
    pub(crate) fn push_data(&mut self, item: TxItem) {
        let q = match item.kind {
            TxKind::Data { repair: true, .. } => REPAIR_QUEUE,
            TxKind::Data { class, .. } => class.index(),
            _ => Class::CONTROL.index(),
        };
        self.queues[q].push_back(item);
    }

    /// Queue the [`PROBE_COPIES`] copies of a PROBE.
    pub(crate) fn push_probes(&mut self, op: OpKey, phase: Phase, peer: u32) {
        for _ in 0..PROBE_COPIES {
            self.push(TxItem { op, phase, peer, kind: TxKind::Probe });
        }
    }

    /// Queue `segs` BITMAP segments.
    pub(crate) fn push_bitmaps(&mut self, op: OpKey, phase: Phase, peer: u32, segs: u32) {
        for seg in 0..segs {
            self.push(TxItem { op, phase, peer, kind: TxKind::Bitmap { seg } });
        }
    }

    /// Queue the DONE segments announcing the agreed gather `mask` to `peer`.
    pub(crate) fn push_mask(&mut self, op: OpKey, peer: u32, mask: &Bitmap, seg_bytes: usize) {
        for seg in 0..mask_segments(mask, seg_bytes) {
            self.push(TxItem { op, phase: Phase::Gather, peer, kind: TxKind::Done { seg } });
        }
    }

    /// Queue a HELLO to every rank of `world` but `me`.
    pub(crate) fn push_hellos(&mut self, world: u32, me: u32) {
        for peer in (0..world).filter(|&j| j != me) {
            let op = OpKey::outside(OpId { seq: 0, tensor: 0 });
            self.push(TxItem { op, phase: Phase::None, peer, kind: TxKind::Hello });
        }
    }

    /// The next item to serve and its queue.
    pub(crate) fn front(&self) -> Option<(usize, TxItem)> {
        let qi = SERVICE_ORDER.into_iter().find(|&i| !self.queues[i].is_empty())?;
        Some((qi, *self.queues[qi].front()?))
    }

    /// Drop the front item of queue `qi`.
    pub(crate) fn pop(&mut self, qi: usize) {
        self.queues[qi].pop_front();
    }

    /// Items queued.
    pub(crate) fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    /// Whether nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.queues.iter().all(VecDeque::is_empty)
    }

    /// Bytes the queues hold (for the endpoint's footprint).
    pub(crate) fn bytes(&self) -> usize {
        self.queues.iter().map(|q| q.capacity() * size_of::<TxItem>()).sum()
    }
}
