//! The local reduce: the K trainers on this host each contribute their tensor
//! to an op, and the daemon sends one sum into the network allreduce.
//! [`LocalReducer`] collects an op's contributions until all K are in and
//! checks they agree ([`Shape`]: length, layer, type, reduction, collective
//! and root); [`sum_in_rank_order`] then
//! adds them up in local-rank order, so the bytes of the sum do not depend on
//! the order the trainers submitted in. The tensors are read where they lie
//! (the trainers' arenas) only then, in one pass: block by block, the first
//! copied and the others added into the same block of the sum, so each arena
//! is read once and the sum written once, for one trainer or several. Pure:
//! no I/O, no shared memory (a [`Source`] reads a contribution); what
//! identifies a contribution's trainer is an opaque ticket `T` handed back
//! when the op is reduced or fails.

use std::collections::BTreeMap;
use std::time::Instant;

use dlcp_proto::endpoint::OpId;

use crate::shm::{ElemType, Opcode, Reduce};

/// What every contribution to one op must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    /// Elements.
    pub(super) len: u64,
    /// Layer of this tensor (front layer first).
    pub(super) layer: u32,
    /// Layers in the step.
    pub(super) layers: u32,
    /// Element type.
    pub(super) dtype: ElemType,
    /// The reduction.
    pub(super) reduce: Reduce,
    /// The collective.
    pub(super) opcode: Opcode,
    /// A broadcast's root (0 for the others).
    pub(super) root: u32,
}

/// One trainer's contribution to an op (its tensor stays where it is until
/// the op is reduced).
#[derive(Debug)]
pub(super) struct Contribution<T> {
    /// The trainer's local rank (`0 .. K`): its place in the sum.
    pub(super) local_rank: u32,
    /// What it says the op is.
    pub(super) shape: Shape,
    /// Who contributed (handed back with the op).
    pub(super) ticket: T,
}

/// What [`LocalReducer::add`] did with a contribution.
#[derive(Debug)]
pub(super) enum Added<T> {
    /// Kept; the op waits for other local ranks.
    Waiting,
    /// All K are in: the op left the reducer with its sum.
    Reduced(Reduced<T>),
    /// Refused: its local rank already contributed (or is out of range).
    /// The op is unchanged; the ticket comes back.
    Duplicate(T),
    /// Refused: it disagrees with the op's first contribution (`first`). The
    /// op is dropped: the new ticket and the others' come back to fail.
    Mismatch {
        /// The shape of the op's first contribution (lowest local rank).
        first: Shape,
        /// The refused contribution's ticket.
        ticket: T,
        /// The other contributors' tickets, in local-rank order.
        others: Vec<T>,
    },
}

/// An op whose K contributions are all in: sum them with
/// [`sum_in_rank_order`], in the order of `tickets`.
#[derive(Debug)]
pub(super) struct Reduced<T> {
    /// The contributors' tickets, in local-rank order.
    pub(super) tickets: Vec<T>,
    /// When the first contribution arrived.
    pub(super) first_at: Instant,
}

/// A contribution kept until its op is complete.
#[derive(Debug)]
struct Part<T> {
    shape: Shape,
    ticket: T,
}

/// An op collecting contributions, by local rank.
#[derive(Debug)]
struct Collecting<T> {
    parts: Vec<Option<Part<T>>>,
    first_at: Instant,
}

/// The ops collecting local contributions: see the [module documentation](self).
#[derive(Debug)]
pub(super) struct LocalReducer<T> {
    ops: BTreeMap<OpId, Collecting<T>>,
}

impl<T> LocalReducer<T> {
    /// No ops yet.
    pub(super) fn new() -> LocalReducer<T> {
        LocalReducer { ops: BTreeMap::new() }
    }

    /// Ops collecting contributions.
    pub(super) fn len(&self) -> usize {
        self.ops.len()
    }

    /// Add `c` to op `id` of `world` local trainers (the op starts waiting at
    /// `now` if this is its first contribution). When it completes the op,
    /// the op leaves with its tickets in local-rank order.
    pub(super) fn add(&mut self, id: OpId, world: usize, c: Contribution<T>, now: Instant) -> Added<T> {
        let op = self
            .ops
            .entry(id)
            .or_insert_with(|| Collecting { parts: (0..world).map(|_| None).collect(), first_at: now });
        let r = c.local_rank as usize;
        if op.parts.get(r).is_none_or(Option::is_some) {
            return Added::Duplicate(c.ticket);
        }
        if let Some(first) = op.parts.iter().flatten().next().map(|p| p.shape)
            && first != c.shape
        {
            let others = self.ops.remove(&id).map(Collecting::into_tickets).unwrap_or_default();
            return Added::Mismatch { first, ticket: c.ticket, others };
        }
        op.parts[r] = Some(Part { shape: c.shape, ticket: c.ticket });
        if op.parts.iter().any(Option::is_none) {
            return Added::Waiting;
        }
        let Some(op) = self.ops.remove(&id) else { return Added::Waiting };
        let first_at = op.first_at;
        Added::Reduced(Reduced { tickets: op.into_tickets(), first_at })
    }

    /// The trainer of local rank `rank` is gone: drop every op that waits for
    /// that rank, or holds a contribution of it for which `is_gone` says it was
    /// the gone trainer's (a contribution of an earlier trainer of that rank
    /// keeps its op). They can never complete: each comes back with the
    /// tickets of the contributions it had (in local-rank order) to fail, in
    /// op order.
    pub(super) fn abandon_rank(&mut self, rank: usize, is_gone: impl Fn(&T) -> bool) -> Vec<(OpId, Vec<T>)> {
        let doomed: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, op)| {
                op.parts.get(rank).is_some_and(|p| p.as_ref().is_none_or(|p| is_gone(&p.ticket)))
            })
            .map(|(id, _)| *id)
            .collect();
        doomed.into_iter().filter_map(|id| self.ops.remove(&id).map(|op| (id, op.into_tickets()))).collect()
    }
}

/// Where a contribution's elements are read from (in the daemon, a trainer's
/// arena; in the tests, a slice).
pub(super) trait Source {
    /// Why a read failed.
    type Error;
    /// Copy elements `at .. at + out.len()` into `out`.
    fn copy_into(&self, at: usize, out: &mut [f32]) -> Result<(), Self::Error>;
    /// Add elements `at .. at + out.len()` to `out`, in order.
    fn add_into(&self, at: usize, out: &mut [f32]) -> Result<(), Self::Error>;
}

impl Source for &[f32] {
    type Error = std::convert::Infallible;

    fn copy_into(&self, at: usize, out: &mut [f32]) -> Result<(), Self::Error> {
        out.copy_from_slice(&self[at..at + out.len()]);
        Ok(())
    }

    fn add_into(&self, at: usize, out: &mut [f32]) -> Result<(), Self::Error> {
        let n = out.len();
        out.iter_mut().zip(&self[at..at + n]).for_each(|(o, x)| *o += *x);
        Ok(())
    }
}

/// Elements per block of [`sum_in_rank_order`] (16 KiB: a block of the sum
/// stays in the L1 cache while every contribution is added into it).
const BLOCK: usize = 4096;

/// The local sum into `out`: `sources[0]` copied, then each later one added,
/// in order (local-rank order), so the bytes do not depend on who submitted
/// first. Block by block: each source is read once and `out` written once.
pub(super) fn sum_in_rank_order<S: Source>(sources: &[S], out: &mut [f32]) -> Result<(), S::Error> {
    for (b, block) in out.chunks_mut(BLOCK).enumerate() {
        let at = b * BLOCK;
        for (k, s) in sources.iter().enumerate() {
            if k == 0 {
                s.copy_into(at, block)?;
            } else {
                s.add_into(at, block)?;
            }
        }
    }
    Ok(())
}

impl<T> Collecting<T> {
    /// The contributors' tickets, in local-rank order.
    fn into_tickets(self) -> Vec<T> {
        self.parts.into_iter().flatten().map(|p| p.ticket).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Shape = Shape {
        len: 3,
        layer: 0,
        layers: 1,
        dtype: ElemType::F32,
        reduce: Reduce::Sum,
        opcode: Opcode::Broadcast,
        root: 0,
    };
    const ID: OpId = OpId { run: 1, seq: 1, tensor: 7 };

    fn part(rank: u32) -> Contribution<u32> {
        Contribution { local_rank: rank, shape: SHAPE, ticket: 100 + rank }
    }

    /// Adds the contributions of `ranks`, in order, to one op of `world`; the
    /// outcome of each add.
    fn run(world: usize, ranks: &[u32]) -> Vec<Added<u32>> {
        let mut red = LocalReducer::new();
        let t0 = Instant::now();
        ranks.iter().map(|&r| red.add(ID, world, part(r), t0)).collect()
    }

    fn reduced(a: &Added<u32>) -> &Reduced<u32> {
        match a {
            Added::Reduced(r) => r,
            other => panic!("not reduced: {other:?}"),
        }
    }

    /// The sum of the tensors of `tickets` (ticket `100 + r`: `data[r]`), as
    /// the daemon computes it.
    fn sum(tickets: &[u32], data: &[Vec<f32>]) -> Vec<f32> {
        let sources: Vec<&[f32]> = tickets.iter().map(|&t| data[(t - 100) as usize].as_slice()).collect();
        let mut out = vec![f32::NAN; data[0].len()];
        let Ok(()) = sum_in_rank_order(&sources, &mut out);
        out
    }

    #[test]
    fn the_sum_is_in_local_rank_order_whatever_the_arrival_order() {
        // Floating-point addition is not associative: 1e8 + 1 - 1e8 is 0 in
        // rank order (1e8 + 1 rounds to 1e8) but 1 in another.
        let data = [[1e8_f32, 1.0, 0.5], [1.0, 1e8, 0.25], [-1e8, -1e8, 0.125]].map(|d| d.to_vec());
        let in_rank_order = {
            let mut s = data[0].clone();
            for d in &data[1..] {
                for (s, x) in s.iter_mut().zip(d) {
                    *s += *x;
                }
            }
            s
        };
        assert_eq!(in_rank_order, [0.0, 0.0, 0.875]);
        for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0], [2, 0, 1]] {
            let out = run(3, &order);
            assert!(matches!(out[0], Added::Waiting) && matches!(out[1], Added::Waiting), "{order:?}");
            let r = reduced(&out[2]);
            assert_eq!(r.tickets, [100, 101, 102], "tickets in local-rank order");
            assert_eq!(sum(&r.tickets, &data), in_rank_order, "arrival order {order:?}");
        }
    }

    /// Block by block, the fused sum is bit for bit the plain one in rank
    /// order, over several blocks and a short last one.
    #[test]
    fn the_fused_sum_is_the_plain_sum_in_rank_order() {
        let n = 3 * BLOCK + 17;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            [1e8, -1e8, -0.0, 0.25, (x % 1000) as f32 / 3.0][(x >> 40) as usize % 5]
        };
        let data: Vec<Vec<f32>> = (0..4).map(|_| (0..n).map(|_| next()).collect()).collect();
        let mut want = data[0].clone();
        for d in &data[1..] {
            want.iter_mut().zip(d).for_each(|(w, x)| *w += *x);
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&sum(&[100, 101, 102, 103], &data)), bits(&want));
    }

    #[test]
    fn one_trainer_is_its_own_sum_and_two_wait_for_each_other() {
        let mut red = LocalReducer::new();
        let t0 = Instant::now();
        let out = red.add(ID, 1, part(0), t0);
        let r = reduced(&out);
        assert_eq!((r.tickets.as_slice(), r.first_at), ([100].as_slice(), t0));
        assert_eq!(red.len(), 0, "the op left the reducer");
        let mine = vec![vec![1.0, -0.0, 3.0]];
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&sum(&r.tickets, &mine)), bits(&mine[0]), "a copy (-0.0 stays -0.0)");

        let out = run(2, &[1, 0]);
        assert!(matches!(out[0], Added::Waiting));
        let data = vec![vec![2.0; 3], vec![1.0; 3]];
        assert_eq!(sum(&reduced(&out[1]).tickets, &data), [3.0; 3]);
    }

    #[test]
    fn a_second_contribution_of_a_rank_is_a_duplicate_and_the_op_carries_on() {
        let out = run(2, &[0, 0, 2, 1]);
        assert!(matches!(out[0], Added::Waiting));
        assert!(matches!(out[1], Added::Duplicate(100)), "{:?}", out[1]);
        assert!(matches!(out[2], Added::Duplicate(102)), "rank out of range: {:?}", out[2]);
        let r = reduced(&out[3]);
        assert_eq!(r.tickets, [100, 101], "the duplicates are not contributors");
        assert_eq!(sum(&r.tickets, &[vec![1.0; 3], vec![2.0; 3]]), [3.0; 3]);
    }

    #[test]
    fn disagreeing_contributions_drop_the_op_and_return_every_ticket() {
        for other in [
            Shape { len: 4, ..SHAPE },
            Shape { layer: 1, ..SHAPE },
            Shape { layers: 2, ..SHAPE },
            Shape { dtype: ElemType::Bf16, ..SHAPE },
            Shape { reduce: Reduce::Average, ..SHAPE },
            Shape { opcode: Opcode::AllReduce, ..SHAPE },
            Shape { opcode: Opcode::Allgather, ..SHAPE },
            Shape { root: 1, ..SHAPE },
        ] {
            let mut red = LocalReducer::new();
            let t0 = Instant::now();
            assert!(matches!(red.add(ID, 3, part(2), t0), Added::Waiting));
            assert!(matches!(red.add(ID, 3, part(0), t0), Added::Waiting));
            let c = Contribution { local_rank: 1, shape: other, ticket: 101 };
            match red.add(ID, 3, c, t0) {
                Added::Mismatch { first, ticket, others } => {
                    assert_eq!(first, SHAPE, "compared with the lowest local rank's");
                    assert_eq!(ticket, 101);
                    assert_eq!(others, [100, 102]);
                }
                x => panic!("{other:?}: {x:?}"),
            }
            assert_eq!(red.len(), 0, "the op is gone");
            // The op id can start again.
            assert!(matches!(red.add(ID, 3, part(0), t0), Added::Waiting));
        }
    }

    #[test]
    fn a_gone_trainer_fails_the_ops_that_wait_for_it_or_hold_its_contribution() {
        let mut red = LocalReducer::new();
        let t0 = Instant::now();
        let op = |seq| OpId { run: 1, seq, tensor: 0 };
        // Op 1 holds the gone trainer's contribution (ticket 101, rank 1); op 2
        // waits for rank 1; op 3 holds a contribution of an earlier trainer of
        // rank 1 (ticket 7); op 4 (of 3 trainers) holds ranks 0 and 2 and waits
        // for rank 1.
        red.add(op(1), 2, part(1), t0);
        red.add(op(2), 2, part(0), t0);
        red.add(op(3), 2, Contribution { ticket: 7, ..part(1) }, t0);
        red.add(op(4), 3, part(2), t0);
        red.add(op(4), 3, part(0), t0);
        let gone = red.abandon_rank(1, |t| *t == 101);
        let got: Vec<(u64, Vec<u32>)> = gone.into_iter().map(|(id, tickets)| (id.seq, tickets)).collect();
        assert_eq!(got, [(1, vec![101]), (2, vec![100]), (4, vec![100, 102])]);
        assert_eq!(red.len(), 1, "op 3 keeps its contribution");
        // The surviving op completes when its other rank comes.
        let out = red.add(op(3), 2, part(0), t0);
        assert_eq!(reduced(&out).tickets, [100, 7]);
        // A rank no op has room for fails nothing.
        assert!(red.abandon_rank(5, |_| true).is_empty());
    }
}
