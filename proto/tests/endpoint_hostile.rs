//! Hostile and malformed input to an endpoint: it never panics, counts every
//! rejection, and keeps serving correct allreduces afterwards.

mod common;

use common::*;
use dlcp_proto::endpoint::{Endpoint, OpId};
use dlcp_proto::priority::Class;
use dlcp_proto::sim::{NetConfig, Node, Rng};
use dlcp_proto::time::{Duration, Instant};
use dlcp_proto::wire::{self, DType, Flags, Header, MacKey, PacketType, Phase};
use proptest::prelude::*;

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
            |(
                ty,
                flags,
                class,
                phase,
                (generation, src, dst, op, tensor),
                (ci, cc, req, budget, seq, job),
            )| {
                let mut h = Header::new(ty, Class::new(class).unwrap(), phase);
                h.flags = Flags(flags);
                h.dtype = DType::F32;
                h.job = if job == 0 { 77 } else { job };
                h.generation = generation;
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
    let mut e = Endpoint::new(endpoint_config(0, 4, 1), Instant::ZERO);
    let x = inputs(1, 4, 3000);
    e.start_allreduce(Instant::ZERO, OpId { seq: 1, tensor: 1 }, x[0].clone(), opts(10_000)).unwrap();
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
        prop_assert!(after.malformed + after.bad_tag == before.malformed + before.bad_tag + 1);
    }
}

#[test]
fn forged_and_foreign_packets_are_rejected_and_counted_and_service_continues() {
    let world = 4;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(5));
    let mut rng = Rng::stream(99, 1, 2);
    let foreign = MacKey::derive(b"another job's secret");
    let mut buf = vec![0u8; 2048];
    let now = c.sim.now();
    let mut sent = 0u64;
    for i in 0..3000u32 {
        let mut h = Header::new(PacketType::Data, Class::new(2).unwrap(), Phase::Scatter);
        h.job = 77;
        h.generation = 1;
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
    let res = all_ok(c.allreduce(OpId { seq: 1, tensor: 0 }, &x, opts(0), Duration::from_secs(1)));
    let want = bits(&reference_sum(&x));
    assert!(res.iter().all(|(v, _)| bits(v) == want));
}

#[test]
fn stale_generation_and_finished_ops_are_counted() {
    let world = 2;
    let mut c = Cluster::new(world, NetConfig::default().with_seed(6));
    let x = inputs(8, world, 2000);
    all_ok(c.allreduce(OpId { seq: 1, tensor: 0 }, &x, opts(0), Duration::from_secs(1)));
    let mut buf = vec![0u8; 2048];
    let now = c.sim.now();
    // A DATA of the finished op, and a HELLO from an older generation of rank 1.
    let mut h = Header::new(PacketType::Data, Class::new(1).unwrap(), Phase::Scatter);
    h.job = 77;
    h.generation = 1;
    h.src = 1;
    h.dst = 0;
    h.op = 1;
    h.chunk_count = 4;
    let n = wire::encode(&key(), &h, &[0u8; 256], &mut buf).unwrap();
    Node::handle_datagram(c.sim.node_mut(0), now, &buf[..n]);
    let mut hello = Header::new(PacketType::Hello, Class::CONTROL, Phase::None);
    hello.job = 77;
    hello.generation = 0;
    hello.src = 1;
    hello.dst = 0;
    let n = wire::encode(&key(), &hello, &[], &mut buf).unwrap();
    Node::handle_datagram(c.sim.node_mut(0), now, &buf[..n]);
    let r = &c.sim.node(0).stats().rejected;
    assert_eq!(r.late + r.stale_op, 1, "{r:?}");
    assert_eq!(r.stale_generation, 1, "{r:?}");
}
