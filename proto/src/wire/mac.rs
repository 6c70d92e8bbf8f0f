//! The per-packet authentication tag: AES-128-GCM used as a MAC over the
//! header and the payload, keyed per sender incarnation.
//!
//! ## Construction
//!
//! A datagram is `header (84 bytes) ‖ payload ‖ tag (16 bytes)`. Its tag is
//! the GCM tag of one AES-128-GCM encryption under the sender's packet key
//! `K` and the 96-bit nonce `N = 0x00000000 ‖ packet` (the header's 64-bit
//! packet number, big-endian), with
//!
//! - associated data `A` = the payload, and
//! - plaintext `P` = the header (84 bytes: five AES blocks and a partial
//!   sixth; versions 4–8 had 80 bytes, five blocks).
//!
//! The ciphertext `C = CTR_K(N, P)` is thrown away; the clear header is sent.
//! The receiver recomputes the same encryption over its copy of the received
//! header and payload, under the nonce the header carries, and compares the
//! tags in constant time ([`MacKey::check_parts`]). So the payload is
//! authenticated where it lies (the datapath sends it from an op buffer and
//! verifies it on the receive slot, never copying it to tag it), and only the
//! 84-byte header is copied, into a stack buffer.
//!
//! Why it is sound: GCM's tag is `GHASH_H(A, C) ⊕ AES_K(J0)`, and GCM is an
//! authenticated encryption scheme whose integrity covers both `A` and `C`:
//! no one without `K` can produce a new `(N, A, C, tag)` that verifies, as
//! long as the sender never uses a nonce twice under one key. For a fixed
//! `(K, N)`, `C` is a bijective, deterministic function of `P` (CTR mode), so
//! `(N, A, P) ↦ (N, A, C)` is injective: a forgery of this MAC — a new
//! `(N, A, P)` with a valid tag — is a new `(N, A, C)` with a valid tag, that
//! is, a GCM forgery. The receiver's recomputation is GCM decryption's tag
//! check done the other way round; it outputs only accept/reject. Nothing is
//! secret here, so confidentiality (the part of GCM a repeated nonce breaks
//! first) is not used, but integrity needs unique nonces too: two tags under
//! one `(K, N)` reveal the GHASH key `H` and allow forgeries. Hence the nonce
//! rules below. Cost: one GHASH pass over the payload plus seven AES blocks —
//! aws-lc's AES-NI/VAES + (V)PCLMULQDQ code, through aws-lc-rs's public
//! `aead::LessSafeKey` API.
//!
//! ## Keys and nonces: unique by construction
//!
//! - The job secret is extracted once: `PRK = HKDF-Extract(salt = KEY_SALT,
//!   IKM = secret)` (SHA-256), held by the [`JobKey`].
//! - Every endpoint incarnation has a 64-bit random **session**, drawn from
//!   the operating system when the daemon starts (tests fix it). Its packet
//!   key is `K = HKDF-Expand(PRK, info = KEY_INFO ‖ job ‖ rank ‖ session,
//!   16 bytes)` (integers big-endian: 4, 4 and 8 bytes): a different key per
//!   (job, sender rank, session). (Version 2 and 3 also put the sender's
//!   wall-clock generation in `info`; versions 4 and 5 have no generation on
//!   the wire, and each version names itself in the salt and info.)
//! - Every datagram carries the session and a **packet number**, the nonce,
//!   which the sender increments for every datagram it seals (a `u64`
//!   starting at 0: it cannot wrap in the life of any process).
//!
//! So a (key, nonce) pair repeats only if one sender incarnation repeats a
//! packet number — it never does — or if two incarnations of the same (job,
//! rank) draw the same session. Other ranks and other jobs have other keys by
//! the derivation's input. A restarted daemon draws a new session whatever its
//! configuration says; two of `n` incarnations of one (job, rank) share a
//! session with probability below `n² / 2⁶⁵`. Receivers derive each sender's
//! key from the header's fields (which the tag then covers) and keep a few per peer ([`KeyCache`]).
//!
//! Under `packet_auth = "none"` ([`PacketAuth::None`]) there is no key and no
//! tag: [`MacKey::tag_parts`] gives zeros, which are never sent.
//!
//! The measured cost of this MAC and of the alternatives is in the [wire
//! module docs](super#mac-cost-measured).
//!
//! [`KeyCache`]: crate::wire::KeyCache

use aws_lc_rs::{aead, hkdf};

use crate::wire::auth::PacketAuth;
use crate::wire::layout::{HEADER_LEN, TAG_LEN, be32, be64, field};

/// HKDF salt of the packet key schedule (public, fixed per wire version).
pub const KEY_SALT: &[u8] = b"dlcp wire v10 packet authentication";
/// Prefix of the HKDF info of a sender's packet key (see the module docs).
pub const KEY_INFO: &[u8] = b"dlcp v10 aes-128-gmac sender key";

/// Who sent a datagram: what a packet key is derived for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SenderId {
    /// Job id.
    pub job: u32,
    /// Sender rank.
    pub rank: u32,
    /// Sender session (random per incarnation).
    pub session: u64,
}

impl SenderId {
    /// The sender a raw header names (its first [`HEADER_LEN`] bytes).
    ///
    /// # Panics
    /// If `header` is shorter than [`HEADER_LEN`].
    pub fn of_header(header: &[u8]) -> SenderId {
        SenderId {
            job: be32(header, field::JOB),
            rank: be32(header, field::SRC),
            session: be64(header, field::SESSION),
        }
    }
}

/// A job's packet key schedule: the extracted job secret, from which every
/// sender's [`MacKey`] is derived (or nothing, under `packet_auth = "none"`).
#[derive(Clone)]
pub struct JobKey {
    prk: Option<hkdf::Prk>,
}

impl core::fmt::Debug for JobKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "JobKey({})", self.auth())
    }
}

impl JobKey {
    /// The key schedule of a job secret (any length; use ≥ 16 random bytes):
    /// datagrams are authenticated ([`PacketAuth::AesGmac`]).
    pub fn new(secret: &[u8]) -> JobKey {
        JobKey { prk: Some(hkdf::Salt::new(hkdf::HKDF_SHA256, KEY_SALT).extract(secret)) }
    }

    /// No key: datagrams carry no tag ([`PacketAuth::None`], `packet_auth = "none"`).
    pub fn unauthenticated() -> JobKey {
        JobKey { prk: None }
    }

    /// The packet authentication mode.
    pub fn auth(&self) -> PacketAuth {
        if self.prk.is_some() { PacketAuth::AesGmac } else { PacketAuth::None }
    }

    /// The packet key of sender `id` (an HKDF-Expand and an AES key schedule:
    /// about a microsecond; receivers cache them, see [`crate::wire::KeyCache`]).
    pub fn sender_key(&self, id: SenderId) -> MacKey {
        let key = self.prk.as_ref().map(|prk| {
            let (job, rank, session) =
                (id.job.to_be_bytes(), id.rank.to_be_bytes(), id.session.to_be_bytes());
            let info: [&[u8]; 4] = [KEY_INFO, &job, &rank, &session];
            let okm =
                prk.expand(&info, &aead::AES_128_GCM).expect("16 bytes is a valid HKDF-SHA256 output length");
            aead::LessSafeKey::new(aead::UnboundKey::from(okm))
        });
        MacKey { id, key }
    }

    /// The tag of a contiguous `header ‖ payload` under the key of the sender
    /// its header names (derived for this one call: for tests and tools).
    ///
    /// # Panics
    /// If `authenticated` is shorter than [`HEADER_LEN`].
    pub fn tag(&self, authenticated: &[u8]) -> [u8; TAG_LEN] {
        self.sender_key(SenderId::of_header(authenticated)).tag(authenticated)
    }
}

/// One sender incarnation's packet key (see the module docs).
pub struct MacKey {
    id: SenderId,
    key: Option<aead::LessSafeKey>,
}

impl core::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "MacKey({:?}, {})", self.id, self.auth())
    }
}

impl MacKey {
    /// The sender this key belongs to.
    pub fn id(&self) -> SenderId {
        self.id
    }

    /// The packet authentication mode.
    pub fn auth(&self) -> PacketAuth {
        if self.key.is_some() { PacketAuth::AesGmac } else { PacketAuth::None }
    }

    /// The tag of a contiguous datagram without its tag: its first
    /// [`HEADER_LEN`] bytes are the header, the rest the payload
    /// (`tag(d) == tag_parts(&d[..HEADER_LEN], &d[HEADER_LEN..])`).
    ///
    /// # Panics
    /// If `authenticated` is shorter than [`HEADER_LEN`] (and this is not a
    /// `packet_auth = "none"` key).
    pub fn tag(&self, authenticated: &[u8]) -> [u8; TAG_LEN] {
        if self.key.is_none() {
            return [0; TAG_LEN];
        }
        assert!(authenticated.len() >= HEADER_LEN, "a datagram starts with an {HEADER_LEN}-byte header");
        let (header, payload) = authenticated.split_at(HEADER_LEN);
        self.tag_parts(header, payload)
    }

    /// The tag of a datagram whose header and payload are not contiguous,
    /// exactly as if they were (`tag_parts(h, p) == tag(h ‖ p)`): the
    /// datapath sends the payload from where it lies, so nothing is copied to
    /// tag it. The nonce is the header's packet number. All zeros under
    /// `packet_auth = "none"` (nothing is sent then).
    ///
    /// # Panics
    /// If `header` is not [`HEADER_LEN`] bytes long (and this is not a
    /// `packet_auth = "none"` key).
    pub fn tag_parts(&self, header: &[u8], payload: &[u8]) -> [u8; TAG_LEN] {
        self.compute(header, payload).unwrap_or([0; TAG_LEN])
    }

    /// True if `got` is the tag of `header ‖ payload` ([`tag_parts`](Self::tag_parts)),
    /// compared in constant time. Never panics: a header of the wrong length
    /// fails. Under `packet_auth = "none"`, true iff `got` is empty.
    pub fn check_parts(&self, header: &[u8], payload: &[u8], got: &[u8]) -> bool {
        if self.key.is_none() {
            return got.is_empty();
        }
        header.len() == HEADER_LEN && self.compute(header, payload).is_some_and(|want| tags_equal(&want, got))
    }

    /// True if `got` is the tag of the contiguous `authenticated` bytes
    /// ([`tag`](Self::tag)), compared in constant time. Never panics.
    pub fn check(&self, authenticated: &[u8], got: &[u8]) -> bool {
        if authenticated.len() < HEADER_LEN {
            return self.key.is_none() && got.is_empty();
        }
        let (header, payload) = authenticated.split_at(HEADER_LEN);
        self.check_parts(header, payload, got)
    }

    /// The GCM tag with the payload as associated data and a copy of the
    /// header as plaintext; `None` without a key.
    fn compute(&self, header: &[u8], payload: &[u8]) -> Option<[u8; TAG_LEN]> {
        let key = self.key.as_ref()?;
        assert_eq!(header.len(), HEADER_LEN, "the tagged header is {HEADER_LEN} bytes");
        let mut nonce = [0u8; aead::NONCE_LEN];
        nonce[4..].copy_from_slice(&header[field::PACKET]);
        let mut block = [0u8; HEADER_LEN];
        block.copy_from_slice(header);
        let nonce = aead::Nonce::assume_unique_for_key(nonce);
        // Sealing fails only for inputs of 64 GiB and more: never for a datagram.
        let tag = key.seal_in_place_separate_tag(nonce, aead::Aad::from(payload), &mut block).ok()?;
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(tag.as_ref());
        Some(t)
    }
}

/// Constant-time equality of two tags (false if their lengths differ).
pub(crate) fn tags_equal(want: &[u8], got: &[u8]) -> bool {
    let diff = want.iter().zip(got).fold(0u8, |acc, (a, b)| acc | (a ^ b));
    want.len() == got.len() && diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(session: u64) -> SenderId {
        SenderId { job: 7, rank: 1, session }
    }

    /// A header naming `id`, with packet number `packet`.
    fn header(id: SenderId, packet: u64) -> [u8; HEADER_LEN] {
        let mut h = [0x5Au8; HEADER_LEN];
        h[field::JOB].copy_from_slice(&id.job.to_be_bytes());
        h[field::SRC].copy_from_slice(&id.rank.to_be_bytes());
        h[field::SESSION].copy_from_slice(&id.session.to_be_bytes());
        h[field::PACKET].copy_from_slice(&packet.to_be_bytes());
        h
    }

    #[test]
    fn tag_parts_equals_tag_of_the_concatenation() {
        let key = JobKey::new(b"parts").sender_key(id(1));
        let mut msg: Vec<u8> = header(id(1), 9).to_vec();
        msg.extend((0..3000u32).map(|i| (i * 7 + 1) as u8));
        let (h, p) = msg.split_at(HEADER_LEN);
        assert_eq!(key.tag_parts(h, p), key.tag(&msg));
        assert!(key.check_parts(h, p, &key.tag(&msg)) && key.check(&msg, &key.tag(&msg)));
        assert_eq!(
            JobKey::new(b"parts").tag(&msg),
            key.tag(&msg),
            "the job key derives the header's sender key"
        );
        assert_ne!(key.tag_parts(h, p), JobKey::new(b"other").sender_key(id(1)).tag(&msg));
    }

    #[test]
    fn every_input_of_the_key_and_the_nonce_changes_the_tag() {
        let jk = JobKey::new(b"inputs");
        let base = id(42);
        let variants =
            [SenderId { job: 8, ..base }, SenderId { rank: 2, ..base }, SenderId { session: 43, ..base }];
        let h = header(base, 5);
        let t = jk.sender_key(base).tag_parts(&h, b"payload");
        for v in variants {
            assert_ne!(jk.sender_key(v).tag_parts(&h, b"payload"), t, "{v:?}");
        }
        // The nonce: same key, another packet number.
        assert_ne!(jk.sender_key(base).tag_parts(&header(base, 6), b"payload"), t);
        // The payload and the header are both covered.
        assert_ne!(jk.sender_key(base).tag_parts(&h, b"paylaod"), t);
        let mut h2 = h;
        h2[40] ^= 1;
        assert_ne!(jk.sender_key(base).tag_parts(&h2, b"payload"), t);
        // A header of the wrong length never verifies (and does not panic).
        assert!(!jk.sender_key(base).check_parts(&h[..HEADER_LEN - 1], b"payload", &t));
        assert!(!jk.sender_key(base).check(&h[..10], &t));
    }

    #[test]
    fn unauthenticated_keys_make_no_tag() {
        let k = JobKey::unauthenticated().sender_key(id(1));
        assert_eq!(k.auth(), PacketAuth::None);
        assert_eq!(k.tag_parts(&header(id(1), 0), b"x"), [0; TAG_LEN]);
        assert!(k.check_parts(&header(id(1), 0), b"x", &[]));
        assert!(!k.check_parts(&header(id(1), 0), b"x", &[0; TAG_LEN]));
    }

    #[test]
    fn tags_equal_needs_every_byte_and_the_length() {
        let key = JobKey::new(b"tags_equal secret").sender_key(id(1));
        let h = header(id(1), 1);
        let t = key.tag_parts(&h, b"message");
        assert!(tags_equal(&t, &t));
        let mut u = t;
        u[TAG_LEN - 1] ^= 0x80;
        assert!(!tags_equal(&t, &u));
        assert!(!tags_equal(&t, &t[..TAG_LEN - 1]));
        assert!(key.check_parts(&h, b"message", &t) && !key.check_parts(&h, b"messagf", &t));
    }
}
