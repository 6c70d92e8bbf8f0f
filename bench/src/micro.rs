//! Micro benchmarks, each against a limit measured in the same run (see `main.rs`).

use std::hint::black_box;
use std::io::{ErrorKind, Read, Write};
use std::net::UdpSocket;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use dlcp::shm::server::{ServerConfig, ShmServer};
use dlcp::shm::{Geometry, Status, SubmitOptions, TrainerChannel};
use dlcp_proto::priority::Class;
use dlcp_proto::wire::{self, Header, MacKey, OVERHEAD, Packet, PacketType, Phase};

/// One result line: what dlcp reached, what the limit reached, in `unit`.
struct Figure {
    name: &'static str,
    what: &'static str,
    dlcp: f64,
    peer_name: &'static str,
    peer: f64,
    unit: &'static str,
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
    h.generation = 1;
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

fn header_figures(dur: Duration, udp_pps: f64) -> Vec<Figure> {
    let key = MacKey::derive(b"bench secret");
    let size = 1472;
    let payload: Vec<u8> = (0..size - OVERHEAD).map(|i| i as u8).collect();
    let h = data_header(payload.len());
    let mut pkt = vec![0u8; size];
    wire::encode(&key, &h, &payload, &mut pkt).expect("encode");
    let mut hdr = [0u8; wire::HEADER_LEN];
    // Header only: emit into 64 bytes; parse (bounds + field checks) from a full datagram.
    let emit = rate(dur, 1024, || {
        black_box(&h).emit(black_box(&mut hdr[..])).expect("emit");
    });
    let parse = rate(dur, 1024, || {
        let p = Packet::new_checked(black_box(&pkt[..])).expect("packet");
        black_box(Header::parse(&p).expect("parse"));
    });
    let both = 1.0 / (1.0 / emit + 1.0 / parse);
    // Full datagram, as the datapath does it: header + payload copy + keyed-BLAKE3 tag.
    let mut out = vec![0u8; size];
    let encode = rate(dur, 256, || {
        black_box(wire::encode(&key, black_box(&h), black_box(&payload), &mut out).expect("encode"));
    });
    let decode = rate(dur, 256, || {
        black_box(wire::decode(&key, black_box(&pkt[..])).expect("decode"));
    });
    let full = 1.0 / (1.0 / encode + 1.0 / decode);
    // The tag alone, as dlcpd computes it: 64 datagrams of a send or receive
    // batch at a time (MacKey::tag_many), and one at a time (MacKey::tag).
    const BATCH: usize = 64;
    let msgs: Vec<Vec<u8>> = (0..BATCH)
        .map(|i| {
            let mut m = pkt[..size - wire::TAG_LEN].to_vec();
            m[wire::HEADER_LEN] = i as u8;
            m
        })
        .collect();
    let refs: Vec<&[u8]> = msgs.iter().map(|m| &m[..]).collect();
    let mut tags = vec![[0u8; wire::TAG_LEN]; BATCH];
    let many = BATCH as f64
        * rate(dur, 4, || {
            key.tag_many(black_box(&refs), &mut tags);
            black_box(&tags);
        });
    let one = rate(dur, 256, || {
        black_box(key.tag(black_box(&msgs[0])));
    });
    vec![
        Figure {
            name: "header_codec",
            what: "64-byte header emit + parse, per core",
            dlcp: both,
            peer_name: "kernel UDP send 1472 B, one core",
            peer: udp_pps,
            unit: "pkt/s",
        },
        Figure {
            name: "packet_codec_mac",
            what: "1472-byte datagram encode + decode with keyed-BLAKE3 tag, per core",
            dlcp: full,
            peer_name: "kernel UDP send 1472 B, one core",
            peer: udp_pps,
            unit: "pkt/s",
        },
        Figure {
            name: "mac_batched",
            what: "keyed-BLAKE3 tag of 1472-byte datagrams, 64 at a time as dlcpd does (tag_many), per core",
            dlcp: many,
            peer_name: "kernel UDP send 1472 B, one core",
            peer: udp_pps,
            unit: "pkt/s",
        },
        Figure {
            name: "mac_single",
            what: "keyed-BLAKE3 tag of one 1472-byte datagram at a time, per core",
            dlcp: one,
            peer_name: "kernel UDP send 1472 B, one core",
            peer: udp_pps,
            unit: "pkt/s",
        },
    ]
}

/// f32 sum `dst += src` (the endpoint's reduce loop) vs `memcpy` of the same bytes.
fn aggregation_figure(dur: Duration) -> Figure {
    let n = 16 << 20; // 64 MiB per buffer: well outside the caches
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
    Figure {
        name: "aggregation",
        what: "f32 sum dst += src, 64 MiB, bytes of src per second",
        dlcp: sum / 1e9,
        peer_name: "memcpy of the same bytes",
        peer: copy / 1e9,
        unit: "GB/s",
    }
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

fn shm_figures(dur: Duration) -> Result<Vec<Figure>, String> {
    let dir = std::env::temp_dir().join(format!("dlcp-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let r = (|| {
        let (path, server) = shm_server(&dir, 64 << 20)?;
        let mut cl = TrainerChannel::attach(&path, 1, 0, 1).map_err(|e| format!("attach: {e}"))?;
        let op = |cl: &mut TrainerChannel, t: &dlcp::shm::Tensor| {
            cl.submit(t, SubmitOptions::default()).expect("submit");
            let c = cl.wait_completion(Duration::from_secs(10)).expect("completion");
            assert_eq!(c.status, Status::Ok);
        };
        let small = cl.alloc("small", 1).map_err(|e| e.to_string())?;
        let rts = rate(dur, 64, || op(&mut cl, &small));
        let n = 4 << 20; // 16 MiB tensor
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
            },
            Figure {
                name: "shm_tensor",
                what: "16 MiB tensor trainer -> daemon -> trainer (copy out + copy in, as dlcpd does)",
                dlcp: big_rate / 1e9,
                peer_name: "one memcpy of the same bytes (two copies: ideal ratio 0.5)",
                peer: copy / 1e9,
                unit: "GB/s",
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
    eprintln!("micro benchmarks: {ms} ms per figure, one thread each (the shm channel: two)");
    let udp = udp_send_pps(dur.max(Duration::from_millis(300)))?;
    let mut figs = header_figures(dur, udp);
    figs.push(aggregation_figure(dur));
    figs.extend(shm_figures(dur)?);
    let mut json = Vec::new();
    for f in &figs {
        let ratio = f.dlcp / f.peer;
        println!(
            "{}: dlcp {} {}, peer {} {}, ratio {:.2}   ({}; peer: {})",
            f.name,
            fmt(f.dlcp),
            f.unit,
            fmt(f.peer),
            f.unit,
            ratio,
            f.what,
            f.peer_name
        );
        json.push(format!(
            "{{\"name\":\"{}\",\"what\":\"{}\",\"dlcp\":{},\"peer_name\":\"{}\",\"peer\":{},\"unit\":\"{}\",\"ratio\":{}}}",
            f.name, f.what, f.dlcp, f.peer_name, f.peer, f.unit, ratio
        ));
    }
    println!("JSON [{}]", json.join(","));
    Ok(())
}
