//! The packet authentication mode: the `auth` header byte.

use crate::wire::layout::TAG_LEN;

/// How datagrams are authenticated (`[security] packet_auth` in the daemon's
/// configuration; the `auth` header byte). Both ends must agree: a datagram
/// of the other mode is refused with
/// [`WireError::AuthMismatch`](crate::wire::WireError::AuthMismatch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum PacketAuth {
    /// No tag: for isolated fabrics whose operator opted out explicitly.
    None = 0,
    /// A 16-byte AES-128-GCM tag per datagram (see [`crate::wire::MacKey`]): the default.
    #[default]
    AesGmac = 1,
}

impl PacketAuth {
    /// Parse the wire value (`None`: unknown, [`WireError::UnknownAuth`](crate::wire::WireError::UnknownAuth)).
    pub fn from_u8(v: u8) -> Option<PacketAuth> {
        match v {
            0 => Some(PacketAuth::None),
            1 => Some(PacketAuth::AesGmac),
            _ => None,
        }
    }

    /// The mode's name in the configuration: `"aes-128-gmac"` or `"none"`.
    pub fn name(self) -> &'static str {
        match self {
            PacketAuth::None => "none",
            PacketAuth::AesGmac => "aes-128-gmac",
        }
    }

    /// The mode named `name` ([`PacketAuth::name`]), if any.
    pub fn from_name(name: &str) -> Option<PacketAuth> {
        [PacketAuth::None, PacketAuth::AesGmac].into_iter().find(|a| a.name() == name)
    }

    /// Bytes of tag a datagram of this mode ends with.
    pub fn tag_len(self) -> usize {
        match self {
            PacketAuth::None => 0,
            PacketAuth::AesGmac => TAG_LEN,
        }
    }
}

impl core::fmt::Display for PacketAuth {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}
