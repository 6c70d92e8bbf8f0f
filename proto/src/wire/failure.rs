//! The payload of a failing DONE (wire version 5): why the sender failed the
//! op.
//!
//! A DONE with [`Flags::FAILED`](crate::wire::Flags::FAILED) says "the sender
//! failed this op": the receiver fails it too, at once, instead of probing a
//! rank that gave up until its own hard timeout. Its payload is one byte:
//!
//! | offset | size | field    | meaning                                        |
//! |-------:|-----:|----------|------------------------------------------------|
//! | 0      | 1    | `reason` | [`FailReason`]: 0 other, 1 timeout, 2 deadline, 3 peer left, 4 peer incompatible, 5 peer failed |
//!
//! A code this build does not know reads as [`FailReason::Other`], never an
//! error: a later version may add codes without breaking the notice.

/// Length of a failing DONE's payload.
pub const FAILURE_LEN: usize = 1;

/// Why the sender of a failing DONE failed the op (its one-byte payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FailReason {
    /// Another reason (e.g. its run ended, or a trainer of its host left
    /// before the op started), or a code this build does not know.
    Other = 0,
    /// It made no progress for the sender's hard timeout.
    Timeout = 1,
    /// It was still unfinished at the sender's absolute op deadline.
    Deadline = 2,
    /// A rank the sender needed left (shut down) or restarted.
    PeerLeft = 3,
    /// A rank the sender needed cannot talk to it (another version or settings).
    PeerIncompatible = 4,
    /// Another rank failed it first and told the sender (a failing DONE).
    PeerFailed = 5,
}

impl FailReason {
    /// Every reason, in wire-value order.
    pub const ALL: [FailReason; 6] = [
        FailReason::Other,
        FailReason::Timeout,
        FailReason::Deadline,
        FailReason::PeerLeft,
        FailReason::PeerIncompatible,
        FailReason::PeerFailed,
    ];

    /// The reason of wire code `v`; unknown codes are [`FailReason::Other`].
    pub fn from_u8(v: u8) -> FailReason {
        FailReason::ALL.get(usize::from(v)).copied().unwrap_or(FailReason::Other)
    }

    /// The reason in words a trainer understands ("rank 2 gave up on this
    /// op: …").
    pub fn describe(self) -> &'static str {
        match self {
            FailReason::Other => {
                "it failed for another reason (e.g. its run ended, or a trainer of its host left)"
            }
            FailReason::Timeout => "no progress within its hard timeout",
            FailReason::Deadline => "not finished within its op deadline",
            FailReason::PeerLeft => "a rank it needed shut down or restarted",
            FailReason::PeerIncompatible => "a rank it needed is incompatible (other version or settings)",
            FailReason::PeerFailed => "another rank had given up on it",
        }
    }
}

impl core::fmt::Display for FailReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.describe())
    }
}

/// Write `reason` as a failing DONE's payload into the first [`FAILURE_LEN`]
/// bytes of `out`.
///
/// # Panics
/// If `out` is empty.
pub fn emit_failure(reason: FailReason, out: &mut [u8]) {
    out[0] = reason as u8;
}

/// The reason of a failing DONE's payload (`None` unless it is exactly
/// [`FAILURE_LEN`] bytes; an unknown code is [`FailReason::Other`]).
pub fn parse_failure(payload: &[u8]) -> Option<FailReason> {
    match payload {
        [code] => Some(FailReason::from_u8(*code)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_read_as_other() {
        for r in FailReason::ALL {
            let mut b = [0xAA; FAILURE_LEN];
            emit_failure(r, &mut b);
            assert_eq!(b[0], r as u8);
            assert_eq!(parse_failure(&b), Some(r));
        }
        assert_eq!(FailReason::ALL.map(|r| r as u8), [0, 1, 2, 3, 4, 5]);
        for code in 6..=255u8 {
            assert_eq!(parse_failure(&[code]), Some(FailReason::Other), "code {code}");
        }
        assert_eq!(parse_failure(&[]), None);
        assert_eq!(parse_failure(&[1, 0]), None);
    }
}
