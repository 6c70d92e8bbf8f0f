//! The enumerated header fields: packet type, phase, element type and flags.

use crate::wire::error::WireError;

/// Packet type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PacketType {
    /// A chunk of tensor data.
    Data = 1,
    /// Sender to receiver: "I have sent everything; what do you have?"
    Probe = 2,
    /// Receiver to sender: a segment of the bitmap of chunks it holds (selective NACK).
    Bitmap = 3,
    /// Transfer closed (scatter: receiver to sender; gather: owner to receivers, with the agreed mask);
    /// with [`Flags::FAILED`] (version 5), the sender failed the op.
    Done = 4,
    /// Announcement and heartbeat: the sender's settings, its incarnation
    /// challenge and echo, and its run ([`crate::wire::Settings`]).
    Hello = 5,
    /// Flow control (version 3): receiver to sender, the cumulative credit
    /// limit; with [`Flags::REQUEST`], sender to receiver, a request for
    /// credit naming how many DATA datagrams it sent ([`crate::flow`]).
    Grant = 6,
    /// The sender's daemon is shutting down (version 4): mark it down now,
    /// not after the peer timeout. Accepted only from the sender's current,
    /// verified session and only if newer than anything else it sent.
    Goodbye = 7,
    /// Receiver to owner (version 10): the all-gather transfers of several
    /// ops it received whole, in one packet ([`crate::wire::AckEntry`]).
    Ack = 8,
}

impl PacketType {
    /// Every packet type, in wire-value order.
    pub const ALL: [PacketType; 8] = [
        PacketType::Data,
        PacketType::Probe,
        PacketType::Bitmap,
        PacketType::Done,
        PacketType::Hello,
        PacketType::Grant,
        PacketType::Goodbye,
        PacketType::Ack,
    ];

    /// Parse the wire value.
    pub fn from_u8(v: u8) -> Result<PacketType, WireError> {
        Ok(match v {
            1 => PacketType::Data,
            2 => PacketType::Probe,
            3 => PacketType::Bitmap,
            4 => PacketType::Done,
            5 => PacketType::Hello,
            6 => PacketType::Grant,
            7 => PacketType::Goodbye,
            8 => PacketType::Ack,
            _ => return Err(WireError::UnknownType(v)),
        })
    }

    /// True for packets about no op (HELLO, GRANT, GOODBYE): phase 0, run 0.
    pub fn is_phaseless(self) -> bool {
        matches!(self, PacketType::Hello | PacketType::Grant | PacketType::Goodbye)
    }

    /// True for packets that are not tensor data.
    pub fn is_control(self) -> bool {
        self != PacketType::Data
    }
}

/// Allreduce phase a packet belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Phase {
    /// Not tied to a phase (HELLO).
    None = 0,
    /// Reduce-scatter: raw contributions sent to the shard's owner.
    Scatter = 1,
    /// All-gather: the owner's aggregated shard sent to every rank.
    Gather = 2,
}

impl Phase {
    /// Parse the wire value.
    pub fn from_u8(v: u8) -> Result<Phase, WireError> {
        Ok(match v {
            0 => Phase::None,
            1 => Phase::Scatter,
            2 => Phase::Gather,
            _ => return Err(WireError::BadPhase(v)),
        })
    }
}

/// Element type of DATA payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum DType {
    /// IEEE 754 binary32.
    #[default]
    F32 = 0,
    /// IEEE 754 binary16 (version 6: reduced with `f32` accumulation,
    /// rounded once to nearest even; [`crate::elem`]).
    F16 = 1,
    /// bfloat16, the upper half of a binary32 (version 6: as [`DType::F16`]).
    Bf16 = 2,
}

impl DType {
    /// Parse the wire value.
    pub fn from_u8(v: u8) -> Result<DType, WireError> {
        Ok(match v {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Bf16,
            _ => return Err(WireError::UnknownDType(v)),
        })
    }

    /// Every element type, in wire-value order.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    /// Lower-case name (`f32`, `f16`, `bf16`), as configuration and command
    /// lines spell it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }
}

/// The reduction an op applies (version 6: the low four bits of header byte
/// 15, `kind`). Every datagram of an op carries it; a packet whose reduction
/// (or dtype) is not its op's is refused and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum ReduceOp {
    /// Element-wise sum.
    #[default]
    Sum = 0,
    /// Element-wise mean: each owner divides its reduced shard once, before
    /// the one rounding to the op's dtype.
    Average = 1,
}

impl ReduceOp {
    /// Every reduction, in wire-value order.
    pub const ALL: [ReduceOp; 2] = [ReduceOp::Sum, ReduceOp::Average];

    /// Parse the wire value (the low four bits of `kind`).
    pub fn from_u8(v: u8) -> Result<ReduceOp, WireError> {
        Ok(match v {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Average,
            _ => return Err(WireError::UnknownReduceOp(v)),
        })
    }

    /// Lower-case name (`sum`, `average`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Average => "average",
        }
    }
}

/// The collective an op is (the high four bits of header byte 15, `kind`;
/// version 6 defined allreduce only, version 7 the other four). Values
/// 5–15 are refused ([`WireError::UnknownCollective`]).
///
/// Which phases each uses (a packet of another phase is malformed): allreduce
/// and broadcast both, reduce-scatter and barrier only [`Phase::Scatter`],
/// allgather only [`Phase::Gather`]. Only allreduce and reduce-scatter
/// reduce: the others carry [`ReduceOp::Sum`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Collective {
    /// Reduce-scatter then all-gather of the reduced shards.
    #[default]
    Allreduce = 0,
    /// The first half of allreduce: each rank ends with its reduced shard.
    ReduceScatter = 1,
    /// The second half: each rank sends its shard to every other.
    Allgather = 2,
    /// One root's tensor to every rank: the root scatters each other owner
    /// its shard, then every owner sends its shard to every other rank, the
    /// root included (a scatter and an all-gather, as van de Geijn's
    /// broadcast: the root's uplink carries the tensor about twice, not N−1
    /// times; what it gets back makes it hold what every rank holds).
    Broadcast = 3,
    /// A reduce-scatter of one element per rank, exact: a rank leaves it
    /// once every rank has entered it.
    Barrier = 4,
}

impl Collective {
    /// Every collective, in wire order.
    pub const ALL: [Collective; 5] = [
        Collective::Allreduce,
        Collective::ReduceScatter,
        Collective::Allgather,
        Collective::Broadcast,
        Collective::Barrier,
    ];

    /// Parse the wire value (the high four bits of `kind`).
    pub fn from_u8(v: u8) -> Result<Collective, WireError> {
        Collective::ALL.get(usize::from(v)).copied().ok_or(WireError::UnknownCollective(v))
    }

    /// Whether its ops have a reduce-scatter phase.
    pub fn scatters(self) -> bool {
        matches!(
            self,
            Collective::Allreduce | Collective::ReduceScatter | Collective::Broadcast | Collective::Barrier
        )
    }

    /// Whether its ops have an all-gather phase.
    pub fn gathers(self) -> bool {
        matches!(self, Collective::Allreduce | Collective::Allgather | Collective::Broadcast)
    }

    /// Whether it reduces (the others carry [`ReduceOp::Sum`] and add nothing).
    pub fn reduces(self) -> bool {
        matches!(self, Collective::Allreduce | Collective::ReduceScatter)
    }

    /// Lower-case name (`allreduce`, `reduce-scatter`, `allgather`,
    /// `broadcast`, `barrier`), as the CLI and the reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            Collective::Allreduce => "allreduce",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::Allgather => "allgather",
            Collective::Broadcast => "broadcast",
            Collective::Barrier => "barrier",
        }
    }

    /// The collective a [`Collective::name`] names.
    pub fn from_name(name: &str) -> Option<Collective> {
        Collective::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// Flag bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(pub u8);

impl Flags {
    /// DATA: a retransmission requested by a BITMAP.
    pub const REPAIR: Flags = Flags(0x01);
    /// BITMAP: the receiver holds every chunk (no payload follows).
    pub const COMPLETE: Flags = Flags(0x02);
    /// DONE: the agreed mask is empty (no payload follows).
    pub const MASK_EMPTY: Flags = Flags(0x04);
    /// DATA: the chunk's class is not droppable; it counts towards `required`.
    pub const REQUIRED: Flags = Flags(0x08);
    /// GRANT: a sender's request for credit, not a grant.
    pub const REQUEST: Flags = Flags(0x10);
    /// DATA: the sender has more DATA for this receiver than its credit
    /// covers (it wants a GRANT soon; [`crate::flow`]).
    pub const BACKLOG: Flags = Flags(0x20);
    /// DONE (version 5): the sender failed this op; the payload is its
    /// one-byte reason ([`FailReason`](crate::wire::FailReason)). Never
    /// with MASK_EMPTY; never answered.
    pub const FAILED: Flags = Flags(0x40);
    /// DATA (version 6): the last datagram its sender had queued for the
    /// transfer (of the first pass, or of a repair round): the receiver
    /// decides on it as on a PROBE ([`crate::transfer`]).
    pub const LAST: Flags = Flags(0x80);

    /// True if every bit of `other` is set.
    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union of two flag sets.
    pub fn with(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_wire_value_once() {
        let parsed: Vec<PacketType> = (0..=255u8).filter_map(|v| PacketType::from_u8(v).ok()).collect();
        assert_eq!(parsed, PacketType::ALL);
    }
}
