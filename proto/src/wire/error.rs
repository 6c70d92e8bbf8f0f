//! Why a datagram was rejected, or could not be encoded.

use thiserror::Error;

use crate::wire::auth::PacketAuth;
use crate::wire::layout::HEADER_LEN;

/// Why a datagram was rejected. Each variant is a separate counter in the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WireError {
    /// Shorter than the fixed header.
    #[error("datagram of {len} bytes is shorter than the {HEADER_LEN}-byte header")]
    Truncated {
        /// Bytes received.
        len: usize,
    },
    /// The declared payload length (plus header and tag) disagrees with the datagram length.
    #[error("payload_len {declared} disagrees with datagram length {actual}")]
    LengthMismatch {
        /// Payload length in the header.
        declared: usize,
        /// Datagram length.
        actual: usize,
    },
    /// Not a dlcp datagram.
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    /// A dlcp version this build does not speak.
    #[error("unsupported wire version {0}")]
    UnsupportedVersion(u8),
    /// An `auth` byte that names no packet authentication mode.
    #[error("unknown packet_auth mode {0}")]
    UnknownAuth(u8),
    /// The datagram was sent with another packet authentication mode than the
    /// receiver's (`[security] packet_auth` differs between the two daemons).
    #[error("datagram sent with packet_auth = \"{theirs}\"; this receiver has packet_auth = \"{ours}\"")]
    AuthMismatch {
        /// The receiver's mode.
        ours: PacketAuth,
        /// The datagram's mode.
        theirs: PacketAuth,
    },
    /// The authentication tag does not match (forged, corrupted, or another job's key).
    #[error("authentication tag mismatch")]
    BadTag,
    /// Unknown packet type.
    #[error("unknown packet type {0}")]
    UnknownType(u8),
    /// Flag bits that are undefined or not allowed for the packet type.
    #[error("flags {0:#04x} not allowed for this packet type")]
    BadFlags(u8),
    /// Priority class above 7.
    #[error("priority class {0} out of range 0..=7")]
    BadClass(u8),
    /// Unknown phase, or a phase not allowed for the packet type.
    #[error("phase {0} not allowed for this packet type")]
    BadPhase(u8),
    /// Unknown element type.
    #[error("unknown dtype {0}")]
    UnknownDType(u8),
    /// Unknown reduction (the low four bits of `kind`, version 6).
    #[error("unknown reduce op {0}")]
    UnknownReduceOp(u8),
    /// A collective this version does not define (the high four bits of
    /// `kind`; version 7: 0–4, allreduce to barrier).
    #[error("unknown collective {0}")]
    UnknownCollective(u8),
    /// Reserved bytes were not zero.
    #[error("reserved bytes are not zero")]
    ReservedNonZero,
    /// A field is outside its allowed range (named).
    #[error("field `{0}` out of range")]
    BadField(&'static str),
    /// The output buffer cannot hold the packet.
    #[error("buffer of {have} bytes cannot hold a {need}-byte packet")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// Encoding only: the sender key was derived for another sender (job,
    /// rank, generation, session) or another packet_auth mode than the header
    /// names, so no receiver could verify the datagram.
    #[error("the packet key belongs to another sender or packet_auth mode than the header names")]
    KeyMismatch,
}
