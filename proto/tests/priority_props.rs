//! Property tests for the priority classifier (`dlcp_proto::priority`).
//!
//! The ordering rules — control on top, then phase before layer level before
//! magnitude level — must hold *exactly* for every valid configuration, so each
//! one is checked over random configs and random chunk traits. Layer position is
//! compared at the granularity of `layer_levels` (layer `l` of `n` is in level
//! `layer_levels - 1 - ⌊l·layer_levels/n⌋`); within one layer level, magnitude
//! decides.

use dlcp_proto::class::{Class, ClassSet};
use dlcp_proto::priority::{ChunkTraits, ClassifierConfig, ClassifierError, classify, magnitude_ranks};
use dlcp_proto::wire::Phase;
use proptest::prelude::*;

/// A valid config: `slo <= shi < glo <= ghi <= 6`, levels in `1..=16`, any
/// droppable set without the control class.
fn valid_config() -> impl Strategy<Value = ClassifierConfig> {
    (0u8..=5)
        .prop_flat_map(|shi| (0..=shi, Just(shi), shi + 1..=6))
        .prop_flat_map(|(slo, shi, glo)| (Just((slo, shi)), Just(glo), glo..=6))
        .prop_flat_map(|(scatter_band, glo, ghi)| {
            (Just(scatter_band), Just((glo, ghi)), 1u8..=16, 1u8..=16, 0u8..0x80)
        })
        .prop_map(|(scatter_band, gather_band, layer_levels, magnitude_levels, drop)| ClassifierConfig {
            scatter_band,
            gather_band,
            layer_levels,
            magnitude_levels,
            droppable: ClassSet(drop),
        })
}

/// A positive count: mostly small (where level boundaries are dense), sometimes huge.
fn count() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 1u32..=40, 1 => 1u32..=u32::MAX]
}

/// An index below `n`.
fn below(n: u32) -> impl Strategy<Value = u32> {
    0..n
}

fn phase() -> impl Strategy<Value = Phase> {
    prop_oneof![Just(Phase::None), Just(Phase::Scatter), Just(Phase::Gather)]
}

/// Well-formed traits (`layer < layers`, `magnitude_rank < chunks`) of the given phase.
fn traits_in(phase: impl Strategy<Value = Phase>) -> impl Strategy<Value = ChunkTraits> {
    (phase, count(), count())
        .prop_flat_map(|(phase, layers, chunks)| {
            (Just(phase), below(layers), Just(layers), below(chunks), Just(chunks))
        })
        .prop_map(|(phase, layer, layers, magnitude_rank, chunks)| ChunkTraits {
            phase,
            layer,
            layers,
            magnitude_rank,
            chunks,
        })
}

/// Arbitrary (possibly malformed) traits: zero counts, indices out of range.
fn any_traits() -> impl Strategy<Value = ChunkTraits> {
    (phase(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
        |(phase, layer, layers, magnitude_rank, chunks)| ChunkTraits {
            phase,
            layer,
            layers,
            magnitude_rank,
            chunks,
        },
    )
}

/// The band `classify` must stay in for `phase` (phase `None` is treated as scatter).
fn band(cfg: &ClassifierConfig, phase: Phase) -> (u8, u8) {
    match phase {
        Phase::Gather => cfg.gather_band,
        _ => cfg.scatter_band,
    }
}

fn band_width(b: (u8, u8)) -> u32 {
    u32::from(b.1 - b.0) + 1
}

/// Reference level, as documented: position `i` of `n` cut into `levels`
/// levels is in level `levels - 1 - ⌊i·levels/n⌋` (higher = more front / larger).
fn level(i: u32, n: u32, levels: u8) -> u64 {
    let levels = u64::from(levels);
    levels - 1 - u64::from(i) * levels / u64::from(n)
}

/// The raw layers `first..next` of layer group `g` (0 = front, i.e. level
/// `layer_levels - 1 - g`) of a model with `n` layers; empty if no layer is in it.
fn group_range(g: u64, n: u32, layer_levels: u8) -> (u32, u32) {
    let (n, ll) = (u64::from(n), u64::from(layer_levels));
    ((g * n).div_ceil(ll) as u32, ((g + 1) * n).div_ceil(ll) as u32)
}

/// Reference class, as documented: `lo + ⌊composite·width/levels⌋` with
/// `composite = layer_level·magnitude_levels + magnitude_level`.
fn reference_class(cfg: &ClassifierConfig, t: &ChunkTraits) -> u8 {
    let (lo, hi) = band(cfg, t.phase);
    let composite = level(t.layer, t.layers, cfg.layer_levels) * u64::from(cfg.magnitude_levels)
        + level(t.magnitude_rank, t.chunks, cfg.magnitude_levels);
    let levels = u64::from(cfg.layer_levels) * u64::from(cfg.magnitude_levels);
    lo + (composite * u64::from(band_width((lo, hi))) / levels) as u8
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Control is always on top: no data chunk reaches class 7, for any traits
    /// (malformed ones included), valid config or not.
    #[test]
    fn control_always_on_top(cfg in valid_config(), t in any_traits(), w in traits_in(phase())) {
        // Also the most important chunk of its phase (front layer, largest).
        let top = ChunkTraits { layer: 0, magnitude_rank: 0, ..t };
        for t in [t, top, w] {
            let c = classify(&cfg, &t);
            prop_assert!(c < Class::CONTROL, "{:?} -> {:?}", t, c);
            prop_assert!(c <= Class::MAX_DATA);
        }
    }

    /// Even an unvalidated (garbage) config never yields the control class.
    #[test]
    fn invalid_config_still_yields_data_class(
        bands in any::<(u8, u8, u8, u8)>(),
        ll in any::<u8>(),
        ml in any::<u8>(),
        t in any_traits(),
    ) {
        let cfg = ClassifierConfig {
            scatter_band: (bands.0, bands.1),
            gather_band: (bands.2, bands.3),
            layer_levels: ll,
            magnitude_levels: ml,
            droppable: ClassSet::EMPTY,
        };
        prop_assert!(classify(&cfg, &t) <= Class::MAX_DATA);
    }

    /// Every class lies inside its phase's band.
    #[test]
    fn class_inside_band(cfg in valid_config(), t in any_traits()) {
        let (lo, hi) = band(&cfg, t.phase);
        let c = classify(&cfg, &t).get();
        prop_assert!(lo <= c && c <= hi, "class {} outside band {:?}", c, (lo, hi));
    }

    /// Phase first: every gather chunk ranks strictly above every scatter chunk.
    #[test]
    fn gather_strictly_above_scatter(
        cfg in valid_config(),
        g in traits_in(Just(Phase::Gather)),
        s in traits_in(prop_oneof![Just(Phase::Scatter), Just(Phase::None)]),
    ) {
        prop_assert!(classify(&cfg, &g) > classify(&cfg, &s));
    }

    /// The class is exactly the documented formula, for well-formed traits.
    #[test]
    fn class_matches_documented_formula(cfg in valid_config(), t in traits_in(phase())) {
        prop_assert_eq!(classify(&cfg, &t).get(), reference_class(&cfg, &t), "{:?}", t);
    }

    /// Layer level before magnitude: a chunk in a more-front layer level never
    /// ranks below a chunk in a more-back layer level, whatever the magnitudes
    /// (and chunk counts, since different layers are different tensors). Layers
    /// are picked by level, so every case exercises the rule.
    #[test]
    fn front_level_never_below_back_level(
        cfg in valid_config(),
        phase in phase(),
        extra_layers in prop_oneof![3 => 0u32..=40, 1 => 0u32..=u32::MAX - 16],
        groups in any::<(u8, u8)>(),
        pick in any::<(u32, u32)>(),
        a in traits_in(Just(Phase::Scatter)),
        b in traits_in(Just(Phase::Scatter)),
    ) {
        prop_assume!(cfg.layer_levels >= 2);
        let layers = u32::from(cfg.layer_levels) + extra_layers;
        let ll = u64::from(cfg.layer_levels);
        let (gx, gy) = (u64::from(groups.0) % ll, u64::from(groups.1) % (ll - 1));
        // Two distinct groups, front one first (every group is populated: layers >= ll).
        let gy = if gy >= gx { gy + 1 } else { gy };
        let (gf, gb) = (gx.min(gy), gx.max(gy));
        let (ff, fn_) = group_range(gf, layers, cfg.layer_levels);
        let (bf, bn) = group_range(gb, layers, cfg.layer_levels);
        let front = ff + pick.0 % (fn_ - ff);
        let back = bf + pick.1 % (bn - bf);
        prop_assert!(level(front, layers, cfg.layer_levels) > level(back, layers, cfg.layer_levels));
        let ta = ChunkTraits { phase, layer: front, layers, ..a };
        let tb = ChunkTraits { phase, layer: back, layers, ..b };
        let (ca, cb) = (classify(&cfg, &ta), classify(&cfg, &tb));
        prop_assert!(ca >= cb, "front {:?} -> {:?} below back {:?} -> {:?}", ta, ca, tb, cb);
    }

    /// The sharpest form of the level rule: the last layer of a level with its
    /// smallest chunk against the first layer of the next level back with its
    /// largest chunk.
    #[test]
    fn adjacent_levels_extreme_magnitudes(
        cfg in valid_config(),
        phase in phase(),
        extra_layers in 0u32..=64,
        g in any::<u8>(),
        chunks_a in count(),
        chunks_b in count(),
    ) {
        prop_assume!(cfg.layer_levels >= 2);
        let layers = u32::from(cfg.layer_levels) + extra_layers;
        let g = 1 + u64::from(g) % (u64::from(cfg.layer_levels) - 1);
        let (first, _) = group_range(g, layers, cfg.layer_levels);
        let ta = ChunkTraits { phase, layer: first - 1, layers, magnitude_rank: chunks_a - 1, chunks: chunks_a };
        let tb = ChunkTraits { phase, layer: first, layers, magnitude_rank: 0, chunks: chunks_b };
        prop_assert!(classify(&cfg, &ta) >= classify(&cfg, &tb), "{:?} vs {:?}", ta, tb);
    }

    /// Layer order on raw indices is monotone in the weak sense: for layers
    /// `x < y`, with equal magnitudes the front one never ranks below; when
    /// their levels differ it never ranks below whatever the magnitudes; when
    /// they share a level, layer position is a tie and the class depends on
    /// the magnitude alone.
    #[test]
    fn raw_layer_order_weakly_monotone(
        cfg in valid_config(),
        phase in phase(),
        layers in prop_oneof![3 => 2u32..=40, 1 => 2u32..=u32::MAX],
        pick in any::<(u32, u32)>(),
        a in traits_in(Just(Phase::Scatter)),
        b in traits_in(Just(Phase::Scatter)),
    ) {
        let (x, y) = (pick.0 % layers, pick.1 % layers);
        prop_assume!(x != y);
        let (front, back) = (x.min(y), x.max(y));
        let same_mag = (
            classify(&cfg, &ChunkTraits { phase, layer: front, layers, ..a }),
            classify(&cfg, &ChunkTraits { phase, layer: back, layers, ..a }),
        );
        let ta = ChunkTraits { phase, layer: front, layers, ..a };
        let tb = ChunkTraits { phase, layer: back, layers, ..b };
        let (ca, cb) = (classify(&cfg, &ta), classify(&cfg, &tb));
        if level(front, layers, cfg.layer_levels) == level(back, layers, cfg.layer_levels) {
            prop_assert_eq!(same_mag.0, same_mag.1, "same level, same magnitude: {:?} vs {:?}", ta, tb);
        } else {
            prop_assert!(same_mag.0 >= same_mag.1);
            prop_assert!(ca >= cb, "front {:?} -> {:?} below back {:?} -> {:?}", ta, ca, tb, cb);
        }
    }

    /// Magnitude within a layer: same phase and layer, a larger chunk (smaller
    /// rank) never ranks below a smaller one.
    #[test]
    fn larger_magnitude_never_below_smaller(
        cfg in valid_config(),
        t in traits_in(phase()),
        other in any::<u32>(),
    ) {
        let r2 = other % t.chunks;
        let (big, small) = (t.magnitude_rank.min(r2), t.magnitude_rank.max(r2));
        let cb = classify(&cfg, &ChunkTraits { magnitude_rank: big, ..t });
        let cs = classify(&cfg, &ChunkTraits { magnitude_rank: small, ..t });
        prop_assert!(cb >= cs, "rank {} -> {:?} below rank {} -> {:?} ({:?})", big, cb, small, cs, t);
    }

    /// Magnitude within a layer level: two chunks of (possibly) different layers
    /// of the same level, from tensors of (possibly) different chunk counts —
    /// the one with the larger magnitude (smaller relative rank `rank/chunks`)
    /// never ranks below the other, whatever their raw layer order.
    #[test]
    fn larger_magnitude_never_below_smaller_within_level(
        cfg in valid_config(),
        phase in phase(),
        layers in count(),
        pick in any::<(u32, u32)>(),
        a in traits_in(Just(Phase::Scatter)),
        b in traits_in(Just(Phase::Scatter)),
    ) {
        let x = pick.0 % layers;
        let g = u64::from(x) * u64::from(cfg.layer_levels) / u64::from(layers);
        let (first, next) = group_range(g, layers, cfg.layer_levels);
        prop_assert!(first <= x && x < next, "group range {:?} misses layer {}", (first, next), x);
        let y = first + pick.1 % (next - first);
        prop_assert_eq!(level(x, layers, cfg.layer_levels), level(y, layers, cfg.layer_levels));
        let ta = ChunkTraits { phase, layer: x, layers, ..a };
        let tb = ChunkTraits { phase, layer: y, layers, ..b };
        // Relative ranks a.r/a.c vs b.r/b.c, compared exactly.
        let lhs = u64::from(ta.magnitude_rank) * u64::from(tb.chunks);
        let rhs = u64::from(tb.magnitude_rank) * u64::from(ta.chunks);
        let (ca, cb) = (classify(&cfg, &ta), classify(&cfg, &tb));
        if lhs <= rhs {
            prop_assert!(ca >= cb, "larger {:?} -> {:?} below smaller {:?} -> {:?}", ta, ca, tb, cb);
        }
        if rhs <= lhs {
            prop_assert!(cb >= ca, "larger {:?} -> {:?} below smaller {:?} -> {:?}", tb, cb, ta, ca);
        }
    }

    /// Band ends: the front layer's largest chunk gets the band's top class
    /// whenever there are at least as many composite levels as band classes;
    /// the back layer's smallest chunk gets the band's bottom class whenever
    /// every level is populated (layers >= layer_levels, chunks >= magnitude_levels).
    #[test]
    fn band_ends_reachable(
        cfg in valid_config(),
        phase in phase(),
        layers in count(),
        chunks in count(),
    ) {
        let (lo, hi) = band(&cfg, phase);
        let top = ChunkTraits { phase, layer: 0, layers, magnitude_rank: 0, chunks };
        let bottom = ChunkTraits { phase, layer: layers - 1, layers, magnitude_rank: chunks - 1, chunks };
        let levels = u32::from(cfg.layer_levels) * u32::from(cfg.magnitude_levels);
        if levels >= band_width((lo, hi)) {
            prop_assert_eq!(classify(&cfg, &top).get(), hi);
        }
        if layers >= u32::from(cfg.layer_levels) && chunks >= u32::from(cfg.magnitude_levels) {
            prop_assert_eq!(classify(&cfg, &bottom).get(), lo);
        }
    }

    /// The same with every level populated by construction (the conditional
    /// branches above are then always exercised).
    #[test]
    fn band_ends_reachable_populated(
        cfg in valid_config(),
        phase in phase(),
        extra_layers in 0u32..100,
        extra_chunks in 0u32..100,
    ) {
        let (lo, hi) = band(&cfg, phase);
        let layers = u32::from(cfg.layer_levels) + extra_layers;
        let chunks = u32::from(cfg.magnitude_levels) + extra_chunks;
        let top = ChunkTraits { phase, layer: 0, layers, magnitude_rank: 0, chunks };
        let bottom = ChunkTraits { phase, layer: layers - 1, layers, magnitude_rank: chunks - 1, chunks };
        prop_assert_eq!(classify(&cfg, &bottom).get(), lo);
        let levels = u32::from(cfg.layer_levels) * u32::from(cfg.magnitude_levels);
        if levels >= band_width((lo, hi)) {
            prop_assert_eq!(classify(&cfg, &top).get(), hi);
        }
    }

    /// With at least as many composite levels as band classes and every level
    /// populated (at least one layer per layer level, at least one chunk per
    /// magnitude level), every class of the band is used: the spread over the
    /// band has no holes.
    #[test]
    fn every_band_class_used_when_resolution_allows(
        cfg in valid_config(),
        phase in phase(),
        extra_layers in prop_oneof![Just(0u32), 0u32..=24],
        extra_chunks in prop_oneof![Just(0u32), 0u32..=24],
    ) {
        let (lo, hi) = band(&cfg, phase);
        let layers = u32::from(cfg.layer_levels) + extra_layers;
        let chunks = u32::from(cfg.magnitude_levels) + extra_chunks;
        let levels = u32::from(cfg.layer_levels) * u32::from(cfg.magnitude_levels);
        prop_assume!(levels >= band_width((lo, hi)));
        let mut seen = ClassSet::EMPTY;
        for layer in 0..layers {
            for magnitude_rank in 0..chunks {
                let c = classify(&cfg, &ChunkTraits { phase, layer, layers, magnitude_rank, chunks });
                seen = ClassSet(seen.0 | (1 << c.get()));
            }
        }
        for c in lo..=hi {
            prop_assert!(seen.contains(Class::new(c).unwrap()), "class {} unused", c);
        }
    }

    /// `validate` accepts exactly the configs the ordering rules rely on, and
    /// names the first broken invariant.
    #[test]
    fn validate_matches_invariants(
        bands in (0u8..=9, 0u8..=9, 0u8..=9, 0u8..=9),
        ll in prop_oneof![Just(0u8), 0u8..=16],
        ml in prop_oneof![Just(0u8), 0u8..=16],
        drop in any::<u8>(),
    ) {
        let cfg = ClassifierConfig {
            scatter_band: (bands.0, bands.1),
            gather_band: (bands.2, bands.3),
            layer_levels: ll,
            magnitude_levels: ml,
            droppable: ClassSet(drop),
        };
        let (slo, shi, glo, ghi) = bands;
        let expected = if !(slo <= shi && shi < glo && glo <= ghi && ghi <= 6) {
            Err(ClassifierError::BadBands)
        } else if ll == 0 || ml == 0 {
            Err(ClassifierError::ZeroLevels)
        } else if drop & 0x80 != 0 {
            Err(ClassifierError::DroppableControl)
        } else {
            Ok(())
        };
        prop_assert_eq!(cfg.validate(), expected);
    }

    /// Every generated valid config passes `validate` (the generator is honest).
    #[test]
    fn generated_configs_validate(cfg in valid_config()) {
        prop_assert_eq!(cfg.validate(), Ok(()));
    }

    /// `classify` is a pure function of its inputs.
    #[test]
    fn classify_is_pure(cfg in valid_config(), t in any_traits()) {
        let (cfg2, t2) = (cfg, t);
        prop_assert_eq!(classify(&cfg, &t), classify(&cfg2, &t2));
    }
}

// ---------------------------------------------------------------------------
// magnitude_ranks

/// Reference norm, as documented: sum of squares in `f64`, element order; NaN → +∞.
fn ref_norm(chunk: &[f32]) -> f64 {
    let s: f64 = chunk.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    if s.is_nan() { f64::INFINITY } else { s }
}

/// Check `ranks` against the documented definition for `data` cut into `ce`-sized chunks.
fn check_ranks(data: &[f32], ce: usize, ranks: &[u32]) -> Result<(), TestCaseError> {
    let ce = ce.max(1);
    let norms: Vec<f64> = data.chunks(ce).map(ref_norm).collect();
    prop_assert_eq!(ranks.len(), data.len().div_ceil(ce));
    // A permutation of 0..n.
    let mut seen = vec![false; ranks.len()];
    for &r in ranks {
        prop_assert!((r as usize) < ranks.len(), "rank {} out of range", r);
        prop_assert!(!seen[r as usize], "rank {} repeated", r);
        seen[r as usize] = true;
    }
    // Decreasing norm, ties by index.
    for i in 0..ranks.len() {
        for j in i + 1..ranks.len() {
            let i_first = norms[i] >= norms[j];
            prop_assert_eq!(
                ranks[i] < ranks[j],
                i_first,
                "chunks {} (norm² {}) and {} (norm² {}) ranked {} and {}",
                i,
                norms[i],
                j,
                norms[j],
                ranks[i],
                ranks[j]
            );
        }
    }
    Ok(())
}

/// Any `f32` bit pattern: NaNs, infinities, subnormals, huge and tiny values.
fn any_f32_bits() -> impl Strategy<Value = f32> {
    prop_oneof![
        any::<u32>().prop_map(f32::from_bits),
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(f32::NEG_INFINITY),
        Just(0.0f32),
        Just(-0.0f32),
        -4.0f32..4.0,
    ]
}

/// A finite value from a wide dynamic range (1e-30 .. 1e30, both signs).
fn wide_finite_f32() -> impl Strategy<Value = f32> {
    (-30i32..=30, 1.0f32..10.0, any::<bool>())
        .prop_map(|(e, m, neg)| (if neg { -m } else { m }) * 10f32.powi(e))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Permutation, decreasing norm with ties by index, partial last chunk, any
    /// bit patterns (NaN/inf), any chunk size including 0 (treated as 1).
    #[test]
    fn ranks_permutation_ordered(
        data in prop::collection::vec(any_f32_bits(), 0..120),
        ce in 0usize..=20,
    ) {
        let ranks = magnitude_ranks(&data, ce);
        check_ranks(&data, ce, &ranks)?;
    }

    /// Finite gradients over a wide dynamic range are ranked by their true norm,
    /// even where a square or a sum would overflow `f32`.
    #[test]
    fn ranks_follow_true_norm_for_finite_data(
        data in prop::collection::vec(wide_finite_f32(), 1..80),
        ce in 1usize..=8,
    ) {
        let ranks = magnitude_ranks(&data, ce);
        check_ranks(&data, ce, &ranks)?;
        // Stronger than self-consistency: the largest |x| chunk (with single
        // elements, norm = |x|) must be first when chunks are single elements.
        if ce == 1 {
            let best = (0..data.len())
                .max_by(|&a, &b| data[a].abs().total_cmp(&data[b].abs()).then(b.cmp(&a)))
                .unwrap();
            prop_assert_eq!(ranks[best], 0);
        }
    }

    /// Identical chunks tie and are ordered by index; ranks are deterministic.
    #[test]
    fn ranks_ties_by_index(
        chunk in prop::collection::vec(any_f32_bits(), 1..6),
        copies in 1usize..20,
    ) {
        let data: Vec<f32> = chunk.iter().copied().cycle().take(chunk.len() * copies).collect();
        let ranks = magnitude_ranks(&data, chunk.len());
        prop_assert_eq!(ranks, (0..copies as u32).collect::<Vec<_>>());
    }
}

#[test]
fn ranks_empty_input() {
    assert!(magnitude_ranks(&[], 4).is_empty());
    assert!(magnitude_ranks(&[], 0).is_empty());
}

#[test]
fn ranks_partial_last_chunk() {
    // Chunks: [1,1,1] (norm² 3), [2,0,0] (4), [3] (9, partial).
    let d = [1.0, 1.0, 1.0, 2.0, 0.0, 0.0, 3.0];
    assert_eq!(magnitude_ranks(&d, 3), vec![2, 1, 0]);
}

#[test]
fn ranks_nan_counts_as_largest_and_f32_overflow_is_not_a_tie() {
    // 1e30² overflows f32; the true norms still order 1e30 above 1e20.
    assert_eq!(magnitude_ranks(&[1e20, 1e30], 1), vec![1, 0]);
    assert_eq!(magnitude_ranks(&[1.0, f32::NAN, f32::INFINITY], 1), vec![2, 0, 1]);
}
