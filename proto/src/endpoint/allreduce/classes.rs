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

    /// The class DATA of `class` to `peer` in `phase` goes at on the wire
    /// (`repair`: a repair's).
    ///
    /// Where peers hold all-gathers back (`credit::HOLD_MIN_WORLD`, 8
    /// ranks), an all-gather to a peer that may not have reduced yet — none
    /// of its own all-gather had arrived here when the transfer's first
    /// chunk left — goes at this op's lowest reduce-scatter class: all of
    /// its first pass, so that its chunks keep their order (a transfer that
    /// changed class midway reached its receiver out of order at a
    /// strict-priority port and cost PROBEs, BITMAPs and repairs on a clean
    /// network). Its repairs go at the chunk's own class as soon as the
    /// peer's all-gather has arrived: the lowest class may be class 0, which
    /// best-effort traffic shares. The peer holds the owners' all-gathers
    /// back until it reduced ([`crate::flow`]), but the one datagram its
    /// credit allows beyond what it asked for (so that credit can come back
    /// on DATA) is a third of the all-gather at 256 ranks and all of it at
    /// 1,024 (1 MB): at an all-gather class, which outranks reduce-scatter at
    /// the switch, it starved the last reduce-scatter chunks the peer waited
    /// for (`dlcpd simulate`, 1 MB, clean: 1,024 ranks 2.43 → 1.88 ms per op,
    /// 256 ranks 2.01 → 1.82). The op's own lowest class rather than the
    /// band's, so that it still outranks later layers' reduce-scatter.
    /// Whether a chunk is REQUIRED still follows its own class.
    ///
    /// Not below 8 ranks, though the same inversion costs time there on a
    /// clean fabric that its links bound: `gather_class_sim` (4 ranks, 1
    /// Gbit/s, 1 MiB of a back layer) takes 3.0 link-limit transfer times
    /// per op, 2.0 demoted; `dlcpd simulate`, 4 and 6 hosts, 16 MB: p99 24.0
    /// and 26.6 ms, 21.3 and 23.7 demoted. But where best-effort traffic
    /// floods a port — the case priority classes exist for — the demoted
    /// first pass of a back layer's all-gather queues in class 0 with it,
    /// is lost there and comes back by repair: the time-to-accuracy bench's
    /// congested port (4 hosts, dlcp budget 1%, seed 1, one run each,
    /// session 44) took 2.75 s per step demoted with repairs promoted, 2.48
    /// s demoted with repairs demoted too (session 43's reverted rule) and
    /// 2.03 s without the demotion
    /// (`bench/results/2026-12-05-gather-class-every-world-2.md`).
    pub(super) fn network_class(
        &mut self,
        phase: Phase,
        peer: u32,
        class: Class,
        repair: bool,
        sh: &Shared,
    ) -> Class {
        if phase != Phase::Gather || sh.cfg.world < crate::endpoint::credit::HOLD_MIN_WORLD {
            return class;
        }
        let c = self.opts.collective;
        let unreduced = |op: &Op| {
            c.scatters()
                && c.gathers()
                && op.transfers.receiver(Phase::Gather, peer).is_some_and(|r| r.got().count_ones() == 0)
        };
        if !self.gather_low.get(peer) {
            // Decided at the transfer's first chunk: once the peer's
            // all-gather has arrived, it stays so.
            if !unreduced(self) {
                return class;
            }
            self.gather_low.set(peer);
        }
        if repair && !unreduced(self) {
            return class;
        }
        self.scatter_low.map_or(class, |low| low.min(class))
    }
}
