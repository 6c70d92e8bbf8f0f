//! The payload of an ACK (wire version 10): the all-gather transfers of
//! several ops that its sender received whole.
//!
//! An ACK's header names the run of every entry (`run`), its phase is 2
//! (all-gather), `op` and `tensor` are 0, and `chunk_count` is the number of
//! entries (1 to [`MAX_ACKS`]); the payload is that many entries of
//! [`ACK_ENTRY_LEN`] bytes:
//!
//! | offset | size | field    | meaning                                                          |
//! |-------:|-----:|----------|------------------------------------------------------------------|
//! | 0      | 8    | `op`     | the op's sequence number                                         |
//! | 8      | 4    | `tensor` | the op's tensor id                                               |
//! | 12     | 4    | `echo`   | the `seq` (data sequence number) of the DATA that completed the transfer |
//! | 16     | 4    | `held`   | microseconds between that DATA's arrival and the ACK leaving (saturating) |
//!
//! The owner takes a round-trip sample from `echo` when it names the
//! transfer's LAST DATA, less `held` (as QUIC's ACK Delay, RFC 9000 §13.2.5).

use crate::wire::layout::{be32, be64};

/// Bytes per ACK entry.
pub const ACK_ENTRY_LEN: usize = 20;

/// Entries per ACK at most (1,280 bytes: fits a 1,500-byte MTU's datagram).
pub const MAX_ACKS: usize = 64;

/// One acknowledged all-gather transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckEntry {
    /// The op's sequence number.
    pub op: u64,
    /// The op's tensor id.
    pub tensor: u32,
    /// The `seq` of the DATA that completed the transfer.
    pub echo: u32,
    /// Microseconds the acknowledgement was held before it left.
    pub held_us: u32,
}

/// Write `entries` (at most [`MAX_ACKS`]) into `out`; the payload length.
///
/// # Panics
/// If `out` is shorter than `entries.len() * ACK_ENTRY_LEN`.
pub fn emit_acks(entries: &[AckEntry], out: &mut [u8]) -> usize {
    for (e, o) in entries.iter().zip(out.chunks_exact_mut(ACK_ENTRY_LEN)) {
        o[0..8].copy_from_slice(&e.op.to_be_bytes());
        o[8..12].copy_from_slice(&e.tensor.to_be_bytes());
        o[12..16].copy_from_slice(&e.echo.to_be_bytes());
        o[16..20].copy_from_slice(&e.held_us.to_be_bytes());
    }
    entries.len() * ACK_ENTRY_LEN
}

/// The entries of an ACK payload (the header check made its length a whole
/// number of entries; a trailing partial entry is ignored).
pub fn parse_acks(payload: &[u8]) -> impl Iterator<Item = AckEntry> + '_ {
    payload.chunks_exact(ACK_ENTRY_LEN).map(|e| AckEntry {
        op: be64(e, 0..8),
        tensor: be32(e, 8..12),
        echo: be32(e, 12..16),
        held_us: be32(e, 16..20),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let es = [
            AckEntry { op: 1, tensor: 2, echo: 3, held_us: 4 },
            AckEntry { op: u64::MAX, tensor: u32::MAX, echo: 0, held_us: u32::MAX },
        ];
        let mut buf = [0u8; 2 * ACK_ENTRY_LEN];
        assert_eq!(emit_acks(&es, &mut buf), 40);
        assert_eq!(&buf[0..8], &1u64.to_be_bytes());
        assert_eq!(parse_acks(&buf).collect::<Vec<_>>(), es);
        assert_eq!(parse_acks(&buf[..30]).count(), 1);
    }
}
