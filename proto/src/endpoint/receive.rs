//! The receive side's entry points: a datagram from the datapath is checked
//! against its claimed sender (`source_ok`), its tag and version
//! (`handle_datagram_impl`), its job, rank, settings and session
//! (`handle_authenticated`), then handed to flow control and to its op, its
//! lingering history, or the early buffer. Every rejection is counted by
//! reason and, when it discards the datagram, by class and peer.

use super::*;

impl Endpoint {
    /// Process one received datagram. Never panics; every rejection is counted.
    /// A rejected datagram is attributed to the sender its header claims (see
    /// [`Endpoint::handle_datagram_from`] when the caller knows better).
    pub fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        self.handle_datagram_from(now, datagram, wire::peek_src(datagram));
    }

    /// Process one received datagram that came from peer rank `from` as far as
    /// the caller knows (its source address is that peer's configured address),
    /// or from no configured peer (`None`). A datagram whose header claims
    /// another sender rank of this world is rejected before its tag is checked
    /// (`wrong_source`, or `unknown_source` when `from` is `None`): a peer must
    /// send from its configured address, and the MAC proves the rest. Never
    /// panics; every rejection is counted by reason ([`Stats::rejected`]) and,
    /// if it discards the datagram, by class and by `from` ([`Stats::rx_dropped`]).
    pub fn handle_datagram_from(&mut self, now: Instant, datagram: &[u8], from: Option<u32>) {
        self.handle_one(now, datagram, from);
    }

    /// One received datagram, counted in [`Stats::rx_dropped`] if discarded.
    fn handle_one(&mut self, now: Instant, datagram: &[u8], from: Option<u32>) {
        let before = self.sh.stats.rejected.discarded_on_arrival();
        if self.source_ok(datagram, from) {
            self.handle_datagram_impl(now, datagram, false, from);
        }
        if self.sh.stats.rejected.discarded_on_arrival() != before {
            self.count_dropped(datagram, from);
        }
    }

    /// Whether `datagram`, received from peer `from`, may claim the sender it
    /// claims: any rank of this world only from that rank's configured
    /// address (not well-formed, or a rank outside the world: other checks
    /// reject it). Counts a failure by reason.
    fn source_ok(&mut self, datagram: &[u8], from: Option<u32>) -> bool {
        let Ok(p) = wire::Packet::new_checked(datagram) else { return true };
        let src = p.src();
        if src >= self.sh.cfg.world || Some(src) == from {
            return true;
        }
        let rejected = &mut self.sh.stats.rejected;
        match from {
            Some(_) => rejected.wrong_source += 1,
            None => rejected.unknown_source += 1,
        }
        false
    }

    /// Count a received datagram the caller discarded before handing it over
    /// (e.g. a source-address check) in [`Stats::rx_dropped`]: class from its
    /// header when readable, peer `from` (`None` or out of range: unknown).
    pub fn count_dropped(&mut self, datagram: &[u8], from: Option<u32>) {
        self.sh.stats.count_dropped(datagram, from);
    }

    /// Process received datagrams, in order: exactly
    /// [`handle_datagram`](Self::handle_datagram) on each.
    pub fn handle_datagrams(&mut self, now: Instant, datagrams: &[&[u8]]) {
        for d in datagrams {
            self.handle_datagram(now, d);
        }
    }

    /// [`handle_datagram_from`](Self::handle_datagram_from) on each
    /// `(datagram, from)`, in order (each tag checked on its own: the keys are
    /// per sender).
    pub fn handle_datagrams_from(&mut self, now: Instant, datagrams: &[(&[u8], Option<u32>)]) {
        for &(d, from) in datagrams {
            self.handle_one(now, d, from);
        }
        self.prune_timers();
    }

    /// `replay`: a datagram buffered before its op started, already counted;
    /// `from`: the peer it came from as far as the caller knows.
    pub(super) fn handle_datagram_impl(
        &mut self,
        now: Instant,
        datagram: &[u8],
        replay: bool,
        from: Option<u32>,
    ) {
        self.now = now;
        let decoded = self.keys.decode(datagram);
        self.sh.stats.key_derivations = self.keys.derivations();
        let rejected = &mut self.sh.stats.rejected;
        let mismatch = match decoded {
            Ok((h, payload)) => {
                self.handle_authenticated(now, h, payload, datagram, replay);
                return self.grant_after_data();
            }
            Err(WireError::BadTag) => {
                rejected.bad_tag += 1;
                return;
            }
            Err(WireError::UnsupportedVersion(theirs)) => {
                rejected.version_mismatch += 1;
                Mismatch::WireVersion { theirs, ours: wire::VERSION }
            }
            Err(WireError::AuthMismatch { ours, theirs }) => {
                rejected.auth_mismatch += 1;
                Mismatch::PacketAuth { theirs, ours }
            }
            Err(_) => {
                rejected.malformed += 1;
                return;
            }
        };
        self.refuse(now, from, mismatch);
    }

    /// Datagrams from `rank` were refused for `mismatch`: remember it, and
    /// report it unless it was reported recently.
    pub(super) fn refuse(&mut self, now: Instant, rank: Option<u32>, mismatch: Mismatch) {
        let rank = rank.filter(|&r| r < self.sh.cfg.world && r != self.sh.me());
        if self.peers.refuse(now, rank, mismatch) {
            self.events.push_back(Event::PeerIncompatible { rank, mismatch });
        }
    }

    /// A datagram whose tag checked out, parsed into `h` and `payload`.
    fn handle_authenticated(
        &mut self,
        now: Instant,
        h: Header,
        payload: &[u8],
        datagram: &[u8],
        replay: bool,
    ) {
        let (cfg, rejected) = (&self.sh.cfg, &mut self.sh.stats.rejected);
        if h.job != cfg.job {
            rejected.wrong_job += 1;
            return;
        }
        if h.dst != cfg.rank || h.src >= cfg.world {
            rejected.wrong_rank += 1;
            return;
        }
        if !self.settings_agree(now, &h, payload) {
            self.sh.stats.rejected.settings_mismatch += 1;
            return;
        }
        if h.ty == PacketType::Hello {
            return self.on_hello(now, &h, payload, datagram.len());
        }
        match self.peers.note(now, h.src, h.session) {
            None => {
                self.sh.stats.rejected.unverified_session += 1;
                return;
            }
            Some(true) => {
                let generation = self.peers.generation(h.src).unwrap_or(0);
                self.events.push_back(Event::PeerUp { rank: h.src, generation });
            }
            Some(false) => {}
        }
        if !replay && h.ty != PacketType::Data && !self.peers.fresh_control(h.src, h.packet) {
            self.sh.stats.rejected.stale_control += 1;
            return;
        }
        if !replay {
            self.sh.stats.count_rx(h.src, h.class, datagram.len());
            self.flow_received(now, &h, payload);
        } else {
            self.sh.flow.early_replayed(h.src);
        }
        match h.ty {
            PacketType::Grant => return,
            PacketType::Goodbye => return self.on_goodbye(h.src),
            PacketType::Ack => return self.on_ack(now, &h, payload),
            _ => {}
        }
        let Some(run) = self.sh.runs.epoch_of(h.run) else {
            return self.other_run(now, &h, datagram);
        };
        let id = OpId { run, seq: h.op, tensor: h.tensor };
        self.peers.saw_op(h.src, id);
        if h.ty == PacketType::Done && h.flags.contains(wire::Flags::FAILED) {
            return self.on_failure_notice(id, &h, payload);
        }
        if let Some(slot) = self.ops.slot(&id) {
            let key = OpKey::new(id, slot);
            let side = Side::of_packet(h.ty, h.phase);
            let Some(op) = self.ops.at_mut(slot, &id) else { return };
            op.on_packet(now, key, &h, payload, &mut self.sh);
            self.timers.reindex(op.transfers_mut(), id, side, h.src, false);
            self.check_complete(id);
        } else if self.history.lingering(&id).is_some() {
            self.answer_lingering(id, &h);
        } else if self.history.is_finished(&id) {
            self.sh.stats.rejected.stale_op += 1;
            self.notify_failure(now, id, &h);
        } else if h.ty == PacketType::Data
            && (h.phase == Phase::Scatter || h.collective != Collective::Allreduce)
        {
            // The first DATA of an op may come before this rank started it:
            // any of a reduce-scatter's, an allgather's (all-gather only) or
            // a broadcast's (from the root, or from an owner that heard from
            // the root first).
            self.buffer_early(now, OpId { run: h.run, ..id }, h.src, datagram);
        } else {
            // A control packet for an op not started here: the sender retries.
            self.sh.stats.rejected.stale_op += 1;
        }
    }

    /// Keep a DATA datagram for an op not started here yet (bounded).
    pub(super) fn buffer_early(&mut self, now: Instant, id: OpId, src: u32, datagram: &[u8]) {
        let rejected = &mut self.sh.stats.rejected;
        match self.history.buffer(now, id, datagram, self.sh.cfg.early_buffer_bytes) {
            Early::Buffered => rejected.early_buffered += 1,
            Early::Dropped => rejected.early_dropped += 1,
        }
        self.sh.flow.note_early(src);
    }
}
