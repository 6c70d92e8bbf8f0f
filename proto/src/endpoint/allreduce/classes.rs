//! Which class an op's DATA goes at: the classifier's class of each chunk
//! ([`crate::priority`]), which also decides whether it is REQUIRED, and the
//! class it goes at on the wire, which for an all-gather to a rank that may
//! not have reduced yet is lower ([`Op::network_class`]).

use crate::class::Class;
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
    /// An all-gather to a peer that may not have reduced yet — none of its
    /// own all-gather had arrived here when the transfer's first chunk left
    /// — goes at this op's lowest reduce-scatter class: all of its first
    /// pass, so that its chunks keep their order (a transfer that changed
    /// class midway reached its receiver out of order at a strict-priority
    /// port and cost PROBEs, BITMAPs and repairs on a clean network).
    /// Its repairs go at the chunk's own class as soon as the peer's
    /// all-gather has arrived.
    ///
    /// Why: that peer still waits for reduce-scatter chunks, and its own
    /// all-gather, which every rank waits for, cannot start before they
    /// arrive; at an all-gather class, which outranks reduce-scatter at the
    /// switch, the owners' all-gathers overtook them at its port. At 4 ranks
    /// (`gather_class_sim`: 1 Gbit/s, clean, 1 MiB of a back layer) a rank
    /// whose last contributions were class 0 waited behind every owner's
    /// all-gather: 3.0 transfer times per op against 2.0 demoted. From 8
    /// ranks peers also hold all-gathers back until they reduced
    /// ([`crate::flow`]), but the one datagram the credit allows beyond what
    /// was asked for (so that credit can come back on DATA) is a third of
    /// the all-gather at 256 ranks and all of it at 1,024 (1 MB): at an
    /// all-gather class it starved the same chunks (`dlcpd simulate`, 1 MB,
    /// clean: 1,024 ranks 2.43 → 1.88 ms per op, 256 ranks 2.01 → 1.82).
    /// The op's own lowest class rather than the band's, so that it still
    /// outranks later layers' reduce-scatter. Whether a chunk is REQUIRED
    /// still follows its own class.
    ///
    /// The lowest class may be class 0, where best-effort traffic queues: a
    /// demoted first pass crosses a port congested by best-effort traffic
    /// with it (as the peer's own contributions of that class do), and what
    /// it loses there is repaired at the all-gather's class once the peer
    /// reduced. `tests/testbed_priority.rs` (3 hosts, a 200 Mbit/s port
    /// flooded by best-effort UDP, one run each): the back layer's chunks
    /// host 1 got only by repair 2.4% → 8.0%, its ops 688–740 → 697–764 ms,
    /// the front layer's unchanged (no loss). Until session 44 this held
    /// only from 8 ranks, repairs included; session 43 tried it at every
    /// world size with repairs demoted too and reverted it.
    pub(super) fn network_class(&mut self, phase: Phase, peer: u32, class: Class, repair: bool) -> Class {
        if phase != Phase::Gather {
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
