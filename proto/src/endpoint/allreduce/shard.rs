//! Where a tensor's shards and chunks lie ([`Layout`]), and the arithmetic
//! on them: ranking chunks by magnitude, and the reduction of a shard.

use std::ops::Range;

use crate::endpoint::api::{Fill, OpOptions, ReduceOp};
use crate::priority::rank_order;
use crate::transfer::Receiver;

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

/// Little-endian `f32`s of a DATA payload into `dst`.
pub(crate) fn read_f32s(src: &[u8], dst: &mut [f32]) {
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// `src` as little-endian bytes into a DATA payload.
pub(crate) fn write_f32s(src: &[f32], dst: &mut [u8]) {
    for (s, b) in src.iter().zip(dst.chunks_exact_mut(4)) {
        b.copy_from_slice(&s.to_le_bytes());
    }
}

/// Reduce shard `me` into `out`: the contributions summed in rank order
/// `0, 1, …, N−1` (`own` for this rank, what `recvs` holds for the others,
/// a missing chunk filled per [`Fill`]; every chunk is written: rank 0's term
/// is a copy or a fill), then rescaled and averaged as `opts` says.
pub(crate) fn reduce_shard(
    layout: &Layout,
    me: u32,
    opts: &OpOptions,
    own: &[f32],
    recvs: &[Option<Receiver>],
    out: &mut [f32],
) {
    let world = layout.world;
    for c in 0..layout.chunks(me) {
        let cr = layout.chunk(me, c);
        let mut delivered = 0u32;
        for j in 0..world {
            let theirs = recvs[j as usize].as_ref().filter(|r| r.got().get(c));
            let src: Option<&[f32]> = if j == me {
                Some(&own[cr.clone()])
            } else if let Some(r) = theirs {
                Some(&r.buf()[cr.clone()])
            } else {
                match opts.fill {
                    Fill::Local => Some(&own[cr.clone()]),
                    Fill::Zero => None,
                }
            };
            if j == me || theirs.is_some() {
                delivered += 1;
            }
            let dst = &mut out[cr.clone()];
            match (j, src) {
                (0, Some(s)) => dst.copy_from_slice(s),
                (0, None) => dst.fill(0.0),
                (_, Some(s)) => dst.iter_mut().zip(s).for_each(|(d, x)| *d += *x),
                (_, None) => dst.iter_mut().for_each(|d| *d += 0.0),
            }
        }
        let dst = &mut out[cr];
        if opts.rescale && delivered < world {
            let f = world as f32 / delivered as f32;
            dst.iter_mut().for_each(|d| *d *= f);
        }
        if opts.reduce == ReduceOp::Average {
            let w = world as f32;
            dst.iter_mut().for_each(|d| *d /= w);
        }
    }
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
