//! Property tests for the wire format.
//!
//! - encode/decode round-trips every valid header and payload, byte-exactly;
//! - `decode` never panics, on arbitrary bytes, on mutations of valid packets,
//!   and on mutated packets re-tagged with the right key (which reach the
//!   field checks after the MAC);
//! - `Packet::new_checked` and every accessor never panic.

use dlcp_proto::class::Class;
use dlcp_proto::wire::{
    self, Collective, DType, Flags, HEADER_LEN, Header, JobKey, MAX_PAYLOAD, OVERHEAD, PPM, Packet,
    PacketAuth, PacketType, Phase, ReduceOp, SETTINGS_LEN, SenderId, Settings, TAG_LEN, WireError,
};
use proptest::prelude::*;

fn key() -> JobKey {
    JobKey::new(b"proptest secret")
}

/// A valid HELLO payload announcing `chunk_bytes`.
fn settings(chunk_bytes: u32) -> Vec<u8> {
    let mut b = vec![0u8; SETTINGS_LEN];
    Settings {
        version: wire::VERSION,
        auth: PacketAuth::AesGmac,
        chunk_bytes,
        flow_window: 0,
        digest: u64::from(chunk_bytes).rotate_left(13),
        generation: chunk_bytes ^ 0x55,
        run_flags: (chunk_bytes & 1) as u8,
        run_nonce: u64::from(chunk_bytes) * 3,
        run_echo: u64::from(chunk_bytes) * 11,
        challenge: u64::from(chunk_bytes) * 5,
        echo: u64::from(chunk_bytes) * 7,
    }
    .emit(&mut b);
    b
}

fn packet_type() -> impl Strategy<Value = PacketType> {
    prop_oneof![
        Just(PacketType::Data),
        Just(PacketType::Probe),
        Just(PacketType::Bitmap),
        Just(PacketType::Done),
        Just(PacketType::Hello),
    ]
}

fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::Bf16)]
}

/// Payload lengths: mostly small, sometimes MTU-sized, occasionally huge.
fn len_units() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 1usize..64, 2 => 64usize..2300, 1 => 2300usize..(MAX_PAYLOAD / 4)]
}

/// A header that satisfies `Header::check`, with a matching payload.
fn valid_packet() -> impl Strategy<Value = (Header, Vec<u8>)> {
    (packet_type(), dtype(), any::<bool>(), any::<bool>(), 0u8..7, any::<bool>(), any::<bool>(), 0usize..3)
        .prop_flat_map(|(ty, dtype, flag_a, flag_b, data_class, gather, average, which)| {
            let class = if ty == PacketType::Data { Class::new(data_class).unwrap() } else { Class::CONTROL };
            let phase = match ty {
                PacketType::Hello => Phase::None,
                _ if gather => Phase::Gather,
                _ => Phase::Scatter,
            };
            let flags = match ty {
                PacketType::Data => Flags(
                    if flag_a { Flags::REPAIR.0 } else { 0 } | if flag_b { Flags::REQUIRED.0 } else { 0 },
                ),
                PacketType::Bitmap if flag_a => Flags::COMPLETE,
                PacketType::Done if flag_a => Flags::MASK_EMPTY,
                _ => Flags::default(),
            };
            let no_payload = flags.0 & 0x06 != 0;
            let min_count = if ty == PacketType::Hello { 0u32 } else { 1 };
            (
                any::<[u32; 5]>(), // job, run (low bits), src, tensor, seq
                1u32..=u32::MAX,   // dst = src ^ this, never equal to src
                any::<u64>(),
                prop_oneof![3 => min_count..=64u32, 1 => min_count..=u32::MAX], // chunk_count: small ones hit the edges
                any::<u32>(),
                0..=PPM,
                if no_payload { Just(0usize).boxed() } else { len_units().boxed() },
                any::<u64>(),
                any::<[u64; 2]>(), // session, packet number
            )
                .prop_map(
                    move |(w, dst_xor, op, chunk_count, raw, budget_ppm, units, seed, sp)| {
                        let mut h = Header::new(ty, class, phase);
                        h.flags = flags;
                        // A packet about no op carries f32, sum and allreduce
                        // (version 6); one of an op, a collective that has its
                        // phase, and sum unless that collective reduces (version 7).
                        if !ty.is_phaseless() {
                            h.dtype = dtype;
                            let fits = Collective::ALL
                                .into_iter()
                                .filter(|c| if phase == Phase::Gather { c.gathers() } else { c.scatters() });
                            h.collective = fits.collect::<Vec<_>>()[which];
                            h.reduce = if average && h.collective.reduces() {
                                ReduceOp::Average
                            } else {
                                ReduceOp::Sum
                            };
                        }
                        h.job = w[0];
                        h.run = if ty.is_phaseless() { 0 } else { u64::from(w[1]) << 7 | 1 };
                        h.src = w[2];
                        h.dst = w[2] ^ dst_xor;
                        h.op = op;
                        h.tensor = w[3];
                        h.seq = w[4];
                        h.chunk_count = chunk_count;
                        h.budget_ppm = budget_ppm;
                        [h.session, h.packet] = sp;
                        let count = u64::from(chunk_count.max(1));
                        h.required =
                            if ty == PacketType::Hello { raw } else { (u64::from(raw) % (count + 1)) as u32 };
                        h.chunk_index = match ty {
                            // DATA: the chunk; PROBE: the last chunk sent before it.
                            PacketType::Data | PacketType::Probe => (u64::from(raw) % count) as u32,
                            PacketType::Bitmap | PacketType::Done if units > 0 => {
                                ((u64::from(raw) % count) as u32) & !7
                            }
                            PacketType::Bitmap | PacketType::Done => raw & !7,
                            _ => raw,
                        };
                        let len = match ty {
                            PacketType::Data => (units * dtype.size()).min(MAX_PAYLOAD / 4 * 4),
                            // A PROBE carries its sender's DATA count.
                            PacketType::Probe => wire::GRANT_LEN,
                            // A segment ends at the byte holding the last chunk's bit.
                            PacketType::Bitmap | PacketType::Done if units > 0 => {
                                units.min((chunk_count - h.chunk_index).div_ceil(8) as usize)
                            }
                            _ => units,
                        };
                        // Cheap deterministic payload bytes; a HELLO's are its settings.
                        let payload: Vec<u8> = if ty == PacketType::Hello {
                            settings(seed as u32)
                        } else {
                            (0..len)
                                .map(|i| (seed.wrapping_mul(i as u64 + 1).wrapping_add(i as u64) >> 29) as u8)
                                .collect()
                        };
                        let len = payload.len();
                        h.payload_len = len as u16;
                        (h, payload)
                    },
                )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn generator_yields_valid_headers((h, _p) in valid_packet()) {
        prop_assert_eq!(h.check(), Ok(()));
    }

    #[test]
    fn round_trip((h, payload) in valid_packet()) {
        let k = key();
        let mut buf = vec![0u8; payload.len() + OVERHEAD];
        let n = wire::encode(&k, &h, &payload, &mut buf).unwrap();
        prop_assert_eq!(n, h.packet_len());
        let (got, p) = wire::decode(&k, &buf[..n]).unwrap();
        prop_assert_eq!(got, h);
        prop_assert_eq!(p, &payload[..]);
        // Re-encoding the decoded header reproduces the datagram byte for byte.
        let mut again = vec![0u8; n];
        wire::encode(&k, &got, p, &mut again).unwrap();
        prop_assert_eq!(&again[..], &buf[..n]);
        // The view agrees.
        let v = Packet::new_checked(&buf[..n]).unwrap();
        prop_assert_eq!(v.payload(), &payload[..]);
        prop_assert_eq!(Header::parse(&v).unwrap(), h);
    }

    #[test]
    fn decode_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = wire::decode(&key(), &bytes);
    }

    /// Arbitrary bytes behind a valid magic/version/length prefix, with a
    /// correct tag: exercises `Header::parse` on random field values.
    #[test]
    fn decode_never_panics_on_tagged_garbage(
        mut hdr in proptest::collection::vec(any::<u8>(), HEADER_LEN),
        payload in proptest::collection::vec(any::<u8>(), 0..100),
        keep_reserved in any::<bool>(),
    ) {
        hdr[0..2].copy_from_slice(&wire::MAGIC.to_be_bytes());
        hdr[2] = wire::VERSION;
        hdr[56..58].copy_from_slice(&(payload.len() as u16).to_be_bytes());
        if !keep_reserved {
            hdr[58] = PacketAuth::AesGmac as u8;
            hdr[59..64].fill(0);
        }
        let mut b = hdr;
        b.extend_from_slice(&payload);
        let t = key().tag(&b);
        b.extend_from_slice(&t);
        check_decode(&b)?;
    }

    /// Random byte edits, truncations and extensions of a valid packet, both
    /// without (must fail) and with (may succeed) re-tagging.
    #[test]
    fn decode_never_panics_on_mutations(
        (h, payload) in valid_packet(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        resize in prop_oneof![3 => Just(0i32), 1 => -90i32..90],
        retag in any::<bool>(),
    ) {
        let k = key();
        let mut b = vec![0u8; payload.len() + OVERHEAD];
        wire::encode(&k, &h, &payload, &mut b).unwrap();
        let orig = b.clone();
        for (i, x) in &edits {
            let i = i.index(b.len());
            b[i] ^= x;
        }
        let new_len = (b.len() as i64 + i64::from(resize)).max(0) as usize;
        b.resize(new_len, 0xA5);
        if retag && b.len() >= OVERHEAD {
            let n = b.len() - TAG_LEN;
            let t = k.tag(&b[..n]);
            b[n..].copy_from_slice(&t);
        }
        let r = check_decode(&b);
        r?;
        if !retag && b != orig {
            prop_assert!(wire::decode(&k, &b).is_err(), "an unauthenticated edit decoded");
        }
    }

    #[test]
    fn new_checked_and_accessors_never_panic(
        mut bytes in proptest::collection::vec(any::<u8>(), 0..200),
        fix_prefix in any::<bool>(),
    ) {
        if fix_prefix && bytes.len() >= OVERHEAD {
            bytes[0..2].copy_from_slice(&wire::MAGIC.to_be_bytes());
            bytes[2] = wire::VERSION;
            let plen = (bytes.len() - OVERHEAD) as u16;
            bytes[56..58].copy_from_slice(&plen.to_be_bytes());
            bytes[58] = PacketAuth::AesGmac as u8;
        }
        match Packet::new_checked(&bytes[..]) {
            Ok(p) => {
                prop_assert!(fix_prefix || bytes.len() >= OVERHEAD);
                exercise_view(&p);
                let _ = Header::parse(&p);
                let _ = p.verify(&key().sender_key(SenderId::of_header(p.header())));
                let _ = (p.auth(), p.session(), p.packet(), p.header());
                prop_assert_eq!(p.authenticated().len() + TAG_LEN, bytes.len());
                prop_assert_eq!(p.payload().len(), bytes.len() - OVERHEAD);
            }
            Err(e) => {
                let structural = matches!(
                    e,
                    WireError::Truncated { .. }
                        | WireError::BadMagic(_)
                        | WireError::UnsupportedVersion(_)
                        | WireError::UnknownAuth(_)
                        | WireError::LengthMismatch { .. }
                );
                prop_assert!(structural, "new_checked returned {:?}", e);
            }
        }
    }

    /// `Header::check` never panics and `emit` agrees with it, for any header
    /// (including ones that violate the rules).
    #[test]
    fn check_and_emit_agree_on_arbitrary_headers(
        (ty, dtype) in (packet_type(), dtype()),
        class in 0u8..8,
        phase in prop_oneof![Just(Phase::None), Just(Phase::Scatter), Just(Phase::Gather)],
        flags in any::<u8>(),
        w in any::<[u32; 11]>(),
        op in any::<u64>(),
        payload_len in any::<u16>(),
    ) {
        let mut h = Header::new(ty, Class::new(class).unwrap(), phase);
        h.dtype = dtype;
        h.reduce = if flags & 0x80 != 0 { ReduceOp::Average } else { ReduceOp::Sum };
        h.flags = Flags(flags);
        h.run = u64::from(w[1]);
        [h.job, h.src, h.dst, h.tensor, h.chunk_index, h.chunk_count, h.required,
         h.budget_ppm, h.seq] = [w[0], w[2], w[3] % 4, w[4], w[5] % 64, w[6] % 64, w[7] % 64,
         w[8] % (2 * PPM), w[9]];
        h.op = op;
        h.payload_len = payload_len % 64;
        [h.session, h.packet] = [op.rotate_left(17), op ^ u64::from(w[10])];
        let mut buf = [0u8; HEADER_LEN];
        let checked = h.check();
        prop_assert_eq!(h.emit(&mut buf), checked);
        if checked.is_ok() {
            // A checked header survives a full round trip.
            let payload =
                if ty == PacketType::Hello { settings(w[10]) } else { vec![0u8; usize::from(h.payload_len)] };
            let mut out = vec![0u8; h.packet_len()];
            wire::encode(&key(), &h, &payload, &mut out).unwrap();
            prop_assert_eq!(wire::decode(&key(), &out).unwrap().0, h);
        }
    }
}

/// Decode; if it succeeds, the datagram must re-encode to the same bytes.
fn check_decode(b: &[u8]) -> Result<(), TestCaseError> {
    let k = key();
    if let Ok((h, p)) = wire::decode(&k, b) {
        prop_assert_eq!(h.check(), Ok(()));
        let mut out = vec![0u8; h.packet_len()];
        let n = wire::encode(&k, &h, p, &mut out).unwrap();
        prop_assert_eq!(&out[..n], b);
    }
    Ok(())
}

fn exercise_view(p: &Packet<&[u8]>) {
    let _ = (p.raw_type(), p.flags(), p.raw_class(), p.raw_phase(), p.raw_dtype());
    let _ = (p.job(), p.run(), p.src(), p.dst(), p.op(), p.tensor());
    let _ = (p.chunk_index(), p.chunk_count(), p.required(), p.budget_ppm(), p.seq(), p.payload_len());
    let _ = (p.raw_kind(), p.payload(), p.authenticated(), p.tag());
}
