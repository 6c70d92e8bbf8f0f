//! Priority classes.
//!
//! Every packet carries one of eight classes; the daemon maps a class to an IP
//! DSCP value (so switches with priority queues serve and drop by importance), to
//! a Linux `SO_PRIORITY`, and to a DPDK TX queue. Class 7 ([`Class::CONTROL`]) is
//! reserved for control packets (PROBE, BITMAP, DONE, HELLO); data uses 0–6.
//!
//! A data chunk's class is a pure function of three traits, compared
//! lexicographically — **phase before layer level before magnitude level**:
//!
//! 1. *phase*: aggregated results (all-gather) rank above raw contributions
//!    (reduce-scatter); each phase owns a band of classes
//!    ([`ClassifierConfig::scatter_band`], [`ClassifierConfig::gather_band`]) and the
//!    gather band lies wholly above the scatter band, so every gather chunk is in a
//!    strictly higher class than every scatter chunk. ([`Phase::None`] is classified
//!    like scatter.) On the wire one exception (from 8 ranks): an all-gather
//!    transfer to a rank that had not reduced when it began (none of the rank's own
//!    all-gather had arrived) goes at the op's lowest scatter class, so that
//!    it does not overtake the contributions that rank still waits for
//!    ([`crate::flow`]), and its repairs at its own class once the rank's
//!    all-gather arrives; whether its chunks are REQUIRED still follows the
//!    class given here.
//! 2. *layer position*: front layers (needed first by the next forward pass)
//!    rank above back layers, compared at the granularity of
//!    [`ClassifierConfig::layer_levels`]: layer `l` of `n` is in layer level
//!    `layer_levels - 1 - ⌊l · layer_levels / n⌋` (so the front layer is always
//!    in the top level and the back layer, once `n >= layer_levels`, in level 0);
//! 3. *magnitude rank* of the chunk inside its tensor (by L2 norm, see
//!    [`magnitude_ranks`]): large gradients rank above small ones. Chunk `rank`
//!    of `chunks` is in magnitude level
//!    `magnitude_levels - 1 - ⌊rank · magnitude_levels / chunks⌋`.
//!
//! The composite level `layer_level * magnitude_levels + magnitude_level` (in
//! `0..levels`, `levels = layer_levels * magnitude_levels`) is spread
//! monotonically over the band's classes: `class = lo + ⌊composite · width / levels⌋`
//! (`width = hi - lo + 1`).
//!
//! ## Layer position is compared by layer level, not by raw layer index
//!
//! The two level counts are the classifier's *weights*. `layer_levels` is a
//! deliberate quantisation of layer position: all layers of one layer level are
//! equal as far as layer position goes, and inside a level the chunk's
//! magnitude decides. So a large chunk of a back layer may rank above a small
//! chunk of a more-front layer *of the same layer level*; across levels,
//! layer position wins outright. Precisely, for a config that passes
//! [`ClassifierConfig::validate`] and chunks of the same phase:
//!
//! - a chunk in a more-front layer level never gets a lower class than a chunk
//!   in a more-back layer level, whatever the magnitudes (its composite is
//!   strictly larger, and the spread over the band is monotone);
//! - within one layer level (the same layer or not), a larger magnitude — a
//!   smaller relative rank `rank / chunks`, which for one tensor is a smaller
//!   rank — never gets a lower class;
//! - on raw layer indices the order is monotone in the weak sense: a front layer
//!   is never in a lower layer level than a back layer, so it never gets a lower
//!   class whenever the two layers' levels differ.
//!
//! An operator who wants strict layer order (a front layer never below a back
//! layer, whatever the magnitudes) sets `layer_levels >= layers`; then every
//! layer has a level of its own. `magnitude_levels = 1` ignores magnitude.
//!
//! Guarantees, for a config that passes [`ClassifierConfig::validate`]:
//! - every data class is below [`Class::CONTROL`] and inside its phase's band;
//! - the front layer's largest chunk gets the band's top class whenever
//!   `layer_levels * magnitude_levels >= width`; the back layer's smallest chunk
//!   gets the band's bottom class whenever every level is populated
//!   (`layers >= layer_levels` and `chunks >= magnitude_levels`; with fewer layers
//!   or chunks than levels the lowest levels simply go unused);
//! - with `layer_levels * magnitude_levels >= width` and every level populated,
//!   every class of the band is used.
//!
//! ## Worked example: the default config
//!
//! [`ClassifierConfig::default`]: scatter band 0–3, gather band 4–6,
//! `layer_levels = 2`, `magnitude_levels = 2` (4 composite levels), droppable
//! {0, 1, 2, 3, 4}. For a model of any depth `n >= 2` (the front half is layers
//! `l < n / 2`, the back half the rest) and a tensor of any `chunks >= 2` (the
//! larger half is ranks `rank < chunks / 2`, the smaller half the rest):
//!
//! | phase   | layer half    | magnitude half | composite | class | droppable |
//! |---------|---------------|----------------|-----------|-------|-----------|
//! | gather  | front         | larger         | 3         | 6     | no        |
//! | gather  | front         | smaller        | 2         | 5     | no        |
//! | gather  | back          | larger         | 1         | 4     | yes       |
//! | gather  | back          | smaller        | 0         | 4     | yes       |
//! | scatter | front         | larger         | 3         | 3     | yes       |
//! | scatter | front         | smaller        | 2         | 2     | yes       |
//! | scatter | back          | larger         | 1         | 1     | yes       |
//! | scatter | back          | smaller        | 0         | 0     | yes       |
//!
//! (Gather: `4 + ⌊composite · 3 / 4⌋`; scatter: `⌊composite · 4 / 4⌋`, so each
//! scatter composite is a class of its own and magnitude always matters.)
//! Control packets are class 7.
//!
//! Which classes are *droppable* (may count against the loss budget) is a
//! separate [`ClassSet`]; chunks of other classes are always repaired.

// The classifier speaks in classes: kept here too for the crates that use them with it.
use crate::class::{Class, ClassSet};
use crate::wire::Phase;

/// Classifier parameters (from the `[priority]` section of the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassifierConfig {
    /// Classes `lo..=hi` used by reduce-scatter chunks.
    pub scatter_band: (u8, u8),
    /// Classes `lo..=hi` used by all-gather chunks; must lie above `scatter_band`.
    pub gather_band: (u8, u8),
    /// How many levels layer position is cut into (≥ 1).
    pub layer_levels: u8,
    /// How many levels magnitude rank is cut into (≥ 1).
    pub magnitude_levels: u8,
    /// Classes whose chunks may be lost within the budget.
    pub droppable: ClassSet,
}

impl Default for ClassifierConfig {
    fn default() -> Self {
        ClassifierConfig {
            scatter_band: (0, 3),
            gather_band: (4, 6),
            layer_levels: 2,
            magnitude_levels: 2,
            droppable: ClassSet::from_classes([0, 1, 2, 3, 4].into_iter().filter_map(Class::new)),
        }
    }
}

/// Why a [`ClassifierConfig`] is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassifierError {
    /// A band is empty, reaches the control class, or the bands overlap / are misordered.
    #[error("class bands must satisfy scatter.lo <= scatter.hi < gather.lo <= gather.hi <= 6")]
    BadBands,
    /// A level count of zero.
    #[error("layer_levels and magnitude_levels must be at least 1")]
    ZeroLevels,
    /// The control class cannot be droppable.
    #[error("the control class (7) cannot be droppable")]
    DroppableControl,
}

impl ClassifierConfig {
    /// Check the invariants the ordering rules rely on.
    pub fn validate(&self) -> Result<(), ClassifierError> {
        let (slo, shi) = self.scatter_band;
        let (glo, ghi) = self.gather_band;
        if !(slo <= shi && shi < glo && glo <= ghi && ghi <= Class::MAX_DATA.get()) {
            return Err(ClassifierError::BadBands);
        }
        if self.layer_levels == 0 || self.magnitude_levels == 0 {
            return Err(ClassifierError::ZeroLevels);
        }
        if self.droppable.contains(Class::CONTROL) {
            return Err(ClassifierError::DroppableControl);
        }
        Ok(())
    }
}

/// What the classifier knows about a data chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkTraits {
    /// Phase of the transfer.
    pub phase: Phase,
    /// Layer position of the tensor, 0 = front (input side).
    pub layer: u32,
    /// Number of layer positions in the model (≥ 1).
    pub layers: u32,
    /// Rank of the chunk by magnitude inside its tensor, 0 = largest.
    pub magnitude_rank: u32,
    /// Number of chunks ranked (≥ 1).
    pub chunks: u32,
}

/// Layer level of layer `l` of `n` (`n >= 1`, `l < n`) with `ll >= 1` levels:
/// `ll - 1 - ⌊l · ll / n⌋`, in `0..ll`, higher = more front.
fn level_of(l: u128, n: u128, ll: u128) -> u128 {
    ll - 1 - l * ll / n
}

/// The composite level of `t` in `0..layer_levels * magnitude_levels` (higher =
/// more important) and the number of composite levels. Counts of zero are
/// treated as one and out-of-range positions as the last position. All
/// arithmetic is in `u128` on values below 2^40, so it cannot overflow.
fn composite_level(cfg: &ClassifierConfig, t: &ChunkTraits) -> (u128, u128) {
    let ll = u128::from(cfg.layer_levels.max(1));
    let ml = u128::from(cfg.magnitude_levels.max(1));
    let n = u128::from(t.layers.max(1));
    let l = u128::from(t.layer).min(n - 1);
    let c = u128::from(t.chunks.max(1));
    let r = u128::from(t.magnitude_rank).min(c - 1);
    let layer_level = level_of(l, n, ll);
    let magnitude_level = level_of(r, c, ml);
    (layer_level * ml + magnitude_level, ll * ml)
}

/// The class of a data chunk. Pure; see the module docs for the rules.
/// `cfg` should have passed [`ClassifierConfig::validate`]; an invalid config
/// still yields a data class (never [`Class::CONTROL`]). Malformed traits are
/// tolerated: zero `layers`/`chunks` count as one, and a `layer` or
/// `magnitude_rank` past the end counts as the last one.
pub fn classify(cfg: &ClassifierConfig, t: &ChunkTraits) -> Class {
    let (lo, hi) = match t.phase {
        Phase::Gather => cfg.gather_band,
        Phase::Scatter | Phase::None => cfg.scatter_band,
    };
    let hi = hi.min(Class::MAX_DATA.get());
    let lo = lo.min(hi);
    let width = u128::from(hi - lo) + 1;
    let (composite, levels) = composite_level(cfg, t);
    // composite < levels, so offset < width and lo + offset <= hi <= MAX_DATA.
    let offset = composite * width / levels;
    Class(lo + offset as u8)
}

/// Rank every `chunk_elems`-sized chunk of `data` by L2 norm: `ranks[i]` is the
/// position of chunk `i` when chunks are sorted by decreasing norm (ties broken by
/// index, so the result is deterministic).
///
/// The last chunk may be shorter than `chunk_elems`; `chunk_elems == 0` is
/// treated as 1; empty `data` gives no ranks. The squared norm is summed in `f64`
/// (in element order), where the square of any `f32` is exact and neither
/// overflows nor underflows, so chunks whose norms differ in `f32` extremes
/// (1e30 vs 1e20, 1e-45 vs 0) are still told apart. A NaN anywhere makes the
/// chunk count as largest (equal to an infinite norm), so corrupt data is
/// looked at first rather than dropped first. Never panics.
pub fn magnitude_ranks(data: &[f32], chunk_elems: usize) -> Vec<u32> {
    let chunk_elems = chunk_elems.max(1);
    let norms: Vec<f64> = data
        .chunks(chunk_elems)
        .map(|c| {
            let s: f64 = c.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
            if s.is_nan() { f64::INFINITY } else { s }
        })
        .collect();
    rank_order(norms.len(), |a, b| norms[b].total_cmp(&norms[a]))
}

/// The position of each of `n` entries when sorted by `cmp` (ties broken by
/// index, so the result is deterministic).
pub(crate) fn rank_order(n: usize, cmp: impl Fn(usize, usize) -> core::cmp::Ordering) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by(|&a, &b| cmp(a as usize, b as usize).then(a.cmp(&b)));
    let mut ranks = vec![0u32; n];
    for (pos, &i) in order.iter().enumerate() {
        ranks[i as usize] = pos as u32;
    }
    ranks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        ClassifierConfig::default().validate().unwrap();
    }

    #[test]
    fn front_large_gather_is_top_data_class() {
        let cfg = ClassifierConfig::default();
        let t = ChunkTraits { phase: Phase::Gather, layer: 0, layers: 10, magnitude_rank: 0, chunks: 100 };
        assert_eq!(classify(&cfg, &t), Class::MAX_DATA);
        let t = ChunkTraits { phase: Phase::Scatter, layer: 9, layers: 10, magnitude_rank: 99, chunks: 100 };
        assert_eq!(classify(&cfg, &t), Class::new(0).unwrap());
    }

    /// The worked example table in the module docs, for several model depths
    /// and chunk counts.
    #[test]
    fn default_config_table() {
        let cfg = ClassifierConfig::default();
        assert_eq!((cfg.layer_levels, cfg.magnitude_levels), (2, 2));
        assert_eq!((cfg.scatter_band, cfg.gather_band), ((0, 3), (4, 6)));
        // (phase, layer half (0 = front), magnitude half (0 = larger), composite, class)
        let table = [
            (Phase::Gather, 0, 0, 3, 6),
            (Phase::Gather, 0, 1, 2, 5),
            (Phase::Gather, 1, 0, 1, 4),
            (Phase::Gather, 1, 1, 0, 4),
            (Phase::Scatter, 0, 0, 3, 3),
            (Phase::Scatter, 0, 1, 2, 2),
            (Phase::Scatter, 1, 0, 1, 1),
            (Phase::Scatter, 1, 1, 0, 0),
        ];
        for layers in [2u32, 3, 4, 10, 161] {
            for chunks in [2u32, 5, 10, 1001] {
                for (phase, half, mag, composite, class) in table {
                    // Every layer of the half; first, middle and last rank of the magnitude half.
                    let front_len = layers.div_ceil(2);
                    let (l0, l1) = if half == 0 { (0, front_len) } else { (front_len, layers) };
                    let large_len = chunks.div_ceil(2);
                    let (r0, r1) = if mag == 0 { (0, large_len) } else { (large_len, chunks) };
                    for layer in l0..l1 {
                        for magnitude_rank in [r0, (r0 + r1) / 2, r1 - 1] {
                            let t = ChunkTraits { phase, layer, layers, magnitude_rank, chunks };
                            assert_eq!(composite_level(&cfg, &t), (composite, 4), "{t:?}");
                            assert_eq!(classify(&cfg, &t).get(), class, "{t:?}");
                        }
                    }
                    let droppable = cfg.droppable.contains(Class::new(class).unwrap());
                    assert_eq!(droppable, class <= 4);
                }
            }
        }
    }

    /// Layers sharing a layer level are equal in layer position, so magnitude
    /// decides between them: a back layer's large chunk ranks above a more-front
    /// layer's small chunk of the same level. Across levels, layer wins.
    #[test]
    fn magnitude_decides_within_a_shared_layer_level() {
        let cfg = ClassifierConfig::default();
        // 8 layers: 0..4 front level, 4..8 back level.
        let front = ChunkTraits { phase: Phase::Scatter, layer: 4, layers: 8, magnitude_rank: 9, chunks: 10 };
        let back = ChunkTraits { layer: 5, magnitude_rank: 0, ..front };
        assert_eq!(classify(&cfg, &front).get(), 0);
        assert_eq!(classify(&cfg, &back).get(), 1);
        // Across the level boundary the front layer wins whatever the magnitudes.
        let front = ChunkTraits { layer: 3, ..front };
        assert_eq!(classify(&cfg, &front).get(), 2);
        assert!(classify(&cfg, &front) > classify(&cfg, &back));
    }

    /// A realistic model (ResNet-50: ~160 parameter tensors, far more than the
    /// layer levels): magnitude still changes the class in every layer.
    #[test]
    fn magnitude_matters_for_deep_models() {
        let cfg = ClassifierConfig::default();
        for phase in [Phase::Scatter, Phase::Gather] {
            for layer in 0..161 {
                let large = ChunkTraits { phase, layer, layers: 161, magnitude_rank: 0, chunks: 64 };
                let small = ChunkTraits { magnitude_rank: 63, ..large };
                let (cl, cs) = (classify(&cfg, &large), classify(&cfg, &small));
                assert!(cl >= cs, "{large:?}");
                // Gather's back level has one class (4) for both halves.
                if phase == Phase::Scatter || layer < 81 {
                    assert!(cl > cs, "{large:?}: {cl:?} vs {cs:?}");
                }
            }
        }
    }

    #[test]
    fn magnitude_ranks_order() {
        let d = [0.0, 0.0, 3.0, 3.0, 1.0, 1.0];
        assert_eq!(magnitude_ranks(&d, 2), vec![2, 0, 1]);
        // f32 squares would overflow (1e30) or underflow (1e-45) and tie.
        assert_eq!(magnitude_ranks(&[1e20, 1e30], 1), vec![1, 0]);
        assert_eq!(magnitude_ranks(&[0.0, 1e-45], 1), vec![1, 0]);
        assert!(magnitude_ranks(&[], 3).is_empty());
    }
}
