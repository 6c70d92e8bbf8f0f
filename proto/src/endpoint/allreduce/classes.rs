//! Which class an op's DATA goes at: the classifier's class of each chunk
//! ([`crate::priority`]), which also decides whether it is REQUIRED, and the
//! class it goes at on the wire, which for an all-gather to a rank that may
//! not have reduced yet is lower ([`Op::network_class`]).

use crate::class::Class;
use crate::endpoint::shared::Shared;
use crate::priority::{ChunkTraits, classify};
use crate::wire::Phase;

use super::Op;

impl Op {
    /// The classifier's class of a chunk of this op.
    pub(super) fn classify(&self, phase: Phase, magnitude_rank: u32, chunks: u32) -> Class {
        let (layer, layers) = (self.opts.layer, self.opts.layers);
        classify(&self.classifier, &ChunkTraits { phase, layer, layers, magnitude_rank, chunks })
    }

    /// Chunks of a class that is not droppable.
    pub(super) fn required(&self, classes: &[Class]) -> u32 {
        classes.iter().filter(|&&c| !self.classifier.droppable.contains(c)).count() as u32
    }

    /// The class of `chunk` in the transfer with `peer` in `phase`.
    pub(super) fn class_of(&self, phase: Phase, peer: u32, chunk: u32) -> Class {
        match phase {
            Phase::Gather => self.gclasses[chunk as usize],
            _ => self.classes[peer as usize][chunk as usize],
        }
    }

    /// The class DATA of `class` to `peer` in `phase` goes at on the wire.
    /// An all-gather to a peer that may not have reduced yet (nothing of
    /// its own all-gather had arrived here when the first chunk left) goes,
    /// all of it, at this op's lowest reduce-scatter class. That peer holds
    /// the owners' all-gathers back until it reduced ([`crate::flow`]), but
    /// the one datagram its credit allows beyond what it asked for (so that
    /// credit can come back on DATA) is a third of the all-gather at 256
    /// ranks and all of it at 1,024 (1 MB): hundreds of owners' of them at
    /// an all-gather class, which outranks reduce-scatter at the switch,
    /// starved the last reduce-scatter chunks it waited for (`dlcpd
    /// simulate`, 1 MB, clean: 1,024 ranks 2.43 → 1.88 ms per op, 256 ranks
    /// 2.01 → 1.82). All of the transfer, so that its chunks keep their
    /// order; the op's own lowest class rather than the band's, so that it
    /// still outranks later layers' reduce-scatter. Whether a chunk is
    /// REQUIRED still follows its own class.
    ///
    /// Only where peers hold all-gathers back (`credit::HOLD_MIN_WORLD`).
    /// With fewer ranks the same starvation costs time in the simulator (4
    /// ranks, 1 Gbit/s, clean, 1 MiB: 29.5 ms per op against 19.7 demoted;
    /// `dlcpd simulate`, 4 and 6 hosts, 16 MB: 0.886 against 0.995 of the
    /// link limit), but demoting there too (session 43, reverted) sent a
    /// back layer's all-gather at class 0, with best-effort traffic, at a
    /// congested port: `testbed_priority` saw no class-4 DATA at all. The
    /// 4-host testbed's A/B was within noise
    /// (`bench/results/2026-12-05-gather-class-every-world.md`).
    pub(super) fn network_class(&mut self, phase: Phase, peer: u32, class: Class, sh: &Shared) -> Class {
        if phase != Phase::Gather {
            return class;
        }
        if !self.gather_low.get(peer) {
            let c = self.opts.collective;
            let may_hold = c.scatters()
                && c.gathers()
                && sh.cfg.world >= crate::endpoint::credit::HOLD_MIN_WORLD
                && self.transfers.receiver(Phase::Gather, peer).is_some_and(|r| r.got().count_ones() == 0);
            if !may_hold {
                return class;
            }
            self.gather_low.set(peer);
        }
        self.scatter_low.unwrap_or(class)
    }
}
