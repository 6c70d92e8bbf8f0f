//! The settings a HELLO carries: what two daemons must agree on to talk.
//!
//! A HELLO's payload is exactly [`SETTINGS_LEN`] bytes:
//!
//! | offset | size | field         | meaning                                               |
//! |-------:|-----:|---------------|-------------------------------------------------------|
//! | 0      | 1    | `version`     | the sender's wire version (equal to the header's)     |
//! | 1      | 1    | `auth`        | its packet authentication mode (equal to the header's) |
//! | 2      | 2    | `flow_window` | its flow-control receive window in datagrams, 0 = off (version 3; zero before) |
//! | 4      | 4    | `chunk_bytes` | payload bytes per DATA packet it cuts tensors into    |
//!
//! [`decode`](crate::wire::decode) checks the payload of every HELLO (known
//! values, agreement with the header); whether the settings agree with the
//! receiver's own is the endpoint's decision.

use crate::wire::auth::PacketAuth;
use crate::wire::error::WireError;
use crate::wire::layout::be32;

/// Length of a HELLO's payload.
pub const SETTINGS_LEN: usize = 8;

/// The settings a HELLO announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    }

    /// Parse a HELLO payload: exactly [`SETTINGS_LEN`] bytes, a known `auth`
    /// value.
    pub fn parse(payload: &[u8]) -> Result<Settings, WireError> {
        if payload.len() != SETTINGS_LEN {
            return Err(WireError::BadField("payload_len"));
        }
        let auth = PacketAuth::from_u8(payload[1]).ok_or(WireError::BadField("settings.auth"))?;
        Ok(Settings {
            version: payload[0],
            auth,
            chunk_bytes: be32(payload, 4..8),
            flow_window: u16::from_be_bytes([payload[2], payload[3]]),
        })
    }
}
