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
/// priority `class`, on `path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination rank.
    pub dst: u32,
    /// Datagram length.
    pub len: usize,
    /// Priority class (the simulated switch serves and drops by it).
    pub class: Class,
    /// The path to send it on, `0..paths` ([`crate::paths`]; always 0 with
    /// one path): a datapath sends it from source port `base + path`.
    pub path: u8,
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
    /// A COMPLETE bitmap of `n` chunks echoing `seq`, from a completed op
    /// (lingering) to an owner that probes its exact all-gather: both
    /// copies of the report were lost.
    Complete { n: u32, seq: u32 },
    /// A DONE (scatter: `seg` 0; gather: segment `seg` of the agreed mask).
    Done { seg: u32 },
    /// A heartbeat (and the incarnation handshake and run announcement).
    Hello,
    /// This daemon is shutting down.
    Goodbye,
    /// Flow control: the credit limit granted to the peer, or (`request`) a
    /// request for credit naming the DATA datagrams sent to it.
    Grant { request: bool },
    /// A failing DONE: this rank failed the op (wire version 5).
    Failed,
    /// An ACK of the exact all-gathers received whole from the peer
    /// (version 10): the entries are taken from `Shared::acks` as it is
    /// written, so a second queued ACK with nothing left is not sent.
    Ack,
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

/// The transmit queues: one per class, and one for repairs; and per peer,
/// the DATA items parked while that peer gives no credit ([`crate::flow`]).
#[derive(Debug, Default)]
pub(crate) struct TxQueues {
    queues: [VecDeque<TxItem>; 9],
    /// Per peer rank, per queue, in the order they were parked.
    parked: Vec<Parked>,
    parked_len: usize,
    /// Per peer rank: DATA items queued or parked for it.
    data_for: Vec<u32>,
}

/// DATA items parked for one peer, by the queue they came from: credit
/// releases them in the queues' service order (repairs, then classes high
/// to low), not in the order they were parked. Released in park order, a
/// repair parked behind an op's whole first pass waited for all of it: a
/// rank an op ahead had parked its next op's first pass (thousands of
/// datagrams) when the repair its peer waited for in the op before came,
/// and the peer's credit, given for that repair, went to the first pass a
/// datagram at a time (2 ranks, 10% loss, back-to-back ops: an op of 20 ms
/// stalled for 3 s, `flow_sim`'s lagging-rank test).
#[derive(Debug, Default)]
struct Parked {
    queues: [VecDeque<TxItem>; 9],
}

impl Parked {
    fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }
}

/// The queue a DATA item belongs in.
fn data_queue(item: &TxItem) -> usize {
    match item.kind {
        TxKind::Data { repair: true, .. } => REPAIR_QUEUE,
        TxKind::Data { class, .. } => class.index(),
        _ => Class::CONTROL.index(),
    }
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
        let peer = item.peer as usize;
        if self.data_for.len() <= peer {
            self.data_for.resize(peer + 1, 0);
        }
        self.data_for[peer] += 1;
        self.queues[data_queue(&item)].push_back(item);
    }

    /// DATA items queued or parked for `peer`.
    pub(crate) fn data_for(&self, peer: u32) -> u32 {
        self.data_for.get(peer as usize).copied().unwrap_or(0)
    }

    /// A DATA item for `peer` left the queues.
    fn data_gone(&mut self, peer: u32, n: usize) {
        if let Some(c) = self.data_for.get_mut(peer as usize) {
            *c = c.saturating_sub(n as u32);
        }
    }

    /// Move the front item of queue `qi` (DATA for a peer out of credit) to
    /// its peer's parked items.
    pub(crate) fn park(&mut self, qi: usize) {
        let Some(item) = self.queues[qi].pop_front() else { return };
        let peer = item.peer as usize;
        if self.parked.len() <= peer {
            self.parked.resize_with(peer + 1, Parked::default);
        }
        let p = &mut self.parked[peer];
        p.queues[qi].push_back(item);
        self.parked_len += 1;
    }

    /// `peer` gave credit for `n` more datagrams: its first `n` parked items
    /// in service order (repairs, then classes high to low; within a queue,
    /// in the order they were parked) go back to the front of their queues,
    /// ahead of anything queued since; the rest stay parked, so a grant
    /// costs work in proportion to the credit it gives.
    pub(crate) fn unpark(&mut self, peer: u32, n: usize) {
        let Some(p) = self.parked.get_mut(peer as usize) else { return };
        let mut left = n.min(p.len());
        self.parked_len -= left;
        for qi in SERVICE_ORDER {
            if left == 0 {
                break;
            }
            let k = left.min(p.queues[qi].len());
            left -= k;
            for item in p.queues[qi].drain(..k).rev() {
                self.queues[qi].push_front(item);
            }
        }
    }

    /// Items parked for `peer`.
    pub(crate) fn parked(&self, peer: u32) -> usize {
        self.parked.get(peer as usize).map_or(0, Parked::len)
    }

    /// Take out `peer`'s parked items that `keep` rejects (ops that ended):
    /// returned, for the caller's bookkeeping.
    pub(crate) fn drain_parked(&mut self, peer: u32, mut keep: impl FnMut(&TxItem) -> bool) -> Vec<TxItem> {
        let Some(p) = self.parked.get_mut(peer as usize) else { return Vec::new() };
        let mut gone = Vec::new();
        for q in &mut p.queues {
            q.retain(|i| {
                keep(i) || {
                    gone.push(*i);
                    false
                }
            });
        }
        self.parked_len -= gone.len();
        self.data_gone(peer, gone.len());
        gone
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
    ///
    /// In rank order starting after this rank, as the first pass of a
    /// transfer goes: every rank starts its rounds at about the same times
    /// (at start, then every heartbeat), and were they all to go to rank 0
    /// first, rank 1 next, each switch port would take a HELLO from every
    /// rank at once and its queue would drop the same senders' every round
    /// (above about 300 ranks with 256-packet queues, the ranks never
    /// agreed on a run). Rotated, each port receives one rank's HELLO at a
    /// time.
    pub(crate) fn push_hellos(&mut self, world: u32, me: u32) {
        for k in 1..world {
            self.push_phaseless((me + k) % world, TxKind::Hello);
        }
    }

    /// Queue a packet about no op (HELLO, GRANT, GOODBYE) to `peer`.
    pub(crate) fn push_phaseless(&mut self, peer: u32, kind: TxKind) {
        let op = OpKey::outside(OpId { run: 0, seq: 0, tensor: 0 });
        self.push(TxItem { op, phase: Phase::None, peer, kind });
    }

    /// The next item to serve and its queue.
    pub(crate) fn front(&self) -> Option<(usize, TxItem)> {
        let qi = SERVICE_ORDER.into_iter().find(|&i| !self.queues[i].is_empty())?;
        Some((qi, *self.queues[qi].front()?))
    }

    /// Drop the front item of queue `qi`.
    pub(crate) fn pop(&mut self, qi: usize) {
        if let Some(item) = self.queues[qi].pop_front()
            && matches!(item.kind, TxKind::Data { .. })
        {
            self.data_gone(item.peer, 1);
        }
    }

    /// Items queued, parked ones included.
    pub(crate) fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum::<usize>() + self.parked_len
    }

    /// Whether nothing is ready to send (parked items wait for credit, not
    /// for the pacer).
    pub(crate) fn is_empty(&self) -> bool {
        self.queues.iter().all(VecDeque::is_empty)
    }

    /// Bytes the queues hold (for the endpoint's footprint).
    pub(crate) fn bytes(&self) -> usize {
        let parked: usize = self
            .parked
            .iter()
            .map(|p| {
                size_of::<Parked>()
                    + p.queues.iter().map(|q| q.capacity() * size_of::<TxItem>()).sum::<usize>()
            })
            .sum();
        self.queues.iter().map(|q| q.capacity() * size_of::<TxItem>()).sum::<usize>()
            + parked
            + self.data_for.capacity() * 4
    }
}
