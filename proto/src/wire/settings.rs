//! What a HELLO carries: the settings two daemons must agree on to talk, the
//! sender's incarnation handshake, and its run.
//!
//! A HELLO's payload is exactly [`SETTINGS_LEN`] bytes (versions 4 and 5):
//!
//! | offset | size | field         | meaning                                               |
//! |-------:|-----:|---------------|-------------------------------------------------------|
//! | 0      | 1    | `version`     | the sender's wire version (equal to the header's)     |
//! | 1      | 1    | `auth`        | its packet authentication mode (equal to the header's) |
//! | 2      | 2    | `flow_window` | its flow-control receive window in datagrams, 0 = off |
//! | 4      | 4    | `chunk_bytes` | payload bytes per DATA packet it cuts tensors into    |
//! | 8      | 8    | `digest`      | digest of every setting the job's hosts must share ([`crate::endpoint::settings_digest`]) |
//! | 16     | 4    | `generation`  | its incarnation number, for people (logs, `dlcpctl status`); no receiver orders by it |
//! | 20     | 1    | `run_flags`   | bit 0 FRESH: its run began after it verified the receiver's current session; others 0 |
//! | 21     | 3    | reserved      | zero                                                  |
//! | 24     | 8    | `run_nonce`   | its trainers' current run (random per run, 0 = none)  |
//! | 32     | 8    | `run_echo`    | the receiver's run nonce as it last heard it (0 = none) |
//! | 40     | 8    | `challenge`   | its challenge to the receiver (0 = none)              |
//! | 48     | 8    | `echo`        | the last challenge it received from the receiver (0 = none) |
//!
//! The incarnation handshake ([`crate::endpoint`]'s membership): a receiver
//! accepts a sender's new session only from a HELLO of that session echoing
//! a challenge it issued for it, so a replayed HELLO of an earlier
//! incarnation is never taken for a restart. The run fields feed the run
//! agreement ([`crate::run`]).
//!
//! [`decode`](crate::wire::decode) checks the payload of every HELLO (known
//! values, agreement with the header, zero reserved bits); whether the
//! settings agree with the receiver's own is the endpoint's decision.

use crate::wire::auth::PacketAuth;
use crate::wire::error::WireError;
use crate::wire::layout::{be32, be64};

/// Length of a HELLO's payload.
pub const SETTINGS_LEN: usize = 56;

/// [`Settings::run_flags`]: the sender's run began after it verified the
/// receiver's current session.
pub const RUN_FRESH: u8 = 1;

/// What a HELLO announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Settings {
    /// Wire version.
    pub version: u8,
    /// Packet authentication mode.
    pub auth: PacketAuth,
    /// Payload bytes per DATA packet.
    pub chunk_bytes: u32,
    /// Flow-control receive window in datagrams (0: flow control off;
    /// [`crate::flow`]). Senders assume their receivers' window when they
    /// start, so it must agree across the job.
    pub flow_window: u16,
    /// Digest of the settings every host of the job must share.
    pub digest: u64,
    /// The sender's incarnation number (informational).
    pub generation: u32,
    /// Run flags ([`RUN_FRESH`]).
    pub run_flags: u8,
    /// The sender's current run nonce (0: no run).
    pub run_nonce: u64,
    /// The receiver's run nonce as the sender last heard it (0: none).
    pub run_echo: u64,
    /// The sender's challenge to the receiver (0: none).
    pub challenge: u64,
    /// The receiver's last challenge the sender received (0: none).
    pub echo: u64,
}

impl Settings {
    /// Write the settings into the first [`SETTINGS_LEN`] bytes of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than [`SETTINGS_LEN`].
    pub fn emit(&self, out: &mut [u8]) {
        out[0] = self.version;
        out[1] = self.auth as u8;
        out[2..4].copy_from_slice(&self.flow_window.to_be_bytes());
        out[4..8].copy_from_slice(&self.chunk_bytes.to_be_bytes());
        out[8..16].copy_from_slice(&self.digest.to_be_bytes());
        out[16..20].copy_from_slice(&self.generation.to_be_bytes());
        out[20] = self.run_flags;
        out[21..24].fill(0);
        out[24..32].copy_from_slice(&self.run_nonce.to_be_bytes());
        out[32..40].copy_from_slice(&self.run_echo.to_be_bytes());
        out[40..48].copy_from_slice(&self.challenge.to_be_bytes());
        out[48..56].copy_from_slice(&self.echo.to_be_bytes());
    }

    /// Parse a HELLO payload: exactly [`SETTINGS_LEN`] bytes, a known `auth`
    /// value, known run flags, zero reserved bytes.
    pub fn parse(payload: &[u8]) -> Result<Settings, WireError> {
        if payload.len() != SETTINGS_LEN {
            return Err(WireError::BadField("payload_len"));
        }
        let auth = PacketAuth::from_u8(payload[1]).ok_or(WireError::BadField("settings.auth"))?;
        if payload[20] & !RUN_FRESH != 0 {
            return Err(WireError::BadField("settings.run_flags"));
        }
        if payload[21..24].iter().any(|&b| b != 0) {
            return Err(WireError::ReservedNonZero);
        }
        Ok(Settings {
            version: payload[0],
            auth,
            chunk_bytes: be32(payload, 4..8),
            flow_window: u16::from_be_bytes([payload[2], payload[3]]),
            digest: be64(payload, 8..16),
            generation: be32(payload, 16..20),
            run_flags: payload[20],
            run_nonce: be64(payload, 24..32),
            run_echo: be64(payload, 32..40),
            challenge: be64(payload, 40..48),
            echo: be64(payload, 48..56),
        })
    }
}
