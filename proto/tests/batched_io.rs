//! The batched entry points of the endpoint (`handle_datagrams`,
//! `poll_transmit_batch`, whose DATA payloads are lent from the ops' memory)
//! behave exactly like their one-datagram counterparts.

mod common;

use common::*;
use dlcp_proto::class::Class;
use dlcp_proto::endpoint::{Endpoint, OpId, Transmit, TxBatch};
use dlcp_proto::rng::Rng;
use dlcp_proto::time::Instant;
use dlcp_proto::wire::{self, Header, JobKey, PacketType, Phase};

fn live_endpoint() -> Endpoint {
    let mut e = agreed_endpoints((0..4).map(|r| endpoint_config(r, 4, 1)).collect()).swap_remove(0);
    let x = inputs(1, 4, 3000);
    e.start_allreduce(Instant::ZERO, OpId { run: 1, seq: 1, tensor: 1 }, x[0].clone(), opts(10_000)).unwrap();
    e
}

/// `handle_datagrams` (tags checked in batches) has exactly the outcome of
/// `handle_datagram` on each datagram in turn: same counters, same transmits,
/// for genuine, forged, foreign-job, bit-flipped, truncated and random
/// datagrams of every size around the batched range (1–2 KiB).
#[test]
fn batched_receive_matches_one_at_a_time() {
    let foreign = JobKey::new(b"another job's secret");
    let e_run = live_endpoint().run().unwrap().1;
    let mut rng = Rng::stream(41, 3, 4);
    let mut datagrams: Vec<Vec<u8>> = Vec::new();
    let mut buf = vec![0u8; 4096];
    for i in 0..1500u32 {
        let mut h = Header::new(PacketType::Data, Class::new((i % 7) as u8).unwrap(), Phase::Scatter);
        h.job = 77;
        h.run = e_run;
        h.src = 1 + i % 3;
        h.session = session(h.src, 1);
        h.dst = 0;
        h.op = 1;
        h.tensor = 1;
        h.chunk_count = 3;
        h.chunk_index = i % 3;
        let plen = [4, 100, 900, 960, 964, 1000, 1392, 1400, 1984, 1988, 2100][(i % 11) as usize];
        let payload: Vec<u8> = (0..plen).map(|_| rng.below(256) as u8).collect();
        let mut n = match i % 6 {
            0 => wire::encode(&foreign, &h, &payload, &mut buf).unwrap(),
            1 => {
                h.job = 78;
                wire::encode(&key(), &h, &payload, &mut buf).unwrap()
            }
            _ => wire::encode(&key(), &h, &payload, &mut buf).unwrap(),
        };
        match i % 13 {
            3 => buf[(rng.below(n as u64)) as usize] ^= 1 << rng.below(8), // bit flip anywhere
            5 => n -= 1 + rng.below(n as u64 / 2) as usize,                // truncated
            7 => {
                n = 1 + rng.below(2200) as usize; // random bytes
                for b in &mut buf[..n] {
                    *b = rng.below(256) as u8;
                }
            }
            _ => {}
        }
        datagrams.push(buf[..n].to_vec());
    }
    let mut one = live_endpoint();
    let mut many = live_endpoint();
    let now = Instant::from_nanos(1000);
    for d in &datagrams {
        one.handle_datagram(now, d);
    }
    for batch in datagrams.chunks(37) {
        let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
        many.handle_datagrams(now, &refs);
    }
    let (a, b) = (format!("{:?}", one.stats()), format!("{:?}", many.stats()));
    assert_eq!(a, b);
    let r = &one.stats().rejected;
    assert!(r.bad_tag > 200 && r.wrong_job > 100 && r.malformed > 50, "{r:?}");
    assert!(one.stats().rx_packets.iter().sum::<u64>() > 200, "{:?}", one.stats());
    let later = Instant::from_nanos(5_000_000);
    one.handle_timeout(later);
    many.handle_timeout(later);
    let (mut x, mut y) = (vec![0u8; 70_000], vec![0u8; 70_000]);
    loop {
        let (tx, ty) = (one.poll_transmit(later, &mut x), many.poll_transmit(later, &mut y));
        assert_eq!(format!("{tx:?}"), format!("{ty:?}"));
        let Some(t) = tx else { break };
        assert_eq!(x[..t.len], y[..t.len]);
    }
}

/// `poll_transmit_batch` returns the very datagrams (bytes, tags included,
/// destinations, classes) that repeated `poll_transmit` calls return, batch
/// after batch, also with a pacing rate that cuts batches short. And a DATA
/// payload is lent from the op's tensor, not copied: the payloads of
/// consecutive chunks of one shard lie back to back in memory.
#[test]
fn batched_transmit_matches_one_at_a_time() {
    for rate in [0u64, 50_000_000] {
        let make = || {
            let cfgs = (0..4).map(|r| {
                let mut cfg = endpoint_config(r, 4, 1);
                cfg.pacing_rate = rate;
                // One endpoint alone: no receiver grants it credit beyond the
                // unscheduled window (flow control is not what this tests).
                cfg.flow = dlcp_proto::flow::FlowConfig::OFF;
                cfg
            });
            let mut e = agreed_endpoints(cfgs.collect()).swap_remove(1);
            let x = inputs(3, 4, 200_000);
            e.start_allreduce(Instant::ZERO, OpId { run: 1, seq: 1, tensor: 1 }, x[1].clone(), opts(10_000))
                .unwrap();
            e
        };
        let (mut one, mut many) = (make(), make());
        let mut batch = TxBatch::new();
        let mut single = vec![0u8; 2048];
        let (mut total, mut adjacent) = (0, 0);
        // Per destination: the last DATA chunk and where its payload ended.
        let mut last = [None::<(Phase, u32, usize)>; 4];
        for step in 0..2000u64 {
            let now = Instant::from_nanos(step * 20_000);
            let view = many.poll_transmit_batch(now, 64, &mut batch);
            for d in view.iter() {
                let s = one.poll_transmit(now, &mut single).expect("one-at-a-time has it too");
                assert_eq!(s, Transmit { dst: d.dst, len: d.len(), class: d.class, path: d.path });
                let mut whole = vec![0u8; d.len()];
                assert_eq!(d.write_to(&mut whole), d.len());
                assert_eq!(&single[..s.len], &whole[..]);
                // And it authenticates.
                let (h, _) = wire::decode(&key(), &whole).expect("authenticates");
                assert_eq!((d.header.len(), d.tag.len()), (wire::HEADER_LEN, wire::TAG_LEN));
                if h.ty == PacketType::Data {
                    let at = d.payload.as_ptr() as usize;
                    let prev = &mut last[d.dst as usize];
                    if let Some((phase, chunk, end)) = *prev
                        && phase == h.phase
                        && chunk + 1 == h.chunk_index
                    {
                        assert_eq!(at, end, "consecutive chunks of a shard lie back to back");
                        adjacent += 1;
                    }
                    *prev = Some((h.phase, h.chunk_index, at + d.payload.len()));
                }
            }
            total += view.len();
            if view.len() < 64 {
                assert!(one.poll_transmit(now, &mut single).is_none(), "batch ended early");
            }
        }
        assert!(total > 1000, "rate {rate}: only {total} datagrams");
        eprintln!(
            "rate {rate}: {total} datagrams, {adjacent} right after the previous chunk to the same rank"
        );
        assert!(adjacent > total / 3, "rate {rate}: only {adjacent} of {total} after the previous chunk");
    }
}
