//! Who is out there: every peer's generation and liveness, and the heartbeats.
//!
//! Ops are matched across ranks by (job, op sequence, tensor id). Every
//! packet carries its sender's generation; a higher generation means the
//! peer's daemon restarted ([`Peers::note`] says so, and the endpoint fails
//! the live ops). Packets of an older generation are dropped. A peer silent
//! for the peer timeout is down until heard from again.
//!
//! A peer that cannot talk to this one (another wire version, packet
//! authentication mode or chunk size: a [`Mismatch`]) is remembered until it
//! sends a HELLO whose settings agree, and reported at most once per
//! [`MISMATCH_REPORT_INTERVAL`].

use std::collections::BTreeSet;

use crate::endpoint::api::{MISMATCH_REPORT_INTERVAL, Mismatch};
use crate::time::{Duration, Instant};

#[derive(Debug, Clone, Default)]
struct PeerState {
    generation: Option<u32>,
    last_heard: Option<Instant>,
    up: bool,
    /// Why its datagrams were last refused, until its settings agree.
    mismatch: Option<Mismatch>,
    /// When that was last reported.
    reported: Option<Instant>,
}

/// What a packet's generation said about its sender ([`Peers::note`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Noted {
    /// From an older generation: drop the packet.
    Stale,
    /// Current. `restarted`: the peer came back with this new generation
    /// (the old one given); `came_up`: first contact, or contact again after
    /// it was down.
    Current { restarted: Option<u32>, came_up: bool },
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
    /// When a mismatch of a datagram from no known peer was last reported.
    unknown_reported: Option<Instant>,
}

impl Peers {
    /// A world of `world` ranks, none heard from; heartbeats from `now` if
    /// `heartbeat` is not zero and there is someone to talk to.
    pub(crate) fn new(world: u32, heartbeat: Duration, now: Instant) -> Peers {
        Peers {
            peers: vec![PeerState::default(); world as usize],
            heard: BTreeSet::new(),
            next_heartbeat: (!heartbeat.is_zero() && world > 1).then_some(now),
            hello_seq: 0,
            unknown_reported: None,
        }
    }

    /// Whether `rank` was heard from within the peer timeout.
    pub(crate) fn is_up(&self, rank: u32) -> bool {
        self.peers.get(rank as usize).is_some_and(|p| p.up)
    }

    /// The last generation seen from `rank`.
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
        matches!(self.mismatch(rank), Some(Mismatch::ChunkBytes { .. }))
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

    /// A packet from `src` of `generation` arrived at `now`. O(1) for a peer
    /// that is up: only its last-heard time changes; its entry in the timeout
    /// order is brought up to date when it comes due ([`Peers::expire`]).
    pub(crate) fn note(&mut self, now: Instant, src: u32, generation: u32) -> Noted {
        let p = &mut self.peers[src as usize];
        let restarted = match p.generation {
            Some(g) if generation < g => return Noted::Stale,
            Some(g) if generation > g => Some(g),
            Some(_) => None,
            None => None,
        };
        p.generation = Some(generation);
        p.last_heard = Some(now);
        let came_up = !p.up;
        if came_up {
            self.heard.insert((now, src));
        }
        p.up = true;
        Noted::Current { restarted, came_up }
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
