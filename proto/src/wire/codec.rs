//! Whole datagrams: encode (header, payload, tag) and decode (structure,
//! authentication, fields, in the order the [wire module docs](super) give).

use crate::class::Class;
use crate::wire::auth::PacketAuth;
use crate::wire::error::WireError;
use crate::wire::header::Header;
use crate::wire::layout::{HEADER_LEN, MAGIC, MAX_PAYLOAD, STABLE_PREFIX, VERSION, be16, be32, field};
use crate::wire::mac::{JobKey, MacKey, SenderId};
use crate::wire::packet::Packet;
use crate::wire::settings::Settings;
use crate::wire::types::PacketType;

/// Encode a complete datagram: header, `payload`, tag (if `h.auth` has one),
/// with the key of the sender `h` names, derived from `keys` for this call (a
/// sender encodes with its own [`MacKey`] through [`seal`]).
/// `h.payload_len` is set from `payload`. Returns the datagram length.
pub fn encode(keys: &JobKey, h: &Header, payload: &[u8], out: &mut [u8]) -> Result<usize, WireError> {
    if payload.len() > MAX_PAYLOAD {
        return Err(WireError::BadField("payload_len"));
    }
    let mut h = *h;
    h.payload_len = payload.len() as u16;
    encode_in_place(keys, &h, out, |p| p.copy_from_slice(payload))
}

/// [`encode`] a datagram whose payload (of `h.payload_len` bytes) `fill` writes
/// directly into the output buffer.
pub fn encode_in_place(
    keys: &JobKey,
    h: &Header,
    out: &mut [u8],
    fill: impl FnOnce(&mut [u8]),
) -> Result<usize, WireError> {
    if h.auth != keys.auth() {
        return Err(WireError::KeyMismatch);
    }
    seal(&keys.sender_key(h.sender()), h, out, fill)
}

/// Encode a datagram with the sender's own packet `key`: the header, the
/// payload (of `h.payload_len` bytes) that `fill` writes into the output
/// buffer, then the tag. `key` must be the key of the sender `h` names, in the
/// mode `h.auth` names ([`WireError::KeyMismatch`] otherwise); `h.packet` is
/// the nonce, which the caller never repeats under one key. Returns the
/// datagram length.
pub fn seal(
    key: &MacKey,
    h: &Header,
    out: &mut [u8],
    fill: impl FnOnce(&mut [u8]),
) -> Result<usize, WireError> {
    if h.auth != key.auth() || (h.auth != PacketAuth::None && h.sender() != key.id()) {
        return Err(WireError::KeyMismatch);
    }
    let n = h.packet_len();
    if out.len() < n {
        return Err(WireError::BufferTooSmall { need: n, have: out.len() });
    }
    h.emit(out)?;
    let end = HEADER_LEN + usize::from(h.payload_len);
    fill(&mut out[HEADER_LEN..end]);
    if h.auth != PacketAuth::None {
        let (header, rest) = out.split_at_mut(HEADER_LEN);
        let tag = key.tag_parts(header, &rest[..end - HEADER_LEN]);
        out[end..n].copy_from_slice(&tag);
    }
    Ok(n)
}

/// Decode and authenticate a datagram: structure, then the packet
/// authentication mode and the tag (with the key of the sender its header
/// names, derived from `keys` for this call; an endpoint uses its
/// [`KeyCache`](crate::wire::KeyCache)), then fields (see the module docs for
/// the order). Returns the header and the payload, a sub-slice of `datagram`.
pub fn decode<'a>(keys: &JobKey, datagram: &'a [u8]) -> Result<(Header, &'a [u8]), WireError> {
    decode_with(keys.auth(), datagram, |p| p.verify(&keys.sender_key(SenderId::of_header(p.header()))))
}

/// [`decode`] for a receiver whose packet authentication mode is `ours`,
/// checking the tag of a structurally sound datagram of that mode with `verify`.
pub(crate) fn decode_with<'a>(
    ours: PacketAuth,
    datagram: &'a [u8],
    verify: impl FnOnce(&Packet<&'a [u8]>) -> Result<(), WireError>,
) -> Result<(Header, &'a [u8]), WireError> {
    let p = Packet::new_checked(datagram)?;
    if p.auth() != ours {
        return Err(WireError::AuthMismatch { ours, theirs: p.auth() });
    }
    if ours != PacketAuth::None {
        verify(&p)?;
    }
    let h = Header::parse(&p)?;
    let payload = &datagram[HEADER_LEN..HEADER_LEN + usize::from(h.payload_len)];
    if h.ty == PacketType::Hello {
        let s = Settings::parse(payload)?;
        if s.version != VERSION || s.auth != h.auth {
            return Err(WireError::BadField("settings"));
        }
    }
    Ok((h, payload))
}

/// The unauthenticated fixed header of a datagram that may be invalid in any
/// other way (version, length, tag, field values): present when the datagram
/// starts with [`MAGIC`] and holds a whole fixed header ([`HEADER_LEN`]
/// bytes), or, for another version, the prefix every version shares
/// ([`STABLE_PREFIX`] bytes: an 80-byte version 8 header still names its
/// sender). Only for attributing a rejected datagram to a class and a
/// claimed sender in counters; never trust it for anything else.
fn raw_header(datagram: &[u8]) -> Option<&[u8]> {
    if datagram.len() < STABLE_PREFIX || be16(datagram, field::MAGIC) != MAGIC {
        return None;
    }
    let whole = if datagram[field::VERSION] == VERSION { HEADER_LEN } else { STABLE_PREFIX };
    (datagram.len() >= whole).then_some(datagram)
}

/// The class a datagram's fixed header claims (see `raw_header`: magic and a
/// whole fixed header present, class byte in range), unauthenticated.
pub fn peek_class(datagram: &[u8]) -> Option<Class> {
    raw_header(datagram).and_then(|b| Class::new(b[field::CLASS]))
}

/// The sender rank a datagram's fixed header claims (magic and a whole fixed
/// header present), unauthenticated. Version 1 put the rank at the same
/// offset, so this also names the sender of a version 1 datagram.
pub fn peek_src(datagram: &[u8]) -> Option<u32> {
    raw_header(datagram).map(|b| be32(b, field::SRC))
}
