//! Property tests for the Jacobson/Karels estimators (`dlcp_proto::estimator`).

use dlcp_proto::estimator::{DeadlineEstimator, RttEstimator};
use dlcp_proto::time::Duration;
use proptest::prelude::*;

/// Realistic durations: 0 .. ~18 minutes in ns (well inside f64's exact range).
fn dur() -> impl Strategy<Value = Duration> {
    prop_oneof![Just(0u64), 0u64..=1_000, 1_000u64..=10_000_000, 10_000_000u64..=1 << 40]
        .prop_map(Duration::from_nanos)
}

/// Any duration, including zero and `Duration::MAX`.
fn any_dur() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        Just(Duration::from_nanos(u64::MAX)),
        any::<u64>().prop_map(Duration::from_nanos),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

/// Bounds `min <= max`.
fn bounds() -> impl Strategy<Value = (Duration, Duration)> {
    (any_dur(), any_dur()).prop_map(|(a, b)| (a.min(b), a.max(b)))
}

fn ns(d: Duration) -> u128 {
    d.as_nanos()
}

trait Est: Clone {
    fn feed(&mut self, d: Duration);
    fn mean(&self) -> Duration;
    fn timer(&self) -> Duration;
}

impl Est for RttEstimator {
    fn feed(&mut self, d: Duration) {
        self.observe(d);
    }
    fn mean(&self) -> Duration {
        self.smoothed()
    }
    fn timer(&self) -> Duration {
        self.timeout()
    }
}

/// A deadline estimator fed whole transfers of 1000 chunks (per-chunk time `d`).
#[derive(Clone)]
struct Deadline(DeadlineEstimator);

impl Est for Deadline {
    fn feed(&mut self, d: Duration) {
        self.0.observe(d * 1000, 1000);
    }
    fn mean(&self) -> Duration {
        self.0.mean_per_chunk()
    }
    fn timer(&self) -> Duration {
        self.0.deadline(1)
    }
}

fn rtt(initial: Duration) -> RttEstimator {
    RttEstimator::new(initial, Duration::ZERO, Duration::MAX)
}

fn deadline(initial: Duration) -> Deadline {
    Deadline(DeadlineEstimator::new(initial, Duration::ZERO, Duration::MAX))
}

/// After an arbitrary warm-up, a constant input `x` makes the mean converge to
/// `x` and the timer to `x` (deviation decays to ~0).
fn check_converges(mut e: impl Est, warmup: &[Duration], x: Duration) -> Result<(), TestCaseError> {
    for &d in warmup {
        e.feed(d);
    }
    for _ in 0..400 {
        e.feed(x);
    }
    let (m, t, x) = (ns(e.mean()), ns(e.timer()), ns(x));
    prop_assert!(m.abs_diff(x) <= 1, "mean {} vs input {}", m, x);
    prop_assert!(t + 1 >= x && t <= x + x / 1_000_000 + 2, "timer {} vs input {}", t, x);
    Ok(())
}

/// A step from `a` to `b`: every sample moves the (integer) mean toward `b`
/// without overshooting it, strictly while it is at least 16 ns away.
fn check_step(mut e: impl Est, a: Duration, b: Duration, n: usize) -> Result<(), TestCaseError> {
    for _ in 0..50 {
        e.feed(a);
    }
    let b_ns = ns(b);
    for _ in 0..n {
        let before = ns(e.mean());
        e.feed(b);
        let after = ns(e.mean());
        prop_assert!(
            after.abs_diff(b_ns) <= before.abs_diff(b_ns),
            "{} -> {} away from {}",
            before,
            after,
            b_ns
        );
        // No overshoot: `after` stays on `before`'s side of `b` (or reaches it).
        prop_assert!(
            (before <= b_ns) == (after <= b_ns) || after == b_ns,
            "{} -> {} overshot {}",
            before,
            after,
            b_ns
        );
        if before.abs_diff(b_ns) >= 16 {
            prop_assert!(
                after.abs_diff(b_ns) < before.abs_diff(b_ns),
                "{} -> {} stuck, target {}",
                before,
                after,
                b_ns
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Converges to a constant input after any warm-up history (RTT and
    /// per-chunk deadline estimators).
    #[test]
    fn converges_to_constant(
        initial in dur(),
        warmup in prop::collection::vec(dur(), 0..30),
        x in dur(),
    ) {
        check_converges(rtt(initial), &warmup, x)?;
        check_converges(deadline(initial), &warmup, x)?;
    }

    /// The timeout and every deadline stay within `[min, max]`, before and after
    /// every sample, for any samples (zero and `Duration::MAX` included), any
    /// initial value and any bounds with `min <= max`.
    #[test]
    fn timers_within_bounds(
        initial in any_dur(),
        (min, max) in bounds(),
        samples in prop::collection::vec((any_dur(), any::<u32>()), 0..40),
        probe in prop::collection::vec(any::<u32>(), 1..8),
    ) {
        let mut r = RttEstimator::new(initial, min, max);
        let mut d = DeadlineEstimator::new(initial, min, max);
        let check = |r: &RttEstimator, d: &DeadlineEstimator| -> Result<(), TestCaseError> {
            prop_assert!(min <= r.timeout() && r.timeout() <= max, "timeout {:?} outside [{:?}, {:?}]", r.timeout(), min, max);
            for &c in probe.iter().chain(&[0, 1, u32::MAX]) {
                let dl = d.deadline(c);
                prop_assert!(min <= dl && dl <= max, "deadline({}) {:?} outside [{:?}, {:?}]", c, dl, min, max);
            }
            Ok(())
        };
        check(&r, &d)?;
        for (s, chunks) in samples {
            r.observe(s);
            d.observe(s, chunks);
            check(&r, &d)?;
        }
    }

    /// The deadline is monotone non-decreasing in the chunk count, in any state.
    #[test]
    fn deadline_monotone_in_chunks(
        initial in any_dur(),
        (min, max) in bounds(),
        samples in prop::collection::vec((any_dur(), any::<u32>()), 0..20),
        a in any::<u32>(),
        b in any::<u32>(),
    ) {
        let mut d = DeadlineEstimator::new(initial, min, max);
        for (s, c) in samples {
            d.observe(s, c);
        }
        let (lo, hi) = (a.min(b), a.max(b));
        prop_assert!(d.deadline(lo) <= d.deadline(hi), "deadline({}) = {:?} > deadline({}) = {:?}", lo, d.deadline(lo), hi, d.deadline(hi));
        // Also across a dense run of small counts.
        let mut prev = d.deadline(0);
        for c in 1..64 {
            let cur = d.deadline(c);
            prop_assert!(prev <= cur);
            prev = cur;
        }
    }

    /// After a step change in the input, every sample moves the estimate toward
    /// the new value (never away, never past it).
    #[test]
    fn step_change_moves_toward_new_value(a in dur(), b in dur()) {
        check_step(rtt(a), a, b, 200)?;
        check_step(deadline(a), a, b, 200)?;
    }

    /// Same samples, same outputs: the estimators are deterministic functions of
    /// their construction parameters and sample sequence.
    #[test]
    fn deterministic(
        initial in any_dur(),
        (min, max) in bounds(),
        samples in prop::collection::vec((any_dur(), any::<u32>()), 0..40),
    ) {
        let (mut r1, mut r2) = (RttEstimator::new(initial, min, max), RttEstimator::new(initial, min, max));
        let (mut d1, mut d2) = (DeadlineEstimator::new(initial, min, max), DeadlineEstimator::new(initial, min, max));
        for (i, &(s, c)) in samples.iter().enumerate() {
            r1.observe(s);
            r2.observe(s);
            d1.observe(s, c);
            d2.observe(s, c);
            prop_assert_eq!(&r1, &r2);
            prop_assert_eq!(&d1, &d2);
            prop_assert_eq!(r1.timeout(), r2.timeout());
            prop_assert_eq!(r1.smoothed(), r2.smoothed());
            prop_assert_eq!(d1.deadline(c), d2.deadline(c));
            prop_assert_eq!(d1.mean_per_chunk(), d2.mean_per_chunk());
            prop_assert_eq!(r1.samples(), i as u64 + 1);
            prop_assert_eq!(d1.samples(), i as u64 + 1);
        }
    }
}

/// Before any sample the timer comes from the initial value: `3 × initial`
/// (mean `initial`, deviation `initial / 2`).
#[test]
fn initial_timer_is_three_times_initial() {
    let e = rtt(Duration::from_millis(10));
    assert_eq!(e.timeout(), Duration::from_millis(30));
    assert_eq!(e.samples(), 0);
    let d = DeadlineEstimator::new(Duration::from_micros(1), Duration::ZERO, Duration::MAX);
    assert_eq!(d.deadline(1000), Duration::from_millis(3));
}

/// A huge estimate saturates at `max` rather than wrapping to `min`.
#[test]
fn huge_deadline_saturates_at_max() {
    let mut d = DeadlineEstimator::new(Duration::ZERO, Duration::from_millis(1), Duration::MAX);
    d.observe(Duration::MAX, 1);
    assert!(d.deadline(u32::MAX) >= Duration::from_secs(100 * 365 * 86_400));
    let mut r = RttEstimator::new(Duration::ZERO, Duration::from_millis(1), Duration::from_secs(60));
    r.observe(Duration::MAX);
    assert_eq!(r.timeout(), Duration::from_secs(60));
    r.observe(Duration::ZERO);
    assert!(r.timeout() >= Duration::from_millis(1));
}
