//! Priority classes.
//!
//! Every packet carries one of eight classes; the daemon maps a class to an IP
//! DSCP value (so switches with priority queues serve and drop by importance), to
//! a Linux `SO_PRIORITY`, and to a DPDK TX queue. Class 7 ([`Class::CONTROL`]) is
//! reserved for control packets (PROBE, BITMAP, DONE, HELLO); data uses 0–6.
//!
//! A data chunk's class is a pure function of three traits, compared
//! lexicographically — **phase before layer before magnitude**:
//!
//! 1. *phase*: aggregated results (all-gather) rank above raw contributions
//!    (reduce-scatter); each phase owns a band of classes
//!    ([`ClassifierConfig::scatter_band`], [`ClassifierConfig::gather_band`]) and the
//!    gather band lies wholly above the scatter band, so every gather chunk is in a
//!    strictly higher class than every scatter chunk. ([`Phase::None`] is classified
//!    like scatter.)
//! 2. *layer position*: front layers (needed first by the next forward pass)
//!    rank above back layers; the layer axis is cut into
//!    [`ClassifierConfig::layer_levels`] levels (layer `l` of `n` is in level
//!    `layer_levels - 1 - ⌊l · layer_levels / n⌋`, so the front layer is always in
//!    the top level);
//! 3. *magnitude rank* of the chunk inside its tensor (by L2 norm, see
//!    [`magnitude_ranks`]): large gradients rank above small ones, cut into
//!    [`ClassifierConfig::magnitude_levels`] sub-levels of the layer level.
//!
//! The composite level `layer_level * magnitude_levels + magnitude_level` (in
//! `0..layer_levels * magnitude_levels`) is spread monotonically over the band's
//! classes: `class = lo + ⌊composite · width / levels⌋`. The two level counts are
//! the classifier's *weights*: more layer levels give layer position more
//! resolution; `magnitude_levels = 1` ignores magnitude.
//!
//! **Ordering is exact on raw layer indices.** When one layer level holds several
//! layers (a model deeper than `layer_levels`), its magnitude sub-levels are shared
//! out between those layers in layer order: the chunks of the level are ordered
//! by (layer, magnitude rank) and that order is cut into `magnitude_levels` parts.
//! So a front layer never ranks below a back layer whatever the magnitudes (a
//! rule that must hold exactly, because "layer before magnitude" is what lets
//! the next forward pass start early), and magnitude refines the class only
//! within a layer. With at most one layer per level (`layers <= layer_levels`)
//! each layer gets all `magnitude_levels` sub-levels.
//!
//! Guarantees, for a config that passes [`ClassifierConfig::validate`]:
//! - every data class is below [`Class::CONTROL`] and inside its phase's band;
//! - the front layer's largest chunk gets the band's top class whenever
//!   `layer_levels * magnitude_levels >= width`; the back layer's smallest chunk
//!   gets the band's bottom class whenever every level is populated
//!   (`layers >= layer_levels` and `chunks >= magnitude_levels`; with fewer layers
//!   or chunks than levels the lowest levels simply go unused).
//!
//! ## Worked example: the default config
//!
//! [`ClassifierConfig::default`]: scatter band 0–3, gather band 4–6,
//! `layer_levels = 4`, `magnitude_levels = 2` (8 composite levels), droppable
//! {0, 1, 2, 3, 4}. For a model whose layer count is a multiple of 4, with one
//! layer per quarter (e.g. 4 layers; deeper models share each quarter's two
//! magnitude halves out between the quarter's layers, front layers first) and
//! chunks ranked into a larger and a smaller half:
//!
//! | phase   | layer quarter | magnitude half | composite | class | droppable |
//! |---------|---------------|----------------|-----------|-------|-----------|
//! | gather  | 1st (front)   | larger         | 7         | 6     | no        |
//! | gather  | 1st (front)   | smaller        | 6         | 6     | no        |
//! | gather  | 2nd           | larger         | 5         | 5     | no        |
//! | gather  | 2nd           | smaller        | 4         | 5     | no        |
//! | gather  | 3rd           | larger         | 3         | 5     | no        |
//! | gather  | 3rd           | smaller        | 2         | 4     | yes       |
//! | gather  | 4th (back)    | larger         | 1         | 4     | yes       |
//! | gather  | 4th (back)    | smaller        | 0         | 4     | yes       |
//! | scatter | 1st (front)   | either         | 7, 6      | 3     | yes       |
//! | scatter | 2nd           | either         | 5, 4      | 2     | yes       |
//! | scatter | 3rd           | either         | 3, 2      | 1     | yes       |
//! | scatter | 4th (back)    | either         | 1, 0      | 0     | yes       |
//!
//! (Gather: `⌊composite · 3 / 8⌋ + 4`; scatter: `⌊composite · 4 / 8⌋`, so with
//! the default weights magnitude never changes a scatter class.) Control packets
//! are class 7.
//!
//! Which classes are *droppable* (may count against the loss budget) is a
//! separate [`ClassSet`]; chunks of other classes are always repaired.

use crate::wire::Phase;

/// A priority class, 0 (lowest) to 7 (control).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Class(u8);

impl Class {
    /// Number of classes.
    pub const COUNT: usize = 8;
    /// The class of control packets.
    pub const CONTROL: Class = Class(7);
    /// The highest class a data chunk can have.
    pub const MAX_DATA: Class = Class(6);

    /// A class from its number, if in range.
    pub const fn new(v: u8) -> Option<Class> {
        if (v as usize) < Self::COUNT { Some(Class(v)) } else { None }
    }

    /// The class number.
    pub const fn get(self) -> u8 {
        self.0
    }

    /// The class number as an index into per-class tables.
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// All classes, lowest first.
    pub fn all() -> impl DoubleEndedIterator<Item = Class> {
        (0..Self::COUNT as u8).map(Class)
    }
}

/// A set of classes (bit `c` set = class `c` in the set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ClassSet(pub u8);

impl ClassSet {
    /// The empty set.
    pub const EMPTY: ClassSet = ClassSet(0);

    /// A set from a list of classes.
    pub fn from_classes(classes: impl IntoIterator<Item = Class>) -> ClassSet {
        ClassSet(classes.into_iter().fold(0, |m, c| m | (1 << c.get())))
    }

    /// True if `c` is in the set.
    pub fn contains(self, c: Class) -> bool {
        self.0 & (1 << c.get()) != 0
    }
}

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
            layer_levels: 4,
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

/// The composite level of `t` in `0..layer_levels * magnitude_levels` (higher =
/// more important) and the number of composite levels. Counts of zero are
/// treated as one and out-of-range positions as the last position.
fn composite_level(cfg: &ClassifierConfig, t: &ChunkTraits) -> (u128, u128) {
    let ll = u128::from(cfg.layer_levels.max(1));
    let ml = u128::from(cfg.magnitude_levels.max(1));
    let n = u128::from(t.layers.max(1));
    let l = u128::from(t.layer).min(n - 1);
    let c = u128::from(t.chunks.max(1));
    let r = u128::from(t.magnitude_rank).min(c - 1);
    // Layer group `g` (0 = front) and the layers `first..next` it holds (l is one).
    let g = l * ll / n;
    let first = (g * n).div_ceil(ll);
    let next = ((g + 1) * n).div_ceil(ll);
    let k = next - first;
    // Position of the chunk in the group's (layer, magnitude rank) order, out of
    // `k * c`, cut into `ml` parts: 0 = front layer's largest chunk. Monotone in
    // (l, r/c) lexicographically, even across tensors of different chunk counts.
    let q = (l - first) * c + r;
    let magnitude_level = ml - 1 - q * ml / (k * c);
    ((ll - 1 - g) * ml + magnitude_level, ll * ml)
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
    let mut order: Vec<u32> = (0..norms.len() as u32).collect();
    order.sort_by(|&a, &b| norms[b as usize].total_cmp(&norms[a as usize]).then(a.cmp(&b)));
    let mut ranks = vec![0u32; norms.len()];
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

    /// The worked example table in the module docs.
    #[test]
    fn default_config_table() {
        let cfg = ClassifierConfig::default();
        // (phase, layer quarter, magnitude half (0 = larger), class)
        let table = [
            (Phase::Gather, 0, 0, 6),
            (Phase::Gather, 0, 1, 6),
            (Phase::Gather, 1, 0, 5),
            (Phase::Gather, 1, 1, 5),
            (Phase::Gather, 2, 0, 5),
            (Phase::Gather, 2, 1, 4),
            (Phase::Gather, 3, 0, 4),
            (Phase::Gather, 3, 1, 4),
            (Phase::Scatter, 0, 0, 3),
            (Phase::Scatter, 0, 1, 3),
            (Phase::Scatter, 1, 0, 2),
            (Phase::Scatter, 1, 1, 2),
            (Phase::Scatter, 2, 0, 1),
            (Phase::Scatter, 2, 1, 1),
            (Phase::Scatter, 3, 0, 0),
            (Phase::Scatter, 3, 1, 0),
        ];
        for (phase, layer, half, class) in table {
            // 4 layers, 10 chunks: ranks 0..5 are the larger half.
            let t = ChunkTraits { phase, layer, layers: 4, magnitude_rank: half * 5 + 2, chunks: 10 };
            assert_eq!(classify(&cfg, &t).get(), class, "{t:?}");
            let droppable = cfg.droppable.contains(Class::new(class).unwrap());
            assert_eq!(droppable, class <= 4);
        }
    }

    /// Two layers in one layer level: the front one's smallest chunk must not
    /// rank below the back one's largest (it did when magnitude was applied per
    /// layer level rather than per layer).
    #[test]
    fn layers_sharing_a_level_keep_layer_order() {
        let cfg = ClassifierConfig::default();
        let front = ChunkTraits { phase: Phase::Gather, layer: 4, layers: 8, magnitude_rank: 9, chunks: 10 };
        let back = ChunkTraits { layer: 5, magnitude_rank: 0, ..front };
        assert!(classify(&cfg, &front) >= classify(&cfg, &back));
        assert_eq!(classify(&cfg, &front).get(), 5);
        assert_eq!(classify(&cfg, &back).get(), 4);
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
