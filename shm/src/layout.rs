//! Segment geometry, the header, the two descriptor formats and descriptor
//! validation. Pure data: no `unsafe`, no I/O.
//!
//! Everything here is shared with the trainer side, so every struct is
//! `#[repr(C)]` with explicit padding and a size pinned by a compile-time
//! assertion. Descriptors travel through the rings as eight 64-bit words
//! (see [`SubmitDesc::to_words`]); the byte layout of those words is the
//! `repr(C)` layout of the struct in native byte order (the two sides always run
//! on the same host).

use core::mem::{offset_of, size_of};

use thiserror::Error;

/// Magic number at offset 0 of every segment: `"DLCPSHM1"` read as a little-endian u64.
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"DLCPSHM1");
/// Version of the segment layout; bumped on any incompatible change.
pub const SEGMENT_VERSION: u64 = 1;
/// Bytes of the [`Header`].
pub const HEADER_SIZE: u64 = size_of::<Header>() as u64;
/// Every region (header, each ring, the arena) starts on a page boundary.
pub const REGION_ALIGN: u64 = 4096;
/// Bytes of one ring descriptor, submission or completion.
pub const DESC_SIZE: u64 = 64;
/// Number of 64-bit words in one descriptor.
pub const DESC_WORDS: usize = (DESC_SIZE / 8) as usize;
/// Bytes of a ring's control block: `head` and `tail`, each on its own cache line.
pub const RING_CTL_SIZE: u64 = 128;
/// Offset of `head` within a ring's control block.
pub const RING_HEAD_OFFSET: u64 = 0;
/// Offset of `tail` within a ring's control block.
pub const RING_TAIL_OFFSET: u64 = 64;
/// Smallest ring capacity accepted.
pub const MIN_RING_CAPACITY: u32 = 2;
/// Largest ring capacity accepted (keeps a segment's ring memory bounded).
pub const MAX_RING_CAPACITY: u32 = 1 << 16;
/// Largest arena accepted: 16 GiB.
pub const MAX_ARENA_SIZE: u64 = 16 << 30;
/// Alignment every tensor's arena offset must have (one cache line).
pub const ARENA_ALIGN: u64 = 64;

/// One ring index alone on its cache line (so producer and consumer never share a line).
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct CachePaddedIndex(pub core::sync::atomic::AtomicU32);

/// The control block at the start of each ring, as a C struct: `head` (written
/// only by the consumer) and `tail` (written only by the producer) on separate
/// cache lines. Describes the layout (and pins it below); the code accesses the
/// words at [`RING_HEAD_OFFSET`] / [`RING_TAIL_OFFSET`] through the mapping.
#[repr(C)]
#[derive(Debug, Default)]
pub struct RingCtl {
    /// Consumer index (free-running).
    pub head: CachePaddedIndex,
    /// Producer index (free-running).
    pub tail: CachePaddedIndex,
}

const _: () = assert!(size_of::<RingCtl>() as u64 == RING_CTL_SIZE);
const _: () = assert!(offset_of!(RingCtl, head) as u64 == RING_HEAD_OFFSET);
const _: () = assert!(offset_of!(RingCtl, tail) as u64 == RING_TAIL_OFFSET);
const _: () = assert!(size_of::<Header>() == 128);
const _: () = assert!(size_of::<SubmitDesc>() == DESC_SIZE as usize);
const _: () = assert!(size_of::<CompletionDesc>() == DESC_SIZE as usize);
const _: () = assert!(HEADER_SIZE <= REGION_ALIGN);

/// The segment header at offset 0, written by the daemon before the memfd is
/// handed out. Every field is a native-endian u64 so the header is sixteen words.
///
/// The daemon never reads the header back (a trainer may scribble on it); it keeps
/// its own [`Geometry`]. The trainer checks the header against the geometry in the
/// attach reply and the memfd's size.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// [`SEGMENT_MAGIC`].
    pub magic: u64,
    /// [`SEGMENT_VERSION`].
    pub version: u64,
    /// [`HEADER_SIZE`].
    pub header_size: u64,
    /// Size of the whole segment (the memfd) in bytes.
    pub total_size: u64,
    /// Offset of the submission ring's control block.
    pub sq_offset: u64,
    /// Submission ring capacity (slots, a power of two).
    pub sq_capacity: u64,
    /// Offset of the completion ring's control block.
    pub cq_offset: u64,
    /// Completion ring capacity (slots, a power of two).
    pub cq_capacity: u64,
    /// Size of a submission descriptor ([`DESC_SIZE`]).
    pub sq_desc_size: u64,
    /// Size of a completion descriptor ([`DESC_SIZE`]).
    pub cq_desc_size: u64,
    /// Offset of the buffer arena.
    pub arena_offset: u64,
    /// Size of the buffer arena in bytes.
    pub arena_size: u64,
    /// Attachment id the daemon gave this segment.
    pub attachment_id: u64,
    /// Job id from the trainer's register message.
    pub job_id: u64,
    /// Local rank from the register message.
    pub local_rank: u64,
    /// Local world size from the register message.
    pub local_world: u64,
}

impl Header {
    /// The header as the sixteen words stored at offset 0.
    pub fn to_words(&self) -> [u64; 16] {
        [
            self.magic,
            self.version,
            self.header_size,
            self.total_size,
            self.sq_offset,
            self.sq_capacity,
            self.cq_offset,
            self.cq_capacity,
            self.sq_desc_size,
            self.cq_desc_size,
            self.arena_offset,
            self.arena_size,
            self.attachment_id,
            self.job_id,
            self.local_rank,
            self.local_world,
        ]
    }

    /// The header from the sixteen words at offset 0 (no checks; see [`Geometry::check_header`]).
    pub fn from_words(w: [u64; 16]) -> Header {
        Header {
            magic: w[0],
            version: w[1],
            header_size: w[2],
            total_size: w[3],
            sq_offset: w[4],
            sq_capacity: w[5],
            cq_offset: w[6],
            cq_capacity: w[7],
            sq_desc_size: w[8],
            cq_desc_size: w[9],
            arena_offset: w[10],
            arena_size: w[11],
            attachment_id: w[12],
            job_id: w[13],
            local_rank: w[14],
            local_world: w[15],
        }
    }
}

/// Why a geometry or a header was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GeometryError {
    /// A ring capacity is not a power of two in `MIN_RING_CAPACITY..=MAX_RING_CAPACITY`.
    #[error("ring capacity {0} is not a power of two in {MIN_RING_CAPACITY}..={MAX_RING_CAPACITY}")]
    BadCapacity(u64),
    /// The arena size is zero, above [`MAX_ARENA_SIZE`], or not a multiple of [`REGION_ALIGN`].
    #[error("arena size {0} is not a non-zero multiple of {REGION_ALIGN} up to {MAX_ARENA_SIZE}")]
    BadArenaSize(u64),
    /// The header's magic number is wrong: not a dlcp segment.
    #[error("bad segment magic {0:#018x}: not a dlcp segment")]
    BadMagic(u64),
    /// The header's layout version is not the one this build speaks.
    #[error("segment layout version {found}, this build speaks {SEGMENT_VERSION}: upgrade the older side")]
    BadVersion {
        /// Version found in the header.
        found: u64,
    },
    /// A header field disagrees with the geometry computed from the capacities and arena size.
    #[error("segment header field `{field}` is {found}, expected {expected}")]
    Mismatch {
        /// Name of the header field.
        field: &'static str,
        /// Value in the header.
        found: u64,
        /// Value the geometry implies.
        expected: u64,
    },
}

/// Where everything sits in a segment. Computed by [`Geometry::new`] from the ring
/// capacities and the arena size alone, so both sides can recompute and compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Size of the whole segment in bytes.
    pub total_size: u64,
    /// Offset of the submission ring control block.
    pub sq_offset: u64,
    /// Submission ring capacity.
    pub sq_capacity: u32,
    /// Offset of the completion ring control block.
    pub cq_offset: u64,
    /// Completion ring capacity.
    pub cq_capacity: u32,
    /// Offset of the arena.
    pub arena_offset: u64,
    /// Size of the arena in bytes.
    pub arena_size: u64,
}

fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

fn check_capacity(c: u64) -> Result<u32, GeometryError> {
    if c.is_power_of_two() && (MIN_RING_CAPACITY as u64..=MAX_RING_CAPACITY as u64).contains(&c) {
        Ok(c as u32)
    } else {
        Err(GeometryError::BadCapacity(c))
    }
}

impl Geometry {
    /// Lays out a segment: header page, submission ring, completion ring, arena,
    /// each starting on a page boundary.
    pub fn new(sq_capacity: u32, cq_capacity: u32, arena_size: u64) -> Result<Geometry, GeometryError> {
        let sq_capacity = check_capacity(sq_capacity as u64)?;
        let cq_capacity = check_capacity(cq_capacity as u64)?;
        if arena_size == 0 || arena_size > MAX_ARENA_SIZE || arena_size % REGION_ALIGN != 0 {
            return Err(GeometryError::BadArenaSize(arena_size));
        }
        let sq_offset = REGION_ALIGN;
        let cq_offset = sq_offset + round_up(RING_CTL_SIZE + sq_capacity as u64 * DESC_SIZE, REGION_ALIGN);
        let arena_offset = cq_offset + round_up(RING_CTL_SIZE + cq_capacity as u64 * DESC_SIZE, REGION_ALIGN);
        Ok(Geometry {
            total_size: arena_offset + arena_size,
            sq_offset,
            sq_capacity,
            cq_offset,
            cq_capacity,
            arena_offset,
            arena_size,
        })
    }

    /// The header the daemon writes for this geometry.
    pub fn header(&self, attachment_id: u64, job_id: u64, local_rank: u32, local_world: u32) -> Header {
        Header {
            magic: SEGMENT_MAGIC,
            version: SEGMENT_VERSION,
            header_size: HEADER_SIZE,
            total_size: self.total_size,
            sq_offset: self.sq_offset,
            sq_capacity: self.sq_capacity as u64,
            cq_offset: self.cq_offset,
            cq_capacity: self.cq_capacity as u64,
            sq_desc_size: DESC_SIZE,
            cq_desc_size: DESC_SIZE,
            arena_offset: self.arena_offset,
            arena_size: self.arena_size,
            attachment_id,
            job_id,
            local_rank: local_rank as u64,
            local_world: local_world as u64,
        }
    }

    /// Recomputes the geometry from a header's capacities and arena size and checks
    /// that every other field (magic, version, sizes, offsets) agrees with it.
    pub fn check_header(h: &Header) -> Result<Geometry, GeometryError> {
        if h.magic != SEGMENT_MAGIC {
            return Err(GeometryError::BadMagic(h.magic));
        }
        if h.version != SEGMENT_VERSION {
            return Err(GeometryError::BadVersion { found: h.version });
        }
        let sq = check_capacity(h.sq_capacity)?;
        let cq = check_capacity(h.cq_capacity)?;
        let g = Geometry::new(sq, cq, h.arena_size)?;
        let checks: [(&'static str, u64, u64); 7] = [
            ("header_size", h.header_size, HEADER_SIZE),
            ("total_size", h.total_size, g.total_size),
            ("sq_offset", h.sq_offset, g.sq_offset),
            ("cq_offset", h.cq_offset, g.cq_offset),
            ("sq_desc_size", h.sq_desc_size, DESC_SIZE),
            ("cq_desc_size", h.cq_desc_size, DESC_SIZE),
            ("arena_offset", h.arena_offset, g.arena_offset),
        ];
        for (field, found, expected) in checks {
            if found != expected {
                return Err(GeometryError::Mismatch { field, found, expected });
            }
        }
        Ok(g)
    }

    /// Offset of the first slot of the submission ring.
    pub fn sq_slots(&self) -> u64 {
        self.sq_offset + RING_CTL_SIZE
    }

    /// Offset of the first slot of the completion ring.
    pub fn cq_slots(&self) -> u64 {
        self.cq_offset + RING_CTL_SIZE
    }
}

/// Element type of a tensor. Raw value in [`SubmitDesc::dtype`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Dtype {
    /// IEEE 754 binary32.
    F32 = 1,
}

impl Dtype {
    /// The dtype for a raw descriptor value, if known.
    pub fn from_raw(raw: u16) -> Option<Dtype> {
        match raw {
            1 => Some(Dtype::F32),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Dtype::F32 => 4,
        }
    }
}

/// Operation a submission asks for. Raw value in [`SubmitDesc::opcode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Opcode {
    /// Allreduce (sum) the tensor across all ranks of the job; the result replaces it.
    AllReduce = 1,
}

impl Opcode {
    /// The opcode for a raw descriptor value, if known.
    pub fn from_raw(raw: u16) -> Option<Opcode> {
        match raw {
            1 => Some(Opcode::AllReduce),
            _ => None,
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
/// | 52     | 2    | `dtype`        |
/// | 54     | 2    | `opcode`       |
/// | 56     | 8    | `reserved` (must be zero) |
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
    /// Raw [`Dtype`].
    pub dtype: u16,
    /// Raw [`Opcode`].
    pub opcode: u16,
    /// Must be zero (room for later fields).
    pub reserved: [u8; 8],
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
/// | 44     | 20   | `reserved` (zero) |
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
    /// Status detail: for [`Status::InvalidDescriptor`] the [`DescError::code`].
    pub detail: u32,
    /// Zero.
    pub reserved: [u8; 20],
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
});

/// Outcome of an operation, raw value in [`CompletionDesc::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Completed; the result is in the tensor's arena buffer.
    Ok,
    /// The descriptor was rejected; `detail` holds the [`DescError::code`]. Fix the caller.
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

/// Per-daemon bounds a submission must respect beyond the arena itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Tensor ids must be below this.
    pub max_tensor_ids: u32,
    /// `layers` must be in `1..=max_layers`.
    pub max_layers: u32,
    /// `budget_ppm` must be at most this (the loss contract's hard cap is 10%).
    pub max_budget_ppm: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_tensor_ids: 1 << 20, max_layers: 1 << 16, max_budget_ppm: 100_000 }
    }
}

/// Why a submission descriptor was rejected. One variant per rule; the check order
/// is the variant order.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DescError {
    /// The reserved bytes are not zero (a newer client, or garbage).
    #[error("reserved descriptor bytes are not zero")]
    ReservedNonZero,
    /// Unknown opcode.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u16),
    /// Unknown dtype.
    #[error("unknown dtype {0}")]
    UnknownDtype(u16),
    /// A flag bit this version does not know.
    #[error("unknown flag bits {0:#x}")]
    UnknownFlags(u32),
    /// Zero-length tensor.
    #[error("tensor length is zero")]
    EmptyTensor,
    /// `len_elems * dtype size` or `offset + bytes` overflows u64.
    #[error("tensor of {len_elems} elements at offset {offset} overflows")]
    LengthOverflow {
        /// Offset in the descriptor.
        offset: u64,
        /// Length in the descriptor.
        len_elems: u64,
    },
    /// The tensor's arena offset is not a multiple of [`ARENA_ALIGN`].
    #[error("arena offset {offset} is not a multiple of {ARENA_ALIGN}")]
    Misaligned {
        /// Offset in the descriptor.
        offset: u64,
    },
    /// The tensor does not lie inside the arena.
    #[error("tensor bytes {offset}..{end} lie outside the arena of {arena_size} bytes")]
    OutOfArena {
        /// Start offset.
        offset: u64,
        /// End offset (exclusive).
        end: u64,
        /// Arena size.
        arena_size: u64,
    },
    /// Tensor id at or above the limit.
    #[error("tensor id {id} is not below {max}")]
    TensorIdOutOfRange {
        /// Id in the descriptor.
        id: u32,
        /// The limit.
        max: u32,
    },
    /// `layers` is zero or above the limit.
    #[error("layer count {layers} is not in 1..={max}")]
    BadLayerCount {
        /// Layer count in the descriptor.
        layers: u32,
        /// The limit.
        max: u32,
    },
    /// `layer >= layers`.
    #[error("layer {layer} is not below the layer count {layers}")]
    LayerOutOfRange {
        /// Layer in the descriptor.
        layer: u32,
        /// Layer count in the descriptor.
        layers: u32,
    },
    /// Budget above the cap.
    #[error("loss budget {ppm} ppm exceeds the cap {max} ppm")]
    BudgetOutOfRange {
        /// Budget in the descriptor.
        ppm: u32,
        /// The cap.
        max: u32,
    },
}

impl DescError {
    /// Stable numeric code, sent back in [`CompletionDesc::detail`].
    pub fn code(&self) -> u32 {
        match self {
            DescError::ReservedNonZero => 1,
            DescError::UnknownOpcode(_) => 2,
            DescError::UnknownDtype(_) => 3,
            DescError::UnknownFlags(_) => 4,
            DescError::EmptyTensor => 5,
            DescError::LengthOverflow { .. } => 6,
            DescError::Misaligned { .. } => 7,
            DescError::OutOfArena { .. } => 8,
            DescError::TensorIdOutOfRange { .. } => 9,
            DescError::BadLayerCount { .. } => 10,
            DescError::LayerOutOfRange { .. } => 11,
            DescError::BudgetOutOfRange { .. } => 12,
        }
    }

    /// Number of distinct codes (codes are `1..=COUNT`).
    pub const COUNT: usize = 12;
}

/// A byte range of the arena that passed validation: `offset + len_elems * 4 <= arena_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaSpan {
    /// Byte offset from the start of the arena.
    pub offset: u64,
    /// Length in elements.
    pub len_elems: u64,
    /// Element type.
    pub dtype: Dtype,
}

impl ArenaSpan {
    /// Length in bytes (cannot overflow: checked at validation).
    pub fn bytes(&self) -> u64 {
        self.len_elems * self.dtype.size()
    }
}

/// A submission that passed every check: typed fields, nothing left to trust.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submission {
    /// Trainer's op sequence number.
    pub op_seq: u64,
    /// Trainer's cookie.
    pub cookie: u64,
    /// Operation.
    pub opcode: Opcode,
    /// Where the tensor is.
    pub span: ArenaSpan,
    /// Tensor id (`< max_tensor_ids`).
    pub tensor_id: u32,
    /// Layer (`< layers`).
    pub layer: u32,
    /// Layer count (`1..=max_layers`).
    pub layers: u32,
    /// Budget (`<= max_budget_ppm`).
    pub budget_ppm: u32,
    /// Known flag bits only.
    pub flags: u32,
}

impl SubmitDesc {
    /// Checks a descriptor that was already copied out of shared memory against the
    /// arena size and the limits. Checks run in [`DescError`] variant order.
    pub fn validate(&self, arena_size: u64, limits: &Limits) -> Result<Submission, DescError> {
        if self.reserved != [0u8; 8] {
            return Err(DescError::ReservedNonZero);
        }
        let opcode = Opcode::from_raw(self.opcode).ok_or(DescError::UnknownOpcode(self.opcode))?;
        let dtype = Dtype::from_raw(self.dtype).ok_or(DescError::UnknownDtype(self.dtype))?;
        if self.flags & !KNOWN_FLAGS != 0 {
            return Err(DescError::UnknownFlags(self.flags & !KNOWN_FLAGS));
        }
        if self.len_elems == 0 {
            return Err(DescError::EmptyTensor);
        }
        let overflow = DescError::LengthOverflow { offset: self.arena_offset, len_elems: self.len_elems };
        let bytes = self.len_elems.checked_mul(dtype.size()).ok_or(overflow.clone())?;
        let end = self.arena_offset.checked_add(bytes).ok_or(overflow)?;
        if self.arena_offset % ARENA_ALIGN != 0 {
            return Err(DescError::Misaligned { offset: self.arena_offset });
        }
        if end > arena_size {
            return Err(DescError::OutOfArena { offset: self.arena_offset, end, arena_size });
        }
        if self.tensor_id >= limits.max_tensor_ids {
            return Err(DescError::TensorIdOutOfRange { id: self.tensor_id, max: limits.max_tensor_ids });
        }
        if self.layers == 0 || self.layers > limits.max_layers {
            return Err(DescError::BadLayerCount { layers: self.layers, max: limits.max_layers });
        }
        if self.layer >= self.layers {
            return Err(DescError::LayerOutOfRange { layer: self.layer, layers: self.layers });
        }
        if self.budget_ppm > limits.max_budget_ppm {
            return Err(DescError::BudgetOutOfRange { ppm: self.budget_ppm, max: limits.max_budget_ppm });
        }
        Ok(Submission {
            op_seq: self.op_seq,
            cookie: self.cookie,
            opcode,
            span: ArenaSpan { offset: self.arena_offset, len_elems: self.len_elems, dtype },
            tensor_id: self.tensor_id,
            layer: self.layer,
            layers: self.layers,
            budget_ppm: self.budget_ppm,
            flags: self.flags,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARENA: u64 = 1 << 20;

    fn good() -> SubmitDesc {
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
            dtype: Dtype::F32 as u16,
            opcode: Opcode::AllReduce as u16,
            reserved: [0; 8],
        }
    }

    fn check(d: SubmitDesc) -> Result<Submission, DescError> {
        d.validate(ARENA, &Limits::default())
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
        assert_eq!(offset_of!(SubmitDesc, reserved), 56);
        assert_eq!(offset_of!(CompletionDesc, cookie), 0);
        assert_eq!(offset_of!(CompletionDesc, op_seq), 8);
        assert_eq!(offset_of!(CompletionDesc, duration_ns), 16);
        assert_eq!(offset_of!(CompletionDesc, tensor_id), 24);
        assert_eq!(offset_of!(CompletionDesc, status), 28);
        assert_eq!(offset_of!(CompletionDesc, delivered_ppm), 32);
        assert_eq!(offset_of!(CompletionDesc, repairs), 36);
        assert_eq!(offset_of!(CompletionDesc, detail), 40);
        assert_eq!(offset_of!(CompletionDesc, reserved), 44);
    }

    #[test]
    fn descriptors_round_trip_through_words() {
        let d = SubmitDesc { reserved: [1, 2, 3, 4, 5, 6, 7, 8], ..good() };
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
            reserved: [9; 20],
        };
        assert_eq!(CompletionDesc::from_words(c.to_words()), c);
        let w: [u64; 8] = core::array::from_fn(|i| (i as u64 + 1) * 0x0101_0101_0101_0101);
        assert_eq!(SubmitDesc::from_words(w).to_words(), w);
    }

    #[test]
    fn a_good_descriptor_validates() {
        let s = check(good()).unwrap();
        assert_eq!(s.span, ArenaSpan { offset: 4096, len_elems: 1000, dtype: Dtype::F32 });
        assert_eq!(s.span.bytes(), 4000);
        assert_eq!((s.op_seq, s.cookie, s.tensor_id, s.layer, s.layers), (7, 0xdead_beef, 3, 1, 4));
        // Exactly filling the arena is fine.
        let full = SubmitDesc { arena_offset: 0, len_elems: ARENA / 4, ..good() };
        assert!(check(full).is_ok());
        let last = SubmitDesc { arena_offset: ARENA - 64, len_elems: 16, ..good() };
        assert!(check(last).is_ok());
    }

    #[test]
    fn every_error_variant_is_reachable() {
        let cases: Vec<(SubmitDesc, DescError)> = vec![
            (SubmitDesc { reserved: [0, 0, 0, 0, 0, 0, 0, 1], ..good() }, DescError::ReservedNonZero),
            (SubmitDesc { opcode: 0, ..good() }, DescError::UnknownOpcode(0)),
            (SubmitDesc { opcode: 99, ..good() }, DescError::UnknownOpcode(99)),
            (SubmitDesc { dtype: 0, ..good() }, DescError::UnknownDtype(0)),
            (SubmitDesc { dtype: 0xffff, ..good() }, DescError::UnknownDtype(0xffff)),
            (SubmitDesc { flags: 1 << 31 | FLAG_RESCALE, ..good() }, DescError::UnknownFlags(1 << 31)),
            (SubmitDesc { len_elems: 0, ..good() }, DescError::EmptyTensor),
            (
                SubmitDesc { len_elems: u64::MAX / 2, ..good() },
                DescError::LengthOverflow { offset: 4096, len_elems: u64::MAX / 2 },
            ),
            (
                SubmitDesc { arena_offset: u64::MAX - 63, len_elems: 16, ..good() },
                DescError::LengthOverflow { offset: u64::MAX - 63, len_elems: 16 },
            ),
            (SubmitDesc { arena_offset: 4100, ..good() }, DescError::Misaligned { offset: 4100 }),
            (
                SubmitDesc { arena_offset: ARENA, len_elems: 1, ..good() },
                DescError::OutOfArena { offset: ARENA, end: ARENA + 4, arena_size: ARENA },
            ),
            (
                SubmitDesc { arena_offset: ARENA - 64, len_elems: 17, ..good() },
                DescError::OutOfArena { offset: ARENA - 64, end: ARENA + 4, arena_size: ARENA },
            ),
            (
                SubmitDesc { arena_offset: 1 << 62, ..good() },
                DescError::OutOfArena { offset: 1 << 62, end: (1 << 62) + 4000, arena_size: ARENA },
            ),
            (
                SubmitDesc { tensor_id: u32::MAX, ..good() },
                DescError::TensorIdOutOfRange { id: u32::MAX, max: 1 << 20 },
            ),
            (
                SubmitDesc { layers: 0, layer: 0, ..good() },
                DescError::BadLayerCount { layers: 0, max: 1 << 16 },
            ),
            (
                SubmitDesc { layers: (1 << 16) + 1, ..good() },
                DescError::BadLayerCount { layers: (1 << 16) + 1, max: 1 << 16 },
            ),
            (SubmitDesc { layer: 4, ..good() }, DescError::LayerOutOfRange { layer: 4, layers: 4 }),
            (
                SubmitDesc { budget_ppm: 100_001, ..good() },
                DescError::BudgetOutOfRange { ppm: 100_001, max: 100_000 },
            ),
        ];
        let mut seen = [false; DescError::COUNT + 1];
        for (d, want) in cases {
            let got = check(d).unwrap_err();
            assert_eq!(got, want, "descriptor {d:?}");
            seen[got.code() as usize] = true;
            assert!(!got.to_string().is_empty());
        }
        assert!(seen[1..].iter().all(|&s| s), "every code covered: {seen:?}");
    }

    #[test]
    fn geometry_is_page_aligned_and_header_checks_catch_every_field() {
        let g = Geometry::new(64, 128, 1 << 20).unwrap();
        for off in [g.sq_offset, g.cq_offset, g.arena_offset, g.total_size] {
            assert_eq!(off % REGION_ALIGN, 0);
        }
        assert!(g.sq_slots() + 64 * DESC_SIZE <= g.cq_offset);
        assert!(g.cq_slots() + 128 * DESC_SIZE <= g.arena_offset);
        assert_eq!(g.total_size, g.arena_offset + (1 << 20));
        let h = g.header(1, 2, 3, 4);
        assert_eq!(Header::from_words(h.to_words()), h);
        assert_eq!(Geometry::check_header(&h).unwrap(), g);

        assert_eq!(Geometry::check_header(&Header { magic: 1, ..h }), Err(GeometryError::BadMagic(1)));
        assert_eq!(
            Geometry::check_header(&Header { version: 9, ..h }),
            Err(GeometryError::BadVersion { found: 9 })
        );
        assert_eq!(
            Geometry::check_header(&Header { sq_capacity: 3, ..h }),
            Err(GeometryError::BadCapacity(3))
        );
        assert_eq!(
            Geometry::check_header(&Header { cq_capacity: 1 << 40, ..h }),
            Err(GeometryError::BadCapacity(1 << 40))
        );
        assert_eq!(
            Geometry::check_header(&Header { arena_size: 100, ..h }),
            Err(GeometryError::BadArenaSize(100))
        );
        for (name, bad) in [
            ("header_size", Header { header_size: 64, ..h }),
            ("total_size", Header { total_size: h.total_size + 4096, ..h }),
            ("sq_offset", Header { sq_offset: 0, ..h }),
            ("cq_offset", Header { cq_offset: h.cq_offset + 4096, ..h }),
            ("sq_desc_size", Header { sq_desc_size: 32, ..h }),
            ("cq_desc_size", Header { cq_desc_size: 128, ..h }),
            ("arena_offset", Header { arena_offset: 0, ..h }),
        ] {
            match Geometry::check_header(&bad) {
                Err(GeometryError::Mismatch { field, .. }) => assert_eq!(field, name),
                other => panic!("{name}: {other:?}"),
            }
        }
        assert!(Geometry::new(1, 2, 4096).is_err());
        assert!(Geometry::new(2, 2, 0).is_err());
        assert!(Geometry::new(2, 2, MAX_ARENA_SIZE + 4096).is_err());
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
