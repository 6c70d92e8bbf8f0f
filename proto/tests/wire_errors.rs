//! One test per `WireError` variant, each with the malformed input that produces it.
//!
//! Errors detected after the MAC (type, flags, class, phase, dtype, reserved,
//! field ranges) are reached by editing raw header bytes and then re-computing
//! a valid tag with `JobKey::tag`, exactly as a peer holding the job key could.

use dlcp_proto::class::Class;
use dlcp_proto::wire::{
    self, DType, Flags, HEADER_LEN, Header, JobKey, MAX_PAYLOAD, OVERHEAD, PPM, Packet, PacketAuth,
    PacketType, Phase, SETTINGS_LEN, Settings, TAG_LEN, WireError,
};

fn key() -> JobKey {
    JobKey::new(b"typed error secret")
}

/// A valid header of each type.
fn header(ty: PacketType) -> Header {
    let (class, phase) = match ty {
        PacketType::Data => (Class::new(4).unwrap(), Phase::Gather),
        PacketType::Hello | PacketType::Grant | PacketType::Goodbye => (Class::CONTROL, Phase::None),
        PacketType::Ack => (Class::CONTROL, Phase::Gather),
        _ => (Class::CONTROL, Phase::Scatter),
    };
    let mut h = Header::new(ty, class, phase);
    h.job = 1;
    h.run = if ty.is_phaseless() { 0 } else { 1 };
    h.src = 0;
    h.dst = 1;
    h.op = 5;
    h.tensor = 2;
    h.chunk_count = 16;
    h.required = 8;
    h.budget_ppm = 10_000;
    if matches!(ty, PacketType::Probe | PacketType::Grant) {
        h.payload_len = wire::GRANT_LEN as u16;
    }
    if ty == PacketType::Ack {
        (h.op, h.tensor, h.chunk_count, h.required, h.budget_ppm) = (0, 0, 1, 0, 0);
    }
    h
}

fn payload_for(ty: PacketType) -> Vec<u8> {
    match ty {
        PacketType::Data => vec![0; 16],
        PacketType::Bitmap | PacketType::Done => vec![0xFF, 0x00],
        PacketType::Hello => settings(),
        PacketType::Grant | PacketType::Probe => vec![0, 0, 0, 0, 0, 0, 1, 0],
        PacketType::Goodbye => vec![],
        PacketType::Ack => vec![0; wire::ACK_ENTRY_LEN],
    }
}

/// A HELLO's valid settings.
fn settings() -> Vec<u8> {
    let mut b = vec![0u8; SETTINGS_LEN];
    Settings { version: wire::VERSION, auth: PacketAuth::AesGmac, chunk_bytes: 1376, ..Settings::default() }
        .emit(&mut b);
    b
}

fn encoded(ty: PacketType) -> Vec<u8> {
    let mut buf = vec![0u8; 256];
    let n = wire::encode(&key(), &header(ty), &payload_for(ty), &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// Replace the tag with a correct one for the (edited) header and payload.
fn retag(mut b: Vec<u8>) -> Vec<u8> {
    let n = b.len();
    let t = key().tag(&b[..n - TAG_LEN]);
    b[n - TAG_LEN..].copy_from_slice(&t);
    b
}

/// Edit `pkt` with `f`, re-tag it and decode it.
fn decode_edited(ty: PacketType, f: impl FnOnce(&mut Vec<u8>)) -> Result<Header, WireError> {
    let mut b = encoded(ty);
    f(&mut b);
    let b = retag(b);
    wire::decode(&key(), &b).map(|(h, _)| h)
}

/// A datagram built from raw header bytes and payload, re-tagged.
fn raw(header: &[u8; HEADER_LEN], payload: &[u8]) -> Vec<u8> {
    let mut b = header.to_vec();
    b.extend_from_slice(payload);
    b.extend_from_slice(&[0; TAG_LEN]);
    retag(b)
}

fn set_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

const ALL_TYPES: [PacketType; 8] = PacketType::ALL;

/// An ACK (version 10): phase 2, no op, dtype or kind of its own, its entry
/// count in `chunk_count` (1 to 64) and 20 bytes per entry.
#[test]
fn bad_ack() {
    let mut out = vec![0u8; 2048];
    let h = header(PacketType::Ack);
    let enc = |h: &Header, n: usize, out: &mut Vec<u8>| wire::encode(&key(), h, &vec![0; n], out).map(|_| ());
    assert_eq!(enc(&h, 20, &mut out), Ok(()));
    for (n, len) in [(1u32, 19usize), (1, 21), (2, 20), (0, 0), (65, 65 * 20)] {
        let e = enc(&Header { chunk_count: n, ..h }, len, &mut out);
        assert!(e.is_err(), "{n} entries in {len} bytes: {e:?}");
    }
    assert_eq!(enc(&Header { chunk_count: 64, ..h }, 64 * 20, &mut out), Ok(()));
    assert_eq!(enc(&Header { op: 1, ..h }, 20, &mut out), Err(WireError::BadField("op")));
    assert_eq!(enc(&Header { tensor: 1, ..h }, 20, &mut out), Err(WireError::BadField("op")));
    assert_eq!(enc(&Header { dtype: DType::Bf16, ..h }, 20, &mut out), Err(WireError::BadField("dtype")));
    assert_eq!(enc(&Header { seq: 1, ..h }, 20, &mut out), Err(WireError::BadField("chunk_index")));
    assert_eq!(enc(&Header { phase: Phase::Scatter, ..h }, 20, &mut out), Err(WireError::BadPhase(1)));
    assert_eq!(enc(&Header { flags: Flags::COMPLETE, ..h }, 20, &mut out), Err(WireError::BadFlags(2)));
    assert_eq!(decode_edited(PacketType::Ack, |b| b[6] = 0), Err(WireError::BadPhase(0)));
}

/// A GRANT's payload is exactly 8 bytes, and its phase is none.
#[test]
fn bad_grant() {
    let mut h = header(PacketType::Grant);
    let mut out = vec![0u8; 256];
    for len in [0usize, 7, 9, 16] {
        h.payload_len = len as u16;
        assert_eq!(
            wire::encode(&key(), &h, &vec![0; len], &mut out),
            Err(WireError::BadField("payload_len")),
            "{len} bytes"
        );
    }
    assert_eq!(decode_edited(PacketType::Grant, |b| b[6] = 1), Err(WireError::BadPhase(1)));
    assert!(decode_edited(PacketType::Grant, |b| b[4] = 0x10).is_ok(), "a credit request");
}

#[test]
fn baseline_packets_are_valid() {
    for ty in ALL_TYPES {
        assert!(decode_edited(ty, |_| {}).is_ok(), "{ty:?}");
    }
}

#[test]
fn truncated() {
    let pkt = encoded(PacketType::Probe);
    for n in 0..HEADER_LEN {
        assert_eq!(wire::decode(&key(), &pkt[..n]), Err(WireError::Truncated { len: n }));
        assert_eq!(Packet::new_checked(&pkt[..n]).unwrap_err(), WireError::Truncated { len: n });
    }
    assert_eq!(wire::decode(&key(), &[]), Err(WireError::Truncated { len: 0 }));
    // A whole header with a partial payload or tag: the declared length is
    // short of it.
    for n in HEADER_LEN..OVERHEAD + wire::GRANT_LEN {
        assert_eq!(
            wire::decode(&key(), &pkt[..n]),
            Err(WireError::LengthMismatch { declared: wire::GRANT_LEN, actual: n })
        );
    }
}

#[test]
fn length_mismatch() {
    // DATA declares 16 payload bytes; cut 4 of them (tag recomputed, but the
    // length check runs before the MAC anyway).
    let mut b = encoded(PacketType::Data);
    b.drain(HEADER_LEN..HEADER_LEN + 4);
    let b = retag(b);
    assert_eq!(
        wire::decode(&key(), &b),
        Err(WireError::LengthMismatch { declared: 16, actual: OVERHEAD + 12 })
    );
    // A PROBE that claims 1 byte of payload where it carries 8.
    let mut b = encoded(PacketType::Probe);
    b[12..14].copy_from_slice(&1u16.to_be_bytes());
    let actual = OVERHEAD + wire::GRANT_LEN;
    assert_eq!(wire::decode(&key(), &b), Err(WireError::LengthMismatch { declared: 1, actual }));
    // Declared length at the maximum, datagram much shorter: no out-of-range read.
    b[12..14].copy_from_slice(&u16::MAX.to_be_bytes());
    assert_eq!(wire::decode(&key(), &b), Err(WireError::LengthMismatch { declared: MAX_PAYLOAD, actual }));
}

#[test]
fn bad_magic() {
    let mut b = encoded(PacketType::Hello);
    b[0] = 0x45; // an IPv4 header, say
    b[1] = 0x00;
    assert_eq!(wire::decode(&key(), &retag(b)), Err(WireError::BadMagic(0x4500)));
}

#[test]
fn unsupported_version() {
    for v in [0u8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 255] {
        let r = decode_edited(PacketType::Hello, |b| b[2] = v);
        assert_eq!(r, Err(WireError::UnsupportedVersion(v)));
    }
}

#[test]
fn unknown_auth() {
    // The auth byte decides the length, so it is checked before the tag.
    for a in [2u8, 3, 0x80, 255] {
        assert_eq!(decode_edited(PacketType::Probe, |b| b[14] = a), Err(WireError::UnknownAuth(a)), "{a}");
    }
}

#[test]
fn auth_mismatch() {
    // A datagram without a tag reaching an authenticating receiver, and the
    // other way round: refused naming both modes, before any tag is looked at.
    let none = JobKey::unauthenticated();
    let h = Header { auth: PacketAuth::None, ..header(PacketType::Data) };
    let mut b = vec![0u8; 256];
    let n = wire::encode(&none, &h, &[0; 16], &mut b).unwrap();
    let (gmac, plain) = (PacketAuth::AesGmac, PacketAuth::None);
    assert_eq!(wire::decode(&key(), &b[..n]), Err(WireError::AuthMismatch { ours: gmac, theirs: plain }));
    assert_eq!(
        WireError::AuthMismatch { ours: gmac, theirs: plain }.to_string(),
        "datagram sent with packet_auth = \"none\"; this receiver has packet_auth = \"aes-128-gmac\""
    );
    let b = encoded(PacketType::Data);
    assert_eq!(wire::decode(&none, &b), Err(WireError::AuthMismatch { ours: plain, theirs: gmac }));
}

#[test]
fn key_mismatch() {
    // Encoding only: a header of the other mode than the key, or a sender's
    // own key used for another sender's header.
    let h = header(PacketType::Probe);
    let count = payload_for(PacketType::Probe);
    let mut b = vec![0u8; 256];
    assert_eq!(wire::encode(&JobKey::unauthenticated(), &h, &count, &mut b), Err(WireError::KeyMismatch));
    let none = Header { auth: PacketAuth::None, ..h };
    assert_eq!(wire::encode(&key(), &none, &count, &mut b), Err(WireError::KeyMismatch));
    let own = key().sender_key(h.sender());
    assert!(wire::seal(&own, &h, &mut b, |_| {}).is_ok());
    let other = Header { session: h.session + 1, ..h };
    assert_eq!(wire::seal(&own, &other, &mut b, |_| {}), Err(WireError::KeyMismatch));
}

#[test]
fn bad_tag() {
    // Wrong key.
    let b = encoded(PacketType::Data);
    assert_eq!(wire::decode(&JobKey::new(b"another job"), &b), Err(WireError::BadTag));
    // Header edited without re-tagging.
    let mut b = encoded(PacketType::Data);
    b[8] ^= 1;
    assert_eq!(wire::decode(&key(), &b), Err(WireError::BadTag));
    // Zeroed tag.
    let mut b = encoded(PacketType::Probe);
    let n = b.len();
    b[n - TAG_LEN..].fill(0);
    assert_eq!(wire::decode(&key(), &b), Err(WireError::BadTag));
    // The MAC runs before field validation: an invalid type under a bad tag is BadTag.
    let mut b = encoded(PacketType::Probe);
    b[3] = 99;
    assert_eq!(wire::decode(&key(), &b), Err(WireError::BadTag));
}

#[test]
fn unknown_type() {
    for t in [0u8, 9, 0x80, 255] {
        assert_eq!(decode_edited(PacketType::Probe, |b| b[3] = t), Err(WireError::UnknownType(t)));
    }
}

#[test]
fn bad_flags() {
    // LAST (version 8, the last bit) on every type but DATA, where it is
    // valid; FAILED (version 5) on every type but DONE.
    for ty in ALL_TYPES {
        if ty == PacketType::Data {
            assert!(decode_edited(ty, |b| b[4] = 0x80).is_ok(), "{ty:?} LAST");
        } else {
            assert_eq!(decode_edited(ty, |b| b[4] = 0x80), Err(WireError::BadFlags(0x80)), "{ty:?} 0x80");
        }
        if ty != PacketType::Done {
            assert_eq!(decode_edited(ty, |b| b[4] = 0x40), Err(WireError::BadFlags(0x40)), "{ty:?} 0x40");
        }
    }
    // FAILED with MASK_EMPTY: a DONE is one or the other.
    assert_eq!(decode_edited(PacketType::Done, |b| b[4] = 0x44), Err(WireError::BadFlags(0x44)));
    // Defined bits on the wrong packet type.
    assert_eq!(decode_edited(PacketType::Data, |b| b[4] = 0x02), Err(WireError::BadFlags(0x02)));
    assert_eq!(decode_edited(PacketType::Data, |b| b[4] = 0x04), Err(WireError::BadFlags(0x04)));
    assert_eq!(decode_edited(PacketType::Probe, |b| b[4] = 0x01), Err(WireError::BadFlags(0x01)));
    // REQUEST is GRANT's, BACKLOG DATA's.
    assert_eq!(decode_edited(PacketType::Data, |b| b[4] = 0x10), Err(WireError::BadFlags(0x10)));
    assert_eq!(decode_edited(PacketType::Probe, |b| b[4] = 0x20), Err(WireError::BadFlags(0x20)));
    assert!(decode_edited(PacketType::Data, |b| b[4] = 0x20).is_ok());
    for ty in [PacketType::Probe, PacketType::Bitmap, PacketType::Done, PacketType::Hello] {
        assert_eq!(decode_edited(ty, |b| b[4] = 0x08), Err(WireError::BadFlags(0x08)), "REQUIRED on {ty:?}");
    }
    assert!(decode_edited(PacketType::Data, |b| b[4] = 0x09).is_ok(), "REPAIR | REQUIRED on DATA");
    assert_eq!(decode_edited(PacketType::Hello, |b| b[4] = 0x02), Err(WireError::BadFlags(0x02)));
    assert_eq!(decode_edited(PacketType::Bitmap, |b| b[4] = 0x04), Err(WireError::BadFlags(0x04)));
    assert_eq!(decode_edited(PacketType::Done, |b| b[4] = 0x02), Err(WireError::BadFlags(0x02)));
    assert_eq!(decode_edited(PacketType::Done, |b| b[4] = 0x05), Err(WireError::BadFlags(0x05)));
    // And through Header::emit.
    let mut h = header(PacketType::Probe);
    h.flags = Flags::REPAIR;
    assert_eq!(h.check(), Err(WireError::BadFlags(0x01)));
}

/// A failing DONE (version 5) carries exactly its one-byte reason, and no
/// segment: `chunk_index` 0. Any reason code is valid on the wire.
#[test]
fn bad_failing_done() {
    let mut h = header(PacketType::Done);
    h.flags = Flags::FAILED;
    let mut out = vec![0u8; 256];
    for len in [0usize, 2, 8] {
        h.payload_len = len as u16;
        assert_eq!(
            wire::encode(&key(), &h, &vec![1; len], &mut out),
            Err(WireError::BadField("payload_len")),
            "{len} bytes"
        );
    }
    h.payload_len = wire::FAILURE_LEN as u16;
    for code in [0u8, 1, 5, 6, 255] {
        let n = wire::encode(&key(), &h, &[code], &mut out).unwrap();
        let (got, p) = wire::decode(&key(), &out[..n]).unwrap();
        assert_eq!((got, p), (h, &[code][..]));
    }
    h.chunk_index = 8;
    assert_eq!(wire::encode(&key(), &h, &[1], &mut out), Err(WireError::BadField("chunk_index")));
    // The 2-byte segment of a mask DONE is not a reason.
    assert_eq!(decode_edited(PacketType::Done, |b| b[4] = 0x40), Err(WireError::BadField("payload_len")));
}

#[test]
fn bad_class() {
    // Out of range.
    for c in [8u8, 0x80, 255] {
        assert_eq!(decode_edited(PacketType::Data, |b| b[5] = c), Err(WireError::BadClass(c)));
    }
    // Control class on DATA; data class on a control packet.
    assert_eq!(decode_edited(PacketType::Data, |b| b[5] = 7), Err(WireError::BadClass(7)));
    for ty in [PacketType::Probe, PacketType::Bitmap, PacketType::Done, PacketType::Hello] {
        assert_eq!(decode_edited(ty, |b| b[5] = 0), Err(WireError::BadClass(0)), "{ty:?}");
    }
}

#[test]
fn bad_phase() {
    assert_eq!(decode_edited(PacketType::Data, |b| b[6] = 3), Err(WireError::BadPhase(3)));
    assert_eq!(decode_edited(PacketType::Data, |b| b[6] = 0), Err(WireError::BadPhase(0)));
    assert_eq!(decode_edited(PacketType::Probe, |b| b[6] = 0), Err(WireError::BadPhase(0)));
    assert_eq!(decode_edited(PacketType::Hello, |b| b[6] = 1), Err(WireError::BadPhase(1)));
    assert_eq!(decode_edited(PacketType::Hello, |b| b[6] = 2), Err(WireError::BadPhase(2)));
}

#[test]
fn unknown_dtype() {
    for d in [3u8, 255] {
        assert_eq!(decode_edited(PacketType::Data, |b| b[7] = d), Err(WireError::UnknownDType(d)));
        assert_eq!(decode_edited(PacketType::Hello, |b| b[7] = d), Err(WireError::UnknownDType(d)));
    }
}

/// Byte 15 was reserved (zero) up to version 5; version 6 made it `kind`,
/// so the header has no reserved byte left. A HELLO's settings still have
/// reserved bytes (21–23 of its payload).
#[test]
fn reserved_non_zero() {
    for i in 21..24 {
        assert_eq!(
            decode_edited(PacketType::Hello, |b| b[HEADER_LEN + i] = 0x01),
            Err(WireError::ReservedNonZero),
            "settings byte {i}"
        );
    }
}

/// Byte 15, `kind` (versions 6, 7): the reduction in the low four bits (0
/// sum, 1 average), the collective in the high four (version 7: 0 allreduce,
/// 1 reduce-scatter, 2 allgather, 3 broadcast, 4 barrier). A collective's
/// packets are of the phases it has, and one that does not reduce says sum.
#[test]
fn unknown_reduce_op_and_collective() {
    let mut other_phase_checked = 0;
    for ty in [PacketType::Data, PacketType::Probe, PacketType::Bitmap, PacketType::Done] {
        let h = decode_edited(ty, |b| b[15] = 0x01).unwrap();
        assert_eq!(h.reduce, wire::ReduceOp::Average, "{ty:?}");
        for r in [2u8, 7, 15] {
            assert_eq!(decode_edited(ty, |b| b[15] = r), Err(WireError::UnknownReduceOp(r)), "{ty:?}");
        }
        for c in [5u8, 9, 15] {
            assert_eq!(decode_edited(ty, |b| b[15] = c << 4), Err(WireError::UnknownCollective(c)), "{ty:?}");
        }
        for c in wire::Collective::ALL {
            let kind = (c as u8) << 4;
            let phase = h.phase;
            let fits = match phase {
                Phase::Scatter => c.scatters(),
                _ => c.gathers(),
            };
            let got = decode_edited(ty, |b| b[15] = kind);
            if fits {
                assert_eq!(got.unwrap().collective, c, "{ty:?} {c:?}");
            } else {
                assert_eq!(got, Err(WireError::BadPhase(phase as u8)), "{ty:?} {c:?} in {phase:?}");
            }
            // Only allreduce and reduce-scatter reduce: the others say sum.
            let averaged = decode_edited(ty, |b| b[15] = kind | 1);
            if fits && !c.reduces() {
                assert_eq!(averaged, Err(WireError::BadField("kind")), "{ty:?} {c:?} average");
            }
        }
        // The other phase: each collective that has it.
        let other = if h.phase == Phase::Scatter { 2 } else { 1 };
        let h2 = decode_edited(ty, |b| b[6] = other);
        if let Ok(h2) = h2 {
            for c in wire::Collective::ALL {
                let fits = if h2.phase == Phase::Scatter { c.scatters() } else { c.gathers() };
                let got = decode_edited(ty, |b| {
                    b[6] = other;
                    b[15] = (c as u8) << 4;
                });
                assert_eq!(got.is_ok(), fits, "{ty:?} {c:?} in {:?}: {got:?}", h2.phase);
            }
            other_phase_checked += 1;
        }
    }
    assert!(other_phase_checked >= 3, "only {other_phase_checked} packet types decoded in the other phase");
    // A packet about no op carries no reduction and no element type.
    for ty in [PacketType::Hello, PacketType::Grant, PacketType::Goodbye] {
        assert_eq!(decode_edited(ty, |b| b[15] = 0x01), Err(WireError::BadField("kind")), "{ty:?}");
        for d in [1u8, 2] {
            assert_eq!(decode_edited(ty, |b| b[7] = d), Err(WireError::BadField("dtype")), "{ty:?}");
        }
    }
    // Every op packet may carry any element type.
    for ty in [PacketType::Data, PacketType::Probe, PacketType::Bitmap, PacketType::Done] {
        assert_eq!(decode_edited(ty, |b| b[7] = 2).unwrap().dtype, DType::Bf16, "{ty:?}");
    }
}

#[test]
fn bad_field_dst() {
    assert_eq!(decode_edited(PacketType::Data, |b| set_u32(b, 20, 0)), Err(WireError::BadField("dst")));
    assert_eq!(decode_edited(PacketType::Hello, |b| set_u32(b, 16, 1)), Err(WireError::BadField("dst")));
}

#[test]
fn bad_field_budget() {
    assert!(decode_edited(PacketType::Data, |b| set_u32(b, 48, PPM)).is_ok());
    assert_eq!(
        decode_edited(PacketType::Data, |b| set_u32(b, 48, PPM + 1)),
        Err(WireError::BadField("budget_ppm"))
    );
    assert_eq!(
        decode_edited(PacketType::Hello, |b| set_u32(b, 48, u32::MAX)),
        Err(WireError::BadField("budget_ppm"))
    );
}

#[test]
fn bad_field_chunk_count_and_required() {
    for ty in [PacketType::Data, PacketType::Probe, PacketType::Bitmap, PacketType::Done] {
        assert_eq!(
            decode_edited(ty, |b| set_u32(b, 40, 0)),
            Err(WireError::BadField("chunk_count")),
            "{ty:?}"
        );
        assert_eq!(decode_edited(ty, |b| set_u32(b, 44, 17)), Err(WireError::BadField("required")), "{ty:?}");
    }
    // HELLO is not about a transfer: chunk_count / required are not checked.
    assert!(decode_edited(PacketType::Hello, |b| set_u32(b, 40, 0)).is_ok());
}

#[test]
fn bad_field_chunk_index() {
    // DATA: index must be < count.
    assert!(decode_edited(PacketType::Data, |b| set_u32(b, 36, 15)).is_ok());
    assert_eq!(
        decode_edited(PacketType::Data, |b| set_u32(b, 36, 16)),
        Err(WireError::BadField("chunk_index"))
    );
    // BITMAP / DONE: the segment start is byte aligned and inside the transfer.
    for ty in [PacketType::Bitmap, PacketType::Done] {
        let at = |first: u32, count: u32| {
            move |b: &mut Vec<u8>| {
                set_u32(b, 36, first);
                set_u32(b, 40, count);
            }
        };
        assert!(decode_edited(ty, at(8, 24)).is_ok());
        assert_eq!(decode_edited(ty, at(3, 24)), Err(WireError::BadField("chunk_index")));
        assert_eq!(decode_edited(ty, at(24, 24)), Err(WireError::BadField("chunk_index")));
        assert_eq!(decode_edited(ty, at(0xFFFF_FFF8, 24)), Err(WireError::BadField("chunk_index")));
    }
}

#[test]
fn bad_field_segment_past_the_transfer() {
    // BITMAP/DONE segments carry 2 bytes (16 bits) here.
    for ty in [PacketType::Bitmap, PacketType::Done] {
        let at = |first: u32, count: u32| {
            move |b: &mut Vec<u8>| {
                set_u32(b, 36, first);
                set_u32(b, 40, count);
                set_u32(b, 44, 0);
            }
        };
        // Bits 0..16 of a 9..16-chunk transfer: the second byte is needed.
        assert!(decode_edited(ty, at(0, 9)).is_ok(), "{ty:?}");
        assert!(decode_edited(ty, at(0, 16)).is_ok(), "{ty:?}");
        assert!(decode_edited(ty, at(8, 17)).is_ok(), "{ty:?}");
        // A second byte wholly past the last chunk is rejected.
        assert_eq!(decode_edited(ty, at(0, 8)), Err(WireError::BadField("payload_len")), "{ty:?}");
        assert_eq!(decode_edited(ty, at(8, 16)), Err(WireError::BadField("payload_len")), "{ty:?}");
        assert_eq!(decode_edited(ty, at(0, 1)), Err(WireError::BadField("payload_len")), "{ty:?}");
    }
}

#[test]
fn bad_field_payload_len() {
    let mut hdr = [0u8; HEADER_LEN];

    // DATA with an empty payload.
    let mut h = header(PacketType::Data);
    h.payload_len = 0;
    assert_eq!(h.emit(&mut hdr), Err(WireError::BadField("payload_len")));
    // Build it raw: emit a valid header, then zero payload_len by hand.
    h.payload_len = 4;
    h.emit(&mut hdr).unwrap();
    hdr[12..14].fill(0);
    assert_eq!(wire::decode(&key(), &raw(&hdr, &[])), Err(WireError::BadField("payload_len")));

    // DATA whose length is not a whole number of f32 elements; bf16 allows it.
    h.payload_len = 6;
    assert_eq!(h.check(), Err(WireError::BadField("payload_len")));
    h.payload_len = 4;
    h.emit(&mut hdr).unwrap();
    hdr[13] = 6;
    assert_eq!(wire::decode(&key(), &raw(&hdr, &[0; 6])), Err(WireError::BadField("payload_len")));
    hdr[7] = DType::Bf16 as u8;
    assert!(wire::decode(&key(), &raw(&hdr, &[0; 6])).is_ok());

    // PROBE with anything but its count's length; HELLO with anything but
    // its settings' length.
    let mut hdr = [0u8; HEADER_LEN];
    header(PacketType::Probe).emit(&mut hdr).unwrap();
    hdr[13] = 1;
    assert_eq!(wire::decode(&key(), &raw(&hdr, &[0])), Err(WireError::BadField("payload_len")));
    let mut hello = Header { payload_len: SETTINGS_LEN as u16, ..header(PacketType::Hello) };
    let mut hdr = [0u8; HEADER_LEN];
    hello.emit(&mut hdr).unwrap();
    for len in [0, 1, SETTINGS_LEN - 1, SETTINGS_LEN + 1] {
        hello.payload_len = len as u16;
        assert_eq!(hello.check(), Err(WireError::BadField("payload_len")), "{len}");
        hdr[12..14].copy_from_slice(&(len as u16).to_be_bytes());
        let mut p = settings();
        p.resize(len, 0);
        assert_eq!(wire::decode(&key(), &raw(&hdr, &p)), Err(WireError::BadField("payload_len")), "{len}");
    }

    // BITMAP/DONE: a payload iff not COMPLETE/MASK_EMPTY.
    for (ty, flag) in [(PacketType::Bitmap, Flags::COMPLETE), (PacketType::Done, Flags::MASK_EMPTY)] {
        let mut h = header(ty);
        h.payload_len = 2;
        h.emit(&mut hdr).unwrap();
        // Flag set, payload present.
        hdr[4] = flag.0;
        assert_eq!(wire::decode(&key(), &raw(&hdr, &[1, 2])), Err(WireError::BadField("payload_len")));
        // Flag clear, no payload.
        hdr[4] = 0;
        hdr[12..14].fill(0);
        assert_eq!(wire::decode(&key(), &raw(&hdr, &[])), Err(WireError::BadField("payload_len")));
        // Flag set, no payload: fine.
        hdr[4] = flag.0;
        assert!(wire::decode(&key(), &raw(&hdr, &[])).is_ok());
    }

    // encode refuses a payload longer than the header can declare.
    let big = vec![0u8; MAX_PAYLOAD + 1];
    let mut out = vec![0u8; MAX_PAYLOAD + 1 + OVERHEAD];
    assert_eq!(
        wire::encode(&key(), &header(PacketType::Data), &big, &mut out),
        Err(WireError::BadField("payload_len"))
    );
}

#[test]
fn bad_hello_settings() {
    // A HELLO's settings must be well formed and agree with its header.
    let edit = |i: usize, v: u8| decode_edited(PacketType::Hello, move |b| b[HEADER_LEN + i] = v);
    assert!(edit(0, wire::VERSION).is_ok());
    assert_eq!(edit(0, 1), Err(WireError::BadField("settings")), "another version than the header's");
    assert_eq!(edit(1, 0), Err(WireError::BadField("settings")), "another auth than the header's");
    assert_eq!(edit(1, 7), Err(WireError::BadField("settings.auth")));
    assert!(edit(2, 1).is_ok() && edit(3, 1).is_ok(), "any flow window is well formed (version 3)");
    assert!(edit(7, 0x99).is_ok(), "any chunk size is well formed");
}

#[test]
fn buffer_too_small() {
    let h = header(PacketType::Data);
    let payload = payload_for(PacketType::Data);
    let need = OVERHEAD + payload.len();
    for have in [0, 1, HEADER_LEN, need - 1] {
        let mut out = vec![0u8; have];
        assert_eq!(
            wire::encode(&key(), &h, &payload, &mut out),
            Err(WireError::BufferTooSmall { need, have })
        );
    }
    let mut out = vec![0u8; need];
    assert_eq!(wire::encode(&key(), &h, &payload, &mut out), Ok(need));
    let mut small = [0u8; HEADER_LEN - 1];
    assert_eq!(
        header(PacketType::Probe).emit(&mut small),
        Err(WireError::BufferTooSmall { need: HEADER_LEN, have: HEADER_LEN - 1 })
    );
}

/// Every variant has a test above; this fails to compile if a variant is added
/// without one being considered.
#[test]
fn variant_list_is_exhaustive() {
    fn covered(e: WireError) -> &'static str {
        match e {
            WireError::Truncated { .. } => "truncated",
            WireError::LengthMismatch { .. } => "length_mismatch",
            WireError::BadMagic(_) => "bad_magic",
            WireError::UnsupportedVersion(_) => "unsupported_version",
            WireError::BadTag => "bad_tag",
            WireError::UnknownType(_) => "unknown_type",
            WireError::BadFlags(_) => "bad_flags",
            WireError::BadClass(_) => "bad_class",
            WireError::BadPhase(_) => "bad_phase",
            WireError::UnknownDType(_) => "unknown_dtype",
            WireError::ReservedNonZero => "reserved_non_zero",
            WireError::UnknownReduceOp(_) | WireError::UnknownCollective(_) => {
                "unknown_reduce_op_and_collective"
            }
            WireError::BadField(_) => "bad_field_*",
            WireError::BufferTooSmall { .. } => "buffer_too_small",
            WireError::UnknownAuth(_) => "unknown_auth",
            WireError::AuthMismatch { .. } => "auth_mismatch",
            WireError::KeyMismatch => "key_mismatch",
        }
    }
    assert_eq!(covered(WireError::BadTag), "bad_tag");
    // Display strings exist and are distinct for a sample.
    assert_ne!(WireError::BadTag.to_string(), WireError::ReservedNonZero.to_string());
}
