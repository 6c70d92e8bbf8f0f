//! A zero-copy view of a datagram whose structure was checked.

use crate::wire::auth::PacketAuth;
use crate::wire::error::WireError;
use crate::wire::layout::{HEADER_LEN, MAGIC, STABLE_PREFIX, VERSION, be16, be32, be64, field};
use crate::wire::mac::MacKey;
use crate::wire::types::Flags;

/// A zero-copy view of a datagram whose length, magic, version and `auth`
/// byte were checked.
///
/// Accessors read straight from the buffer; none of them can panic once
/// [`Packet::new_checked`] has succeeded (for any `T` whose `as_ref` returns
/// the same slice every time, as `&[u8]`, `Vec<u8>` and arrays do). The fields
/// are *not* authenticated or validated by the view: use
/// [`decode`](crate::wire::decode), or [`Packet::verify`] then
/// [`Header::parse`](crate::wire::Header::parse).
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap `buffer`, checking that it starts with the dlcp magic, this
    /// version and a known `auth` byte, and is exactly header + declared
    /// payload + tag (if its `auth` mode has one) long.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let b = buffer.as_ref();
        // The prefix every version shares first, so that a shorter header of
        // an older version (80 bytes before version 9) is refused by its
        // version, not as truncated.
        if b.len() < STABLE_PREFIX {
            return Err(WireError::Truncated { len: b.len() });
        }
        let magic = be16(b, field::MAGIC);
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if b[field::VERSION] != VERSION {
            return Err(WireError::UnsupportedVersion(b[field::VERSION]));
        }
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated { len: b.len() });
        }
        let auth = PacketAuth::from_u8(b[field::AUTH]).ok_or(WireError::UnknownAuth(b[field::AUTH]))?;
        let declared = usize::from(be16(b, field::PAYLOAD_LEN));
        if declared + HEADER_LEN + auth.tag_len() != b.len() {
            return Err(WireError::LengthMismatch { declared, actual: b.len() });
        }
        Ok(Packet { buffer })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Raw packet type byte.
    pub fn raw_type(&self) -> u8 {
        self.b()[field::TYPE]
    }
    /// Flags.
    pub fn flags(&self) -> Flags {
        Flags(self.b()[field::FLAGS])
    }
    /// Raw class byte.
    pub fn raw_class(&self) -> u8 {
        self.b()[field::CLASS]
    }
    /// Raw phase byte.
    pub fn raw_phase(&self) -> u8 {
        self.b()[field::PHASE]
    }
    /// Raw dtype byte.
    pub fn raw_dtype(&self) -> u8 {
        self.b()[field::DTYPE]
    }
    /// Job id.
    pub fn job(&self) -> u32 {
        be32(self.b(), field::JOB)
    }
    /// The job's run the op belongs to (0 on HELLO, GRANT and GOODBYE).
    pub fn run(&self) -> u64 {
        be64(self.b(), field::RUN)
    }
    /// Sender rank.
    pub fn src(&self) -> u32 {
        be32(self.b(), field::SRC)
    }
    /// Destination rank.
    pub fn dst(&self) -> u32 {
        be32(self.b(), field::DST)
    }
    /// Op sequence number.
    pub fn op(&self) -> u64 {
        be64(self.b(), field::OP)
    }
    /// Tensor id.
    pub fn tensor(&self) -> u32 {
        be32(self.b(), field::TENSOR)
    }
    /// Chunk index or segment start.
    pub fn chunk_index(&self) -> u32 {
        be32(self.b(), field::CHUNK_INDEX)
    }
    /// Chunk count.
    pub fn chunk_count(&self) -> u32 {
        be32(self.b(), field::CHUNK_COUNT)
    }
    /// Non-droppable chunk count.
    pub fn required(&self) -> u32 {
        be32(self.b(), field::REQUIRED)
    }
    /// Budget in ppm.
    pub fn budget_ppm(&self) -> u32 {
        be32(self.b(), field::BUDGET)
    }
    /// Round number / heartbeat counter.
    pub fn seq(&self) -> u32 {
        be32(self.b(), field::SEQ)
    }
    /// Declared payload length.
    pub fn payload_len(&self) -> u16 {
        be16(self.b(), field::PAYLOAD_LEN)
    }
    /// Packet authentication mode.
    pub fn auth(&self) -> PacketAuth {
        PacketAuth::from_u8(self.b()[field::AUTH]).unwrap_or_default()
    }
    /// Raw `kind` byte (version 6): collective in the high four bits, reduction in the low four.
    pub fn raw_kind(&self) -> u8 {
        self.b()[field::KIND]
    }
    /// The sender's session (random per endpoint incarnation).
    pub fn session(&self) -> u64 {
        be64(self.b(), field::SESSION)
    }
    /// The sender's packet number (the GCM nonce).
    pub fn packet(&self) -> u64 {
        be64(self.b(), field::PACKET)
    }
    /// The flow-control credit the sender grants the destination (version 9):
    /// the low 32 bits of its cumulative DATA limit, 0 for none.
    pub fn credit(&self) -> u32 {
        be32(self.b(), field::CREDIT)
    }
    /// The fixed header.
    pub fn header(&self) -> &[u8] {
        &self.b()[..HEADER_LEN]
    }
    /// The payload.
    pub fn payload(&self) -> &[u8] {
        let n = usize::from(self.payload_len());
        &self.b()[HEADER_LEN..HEADER_LEN + n]
    }
    /// Header and payload: the bytes the tag covers.
    pub fn authenticated(&self) -> &[u8] {
        let b = self.b();
        &b[..HEADER_LEN + usize::from(self.payload_len())]
    }
    /// The tag (empty under `packet_auth = "none"`).
    pub fn tag(&self) -> &[u8] {
        let b = self.b();
        &b[HEADER_LEN + usize::from(self.payload_len())..]
    }

    /// Check the tag with `key` (the sender's key), in constant time.
    pub fn verify(&self, key: &MacKey) -> Result<(), WireError> {
        if key.check_parts(self.header(), self.payload(), self.tag()) {
            Ok(())
        } else {
            Err(WireError::BadTag)
        }
    }
}
