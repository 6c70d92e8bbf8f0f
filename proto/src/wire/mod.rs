//! Wire format: zero-copy packet views and parsed representations.
//!
//! Every dlcp datagram is `header (84 bytes) || payload (payload_len bytes) || tag (16 bytes)`.
//! The header is fixed-width and big-endian; the tag is AES-128-GCM used as a
//! MAC over header and payload ([`MacKey`]), keyed per sender incarnation by a
//! key derived from the per-job secret ([`JobKey`]); the construction, why it
//! is sound and why its nonces never repeat are in the docs of
//! `proto/src/wire/mac.rs`. Under `packet_auth = "none"` (the `auth` byte
//! is 0) the tag is absent. Every packet is placeable on its own: it names its
//! job, the sender's session, the run, op, tensor, phase and chunk
//! it belongs to.
//!
//! ## Header layout (version 10)
//!
//! | offset | size | field          | meaning                                                             |
//! |-------:|-----:|----------------|---------------------------------------------------------------------|
//! | 0      | 2    | `magic`        | `0xD1C9`                                                            |
//! | 2      | 1    | `version`      | `10`                                                                |
//! | 3      | 1    | `type`         | 1 DATA, 2 PROBE, 3 BITMAP, 4 DONE, 5 HELLO, 6 GRANT, 7 GOODBYE, 8 ACK (version 10) |
//! | 4      | 1    | `flags`        | bit 0 REPAIR, bit 1 COMPLETE, bit 2 MASK_EMPTY, bit 3 REQUIRED, bit 4 REQUEST, bit 5 BACKLOG, bit 6 FAILED, bit 7 LAST |
//! | 5      | 1    | `class`        | priority class 0–7 (7 = control)                                    |
//! | 6      | 1    | `phase`        | 0 none (HELLO, GRANT, GOODBYE), 1 reduce-scatter, 2 all-gather (ACK: always 2) |
//! | 7      | 1    | `dtype`        | 0 f32, 1 f16, 2 bf16: the op's element type, and so of DATA payloads (version 6: every op packet carries its op's; 0 on HELLO, GRANT, GOODBYE and ACK) |
//! | 8      | 4    | `job`          | job id                                                              |
//! | 12     | 2    | `payload_len`  | bytes of payload that follow the header                             |
//! | 14     | 1    | `auth`         | packet authentication: 0 none (no tag), 1 AES-128-GMAC (16-byte tag) |
//! | 15     | 1    | `kind`         | bits 0–3 the op's reduction ([`ReduceOp`]: 0 sum, 1 average; sum for a collective that does not reduce), bits 4–7 its collective ([`Collective`]: 0 allreduce, 1 reduce-scatter, 2 allgather, 3 broadcast, 4 barrier (version 7); 5–15 refused); a packet's phase is one its collective has; 0 on HELLO, GRANT, GOODBYE and ACK (version 6: allreduce only; versions 4–5: reserved, zero) |
//! | 16     | 4    | `src`          | sender rank                                                         |
//! | 20     | 4    | `dst`          | destination rank                                                    |
//! | 24     | 8    | `op`           | op sequence number (0 on an ACK, whose entries name their ops)      |
//! | 32     | 4    | `tensor`       | tensor id                                                           |
//! | 36     | 4    | `chunk_index`  | DATA: chunk; PROBE: last chunk sent before it; BITMAP/DONE: first bit of the segment |
//! | 40     | 4    | `chunk_count`  | chunks in the transfer; ACK: its entries (1–64)                      |
//! | 44     | 4    | `required`     | chunks of non-droppable classes in the transfer                     |
//! | 48     | 4    | `budget_ppm`   | loss budget of the transfer, parts per million (≤ 1 000 000); on a BITMAP, the budget its receiver holds the transfer to |
//! | 52     | 4    | `seq`          | DATA: the pair's data sequence number `dseq` (low 32 bits, [`crate::flow`]); PROBE/DONE round number; BITMAP: the round of the PROBE it answers, or the `seq` of the LAST DATA it answers; HELLO: heartbeat counter; GRANT, GOODBYE 0 |
//! | 56     | 8    | `run`          | the run the op belongs to, agreed by the job's daemons ([`crate::run`]); ACK: the run of every entry; 0 on HELLO, GRANT, GOODBYE |
//! | 64     | 8    | `session`      | sender's session, random per endpoint incarnation                   |
//! | 72     | 8    | `packet`       | sender's packet number, strictly increasing per datagram (the nonce) |
//! | 80     | 4    | `credit`       | flow control's credit for the destination, on every packet but HELLO and GOODBYE (which carry 0): the low 32 bits of the cumulative limit below which the destination may number its DATA to this sender ([`crate::flow`]); 0 carries none (version 9) |
//! | 84     | n    | payload        | DATA: elements, little-endian; BITMAP/DONE: bitmap segment; DONE with FAILED: a one-byte reason ([`FailReason`], `wire/failure.rs`); HELLO: [`Settings`]; GRANT and PROBE: a count ([`GRANT_LEN`] bytes, `wire/grant.rs`); GOODBYE: none; ACK: 20 bytes per entry ([`AckEntry`], `wire/ack.rs`) |
//! | 84 + n | 16   | tag            | GCM tag, payload as associated data, header as plaintext (absent if `auth` is 0) |
//!
//! ## Versions
//!
//! | version | what changed | why |
//! |--------:|--------------|-----|
//! | 10 | packet type 8 ACK (receiver to owner, phase 2, class 7, `run` set, `op`/`tensor` 0, `chunk_count` entries of 20 bytes: op, tensor, the echoed `seq` of the DATA that completed the transfer, µs held; [`AckEntry`]); an exact all-gather receiver acknowledges in it every op it completed within the ACK delay (25 ms by default) instead of one COMPLETE BITMAP per op, and the owner delivers its result before the ACKs arrive (it keeps a copy of its shard for repairs until they do); the key schedule names version 10 ([`KEY_SALT`], [`KEY_INFO`]); header layout unchanged | issue 16: after version 9 the COMPLETE report was 1.0 of the 1.04 control packets per peer per op at 1,024 ranks (1 MB: one DATA each way per phase, so 34% of all packets were control); the issue asks for ≤ 10%, fewer than 0.25 per peer per op, which only control covering many ops reaches. A version 9 peer would have refused every ACK as an unknown type and probed for its reports |
//! | 9 | the header grows to 84 bytes: `credit` at offset 80 carries, on every packet but HELLO and GOODBYE, the cumulative DATA limit its sender grants the destination (low 32 bits; a GRANT's payload still carries all 64); the payload starts at 84; the key schedule names version 9 ([`KEY_SALT`], [`KEY_INFO`]) | issue 16: the receiver's credit went only in GRANT packets, 1.4 to 1.9 per peer and op at 64 ranks (1 MB): half of a clean network's control after version 8. In a collective every pair of ranks sends each other DATA in both directions, so the credit now rides on those, and a receiver can give it by need (the chunks it waits for, contributions before results) at no cost in packets: at 64 ranks GRANTs fall from 2.0 to 0.6 per peer and op, control from 10.0% to 5.6% of packets, and a clean op takes 1.89 instead of 2.67 ms. 4 bytes more per datagram (0.27% of a 1,472-byte one) |
//! | 8 | DATA flag LAST (bit 7): the last DATA of its sender's first pass of a transfer, on which the receiver decides as on a PROBE (closes within budget, or NACKs with a BITMAP); a BITMAP (or an all-gather COMPLETE report) answering a LAST DATA echoes its `seq`, a round-trip sample; the key schedule names version 8 ([`KEY_SALT`], [`KEY_INFO`]); header layout unchanged | issue 16: every (peer, phase) transfer cost two PROBEs and a DONE or BITMAP each way, so control grew with the peers (29% of packets at 64 ranks, 63% at 256, 1 MB). Now a transfer ends on its last DATA, a reduce-scatter transfer of a collective with an all-gather is acknowledged by the owner's all-gather, and a PROBE goes out only when an answer is overdue ([`crate::transfer`]). A version 7 peer would have refused every LAST DATA as malformed |
//! | 7 | the collective nibble of `kind` names four more collectives: 1 reduce-scatter, 2 allgather, 3 broadcast, 4 barrier; a packet whose phase its collective does not have (a reduce-scatter or barrier packet of the all-gather, an allgather packet of the reduce-scatter) is malformed, and so is a reduction other than sum on one that does not reduce; a packet of an op whose collective differs from the op's at its receiver is refused and counted (`op_kind_mismatch`, as for dtype and reduction); the key schedule names version 7; the layout is version 6's | issue 18: broadcast of parameters from a root, allgather and reduce-scatter (the two halves of the transpose allreduce, exposed) and a barrier. A rank that ran another collective under the same op id would otherwise read an allgather's shard as a contribution to sum, or wait for a phase its peer never sends; a version 6 peer would have read the new values as an unknown collective per packet instead of being refused once, at HELLO |
//! | 6 | the `dtype` byte is meaningful: f16 and bf16 ops are reduced (elements of 2 bytes, so a chunk holds twice the elements of an f32 one); byte 15, reserved before, is `kind`: the op's reduction (sum, average) in its low four bits and its collective (0 allreduce, the only one defined) in its high four; every op packet carries its op's dtype and kind, HELLO, GRANT and GOODBYE carry 0 in both; a packet of an op (DATA or control) with another dtype or reduction than the op has at its receiver is refused and counted (`op_kind_mismatch`); the key schedule names version 6 | issue 18: allreduce of bfloat16 and float16 gradients, averaged by the daemon. Each owner accumulates its shard in f32 and rounds once to the op's dtype (after the division, for average) before the all-gather, which carries the rounded values, so every rank holds the same bytes; a rank whose op disagreed about the dtype or the reduction would otherwise read another rank's payload in the wrong format or divide a different shard differently, silently. The collective nibble is where broadcast, allgather, reduce-scatter and barrier go, without another layout change |
//! | 5 | DONE flag FAILED (bit 6): "the sender failed this op", its payload a one-byte reason code ([`FailReason`]: timeout, deadline, peer left, peer incompatible, peer failed, other; unknown codes read as other); the key schedule names version 5 ([`KEY_SALT`], [`KEY_INFO`]); header layout unchanged | a rank that failed an op (hard timeout, op deadline, a peer that left) dropped the op's later packets as stale and the other ranks learnt nothing: they probed it at the capped backoff until their own hard timeout (fuzz finding 3: 7,782 PROBEs in 200 ms). Now it answers a PROBE, BITMAP or DATA of the op with a failing DONE, and the prober fails the op at once, naming it |
//! | 4 | op identity: no generation in the header, `run` at 56, GOODBYE, a 56-byte HELLO (below) | issue 15: incarnations and runs agreed, not wall-clock |
//! | 3 | flow control: GRANT, BACKLOG, `dseq`, a PROBE's DATA count (below) | issue 16 |
//!
//! Version 9 datagrams (a HELLO included) are refused as
//! `UnsupportedVersion(9)`, and the endpoint reports such a peer as
//! incompatible, naming both versions; so are versions 1–8.
//!
//! Version 9 differed from version 10 by: no ACK type (an exact all-gather
//! receiver answered each op with a COMPLETE BITMAP at once) and its key
//! schedule's version 9 strings.
//!
//! Version 8 differed from version 9 by: an 80-byte header without
//! `credit` (the payload at offset 80), credit only in GRANTs, and its key
//! schedule's version 8 strings.
//!
//! Version 7 differed from version 8 by: no LAST flag (bit 7 of a DATA's
//! flags refused), every transfer ending in PROBEs answered by DONE or
//! BITMAP, and its key schedule's version 7 strings.
//!
//! Version 6 differed from version 7 by: allreduce the only collective (the
//! collective nibble 1–15 refused) and its key schedule's version 6 strings.
//!
//! Version 5 differed from version 6 by: the `dtype` byte reserved for
//! f16/bf16 but only f32 reduced (a DATA of another dtype was dropped), byte
//! 15 reserved (zero), and its key schedule's version 5 strings.
//!
//! Version 4 differed from version 3 by op identity (issue 15): the sender's
//! wall-clock `generation` (offset 12 in versions 2–3) is gone — an
//! incarnation is its random session, verified by a HELLO challenge — so
//! `payload_len` and `auth` move to offsets 12 and 14 and a 64-bit `run` takes
//! offsets 56–63; type 7 GOODBYE announces a shutdown; the HELLO payload grows
//! to 56 bytes (settings digest, generation for people, run announcement and
//! echo, incarnation challenge and echo; [`Settings`]); a BITMAP's
//! `budget_ppm` is the budget its receiver applies; the key schedule drops the
//! generation and names version 4 ([`KEY_SALT`], [`KEY_INFO`]). Version 3
//! datagrams are refused as `UnsupportedVersion(3)`.
//!
//! Version 3 added flow control to version 2 (issue 16): the GRANT type with
//! its REQUEST flag, DATA's BACKLOG flag and `dseq`, a PROBE's count of the
//! DATA its sender sent.
//!
//! Offsets 0–11 and 16–23 are those of every earlier version, so a datagram
//! of any version is recognised, attributed to its sender ([`peek_src`]) and
//! refused with [`WireError::UnsupportedVersion`].
//!
//! Payload elements are little-endian IEEE 754 binary32 or binary16, or
//! bfloat16 (the byte order of every host dlcp targets, so an f32 receive is a
//! plain copy); header fields are big-endian.
//!
//! Decoding never panics and never allocates: [`Packet::new_checked`] validates
//! lengths and the fixed fields, [`Packet::verify`] the tag, and [`Header::parse`]
//! every enumerated field, returning a typed [`WireError`] for each malformed input.
//!
//! ## Validation order
//!
//! [`decode`] (and [`KeyCache::decode`]) check, in this order:
//!
//! 1. structure, before any cryptography: length ≥ [`STABLE_PREFIX`]
//!    ([`WireError::Truncated`]), magic ([`WireError::BadMagic`]), version
//!    ([`WireError::UnsupportedVersion`]), length ≥ [`HEADER_LEN`]
//!    ([`WireError::Truncated`]), `auth` ([`WireError::UnknownAuth`]),
//!    `84 + payload_len + tag length == datagram length`
//!    ([`WireError::LengthMismatch`]);
//! 2. the packet authentication mode: the datagram's `auth` must be the
//!    receiver's ([`WireError::AuthMismatch`], naming both);
//! 3. the tag ([`WireError::BadTag`]), with the key of the sender the header
//!    names: nothing past this point is looked at unless the sender holds the
//!    job secret;
//! 4. fields: type, flag bits, class, phase, dtype, `kind` (collective, then reduction), then the
//!    per-type rules of [`Header::check`] (the same rules [`Header::emit`]
//!    enforces), then a HELLO's [`Settings`] (known values, zero reserved
//!    bytes, the header's version and `auth`).
//!
//! So a single flipped bit anywhere in an authenticated datagram is always
//! rejected: in magic, version, `auth` or `payload_len` by step 1, everywhere
//! else (header, payload, tag) by step 3.
//!
//! ## Per-type rules ([`Header::check`])
//!
//! - `src != dst`; `budget_ppm ≤ 1 000 000`;
//! - class 7 exactly for control packets, 0–6 for DATA;
//! - phase 0 and run 0 exactly for HELLO, GRANT and GOODBYE, phase 1 or 2 for every other type;
//! - dtype 0 (f32) and `kind` 0 on HELLO, GRANT and GOODBYE (`BadField("dtype")`, `BadField("kind")`);
//! - `credit` 0 on HELLO and GOODBYE (`BadField("credit")`);
//! - flags: DATA may carry REPAIR, REQUIRED, BACKLOG and LAST, BITMAP COMPLETE, DONE MASK_EMPTY or FAILED (not both),
//!   GRANT REQUEST, PROBE, HELLO, GOODBYE and ACK none;
//! - ACK (version 10): phase 2, dtype 0 and `kind` 0, `op` and `tensor` 0
//!   (`BadField("op")`), `chunk_index`, `required`, `budget_ppm` and `seq` 0,
//!   `chunk_count` 1 to [`MAX_ACKS`] and exactly [`ACK_ENTRY_LEN`] payload
//!   bytes per entry;
//! - every type but HELLO, GRANT and GOODBYE: `chunk_count ≥ 1`, `required ≤ chunk_count`;
//! - DATA: `chunk_index < chunk_count`, payload non-empty and a whole number of
//!   `dtype` elements;
//! - DONE with FAILED: exactly [`FAILURE_LEN`] (1) byte of payload, the
//!   reason code (any value: unknown codes read as `Other`), and
//!   `chunk_index` 0;
//! - other BITMAP/DONE: a payload iff neither COMPLETE nor MASK_EMPTY is set;
//!   `chunk_index` (the segment's first bit) is a multiple of 8, and with a
//!   payload it is `< chunk_count` and the segment ends at the byte holding bit
//!   `chunk_count - 1` (`payload_len ≤ ⌈(chunk_count − chunk_index) / 8⌉`, which
//!   is what [`crate::bitmap::Bitmap::write_segment`] produces);
//! - PROBE and GRANT: a payload of exactly [`GRANT_LEN`] bytes; HELLO:
//!   exactly [`SETTINGS_LEN`] bytes; GOODBYE: none.
//!
//! ## Canonical form
//!
//! Every header bit is either a field or required to be zero, so the wire form
//! is canonical: a datagram that decodes re-encodes, from the decoded header and
//! payload, to exactly the same bytes. The tests and the fuzz targets assert this.
//!
//! ## How the format is pinned
//!
//! - `proto/tests/wire_golden.rs` + `proto/tests/golden/v8/*.hex`: exact bytes
//!   for every packet type and flag, every dtype, reduction and collective
//!   and both `auth` modes, generated independently of this encoder
//!   (`golden/v8/gen.py`: Python's `cryptography` HKDF and AES-GCM) and
//!   headers written out by hand; `golden/v1/` to `golden/v7/`, the older
//!   versions' vectors, are refused with `UnsupportedVersion(1)` to `(7)`;
//! - `proto/tests/wire_bitflip.rs`: every single-bit flip is rejected;
//! - `proto/tests/wire_errors.rs`: the input that produces each [`WireError`];
//! - `proto/tests/wire_proptest.rs`: round trip and never-panic properties;
//! - `fuzz/` (cargo-fuzz, `decode` and `decode_tagged`), whose corpus
//!   `proto/tests/wire_fuzz_corpus.rs` replays in a plain `cargo test`.
//!
//! Changing the layout, the key schedule ([`KEY_SALT`], [`KEY_INFO`]) or the
//! MAC breaks the golden vectors: bump [`VERSION`], add a vector set for the
//! new version (`tests/golden/vN/`, from its own independent generator) and
//! keep the older sets, which must then be refused as `UnsupportedVersion`.
//!
//! ## MAC cost (measured)
//!
//! `cargo bench -p dlcp-proto --bench mac`: one thread on the 2-vCPU AMD EPYC
//! development VM (AES-NI, VAES, (V)PCLMULQDQ, SHA-NI, no AVX-512; 32 MiB L3),
//! shared with other builds (load 3–4); working set 64 MiB of datagrams per
//! size (twice the last-level cache), each datagram given as header + payload
//! slices; GB/s of whole datagrams and time per datagram, ranges over three
//! runs:
//!
//! | MAC (16-byte tag), one datagram at a time | 1472 B: tag / verify | 8972 B: tag / verify |
//! |---|---:|---:|
//! | **AES-128-GCM as a MAC, aws-lc-rs (dlcp's [`MacKey`])** | **3.9–4.4 / 4.1–4.3 GB/s (≈ 340 ns)** | **5.6–6.1 / 5.7–6.3 GB/s (≈ 1.5 µs)** |
//! | AES-128-GCM-SIV, fixed nonce, aws-lc-rs | 3.5–3.7 / 3.6 GB/s (≈ 410 ns) | 4.9–5.2 / 4.1–4.9 GB/s (≈ 1.8 µs) |
//! | ChaCha20-Poly1305 as a MAC, aws-lc-rs | 2.2 / 2.1–2.2 GB/s | 2.3–2.7 / 2.2–2.7 GB/s |
//! | AES-128-GCM as a MAC, ring | 1.7 / 1.7 GB/s | 1.2–1.7 / 1.2–1.7 GB/s |
//! | AES-128-GCM as a MAC, RustCrypto `aes-gcm` | 1.4 / 1.1–1.4 GB/s | 1.4–1.5 / 1.4 GB/s |
//! | HMAC-SHA256/128, aws-lc-rs (SHA-NI) | 1.2 / 1.2 GB/s | 1.4 / 1.4 GB/s |
//! | keyed BLAKE3, `blake3` public API (the version 1 MAC) | 0.8 / 0.7–0.8 GB/s (≈ 1.8 µs) | 1.2–1.3 / 1.3 GB/s (≈ 7 µs) |
//! | keyed BLAKE3, 64 per call (version 1's `tag_many`, hidden API; before its removal) | 2.7 GB/s | 1.6–2.0 GB/s |
//! | AES-128-CMAC, aws-lc-rs | 0.8–0.9 / 0.7–0.9 GB/s | 0.6–0.9 / 0.6–0.9 GB/s |
//! | whole datagram: `wire::seal` (header, payload copy, tag) / `KeyCache::decode` | 3.6–4.3 / 3.6–3.8 GB/s | 5.9 / 5.8 GB/s |
//! | `memcpy` of the datagram (reference) | 7–13 GB/s | 8–14 GB/s |
//! | kernel UDP send on loopback, one thread (reference) | 0.35–0.49 GB/s (3.0–4.2 µs) | 1.4–2.4 GB/s (3.7–6.5 µs) |
//!
//! AES-128-GCM through aws-lc-rs is the fastest standard MAC here: 5× keyed
//! BLAKE3 one at a time at 1472 bytes and 4.5× at 8972 (1.6× and 3× the old
//! batched BLAKE3), 2.5–3.5× the same construction in ring or RustCrypto,
//! and about 20% faster than
//! AES-128-GCM-SIV with a fixed nonce, the nonce-misuse-resistant
//! alternative (median of seven interleaved runs of the two: 1.21× at both
//! sizes). Being nonce-based, it needs unique nonces, which the key schedule
//! guarantees by construction (`wire/mac.rs`). Tag plus verify on one core
//! now runs at 4.3–4.6× the kernel's UDP send rate at 1472 bytes and 1.2–1.3×
//! at 8972 bytes; keyed BLAKE3 ran at 0.8× and 0.3×.

mod ack;
mod auth;
mod codec;
mod error;
mod failure;
mod grant;
mod header;
mod keys;
mod layout;
mod mac;
mod packet;
mod settings;
mod types;

pub use ack::{ACK_ENTRY_LEN, AckEntry, MAX_ACKS, emit_acks, parse_acks};
pub use auth::PacketAuth;
pub use codec::{decode, encode, encode_in_place, peek_class, peek_src, seal};
pub use error::WireError;
pub use failure::{FAILURE_LEN, FailReason, emit_failure, parse_failure};
pub use grant::{GRANT_LEN, emit_grant, parse_grant};
pub use header::Header;
pub use keys::{KEYS_PER_PEER, KeyCache};
pub use layout::{HEADER_LEN, MAGIC, MAX_PAYLOAD, OVERHEAD, PPM, STABLE_PREFIX, TAG_LEN, VERSION};
pub use mac::{JobKey, KEY_INFO, KEY_SALT, MacKey, SenderId};
pub use packet::Packet;
pub use settings::{RUN_FRESH, SETTINGS_LEN, Settings};
pub use types::{Collective, DType, Flags, PacketType, Phase, ReduceOp};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::class::Class;
    use layout::field;

    fn key() -> JobKey {
        JobKey::new(b"test secret")
    }

    #[test]
    fn peek_reads_class_and_src_of_damaged_datagrams_only_when_the_header_is_there() {
        let mut buf = [0u8; 2048];
        let n = encode(&key(), &data_header(), &[1, 2, 3, 4], &mut buf).unwrap();
        let d = &mut buf[..n];
        assert_eq!((peek_class(d), peek_src(d)), (Class::new(3), Some(1)));
        d[field::VERSION] = 8; // unsupported version: still attributable
        d[n - 1] ^= 1; // and a bad tag
        assert!(decode(&key(), d).is_err());
        assert_eq!((peek_class(d), peek_src(d)), (Class::new(3), Some(1)));
        // As far as the prefix every version shares (a version 8 header is
        // shorter than this version's).
        let p = STABLE_PREFIX;
        assert_eq!((peek_class(&d[..p]), peek_src(&d[..p])), (Class::new(3), Some(1)));
        assert_eq!((peek_class(&d[..p - 1]), peek_src(&d[..p - 1])), (None, None));
        assert_eq!(decode(&key(), &d[..p]), Err(WireError::UnsupportedVersion(8)));
        d[field::VERSION] = VERSION;
        assert_eq!(decode(&key(), &d[..HEADER_LEN - 1]), Err(WireError::Truncated { len: HEADER_LEN - 1 }));
        d[field::CLASS] = 8;
        assert_eq!((peek_class(d), peek_src(d)), (None, Some(1)));
        d[0] = 0;
        assert_eq!((peek_class(d), peek_src(d)), (None, None));
    }

    fn data_header() -> Header {
        let mut h = Header::new(PacketType::Data, Class::new(3).unwrap(), Phase::Scatter);
        h.job = 7;
        h.run = 2;
        h.src = 1;
        h.dst = 2;
        h.op = 42;
        h.tensor = 9;
        h.chunk_index = 5;
        h.chunk_count = 10;
        h.required = 4;
        h.budget_ppm = 10_000;
        h.session = 0x0123_4567_89AB_CDEF;
        h.packet = 77;
        h
    }

    #[test]
    fn round_trip() {
        let payload = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let mut buf = [0u8; 256];
        let n = encode(&key(), &data_header(), &payload, &mut buf).unwrap();
        assert_eq!(n, OVERHEAD + 8);
        let (h, p) = decode(&key(), &buf[..n]).unwrap();
        assert_eq!(p, payload);
        assert_eq!(h, Header { payload_len: 8, ..data_header() });
    }

    #[test]
    fn round_trip_without_authentication() {
        let none = JobKey::unauthenticated();
        let h = Header { auth: PacketAuth::None, ..data_header() };
        let mut buf = [0u8; 256];
        let n = encode(&none, &h, &[9; 8], &mut buf).unwrap();
        assert_eq!(n, HEADER_LEN + 8, "no tag");
        assert_eq!(decode(&none, &buf[..n]).unwrap(), (Header { payload_len: 8, ..h }, &[9u8; 8][..]));
        // Each mode refuses the other's datagrams, naming both.
        let (ours, theirs) = (PacketAuth::AesGmac, PacketAuth::None);
        assert_eq!(decode(&key(), &buf[..n]), Err(WireError::AuthMismatch { ours, theirs }));
        let n = encode(&key(), &data_header(), &[9; 8], &mut buf).unwrap();
        let (ours, theirs) = (theirs, ours);
        assert_eq!(decode(&none, &buf[..n]), Err(WireError::AuthMismatch { ours, theirs }));
        // A header of one mode with a key of the other is refused.
        assert_eq!(encode(&none, &data_header(), &[9; 8], &mut buf), Err(WireError::KeyMismatch));
    }

    #[test]
    fn seal_needs_the_key_of_the_sender_the_header_names() {
        let h = Header { payload_len: 4, ..data_header() };
        let mut buf = [0u8; 256];
        let own = key().sender_key(h.sender());
        let n = seal(&own, &h, &mut buf, |p| p.fill(3)).unwrap();
        assert!(decode(&key(), &buf[..n]).is_ok());
        for other in [Header { session: 1, ..h }, Header { job: 9, ..h }, Header { src: 0, dst: 2, ..h }] {
            assert_eq!(seal(&own, &other, &mut buf, |_| {}), Err(WireError::KeyMismatch), "{other:?}");
        }
    }

    #[test]
    fn wrong_key_rejected() {
        let mut buf = [0u8; 256];
        let n = encode(&key(), &data_header(), &[0; 4], &mut buf).unwrap();
        assert_eq!(decode(&JobKey::new(b"other"), &buf[..n]), Err(WireError::BadTag));
    }
}
