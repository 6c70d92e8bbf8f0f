//! Where a tensor's shards and chunks lie ([`Layout`]), and the arithmetic
//! on them: ranking chunks by magnitude.

use std::ops::Range;

use crate::priority::rank_order;

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
        let (l, w) = (len as u128, u128::from(world));
        let starts = (0..=world).map(|s| (u128::from(s) * l / w) as usize).collect();
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

    /// The position of every chunk of shard `s` of `data` (the whole tensor)
    /// by decreasing L2 norm, for the shards in `shards`, in order: the
    /// magnitude ranks of those chunks among all of them, and their count.
    pub(crate) fn magnitude_ranks(
        &self,
        data: &[f32],
        shards: impl Iterator<Item = u32>,
    ) -> Vec<(u32, u32, u32)> {
        let mut norms = Vec::new();
        for s in shards {
            let shard = &data[self.shard(s)];
            for c in 0..self.chunks(s) {
                norms.push((s, c, sq_norm(&shard[self.chunk(s, c)])));
            }
        }
        let ranks = rank_order(norms.len(), |a, b| norms[b].2.total_cmp(&norms[a].2));
        norms.iter().zip(ranks).map(|(&(s, c, _), rank)| (s, c, rank)).collect()
    }
}

/// Squared L2 norm, summed in `f32` (NaN counts as infinite).
fn sq_norm(x: &[f32]) -> f32 {
    let s: f32 = x.iter().map(|v| v * v).sum();
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
        assert_eq!(l.magnitude_ranks(&data, [1].into_iter()), [(1, 0, 1), (1, 1, 0)]);
        assert_eq!(l.magnitude_ranks(&data, 0..2), [(0, 0, 1), (0, 1, 3), (1, 0, 2), (1, 1, 0)]);
    }
}
