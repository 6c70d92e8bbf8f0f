//! `dlcpd demo`: N real daemons on loopback, K synthetic trainers per daemon on
//! the real shared-memory path, allreduce rounds, a progress line per iteration
//! and a summary table.
//!
//! Every daemon is a full [`Service`] (its own thread, UDP sockets on
//! 127.0.0.1, control socket in a private temp directory); every trainer is a
//! thread on the trainer end of the shared-memory channel
//! ([`crate::shm::TrainerChannel`]). With `--loss` each
//! daemon drops that share of received datagrams before the protocol sees them,
//! so the bounded-loss behaviour shows without root or a lossy network. Results
//! are checked: byte-identical on every trainer, and bit-exact against a local
//! reference when the budget is 0. `--dtype f16|bf16` runs 2-byte tensors
//! (the reference: each host's local sum in f32 rounded once to the type, the
//! hosts' sum in f32, divided for `--op average`, rounded once).
//!
//! `--collective` runs reduce-scatter, allgather, broadcast (from `--root`)
//! or barrier rounds instead, checked the same way: a reduce-scatter's
//! trainers agree on their host's shard (the one the completion names; the
//! rest of each tensor must be the trainer's own) and, at budget 0, it is the
//! reference sum's; an allgather's result is every host's shard of its local
//! sum, a broadcast's the root's local rank 0's tensor; a barrier completes.

use std::io::{self, Write};
use std::net::UdpSocket;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::datapath::fault::FaultInjector;
use crate::service::Service;
use crate::shm::{Completion, ElemType, Opcode, Reduce, Status, SubmitOptions, TrainerChannel};
use dlcp_proto::elem;
use dlcp_proto::endpoint::{Collective, DType, ReduceOp, shard_range};

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoOptions {
    /// Daemons (hosts).
    pub hosts: u32,
    /// Trainers per daemon.
    pub trainers: u32,
    /// Megabytes (10^6 bytes) of gradients per iteration, over `layers` tensors.
    pub size_mb: f64,
    /// Element type of the gradients.
    pub dtype: DType,
    /// The reduction.
    pub reduce: ReduceOp,
    /// Receive-side loss in each daemon, percent.
    pub loss_pct: f64,
    /// Loss budget, a fraction (0.01 = 1 %; 0 = reliable).
    pub budget: f64,
    /// Iterations.
    pub iters: u32,
    /// Tensors per iteration (front layer first).
    pub layers: u32,
    /// The daemons' `network.mtu` (loopback carries up to 65536).
    pub mtu: u32,
    /// The collective each op is (allreduce by default).
    pub collective: Collective,
    /// Broadcast: the daemon rank whose local rank 0 sends its tensor.
    pub root: u32,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            hosts: 4,
            trainers: 2,
            size_mb: 8.0,
            dtype: DType::F32,
            reduce: ReduceOp::Sum,
            loss_pct: 0.0,
            budget: 0.01,
            iters: 10,
            layers: 4,
            mtu: 1500,
            collective: Collective::Allreduce,
            root: 0,
        }
    }
}

impl DemoOptions {
    /// Check the options, naming the flag that is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=16).contains(&self.hosts) {
            return Err(format!("--hosts {} out of range (allowed: 1 ..= 16 on loopback)", self.hosts));
        }
        if !(1..=8).contains(&self.trainers) {
            return Err(format!("--trainers-per-host {} out of range (allowed: 1 ..= 8)", self.trainers));
        }
        if !(self.size_mb > 0.0 && self.size_mb <= 512.0) {
            return Err(format!("--size {} out of range (allowed: > 0 ..= 512 MB)", self.size_mb));
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
        if !(1280..=9000).contains(&self.mtu) {
            return Err(format!("--mtu {} out of range (allowed: 1280 ..= 9000)", self.mtu));
        }
        if !(1..=64).contains(&self.layers) || self.iters == 0 {
            return Err("--layers must be 1 ..= 64 and --iters at least 1".into());
        }
        if self.collective == Collective::Broadcast && self.root >= self.hosts {
            return Err(format!(
                "--root {} is not a daemon rank of {} hosts (0 ..= {})",
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

    fn elems(&self) -> usize {
        ((self.size_mb * 1e6 / self.dtype.size() as f64 / f64::from(self.layers)) as usize).max(1)
    }
}

/// The shared-memory element type and reduction of the wire's.
fn shm_kind(dtype: DType, reduce: ReduceOp) -> (ElemType, Reduce) {
    let t = match dtype {
        DType::F32 => ElemType::F32,
        DType::F16 => ElemType::F16,
        DType::Bf16 => ElemType::Bf16,
    };
    (t, if reduce == ReduceOp::Average { Reduce::Average } else { Reduce::Sum })
}

/// The submission opcode of a collective.
fn opcode(c: Collective) -> Opcode {
    match c {
        Collective::Allreduce => Opcode::AllReduce,
        Collective::ReduceScatter => Opcode::ReduceScatter,
        Collective::Allgather => Opcode::Allgather,
        Collective::Broadcast => Opcode::Broadcast,
        Collective::Barrier => Opcode::Barrier,
    }
}

/// The collective as the banner names it.
fn collective_name(o: &DemoOptions) -> String {
    match o.collective {
        Collective::Broadcast => format!("broadcast from daemon {}", o.root),
        c => c.name().to_owned(),
    }
}

/// What the run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoSummary {
    /// All results identical on every trainer (and bit-exact when budget 0).
    pub verified: bool,
    /// Ops completed (counted once per op, not per trainer).
    pub ops: u64,
    /// Ops that failed on some trainer.
    pub failed: u64,
    /// Median op time as trainers saw it.
    pub op_p50: Duration,
    /// 99th percentile op time.
    pub op_p99: Duration,
    /// Median iteration goodput, Gbit/s of gradients reduced per host.
    pub goodput_gbps: f64,
    /// Per class: (datagrams sent by all daemons, fraction received).
    pub per_class: Vec<(u8, u64, f64)>,
    /// Repair datagrams sent.
    pub repairs: u64,
    /// Least delivered fraction any trainer was told.
    pub min_delivered: f64,
    /// Wall time.
    pub wall: Duration,
}

fn seed(host: u32, k: u32, it: u32, l: u32) -> u64 {
    (u64::from(host) << 48) ^ (u64::from(k) << 40) ^ (u64::from(it) << 16) ^ u64::from(l) ^ 0x5DEECE66D
}

fn synth(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn fnv(bits: impl Iterator<Item = u32>) -> u64 {
    bits.fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

struct Done {
    host: u32,
    it: u32,
    layer: u32,
    status: Status,
    duration: Duration,
    delivered_ppm: u32,
    /// Of the result (a reduce-scatter's: of the host's shard; a barrier's: 0).
    hash: u64,
    /// The completion named the host's shard (reduce-scatter, allgather), and
    /// a reduce-scatter left the rest of the tensor as the trainer wrote it.
    intact: bool,
}

/// Removes the demo's directory when dropped.
struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn config_text(rank: u32, ports: &[u16], socket: &std::path::Path, arena: u64, o: &DemoOptions) -> String {
    let mut t = format!(
        "[node]\nrank = {rank}\njob_id = 1\njob_secret = \"dlcpd demo job secret, loopback only\"\n\n"
    );
    for (r, p) in ports.iter().enumerate() {
        t += &format!("[[peers]]\nrank = {r}\naddress = \"127.0.0.1\"\nport = {p}\n\n");
    }
    t += &format!(
        "[network]\nheartbeat_interval_ms = 200\nmtu = {mtu}\n\n[pacing]\nrate_mbps = 0\n\n[loss]\nhard_timeout_ms = 10000\nbudget = {budget}\n\n\
         [control]\nsocket_path = \"{}\"\nsocket_mode = \"0600\"\n\n\
         [shm]\narena_bytes = {arena}\nmax_tensor_bytes = {arena}\nearly_buffer_bytes = {arena}\n\n[log]\nlevel = \"warn\"\n\n[metrics]\nenabled = false\n",
        socket.display(),
        budget = o.budget,
        mtu = o.mtu
    );
    t
}

/// The first ports of `n` non-overlapping blocks of `block` consecutive free
/// UDP ports on `ip` — one block per daemon, which binds `network.paths`
/// ports from its configured one. Every port is held until all blocks are
/// found, then released (another process could take one in that short window;
/// the daemon then fails to bind and says which port).
pub fn free_port_blocks(n: usize, block: u16, ip: std::net::IpAddr) -> io::Result<Vec<u16>> {
    let block = block.max(1);
    let mut held: Vec<UdpSocket> = Vec::new();
    let mut bases = Vec::new();
    for _ in 0..10_000 {
        if bases.len() == n {
            return Ok(bases);
        }
        let first = UdpSocket::bind((ip, 0))?;
        let base = first.local_addr()?.port();
        if u32::from(base) + u32::from(block) > 65536 {
            continue;
        }
        let rest: Option<Vec<UdpSocket>> = (1..block).map(|k| UdpSocket::bind((ip, base + k)).ok()).collect();
        if let Some(rest) = rest {
            held.push(first);
            held.extend(rest);
            bases.push(base);
        }
    }
    Err(io::Error::new(io::ErrorKind::AddrInUse, format!("no {n} blocks of {block} free UDP ports on {ip}")))
}

/// A daemon thread: the `stats` it ended with.
type DaemonThread = std::thread::JoinHandle<Result<serde_json::Value, String>>;
/// A trainer thread.
type TrainerThread = std::thread::JoinHandle<Result<(), String>>;

/// Run the demo, writing progress and the summary to `out`.
pub fn run(o: &DemoOptions, out: &mut impl Write) -> io::Result<DemoSummary> {
    let wall = Instant::now();
    let n = o.elems();
    let dir = Dir(std::env::temp_dir().join(format!("dlcpd-demo-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0)?;
    // Each daemon binds `network.paths` consecutive ports from its own: the
    // blocks must not overlap (configuration refuses a peer's port inside
    // another's block).
    let ports =
        free_port_blocks(o.hosts as usize, dlcp_config::schema::DEFAULT_PATHS, "127.0.0.1".parse().unwrap())?;
    let tensor_bytes = (n * o.dtype.size()) as u64;
    let arena = ((tensor_bytes * u64::from(o.layers) * 5 / 4).div_ceil(1 << 20) << 20).max(16 << 20);
    writeln!(
        out,
        "dlcpd demo: {} daemons on 127.0.0.1, {} trainers each on shared memory, {} tensors × {:.2} MB {} ({}) \
         per iteration, {}, receive loss {}%, budget {}",
        o.hosts,
        o.trainers,
        o.layers,
        tensor_bytes as f64 / 1e6,
        o.dtype.name(),
        o.reduce.name(),
        collective_name(o),
        o.loss_pct,
        dlcp_config::percent(o.budget)
    )?;
    let stop = Arc::new(AtomicBool::new(false));
    let (services, sockets) = start_daemons(o, &dir.0, &ports, arena, &stop)?;
    let budget_ppm = dlcp_config::schema::fraction_to_ppm(o.budget);
    let (tx, rx) = mpsc::channel::<Done>();
    let trainers = start_trainers(o, &sockets, n, budget_ppm, &tx);
    drop(tx);
    let mut tally = Tally::new(o, n, budget_ppm);
    for d in rx.iter() {
        tally.add(d, out)?;
    }
    let mut errors = Vec::new();
    for t in trainers {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("trainer thread panicked".into()),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut stats = Vec::new();
    for s in services {
        match s.join() {
            Ok(Ok(v)) => stats.push(v),
            Ok(Err(e)) => errors.push(format!("daemon: {e}")),
            Err(_) => errors.push("daemon thread panicked".into()),
        }
    }
    for e in &errors {
        writeln!(out, "  error: {e}")?;
    }
    tally.verified &= errors.is_empty() && tally.next_it == o.iters;
    let summary = tally.summary(&stats, wall.elapsed());
    print_summary(o, &summary, budget_ppm, out)?;
    Ok(summary)
}

/// Start one daemon per host (a [`Service`] on its own thread, receive loss as
/// `o` says) and wait until each admin socket exists. Returns the threads and
/// the control sockets.
fn start_daemons(
    o: &DemoOptions,
    dir: &std::path::Path,
    ports: &[u16],
    arena: u64,
    stop: &Arc<AtomicBool>,
) -> io::Result<(Vec<DaemonThread>, Vec<PathBuf>)> {
    let mut services = Vec::new();
    let mut sockets = Vec::new();
    for r in 0..o.hosts {
        let socket = dir.join(format!("d{r}.sock"));
        let text = config_text(r, ports, &socket, arena, o);
        let cfg = dlcp_config::Config::from_str_named(&text, &format!("demo-rank{r}.toml"))
            .map_err(|e| io::Error::other(e.to_string()))?;
        let stop = stop.clone();
        let loss_ppm = (o.loss_pct * 1e4).round() as u32;
        services.push(std::thread::spawn(move || -> Result<serde_json::Value, String> {
            let dp = FaultInjector::new(crate::datapath::open(&cfg).map_err(|e| e.to_string())?)
                .with_receive_loss(loss_ppm, 0xD3_0000 + u64::from(r), u64::from(cfg.rank()));
            let mut svc = Service::new(cfg, dp).map_err(|e| e.to_string())?;
            let mut last = serde_json::Value::Null;
            svc.run(|s| {
                let done = stop.load(Ordering::Relaxed);
                if done {
                    last = s.stats_json();
                }
                done
            })
            .map_err(|e| e.to_string())?;
            Ok(last)
        }));
        sockets.push(socket);
    }
    for s in &sockets {
        let t0 = Instant::now();
        while !crate::service::admin_path(s).exists() {
            if t0.elapsed() > Duration::from_secs(10) {
                stop.store(true, Ordering::Relaxed);
                return Err(io::Error::other(format!("daemon did not start: {}", s.display())));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok((services, sockets))
}

/// Start `o.trainers` trainer threads per daemon, each reporting every
/// completion on `tx`.
fn start_trainers(
    o: &DemoOptions,
    sockets: &[PathBuf],
    n: usize,
    budget_ppm: u32,
    tx: &mpsc::Sender<Done>,
) -> Vec<TrainerThread> {
    let mut trainers = Vec::new();
    for h in 0..o.hosts {
        for k in 0..o.trainers {
            let (socket, tx, o) = (sockets[h as usize].clone(), tx.clone(), o.clone());
            trainers.push(std::thread::spawn(move || trainer(&o, &socket, h, k, n, budget_ppm, &tx)));
        }
    }
    trainers
}

/// Trainer `k` of host `h`: every iteration, write and submit each layer's
/// synthetic gradients, then report each completion with a hash of its result.
fn trainer(
    o: &DemoOptions,
    socket: &std::path::Path,
    h: u32,
    k: u32,
    n: usize,
    budget_ppm: u32,
    tx: &mpsc::Sender<Done>,
) -> Result<(), String> {
    let mut cl = TrainerChannel::attach(socket, 1, k, o.trainers).map_err(|e| e.to_string())?;
    let (elem_type, reduce) = shm_kind(o.dtype, o.reduce);
    let tensors: Vec<_> = (0..o.layers)
        .map(|l| cl.alloc_typed(&format!("layer{l}"), n as u64, elem_type).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let mut bytes = vec![0u8; n * o.dtype.size()];
    let root = if o.collective == Collective::Broadcast { o.root } else { 0 };
    for it in 0..o.iters {
        for (l, t) in tensors.iter().enumerate() {
            elem::encode(o.dtype, &synth(seed(h, k, it, l as u32), n), &mut bytes);
            cl.write_bytes(t, &bytes).map_err(|e| e.to_string())?;
            let opts = SubmitOptions {
                reduce,
                tensor_id: l as u32,
                layer: l as u32,
                layers: o.layers,
                budget_ppm,
                cookie: u64::from(l as u32),
                opcode: opcode(o.collective),
                root,
                ..Default::default()
            };
            match o.collective {
                Collective::Barrier => cl.submit_barrier(opts),
                _ => cl.submit(t, opts),
            }
            .map_err(|e| e.to_string())?;
        }
        for _ in 0..o.layers {
            let c = cl.wait_completion(Duration::from_secs(60)).map_err(|e| e.to_string())?;
            let l = c.cookie as u32;
            let raw = cl.read_bytes(&tensors[l as usize]).map_err(|e| e.to_string())?;
            let mut res = vec![0f32; n];
            elem::decode(o.dtype, &raw, &mut res);
            let (hash, intact) = check_result(o, &c, &res, (h, k, it, l));
            let _ = tx.send(Done {
                host: h,
                it,
                layer: l,
                status: c.status,
                duration: c.duration,
                delivered_ppm: c.delivered_ppm,
                hash,
                intact,
            });
        }
    }
    Ok(())
}

/// A trainer's look at its result `res` of completion `c` for trainer `k`
/// of host `h`, iteration `it`, layer `l`: the hash of what every trainer
/// (of the host, for a reduce-scatter) must agree on, and whether the
/// completion named the host's shard and a reduce-scatter left the rest of
/// the tensor as the trainer wrote it.
fn check_result(
    o: &DemoOptions,
    c: &Completion,
    res: &[f32],
    (h, k, it, l): (u32, u32, u32, u32),
) -> (u64, bool) {
    let shard = shard_range(res.len(), o.hosts, h);
    let told = c.shard_offset as usize..(c.shard_offset + c.shard_len) as usize;
    match o.collective {
        Collective::Barrier => (0, true),
        Collective::ReduceScatter => {
            let mut mine = synth(seed(h, k, it, l), res.len());
            elem::round_all(o.dtype, &mut mine);
            let kept = |r: std::ops::Range<usize>| {
                res[r.clone()].iter().zip(&mine[r]).all(|(a, b)| a.to_bits() == b.to_bits())
            };
            let intact = told == shard && kept(0..shard.start) && kept(shard.end..res.len());
            let part = res.get(shard).unwrap_or_default();
            (fnv(part.iter().map(|x| x.to_bits())), intact)
        }
        Collective::Allgather => (fnv(res.iter().map(|x| x.to_bits())), told == shard),
        Collective::Allreduce | Collective::Broadcast => {
            (fnv(res.iter().map(|x| x.to_bits())), told.is_empty())
        }
    }
}

/// The hash of op (`it`, layer `l`)'s exact result as host `h`'s trainers
/// must hash it (see [`check_result`]): for allreduce and reduce-scatter the
/// local sums in local-rank order (of the trainers' values of the type, in
/// f32), each rounded once to the type, then hosts in rank order, divided
/// for an average, rounded once (a reduce-scatter's: host `h`'s shard of
/// it); for an allgather each host's shard of its rounded local sum; for a
/// broadcast the root's local rank 0's values.
fn reference_hash(o: &DemoOptions, it: u32, l: u32, n: usize, h: u32) -> u64 {
    let typed = |h, k| {
        let mut v = synth(seed(h, k, it, l), n);
        elem::round_all(o.dtype, &mut v);
        v
    };
    let local_sum = |h| {
        let mut local = typed(h, 0);
        for k in 1..o.trainers {
            local.iter_mut().zip(typed(h, k)).for_each(|(a, b)| *a += b);
        }
        elem::round_all(o.dtype, &mut local);
        local
    };
    let result = match o.collective {
        Collective::Barrier => return 0,
        Collective::Broadcast => typed(o.root, 0),
        Collective::Allgather => {
            let mut out = vec![0f32; n];
            for s in 0..o.hosts {
                let sh = shard_range(n, o.hosts, s);
                out[sh.clone()].copy_from_slice(&local_sum(s)[sh]);
            }
            out
        }
        Collective::Allreduce | Collective::ReduceScatter => {
            let mut global = local_sum(0);
            for s in 1..o.hosts {
                global.iter_mut().zip(&local_sum(s)).for_each(|(a, b)| *a += *b);
            }
            if o.reduce == ReduceOp::Average {
                let w = (o.hosts * o.trainers) as f32;
                global.iter_mut().for_each(|x| *x /= w);
            }
            elem::round_all(o.dtype, &mut global);
            global
        }
    };
    let part = if o.collective == Collective::ReduceScatter { shard_range(n, o.hosts, h) } else { 0..n };
    fnv(result[part].iter().map(|x| x.to_bits()))
}

/// The completions seen so far, checked and timed an iteration at a time.
struct Tally<'a> {
    o: &'a DemoOptions,
    n: usize,
    budget_ppm: u32,
    per_iter: usize,
    it_done: Vec<Vec<Done>>,
    it_start: Instant,
    durations: Vec<Duration>,
    gbps: Vec<f64>,
    verified: bool,
    ops: u64,
    failed: u64,
    min_delivered: f64,
    /// The next iteration to complete.
    next_it: u32,
}

impl<'a> Tally<'a> {
    fn new(o: &'a DemoOptions, n: usize, budget_ppm: u32) -> Tally<'a> {
        Tally {
            o,
            n,
            budget_ppm,
            per_iter: (o.hosts * o.trainers * o.layers) as usize,
            it_done: (0..o.iters).map(|_| Vec::new()).collect(),
            it_start: Instant::now(),
            durations: Vec::new(),
            gbps: Vec::new(),
            verified: true,
            ops: 0,
            failed: 0,
            min_delivered: 1.0,
            next_it: 0,
        }
    }

    /// Take one completion; when that completes iterations, check them and
    /// print a progress line for each.
    fn add(&mut self, d: Done, out: &mut impl Write) -> io::Result<()> {
        let it = d.it as usize;
        self.it_done[it].push(d);
        while (self.next_it as usize) < self.it_done.len()
            && self.it_done[self.next_it as usize].len() == self.per_iter
        {
            let secs = self.it_start.elapsed().as_secs_f64();
            self.it_start = Instant::now();
            let ok = self.check_iteration();
            self.verified &= ok;
            let bytes = self.n as u64 * self.o.dtype.size() as u64;
            let g = (bytes * u64::from(self.o.layers) * 8) as f64 / secs / 1e9;
            self.gbps.push(g);
            let done = &self.it_done[self.next_it as usize];
            writeln!(
                out,
                "iter {:>4}/{}: {:>9.2} ms  {:>6.2} Gbit/s per host  min delivered {:>7.3}%  {}",
                self.next_it + 1,
                self.o.iters,
                secs * 1e3,
                g,
                done.iter().map(|d| d.delivered_ppm).min().unwrap_or(0) as f64 / 1e4,
                if ok { "ok" } else { "MISMATCH" }
            )?;
            out.flush()?;
            self.next_it += 1;
        }
        Ok(())
    }

    /// Check the ops of iteration `next_it`, all in: every trainer got the
    /// same bytes (and, with budget 0, the exact sum). Counts ops, failures,
    /// op times and the least delivered fraction.
    fn check_iteration(&mut self) -> bool {
        let it = self.next_it;
        let done = &self.it_done[it as usize];
        let mut ok = true;
        for l in 0..self.o.layers {
            let mine: Vec<&Done> = done.iter().filter(|d| d.layer == l).collect();
            self.ops += 1;
            if mine.iter().any(|d| d.status != Status::Ok) {
                self.failed += 1;
                ok = false;
                continue;
            }
            ok &= mine.iter().all(|d| d.intact);
            // A reduce-scatter's trainers agree within their host (on its shard).
            let per_host = self.o.collective == Collective::ReduceScatter;
            let peer = |d: &Done| mine.iter().find(|e| !per_host || e.host == d.host).map(|e| e.hash);
            ok &= mine.iter().all(|d| peer(d) == Some(d.hash));
            if self.budget_ppm == 0 {
                let hosts = if per_host { self.o.hosts } else { 1 };
                for h in 0..hosts {
                    let want = reference_hash(self.o, it, l, self.n, h);
                    ok &= mine.iter().filter(|d| !per_host || d.host == h).all(|d| d.hash == want);
                }
            }
            for d in &mine {
                self.durations.push(d.duration);
                self.min_delivered = self.min_delivered.min(f64::from(d.delivered_ppm) / 1e6);
                let _ = d.host;
            }
        }
        ok
    }

    /// The summary, with the per-class counts and repairs from the daemons'
    /// final `stats`.
    fn summary(mut self, stats: &[serde_json::Value], wall: Duration) -> DemoSummary {
        self.durations.sort();
        self.gbps.sort_by(f64::total_cmp);
        let durations = &self.durations;
        let pct = |p: f64| durations.get(((durations.len().max(1) - 1) as f64 * p).round() as usize).copied();
        let sum_class = |key: &str, c: usize| -> u64 {
            stats.iter().map(|s| s["protocol"][key][c].as_u64().unwrap_or(0)).sum()
        };
        let per_class: Vec<(u8, u64, f64)> = (0..8)
            .filter_map(|c| {
                let tx = sum_class("tx_packets_per_class", c);
                (tx > 0).then(|| (c as u8, tx, sum_class("rx_packets_per_class", c) as f64 / tx as f64))
            })
            .collect();
        let repairs: u64 = stats.iter().map(|s| s["protocol"]["repairs_sent"].as_u64().unwrap_or(0)).sum();
        DemoSummary {
            verified: self.verified,
            ops: self.ops,
            failed: self.failed,
            op_p50: pct(0.5).unwrap_or_default(),
            op_p99: pct(0.99).unwrap_or_default(),
            goodput_gbps: self.gbps.get(self.gbps.len() / 2).copied().unwrap_or(0.0),
            per_class,
            repairs,
            min_delivered: self.min_delivered,
            wall,
        }
    }
}

/// The summary table.
fn print_summary(
    o: &DemoOptions,
    summary: &DemoSummary,
    budget_ppm: u32,
    out: &mut impl Write,
) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "summary ({} daemons × {} trainers, {} iterations × {} tensors)",
        o.hosts, o.trainers, o.iters, o.layers
    )?;
    writeln!(out, "  ops completed / failed      {} / {}", summary.ops - summary.failed, summary.failed)?;
    writeln!(
        out,
        "  op time p50 / p99           {:.2} ms / {:.2} ms (as trainers saw it)",
        summary.op_p50.as_secs_f64() * 1e3,
        summary.op_p99.as_secs_f64() * 1e3
    )?;
    writeln!(out, "  goodput (median iteration)  {:.2} Gbit/s of gradients per host", summary.goodput_gbps)?;
    writeln!(
        out,
        "  min delivered               {:.3}% (budget {})",
        summary.min_delivered * 100.0,
        dlcp_config::percent(o.budget)
    )?;
    writeln!(out, "  repairs sent                {}", summary.repairs)?;
    writeln!(out, "  class  datagrams   received (after {}% receive loss)", o.loss_pct)?;
    for (c, tx, f) in &summary.per_class {
        let what = if *c == 7 { " (control)" } else { "" };
        writeln!(out, "  {c:>5}  {tx:>9}   {:>8.3}%{what}", f * 100.0)?;
    }
    writeln!(
        out,
        "  verification                {}",
        if summary.verified {
            match (budget_ppm, o.collective) {
                (_, Collective::Barrier) => "every barrier completed on every trainer",
                (0, Collective::ReduceScatter) => {
                    "every host's trainers byte-identical on its shard and bit-exact against the reference sum"
                }
                (_, Collective::ReduceScatter) => "every host's trainers byte-identical on its shard",
                (0, Collective::Allreduce) => {
                    "every trainer byte-identical and bit-exact against the reference sum"
                }
                (0, _) => "every trainer byte-identical and bit-exact against the reference",
                _ => "every trainer byte-identical",
            }
        } else {
            "FAILED"
        }
    )?;
    writeln!(out, "  wall time                   {:.2} s", summary.wall.as_secs_f64())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_blocks_do_not_overlap_and_the_configuration_takes_them() {
        let block = dlcp_config::schema::DEFAULT_PATHS;
        for _ in 0..20 {
            let ports = free_port_blocks(4, block, "127.0.0.1".parse().unwrap()).unwrap();
            assert_eq!(ports.len(), 4);
            for (i, a) in ports.iter().enumerate() {
                for b in &ports[i + 1..] {
                    assert!(a.abs_diff(*b) >= block, "{ports:?}");
                }
            }
            let o = DemoOptions { hosts: 4, ..DemoOptions::default() };
            let text = config_text(0, &ports, std::path::Path::new("/tmp/x.sock"), 16 << 20, &o);
            dlcp_config::Config::from_str_named(&text, "demo.toml").unwrap();
        }
    }

    #[test]
    fn options_are_checked() {
        assert!(
            DemoOptions { hosts: 0, ..DemoOptions::default() }.validate().unwrap_err().contains("--hosts")
        );
        assert!(DemoOptions::default().validate().is_ok());
        let bcast = DemoOptions { collective: Collective::Broadcast, root: 4, ..DemoOptions::default() };
        assert!(bcast.validate().unwrap_err().contains("--root 4"));
        assert!(DemoOptions { root: 3, ..bcast }.validate().is_ok());
        let avg = DemoOptions {
            collective: Collective::Allgather,
            reduce: ReduceOp::Average,
            ..DemoOptions::default()
        };
        assert!(avg.validate().unwrap_err().contains("--op average: allgather does not reduce"));
    }
}
