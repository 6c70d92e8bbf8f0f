//! The daemon's event loop: trainers on shared memory, the protocol core, the
//! datapath, signals — one thread, driven by mio.
//!
//! ```text
//!  trainer ─doorbell─▶ Trainers: next_submission ─copy out─▶ LocalReducer (K trainers)
//!                               all K in, summed in local-rank order ─▶ Endpoint::start_allreduce
//!  Datapath::recv (each datagram in its receive slot) ─▶ Pump::receive (peer of the source address)
//!                                 ─▶ Endpoint::handle_datagram_from (source check, tag, placement)
//!  Endpoint::poll_transmit_batch (payloads lent from op memory) ─▶ Pump::transmit
//!                                 ─▶ Datapath::send_batch (class → DSCP, iovecs, in the order given)
//!  Endpoint::poll_event: OpComplete ─▶ copy result into every trainer's buffer ─▶ completion
//!                        OpFailed   ─▶ completion with Timeout / PeerDown
//! ```
//!
//! Nothing here blocks except `Poll::poll`, whose timeout is the protocol's next
//! timer (capped for housekeeping). No local client can hold the loop: admin
//! requests and attach handshakes are state machines under tokens of their
//! own, capped in number and closed at their deadline. SIGTERM/SIGINT stop accepting new ops, drain
//! those in flight (bounded by the hard timeout) and return.
//!
//! [`Service`] (this file: set-up, the loop, signals, dispatch) composes the
//! parts, each in its own file and none of them knowing the service:
//!
//! - `setup.rs`: configuration → subsystems (endpoint settings, generation,
//!   control socket, timerfd, the service's clock);
//! - `attach.rs`: the control socket and the attach handshakes in progress,
//!   read without waiting for any trainer;
//! - `trainers.rs`: attached trainers, detach, submissions, op start, completions;
//! - `local.rs`: the local reduce of the K trainers of a host (pure);
//! - `pump.rs`: datagrams between datapath and endpoint, and the loss-driven
//!   pacing;
//! - `admin.rs`: the `dlcpctl` protocol and its reply types;
//!   `admin_socket.rs`: its connections, read and written without waiting for
//!   any client, and who may ask what (`SO_PEERCRED`);
//! - `operations.rs`: reload, systemd notification, metrics;
//! - `counters.rs`: the service's counters; `view.rs`: the read-only look at
//!   the service that admin replies and metrics are built from.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use dlcp_config::{Config, PacketAuthMode};
use dlcp_proto::endpoint::{Endpoint, Event, OpError, OpId};
use dlcp_proto::stats::{Desc, Label};
use dlcp_proto::time::Instant;
use dlcp_proto::wire::FailReason;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;

use self::admin::{Admin, Request};
use self::admin_socket::{AdminPolicy, AdminSocket};
use self::attach::Attach;
use self::operations::{Operations, Reloadable};
use self::pump::Pump;
use self::trainers::{ATTACH_BASE, Completion, Trainers};
use self::view::View;
use crate::datapath::fault::FaultInjector;
use crate::datapath::{Datapath, DatapathStats};
use crate::hot_reload::ReloadOutcome;
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::shm::Status;

mod admin;
mod admin_socket;

/// The admin request parser and line reader, for the fuzz targets (`fuzz/`): not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::admin::Request as AdminRequest;
    pub use super::admin_socket::{MAX_REQUEST as MAX_ADMIN_REQUEST, read_line as read_admin_line};
}

mod attach;
mod counters;
mod local;
mod operations;
mod pump;
mod setup;
mod sources;
mod trainers;
mod view;

pub use self::admin::{
    ErrorReply, LastReload, MetricsStatus, OpRecord, OperationsStatus, PeerStatus, ReportReply, StatusReply,
    SystemdStatus, TransferReply, admin_path, report_from_json,
};
pub use self::counters::ServiceCounters;
pub use self::setup::{ServiceError, SocketGroupError, auto_generation, endpoint_config, timers};

const LISTENER: Token = Token(0);
const SIGNALS: Token = Token(1);
const ADMIN: Token = Token(2);
const TIMER: Token = Token(3);
const DATAPATH_BASE: usize = 16;
/// Longest sleep between housekeeping passes.
const HOUSEKEEPING: StdDuration = StdDuration::from_millis(100);
/// How often local connections are checked against their deadline.
const SWEEP_EVERY: StdDuration = StdDuration::from_millis(50);

/// The running daemon.
pub struct Service {
    cfg: Config,
    endpoint: Endpoint,
    pump: Pump,
    trainers: Trainers,
    attach: Attach,
    admin: Admin,
    admin_socket: AdminSocket,
    operations: Operations,
    counters: ServiceCounters,
    poll: Poll,
    signals: Signals,
    /// A timerfd for sub-millisecond wakeups (epoll's own timeout has
    /// millisecond resolution, too coarse for pacing and probe timers).
    timer: OwnedFd,
    /// The datapath's mio tokens.
    datapath_tokens: std::ops::Range<usize>,
    start: StdInstant,
    draining: Option<StdInstant>,
    /// When local connections were last checked against their deadline.
    swept: StdInstant,
}

impl Service {
    /// Set up the service: control socket, endpoint, event loop. The datapath is
    /// built by the caller (socket or DPDK, see `crate::datapath`), wrapped in
    /// a [`FaultInjector`] if it should inject faults (a plain
    /// `Box<dyn Datapath>` converts to one without faults).
    pub fn new(cfg: Config, datapath: impl Into<FaultInjector>) -> Result<Service, ServiceError> {
        let mut datapath = datapath.into();
        let generation = setup::generation(&cfg);
        let start = StdInstant::now();
        let endpoint = Endpoint::new(
            endpoint_config(&cfg, generation, setup::session().map_err(ServiceError::Session)?),
            Instant::ZERO,
        );
        let group = setup::socket_gid(&cfg.control)?;
        let attach = Attach::new(setup::shm_server(&cfg, group)?, cfg.control.max_pending_attaches as usize);
        let poll = Poll::new()?;
        let listener_fd = attach.listener().as_raw_fd();
        poll.registry().register(&mut SourceFd(&listener_fd), LISTENER, Interest::READABLE)?;
        let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP])?;
        poll.registry().register(&mut signals, SIGNALS, Interest::READABLE)?;
        let tokens = datapath.register(poll.registry(), DATAPATH_BASE)?;
        let mut admin_socket = AdminSocket::bind(
            admin_path(&cfg.control.socket_path),
            cfg.control.mode(),
            // Read-only requests as for attaching; reload for the daemon's user and root.
            AdminPolicy { read: setup::peer_policy(group), owner: rustix::process::geteuid().as_raw() },
            cfg.control.max_admin_connections as usize,
            cfg.control.request_timeout(),
        )?;
        setup::chgrp(&cfg.control.socket_path, group)?;
        setup::chgrp(admin_socket.path(), group)?;
        admin_socket.register(poll.registry(), ADMIN)?;
        let timer = setup::timerfd()?;
        poll.registry().register(&mut SourceFd(&timer.as_raw_fd()), TIMER, Interest::READABLE)?;
        let peers: Vec<SocketAddr> = cfg.peers.iter().map(|p| p.socket_addr()).collect();
        let operations = Operations::new();
        log::info!(
            "dlcpd rank {}/{} job {} generation {generation}: {} — control socket {}",
            cfg.rank(),
            cfg.world_size(),
            cfg.node.job_id,
            datapath.describe(),
            cfg.control.socket_path.display()
        );
        if cfg.security.packet_auth == PacketAuthMode::None {
            log::warn!(
                "security.packet_auth = \"none\": datagrams are not authenticated; anyone who can reach \
                 {} can inject data into this job's results (use only on an isolated fabric)",
                cfg.bind_addr()
            );
        }
        let paths = cfg.network.paths;
        let pump = Pump::new(datapath, peers, paths);
        let mut service = Service {
            cfg,
            endpoint,
            pump,
            trainers: Trainers::new(),
            attach,
            admin: Admin::new(),
            admin_socket,
            operations,
            counters: ServiceCounters {
                rx_packets_path: vec![0; usize::from(paths)],
                ..ServiceCounters::default()
            },
            poll,
            signals,
            timer,
            datapath_tokens: DATAPATH_BASE..DATAPATH_BASE + tokens,
            start,
            draining: None,
            swept: start,
        };
        if service.cfg.metrics.enabled {
            let v = service.view();
            let each =
                |f: &mut dyn FnMut(&'static Desc, Label, u64)| v.visit_counters(&mut |_, d, l, x| f(d, l, x));
            let auth = v.cfg.security.packet_auth.as_str();
            let m = Metrics::new(v.cfg.rank(), v.cfg.world_size(), &v.datapath.describe(), auth, &each);
            service.operations.start_metrics(&service.cfg, m);
        }
        Ok(service)
    }

    /// Remember the configuration file (for reload) and notify systemd through
    /// `notifier`. `log_level_from_config`: the log filter follows `log.level`
    /// (false when `RUST_LOG` set it; a reload then leaves it alone).
    pub fn set_operations(&mut self, config_path: PathBuf, notifier: Notifier, log_level_from_config: bool) {
        self.operations.set(config_path, notifier, log_level_from_config);
    }

    fn now(&self) -> Instant {
        setup::since(self.start)
    }

    /// Run until SIGTERM/SIGINT and a drain, or until `stop` returns true
    /// (checked every loop turn; tests use it).
    pub fn run(&mut self, mut stop: impl FnMut(&Service) -> bool) -> Result<(), ServiceError> {
        let mut events = Events::with_capacity(256);
        // Control socket, admin socket and datapath are up (Service::new).
        self.operations.ready(&self.cfg, &self.pump.datapath().describe());
        loop {
            let timeout = self.arm_wakeup();
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
            let now = self.now();
            for ev in events.iter() {
                self.on_event(ev.token(), ev.is_readable(), now);
            }
            // Datagrams may also have arrived on sockets whose readiness edge we
            // consumed earlier; receive is cheap when nothing is there.
            self.pump.receive(&mut self.endpoint, &mut self.counters, now);
            self.endpoint.handle_timeout(now);
            self.deliver_events();
            let (trainers, mut ctx) = self.trainers_ctx();
            trainers.resume(&mut ctx, now);
            self.pump.transmit(&mut self.endpoint, now);
            self.sweep();
            self.operations.notifier.ping_watchdog();
            if self.operations.metrics_due()
                && let Some(m) = self.operations.metrics()
            {
                let v = self.view();
                m.update(&|f: &mut dyn FnMut(&'static Desc, Label, u64)| {
                    v.visit_counters(&mut |_, d, l, x| f(d, l, x))
                });
                self.operations.metrics_updated();
            }
            if stop(self) {
                return Ok(());
            }
            if let Some(since) = self.draining {
                let idle = self.endpoint.ops_in_flight() == 0 && self.trainers.ops() == 0;
                if idle || since.elapsed() > self.cfg.loss.hard_timeout() {
                    log::info!("drained ({} ops left in flight); exiting", self.endpoint.ops_in_flight());
                    self.say_goodbye();
                    return Ok(());
                }
            }
        }
    }

    /// Tell every peer this daemon is going (GOODBYE), so they mark it down
    /// at once instead of after the peer timeout.
    fn say_goodbye(&mut self) {
        self.endpoint.goodbye();
        let now = self.now();
        self.pump.transmit(&mut self.endpoint, now);
        if let Err(e) = self.pump.datapath_mut().flush() {
            log::warn!("datapath flush at exit: {e}");
        }
    }

    /// How long the loop may sleep: until the protocol's next timer, the next
    /// watchdog ping or the datapath's poll hint, at most [`HOUSEKEEPING`].
    /// Arms the timerfd for exactly that and returns epoll's timeout.
    fn arm_wakeup(&self) -> StdDuration {
        let now = self.now();
        let wait = match self.endpoint.poll_timeout() {
            Some(t) if t <= now => StdDuration::ZERO,
            Some(t) => (t - now).min(HOUSEKEEPING),
            None => HOUSEKEEPING,
        };
        let wait = self.operations.notifier.next_ping_in().map_or(wait, |p| wait.min(p));
        let wait = if self.pump.blocked() {
            // Blocked on the socket: writability wakes us; check back soon anyway.
            wait.min(StdDuration::from_millis(1))
        } else {
            wait
        };
        // A poll-mode datapath (DPDK) has no descriptor to wake us: it says how soon.
        let hint = self.pump.datapath().poll_hint();
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
            let _ =
                rustix::time::timerfd_settime(&self.timer, rustix::time::TimerfdTimerFlags::empty(), &spec);
        }
        if hint == Some(StdDuration::ZERO) { wait } else { wait + StdDuration::from_millis(1) }
    }

    /// Handle one readiness event.
    fn on_event(&mut self, token: Token, readable: bool, now: Instant) {
        match token {
            LISTENER => {
                for att in self.attach.accept(self.poll.registry(), &mut self.counters) {
                    let (trainers, mut ctx) = self.trainers_ctx();
                    trainers.add(att, &mut ctx);
                }
            }
            ADMIN => {
                for (conn, request) in self.admin_socket.accept(self.poll.registry(), &mut self.counters) {
                    self.answer_admin(conn, &request);
                }
            }
            TIMER => {
                let mut b = [0u8; 8];
                let _ = rustix::io::read(&self.timer, &mut b);
            }
            SIGNALS => self.on_signals(),
            Token(t) if self.datapath_tokens.contains(&t) && readable => {
                self.pump.receive(&mut self.endpoint, &mut self.counters, now);
            }
            Token(t) if t >= ATTACH_BASE => {
                let (trainers, mut ctx) = self.trainers_ctx();
                trainers.on_token(t, &mut ctx, now);
            }
            Token(t) if self.attach.owns(t) => {
                if let Some(att) = self.attach.on_token(t, self.poll.registry(), &mut self.counters) {
                    let (trainers, mut ctx) = self.trainers_ctx();
                    trainers.add(att, &mut ctx);
                }
            }
            Token(t) if self.admin_socket.owns(t) => {
                if let Some((conn, request)) =
                    self.admin_socket.on_token(t, self.poll.registry(), &mut self.counters)
                {
                    self.answer_admin(conn, &request);
                }
            }
            _ => {}
        }
    }

    /// The trainers, and what their handlers need of the rest of the service.
    fn trainers_ctx(&mut self) -> (&mut Trainers, trainers::Ctx<'_>) {
        let ctx = trainers::Ctx {
            cfg: &self.cfg,
            endpoint: &mut self.endpoint,
            counters: &mut self.counters,
            registry: self.poll.registry(),
            draining: self.draining.is_some(),
            start: self.start,
        };
        (&mut self.trainers, ctx)
    }

    fn on_signals(&mut self) {
        for sig in self.signals.pending() {
            match sig {
                SIGTERM | SIGINT if self.draining.is_none() => {
                    log::info!(
                        "signal {sig}: draining {} ops in flight, accepting no new ones",
                        self.endpoint.ops_in_flight() + self.trainers.ops()
                    );
                    self.draining = Some(StdInstant::now());
                    self.operations.notifier.notify("STOPPING=1\nSTATUS=draining");
                }
                SIGHUP => {
                    self.reload();
                }
                _ => {}
            }
        }
    }

    /// Answer an admin request its peer may make (`admin_socket` checked).
    fn answer_admin(&mut self, conn: usize, request: &Request) {
        let reply = match request {
            Request::Stats => self.stats_json(),
            Request::Status => admin::to_json(&self.status()),
            Request::Reload => admin::to_json(&self.reload()),
            Request::Report(id) => self.report_json(*id),
            Request::Invalid(e) => admin::to_json(e),
        };
        self.admin_socket.reply(conn, &reply, self.poll.registry());
    }

    /// Close the local connections past their deadline (every [`SWEEP_EVERY`]).
    fn sweep(&mut self) {
        if self.swept.elapsed() < SWEEP_EVERY {
            return;
        }
        let now = StdInstant::now();
        self.swept = now;
        self.attach.expire(now, self.poll.registry(), &mut self.counters);
        self.admin_socket.expire(now, self.poll.registry(), &mut self.counters);
    }

    /// Hand the endpoint's events to the trainers, the admin protocol and the metrics.
    fn deliver_events(&mut self) {
        while let Some(ev) = self.endpoint.poll_event() {
            match ev {
                Event::OpComplete { id, result, report } => {
                    self.counters.ops_completed += 1;
                    let Some(op) = self.trainers.finish(id) else { continue };
                    let min = report.min_delivered_fraction();
                    let done = op.done(&result, (min * 1e6).round() as u32, report.repairs_sent);
                    self.admin.record(OpRecord {
                        op: id.seq,
                        tensor: id.tensor,
                        collective: op.opcode.name().to_owned(),
                        len: result.len(),
                        duration_us: report.duration().as_micros() as u64,
                        min_delivered: min,
                        repairs_sent: report.repairs_sent,
                        deadline_fired: report.deadline_fired,
                        error: None,
                    });
                    self.trainers.complete(&op, done, &mut self.counters);
                    self.endpoint.recycle(result);
                    self.operations.op_completed(&report, op.budget_ppm);
                    self.admin.keep_report(id, op.opcode.name(), report);
                }
                Event::OpFailed { id, error } => {
                    self.counters.ops_failed += 1;
                    log::warn!("op {}/{} failed: {error}", id.seq, id.tensor);
                    let status = trainer_status(&error);
                    let op = self.trainers.finish(id);
                    self.admin.record(OpRecord {
                        op: id.seq,
                        tensor: id.tensor,
                        collective: op.as_ref().map_or("unknown", |o| o.opcode.name()).to_owned(),
                        len: 0,
                        duration_us: 0,
                        min_delivered: 0.0,
                        repairs_sent: 0,
                        deadline_fired: false,
                        error: Some(error.to_string()),
                    });
                    if let Some(op) = op {
                        let why = error.to_string();
                        let done = Completion::failed(status, op.first_at.elapsed(), &why);
                        self.trainers.complete(&op, done, &mut self.counters);
                    }
                }
                Event::OpAwaitsLate { id, ranks } => log::warn!(
                    "op {}/{} waits for ranks {ranks:?}: up but not started on it (their trainers are late); \
                     it fails only if they go down, leave the run or the op deadline ({} ms) passes",
                    id.seq,
                    id.tensor,
                    self.cfg.loss.op_deadline_ms
                ),
                Event::PeerUp { rank, generation } => log::info!("peer {rank} up (generation {generation})"),
                Event::PeerDown { rank } => log::warn!("peer {rank} silent: marked down"),
                Event::PeerLeft { rank } => {
                    log::warn!("peer {rank} announced its shutdown: marked down; its in-flight ops failed")
                }
                Event::PeerRestarted { rank, old, new } => {
                    log::warn!("peer {rank} restarted (generation {old} -> {new}); its in-flight ops failed")
                }
                Event::PeerIncompatible { rank, mismatch } => {
                    log::error!("{} {mismatch}; its datagrams are refused", peer_name(&self.cfg, rank))
                }
            }
        }
    }

    /// The service as the admin replies and metrics see it.
    fn view(&self) -> View<'_> {
        View {
            cfg: &self.cfg,
            endpoint: &self.endpoint,
            datapath: self.pump.datapath(),
            peers: self.pump.peers(),
            counters: &self.counters,
            trainers: &self.trainers,
            attach: &self.attach,
            admin_connections: self.admin_socket.open(),
            rate_cuts: self.endpoint.rate_cuts(),
            draining: self.draining.is_some(),
        }
    }

    /// Re-read the configuration file and apply what can change at runtime
    /// (see [`crate::hot_reload`]). Logged, counted, and told to systemd.
    pub fn reload(&mut self) -> ReloadOutcome {
        self.operations.reload(Reloadable {
            cfg: &mut self.cfg,
            endpoint: &mut self.endpoint,
            pump: &mut self.pump,
            counters: &mut self.counters,
            start: self.start,
        })
    }

    /// What arrived from whom for a recently completed op (the last 1024 are
    /// kept): per reduce-scatter sender the missing chunks of this rank's shard,
    /// per gather owner the agreed mask, and this rank's own mask.
    pub fn report_json(&self, id: OpId) -> serde_json::Value {
        match self.admin.report(id, self.cfg.rank()) {
            Ok(r) => admin::to_json(&r),
            Err(e) => admin::to_json(&e),
        }
    }

    /// Version, datapath, peers and trainers (for `dlcpctl status`).
    pub fn status(&self) -> StatusReply {
        admin::status(&self.view(), self.operations.status(&self.cfg, &self.counters))
    }

    /// [`Service::status`] as JSON.
    pub fn status_json(&self) -> serde_json::Value {
        admin::to_json(&self.status())
    }

    /// Everything the daemon counts, as JSON (for `dlcpctl stats --json`).
    pub fn stats_json(&self) -> serde_json::Value {
        self.admin.stats_json(&self.view())
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
        self.pump.datapath().stats()
    }

    /// Trainers attached now.
    pub fn trainers(&self) -> usize {
        self.trainers.count()
    }

    /// The address the metrics endpoint listens on, if it does.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.operations.metrics_addr()
    }

    /// The running configuration (after any reloads).
    pub fn config(&self) -> &Config {
        &self.cfg
    }
}

/// How a log line names the peer `rank` (as the datapath knew the sender):
/// its rank and configured address, or an unconfigured address.
fn peer_name(cfg: &Config, rank: Option<u32>) -> String {
    match rank.and_then(|r| cfg.peers.get(r as usize)) {
        Some(p) => format!("rank {} ({})", p.rank, p.socket_addr()),
        None => "an address that is no configured peer".to_owned(),
    }
}

/// The status a trainer gets for an op that failed with `error` (its text,
/// the error's Display, goes with it). A peer's failure notice
/// ([`OpError::PeerFailed`]) maps by the reason the peer gave: an op that
/// timed out or missed its deadline there is a timeout here (retry or abort
/// the step); a peer that left, is incompatible or whose run ended is a peer
/// down; a failure passed on from yet another rank is a timeout too, the
/// usual root cause.
fn trainer_status(error: &OpError) -> Status {
    match error {
        OpError::Timeout { .. } | OpError::NoRun { .. } | OpError::Deadline { .. } => Status::Timeout,
        OpError::PeerRestarted { .. } | OpError::PeerLeft { .. } | OpError::PeerIncompatible { .. } => {
            Status::PeerDown
        }
        OpError::PeerFailed { reason, .. } => match reason {
            FailReason::Timeout | FailReason::Deadline | FailReason::PeerFailed => Status::Timeout,
            FailReason::PeerLeft | FailReason::PeerIncompatible | FailReason::Other => Status::PeerDown,
        },
        OpError::RunEnded { .. } => Status::Shutdown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer's failure notice reaches the trainer with the status its
    /// reason calls for, and a text naming the rank and the reason.
    #[test]
    fn a_peer_failure_maps_to_a_status_by_its_reason() {
        for (reason, status) in [
            (FailReason::Timeout, Status::Timeout),
            (FailReason::Deadline, Status::Timeout),
            (FailReason::PeerFailed, Status::Timeout),
            (FailReason::PeerLeft, Status::PeerDown),
            (FailReason::PeerIncompatible, Status::PeerDown),
            (FailReason::Other, Status::PeerDown),
        ] {
            assert_eq!(trainer_status(&OpError::PeerFailed { rank: 2, reason }), status, "{reason:?}");
        }
        let e = OpError::PeerFailed { rank: 2, reason: FailReason::Timeout };
        assert_eq!(e.to_string(), "rank 2 gave up on this op: no progress within its hard timeout");
        assert_eq!(trainer_status(&OpError::PeerLeft { rank: 1 }), Status::PeerDown);
        assert_eq!(trainer_status(&OpError::RunEnded { epoch: 1 }), Status::Shutdown);
    }
}
