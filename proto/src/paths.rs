//! Per-packet load balancing over many paths ("spraying"), and the health
//! of every path as the sender sees it.
//!
//! Every dlcp datagram is self-describing and order-free, so the datagrams
//! of one transfer need not follow one path through the fabric. A datapath
//! gives each of a peer pair's `N` path candidates its own UDP source port
//! (path `i` = base port + `i`): every ECMP switch hashes the 5-tuple, so a
//! different source port is (likely) a different path. The endpoint picks a
//! path for every datagram it sends ([`crate::endpoint::Transmit::path`],
//! [`crate::endpoint::Datagram::path`]); the datapath only obeys.
//!
//! The idea is that of AWS SRD (Shalev et al., "A Cloud-Optimized Transport
//! Protocol for Elastic and Scalable HPC", IEEE Micro 2020) and of
//! Ultra Ethernet / UCCL multipath and MRC: spray every packet over many
//! paths, watch each path, and steer away from one that loses (or delays)
//! more than the others, probing it back later.
//!
//! - **Choice.** DATA goes out in flowlets of [`FLOWLET`] datagrams per
//!   peer: each flowlet on a path drawn at random (the crate's seeded
//!   [`Rng`], so a simulation is reproducible) with probability
//!   proportional to the path's weight. A flowlet, not every datagram,
//!   because the socket datapath hands the kernel one GSO batch per path:
//!   drawing per datagram split every batch sixteen ways and cost 1.3× (MTU
//!   1500) to 1.6× (MTU 9000) in op time on one link (the bench's labelled
//!   `paths = 1` row). A flowlet ends early when its path is cut. A repair
//!   avoids the
//!   path its chunk was last sent on (the sender keeps one byte per chunk
//!   for that). The copies of a PROBE follow the last DATA on its path
//!   (behind it, they cannot overtake it); a probe retry takes another path.
//! - **Health, without a wire change.** The receiver does not know paths. It
//!   already tells the sender which chunks arrived: a BITMAP answering the
//!   current PROBE or LAST DATA — every segment of it — (or a COMPLETE one,
//!   or a DONE when the budget is 0) is a verdict on every chunk sent since
//!   the last verdict: delivered, or lost on the path it went on. A chunk
//!   repaired before any verdict on it (the receiver's NACK asked for it)
//!   was lost on its last path: sending it again is that verdict. (Without
//!   the last two, a 64 MiB all-gather, whose receivers NACK and whose
//!   BITMAPs take two segments at MTU 1500, reported a tenth of its losses:
//!   the repaired chunk was judged delivered on the repair's path.) A
//!   reduce-scatter receiver that closes within budget says nothing of which
//!   chunks it lacks: no verdicts. Verdicts are counted per path in a window
//!   that decays by half at every evaluation.
//! - **Loss events, not lost datagrams.** A loss judged right after a loss
//!   on the same path (the path's verdicts in the order they come: in chunk
//!   order within a transfer, where chunks of one class go out in order)
//!   continues one loss event and is not judged again, as TFRC counts loss
//!   events (RFC 5348, section 5.2): an overflowing queue drops runs of a
//!   sender's datagrams, random loss drops them one by one. Without this,
//!   the queues of the spine that carries more overflow in runs and lose as
//!   many datagrams as a spine with 1% random loss, and path health settles
//!   where the two look alike (the leaf-spine testbed: 34% of dlcp's
//!   datagrams on the lossy spine from op 10, session 39). The per-path
//!   counters for operators still count every lost datagram.
//! - **Cut and probe back.** Every `max(64, 16·N)` verdicts the peer's paths
//!   are evaluated. A path's baseline is the pooled loss rate of the other
//!   paths; a path with enough verdicts whose losses stand out —
//!   more than the baseline plus three standard deviations (and two), and more
//!   than twice the baseline plus half a percent — is cut to [`FLOOR`] weight
//!   (a small share, never zero: it still carries the odd packet, which is
//!   how it is judged again). Any other path with enough verdicts doubles
//!   its weight, up to [`FULL`]. A cut path with no verdicts also doubles its
//!   weight every [`RECOVER_AFTER`] (time is passed in: no clocks; a cut
//!   does not restart the clock of a path already at the floor), so a path
//!   whose trouble is over comes back even while the budget hides its
//!   losses. From its first recovery step a path is **on probation**: it is
//!   judged on its verdicts since, not on the window that cut it, by a
//!   sequential probability-ratio test (Wald): "just lossy enough to be
//!   cut" (the long window's bar, 1.5 times the baseline plus 0.2%)
//!   against "as good as the baseline", until the odds are 19 to 1 either
//!   way ([`PROBATION_ODDS`]) — cut again, or healed (its probation
//!   verdicts become its long window). Against a baseline of 0.05% that
//!   takes about 170 verdicts to cut a path at 1.2% and about 2,000 clean
//!   ones to heal, where a fixed test of "stands out" needed 1,000–2,000
//!   to cut (by calculation). Each cut on probation doubles
//!   its recovery step, up to `RECOVER_AFTER << MAX_BACKOFF`, and a
//!   healing resets it: a path that stays lossy is tried ever more rarely.
//! - **A long window for small differences.** The short window holds tens
//!   of verdicts per path: enough for a path that drops a fifth, not for
//!   one that loses 1% where the others lose 0.4% (a spine with 1% random
//!   loss while every link also drops a little to its queues: 0.1 against
//!   0.3 expected losses). Each path also keeps an exponential window of about
//!   [`LONG_WINDOW`] verdicts, sliding with its own verdicts (a path cut to
//!   the floor keeps its evidence while it carries little). Once paths have
//!   [`LONG_EVIDENCE`] there, each is compared with the pooled rate of the
//!   best quarter of them (when half the paths or more cross the lossy link,
//!   the others are the reference) and cut when its losses exceed that by
//!   five standard deviations and five, and its rate is above 1.5 times it
//!   plus 0.2%. Strict, because the best quarter's rate is below the true
//!   one by chance alone: with four deviations and three (a window of 2,048
//!   and twice the baseline), uniform loss of 0.2–2% on 16 paths cut a path
//!   in 15 of 80 runs of 400,000 verdicts; as set, in 1 of 80. A path cut
//!   here is probed back on probation (above); its long window would take
//!   many minutes of the odd packet to forget (before probation, such a
//!   path never came back: `heal_tests`). Unit test: paths losing 1.2%
//!   against 0.2%, 4,000 verdicts a second (at once, or in batches every
//!   1.5 s as a transfer's BITMAP brings them), carry 4–10% of the DATA from
//!   20 s on (12 seeds) and are all back at full weight 36–136 s after
//!   their loss ends.
//!   The long window and probation take 40 bytes per path and peer, the
//!   operators' counters ([`PathHealth`]) 24.
//!
//! Uniform loss on every path cuts none (nothing stands out), and a lost
//! chunk is repaired whatever path it took: path health only moves load.

use crate::rng::Rng;
use crate::time::{Duration, Instant};
use crate::transfer::PROBE_COPIES;

/// Most paths per peer (a path index is one byte).
pub const MAX_PATHS: u16 = 256;
/// Weight of a healthy path.
pub const FULL: u32 = 1024;
/// Weight of a path cut for loss (1/64 of [`FULL`]).
pub const FLOOR: u32 = FULL / 64;
/// A cut path's weight doubles after this long without a verdict that cuts it.
pub const RECOVER_AFTER: Duration = Duration::from_millis(500);
/// Most doublings of a repeat offender's recovery step (64 × 500 ms: a
/// path still lossy after several probations is tried about every three
/// minutes).
pub const MAX_BACKOFF: u8 = 6;
/// Probation is a sequential test (Wald's SPRT) between "just lossy enough
/// to be cut" and "as good as the baseline" ([`probation_odds`]): it ends
/// when the odds of one over the other reach 19 to 1 (this is their
/// logarithm).
const PROBATION_ODDS: f64 = 2.944_438_979;
/// The least loss rate either side of that test assumes (a baseline of 0
/// would make one loss proof).
const MIN_RATE: f64 = 0.000_5;
/// DATA datagrams to one peer that share a path before the next draw: one
/// GSO batch of the socket datapath (16 segments). A flowlet leaves at the
/// host's line rate, so it is a burst into whatever link its path crosses;
/// with 128 (until session 40) the leaf-spine testbed's 500 Mbit/s spine
/// links with 50-packet queues dropped 14-16k of dlcp's datagrams in a
/// clean 64 MiB run; with 16, 108 (19k once flow control stopped taking
/// reordering for loss, [`crate::flow`]), and the clean p50 fell from
/// 3.0-3.2 s to 2.4-2.6 s. On one switch the 16-path default costs no more
/// than one path with either (`bench/results/2026-12-05-flowlets.md`).
pub const FLOWLET: u32 = 16;
/// Verdicts a path needs in its window before its loss rate is compared.
const EVIDENCE: f64 = 16.0;
/// Verdicts per peer between evaluations (at least; see [`PeerPaths::epoch`]).
const EPOCH_MIN: u32 = 64;
/// Verdicts a path needs in its long window before it is compared there.
const LONG_EVIDENCE: f64 = 2048.0;
/// The long window's length in verdicts: each verdict of a path weighs
/// `1 - 1/LONG_WINDOW` of the one before (an exponential window of about
/// this many). It slides with the path's own verdicts, not with time, so a
/// path cut for loss keeps its evidence while it carries little.
const LONG_WINDOW: f64 = 8192.0;

/// One path of one peer.
#[derive(Debug, Clone, Copy)]
struct Path {
    weight: u32,
    /// Verdicts in the window (decayed): delivered and lost.
    ok: f64,
    lost: f64,
    /// The same in the long window, which forgets slowly.
    ok_long: f64,
    lost_long: f64,
    /// When the weight last changed by a cut or a recovery step.
    since: Instant,
    /// A cut path back on probation (since its first recovery step): the
    /// verdicts since then, delivered and lost. It is judged on these, not on
    /// the long window that cut it; enough of them clean heal it.
    probation: Option<(f64, f64)>,
    /// Cuts in a row on probation: each doubles the time a recovery step
    /// takes ([`RECOVER_AFTER`] << `backoff`, up to [`MAX_BACKOFF`]).
    backoff: u8,
    /// Whether this path's latest verdict was a loss: a loss right after
    /// one is the same loss event (see [`Paths::judge`]).
    in_run: bool,
    /// Every verdict and every loss so far, and the cuts (for operators).
    verdicts: u64,
    losses: u64,
    cuts: u64,
}

impl Path {
    /// How long one recovery step of this path takes.
    fn recover_after(&self) -> Duration {
        RECOVER_AFTER * (1u32 << self.backoff)
    }
}

/// How one path towards one peer stands (`dlcpctl stats`: why a path
/// carries little).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathHealth {
    /// Its share weight ([`FULL`]: healthy; [`FLOOR`]: cut).
    pub weight: u32,
    /// Verdicts on chunks sent on it so far: delivered or reported missing.
    pub verdicts: u64,
    /// Of those, reported missing.
    pub losses: u64,
    /// Times it was cut to [`FLOOR`] (from a higher weight).
    pub cuts: u64,
    /// Its rate of loss events (runs of losses count once) in the long window.
    pub long_rate: f64,
    /// The verdicts the long window holds (decayed).
    pub long_verdicts: f64,
}

/// The paths towards one peer.
#[derive(Debug, Clone)]
struct PeerPaths {
    paths: Vec<Path>,
    total: u32,
    /// Verdicts since the last evaluation.
    judged: u32,
    /// The path of the last PROBE (its next copy avoids it).
    last_probe: u8,
    /// When a cut path may next recover by time (`Instant::MAX`: none is cut).
    recover_at: Instant,
    /// The current flowlet's path and the datagrams it may still carry.
    flowlet: (u8, u32),
    /// The path of the last DATA, and the PROBEs sent on it since.
    last_data: u8,
    probes_on_last: usize,
    /// Cuts only the long window called for (the short one did not).
    long_cuts: u64,
}

impl PeerPaths {
    fn new(n: u16, now: Instant) -> PeerPaths {
        let p = Path {
            weight: FULL,
            ok: 0.0,
            lost: 0.0,
            ok_long: 0.0,
            lost_long: 0.0,
            since: now,
            probation: None,
            backoff: 0,
            in_run: false,
            verdicts: 0,
            losses: 0,
            cuts: 0,
        };
        PeerPaths {
            paths: vec![p; usize::from(n)],
            total: FULL * u32::from(n),
            judged: 0,
            last_probe: 0,
            recover_at: Instant::MAX,
            flowlet: (0, 0),
            last_data: 0,
            probes_on_last: 0,
            long_cuts: 0,
        }
    }

    /// Verdicts between evaluations.
    fn epoch(&self) -> u32 {
        EPOCH_MIN.max(16 * self.paths.len() as u32)
    }

    fn retotal(&mut self) {
        self.total = self.paths.iter().map(|p| p.weight).sum();
        self.recover_at = self
            .paths
            .iter()
            .filter(|p| p.weight < FULL)
            .map(|p| p.since + p.recover_after())
            .min()
            .unwrap_or(Instant::MAX);
    }

    /// A path drawn by weight, not `avoid` (unless it is the only one).
    fn draw(&self, rng: &mut Rng, avoid: Option<u8>) -> u8 {
        let skip = avoid.filter(|&a| usize::from(a) < self.paths.len() && self.paths.len() > 1);
        let total = self.total - skip.map_or(0, |a| self.paths[usize::from(a)].weight);
        let mut r = rng.below(u64::from(total)) as u32;
        for (i, p) in self.paths.iter().enumerate() {
            if skip == Some(i as u8) {
                continue;
            }
            if r < p.weight {
                return i as u8;
            }
            r -= p.weight;
        }
        // Unreachable with a positive total; the last path otherwise.
        (self.paths.len() - 1) as u8
    }

    /// Double the weight of every cut path whose time has come.
    fn recover(&mut self, now: Instant) {
        if now < self.recover_at {
            return;
        }
        for p in self.paths.iter_mut().filter(|p| p.weight < FULL && p.since + p.recover_after() <= now) {
            p.weight = (p.weight * 2).min(FULL);
            p.since = now;
            p.probation.get_or_insert((0.0, 0.0));
        }
        self.retotal();
    }

    /// The long windows' baseline: the pooled loss rate of the best quarter
    /// of the paths that have [`LONG_EVIDENCE`] there (at least one), or
    /// `None` while fewer than two have. Not all the others: when half the
    /// paths or more cross a lossy link (a hash need not split them evenly
    /// over two spines), the paths that do not are the reference.
    fn long_base(&self) -> Option<f64> {
        let mut rates: Vec<(f64, f64, f64)> = self
            .paths
            .iter()
            .map(|p| (p.ok_long + p.lost_long, p.lost_long))
            .filter(|&(n, _)| n >= LONG_EVIDENCE)
            .map(|(n, lost)| (lost / n, n, lost))
            .collect();
        if rates.len() < 2 {
            return None;
        }
        rates.sort_by(|a, b| a.0.total_cmp(&b.0));
        let best = &rates[..rates.len().div_ceil(4)];
        let (n, lost) = best.iter().fold((0.0, 0.0), |(n, l), r| (n + r.1, l + r.2));
        Some(lost / n)
    }

    /// Compare the paths' windows (see the module docs); the windows decay.
    fn evaluate(&mut self, now: Instant) {
        self.judged = 0;
        let (ok, lost) = self.paths.iter().fold((0.0, 0.0), |(o, l), p| (o + p.ok, l + p.lost));
        let long_base = self.long_base();
        for p in &mut self.paths {
            let n = p.ok + p.lost;
            let nl = p.ok_long + p.lost_long;
            let short_evidence = n >= EVIDENCE;
            let long_evidence = nl >= LONG_EVIDENCE;
            if !(short_evidence || long_evidence && long_base.is_some()) {
                continue;
            }
            // The loss rate of the other paths together: one bad path does
            // not raise the bar it is measured against.
            let others = ok + lost - n;
            let base = if others > 0.0 { (lost - p.lost) / others } else { 0.0 };
            let fast = short_evidence && stands_out(p.lost, n, base, (3.0, 2.0), (2.0, 0.005));
            // The long window sees what the short one cannot: a path that
            // loses 1% where the others lose 0.4% takes thousands of
            // verdicts to tell apart (five standard deviations and five above
            // the baseline, and more than 1.5 times it plus 0.2%: the best
            // quarter's rate is below the paths' true one by chance alone).
            // A path on probation is judged on its verdicts since: the long
            // window that cut it forgets too slowly for it ever to heal.
            let trial = match (p.probation, long_base) {
                (Some((ok, lost)), Some(b)) => probation_odds(ok, lost, b),
                _ => 0.0,
            };
            let slow = match p.probation {
                Some(_) => trial > PROBATION_ODDS,
                None => {
                    long_evidence
                        && long_base.is_some_and(|b| stands_out(p.lost_long, nl, b, (5.0, 5.0), (1.5, 0.002)))
                }
            };
            if fast || slow {
                // Cut from above the floor only: a path at the floor keeps
                // the clock of its recovery running from its cut.
                if p.weight > FLOOR {
                    self.long_cuts += u64::from(!fast);
                    p.cuts += 1;
                    if p.probation.take().is_some() {
                        p.backoff = (p.backoff + 1).min(MAX_BACKOFF);
                    }
                    p.weight = FLOOR;
                    p.since = now;
                }
            } else {
                if let Some((ok, lost)) = p.probation
                    && trial < -PROBATION_ODDS
                {
                    // Healed: what it did on probation is its record now.
                    (p.ok_long, p.lost_long) = (ok, lost);
                    p.probation = None;
                    p.backoff = 0;
                }
                if short_evidence {
                    p.weight = (p.weight * 2).min(FULL);
                    p.since = now;
                }
            }
            if short_evidence {
                p.ok /= 2.0;
                p.lost /= 2.0;
            }
        }
        self.retotal();
    }
}

/// The log-odds of `lost` losses and `ok` deliveries under the least loss
/// rate the long window cuts for (1.5 times `base` plus 0.2%, at least twice
/// it) against `base` (at least [`MIN_RATE`]): positive says still lossy,
/// negative healed. Not the rate that cut the path: a path cut on a burst
/// of queue drops (tens of percent in the short window) would pass as
/// healed at 2%, nearer the baseline than the burst.
fn probation_odds(ok: f64, lost: f64, base: f64) -> f64 {
    let b = base.max(MIN_RATE);
    let r = (1.5 * b + 0.002).max(2.0 * b).min(0.5);
    lost * (r / b).ln() + ok * ((1.0 - r) / (1.0 - b)).ln()
}

/// Whether `lost` of `n` verdicts stand out against a loss rate of `base`:
/// more than expected by `sd.0` standard deviations plus `sd.1`, and a rate
/// above `rate.0` times `base` plus `rate.1`.
fn stands_out(lost: f64, n: f64, base: f64, sd: (f64, f64), rate: (f64, f64)) -> bool {
    lost > n * base + sd.0 * (n * base * (1.0 - base)).sqrt() + sd.1 && lost / n > rate.0 * base + rate.1
}

/// The paths towards every peer (see the module docs).
#[derive(Debug, Clone)]
pub struct Paths {
    n: u16,
    peers: Vec<PeerPaths>,
    rng: Rng,
}

impl Paths {
    /// `n` paths (clamped to `1..=`[`MAX_PATHS`]) towards each of `world`
    /// peers, drawing from a generator seeded with `seed`.
    pub fn new(n: u16, world: u32, seed: u64, now: Instant) -> Paths {
        let n = n.clamp(1, MAX_PATHS);
        Paths { n, peers: (0..world).map(|_| PeerPaths::new(n, now)).collect(), rng: Rng::new(seed) }
    }

    /// Paths per peer.
    pub fn count(&self) -> u16 {
        self.n
    }

    /// Whether there is more than one path (the sender keeps per-chunk paths).
    pub fn multipath(&self) -> bool {
        self.n > 1
    }

    /// The weight of `path` towards `peer` ([`FULL`]: healthy; 0 for a peer
    /// or path that does not exist).
    pub fn weight(&self, peer: u32, path: u8) -> u32 {
        self.peers.get(peer as usize).and_then(|p| p.paths.get(usize::from(path))).map_or(0, |p| p.weight)
    }

    /// How each path towards `peer` stands (empty for a peer that does not
    /// exist).
    pub fn health(&self, peer: u32) -> Vec<PathHealth> {
        let Some(pp) = self.peers.get(peer as usize) else { return Vec::new() };
        pp.paths
            .iter()
            .map(|p| {
                let n = p.ok_long + p.lost_long;
                PathHealth {
                    weight: p.weight,
                    verdicts: p.verdicts,
                    losses: p.losses,
                    cuts: p.cuts,
                    long_rate: if n > 0.0 { p.lost_long / n } else { 0.0 },
                    long_verdicts: n,
                }
            })
            .collect()
    }

    /// Cuts of `peer`'s paths that only the long window called for.
    #[cfg(test)]
    fn long_cuts(&self, peer: u32) -> u64 {
        self.peers.get(peer as usize).map_or(0, |p| p.long_cuts)
    }

    /// The lowest weight any peer gives `path`.
    pub fn min_weight(&self, path: u8) -> u32 {
        (0..self.peers.len() as u32).map(|j| self.weight(j, path)).min().unwrap_or(FULL)
    }

    /// The path of the next datagram to `peer`: the current flowlet's while
    /// it lasts and its path is healthy, else drawn by weight; with `avoid`
    /// (a repair avoids the path its chunk was lost on) drawn alone, not
    /// `avoid`, leaving the flowlet as it is. Always 0 with one path.
    pub fn pick(&mut self, peer: u32, avoid: Option<u8>, now: Instant) -> u8 {
        if self.n == 1 {
            return 0;
        }
        let Some(pp) = self.peers.get_mut(peer as usize) else { return 0 };
        pp.recover(now);
        let path = if avoid.is_some() {
            pp.draw(&mut self.rng, avoid)
        } else if pp.flowlet.1 > 0 && pp.paths[usize::from(pp.flowlet.0)].weight == FULL {
            pp.flowlet.1 -= 1;
            pp.flowlet.0
        } else {
            let path = pp.draw(&mut self.rng, None);
            pp.flowlet = (path, FLOWLET - 1);
            path
        };
        (pp.last_data, pp.probes_on_last) = (path, 0);
        path
    }

    /// The path of a PROBE to `peer`: the path of the last DATA for the
    /// first [`PROBE_COPIES`] PROBEs after it (behind that DATA on its path,
    /// a PROBE cannot overtake it: a receiver could otherwise close on a
    /// PROBE while the last flowlet is still on a longer path); a retry
    /// after that is drawn by weight and not the previous PROBE's path (a
    /// dead path does not swallow every retry).
    pub fn pick_probe(&mut self, peer: u32, now: Instant) -> u8 {
        if self.n == 1 {
            return 0;
        }
        let Some(pp) = self.peers.get_mut(peer as usize) else { return 0 };
        let path = if pp.probes_on_last < PROBE_COPIES {
            pp.probes_on_last += 1;
            pp.last_data
        } else {
            let last = pp.last_probe;
            let path = self.pick(peer, Some(last), now);
            self.peers[peer as usize].probes_on_last = PROBE_COPIES;
            path
        };
        if let Some(pp) = self.peers.get_mut(peer as usize) {
            pp.last_probe = path;
        }
        path
    }

    /// A verdict from `peer`'s feedback: the chunk sent on `path` was
    /// `delivered` (or reported missing). Returns true when the peer's paths
    /// were evaluated (their weights may have changed).
    pub fn judge(&mut self, peer: u32, path: u8, delivered: bool, now: Instant) -> bool {
        let Some(pp) = self.peers.get_mut(peer as usize) else { return false };
        let Some(p) = pp.paths.get_mut(usize::from(path)) else { return false };
        p.verdicts += 1;
        p.losses += u64::from(!delivered);
        // A loss right after a loss on the same path continues one loss
        // event: counted for operators, not judged again.
        let continues = !delivered && p.in_run;
        p.in_run = !delivered;
        if continues {
            return false;
        }
        p.ok_long *= 1.0 - 1.0 / LONG_WINDOW;
        p.lost_long *= 1.0 - 1.0 / LONG_WINDOW;
        if let Some((ok, lost)) = &mut p.probation {
            *if delivered { ok } else { lost } += 1.0;
        }
        if delivered {
            p.ok += 1.0;
            p.ok_long += 1.0;
        } else {
            p.lost += 1.0;
            p.lost_long += 1.0;
        }
        pp.judged += 1;
        if pp.judged < pp.epoch() {
            return false;
        }
        pp.evaluate(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    fn shares(p: &mut Paths, peer: u32, draws: u32, now: Instant) -> Vec<u32> {
        let mut c = vec![0; usize::from(p.count())];
        for _ in 0..draws {
            c[usize::from(p.pick(peer, None, now))] += 1;
        }
        c
    }

    #[test]
    fn data_goes_in_flowlets_and_a_repair_leaves_the_flowlet_alone() {
        let mut p = Paths::new(16, 2, 7, t(0));
        let mut runs = Vec::new();
        let (mut last, mut run) = (p.pick(1, None, t(0)), 1u32);
        for i in 1..(FLOWLET * 64) {
            if i % 7 == 0 {
                // A repair in between: drawn alone, the flowlet goes on.
                assert_ne!(p.pick(1, Some(last), t(0)), last);
            }
            let path = p.pick(1, None, t(0));
            if path == last {
                run += 1;
            } else {
                runs.push(run);
                (last, run) = (path, 1);
            }
        }
        // Two flowlets in a row may draw the same path: runs are multiples of FLOWLET.
        assert!(runs.iter().all(|&r| r % FLOWLET == 0), "{runs:?}");
        assert!(runs.len() >= 32, "flowlets change paths: {runs:?}");
    }

    #[test]
    fn one_path_is_always_path_zero() {
        let mut p = Paths::new(1, 2, 7, t(0));
        assert!(!p.multipath());
        assert!((0..100).all(|_| p.pick(1, Some(0), t(0)) == 0));
    }

    #[test]
    fn healthy_paths_share_evenly_and_repairs_avoid_their_path() {
        let mut p = Paths::new(8, 2, 7, t(0));
        let c = shares(&mut p, 1, 800_000, t(0));
        assert!(c.iter().all(|&k| (90_000..110_000).contains(&k)), "{c:?}");
        assert!((0..1000).all(|_| p.pick(1, Some(3), t(0)) != 3));
        let data = p.pick(1, None, t(0));
        assert_eq!(p.pick_probe(1, t(0)), data, "a PROBE follows the last DATA on its path");
        assert_eq!(p.pick_probe(1, t(0)), data, "and so does its copy");
        let retry = p.pick_probe(1, t(0));
        assert_ne!(retry, data, "a retry takes another path");
        assert_ne!(p.pick_probe(1, t(0)), retry, "and the next one another again");
    }

    #[test]
    fn a_lossy_path_is_cut_to_the_floor_and_probed_back() {
        let mut p = Paths::new(8, 2, 7, t(0));
        let mut rng = Rng::new(3);
        // Path 5 loses 20%, the others 1%.
        for _ in 0..4000 {
            let path = p.pick(1, None, t(1));
            let loss = if path == 5 { 0.2 } else { 0.01 };
            p.judge(1, path, !rng.chance(loss), t(1));
        }
        // Cut to the floor; with flowlets its verdicts come in bursts, so the
        // last evaluation may have let it take one recovery step since.
        assert!(p.weight(1, 5) <= 2 * FLOOR, "{}", p.weight(1, 5));
        let w: Vec<u32> = (0..8).map(|i| p.weight(1, i)).collect();
        assert!((0..8usize).filter(|&i| i != 5).all(|i| w[i] == FULL), "no healthy path is cut: {w:?}");
        // What an operator sees: every verdict counted, the cut on path 5 alone.
        let h = p.health(1);
        assert_eq!(h.iter().map(|x| x.verdicts).sum::<u64>(), 4000);
        assert!(h[5].cuts >= 1 && h[5].weight == p.weight(1, 5), "{:?}", h[5]);
        assert!(h.iter().enumerate().all(|(i, x)| (i == 5) == (x.cuts > 0)), "{h:?}");
        assert!(h[5].losses * 10 > h[5].verdicts && h[5].long_rate > 0.1, "{:?}", h[5]);
        assert!(p.health(7).is_empty(), "no such peer");
        let c = shares(&mut p, 1, 100_000, t(1));
        assert!(c[5] < 1000, "the cut path carries under 1%: {c:?}");
        assert!(c[5] > 0, "but not nothing");
        // Its trouble over and no verdicts: it doubles every RECOVER_AFTER.
        let before = p.weight(1, 5);
        p.pick(1, None, t(1) + RECOVER_AFTER);
        assert_eq!(p.weight(1, 5), 2 * before);
        for k in 2..=7 {
            p.pick(1, None, t(1) + RECOVER_AFTER * k);
        }
        assert_eq!(p.weight(1, 5), FULL);
    }

    /// `verdicts` verdicts over 16 paths, path `i` losing `loss(i)`: the
    /// paths' weights at the end.
    fn run_verdicts(seed: u64, verdicts: u32, loss: impl Fn(u8) -> f64) -> Vec<u32> {
        let mut p = Paths::new(16, 2, seed, t(0));
        let mut rng = Rng::new(seed + 1);
        for _ in 0..verdicts {
            let path = p.pick(1, None, t(1));
            p.judge(1, path, !rng.chance(loss(path)), t(1));
        }
        (0..16).map(|i| p.weight(1, i)).collect()
    }

    #[test]
    fn half_the_paths_losing_one_percent_more_than_the_others_are_cut() {
        // A spine with 1% random loss under paths 8..16, every path losing
        // 0.2% to queues besides: the short window cannot tell 1.2% from
        // 0.2% (under one loss in its tens of verdicts), the long one can;
        // and 2.5% from 1%, and 1% from 0.4% (the leaf-spine testbed's).
        for (seed, bad, good) in [(3, 0.012, 0.002), (5, 0.012, 0.002), (7, 0.025, 0.01), (9, 0.01, 0.004)] {
            let w = run_verdicts(seed, 400_000, |p| if p >= 8 { bad } else { good });
            let cut = w[8..].iter().filter(|&&x| x <= 2 * FLOOR).count();
            // (The short window may be letting a healthy path back up after
            // a chance cut: with flowlets a path's verdicts come a hundred at
            // a time.)
            assert!(w[..8].iter().all(|&x| x > 2 * FLOOR), "seed {seed}: no healthy path is cut: {w:?}");
            assert!(cut >= 7, "seed {seed}: the lossy half is cut: {w:?}");
        }
    }

    #[test]
    fn runs_of_losses_weigh_as_one_event_and_random_loss_stands_out() {
        // Paths 0..8 behind a queue that overflows now and then, dropping
        // eight of this sender's datagrams in a row (1.6% of them lost, in
        // 0.2% events); paths 8..16 behind a spine with 1% random loss. By
        // lost datagrams the queue's paths look worse; by loss events the
        // random loss stands out, and it is the one to steer away from.
        for seed in [21u64, 23, 25] {
            let mut p = Paths::new(16, 2, seed, t(0));
            let mut rng = Rng::new(seed + 1);
            let mut run = [0u32; 16];
            for _ in 0..400_000 {
                let path = p.pick(1, None, t(1));
                let i = usize::from(path);
                let lost = if path >= 8 {
                    rng.chance(0.01)
                } else if run[i] > 0 {
                    run[i] -= 1;
                    true
                } else if rng.chance(0.002) {
                    run[i] = 7;
                    true
                } else {
                    false
                };
                p.judge(1, path, !lost, t(1));
            }
            let w: Vec<u32> = (0..16).map(|i| p.weight(1, i)).collect();
            assert!(w[..8].iter().all(|&x| x > 2 * FLOOR), "seed {seed}: no queue path is cut: {w:?}");
            let cut = w[8..].iter().filter(|&&x| x <= 2 * FLOOR).count();
            assert!(cut >= 7, "seed {seed}: the randomly lossy half is cut: {w:?}");
            let h = p.health(1);
            assert!(h[0].losses > h[0].verdicts / 100, "every lost datagram still counted: {:?}", h[0]);
        }
    }

    #[test]
    fn uniform_loss_cuts_no_path_in_the_long_window_either() {
        for (seed, loss) in [(11, 0.01), (13, 0.01), (17, 0.002), (19, 0.02)] {
            let mut p = Paths::new(16, 2, seed, t(0));
            let mut rng = Rng::new(seed + 1);
            for _ in 0..400_000 {
                let path = p.pick(1, None, t(1));
                p.judge(1, path, !rng.chance(loss), t(1));
            }
            // (The short window cuts a path now and then by chance: with
            // flowlets a path's verdicts come a hundred at a time.)
            assert_eq!(p.long_cuts(1), 0, "seed {seed}, loss {loss}");
        }
    }

    #[test]
    fn uniform_loss_cuts_no_path() {
        let mut p = Paths::new(16, 2, 9, t(0));
        let mut rng = Rng::new(4);
        for _ in 0..50_000 {
            let path = p.pick(1, None, t(0));
            p.judge(1, path, !rng.chance(0.05), t(0));
        }
        assert!((0..16).all(|i| p.weight(1, i) == FULL));
        assert_eq!(p.min_weight(3), FULL);
    }
}

#[cfg(test)]
mod heal_tests {
    use super::*;

    /// `rate` verdicts a second to peer 1 over 16 paths, paths 8..16 losing
    /// 1.2% (the others 0.2%) until `heal_at`, every path 0.2% after, until
    /// `end` (seconds). Returns the lossy half's share of the DATA picked in
    /// `20..heal_at`, the share in the last 100 s, and how long after
    /// `heal_at` the lossy half was first all back at full weight.
    ///
    /// The verdicts come in batches every `batch_ms` (0: at once), as a
    /// transfer's BITMAP judges every chunk it carried.
    fn heal_run(seed: u64, rate: u64, heal_at: u64, end: u64, batch_ms: u64) -> (f64, f64, f64) {
        let mut p = Paths::new(16, 2, seed, Instant::ZERO);
        let mut rng = Rng::new(seed + 1);
        let mut pending: Vec<(u8, bool)> = Vec::new();
        let batch = (rate * batch_ms / 1000).max(1);
        let (mut lossy_early, mut all_early, mut lossy_late, mut all_late) = (0u64, 0u64, 0u64, 0u64);
        let mut healed = None;
        for k in 0..rate * end {
            let now = Instant::from_nanos(k * 1_000_000_000 / rate);
            let t = k as f64 / rate as f64;
            let path = p.pick(1, None, now);
            let lossy = path >= 8;
            if t >= 20.0 && t < heal_at as f64 {
                (lossy_early, all_early) = (lossy_early + u64::from(lossy), all_early + 1);
            }
            if t >= (end - 100) as f64 {
                (lossy_late, all_late) = (lossy_late + u64::from(lossy), all_late + 1);
            }
            let loss = if lossy && t < heal_at as f64 { 0.012 } else { 0.002 };
            pending.push((path, !rng.chance(loss)));
            if k % batch == batch - 1 {
                for (path, ok) in pending.drain(..) {
                    p.judge(1, path, ok, now);
                }
            }
            if healed.is_none() && t >= heal_at as f64 && (8..16).all(|i| p.weight(1, i) == FULL) {
                healed = Some(t - heal_at as f64);
            }
        }
        (
            lossy_early as f64 / all_early as f64,
            lossy_late as f64 / all_late as f64,
            healed.unwrap_or(f64::INFINITY),
        )
    }

    #[test]
    fn a_path_cut_by_the_long_window_heals_when_its_loss_ends() {
        for (seed, batch_ms) in [(0, 0), (1, 0), (2, 1500), (3, 1500)] {
            let (early, late, healed) = heal_run(seed, 4000, 60, 400, batch_ms);
            eprintln!(
                "seed {seed}, verdicts every {batch_ms} ms: lossy half's share 20-60 s {early:.3}, last 100 s \
                 {late:.3}; healed after {healed:.0} s"
            );
            assert!(early < 0.2, "seed {seed}: the lossy half carries under a fifth while lossy: {early:.3}");
            assert!(late > 0.4, "seed {seed}: healed, it carries its half again: {late:.3}");
            assert!(
                healed < 180.0,
                "seed {seed}: the lossy half all at full weight within 3 min: {healed:.0} s"
            );
        }
    }
}
