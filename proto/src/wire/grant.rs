//! The payload of a GRANT and of a PROBE (wire version 3): one cumulative count.
//!
//! | offset | size | field   | meaning                                                           |
//! |-------:|-----:|---------|-------------------------------------------------------------------|
//! | 0      | 8    | `count` | GRANT: the credit limit, DATA `dseq`s below it may be sent; with REQUEST, and in a PROBE: DATA datagrams the sender had sent to the receiver |
//!
//! Both are 64-bit counts of the DATA datagrams between the two ranks since
//! either last restarted; DATA headers carry the low 32 bits of each
//! datagram's number (`dseq`) in `seq` (see [`crate::flow`]).

use crate::wire::layout::be64;

/// Length of a GRANT's payload.
pub const GRANT_LEN: usize = 8;

/// Write `count` as a GRANT payload into the first [`GRANT_LEN`] bytes of `out`.
///
/// # Panics
/// If `out` is shorter than [`GRANT_LEN`].
pub fn emit_grant(count: u64, out: &mut [u8]) {
    out[..GRANT_LEN].copy_from_slice(&count.to_be_bytes());
}

/// The count of a GRANT payload (`None` unless it is exactly [`GRANT_LEN`] bytes).
pub fn parse_grant(payload: &[u8]) -> Option<u64> {
    (payload.len() == GRANT_LEN).then(|| be64(payload, 0..GRANT_LEN))
}
