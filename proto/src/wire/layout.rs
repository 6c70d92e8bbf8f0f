//! The fixed numbers of the wire format: magic, version, lengths, and the
//! offset of every header field (the layout table of the [wire module
//! docs](super)).

/// `0xD1C9`, the first two bytes of every dlcp datagram.
pub const MAGIC: u16 = 0xD1C9;
/// Wire version this crate speaks.
pub const VERSION: u8 = 10;
/// Length of the fixed header (versions 9 and 10: 84 bytes, the 80 of versions 4–8
/// and the 4-byte `credit`; GCM pads the last partial block of plaintext).
pub const HEADER_LEN: usize = 84;
/// The prefix every version shares (magic, version, type, flags, class,
/// phase, dtype, job, then `src` and `dst` at 16–23): enough to recognise a
/// datagram of any version, refuse it by version and name its sender.
pub const STABLE_PREFIX: usize = 24;
/// Length of the authentication tag (absent under `packet_auth = "none"`).
pub const TAG_LEN: usize = 16;
/// Fixed bytes per authenticated datagram (header plus tag): the most a
/// datagram adds to its payload.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// Largest payload a header can declare (the range of `payload_len`).
///
/// The transport limit is lower: a UDP/IPv4 datagram carries at most 65 507
/// bytes, so at most `65_507 - OVERHEAD` = 65 407 bytes of payload fit in one.
pub const MAX_PAYLOAD: usize = u16::MAX as usize;
/// Largest budget (100%) in parts per million.
pub const PPM: u32 = 1_000_000;

/// Byte offsets of the header fields.
pub(crate) mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const TYPE: usize = 3;
    pub const FLAGS: usize = 4;
    pub const CLASS: usize = 5;
    pub const PHASE: usize = 6;
    pub const DTYPE: usize = 7;
    pub const JOB: Range<usize> = 8..12;
    pub const PAYLOAD_LEN: Range<usize> = 12..14;
    pub const AUTH: usize = 14;
    pub const KIND: usize = 15;
    pub const SRC: Range<usize> = 16..20;
    pub const DST: Range<usize> = 20..24;
    pub const OP: Range<usize> = 24..32;
    pub const TENSOR: Range<usize> = 32..36;
    pub const CHUNK_INDEX: Range<usize> = 36..40;
    pub const CHUNK_COUNT: Range<usize> = 40..44;
    pub const REQUIRED: Range<usize> = 44..48;
    pub const BUDGET: Range<usize> = 48..52;
    pub const SEQ: Range<usize> = 52..56;
    pub const RUN: Range<usize> = 56..64;
    pub const SESSION: Range<usize> = 64..72;
    pub const PACKET: Range<usize> = 72..80;
    pub const CREDIT: Range<usize> = 80..84;
}

pub(crate) fn be16(b: &[u8], r: core::ops::Range<usize>) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[r]);
    u16::from_be_bytes(a)
}

pub(crate) fn be32(b: &[u8], r: core::ops::Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    u32::from_be_bytes(a)
}

pub(crate) fn be64(b: &[u8], r: core::ops::Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_be_bytes(a)
}
