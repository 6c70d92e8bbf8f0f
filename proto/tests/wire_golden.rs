//! Golden byte vectors pinning the wire layout, one set per wire version.
//!
//! The version 10 vectors in `tests/golden/v10/*.hex` were produced by
//! `tests/golden/v10/gen.py`, which writes each field at the offset given by
//! the layout table in the `wire` module docs and computes the tag with
//! Python's `cryptography` (HKDF-SHA256, AES-128-GCM) — independently of the
//! Rust encoder. Each vector is checked both ways: `encode(header, payload)
//! == golden` and `decode(golden) == (header, payload)`.
//!
//! `probe_header_written_by_hand` and `f16_average_header_written_by_hand`
//! additionally spell headers out byte by byte from the table, so a wrong
//! offset in both the encoder and the generator would still be caught.
//!
//! The older versions' vectors are kept as they were: version 1
//! (`tests/golden/v1/`, keyed BLAKE3, 64-byte header), version 2
//! (`tests/golden/v2/`, AES-GMAC without flow control) and version 3
//! (`tests/golden/v3/`, flow control; a wall-clock generation in the header,
//! no run), version 4 (`tests/golden/v4/`, op identity; no failing DONE) and
//! version 5 (`tests/golden/v5/`, failing DONEs; f32 only, byte 15
//! reserved), version 6 (`tests/golden/v6/`, f16/bf16 and average;
//! allreduce only), version 7 (`tests/golden/v7/`, the other
//! collectives; no LAST DATA), version 8 (`tests/golden/v8/`, an 80-byte
//! header without `credit`) and version 9 (`tests/golden/v9/`, no ACK).
//! This build refuses every one of them with `UnsupportedVersion(1)` to
//! `(9)`, and still reads the sender rank they claim.

use dlcp_proto::class::Class;
use dlcp_proto::wire::{
    self, Collective, DType, FailReason, Flags, HEADER_LEN, Header, JobKey, KEY_INFO, KEY_SALT, OVERHEAD,
    Packet, PacketAuth, PacketType, Phase, ReduceOp, SETTINGS_LEN, SenderId, Settings, TAG_LEN, WireError,
};

/// The job secret every version 10 golden vector is tagged with (see `v10/gen.py`).
const SECRET: &[u8] = b"dlcp golden secret v10";

fn key() -> JobKey {
    JobKey::new(SECRET)
}

/// The version 1 vectors.
const V1: [&str; 8] =
    ["data", "data_repair_bf16", "probe", "bitmap", "bitmap_complete", "done", "done_mask_empty", "hello"];

/// The version 2 vectors: version 1's and one without authentication.
const V2: [&str; 9] = [
    "data",
    "data_repair_bf16",
    "data_auth_none",
    "probe",
    "bitmap",
    "bitmap_complete",
    "done",
    "done_mask_empty",
    "hello",
];

/// The version 3 vectors: version 2's and flow control's.
const V3: [&str; 11] = [
    "data",
    "data_repair_bf16",
    "data_auth_none",
    "probe",
    "bitmap",
    "bitmap_complete",
    "done",
    "done_mask_empty",
    "hello",
    "grant",
    "grant_request",
];

/// The version 4 vectors: version 3's and GOODBYE.
const V4: [&str; 12] = [
    "data",
    "data_repair_bf16",
    "data_auth_none",
    "probe",
    "bitmap",
    "bitmap_complete",
    "done",
    "done_mask_empty",
    "hello",
    "grant",
    "grant_request",
    "goodbye",
];

/// The version 5 vectors: version 4's and the failing DONEs.
const V5: [&str; 14] = [
    "data",
    "data_repair_bf16",
    "data_auth_none",
    "probe",
    "bitmap",
    "bitmap_complete",
    "done",
    "done_mask_empty",
    "done_failed",
    "done_failed_unknown",
    "hello",
    "grant",
    "grant_request",
    "goodbye",
];

/// The version 6 vectors: version 5's and the f16/bf16 and average ones.
const V6: [&str; 16] = [
    "data",
    "data_repair_bf16",
    "data_f16_average",
    "bitmap_bf16_average",
    "data_auth_none",
    "probe",
    "bitmap",
    "bitmap_complete",
    "done",
    "done_mask_empty",
    "done_failed",
    "done_failed_unknown",
    "hello",
    "grant",
    "grant_request",
    "goodbye",
];

/// The version 7 vectors: version 6's and the other collectives'.
const V7: [&str; 21] = [
    "data",
    "data_repair_bf16",
    "data_f16_average",
    "bitmap_bf16_average",
    "data_reduce_scatter_average",
    "data_allgather_f16",
    "data_broadcast_bf16",
    "probe_barrier",
    "done_allgather",
    "data_auth_none",
    "probe",
    "bitmap",
    "bitmap_complete",
    "done",
    "done_mask_empty",
    "done_failed",
    "done_failed_unknown",
    "hello",
    "grant",
    "grant_request",
    "goodbye",
];

/// The version 8 vectors: version 7's and the LAST DATA.
const V8: [&str; 22] = [
    "data",
    "data_repair_bf16",
    "data_f16_average",
    "bitmap_bf16_average",
    "data_reduce_scatter_average",
    "data_allgather_f16",
    "data_broadcast_bf16",
    "probe_barrier",
    "done_allgather",
    "data_last",
    "data_auth_none",
    "probe",
    "bitmap",
    "bitmap_complete",
    "done",
    "done_mask_empty",
    "done_failed",
    "done_failed_unknown",
    "hello",
    "grant",
    "grant_request",
    "goodbye",
];

/// The version 9 vectors: version 8's (the header grew by `credit`).
const V9: [&str; 22] = V8;

/// Parse a `.hex` golden file of this version: `#` comments and whitespace are ignored.
fn golden(name: &str) -> Vec<u8> {
    golden_of("v10", name)
}

/// Parse the `.hex` golden file `name` of version directory `version`.
fn golden_of(version: &str, name: &str) -> Vec<u8> {
    let path = format!("{}/tests/golden/{version}/{name}.hex", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let hex: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.chars())
        .filter(|c| !c.is_whitespace())
        .collect();
    unhex(&hex)
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn class(c: u8) -> Class {
    Class::new(c).unwrap()
}

/// Fields shared by the golden vectors (mirrors `COMMON` in `gen.py`).
fn common(ty: PacketType, class: Class, phase: Phase) -> Header {
    let mut h = Header::new(ty, class, phase);
    h.job = 0x0102_0304;
    h.run = 0x0A0B_0C0D_0E0F_1011;
    h.src = 1;
    h.dst = 2;
    h.op = 0x1122_3344_5566_7788;
    h.tensor = 0xCAFE_BABE;
    h.session = 0x5E55_10A0_B0C0_D0E0;
    h.chunk_count = 10;
    h.required = 4;
    h.budget_ppm = 10_000;
    h
}

/// Every golden vector: name, header (with `payload_len` set), payload.
fn vectors() -> Vec<(&'static str, Header, Vec<u8>)> {
    let mut v = Vec::new();

    let mut h = common(PacketType::Data, class(3), Phase::Scatter);
    h.chunk_index = 5;
    h.seq = 41;
    h.credit = 0x123;
    let payload: Vec<u8> = [1.0f32, -2.5].iter().flat_map(|x| x.to_le_bytes()).collect();
    v.push(("data", h, payload.clone()));

    let mut h = common(PacketType::Data, class(6), Phase::Gather);
    h.flags = Flags::REPAIR.with(Flags::REQUIRED);
    h.dtype = DType::Bf16;
    h.chunk_index = 9;
    h.required = 10;
    h.budget_ppm = 1_000_000;
    h.packet = 0xFFFF_FFFF_FFFF_FFFE;
    h.seq = u32::MAX;
    // bf16 little-endian: 1.0 = 0x3F80, -2.5 = 0xC020.
    v.push(("data_repair_bf16", h, vec![0x80, 0x3F, 0x20, 0xC0]));

    // f16 little-endian: 1.0 = 0x3C00, -2.5 = 0xC100, 65504 = 0x7BFF; an average.
    let mut h = common(PacketType::Data, class(2), Phase::Scatter);
    h.flags = Flags::REQUIRED;
    h.dtype = DType::F16;
    h.reduce = ReduceOp::Average;
    h.chunk_index = 3;
    h.required = 10;
    h.budget_ppm = 0;
    h.seq = 7;
    h.packet = 12;
    v.push(("data_f16_average", h, vec![0x00, 0x3C, 0x00, 0xC1, 0xFF, 0x7B]));

    // Control packets of an op carry its dtype and reduction too.
    let mut h = common(PacketType::Bitmap, Class::CONTROL, Phase::Gather);
    h.dtype = DType::Bf16;
    h.reduce = ReduceOp::Average;
    h.chunk_count = 4;
    h.required = 0;
    h.seq = 9;
    h.packet = 13;
    v.push(("bitmap_bf16_average", h, vec![0x0F]));

    // Version 7: the other collectives, each in the phase it has.
    let mut h = common(PacketType::Data, class(1), Phase::Scatter);
    h.flags = Flags::REQUIRED;
    h.reduce = ReduceOp::Average;
    h.collective = Collective::ReduceScatter;
    h.chunk_index = 2;
    h.required = 10;
    h.packet = 14;
    v.push(("data_reduce_scatter_average", h, payload.clone()));

    let mut h = common(PacketType::Data, class(4), Phase::Gather);
    h.dtype = DType::F16;
    h.collective = Collective::Allgather;
    h.chunk_index = 7;
    h.required = 0;
    h.packet = 15;
    v.push(("data_allgather_f16", h, vec![0x00, 0x3C, 0x00, 0xC1]));

    let mut h = common(PacketType::Data, class(0), Phase::Gather);
    h.flags = Flags::REQUIRED;
    h.dtype = DType::Bf16;
    h.collective = Collective::Broadcast;
    h.required = 10;
    h.budget_ppm = 0;
    h.packet = 16;
    v.push(("data_broadcast_bf16", h, vec![0x80, 0x3F, 0x20, 0xC0]));

    let mut h = common(PacketType::Probe, Class::CONTROL, Phase::Scatter);
    h.collective = Collective::Barrier;
    h.chunk_count = 1;
    h.required = 1;
    h.budget_ppm = 0;
    h.seq = 1;
    h.packet = 17;
    v.push(("probe_barrier", h, 1u64.to_be_bytes().to_vec()));

    let mut h = common(PacketType::Done, Class::CONTROL, Phase::Gather);
    h.collective = Collective::Allgather;
    h.required = 0;
    h.seq = 2;
    h.packet = 18;
    v.push(("done_allgather", h, vec![0x04]));

    // The last DATA of a first pass (version 8): LAST, REQUIRED, BACKLOG.
    let mut h = common(PacketType::Data, class(2), Phase::Scatter);
    h.flags = Flags::LAST.with(Flags::REQUIRED).with(Flags::BACKLOG);
    h.chunk_index = 9;
    h.seq = 0x1234_5678;
    h.packet = 17;
    h.credit = u32::MAX;
    v.push(("data_last", h, payload.clone()));

    let mut h = common(PacketType::Data, class(3), Phase::Scatter);
    h.chunk_index = 5;
    h.auth = PacketAuth::None;
    h.packet = 1;
    v.push(("data_auth_none", h, payload));

    let mut h = common(PacketType::Probe, Class::CONTROL, Phase::Gather);
    h.seq = 3;
    h.packet = 2;
    h.credit = 0x89AB_CDEF;
    v.push(("probe", h, 4242u64.to_be_bytes().to_vec()));

    let mut h = common(PacketType::Bitmap, Class::CONTROL, Phase::Scatter);
    h.chunk_index = 8;
    h.chunk_count = 20;
    h.seq = 2;
    h.packet = 3;
    v.push(("bitmap", h, vec![0xFF, 0x0F]));

    let mut h = common(PacketType::Bitmap, Class::CONTROL, Phase::Scatter);
    h.flags = Flags::COMPLETE;
    h.chunk_count = 20;
    h.seq = 4;
    h.packet = 4;
    h.credit = 1;
    v.push(("bitmap_complete", h, vec![]));

    let mut h = common(PacketType::Done, Class::CONTROL, Phase::Gather);
    h.seq = 5;
    h.packet = 5;
    v.push(("done", h, vec![0xF7, 0x03]));

    let mut h = common(PacketType::Done, Class::CONTROL, Phase::Gather);
    h.flags = Flags::MASK_EMPTY;
    h.seq = 6;
    h.packet = 6;
    v.push(("done_mask_empty", h, vec![]));

    let mut h = common(PacketType::Done, Class::CONTROL, Phase::Scatter);
    h.flags = Flags::FAILED;
    h.packet = 10;
    let mut reason = vec![0u8; wire::FAILURE_LEN];
    wire::emit_failure(FailReason::Timeout, &mut reason);
    v.push(("done_failed", h, reason));

    // A reason code no version defines yet (200): it reads as `Other`.
    let mut h = common(PacketType::Done, Class::CONTROL, Phase::Gather);
    h.flags = Flags::FAILED;
    h.chunk_count = 1;
    h.required = 0;
    h.budget_ppm = 0;
    h.packet = 11;
    v.push(("done_failed_unknown", h, vec![200]));

    let mut h = Header::new(PacketType::Hello, Class::CONTROL, Phase::None);
    h.job = 0x0102_0304;
    h.src = 3;
    h.dst = 0;
    h.seq = 77;
    h.session = 0xFEDC_BA98_7654_3210;
    h.packet = 7;
    let mut settings = vec![0u8; SETTINGS_LEN];
    Settings {
        version: 10,
        auth: PacketAuth::AesGmac,
        chunk_bytes: 1376,
        flow_window: 256,
        digest: 0x0123_4567_89AB_CDEF,
        generation: 0xFFFF_FFFE,
        run_flags: wire::RUN_FRESH,
        run_nonce: 0x1122_3344_5566_7789,
        run_echo: 0xC1C2_C3C4_C5C6_C7C9,
        challenge: 0xA1A2_A3A4_A5A6_A7A9,
        echo: 0xB1B2_B3B4_B5B6_B7B9,
    }
    .emit(&mut settings);
    v.push(("hello", h, settings));

    let mut h = Header::new(PacketType::Grant, Class::CONTROL, Phase::None);
    h.job = 0x0102_0304;
    h.src = 2;
    h.dst = 1;
    h.session = 0x5E55_20A0_B0C0_D0E0;
    h.packet = 8;
    h.credit = 0x40;
    let mut count = vec![0u8; wire::GRANT_LEN];
    wire::emit_grant(0x1_0000_0040, &mut count);
    v.push(("grant", h, count));

    let mut h = Header::new(PacketType::Grant, Class::CONTROL, Phase::None);
    h.flags = Flags::REQUEST;
    h.job = 0x0102_0304;
    h.src = 1;
    h.dst = 2;
    h.session = 0x5E55_10A0_B0C0_D0E0;
    h.packet = 9;
    let mut count = vec![0u8; wire::GRANT_LEN];
    wire::emit_grant(1000, &mut count);
    v.push(("grant_request", h, count));

    let mut h = Header::new(PacketType::Goodbye, Class::CONTROL, Phase::None);
    h.job = 0x0102_0304;
    h.src = 2;
    h.dst = 0;
    h.session = 0x5E55_20A0_B0C0_D0E0;
    h.packet = 0xFFFF_FFFF_FFFF_FFF0;
    v.push(("goodbye", h, vec![]));

    // Version 10: two ops' all-gathers acknowledged in one ACK.
    let mut h = Header::new(PacketType::Ack, Class::CONTROL, Phase::Gather);
    h.job = 0x0102_0304;
    h.run = 0x0A0B_0C0D_0E0F_1011;
    h.src = 2;
    h.dst = 1;
    h.chunk_count = 2;
    h.session = 0x5E55_20A0_B0C0_D0E0;
    h.packet = 19;
    h.credit = 0x80;
    let entries = [
        wire::AckEntry { op: 0x1122_3344_5566_7788, tensor: 0xCAFE_BABE, echo: 0x1234_5678, held_us: 25_000 },
        wire::AckEntry { op: 0x1122_3344_5566_7789, tensor: 0, echo: u32::MAX, held_us: u32::MAX },
    ];
    let mut payload = vec![0u8; 2 * wire::ACK_ENTRY_LEN];
    wire::emit_acks(&entries, &mut payload);
    v.push(("ack", h, payload));

    for (_, h, p) in &mut v {
        h.payload_len = p.len() as u16;
    }
    v
}

#[test]
fn every_packet_type_and_flag_is_covered() {
    let v = vectors();
    for ty in PacketType::ALL {
        assert!(v.iter().any(|(_, h, _)| h.ty == ty), "{ty:?} has no golden vector");
    }
    for f in [
        Flags::REPAIR,
        Flags::COMPLETE,
        Flags::MASK_EMPTY,
        Flags::REQUIRED,
        Flags::REQUEST,
        Flags::BACKLOG,
        Flags::FAILED,
        Flags::LAST,
    ] {
        assert!(v.iter().any(|(_, h, _)| h.flags.contains(f)), "{f:?} has no golden vector");
    }
    for a in [PacketAuth::None, PacketAuth::AesGmac] {
        assert!(v.iter().any(|(_, h, _)| h.auth == a), "{a:?} has no golden vector");
    }
    for d in DType::ALL {
        assert!(v.iter().any(|(_, h, _)| h.ty == PacketType::Data && h.dtype == d), "{d:?}: no DATA vector");
    }
    for r in ReduceOp::ALL {
        assert!(v.iter().any(|(_, h, _)| h.ty == PacketType::Data && h.reduce == r), "{r:?}: no DATA vector");
        assert!(v.iter().any(|(_, h, _)| h.ty.is_control() && h.reduce == r), "{r:?}: no control vector");
    }
}

/// The key of the golden vectors of `h.auth`'s mode.
fn key_of(h: &Header) -> JobKey {
    if h.auth == PacketAuth::None { JobKey::unauthenticated() } else { key() }
}

#[test]
fn encode_matches_golden() {
    for (name, h, payload) in vectors() {
        let want = golden(name);
        let mut buf = vec![0u8; want.len() + 7];
        let n = wire::encode(&key_of(&h), &h, &payload, &mut buf).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(n, want.len(), "{name}: length");
        assert_eq!(hex(&buf[..n]), hex(&want), "{name}: bytes");
        assert_eq!(n, h.packet_len(), "{name}: packet_len");

        // encode_in_place writes the same bytes.
        let mut buf2 = vec![0u8; n];
        let n2 = wire::encode_in_place(&key_of(&h), &h, &mut buf2, |p| p.copy_from_slice(&payload)).unwrap();
        assert_eq!(buf2[..n2], want[..], "{name}: encode_in_place");

        // Header::emit writes the first 80 bytes, MacKey::tag_parts the last 16
        // (from header and payload as separate slices, as the datapath holds them).
        let mut hb = [0u8; HEADER_LEN];
        h.emit(&mut hb).unwrap();
        assert_eq!(hb[..], want[..HEADER_LEN], "{name}: emit");
        if h.auth == PacketAuth::AesGmac {
            let sender = key().sender_key(h.sender());
            assert_eq!(sender.tag_parts(&hb, &payload)[..], want[n - TAG_LEN..], "{name}: tag_parts");
            assert_eq!(key().tag(&want[..n - TAG_LEN])[..], want[n - TAG_LEN..], "{name}: tag");
            // The sender's own key seals the same bytes.
            let mut buf3 = vec![0u8; n];
            wire::seal(&sender, &h, &mut buf3, |p| p.copy_from_slice(&payload)).unwrap();
            assert_eq!(buf3, want, "{name}: seal");
        } else {
            assert_eq!(n, HEADER_LEN + payload.len(), "{name}: no tag");
        }
    }
}

#[test]
fn decode_golden_gives_header() {
    for (name, h, payload) in vectors() {
        let bytes = golden(name);
        let (got, p) = wire::decode(&key_of(&h), &bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, h, "{name}: header");
        assert_eq!(p, &payload[..], "{name}: payload");

        // The zero-copy view agrees with the parsed header.
        let view = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(Header::parse(&view).unwrap(), h);
        assert_eq!(view.payload(), &payload[..]);
        let tag_len = h.auth.tag_len();
        assert_eq!(view.authenticated(), &bytes[..bytes.len() - tag_len]);
        assert_eq!(view.tag(), &bytes[bytes.len() - tag_len..]);
        view.verify(&key_of(&h).sender_key(SenderId::of_header(view.header()))).unwrap();
    }
}

/// Every datagram of an older version (1: keyed BLAKE3, 64-byte header; 2:
/// AES-GMAC without flow control; 3: flow control, a wall-clock generation,
/// no run; 4: the layout of this version without failing DONEs, another key
/// schedule; 5: byte 15 reserved, f32 only, another key schedule; 6: allreduce
/// only, another key schedule; 7: no LAST DATA, another key schedule) is refused
/// as such, before any cryptography, under any key, and still names the rank
/// that sent it.
#[test]
fn older_versions_vectors_are_refused() {
    for (version, names) in [
        (1u8, &V1[..]),
        (2, &V2[..]),
        (3, &V3[..]),
        (4, &V4[..]),
        (5, &V5[..]),
        (6, &V6[..]),
        (7, &V7[..]),
        (8, &V8[..]),
        (9, &V9[..]),
    ] {
        let own = JobKey::new(format!("dlcp golden secret v{version}").as_bytes());
        for name in names {
            let bytes = golden_of(&format!("v{version}"), name);
            assert_eq!(bytes[2], version, "v{version} {name}: a version {version} vector");
            for k in [key(), own.clone(), JobKey::unauthenticated()] {
                assert_eq!(
                    wire::decode(&k, &bytes),
                    Err(WireError::UnsupportedVersion(version)),
                    "v{version} {name}"
                );
            }
            let refused = Packet::new_checked(&bytes[..]).unwrap_err();
            assert_eq!(refused, WireError::UnsupportedVersion(version), "v{version} {name}");
            let src = match *name {
                "hello" => 3,
                "grant" | "goodbye" => 2,
                _ => 1,
            };
            assert_eq!(wire::peek_src(&bytes), Some(src), "v{version} {name}");
        }
    }
}

/// The HELLO payload reads back as gen.py wrote it.
#[test]
fn hello_settings_read_back() {
    let bytes = golden("hello");
    let (h, p) = wire::decode(&key(), &bytes).unwrap();
    let s = Settings::parse(p).unwrap();
    assert_eq!(
        (h.ty, h.run, s.generation, s.run_flags),
        (PacketType::Hello, 0, 0xFFFF_FFFE, wire::RUN_FRESH)
    );
    assert_eq!(
        (s.run_nonce, s.challenge, s.echo),
        (0x1122_3344_5566_7789, 0xA1A2_A3A4_A5A6_A7A9, 0xB1B2_B3B4_B5B6_B7B9)
    );
    assert_eq!(s.digest, 0x0123_4567_89AB_CDEF);
}

/// The GRANT payloads read back as the counts gen.py wrote.
#[test]
fn grant_counts_read_back() {
    for (name, want) in [("grant", 0x1_0000_0040u64), ("grant_request", 1000)] {
        let bytes = golden(name);
        let (h, p) = wire::decode(&key(), &bytes).unwrap();
        assert_eq!((h.ty, wire::parse_grant(p)), (PacketType::Grant, Some(want)), "{name}");
    }
    assert_eq!(wire::parse_grant(&[0; 7]), None);
}

/// The failing DONEs read back as gen.py wrote them: the reason it named, and
/// a code no version defines read as `Other`, not refused.
#[test]
fn failing_done_reasons_read_back() {
    for (name, code, want) in
        [("done_failed", 1u8, FailReason::Timeout), ("done_failed_unknown", 200, FailReason::Other)]
    {
        let bytes = golden(name);
        let (h, p) = wire::decode(&key(), &bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(h.ty == PacketType::Done && h.flags.contains(Flags::FAILED), "{name}");
        assert_eq!((p, wire::parse_failure(p)), (&[code][..], Some(want)), "{name}");
    }
}

#[test]
fn golden_rejected_under_another_key() {
    for (name, h, _) in vectors() {
        let bytes = golden(name);
        let want = match h.auth {
            PacketAuth::AesGmac => WireError::BadTag,
            PacketAuth::None => {
                WireError::AuthMismatch { ours: PacketAuth::AesGmac, theirs: PacketAuth::None }
            }
        };
        assert_eq!(wire::decode(&JobKey::new(b"dlcp golden secret v3"), &bytes), Err(want), "{name}");
    }
}

/// One header spelled out by hand from the layout table, field by field.
#[test]
fn probe_header_written_by_hand() {
    #[rustfmt::skip]
    let hand: [u8; HEADER_LEN] = [
        0xD1, 0xC9,             //  0 magic
        0x0A,                   //  2 version
        0x02,                   //  3 type = PROBE
        0x00,                   //  4 flags
        0x07,                   //  5 class = control
        0x02,                   //  6 phase = all-gather
        0x00,                   //  7 dtype = f32
        0x01, 0x02, 0x03, 0x04, //  8 job
        0x00, 0x08,             // 12 payload_len = 8 (the DATA count)
        0x01,                   // 14 auth = AES-128-GMAC
        0x00,                   // 15 kind = allreduce, sum
        0x00, 0x00, 0x00, 0x01, // 16 src
        0x00, 0x00, 0x00, 0x02, // 20 dst
        0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // 24 op
        0xCA, 0xFE, 0xBA, 0xBE, // 32 tensor
        0x00, 0x00, 0x00, 0x00, // 36 chunk_index
        0x00, 0x00, 0x00, 0x0A, // 40 chunk_count = 10
        0x00, 0x00, 0x00, 0x04, // 44 required = 4
        0x00, 0x00, 0x27, 0x10, // 48 budget_ppm = 10 000
        0x00, 0x00, 0x00, 0x03, // 52 seq = 3
        0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11, // 56 run
        0x5E, 0x55, 0x10, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, // 64 session
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, // 72 packet = 2
        0x89, 0xAB, 0xCD, 0xEF, // 80 credit (version 9)
    ];
    let g = golden("probe");
    assert_eq!(g.len(), OVERHEAD + wire::GRANT_LEN);
    assert_eq!(g[..HEADER_LEN], hand[..], "generator disagrees with the hand-written header");

    let (_, h, payload) = vectors().into_iter().find(|(n, _, _)| *n == "probe").unwrap();
    let mut buf = [0u8; OVERHEAD + wire::GRANT_LEN];
    wire::encode(&key(), &h, &payload, &mut buf).unwrap();
    assert_eq!(buf[..HEADER_LEN], hand[..], "encoder disagrees with the hand-written header");
}

/// The DATA vector's header, also by hand, checking the big-endian multi-byte
/// fields and that payload elements stay little-endian.
#[test]
fn data_packet_written_by_hand() {
    let mut hand = Vec::new();
    hand.extend_from_slice(&[0xD1, 0xC9, 10, 1, 0, 3, 1, 0]); // magic version DATA flags class3 scatter f32
    hand.extend_from_slice(&[1, 2, 3, 4, 0, 8, 1, 0]); // job payload_len auth kind (allreduce, sum)
    hand.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2]); // src dst
    hand.extend_from_slice(&[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]); // op
    hand.extend_from_slice(&[0xCA, 0xFE, 0xBA, 0xBE, 0, 0, 0, 5]); // tensor chunk_index
    hand.extend_from_slice(&[0, 0, 0, 10, 0, 0, 0, 4]); // chunk_count required
    hand.extend_from_slice(&[0, 0, 0x27, 0x10, 0, 0, 0, 41]); // budget_ppm seq (dseq 41)
    hand.extend_from_slice(&[0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11]); // run
    hand.extend_from_slice(&[0x5E, 0x55, 0x10, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0]); // session
    hand.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]); // packet = 0
    hand.extend_from_slice(&[0, 0, 0x01, 0x23]); // credit = 0x123 (version 9)
    hand.extend_from_slice(&[0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x20, 0xC0]); // 1.0f32, -2.5f32 LE
    assert_eq!(hand.len(), HEADER_LEN + 8);
    let g = golden("data");
    assert_eq!(g[..HEADER_LEN + 8], hand[..]);
}

/// The f16 average DATA vector's first 16 header bytes and its payload, by
/// hand: dtype 1 at offset 7, `kind` 0x01 (allreduce, average) at 15, and
/// 2-byte little-endian elements.
#[test]
fn f16_average_header_written_by_hand() {
    let mut hand = Vec::new();
    hand.extend_from_slice(&[0xD1, 0xC9, 10, 1, 0x08, 2, 1, 1]); // magic version DATA REQUIRED class2 scatter f16
    hand.extend_from_slice(&[1, 2, 3, 4, 0, 6, 1, 0x01]); // job payload_len auth kind (allreduce, average)
    let g = golden("data_f16_average");
    assert_eq!(g[..16], hand[..]);
    assert_eq!(g[HEADER_LEN..HEADER_LEN + 6], [0x00, 0x3C, 0x00, 0xC1, 0xFF, 0x7B]); // 1.0, -2.5, 65504 (f16 LE)
    let (h, p) = wire::decode(&key(), &g).unwrap();
    assert_eq!(
        (h.dtype, h.reduce, h.collective),
        (DType::F16, ReduceOp::Average, wire::Collective::Allreduce)
    );
    let mut x = [0f32; 3];
    dlcp_proto::elem::decode(h.dtype, p, &mut x);
    assert_eq!(x, [1.0, -2.5, 65504.0]);
}

/// The version 9 `credit` by hand: the last 4 bytes of the header,
/// big-endian, on a LAST DATA (all ones) and on a GRANT (0x40).
#[test]
fn credit_written_by_hand() {
    let g = golden("data_last");
    assert_eq!(g[80..84], [0xFF, 0xFF, 0xFF, 0xFF]);
    assert_eq!(wire::decode(&key(), &g).unwrap().0.credit, u32::MAX);
    let g = golden("grant");
    assert_eq!(g[80..84], [0, 0, 0, 0x40]);
    let (h, p) = wire::decode(&key(), &g).unwrap();
    assert_eq!((h.credit, wire::parse_grant(p)), (0x40, Some(0x1_0000_0040)));
}

/// The version 8 LAST flag by hand: bit 7 of a DATA's flags byte (here
/// with REQUIRED 0x08 and BACKLOG 0x20: 0xA8).
#[test]
fn last_flag_written_by_hand() {
    let g = golden("data_last");
    assert_eq!(g[..8], [0xD1, 0xC9, 10, 1, 0xA8, 2, 1, 0]); // magic version DATA flags class2 scatter f32
    let (h, _) = wire::decode(&key(), &g).unwrap();
    assert!(
        h.flags.contains(Flags::LAST)
            && h.flags.contains(Flags::REQUIRED)
            && !h.flags.contains(Flags::REPAIR)
    );
}

/// The `kind` bytes by hand (version 7 on): reduce-scatter with average is
/// 0x11, allgather 0x20, broadcast 0x30, barrier 0x40; each in its phase.
#[test]
fn collective_kind_bytes_written_by_hand() {
    for (name, phase, kind, collective) in [
        ("data_reduce_scatter_average", 1u8, 0x11u8, wire::Collective::ReduceScatter),
        ("data_allgather_f16", 2, 0x20, wire::Collective::Allgather),
        ("data_broadcast_bf16", 2, 0x30, wire::Collective::Broadcast),
        ("probe_barrier", 1, 0x40, wire::Collective::Barrier),
        ("done_allgather", 2, 0x20, wire::Collective::Allgather),
    ] {
        let g = golden(name);
        assert_eq!((g[2], g[6], g[15]), (10, phase, kind), "{name}: version, phase, kind");
        let (h, _) = wire::decode(&key(), &g).unwrap();
        assert_eq!(h.collective, collective, "{name}");
    }
}

/// The version 10 ACK by hand: type 8, phase 2, the run in the header,
/// `chunk_count` 2 entries of 20 bytes (op, tensor, echo, held), big-endian.
#[test]
fn ack_written_by_hand() {
    let g = golden("ack");
    assert_eq!(g[..8], [0xD1, 0xC9, 10, 8, 0, 7, 2, 0]); // magic version ACK flags class7 gather f32
    assert_eq!(g[12..16], [0, 40, 1, 0]); // payload_len auth kind
    assert_eq!(g[24..40], [0; 16]); // op, tensor, chunk_index: 0
    assert_eq!(g[40..44], [0, 0, 0, 2]); // chunk_count = entries
    assert_eq!(g[44..56], [0; 12]); // required, budget_ppm, seq: 0
    assert_eq!(g[56..64], [0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11]); // run
    let entry = [
        0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // op
        0xCA, 0xFE, 0xBA, 0xBE, // tensor
        0x12, 0x34, 0x56, 0x78, // echo
        0x00, 0x00, 0x61, 0xA8, // held = 25 000 µs
    ];
    assert_eq!(g[HEADER_LEN..HEADER_LEN + 20], entry);
    let (h, p) = wire::decode(&key(), &g).unwrap();
    let es: Vec<_> = wire::parse_acks(p).collect();
    assert_eq!((h.ty, h.chunk_count, es.len()), (PacketType::Ack, 2, 2));
    assert_eq!(
        (es[1].op, es[1].tensor, es[1].echo, es[1].held_us),
        (0x1122_3344_5566_7789, 0, u32::MAX, u32::MAX)
    );
}

/// The key schedule is pinned too: HKDF salt and info, then AES-128-GCM.
#[test]
fn key_schedule_is_pinned() {
    assert_eq!(KEY_SALT, b"dlcp wire v10 packet authentication");
    assert_eq!(KEY_INFO, b"dlcp v10 aes-128-gmac sender key");
    // The probe vector's tag, computed by gen.py with Python's cryptography.
    let g = golden("probe");
    let n = HEADER_LEN + wire::GRANT_LEN;
    assert_eq!(hex(&g[n..]), "76872f622ade3470faa7ce88b295acbd");
    assert_eq!(hex(&key().tag(&g[..n])), "76872f622ade3470faa7ce88b295acbd");
    assert_ne!(JobKey::new(b"").tag(&g[..n]), key().tag(&g[..n]));
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
