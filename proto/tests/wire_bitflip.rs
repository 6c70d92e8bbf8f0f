//! Single-bit corruption anywhere in a datagram is always rejected.
//!
//! Flipping one bit of magic, version, auth or payload_len fails the structural
//! check in `Packet::new_checked` (before the MAC); every other bit — the rest
//! of the header (the session and packet number included), the payload and the
//! tag itself — fails the MAC with `BadTag`. No flip may ever decode.

use dlcp_proto::class::Class;
use dlcp_proto::wire::{self, Flags, HEADER_LEN, Header, JobKey, PacketType, Phase, WireError};

fn key() -> JobKey {
    JobKey::new(b"bit flip secret")
}

fn data_packet() -> Vec<u8> {
    let mut h = Header::new(PacketType::Data, Class::new(2).unwrap(), Phase::Scatter);
    h.job = 11;
    h.run = 3;
    h.src = 4;
    h.dst = 5;
    h.op = 99;
    h.tensor = 7;
    h.chunk_index = 1;
    h.chunk_count = 3;
    h.required = 1;
    h.budget_ppm = 5000;
    h.session = 0x1234_5678_9ABC_DEF0;
    h.packet = 41;
    let payload: Vec<u8> = (0..64u32).flat_map(|i| (i as f32 * 0.25).to_le_bytes()).collect();
    let mut buf = vec![0u8; 2048];
    let n = wire::encode(&key(), &h, &payload, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn bitmap_packet() -> Vec<u8> {
    let mut h = Header::new(PacketType::Bitmap, Class::CONTROL, Phase::Gather);
    h.job = 11;
    h.src = 5;
    h.dst = 4;
    h.op = 99;
    h.chunk_index = 16;
    h.chunk_count = 40;
    h.seq = 1;
    let mut buf = vec![0u8; 256];
    let n = wire::encode(&key(), &h, &[0xA5, 0x5A, 0xFF], &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn control_packet_no_payload() -> Vec<u8> {
    let mut h = Header::new(PacketType::Done, Class::CONTROL, Phase::Gather);
    h.flags = Flags::MASK_EMPTY;
    h.job = 11;
    h.src = 5;
    h.dst = 4;
    h.op = 99;
    h.chunk_count = 40;
    let mut buf = vec![0u8; 256];
    let n = wire::encode(&key(), &h, &[], &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// What a flip of a bit in byte `i` must produce.
fn expected(i: usize, flipped: &[u8]) -> WireError {
    match i {
        0 | 1 => WireError::BadMagic(u16::from_be_bytes([flipped[0], flipped[1]])),
        2 => WireError::UnsupportedVersion(flipped[2]),
        // auth 1 → 0 drops the tag from the expected length; anything else is no mode.
        14 if flipped[14] > 1 => WireError::UnknownAuth(flipped[14]),
        12..=14 => WireError::LengthMismatch {
            declared: usize::from(u16::from_be_bytes([flipped[12], flipped[13]])),
            actual: flipped.len(),
        },
        _ => WireError::BadTag,
    }
}

fn check_every_bit(name: &str, pkt: &[u8]) {
    let k = key();
    assert!(wire::decode(&k, pkt).is_ok(), "{name}: the unmodified packet must decode");
    let mut counts = [0usize; 2]; // [structural, BadTag]
    for i in 0..pkt.len() {
        for bit in 0..8 {
            let mut m = pkt.to_vec();
            m[i] ^= 1 << bit;
            let got = wire::decode(&k, &m);
            let want = expected(i, &m);
            assert_eq!(got, Err(want), "{name}: flip of byte {i} bit {bit}");
            counts[usize::from(want == WireError::BadTag)] += 1;
        }
    }
    // 6 header bytes (magic, version, payload_len, auth) fail structurally; the rest by MAC.
    assert_eq!(counts[0], 6 * 8, "{name}");
    assert_eq!(counts[1], (pkt.len() - 6) * 8, "{name}");
}

#[test]
fn every_single_bit_flip_fails_data() {
    check_every_bit("data", &data_packet());
}

#[test]
fn every_single_bit_flip_fails_bitmap() {
    check_every_bit("bitmap", &bitmap_packet());
}

#[test]
fn every_single_bit_flip_fails_control_without_payload() {
    check_every_bit("done", &control_packet_no_payload());
}

/// Two-bit flips (a cheap sample: every pair inside the header) never decode either.
#[test]
fn double_bit_flips_in_header_fail() {
    let k = key();
    let pkt = bitmap_packet();
    for a in 0..HEADER_LEN * 8 {
        for b in (a + 1..HEADER_LEN * 8).step_by(7) {
            let mut m = pkt.clone();
            m[a / 8] ^= 1 << (a % 8);
            m[b / 8] ^= 1 << (b % 8);
            assert!(wire::decode(&k, &m).is_err(), "bits {a} and {b}");
        }
    }
}

/// Truncating or extending a valid datagram by any amount never decodes.
#[test]
fn length_changes_fail() {
    let k = key();
    let pkt = data_packet();
    for n in 0..pkt.len() {
        assert!(wire::decode(&k, &pkt[..n]).is_err(), "truncated to {n}");
    }
    for extra in 1..64 {
        let mut m = pkt.clone();
        m.resize(pkt.len() + extra, 0);
        assert!(matches!(wire::decode(&k, &m), Err(WireError::LengthMismatch { .. })), "extended by {extra}");
    }
}
