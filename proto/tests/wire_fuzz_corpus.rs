//! Replays the cargo-fuzz corpora (`fuzz/corpus/decode*/`) through `decode`, so
//! `cargo test` covers what the fuzzer found without running the fuzzer.
//!
//! - `decode/`: each file is decoded as is with the fuzz key; it must not
//!   panic, and a file that decodes must re-encode to the same bytes.
//! - `decode_tagged/`: each file first gets a correct tag (last 16 bytes), as
//!   the `decode_tagged` target does, then the same checks.
//!
//! The valid seed packets (`seed-*`, one or more of every type) are written by
//! the ignored test `write_seed_corpus`:
//! `cargo test -p dlcp-proto --test wire_fuzz_corpus -- --ignored write_seed_corpus`.

use dlcp_proto::class::Class;
use dlcp_proto::wire::{
    self, Collective, DType, Flags, Header, JobKey, OVERHEAD, PacketAuth, PacketType, Phase, ReduceOp,
    SETTINGS_LEN, Settings, TAG_LEN,
};
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Must match `SECRET` in `fuzz/fuzz_targets/*.rs`.
const SECRET: &[u8] = b"dlcp fuzz corpus key";

fn key() -> JobKey {
    JobKey::new(SECRET)
}

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target)
}

fn files(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    v.sort();
    v
}

/// Decode; on success re-encode and compare. Returns the packet type if valid.
fn replay(k: &JobKey, name: &str, b: &[u8]) -> Option<PacketType> {
    let (h, p) = wire::decode(k, b).ok()?;
    assert_eq!(h.check(), Ok(()), "{name}");
    let mut out = vec![0u8; h.packet_len()];
    let n = wire::encode(k, &h, p, &mut out).unwrap();
    assert_eq!(&out[..n], b, "{name}: decode/encode is not the identity");
    Some(h.ty)
}

#[test]
fn replay_decode_corpus() {
    let k = key();
    let files = files("decode");
    assert!(!files.is_empty(), "empty corpus");
    let mut types = BTreeSet::new();
    for (name, b) in &files {
        let valid = replay(&k, name, b);
        if name.starts_with("seed-") {
            assert!(valid.is_some(), "seed {name} no longer decodes");
        }
        types.extend(valid.map(|t| t as u8));
    }
    let mut want: BTreeSet<u8> = (1..=6).collect();
    want.insert(PacketType::Ack as u8);
    assert_eq!(types, want, "corpus lacks a valid packet of some type");
}

#[test]
fn replay_decode_tagged_corpus() {
    let k = key();
    let files = files("decode_tagged");
    assert!(!files.is_empty(), "empty corpus");
    for (name, mut b) in files {
        if b.len() >= OVERHEAD {
            let n = b.len() - TAG_LEN;
            let t = k.tag(&b[..n]);
            b[n..].copy_from_slice(&t);
        }
        replay(&k, &name, &b);
    }
}

fn seeds() -> Vec<(&'static str, Header, Vec<u8>)> {
    let base = |ty, class, phase| {
        let mut h = Header::new(ty, class, phase);
        h.job = 42;
        h.run = 7;
        h.src = 0;
        h.dst = 3;
        h.op = 1000;
        h.tensor = 12;
        h.chunk_count = 700;
        h.required = 100;
        h.budget_ppm = 10_000;
        h.session = 0x0123_4567_89AB_CDEF;
        h.packet = 1000 + u64::from(ty as u8);
        h
    };
    let data_class = Class::new(2).unwrap();
    let mut v = Vec::new();

    let mut h = base(PacketType::Data, data_class, Phase::Scatter);
    h.chunk_index = 3;
    v.push(("seed-data-f32-1392", h, (0..1392u32).map(|i| (i * 7) as u8).collect()));
    let mut h = base(PacketType::Data, Class::new(6).unwrap(), Phase::Gather);
    h.flags = Flags::REPAIR.with(Flags::REQUIRED);
    h.dtype = DType::Bf16;
    h.chunk_index = 699;
    v.push(("seed-data-bf16-repair-required", h, vec![0x80, 0x3F, 0x20, 0xC0, 0, 0]));
    let mut h = base(PacketType::Data, Class::new(0).unwrap(), Phase::Scatter);
    h.dtype = DType::F16;
    v.push(("seed-data-f16-min", h, vec![0x00, 0x3C]));
    // Version 6: an op's reduction rides in every packet of it.
    let mut h = base(PacketType::Data, data_class, Phase::Scatter);
    (h.dtype, h.reduce) = (DType::F16, ReduceOp::Average);
    v.push(("seed-data-f16-average", h, vec![0x00, 0x3C, 0x00, 0xC1]));
    let mut h = base(PacketType::Bitmap, Class::CONTROL, Phase::Gather);
    (h.dtype, h.reduce) = (DType::Bf16, ReduceOp::Average);
    h.seq = 7;
    v.push(("seed-bitmap-bf16-average", h, vec![0x0F]));

    // Version 7: the other collectives, each in a phase it has.
    let mut h = base(PacketType::Data, data_class, Phase::Scatter);
    (h.reduce, h.collective) = (ReduceOp::Average, Collective::ReduceScatter);
    v.push(("seed-data-reduce-scatter", h, vec![0, 0, 0x80, 0x3F]));
    let mut h = base(PacketType::Data, data_class, Phase::Gather);
    (h.dtype, h.collective) = (DType::Bf16, Collective::Allgather);
    v.push(("seed-data-allgather-bf16", h, vec![0x80, 0x3F]));
    let mut h = base(PacketType::Data, Class::new(0).unwrap(), Phase::Gather);
    h.collective = Collective::Broadcast;
    v.push(("seed-data-broadcast", h, vec![0, 0, 0x80, 0x3F]));
    let mut h = base(PacketType::Probe, Class::CONTROL, Phase::Scatter);
    (h.collective, h.seq) = (Collective::Barrier, 1);
    v.push(("seed-probe-barrier", h, 1u64.to_be_bytes().to_vec()));

    let mut h = base(PacketType::Probe, Class::CONTROL, Phase::Scatter);
    h.seq = 1;
    v.push(("seed-probe", h, 640u64.to_be_bytes().to_vec()));

    let mut h = base(PacketType::Bitmap, Class::CONTROL, Phase::Scatter);
    h.chunk_index = 64;
    h.seq = 2;
    v.push(("seed-bitmap", h, vec![0xFF, 0xEF, 0x7F, 0x00, 0x01]));
    let mut h = base(PacketType::Bitmap, Class::CONTROL, Phase::Gather);
    h.flags = Flags::COMPLETE;
    h.seq = 3;
    v.push(("seed-bitmap-complete", h, vec![]));

    let mut h = base(PacketType::Done, Class::CONTROL, Phase::Gather);
    h.seq = 4;
    v.push(("seed-done-mask", h, vec![0xFE; 88]));
    let mut h = base(PacketType::Done, Class::CONTROL, Phase::Scatter);
    h.flags = Flags::MASK_EMPTY;
    h.seq = 5;
    v.push(("seed-done-mask-empty", h, vec![]));
    let mut h = base(PacketType::Done, Class::CONTROL, Phase::Gather);
    h.flags = Flags::FAILED;
    h.seq = 6;
    v.push(("seed-done-failed", h, vec![wire::FailReason::Deadline as u8]));

    // Version 10: an ACK of three ops' all-gathers.
    let mut h = base(PacketType::Ack, Class::CONTROL, Phase::Gather);
    (h.op, h.tensor, h.chunk_count, h.required, h.budget_ppm) = (0, 0, 3, 0, 0);
    let entries: Vec<wire::AckEntry> = (0..3)
        .map(|i| wire::AckEntry { op: 1000 + i, tensor: 12, echo: 40 + i as u32, held_us: 250 })
        .collect();
    let mut acks = vec![0u8; 3 * wire::ACK_ENTRY_LEN];
    wire::emit_acks(&entries, &mut acks);
    v.push(("seed-ack", h, acks));

    let mut h = Header::new(PacketType::Hello, Class::CONTROL, Phase::None);
    h.job = 42;
    h.src = 3;
    h.dst = 0;
    h.seq = 9;
    h.session = 0xFEDC_BA98_7654_3210;
    let mut settings = vec![0u8; SETTINGS_LEN];
    Settings {
        version: wire::VERSION,
        auth: PacketAuth::AesGmac,
        chunk_bytes: 1392,
        flow_window: 0,
        digest: 0x0123_4567_89AB_CDEF,
        generation: 8,
        run_flags: wire::RUN_FRESH,
        run_nonce: 0x1111_2222_3333_4444,
        run_echo: 0x5555_6666_7777_8888,
        challenge: 5,
        echo: 6,
    }
    .emit(&mut settings);
    v.push(("seed-hello", h, settings));

    let mut h = Header::new(PacketType::Grant, Class::CONTROL, Phase::None);
    h.job = 42;
    h.src = 3;
    h.dst = 0;
    v.push(("seed-grant", h, 1424u64.to_be_bytes().to_vec()));
    let mut h = Header::new(PacketType::Grant, Class::CONTROL, Phase::None);
    h.flags = Flags::REQUEST;
    h.job = 42;
    h.src = 0;
    h.dst = 3;
    v.push(("seed-grant-request", h, 77u64.to_be_bytes().to_vec()));
    let mut h = base(PacketType::Data, data_class, Phase::Gather);
    h.flags = Flags::BACKLOG;
    h.seq = 0xFFFF_FFF0;
    v.push(("seed-data-backlog", h, vec![0; 8]));
    let mut h = base(PacketType::Data, data_class, Phase::Scatter);
    h.flags = Flags::LAST.with(Flags::REPAIR);
    h.chunk_index = 99;
    h.seq = 77;
    v.push(("seed-data-last", h, vec![0; 8]));
    v
}

/// Writes the valid seed packets into both corpora. Ignored: run by hand.
#[test]
#[ignore]
fn write_seed_corpus() {
    let k = key();
    for (name, h, payload) in seeds() {
        let mut out = vec![0u8; payload.len() + wire::OVERHEAD];
        let n = wire::encode(&k, &h, &payload, &mut out).unwrap();
        for target in ["decode", "decode_tagged"] {
            std::fs::create_dir_all(corpus_dir(target)).unwrap();
            std::fs::write(corpus_dir(target).join(name), &out[..n]).unwrap();
        }
    }
}

/// The seeds in this file are valid (independent of what is on disk).
#[test]
fn seeds_are_valid() {
    let k = key();
    for (name, h, payload) in seeds() {
        let mut out = vec![0u8; payload.len() + wire::OVERHEAD];
        let n = wire::encode(&k, &h, &payload, &mut out).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(replay(&k, name, &out[..n]), Some(h.ty));
    }
}
