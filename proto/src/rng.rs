//! A small seeded pseudo-random generator (SplitMix64).
//!
//! The simulator draws every fault from it, and the daemon's debug receive
//! loss uses it too, so it lives here rather than in the simulator.

/// The SplitMix64 finalizer: a bijective 64-bit mixing function.
const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A small seeded pseudo-random generator (SplitMix64).
///
/// Not cryptographic; fast, tiny, and identical on every platform, which is what a
/// reproducible simulation needs. Also handy for nodes and tests that want seeded
/// randomness of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose sequence is determined by `seed`.
    pub const fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// An independent generator for the sub-stream `(a, b)` of `seed`.
    pub fn stream(seed: u64, a: u64, b: u64) -> Rng {
        Rng::new(mix64(mix64(seed ^ mix64(a.wrapping_add(0x005E_ED0F_D1C9))) ^ b.wrapping_mul(0x9E37_79B9)))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }

    /// Uniform in `[0, 1)`, with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, n)` (`0` if `n == 0`); bias below 2⁻⁶⁴·n.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `p` (clamped to `[0, 1]`).
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_roughly_uniform() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(7);
        assert!(a.iter().all(|&x| x == r.next_u64()));
        assert_ne!(Rng::stream(1, 0, 0).next_u64(), Rng::stream(1, 0, 1).next_u64());
        assert_ne!(Rng::stream(1, 0, 1).next_u64(), Rng::stream(1, 1, 0).next_u64());
        assert_ne!(Rng::stream(1, 0, 0).next_u64(), Rng::stream(2, 0, 0).next_u64());
        let mut r = Rng::new(3);
        let mut buckets = [0u32; 10];
        for _ in 0..100_000 {
            buckets[r.below(10) as usize] += 1;
        }
        assert!(buckets.iter().all(|&b| (9_500..10_500).contains(&b)), "{buckets:?}");
        let hits = (0..100_000).filter(|_| r.chance(0.25)).count();
        assert!((24_000..26_000).contains(&hits), "{hits}");
        assert!(!(0..1000).any(|_| r.chance(0.0)));
        assert!((0..1000).all(|_| r.chance(1.0)));
    }
}
