//! A receiver's record of which of one sender's DATA datagrams arrived, and
//! how late the ones it waited for came: its **reordering window**, how
//! long a receiver waits for DATA sent before a LAST DATA or PROBE that has
//! not arrived.
//!
//! With several paths of different delays, datagrams a sender sent before
//! its LAST (or PROBE) can land after it, so a receiver that counted them
//! missing at once would close transfers with chunks still on their way
//! (`Flow::arrived` counts exactly which arrived). But waiting a probe
//! timeout for the missing ones costs that timeout on every transfer that
//! really lost a datagram: on the 4-host testbed (16 paths, 1% loss) every
//! op went from about 13 ms to 410 ms. How long to wait is what the
//! receiver has measured, as RACK-TLP's reordering window does at a sender
//! (Cheng et al., RFC 8985, section 6.2: a packet is taken as lost once
//! one sent after it was delivered more than `reo_wnd` ago; `reo_wnd` is 0
//! until reordering is seen, then `min_RTT / 4`, and grows when DSACKs show
//! a loss was spurious). Here, at the receiver, per sender:
//!
//! - **A lag sample** is how long after a LAST or PROBE that found some of
//!   the DATA sent before it missing one of those arrived (any arrival of
//!   them from then on, also after the receiver gave them up and closed or
//!   NACKed: as RACK's DSACKs, a wait that was too short lengthens the
//!   next). Only the last such LAST or PROBE is kept. Datagrams that
//!   reorder in the middle of a transfer are no samples: on the testbed the
//!   sender's per-path, per-class socket queues reorder a burst by up to
//!   tens of milliseconds while its tail, flushed last, comes in order, and
//!   such samples made every op wait (p50 13 -> 23 ms).
//! - **The lag** jumps up to a larger sample and moves an eighth of the way
//!   down to a smaller one; each wait that ended with datagrams still
//!   missing (taken as lost, `Flow::take_as_lost`) shrinks it by a quarter,
//!   so an old outlier stops costing once losses keep proving it too long.
//! - **The wait** after a LAST or PROBE for DATA sent before it is
//!   [`REORDER_SAFETY`] lags, at most the probe timeout, and none before
//!   the first sample (RACK's `reo_wnd` of 0 before reordering is seen; no
//!   `min_RTT / 4` default, which at these round trips is below the
//!   receiver's close grace anyway). While data keeps arriving the receiver
//!   waits anyway (the settle of `transfer::recv`); this wait is for the
//!   silence before a datagram still on a slower path lands.
//!
//! Measured, on the testbed (60 ops): samples p50 0, p90 0.26 ms, p99
//! 2.6 ms; waits p50 0, p90 0.11 ms; op p50 13.3 ms (main 13.0 ms, a
//! probe-timeout wait 410 ms). Tried and dropped: samples from any
//! reordering (mid-transfer too): p50 23 ms; a start at the probe timeout
//! shrinking per loss proved real: p50 18-20 ms. Known cost of no start: a
//! receiver's first late tail is closed out or NACKed (multipath_sim's
//! 8 equal paths, one losing 20%, 1% budget: 30-37 chunks reported lost on
//! healthy paths in ops 1-2, before the lag is learned).
//!
//! State per sender: 128 bytes of arrival bits, the wait's start and the
//! lag (O(1) in the number of ranks and datagrams).

use super::Flow;
use crate::time::{Duration, Instant};
use crate::transfer::Behind;

/// How many of a sender's data sequence numbers below its highest the
/// receiver remembers the arrival of (`Flow::arrived`): more than a
/// datagram on a slower path falls behind (a sender's window bounds it).
pub(crate) const ARRIVAL_WINDOW: u64 = 1024;

/// The wait for DATA sent before a LAST or PROBE, in measured lags.
pub(crate) const REORDER_SAFETY: u32 = 2;

const WORDS: usize = (ARRIVAL_WINDOW / 64) as usize;

/// The word of the record that holds `dseq`, and its bit there.
fn ring_slot(dseq: u64) -> (usize, u64) {
    let i = dseq % ARRIVAL_WINDOW;
    ((i / 64) as usize, 1 << (i % 64))
}

/// The arrival record of one sender: bit `d % ARRIVAL_WINDOW` says whether
/// data sequence number `d` arrived, for `d` in the window below its
/// highest; and the sender's reordering lag.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Arrivals {
    bits: [u64; WORDS],
    /// The last LAST DATA or PROBE that found DATA sent before it missing:
    /// how many it said were sent, and when it arrived.
    waiting: Option<(u64, Instant)>,
    /// The smoothed lag; `None` while there was no sample.
    lag: Option<Duration>,
}

impl Arrivals {
    /// The highest moves from `from` to `to`: the sequence numbers in
    /// between come into the window as not arrived (the ones they replace
    /// leave it).
    pub(crate) fn advance(&mut self, from: u64, to: u64) {
        for d in from.max(to.saturating_sub(ARRIVAL_WINDOW))..to {
            let (w, b) = ring_slot(d);
            self.bits[w] &= !b;
        }
    }

    /// DATA `d` arrived at `now`, the highest having been `high`: record
    /// it, and if the last LAST or PROBE found it missing, take the lag
    /// sample: how long after that it came.
    pub(crate) fn note(&mut self, d: u64, high: u64, now: Instant) {
        let new = d >= high || (d + ARRIVAL_WINDOW >= high && !self.has(d));
        self.advance(high, d + 1);
        if d + ARRIVAL_WINDOW < high.max(d + 1) {
            return;
        }
        let (w, b) = ring_slot(d);
        self.bits[w] |= b;
        if let Some((sent, at)) = self.waiting
            && new
            && d < sent
        {
            let sample = now.saturating_duration_since(at);
            self.lag = Some(match self.lag {
                Some(lag) if sample < lag => lag - (lag - sample) / 8,
                _ => sample,
            });
        }
    }

    /// A LAST DATA or PROBE that arrived at `now` found some of the `sent`
    /// DATA datagrams sent before it missing: their arrivals from now on
    /// are lag samples (a later one that says the same keeps the start).
    pub(crate) fn waiting(&mut self, sent: u64, now: Instant) {
        if self.waiting.is_none_or(|(s, _)| s < sent) {
            self.waiting = Some((sent, now));
        }
    }

    /// Whether `d` (within the window below the highest) arrived.
    pub(crate) fn has(&self, d: u64) -> bool {
        let (w, b) = ring_slot(d);
        self.bits[w] & b != 0
    }

    /// A wait ended with datagrams still missing (taken as lost): the lag
    /// shrinks by a quarter.
    pub(crate) fn decay(&mut self) {
        if let Some(lag) = self.lag.as_mut() {
            *lag -= *lag / 4;
        }
    }

    /// The smoothed lag, if there was a sample.
    #[cfg(test)]
    pub(crate) fn lag(&self) -> Option<Duration> {
        self.lag
    }

    /// How long to wait after a LAST or PROBE for DATA sent before it that
    /// has not arrived: [`REORDER_SAFETY`] lags, at most `cap` (the probe
    /// timeout); none before the first sample.
    pub(crate) fn wait(&self, cap: Duration) -> Duration {
        self.lag.map_or(Duration::ZERO, |lag| lag.saturating_mul(REORDER_SAFETY).min(cap))
    }
}

impl Flow {
    /// `dseq` (low 32 bits) of a DATA datagram from `src` that arrived,
    /// extended to 64 bits around the highest seen.
    pub(crate) fn extend(&self, src: u32, dseq: u32) -> u64 {
        let high = self.rx.get(src as usize).map_or(0, |r| r.high);
        high.saturating_add_signed(i64::from(dseq.wrapping_sub(high as u32) as i32))
    }

    /// How many of the first `sent` DATA datagrams of `src` arrived, and
    /// whether they may arrive out of order. With several paths configured
    /// (`multipath`), or once `src`'s datagrams were seen reordered
    /// ([`Flow::reordering`]), they may, from the start: the count is then
    /// exact, from the record of which data sequence numbers arrived (the
    /// last [`ARRIVAL_WINDOW`] below the highest; older ones count as here),
    /// so datagrams `src` sent later, on faster paths, make up for none of
    /// the earlier ones still on slower paths. Otherwise [`Flow::high`]:
    /// what the highest arrival says was sent before it.
    pub(crate) fn arrived(&self, src: u32, sent: u64, multipath: bool) -> (u64, bool) {
        let (Some(r), Some(bits)) = (self.rx.get(src as usize), self.arrivals.get(src as usize)) else {
            return (0, false);
        };
        if !(multipath || self.reordering(src)) {
            return (r.high, false);
        }
        let from = r.high.saturating_sub(ARRIVAL_WINDOW).max(r.lost_below);
        let gaps = (from..sent.min(r.high)).filter(|&d| !bits.has(d)).count() as u64;
        (sent - gaps - sent.saturating_sub(r.high.max(from)), true)
    }

    /// A receiver waited for `src`'s first `sent` DATA datagrams as long as
    /// datagrams on their way can take (see [`Flow::arrived`],
    /// [`Flow::reorder_wait`]): the ones still missing are lost, and no
    /// later PROBE waits for them again. If some were, the wait was not
    /// cut short by them arriving: `src`'s reordering lag shrinks.
    pub(crate) fn take_as_lost(&mut self, src: u32, sent: u64) {
        let missing = self.rx.get(src as usize).is_some_and(|r| sent > r.lost_below)
            && self.arrived(src, sent, true).0 < sent;
        if let (Some(r), Some(bits)) = (self.rx.get_mut(src as usize), self.arrivals.get_mut(src as usize)) {
            r.lost_below = r.lost_below.max(sent);
            if missing {
                bits.decay();
            }
        }
    }

    /// A LAST DATA or PROBE from `src` arrived at `now`, which sent `sent`
    /// DATA datagrams before it: how many of them arrived, whether they may
    /// reorder ([`Flow::arrived`]), and if some may still be on their way,
    /// how long to wait for them: twice the lag measured of `src`'s
    /// datagrams that such a wait found missing, at most `cap` (the probe
    /// timeout), none before the first such sample ([`arrivals`]).
    pub(crate) fn behind(
        &mut self,
        src: u32,
        sent: u64,
        multipath: bool,
        cap: Duration,
        now: Instant,
    ) -> Behind {
        let (seen, reordering) = self.arrived(src, sent, multipath);
        let Some(a) = self.arrivals.get_mut(src as usize) else {
            return Behind { sent, seen, reordering, wait: Duration::ZERO };
        };
        if reordering && seen < sent {
            a.waiting(sent, now);
        }
        Behind { sent, seen, reordering, wait: a.wait(cap) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(us: u64) -> Instant {
        Instant::from_nanos(us * 1000)
    }

    fn flow(window: u32, world: u32) -> Flow {
        Flow::new(crate::flow::FlowConfig::with_window(window), world)
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// Feed arrivals `(dseq, µs)` in order.
    fn feed(a: &mut Arrivals, high: &mut u64, arrivals: &[(u64, u64)]) {
        for &(d, t) in arrivals {
            a.note(d, *high, at(t));
            *high = (*high).max(d + 1);
        }
    }

    #[test]
    fn reordering_within_a_transfer_is_no_sample() {
        let (mut a, mut high) = (Arrivals::default(), 0);
        // 0..100, 40 to 49 overtaken by 50..99 (by 5 ms), 30 lost.
        let order: Vec<(u64, u64)> =
            (0..40).chain(50..100).chain(40..50).filter(|&d| d != 30).map(|d| (d, 10 * d)).collect();
        feed(&mut a, &mut high, &order);
        assert_eq!(a.lag(), None);
        assert!(a.has(29) && !a.has(30) && a.has(45));
        assert_eq!(a.wait(us(200_000)), Duration::ZERO, "a real loss is not waited for");
        // A LAST finds 30 missing; it never comes: still no sample.
        a.waiting(100, at(1000));
        a.decay();
        assert_eq!(a.wait(us(200_000)), Duration::ZERO);
    }

    #[test]
    fn the_lag_is_how_long_after_a_last_or_probe_what_it_found_missing_came() {
        let (mut a, mut high) = (Arrivals::default(), 0);
        // The LAST (dseq 9) at 100 µs finds 5 and 6 missing.
        feed(&mut a, &mut high, &[(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (7, 0), (8, 0), (9, 100)]);
        a.waiting(10, at(100));
        a.waiting(10, at(180));
        feed(&mut a, &mut high, &[(10, 120), (5, 250)]);
        assert_eq!(a.lag(), Some(us(150)), "from the first LAST or PROBE that found it missing");
        assert_eq!(a.wait(us(1000)), us(300));
        assert_eq!(a.wait(us(200)), us(200), "at most the cap");
        // A duplicate is no sample; 6 after the wait ended is (a larger one
        // raises the lag at once); a smaller one moves it an eighth down.
        feed(&mut a, &mut high, &[(5, 900), (6, 700)]);
        assert_eq!(a.lag(), Some(us(600)));
        a.waiting(20, at(1000));
        feed(&mut a, &mut high, &[(11, 1040)]);
        assert_eq!(a.lag(), Some(us(600 - 560 / 8)));
        a.decay();
        assert_eq!(a.lag(), Some(Duration::from_nanos(397_500)));
    }

    #[test]
    fn with_several_paths_what_arrived_of_what_was_sent_is_counted_exactly() {
        let mut f = flow(4096, 2);
        // Of the first 10 DATA datagrams, 5 and 6 are on a slower path; 10
        // to 14, sent after them (after the LAST, dseq 9), came on faster
        // ones: 13 arrived in all, but 2 of the 10 are still on their way.
        for d in (0..5).chain(7..15) {
            f.note_data(1, d, Instant::ZERO);
        }
        assert_eq!(f.arrived(1, 10, true), (8, true));
        assert_eq!(f.arrived(1, 20, true), (13, true), "15 to 19 not here yet either");
        assert_eq!(f.arrived(1, 10, false), (15, false), "one path: the highest says it all");
        f.note_data(1, 5, Instant::ZERO);
        assert_eq!(f.arrived(1, 10, true), (9, true));
        // Waited for long enough: 6 is lost, and no later count waits for it.
        f.take_as_lost(1, 10);
        assert_eq!(f.arrived(1, 10, true), (10, true));
        assert_eq!(f.arrived(1, 15, true), (15, true));
        // A gap older than the record's window is forgotten.
        f.note_data(1, 16, Instant::ZERO);
        assert_eq!(f.arrived(1, 17, true), (16, true));
        f.note_data(1, 16 + ARRIVAL_WINDOW as u32, Instant::ZERO);
        assert_eq!(f.arrived(1, 17 + ARRIVAL_WINDOW, true).0, 17 + ARRIVAL_WINDOW - (ARRIVAL_WINDOW - 1));
        // A restart starts the record over.
        f.reset(1);
        f.note_data(1, 1, Instant::ZERO);
        assert_eq!(f.arrived(1, 2, true), (1, true));
    }
}
