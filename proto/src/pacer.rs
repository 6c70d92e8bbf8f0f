//! Token-bucket pacer on virtual time.
//!
//! Tokens are bytes. The bucket refills at `rate` bytes per second up to `burst`
//! bytes. Arithmetic is exact integer arithmetic in byte-nanoseconds, so a
//! simulation is reproducible bit for bit. A rate of zero means "unpaced".
//!
//! A packet is admitted when the bucket holds `min(size, burst)` bytes, and is
//! then charged its full size: a packet larger than the bucket is admitted from
//! a full bucket and drives it into debt, which later packets wait out. Hence,
//! starting from a full bucket, the bytes admitted over any virtual time `T` are
//! at most `burst + rate·T + one packet` (exactly: `rate·T + max(burst, largest
//! packet)`), and a sender that always waits until [`Pacer::ready_at`] gets the
//! full rate.
//!
//! Clock granularity: time is in whole nanoseconds, so a sender woken at
//! `ready_at` (rounded up to the next nanosecond) finds up to one nanosecond's
//! refill beyond what it needed. The bucket may hold that remainder above
//! `burst` (its capacity is `burst` bytes plus `rate − 1` byte-nanoseconds);
//! capping it at `burst` instead would lose up to a nanosecond per packet, i.e.
//! ~6% of the rate for 1500-byte packets at 100 GB/s, or nearly all of it with a
//! bucket smaller than a nanosecond's refill. So after an idle period the bound
//! above becomes `burst + rate·(T + 1 ns) + one packet`; from a new pacer (or a
//! bucket at `burst`) it is exact.
//!
//! Time going backwards (a `now` before the last update) is tolerated: the bucket
//! is simply not refilled.

use crate::time::{Duration, Instant};

const NANOS: u128 = 1_000_000_000;

/// A token bucket.
#[derive(Debug, Clone)]
pub struct Pacer {
    rate: u64,
    burst: u64,
    /// Tokens in byte-nanoseconds (bytes × 1e9); negative when in debt after a
    /// packet larger than the bucket. Always in `-(usize::MAX · 1e9) ..= cap`,
    /// far inside `i128`.
    tokens: i128,
    /// Virtual time the tokens were last refilled to.
    last: Instant,
}

impl Pacer {
    /// A pacer at `rate_bytes_per_sec` with a bucket of `burst_bytes` (at least
    /// one byte), full at `now`. `rate_bytes_per_sec == 0` disables pacing.
    pub fn new(rate_bytes_per_sec: u64, burst_bytes: u64, now: Instant) -> Pacer {
        let burst = burst_bytes.max(1);
        Pacer { rate: rate_bytes_per_sec, burst, tokens: Self::bytes(burst), last: now }
    }

    /// An unpaced pacer.
    pub fn unlimited() -> Pacer {
        Pacer::new(0, 1, Instant::ZERO)
    }

    /// Configured rate in bytes per second (0 = unpaced).
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Change the rate, taking effect from `now`: tokens accrued up to `now` at
    /// the old rate (and any debt) are kept, later ones accrue at the new rate.
    pub fn set_rate(&mut self, now: Instant, rate_bytes_per_sec: u64) {
        self.refill(now);
        self.rate = rate_bytes_per_sec;
        self.tokens = self.tokens.min(self.cap());
    }

    /// Change the bucket depth (at least one byte), taking effect from `now`:
    /// tokens above the new depth are dropped.
    pub fn set_burst(&mut self, now: Instant, burst_bytes: u64) {
        self.refill(now);
        self.burst = burst_bytes.max(1);
        self.tokens = self.tokens.min(self.cap());
    }

    /// Bucket depth in bytes.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// `bytes` bytes in byte-ns.
    fn bytes(bytes: u64) -> i128 {
        i128::from(bytes) * NANOS as i128
    }

    /// Bucket capacity in byte-ns: `burst` plus less than a nanosecond's refill
    /// (see the module docs).
    fn cap(&self) -> i128 {
        Self::bytes(self.burst) + i128::from(self.rate.saturating_sub(1))
    }

    /// Tokens (byte-ns) needed before a `bytes`-byte packet is admitted.
    fn threshold(&self, bytes: usize) -> i128 {
        Self::bytes(self.burst.min(u64::try_from(bytes).unwrap_or(u64::MAX)))
    }

    /// Tokens (byte-ns) a `bytes`-byte packet costs.
    fn cost(bytes: usize) -> i128 {
        // usize::MAX · 1e9 < 2^94: no overflow.
        bytes as i128 * NANOS as i128
    }

    fn refill(&mut self, now: Instant) {
        if now > self.last {
            let dt = u128::from((now - self.last).as_nanos() as u64);
            let cap = self.cap();
            // (2^64 - 1)^2 < 2^128: the product cannot overflow; saturate the
            // addition by capping the increment at the room left in the bucket.
            let room = (cap - self.tokens).max(0) as u128;
            let add = (dt * u128::from(self.rate)).min(room);
            self.tokens = (self.tokens + add as i128).min(cap);
            self.last = now;
        }
    }

    /// Take `bytes` tokens if the packet may go at `now`: the bucket must hold
    /// `min(bytes, burst)` bytes; the packet is then charged in full (a packet
    /// larger than the burst is allowed when the bucket is full, and drives the
    /// bucket negative). Always true when unpaced.
    pub fn try_consume(&mut self, now: Instant, bytes: usize) -> bool {
        if self.rate == 0 {
            return true;
        }
        self.refill(now);
        if self.tokens >= self.threshold(bytes) {
            self.tokens -= Self::cost(bytes);
            true
        } else {
            false
        }
    }

    /// The earliest instant at which a `bytes`-byte packet may go (`now` if it
    /// already may): [`Pacer::try_consume`] succeeds at the returned instant and,
    /// if that is later than `now`, fails one nanosecond before it. Saturates at
    /// [`Instant::MAX`] when the wait is not representable.
    pub fn ready_at(&self, now: Instant, bytes: usize) -> Instant {
        if self.rate == 0 {
            return now;
        }
        let mut p = self.clone();
        p.refill(now);
        let need = self.threshold(bytes);
        if p.tokens >= need {
            return now;
        }
        // Tokens accrue from `p.last`, which is later than `now` if time went
        // backwards.
        let deficit = (need - p.tokens) as u128;
        let ns = deficit.div_ceil(u128::from(self.rate));
        p.last.max(now) + Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_burst_caps_the_bucket() {
        let t0 = Instant::ZERO;
        let mut p = Pacer::new(1_000_000, 10_000, t0);
        assert!(p.try_consume(t0, 10_000));
        p.set_burst(t0, 2_000);
        assert_eq!(p.burst(), 2_000);
        // Refilled for a long time: at most the new burst is available at once.
        let later = t0 + std::time::Duration::from_secs(1);
        assert!(p.try_consume(later, 2_000));
        assert!(!p.try_consume(later, 1));
    }

    #[test]
    fn rate_is_exact_over_a_virtual_second() {
        // 1 MB/s with a 1500-byte bucket, 1000-byte packets sent as soon as allowed.
        let mut t = Instant::ZERO;
        let mut p = Pacer::new(1_000_000, 1500, t);
        let mut sent = 0u64;
        while t < Instant::from_nanos(1_000_000_000) {
            if p.try_consume(t, 1000) {
                sent += 1000;
            } else {
                t = p.ready_at(t, 1000);
            }
        }
        // Initial burst (1500 bytes) plus one second of refill.
        assert!((1_000_000..=1_002_000).contains(&sent), "sent {sent}");
    }

    #[test]
    fn jumbo_packet_is_charged_in_full() {
        // 1 byte/µs, 1000-byte bucket: a 9000-byte packet goes from the full
        // bucket and leaves 8000 bytes of debt.
        let mut p = Pacer::new(1_000_000, 1_000, Instant::ZERO);
        assert!(p.try_consume(Instant::ZERO, 9_000));
        assert_eq!(p.ready_at(Instant::ZERO, 1_000), Instant::from_nanos(9_000_000));
    }

    #[test]
    fn ready_at_is_exact_when_time_went_backwards() {
        let mut p = Pacer::new(1_000_000, 1_000, Instant::ZERO);
        let t = Instant::from_nanos(5_000);
        assert!(p.try_consume(t, 1_000));
        // Asked with a stale `now`: tokens accrue from `t`, not from `now`.
        let r = p.ready_at(Instant::from_nanos(1_000), 1_000);
        assert_eq!(r, Instant::from_nanos(1_005_000));
        assert!(!p.clone().try_consume(r - Duration::from_nanos(1), 1_000));
        assert!(p.try_consume(r, 1_000));
    }

    #[test]
    fn unlimited_never_blocks() {
        let mut p = Pacer::unlimited();
        for _ in 0..1000 {
            assert!(p.try_consume(Instant::ZERO, 9000));
        }
        assert_eq!(p.ready_at(Instant::ZERO, 9000), Instant::ZERO);
    }
}
