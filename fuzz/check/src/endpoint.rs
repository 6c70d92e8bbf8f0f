//! The endpoint state machine (`dlcp_proto::endpoint::Endpoint`): 2–4 ranks
//! on a network the input controls, checked against `dlcp_proto::oracle`.
//!
//! The input sets up the world size, one to three ops (tensor length and
//! options: budgets, fill, rescale, reduction) and then a script. Each step
//! picks one of: start an op on a rank (so ranks start ops at different times
//! and datagrams of ops not started yet are buffered), deliver any datagram in
//! flight (the fuzzer's choice of index is the reordering), drop one,
//! duplicate one (a replay, at any later time), let time pass (timers fire
//! late or on time), or inject something else:
//! - *outsider* datagrams, which must all be rejected: a genuine datagram with
//!   a bit flipped, misrouted to another rank, claimed from another source,
//!   tagged with another job's key, or random bytes;
//! - *insider* datagrams (in scripts whose second byte is 0xC0 or more): a
//!   genuine one decoded with the job key, one header field or its payload
//!   changed, and tagged again (what a holder of the key can send).
//!
//! After the script every op is started everywhere, and the network delivers
//! everything in order and runs the timers until every op has ended.
//! Checked:
//! - nothing panics; every rank ends every op it started exactly once, within
//!   a bounded virtual time (never a hang), and reports no op it did not start;
//! - without insider datagrams, an op that completed on every rank has the
//!   same bytes on every rank, equal to `oracle::recompute` from the owners'
//!   reports, and no transfer is missing more chunks than its budget allows.
//! - without insider datagrams, a rank that failed an op because a peer told
//!   it so (`OpError::PeerFailed`, a failing DONE) names a rank that failed it.

use std::collections::BTreeMap;

use dlcp_proto::endpoint::{
    DType, Endpoint, EndpointConfig, Event, Fill, OpError, OpId, OpOptions, OpReport, ReduceOp, Timers,
    allowed_missing,
};
use dlcp_proto::oracle;
use dlcp_proto::time::{Duration, Instant};
use dlcp_proto::wire::{self, JobKey};

use crate::input::Input;

/// Payload bytes per chunk: small, so that small tensors have many chunks.
const CHUNK_BYTES: usize = 64;
/// Job id of every endpoint.
const JOB: u32 = 77;
/// Steps of a script at most, and datagrams in flight at most.
const MAX_STEPS: usize = 2_000;
const MAX_FLIGHT: usize = 4_096;
/// One-way latency of the network after the script (during it, the script
/// delivers what it likes when it likes).
const LATENCY: Duration = Duration::from_micros(10);

fn key() -> JobKey {
    JobKey::new(b"dlcp fuzz endpoint key")
}

/// Short timers (as the simulations use), so a script spans many of them.
fn timers() -> Timers {
    let ms = Duration::from_millis;
    Timers {
        hard_timeout: ms(200),
        op_deadline: ms(2_000),
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

/// One op of the script: its id, every rank's input and its options.
struct Op {
    id: OpId,
    inputs: Vec<Vec<f32>>,
    opts: OpOptions,
}

fn op(input: &mut Input<'_>, i: u64, world: u32) -> Op {
    let most = if input.bool() { 64 } else { 1000 };
    let len = 1 + input.below(most);
    let budget_ppm = input.pick(&[0, 10_000, 50_000, 100_000]);
    let opts = OpOptions {
        budget_ppm,
        gather_budget_ppm: if input.bool() { 0 } else { budget_ppm },
        fill: if input.bool() { Fill::Zero } else { Fill::Local },
        rescale: input.bool(),
        reduce: if input.bool() { ReduceOp::Sum } else { ReduceOp::Average },
        dtype: input.pick(&DType::ALL),
        ..OpOptions::default()
    };
    // Small integers and halves (values of every dtype): every sum is exact,
    // whatever the order.
    let inputs = (0..world)
        .map(|r| {
            (0..len).map(|e| ((u64::from(r) * 31 + e as u64 * 7 + i * 13) % 17) as f32 * 0.5 - 4.0).collect()
        })
        .collect();
    // Every rank's first local run (`begin_run` in `Net::new`) is epoch 1.
    Op { id: OpId { run: 1, seq: 1 + i, tensor: i as u32 % 2 }, inputs, opts }
}

/// A datagram in flight.
struct Flight {
    /// When it arrives if the network just forwards it ([`LATENCY`] after it was sent).
    at: Instant,
    src: u32,
    dst: u32,
    data: Vec<u8>,
}

/// How an op ended on one rank.
type Outcome = Result<(Vec<f32>, OpReport), OpError>;

/// The endpoints, the network between them and what they reported.
struct Net {
    eps: Vec<Endpoint>,
    now: Instant,
    flights: Vec<Flight>,
    started: Vec<Vec<bool>>,
    ended: Vec<BTreeMap<OpId, Outcome>>,
    ops: Vec<Op>,
    buf: Vec<u8>,
    /// The script may deliver correctly tagged forgeries.
    allow_insider: bool,
    /// A correctly tagged forgery was delivered: results are no longer the oracle's.
    insider: bool,
    /// Datagrams delivered so far.
    delivered: u64,
    /// Datagrams delivered so far by packet type (see [`Summary::settle_types`]).
    types: [u64; 8],
}

impl Net {
    fn new(world: u32, ops: Vec<Op>, allow_insider: bool) -> Net {
        let eps = (0..world)
            .map(|r| {
                let session = 0x5E55_0000_0000_0000 | u64::from(r);
                let mut c = EndpointConfig::new(r, world, JOB, 1, session, key());
                c.chunk_bytes = CHUNK_BYTES;
                c.timers = timers();
                let mut e = Endpoint::new(c, Instant::ZERO);
                // The trainers attach: a run begins, announced in the first
                // HELLOs, which the script delivers, drops or mangles like
                // any other datagram (ops wait for the run's agreement).
                e.begin_run(Instant::ZERO);
                e
            })
            .collect();
        let n = ops.len();
        let mut net = Net {
            eps,
            now: Instant::ZERO,
            flights: Vec::new(),
            started: vec![vec![false; n]; world as usize],
            ended: (0..world).map(|_| BTreeMap::new()).collect(),
            ops,
            buf: vec![0u8; 70_000],
            allow_insider,
            insider: false,
            delivered: 0,
            types: [0; 8],
        };
        for r in 0..world as usize {
            net.pump(r);
        }
        net
    }

    fn world(&self) -> usize {
        self.eps.len()
    }

    /// Take rank `r`'s datagrams and events.
    fn pump(&mut self, r: usize) {
        while let Some(t) = self.eps[r].poll_transmit(self.now, &mut self.buf) {
            assert!((t.dst as usize) < self.world() && t.dst as usize != r, "rank {r} sends to {}", t.dst);
            if self.flights.len() < MAX_FLIGHT {
                let at = self.now + LATENCY;
                self.flights.push(Flight { at, src: r as u32, dst: t.dst, data: self.buf[..t.len].to_vec() });
            }
        }
        while let Some(ev) = self.eps[r].poll_event() {
            let (id, outcome) = match ev {
                Event::OpComplete { id, result, report } => (id, Ok((result, *report))),
                Event::OpFailed { id, error } => (id, Err(error)),
                _ => continue,
            };
            let i = self.ops.iter().position(|o| o.id == id);
            assert!(i.is_some_and(|i| self.started[r][i]), "rank {r} ended op {id:?} it never started");
            assert!(self.ended[r].insert(id, outcome).is_none(), "rank {r} ended op {id:?} twice");
        }
    }

    fn start(&mut self, r: usize, i: usize) {
        if self.started[r][i] {
            return;
        }
        self.started[r][i] = true;
        let op = &self.ops[i];
        self.eps[r]
            .start_allreduce(self.now, op.id, op.inputs[r].clone(), op.opts)
            .expect("a valid op starts");
        self.pump(r);
    }

    /// Hand `data` to rank `dst` as if it came from `from`'s address.
    fn deliver(&mut self, dst: usize, data: &[u8], from: Option<u32>) {
        self.delivered += 1;
        let ty = wire::Packet::new_checked(data).map_or(0, |p| usize::from(p.raw_type()).min(7));
        self.types[ty] += 1;
        self.eps[dst].handle_datagram_from(self.now, data, from);
        self.pump(dst);
    }

    /// Let `dt` pass; every rank whose timer is due handles it.
    fn advance(&mut self, dt: Duration) {
        self.now += dt;
        for r in 0..self.world() {
            if self.eps[r].poll_timeout().is_some_and(|t| t <= self.now) {
                self.eps[r].handle_timeout(self.now);
            }
            self.pump(r);
        }
    }

    fn all_ended(&self) -> bool {
        (0..self.world()).all(|r| self.ended[r].len() == self.ops.len())
    }

    /// Start every op everywhere, then deliver everything in order and run
    /// the timers until every op has ended. Panics if that takes too long.
    fn settle(&mut self) {
        for r in 0..self.world() {
            for i in 0..self.ops.len() {
                self.start(r, i);
            }
        }
        let limit = self.now + Duration::from_secs(5);
        let mut spins = 0;
        while !self.all_ended() {
            let timer = self.eps.iter().filter_map(Endpoint::poll_timeout).min();
            let flight = self.flights.first().map(|f| f.at);
            let next = match (flight, timer) {
                (Some(f), Some(t)) => f.min(t),
                (f, t) => f.or(t).expect("heartbeats keep a timer armed"),
            };
            assert!(next <= limit, "ops still running 5 s after the script ended: a hang");
            if flight == Some(next) {
                let f = self.flights.remove(0);
                self.now = self.now.max(f.at);
                self.deliver(f.dst as usize, &f.data, Some(f.src));
                spins = 0;
                continue;
            }
            // A timer that stays due after it was handled, with nothing sent:
            // an endless loop in virtual time (the simulator's `max_timer_spins`).
            spins = if next <= self.now { spins + 1 } else { 0 };
            assert!(spins < 1_000, "a timer stays due at {:?} and nothing happens", self.now);
            let dt = next.saturating_duration_since(self.now);
            self.advance(dt);
        }
    }
}

/// Something other than a genuine datagram, made from flight `i`.
fn forge(net: &mut Net, input: &mut Input<'_>, i: usize) {
    let world = net.world();
    let f = &net.flights[i];
    let (src, dst, mut data) = (f.src, f.dst as usize, f.data.clone());
    match input.u8() % 7 {
        0 => {
            let at = input.below(data.len().max(1));
            if let Some(b) = data.get_mut(at) {
                *b ^= 1 << (input.u8() % 8);
            }
            net.deliver(dst, &data, Some(src));
        }
        1 => net.deliver(input.below(world), &data, Some(src)),
        2 => net.deliver(dst, &data, Some(input.below(world + 1) as u32).filter(|&r| r as usize != world)),
        3 => {
            let Ok((h, p)) = wire::decode(&key(), &data) else { return };
            let n = wire::encode(&JobKey::new(b"another job's key"), &h, p, &mut net.buf).expect("re-encode");
            let forged = net.buf[..n].to_vec();
            net.deliver(dst, &forged, Some(src));
        }
        4 => {
            let junk = input.blob(96).to_vec();
            net.deliver(input.below(world), &junk, Some(src));
        }
        _ if net.allow_insider => insider(net, input, dst, &data),
        _ => net.deliver(dst, &data, Some(src)),
    }
}

/// A genuine datagram with one field or its payload changed, tagged again.
fn insider(net: &mut Net, input: &mut Input<'_>, dst: usize, data: &[u8]) {
    let Ok((mut h, p)) = wire::decode(&key(), data) else { return };
    let mut payload = p.to_vec();
    let v = input.u64();
    match input.u8() % 12 {
        0 => h.op = v % 5,
        1 => h.tensor = v as u32 % 3,
        2 => h.chunk_index = v as u32 % 64,
        3 => h.chunk_count = v as u32 % 64,
        4 => h.required = v as u32,
        5 => h.budget_ppm = v as u32 % 200_000,
        6 => h.seq = v as u32,
        7 => h.run = v % 4,
        8 => h.flags = wire::Flags(v as u8),
        9 => h.src = v as u32 % (net.world() as u32),
        10 => payload.truncate(v as usize % (payload.len() + 1)),
        _ => {
            if let Some(b) = payload.get_mut(v as usize % p.len().max(1)) {
                *b = (v >> 32) as u8;
            }
        }
    }
    h.payload_len = payload.len() as u16;
    let Ok(n) = wire::encode(&key(), &h, &payload, &mut net.buf) else { return };
    let forged = net.buf[..n].to_vec();
    net.insider = true;
    net.deliver(dst, &forged, Some(h.src));
}

/// One step of the script.
fn step(net: &mut Net, input: &mut Input<'_>) {
    let pick = |input: &mut Input<'_>, n: usize| input.below(n.max(1));
    match input.u8() % 16 {
        0 => {
            let (r, i) = (input.below(net.world()), input.below(net.ops.len()));
            net.start(r, i);
        }
        1..=6 if !net.flights.is_empty() => {
            let f = net.flights.remove(pick(input, net.flights.len()));
            net.deliver(f.dst as usize, &f.data, Some(f.src));
        }
        7 | 8 if !net.flights.is_empty() => {
            net.flights.remove(pick(input, net.flights.len()));
        }
        9 if !net.flights.is_empty() => {
            let f = &net.flights[pick(input, net.flights.len())];
            let (dst, src, data) = (f.dst as usize, f.src, f.data.clone());
            net.deliver(dst, &data, Some(src));
        }
        10 | 11 if !net.flights.is_empty() => {
            let i = pick(input, net.flights.len());
            forge(net, input, i);
        }
        _ => {
            let us = input.pick(&[1, 20, 100, 1_000, 5_000, 20_000, 60_000]);
            net.advance(Duration::from_micros(us));
        }
    }
}

/// How far one input went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Ranks.
    pub world: u32,
    /// Ops in the script.
    pub ops: usize,
    /// Ops that completed on every rank.
    pub completed: usize,
    /// Of those, ops whose results were checked against the oracle (all of
    /// them unless an insider datagram was delivered).
    pub checked: usize,
    /// An insider datagram (correctly tagged forgery) was delivered.
    pub insider: bool,
    /// Datagrams delivered, and virtual time, after the script.
    pub settle: (u64, Duration),
    /// Of the datagrams delivered after the script, how many of each packet
    /// type (index: the type's wire value; 0: not a packet).
    pub settle_types: [u64; 8],
}

/// Run one input.
pub fn check(data: &[u8]) {
    run(data);
}

/// Run one input and say how far it went ([`check`] without the summary).
pub fn run(data: &[u8]) -> Summary {
    let mut input = Input::new(data);
    let world = 2 + input.below(3) as u32;
    let allow_insider = input.u8() >= 0xC0;
    let n = 1 + input.below(3);
    let ops = (0..n as u64).map(|i| op(&mut input, i, world)).collect();
    let mut net = Net::new(world, ops, allow_insider);
    for _ in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        step(&mut net, &mut input);
    }
    let (before, start, types) = (net.delivered, net.now, net.types);
    net.settle();
    let settle = (net.delivered - before, net.now.saturating_duration_since(start));
    let completed = (0..net.ops.len())
        .filter(|&i| (0..net.world()).all(|r| net.ended[r][&net.ops[i].id].is_ok()))
        .count();
    if !net.insider {
        for i in 0..net.ops.len() {
            check_op(&net, i);
            check_blame(&net, i);
        }
    }
    Summary {
        world,
        ops: net.ops.len(),
        completed,
        checked: if net.insider { 0 } else { completed },
        insider: net.insider,
        settle,
        settle_types: std::array::from_fn(|i| net.types[i] - types[i]),
    }
}

/// A rank that failed an op because a peer said it failed it (a failing
/// DONE, wire version 5) names a rank that did fail it.
fn check_blame(net: &Net, i: usize) {
    let id = net.ops[i].id;
    for r in 0..net.world() {
        if let Err(OpError::PeerFailed { rank, reason }) = &net.ended[r][&id] {
            let theirs = &net.ended[*rank as usize][&id];
            assert!(
                theirs.is_err(),
                "op {id:?}: rank {r} says rank {rank} failed it ({reason}), but it completed"
            );
        }
    }
}

/// An op that completed on every rank is the oracle's everywhere.
fn check_op(net: &Net, i: usize) {
    let op = &net.ops[i];
    let mut done = Vec::new();
    for r in 0..net.world() {
        match &net.ended[r][&op.id] {
            Ok(d) => done.push(d),
            Err(_) => return,
        }
    }
    let reports: Vec<&OpReport> = done.iter().map(|d| &d.1).collect();
    let inputs: Vec<&[f32]> = op.inputs.iter().map(Vec::as_slice).collect();
    let want = oracle::recompute(&inputs, &reports, op.opts, CHUNK_BYTES / op.opts.dtype.size());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (r, (result, report)) in done.iter().enumerate() {
        assert_eq!(bits(result), bits(&want), "op {:?}: rank {r} differs from the oracle", op.id);
        for t in &report.scatter {
            let missing = t.delivered.count_zeros();
            assert!(
                missing <= allowed_missing(t.chunks, op.opts.budget_ppm),
                "op {:?}: rank {r} closed the transfer from {} missing {missing} of {} chunks at {} ppm",
                op.id,
                t.peer,
                t.chunks,
                op.opts.budget_ppm
            );
        }
        let masked = report.own_mask.count_ones();
        assert!(
            masked <= allowed_missing(report.own_chunks, op.opts.gather_budget_ppm),
            "op {:?}: rank {r} masked {masked}",
            op.id
        );
    }
}
