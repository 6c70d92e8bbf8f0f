//! Who is out there: every peer's incarnation and liveness, and the heartbeats.
//!
//! Ops are matched across ranks by (job, run, op sequence, tensor id). Every
//! packet carries its sender's session, 64 random bits per daemon start. A
//! receiver takes a session as its peer's current incarnation only through
//! the incarnation handshake: a HELLO of an unknown session is answered with
//! a fresh challenge, and the session is verified when a HELLO of it echoes
//! that challenge. Only then is it current; if it replaces a verified one,
//! the peer restarted ([`Peers::on_hello`] says so, and the endpoint fails the
//! live ops). Any other packet of a session that is not the verified one is
//! dropped. So a replayed datagram of an earlier incarnation is never taken
//! for a restart, and no clock or counter the sender announces decides
//! anything (version 3 ordered incarnations by a wall-clock generation: a
//! clock stepped back made a restarted daemon "stale" to every peer).
//! A GOODBYE of the verified session retires it at once.
//!
//! A peer silent for the peer timeout is down until heard from again.
//!
//! A peer that cannot talk to this one (another wire version, packet
//! authentication mode, chunk size or settings digest: a [`Mismatch`]) is
//! remembered until it sends a HELLO whose settings agree, and reported at
//! most once per [`MISMATCH_REPORT_INTERVAL`].

use std::collections::BTreeSet;

use crate::endpoint::api::{MISMATCH_REPORT_INTERVAL, Mismatch, OpId};
use crate::rng::Rng;
use crate::time::{Duration, Instant};
use crate::wire::Settings;

#[derive(Debug, Clone, Default)]
struct PeerState {
    /// The verified session (the peer's current incarnation).
    session: Option<u64>,
    /// The generation its verified incarnation announced (for people).
    generation: Option<u32>,
    /// An unverified session this rank challenged, and the challenge.
    candidate: Option<(u64, u64)>,
    /// The last challenge it sent this rank (echoed in HELLOs to it).
    echo: u64,
    /// It said goodbye since its last verified session.
    left: bool,
    /// The packet number of the last PROBE, BITMAP, DONE or GRANT of its
    /// verified session taken (control packets travel in order, in one
    /// class queue; an older one is a replay or a duplicate).
    control_pn: Option<u64>,
    /// The packet number of the last HELLO of its verified session taken.
    hello_pn: Option<u64>,
    /// The op of the last op packet taken from it.
    last_op: Option<OpId>,
    /// The newest op (by run, then sequence) of any op packet taken from its
    /// verified session: it has started every op up to this one.
    newest_op: Option<OpId>,
    last_heard: Option<Instant>,
    up: bool,
    /// Why its datagrams were last refused, until its settings agree.
    mismatch: Option<Mismatch>,
    /// When that was last reported.
    reported: Option<Instant>,
}

/// What a HELLO did to its sender's incarnation ([`Peers::on_hello`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Hello {
    /// Of the verified session (before or by this HELLO).
    pub current: bool,
    /// This HELLO verified a new session that replaces another: the peer
    /// restarted (the old incarnation's generation given).
    pub restarted: Option<u32>,
    /// This HELLO verified a session (first contact, restart or return).
    pub verified: bool,
    /// The peer came up: first contact, or contact again after it was down.
    pub came_up: bool,
    /// Send it a HELLO now: it was challenged, or it challenges this rank.
    pub reply: bool,
    /// Of the verified session but no newer than its last HELLO taken: a
    /// replay (or a duplicate); nothing in it was taken.
    pub stale: bool,
}

/// Every peer's state, and the heartbeat schedule.
#[derive(Debug)]
pub(crate) struct Peers {
    peers: Vec<PeerState>,
    /// `(heard, rank)` of every peer that is up, for the peer timeout: `heard`
    /// is at most the peer's last-heard time (updated lazily).
    heard: BTreeSet<(Instant, u32)>,
    next_heartbeat: Option<Instant>,
    hello_seq: u32,
    /// Source of challenges (seeded by this incarnation's session).
    challenges: Rng,
    /// When a mismatch of a datagram from no known peer was last reported.
    unknown_reported: Option<Instant>,
}

impl Peers {
    /// A world of `world` ranks, none heard from; heartbeats from `now` if
    /// `heartbeat` is not zero and there is someone to talk to.
    pub(crate) fn new(world: u32, heartbeat: Duration, now: Instant, session: u64) -> Peers {
        Peers {
            peers: vec![PeerState::default(); world as usize],
            heard: BTreeSet::new(),
            next_heartbeat: (!heartbeat.is_zero() && world > 1).then_some(now),
            hello_seq: 0,
            challenges: Rng::stream(session, 0xC4A1, u64::from(world)),
            unknown_reported: None,
        }
    }

    /// Whether `rank` was heard from within the peer timeout.
    pub(crate) fn is_up(&self, rank: u32) -> bool {
        self.peers.get(rank as usize).is_some_and(|p| p.up)
    }

    /// The verified session of `rank`.
    pub(crate) fn session(&self, rank: u32) -> Option<u64> {
        self.peers.get(rank as usize).and_then(|p| p.session)
    }

    /// What a HELLO to `rank` carries of the handshake: (the challenge for
    /// its unverified session or 0, the last challenge it sent or 0).
    pub(crate) fn handshake(&self, rank: u32) -> (u64, u64) {
        self.peers.get(rank as usize).map_or((0, 0), |p| (p.candidate.map_or(0, |c| c.1), p.echo))
    }

    /// The generation the verified incarnation of `rank` announced.
    pub(crate) fn generation(&self, rank: u32) -> Option<u32> {
        self.peers.get(rank as usize).and_then(|p| p.generation)
    }

    /// Why `rank`'s datagrams were last refused, if its settings have not
    /// agreed since.
    pub(crate) fn mismatch(&self, rank: u32) -> Option<Mismatch> {
        self.peers.get(rank as usize).and_then(|p| p.mismatch)
    }

    /// Whether `rank` announced settings (in HELLO) that disagree with ours:
    /// its other datagrams are refused until it announces ours.
    pub(crate) fn settings_refused(&self, rank: u32) -> bool {
        matches!(self.mismatch(rank), Some(Mismatch::ChunkBytes { .. } | Mismatch::SettingsDigest { .. }))
    }

    /// A datagram from `rank` (`None`: from no known peer) was refused at
    /// `now` for `mismatch`. Returns whether to report it (at most once per
    /// [`MISMATCH_REPORT_INTERVAL`] per peer, and at once when what differs changes).
    pub(crate) fn refuse(&mut self, now: Instant, rank: Option<u32>, mismatch: Mismatch) -> bool {
        let (reported, changed) = match rank.and_then(|r| self.peers.get_mut(r as usize)) {
            Some(p) => {
                let changed = p.mismatch != Some(mismatch);
                p.mismatch = Some(mismatch);
                (&mut p.reported, changed)
            }
            None => (&mut self.unknown_reported, false),
        };
        let due = changed || reported.is_none_or(|t| t + MISMATCH_REPORT_INTERVAL <= now);
        if due {
            *reported = Some(now);
        }
        due
    }

    /// `rank` announced settings that agree with ours.
    pub(crate) fn settings_agree(&mut self, rank: u32) {
        if let Some(p) = self.peers.get_mut(rank as usize) {
            p.mismatch = None;
            p.reported = None;
        }
    }

    /// The heartbeat counter carried in HELLO.
    pub(crate) fn hello_seq(&self) -> u32 {
        self.hello_seq
    }

    /// A HELLO of `session` announcing `s` arrived from `src` at `now` (its
    /// tag checked): run the incarnation handshake (see the module docs).
    pub(crate) fn on_hello(
        &mut self,
        now: Instant,
        src: u32,
        session: u64,
        packet: u64,
        s: &Settings,
    ) -> Hello {
        let fresh = self.challenges.next_u64() | 1;
        let p = &mut self.peers[src as usize];
        if p.session == Some(session) && p.hello_pn.is_some_and(|last| packet <= last) {
            return Hello { stale: true, ..Hello::default() };
        }
        let mut out = Hello { reply: s.challenge != 0 && s.challenge != p.echo, ..Hello::default() };
        p.echo = s.challenge;
        if p.session != Some(session) {
            match p.candidate {
                Some((c, challenge)) if c == session && s.echo == challenge => {
                    out.restarted = (p.session.is_some() || p.left).then(|| p.generation.unwrap_or(0));
                    out.verified = true;
                    p.session = Some(session);
                    p.candidate = None;
                    p.left = false;
                    p.control_pn = None;
                    p.hello_pn = None;
                    p.newest_op = None;
                }
                Some((c, _)) if c == session => return out,
                _ => {
                    p.candidate = Some((session, fresh));
                    out.reply = true;
                    return out;
                }
            }
        }
        p.generation = Some(s.generation);
        p.hello_pn = Some(packet);
        out.current = true;
        out.came_up = self.heard(now, src);
        out
    }

    /// A packet other than HELLO of `session` arrived from `src` at `now`:
    /// whether it is of the verified session (else drop it), and whether the
    /// peer came up again. O(1) for a peer that is up: only its last-heard
    /// time changes; its entry in the timeout order is brought up to date
    /// when it comes due ([`Peers::expire`]).
    pub(crate) fn note(&mut self, now: Instant, src: u32, session: u64) -> Option<bool> {
        (self.peers[src as usize].session == Some(session)).then(|| self.heard(now, src))
    }

    /// Whether a control packet (PROBE, BITMAP, DONE, GRANT) numbered
    /// `packet` of `src`'s verified session is fresh: newer than the last
    /// taken (which it then becomes). A replayed or duplicated one is not.
    pub(crate) fn fresh_control(&mut self, src: u32, packet: u64) -> bool {
        let p = &mut self.peers[src as usize];
        if p.control_pn.is_some_and(|last| packet <= last) {
            return false;
        }
        p.control_pn = Some(packet);
        true
    }

    /// An op packet of op `id` was taken from `src`.
    pub(crate) fn saw_op(&mut self, src: u32, id: OpId) {
        if let Some(p) = self.peers.get_mut(src as usize) {
            p.last_op = Some(id);
            if p.newest_op.is_none_or(|o| (o.run, o.seq) < (id.run, id.seq)) {
                p.newest_op = Some(id);
            }
        }
    }

    /// Whether `rank` is up and has taken part in op `id`'s run but has not
    /// started op `id`: op packets of earlier ops of the run came from it,
    /// none of `id` or a later one. Its trainer is late (an evaluation, a
    /// checkpoint, a pause), not its network: a rank that has started an
    /// op soon sends this one something of it (its data, or its answer to
    /// this one's), so a rank that started and then went silent is not late.
    /// Nor is one that never sent anything of the run (it may never have
    /// agreed on it: an asymmetric partition).
    pub(crate) fn late_for(&self, rank: u32, id: OpId) -> bool {
        self.peers
            .get(rank as usize)
            .is_some_and(|p| p.up && p.newest_op.is_some_and(|o| o.run == id.run && o.seq < id.seq))
    }

    /// The op of the last op packet taken from `rank`.
    pub(crate) fn last_op(&self, rank: u32) -> Option<OpId> {
        self.peers.get(rank as usize).and_then(|p| p.last_op)
    }

    /// `src`'s verified session said goodbye: it is down, and the session
    /// retired (a restart is verified afresh). Whether it was up.
    pub(crate) fn goodbye(&mut self, src: u32) -> bool {
        let p = &mut self.peers[src as usize];
        p.session = None;
        p.candidate = None;
        p.left = true;
        std::mem::replace(&mut p.up, false)
    }

    /// `src` was heard at `now`; whether it came up.
    fn heard(&mut self, now: Instant, src: u32) -> bool {
        let p = &mut self.peers[src as usize];
        p.last_heard = Some(now);
        let came_up = !p.up;
        if came_up {
            self.heard.insert((now, src));
        }
        p.up = true;
        came_up
    }

    /// Whether a round of HELLOs is due at `now` (then the next is scheduled).
    pub(crate) fn heartbeat_due(&mut self, now: Instant, heartbeat: Duration) -> bool {
        if self.next_heartbeat.is_none_or(|hb| hb > now) {
            return false;
        }
        self.hello_seq = self.hello_seq.wrapping_add(1);
        self.next_heartbeat = Some(now + heartbeat);
        true
    }

    /// The heartbeat interval changed (at `now`).
    pub(crate) fn set_heartbeat(&mut self, now: Instant, heartbeat: Duration) {
        if heartbeat.is_zero() || self.peers.len() <= 1 {
            self.next_heartbeat = None;
        } else if self.next_heartbeat.is_none_or(|t| t > now + heartbeat) {
            self.next_heartbeat = Some(now + heartbeat);
        }
    }

    /// Peers silent for `timeout` at `now`, in rank order: now down. An
    /// entry of the timeout order may be older than its peer's last-heard
    /// time (see [`Peers::note`]): it moves to that time instead.
    pub(crate) fn expire(&mut self, now: Instant, timeout: Duration) -> Vec<u32> {
        let mut down = Vec::new();
        while let Some(&(h, j)) = self.heard.first() {
            if h + timeout > now {
                break;
            }
            self.heard.pop_first();
            match self.peers[j as usize].last_heard {
                Some(last) if last + timeout > now => {
                    self.heard.insert((last, j));
                }
                _ => down.push(j),
            }
        }
        down.sort_unstable();
        for &j in &down {
            self.peers[j as usize].up = false;
        }
        down
    }

    /// When the next heartbeat or peer timeout is due.
    pub(crate) fn next_timeout(&self, timeout: Duration) -> Option<Instant> {
        let silent = self.heard.first().map(|&(h, _)| h + timeout);
        [self.next_heartbeat, silent].into_iter().flatten().min()
    }

    /// Bytes held (for the endpoint's footprint).
    pub(crate) fn bytes(&self) -> usize {
        self.peers.capacity() * size_of::<PeerState>() + self.heard.len() * size_of::<(Instant, u32)>()
    }
}
