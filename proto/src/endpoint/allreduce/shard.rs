//! Where a tensor's shards and chunks lie ([`Layout`]), and the arithmetic
//! on them: ranking chunks by magnitude.

use std::ops::Range;

/// Where a tensor's shards and chunks lie. Every shard's first element is
/// computed once, when the op starts: a chunk's place is then one multiply
/// and one add (no wide division per datagram).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    len: usize,
    world: u32,
    chunk_elems: usize,
    /// First element of every shard, and `len` at the end (`world + 1` entries).
    starts: Box<[usize]>,
}

impl Layout {
    /// A tensor of `len` elements over `world` ranks, in chunks of `chunk_elems`.
    pub(crate) fn new(len: usize, world: u32, chunk_elems: usize) -> Layout {
        // Shard `world` starts at `len`: the end of the last one.
        let starts = (0..=world).map(|s| crate::endpoint::shard_range(len, world, s).start).collect();
        Layout { len, world, chunk_elems, starts }
    }

    /// Element range of shard `s`.
    pub(crate) fn shard(&self, s: u32) -> Range<usize> {
        self.starts[s as usize]..self.starts[s as usize + 1]
    }

    /// Chunks of shard `s`.
    pub(crate) fn chunks(&self, s: u32) -> u32 {
        self.shard(s).len().div_ceil(self.chunk_elems) as u32
    }

    /// Element range of chunk `c` of shard `s`, relative to the shard.
    pub(crate) fn chunk(&self, s: u32, c: u32) -> Range<usize> {
        let n = self.shard(s).len();
        let a = (c as usize * self.chunk_elems).min(n);
        a..(a + self.chunk_elems).min(n)
    }

    /// Element range of chunk `c` of shard `s` in the whole tensor.
    pub(crate) fn chunk_in_tensor(&self, s: u32, c: u32) -> Range<usize> {
        let base = self.starts[s as usize];
        let r = self.chunk(s, c);
        base + r.start..base + r.end
    }

    /// Whether some shard has more chunks than the wire can number.
    pub(crate) fn too_large(&self) -> bool {
        (0..self.world).any(|s| u64::from(self.chunks(s)) >= u64::from(u32::MAX))
    }

    /// The magnitude rank of every chunk of the shards in `shards` of `data`
    /// (the whole tensor) among all of them, by decreasing L2 norm (ties by
    /// position), as far as `levels` magnitude levels tell ranks apart: chunk
    /// ranks fall into `levels` blocks, `rank · levels / count` (what
    /// [`crate::priority::classify`] looks at), and each chunk gets the first
    /// rank of its block. So the class is what the exact rank gives, found by
    /// `levels − 1` linear-time selections instead of a sort (with `levels` at
    /// least the count, every block holds one chunk: the exact ranks).
    /// Returns `(shard, chunk, rank)` in order, and the count is its length.
    pub(crate) fn magnitude_ranks(
        &self,
        data: &[f32],
        shards: impl Iterator<Item = u32>,
        levels: u8,
    ) -> Vec<(u32, u32, u32)> {
        let mut chunks = Vec::new();
        let mut norms = Vec::new();
        for s in shards {
            let shard = &data[self.shard(s)];
            for c in 0..self.chunks(s) {
                chunks.push((s, c));
                norms.push(sq_norm(&shard[self.chunk(s, c)]));
            }
        }
        let n = norms.len();
        // Larger norm first, then lower position: the order of the ranks.
        let before = |a: &u32, b: &u32| norms[*b as usize].total_cmp(&norms[*a as usize]).then(a.cmp(b));
        let mut order: Vec<u32> = (0..n as u32).collect();
        let levels = usize::from(levels.max(1)).min(n.max(1));
        let starts: Vec<usize> = (0..=levels).map(|k| (k * n).div_ceil(levels)).collect();
        // Each block's first rank, by selection from the right end of the
        // previous one.
        for k in 1..levels {
            let (lo, at) = (starts[k - 1], starts[k]);
            if at > lo && at < n {
                order[lo..].select_nth_unstable_by(at - lo, before);
            }
        }
        let mut ranks = vec![0u32; n];
        for k in 0..levels {
            for &i in &order[starts[k]..starts[k + 1]] {
                ranks[i as usize] = starts[k] as u32;
            }
        }
        chunks.into_iter().zip(ranks).map(|((s, c), rank)| (s, c, rank)).collect()
    }
}

/// Squared L2 norm, summed in `f32` (NaN counts as infinite), in 16
/// independent lanes: a single running sum is one dependent add per element
/// (the compiler may not reorder float adds), which made this pass over the
/// whole tensor 4% of all CPU samples at MTU 9000; 16 lanes let it vectorise
/// and run at memory speed. Only the ranking of chunks reads it, so the lane
/// order's rounding is of no consequence.
fn sq_norm(x: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let blocks = x.chunks_exact(LANES);
    let tail = blocks.remainder();
    for b in blocks {
        for (a, v) in acc.iter_mut().zip(b) {
            *a += v * v;
        }
    }
    let s: f32 = acc.iter().sum::<f32>() + tail.iter().map(|v| v * v).sum::<f32>();
    if s.is_nan() { f32::INFINITY } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_covers_tensor() {
        for (len, world, ce) in [(10usize, 3u32, 2usize), (1, 4, 3), (1000, 7, 13), (5, 5, 1)] {
            let l = Layout::new(len, world, ce);
            let mut covered = 0;
            for s in 0..world {
                let sh = l.shard(s);
                assert_eq!(sh.start, covered);
                covered = sh.end;
                let total: usize = (0..l.chunks(s)).map(|c| l.chunk(s, c).len()).sum();
                assert_eq!(total, sh.len());
            }
            assert_eq!(covered, len);
        }
    }

    #[test]
    fn magnitude_ranks_order_chunks_across_shards_by_norm() {
        // 8 elements over 2 ranks in chunks of 2: shard 1 is chunks [4,5] [6,7].
        let l = Layout::new(8, 2, 2);
        let data = [9.0, 9.0, 0.0, 0.0, 1.0, 1.0, 3.0, f32::NAN];
        assert_eq!(l.magnitude_ranks(&data, [1].into_iter(), 255), [(1, 0, 1), (1, 1, 0)]);
        assert_eq!(l.magnitude_ranks(&data, 0..2, 255), [(0, 0, 1), (0, 1, 3), (1, 0, 2), (1, 1, 0)]);
        // Two levels: the larger half ranks 0, the smaller half 2.
        assert_eq!(l.magnitude_ranks(&data, 0..2, 2), [(0, 0, 0), (0, 1, 2), (1, 0, 2), (1, 1, 0)]);
    }

    /// The class a block's first rank gives is the class of the exact rank,
    /// for every level count, on norms with many ties.
    #[test]
    fn magnitude_blocks_classify_like_exact_ranks() {
        use crate::priority::{ChunkTraits, ClassifierConfig, classify};
        use crate::rng::Rng;
        use crate::wire::Phase;
        let mut rng = Rng::stream(3, 2, 1);
        for case in 0..300u32 {
            let ce = 1 + rng.below(4) as usize;
            let len = 1 + rng.below(400) as usize;
            let world = 1 + rng.below(4) as u32;
            let l = Layout::new(len, world, ce);
            let data: Vec<f32> = (0..len).map(|_| rng.below(5) as f32).collect();
            let exact = l.magnitude_ranks(&data, 0..world, 255);
            let n = exact.len() as u32;
            if n > 255 {
                continue;
            }
            for levels in 1..=9u8 {
                let cfg = ClassifierConfig { magnitude_levels: levels, ..ClassifierConfig::default() };
                let class = |rank| {
                    let t = ChunkTraits {
                        phase: Phase::Scatter,
                        layer: 0,
                        layers: 1,
                        magnitude_rank: rank,
                        chunks: n,
                    };
                    classify(&cfg, &t)
                };
                let blocks = l.magnitude_ranks(&data, 0..world, levels);
                for (e, b) in exact.iter().zip(&blocks) {
                    assert_eq!((e.0, e.1), (b.0, b.1));
                    assert_eq!(class(e.2), class(b.2), "case {case}, {levels} levels, chunk {e:?} vs {b:?}");
                }
            }
        }
    }
}
