//! From the configuration to the service's subsystems: the protocol endpoint's
//! settings, the generation, the trainers' control socket (group, policy,
//! shared-memory geometry), the timerfd, and the service's clock. What
//! [`Service::new`](super::Service::new) assembles; also what a reload
//! recomputes ([`endpoint_config`]).

use std::io;
use std::os::fd::OwnedFd;
use std::time::Instant as StdInstant;

use dlcp_config::Config;
use dlcp_proto::endpoint::{EndpointConfig, Timers};
use dlcp_proto::rate::RateConfig;
use dlcp_proto::time::Instant;

use crate::shm::{ServerConfig, ShmServer};

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
    /// `control.socket_group` names no group.
    #[error("configuration: {0}")]
    SocketGroup(#[from] SocketGroupError),
    /// `[shm]` describes rings or an arena the channel cannot have.
    #[error("configuration: shm geometry: {0}")]
    Geometry(#[source] crate::shm::layout::GeometryError),
    /// The operating system gave no random bytes for the packet-key session.
    #[error("getrandom (packet-key session): {0}")]
    Session(#[source] io::Error),
}

/// Why `control.socket_group` gives no gid.
#[derive(Debug, thiserror::Error)]
pub enum SocketGroupError {
    /// `/etc/group` could not be read.
    #[error("/etc/group: {0}")]
    GroupFile(#[source] io::Error),
    /// No group of that name in `/etc/group`.
    #[error("control.socket_group {group:?}: no such group in /etc/group")]
    NoSuchGroup {
        /// The configured name.
        group: String,
    },
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

/// The generation this daemon announces: `node.generation`, or
/// [`auto_generation`].
pub(super) fn generation(cfg: &Config) -> u32 {
    match cfg.node.generation {
        dlcp_config::schema::Generation::Fixed(g) => g,
        dlcp_config::schema::Generation::Auto => auto_generation(),
    }
}

/// A fresh packet-key session: 64 random bits from the operating system
/// (`getrandom(2)`), drawn at every start, so a restarted daemon never reuses
/// a packet key even when its generation is fixed in the configuration (see
/// `dlcp_proto::wire::mac`).
pub fn session() -> io::Result<u64> {
    let mut b = [0u8; 8];
    let mut filled = 0;
    while filled < b.len() {
        filled += rustix::rand::getrandom(&mut b[filled..], rustix::rand::GetRandomFlags::empty())?;
    }
    Ok(u64::from_ne_bytes(b))
}

/// The protocol endpoint's configuration from the daemon's, for this
/// incarnation's `generation` and `session`.
pub fn endpoint_config(cfg: &Config, generation: u32, session: u64) -> EndpointConfig {
    let (rank, world, job) = (cfg.rank(), cfg.world_size(), cfg.node.job_id);
    let mut e = EndpointConfig::new(rank, world, job, generation, session, cfg.job_key());
    e.chunk_bytes = cfg.chunk_bytes() as usize;
    e.flow = cfg.network.flow(cfg.chunk_bytes());
    e.paths = cfg.network.paths;
    e.classifier = cfg.classifier();
    e.timers = timers(cfg);
    e.pacing_rate = cfg.pacing.rate_bytes_per_sec().unwrap_or(0);
    // At least 100 µs of traffic per bucket, so the loop is not woken for every
    // datagram at high rates.
    e.pacing_burst = u64::from(cfg.pacing.burst_bytes).max(e.pacing_rate / 10_000);
    e.rate_adapt = rate_adaptation(&cfg.pacing);
    e.early_buffer_bytes = usize::try_from(cfg.shm.early_buffer_bytes).unwrap_or(usize::MAX);
    e
}

/// Timer settings from the `[loss]` and `[network]` sections.
pub fn timers(cfg: &Config) -> Timers {
    let l = &cfg.loss;
    let t = Timers::default();
    Timers {
        hard_timeout: l.hard_timeout(),
        op_deadline: l.op_deadline(),
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
        ack_delay: l.ack_delay(),
    }
}

/// The service's protocol clock: the time since `start` (taken when the
/// service was set up) as the endpoint's [`Instant`].
pub(super) fn since(start: StdInstant) -> Instant {
    Instant::from_nanos(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// The trainers' control socket, bound as `[control]` and `[shm]` say, for
/// members of `group` (see [`peer_policy`]): this job's trainers only, at most
/// `shm.max_attachments` (and per user) at once, tensors of at most
/// `shm.max_tensor_bytes`.
pub(super) fn shm_server(cfg: &Config, group: Option<u32>) -> Result<ShmServer, ServiceError> {
    let mut sc = ServerConfig::new(cfg.control.socket_path.clone(), cfg.control.mode());
    sc.policy = peer_policy(group);
    sc.geometry = crate::shm::Geometry::new(cfg.shm.ring_entries, cfg.shm.ring_entries, cfg.shm.arena_bytes)
        .map_err(ServiceError::Geometry)?;
    // Checked when a trainer registers, before its segment is made.
    sc.job_id = Some(u64::from(cfg.node.job_id));
    sc.max_attachments = cfg.shm.max_attachments as usize;
    sc.max_attachments_per_user = cfg.shm.max_attachments_per_user as usize;
    sc.handshake_timeout = cfg.control.request_timeout();
    // Told to every trainer in the attach reply (its world size and global rank).
    sc.place = crate::shm::JobPlace { node_rank: cfg.rank(), nodes: cfg.world_size() };
    // Enforced on every submission (the trainer's completion says which rule).
    sc.limits.max_tensor_bytes = cfg.shm.max_tensor_bytes;
    sc.limits.nodes = cfg.world_size();
    ShmServer::bind(sc)
        .map_err(|e| ServiceError::Control { path: cfg.control.socket_path.display().to_string(), source: e })
}

/// A non-blocking monotonic timerfd, for sub-millisecond wakeups (epoll's own
/// timeout has millisecond resolution, too coarse for pacing and probe timers).
pub(super) fn timerfd() -> io::Result<OwnedFd> {
    rustix::time::timerfd_create(
        rustix::time::TimerfdClockId::Monotonic,
        rustix::time::TimerfdFlags::NONBLOCK | rustix::time::TimerfdFlags::CLOEXEC,
    )
    .map_err(io::Error::from)
}

/// The gid of `control.socket_group` (a group name from `/etc/group`, or a
/// number); `None` if unset (the sockets keep the daemon's group).
pub(super) fn socket_gid(c: &dlcp_config::Control) -> Result<Option<u32>, SocketGroupError> {
    let Some(g) = c.socket_group.as_deref() else { return Ok(None) };
    if let Ok(n) = g.parse::<u32>() {
        return Ok(Some(n));
    }
    let groups = std::fs::read_to_string("/etc/group").map_err(SocketGroupError::GroupFile)?;
    groups
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 3 && f[0] == g)
        .and_then(|f| f[2].parse().ok())
        .map(Some)
        .ok_or_else(|| SocketGroupError::NoSuchGroup { group: g.to_owned() })
}

/// Who may attach: the daemon's own user, root, and members (primary or
/// supplementary) of the sockets' group. The socket's file mode decides who can
/// connect at all; this repeats it for the processes that got through.
pub(super) fn peer_policy(group: Option<u32>) -> crate::shm::PeerPolicy {
    let mut p =
        crate::shm::PeerPolicy::same_user().with_gid(group.unwrap_or(rustix::process::getegid().as_raw()));
    p.uids.push(0);
    p
}

/// Give a socket file the configured group.
pub(super) fn chgrp(path: &std::path::Path, group: Option<u32>) -> io::Result<()> {
    match group {
        Some(g) => rustix::fs::chown(path, None, Some(rustix::fs::Gid::from_raw(g)))
            .map_err(|e| io::Error::other(format!("chgrp {} to gid {g}: {e}", path.display()))),
        None => Ok(()),
    }
}

/// Loss-driven rate adaptation as `[pacing]` says: on with `adapt = true` and
/// a rate to start from and cap at (`rate_mbps > 0`), with the protocol's
/// default rule ([`RateConfig::for_max`]).
pub fn rate_adaptation(pacing: &dlcp_config::Pacing) -> Option<RateConfig> {
    let max = pacing.rate_bytes_per_sec().unwrap_or(0);
    (pacing.adapt && max > 0).then(|| RateConfig::for_max(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(g: Option<&str>) -> dlcp_config::Control {
        dlcp_config::Control { socket_group: g.map(str::to_owned), ..dlcp_config::Control::default() }
    }

    #[test]
    fn socket_group_by_number_name_or_not_at_all() {
        assert_eq!(socket_gid(&control(None)).unwrap(), None);
        assert_eq!(socket_gid(&control(Some("4242"))).unwrap(), Some(4242));
        assert_eq!(socket_gid(&control(Some("root"))).unwrap(), Some(0));
        let e = socket_gid(&control(Some("no-such-group-dlcp"))).unwrap_err();
        assert!(
            matches!(&e, SocketGroupError::NoSuchGroup { group } if group == "no-such-group-dlcp"),
            "{e}"
        );
        assert!(e.to_string().contains("no such group"), "{e}");
        let p = peer_policy(Some(4242));
        let cred = |uid, gid| crate::shm::PeerCred { pid: 1, uid, gid };
        assert!(p.allows_peer(&cred(0, 1)), "root");
        assert!(p.allows_peer(&cred(12345, 4242)), "primary group");
        assert!(!p.allows_peer(&cred(12345, 1)));
        assert!(p.allows_peer_in(&cred(12345, 1), &[7, 4242]), "supplementary group");
        assert!(!p.allows_peer_in(&cred(12345, 1), &[7]));
    }
}
