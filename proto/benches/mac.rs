//! MAC cost versus the per-core packet rate of a kernel UDP datapath.
//!
//! `cargo bench -p dlcp-proto --bench mac` measures, in one run and on one core:
//!
//! 1. keyed-BLAKE3 tag computation and tag verification for 1472- and
//!    9000-byte datagrams (packets/s and GB/s of authenticated bytes);
//! 2. the full `wire::encode` / `wire::decode` rate for the same sizes;
//! 3. a plain kernel UDP datapath: a non-blocking `UdpSocket` pair on
//!    127.0.0.1, one thread sending 1472-byte datagrams in bursts and draining
//!    the receiver between bursts for ~1 s (sent and received counted);
//!
//! and prints `MAC rate / UDP rate`. The requirement is MAC throughput ≥ 3× the
//! per-core packet rate the datapath reaches.
//!
//! For comparison it also measures HMAC-SHA256 truncated to 16 bytes (RustCrypto
//! `hmac` + `sha2`, which use SHA-NI when the CPU has it), with the keyed
//! ipad/opad state precomputed once, as a daemon would.
//!
//! Optional arguments: a duration per measurement in milliseconds (default 700)
//! and, after `--`, nothing else (cargo passes `--bench`, which is ignored).

use dlcp_proto::class::Class;
use dlcp_proto::wire::{self, Header, MacKey, OVERHEAD, Packet, PacketType, Phase, TAG_LEN};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::hint::black_box;
use std::io::ErrorKind;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// Runs `f` in batches until `dur` has passed; returns operations per second.
fn rate(dur: Duration, mut f: impl FnMut()) -> f64 {
    // Warm up.
    for _ in 0..1000 {
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

fn data_header(payload_len: usize) -> Header {
    let mut h = Header::new(PacketType::Data, Class::new(3).unwrap(), Phase::Scatter);
    h.job = 1;
    h.generation = 1;
    h.src = 0;
    h.dst = 1;
    h.op = 77;
    h.tensor = 5;
    h.chunk_index = 0;
    h.chunk_count = 1000;
    h.required = 10;
    h.budget_ppm = 10_000;
    h.payload_len = payload_len as u16;
    h
}

struct MacFigures {
    size: usize,
    tag_pps: f64,
    verify_pps: f64,
    encode_pps: f64,
    decode_pps: f64,
}

fn measure_mac(size: usize, dur: Duration) -> MacFigures {
    let key = MacKey::derive(b"bench secret");
    let payload: Vec<u8> = (0..size - OVERHEAD).map(|i| i as u8).collect();
    let h = data_header(payload.len());
    let mut pkt = vec![0u8; size];
    assert_eq!(wire::encode(&key, &h, &payload, &mut pkt).unwrap(), size);

    let tag_pps = rate(dur, || {
        black_box(key.tag(black_box(&pkt[..size - TAG_LEN])));
    });
    let verify_pps = rate(dur, || {
        let p = Packet::new_checked(black_box(&pkt[..])).unwrap();
        p.verify(&key).unwrap();
    });
    let mut out = vec![0u8; size];
    let encode_pps = rate(dur, || {
        black_box(wire::encode(&key, black_box(&h), black_box(&payload), &mut out).unwrap());
    });
    let decode_pps = rate(dur, || {
        black_box(wire::decode(&key, black_box(&pkt[..])).unwrap());
    });
    MacFigures { size, tag_pps, verify_pps, encode_pps, decode_pps }
}

/// HMAC-SHA256/128: tag and constant-time verify rates.
fn measure_hmac(size: usize, dur: Duration) -> (f64, f64) {
    let keyed = Hmac::<Sha256>::new_from_slice(&[0x42; 32]).unwrap();
    let pkt: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let tag = |m: &[u8]| -> [u8; TAG_LEN] {
        let mut mac = keyed.clone();
        mac.update(m);
        let full = mac.finalize().into_bytes();
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&full[..TAG_LEN]);
        t
    };
    let want = tag(&pkt[..size - TAG_LEN]);
    let tag_pps = rate(dur, || {
        black_box(tag(black_box(&pkt[..size - TAG_LEN])));
    });
    let verify_pps = rate(dur, || {
        let mut mac = keyed.clone();
        mac.update(black_box(&pkt[..size - TAG_LEN]));
        mac.verify_truncated_left(black_box(&want)).unwrap();
    });
    (tag_pps, verify_pps)
}

struct UdpFigures {
    sent_pps: f64,
    recv_pps: f64,
    send_only_pps: f64,
}

/// AES-128-GMAC (GCM with the packet as associated data and no plaintext), 16-byte tag,
/// nonce from the packet's position (a real design would carry a per-sender counter).
fn measure_gmac(size: usize, dur: Duration) -> f64 {
    use aes_gcm::aead::{AeadInPlace, KeyInit};
    let cipher = aes_gcm::Aes128Gcm::new_from_slice(&[7u8; 16]).unwrap();
    let pkt = vec![0x5au8; size - TAG_LEN];
    let mut n = 0u64;
    rate(dur, || {
        n += 1;
        let mut nonce = [0u8; 12];
        nonce[..8].copy_from_slice(&n.to_le_bytes());
        let mut empty: [u8; 0] = [];
        let tag = cipher.encrypt_in_place_detached((&nonce).into(), black_box(&pkt), &mut empty).unwrap();
        black_box(tag);
    })
}

/// Poly1305 with a one-time key per packet derived by keyed BLAKE3 from the
/// 64-byte header (which would carry a unique per-sender counter).
fn measure_poly(size: usize, dur: Duration) -> f64 {
    use poly1305::universal_hash::KeyInit;
    let key = MacKey::derive(b"bench");
    let pkt = vec![0x5au8; size - TAG_LEN];
    rate(dur, || {
        let k = key.tag(black_box(&pkt[..64]));
        let mut k32 = [0u8; 32];
        k32[..16].copy_from_slice(&k);
        k32[16..].copy_from_slice(&k);
        let tag = poly1305::Poly1305::new((&k32).into()).compute_unpadded(black_box(&pkt));
        black_box(tag);
    })
}

fn measure_udp(dur: Duration) -> std::io::Result<UdpFigures> {
    const SIZE: usize = 1472;
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    tx.connect(rx.local_addr()?)?;
    rx.set_nonblocking(true)?;
    tx.set_nonblocking(true)?;
    let msg = vec![0x5Au8; SIZE];
    let mut buf = vec![0u8; 65536];

    // Send and receive on one core: bursts of 32 sends, then drain.
    let (mut sent, mut recvd) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < dur {
        for _ in 0..32 {
            match tx.send(&msg) {
                Ok(_) => sent += 1,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        loop {
            match rx.recv(&mut buf) {
                Ok(_) => recvd += 1,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let (sent_pps, recv_pps) = (sent as f64 / secs, recvd as f64 / secs);

    // Send only (the receiver's buffer overflows and the kernel drops): the
    // sender-side cost of a datagram, loopback delivery included.
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
    let send_only_pps = sent as f64 / start.elapsed().as_secs_f64();
    Ok(UdpFigures { sent_pps, recv_pps, send_only_pps })
}

fn main() {
    let ms = std::env::args().skip(1).find_map(|a| a.parse::<u64>().ok()).unwrap_or(700);
    let dur = Duration::from_millis(ms);
    println!("dlcp MAC benchmark (keyed BLAKE3, 16-byte tag), one thread, {ms} ms per figure");
    println!();

    let udp = measure_udp(Duration::from_millis(ms.max(1000)));
    let macs: Vec<MacFigures> = [1472, 9000].into_iter().map(|s| measure_mac(s, dur)).collect();
    let hmacs: Vec<(usize, f64, f64)> = [1472, 9000]
        .into_iter()
        .map(|s| {
            let (t, v) = measure_hmac(s, dur);
            (s, t, v)
        })
        .collect();

    println!("{:>6}  {:>22}  {:>22}  {:>12}  {:>12}", "bytes", "tag", "verify", "encode", "decode");
    for m in &macs {
        let gbs = |pps: f64| pps * (m.size - TAG_LEN) as f64 / 1e9;
        println!(
            "{:>6}  {:>9.0} pps {:>5.2} GB/s  {:>9.0} pps {:>5.2} GB/s  {:>8.0} pps  {:>8.0} pps",
            m.size,
            m.tag_pps,
            gbs(m.tag_pps),
            m.verify_pps,
            gbs(m.verify_pps),
            m.encode_pps,
            m.decode_pps
        );
        println!(
            "{:>6}  MAC cost {:.0} ns/packet to tag, {:.0} ns to verify; tag + verify {:.0} ns",
            "",
            1e9 / m.tag_pps,
            1e9 / m.verify_pps,
            1e9 / m.tag_pps + 1e9 / m.verify_pps
        );
    }
    // Batched tags (MacKey::tag_many, what dlcpd uses): 64 messages per call.
    for size in [1472usize, 1456] {
        let key = MacKey::derive(b"bench secret");
        let data: Vec<u8> = (0..size * 64).map(|i| (i * 7) as u8).collect();
        let msgs: Vec<&[u8]> = data.chunks(size).map(|c| &c[..size - TAG_LEN]).collect();
        let mut out = vec![[0u8; TAG_LEN]; msgs.len()];
        let calls = rate(dur, || key.tag_many(black_box(&msgs), &mut out));
        let pps = calls * msgs.len() as f64;
        println!(
            "{size:>6}  tag_many (64 per call): {pps:>9.0} pps {:>5.2} GB/s, {:.0} ns/packet",
            pps * (size - TAG_LEN) as f64 / 1e9,
            1e9 / pps
        );
    }
    println!();
    let sha_ni = std::arch::is_x86_feature_detected!("sha");
    println!("HMAC-SHA256/128 for comparison (SHA-NI {}):", if sha_ni { "present" } else { "absent" });
    for &(size, t, v) in &hmacs {
        let gbs = |pps: f64| pps * (size - TAG_LEN) as f64 / 1e9;
        println!(
            "{:>6}  {:>9.0} pps {:>5.2} GB/s  {:>9.0} pps {:>5.2} GB/s   ({:.0} ns/packet to tag)",
            size,
            t,
            gbs(t),
            v,
            gbs(v),
            1e9 / t
        );
    }
    println!();

    match udp {
        Ok(u) => {
            println!(
                "kernel UDP 127.0.0.1, 1472-byte datagrams, one thread: send+drain {:.0} pps sent / {:.0} pps received; send only {:.0} pps",
                u.sent_pps, u.recv_pps, u.send_only_pps
            );
            let udp_rate = u.sent_pps.max(u.send_only_pps);
            let m = &macs[0];
            let verify_ratio = m.verify_pps / udp_rate;
            let both = 1.0 / (1.0 / m.tag_pps + 1.0 / m.verify_pps);
            println!(
                "ratio (1472 B): MAC verify rate / UDP send rate = {:.1}x; tag rate / UDP = {:.1}x; tag+verify on one core / UDP = {:.1}x; decode / UDP = {:.1}x",
                verify_ratio,
                m.tag_pps / udp_rate,
                both / udp_rate,
                m.decode_pps / udp_rate
            );
            println!(
                "requirement MAC >= 3x UDP per-core rate: keyed BLAKE3 {}",
                if verify_ratio >= 3.0 && m.tag_pps / udp_rate >= 3.0 { "MET" } else { "NOT MET" }
            );
            let gmac = measure_gmac(1472, dur);
            let poly = measure_poly(1472, dur);
            println!(
                "alternatives (1472 B, tag): AES-128-GMAC {:.0} pps = {:.1}x UDP; BLAKE3-keyed Poly1305 {:.0} pps = {:.1}x UDP",
                gmac,
                gmac / udp_rate,
                poly,
                poly / udp_rate
            );
            let (_, ht, hv) = hmacs[0];
            println!(
                "HMAC-SHA256 (1472 B): tag / UDP = {:.1}x, verify / UDP = {:.1}x -> {}",
                ht / udp_rate,
                hv / udp_rate,
                if ht.min(hv) / udp_rate >= 3.0 { "MET" } else { "NOT MET" }
            );
        }
        Err(e) => println!("kernel UDP datapath not measured: {e}"),
    }
}
