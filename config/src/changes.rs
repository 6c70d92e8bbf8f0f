//! Changes between two configurations and their reload classes: which
//! settings a running daemon can take on `SIGHUP` / `dlcpctl reload`, and which
//! need a restart. (What the daemon then does with them is `dlcp::hot_reload`.)

use std::fmt;

use crate::Config;

/// When a changed setting takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reload {
    /// Applied by a running daemon on reload (between ops; an op in flight keeps
    /// the values it started with).
    Runtime,
    /// Needs the daemon to be restarted (the job's ranks see a new generation).
    Restart,
}

impl fmt::Display for Reload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reload::Runtime => "runtime",
            Reload::Restart => "restart",
        })
    }
}

use Reload::{Restart, Runtime};

/// Every setting (dotted path, array indices left out) with its reload class.
pub const SETTINGS: &[(&str, Reload)] = &[
    ("node.rank", Restart),
    ("node.job_id", Restart),
    ("node.job_secret", Restart),
    ("node.job_secret_file", Restart),
    ("node.generation", Restart),
    ("peers.rank", Restart),
    ("peers.address", Restart),
    ("peers.port", Restart),
    ("network.bind_address", Restart),
    ("network.mtu", Restart),
    ("network.chunk_bytes", Restart),
    ("network.flow_window_bytes", Restart),
    ("network.paths", Restart),
    ("network.heartbeat_interval_ms", Runtime),
    ("network.peer_timeout_ms", Runtime),
    ("datapath.kind", Restart),
    ("datapath.socket.gso", Restart),
    ("datapath.socket.gso_max_segments", Restart),
    ("datapath.socket.batch", Restart),
    ("datapath.socket.send_buffer_bytes", Restart),
    ("datapath.socket.recv_buffer_bytes", Restart),
    ("datapath.dpdk.eal_args", Restart),
    ("datapath.dpdk.port_id", Restart),
    ("datapath.dpdk.rx_queues", Restart),
    ("datapath.dpdk.tx_queues", Restart),
    ("datapath.dpdk.rx_burst", Restart),
    ("datapath.dpdk.tx_burst", Restart),
    ("datapath.dpdk.rx_ring_size", Restart),
    ("datapath.dpdk.tx_ring_size", Restart),
    ("datapath.dpdk.mbuf_pool_size", Restart),
    ("datapath.dpdk.class_tx_queue", Restart),
    ("datapath.dpdk.neighbours", Restart),
    ("priority.scatter_band", Runtime),
    ("priority.gather_band", Runtime),
    ("priority.layer_levels", Runtime),
    ("priority.magnitude_levels", Runtime),
    ("priority.droppable", Runtime),
    ("priority.dscp", Runtime),
    ("priority.so_priority", Runtime),
    ("loss.budget", Runtime),
    ("loss.gather_budget", Runtime),
    ("loss.fill", Runtime),
    ("loss.rescale", Runtime),
    ("loss.deadline_min_ms", Runtime),
    ("loss.deadline_max_ms", Runtime),
    ("loss.hard_timeout_ms", Runtime),
    ("loss.op_deadline_ms", Runtime),
    ("loss.probe_timeout_min_ms", Runtime),
    ("loss.probe_timeout_max_ms", Runtime),
    ("loss.initial_per_chunk_us", Runtime),
    ("loss.ack_delay_ms", Runtime),
    ("pacing.rate_mbps", Runtime),
    ("pacing.burst_bytes", Runtime),
    ("pacing.adapt", Runtime),
    ("shm.arena_bytes", Restart),
    ("shm.ring_entries", Restart),
    ("shm.max_tensor_bytes", Restart),
    ("shm.early_buffer_bytes", Restart),
    ("shm.max_attachments", Restart),
    ("shm.max_attachments_per_user", Restart),
    ("shm.max_ops_in_flight", Restart),
    ("control.socket_path", Restart),
    ("control.socket_mode", Restart),
    ("control.socket_group", Restart),
    ("control.max_admin_connections", Restart),
    ("control.max_pending_attaches", Restart),
    ("control.request_timeout_ms", Restart),
    ("metrics.enabled", Restart),
    ("metrics.address", Restart),
    ("security.packet_auth", Restart),
    ("log.level", Runtime),
];

/// `peers[2].address` → `peers.address`.
fn normalize(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut depth = 0usize;
    for c in path.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// The reload class of a dotted path (`loss.budget`, `peers[1].port`,
/// `priority.dscp[3]`, or a whole table such as `pacing`). A table is
/// [`Reload::Runtime`] only if every setting in it is; an unknown path is
/// [`Reload::Restart`] (the safe answer).
pub fn reload_class(path: &str) -> Reload {
    let p = normalize(path);
    if let Some(&(_, r)) = SETTINGS.iter().find(|(s, _)| *s == p) {
        return r;
    }
    let prefix = format!("{p}.");
    let mut under = SETTINGS.iter().filter(|(s, _)| p.is_empty() || s.starts_with(&prefix)).peekable();
    if under.peek().is_none() {
        return Restart;
    }
    under.map(|&(_, r)| r).max().unwrap_or(Restart)
}

/// One setting that differs between two configurations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Dotted path, e.g. `loss.budget` or `peers[3].address`.
    pub path: String,
    /// When the change can take effect.
    pub reload: Reload,
    /// The old value as TOML (`None`: absent); secrets show as `"<redacted>"`.
    pub old: Option<String>,
    /// The new value as TOML (`None`: absent); secrets show as `"<redacted>"`.
    pub new: Option<String>,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".to_owned());
        write!(f, "{}: {} -> {} ({})", self.path, show(&self.old), show(&self.new), self.reload)
    }
}

/// True if any change needs a restart.
pub fn needs_restart(changes: &[Change]) -> bool {
    changes.iter().any(|c| c.reload == Restart)
}

/// Flatten a TOML value into `(path, rendered value)` leaves. Arrays of tables
/// are indexed (`peers[0].rank`); other arrays are single leaves.
fn flatten(v: &toml::Value, prefix: &str, out: &mut Vec<(String, String)>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let p = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(v, &p, out);
            }
        }
        toml::Value::Array(a) if !a.is_empty() && a.iter().all(toml::Value::is_table) => {
            for (i, v) in a.iter().enumerate() {
                flatten(v, &format!("{prefix}[{i}]"), out);
            }
        }
        other => out.push((prefix.to_owned(), other.to_string())),
    }
}

/// Schema order of a path: section as in [`SETTINGS`], then array element, then
/// setting as in [`SETTINGS`] (unknown paths last).
fn schema_order(path: &str) -> (usize, usize, usize) {
    let norm = normalize(path);
    let section = norm.split('.').next().unwrap_or("");
    let sec = SETTINGS.iter().position(|(s, _)| s.split('.').next() == Some(section)).unwrap_or(usize::MAX);
    let idx = path
        .split_once('[')
        .and_then(|(_, r)| r.split_once(']'))
        .and_then(|(i, _)| i.parse().ok())
        .unwrap_or(0);
    let pos = SETTINGS.iter().position(|(s, _)| *s == norm).unwrap_or(usize::MAX);
    (sec, idx, pos)
}

/// The effective settings of a config as `(path, value)` leaves, in schema order.
pub(crate) fn leaves(cfg: &Config) -> Vec<(String, String)> {
    let mut out = Vec::new();
    match toml::Value::try_from(cfg) {
        Ok(v) => flatten(&v, "", &mut out),
        Err(e) => out.push(("(unserializable)".to_owned(), e.to_string())),
    }
    out.sort_by_cached_key(|(p, _)| schema_order(p));
    out
}

/// The changes from `old` to `new` (see [`Config::diff`]).
pub(crate) fn diff(old: &Config, new: &Config) -> Vec<Change> {
    let a = leaves(old);
    let b = leaves(new);
    let mut changes = Vec::new();
    let mut push = |path: &str, o: Option<&String>, n: Option<&String>| {
        changes.push(Change {
            path: path.to_owned(),
            reload: reload_class(path),
            old: o.cloned(),
            new: n.cloned(),
        });
    };
    for (path, o) in &a {
        match b.iter().find(|(p, _)| p == path) {
            Some((_, n)) if n == o => {}
            Some((_, n)) => push(path, Some(o), Some(n)),
            None => push(path, Some(o), None),
        }
    }
    for (path, n) in &b {
        if !a.iter().any(|(p, _)| p == path) {
            push(path, None, Some(n));
        }
    }
    // The serialized form redacts the secret: compare the bytes themselves.
    if old.job_secret() != new.job_secret() && !changes.iter().any(|c| c.path.starts_with("node.job_secret"))
    {
        let r = Some(format!("{:?}", crate::schema::REDACTED));
        changes.push(Change { path: "node.job_secret".into(), reload: Restart, old: r.clone(), new: r });
    }
    changes.sort_by_cached_key(|c| schema_order(&c.path));
    changes
}
