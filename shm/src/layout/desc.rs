//! The two descriptor formats that travel through the rings — [`SubmitDesc`]
//! (trainer → daemon) and [`CompletionDesc`] (daemon → trainer) — with their raw
//! field values ([`ElemType`], [`Opcode`], the `FLAG_*` bits, [`Status`]). Pure
//! data: no `unsafe`, no I/O. What a submission must satisfy is checked in
//! `validate` ([`SubmitDesc::validate`]).

use core::mem::{offset_of, size_of};

/// Bytes of one ring descriptor, submission or completion.
pub const DESC_SIZE: u64 = 64;
/// Number of 64-bit words in one descriptor.
pub const DESC_WORDS: usize = (DESC_SIZE / 8) as usize;

const _: () = assert!(size_of::<SubmitDesc>() == DESC_SIZE as usize);
const _: () = assert!(size_of::<CompletionDesc>() == DESC_SIZE as usize);

/// Element type of a tensor in the arena. Raw value in [`SubmitDesc::dtype`].
///
/// The segment's own numbering (F32 = 1, so an all-zero descriptor is invalid);
/// not the packet format's `dlcp_proto::wire::DType`, which numbers F32 as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum ElemType {
    /// IEEE 754 binary32.
    F32 = 1,
    /// IEEE 754 binary16: reduced with `f32` accumulation, the result
    /// rounded once (to nearest even) to binary16.
    F16 = 2,
    /// bfloat16 (the upper half of a binary32): as [`ElemType::F16`].
    Bf16 = 3,
}

impl ElemType {
    /// The element type for a raw descriptor value, if known.
    pub fn from_raw(raw: u16) -> Option<ElemType> {
        match raw {
            1 => Some(ElemType::F32),
            2 => Some(ElemType::F16),
            3 => Some(ElemType::Bf16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            ElemType::F32 => 4,
            ElemType::F16 | ElemType::Bf16 => 2,
        }
    }
}

/// The reduction a submission asks for. Raw value in [`SubmitDesc::reduce`]
/// (0, what every earlier client wrote in that reserved byte, is the sum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Reduce {
    /// Element-wise sum over every trainer of the job.
    #[default]
    Sum = 0,
    /// Element-wise mean over every trainer of the job: the daemons divide
    /// once, before the one rounding to the tensor's type (the trainer does
    /// not divide).
    Average = 1,
}

impl Reduce {
    /// The reduction for a raw descriptor value, if known.
    pub fn from_raw(raw: u8) -> Option<Reduce> {
        match raw {
            0 => Some(Reduce::Sum),
            1 => Some(Reduce::Average),
            _ => None,
        }
    }
}

/// Operation a submission asks for. Raw value in [`SubmitDesc::opcode`].
///
/// A host's "shard" is the element range `r·len/nodes .. (r+1)·len/nodes`
/// (rounded down) of its daemon's rank `r` of `nodes`; the completion of a
/// reduce-scatter or an allgather names it ([`CompletionDesc::shard_offset`],
/// [`CompletionDesc::shard_len`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Opcode {
    /// Allreduce the tensor across all trainers of the job; the result replaces it.
    AllReduce = 1,
    /// Reduce-scatter: the host's shard of the tensor is replaced by the
    /// reduced shard (as an allreduce reduces it); the rest is left as it was.
    ReduceScatter = 2,
    /// Allgather: each host contributes its shard of the tensor (the sum of
    /// its trainers' tensors over that range); the whole gathered tensor
    /// replaces it. Does not reduce: `reduce` must be sum.
    Allgather = 3,
    /// Broadcast from the host of daemon rank [`SubmitDesc::root`]: its
    /// local rank 0's tensor replaces every trainer's. Does not reduce:
    /// `reduce` must be sum.
    Broadcast = 4,
    /// Barrier: completes once every trainer of the job has entered it. No
    /// tensor (`len_elems` may be 0; a tensor given is neither read nor
    /// written). Does not reduce: `reduce` must be sum.
    Barrier = 5,
}

impl Opcode {
    /// Every opcode, in raw-value order.
    pub const ALL: [Opcode; 5] =
        [Opcode::AllReduce, Opcode::ReduceScatter, Opcode::Allgather, Opcode::Broadcast, Opcode::Barrier];

    /// The opcode for a raw descriptor value, if known.
    pub fn from_raw(raw: u16) -> Option<Opcode> {
        Opcode::ALL.into_iter().find(|o| *o as u16 == raw)
    }

    /// Whether it reduces (allreduce and reduce-scatter); the others take
    /// only [`Reduce::Sum`].
    pub fn reduces(self) -> bool {
        matches!(self, Opcode::AllReduce | Opcode::ReduceScatter)
    }

    /// Lower-case name, as the daemon's reports and the CLI spell the
    /// collective (`allreduce`, `reduce-scatter`, `allgather`, `broadcast`,
    /// `barrier`).
    pub fn name(self) -> &'static str {
        match self {
            Opcode::AllReduce => "allreduce",
            Opcode::ReduceScatter => "reduce-scatter",
            Opcode::Allgather => "allgather",
            Opcode::Broadcast => "broadcast",
            Opcode::Barrier => "barrier",
        }
    }
}

/// Submission flag: after a partial delivery, rescale by the delivered count.
pub const FLAG_RESCALE: u32 = 1 << 0;
/// Submission flag: fill what is missing with the local value instead of zero.
pub const FLAG_FILL_LOCAL: u32 = 1 << 1;
/// Every flag bit this version knows; any other bit set is an error.
pub const KNOWN_FLAGS: u32 = FLAG_RESCALE | FLAG_FILL_LOCAL;

/// A submission descriptor (trainer → daemon), 64 bytes.
///
/// | offset | size | field          |
/// |-------:|-----:|----------------|
/// | 0      | 8    | `op_seq`       |
/// | 8      | 8    | `cookie`       |
/// | 16     | 8    | `arena_offset` |
/// | 24     | 8    | `len_elems`    |
/// | 32     | 4    | `tensor_id`    |
/// | 36     | 4    | `layer`        |
/// | 40     | 4    | `layers`       |
/// | 44     | 4    | `budget_ppm`   |
/// | 48     | 4    | `flags`        |
/// | 52     | 2    | `dtype` ([`ElemType`]: 1 f32, 2 f16, 3 bf16) |
/// | 54     | 2    | `opcode` ([`Opcode`]: 1 allreduce, 2 reduce-scatter, 3 allgather, 4 broadcast, 5 barrier) |
/// | 56     | 1    | `reduce` ([`Reduce`]: 0 sum, 1 average) |
/// | 57     | 3    | `reserved` (must be zero) |
/// | 60     | 4    | `root` (broadcast: the root's daemon rank; 0 otherwise) |
///
/// `reserved` and `root` were one 7-byte reserved field before the
/// collectives: a client that zeroes them asks for the same ops as before.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubmitDesc {
    /// Trainer-chosen sequence number of the operation (echoed in the completion).
    pub op_seq: u64,
    /// Opaque trainer value echoed in the completion.
    pub cookie: u64,
    /// Byte offset of the tensor from the start of the arena.
    pub arena_offset: u64,
    /// Tensor length in elements.
    pub len_elems: u64,
    /// Tensor id (the same tensor has the same id on every rank).
    pub tensor_id: u32,
    /// Layer index of the tensor (priority input: front layers first).
    pub layer: u32,
    /// Number of layers of the model.
    pub layers: u32,
    /// Loss budget in parts per million (0 = reliable).
    pub budget_ppm: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Raw [`ElemType`].
    pub dtype: u16,
    /// Raw [`Opcode`].
    pub opcode: u16,
    /// Raw [`Reduce`] (a reserved zero byte before: 0 is the sum).
    pub reduce: u8,
    /// Must be zero (room for later fields).
    pub reserved: [u8; 3],
    /// [`Opcode::Broadcast`]: the daemon rank (`node.rank`) of the host whose
    /// local rank 0 sends its tensor; must be below the job's number of
    /// daemons. Must be 0 for every other opcode.
    pub root: u32,
}

/// A completion descriptor (daemon → trainer), 64 bytes.
///
/// | offset | size | field           |
/// |-------:|-----:|-----------------|
/// | 0      | 8    | `cookie`        |
/// | 8      | 8    | `op_seq`        |
/// | 16     | 8    | `duration_ns`   |
/// | 24     | 4    | `tensor_id`     |
/// | 28     | 4    | `status`        |
/// | 32     | 4    | `delivered_ppm` |
/// | 36     | 4    | `repairs`       |
/// | 40     | 4    | `detail`        |
/// | 44     | 4    | `reserved` (zero) |
/// | 48     | 8    | `shard_offset`  |
/// | 56     | 8    | `shard_len`     |
///
/// `shard_offset` and `shard_len` were reserved zero bytes before the
/// collectives; a client that ignores them loses nothing for an allreduce.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompletionDesc {
    /// The submission's cookie.
    pub cookie: u64,
    /// The submission's `op_seq`.
    pub op_seq: u64,
    /// Time from submission to completion, nanoseconds.
    pub duration_ns: u64,
    /// The submission's tensor id.
    pub tensor_id: u32,
    /// Raw [`Status`].
    pub status: u32,
    /// Fraction of the tensor that arrived, parts per million.
    pub delivered_ppm: u32,
    /// Packets repaired (re-requested) for this op.
    pub repairs: u32,
    /// Status detail: for [`Status::InvalidDescriptor`] the [`DescError::code`](super::validate::DescError::code).
    pub detail: u32,
    /// Zero.
    pub reserved: [u8; 4],
    /// A completed [`Opcode::ReduceScatter`] or [`Opcode::Allgather`]: the
    /// first element of this host's shard (the part a reduce-scatter wrote,
    /// the part an allgather took from this host). 0 otherwise.
    pub shard_offset: u64,
    /// Elements of that shard (0 for other opcodes and failed ops; a shard
    /// may be empty when the tensor has fewer elements than the job has hosts).
    pub shard_len: u64,
}

fn put(b: &mut [u8; 64], off: usize, src: &[u8]) {
    b[off..off + src.len()].copy_from_slice(src);
}

fn get<const N: usize>(b: &[u8; 64], off: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[off..off + N]);
    out
}

fn bytes_to_words(b: [u8; 64]) -> [u64; DESC_WORDS] {
    core::array::from_fn(|i| u64::from_ne_bytes(get::<8>(&b, i * 8)))
}

fn words_to_bytes(w: [u64; DESC_WORDS]) -> [u8; 64] {
    let mut b = [0u8; 64];
    for (i, word) in w.iter().enumerate() {
        put(&mut b, i * 8, &word.to_ne_bytes());
    }
    b
}

macro_rules! desc_codec {
    ($ty:ident { $($f:ident : $ft:ty),* $(,)? }) => {
        impl $ty {
            /// The descriptor as the eight words stored in a ring slot (the `repr(C)` bytes).
            pub fn to_words(&self) -> [u64; DESC_WORDS] {
                let mut b = [0u8; 64];
                $( put(&mut b, offset_of!($ty, $f), &self.$f.to_ne_bytes()); )*
                put(&mut b, offset_of!($ty, reserved), &self.reserved);
                bytes_to_words(b)
            }

            /// The descriptor from the eight words of a ring slot. Every bit pattern
            /// decodes; meaning is checked afterwards.
            pub fn from_words(w: [u64; DESC_WORDS]) -> $ty {
                let b = words_to_bytes(w);
                $ty {
                    $( $f: <$ft>::from_ne_bytes(get(&b, offset_of!($ty, $f))), )*
                    reserved: get(&b, offset_of!($ty, reserved)),
                }
            }
        }
    };
}

desc_codec!(SubmitDesc {
    op_seq: u64,
    cookie: u64,
    arena_offset: u64,
    len_elems: u64,
    tensor_id: u32,
    layer: u32,
    layers: u32,
    budget_ppm: u32,
    flags: u32,
    dtype: u16,
    opcode: u16,
    reduce: u8,
    root: u32,
});

desc_codec!(CompletionDesc {
    cookie: u64,
    op_seq: u64,
    duration_ns: u64,
    tensor_id: u32,
    status: u32,
    delivered_ppm: u32,
    repairs: u32,
    detail: u32,
    shard_offset: u64,
    shard_len: u64,
});

/// Outcome of an operation, raw value in [`CompletionDesc::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Completed; the result is in the tensor's arena buffer.
    Ok,
    /// The descriptor was rejected; `detail` holds the [`DescError::code`](super::validate::DescError::code). Fix the caller.
    InvalidDescriptor,
    /// A peer stayed silent past the hard timeout. The tensor is unchanged; retry or abort the step.
    Timeout,
    /// A peer (or a local trainer of the same job) is gone. Abort the step.
    PeerDown,
    /// The daemon is shutting down.
    Shutdown,
    /// A status this build does not know (from a newer daemon).
    Unknown(u32),
}

impl Status {
    /// The raw value.
    pub fn to_raw(self) -> u32 {
        match self {
            Status::Ok => 0,
            Status::InvalidDescriptor => 1,
            Status::Timeout => 2,
            Status::PeerDown => 3,
            Status::Shutdown => 4,
            Status::Unknown(v) => v,
        }
    }

    /// The status for a raw value.
    pub fn from_raw(raw: u32) -> Status {
        match raw {
            0 => Status::Ok,
            1 => Status::InvalidDescriptor,
            2 => Status::Timeout,
            3 => Status::PeerDown,
            4 => Status::Shutdown,
            v => Status::Unknown(v),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A descriptor every check accepts (against a 1 MiB arena and the default limits).
    pub(crate) fn good() -> SubmitDesc {
        SubmitDesc {
            op_seq: 7,
            cookie: 0xdead_beef,
            arena_offset: 4096,
            len_elems: 1000,
            tensor_id: 3,
            layer: 1,
            layers: 4,
            budget_ppm: 10_000,
            flags: FLAG_RESCALE,
            dtype: ElemType::F32 as u16,
            opcode: Opcode::AllReduce as u16,
            reduce: Reduce::Sum as u8,
            reserved: [0; 3],
            root: 0,
        }
    }

    #[test]
    fn repr_c_offsets_match_documented_tables() {
        assert_eq!(offset_of!(SubmitDesc, op_seq), 0);
        assert_eq!(offset_of!(SubmitDesc, cookie), 8);
        assert_eq!(offset_of!(SubmitDesc, arena_offset), 16);
        assert_eq!(offset_of!(SubmitDesc, len_elems), 24);
        assert_eq!(offset_of!(SubmitDesc, tensor_id), 32);
        assert_eq!(offset_of!(SubmitDesc, layer), 36);
        assert_eq!(offset_of!(SubmitDesc, layers), 40);
        assert_eq!(offset_of!(SubmitDesc, budget_ppm), 44);
        assert_eq!(offset_of!(SubmitDesc, flags), 48);
        assert_eq!(offset_of!(SubmitDesc, dtype), 52);
        assert_eq!(offset_of!(SubmitDesc, opcode), 54);
        assert_eq!(offset_of!(SubmitDesc, reduce), 56);
        assert_eq!(offset_of!(SubmitDesc, reserved), 57);
        assert_eq!(offset_of!(SubmitDesc, root), 60);
        assert_eq!(offset_of!(CompletionDesc, cookie), 0);
        assert_eq!(offset_of!(CompletionDesc, op_seq), 8);
        assert_eq!(offset_of!(CompletionDesc, duration_ns), 16);
        assert_eq!(offset_of!(CompletionDesc, tensor_id), 24);
        assert_eq!(offset_of!(CompletionDesc, status), 28);
        assert_eq!(offset_of!(CompletionDesc, delivered_ppm), 32);
        assert_eq!(offset_of!(CompletionDesc, repairs), 36);
        assert_eq!(offset_of!(CompletionDesc, detail), 40);
        assert_eq!(offset_of!(CompletionDesc, reserved), 44);
        assert_eq!(offset_of!(CompletionDesc, shard_offset), 48);
        assert_eq!(offset_of!(CompletionDesc, shard_len), 56);
    }

    #[test]
    fn descriptors_round_trip_through_words() {
        let d = SubmitDesc { reduce: 1, reserved: [2, 3, 4], root: 0x0807_0605, ..good() };
        assert_eq!(SubmitDesc::from_words(d.to_words()), d);
        // The first word is op_seq in native order: the layout is the repr(C) one.
        assert_eq!(d.to_words()[0], 7);
        let c = CompletionDesc {
            cookie: 1,
            op_seq: 2,
            duration_ns: 3,
            tensor_id: 4,
            status: 5,
            delivered_ppm: 6,
            repairs: 7,
            detail: 8,
            reserved: [9; 4],
            shard_offset: 10,
            shard_len: 11,
        };
        assert_eq!(CompletionDesc::from_words(c.to_words()), c);
        let w: [u64; 8] = core::array::from_fn(|i| (i as u64 + 1) * 0x0101_0101_0101_0101);
        assert_eq!(SubmitDesc::from_words(w).to_words(), w);
        assert_eq!(CompletionDesc::from_words(w).to_words(), w);
        // The root is the last word's upper half (native order), where an
        // older client's zero reserved bytes were.
        let r = SubmitDesc { root: 3, ..good() }.to_words()[7];
        assert_eq!(r.to_ne_bytes()[4..], 3u32.to_ne_bytes());
        let c = CompletionDesc { shard_offset: 5, shard_len: 6, ..CompletionDesc::default() }.to_words();
        assert_eq!((c[6], c[7]), (5, 6));
    }

    #[test]
    fn opcodes_round_trip_and_know_which_reduce() {
        for (i, o) in Opcode::ALL.into_iter().enumerate() {
            assert_eq!(o as u16, i as u16 + 1);
            assert_eq!(Opcode::from_raw(o as u16), Some(o));
        }
        assert_eq!(Opcode::from_raw(0), None);
        assert_eq!(Opcode::from_raw(6), None);
        let reducing: Vec<_> = Opcode::ALL.into_iter().filter(|o| o.reduces()).collect();
        assert_eq!(reducing, [Opcode::AllReduce, Opcode::ReduceScatter]);
        assert_eq!(Opcode::ReduceScatter.name(), "reduce-scatter");
    }

    #[test]
    fn status_round_trips() {
        for s in [Status::Ok, Status::InvalidDescriptor, Status::Timeout, Status::PeerDown, Status::Shutdown]
        {
            assert_eq!(Status::from_raw(s.to_raw()), s);
        }
        assert_eq!(Status::from_raw(77), Status::Unknown(77));
    }
}
