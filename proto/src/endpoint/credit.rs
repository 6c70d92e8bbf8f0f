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
    pub(super) fn flow_received(&mut self, h: &Header, payload: &[u8]) {
        match h.ty {
            PacketType::Data => {
                let due = self.sh.flow.on_data(h.src, h.seq, h.flags.contains(Flags::BACKLOG));
                self.sh.stats.flow_window_cuts = self.sh.flow.cuts;
                if due {
                    self.queue_grant(h.src);
                }
            }
            PacketType::Grant => {
                let Some(count) = wire::parse_grant(payload) else { return };
                if h.flags.contains(Flags::REQUEST) {
                    self.sh.stats.flow_requests_received += 1;
                    if self.sh.flow.enabled() {
                        self.sh.flow.on_request(h.src, count);
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
        let due: Vec<u32> = self.sh.flow.requests_due(now).collect();
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
}

/// A queued GRANT (or credit request) to `peer`.
fn grant_item(peer: u32, request: bool) -> TxItem {
    TxItem {
        op: OpKey::outside(OpId { run: 0, seq: 0, tensor: 0 }),
        phase: Phase::None,
        peer,
        kind: TxKind::Grant { request },
    }
}
