//! The local reduce: the K trainers on this host each contribute their tensor
//! to an op, and the daemon sends one sum into the network allreduce.
//! [`LocalReducer`] collects an op's contributions until all K are in, checks
//! they agree ([`Shape`]: length and layer), and sums them in local-rank order,
//! so the bytes of the sum do not depend on the order the trainers submitted
//! in. Pure bookkeeping: no I/O, no shared memory; what identifies a
//! contribution's trainer is an opaque ticket `T` handed back when the op is
//! reduced or fails.

use std::collections::BTreeMap;
use std::time::Instant;

use dlcp_proto::endpoint::OpId;

/// What every contribution to one op must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    /// Elements.
    pub(super) len: u64,
    /// Layer of this tensor (front layer first).
    pub(super) layer: u32,
    /// Layers in the step.
    pub(super) layers: u32,
}

/// One trainer's contribution to an op.
#[derive(Debug)]
pub(super) struct Contribution<T> {
    /// The trainer's local rank (`0 .. K`): its place in the sum.
    pub(super) local_rank: u32,
    /// What it says the op is.
    pub(super) shape: Shape,
    /// Who contributed (handed back with the op).
    pub(super) ticket: T,
    /// The tensor (taken over: becomes the sum, or goes back to the pool).
    pub(super) data: Vec<f32>,
}

/// What [`LocalReducer::add`] did with a contribution.
#[derive(Debug)]
pub(super) enum Added<T> {
    /// Kept; the op waits for other local ranks.
    Waiting,
    /// All K are in: the op left the reducer with its sum.
    Reduced(Reduced<T>),
    /// Refused: its local rank already contributed (or is out of range).
    /// The op is unchanged; the ticket comes back, the data is dropped.
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

/// An op whose K contributions are all in.
#[derive(Debug)]
pub(super) struct Reduced<T> {
    /// The sum, added up in local-rank order.
    pub(super) sum: Vec<f32>,
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
    data: Vec<f32>,
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
    /// `now` if this is its first contribution). When it completes the op, the
    /// sum is rank 0's buffer with the others added in rank order, and their
    /// buffers go to `recycle`; with one local trainer its contribution *is*
    /// the sum (no copy).
    pub(super) fn add(
        &mut self,
        id: OpId,
        world: usize,
        c: Contribution<T>,
        now: Instant,
        recycle: &mut impl FnMut(Vec<f32>),
    ) -> Added<T> {
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
        op.parts[r] = Some(Part { shape: c.shape, ticket: c.ticket, data: c.data });
        if op.parts.iter().any(Option::is_none) {
            return Added::Waiting;
        }
        let Some(op) = self.ops.remove(&id) else { return Added::Waiting };
        let mut parts = op.parts.into_iter().flatten();
        let Some(first) = parts.next() else { return Added::Waiting };
        let (mut sum, mut tickets) = (first.data, vec![first.ticket]);
        for part in parts {
            for (s, x) in sum.iter_mut().zip(&part.data) {
                *s += *x;
            }
            recycle(part.data);
            tickets.push(part.ticket);
        }
        Added::Reduced(Reduced { sum, tickets, first_at: op.first_at })
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

impl<T> Collecting<T> {
    /// The contributors' tickets, in local-rank order.
    fn into_tickets(self) -> Vec<T> {
        self.parts.into_iter().flatten().map(|p| p.ticket).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Shape = Shape { len: 3, layer: 0, layers: 1 };
    const ID: OpId = OpId { seq: 1, tensor: 7 };

    fn part(rank: u32, data: &[f32]) -> Contribution<u32> {
        Contribution { local_rank: rank, shape: SHAPE, ticket: 100 + rank, data: data.to_vec() }
    }

    /// Adds `parts` in order to one op of `world`; the outcome of the last add,
    /// and the buffers recycled.
    fn run(world: usize, parts: Vec<Contribution<u32>>) -> (Vec<Added<u32>>, Vec<Vec<f32>>) {
        let mut red = LocalReducer::new();
        let mut pool = Vec::new();
        let t0 = Instant::now();
        let out = parts.into_iter().map(|c| red.add(ID, world, c, t0, &mut |b| pool.push(b))).collect();
        (out, pool)
    }

    fn reduced(a: &Added<u32>) -> &Reduced<u32> {
        match a {
            Added::Reduced(r) => r,
            other => panic!("not reduced: {other:?}"),
        }
    }

    #[test]
    fn the_sum_is_in_local_rank_order_whatever_the_arrival_order() {
        // Floating-point addition is not associative: 1e8 + 1 - 1e8 is 0 in
        // rank order (1e8 + 1 rounds to 1e8) but 1 in another.
        let data = [[1e8_f32, 1.0, 0.5], [1.0, 1e8, 0.25], [-1e8, -1e8, 0.125]];
        let in_rank_order = {
            let mut s = data[0];
            for d in &data[1..] {
                for (s, x) in s.iter_mut().zip(d) {
                    *s += *x;
                }
            }
            s
        };
        assert_eq!(in_rank_order, [0.0, 0.0, 0.875]);
        for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0], [2, 0, 1]] {
            let (out, pool) = run(3, order.iter().map(|&r| part(r as u32, &data[r])).collect());
            assert!(matches!(out[0], Added::Waiting) && matches!(out[1], Added::Waiting), "{order:?}");
            let r = reduced(&out[2]);
            assert_eq!(r.sum, in_rank_order, "arrival order {order:?}");
            assert_eq!(r.tickets, [100, 101, 102], "tickets in local-rank order");
            assert_eq!(pool.len(), 2, "the two buffers not used for the sum are recycled");
        }
    }

    #[test]
    fn one_trainer_is_its_own_sum_and_two_wait_for_each_other() {
        let mut red = LocalReducer::new();
        let c = part(0, &[1.0, 2.0, 3.0]);
        let ptr = c.data.as_ptr();
        let t0 = Instant::now();
        let out = red.add(ID, 1, c, t0, &mut |_| panic!("nothing to recycle"));
        let r = reduced(&out);
        assert_eq!(r.sum.as_ptr(), ptr, "no copy");
        assert_eq!((r.tickets.as_slice(), r.first_at), ([100].as_slice(), t0));
        assert_eq!(red.len(), 0, "the op left the reducer");

        let (out, pool) = run(2, vec![part(1, &[1.0, 1.0, 1.0]), part(0, &[2.0, 2.0, 2.0])]);
        assert!(matches!(out[0], Added::Waiting));
        assert_eq!(reduced(&out[1]).sum, [3.0; 3]);
        assert_eq!(pool, [vec![1.0; 3]]);
    }

    #[test]
    fn a_second_contribution_of_a_rank_is_a_duplicate_and_the_op_carries_on() {
        let (out, _) =
            run(2, vec![part(0, &[1.0; 3]), part(0, &[5.0; 3]), part(2, &[5.0; 3]), part(1, &[2.0; 3])]);
        assert!(matches!(out[0], Added::Waiting));
        assert!(matches!(out[1], Added::Duplicate(100)), "{:?}", out[1]);
        assert!(matches!(out[2], Added::Duplicate(102)), "rank out of range: {:?}", out[2]);
        let r = reduced(&out[3]);
        assert_eq!(r.sum, [3.0; 3], "the duplicates were not added");
        assert_eq!(r.tickets, [100, 101]);
    }

    #[test]
    fn disagreeing_contributions_drop_the_op_and_return_every_ticket() {
        for other in [Shape { len: 4, ..SHAPE }, Shape { layer: 1, ..SHAPE }, Shape { layers: 2, ..SHAPE }] {
            let mut red = LocalReducer::new();
            let t0 = Instant::now();
            assert!(matches!(red.add(ID, 3, part(2, &[1.0; 3]), t0, &mut drop), Added::Waiting));
            assert!(matches!(red.add(ID, 3, part(0, &[1.0; 3]), t0, &mut drop), Added::Waiting));
            let c = Contribution { local_rank: 1, shape: other, ticket: 101, data: vec![1.0; 4] };
            match red.add(ID, 3, c, t0, &mut drop) {
                Added::Mismatch { first, ticket, others } => {
                    assert_eq!(first, SHAPE, "compared with the lowest local rank's");
                    assert_eq!(ticket, 101);
                    assert_eq!(others, [100, 102]);
                }
                x => panic!("{other:?}: {x:?}"),
            }
            assert_eq!(red.len(), 0, "the op is gone");
            // The op id can start again.
            assert!(matches!(red.add(ID, 3, part(0, &[1.0; 3]), t0, &mut drop), Added::Waiting));
        }
    }

    #[test]
    fn a_gone_trainer_fails_the_ops_that_wait_for_it_or_hold_its_contribution() {
        let mut red = LocalReducer::new();
        let t0 = Instant::now();
        let op = |seq| OpId { seq, tensor: 0 };
        // Op 1 holds the gone trainer's contribution (ticket 101, rank 1); op 2
        // waits for rank 1; op 3 holds a contribution of an earlier trainer of
        // rank 1 (ticket 7); op 4 (of 3 trainers) holds ranks 0 and 2 and waits
        // for rank 1.
        red.add(op(1), 2, part(1, &[1.0; 3]), t0, &mut drop);
        red.add(op(2), 2, part(0, &[1.0; 3]), t0, &mut drop);
        red.add(op(3), 2, Contribution { ticket: 7, ..part(1, &[1.0; 3]) }, t0, &mut drop);
        red.add(op(4), 3, part(2, &[1.0; 3]), t0, &mut drop);
        red.add(op(4), 3, part(0, &[1.0; 3]), t0, &mut drop);
        let gone = red.abandon_rank(1, |t| *t == 101);
        let got: Vec<(u64, Vec<u32>)> = gone.into_iter().map(|(id, tickets)| (id.seq, tickets)).collect();
        assert_eq!(got, [(1, vec![101]), (2, vec![100]), (4, vec![100, 102])]);
        assert_eq!(red.len(), 1, "op 3 keeps its contribution");
        // The surviving op completes when its other rank comes.
        let out = red.add(op(3), 2, part(0, &[2.0; 3]), t0, &mut drop);
        assert_eq!(reduced(&out).tickets, [100, 7]);
        // A rank no op has room for fails nothing.
        assert!(red.abandon_rank(5, |_| true).is_empty());
    }
}
