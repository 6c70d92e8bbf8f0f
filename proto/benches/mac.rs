//! The per-packet MAC: candidates measured against each other and against the
//! kernel's UDP send rate, in one run, on one core.
//!
//! `cargo bench -p dlcp-proto --bench mac [-- MS]` measures, for 1472-byte
//! (MTU 1500) and 8972-byte (MTU 9000) datagrams:
//!
//! 1. every candidate MAC, tagging and verifying one datagram at a time, the
//!    datagram given as two slices (64/80-byte header, payload) the way the
//!    datapath holds it, over a working set of [`WORKING_SET`] bytes of
//!    datagrams (at least twice the last-level cache of the machines dlcp is
//!    measured on, so the bytes come from memory as a tensor's would);
//! 2. dlcp's own [`MacKey`] (AES-128-GCM as a MAC through aws-lc-rs, the
//!    first candidate below with dlcp's real 80-byte header and packet
//!    numbers), and a whole datagram: `wire::seal` (header, payload copy, tag)
//!    and [`KeyCache::decode`] (structure, tag with the cached sender key,
//!    fields);
//! 3. the kernel UDP datapath: a non-blocking `UdpSocket` pair on 127.0.0.1,
//!    one thread sending datagrams of the same size (send only: the receiver
//!    overflows and the kernel drops), and `memcpy` of the same working set.
//!
//! The candidates, each through its crate's public API:
//!
//! - keyed BLAKE3 (the `blake3` crate), one datagram at a time;
//! - AES-128-GCM used as a MAC (aws-lc-rs, ring, RustCrypto `aes-gcm`): the
//!   payload is the associated data, a copy of the header the plaintext, the
//!   ciphertext is thrown away and the tag kept (see the `wire::mac` docs for
//!   why that is sound); a fresh nonce per datagram;
//! - AES-128-GCM-SIV (aws-lc-rs) the same way with a fixed nonce (it is
//!   nonce-misuse resistant);
//! - ChaCha20-Poly1305 (aws-lc-rs) the same way;
//! - AES-128-CMAC and HMAC-SHA256/128 (aws-lc-rs), over header then payload.
//!
//! Verify is what a receiver does: recompute, then compare in constant time.
//! The argument, if any, is the duration of each figure in milliseconds
//! (default 500); cargo's `--bench` is ignored.

use aws_lc_rs::{aead, cmac, constant_time, hmac};
use dlcp_proto::class::Class;
use dlcp_proto::wire::{
    self, HEADER_LEN, Header, JobKey, KeyCache, MacKey, OVERHEAD, PacketType, Phase, TAG_LEN,
};
use std::hint::black_box;
use std::io::ErrorKind;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// Bytes of datagrams walked through: 64 MiB, twice a 32 MiB last-level cache.
const WORKING_SET: usize = 64 << 20;
/// The datagram sizes measured: the UDP payload of an MTU 1500 and an MTU 9000 IPv4 packet.
const SIZES: [usize; 2] = [1472, 8972];

/// Runs `f` until `dur` has passed; returns calls per second.
fn rate(dur: Duration, mut f: impl FnMut()) -> f64 {
    for _ in 0..2000 {
        f();
    }
    let start = Instant::now();
    let mut n = 0u64;
    loop {
        for _ in 0..256 {
            f();
        }
        n += 256;
        let e = start.elapsed();
        if e >= dur {
            return n as f64 / e.as_secs_f64();
        }
    }
}

/// A MAC over a datagram held as header and payload.
trait Candidate {
    /// The tag of `header ‖ payload`; `n` is the datagram's packet number
    /// (the nonce, for the nonce-based ones).
    fn tag(&self, n: u64, header: &[u8], payload: &[u8]) -> [u8; TAG_LEN];
}

/// GCM nonce from a packet number.
fn nonce(n: u64) -> aead::Nonce {
    let mut b = [0u8; aead::NONCE_LEN];
    b[4..].copy_from_slice(&n.to_be_bytes());
    aead::Nonce::assume_unique_for_key(b)
}

/// An aws-lc-rs AEAD as a MAC: payload as associated data, header as plaintext.
struct AwsAead(aead::LessSafeKey, bool);
impl Candidate for AwsAead {
    fn tag(&self, n: u64, header: &[u8], payload: &[u8]) -> [u8; TAG_LEN] {
        let mut h = [0u8; 128];
        let h = &mut h[..header.len()];
        h.copy_from_slice(header);
        let nonce = if self.1 { nonce(0) } else { nonce(n) };
        let t = self.0.seal_in_place_separate_tag(nonce, aead::Aad::from(payload), h).expect("seal");
        t.as_ref().try_into().expect("16-byte tag")
    }
}

/// ring's AES-128-GCM, the same construction.
struct RingGcm(ring::aead::LessSafeKey);
impl Candidate for RingGcm {
    fn tag(&self, n: u64, header: &[u8], payload: &[u8]) -> [u8; TAG_LEN] {
        let mut b = [0u8; 12];
        b[4..].copy_from_slice(&n.to_be_bytes());
        let mut h = [0u8; 128];
        let h = &mut h[..header.len()];
        h.copy_from_slice(header);
        let nonce = ring::aead::Nonce::assume_unique_for_key(b);
        let t = self.0.seal_in_place_separate_tag(nonce, ring::aead::Aad::from(payload), h).expect("seal");
        t.as_ref().try_into().expect("16-byte tag")
    }
}

/// RustCrypto's AES-128-GCM, the same construction.
struct RustCryptoGcm(aes_gcm::Aes128Gcm);
impl Candidate for RustCryptoGcm {
    fn tag(&self, n: u64, header: &[u8], payload: &[u8]) -> [u8; TAG_LEN] {
        use aes_gcm::aead::AeadInPlace;
        let mut b = [0u8; 12];
        b[4..].copy_from_slice(&n.to_be_bytes());
        let mut h = [0u8; 128];
        let h = &mut h[..header.len()];
        h.copy_from_slice(header);
        self.0.encrypt_in_place_detached((&b).into(), payload, h).expect("seal").into()
    }
}

/// Keyed BLAKE3 through the public API.
struct Blake3([u8; 32]);
impl Candidate for Blake3 {
    fn tag(&self, _: u64, header: &[u8], payload: &[u8]) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(header);
        h.update(payload);
        h.finalize().as_bytes()[..TAG_LEN].try_into().expect("16 bytes")
    }
}

/// AES-128-CMAC (aws-lc-rs).
struct Cmac(cmac::Key);
impl Candidate for Cmac {
    fn tag(&self, _: u64, header: &[u8], payload: &[u8]) -> [u8; TAG_LEN] {
        let mut c = cmac::Context::with_key(&self.0);
        c.update(header).expect("cmac");
        c.update(payload).expect("cmac");
        c.sign().expect("cmac").as_ref().try_into().expect("16 bytes")
    }
}

/// HMAC-SHA256 truncated to 16 bytes (aws-lc-rs; SHA-NI where present).
struct HmacSha256(hmac::Key);
impl Candidate for HmacSha256 {
    fn tag(&self, _: u64, header: &[u8], payload: &[u8]) -> [u8; TAG_LEN] {
        let mut c = hmac::Context::with_key(&self.0);
        c.update(header);
        c.update(payload);
        c.sign().as_ref()[..TAG_LEN].try_into().expect("16 bytes")
    }
}

/// dlcp's own packet MAC ([`MacKey`]) on a real header (its packet number is the nonce).
struct Dlcp(MacKey);
impl Candidate for Dlcp {
    fn tag(&self, _: u64, header: &[u8], payload: &[u8]) -> [u8; TAG_LEN] {
        self.0.tag_parts(header, payload)
    }
}

fn data_header(payload_len: usize) -> Header {
    let mut h = Header::new(PacketType::Data, Class::new(3).unwrap(), Phase::Scatter);
    h.job = 1;
    h.run = 1;
    h.src = 0;
    h.dst = 1;
    h.op = 77;
    h.tensor = 5;
    h.chunk_count = 1000;
    h.required = 10;
    h.budget_ppm = 10_000;
    h.payload_len = payload_len as u16;
    h
}

/// `WORKING_SET` bytes of real datagrams of `size` bytes, back to back.
struct Datagrams {
    size: usize,
    count: usize,
    bytes: Vec<u8>,
}

impl Datagrams {
    fn new(key: &MacKey, size: usize) -> Datagrams {
        let count = WORKING_SET / size;
        let mut bytes = vec![0u8; count * size];
        let pl = size - OVERHEAD;
        let payload: Vec<u8> = (0..pl).map(|i| (i * 31 + 7) as u8).collect();
        for (i, d) in bytes.chunks_exact_mut(size).enumerate() {
            let mut h = data_header(pl);
            h.chunk_index = (i % 1000) as u32;
            h.packet = i as u64;
            wire::seal(key, &h, d, |p| {
                p.copy_from_slice(&payload);
                p[..4].copy_from_slice(&(i as u32).to_le_bytes());
            })
            .expect("encode");
        }
        Datagrams { size, count, bytes }
    }

    fn get(&self, i: usize) -> (&[u8], &[u8], &[u8]) {
        let d = &self.bytes[i * self.size..(i + 1) * self.size];
        (&d[..HEADER_LEN], &d[HEADER_LEN..self.size - TAG_LEN], &d[self.size - TAG_LEN..])
    }
}

/// (tag rate, verify rate) of `c` over `d`, in datagrams per second.
fn measure(dur: Duration, c: &dyn Candidate, d: &Datagrams) -> (f64, f64) {
    let mut i = 0usize;
    let tag = rate(dur, || {
        let (h, p, _) = d.get(i);
        black_box(c.tag(i as u64, black_box(h), black_box(p)));
        i = (i + 1) % d.count;
    });
    // Verify against the candidate's own tags: computed once, kept beside.
    let want: Vec<[u8; TAG_LEN]> = (0..d.count)
        .map(|i| {
            let (h, p, _) = d.get(i);
            c.tag(i as u64, h, p)
        })
        .collect();
    let mut i = 0usize;
    let verify = rate(dur, || {
        let (h, p, _) = d.get(i);
        let got = c.tag(i as u64, black_box(h), black_box(p));
        assert!(constant_time::verify_slices_are_equal(&got, black_box(&want[i])).is_ok());
        i = (i + 1) % d.count;
    });
    (tag, verify)
}

/// Datagrams per second one thread sends of `size` bytes on loopback.
fn udp_send_rate(dur: Duration, size: usize) -> std::io::Result<f64> {
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    tx.connect(rx.local_addr()?)?;
    tx.set_nonblocking(true)?;
    let msg = vec![0x5Au8; size];
    let mut sent = 0u64;
    let start = Instant::now();
    while start.elapsed() < dur {
        for _ in 0..32 {
            match tx.send(&msg) {
                Ok(_) => sent += 1,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
    }
    Ok(sent as f64 / start.elapsed().as_secs_f64())
}

fn main() {
    let ms = std::env::args().skip(1).find_map(|a| a.parse::<u64>().ok()).unwrap_or(500);
    let dur = Duration::from_millis(ms);
    let has = |yes: bool, f: &'static str| if yes { f } else { "-" };
    println!(
        "dlcp MAC benchmark: one thread, {ms} ms per figure, working set {} MiB per size; CPU: {} {} {} {} {}",
        WORKING_SET >> 20,
        has(std::arch::is_x86_feature_detected!("aes"), "aes"),
        has(std::arch::is_x86_feature_detected!("pclmulqdq"), "pclmulqdq"),
        has(std::arch::is_x86_feature_detected!("vaes"), "vaes"),
        has(std::arch::is_x86_feature_detected!("avx512f"), "avx512f"),
        has(std::arch::is_x86_feature_detected!("sha"), "sha")
    );
    let k16 = [7u8; 16];
    let k32 = [7u8; 32];
    let aws = |alg| aead::LessSafeKey::new(aead::UnboundKey::new(alg, &k16).expect("key"));
    let job = JobKey::new(b"bench secret");
    let dlcp_key = job.sender_key(data_header(0).sender());
    let candidates: Vec<(&str, Box<dyn Candidate>)> = vec![
        (
            "dlcp MacKey::tag_parts (AES-128-GCM as MAC, aws-lc-rs)",
            Box::new(Dlcp(job.sender_key(dlcp_key.id()))),
        ),
        ("keyed BLAKE3 (blake3)", Box::new(Blake3(k32))),
        ("AES-128-GCM as MAC (aws-lc-rs)", Box::new(AwsAead(aws(&aead::AES_128_GCM), false))),
        ("AES-128-GCM-SIV fixed nonce (aws-lc-rs)", Box::new(AwsAead(aws(&aead::AES_128_GCM_SIV), true))),
        (
            "ChaCha20-Poly1305 as MAC (aws-lc-rs)",
            Box::new(AwsAead(
                aead::LessSafeKey::new(aead::UnboundKey::new(&aead::CHACHA20_POLY1305, &k32).expect("key")),
                false,
            )),
        ),
        (
            "AES-128-GCM as MAC (ring)",
            Box::new(RingGcm(ring::aead::LessSafeKey::new(
                ring::aead::UnboundKey::new(&ring::aead::AES_128_GCM, &k16).expect("key"),
            ))),
        ),
        (
            "AES-128-GCM as MAC (RustCrypto)",
            Box::new(RustCryptoGcm(<aes_gcm::Aes128Gcm as aes_gcm::KeyInit>::new(&k16.into()))),
        ),
        ("AES-128-CMAC (aws-lc-rs)", Box::new(Cmac(cmac::Key::new(cmac::AES_128, &k16).expect("key")))),
        ("HMAC-SHA256/128 (aws-lc-rs)", Box::new(HmacSha256(hmac::Key::new(hmac::HMAC_SHA256, &k32)))),
    ];

    let mut udp = Vec::new();
    let mut copy = Vec::new();
    let mut rows: Vec<(String, Vec<(f64, f64)>)> =
        candidates.iter().map(|(n, _)| (n.to_string(), vec![])).collect();
    let mut codec = Vec::new();
    for &size in &SIZES {
        let d = Datagrams::new(&dlcp_key, size);
        udp.push(udp_send_rate(dur.max(Duration::from_millis(1000)), size));
        let mut dst = vec![0u8; size];
        let mut i = 0;
        copy.push(rate(dur, || {
            dst.copy_from_slice(&d.bytes[i * size..(i + 1) * size]);
            black_box(&dst);
            i = (i + 1) % d.count;
        }));
        for ((_, c), row) in candidates.iter().zip(&mut rows) {
            row.1.push(measure(dur, c.as_ref(), &d));
        }
        let pl = size - OVERHEAD;
        let payload = &d.bytes[HEADER_LEN..HEADER_LEN + pl];
        let mut h = data_header(pl);
        let mut out = vec![0u8; size];
        let enc = rate(dur, || {
            h.packet += 1;
            let p = black_box(payload);
            black_box(
                wire::seal(&dlcp_key, black_box(&h), &mut out, |b| b.copy_from_slice(p)).expect("encode"),
            );
        });
        let mut cache = KeyCache::new(job.clone(), 2);
        let mut i = 0;
        let dec = rate(dur, || {
            black_box(cache.decode(black_box(&d.bytes[i * size..(i + 1) * size])).expect("decode"));
            i = (i + 1) % d.count;
        });
        codec.push((enc, dec));
    }

    println!();
    println!("| MAC (16-byte tag) | 1472 B tag | 1472 B verify | 8972 B tag | 8972 B verify |");
    println!("|---|---:|---:|---:|---:|");
    let cell = |size: usize, pps: f64| format!("{:.2} GB/s, {:.0} ns", pps * size as f64 / 1e9, 1e9 / pps);
    for (name, r) in &rows {
        let cells: Vec<String> =
            SIZES.iter().zip(r).flat_map(|(&s, &(t, v))| [cell(s, t), cell(s, v)]).collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    let c: Vec<String> =
        SIZES.iter().zip(&codec).flat_map(|(&s, &(e, d))| [cell(s, e), cell(s, d)]).collect();
    println!("| dlcp wire::seal / KeyCache::decode (copy + header + MAC) | {} |", c.join(" | "));
    let m: Vec<String> = SIZES.iter().zip(&copy).flat_map(|(&s, &t)| [cell(s, t), "-".into()]).collect();
    println!("| memcpy of the datagram (reference) | {} |", m.join(" | "));
    let u: Vec<String> = SIZES
        .iter()
        .zip(&udp)
        .flat_map(|(&s, r)| match r {
            Ok(pps) => [cell(s, *pps), "-".into()],
            Err(e) => [format!("not measured: {e}"), "-".into()],
        })
        .collect();
    println!("| kernel UDP send, loopback (reference) | {} |", u.join(" | "));
    println!();
    for (k, &size) in SIZES.iter().enumerate() {
        let Ok(udp) = udp[k] else { continue };
        let ratios: Vec<String> = rows
            .iter()
            .map(|(n, r)| format!("{n} {:.1}x", 1.0 / (1.0 / r[k].0 + 1.0 / r[k].1) / udp))
            .collect();
        println!("{size} B, (tag + verify on one core) / UDP send rate: {}", ratios.join("; "));
    }
}
