//! Runs: which training run an op belongs to, agreed by the job's daemons.
//!
//! Trainers number their collective calls from 1 on every attach, so two
//! runs of a job on the same long-lived daemons use the same op sequence
//! numbers. Version 3 told ops apart by (generation, op, tensor) alone: a job
//! rerun within the linger time collided with the finished ops of the run
//! before, and DATA captured in run N and replayed into run N+1 was accepted
//! as run N+1's. Version 4 puts a **run id** in every op packet's header,
//! under the tag, and matches ops by (run, op, tensor).
//!
//! The run id is agreed among the daemons, with nothing asked of the
//! launcher:
//!
//! - A daemon's **local run** begins when its first trainer attaches and
//!   ends when the last one detaches ([`Runs::begin`], [`Runs::end`]). Each
//!   local run draws a fresh random **nonce**, announced in every HELLO with
//!   a FRESH flag per receiver: "my run began after I verified your current
//!   session" (so a run that began before a peer restarted never counts for
//!   the peer's new incarnation).
//! - A daemon agrees on a run when, for every other rank, it holds a nonce
//!   flagged fresh that it has not used in an earlier agreed run, announced
//!   in a HELLO that echoes this daemon's own current nonce (so every
//!   announcement it agrees on was made knowing its run: two daemons never
//!   agree on different sets), and its own run is fresh for every peer. The run id is then
//!   SHA-256(job ‖ every rank's nonce, in rank order), truncated to 64 bits;
//!   every daemon computes the same one from the same nonces.
//! - Ops submitted before agreement wait (the endpoint holds them) and fail
//!   at the hard timeout naming the ranks that have not started the run.
//!
//! A job rerun therefore never collides with the ops of the run before it
//! (each daemon waits for every peer's *next* nonce), and packets of another
//! run — replayed or late — match no op: they are counted and dropped.
//! Inside the endpoint an op's [`OpId::run`](crate::endpoint::OpId) is the
//! local run's **epoch**, a counter; this module maps epochs to run ids and
//! back for the current run and the last [`HISTORY`] agreed ones (whose ops
//! may still linger).

use std::collections::VecDeque;

use crate::rng::Rng;

/// Agreed runs remembered after they end (their ops may linger).
pub const HISTORY: usize = 8;

/// What a daemon knows of a peer's run.
#[derive(Debug, Clone, Copy, Default)]
struct PeerRun {
    /// Its current run's nonce (0: none).
    nonce: u64,
    /// It flags that nonce fresh for this rank's current session.
    fresh: bool,
    /// This rank's run nonce as it last heard it (its echo).
    echo: u64,
    /// The nonce of it this rank used in its last agreed run.
    used: u64,
    /// When (in [`Runs`]' event ticks) its current session replaced an
    /// earlier one (0: first contact; None: not verified yet).
    verified: Option<u64>,
}

/// This daemon's local run.
#[derive(Debug, Clone, Copy)]
struct Local {
    epoch: u64,
    nonce: u64,
    /// The event tick it began at.
    began: u64,
    /// Its agreed run id, once agreed.
    agreed: Option<u64>,
}

/// Why a rank's run is not agreed yet ([`Runs::waiting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// No trainer of this daemon is attached.
    NoLocalRun,
    /// The peer announced no run this rank has not already used: its
    /// trainers have not started this run.
    NotStarted(u32),
    /// The peer has not yet confirmed it heard this rank's run.
    Unconfirmed(u32),
    /// The peer restarted after this rank's run began: this run cannot
    /// include it; the job's trainers must start a new run.
    RestartedSinceRunBegan(u32),
}

impl Waiting {
    /// The rank waited on (none for [`Waiting::NoLocalRun`]).
    pub fn rank(&self) -> Option<u32> {
        match *self {
            Waiting::NoLocalRun => None,
            Waiting::NotStarted(r) | Waiting::Unconfirmed(r) | Waiting::RestartedSinceRunBegan(r) => Some(r),
        }
    }
}

impl core::fmt::Display for Waiting {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Waiting::NoLocalRun => write!(f, "no trainer is attached to this daemon"),
            Waiting::NotStarted(r) => write!(
                f,
                "rank {r} has not started this run (its trainers are not attached yet, or still in the previous run)"
            ),
            Waiting::Unconfirmed(r) => write!(f, "rank {r} has not confirmed this run yet"),
            Waiting::RestartedSinceRunBegan(r) => {
                write!(f, "rank {r}'s daemon restarted after this run began: restart the job's trainers")
            }
        }
    }
}

/// A daemon's view of the job's runs (see the module docs).
#[derive(Debug)]
pub struct Runs {
    me: u32,
    job: u32,
    peers: Vec<PeerRun>,
    local: Option<Local>,
    next_epoch: u64,
    /// `(epoch, run id)` of ended agreed runs, newest last.
    history: VecDeque<(u64, u64)>,
    ticks: u64,
    nonces: Rng,
    /// Peers (this rank excluded) that keep the local run from being
    /// agreed ([`blocker`]), kept in step with every change, so a HELLO
    /// does not rescan every peer (O(world) per HELLO); 0 without a local
    /// run.
    blocking: usize,
}

/// Why peer `p` keeps the local run `l` from being agreed, if it does.
fn blocker(r: u32, p: &PeerRun, l: &Local) -> Option<Waiting> {
    if p.verified.is_some_and(|v| v > l.began && v > 0) {
        Some(Waiting::RestartedSinceRunBegan(r))
    } else if p.verified.is_none() || p.nonce == 0 || !p.fresh || p.nonce == p.used {
        Some(Waiting::NotStarted(r))
    } else if p.echo != l.nonce {
        Some(Waiting::Unconfirmed(r))
    } else {
        None
    }
}

impl Runs {
    /// No run yet, for rank `me` of `world` in `job`; nonces drawn from a
    /// generator seeded by this incarnation's random `session`.
    pub fn new(me: u32, world: u32, job: u32, session: u64) -> Runs {
        Runs {
            me,
            job,
            peers: vec![PeerRun::default(); world as usize],
            local: None,
            next_epoch: 1,
            history: VecDeque::new(),
            ticks: 0,
            nonces: Rng::stream(session, 0x52_554E, u64::from(me)),
            blocking: 0,
        }
    }

    /// Recount the peers blocking the local run (after it changed).
    fn recount(&mut self) {
        let Some(l) = self.local else {
            self.blocking = 0;
            return;
        };
        let me = self.me;
        self.blocking = (0..self.peers.len() as u32)
            .filter(|&r| r != me && blocker(r, &self.peers[r as usize], &l).is_some())
            .count();
    }

    /// Change what is known of `peer` with `f`, keeping the count of
    /// blocking peers in step.
    fn update_peer(&mut self, peer: u32, f: impl FnOnce(&mut PeerRun)) {
        let Some(p) = self.peers.get_mut(peer as usize) else { return };
        let counted = peer != self.me;
        let blocks = |p: &PeerRun| self.local.is_some_and(|l| counted && blocker(peer, p, &l).is_some());
        let before = blocks(p);
        f(p);
        let after = blocks(p);
        self.blocking = self.blocking + usize::from(after) - usize::from(before);
    }

    fn tick(&mut self) -> u64 {
        self.ticks += 1;
        self.ticks
    }

    /// A local run begins (the first trainer attached); its epoch. If one
    /// is running, it is kept and its epoch returned.
    pub fn begin(&mut self) -> u64 {
        if let Some(l) = self.local {
            return l.epoch;
        }
        let began = self.tick();
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        let nonce = self.nonces.next_u64() | 1;
        self.local = Some(Local { epoch, nonce, began, agreed: None });
        self.recount();
        self.try_agree();
        epoch
    }

    /// The local run ended (the last trainer detached).
    pub fn end(&mut self) {
        if let Some(Local { epoch, agreed: Some(id), .. }) = self.local.take() {
            self.remember(epoch, id);
        }
        self.blocking = 0;
    }

    fn remember(&mut self, epoch: u64, id: u64) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back((epoch, id));
    }

    /// The current local run's epoch, if one is running.
    pub fn epoch(&self) -> Option<u64> {
        self.local.map(|l| l.epoch)
    }

    /// The current run's id, once agreed.
    pub fn agreed(&self) -> Option<u64> {
        self.local.and_then(|l| l.agreed)
    }

    /// `peer`'s current session was verified: on first contact
    /// (`restart` false) or replacing an earlier incarnation — a restart,
    /// or a return after a goodbye. A restart ends the agreed run: it
    /// included the peer's old incarnation (its ops keep their run id).
    pub fn peer_verified(&mut self, peer: u32, restart: bool) {
        let t = if restart { self.tick() } else { 0 };
        self.update_peer(peer, |p| *p = PeerRun { verified: Some(t), ..PeerRun::default() });
        if restart {
            self.retire_agreed();
        }
    }

    /// `peer` said goodbye: the agreed run, which included it, is over.
    pub fn peer_left(&mut self, peer: u32) {
        let t = self.tick();
        self.update_peer(peer, |p| *p = PeerRun { verified: Some(t), ..PeerRun::default() });
        self.retire_agreed();
    }

    fn retire_agreed(&mut self) {
        if let Some(l) = self.local.as_mut()
            && let Some(id) = l.agreed.take()
        {
            let epoch = l.epoch;
            self.remember(epoch, id);
        }
    }

    /// `peer` announced its run `nonce` (in a HELLO of its verified
    /// session), flagged `fresh` for this rank, echoing `echo` as this
    /// rank's nonce. Returns whether the peer should hear from this rank
    /// now: its nonce changed (so our echo did), or it echoes a stale nonce
    /// of ours.
    pub fn peer_announced(&mut self, peer: u32, nonce: u64, fresh: bool, echo: u64) -> bool {
        let ours = self.local.map_or(0, |l| l.nonce);
        let Some(p) = self.peers.get(peer as usize) else { return false };
        let changed = p.nonce != nonce;
        self.update_peer(peer, |p| (p.nonce, p.fresh, p.echo) = (nonce, fresh, echo));
        self.try_agree();
        changed || echo != ours
    }

    /// What a HELLO to `peer` announces: (our nonce or 0, fresh for it,
    /// its nonce as we heard it).
    pub fn announce(&self, peer: u32) -> (u64, bool, u64) {
        let p = self.peers.get(peer as usize);
        let echo = p.map_or(0, |p| p.nonce);
        match (self.local, p.and_then(|p| p.verified)) {
            (Some(l), Some(v)) => (l.nonce, l.began > v, echo),
            (Some(l), None) => (l.nonce, false, echo),
            (None, _) => (0, false, echo),
        }
    }

    /// Why the current run is not agreed (empty once it is), by rank.
    pub fn waiting(&self) -> Vec<Waiting> {
        let Some(l) = self.local else { return vec![Waiting::NoLocalRun] };
        if l.agreed.is_some() {
            return Vec::new();
        }
        let me = self.me;
        let peers = self.peers.iter().enumerate().filter(|&(r, _)| r as u32 != me);
        peers.filter_map(|(r, p)| blocker(r as u32, p, &l)).collect()
    }

    fn try_agree(&mut self) {
        let Some(l) = self.local else { return };
        if l.agreed.is_some() {
            return;
        }
        debug_assert_eq!(self.blocking == 0, self.waiting().is_empty(), "blocking peers out of step");
        if self.blocking > 0 {
            return;
        }
        let mut input = Vec::with_capacity(4 + 8 * self.peers.len());
        input.extend_from_slice(&self.job.to_be_bytes());
        for (r, p) in self.peers.iter_mut().enumerate() {
            let nonce = if r as u32 == self.me { l.nonce } else { p.nonce };
            p.used = p.nonce;
            input.extend_from_slice(&nonce.to_be_bytes());
        }
        let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &input);
        let mut id = [0u8; 8];
        id.copy_from_slice(&d.as_ref()[..8]);
        let id = u64::from_be_bytes(id).max(1);
        self.local = Some(Local { agreed: Some(id), ..l });
        self.recount();
    }

    /// Whether `peer` is still in the agreed run of local epoch `epoch`: it is
    /// the current run, agreed, and the peer still announces the run nonce it
    /// was agreed with (its trainers have not all left since).
    pub fn in_run(&self, peer: u32, epoch: u64) -> bool {
        let Some(p) = self.peers.get(peer as usize) else { return false };
        self.local.is_some_and(|l| l.epoch == epoch && l.agreed.is_some())
            && p.nonce != 0
            && p.nonce == p.used
    }

    /// The run id of local epoch `epoch` (current or remembered).
    pub fn id_of(&self, epoch: u64) -> Option<u64> {
        match self.local {
            Some(l) if l.epoch == epoch => l.agreed,
            _ => self.history.iter().rev().find(|&&(e, _)| e == epoch).map(|&(_, id)| id),
        }
    }

    /// The local epoch of run id `id` (current or remembered).
    pub fn epoch_of(&self, id: u64) -> Option<u64> {
        match self.local {
            Some(l) if l.agreed == Some(id) => Some(l.epoch),
            _ if id == 0 => None,
            _ => self.history.iter().rev().find(|&&(_, i)| i == id).map(|&(e, _)| e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deliver every daemon's announcements to every other, as HELLOs would.
    fn exchange(d: &mut [Runs]) {
        for _ in 0..2 {
            for a in 0..d.len() {
                for b in (0..d.len()).filter(|&b| b != a) {
                    let (n, f, e) = d[a].announce(b as u32);
                    d[b].peer_announced(a as u32, n, f, e);
                }
            }
        }
    }

    fn cluster(n: u32) -> Vec<Runs> {
        let mut d: Vec<Runs> = (0..n).map(|r| Runs::new(r, n, 7, 100 + u64::from(r))).collect();
        for (a, x) in d.iter_mut().enumerate() {
            for b in (0..n).filter(|&b| b != a as u32) {
                x.peer_verified(b, false);
            }
        }
        d
    }

    #[test]
    fn every_daemon_agrees_on_the_same_run_and_a_rerun_gets_a_new_one() {
        let mut d = cluster(3);
        assert_eq!(d[0].waiting(), vec![Waiting::NoLocalRun]);
        for x in &mut d {
            x.begin();
        }
        exchange(&mut d);
        let first = d[0].agreed().expect("agreed");
        assert!(d.iter().all(|x| x.agreed() == Some(first)));
        for x in &mut d {
            x.end();
        }
        // Rank 0 reruns first: it waits for the others' next run, not the last.
        d[0].begin();
        exchange(&mut d);
        assert_eq!(d[0].agreed(), None);
        assert_eq!(d[0].waiting(), vec![Waiting::NotStarted(1), Waiting::NotStarted(2)]);
        d[1].begin();
        d[2].begin();
        exchange(&mut d);
        let second = d[0].agreed().expect("agreed again");
        assert_ne!(second, first);
        assert!(d.iter().all(|x| x.agreed() == Some(second)));
        // The first run's ops still map back to its epoch.
        assert_eq!(d[1].epoch_of(first), Some(1));
        assert_eq!(d[1].id_of(1), Some(first));
    }

    /// A daemon's nonce heard before it heard ours is not agreed on: a
    /// peer that ended its run (and began another) since would otherwise be
    /// agreed with on a nonce it no longer has.
    #[test]
    fn only_announcements_that_echo_our_run_are_agreed_on() {
        let mut d = cluster(2);
        d[0].begin();
        // Rank 1 has no trainers: it hears rank 0's first run (A1).
        let (n, f, e) = d[0].announce(1);
        d[1].peer_announced(0, n, f, e);
        // Rank 0's run ends and another begins (A2) before rank 1 hears of it;
        // rank 1's trainers attach now.
        d[0].end();
        d[0].begin();
        d[1].begin();
        assert_eq!(d[1].waiting(), vec![Waiting::Unconfirmed(0)], "A1 never echoed rank 1's run");
        exchange(&mut d);
        let id = d[0].agreed().expect("agreed on A2");
        assert_eq!(d[1].agreed(), Some(id));
        assert_eq!(d[0].epoch(), Some(2));
    }

    #[test]
    fn a_run_begun_before_first_contact_counts() {
        let mut d: Vec<Runs> = (0..2).map(|r| Runs::new(r, 2, 7, 5 + u64::from(r))).collect();
        d[0].begin();
        d[1].begin();
        d[0].peer_verified(1, false);
        d[1].peer_verified(0, false);
        exchange(&mut d);
        assert!(d[0].agreed().is_some() && d[0].agreed() == d[1].agreed());
    }

    #[test]
    fn a_goodbye_ends_the_agreed_run() {
        let mut d = cluster(2);
        d[0].begin();
        d[1].begin();
        exchange(&mut d);
        let id = d[0].agreed().unwrap();
        d[0].peer_left(1);
        assert_eq!(d[0].agreed(), None);
        assert_eq!(d[0].epoch_of(id), Some(1), "its ops still resolve");
        assert_eq!(d[0].waiting(), vec![Waiting::RestartedSinceRunBegan(1)]);
    }

    #[test]
    fn a_peer_still_in_the_previous_run_is_waited_for() {
        let mut d = cluster(2);
        d[0].begin();
        d[1].begin();
        exchange(&mut d);
        assert!(d[0].agreed().is_some());
        d[0].end();
        d[0].begin();
        exchange(&mut d);
        assert_eq!(d[0].waiting(), vec![Waiting::NotStarted(1)]);
    }

    #[test]
    fn a_run_that_began_before_a_peer_restarted_never_includes_it() {
        let mut d = cluster(2);
        d[0].begin();
        // Rank 1 restarts: rank 0 verifies its new session after its run began.
        d[1] = Runs::new(1, 2, 7, 999);
        d[1].peer_verified(0, false);
        d[0].peer_verified(1, true);
        d[1].begin();
        exchange(&mut d);
        assert_eq!(d[0].waiting(), vec![Waiting::RestartedSinceRunBegan(1)]);
        assert_eq!(d[1].waiting(), vec![Waiting::NotStarted(0)], "rank 0's run is not fresh for it");
        d[0].end();
        d[0].begin();
        exchange(&mut d);
        assert!(d[0].agreed().is_some() && d[0].agreed() == d[1].agreed());
    }
}
