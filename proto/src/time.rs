//! Virtual time for the sans-IO core.
//!
//! The protocol core never reads a clock: every entry point takes `now: Instant`.
//! An [`Instant`] is a count of nanoseconds since an arbitrary epoch chosen by the
//! caller (the daemon maps `std::time::Instant` onto it; the simulator starts at 0),
//! which makes simulations deterministic and reproducible.

use core::ops::{Add, AddAssign, Sub};
pub use core::time::Duration;

/// A point in time, in nanoseconds since a caller-chosen epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The epoch.
    pub const ZERO: Instant = Instant(0);
    /// The latest representable instant (used as "never").
    pub const MAX: Instant = Instant(u64::MAX);

    /// An instant `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time elapsed from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        Instant(self.0.saturating_add(duration_nanos(rhs)))
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, rhs: Duration) -> Instant {
        Instant(self.0.saturating_sub(duration_nanos(rhs)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_nanos(5);
        assert_eq!(t - Instant::from_nanos(10), Duration::ZERO);
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!((t + Duration::from_nanos(7)).as_nanos(), 12);
        assert_eq!((t - Duration::from_nanos(7)).as_nanos(), 0);
    }
}
