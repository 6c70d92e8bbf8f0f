//! The endpoint's side of flow control ([`crate::flow`]): DATA for a peer
//! out of credit is parked, GRANTs and credit requests are queued, received
//! and answered, and a blocked sender's request timer is served.

use crate::endpoint::Endpoint;
use crate::endpoint::api::{OpId, OpKey};
use crate::endpoint::tx::{TxItem, TxKind};
use crate::time::Instant;
use crate::wire::{self, Flags, Header, PacketType, Phase};

impl Endpoint {
    /// The front DATA item of queue `qi` is for a peer out of credit: park
    /// it until a GRANT comes, and make sure the credit request timer runs.
    pub(super) fn park(&mut self, qi: usize, peer: u32, now: Instant) {
        self.sh.tx.park(qi);
        let probe_max = self.sh.cfg.timers.probe_max;
        if self.sh.flow.blocked(peer, now, self.sh.rtt.timeout(), probe_max) {
            self.sh.stats.flow_credit_waits += 1;
        }
    }

    /// A DATA item for `peer` left the queues unsent (no longer wanted): the
    /// credit it would have used goes to the next parked item, if any.
    pub(super) fn credit_unused(&mut self, peer: u32) {
        if self.sh.tx.parked(peer) > 0 {
            self.unpark(peer);
        }
    }

    /// Release as many of `peer`'s parked items as its credit allows; while
    /// some stay parked, the credit request timer runs (the GRANT that would
    /// release them may be lost, or the datagrams that would earn it).
    fn unpark(&mut self, peer: u32) {
        self.sh.tx.unpark(peer, self.sh.flow.credit(peer));
        if self.sh.tx.parked(peer) > 0 {
            let probe_max = self.sh.cfg.timers.probe_max;
            self.sh.flow.blocked(peer, self.now, self.sh.rtt.timeout(), probe_max);
        }
    }

    /// Whether more DATA waits for `peer` than its credit covers (the DATA
    /// datagram being sent says so with BACKLOG).
    pub(super) fn backlogged(&self, peer: u32) -> bool {
        self.sh.flow.enabled() && self.sh.tx.data_for(peer) as usize > self.sh.flow.credit(peer)
    }

    /// The `dseq` of the next DATA datagram to `peer`.
    pub(super) fn take_dseq(&mut self, peer: u32) -> u32 {
        self.sh.flow.take_dseq(peer)
    }

    /// Whether DATA may go to `peer` now.
    pub(super) fn may_send(&self, peer: u32) -> bool {
        self.sh.flow.may_send(peer)
    }

    /// Flow control's part of an authenticated datagram from a current peer
    /// (not a replayed early one): DATA moves the receive window, GRANTs
    /// give credit, requests are answered.
    pub(super) fn flow_received(&mut self, now: Instant, h: &Header, payload: &[u8]) {
        // Every packet but HELLO and GOODBYE may carry credit (version 9); a
        // GRANT's is its payload's, read below.
        if h.ty != PacketType::Grant && self.sh.flow.on_credit(h.src, h.credit) {
            self.sh.stats.flow_credit_piggybacked += 1;
            self.unpark(h.src);
        }
        match h.ty {
            PacketType::Data => {
                self.sh.flow.note_data(h.src, h.seq, now);
                self.sh.stats.flow_window_cuts = self.sh.flow.cuts;
                // Whether a GRANT is due is decided once the op took the
                // chunk in (`grant_after_data`): what this rank wants next
                // depends on it.
                self.sh.grant_check = Some((h.src, h.flags.contains(Flags::BACKLOG)));
            }
            PacketType::Grant => {
                let Some(count) = wire::parse_grant(payload) else { return };
                if h.flags.contains(Flags::REQUEST) {
                    self.sh.stats.flow_requests_received += 1;
                    if self.sh.flow.enabled() {
                        let want = self.wants(h.src, false);
                        self.sh.flow.on_request(h.src, count, want);
                        self.queue_grant(h.src);
                    }
                } else {
                    self.sh.stats.flow_grants_received += 1;
                    if self.sh.flow.on_grant(h.src, count) {
                        self.unpark(h.src);
                    }
                }
            }
            _ => {}
        }
    }

    /// After a DATA datagram from a current peer was handled: queue a GRANT
    /// to it if one is due. While DATA of this rank's for it is queued and
    /// sendable, that DATA carries the credit a little later, so the sender's
    /// BACKLOG is not heeded: the GRANT goes only when the sender is down to
    /// a quarter of its window, as without BACKLOG.
    ///
    /// In a collective every pair sends each other DATA, so the piggyback
    /// nearly always comes: 64 ranks, 1 MB, clean: 0.41 GRANTs per peer and
    /// op before, 0.05 now, the op time the same. Not sending the GRANT at
    /// all there (0.01) made 64 ranks × 64 MB take 1.46× as long (167 ms
    /// against 114): behind a deep queue the piggyback came too late.
    pub(super) fn grant_after_data(&mut self) {
        self.release_credit();
        let Some((src, backlog)) = self.sh.grant_check.take() else { return };
        let backlog = backlog && !self.carries_credit_soon(src);
        let want = self.wants(src, false);
        if self.sh.flow.grant_due(src, backlog, want) {
            self.queue_grant(src);
        }
    }

    /// Whether DATA of this rank's for `peer` is queued and may go now: it
    /// carries the credit `peer` needs, a little later.
    fn carries_credit_soon(&self, peer: u32) -> bool {
        self.sh.tx.data_for(peer) > 0 && self.may_send(peer)
    }

    /// An op reduced: it now wants the all-gather DATA it held back
    /// ([`Endpoint::wants`]). Every peer short of that credit hears of it
    /// from the next DATA this rank sends it, or, where none can go now, in
    /// a GRANT (two ranks that held each other would otherwise wait for a
    /// credit request).
    pub(super) fn release_credit(&mut self) {
        if !std::mem::take(&mut self.sh.want_grew) || !self.sh.flow.enabled() {
            return;
        }
        let (world, me) = (self.sh.cfg.world, self.sh.me());
        for peer in (0..world).filter(|&p| p != me) {
            let want = self.wants(peer, false);
            let sendable = self.carries_credit_soon(peer);
            if self.sh.flow.short_of(peer, want) && !sendable {
                self.queue_grant(peer);
            }
        }
    }

    /// Queue a GRANT to `peer` unless one is queued (it carries the limit
    /// as of when it is sent).
    fn queue_grant(&mut self, peer: u32) {
        if self.sh.flow.mark_grant_queued(peer) {
            self.sh.tx.push(grant_item(peer, false));
        }
    }

    /// `peer` restarted: both directions of flow control start over, and
    /// DATA parked for it is released (its ops failed; the items are dropped
    /// as no longer wanted when they reach the front).
    pub(super) fn flow_reset(&mut self, peer: u32) {
        self.sh.flow.reset(peer);
        self.sh.tx.unpark(peer, usize::MAX);
    }

    /// Serve the credit request timers due at `now`: a peer whose parked
    /// DATA is all for ops that ended needs no credit any more; to the
    /// others a request goes out, and the next one backs off.
    pub(super) fn flow_timeouts(&mut self, now: Instant) {
        let due = self.sh.flow.requests_due(now);
        for peer in due {
            let ops = &self.ops;
            let gone = self.sh.tx.drain_parked(peer, |item| {
                let TxKind::Data { chunk, .. } = item.kind else { return false };
                ops.by_key(item.op)
                    .and_then(|op| op.transfers().sender(item.phase, peer))
                    .is_some_and(|s| s.wants(chunk))
            });
            for item in gone {
                self.dequeued(now, item);
            }
            self.sh.flow.request_sent(peer);
            if self.sh.tx.parked(peer) == 0 {
                continue;
            }
            self.sh.tx.push(grant_item(peer, true));
            let probe_max = self.sh.cfg.timers.probe_max;
            self.sh.flow.blocked(peer, now, self.sh.rtt.timeout(), probe_max);
        }
    }

    /// Fill the header of a GRANT (or credit request) to `peer`; the count
    /// its payload carries.
    pub(super) fn fill_grant(&mut self, h: &mut Header, peer: u32, request: bool) -> u64 {
        h.ty = PacketType::Grant;
        h.phase = Phase::None;
        h.op = 0;
        h.tensor = 0;
        h.payload_len = wire::GRANT_LEN as u16;
        if request {
            h.flags = Flags::REQUEST;
            self.sh.stats.flow_requests_sent += 1;
            self.sh.flow.sent(peer)
        } else {
            self.sh.stats.flow_grants_sent += 1;
            self.sh.flow.take_grant(peer)
        }
    }

    /// The credit a packet to `peer` carries (version 9; see [`crate::flow`]).
    pub(super) fn credit_for(&mut self, peer: u32) -> u32 {
        let want = self.wants(peer, true);
        self.sh.flow.piggyback(peer, want)
    }

    /// How many more DATA datagrams this rank wants from `peer` now
    /// ([`crate::flow`]), `piggyback`ed on a packet to it or in a GRANT: the
    /// chunks its ops still wait for from `peer` and, unless an op here
    /// still waits for reduce-scatter DATA, an unscheduled window for
    /// `peer`'s next op. Before this rank's reduce, an op wants only
    /// `peer`'s reduce-scatter chunks: `peer`'s all-gather DATA outranks
    /// reduce-scatter DATA at this rank's switch port, and a burst of it from
    /// every owner done early would starve the last reduce-scatter chunks
    /// this rank still waits for (64 ranks, 1 MB: the op took 2.7 ms
    /// instead of 1.9). A piggybacked credit then allows one datagram more,
    /// once: two ranks that hold each other would otherwise have no DATA
    /// left to carry either's credit when both reduced (each side's DATA
    /// carries the other's); a GRANT does not (it would let every owner
    /// trickle its all-gather in at one datagram per round trip).
    fn wants(&self, peer: u32, piggyback: bool) -> u64 {
        let (mut holding, mut want) = (false, 0u64);
        // With few peers nothing is held (see `HOLD_MIN_WORLD`).
        let hold_max = if self.sh.cfg.world < HOLD_MIN_WORLD { 0 } else { self.sh.flow.per_sender_limit() };
        for op in self.ops.values() {
            let (hold, k) = op.wants_from(peer, hold_max);
            holding |= hold;
            want += u64::from(k);
        }
        match (holding, piggyback) {
            (true, true) => want + 1,
            (true, false) => want,
            (false, _) => want + self.sh.flow.unscheduled_left(peer),
        }
    }
}

/// The least world in which a rank holds its peers' all-gather back before
/// its reduce ([`crate::endpoint::allreduce`]'s `wants_from`). Measured in
/// `dlcpd simulate` (1 MB, clean): holding takes 1.88 instead of 2.67 ms at
/// 64 ranks, 1.75 instead of 2.53 at 16, 1.72 instead of 2.37 at 8, but 1.52
/// instead of 1.38 at 4, where three owners' all-gathers are the whole of
/// a port's traffic and holding them idles it.
pub(crate) const HOLD_MIN_WORLD: u32 = 8;

/// A queued GRANT (or credit request) to `peer`.
fn grant_item(peer: u32, request: bool) -> TxItem {
    TxItem {
        op: OpKey::outside(OpId { run: 0, seq: 0, tensor: 0 }),
        phase: Phase::None,
        peer,
        kind: TxKind::Grant { request },
    }
}
