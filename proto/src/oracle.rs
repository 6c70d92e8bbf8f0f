//! The reference for what a collective must produce.
//!
//! Given every rank's input, the reports of every shard owner (which say which
//! contributions arrived and which chunks were masked in the gather) and the op
//! options, [`recompute`] gives the bytes every rank must hold: contributions
//! summed in rank order `0, 1, …, N−1`, missing ones filled per [`Fill`], then
//! rescaled, averaged and masked. For an f16 or bf16 op ([`OpOptions::dtype`])
//! every input is first rounded to that type (a no-op for values of it), the
//! sum is accumulated in `f32`, and the result (divided, for an average) is
//! rounded once to the type ([`crate::elem`]). The daemon's tests and the demo use it to check
//! results end to end; the protocol simulations check it against an
//! independent implementation.
//!
//! The other collectives ([`OpOptions::collective`]): a reduce-scatter (and
//! a barrier) reduces exactly as an allreduce whose all-gather masked
//! nothing — rank `r` holds shard `r` of [`recompute`]'s tensor and zero
//! elsewhere; an allgather's shard `s` is rank `s`'s input and a broadcast's
//! the root's as owner `s` received it (zero where it did not), each rounded
//! to the type and zero where its owner's agreed mask
//! ([`OpReport::own_mask`]) says so.

use crate::elem;
use crate::endpoint::{Collective, Fill, OpOptions, OpReport, ReduceOp};

/// Element range of shard `s` of a tensor of `len` elements over `world` ranks.
pub fn shard(len: usize, world: u32, s: u32) -> core::ops::Range<usize> {
    crate::endpoint::shard_range(len, world, s)
}

/// Recompute the result of an op. `owner_reports[s]` is rank `s`'s report;
/// `chunk_elems` is `chunk_bytes / opts.dtype.size()`.
///
/// # Panics
/// If `inputs` is empty, the inputs differ in length, or a report is missing.
pub fn recompute(
    inputs: &[&[f32]],
    owner_reports: &[&OpReport],
    opts: OpOptions,
    chunk_elems: usize,
) -> Vec<f32> {
    match opts.collective {
        Collective::Allgather => return gathered(inputs, owner_reports, opts, chunk_elems),
        Collective::Broadcast => return broadcast(inputs, owner_reports, opts, chunk_elems),
        Collective::Allreduce | Collective::ReduceScatter | Collective::Barrier => {}
    }
    let world = inputs.len() as u32;
    let len = inputs[0].len();
    let mut out = vec![0.0f32; len];
    for s in 0..world {
        let sh = shard(len, world, s);
        let rep = owner_reports[s as usize];
        // Which ranks' contributions of each chunk arrived: one pass over the
        // owner's reports per chunk (the per-element loop below is O(world)).
        let mut present = vec![false; world as usize];
        for (c, start) in sh.clone().step_by(chunk_elems.max(1)).enumerate() {
            let end = (start + chunk_elems).min(sh.end);
            present.iter_mut().for_each(|p| *p = false);
            present[s as usize] = true;
            for t in &rep.scatter {
                if let Some(p) = present.get_mut(t.peer as usize)
                    && t.delivered.get(c as u32)
                {
                    *p = true;
                }
            }
            let delivered = present.iter().filter(|&&p| p).count() as u32;
            let masked = rep.own_mask.get(c as u32);
            for e in start..end {
                let v = |j: u32| {
                    if present[j as usize] {
                        elem::round(opts.dtype, inputs[j as usize][e])
                    } else {
                        match opts.fill {
                            Fill::Zero => 0.0,
                            Fill::Local => elem::round(opts.dtype, inputs[s as usize][e]),
                        }
                    }
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
                out[e] = if masked { 0.0 } else { elem::round(opts.dtype, acc) };
            }
        }
    }
    out
}

/// An allgather's result: shard `s` is rank `s`'s input, zero where its
/// agreed mask says so.
fn gathered(inputs: &[&[f32]], owner_reports: &[&OpReport], opts: OpOptions, chunk_elems: usize) -> Vec<f32> {
    let world = inputs.len() as u32;
    let mut out = vec![0.0f32; inputs[0].len()];
    for s in 0..world {
        let sh = shard(out.len(), world, s);
        copy_masked(
            &inputs[s as usize][sh.clone()],
            owner_reports[s as usize],
            opts,
            chunk_elems,
            &mut out[sh],
        );
    }
    out
}

/// A broadcast's result: the root's input, shard by shard as its owner
/// holds it — zero where the owner's agreed mask says so and (an owner but
/// the root) where the root's chunk never reached it.
fn broadcast(
    inputs: &[&[f32]],
    owner_reports: &[&OpReport],
    opts: OpOptions,
    chunk_elems: usize,
) -> Vec<f32> {
    let (world, root) = (inputs.len() as u32, opts.root);
    let src = inputs[root as usize];
    let mut out = vec![0.0f32; src.len()];
    for s in 0..world {
        let sh = shard(out.len(), world, s);
        let rep = owner_reports[s as usize];
        let from_root = rep.scatter.iter().find(|t| t.peer == root);
        let mut part = src[sh.clone()].to_vec();
        if s != root {
            for (c, chunk) in part.chunks_mut(chunk_elems.max(1)).enumerate() {
                if !from_root.is_some_and(|t| t.delivered.get(c as u32)) {
                    chunk.fill(0.0);
                }
            }
        }
        copy_masked(&part, rep, opts, chunk_elems, &mut out[sh]);
    }
    out
}

/// `src` rounded to the op's type into `out`, chunk `c` zero where
/// `rep.own_mask` has it.
fn copy_masked(src: &[f32], rep: &OpReport, opts: OpOptions, chunk_elems: usize, out: &mut [f32]) {
    for (c, (o, i)) in out.chunks_mut(chunk_elems.max(1)).zip(src.chunks(chunk_elems.max(1))).enumerate() {
        let masked = rep.own_mask.get(c as u32);
        for (o, &i) in o.iter_mut().zip(i) {
            *o = if masked { 0.0 } else { elem::round(opts.dtype, i) };
        }
    }
}
