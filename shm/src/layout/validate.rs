//! What a submission descriptor must satisfy before the daemon touches the arena:
//! [`SubmitDesc::validate`] checks a private copy against the arena size and the
//! daemon's [`Limits`], one [`DescError`] variant per rule, and yields a typed
//! [`Submission`]. Pure data: no `unsafe`, no I/O.

use thiserror::Error;

use super::desc::{CompletionDesc, ElemType, KNOWN_FLAGS, Opcode, Reduce, Status, SubmitDesc};
use super::segment::ARENA_ALIGN;

/// Per-daemon bounds a submission must respect beyond the arena itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Tensor ids must be below this.
    pub max_tensor_ids: u32,
    /// `layers` must be in `1..=max_layers`.
    pub max_layers: u32,
    /// `budget_ppm` must be at most this (the loss contract's hard cap is 10%).
    pub max_budget_ppm: u32,
    /// A tensor's bytes must be at most this (the daemon's `shm.max_tensor_bytes`).
    pub max_tensor_bytes: u64,
    /// The job's number of daemons (hosts): a broadcast root must be below it.
    pub nodes: u32,
}

impl Default for Limits {
    /// No limit on tensor size beyond the arena's, nor on the broadcast root.
    fn default() -> Self {
        Limits {
            max_tensor_ids: 1 << 20,
            max_layers: 1 << 16,
            max_budget_ppm: 100_000,
            max_tensor_bytes: u64::MAX,
            nodes: u32::MAX,
        }
    }
}

/// Why a submission descriptor was rejected. One variant per rule; the check order
/// is the variant order. Each message starts with the descriptor field(s) it is
/// about (`budget_ppm: ...`): the trainer receives it as the op's failure reason.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DescError {
    /// The reserved bytes are not zero (a newer client, or garbage).
    #[error("reserved: reserved descriptor bytes are not zero")]
    ReservedNonZero,
    /// Unknown opcode.
    #[error("opcode: unknown opcode {0}")]
    UnknownOpcode(u16),
    /// Unknown dtype.
    #[error("dtype: unknown dtype {0} (1 f32, 2 f16, 3 bf16)")]
    UnknownDtype(u16),
    /// Unknown reduction.
    #[error("reduce: unknown reduction {0} (0 sum, 1 average)")]
    UnknownReduce(u8),
    /// A flag bit this version does not know.
    #[error("flags: unknown flag bits {0:#x}")]
    UnknownFlags(u32),
    /// A reduction other than sum for a collective that does not reduce
    /// (allgather, broadcast, barrier).
    #[error("reduce: {} does not reduce: its reduction must be 0 (sum), not {reduce}", .opcode.name())]
    ReduceNotSum {
        /// The opcode.
        opcode: Opcode,
        /// The raw reduction in the descriptor.
        reduce: u8,
    },
    /// A root given for a collective other than broadcast.
    #[error("root: {} has no root: root must be 0, not {root}", .opcode.name())]
    RootNotZero {
        /// The opcode.
        opcode: Opcode,
        /// The root in the descriptor.
        root: u32,
    },
    /// A broadcast root that is not a daemon rank of the job.
    #[error("root: broadcast root {root} is not a daemon rank of this job (0..{nodes})")]
    RootOutOfRange {
        /// The root in the descriptor.
        root: u32,
        /// The job's number of daemons.
        nodes: u32,
    },
    /// Zero-length tensor (only a barrier may have none).
    #[error("len_elems: tensor length is zero")]
    EmptyTensor,
    /// `len_elems * dtype size` or `offset + bytes` overflows u64.
    #[error("len_elems: tensor of {len_elems} elements at offset {offset} overflows")]
    LengthOverflow {
        /// Offset in the descriptor.
        offset: u64,
        /// Length in the descriptor.
        len_elems: u64,
    },
    /// The tensor's arena offset is not a multiple of [`ARENA_ALIGN`].
    #[error("arena_offset: arena offset {offset} is not a multiple of {ARENA_ALIGN}")]
    Misaligned {
        /// Offset in the descriptor.
        offset: u64,
    },
    /// The tensor does not lie inside the arena.
    #[error(
        "arena_offset, len_elems: tensor bytes {offset}..{end} lie outside the arena of {arena_size} bytes"
    )]
    OutOfArena {
        /// Start offset.
        offset: u64,
        /// End offset (exclusive).
        end: u64,
        /// Arena size.
        arena_size: u64,
    },
    /// Tensor id at or above the limit.
    #[error("tensor_id: tensor id {id} is not below {max}")]
    TensorIdOutOfRange {
        /// Id in the descriptor.
        id: u32,
        /// The limit.
        max: u32,
    },
    /// `layers` is zero or above the limit.
    #[error("layers: layer count {layers} is not in 1..={max}")]
    BadLayerCount {
        /// Layer count in the descriptor.
        layers: u32,
        /// The limit.
        max: u32,
    },
    /// `layer >= layers`.
    #[error("layer: layer {layer} is not below the layer count {layers}")]
    LayerOutOfRange {
        /// Layer in the descriptor.
        layer: u32,
        /// Layer count in the descriptor.
        layers: u32,
    },
    /// Budget above the cap.
    #[error("budget_ppm: loss budget {ppm} ppm exceeds the cap {max} ppm")]
    BudgetOutOfRange {
        /// Budget in the descriptor.
        ppm: u32,
        /// The cap.
        max: u32,
    },
    /// The tensor is larger than the daemon allows (`shm.max_tensor_bytes`).
    #[error("len_elems: tensor of {bytes} bytes exceeds the daemon's limit shm.max_tensor_bytes = {max}")]
    TensorTooLarge {
        /// The tensor's bytes.
        bytes: u64,
        /// The limit.
        max: u64,
    },
}

impl DescError {
    /// Stable numeric code, sent back in [`CompletionDesc::detail`](super::desc::CompletionDesc::detail).
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
            DescError::TensorTooLarge { .. } => 13,
            DescError::UnknownReduce(_) => 14,
            DescError::ReduceNotSum { .. } => 15,
            DescError::RootNotZero { .. } => 16,
            DescError::RootOutOfRange { .. } => 17,
        }
    }

    /// Number of distinct codes (codes are `1..=COUNT`).
    pub const COUNT: usize = 17;
}

/// A tensor range that is not inside the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("{len_elems} elements at arena offset {offset} lie outside the {arena_size}-byte arena")]
pub struct ArenaError {
    /// Offset asked for.
    pub offset: u64,
    /// Length asked for.
    pub len_elems: u64,
    /// Arena size.
    pub arena_size: u64,
}

/// A byte range of the arena that passed validation: `offset + len_elems * dtype size <= arena_size`
/// (a barrier without a tensor: offset 0, no elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaSpan {
    /// Byte offset from the start of the arena.
    pub offset: u64,
    /// Length in elements.
    pub len_elems: u64,
    /// Element type.
    pub dtype: ElemType,
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
    /// The reduction (sum for a collective that does not reduce).
    pub reduce: Reduce,
    /// Broadcast: the root's daemon rank (below [`Limits::nodes`]); 0 otherwise.
    pub root: u32,
}

impl Submission {
    /// Its completion with `status`: cookie, op_seq and tensor id echoed,
    /// everything else zero (the report and the shard are the caller's).
    pub fn completion(&self, status: Status) -> CompletionDesc {
        CompletionDesc {
            cookie: self.cookie,
            op_seq: self.op_seq,
            tensor_id: self.tensor_id,
            status: status.to_raw(),
            ..CompletionDesc::default()
        }
    }
}

impl SubmitDesc {
    /// Checks a descriptor that was already copied out of shared memory against the
    /// arena size and the limits. Checks run in [`DescError`] variant order.
    pub fn validate(&self, arena_size: u64, limits: &Limits) -> Result<Submission, DescError> {
        if self.reserved != [0u8; 3] {
            return Err(DescError::ReservedNonZero);
        }
        let opcode = Opcode::from_raw(self.opcode).ok_or(DescError::UnknownOpcode(self.opcode))?;
        let dtype = ElemType::from_raw(self.dtype).ok_or(DescError::UnknownDtype(self.dtype))?;
        let reduce = Reduce::from_raw(self.reduce).ok_or(DescError::UnknownReduce(self.reduce))?;
        if self.flags & !KNOWN_FLAGS != 0 {
            return Err(DescError::UnknownFlags(self.flags & !KNOWN_FLAGS));
        }
        if !opcode.reduces() && reduce != Reduce::Sum {
            return Err(DescError::ReduceNotSum { opcode, reduce: self.reduce });
        }
        if opcode != Opcode::Broadcast && self.root != 0 {
            return Err(DescError::RootNotZero { opcode, root: self.root });
        }
        if self.root >= limits.nodes {
            return Err(DescError::RootOutOfRange { root: self.root, nodes: limits.nodes });
        }
        let span = if opcode == Opcode::Barrier && self.len_elems == 0 {
            // A barrier without a tensor: nothing in the arena to check.
            ArenaSpan { offset: 0, len_elems: 0, dtype }
        } else {
            self.arena_span(dtype, arena_size)?
        };
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
        if span.bytes() > limits.max_tensor_bytes {
            return Err(DescError::TensorTooLarge { bytes: span.bytes(), max: limits.max_tensor_bytes });
        }
        Ok(Submission {
            op_seq: self.op_seq,
            cookie: self.cookie,
            opcode,
            span,
            tensor_id: self.tensor_id,
            layer: self.layer,
            layers: self.layers,
            budget_ppm: self.budget_ppm,
            flags: self.flags,
            reduce,
            root: self.root,
        })
    }

    /// The tensor's span, checked: not empty, no overflow, aligned, inside the arena.
    fn arena_span(&self, dtype: ElemType, arena_size: u64) -> Result<ArenaSpan, DescError> {
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
        Ok(ArenaSpan { offset: self.arena_offset, len_elems: self.len_elems, dtype })
    }
}

#[cfg(test)]
mod tests {
    use super::super::desc::FLAG_RESCALE;
    use super::super::desc::tests::good;
    use super::*;

    const ARENA: u64 = 1 << 20;

    fn check(d: SubmitDesc) -> Result<Submission, DescError> {
        d.validate(ARENA, &Limits::default())
    }
    #[test]
    fn a_good_descriptor_validates() {
        let s = check(good()).unwrap();
        assert_eq!(s.span, ArenaSpan { offset: 4096, len_elems: 1000, dtype: ElemType::F32 });
        assert_eq!(s.span.bytes(), 4000);
        assert_eq!((s.op_seq, s.cookie, s.tensor_id, s.layer, s.layers), (7, 0xdead_beef, 3, 1, 4));
        // f16 and bf16: 2 bytes an element; the reduction as asked.
        for (raw, dtype) in [(2u16, ElemType::F16), (3, ElemType::Bf16)] {
            let s = check(SubmitDesc { dtype: raw, reduce: 1, ..good() }).unwrap();
            assert_eq!((s.span.dtype, s.span.bytes(), s.reduce), (dtype, 2000, Reduce::Average));
        }
        assert_eq!(s.reduce, Reduce::Sum);
        // Exactly filling the arena is fine.
        let full = SubmitDesc { arena_offset: 0, len_elems: ARENA / 4, ..good() };
        assert!(check(full).is_ok());
        let last = SubmitDesc { arena_offset: ARENA - 64, len_elems: 16, ..good() };
        assert!(check(last).is_ok());
    }

    #[test]
    fn every_error_variant_is_reachable() {
        let cases: Vec<(SubmitDesc, DescError)> = vec![
            (SubmitDesc { reserved: [0, 0, 1], ..good() }, DescError::ReservedNonZero),
            (SubmitDesc { opcode: 0, ..good() }, DescError::UnknownOpcode(0)),
            (SubmitDesc { opcode: 99, ..good() }, DescError::UnknownOpcode(99)),
            (SubmitDesc { dtype: 0, ..good() }, DescError::UnknownDtype(0)),
            (SubmitDesc { dtype: 0xffff, ..good() }, DescError::UnknownDtype(0xffff)),
            (SubmitDesc { dtype: 4, ..good() }, DescError::UnknownDtype(4)),
            (SubmitDesc { reduce: 2, ..good() }, DescError::UnknownReduce(2)),
            (SubmitDesc { reduce: 0xff, ..good() }, DescError::UnknownReduce(0xff)),
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
        // The collectives' rules: no reduction but sum where nothing is
        // reduced, a root only for broadcast, and below the job's daemons.
        let limits = Limits { nodes: 4, ..Limits::default() };
        let collective_cases = [
            (Opcode::Allgather, 1, 0, DescError::ReduceNotSum { opcode: Opcode::Allgather, reduce: 1 }),
            (Opcode::Broadcast, 1, 0, DescError::ReduceNotSum { opcode: Opcode::Broadcast, reduce: 1 }),
            (Opcode::Barrier, 1, 0, DescError::ReduceNotSum { opcode: Opcode::Barrier, reduce: 1 }),
            (Opcode::AllReduce, 0, 1, DescError::RootNotZero { opcode: Opcode::AllReduce, root: 1 }),
            (Opcode::ReduceScatter, 0, 2, DescError::RootNotZero { opcode: Opcode::ReduceScatter, root: 2 }),
            (Opcode::Allgather, 0, 3, DescError::RootNotZero { opcode: Opcode::Allgather, root: 3 }),
            (Opcode::Barrier, 0, 1, DescError::RootNotZero { opcode: Opcode::Barrier, root: 1 }),
            (Opcode::Broadcast, 0, 4, DescError::RootOutOfRange { root: 4, nodes: 4 }),
            (Opcode::Broadcast, 0, u32::MAX, DescError::RootOutOfRange { root: u32::MAX, nodes: 4 }),
        ];
        for (opcode, reduce, root, want) in collective_cases {
            let d = SubmitDesc { opcode: opcode as u16, reduce, root, ..good() };
            let got = d.validate(ARENA, &limits).unwrap_err();
            assert_eq!(got, want, "descriptor {d:?}");
            let field = if reduce != 0 { "reduce: " } else { "root: " };
            assert!(got.to_string().starts_with(field), "{got}");
            seen[got.code() as usize] = true;
        }
        // The tensor-size limit (none by default): at it passes, above it not.
        let limits = Limits { max_tensor_bytes: 4000, ..Limits::default() };
        assert!(good().validate(ARENA, &limits).is_ok(), "exactly at the limit");
        let got = SubmitDesc { len_elems: 1001, ..good() }.validate(ARENA, &limits).unwrap_err();
        assert_eq!(got, DescError::TensorTooLarge { bytes: 4004, max: 4000 });
        assert!(got.to_string().contains("shm.max_tensor_bytes = 4000"), "{got}");
        seen[got.code() as usize] = true;
        assert!(seen[1..].iter().all(|&s| s), "every code covered: {seen:?}");
    }

    #[test]
    fn every_collective_validates_and_a_barrier_needs_no_tensor() {
        let limits = Limits { nodes: 4, ..Limits::default() };
        for opcode in Opcode::ALL {
            let root = if opcode == Opcode::Broadcast { 3 } else { 0 };
            let s = SubmitDesc { opcode: opcode as u16, root, ..good() }.validate(ARENA, &limits).unwrap();
            assert_eq!((s.opcode, s.root, s.span.len_elems), (opcode, root, 1000));
        }
        // The reducing ones take an average.
        for opcode in [Opcode::AllReduce, Opcode::ReduceScatter] {
            let s = check(SubmitDesc { opcode: opcode as u16, reduce: 1, ..good() }).unwrap();
            assert_eq!(s.reduce, Reduce::Average);
        }
        // A barrier of no elements: its offset is not looked at.
        let b = SubmitDesc { opcode: Opcode::Barrier as u16, len_elems: 0, arena_offset: 3, ..good() };
        let s = check(b).unwrap();
        assert_eq!(s.span, ArenaSpan { offset: 0, len_elems: 0, dtype: ElemType::F32 });
        // Only a barrier: the others still need a tensor.
        for opcode in [Opcode::AllReduce, Opcode::ReduceScatter, Opcode::Allgather, Opcode::Broadcast] {
            let d = SubmitDesc { opcode: opcode as u16, len_elems: 0, ..good() };
            assert_eq!(check(d).unwrap_err(), DescError::EmptyTensor);
        }
        // A barrier with a tensor has it checked like any other.
        let b = SubmitDesc { opcode: Opcode::Barrier as u16, arena_offset: 4100, ..good() };
        assert_eq!(check(b).unwrap_err(), DescError::Misaligned { offset: 4100 });
    }
}
