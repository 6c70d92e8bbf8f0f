//! Shared harness for the allreduce simulations: N endpoints on the
//! deterministic simulator, seeded random data, an independent reference.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

use dlcp_proto::elem;
use dlcp_proto::endpoint::{
    Endpoint, EndpointConfig, Event, Fill, OpError, OpId, OpOptions, OpReport, ReduceOp, Timers,
};
use dlcp_proto::rng::Rng;
use dlcp_proto::sim::{ChunkKey, NetConfig, PathConfig, Sim, TraceEvent};
use dlcp_proto::time::{Duration, Instant};
use dlcp_proto::wire::{self, Flags, JobKey, PacketType, Phase};

/// Payload bytes per chunk used by the tests (small, so small tensors have many chunks).
pub const CHUNK_BYTES: usize = 256;
pub const CHUNK_ELEMS: usize = CHUNK_BYTES / 4;

pub fn key() -> JobKey {
    JobKey::new(b"simulation job secret")
}

/// A fixed session per (rank, generation): tests are deterministic, and no
/// two incarnations of a rank share a session (as the daemon's random ones).
pub fn session(rank: u32, generation: u32) -> u64 {
    0x5E55_0000_0000_0000 | u64::from(rank) << 32 | u64::from(generation)
}

pub fn timers() -> Timers {
    let ms = Duration::from_millis;
    Timers {
        hard_timeout: ms(200),
        op_deadline: Duration::ZERO,
        deadline_min: ms(1),
        deadline_max: ms(100),
        initial_per_chunk: Duration::from_micros(20),
        probe_initial: Duration::from_micros(100),
        probe_min: Duration::from_micros(50),
        probe_max: ms(20),
        heartbeat: ms(50),
        peer_timeout: ms(150),
        linger: ms(200),
        close_grace: Duration::from_micros(50),
        ack_delay: ms(5),
    }
}

pub fn endpoint_config(rank: u32, world: u32, generation: u32) -> EndpointConfig {
    let mut c = EndpointConfig::new(rank, world, 77, generation, session(rank, generation), key());
    c.chunk_bytes = CHUNK_BYTES;
    c.timers = timers();
    c
}

/// Random non-integer f32 data in roughly [-4, 4], some chunks scaled up so
/// magnitude classes differ.
pub fn random_tensor(rng: &mut Rng, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let scale = if (i / CHUNK_ELEMS) % 5 == 0 { 16.0 } else { 1.0 };
            let x = (rng.next_f64() * 8.0 - 4.0) as f32 * scale;
            if x.fract() == 0.0 { x + 0.5 } else { x }
        })
        .collect()
}

pub fn shard(len: usize, world: u32, s: u32) -> std::ops::Range<usize> {
    let a = (s as u128 * len as u128 / world as u128) as usize;
    let b = ((s as u128 + 1) * len as u128 / world as u128) as usize;
    a..b
}

/// What one rank ended an op with.
pub type Outcome = Result<(Vec<f32>, OpReport), OpError>;

/// Record of every DATA datagram a node sent with the REQUIRED flag.
#[derive(Default)]
pub struct Trace {
    /// (dst, key) of DATA sent with REQUIRED.
    pub required_sent: BTreeSet<(u32, ChunkKey)>,
    /// Datagrams sent that parse.
    pub sent: usize,
    /// Of those, how many are not exactly header + payload + their mode's tag long.
    pub misframed: usize,
}

pub struct Cluster {
    pub sim: Sim<Endpoint>,
    pub world: u32,
    pub trace: Rc<RefCell<Trace>>,
}

impl Cluster {
    pub fn new(world: u32, net: NetConfig) -> Cluster {
        Self::with_configs(net, (0..world).map(|r| endpoint_config(r, world, 1)).collect())
    }

    /// `world` ranks spraying over `paths` (one simulated path each, in
    /// order), a hard timeout of 2 s.
    pub fn multipath(world: u32, paths: Vec<PathConfig>, seed: u64) -> Cluster {
        let n = u16::try_from(paths.len()).expect("at most 65535 paths");
        Self::spraying(world, n, NetConfig::default().with_seed(seed).with_paths(paths))
    }

    /// `world` ranks spraying over `paths` path indices each on `net`
    /// (whose simulated paths they map onto modulo their number), a hard
    /// timeout of 2 s.
    pub fn spraying(world: u32, paths: u16, net: NetConfig) -> Cluster {
        let cfgs = (0..world)
            .map(|r| {
                let mut c = endpoint_config(r, world, 1);
                c.paths = paths;
                c.timers.hard_timeout = Duration::from_secs(2);
                c
            })
            .collect();
        Self::with_configs(net, cfgs)
    }

    pub fn with_configs(net: NetConfig, cfgs: Vec<EndpointConfig>) -> Cluster {
        let world = cfgs.len() as u32;
        let nodes = cfgs
            .into_iter()
            .map(|c| {
                let mut e = Endpoint::new(c, Instant::ZERO);
                assert_eq!(e.begin_run(Instant::ZERO), 1, "the first local run is epoch 1");
                e
            })
            .collect();
        let mut sim = Sim::new(net, nodes);
        let trace = Rc::new(RefCell::new(Trace::default()));
        let t = trace.clone();
        sim.set_trace(Some(Box::new(move |rec| {
            if rec.event != TraceEvent::Sent {
                return;
            }
            if let Ok(p) = wire::Packet::new_checked(rec.datagram) {
                let framed = wire::HEADER_LEN + usize::from(p.payload_len()) + p.auth().tag_len();
                let mut t = t.borrow_mut();
                t.sent += 1;
                t.misframed += usize::from(rec.datagram.len() != framed);
            }
            if let Ok(p) = wire::Packet::new_checked(rec.datagram)
                && p.raw_type() == PacketType::Data as u8
                && p.flags().contains(Flags::REQUIRED)
            {
                let phase = Phase::from_u8(p.raw_phase()).unwrap();
                let key =
                    ChunkKey { op: p.op(), tensor: p.tensor(), phase, src: p.src(), chunk: p.chunk_index() };
                t.borrow_mut().required_sent.insert((p.dst(), key));
            }
        })));
        let mut c = Cluster { sim, world, trace };
        c.agree_run();
        c
    }

    /// Run until every live rank has agreed on the run (the HELLO handshake
    /// and run announcement), at most 100 ms of virtual time.
    pub fn agree_run(&mut self) {
        let until = self.sim.now() + Duration::from_millis(100);
        self.sim.run_until(until, |s| {
            (0..s.node_count() as u32)
                .all(|r| s.is_silent(r) || s.node(r).run().is_some_and(|(_, id)| id != 0))
        });
    }

    /// Start `id` on every rank with `inputs[rank]`, run until every rank has
    /// finished it (or `limit` of virtual time passes), return each rank's outcome.
    pub fn allreduce(
        &mut self,
        id: OpId,
        inputs: &[Vec<f32>],
        opts: OpOptions,
        limit: Duration,
    ) -> Vec<Outcome> {
        self.allreduce_many(&[(id, inputs.to_vec(), opts)], limit).remove(0)
    }

    /// Start several ops at once on every rank and run them to completion.
    pub fn allreduce_many(
        &mut self,
        ops: &[(OpId, Vec<Vec<f32>>, OpOptions)],
        limit: Duration,
    ) -> Vec<Vec<Outcome>> {
        let now = self.sim.now();
        for (id, inputs, opts) in ops {
            for r in 0..self.world {
                if self.sim.is_silent(r) {
                    continue;
                }
                self.sim.node_mut(r).start_allreduce(now, *id, inputs[r as usize].clone(), *opts).unwrap();
            }
        }
        self.run(limit);
        let mut out: Vec<Vec<Option<Outcome>>> = vec![(0..self.world).map(|_| None).collect(); ops.len()];
        for r in 0..self.world {
            if self.sim.is_silent(r) {
                continue;
            }
            while let Some(ev) = self.sim.node_mut(r).poll_event() {
                let (id, o) = match ev {
                    Event::OpComplete { id, result, report } => (id, Ok((result, *report))),
                    Event::OpFailed { id, error } => (id, Err(error)),
                    _ => continue,
                };
                if let Some(i) = ops.iter().position(|(x, _, _)| *x == id) {
                    out[i][r as usize] = Some(o);
                }
            }
        }
        out.into_iter()
            .map(|v| {
                v.into_iter()
                    .enumerate()
                    .map(|(r, o)| {
                        o.unwrap_or_else(|| {
                            Err(OpError::Timeout {
                                phase: Phase::None,
                                waiting_on: vec![r as u32],
                                timeout: Duration::ZERO,
                                elsewhere: Vec::new(),
                            })
                        })
                    })
                    .collect()
            })
            .collect()
    }

    /// Op `seq` of run 1 (tensor 0) on every rank with `inputs[rank]`: every
    /// rank must complete it, with identical results equal to the oracle's
    /// ([`expected`]). Returns each rank's result and report.
    pub fn checked_allreduce(
        &mut self,
        seq: u64,
        inputs: &[Vec<f32>],
        opts: OpOptions,
        limit: Duration,
    ) -> Vec<(Vec<f32>, OpReport)> {
        let out = all_ok(self.allreduce(OpId { run: 1, seq, tensor: 0 }, inputs, opts, limit));
        assert_identical(&out);
        let reports: Vec<&OpReport> = out.iter().map(|(_, r)| r).collect();
        assert!(bits(&out[0].0) == bits(&expected(inputs, &reports, opts)), "op {seq}: the oracle's result");
        out
    }

    /// Run until no live rank has an op in flight, or `limit` passes.
    pub fn run(&mut self, limit: Duration) {
        let until = self.sim.now() + limit;
        self.sim.run_until(until, |s| {
            (0..s.node_count() as u32)
                .all(|r| s.is_silent(r) || (s.node(r).ops_in_flight() == 0 && s.node(r).ops_held() == 0))
        });
    }
}

/// The value every rank must hold, recomputed from the inputs, the owners'
/// delivery bitmaps and masks, and the fill rule — summed in rank order, in
/// `f32`, from the inputs rounded to `opts.dtype`, and the sum (divided for
/// an average) rounded once to it.
pub fn expected(inputs: &[Vec<f32>], reports: &[&OpReport], opts: OpOptions) -> Vec<f32> {
    let world = inputs.len() as u32;
    let len = inputs[0].len();
    let inputs: Vec<Vec<f32>> =
        inputs.iter().map(|x| x.iter().map(|&v| elem::round(opts.dtype, v)).collect()).collect();
    let chunk_elems = CHUNK_BYTES / opts.dtype.size();
    let mut out = vec![0.0f32; len];
    for s in 0..world {
        let sh = shard(len, world, s);
        let rep = reports[s as usize];
        for (c, chunk) in sh.clone().step_by(chunk_elems).enumerate() {
            let end = (chunk + chunk_elems).min(sh.end);
            let present = |j: u32| {
                j == s || rep.scatter.iter().find(|t| t.peer == j).is_some_and(|t| t.delivered.get(c as u32))
            };
            let delivered = (0..world).filter(|&j| present(j)).count() as u32;
            for e in chunk..end {
                let v = |j: u32| -> f32 {
                    if present(j) {
                        inputs[j as usize][e]
                    } else {
                        match opts.fill {
                            Fill::Zero => 0.0,
                            Fill::Local => inputs[s as usize][e],
                        }
                    }
                };
                let mut acc = v(0);
                for j in 1..world {
                    acc += v(j);
                }
                if opts.rescale && delivered < world {
                    acc *= world as f32 / delivered as f32;
                }
                if opts.reduce == ReduceOp::Average {
                    acc /= if opts.contributors == 0 { world as f32 } else { opts.contributors as f32 };
                }
                if rep.own_mask.get(c as u32) {
                    acc = 0.0;
                }
                out[e] = elem::round(opts.dtype, acc);
            }
        }
    }
    out
}

/// Checks shared by the lossy tests: within budget per (tensor, phase, sender),
/// every REQUIRED chunk the sender sent arrived before close, reported bitmaps
/// equal the simulator's delivery log up to the close, results equal the value
/// recomputed from inputs, bitmaps and fill rule, and all ranks are identical.
pub fn check_lossy(
    c: &Cluster,
    id: OpId,
    x: &[Vec<f32>],
    o: dlcp_proto::endpoint::OpOptions,
    res: &[(Vec<f32>, dlcp_proto::endpoint::OpReport)],
) {
    use dlcp_proto::wire::Phase;
    let world = c.world;
    let log = c.sim.log();
    let trace = c.trace.borrow();
    for (r, (_, rep)) in res.iter().enumerate() {
        let r = r as u32;
        for t in rep.scatter.iter().chain(&rep.gather) {
            let budget = if t.phase == Phase::Scatter { o.budget_ppm } else { o.gather_budget_ppm };
            let min = 1.0 - f64::from(budget) / 1e6;
            assert!(
                t.delivered_fraction() >= min - 1e-12,
                "rank {r} {:?} from {}: delivered {} < {min}",
                t.phase,
                t.peer,
                t.delivered_fraction()
            );
            // The report's bitmap is exactly what the network delivered before close.
            let logged: Vec<u32> = log
                .transfer(r, id.seq, id.tensor, t.phase, t.peer)
                .filter(|&(_, at)| at <= t.closed_at)
                .map(|(c, _)| c)
                .collect();
            let reported: Vec<u32> = t.delivered.iter_ones().collect();
            assert_eq!(
                reported, logged,
                "rank {r} {:?} from {}: bitmap differs from the delivery log",
                t.phase, t.peer
            );
            // Every chunk sent as non-droppable arrived (scatter) or is unmasked (gather).
            for (dst, key) in trace.required_sent.iter() {
                if *dst == r
                    && key.op == id.seq
                    && key.tensor == id.tensor
                    && key.phase == t.phase
                    && key.src == t.peer
                {
                    assert!(t.delivered.get(key.chunk), "rank {r}: required chunk {key:?} missing");
                    if let Some(m) = &t.mask {
                        assert!(!m.get(key.chunk), "rank {r}: required chunk {key:?} masked");
                    }
                }
            }
        }
    }
    let reports: Vec<_> = res.iter().map(|(_, rep)| rep).collect();
    let want = bits(&expected(x, &reports, o));
    for (r, (v, _)) in res.iter().enumerate() {
        assert!(bits(v) == want, "rank {r}: result differs from the recomputed value");
    }
    assert_identical(res);
    assert_eq!(world as usize, res.len());
}

/// Plain reference: the exact sum in rank order (what loss 0 must give).
pub fn reference_sum(inputs: &[Vec<f32>]) -> Vec<f32> {
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        for (a, b) in acc.iter_mut().zip(x) {
            *a += *b;
        }
    }
    acc
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Unwrap every rank's outcome, panicking with the error otherwise.
pub fn all_ok(outcomes: Vec<Outcome>) -> Vec<(Vec<f32>, OpReport)> {
    outcomes
        .into_iter()
        .enumerate()
        .map(|(r, o)| o.unwrap_or_else(|e| panic!("rank {r} failed: {e}")))
        .collect()
}

/// Every rank holds byte-identical results.
pub fn assert_identical(results: &[(Vec<f32>, OpReport)]) {
    let first = bits(&results[0].0);
    for (r, (v, _)) in results.iter().enumerate() {
        assert!(bits(v) == first, "rank {r} diverged from rank 0");
    }
}

pub fn opts(budget_ppm: u32) -> OpOptions {
    OpOptions { budget_ppm, gather_budget_ppm: 0, ..OpOptions::default() }
}

pub fn inputs(seed: u64, world: u32, len: usize) -> Vec<Vec<f32>> {
    let mut rng = Rng::stream(seed, 0xDA7A, len as u64);
    (0..world).map(|_| random_tensor(&mut rng, len)).collect()
}

/// Endpoints for `cfgs` (one world) that have verified each other and agreed
/// on their first run (epoch 1), by passing every datagram straight to its
/// destination: for tests that drive one endpoint by hand.
pub fn agreed_endpoints(cfgs: Vec<EndpointConfig>) -> Vec<Endpoint> {
    let mut nodes: Vec<Endpoint> = cfgs.into_iter().map(|c| Endpoint::new(c, Instant::ZERO)).collect();
    let mut now = Instant::ZERO;
    for e in &mut nodes {
        assert_eq!(e.begin_run(now), 1);
    }
    let mut buf = vec![0u8; 4096];
    for _ in 0..100 {
        if nodes.iter().all(|e| e.run().is_some_and(|(_, id)| id != 0)) {
            for e in &mut nodes {
                while e.poll_event().is_some() {}
            }
            return nodes;
        }
        for i in 0..nodes.len() {
            nodes[i].handle_timeout(now);
            while let Some(t) = nodes[i].poll_transmit(now, &mut buf) {
                let d = buf[..t.len].to_vec();
                nodes[t.dst as usize].handle_datagram(now, &d);
            }
        }
        now += Duration::from_millis(1);
    }
    panic!("the endpoints did not agree on a run");
}
