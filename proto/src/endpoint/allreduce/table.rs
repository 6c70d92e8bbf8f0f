//! An op's transfers: for each phase and each peer, a send side and a
//! receive side, and what addresses one of them (a [`Side`] and a peer).

use crate::time::Instant;
use crate::transfer::{Receiver, Sender, TransferReport};
use crate::wire::{PacketType, Phase};

/// One side of one phase of an op's transfers with a peer, in the order the
/// endpoint serves their timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Side {
    ScatterSend,
    GatherSend,
    ScatterRecv,
    GatherRecv,
}

impl Side {
    fn new(phase: Phase, send: bool) -> Side {
        match (phase == Phase::Gather, send) {
            (false, true) => Side::ScatterSend,
            (true, true) => Side::GatherSend,
            (false, false) => Side::ScatterRecv,
            (true, false) => Side::GatherRecv,
        }
    }

    /// The send side of `phase`.
    pub(crate) fn send(phase: Phase) -> Side {
        Side::new(phase, true)
    }

    /// The transfer a packet of type `ty` in `phase` is about, on this rank:
    /// BITMAPs, and reduce-scatter DONEs, come to a sender.
    pub(crate) fn of_packet(ty: PacketType, phase: Phase) -> Side {
        let to_sender = ty == PacketType::Bitmap || (ty == PacketType::Done && phase == Phase::Scatter);
        Side::new(phase, to_sender)
    }

    /// A send side.
    pub(crate) fn is_send(self) -> bool {
        matches!(self, Side::ScatterSend | Side::GatherSend)
    }

    /// Its position in per-transfer tables.
    fn index(self) -> usize {
        self as usize
    }

    /// Its phase.
    pub(crate) fn phase(self) -> Phase {
        match self {
            Side::ScatterSend | Side::ScatterRecv => Phase::Scatter,
            Side::GatherSend | Side::GatherRecv => Phase::Gather,
        }
    }
}

/// Index of a phase's transfers in the tables (`[scatter, gather]`).
fn slot(phase: Phase) -> usize {
    usize::from(phase == Phase::Gather)
}

/// Every transfer of one op, by phase and peer.
#[derive(Debug)]
pub(crate) struct Transfers {
    sends: [Vec<Option<Sender>>; 2],
    recvs: [Vec<Option<Receiver>>; 2],
    /// Per peer and [`Side`]: the instant of the transfer's entry in the
    /// endpoint's timer index ([`Transfers::reindex`]).
    indexed: Vec<[Option<Instant>; 4]>,
}

impl Transfers {
    /// No transfers yet, for a world of `world` ranks.
    pub(crate) fn new(world: usize) -> Transfers {
        fn none<T>(world: usize) -> Vec<Option<T>> {
            (0..world).map(|_| None).collect()
        }
        Transfers {
            sends: [none(world), none(world)],
            recvs: [none(world), none(world)],
            indexed: vec![[None; 4]; world],
        }
    }

    /// The send side to `peer` in `phase`.
    pub(crate) fn sender(&self, phase: Phase, peer: u32) -> Option<&Sender> {
        self.sends[slot(phase)].get(peer as usize)?.as_ref()
    }

    /// The send side to `peer` in `phase`, to change.
    pub(crate) fn sender_mut(&mut self, phase: Phase, peer: u32) -> Option<&mut Sender> {
        self.sends[slot(phase)].get_mut(peer as usize)?.as_mut()
    }

    /// The receive side from `peer` in `phase`.
    pub(crate) fn receiver(&self, phase: Phase, peer: u32) -> Option<&Receiver> {
        self.recvs[slot(phase)].get(peer as usize)?.as_ref()
    }

    /// The receive side from `peer` in `phase`, to change.
    pub(crate) fn receiver_mut(&mut self, phase: Phase, peer: u32) -> Option<&mut Receiver> {
        self.recvs[slot(phase)].get_mut(peer as usize)?.as_mut()
    }

    /// Open the send side to `peer` in `phase`.
    pub(crate) fn set_sender(&mut self, phase: Phase, peer: u32, st: Sender) {
        self.sends[slot(phase)][peer as usize] = Some(st);
    }

    /// Open the receive side from `peer` in `phase`.
    pub(crate) fn set_receiver(&mut self, phase: Phase, peer: u32, r: Receiver) {
        self.recvs[slot(phase)][peer as usize] = Some(r);
    }

    /// Every send side of `phase`, by peer.
    pub(crate) fn senders(&self, phase: Phase) -> impl Iterator<Item = (u32, &Sender)> {
        let all = self.sends[slot(phase)].iter().enumerate();
        all.filter_map(|(j, st)| Some((j as u32, st.as_ref()?)))
    }

    /// Every send side of `phase`, by peer, to change.
    pub(crate) fn senders_mut(&mut self, phase: Phase) -> impl Iterator<Item = (u32, &mut Sender)> {
        let all = self.sends[slot(phase)].iter_mut().enumerate();
        all.filter_map(|(j, st)| Some((j as u32, st.as_mut()?)))
    }

    /// The receive sides of `phase`, by peer (`None`: no transfer).
    pub(crate) fn receivers(&self, phase: Phase) -> &[Option<Receiver>] {
        &self.recvs[slot(phase)]
    }

    /// Whether a receive transfer of `phase` is still open.
    pub(crate) fn any_open(&self, phase: Phase) -> bool {
        self.recvs[slot(phase)].iter().flatten().any(Receiver::is_open)
    }

    /// Every live timer of one transfer.
    #[cfg(test)]
    pub(crate) fn timers(&self, side: Side, peer: u32) -> impl Iterator<Item = Instant> + '_ {
        let (phase, send) = (side.phase(), side.is_send());
        let st = self.sender(phase, peer).filter(|_| send);
        let r = self.receiver(phase, peer).filter(|_| !send);
        st.and_then(Sender::timer).into_iter().chain(r.into_iter().flat_map(Receiver::timers))
    }

    /// The instant of this transfer's entry in the timer index (`None`:
    /// it has none that counts).
    pub(crate) fn indexed(&self, side: Side, peer: u32) -> Option<Instant> {
        self.indexed.get(peer as usize)?[side.index()]
    }

    /// Where the timer index must (also) hold this transfer, after its
    /// timers may have changed: its earliest live timer, when that comes
    /// before its entry or it has none — that instant becomes its entry.
    /// `None`: the entry it has serves. A timer that moved later (a receiver
    /// re-arms its quiet timer on every chunk) leaves the entry where it
    /// was: the transfer is served at the entry's instant, finds nothing
    /// due and is indexed anew (`due`). So a datagram costs a comparison,
    /// not an index insertion; an entry fires early at most once per timer
    /// period.
    ///
    /// `due`: the entry was just taken from the index (it came due), so the
    /// transfer has none until this one.
    pub(crate) fn reindex(&mut self, side: Side, peer: u32, due: bool) -> Option<Instant> {
        let (phase, send) = (side.phase(), side.is_send());
        let earliest = if send {
            self.sender(phase, peer).and_then(Sender::timer)
        } else {
            self.receiver(phase, peer).and_then(Receiver::earliest_timer)
        };
        let slot = &mut self.indexed.get_mut(peer as usize)?[side.index()];
        if due {
            *slot = None;
        }
        let at = earliest.filter(|&t| slot.is_none_or(|i| t < i))?;
        *slot = Some(at);
        Some(at)
    }

    /// The peers (but `me`) some transfer still waits on: data, a bitmap or
    /// a DONE. Reduce-scatter sends matter only until this rank `reduced`.
    pub(crate) fn waiting_on(&self, me: u32, reduced: bool) -> Vec<u32> {
        let open = |phase, j| self.receiver(phase, j).is_some_and(Receiver::is_open);
        let scatter_out = |j| self.sender(Phase::Scatter, j).is_some_and(|s| !s.is_done()) && !reduced;
        let gather_out = |j| self.sender(Phase::Gather, j).is_some_and(|s| !s.is_reported() && !s.is_done());
        let peers = (0..self.recvs[0].len() as u32).filter(|&j| j != me);
        peers
            .filter(|&j| open(Phase::Scatter, j) || scatter_out(j) || open(Phase::Gather, j) || gather_out(j))
            .collect()
    }

    /// What each receive transfer of `phase` delivered.
    pub(crate) fn reports(&self, phase: Phase) -> Vec<TransferReport> {
        let rs = self.recvs[slot(phase)].iter().enumerate();
        rs.filter_map(|(j, r)| Some(r.as_ref()?.report(j as u32, phase))).collect()
    }

    /// The op is delivered (wire version 10): only its all-gather sends
    /// that wait for an ACK are left to serve. The rest goes — receive
    /// transfers (their reduce-scatter buffers returned, for the pool),
    /// reduce-scatter sends (every one acknowledged), acknowledged gather
    /// sends — so that the ops waiting for ACKs cost a few bytes per peer,
    /// not a whole op's state.
    pub(crate) fn trim_delivered(&mut self) -> Vec<Vec<f32>> {
        let bufs = self.recvs[0].iter_mut().flatten().map(Receiver::take_buf).filter(|b| b.capacity() > 0);
        let bufs = bufs.collect();
        self.recvs = [Vec::new(), Vec::new()];
        self.sends[0] = Vec::new();
        let gather = &mut self.sends[1];
        for st in gather.iter_mut() {
            if st.as_ref().is_some_and(Sender::is_done) {
                *st = None;
            }
        }
        bufs
    }

    /// The reduce-scatter receive buffers, for the pool.
    pub(crate) fn into_buffers(self) -> impl Iterator<Item = Vec<f32>> {
        let [scatter, _] = self.recvs;
        scatter.into_iter().flatten().map(|mut r| r.take_buf())
    }

    /// State and tensor bytes, and open transfers (for the endpoint's footprint).
    pub(crate) fn footprint(&self) -> (usize, usize, u32) {
        let mut state = (self.sends[0].capacity() + self.sends[1].capacity()) * size_of::<Option<Sender>>()
            + (self.recvs[0].capacity() + self.recvs[1].capacity()) * size_of::<Option<Receiver>>();
        let (mut tensor, mut open) = (0, 0);
        for st in self.sends.iter().flatten().flatten() {
            state += st.bytes();
            open += u32::from(!st.is_done());
        }
        for r in self.recvs.iter().flatten().flatten() {
            state += r.bytes();
            tensor += r.buf_bytes();
            open += u32::from(r.is_open());
        }
        (state, tensor, open)
    }
}
