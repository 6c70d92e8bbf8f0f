//! Micro benchmarks, each against a limit measured in the same run (see `main.rs`).

mod pipeline;

use std::hint::black_box;
use std::io::{ErrorKind, Read, Write};
use std::net::UdpSocket;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use dlcp::shm::server::{ServerConfig, ShmServer};
use dlcp::shm::{Geometry, Status, SubmitOptions, TrainerChannel};
use dlcp_proto::class::Class;
use dlcp_proto::wire::{self, Header, JobKey, KeyCache, MacKey, OVERHEAD, Packet, PacketType, Phase};

/// One result line: what dlcp reached, what the limit reached, in `unit`.
struct Figure {
    name: &'static str,
    what: &'static str,
    dlcp: f64,
    peer_name: &'static str,
    peer: f64,
    unit: &'static str,
    /// Bytes the measured loop touches, over and over (its working set).
    ws_bytes: u64,
    /// The working set in words.
    working_set: String,
}

/// Size of the last-level cache of CPU 0 (the largest data or unified cache in
/// sysfs), or 32 MiB if sysfs does not say.
fn llc_bytes() -> u64 {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    let mut best = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let ty = read(e.path().join("type")).unwrap_or_default();
        if ty == "Instruction" {
            continue;
        }
        if let Some(sz) = read(e.path().join("size")).and_then(|s| parse_size(&s)) {
            best = best.max(sz);
        }
    }
    if best == 0 { 32 << 20 } else { best }
}

/// A sysfs cache size: `32768K`, `1M`, or bytes.
fn parse_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok().map(|n| n * mult)
}

/// Working set of the benchmarks that stream data: twice the last-level
/// cache, at least 64 MiB, so every pass comes from memory as a tensor does.
fn streaming_bytes(llc: u64) -> usize {
    (2 * llc).max(64 << 20) as usize
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / f64::from(1u32 << 20))
}

/// Calls `f` in batches of `batch` until `dur` has passed; returns calls per second.
fn rate(dur: Duration, batch: u64, mut f: impl FnMut()) -> f64 {
    for _ in 0..batch.min(1000) {
        f();
    }
    let start = Instant::now();
    let mut n = 0u64;
    loop {
        for _ in 0..batch {
            f();
        }
        n += batch;
        let e = start.elapsed();
        if e >= dur {
            return n as f64 / e.as_secs_f64();
        }
    }
}

fn data_header(payload_len: usize) -> Header {
    let mut h = Header::new(PacketType::Data, Class::new(3).expect("class 3"), Phase::Scatter);
    h.job = 1;
    h.run = 1;
    h.src = 0;
    h.dst = 1;
    h.op = 77;
    h.tensor = 5;
    h.chunk_count = 1000;
    h.required = 990;
    h.budget_ppm = 10_000;
    h.payload_len = payload_len as u16;
    h
}

/// Kernel UDP send rate on 127.0.0.1, 1472-byte datagrams, one thread, receiver
/// drained between bursts (the per-core packet rate a socket datapath can reach).
fn udp_send_pps(dur: Duration) -> Result<f64, String> {
    let e = |e: std::io::Error| format!("udp: {e}");
    let rx = UdpSocket::bind("127.0.0.1:0").map_err(e)?;
    let tx = UdpSocket::bind("127.0.0.1:0").map_err(e)?;
    tx.connect(rx.local_addr().map_err(e)?).map_err(e)?;
    rx.set_nonblocking(true).map_err(e)?;
    tx.set_nonblocking(true).map_err(e)?;
    let msg = vec![0x5Au8; 1472];
    let mut buf = vec![0u8; 65536];
    let mut sent = 0u64;
    let start = Instant::now();
    while start.elapsed() < dur {
        for _ in 0..32 {
            match tx.send(&msg) {
                Ok(_) => sent += 1,
                Err(x) if x.kind() == ErrorKind::WouldBlock => break,
                Err(x) => return Err(e(x)),
            }
        }
        loop {
            match rx.recv(&mut buf) {
                Ok(_) => {}
                Err(x) if x.kind() == ErrorKind::WouldBlock => break,
                Err(x) => return Err(e(x)),
            }
        }
    }
    Ok(sent as f64 / start.elapsed().as_secs_f64())
}

/// `count` datagrams of `size` bytes, back to back, each encoded from the
/// next `size - OVERHEAD` bytes of a tensor of that many bytes (as the datapath
/// cuts a tensor into chunks), under packet numbers 0, 1, …. Returns (tensor
/// bytes, datagrams).
fn datagram_stream(key: &MacKey, h: &Header, size: usize, count: usize) -> (Vec<u8>, Vec<u8>) {
    let pl = size - OVERHEAD;
    let tensor: Vec<u8> = (0..pl * count).map(|i| (i * 31 + 7) as u8).collect();
    let mut pkts = vec![0u8; size * count];
    for (i, (src, out)) in tensor.chunks_exact(pl).zip(pkts.chunks_exact_mut(size)).enumerate() {
        let h = Header { packet: i as u64, ..*h };
        wire::seal(key, &h, out, |p| p.copy_from_slice(src)).expect("encode");
    }
    (tensor, pkts)
}

/// The job key of the benchmark and the sending rank's own packet key for `h`.
fn keys(h: &Header) -> (JobKey, MacKey) {
    let job = JobKey::new(b"bench secret");
    let own = job.sender_key(h.sender());
    (job, own)
}

fn header_figures(dur: Duration, udp_pps: f64, big: usize) -> Vec<Figure> {
    let size = 1472;
    let h = data_header(size - OVERHEAD);
    let (job, key) = keys(&h);
    let count = big / size;
    let (tensor, mut pkts) = datagram_stream(&key, &h, size, count);
    let stream_ws = (tensor.len() + pkts.len()) as u64;
    let stream = format!("{count} datagrams = {} (2x LLC or more: from memory, as a tensor)", mib(stream_ws));
    let mut hdr = [0u8; wire::HEADER_LEN];
    // Header only: emit into 64 bytes; parse (bounds + field checks) from a full datagram.
    let emit = rate(dur, 1024, || {
        black_box(&h).emit(black_box(&mut hdr[..])).expect("emit");
    });
    let first = pkts[..size].to_vec();
    let parse = rate(dur, 1024, || {
        let p = Packet::new_checked(black_box(&first[..])).expect("packet");
        black_box(Header::parse(&p).expect("parse"));
    });
    let both = 1.0 / (1.0 / emit + 1.0 / parse);
    // Full datagram, as the datapath does it: header + payload copy + AES-128-GMAC
    // tag, walking through the tensor and the datagrams; the receiver's keys cached.
    let pl = size - OVERHEAD;
    let mut cache = KeyCache::new(job, 2);
    let mut i = 0;
    let decode = rate(dur, 256, || {
        black_box(cache.decode(black_box(&pkts[i * size..(i + 1) * size])).expect("decode"));
        i = (i + 1) % count;
    });
    let encode = rate(dur, 256, || {
        let o = &mut pkts[i * size..(i + 1) * size];
        let h = Header { packet: i as u64, ..h };
        let p = black_box(&tensor[i * pl..(i + 1) * pl]);
        black_box(wire::seal(&key, black_box(&h), o, |b| b.copy_from_slice(p)).expect("encode"));
        i = (i + 1) % count;
    });
    let full = 1.0 / (1.0 / encode + 1.0 / decode);
    let (verify, one) = mac_rates(dur, &key, &pkts, size);
    let fig = |name, what, dlcp, ws_bytes, working_set: &str| Figure {
        name,
        what,
        dlcp,
        peer_name: "kernel UDP send 1472 B, one core",
        peer: udp_pps,
        unit: "pkt/s",
        ws_bytes,
        working_set: working_set.to_string(),
    };
    vec![
        fig(
            "header_codec",
            "80-byte header emit + parse, per core",
            both,
            (wire::HEADER_LEN + size) as u64,
            "one header and one datagram (cache-resident: per-packet CPU only)",
        ),
        fig(
            "packet_codec_mac",
            "1472-byte datagram encode + decode with AES-128-GMAC tag, per core",
            full,
            stream_ws,
            &stream,
        ),
        fig(
            "mac_verify",
            "AES-128-GMAC check of one 1472-byte datagram at a time (header + payload slices), per core",
            verify,
            pkts.len() as u64,
            &format!("{count} datagrams = {}", mib(pkts.len() as u64)),
        ),
        fig(
            "mac_single",
            "AES-128-GMAC tag of one 1472-byte datagram at a time (header + payload slices), per core",
            one,
            pkts.len() as u64,
            &format!("{count} datagrams = {}", mib(pkts.len() as u64)),
        ),
    ]
}

/// Checks and tags per second of the datagrams of `size` bytes in `pkts`, one
/// at a time, header and payload as separate slices (as the datapath holds
/// them), walking through the whole buffer.
fn mac_rates(dur: Duration, key: &MacKey, pkts: &[u8], size: usize) -> (f64, f64) {
    let count = pkts.len() / size;
    let parts = |k: usize| {
        let d = &pkts[k * size..(k + 1) * size];
        (&d[..wire::HEADER_LEN], &d[wire::HEADER_LEN..size - wire::TAG_LEN], &d[size - wire::TAG_LEN..])
    };
    let mut i = 0;
    let verify = rate(dur, 256, || {
        let (h, p, t) = parts(i);
        assert!(key.check_parts(black_box(h), black_box(p), t));
        i = (i + 1) % count;
    });
    let one = rate(dur, 256, || {
        let (h, p, _) = parts(i);
        black_box(key.tag_parts(black_box(h), black_box(p)));
        i = (i + 1) % count;
    });
    (verify, one)
}

/// The MAC at MTU 9000 (8972-byte datagrams), in GB/s of tagged bytes, vs
/// `memcpy` of the same buffer: how much dearer the MAC is than one pass over
/// the bytes.
fn jumbo_mac_figures(dur: Duration, big: usize, copy_gbs: f64) -> Vec<Figure> {
    let size = 8972;
    let h = data_header(size - OVERHEAD);
    let (_, key) = keys(&h);
    let count = big / size;
    let (_, pkts) = datagram_stream(&key, &h, size, count);
    let (verify, one) = mac_rates(dur, &key, &pkts, size);
    let gbs = |pps: f64| pps * (size - wire::TAG_LEN) as f64 / 1e9;
    let ws = format!("{count} datagrams = {}", mib(pkts.len() as u64));
    let fig = |name, what, dlcp| Figure {
        name,
        what,
        dlcp,
        peer_name: "memcpy of a buffer of the same size",
        peer: copy_gbs,
        unit: "GB/s",
        ws_bytes: pkts.len() as u64,
        working_set: ws.clone(),
    };
    vec![
        fig(
            "mac_verify_jumbo",
            "AES-128-GMAC check of one 8972-byte datagram (MTU 9000) at a time, per core",
            gbs(verify),
        ),
        fig(
            "mac_single_jumbo",
            "AES-128-GMAC tag of one 8972-byte datagram (MTU 9000) at a time, per core",
            gbs(one),
        ),
    ]
}

/// f32 sum `dst += src` (the endpoint's reduce loop) vs `memcpy` of the same
/// bytes, over `big` bytes per buffer. Returns the figure and memcpy's GB/s.
fn aggregation_figure(dur: Duration, big: usize) -> (Figure, f64) {
    let n = big / 4;
    let src: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 1e-3).collect();
    let mut dst: Vec<f32> = vec![0.5; n];
    let bytes = (n * 4) as f64;
    let sum = rate(dur, 1, || {
        dst.iter_mut().zip(black_box(&src)).for_each(|(d, x)| *d += *x);
        black_box(&dst);
    }) * bytes;
    let copy = rate(dur, 1, || {
        dst.copy_from_slice(black_box(&src));
        black_box(&dst);
    }) * bytes;
    let fig = Figure {
        name: "aggregation",
        what: "f32 sum dst += src, bytes of src per second",
        dlcp: sum / 1e9,
        peer_name: "memcpy of the same bytes",
        peer: copy / 1e9,
        unit: "GB/s",
        ws_bytes: 2 * (n * 4) as u64,
        working_set: format!("src + dst = 2 x {}", mib((n * 4) as u64)),
    };
    (fig, copy / 1e9)
}

/// An in-process daemon side of the shared-memory channel, in a thread: it serves
/// each descriptor as the daemon does (copy the tensor out of the arena, copy a
/// result back in, complete), until the trainer detaches.
fn shm_server(
    dir: &std::path::Path,
    arena: u64,
) -> Result<(std::path::PathBuf, std::thread::JoinHandle<()>), String> {
    let path = dir.join("bench.sock");
    let mut cfg = ServerConfig::new(&path, 0o600);
    cfg.geometry = Geometry::new(256, 256, arena).map_err(|e| format!("geometry: {e}"))?;
    let mut server = ShmServer::bind(cfg).map_err(|e| format!("bind: {e}"))?;
    let t = std::thread::spawn(move || {
        let mut att = loop {
            let _ = server.wait_acceptable(Some(Duration::from_secs(5)));
            match server.accept() {
                Ok(Some(a)) => break a,
                Ok(None) => continue,
                Err(e) => panic!("accept: {e}"),
            }
        };
        let mut buf: Vec<f32> = Vec::new();
        loop {
            let w = att.wait(Some(Duration::from_secs(5))).expect("wait");
            while let Ok(Some(s)) = att.next_submission() {
                buf.resize(s.span.len_elems as usize, 0.0);
                att.copy_from_arena_into(s.span.offset, &mut buf).expect("copy out");
                att.copy_to_arena(s.span.offset, &buf).expect("copy in");
                att.complete_submission(&s, Status::Ok, 1_000_000, 0, Duration::ZERO).expect("complete");
            }
            if w.control && att.liveness() != dlcp::shm::server::Liveness::Alive {
                return;
            }
        }
    });
    Ok((path, t))
}

fn shm_figures(dur: Duration, big: usize) -> Result<Vec<Figure>, String> {
    let dir = std::env::temp_dir().join(format!("dlcp-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let r = (|| {
        let (path, server) = shm_server(&dir, (big + (4 << 20)) as u64)?;
        let mut cl = TrainerChannel::attach(&path, 1, 0, 1).map_err(|e| format!("attach: {e}"))?;
        let op = |cl: &mut TrainerChannel, t: &dlcp::shm::Tensor| {
            cl.submit(t, SubmitOptions::default()).expect("submit");
            let c = cl.wait_completion(Duration::from_secs(10)).expect("completion");
            assert_eq!(c.status, Status::Ok);
        };
        let small = cl.alloc("small", 1).map_err(|e| e.to_string())?;
        let rts = rate(dur, 64, || op(&mut cl, &small));
        let n = big / 4; // a tensor beyond the last-level cache
        let big = cl.alloc("big", n as u64).map_err(|e| e.to_string())?;
        cl.write(&big, &vec![0.25f32; n]).map_err(|e| e.to_string())?;
        let big_rate = rate(dur, 1, || op(&mut cl, &big)) * (n * 4) as f64;
        drop(cl);
        server.join().map_err(|_| "shm server thread panicked".to_string())?;
        // Limits: a 64-byte ping-pong over a Unix socket pair between two threads
        // (the cheapest kernel round trip), and memcpy of the tensor's bytes.
        let (mut a, mut b) = UnixStream::pair().map_err(|e| e.to_string())?;
        let echo = std::thread::spawn(move || {
            let mut m = [0u8; 64];
            while b.read_exact(&mut m).is_ok() {
                if b.write_all(&m).is_err() {
                    break;
                }
            }
        });
        let mut m = [0u8; 64];
        let unix_rts = rate(dur, 64, || {
            a.write_all(&m).expect("ping");
            a.read_exact(&mut m).expect("pong");
        });
        drop(a);
        let _ = echo.join();
        let src = vec![0.25f32; n];
        let mut dst = vec![0f32; n];
        let copy = rate(dur, 1, || {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        }) * (n * 4) as f64;
        Ok(vec![
            Figure {
                name: "shm_round_trip",
                what: "descriptor submit -> daemon thread -> completion, 1-element tensor",
                dlcp: rts,
                peer_name: "64-byte ping-pong over a Unix socket pair",
                peer: unix_rts,
                unit: "round trips/s",
                ws_bytes: 4,
                working_set: "one 1-element tensor and its descriptors (per-op overhead only)".into(),
            },
            Figure {
                name: "shm_tensor",
                what: "tensor trainer -> daemon -> trainer (copy out + copy in, as dlcpd does)",
                dlcp: big_rate / 1e9,
                peer_name: "one memcpy of the same bytes (two copies: ideal ratio 0.5)",
                peer: copy / 1e9,
                unit: "GB/s",
                ws_bytes: 2 * (n * 4) as u64,
                working_set: format!("arena tensor + daemon buffer = 2 x {}", mib((n * 4) as u64)),
            },
        ])
    })();
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn fmt(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.2}")
    }
}

pub fn main(args: &[String]) -> Result<(), String> {
    let ms: u64 = crate::flag(args, "--ms")?.unwrap_or(700);
    let dur = Duration::from_millis(ms);
    let llc = llc_bytes();
    let big = streaming_bytes(llc);
    eprintln!(
        "micro benchmarks: {ms} ms per figure, one thread each (the shm channel: two); last-level cache {}, \
         streaming working sets of {} per buffer",
        mib(llc),
        mib(big as u64)
    );
    let only = crate::flag::<String>(args, "--only")?;
    let udp = udp_send_pps(dur.max(Duration::from_millis(300)))?;
    let mut figs = Vec::new();
    if only.is_none() {
        figs.extend(header_figures(dur, udp, big));
        let (agg, copy_gbs) = aggregation_figure(dur, big);
        figs.extend(jumbo_mac_figures(dur, big, copy_gbs));
        figs.push(agg);
        figs.extend(shm_figures(dur, big)?);
    }
    // Alone (--only), one of the endpoint pipeline's rows runs: the pipeline
    // knows their names.
    figs.extend(pipeline::figures(dur, udp, only.as_deref())?);
    let mut json = Vec::new();
    for f in &figs {
        let ratio = f.dlcp / f.peer;
        println!(
            "{}: dlcp {} {}, peer {} {}, ratio {:.2}   ({}; peer: {}; working set {})",
            f.name,
            fmt(f.dlcp),
            f.unit,
            fmt(f.peer),
            f.unit,
            ratio,
            f.what,
            f.peer_name,
            f.working_set
        );
        json.push(format!(
            "{{\"name\":\"{}\",\"what\":\"{}\",\"dlcp\":{},\"peer_name\":\"{}\",\"peer\":{},\"unit\":\"{}\",\"ratio\":{},\
             \"ws_bytes\":{},\"working_set\":\"{}\",\"llc_bytes\":{llc}}}",
            f.name, f.what, f.dlcp, f.peer_name, f.peer, f.unit, ratio, f.ws_bytes, f.working_set
        ));
    }
    println!("JSON [{}]", json.join(","));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse_and_streaming_sets_exceed_the_llc() {
        assert_eq!(parse_size("32768K"), Some(32 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("x"), None);
        let llc = llc_bytes();
        assert!(llc >= 64 << 10, "last-level cache {llc}");
        assert!(streaming_bytes(llc) as u64 >= 2 * llc && streaming_bytes(llc) >= 64 << 20);
        assert_eq!(streaming_bytes(128 << 20), 256 << 20);
    }
}
