//! Loss-driven rate adaptation (AIMD) on the endpoint's virtual clock.
//!
//! The [`crate::pacer`] caps how fast an endpoint sends; a [`RateAdapter`]
//! moves that cap. Every window ([`RateConfig::window`], 5 ms by default) in
//! which this endpoint sent DATA, the share of its DATA datagrams that
//! receivers asked to have repaired is the loss signal: above
//! [`RateConfig::loss_threshold_ppm`] (0.5%) the rate is cut to
//! [`RateConfig::decrease_percent`] (70%) of what it was, never below
//! [`RateConfig::min`]; otherwise it grows by [`RateConfig::increase_percent`]
//! (2%) of the maximum, never above [`RateConfig::max`]. A sender that floods a
//! congested receiver therefore backs off within a few windows, and a clean
//! path runs at the configured maximum. Windows without DATA change nothing
//! and arm no timer, so an idle endpoint is never woken for it.
//!
//! This is the same rule `dlcpd` applied on its wall clock before it moved
//! here (the `[pacing] adapt` setting); on virtual time the simulator tests it
//! (`proto/tests/rate_sim.rs`). Receiver-driven flow control, which avoids the
//! losses instead of reacting to them, is a later, separate mechanism.

use crate::time::{Duration, Instant};

/// Parameters of a [`RateAdapter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateConfig {
    /// Starting rate and ceiling, bytes per second (> 0).
    pub max: u64,
    /// Floor, bytes per second.
    pub min: u64,
    /// Length of one measurement window.
    pub window: Duration,
    /// Repairs per DATA datagram sent, in ppm, above which the rate is cut.
    pub loss_threshold_ppm: u32,
    /// The rate after a cut, in percent of the rate before it (1 ..= 99).
    pub decrease_percent: u8,
    /// Growth per clean window, in percent of `max` (1 ..= 100).
    pub increase_percent: u8,
}

impl RateConfig {
    /// The daemon's rule for a ceiling of `max` bytes per second: floor at 1%
    /// of it (at least 1 Mbit/s), 5 ms windows, cut to 70% above 0.5% repairs,
    /// grow by 2% of the maximum per clean window.
    pub fn for_max(max: u64) -> RateConfig {
        RateConfig {
            max,
            min: (max / 100).max(125_000).min(max),
            window: Duration::from_millis(5),
            loss_threshold_ppm: 5_000,
            decrease_percent: 70,
            increase_percent: 2,
        }
    }
}

/// What the adapter reads at the end of a window: this endpoint's running
/// totals of DATA datagrams sent (first pass and repairs) and of repairs sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendTotals {
    /// DATA datagrams sent so far.
    pub data: u64,
    /// Of them, repairs.
    pub repairs: u64,
}

/// AIMD on the loss the receivers report: see the [module docs](self).
#[derive(Debug, Clone)]
pub struct RateAdapter {
    cfg: RateConfig,
    window_start: Instant,
    at_start: SendTotals,
    cuts: u64,
}

impl RateAdapter {
    /// An adapter whose first window starts at `now` with the counters `totals`.
    pub fn new(cfg: RateConfig, now: Instant, totals: SendTotals) -> RateAdapter {
        RateAdapter { cfg, window_start: now, at_start: totals, cuts: 0 }
    }

    /// Its parameters.
    pub fn config(&self) -> &RateConfig {
        &self.cfg
    }

    /// Rate cuts so far.
    pub fn cuts(&self) -> u64 {
        self.cuts
    }

    /// When the current window ends, if DATA was sent in it (`totals`: the
    /// counters now); `None` while idle, so no timer is armed.
    pub fn next_timeout(&self, totals: SendTotals) -> Option<Instant> {
        (totals.data != self.at_start.data).then(|| self.window_start + self.cfg.window)
    }

    /// Called with the counters `totals` at `now` and the current pacing
    /// `rate`: closes the window if it is over and returns the new rate when
    /// it differs from `rate`.
    pub fn on_timeout(&mut self, now: Instant, rate: u64, totals: SendTotals) -> Option<u64> {
        if now < self.window_start + self.cfg.window {
            return None;
        }
        let sent = totals.data - self.at_start.data;
        let repairs = totals.repairs - self.at_start.repairs;
        self.window_start = now;
        self.at_start = totals;
        if sent == 0 {
            return None;
        }
        let c = &self.cfg;
        let rate = rate.clamp(c.min, c.max);
        let lossy = u128::from(repairs) * 1_000_000 > u128::from(sent) * u128::from(c.loss_threshold_ppm);
        let new = if lossy {
            self.cuts += 1;
            (rate / 100 * u64::from(c.decrease_percent)).max(c.min)
        } else {
            rate.saturating_add(c.max / 100 * u64::from(c.increase_percent)).min(c.max)
        };
        (new != rate).then_some(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    fn totals(data: u64, repairs: u64) -> SendTotals {
        SendTotals { data, repairs }
    }

    #[test]
    fn cuts_above_the_threshold_and_grows_back_to_the_maximum() {
        let cfg = RateConfig::for_max(1_000_000_000);
        let mut a = RateAdapter::new(cfg, at(0), totals(0, 0));
        // Not over yet: nothing.
        assert_eq!(a.on_timeout(at(4), cfg.max, totals(100, 50)), None);
        // 1% repairs > 0.5%: cut to 70%.
        assert_eq!(a.on_timeout(at(5), cfg.max, totals(1000, 10)), Some(700_000_000));
        assert_eq!(a.cuts(), 1);
        // 0.5% exactly is not above the threshold: grow by 2% of the maximum.
        assert_eq!(a.on_timeout(at(10), 700_000_000, totals(3000, 20)), Some(720_000_000));
        let mut rate = 720_000_000;
        let mut data = 3000;
        for w in 3..40 {
            data += 1000;
            if let Some(r) = a.on_timeout(at(5 * w), rate, totals(data, 20)) {
                rate = r;
            }
        }
        assert_eq!(rate, cfg.max, "a clean path runs at the maximum");
        assert_eq!(a.cuts(), 1);
    }

    #[test]
    fn never_below_the_floor_and_idle_windows_change_nothing() {
        let cfg = RateConfig::for_max(10_000_000);
        assert_eq!(cfg.min, 125_000);
        let mut a = RateAdapter::new(cfg, at(0), totals(0, 0));
        let mut rate = cfg.max;
        let mut data = 0;
        for w in 1..50 {
            data += 100;
            if let Some(r) = a.on_timeout(at(5 * w), rate, totals(data, data)) {
                rate = r;
            }
        }
        assert_eq!(rate, cfg.min);
        // Idle: no timer, and a window without DATA keeps the rate.
        assert_eq!(a.next_timeout(totals(data, data)), None);
        assert_eq!(a.on_timeout(at(1000), rate, totals(data, data)), None);
        // DATA again: the window's end is a timer.
        assert_eq!(a.next_timeout(totals(data + 1, data)), Some(at(1000) + cfg.window));
    }
}
