//! The reduction of this rank's shard, done while the contributions arrive.
//!
//! The contract ([`crate::oracle`]): the owner adds the contributions of a
//! chunk in rank order `0, 1, …, N−1` — rank 0's term a copy (or a fill),
//! each later one added with `+=`, a missing one filled per [`Fill`] — then
//! rescales and averages. Floating-point addition is not associative, so the
//! order is what makes every budget-0 result bit-exact and every replica
//! identical.
//!
//! An [`Accumulator`] keeps, per chunk, the rank whose term comes next. A
//! contribution that arrives when it is next is added straight from the
//! received datagram's payload (already authenticated, still in cache) into
//! the result, and so is every term behind it that is already here (this
//! rank's own, or one staged earlier). One that arrives early is copied once
//! into its sender's staging buffer and added when its turn comes. When the
//! reduce-scatter transfers have closed, [`Accumulator::finish`] adds what is
//! still pending in order (fills for the chunks that never came) and applies
//! the rescale and the average, then rounds the shard once to the op's
//! element type ([`crate::elem`]: f16 and bf16 contributions are widened to
//! `f32` as they are read, and everything before the rounding is `f32`). So
//! the shard is read and written while the chunks come in, not in one pass
//! over it at the end.

use crate::bitmap::Bitmap;
use crate::elem;
use crate::endpoint::allreduce::shard::Layout;
use crate::endpoint::api::{DType, Fill, OpOptions, ReduceOp};
use crate::transfer::Receiver;

/// What the accumulator reads of the other ranks' contributions to this
/// rank's shard: which chunks arrived, and the staging buffer (the whole
/// shard; only chunks that arrived out of turn are in it).
pub(crate) trait Contributions {
    /// Whether rank `j`'s contribution to chunk `c` arrived.
    fn got(&self, j: u32, c: u32) -> bool;
    /// Rank `j`'s staging buffer.
    fn staged(&self, j: u32) -> &[f32];
}

impl Contributions for [Option<Receiver>] {
    fn got(&self, j: u32, c: u32) -> bool {
        self.get(j as usize).and_then(Option::as_ref).is_some_and(|r| r.got().get(c))
    }

    fn staged(&self, j: u32) -> &[f32] {
        self.get(j as usize).and_then(Option::as_ref).map_or(&[], Receiver::buf)
    }
}

/// Staging buffers and arrival bitmaps by rank (for tests).
impl Contributions for [(Bitmap, Vec<f32>)] {
    fn got(&self, j: u32, c: u32) -> bool {
        self[j as usize].0.get(c)
    }

    fn staged(&self, j: u32) -> &[f32] {
        &self[j as usize].1
    }
}

/// Where one shard's reduction reads from: the layout, this rank and its own
/// contribution to its shard.
#[derive(Clone, Copy)]
pub(crate) struct Shard<'a> {
    /// The tensor's layout.
    pub layout: &'a Layout,
    /// This rank (the shard's owner).
    pub me: u32,
    /// This rank's contribution to its shard (shard-relative), already
    /// rounded to the op's element type.
    pub own: &'a [f32],
    /// The op's element type: of the DATA payloads read.
    pub dtype: DType,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Accumulator {
    /// Per chunk of the shard: the rank whose term is added next (`world`:
    /// every term is in).
    next: Vec<u32>,
    world: u32,
}

impl Accumulator {
    /// A shard of `chunks` chunks over `world` ranks, nothing added yet.
    pub(crate) fn new(chunks: u32, world: u32) -> Accumulator {
        Accumulator { next: vec![0; chunks as usize], world }
    }

    /// Add every term that is here already (this rank's own, if it comes
    /// first) to `out`, the shard of the result.
    pub(crate) fn start(&mut self, s: Shard<'_>, theirs: &(impl Contributions + ?Sized), out: &mut [f32]) {
        for c in 0..self.next.len() as u32 {
            self.advance(c, s, theirs, out);
        }
    }

    /// Heap bytes (for the endpoint's footprint).
    pub(crate) fn bytes(&self) -> usize {
        self.next.capacity() * size_of::<u32>()
    }

    /// Whether rank `j`'s contribution to chunk `c` is the next term: then
    /// it is added from where it lies ([`Accumulator::add_now`]); otherwise
    /// it waits in `j`'s staging buffer.
    pub(crate) fn is_next(&self, c: u32, j: u32) -> bool {
        self.next.get(c as usize) == Some(&j)
    }

    /// Add rank `j`'s contribution to chunk `c` (little-endian elements of
    /// the op's type, authenticated; [`Accumulator::is_next`] said it is the next term),
    /// then every term behind it that is here already.
    pub(crate) fn add_now(
        &mut self,
        c: u32,
        payload: &[u8],
        s: Shard<'_>,
        theirs: &(impl Contributions + ?Sized),
        out: &mut [f32],
    ) {
        let j = self.next[c as usize];
        let dst = &mut out[s.layout.chunk(s.me, c)];
        if j == 0 {
            elem::decode(s.dtype, payload, dst);
        } else {
            elem::decode_add(s.dtype, payload, dst);
        }
        self.next[c as usize] = j + 1;
        self.advance(c, s, theirs, out);
    }

    /// Add the terms of chunk `c` that are here, in order, until one is not.
    fn advance(&mut self, c: u32, s: Shard<'_>, theirs: &(impl Contributions + ?Sized), out: &mut [f32]) {
        let cr = s.layout.chunk(s.me, c);
        let mut j = self.next[c as usize];
        while j < self.world {
            let src = if j == s.me {
                &s.own[cr.clone()]
            } else if theirs.got(j, c) {
                &theirs.staged(j)[cr.clone()]
            } else {
                break;
            };
            term(j, Some(src), &mut out[cr.clone()]);
            j += 1;
        }
        self.next[c as usize] = j;
    }

    /// Every transfer into the shard has closed: add the terms still
    /// pending, in order (a contribution that never came filled per
    /// `opts.fill`), then rescale by `N / delivered` and average as `opts`
    /// say, and round once to `opts.dtype`. Every chunk of `out` is then
    /// written.
    pub(crate) fn finish(
        &mut self,
        s: Shard<'_>,
        theirs: &(impl Contributions + ?Sized),
        opts: &OpOptions,
        out: &mut [f32],
    ) {
        let world = self.world;
        for c in 0..self.next.len() as u32 {
            let cr = s.layout.chunk(s.me, c);
            for j in self.next[c as usize]..world {
                let src = if j == s.me {
                    Some(&s.own[cr.clone()])
                } else if theirs.got(j, c) {
                    Some(&theirs.staged(j)[cr.clone()])
                } else {
                    match opts.fill {
                        Fill::Local => Some(&s.own[cr.clone()]),
                        Fill::Zero => None,
                    }
                };
                term(j, src, &mut out[cr.clone()]);
            }
            self.next[c as usize] = world;
            let delivered = 1 + (0..world).filter(|&j| j != s.me && theirs.got(j, c)).count() as u32;
            let dst = &mut out[cr];
            if opts.rescale && delivered < world {
                let f = world as f32 / delivered as f32;
                dst.iter_mut().for_each(|d| *d *= f);
            }
            if opts.reduce == ReduceOp::Average {
                let w = opts.divisor(world);
                dst.iter_mut().for_each(|d| *d /= w);
            }
            elem::round_all(opts.dtype, dst);
        }
    }
}

/// Term `j` of a chunk's sum into `dst`: rank 0's is a copy (or zeros),
/// every later one is added (a missing one adds `0.0`, which turns a `-0.0`
/// into `0.0` exactly as the reference does).
fn term(j: u32, src: Option<&[f32]>, dst: &mut [f32]) {
    match (j, src) {
        (0, Some(s)) => dst.copy_from_slice(s),
        (0, None) => dst.fill(0.0),
        (_, Some(s)) => dst.iter_mut().zip(s).for_each(|(d, x)| *d += *x),
        (_, None) => dst.iter_mut().for_each(|d| *d += 0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// The reference, element by element as [`crate::oracle`] states it.
    fn reference(
        layout: &Layout,
        me: u32,
        inputs: &[Vec<f32>],
        got: &[Bitmap],
        opts: &OpOptions,
    ) -> Vec<f32> {
        let shard = layout.shard(me);
        let world = inputs.len() as u32;
        let mut out = Vec::new();
        for c in 0..layout.chunks(me) {
            let present = |j: u32| j == me || got[j as usize].get(c);
            let delivered = (0..world).filter(|&j| present(j)).count() as u32;
            for e in layout.chunk_in_tensor(me, c) {
                let v = |j: u32| match (present(j), opts.fill) {
                    (true, _) => inputs[j as usize][e],
                    (false, Fill::Zero) => 0.0,
                    (false, Fill::Local) => inputs[me as usize][e],
                };
                let mut acc = v(0);
                for j in 1..world {
                    acc += v(j);
                }
                if opts.rescale && delivered < world {
                    acc *= world as f32 / delivered as f32;
                }
                if opts.reduce == ReduceOp::Average {
                    acc /= opts.divisor(world);
                }
                out.push(elem::round(opts.dtype, acc));
            }
        }
        assert_eq!(out.len(), shard.len());
        out
    }

    /// Contributions arriving in a random order, some never, added as they
    /// come: bit-identical to the reduction in rank order at the end, for
    /// every rank as owner, both fills, rescale and average, every element
    /// type (contributions of that type, one rounding at the end), with
    /// values whose sum depends on the order (large and small, and signed
    /// zeros).
    #[test]
    fn adding_as_they_arrive_is_bit_identical_to_rank_order() {
        let mut rng = Rng::stream(7, 1, 1);
        for case in 0..200u32 {
            let world = 1 + rng.below(5) as u32;
            let len = 1 + rng.below(300) as usize;
            let layout = Layout::new(len, world, 1 + rng.below(9) as usize);
            let value = |rng: &mut Rng| match rng.below(6) {
                0 => 1e8,
                1 => -1e8,
                2 => -0.0,
                3 => 0.0,
                _ => (rng.below(2000) as f32 - 1000.0) / 7.0,
            };
            let dtype = DType::ALL[case as usize % 3];
            let inputs: Vec<Vec<f32>> =
                (0..world).map(|_| (0..len).map(|_| elem::round(dtype, value(&mut rng))).collect()).collect();
            let fill = if case % 2 == 0 { Fill::Zero } else { Fill::Local };
            let reduce = if case % 4 == 0 { ReduceOp::Average } else { ReduceOp::Sum };
            let contributors = if case % 8 == 4 { 3 * world } else { 0 };
            let opts = OpOptions {
                fill,
                rescale: case % 5 == 0,
                reduce,
                dtype,
                contributors,
                ..OpOptions::default()
            };
            for me in 0..world {
                let (shard, n) = (layout.shard(me), layout.chunks(me));
                let own = &inputs[me as usize][shard.clone()];
                let s = Shard { layout: &layout, me, own, dtype };
                // Arrivals: every (rank, chunk) but a few lost, shuffled.
                let mut arrivals: Vec<(u32, u32)> = (0..world)
                    .filter(|&j| j != me)
                    .flat_map(|j| (0..n).map(move |c| (j, c)))
                    .filter(|_| rng.below(10) != 0)
                    .collect();
                for i in (1..arrivals.len()).rev() {
                    arrivals.swap(i, rng.below(i as u64 + 1) as usize);
                }
                let mut theirs: Vec<(Bitmap, Vec<f32>)> =
                    (0..world).map(|_| (Bitmap::new(n), vec![f32::NAN; shard.len()])).collect();
                let mut out = vec![f32::NAN; shard.len()];
                let mut acc = Accumulator::new(n, world);
                acc.start(s, theirs.as_slice(), &mut out);
                for &(j, c) in &arrivals {
                    let cr = layout.chunk(me, c);
                    let values = &inputs[j as usize][shard.start + cr.start..shard.start + cr.end];
                    let mut bytes = vec![0u8; values.len() * dtype.size()];
                    elem::encode(dtype, values, &mut bytes);
                    theirs[j as usize].0.set(c);
                    if acc.is_next(c, j) {
                        acc.add_now(c, &bytes, s, theirs.as_slice(), &mut out);
                    } else {
                        elem::decode(dtype, &bytes, &mut theirs[j as usize].1[cr]);
                    }
                }
                acc.finish(s, theirs.as_slice(), &opts, &mut out);
                let got: Vec<Bitmap> = theirs.iter().map(|t| t.0.clone()).collect();
                let want = reference(&layout, me, &inputs, &got, &opts);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out), bits(&want), "case {case}, rank {me} of {world}");
            }
        }
    }
}
