//! The segment's regions: where the header, the two rings and the arena sit
//! ([`Geometry`]), the header the daemon writes at offset 0 ([`SegmentHeader`])
//! and the ring control block ([`RingCtl`]). Pure data: no `unsafe`, no I/O.

use core::mem::{offset_of, size_of};

use thiserror::Error;

use super::desc::DESC_SIZE;

/// Magic number at offset 0 of every segment: `"DLCPSHM1"` read as a little-endian u64.
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"DLCPSHM1");
/// Version of the segment layout; bumped on any incompatible change.
pub const SEGMENT_VERSION: u64 = 1;
/// Bytes of the [`SegmentHeader`].
pub const HEADER_SIZE: u64 = size_of::<SegmentHeader>() as u64;
/// Every region (header, each ring, the arena) starts on a page boundary.
pub const REGION_ALIGN: u64 = 4096;
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
const _: () = assert!(size_of::<SegmentHeader>() == 128);
const _: () = assert!(HEADER_SIZE <= REGION_ALIGN);

/// The segment header at offset 0, written by the daemon before the memfd is
/// handed out. Every field is a native-endian u64 so the header is sixteen words.
///
/// The daemon never reads the header back (a trainer may scribble on it); it keeps
/// its own [`Geometry`]. The trainer checks the header against the geometry in the
/// attach reply and the memfd's size.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
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

impl SegmentHeader {
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
    pub fn from_words(w: [u64; 16]) -> SegmentHeader {
        SegmentHeader {
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
    pub fn header(
        &self,
        attachment_id: u64,
        job_id: u64,
        local_rank: u32,
        local_world: u32,
    ) -> SegmentHeader {
        SegmentHeader {
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
    pub fn check_header(h: &SegmentHeader) -> Result<Geometry, GeometryError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(SegmentHeader::from_words(h.to_words()), h);
        assert_eq!(Geometry::check_header(&h).unwrap(), g);

        assert_eq!(Geometry::check_header(&SegmentHeader { magic: 1, ..h }), Err(GeometryError::BadMagic(1)));
        assert_eq!(
            Geometry::check_header(&SegmentHeader { version: 9, ..h }),
            Err(GeometryError::BadVersion { found: 9 })
        );
        assert_eq!(
            Geometry::check_header(&SegmentHeader { sq_capacity: 3, ..h }),
            Err(GeometryError::BadCapacity(3))
        );
        assert_eq!(
            Geometry::check_header(&SegmentHeader { cq_capacity: 1 << 40, ..h }),
            Err(GeometryError::BadCapacity(1 << 40))
        );
        assert_eq!(
            Geometry::check_header(&SegmentHeader { arena_size: 100, ..h }),
            Err(GeometryError::BadArenaSize(100))
        );
        for (name, bad) in [
            ("header_size", SegmentHeader { header_size: 64, ..h }),
            ("total_size", SegmentHeader { total_size: h.total_size + 4096, ..h }),
            ("sq_offset", SegmentHeader { sq_offset: 0, ..h }),
            ("cq_offset", SegmentHeader { cq_offset: h.cq_offset + 4096, ..h }),
            ("sq_desc_size", SegmentHeader { sq_desc_size: 32, ..h }),
            ("cq_desc_size", SegmentHeader { cq_desc_size: 128, ..h }),
            ("arena_offset", SegmentHeader { arena_offset: 0, ..h }),
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
}
