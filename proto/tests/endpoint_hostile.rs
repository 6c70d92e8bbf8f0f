//! Hostile and malformed input to an endpoint: it never panics, counts every
//! rejection, and keeps serving correct allreduces afterwards.

mod common;

use common::*;
use dlcp_proto::class::Class;
use dlcp_proto::endpoint::{Endpoint, Event, MISMATCH_REPORT_INTERVAL, Mismatch, OpId};
use dlcp_proto::rng::Rng;
use dlcp_proto::sim::{NetConfig, Node};
use dlcp_proto::stats::RejectCounters;
use dlcp_proto::time::{Duration, Instant};
use dlcp_proto::wire::{self, DType, Flags, Header, JobKey, PacketType, Phase};
use proptest::prelude::*;

/// The flow-control window every endpoint of these tests announces (the default).
const FLOW_WINDOW: u16 = 1424;

fn arb_header() -> impl Strategy<Value = Header> {
    (
        prop::sample::select(vec![
            PacketType::Data,
            PacketType::Probe,
            PacketType::Bitmap,
            PacketType::Done,
            PacketType::Hello,
        ]),
        0u8..16,
        0u8..8,
        prop::sample::select(vec![Phase::None, Phase::Scatter, Phase::Gather]),
        (0u32..4, 0u32..6, 0u32..6, 0u64..4, 0u32..3),
        (any::<u32>(), 0u32..400, any::<u32>(), any::<u32>(), any::<u32>(), 0u32..3),
    )
        .prop_map(
            |(ty, flags, class, phase, (run, src, dst, op, tensor), (ci, cc, req, budget, seq, job))| {
                let mut h = Header::new(ty, Class::new(class).unwrap(), phase);
                h.flags = Flags(flags);
                h.dtype = DType::F32;
                h.job = if job == 0 { 77 } else { job };
                h.run = if ty.is_phaseless() { 0 } else { u64::from(run) };
                h.src = src;
                h.dst = dst;
                h.op = op;
                h.tensor = tensor;
                h.chunk_index = ci % cc.max(1);
                h.chunk_count = cc;
                h.required = req % (cc + 1);
                h.budget_ppm = budget % 1_000_001;
                h.seq = seq;
                h
            },
        )
}

fn live_endpoint() -> Endpoint {
    let mut e = agreed_endpoints((0..4).map(|r| endpoint_config(r, 4, 1)).collect()).swap_remove(0);
    let x = inputs(1, 4, 3000);
    e.start_allreduce(Instant::ZERO, OpId { run: 1, seq: 1, tensor: 1 }, x[0].clone(), opts(10_000)).unwrap();
    e
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    /// Authenticated packets with arbitrary (even nonsensical) field values,
    /// from an insider holding the key: never a panic, and every one is either
    /// accepted or counted.
    #[test]
    fn authenticated_garbage_never_panics(h in arb_header(), payload in prop::collection::vec(any::<u8>(), 0..600)) {
        let mut e = live_endpoint();
        let mut buf = vec![0u8; 2048];
        if let Ok(n) = wire::encode(&key(), &h, &payload, &mut buf) {
            e.handle_datagram(Instant::from_nanos(1000), &buf[..n]);
        }
        e.handle_timeout(Instant::from_nanos(2000));
        let mut out = vec![0u8; 70_000];
        while e.poll_transmit(Instant::from_nanos(3000), &mut out).is_some() {}
    }

    /// Arbitrary bytes: rejected and counted.
    #[test]
    fn random_bytes_are_counted(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut e = live_endpoint();
        let before = e.stats().rejected.clone();
        e.handle_datagram(Instant::from_nanos(10), &bytes);
        let after = &e.stats().rejected;
        // (Bytes that happen to start with the magic may name another version or auth mode.)
        let refused = |r: &RejectCounters| r.malformed + r.bad_tag + r.version_mismatch + r.auth_mismatch;
        prop_assert!(refused(after) == refused(&before) + 1);
        let d = &e.stats().rx_dropped;
        let classes: u64 = d.class.iter().map(|c| c.packets).sum::<u64>() + d.unknown_class.packets;
        let peers: u64 = d.peer.iter().map(|c| c.packets).sum::<u64>() + d.unknown_peer.packets;
        prop_assert_eq!((classes, peers), (1, 1));
        prop_assert_eq!(d.unknown_class.bytes + d.class.iter().map(|c| c.bytes).sum::<u64>(), bytes.len() as u64);
    }
}

#[test]
fn forged_and_foreign_packets_are_rejected_and_counted_and_service_continues() {
    let world = 4;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(5));
    let mut rng = Rng::stream(99, 1, 2);
    let foreign = JobKey::new(b"another job's secret");
    let mut buf = vec![0u8; 2048];
    let now = c.sim.now();
    let mut sent = 0u64;
    for i in 0..3000u32 {
        let mut h = Header::new(PacketType::Data, Class::new(2).unwrap(), Phase::Scatter);
        h.job = 77;
        h.run = 1;
        h.src = 1 + i % 3;
        h.dst = 0;
        h.op = 1;
        h.chunk_count = 10;
        h.chunk_index = i % 10;
        let payload = vec![0x41u8; 64];
        let n = match i % 3 {
            // Forged with the wrong key.
            0 => wire::encode(&foreign, &h, &payload, &mut buf).unwrap(),
            // Right key, wrong job.
            1 => {
                h.job = 78;
                wire::encode(&key(), &h, &payload, &mut buf).unwrap()
            }
            // Random bytes.
            _ => {
                let n = (rng.below(200) + 1) as usize;
                for b in &mut buf[..n] {
                    *b = rng.below(256) as u8;
                }
                n
            }
        };
        Node::handle_datagram(c.sim.node_mut(0), now, &buf[..n]);
        sent += 1;
    }
    let r = &c.sim.node(0).stats().rejected;
    assert_eq!(r.bad_tag + r.malformed + r.wrong_job, sent, "{r:?}");
    assert_eq!(r.wrong_job, 1000);
    assert!(r.bad_tag >= 1000);
    // The endpoint still reduces correctly.
    let x = inputs(7, world, 5000);
    let res = all_ok(c.allreduce(OpId { run: 1, seq: 1, tensor: 0 }, &x, opts(0), Duration::from_secs(1)));
    let want = bits(&reference_sum(&x));
    assert!(res.iter().all(|(v, _)| bits(v) == want));
}

/// After an op: DATA of that finished op, DATA of another run, DATA of an
/// earlier incarnation of the peer (replayed), and a HELLO of that earlier
/// incarnation are each counted, and none of them changes the peer's
/// verified session (a replayed HELLO is challenged, never taken for a restart).
#[test]
fn stale_sessions_other_runs_and_finished_ops_are_counted() {
    let world = 2;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(6));
    let x = inputs(8, world, 2000);
    all_ok(c.allreduce(OpId { run: 1, seq: 1, tensor: 0 }, &x, opts(0), Duration::from_secs(1)));
    let (_, run) = c.sim.node(0).run().unwrap();
    let verified = c.sim.node(0).peer_session(1);
    assert_eq!(verified, Some(session(1, 1)));
    let mut buf = vec![0u8; 2048];
    let now = c.sim.now();
    let data = |run: u64, session: u64| {
        let mut h = Header::new(PacketType::Data, Class::new(1).unwrap(), Phase::Scatter);
        (h.job, h.run, h.src, h.dst, h.op, h.chunk_count, h.session) = (77, run, 1, 0, 1, 4, session);
        h
    };
    for h in [data(run, session(1, 1)), data(run ^ 0x55, session(1, 1)), data(run, session(1, 0))] {
        let n = wire::encode(&key(), &h, &[0u8; 256], &mut buf).unwrap();
        Node::handle_datagram(c.sim.node_mut(0), now, &buf[..n]);
    }
    let mut hello = Header::new(PacketType::Hello, Class::CONTROL, Phase::None);
    (hello.job, hello.src, hello.dst, hello.session) = (77, 1, 0, session(1, 0));
    let mut settings = [0u8; wire::SETTINGS_LEN];
    let digest = dlcp_proto::endpoint::settings_digest(c.sim.node(0).config());
    let auth = wire::PacketAuth::AesGmac;
    let s = wire::Settings {
        version: wire::VERSION,
        auth,
        chunk_bytes: CHUNK_BYTES as u32,
        flow_window: FLOW_WINDOW,
        digest,
        echo: 12345,
        ..wire::Settings::default()
    };
    s.emit(&mut settings);
    let n = wire::encode(&key(), &hello, &settings, &mut buf).unwrap();
    Node::handle_datagram(c.sim.node_mut(0), now, &buf[..n]);
    let r = &c.sim.node(0).stats().rejected;
    assert_eq!(r.late + r.stale_op, 1, "{r:?}");
    assert_eq!(r.other_run, 1, "{r:?}");
    assert_eq!(r.unverified_session, 1, "{r:?}");
    assert_eq!(c.sim.node(0).peer_session(1), verified, "a replayed HELLO is no restart");
}

/// Discarded datagrams are counted per class (from the header when readable)
/// and per peer (the one the caller names, else the header's claim), once each;
/// buffered and accepted ones are not.
#[test]
fn discarded_datagrams_are_counted_per_class_and_per_peer() {
    use dlcp_proto::endpoint::PacketCount;
    let mut e = live_endpoint();
    let now = Instant::from_nanos(10);
    let foreign = JobKey::new(b"another job's secret");
    let mut buf = vec![0u8; 2048];
    let run = e.run().unwrap().1;
    // What the run agreement left in the counters (its HELLOs).
    let (rx0, rx1) = (e.stats().rx_packets.iter().sum::<u64>(), e.stats().rx_bytes_peer[1]);
    let data = |class: u8, src: u32, op: u64| {
        let mut h = Header::new(PacketType::Data, Class::new(class).unwrap(), Phase::Scatter);
        h.job = 77;
        h.run = run;
        h.session = session(src, 1);
        h.src = src;
        h.dst = 0;
        h.op = op;
        h.tensor = 1;
        h.chunk_count = 12; // rank 0's shard of 3000 elements in 64-element chunks
        h
    };
    let count = |packets: u64, bytes: usize| PacketCount { packets, bytes: bytes as u64 };
    // Forged (wrong key), class 2, claiming rank 1: attributed to the claim...
    let n = wire::encode(&foreign, &data(2, 1, 1), &[0; 256], &mut buf).unwrap();
    e.handle_datagram(now, &buf[..n]);
    // ...or to no peer when the caller says it came from no configured address.
    e.handle_datagram_from(now, &buf[..n], None);
    let forged = n;
    // Unsupported version, class 5, from rank 3's address.
    let n = wire::encode(&key(), &data(5, 3, 1), &[0; 256], &mut buf).unwrap();
    buf[2] = 8;
    e.handle_datagram_from(now, &buf[..n], Some(3));
    buf[2] = wire::VERSION;
    let bad_version = n;
    assert_eq!(e.stats().rejected.version_mismatch, 1);
    // Truncated below the prefix every version shares: class unknown; from
    // rank 2's address.
    e.handle_datagram_from(now, &buf[..20], Some(2));
    // A chunk accepted, then the same chunk again (a duplicate, class 4, rank 1).
    let n = wire::encode(&key(), &data(4, 1, 1), &[0; 256], &mut buf).unwrap();
    e.handle_datagram_from(now, &buf[..n], Some(1));
    e.handle_datagram_from(now, &buf[..n], Some(1));
    let dup = n;
    // Early DATA of an op not started here: buffered, not dropped.
    let n = wire::encode(&key(), &data(6, 2, 2), &[0; 256], &mut buf).unwrap();
    e.handle_datagram_from(now, &buf[..n], Some(2));
    // The caller's own drop (e.g. a source check), out-of-range peer: unknown.
    e.count_dropped(&buf[..n], Some(99));
    let own = n;

    let s = e.stats();
    assert_eq!(s.rejected.early_buffered, 1);
    assert_eq!(s.rejected.duplicate, 1, "{:?}", s.rejected);
    assert_eq!(s.rejected.discarded_on_arrival(), 5, "{:?}", s.rejected);
    let d = &s.rx_dropped;
    let mut want_class = [PacketCount::default(); 8];
    want_class[2] = count(2, 2 * forged);
    want_class[5] = count(1, bad_version);
    want_class[4] = count(1, dup);
    want_class[6] = count(1, own);
    assert_eq!(d.class, want_class);
    assert_eq!(d.unknown_class, count(1, 20));
    assert_eq!(d.peer, vec![count(0, 0), count(2, forged + dup), count(1, 20), count(1, bad_version)]);
    assert_eq!(d.unknown_peer, count(2, forged + own));
    // Every datagram accepted or buffered is in rx_packets; the dropped are not.
    assert_eq!(s.rx_packets.iter().sum::<u64>(), rx0 + 3);
    assert_eq!(s.rx_bytes_peer[1], rx1 + 2 * dup as u64);
}

/// The source check: a datagram claiming rank `j` is taken only from rank
/// `j`'s address (the caller's `from`); from another peer's address it is
/// `wrong_source`, from an address that is no peer's `unknown_source`, and
/// neither is processed (its chunk is not admitted). A claim outside the
/// world is left to the rank check.
#[test]
fn a_datagram_must_come_from_the_peer_it_claims() {
    let mut e = live_endpoint();
    let now = Instant::from_nanos(10);
    let mut buf = vec![0u8; 2048];
    let mut h = Header::new(PacketType::Data, Class::new(3).unwrap(), Phase::Scatter);
    (h.job, h.run, h.src, h.dst, h.op, h.tensor, h.chunk_count) = (77, e.run().unwrap().1, 1, 0, 1, 1, 12);
    h.session = session(1, 1);
    let rx0: u64 = e.stats().rx_packets.iter().sum();
    let n = wire::encode(&key(), &h, &[0; 256], &mut buf).unwrap();
    e.handle_datagram_from(now, &buf[..n], Some(2));
    e.handle_datagram_from(now, &buf[..n], None);
    let r = e.stats().rejected.clone();
    assert_eq!((r.wrong_source, r.unknown_source, r.discarded_on_arrival()), (1, 1, 2), "{r:?}");
    assert_eq!(e.stats().rx_packets.iter().sum::<u64>(), rx0, "nothing was processed");
    let d = &e.stats().rx_dropped;
    assert_eq!((d.peer[2].packets, d.unknown_peer.packets, d.class[3].packets), (1, 1, 2));
    // From its own address the very datagram is accepted (not a duplicate).
    e.handle_datagram_from(now, &buf[..n], Some(1));
    assert_eq!(e.stats().rx_packets[3], 1);
    assert_eq!(e.stats().rejected.discarded_on_arrival(), 2);
    // A rank outside the world is not a source question.
    (h.src, h.session) = (9, session(9, 1));
    let n = wire::encode(&key(), &h, &[0; 256], &mut buf).unwrap();
    e.handle_datagram_from(now, &buf[..n], None);
    let r = &e.stats().rejected;
    assert_eq!((r.wrong_rank, r.unknown_source), (1, 1), "{r:?}");
}

/// A peer of the previous releases (wire versions 4 to 9): its HELLO,
/// the golden vector `tests/golden/v9/hello.hex` (`v8/` … `v4/`), is
/// refused, counted and reported naming both versions, and it never comes up.
#[test]
fn a_version_4_to_9_peer_is_refused_naming_both_versions() {
    for (old, count) in [(4u8, 1u64), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1)] {
        let mut e = live_endpoint();
        let path = format!("{}/tests/golden/v{old}/hello.hex", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        let hex: String =
            text.lines().filter(|l| !l.starts_with('#')).flat_map(|l| l.trim().chars()).collect();
        let hello: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        assert_eq!((hello[2], hello[3], wire::peek_src(&hello)), (old, PacketType::Hello as u8, Some(3)));
        while e.poll_event().is_some() {}
        e.handle_datagram_from(Instant::from_nanos(10), &hello, Some(3));
        let mismatch = Mismatch::WireVersion { theirs: old, ours: 10 };
        let events: Vec<Event> = std::iter::from_fn(|| e.poll_event()).collect();
        assert_eq!(events, [Event::PeerIncompatible { rank: Some(3), mismatch }]);
        let says = format!("speaks dlcp wire version {old}; this daemon speaks version 10");
        assert_eq!(mismatch.to_string(), says);
        assert_eq!((e.stats().rejected.version_mismatch, e.peer_mismatch(3)), (count, Some(mismatch)));
    }
}

/// Datagrams of another wire version, of another packet authentication mode,
/// and from a peer whose HELLO announces another chunk size are refused,
/// counted by reason, and reported (once per interval per peer) naming both
/// values; a peer whose settings come to agree is accepted again.
#[test]
fn incompatible_peers_are_refused_counted_and_reported() {
    let mut e = live_endpoint();
    let mut now = Instant::from_nanos(10);
    let mut buf = vec![0u8; 2048];
    let run = e.run().unwrap().1;
    let digest = dlcp_proto::endpoint::settings_digest(e.config());
    let rx1 = e.stats().rx_packets_peer[1];
    let data = |src: u32| {
        let mut h = Header::new(PacketType::Data, Class::new(3).unwrap(), Phase::Scatter);
        (h.job, h.run, h.src, h.dst, h.op, h.tensor, h.chunk_count) = (77, run, src, 0, 1, 1, 12);
        h.session = session(src, 1);
        h
    };
    let events = |e: &mut Endpoint| {
        std::iter::from_fn(|| e.poll_event())
            .filter_map(|ev| match ev {
                Event::PeerIncompatible { rank, mismatch } => Some((rank, mismatch)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };

    // Another wire version (a version 1 peer at rank 3's address), twice: one report.
    let n = wire::encode(&key(), &data(3), &[0; 256], &mut buf).unwrap();
    buf[2] = 1;
    e.handle_datagram_from(now, &buf[..n], Some(3));
    e.handle_datagram_from(now, &buf[..n], Some(3));
    let v1 = Mismatch::WireVersion { theirs: 1, ours: wire::VERSION };
    assert_eq!(events(&mut e), [(Some(3), v1)]);
    assert_eq!(v1.to_string(), "speaks dlcp wire version 1; this daemon speaks version 10");
    assert_eq!(e.stats().rejected.version_mismatch, 2);
    assert_eq!(e.peer_mismatch(3), Some(v1));
    // From no known address: reported without a rank, nothing remembered.
    e.handle_datagram_from(now, &buf[..n], None);
    assert_eq!(events(&mut e), [(None, v1)]);
    // Reported again once the interval has passed.
    now += MISMATCH_REPORT_INTERVAL;
    e.handle_datagram_from(now, &buf[..n], Some(3));
    assert_eq!(events(&mut e), [(Some(3), v1)]);

    // Another packet authentication mode: rank 2 sends without tags.
    let none = JobKey::unauthenticated();
    let h = Header { auth: wire::PacketAuth::None, ..data(2) };
    let n = wire::encode(&none, &h, &[0; 256], &mut buf).unwrap();
    e.handle_datagram_from(now, &buf[..n], Some(2));
    let auth = Mismatch::PacketAuth { theirs: wire::PacketAuth::None, ours: wire::PacketAuth::AesGmac };
    assert_eq!(events(&mut e), [(Some(2), auth)]);
    assert!(
        auth.to_string().contains(r#"packet_auth = "none"; this daemon has packet_auth = "aes-128-gmac""#)
    );
    assert_eq!(e.stats().rejected.auth_mismatch, 1);
    assert_eq!(e.stats().rejected.bad_tag, 0, "not a plain bad tag");

    // Another chunk size in rank 1's HELLO: refused, and so is its DATA,
    // until a HELLO announces ours.
    // Newer packet numbers than any HELLO rank 1 sent so far (a HELLO no
    // newer than the last one taken is a replay).
    let next_pn = std::cell::Cell::new(1u64 << 40);
    let hello = |chunk_bytes: u32, buf: &mut [u8]| {
        let mut h = Header::new(PacketType::Hello, Class::CONTROL, Phase::None);
        (h.job, h.src, h.dst, h.session) = (77, 1, 0, session(1, 1));
        h.packet = next_pn.replace(next_pn.get() + 1);
        let mut s = [0u8; wire::SETTINGS_LEN];
        let auth = wire::PacketAuth::AesGmac;
        wire::Settings {
            version: wire::VERSION,
            auth,
            chunk_bytes,
            flow_window: FLOW_WINDOW,
            digest,
            ..Default::default()
        }
        .emit(&mut s);
        wire::encode(&key(), &h, &s, buf).unwrap()
    };
    let n = hello(1392, &mut buf);
    e.handle_datagram_from(now, &buf[..n], Some(1));
    let chunk = Mismatch::ChunkBytes { theirs: 1392, ours: CHUNK_BYTES as u32 };
    assert_eq!(events(&mut e), [(Some(1), chunk)]);
    assert!(chunk.to_string().starts_with("cuts tensors into chunks of 1392 bytes; this daemon uses 256"));
    let n = wire::encode(&key(), &data(1), &[0; 256], &mut buf).unwrap();
    e.handle_datagram_from(now, &buf[..n], Some(1));
    assert_eq!(e.stats().rejected.settings_mismatch, 2);
    assert_eq!(e.stats().rx_packets_peer[1], rx1);
    assert_eq!(e.peer_mismatch(1), Some(chunk));
    let n = hello(CHUNK_BYTES as u32, &mut buf);
    e.handle_datagram_from(now, &buf[..n], Some(1));
    assert_eq!(e.peer_mismatch(1), None);
    let n = wire::encode(&key(), &data(1), &[0; 256], &mut buf).unwrap();
    e.handle_datagram_from(now, &buf[..n], Some(1));
    assert_eq!(e.stats().rejected.settings_mismatch, 2);
    assert_eq!(e.stats().rx_packets_peer[1], rx1 + 2, "the agreeing HELLO and the DATA");
    assert!(events(&mut e).is_empty());
}
