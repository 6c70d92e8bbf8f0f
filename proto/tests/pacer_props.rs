//! Property tests for the token-bucket pacer (`dlcp_proto::pacer`).
//!
//! All checks use exact integer arithmetic in byte-nanoseconds, like the pacer.

use dlcp_proto::pacer::Pacer;
use dlcp_proto::time::{Duration, Instant};
use proptest::prelude::*;

const NANOS: u128 = 1_000_000_000;

/// 1 KB/s .. 100 GB/s, log-uniform-ish.
fn rate() -> impl Strategy<Value = u64> {
    (3u32..=11, 1u64..10).prop_map(|(e, m)| (m * 10u64.pow(e)).min(100_000_000_000))
}

/// Bucket sizes from one byte to 16 MB.
fn burst() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=64, 64u64..=65_536, 65_536u64..=16_000_000]
}

/// Packet sizes, including empty and jumbo ones (often larger than the burst).
fn packet() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), 1usize..=64, 64usize..=9_000, 9_000usize..=65_536]
}

/// A start instant anywhere in the first ~30 years.
fn start() -> impl Strategy<Value = Instant> {
    (0u64..=1 << 60).prop_map(Instant::from_nanos)
}

/// Nanoseconds between `a` and `b` (`b >= a`).
fn ns(a: Instant, b: Instant) -> u128 {
    u128::from(b.as_nanos() - a.as_nanos())
}

/// One step of a sender: wait `gap` ns (or until `ready_at` when `gap` is
/// `None`), then try to send `size` bytes.
#[derive(Debug, Clone)]
struct Step {
    gap: Option<u64>,
    size: usize,
}

fn steps(max_gap: u64) -> impl Strategy<Value = Vec<Step>> {
    let step = (prop_oneof![1 => Just(None), 2 => (0..=max_gap).prop_map(Some)], packet())
        .prop_map(|(gap, size)| Step { gap, size });
    prop::collection::vec(step, 1..300)
}

/// Run `steps` from a full bucket at `t0`, checking after every step that the
/// bytes admitted so far are at most `burst + rate·T + max packet`, where `T` is
/// the virtual time elapsed, plus `slack` byte-ns. Returns the end time and the
/// bytes admitted.
fn run_bounded(
    p: &mut Pacer,
    t0: Instant,
    rate: u64,
    burst: u64,
    slack: u128,
    steps: &[Step],
) -> Result<(Instant, u128), TestCaseError> {
    let mut t = t0;
    let mut admitted = 0u128;
    let mut max_pkt = 0u128;
    for s in steps {
        t = match s.gap {
            Some(g) => t + Duration::from_nanos(g),
            None => p.ready_at(t, s.size),
        };
        if p.try_consume(t, s.size) {
            admitted += s.size as u128;
            max_pkt = max_pkt.max(s.size as u128);
        }
        let allowed = (u128::from(burst) + max_pkt) * NANOS + u128::from(rate) * ns(t0, t) + slack;
        prop_assert!(
            admitted * NANOS <= allowed,
            "admitted {} bytes in {} ns at {} B/s, burst {}, max packet {}",
            admitted,
            ns(t0, t),
            rate,
            burst,
            max_pkt
        );
    }
    Ok((t, admitted))
}

/// A sender that always waits until `ready_at` and sends `size`-byte packets
/// from `t` until `t + window`; returns the bytes admitted at instants <= the end.
fn greedy(p: &mut Pacer, mut t: Instant, window: u128, size: usize) -> Result<u128, TestCaseError> {
    let end = t.as_nanos() as u128 + window;
    let mut sent = 0u128;
    loop {
        let r = p.ready_at(t, size);
        prop_assert!(r >= t);
        if u128::from(r.as_nanos()) > end {
            return Ok(sent);
        }
        t = r;
        prop_assert!(p.try_consume(t, size), "not admitted at ready_at {:?}", t);
        sent += size as u128;
    }
}

/// A window long enough for ~`packets` packets of `size` bytes at `rate`.
fn window_for(rate: u64, size: usize, packets: u128) -> u128 {
    (size as u128 * packets * NANOS).div_ceil(u128::from(rate))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Over any window starting from a full bucket, bytes admitted are at most
    /// `burst + rate·T + one packet`, for senders that probe at arbitrary times
    /// or at `ready_at`, with packets larger than the burst included.
    #[test]
    fn admitted_bytes_bounded(
        rate in rate(),
        burst in burst(),
        t0 in start(),
        steps in steps(2_000_000),
    ) {
        // A new pacer is exactly at `burst`: no slack.
        let mut p = Pacer::new(rate, burst, t0);
        run_bounded(&mut p, t0, rate, burst, 0, &steps)?;
    }

    /// A sender that always waits until `ready_at` gets at least 99% of the rate
    /// (and, by the bound, not more than rate plus one bucket and one packet).
    #[test]
    fn greedy_sender_gets_the_rate(
        rate in rate(),
        burst in burst(),
        size in 1usize..=65_536,
        t0 in start(),
    ) {
        let mut p = Pacer::new(rate, burst, t0);
        let window = window_for(rate, size, 1_000);
        let sent = greedy(&mut p, t0, window, size)?;
        let target = u128::from(rate) * window;
        prop_assert!(sent * NANOS * 100 >= target * 99, "sent {} of {} B", sent, target / NANOS);
        prop_assert!(sent * NANOS <= (u128::from(burst) + size as u128) * NANOS + target);
    }

    /// `ready_at` is exact: consuming at `ready_at` succeeds and, when not
    /// already ready, consuming one nanosecond earlier fails. Holds from any
    /// state (after an arbitrary history) and for any query time, including a
    /// time before the pacer's last update.
    #[test]
    fn ready_at_is_exact(
        rate in rate(),
        burst in burst(),
        t0 in start(),
        history in steps(500_000),
        back in prop_oneof![3 => Just(0u64), 1 => 0u64..1_000_000],
        size in packet(),
    ) {
        let mut p = Pacer::new(rate, burst, t0);
        let (t, _) = run_bounded(&mut p, t0, rate, burst, 0, &history)?;
        let now = t - Duration::from_nanos(back);
        let r = p.ready_at(now, size);
        prop_assert!(r >= now);
        prop_assert!(p.clone().try_consume(r, size), "consume at ready_at {:?} failed", r);
        if r > now {
            let early = r - Duration::from_nanos(1);
            prop_assert!(!p.clone().try_consume(early, size), "consume 1 ns before ready_at succeeded");
        }
        // Asking again at the answer gives the same answer.
        prop_assert_eq!(p.ready_at(r, size), r);
    }

    /// `set_rate` mid-run: after the change, admitted bytes obey the new rate's
    /// bound (on top of whatever the bucket held), and a greedy sender gets at
    /// least 99% of the new rate.
    #[test]
    fn set_rate_respects_new_rate(
        r1 in rate(),
        r2 in rate(),
        burst in burst(),
        t0 in start(),
        history in steps(500_000),
        tail in steps(2_000_000),
        size in 1usize..=65_536,
    ) {
        let mut p = Pacer::new(r1, burst, t0);
        let (t1, _) = run_bounded(&mut p, t0, r1, burst, 0, &history)?;
        p.set_rate(t1, r2);
        prop_assert_eq!(p.rate(), r2);
        // Bound from t1 at the new rate: the bucket holds at most `burst` plus
        // less than a nanosecond's refill at the new rate.
        let mut q = p.clone();
        run_bounded(&mut q, t1, r2, burst, u128::from(r2), &tail)?;
        // Throughput at the new rate, measured from the first admission after the
        // change (any debt left by the history is paid off by then; what the
        // bucket holds is then at most one packet, small against 2000 packets).
        let first = p.ready_at(t1, size);
        prop_assert!(p.try_consume(first, size));
        let window = window_for(r2, size, 2_000);
        let sent = greedy(&mut p, first, window, size)?;
        let target = u128::from(r2) * window;
        prop_assert!(sent * NANOS * 100 >= target * 99, "sent {} of {} B", sent, target / NANOS);
        prop_assert!(sent * NANOS <= (u128::from(burst) + 65_536 * 2) * NANOS + target);
    }

    /// Rate 0 means unlimited: everything is admitted at once and `ready_at` is
    /// `now`; `set_rate(_, 0)` switches pacing off and a non-zero rate back on.
    #[test]
    fn zero_rate_is_unlimited(
        burst in any::<u64>(),
        t0 in any::<u64>().prop_map(Instant::from_nanos),
        sizes in prop::collection::vec(any::<usize>(), 1..50),
        r in rate(),
    ) {
        let mut p = Pacer::new(0, burst, t0);
        let mut u = Pacer::unlimited();
        for &s in &sizes {
            prop_assert_eq!(p.ready_at(t0, s), t0);
            prop_assert!(p.try_consume(t0, s));
            prop_assert!(u.try_consume(t0, s));
            prop_assert_eq!(u.ready_at(t0, s), t0);
        }
        let mut p = Pacer::new(r, 1500, t0);
        while p.try_consume(t0, 1500) {}
        p.set_rate(t0, 0);
        prop_assert_eq!(p.rate(), 0);
        prop_assert!(p.try_consume(t0, 1500));
        p.set_rate(t0, r);
        prop_assert!(!p.try_consume(t0, 1500), "pacing did not resume");
    }

    /// Extreme values never overflow or panic: any rate (up to u64::MAX), any
    /// burst, any packet size (up to usize::MAX), any instants (up to
    /// Instant::MAX, and going backwards); `ready_at` never precedes `now`.
    #[test]
    fn extremes_never_panic(
        rate in prop_oneof![Just(u64::MAX), Just(1u64), any::<u64>()],
        burst in prop_oneof![Just(u64::MAX), Just(0u64), any::<u64>()],
        t0 in prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()],
        ops in prop::collection::vec(
            (
                prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()],
                prop_oneof![Just(usize::MAX), Just(0usize), any::<usize>()],
                0u8..4,
                any::<u64>(),
            ),
            1..40,
        ),
    ) {
        let mut p = Pacer::new(rate, burst, Instant::from_nanos(t0));
        for (t, size, op, r) in ops {
            let now = Instant::from_nanos(t);
            match op {
                0 => {
                    let _ = p.try_consume(now, size);
                }
                1 => prop_assert!(p.ready_at(now, size) >= now),
                2 => p.set_rate(now, r),
                _ => {
                    let at = p.ready_at(now, size);
                    if at < Instant::MAX {
                        prop_assert!(p.try_consume(at, size));
                    }
                }
            }
        }
    }
}

/// A jumbo packet (larger than the bucket) is admitted from a full bucket and
/// then charged in full: the bucket goes into debt and the next packet waits
/// for the whole jumbo packet's worth of tokens.
#[test]
fn jumbo_packet_drives_bucket_into_debt() {
    let t = Instant::ZERO;
    let mut p = Pacer::new(1_000_000, 1_000, t); // 1 MB/s = 1 byte/µs
    assert!(p.try_consume(t, 9_000));
    assert!(!p.try_consume(t, 1));
    // 9000 bytes charged against 1000 held: 8000 bytes of debt, then 1 byte.
    assert_eq!(p.ready_at(t, 1), Instant::from_nanos(8_001_000));
    // The next jumbo packet needs a full bucket again (9000 µs after the first).
    assert_eq!(p.ready_at(t, 9_000), Instant::from_nanos(9_000_000));
}

/// A bucket smaller than a nanosecond's refill still delivers the rate: the
/// sub-nanosecond remainder is kept rather than capped away.
#[test]
fn tiny_bucket_at_high_rate_keeps_the_rate() {
    // 100 GB/s = 100 bytes/ns; 1500-byte packets with a 1500-byte bucket.
    let mut t = Instant::ZERO;
    let mut p = Pacer::new(100_000_000_000, 1_500, t);
    let mut sent = 0u64;
    while t < Instant::from_nanos(1_000_000) {
        t = p.ready_at(t, 1_500);
        assert!(p.try_consume(t, 1_500));
        sent += 1_500;
    }
    // 1 ms at 100 GB/s = 100 MB (+ the bucket, + one packet past the end).
    assert!((100_000_000..=100_003_000).contains(&sent), "sent {sent}");
}

/// Huge durations saturate instead of overflowing.
#[test]
fn huge_rate_and_duration_saturate() {
    let mut p = Pacer::new(u64::MAX, u64::MAX, Instant::ZERO);
    assert!(p.try_consume(Instant::ZERO, usize::MAX));
    assert!(p.try_consume(Instant::MAX, 1));
    let mut p = Pacer::new(1, u64::MAX, Instant::ZERO);
    assert!(p.try_consume(Instant::ZERO, usize::MAX));
    assert_eq!(p.ready_at(Instant::ZERO, usize::MAX), Instant::MAX);
}
