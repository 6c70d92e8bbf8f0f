//! The daemon's event loop: trainers on shared memory, the protocol core, the
//! datapath, signals — one thread, driven by mio.
//!
//! ```text
//!  trainer ─doorbell─▶ Attachment::next_submission ─copy out─▶ LocalOp (K trainers)
//!                                                   all K in ─▶ sum in local-rank order
//!                                                              ─▶ Endpoint::start_allreduce
//!  Datapath::recv ─▶ (source check) ─▶ Endpoint::handle_datagram
//!  Endpoint::poll_transmit ─▶ Datapath::send (class → DSCP) ─▶ flush
//!  Endpoint::poll_event: OpComplete ─▶ copy result into every trainer's buffer ─▶ completion
//!                        OpFailed   ─▶ completion with Timeout / PeerDown
//! ```
//!
//! Nothing here blocks except `Poll::poll`, whose timeout is the protocol's next
//! timer (capped for housekeeping). A trainer whose control socket closes is
//! gone: its attachment is dropped (segment reclaimed) and local ops waiting for
//! it fail for the other trainers. SIGTERM/SIGINT stop accepting new ops, drain
//! those in flight (bounded by the hard timeout) and return.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use dlcp_config::Config;
use dlcp_config::schema::Fill as CfgFill;
use dlcp_proto::endpoint::{
    Endpoint, EndpointConfig, Event, Fill, OpError, OpId, OpOptions, ReduceOp, StartError, Timers,
};
use dlcp_proto::priority::Class;
use dlcp_proto::time::{Duration, Instant};
use dlcp_proto::wire;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use serde::Serialize;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;

use crate::datapath::fault::{Fate, FaultInjector};
use crate::datapath::{Datapath, DatapathStats, SendOutcome};
use crate::shm::{Attachment, Liveness, ServerConfig, ShmServer, Status, Submission};

/// Operations: reload, systemd notification, metrics, `status` extras.
mod ops;

const LISTENER: Token = Token(0);
const SIGNALS: Token = Token(1);
const ADMIN: Token = Token(2);
const TIMER: Token = Token(3);
const DATAPATH_BASE: usize = 16;
const ATTACH_BASE: usize = 1 << 16;
/// Longest sleep between housekeeping passes.
const HOUSEKEEPING: StdDuration = StdDuration::from_millis(100);
/// Datagrams taken from the endpoint per `poll_transmit_many` (their tags are
/// computed together).
const TX_BATCH: usize = 64;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The control socket could not be bound.
    #[error("control socket {path}: {source}")]
    Control {
        /// The path.
        path: String,
        /// The cause.
        source: crate::shm::BindError,
    },
    /// An I/O error setting up the event loop.
    #[error("event loop: {0}")]
    Io(#[from] io::Error),
    /// A configuration value the service cannot use.
    #[error("configuration: {0}")]
    Config(String),
}

/// A received datagram's bytes in the receive batch and its source peer (`None`: not a configured peer).
type RxSpan = (std::ops::Range<usize>, Option<u32>);

/// Counters of the service itself (the protocol's and datapath's are separate).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServiceCounters {
    /// Trainers attached since start.
    pub trainers_attached: u64,
    /// Trainers whose control socket closed.
    pub trainers_gone: u64,
    /// Trainers refused (other job, handshake failure, policy).
    pub trainers_refused: u64,
    /// Valid submissions received.
    pub submissions: u64,
    /// Submissions rejected by descriptor validation.
    pub submissions_rejected: u64,
    /// Local ops whose trainers disagreed (length, layer, tensor).
    pub local_mismatch: u64,
    /// Ops started on the network.
    pub ops_started: u64,
    /// Ops completed.
    pub ops_completed: u64,
    /// Ops failed (timeout, peer restart, local trainer gone).
    pub ops_failed: u64,
    /// Completions that could not be posted (trainer's completion ring full).
    pub completions_dropped: u64,
    /// Datagrams whose source address does not match the rank they claim.
    pub rx_wrong_source: u64,
    /// Datagrams from addresses that are no peer.
    pub rx_unknown_source: u64,
    /// Datagrams dropped on purpose by the datapath's fault injector (receive
    /// loss of `dlcpd demo --loss` and the `--debug-rx-loss` test knob).
    pub rx_debug_dropped: u64,
    /// Datapath flushes forced so that a PROBE does not overtake the data
    /// queued before it.
    pub probe_flushes: u64,
    /// Configuration reloads that loaded (see `crate::reload`).
    pub reloads_ok: u64,
    /// Configuration reloads rejected (the file did not load; old config kept).
    pub reloads_failed: u64,
}

/// One completed op, for `stats`.
#[derive(Debug, Clone, Serialize)]
pub struct OpRecord {
    /// Op sequence.
    pub op: u64,
    /// Tensor id.
    pub tensor: u32,
    /// Elements.
    pub len: usize,
    /// Duration in microseconds.
    pub duration_us: u64,
    /// Least delivered fraction over this rank's transfers.
    pub min_delivered: f64,
    /// Repairs this rank sent.
    pub repairs_sent: u32,
    /// Whether a deadline fired.
    pub deadline_fired: bool,
    /// Error, if the op failed.
    pub error: Option<String>,
}

#[derive(Debug)]
struct Contribution {
    attachment: u64,
    sub: Submission,
}

#[derive(Debug)]
struct LocalOp {
    contributions: Vec<Option<Contribution>>,
    /// Contributions by local rank until all are in.
    parts: Vec<Option<Vec<f32>>>,
    sum: Option<Vec<f32>>,
    started_at: Option<StdInstant>,
    first_at: StdInstant,
    /// The budget the op started with (the trainer's, capped by `loss.budget`).
    budget_ppm: u32,
}

struct Slot {
    att: Attachment,
}

/// The running daemon.
pub struct Service {
    cfg: Config,
    endpoint: Endpoint,
    datapath: FaultInjector,
    shm: ShmServer,
    poll: Poll,
    signals: Signals,
    slots: Vec<Option<Slot>>,
    local_world: Option<u32>,
    local_ops: BTreeMap<OpId, LocalOp>,
    peers: Vec<SocketAddr>,
    peer_rank: HashMap<SocketAddr, u32>,
    start: StdInstant,
    /// Datagrams the datapath refused (would-block), sent first next time.
    pending_tx: std::collections::VecDeque<(SocketAddr, Class, Vec<u8>)>,
    /// Room per datagram in `tx_buf`.
    tx_slot: usize,
    /// The datagrams of one `poll_transmit_many` call: (transmit, offset in `tx_buf`).
    tx_batch: Vec<(dlcp_proto::sim::Transmit, usize)>,
    /// Received datagrams of one datapath receive call, back to back, and
    /// their spans with the configured peer each came from (see `receive`).
    rx_batch: (Vec<u8>, Vec<RxSpan>),
    tx_buf: Vec<u8>,
    draining: Option<StdInstant>,
    counters: ServiceCounters,
    recent: std::collections::VecDeque<OpRecord>,
    datapath_tokens: usize,
    admin: mio::net::UnixListener,
    admin_path: std::path::PathBuf,
    reports: BTreeMap<OpId, Box<dlcp_proto::endpoint::OpReport>>,
    adapt: Option<RateAdapter>,
    /// A timerfd for sub-millisecond wakeups (epoll's own timeout has
    /// millisecond resolution, too coarse for pacing and probe timers).
    timer: std::os::fd::OwnedFd,
    /// Operations: config file, systemd notification, metrics, reloads.
    ops: ops::OpsState,
}

/// Loss-driven pacing (AIMD): every window, the share of this daemon's data
/// datagrams that receivers asked to have repaired is the loss signal. Above
/// 0.5% the rate is cut to 70%; otherwise it grows by 2% of the maximum, up to
/// `pacing.rate_mbps`. A flood therefore cannot persist, and a clean path runs
/// at the configured rate.
#[derive(Debug, Clone)]
struct RateAdapter {
    max: u64,
    min: u64,
    window: StdDuration,
    last: StdInstant,
    last_tx: u64,
    last_repairs: u64,
    cuts: u64,
}

impl RateAdapter {
    fn step(&mut self, endpoint: &mut Endpoint, now: Instant) {
        if self.last.elapsed() < self.window {
            return;
        }
        self.last = StdInstant::now();
        let s = endpoint.stats();
        let tx: u64 = s.tx_packets[..7].iter().sum();
        let (dtx, drep) = (tx - self.last_tx, s.repairs_sent - self.last_repairs);
        self.last_tx = tx;
        self.last_repairs = s.repairs_sent;
        if dtx == 0 {
            return;
        }
        let rate = endpoint.pacing_rate().max(self.min);
        let new = if drep * 200 > dtx {
            self.cuts += 1;
            (rate * 7 / 10).max(self.min)
        } else {
            (rate + self.max / 50).min(self.max)
        };
        if new != rate {
            endpoint.set_pacing_rate(now, new);
        }
    }
}

/// True if `datagram` is a dlcp PROBE (read from the header's type byte; the
/// datagram came from our own endpoint, so no authentication is needed).
fn is_probe(datagram: &[u8]) -> bool {
    dlcp_proto::wire::Packet::new_checked(datagram)
        .is_ok_and(|p| p.raw_type() == dlcp_proto::wire::PacketType::Probe as u8)
}

/// Path of the admin socket that `dlcpctl` talks to: the control socket's path
/// with `.admin` appended. Protocol: connect, send one line (`stats` or
/// `status`), read one JSON document until EOF.
pub fn admin_path(control: &std::path::Path) -> std::path::PathBuf {
    let mut p = control.as_os_str().to_owned();
    p.push(".admin");
    p.into()
}

/// The inverse of `Service::report_json` (what `dlcpctl report --json` prints):
/// rebuild the parts of an owner's [`OpReport`](dlcp_proto::endpoint::OpReport)
/// that [`dlcp_proto::oracle::recompute`] needs — per sender the delivered
/// chunks of the owner's shard, and the owner's own mask. Timing fields are zero.
/// Panics on JSON that `report_json` did not produce (it is for tests and tools).
pub fn report_from_json(v: &serde_json::Value) -> dlcp_proto::endpoint::OpReport {
    use dlcp_proto::bitmap::Bitmap;
    use dlcp_proto::endpoint::{OpId, OpReport, TransferReport};
    use dlcp_proto::time::Instant;
    use dlcp_proto::wire::Phase;
    let bits = |n: u32, list: &serde_json::Value, set: bool| {
        let mut b = if set { Bitmap::new(n) } else { Bitmap::full(n) };
        for x in list.as_array().unwrap() {
            let i = x.as_u64().unwrap() as u32;
            if set {
                b.set(i);
            } else {
                b.clear(i);
            }
        }
        b
    };
    let own_chunks = v["own_chunks"].as_u64().unwrap() as u32;
    OpReport {
        id: OpId { seq: v["op"].as_u64().unwrap(), tensor: v["tensor"].as_u64().unwrap() as u32 },
        started: Instant::ZERO,
        finished: Instant::ZERO,
        scatter: v["scatter"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let n = t["chunks"].as_u64().unwrap() as u32;
                TransferReport {
                    peer: t["peer"].as_u64().unwrap() as u32,
                    phase: Phase::Scatter,
                    chunks: n,
                    delivered: bits(n, &t["missing"], false),
                    mask: None,
                    repaired: 0,
                    deadline_fired: false,
                    first_at: None,
                    closed_at: Instant::ZERO,
                }
            })
            .collect(),
        gather: Vec::new(),
        own_mask: bits(own_chunks, &v["own_mask"], true),
        own_chunks,
        repairs_sent: 0,
        deadline_fired: false,
    }
}

/// Derive a generation from the wall clock: tenths of a second since
/// 2026-01-01, plus one, so a daemon restarted a moment later announces a larger
/// generation (good for 13 years).
pub fn auto_generation() -> u32 {
    let since_epoch =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
    let base_2026_ms: u128 = 1_767_225_600_000;
    ((since_epoch.saturating_sub(base_2026_ms) / 100) as u32).saturating_add(1)
}

/// The protocol endpoint's configuration from the daemon's.
pub fn endpoint_config(cfg: &Config, generation: u32) -> EndpointConfig {
    let mut e = EndpointConfig::new(cfg.rank(), cfg.world_size(), cfg.node.job_id, generation, cfg.mac_key());
    e.chunk_bytes = cfg.chunk_bytes() as usize;
    e.classifier = cfg.classifier();
    e.timers = timers(cfg);
    e.pacing_rate = cfg.pacing.rate_bytes_per_sec().unwrap_or(0);
    // At least 100 µs of traffic per bucket, so the loop is not woken for every
    // datagram at high rates.
    e.pacing_burst = u64::from(cfg.pacing.burst_bytes).max(e.pacing_rate / 10_000);
    e.early_buffer_bytes = usize::try_from(cfg.shm.early_buffer_bytes).unwrap_or(usize::MAX);
    e
}

fn std_to_proto(d: StdDuration) -> Duration {
    d
}

/// Timer settings from the `[loss]` and `[network]` sections.
pub fn timers(cfg: &Config) -> Timers {
    let l = &cfg.loss;
    let t = Timers::default();
    Timers {
        hard_timeout: std_to_proto(l.hard_timeout()),
        deadline_min: l.deadline_min(),
        deadline_max: l.deadline_max(),
        initial_per_chunk: l.initial_per_chunk(),
        probe_initial: l.probe_timeout_min().max(t.probe_min),
        probe_min: l.probe_timeout_min(),
        probe_max: l.probe_timeout_max(),
        heartbeat: cfg.network.heartbeat_interval(),
        peer_timeout: cfg.network.peer_timeout(),
        linger: l.hard_timeout(),
        close_grace: t.close_grace,
    }
}

impl Service {
    /// Set up the service: control socket, endpoint, event loop. The datapath is
    /// built by the caller (socket or DPDK, see `crate::datapath`), wrapped in
    /// a [`FaultInjector`] if it should inject faults (a plain
    /// `Box<dyn Datapath>` converts to one without faults).
    pub fn new(cfg: Config, datapath: impl Into<FaultInjector>) -> Result<Service, ServiceError> {
        let mut datapath = datapath.into();
        let generation = match cfg.node.generation {
            dlcp_config::schema::Generation::Fixed(g) => g,
            dlcp_config::schema::Generation::Auto => auto_generation(),
        };
        let start = StdInstant::now();
        let endpoint = Endpoint::new(endpoint_config(&cfg, generation), Instant::ZERO);
        let group = ops::socket_gid(&cfg.control).map_err(ServiceError::Config)?;
        let mut sc = ServerConfig::new(cfg.control.socket_path.clone(), cfg.control.mode());
        sc.policy = ops::peer_policy(group);
        sc.geometry =
            crate::shm::Geometry::new(cfg.shm.ring_entries, cfg.shm.ring_entries, cfg.shm.arena_bytes)
                .map_err(|e| ServiceError::Config(format!("shm geometry: {e}")))?;
        let mut shm = ShmServer::bind(sc).map_err(|e| ServiceError::Control {
            path: cfg.control.socket_path.display().to_string(),
            source: e,
        })?;
        let poll = Poll::new()?;
        let listener_fd = std::os::fd::AsFd::as_fd(&shm).as_raw_fd();
        poll.registry().register(&mut SourceFd(&listener_fd), LISTENER, Interest::READABLE)?;
        let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP])?;
        poll.registry().register(&mut signals, SIGNALS, Interest::READABLE)?;
        let datapath_tokens = datapath.register(poll.registry(), DATAPATH_BASE)?;
        let admin_path = admin_path(&cfg.control.socket_path);
        let _ = std::fs::remove_file(&admin_path);
        let mut admin = mio::net::UnixListener::bind(&admin_path)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&admin_path, std::fs::Permissions::from_mode(cfg.control.mode()))?;
        }
        ops::chgrp(&cfg.control.socket_path, group)?;
        ops::chgrp(&admin_path, group)?;
        poll.registry().register(&mut admin, ADMIN, Interest::READABLE)?;
        let timer = rustix::time::timerfd_create(
            rustix::time::TimerfdClockId::Monotonic,
            rustix::time::TimerfdFlags::NONBLOCK | rustix::time::TimerfdFlags::CLOEXEC,
        )
        .map_err(io::Error::from)?;
        poll.registry().register(&mut SourceFd(&timer.as_raw_fd()), TIMER, Interest::READABLE)?;
        let peers: Vec<SocketAddr> = cfg.peers.iter().map(|p| p.socket_addr()).collect();
        let peer_rank = peers.iter().enumerate().map(|(r, a)| (*a, r as u32)).collect();
        let _ = &mut shm;
        let ops = ops::OpsState::new(&cfg, &datapath.describe());
        log::info!(
            "dlcpd rank {}/{} job {} generation {generation}: {} — control socket {}",
            cfg.rank(),
            cfg.world_size(),
            cfg.node.job_id,
            datapath.describe(),
            cfg.control.socket_path.display()
        );
        Ok(Service {
            tx_buf: Vec::new(),
            tx_slot: cfg.chunk_bytes() as usize + wire::OVERHEAD + 64,
            cfg,
            endpoint,
            datapath,
            shm,
            poll,
            signals,
            slots: Vec::new(),
            local_world: None,
            local_ops: BTreeMap::new(),
            peers,
            peer_rank,
            start,
            pending_tx: std::collections::VecDeque::new(),
            tx_batch: Vec::new(),
            rx_batch: (Vec::new(), Vec::new()),
            draining: None,
            counters: ServiceCounters::default(),
            recent: std::collections::VecDeque::new(),
            datapath_tokens,
            admin,
            admin_path,
            reports: BTreeMap::new(),
            adapt: None,
            timer,
            ops,
        }
        .with_rate_adaptation())
    }

    fn with_rate_adaptation(mut self) -> Service {
        self.install_rate_adaptation();
        self
    }

    fn install_rate_adaptation(&mut self) {
        let max = self.cfg.pacing.rate_bytes_per_sec().unwrap_or(0);
        if self.cfg.pacing.adapt && max > 0 {
            self.adapt = Some(RateAdapter {
                max,
                min: (max / 100).max(125_000),
                window: StdDuration::from_millis(5),
                last: StdInstant::now(),
                // From the counters now (a reload installs a new adapter mid-run).
                last_tx: self.endpoint.stats().tx_packets[..7].iter().sum(),
                last_repairs: self.endpoint.stats().repairs_sent,
                cuts: 0,
            });
        }
    }

    fn serve_admin(&mut self) {
        loop {
            let (stream, _) = match self.admin.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    log::warn!("admin socket: {e}");
                    return;
                }
            };
            use std::io::{Read, Write};
            // A short blocking exchange: one request line, one JSON reply.
            let fd: std::os::fd::OwnedFd = stream.into();
            let mut s = std::os::unix::net::UnixStream::from(fd);
            let _ = s.set_nonblocking(false);
            let _ = s.set_read_timeout(Some(StdDuration::from_millis(200)));
            let _ = s.set_write_timeout(Some(StdDuration::from_millis(500)));
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).trim().to_string();
            let words: Vec<&str> = req.split_whitespace().collect();
            let reply = match words.as_slice() {
                ["stats"] => self.stats_json(),
                ["status"] => self.status_json(),
                ["reload"] => serde_json::to_value(self.reload()).unwrap_or_default(),
                ["report", op, tensor] => match (op.parse(), tensor.parse()) {
                    (Ok(seq), Ok(tensor)) => self.report_json(OpId { seq, tensor }),
                    _ => serde_json::json!({ "error": "usage: report OP TENSOR" }),
                },
                _ => serde_json::json!({
                    "error": format!("unknown request {req:?} (allowed: stats, status, reload, report OP TENSOR)")
                }),
            };
            let _ = s.write_all(reply.to_string().as_bytes());
        }
    }

    /// What arrived from whom for a recently completed op (the last 1024 are
    /// kept): per reduce-scatter sender the missing chunks of this rank's shard,
    /// per gather owner the agreed mask, and this rank's own mask.
    pub fn report_json(&self, id: OpId) -> serde_json::Value {
        let Some(r) = self.reports.get(&id) else {
            return serde_json::json!({
                "error": format!("no report for op {} tensor {} (unknown, failed, or too old)", id.seq, id.tensor)
            });
        };
        let transfer = |t: &dlcp_proto::endpoint::TransferReport| {
            serde_json::json!({
                "peer": t.peer,
                "chunks": t.chunks,
                "missing": t.delivered.iter_zeros().collect::<Vec<_>>(),
                "mask": t.mask.as_ref().map(|m| m.iter_ones().collect::<Vec<_>>()),
                "repaired": t.repaired,
                "deadline_fired": t.deadline_fired,
                "delivered_fraction": t.delivered_fraction(),
            })
        };
        serde_json::json!({
            "op": id.seq,
            "tensor": id.tensor,
            "rank": self.cfg.rank(),
            "duration_us": r.duration().as_micros() as u64,
            "own_chunks": r.own_chunks,
            "own_mask": r.own_mask.iter_ones().collect::<Vec<_>>(),
            "scatter": r.scatter.iter().map(transfer).collect::<Vec<_>>(),
            "gather": r.gather.iter().map(transfer).collect::<Vec<_>>(),
            "repairs_sent": r.repairs_sent,
            "deadline_fired": r.deadline_fired,
        })
    }

    /// Version, datapath, peers and trainers, as JSON (for `dlcpctl status`).
    pub fn status_json(&self) -> serde_json::Value {
        let peers: Vec<_> = (0..self.cfg.world_size())
            .map(|r| {
                serde_json::json!({
                    "rank": r,
                    "address": self.peers[r as usize].to_string(),
                    "generation": self.endpoint.peer_generation(r),
                    "up": r == self.cfg.rank() || self.endpoint.peer_up(r),
                    "self": r == self.cfg.rank(),
                })
            })
            .collect();
        serde_json::json!({
            "version": crate::VERSION,
            "rank": self.cfg.rank(),
            "world": self.cfg.world_size(),
            "job": self.cfg.node.job_id,
            "generation": self.endpoint.config().generation,
            "datapath": self.datapath.describe(),
            "trainers": self.trainers(),
            "ops_in_flight": self.endpoint.ops_in_flight(),
            "draining": self.draining.is_some(),
            "peers": peers,
            "ops": self.ops_status_json(),
        })
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Run until SIGTERM/SIGINT and a drain, or until `stop` returns true
    /// (checked every loop turn; tests use it).
    pub fn run(&mut self, mut stop: impl FnMut(&Service) -> bool) -> Result<(), ServiceError> {
        let mut events = Events::with_capacity(256);
        // Control socket, admin socket and datapath are up (Service::new).
        self.ops.ready(&self.cfg, &self.datapath.describe());
        loop {
            let now = self.now();
            let wait = match self.endpoint.poll_timeout() {
                Some(t) if t <= now => StdDuration::ZERO,
                Some(t) => (t - now).min(HOUSEKEEPING),
                None => HOUSEKEEPING,
            };
            let wait = self.ops.notifier.next_ping_in().map_or(wait, |p| wait.min(p));
            let wait = if !self.pending_tx.is_empty() {
                // Blocked on the socket: writability wakes us; check back soon anyway.
                wait.min(StdDuration::from_millis(1))
            } else {
                wait
            };
            // A poll-mode datapath (DPDK) has no descriptor to wake us: it says how soon.
            let hint = self.datapath.poll_hint();
            let wait = hint.map_or(wait, |h| wait.min(h));
            // Arm the timerfd for the exact wait; epoll's timeout (rounded up to
            // milliseconds) is only the fallback.
            if !wait.is_zero() {
                let spec = rustix::time::Itimerspec {
                    it_interval: rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 },
                    it_value: rustix::time::Timespec {
                        tv_sec: wait.as_secs() as i64,
                        tv_nsec: i64::from(wait.subsec_nanos()).max(1),
                    },
                };
                let _ = rustix::time::timerfd_settime(
                    &self.timer,
                    rustix::time::TimerfdTimerFlags::empty(),
                    &spec,
                );
            }
            let timeout =
                if hint == Some(StdDuration::ZERO) { wait } else { wait + StdDuration::from_millis(1) };
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
            let now = self.now();
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_trainers(),
                    ADMIN => self.serve_admin(),
                    TIMER => {
                        let mut b = [0u8; 8];
                        let _ = rustix::io::read(&self.timer, &mut b);
                    }
                    SIGNALS => self.on_signals(),
                    Token(t)
                        if (DATAPATH_BASE..DATAPATH_BASE + self.datapath_tokens).contains(&t)
                            && ev.is_readable() =>
                    {
                        self.receive(now);
                    }
                    Token(t) if t >= ATTACH_BASE => {
                        let slot = (t - ATTACH_BASE) / 2;
                        if (t - ATTACH_BASE) % 2 == 0 {
                            self.check_trainer(slot);
                        } else {
                            self.drain_submissions(slot, now);
                        }
                    }
                    _ => {}
                }
            }
            // Datagrams may also have arrived on sockets whose readiness edge we
            // consumed earlier; receive is cheap when nothing is there.
            self.receive(now);
            self.endpoint.handle_timeout(now);
            if let Some(a) = self.adapt.as_mut() {
                a.step(&mut self.endpoint, now);
            }
            self.deliver_events();
            self.transmit(now);
            self.ops.notifier.ping_watchdog();
            if self.ops.metrics_due() {
                let sample = self.metrics_sample();
                self.ops.update_metrics(&sample);
            }
            if stop(self) {
                return Ok(());
            }
            if let Some(since) = self.draining {
                let idle = self.endpoint.ops_in_flight() == 0 && self.local_ops.is_empty();
                if idle || since.elapsed() > self.cfg.loss.hard_timeout() {
                    log::info!("drained ({} ops left in flight); exiting", self.endpoint.ops_in_flight());
                    return Ok(());
                }
            }
        }
    }

    fn on_signals(&mut self) {
        for sig in self.signals.pending() {
            match sig {
                SIGTERM | SIGINT if self.draining.is_none() => {
                    log::info!(
                        "signal {sig}: draining {} ops in flight, accepting no new ones",
                        self.endpoint.ops_in_flight() + self.local_ops.len()
                    );
                    self.draining = Some(StdInstant::now());
                    self.ops.notifier.notify("STOPPING=1\nSTATUS=draining");
                }
                SIGHUP => {
                    self.reload();
                }
                _ => {}
            }
        }
    }

    fn accept_trainers(&mut self) {
        loop {
            match self.shm.accept() {
                Ok(Some(att)) => self.add_trainer(att),
                Ok(None) => break,
                Err(e) => {
                    self.counters.trainers_refused += 1;
                    log::warn!("trainer refused: {e}");
                }
            }
        }
    }

    fn add_trainer(&mut self, att: Attachment) {
        let reg = att.registration();
        if reg.job_id != u64::from(self.cfg.node.job_id) {
            self.counters.trainers_refused += 1;
            log::warn!(
                "trainer pid {} registered for job {} but this daemon serves job {}; detaching it",
                att.peer().pid,
                reg.job_id,
                self.cfg.node.job_id
            );
            return;
        }
        if let Some(w) = self.local_world
            && w != reg.local_world
            && self.slots.iter().any(Option::is_some)
        {
            self.counters.trainers_refused += 1;
            log::warn!(
                "trainer pid {} says local world {} but attached trainers say {w}",
                att.peer().pid,
                reg.local_world
            );
            return;
        }
        self.local_world = Some(reg.local_world);
        let i = self.slots.iter().position(Option::is_none).unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        let reg_result = self
            .poll
            .registry()
            .register(
                &mut SourceFd(&att.control_fd().as_raw_fd()),
                Token(ATTACH_BASE + 2 * i),
                Interest::READABLE,
            )
            .and_then(|()| {
                self.poll.registry().register(
                    &mut SourceFd(&att.doorbell_fd().as_raw_fd()),
                    Token(ATTACH_BASE + 2 * i + 1),
                    Interest::READABLE,
                )
            });
        if let Err(e) = reg_result {
            log::error!("cannot watch trainer pid {}: {e}; detaching it", att.peer().pid);
            return;
        }
        self.counters.trainers_attached += 1;
        self.slots[i] = Some(Slot { att });
        // Submissions may already be waiting.
        self.drain_submissions(i, self.now());
    }

    fn check_trainer(&mut self, slot: usize) {
        let Some(s) = self.slots.get_mut(slot).and_then(Option::as_mut) else { return };
        match s.att.liveness() {
            Liveness::Alive => {}
            other => {
                let id = s.att.id();
                log::info!("trainer attachment {id} (pid {}) is gone ({other:?})", s.att.peer().pid);
                self.remove_trainer(slot);
            }
        }
    }

    fn remove_trainer(&mut self, slot: usize) {
        let Some(s) = self.slots.get_mut(slot).and_then(Option::take) else { return };
        let id = s.att.id();
        let rank = s.att.registration().local_rank as usize;
        let _ = self.poll.registry().deregister(&mut SourceFd(&s.att.control_fd().as_raw_fd()));
        let _ = self.poll.registry().deregister(&mut SourceFd(&s.att.doorbell_fd().as_raw_fd()));
        self.counters.trainers_gone += 1;
        drop(s);
        // Local ops not started yet that hold the gone trainer's contribution, or
        // still wait for its local rank, can never start: fail them for the other
        // local trainers. (A replacement trainer continues with new ops.)
        let doomed: Vec<OpId> = self
            .local_ops
            .iter()
            .filter(|(_, op)| {
                op.started_at.is_none()
                    && op
                        .contributions
                        .get(rank)
                        .is_some_and(|c| c.as_ref().is_none_or(|c| c.attachment == id))
            })
            .map(|(k, _)| *k)
            .collect();
        for k in doomed {
            if let Some(op) = self.local_ops.remove(&k) {
                self.counters.ops_failed += 1;
                self.complete_all(&op, Status::PeerDown, 0, 0, StdDuration::ZERO, None);
            }
        }
    }

    fn slot_of(&self, attachment: u64) -> Option<usize> {
        self.slots.iter().position(|s| s.as_ref().is_some_and(|s| s.att.id() == attachment))
    }

    fn drain_submissions(&mut self, slot: usize, now: Instant) {
        let Some(s) = self.slots.get_mut(slot).and_then(Option::as_mut) else { return };
        let _ = s.att.wait(Some(StdDuration::ZERO));
        let mut subs = Vec::new();
        loop {
            match s.att.next_submission() {
                Ok(Some(sub)) => subs.push(sub),
                Ok(None) => break,
                Err(crate::shm::ChannelError::Rejected { .. }) => {
                    // Answered with an InvalidDescriptor completion and counted by the attachment.
                    self.counters.submissions_rejected += 1;
                }
                Err(e) => {
                    log::warn!("trainer attachment {}: {e}; detaching it", s.att.id());
                    self.remove_trainer(slot);
                    return;
                }
            }
        }
        let att_id = s.att.id();
        let local_rank = s.att.registration().local_rank;
        for sub in subs {
            self.counters.submissions += 1;
            self.on_submission(slot, att_id, local_rank, sub, now);
        }
    }

    fn on_submission(&mut self, slot: usize, att_id: u64, local_rank: u32, sub: Submission, now: Instant) {
        if self.draining.is_some() {
            if let Some(s) = self.slots[slot].as_mut() {
                let _ = s.att.complete_submission(&sub, Status::Shutdown, 0, 0, StdDuration::ZERO);
            }
            return;
        }
        let id = OpId { seq: sub.op_seq, tensor: sub.tensor_id };
        let world = self.local_world.unwrap_or(1) as usize;
        // Copy the contribution out of shared memory now (the trainer owns the buffer).
        let data = {
            let Some(s) = self.slots[slot].as_ref() else { return };
            // Into a reused buffer (a fresh one page-faults on every op).
            let mut d = self.endpoint.take_buffer(usize::try_from(sub.span.len_elems).unwrap_or(0));
            match s.att.copy_from_arena_into(sub.span.offset, &mut d) {
                Ok(()) => d,
                Err(e) => {
                    self.endpoint.recycle(d);
                    log::warn!("attachment {att_id}: {e}");
                    self.counters.submissions_rejected += 1;
                    if let Some(s) = self.slots[slot].as_mut() {
                        let _ = s.att.complete_submission(
                            &sub,
                            Status::InvalidDescriptor,
                            0,
                            0,
                            StdDuration::ZERO,
                        );
                    }
                    return;
                }
            }
        };
        let op = self.local_ops.entry(id).or_insert_with(|| LocalOp {
            contributions: (0..world).map(|_| None).collect(),
            parts: (0..world).map(|_| None).collect(),
            sum: None,
            started_at: None,
            first_at: StdInstant::now(),
            budget_ppm: 0,
        });
        let r = local_rank as usize;
        if r >= op.contributions.len() || op.contributions[r].is_some() || op.started_at.is_some() {
            self.counters.local_mismatch += 1;
            log::warn!("attachment {att_id}: duplicate submission of op {}/{}", id.seq, id.tensor);
            if let Some(s) = self.slots[slot].as_mut() {
                let _ = s.att.complete_submission(&sub, Status::InvalidDescriptor, 0, 0, StdDuration::ZERO);
            }
            return;
        }
        // Local reduce in local-rank order happens when all K are in; keep the
        // contribution until then (local rank 0 first, so the sum order is fixed).
        let first = op.contributions.iter().flatten().next().map(|c| c.sub);
        if let Some(f) = first
            && (f.span.len_elems != sub.span.len_elems || f.layer != sub.layer || f.layers != sub.layers)
        {
            self.counters.local_mismatch += 1;
            log::warn!(
                "op {}/{}: local trainers disagree (len {} vs {}, layer {}/{} vs {}/{})",
                id.seq,
                id.tensor,
                f.span.len_elems,
                sub.span.len_elems,
                f.layer,
                f.layers,
                sub.layer,
                sub.layers
            );
            if let Some(op) = self.local_ops.remove(&id) {
                self.counters.ops_failed += 1;
                self.complete_all(&op, Status::InvalidDescriptor, 0, 0, StdDuration::ZERO, None);
            }
            if let Some(s) = self.slots[slot].as_mut() {
                let _ = s.att.complete_submission(&sub, Status::InvalidDescriptor, 0, 0, StdDuration::ZERO);
            }
            return;
        }
        op.contributions[r] = Some(Contribution { attachment: att_id, sub });
        stash(op, r, data, &mut self.endpoint);
        if op.contributions.iter().all(Option::is_some) {
            self.start_op(id, now);
        }
    }

    fn start_op(&mut self, id: OpId, now: Instant) {
        let Some(op) = self.local_ops.get_mut(&id) else { return };
        let sum = op.sum.take().unwrap_or_default();
        let sub = op.contributions.iter().flatten().next().map(|c| c.sub);
        let Some(sub) = sub else { return };
        // loss.budget is the operator's cap on what trainers may ask for.
        let budget = sub.budget_ppm.min(self.cfg.loss.budget_ppm());
        op.budget_ppm = budget;
        let opts = OpOptions {
            layer: sub.layer,
            layers: sub.layers,
            budget_ppm: budget,
            gather_budget_ppm: self.cfg.loss.gather_budget_ppm().min(budget),
            // The trainer's flags can only ask for more than `[loss]` sets:
            // a flag bit turns the behaviour on for this op, the config turns
            // it on for every op.
            fill: match self.cfg.loss.fill {
                CfgFill::Local => Fill::Local,
                CfgFill::Zero if sub.flags & crate::shm::layout::FLAG_FILL_LOCAL != 0 => Fill::Local,
                CfgFill::Zero => Fill::Zero,
            },
            rescale: self.cfg.loss.rescale || sub.flags & crate::shm::layout::FLAG_RESCALE != 0,
            reduce: ReduceOp::Sum,
        };
        op.started_at = Some(StdInstant::now());
        match self.endpoint.start_allreduce(now, id, sum, opts) {
            Ok(()) => self.counters.ops_started += 1,
            Err(e) => {
                log::warn!("op {}/{} could not start: {e}", id.seq, id.tensor);
                let status = match e {
                    StartError::Duplicate(_) | StartError::Empty | StartError::TooLarge => {
                        Status::InvalidDescriptor
                    }
                    _ => Status::InvalidDescriptor,
                };
                if let Some(op) = self.local_ops.remove(&id) {
                    self.counters.ops_failed += 1;
                    self.complete_all(&op, status, 0, 0, StdDuration::ZERO, None);
                }
            }
        }
    }

    fn complete_all(
        &mut self,
        op: &LocalOp,
        status: Status,
        delivered_ppm: u32,
        repairs: u32,
        duration: StdDuration,
        result: Option<&[f32]>,
    ) {
        for c in op.contributions.iter().flatten() {
            let Some(slot) = self.slot_of(c.attachment) else { continue };
            let Some(s) = self.slots[slot].as_mut() else { continue };
            let mut st = status;
            if let Some(r) = result
                && let Err(e) = s.att.copy_to_arena(c.sub.span.offset, r)
            {
                log::warn!("attachment {}: cannot write result: {e}", c.attachment);
                st = Status::InvalidDescriptor;
            }
            if s.att.complete_submission(&c.sub, st, delivered_ppm, repairs, duration).is_err() {
                self.counters.completions_dropped += 1;
            }
        }
    }

    fn deliver_events(&mut self) {
        while let Some(ev) = self.endpoint.poll_event() {
            match ev {
                Event::OpComplete { id, result, report } => {
                    self.counters.ops_completed += 1;
                    let Some(op) = self.local_ops.remove(&id) else { continue };
                    let min = report.min_delivered_fraction();
                    let ppm = (min * 1e6).round() as u32;
                    let dur = op.first_at.elapsed();
                    self.record(OpRecord {
                        op: id.seq,
                        tensor: id.tensor,
                        len: result.len(),
                        duration_us: report.duration().as_micros() as u64,
                        min_delivered: min,
                        repairs_sent: report.repairs_sent,
                        deadline_fired: report.deadline_fired,
                        error: None,
                    });
                    self.complete_all(&op, Status::Ok, ppm, report.repairs_sent, dur, Some(&result));
                    self.endpoint.recycle(result);
                    self.ops.op_completed(&report, op.budget_ppm);
                    if self.reports.len() >= 1024 {
                        self.reports.pop_first();
                    }
                    self.reports.insert(id, report);
                }
                Event::OpFailed { id, error } => {
                    self.counters.ops_failed += 1;
                    log::warn!("op {}/{} failed: {error}", id.seq, id.tensor);
                    let status = match error {
                        OpError::Timeout { .. } => Status::Timeout,
                        OpError::PeerRestarted { .. } => Status::PeerDown,
                    };
                    self.record(OpRecord {
                        op: id.seq,
                        tensor: id.tensor,
                        len: 0,
                        duration_us: 0,
                        min_delivered: 0.0,
                        repairs_sent: 0,
                        deadline_fired: false,
                        error: Some(error.to_string()),
                    });
                    if let Some(op) = self.local_ops.remove(&id) {
                        let dur = op.first_at.elapsed();
                        self.complete_all(&op, status, 0, 0, dur, None);
                    }
                }
                Event::PeerUp { rank, generation } => log::info!("peer {rank} up (generation {generation})"),
                Event::PeerDown { rank } => log::warn!("peer {rank} silent: marked down"),
                Event::PeerRestarted { rank, old, new } => {
                    log::warn!("peer {rank} restarted (generation {old} -> {new}); its in-flight ops failed")
                }
            }
        }
    }

    fn record(&mut self, r: OpRecord) {
        if self.recent.len() >= 1024 {
            self.recent.pop_front();
        }
        self.recent.push_back(r);
    }

    fn receive(&mut self, now: Instant) {
        let Service { datapath, endpoint, peers, peer_rank, counters, rx_batch, .. } = self;
        // Datagrams are copied into `rx_batch` and handed to the endpoint a
        // receive call at a time, so their tags are checked together.
        let (buf, spans) = rx_batch;
        // Bounded, so a flood cannot starve timers, trainers and transmit.
        for _ in 0..64 {
            let mut f = |from: SocketAddr, bytes: &[u8], fate: Fate| {
                // Drops are counted per peer by source address: a configured peer's
                // rank, or one bounded "unknown" bucket for any other address.
                let peer = peer_rank.get(&from).copied();
                if let Fate::Dropped(_) = fate {
                    counters.rx_debug_dropped += 1;
                    endpoint.count_dropped(bytes, peer);
                    return;
                }
                // The claimed sender must send from its configured address; the MAC
                // then proves the rest.
                if let Ok(p) = wire::Packet::new_checked(bytes)
                    && peers.get(p.src() as usize).is_some_and(|a| *a != from)
                {
                    if peer.is_some() {
                        counters.rx_wrong_source += 1;
                    } else {
                        counters.rx_unknown_source += 1;
                    }
                    endpoint.count_dropped(bytes, peer);
                    return;
                }
                spans.push((buf.len()..buf.len() + bytes.len(), peer));
                buf.extend_from_slice(bytes);
            };
            let r = datapath.recv_reporting(&mut f);
            if !spans.is_empty() {
                let batch: Vec<(&[u8], Option<u32>)> =
                    spans.iter().map(|(r, p)| (&buf[r.clone()], *p)).collect();
                endpoint.handle_datagrams_from(now, &batch);
                spans.clear();
                buf.clear();
            }
            match r {
                Ok(0) if !datapath.rx_pending() => break,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("datapath receive: {e}");
                    break;
                }
            }
        }
    }

    fn transmit(&mut self, now: Instant) {
        // Datagrams the datapath refused earlier (would-block) go first, in order.
        while let Some((dst, class, d)) = self.pending_tx.pop_front() {
            match self.datapath.send(dst, class, &d) {
                Ok(SendOutcome::Sent) => {}
                Ok(SendOutcome::WouldBlock) => {
                    self.pending_tx.push_front((dst, class, d));
                    let _ = self.datapath.flush();
                    return;
                }
                Err(e) => log::error!("datapath send: {e}"),
            }
        }
        // Datagrams come from the endpoint TX_BATCH at a time, tagged together.
        let slot = self.tx_slot;
        'batches: loop {
            self.endpoint.poll_transmit_many(now, slot, TX_BATCH, &mut self.tx_buf, &mut self.tx_batch);
            let n = self.tx_batch.len();
            for i in 0..n {
                let (t, off) = self.tx_batch[i];
                let Some(&dst) = self.peers.get(t.dst as usize) else { continue };
                let data = &self.tx_buf[off..off + t.len];
                if is_probe(data) {
                    // A PROBE says "I have sent through chunk X": it travels in the
                    // control class, which the datapath flushes first, so push out
                    // the data queued before it or it overtakes that data on the
                    // host and the receiver asks for repairs of chunks in flight.
                    if let Err(e) = self.datapath.flush() {
                        log::warn!("datapath flush: {e}");
                    }
                    self.counters.probe_flushes += 1;
                }
                let outcome = self.datapath.send(dst, t.class, data);
                if !matches!(outcome, Ok(SendOutcome::Sent)) {
                    if let Err(e) = &outcome {
                        log::error!("datapath send: {e}");
                    }
                    // Keep this datagram (unless it failed) and the rest of the
                    // batch, in order, for the next turn.
                    let from = if outcome.is_err() { i + 1 } else { i };
                    for &(t, off) in &self.tx_batch[from..] {
                        if let Some(&dst) = self.peers.get(t.dst as usize) {
                            self.pending_tx.push_back((dst, t.class, self.tx_buf[off..off + t.len].to_vec()));
                        }
                    }
                    break 'batches;
                }
            }
            if n < TX_BATCH {
                break;
            }
        }
        if let Err(e) = self.datapath.flush() {
            log::warn!("datapath flush: {e}");
        }
    }

    /// The protocol endpoint (for tests and `stats`).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Service counters.
    pub fn counters(&self) -> &ServiceCounters {
        &self.counters
    }

    /// Datapath counters.
    pub fn datapath_stats(&self) -> DatapathStats {
        self.datapath.stats()
    }

    /// Trainers attached now.
    pub fn trainers(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Everything the daemon counts, as JSON (for `dlcpctl stats --json`).
    pub fn stats_json(&self) -> serde_json::Value {
        let s = self.endpoint.stats();
        let r = &s.rejected;
        let dr = &s.rx_dropped;
        let count = |c: dlcp_proto::endpoint::PacketCount| serde_json::json!({ "packets": c.packets, "bytes": c.bytes });
        let d = self.datapath.stats();
        serde_json::json!({
            "version": crate::VERSION,
            "rank": self.cfg.rank(),
            "world": self.cfg.world_size(),
            "datapath": self.datapath.describe(),
            "trainers": self.trainers(),
            "pacing_rate_bytes_per_sec": self.endpoint.pacing_rate(),
            "pacing_rate_cuts": self.adapt.as_ref().map(|a| a.cuts),
            "service": self.counters,
            "protocol": {
                "tx_packets_per_class": s.tx_packets, "tx_bytes_per_class": s.tx_bytes,
                "rx_packets_per_class": s.rx_packets, "rx_bytes_per_class": s.rx_bytes,
                "tx_packets_per_peer": s.tx_packets_peer, "rx_packets_per_peer": s.rx_packets_peer,
                "tx_bytes_per_peer": s.tx_bytes_peer, "rx_bytes_per_peer": s.rx_bytes_peer,
                "rx_dropped_packets_per_class": dr.class.map(|c| c.packets),
                "rx_dropped_bytes_per_class": dr.class.map(|c| c.bytes),
                "rx_dropped_unknown_class": count(dr.unknown_class),
                "rx_dropped_packets_per_peer": dr.peer.iter().map(|c| c.packets).collect::<Vec<_>>(),
                "rx_dropped_bytes_per_peer": dr.peer.iter().map(|c| c.bytes).collect::<Vec<_>>(),
                "rx_dropped_unknown_peer": count(dr.unknown_peer),
                "repairs_sent": s.repairs_sent, "repairs_received": s.repairs_received,
                "repairs_sent_per_class": s.repairs_sent_per_class,
                "repairs_received_per_class": s.repairs_received_per_class,
                "repair_bytes_sent_per_class": s.repair_bytes_sent_per_class,
                "repair_bytes_received_per_class": s.repair_bytes_received_per_class,
                "repairs_sent_per_peer": s.repairs_sent_peer.iter().map(|c| c.packets).collect::<Vec<_>>(),
                "repairs_received_per_peer": s.repairs_received_peer.iter().map(|c| c.packets).collect::<Vec<_>>(),
                "repair_bytes_sent_per_peer": s.repairs_sent_peer.iter().map(|c| c.bytes).collect::<Vec<_>>(),
                "repair_bytes_received_per_peer": s.repairs_received_peer.iter().map(|c| c.bytes).collect::<Vec<_>>(),
                "probes_sent": s.probes_sent, "probes_duplicate": s.probes_duplicate,
                "deadlines_fired": s.deadlines_fired, "deadline_closes": s.deadline_closes,
                "deadline_nacks": s.deadline_nacks,
                "hard_timeouts": s.hard_timeouts, "ops_completed": s.ops_completed, "ops_failed": s.ops_failed,
                "closed_within_budget": s.closed_within_budget, "ops_in_flight": self.endpoint.ops_in_flight(),
                "rejected": {
                    "malformed": r.malformed, "bad_tag": r.bad_tag, "wrong_job": r.wrong_job,
                    "wrong_rank": r.wrong_rank, "stale_generation": r.stale_generation, "stale_op": r.stale_op,
                    "mismatch": r.mismatch, "duplicate": r.duplicate, "late": r.late,
                    "early_buffered": r.early_buffered, "early_dropped": r.early_dropped,
                    "early_expired": r.early_expired,
                },
            },
            "datapath_counters": {
                "tx_packets_per_class": d.tx_packets, "tx_bytes_per_class": d.tx_bytes,
                "rx_packets": d.rx_packets, "rx_bytes": d.rx_bytes, "tx_would_block": d.tx_would_block,
                "tx_errors": d.tx_errors, "rx_errors": d.rx_errors, "rx_truncated": d.rx_truncated,
                "tx_syscalls": d.tx_syscalls, "rx_syscalls": d.rx_syscalls,
                "detail": self.datapath.detail_json(),
            },
            "shm": {
                "attached": self.shm.stats().attached,
                "rejected_descriptors": self.slots.iter().flatten().map(|s| s.att.stats().rejected()).sum::<u64>(),
            },
            "recent_ops": self.recent.iter().rev().take(64).collect::<Vec<_>>(),
        })
    }
}

/// Add contribution `r` to the local sum. Contributions arrive in any order
/// but are summed in local-rank order for reproducible bytes: each is kept
/// until all are in, then rank 0's buffer becomes the sum and the others are
/// added to it in rank order (and their buffers go back to `pool`). With one
/// local trainer its contribution *is* the sum: no copy.
fn stash(op: &mut LocalOp, r: usize, data: Vec<f32>, pool: &mut Endpoint) {
    if let Some(p) = op.parts.get_mut(r) {
        *p = Some(data);
    }
    if op.parts.iter().all(Option::is_some) {
        let mut parts = std::mem::take(&mut op.parts).into_iter().flatten();
        let mut sum = parts.next().unwrap_or_default();
        for part in parts {
            for (s, x) in sum.iter_mut().zip(&part) {
                *s += *x;
            }
            pool.recycle(part);
        }
        op.sum = Some(sum);
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.admin_path);
    }
}
