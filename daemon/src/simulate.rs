//! `dlcpd simulate`: N hosts doing allreduce rounds through the real protocol core
//! on the deterministic network simulator (virtual time, seeded data and loss).
//!
//! It needs nothing but cargo and runs in seconds. Every iteration submits one
//! tensor per layer bucket on every host at once, runs until all complete, checks
//! that every rank holds byte-identical results equal to the value recomputed
//! from the inputs, the delivery bitmaps and the fill rule, and prints a progress
//! line; the run ends with a summary table.

use std::cell::RefCell;
use std::io::{self, Write};
use std::rc::Rc;
use std::time::Instant as WallClock;

use dlcp_proto::class::Class;
use dlcp_proto::endpoint::{
    Collective, DType, Endpoint, EndpointConfig, Event, Footprint, OpId, OpOptions, OpReport, ReduceOp,
};
use dlcp_proto::oracle;
use dlcp_proto::rng::Rng;
use dlcp_proto::sim::{NetConfig, NetStats, Sim, TraceEvent, TraceRecord};
use dlcp_proto::time::{Duration, Instant};
use dlcp_proto::wire::{JobKey, OVERHEAD, Packet};

/// One rank's result of one op.
type RankResult = (Vec<f32>, OpReport);

/// Payload bytes per packet at MTU 1500 (1500 − 28 IPv4/UDP − 96 dlcp header and tag).
const CHUNK_BYTES: usize = 1500 - 28 - OVERHEAD;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct SimOptions {
    /// Hosts (ranks).
    pub hosts: u32,
    /// Megabytes (10^6 bytes) of gradients per iteration.
    pub size_mb: f64,
    /// Element type of the gradients (f16/bf16: f32 accumulation, one rounding).
    pub dtype: DType,
    /// The reduction.
    pub reduce: ReduceOp,
    /// The collective (allreduce by default).
    pub collective: Collective,
    /// Broadcast: the root rank.
    pub root: u32,
    /// Random loss, percent.
    pub loss_pct: f64,
    /// Loss budget, a fraction (0.01 = 1 %; 0 = reliable).
    pub budget: f64,
    /// Iterations.
    pub iters: u32,
    /// Tensors per iteration.
    pub layers: u32,
    /// Link rate, Gbit/s.
    pub link_gbps: f64,
    /// Seed.
    pub seed: u64,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            hosts: 4,
            size_mb: 16.0,
            dtype: DType::F32,
            reduce: ReduceOp::Sum,
            collective: Collective::Allreduce,
            root: 0,
            loss_pct: 0.0,
            budget: 0.01,
            iters: 10,
            layers: 4,
            link_gbps: 10.0,
            seed: 1,
        }
    }
}

impl SimOptions {
    /// Check the options, naming the flag that is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.size_mb > 0.0 && self.size_mb <= 4096.0) {
            return Err(format!("--size {} out of range (allowed: > 0 ..= 4096 MB)", self.size_mb));
        }
        if !(0.0..=50.0).contains(&self.loss_pct) {
            return Err(format!("--loss {} out of range (allowed: 0 ..= 50 percent)", self.loss_pct));
        }
        if !(0.0..=dlcp_config::schema::MAX_BUDGET).contains(&self.budget) {
            return Err(format!(
                "--budget {} out of range (allowed: 0 ..= 0.10; {})",
                self.budget,
                dlcp_config::BUDGET_FORMS
            ));
        }
        if !(self.link_gbps >= 0.01 && self.link_gbps <= 1000.0) {
            return Err(format!("--link-gbps {} out of range (allowed: 0.01 ..= 1000)", self.link_gbps));
        }
        if self.hosts < 1 || self.layers < 1 || self.iters < 1 {
            return Err("--hosts, --layers and --iters must be at least 1".into());
        }
        if self.collective == Collective::Broadcast && self.root >= self.hosts {
            return Err(format!(
                "--root {} is not a rank of {} hosts (0 ..= {})",
                self.root,
                self.hosts,
                self.hosts - 1
            ));
        }
        if !self.collective.reduces() && self.reduce != ReduceOp::Sum {
            return Err(format!(
                "--op {}: {} does not reduce (only allreduce and reduce-scatter take --op)",
                self.reduce.name(),
                self.collective.name()
            ));
        }
        Ok(())
    }

    /// The options of layer `l`'s op.
    fn op_options(&self, l: u32, budget_ppm: u32) -> OpOptions {
        // As for allreduce, the budget is the scatter phase's and the all-gather is
        // exact; an allgather has only the all-gather phase: the budget is its.
        let gather_budget_ppm = if self.collective.scatters() { 0 } else { budget_ppm };
        OpOptions {
            layer: l,
            layers: self.layers,
            budget_ppm,
            gather_budget_ppm,
            dtype: self.dtype,
            reduce: self.reduce,
            collective: self.collective,
            root: self.root,
            ..OpOptions::default()
        }
    }

    /// Each rank's share of the DATA an op sends once (no repairs), in
    /// chunks of `chunk_elems`, and the fraction of the data each link
    /// carries at the busiest port (the physical limit of the scheme).
    fn ideal(&self, elems: usize, chunk_elems: usize) -> (f64, f64) {
        let world = self.hosts;
        let n = f64::from(world);
        let all_chunks: u64 =
            (0..world).map(|s| oracle::shard(elems, world, s).len().div_ceil(chunk_elems) as u64).sum();
        let once = all_chunks as f64 * (n - 1.0) / n;
        match self.collective {
            // Every rank sends every other owner's shard and its own reduced
            // shard to every other rank: 2(N-1)/N of the data on each link.
            Collective::Allreduce => (2.0 * once, 2.0 * (n - 1.0) / n),
            Collective::ReduceScatter | Collective::Allgather => (once, (n - 1.0) / n),
            // The root scatters the other shards, then every owner sends its
            // shard to every other rank: the root's uplink carries the data
            // about twice (its own shard N-1 times).
            Collective::Broadcast => {
                let root = oracle::shard(elems, world, self.root).len().div_ceil(chunk_elems) as f64;
                (once + (all_chunks as f64 - root) / n, 2.0 * (n - 1.0) / n)
            }
            Collective::Barrier => (n - 1.0, 0.0),
        }
    }

    fn elems_per_tensor(&self) -> usize {
        ((self.size_mb * 1e6 / self.dtype.size() as f64 / f64::from(self.layers)) as usize).max(1)
    }
}

/// What the run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct SimSummary {
    /// Every op on every rank completed with the expected bytes.
    pub verified: bool,
    /// Ops completed (per rank).
    pub ops_completed: u64,
    /// Ops failed (per rank).
    pub ops_failed: u64,
    /// Median op time (virtual).
    pub op_p50: Duration,
    /// 99th percentile op time (virtual).
    pub op_p99: Duration,
    /// Bytes reduced per iteration / iteration time, Gbit/s (virtual).
    pub goodput_gbps: f64,
    /// Per class: (packets offered, fraction delivered) on the simulated network.
    pub per_class: Vec<(Class, u64, f64)>,
    /// Repair packets sent.
    pub repairs: u64,
    /// Receive deadlines that fired.
    pub deadlines: u64,
    /// Flow control and the switch, summed over the ranks and ports.
    pub flow: FlowCounts,
    /// Least delivered fraction of any transfer.
    pub min_delivered: f64,
    /// Wall-clock run time.
    pub wall: std::time::Duration,
    /// Datagrams sent per rank per op, by wire packet type (index: type value;
    /// 1 DATA, 2 PROBE, 3 BITMAP, 4 DONE, 5 HELLO, 6 GRANT, 7 GOODBYE, 8 ACK).
    pub per_rank_op: [f64; 9],
    /// DATA packets per rank per op if every chunk crossed the network once.
    pub ideal_data_per_rank_op: f64,
    /// Largest per-rank memory and state figures sampled during the run.
    pub peak: PeakFootprint,
}

/// Flow control's counters summed over the ranks, and the simulated
/// switch's queue drops ([`SimSummary::flow`]): the incast flow control is
/// for, and what it costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowCounts {
    /// Datagrams dropped by the switch's port queues (push-outs included).
    pub switch_drops: u64,
    /// GRANTs sent.
    pub grants: u64,
    /// DATA datagrams that waited for their receiver's credit.
    pub credit_waits: u64,
    /// Credit requests sent (out of credit, no GRANT for a retry timeout).
    pub requests: u64,
    /// Senders' windows halved by their receivers (a run of their
    /// datagrams lost).
    pub window_cuts: u64,
    /// Packets other than GRANTs whose piggybacked credit was news.
    pub piggybacked: u64,
}

impl SimSummary {
    /// DATA packets per rank per op.
    pub fn data_per_rank_op(&self) -> f64 {
        self.per_rank_op[1]
    }

    /// Control packets (PROBE, BITMAP, DONE, HELLO, GRANT, GOODBYE, ACK) per rank per op.
    pub fn control_per_rank_op(&self) -> f64 {
        self.per_rank_op[2..].iter().sum()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One rank's seeded input tensor.
fn tensor(rng: &mut Rng, elems: usize) -> Vec<f32> {
    (0..elems).map(|_| (rng.next_f64() * 2.0 - 1.0) as f32).collect()
}

/// Events between two footprint samples (one rank per sample, round robin).
const FOOTPRINT_EVERY: u64 = 512;

/// The largest per-rank figures seen in footprint samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeakFootprint {
    /// Protocol state bytes of one endpoint (see [`Footprint::state_bytes`]).
    pub state_bytes: usize,
    /// Tensor bytes of one endpoint.
    pub tensor_bytes: usize,
    /// Open transfers of one endpoint.
    pub open_transfers: u32,
    /// Datagrams queued in one endpoint.
    pub queued: usize,
}

impl PeakFootprint {
    fn observe(&mut self, f: Footprint) {
        self.state_bytes = self.state_bytes.max(f.state_bytes + f.early_bytes);
        self.tensor_bytes = self.tensor_bytes.max(f.tensor_bytes);
        self.open_transfers = self.open_transfers.max(f.open_transfers);
        self.queued = self.queued.max(f.queued);
    }
}

/// The ops of one layer bucket in an iteration: id, options, and the generator
/// state its inputs were drawn from (to regenerate them for the check).
type Batch = (OpId, OpOptions, Rng);

/// One run's simulator and what it has measured so far.
struct Run<'a> {
    opts: &'a SimOptions,
    sim: Sim<Endpoint>,
    elems: usize,
    budget_ppm: u32,
    rng: Rng,
    op_times: Vec<Duration>,
    iter_gbps: Vec<f64>,
    verified: bool,
    completed: u64,
    failed: u64,
    min_delivered: f64,
    peak: PeakFootprint,
}

/// Run the demo, writing progress and the summary to `out`.
pub fn run(opts: &SimOptions, out: &mut impl Write) -> io::Result<SimSummary> {
    let wall = WallClock::now();
    let world = opts.hosts;
    let key = JobKey::new(b"dlcpd demo job secret");
    let nodes: Vec<Endpoint> = (0..world)
        .map(|r| {
            // A fixed session per rank: the simulation is deterministic.
            let mut c = EndpointConfig::new(r, world, 1, 1, u64::from(r) + 1, key.clone());
            c.chunk_bytes = CHUNK_BYTES;
            let mut e = Endpoint::new(c, Instant::ZERO);
            // Every simulated host's trainers attach at once: one local run.
            e.begin_run(Instant::ZERO);
            e
        })
        .collect();
    let net = NetConfig::default()
        .with_seed(opts.seed)
        .with_link_rate((opts.link_gbps * 1e9) as u64)
        .with_loss(opts.loss_pct / 100.0);
    let mut sim = Sim::new(net, nodes);
    // The check below recomputes results from the ops' reports, not from
    // the network's delivery log.
    sim.set_delivery_log(false);
    // The hosts verify each other and agree on the run before the first op
    // (not counted in the per-op figures below). Nothing here undoes an
    // agreement (no host restarts or leaves), so the scan resumes where it
    // stopped: amortised O(1) per event, not O(world).
    let mut next_agreed = 0u32;
    sim.run_until(Instant::ZERO + Duration::from_secs(5), |s| {
        while next_agreed < world && s.node(next_agreed).run().is_some_and(|(_, id)| id != 0) {
            next_agreed += 1;
        }
        next_agreed == world
    });
    // Datagrams handed to the network, by packet type (index = wire type value).
    let sent_by_type = Rc::new(RefCell::new([0u64; 9]));
    let counter = Rc::clone(&sent_by_type);
    sim.set_trace(Some(Box::new(move |t: &TraceRecord<'_>| {
        if t.event == TraceEvent::Sent
            && let Ok(p) = Packet::new_checked(t.datagram)
        {
            let ty = usize::from(p.raw_type()).min(8);
            counter.borrow_mut()[ty] += 1;
        }
    })));
    let elems = opts.elems_per_tensor();
    writeln!(
        out,
        "dlcpd simulate: {world} simulated hosts, {} of {} tensors × {:.2} MB {} ({}) per iteration, {} Gbit/s \
         star network, random loss {}%, budget {}, seed {} (times are virtual)",
        match opts.collective {
            Collective::Broadcast => format!("broadcast from rank {}", opts.root),
            c => c.name().to_string(),
        },
        opts.layers,
        (elems * opts.dtype.size()) as f64 / 1e6,
        opts.dtype.name(),
        opts.reduce.name(),
        opts.link_gbps,
        opts.loss_pct,
        dlcp_config::percent(opts.budget),
        opts.seed
    )?;
    let mut run = Run {
        opts,
        sim,
        elems,
        budget_ppm: dlcp_config::schema::fraction_to_ppm(opts.budget),
        rng: Rng::stream(opts.seed, 0xDE40, u64::from(world)),
        op_times: Vec::new(),
        iter_gbps: Vec::new(),
        verified: true,
        completed: 0,
        failed: 0,
        min_delivered: 1.0,
        peak: PeakFootprint::default(),
    };
    for it in 0..opts.iters {
        run.iteration(it, out)?;
    }
    run.finish();
    let per_rank_op = *sent_by_type.borrow();
    let summary = run.summary(per_rank_op, wall.elapsed());
    print_summary(opts, &summary, out)?;
    Ok(summary)
}

impl Run<'_> {
    /// One iteration: start one op per layer on every rank, run the network
    /// until all are done, check every result and print a progress line.
    fn iteration(&mut self, it: u32, out: &mut impl Write) -> io::Result<()> {
        let world = self.opts.hosts;
        let start = self.sim.now();
        let batch = self.start_ops(it)?;
        // Done when every rank's ops finished (ops only finish during the run,
        // so the scan resumes where it stopped); sample a rank's footprint
        // every so often (amortised O(1) per event).
        let (mut next_busy, mut steps) = (0u32, 0u64);
        let peak = &mut self.peak;
        self.sim.run_until(start + Duration::from_secs(120), |s| {
            steps += 1;
            if steps % FOOTPRINT_EVERY == 0 {
                peak.observe(s.node(((steps / FOOTPRINT_EVERY) % u64::from(world)) as u32).footprint());
            }
            while next_busy < world && s.node(next_busy).ops_in_flight() == 0 {
                next_busy += 1;
            }
            next_busy == world
        });
        let results = self.collect(&batch, out)?;
        let (iter_ok, iter_end, iter_min) = self.check(&batch, results, start);
        self.verified &= iter_ok;
        self.min_delivered = self.min_delivered.min(iter_min);
        let secs = (iter_end - start).as_secs_f64();
        let bits = (self.elems * self.opts.dtype.size() * self.opts.layers as usize * 8) as f64;
        let gbps = if secs > 0.0 { bits / secs / 1e9 } else { 0.0 };
        self.iter_gbps.push(gbps);
        let repairs: u64 = (0..world).map(|r| self.sim.node(r).stats().repairs_sent).sum();
        writeln!(
            out,
            "iter {:>4}/{}: {:>9.3} ms  {:>7.2} Gbit/s  min delivered {:>7.3}%  repairs so far {:>6}  {}",
            it + 1,
            self.opts.iters,
            secs * 1e3,
            gbps,
            iter_min * 100.0,
            repairs,
            if iter_ok { "ok" } else { "MISMATCH" }
        )?;
        out.flush()
    }

    /// After the last iteration: run until every owner heard every ACK
    /// (wire version 10: receivers hold them up to the ACK delay), so the
    /// packet counts include them (the op times do not: a result is
    /// delivered before its ACKs).
    fn finish(&mut self) {
        let world = self.opts.hosts;
        let start = self.sim.now();
        let mut next = 0u32;
        self.sim.run_until(start + Duration::from_secs(10), |s| {
            while next < world && s.node(next).ops_unacknowledged() == 0 {
                next += 1;
            }
            next == world
        });
    }

    /// Start iteration `it`'s op of every layer on every rank, with seeded inputs.
    fn start_ops(&mut self, it: u32) -> io::Result<Vec<Batch>> {
        let mut batch = Vec::new();
        for l in 0..self.opts.layers {
            let id = OpId { run: 1, seq: u64::from(it), tensor: l };
            let o = self.opts.op_options(l, self.budget_ppm);
            // The inputs move into the endpoints; the check regenerates them
            // from this copy of the generator (a world of inputs is big).
            let input_rng = self.rng.clone();
            let now = self.sim.now();
            for r in 0..self.opts.hosts {
                let input = tensor(&mut self.rng, self.elems);
                self.sim
                    .node_mut(r)
                    .start_allreduce(now, id, input, o)
                    .map_err(|e| io::Error::other(e.to_string()))?;
            }
            for r in 0..self.opts.hosts {
                self.peak.observe(self.sim.node(r).footprint());
            }
            batch.push((id, o, input_rng));
        }
        Ok(batch)
    }

    /// Every rank's events: the results of `batch`'s ops (by op, then rank),
    /// counting completions and printing failures.
    fn collect(&mut self, batch: &[Batch], out: &mut impl Write) -> io::Result<Vec<Vec<Option<RankResult>>>> {
        let world = self.opts.hosts;
        let mut results: Vec<Vec<Option<RankResult>>> =
            (0..batch.len()).map(|_| (0..world).map(|_| None).collect()).collect();
        for r in 0..world {
            while let Some(ev) = self.sim.node_mut(r).poll_event() {
                match ev {
                    Event::OpComplete { id, result, report } => {
                        self.completed += 1;
                        if let Some(i) = batch.iter().position(|b| b.0 == id) {
                            results[i][r as usize] = Some((result, *report));
                        }
                    }
                    Event::OpFailed { id, error } => {
                        self.failed += 1;
                        writeln!(out, "  rank {r}: op {}/{} failed: {error}", id.seq, id.tensor)?;
                    }
                    _ => {}
                }
            }
        }
        Ok(results)
    }

    /// Check every op of `batch` against the value recomputed from its inputs,
    /// the delivery bitmaps and the fill rule. Returns whether all matched, when
    /// the last finished (from `start`), and the least delivered fraction.
    fn check(
        &mut self,
        batch: &[Batch],
        mut results: Vec<Vec<Option<RankResult>>>,
        start: Instant,
    ) -> (bool, Instant, f64) {
        let mut iter_ok = true;
        let mut iter_end = start;
        let mut iter_min = 1.0f64;
        for (i, (_, o, input_rng)) in batch.iter().enumerate() {
            let Some(res) = std::mem::take(&mut results[i]).into_iter().collect::<Option<Vec<_>>>() else {
                iter_ok = false;
                continue;
            };
            let mut g = input_rng.clone();
            let inputs: Vec<Vec<f32>> = (0..self.opts.hosts).map(|_| tensor(&mut g, self.elems)).collect();
            let reports: Vec<&OpReport> = res.iter().map(|(_, rep)| rep).collect();
            let ins: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
            let want: Vec<u32> = oracle::recompute(&ins, &reports, *o, CHUNK_BYTES / o.dtype.size())
                .iter()
                .map(|x| x.to_bits())
                .collect();
            for (r, (v, rep)) in res.iter().enumerate() {
                iter_ok &= match o.collective {
                    // A barrier's result is nothing: that every rank left it is the check.
                    Collective::Barrier => true,
                    // A reduce-scatter leaves rank r its shard, zero elsewhere.
                    Collective::ReduceScatter => {
                        let own = oracle::shard(self.elems, self.opts.hosts, r as u32);
                        v.iter()
                            .enumerate()
                            .all(|(e, x)| x.to_bits() == if own.contains(&e) { want[e] } else { 0 })
                    }
                    _ => v.iter().map(|x| x.to_bits()).eq(want.iter().copied()),
                };
                self.op_times.push(rep.duration());
                iter_end = iter_end.max(rep.finished);
                iter_min = iter_min.min(rep.min_delivered_fraction());
            }
        }
        (iter_ok, iter_end, iter_min)
    }

    /// The summary, given the datagrams sent by packet type.
    fn summary(mut self, sent_by_type: [u64; 9], wall: std::time::Duration) -> SimSummary {
        let world = self.opts.hosts;
        self.op_times.sort();
        let st: &NetStats = self.sim.stats();
        let per_class: Vec<(Class, u64, f64)> = Class::all()
            .filter(|c| st.offered[c.index()] > 0)
            .map(|c| {
                let offered = st.offered[c.index()];
                let lost = st.lost[c.index()] + st.switch_drops[c.index()];
                (c, offered, 1.0 - lost as f64 / offered as f64)
            })
            .collect();
        let sim = &self.sim;
        let sum = |f: fn(&dlcp_proto::endpoint::Stats) -> u64| {
            (0..world).map(|r| f(sim.node(r).stats())).sum::<u64>()
        };
        self.iter_gbps.sort_by(f64::total_cmp);
        let ops_per_rank = f64::from(self.opts.iters) * f64::from(self.opts.layers);
        let chunk_elems = CHUNK_BYTES / self.opts.dtype.size();
        let (ideal_data, _) = self.opts.ideal(self.elems, chunk_elems);
        SimSummary {
            verified: self.verified,
            ops_completed: self.completed,
            ops_failed: self.failed,
            op_p50: percentile(&self.op_times, 0.5),
            op_p99: percentile(&self.op_times, 0.99),
            goodput_gbps: self.iter_gbps.get(self.iter_gbps.len() / 2).copied().unwrap_or(0.0),
            per_class,
            repairs: sum(|s| s.repairs_sent),
            deadlines: sum(|s| s.deadlines_fired),
            flow: FlowCounts {
                switch_drops: NetStats::total(&st.switch_drops),
                grants: sum(|s| s.flow_grants_sent),
                credit_waits: sum(|s| s.flow_credit_waits),
                requests: sum(|s| s.flow_requests_sent),
                window_cuts: sum(|s| s.flow_window_cuts),
                piggybacked: sum(|s| s.flow_credit_piggybacked),
            },
            min_delivered: self.min_delivered,
            wall,
            per_rank_op: sent_by_type.map(|n| n as f64 / f64::from(world) / ops_per_rank),
            ideal_data_per_rank_op: ideal_data,
            peak: self.peak,
        }
    }
}

/// The summary table.
fn print_summary(opts: &SimOptions, summary: &SimSummary, out: &mut impl Write) -> io::Result<()> {
    let world = opts.hosts;
    writeln!(out)?;
    writeln!(out, "summary ({world} hosts, {} iterations × {} tensors)", opts.iters, opts.layers)?;
    writeln!(out, "  ops completed / failed      {} / {}", summary.ops_completed, summary.ops_failed)?;
    writeln!(
        out,
        "  op time p50 / p99           {:.3} ms / {:.3} ms (virtual)",
        ms(summary.op_p50),
        ms(summary.op_p99)
    )?;
    if opts.collective == Collective::Barrier {
        writeln!(
            out,
            "  goodput                     none: a barrier moves one element per rank (the tensor size is unused)"
        )?;
    } else {
        writeln!(
            out,
            "  goodput (median iteration)  {:.2} Gbit/s of tensor data on {} Gbit/s links",
            summary.goodput_gbps, opts.link_gbps
        )?;
    }
    // Physical limit of the scheme: the busiest link carries `share` of the
    // data (allreduce: 2(N-1)/N), plus per-packet framing (28 IP/UDP + 14
    // Ethernet + 100 dlcp bytes).
    let (_, share) = opts.ideal(1, 1);
    let wire_eff = CHUNK_BYTES as f64 / (CHUNK_BYTES as f64 + 28.0 + 14.0 + OVERHEAD as f64);
    let bound = if share > 0.0 { opts.link_gbps / share * wire_eff } else { f64::NAN };
    let what = match opts.collective {
        Collective::Allreduce => "2(N-1)/N of the data crosses each link",
        Collective::ReduceScatter | Collective::Allgather => "(N-1)/N of the data crosses each link",
        Collective::Broadcast => "the root's link carries 2(N-1)/N of the data",
        Collective::Barrier => "a barrier moves no data",
    };
    if bound.is_finite() {
        writeln!(
            out,
            "  limit of the links          {:.2} Gbit/s ({what}, framing included): ratio {:.3}",
            bound,
            summary.goodput_gbps / bound
        )?;
    } else {
        writeln!(out, "  limit of the links          none ({what})")?;
    }
    writeln!(
        out,
        "  min delivered per transfer  {:.3}% (budget {})",
        summary.min_delivered * 100.0,
        dlcp_config::percent(opts.budget)
    )?;
    writeln!(out, "  repairs sent                {}", summary.repairs)?;
    writeln!(out, "  deadlines fired             {}", summary.deadlines)?;
    let f = summary.flow;
    writeln!(
        out,
        "  flow control                {} switch queue drops, {} GRANTs, {} credit waits, {} credit requests, \
         {} window cuts, {} credits piggybacked",
        f.switch_drops, f.grants, f.credit_waits, f.requests, f.window_cuts, f.piggybacked
    )?;
    writeln!(out, "  class  packets     delivered by the network")?;
    for (c, offered, frac) in &summary.per_class {
        let what = if *c == Class::CONTROL { " (control)" } else { "" };
        writeln!(out, "  {:>5}  {:>9}   {:>8.3}%{what}", c.get(), offered, frac * 100.0)?;
    }
    writeln!(
        out,
        "  verification                {}",
        if !summary.verified {
            "FAILED"
        } else if opts.collective == Collective::Barrier {
            "every rank left every barrier"
        } else if opts.collective == Collective::ReduceScatter {
            "every rank's shard equal to the value recomputed from inputs, delivery bitmaps and fill rule, zero elsewhere"
        } else {
            "every rank byte-identical and equal to the value recomputed from inputs, delivery bitmaps and fill rule"
        }
    )?;
    let (data, ctl) = (summary.data_per_rank_op(), summary.control_per_rank_op());
    writeln!(
        out,
        "  packets per rank per op     {:.1} data (ideal {:.1}: every chunk once), {:.1} control ({:.1}% of all)",
        data,
        summary.ideal_data_per_rank_op,
        ctl,
        if data + ctl > 0.0 { 100.0 * ctl / (data + ctl) } else { 0.0 }
    )?;
    let t = &summary.per_rank_op;
    writeln!(
        out,
        "  control per rank per op     probe {:.1}, bitmap {:.1}, done {:.1}, hello {:.1}, grant {:.1}, ack {:.1}",
        t[2],
        t[3],
        t[4],
        t[5],
        t[6] + t[7],
        t[8]
    )?;
    let peers = f64::from(world.saturating_sub(1).max(1));
    writeln!(
        out,
        "  control per peer per op     {:.3} (probe {:.3}, bitmap {:.3}, done {:.3}, hello {:.3}, grant {:.3}, ack {:.3})",
        ctl / peers,
        t[2] / peers,
        t[3] / peers,
        t[4] / peers,
        t[5] / peers,
        (t[6] + t[7]) / peers,
        t[8] / peers
    )?;
    let p = &summary.peak;
    writeln!(
        out,
        "  per-rank peak (sampled)     state {:.1} KiB, tensor data {:.2} MiB, open transfers {}, queued datagrams {}",
        p.state_bytes as f64 / 1024.0,
        p.tensor_bytes as f64 / (1024.0 * 1024.0),
        p.open_transfers,
        p.queued
    )?;
    writeln!(out, "  wall time                   {:.2} s", summary.wall.as_secs_f64())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f16 and bf16, sum and average: verified against the oracle (f32
    /// accumulation, one rounding) under loss, and 2-byte elements put twice
    /// the elements in a datagram.
    #[test]
    fn small_lossy_simulation_of_2_byte_types_verifies() {
        for (dtype, reduce) in [(DType::Bf16, ReduceOp::Average), (DType::F16, ReduceOp::Sum)] {
            let o =
                SimOptions { size_mb: 0.5, loss_pct: 2.0, iters: 2, dtype, reduce, ..SimOptions::default() };
            let mut buf = Vec::new();
            let s = run(&o, &mut buf).unwrap();
            let text = String::from_utf8(buf).unwrap();
            assert!(s.verified && s.ops_completed == 2 * 4 * 4, "{dtype:?} {reduce:?}: {text}");
            assert!(text.contains(dtype.name()) && text.contains(reduce.name()), "{text}");
        }
    }

    #[test]
    fn small_lossy_demo_verifies() {
        let o = SimOptions { size_mb: 0.5, loss_pct: 2.0, budget: 0.01, iters: 3, ..SimOptions::default() };
        let mut buf = Vec::new();
        let s = run(&o, &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(s.verified, "{text}");
        assert_eq!(s.ops_completed, 3 * 4 * 4);
        assert!(s.repairs > 0, "2% loss against a 1% budget must need repairs");
        assert!(s.min_delivered >= 0.99);
        assert!(text.contains("summary") && text.contains("iter    3/3"), "{text}");
        // Every chunk crosses at least once; PROBEs and DONEs exist; state was sampled.
        assert!(s.data_per_rank_op() >= s.ideal_data_per_rank_op, "{text}");
        assert!(s.per_rank_op[2] > 0.0 && s.per_rank_op[4] > 0.0, "{text}");
        assert!(s.peak.state_bytes > 0 && s.peak.open_transfers > 0 && s.peak.tensor_bytes > 0, "{text}");
        assert!(text.contains("packets per rank per op") && text.contains("per-rank peak"), "{text}");
    }

    /// Every collective under loss verifies against the oracle on every
    /// rank, and sends about its own ideal of DATA (a reduce-scatter half
    /// an allreduce's).
    #[test]
    fn small_lossy_simulation_of_every_collective_verifies() {
        let mut data = Vec::new();
        for collective in Collective::ALL {
            let o = SimOptions {
                size_mb: 0.5,
                loss_pct: 2.0,
                iters: 2,
                collective,
                root: 3,
                ..SimOptions::default()
            };
            let mut buf = Vec::new();
            let s = run(&o, &mut buf).unwrap();
            let text = String::from_utf8(buf).unwrap();
            assert!(s.verified && s.ops_completed == 2 * 4 * 4, "{collective:?}: {text}");
            assert!(text.contains(collective.name()), "{text}");
            assert!(s.data_per_rank_op() >= s.ideal_data_per_rank_op, "{collective:?}: {text}");
            data.push(s.ideal_data_per_rank_op);
        }
        // allreduce, reduce-scatter, allgather, broadcast, barrier
        assert_eq!(data[0], data[1] + data[2], "{data:?}");
        assert!(data[3] > data[2], "{data:?}");
        assert_eq!(data[4], 3.0, "{data:?}");
    }

    #[test]
    fn options_are_checked() {
        assert!(
            SimOptions { budget: 0.11, ..SimOptions::default() }.validate().unwrap_err().contains("--budget")
        );
        let bcast = SimOptions { collective: Collective::Broadcast, root: 4, ..SimOptions::default() };
        assert!(bcast.validate().unwrap_err().contains("--root 4"));
        let avg = SimOptions {
            collective: Collective::Allgather,
            reduce: ReduceOp::Average,
            ..SimOptions::default()
        };
        assert!(avg.validate().unwrap_err().contains("allgather does not reduce"));
        assert!(SimOptions::default().validate().is_ok());
    }
}
