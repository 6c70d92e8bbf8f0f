//! Incarnations and runs at the endpoint: the HELLO handshake that verifies
//! a peer's session (`membership`), a peer's GOODBYE and restart, the run
//! agreement ([`crate::run`]) and the ops held until their run is agreed.

use crate::endpoint::api::{Event, Mismatch, OpError, OpId};
use crate::endpoint::tx::TxKind;
use crate::endpoint::{Endpoint, RUN_HELLO_INTERVAL};
use crate::run::Waiting;
use crate::time::Instant;
use crate::wire::{Header, PacketType, Phase, RUN_FRESH, Settings};

impl Endpoint {
    /// A local run begins (the first trainer attached; see [`crate::run`]):
    /// its epoch, the [`OpId::run`] of its ops. It is announced to every
    /// peer at once. If a local run is going on, its epoch.
    pub fn begin_run(&mut self, now: Instant) -> u64 {
        self.now = now;
        let running = self.sh.runs.epoch();
        let epoch = self.sh.runs.begin();
        if running.is_none() {
            self.sh.tx.push_hellos(self.sh.cfg.world, self.sh.me());
            self.run_hello = Some(now + RUN_HELLO_INTERVAL);
        }
        self.start_held(now);
        epoch
    }

    /// The local run ended (the last trainer detached): ops still held for
    /// it fail ([`OpError::RunEnded`]); ops in flight go on.
    pub fn end_run(&mut self, now: Instant) {
        self.now = now;
        let was = self.sh.runs.epoch();
        self.sh.runs.end();
        self.run_hello = None;
        self.fail_held(now);
        if was.is_some() {
            // The peers learn at once that this run is over.
            self.sh.tx.push_hellos(self.sh.cfg.world, self.sh.me());
        }
    }

    /// The local run's epoch and its agreed run id (0 until agreed), if a
    /// local run is going on.
    pub fn run(&self) -> Option<(u64, u64)> {
        self.sh.runs.epoch().map(|e| (e, self.sh.runs.agreed().unwrap_or(0)))
    }

    /// Why the local run is not agreed yet, by rank (empty once it is).
    pub fn run_waiting(&self) -> Vec<Waiting> {
        self.sh.runs.waiting()
    }

    /// Ops submitted but held until their run is agreed.
    pub fn ops_held(&self) -> usize {
        self.held.len()
    }

    /// Announce this daemon's shutdown to every peer (GOODBYE), so they
    /// mark it down at once; the caller then sends what is queued.
    pub fn goodbye(&mut self) {
        // The ACKs this rank still holds go first: their owners are waiting.
        self.flush_acks(self.now, true);
        let me = self.sh.me();
        for peer in (0..self.sh.cfg.world).filter(|&j| j != me) {
            self.sh.tx.push_phaseless(peer, TxKind::Goodbye);
        }
    }

    /// Start the held ops if their run is agreed now.
    pub(super) fn start_held(&mut self, now: Instant) {
        if self.sh.runs.agreed().is_none() {
            return;
        }
        self.run_hello = None;
        for h in self.held.take_all() {
            self.start_now(now, h);
        }
    }

    /// Fail the held ops that waited the hard timeout or whose run ended.
    pub(super) fn fail_held(&mut self, now: Instant) {
        let timeout = self.sh.cfg.timers.hard_timeout;
        for h in self.held.take_expired(now, timeout, self.sh.runs.epoch()) {
            let error = if Some(h.id.run) == self.sh.runs.epoch() {
                OpError::NoRun { waiting: self.sh.runs.waiting(), timeout }
            } else {
                OpError::RunEnded { epoch: h.id.run }
            };
            self.sh.stats.ops_failed += 1;
            self.pool.put(now, h.data);
            self.events.push_back(Event::OpFailed { id: h.id, error });
        }
    }

    /// A HELLO (its settings agree) of `len` bytes: the incarnation
    /// handshake, then the peer's run announcement (see `membership` and
    /// [`crate::run`]).
    pub(super) fn on_hello(&mut self, now: Instant, h: &Header, payload: &[u8], len: usize) {
        let Ok(s) = Settings::parse(payload) else { return };
        let o = self.peers.on_hello(now, h.src, h.session, h.packet, &s);
        if o.stale {
            self.sh.stats.rejected.stale_control += 1;
            return;
        }
        if o.reply || o.verified {
            self.sh.tx.push_phaseless(h.src, TxKind::Hello);
        }
        if !o.current {
            return;
        }
        self.sh.stats.count_rx(h.src, h.class, len);
        if let Some(old) = o.restarted {
            self.peer_restarted(h.src, old, s.generation);
        }
        if o.verified {
            self.sh.runs.peer_verified(h.src, o.restarted.is_some());
        }
        if o.came_up {
            self.events.push_back(Event::PeerUp { rank: h.src, generation: s.generation });
        }
        let fresh = s.run_flags & RUN_FRESH != 0;
        if self.sh.runs.peer_announced(h.src, s.run_nonce, fresh, s.run_echo) && !(o.reply || o.verified) {
            self.sh.tx.push_phaseless(h.src, TxKind::Hello);
        }
        self.start_held(now);
    }

    /// `src` came back as a new incarnation: every live op fails (it lost
    /// their state), and so does what was buffered or credited from it.
    pub(super) fn peer_restarted(&mut self, src: u32, old: u32, new: u32) {
        self.events.push_back(Event::PeerRestarted { rank: src, old, new });
        for id in self.ops.ids() {
            self.fail(id, OpError::PeerRestarted { rank: src, old, new });
        }
        self.sh.acks.forget(src);
        self.history.forget_early_from(src);
        self.flow_reset(src);
    }

    /// `src`'s verified incarnation said goodbye: it is down now, its ops fail.
    pub(super) fn on_goodbye(&mut self, src: u32) {
        self.peers.goodbye(src);
        self.sh.runs.peer_left(src);
        self.events.push_back(Event::PeerLeft { rank: src });
        for id in self.ops.ids() {
            self.fail(id, OpError::PeerLeft { rank: src });
        }
        self.sh.acks.forget(src);
        self.history.forget_early_from(src);
        self.flow_reset(src);
    }

    /// An op packet of a run this rank has not agreed (yet): DATA is kept
    /// while the local run waits for agreement (it may be that run's), the
    /// rest is counted and dropped (another run's, or replayed).
    pub(super) fn other_run(&mut self, now: Instant, h: &Header, datagram: &[u8]) {
        let pending = self.sh.runs.epoch().is_some() && self.sh.runs.agreed().is_none();
        if pending && h.ty == PacketType::Data && h.phase == Phase::Scatter && h.run != 0 {
            self.buffer_early(now, OpId { run: h.run, seq: h.op, tensor: h.tensor }, h.src, datagram);
        } else {
            self.sh.stats.rejected.other_run += 1;
        }
    }

    /// Whether `h.src` may talk to this rank: a HELLO's settings (`payload`)
    /// must agree with ours (else the peer is refused until they do); any
    /// other datagram passes unless the peer's settings were refused.
    pub(super) fn settings_agree(&mut self, now: Instant, h: &Header, payload: &[u8]) -> bool {
        if h.ty != PacketType::Hello {
            return !self.peers.settings_refused(h.src);
        }
        let ours = self.sh.cfg.chunk_bytes as u32;
        let window = self.sh.flow.config().wire_window();
        match Settings::parse(payload) {
            Ok(s) if s.chunk_bytes != ours => {
                self.refuse(now, Some(h.src), Mismatch::ChunkBytes { theirs: s.chunk_bytes, ours });
                false
            }
            Ok(s) if s.flow_window != window => {
                self.refuse(now, Some(h.src), Mismatch::FlowWindow { theirs: s.flow_window, ours: window });
                false
            }
            Ok(s) if s.digest != self.digest => {
                let mismatch = Mismatch::SettingsDigest { theirs: s.digest, ours: self.digest };
                self.refuse(now, Some(h.src), mismatch);
                for id in self.ops.ids().into_iter().filter(|id| id.run != 0) {
                    self.fail(id, OpError::PeerIncompatible { rank: h.src, mismatch });
                }
                false
            }
            _ => {
                self.peers.settings_agree(h.src);
                true
            }
        }
    }
}
