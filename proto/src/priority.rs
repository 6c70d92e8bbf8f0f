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
//!    gather band lies wholly above the scatter band;
//! 2. *layer position*: front layers (needed first by the next forward pass)
//!    rank above back layers; the layer axis is cut into
//!    [`ClassifierConfig::layer_levels`] levels;
//! 3. *magnitude rank* of the chunk inside its tensor (by L2 norm, see
//!    [`magnitude_ranks`]): large gradients rank above small ones, cut into
//!    [`ClassifierConfig::magnitude_levels`] levels.
//!
//! Within a band, the composite level `layer_level * magnitude_levels +
//! magnitude_level` is spread monotonically over the band's classes. The two
//! level counts are the classifier's *weights*: more layer levels give layer
//! position more resolution; `magnitude_levels = 1` ignores magnitude.
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

/// Level of a position `pos` of `n` (0 = most important) on a scale of `levels`,
/// where `levels - 1` is the most important level.
fn level(pos: u32, n: u32, levels: u8) -> u64 {
    let n = u64::from(n.max(1));
    let pos = u64::from(pos).min(n - 1);
    let levels = u64::from(levels.max(1));
    levels - 1 - (pos * levels / n)
}

/// The class of a data chunk. Pure; see the module docs for the rules.
/// `cfg` should have passed [`ClassifierConfig::validate`]; an invalid config
/// still yields a data class (never [`Class::CONTROL`]).
pub fn classify(cfg: &ClassifierConfig, t: &ChunkTraits) -> Class {
    let (lo, hi) = match t.phase {
        Phase::Gather => cfg.gather_band,
        _ => cfg.scatter_band,
    };
    let hi = hi.min(Class::MAX_DATA.get());
    let lo = lo.min(hi);
    let width = u64::from(hi - lo) + 1;
    let ml = u64::from(cfg.magnitude_levels.max(1));
    let levels = u64::from(cfg.layer_levels.max(1)) * ml;
    let composite = level(t.layer, t.layers, cfg.layer_levels) * ml
        + level(t.magnitude_rank, t.chunks, cfg.magnitude_levels);
    let offset = composite * width / levels;
    Class(lo + offset as u8)
}

/// Rank every `chunk_elems`-sized chunk of `data` by L2 norm: `ranks[i]` is the
/// position of chunk `i` when chunks are sorted by decreasing norm (ties broken by
/// index, so the result is deterministic; NaN counts as largest).
pub fn magnitude_ranks(data: &[f32], chunk_elems: usize) -> Vec<u32> {
    let chunk_elems = chunk_elems.max(1);
    let norms: Vec<f32> = data
        .chunks(chunk_elems)
        .map(|c| {
            let s: f32 = c.iter().map(|x| x * x).sum();
            if s.is_nan() { f32::INFINITY } else { s }
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

    #[test]
    fn magnitude_ranks_order() {
        let d = [0.0, 0.0, 3.0, 3.0, 1.0, 1.0];
        assert_eq!(magnitude_ranks(&d, 2), vec![2, 0, 1]);
    }
}
