//! The per-packet authentication tag: keyed BLAKE3 truncated to [`TAG_LEN`]
//! bytes, one message at a time ([`MacKey::tag`]) or many at once
//! ([`MacKey::tag_many`]). See the [wire module docs](super) for the measured
//! cost.

/// Length of the authentication tag.
pub const TAG_LEN: usize = 16;

/// Per-job authentication key.
///
/// Derived from the job secret with BLAKE3's key derivation, then used as a
/// BLAKE3 key: `tag = BLAKE3-keyed(key, header ‖ payload)[..16]`.
#[derive(Clone)]
pub struct MacKey {
    key: [u8; 32],
}

impl core::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("MacKey(..)")
    }
}

/// Domain-separation context for deriving packet keys from a job secret.
pub const KEY_CONTEXT: &str = "dlcp v1 2026-11 packet authentication";

impl MacKey {
    /// Derive the packet key from a job secret (any length; use ≥ 16 random bytes).
    pub fn derive(secret: &[u8]) -> MacKey {
        MacKey { key: blake3::derive_key(KEY_CONTEXT, secret) }
    }

    /// Compute the tag over `authenticated` bytes.
    pub fn tag(&self, authenticated: &[u8]) -> [u8; TAG_LEN] {
        let h = blake3::keyed_hash(&self.key, authenticated);
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&h.as_bytes()[..TAG_LEN]);
        t
    }

    /// The tag of a datagram whose authenticated bytes are not contiguous:
    /// `header` then `payload`, exactly as if they were one slice
    /// (`tag_parts(h, p) == tag(h ‖ p)`). The datapath sends the payload from
    /// where it lies (an op buffer, an arena), so nothing is copied to tag it.
    pub fn tag_parts(&self, header: &[u8], payload: &[u8]) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(header);
        h.update(payload);
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
        t
    }

    /// The tags of many messages: `out[i] == self.tag(msgs[i])` for every `i`
    /// (same keyed BLAKE3, same bytes), computed several messages at a time.
    ///
    /// A message of an MTU-sized datagram spans two BLAKE3 chunks, which
    /// [`tag`](Self::tag) compresses one 64-byte block after the other (24
    /// serial compressions). Here the blocks of *different* messages of one
    /// length go through the SIMD lanes together (BLAKE3's `hash_many`, 16
    /// lanes with AVX-512): only each message's last block and the root parent
    /// node are compressed alone. Messages of 1 KiB or less, or above 2 KiB,
    /// take the plain path. `blake3::platform` is the crate's hidden,
    /// unstable API: the version is pinned by Cargo.lock, and the tests check
    /// equality with [`blake3::keyed_hash`] over every length (a change of
    /// that API fails to compile or fails those tests, never silently).
    ///
    /// # Panics
    /// If `out` is shorter than `msgs`.
    pub fn tag_many(&self, msgs: &[&[u8]], out: &mut [[u8; TAG_LEN]]) {
        assert!(out.len() >= msgs.len(), "tag_many: {} outputs for {} messages", out.len(), msgs.len());
        const CHUNK: usize = blake3::CHUNK_LEN;
        let mut batch: Vec<usize> = Vec::new();
        for (i, m) in msgs.iter().enumerate() {
            if m.len() > CHUNK && m.len() <= 2 * CHUNK {
                batch.push(i);
            } else {
                out[i] = self.tag(m);
            }
        }
        if batch.is_empty() {
            return;
        }
        // Equal lengths together (usually one or two lengths per batch).
        batch.sort_by_key(|&i| msgs[i].len());
        let platform = blake3::platform::Platform::detect();
        let key = blake3::platform::words_from_le_bytes_32(&self.key);
        let mut start = 0;
        while start < batch.len() {
            let len = msgs[batch[start]].len();
            let end = start + batch[start..].iter().take_while(|&&i| msgs[i].len() == len).count();
            for group in batch[start..end].chunks(MAX_TAG_GROUP) {
                tag_group(platform, &key, msgs, group, len, out);
            }
            start = end;
        }
    }

    /// True if `got` is the tag `self.tag` gives `authenticated`, compared in
    /// constant time.
    pub fn check(&self, authenticated: &[u8], got: &[u8]) -> bool {
        tags_equal(&self.tag(authenticated), got)
    }
}

/// Messages per `hash_many` call in [`MacKey::tag_many`].
const MAX_TAG_GROUP: usize = 32;

/// BLAKE3 domain flags (the specification's values).
const B3_CHUNK_START: u8 = 1 << 0;
const B3_CHUNK_END: u8 = 1 << 1;
const B3_PARENT: u8 = 1 << 2;
const B3_ROOT: u8 = 1 << 3;
const B3_KEYED_HASH: u8 = 1 << 4;

/// Keyed BLAKE3 tags of `msgs[i]` for `i` in `group`, all of length `len`
/// with `CHUNK_LEN < len <= 2 * CHUNK_LEN`: chunk 0 of every message in
/// parallel, chunk 1 up to its last block in parallel, then per message the
/// last block of chunk 1 and the root parent node.
fn tag_group(
    platform: blake3::platform::Platform,
    key: &[u32; 8],
    msgs: &[&[u8]],
    group: &[usize],
    len: usize,
    out: &mut [[u8; TAG_LEN]],
) {
    use blake3::IncrementCounter::No;
    use blake3::platform::{le_bytes_from_words_32, words_from_le_bytes_32};
    const CHUNK: usize = blake3::CHUNK_LEN;
    const BLOCK: usize = blake3::BLOCK_LEN;
    let k = group.len();
    let mut cv0 = [0u8; MAX_TAG_GROUP * 32];
    let mut cv1 = [0u8; MAX_TAG_GROUP * 32];
    let firsts: Vec<&[u8; CHUNK]> =
        group.iter().map(|&i| msgs[i][..CHUNK].try_into().expect("len > CHUNK_LEN")).collect();
    platform.hash_many(&firsts, key, 0, No, B3_KEYED_HASH, B3_CHUNK_START, B3_CHUNK_END, &mut cv0[..32 * k]);
    // Chunk 1: `full` whole blocks before its last (possibly partial) block.
    let rest = len - CHUNK;
    let full = rest.div_ceil(BLOCK) - 1;
    macro_rules! prefix {
        ($($n:literal)*) => {
            match full {
                0 => {
                    for j in 0..k {
                        cv1[32 * j..32 * j + 32].copy_from_slice(&le_bytes_from_words_32(key));
                    }
                }
                $($n => {
                    let ins: Vec<&[u8; $n * BLOCK]> = group
                        .iter()
                        .map(|&i| msgs[i][CHUNK..CHUNK + $n * BLOCK].try_into().expect("prefix length"))
                        .collect();
                    platform.hash_many(&ins, key, 1, No, B3_KEYED_HASH, B3_CHUNK_START, 0, &mut cv1[..32 * k]);
                })*
                _ => unreachable!("chunk 1 has at most 15 blocks before its last"),
            }
        };
    }
    prefix!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    let last_len = rest - full * BLOCK;
    let last_flags = B3_KEYED_HASH | B3_CHUNK_END | if full == 0 { B3_CHUNK_START } else { 0 };
    for (j, &i) in group.iter().enumerate() {
        let mut block = [0u8; BLOCK];
        block[..last_len].copy_from_slice(&msgs[i][CHUNK + full * BLOCK..]);
        let mut cv = words_from_le_bytes_32(cv1[32 * j..32 * j + 32].try_into().expect("32 bytes"));
        platform.compress_in_place(&mut cv, &block, last_len as u8, 1, last_flags);
        let mut parent = [0u8; BLOCK];
        parent[..32].copy_from_slice(&cv0[32 * j..32 * j + 32]);
        parent[32..].copy_from_slice(&le_bytes_from_words_32(&cv));
        let mut root = *key;
        platform.compress_in_place(&mut root, &parent, BLOCK as u8, 0, B3_KEYED_HASH | B3_PARENT | B3_ROOT);
        out[i].copy_from_slice(&le_bytes_from_words_32(&root)[..TAG_LEN]);
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

    #[test]
    fn tag_many_equals_tag_for_every_length() {
        let k = MacKey::derive(b"tag_many secret");
        let mut x = 0x1234_5678_9abc_def0u64;
        let data: Vec<u8> = (0..2100 * 3)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        // Every length around and inside the batched range, a few messages of
        // each length (different contents), mixed in one call.
        let mut msgs: Vec<&[u8]> = Vec::new();
        for len in (0..80).chain(1000..=2100) {
            for m in 0..3 {
                let off = (len * 7 + m * 911) % (data.len() - len);
                msgs.push(&data[off..off + len]);
            }
        }
        let mut out = vec![[0u8; TAG_LEN]; msgs.len()];
        k.tag_many(&msgs, &mut out);
        for (m, t) in msgs.iter().zip(&out) {
            assert_eq!(*t, k.tag(m), "length {}", m.len());
        }
        // Larger groups than one hash_many call, all of one length.
        let same: Vec<&[u8]> = (0..70).map(|i| &data[i * 13..i * 13 + 1456]).collect();
        let mut out = vec![[0u8; TAG_LEN]; same.len()];
        k.tag_many(&same, &mut out);
        for (m, t) in same.iter().zip(&out) {
            assert_eq!(*t, k.tag(m));
        }
    }

    #[test]
    fn tag_parts_equals_tag_of_the_concatenation() {
        let key = MacKey::derive(b"parts");
        let msg: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
        for split in [0, 1, 63, 64, 65, 1024, 1500, 2999, 3000] {
            assert_eq!(key.tag_parts(&msg[..split], &msg[split..]), key.tag(&msg), "split at {split}");
        }
        assert_ne!(key.tag_parts(&msg[..64], &msg[64..]), MacKey::derive(b"other").tag(&msg));
    }

    #[test]
    fn tags_equal_needs_every_byte_and_the_length() {
        let key = MacKey::derive(b"tags_equal secret");
        let t = key.tag(b"message");
        assert!(tags_equal(&t, &t));
        let mut u = t;
        u[TAG_LEN - 1] ^= 0x80;
        assert!(!tags_equal(&t, &u));
        assert!(!tags_equal(&t, &t[..TAG_LEN - 1]));
        assert!(key.check(b"message", &t) && !key.check(b"messagf", &t));
    }
}
