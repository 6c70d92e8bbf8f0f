//! Estimators for adaptive timers.
//!
//! Both use the Jacobson/Karels estimator (RFC 6298's SRTT/RTTVAR): a smoothed
//! mean with gain 1/8 and a smoothed mean deviation with gain 1/4, and a timer of
//! `mean + 4 * deviation`, clamped to configured bounds.
//!
//! - [`RttEstimator`] times PROBE → BITMAP/DONE round trips and sets the probe
//!   retransmission timer.
//! - [`DeadlineEstimator`] learns the *per-chunk completion time* of receive
//!   transfers (duration from first packet to close, divided by the chunk count)
//!   and sets the adaptive deadline of a new transfer to
//!   `chunks * (mean + 4 * deviation)`, clamped to `[min, max]`. Normalising by
//!   chunk count lets one estimator serve tensors of every size.
//!
//! Guarantees (checked by `tests/estimator_props.rs`): the first sample replaces
//! the initial guess (mean = sample, deviation = sample / 2, as RFC 6298), so
//! before any sample the timer is `3 × initial`; a constant input makes the mean
//! converge to it and the timer to it (deviation decays by 3/4 per sample);
//! after a step change every sample moves the mean toward the new value without
//! overshooting; timers always lie in `[min, max]` (if `min > max`, `min` wins)
//! for any samples, zero and [`Duration::MAX`] included; the deadline is
//! monotone non-decreasing in the chunk count; and the state is a deterministic
//! function of the construction parameters and the sample sequence (plain `f64`
//! arithmetic, no clock, no randomness).

use crate::time::Duration;

/// Jacobson/Karels mean and deviation in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
struct JacobsonKarels {
    mean: f64,
    dev: f64,
    samples: u64,
}

impl JacobsonKarels {
    fn new(initial: f64) -> Self {
        JacobsonKarels { mean: initial, dev: initial / 2.0, samples: 0 }
    }

    fn observe(&mut self, x: f64) {
        if self.samples == 0 {
            self.mean = x;
            self.dev = x / 2.0;
        } else {
            let err = x - self.mean;
            self.mean += err / 8.0;
            self.dev += (err.abs() - self.dev) / 4.0;
        }
        self.samples += 1;
    }

    fn timer(&self) -> f64 {
        self.mean + 4.0 * self.dev
    }
}

/// A timer of `ns` nanoseconds clamped to `[min, max]` (`min` if `min > max`).
/// Monotone in `ns`: NaN and non-positive values give `min`, values beyond
/// `u64::MAX` ns (including +∞) saturate there before clamping.
fn clamp(ns: f64, min: Duration, max: Duration) -> Duration {
    let d = if ns > 0.0 { Duration::from_nanos(ns.min(u64::MAX as f64) as u64) } else { Duration::ZERO };
    d.clamp(min, max.max(min))
}

/// Round-trip time estimator for the probe retransmission timer.
#[derive(Debug, Clone, PartialEq)]
pub struct RttEstimator {
    jk: JacobsonKarels,
    min: Duration,
    max: Duration,
}

impl RttEstimator {
    /// An estimator starting from `initial` (replaced by the first sample), with
    /// the timer clamped to `[min, max]` (`min` wins if `min > max`).
    pub fn new(initial: Duration, min: Duration, max: Duration) -> Self {
        RttEstimator { jk: JacobsonKarels::new(initial.as_nanos() as f64), min, max }
    }

    /// Record one round-trip sample.
    pub fn observe(&mut self, rtt: Duration) {
        self.jk.observe(rtt.as_nanos() as f64);
    }

    /// Smoothed round-trip time (truncated to whole nanoseconds, saturating at
    /// `u64::MAX` ns).
    pub fn smoothed(&self) -> Duration {
        Duration::from_nanos(self.jk.mean.max(0.0) as u64)
    }

    /// Change the timer's bounds (`min` wins if `min > max`); the learned
    /// estimate is kept.
    pub fn set_bounds(&mut self, min: Duration, max: Duration) {
        self.min = min;
        self.max = max;
    }

    /// Retransmission timeout: `srtt + 4 * rttvar`, clamped to `[min, max]`.
    pub fn timeout(&self) -> Duration {
        clamp(self.jk.timer(), self.min, self.max)
    }

    /// Samples observed.
    pub fn samples(&self) -> u64 {
        self.jk.samples
    }
}

/// Adaptive deadline of receive transfers, from observed completion times.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadlineEstimator {
    jk: JacobsonKarels,
    min: Duration,
    max: Duration,
}

impl DeadlineEstimator {
    /// An estimator with an initial per-chunk time (replaced by the first sample)
    /// and deadline bounds `[min, max]` (`min` wins if `min > max`).
    pub fn new(initial_per_chunk: Duration, min: Duration, max: Duration) -> Self {
        DeadlineEstimator { jk: JacobsonKarels::new(initial_per_chunk.as_nanos() as f64), min, max }
    }

    /// Record that a transfer of `chunks` chunks completed in `duration`
    /// (`chunks == 0` counts as one).
    pub fn observe(&mut self, duration: Duration, chunks: u32) {
        let per_chunk = duration.as_nanos() as f64 / f64::from(chunks.max(1));
        self.jk.observe(per_chunk);
    }

    /// Change the deadline's bounds (`min` wins if `min > max`); the learned
    /// estimate is kept.
    pub fn set_bounds(&mut self, min: Duration, max: Duration) {
        self.min = min;
        self.max = max;
    }

    /// Smoothed per-chunk completion time (truncated to whole nanoseconds,
    /// saturating at `u64::MAX` ns).
    pub fn mean_per_chunk(&self) -> Duration {
        Duration::from_nanos(self.jk.mean.max(0.0) as u64)
    }

    /// Deadline for a transfer of `chunks` chunks (0 counts as one), measured
    /// from its first packet: `chunks * (mean + 4 * deviation)` clamped to
    /// `[min, max]`; monotone non-decreasing in `chunks`.
    pub fn deadline(&self, chunks: u32) -> Duration {
        clamp(self.jk.timer() * f64::from(chunks.max(1)), self.min, self.max)
    }

    /// Samples observed.
    pub fn samples(&self) -> u64 {
        self.jk.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn set_bounds_reclamps_keeping_the_estimate() {
        let mut d = DeadlineEstimator::new(MS, MS, 250 * MS);
        d.observe(100 * MS, 10);
        let before = d.deadline(10);
        assert!(before > 10 * MS && before <= 250 * MS);
        d.set_bounds(MS, 5 * MS);
        assert_eq!(d.deadline(10), 5 * MS);
        d.set_bounds(MS, 250 * MS);
        assert_eq!(d.deadline(10), before, "the learned estimate survives");
        let mut r = RttEstimator::new(MS, MS, 200 * MS);
        r.observe(50 * MS);
        r.set_bounds(MS, 2 * MS);
        assert_eq!(r.timeout(), 2 * MS);
    }

    #[test]
    fn rtt_converges_and_clamps() {
        let mut e = RttEstimator::new(MS * 100, MS, MS * 1000);
        for _ in 0..50 {
            e.observe(MS * 2);
        }
        assert!(
            e.smoothed() >= MS * 2 - Duration::from_micros(10)
                && e.smoothed() <= MS * 2 + Duration::from_micros(10)
        );
        // Deviation decays towards zero, so the timeout approaches srtt, but never below min.
        assert!(e.timeout() < MS * 3, "{:?}", e.timeout());
        let e = RttEstimator::new(Duration::ZERO, MS * 5, MS * 10);
        assert_eq!(e.timeout(), MS * 5);
    }

    #[test]
    fn deadline_scales_with_chunks_and_tracks_jitter() {
        let mut e =
            DeadlineEstimator::new(Duration::from_micros(10), Duration::ZERO, Duration::from_secs(60));
        for i in 0..100 {
            // 1 µs per chunk ± 0.5 µs.
            let jitter = if i % 2 == 0 { 500 } else { 1500 };
            e.observe(Duration::from_nanos(jitter * 1000), 1000);
        }
        let d1000 = e.deadline(1000);
        let d2000 = e.deadline(2000);
        assert!(d2000 > d1000 * 19 / 10 && d2000 < d1000 * 21 / 10);
        // Mean ≈ 1 µs/chunk, deviation ≈ 0.5 µs: deadline ≈ 3 µs/chunk.
        assert!(d1000 > Duration::from_micros(2500) && d1000 < Duration::from_micros(3500), "{d1000:?}");
    }

    #[test]
    fn clamp_is_monotone_at_the_extremes() {
        let (min, max) = (MS, MS * 10);
        assert_eq!(clamp(f64::NAN, min, max), min);
        assert_eq!(clamp(-1.0, min, max), min);
        assert_eq!(clamp(0.0, min, max), min);
        assert_eq!(clamp(1e30, min, max), max);
        assert_eq!(clamp(f64::INFINITY, min, max), max);
        // min > max: min wins.
        assert_eq!(clamp(5e6, max, min), max);
    }
}
