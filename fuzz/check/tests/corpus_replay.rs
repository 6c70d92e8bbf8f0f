//! Replays every committed fuzz corpus (`fuzz/corpus/<target>/`) through the
//! target's own check function (`dlcp_fuzz_check::TARGETS`), so a plain
//! `cargo test` covers what the fuzzers found without running them.
//!
//! The hand-made seed inputs (`seed-*`: valid messages, configurations and
//! scripts) are written by the ignored test `write_seed_corpus`:
//! `cargo test -p dlcp-fuzz-check --test corpus_replay -- --ignored write_seed_corpus`.

use std::path::PathBuf;

use dlcp_fuzz_check::TARGETS;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../corpus").join(target)
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

fn replay(target: &str) {
    let check = TARGETS.iter().find(|t| t.0 == target).expect("a target").1;
    let files = files(target);
    assert!(files.iter().any(|f| f.0.starts_with("seed-")), "{target}: no seed in the corpus");
    for (name, data) in &files {
        let r = std::panic::catch_unwind(|| check(data));
        assert!(r.is_ok(), "{target}: corpus file {name} fails its check");
    }
}

#[test]
fn replay_endpoint_corpus() {
    replay("endpoint");
}

#[test]
fn replay_frame_corpus() {
    replay("frame");
}

#[test]
fn replay_gro_corpus() {
    replay("gro");
}

#[test]
fn replay_control_corpus() {
    replay("control");
}

#[test]
fn replay_ring_corpus() {
    replay("ring");
}

#[test]
fn replay_config_corpus() {
    replay("config");
}

#[test]
fn replay_admin_corpus() {
    replay("admin");
}

#[test]
fn replay_metrics_corpus() {
    replay("metrics");
}

/// Every target has a replay test above, and a corpus.
#[test]
fn every_target_is_replayed() {
    let src = include_str!("corpus_replay.rs");
    for (name, _) in TARGETS {
        assert!(src.contains(&format!("replay(\"{name}\")")), "no replay test for {name}");
        assert!(corpus_dir(name).is_dir(), "no corpus for {name}");
    }
}

/// The committed corpora stay small (minimise with `cargo fuzz cmin`).
#[test]
fn corpora_stay_small() {
    let root = corpus_dir("");
    let mut total = 0;
    for dir in std::fs::read_dir(&root).unwrap() {
        let dir = dir.unwrap().path();
        let bytes: usize = files(&dir.file_name().unwrap().to_string_lossy()).iter().map(|f| f.1.len()).sum();
        total += bytes;
    }
    assert!(total < 400 << 10, "fuzz corpora hold {total} bytes: minimise them");
}

/// Deterministic filler bytes (xorshift).
fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Valid inputs for each target, by name.
fn seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut v = Vec::new();
    // endpoint: 3 ranks, one or three ops, then a clean run (every step delivers
    // the first datagram in flight) or a noisy script.
    let one_op = [1u8, 0, 0, 1, 90, 1, 0, 1, 1, 1];
    v.push(("endpoint", "seed-clean-1op", cat(&[&one_op, &[1, 0].repeat(200)])));
    let three_ops = [1u8, 0, 2, 0, 200, 1, 0, 1, 0, 1, 1, 40, 0, 1, 1, 0, 0, 1, 0, 120, 3, 0, 1, 1, 0];
    v.push(("endpoint", "seed-clean-3ops", cat(&[&three_ops, &[1, 0].repeat(400)])));
    v.push(("endpoint", "seed-noisy-3ops", cat(&[&three_ops, &noise(1, 600)])));
    v.push(("endpoint", "seed-noisy-4ranks", cat(&[&[2u8, 0, 1, 1, 200, 2], &noise(2, 800)])));
    v.push(("endpoint", "seed-insider-3ranks", cat(&[&[1u8, 0xff, 1, 1, 200, 2], &noise(3, 800)])));
    // frame: a UDP frame with software checksums, one with offloaded ones, an ARP reply.
    let udp = cat(&[&[1u8], &noise(3, 28), &[1, 40], &noise(4, 40)]);
    v.push(("frame", "seed-udp", udp));
    v.push(("frame", "seed-udp-offload", cat(&[&[1u8], &noise(5, 28), &[0, 8], &noise(6, 8)])));
    v.push(("frame", "seed-arp", cat(&[&[2u8], &noise(7, 27)])));
    // gro: eight datagrams to two destinations, GSO on; then a split.
    let gro = cat(&[
        &[8u8],
        &[0, 4, 0, 4, 0, 4, 0, 3, 1, 4, 1, 4, 1, 0, 0, 4],
        &[0, 16, 1, 8, 0xff, 0xff],
        &[0, 10, 0x70, 5],
    ]);
    v.push(("gro", "seed-gso", gro));
    // control: a registration, an accepted reply, a rejection.
    v.push(("control", "seed-register", cat(&[&[1u8, 1, 3, 0], &noise(8, 12), &[0]])));
    v.push(("control", "seed-accepted", cat(&[&[2u8, 1, 4, 4, 16, 0], &noise(9, 8), &[0]])));
    v.push(("control", "seed-rejected", cat(&[&[3u8, 2, 6, 0, 0, 0], &noise(10, 16), &[0]])));
    // ring: 8-slot rings, a 16 KiB arena, default limits; push, take, complete, pop.
    let mut ring = vec![2u8, 2, 3, 0, 0, 0, 0];
    for k in 0..6u8 {
        ring.extend_from_slice(&[0, k, 0, 16, k, k, 0, 0, 0, 0, 0, 0, 0, 0, 13]);
        ring.extend_from_slice(&[9, 8, 0, 7]);
    }
    v.push(("ring", "seed-push-take-complete", ring));
    v.push(("ring", "seed-noisy", cat(&[&[1u8, 1, 1, 1, 1, 1, 1], &noise(11, 400)])));
    // config: the base configuration unchanged, with a few edits, and as raw text.
    v.push(("config", "seed-base", vec![1, 0]));
    v.push(("config", "seed-edits", cat(&[&[2u8, 5], &noise(12, 40)])));
    let text = "[node]\nrank = 1\njob_id = 9\njob_secret = \"a very secret job key\"\n\
                [[peers]]\nrank = 0\naddress = \"10.77.0.1\"\nport = 7700\n\
                [[peers]]\nrank = 1\naddress = \"10.77.0.2\"\nport = 7700\n\
                [loss]\nbudget = \"1%\"\n[datapath]\nkind = \"socket\"\n";
    v.push(("config", "seed-text", cat(&[&[0u8], text.as_bytes()])));
    // admin and metrics: every valid request, raw (mode byte 0).
    for (name, line) in [
        ("seed-stats", "stats\n"),
        ("seed-status", "status\n"),
        ("seed-reload", "reload\n"),
        ("seed-report", "report 5 6\n"),
    ] {
        v.push(("admin", name, cat(&[&[0u8], line.as_bytes()])));
    }
    v.push(("admin", "seed-assembled", cat(&[&[1u8], &noise(13, 24)])));
    v.push(("metrics", "seed-get", b"\0GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec()));
    v.push(("metrics", "seed-head", b"\0HEAD /?x=1 HTTP/1.0\r\n\r\n".to_vec()));
    v.push(("metrics", "seed-assembled", cat(&[&[1u8], &noise(14, 24)])));
    v
}

/// The seeds pass their checks (independent of what is on disk).
#[test]
fn seeds_pass() {
    for (target, name, data) in seeds() {
        let check = TARGETS.iter().find(|t| t.0 == target).expect("a target").1;
        let r = std::panic::catch_unwind(|| check(&data));
        assert!(r.is_ok(), "{target}/{name} fails its check");
    }
}

/// The clean endpoint seeds reach the oracle: every op completes on every rank.
#[test]
fn clean_endpoint_seeds_reach_the_oracle() {
    for (target, name, data) in seeds() {
        if target == "endpoint" && name.starts_with("seed-clean") {
            let s = dlcp_fuzz_check::endpoint::run(&data);
            assert!(s.ops > 0 && s.checked == s.ops, "{name}: {s:?}");
        }
    }
}

/// Writes the seeds into the corpora. Ignored: run by hand.
#[test]
#[ignore]
fn write_seed_corpus() {
    for (target, name, data) in seeds() {
        std::fs::create_dir_all(corpus_dir(target)).unwrap();
        std::fs::write(corpus_dir(target).join(name), data).unwrap();
    }
}

/// How far the endpoint corpus goes (`--nocapture` to see it).
#[test]
fn endpoint_corpus_depth() {
    let (mut n, mut checked, mut ops) = (0, 0, 0);
    for (name, data) in files("endpoint") {
        let s = dlcp_fuzz_check::endpoint::run(&data);
        println!("{name}: {s:?}");
        n += 1;
        ops += s.ops;
        checked += s.checked;
    }
    println!("{n} inputs, {ops} ops, {checked} checked against the oracle");
    assert!(checked > 0);
}
