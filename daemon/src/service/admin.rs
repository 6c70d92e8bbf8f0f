//! The admin protocol that `dlcpctl` speaks: connect to the control socket's
//! path with `.admin` appended ([`admin_path`]), send one line (`stats`,
//! `status`, `reload` or `report OP TENSOR`), read one JSON document until EOF.
//! [`Admin`] owns the listening socket and what only the admin protocol shows
//! (the recent ops and their reports); the replies are built from a [`View`]
//! of the service.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration as StdDuration;

use dlcp_proto::endpoint::{OpId, OpReport};
use mio::{Interest, Registry, Token};
use serde::Serialize;

use super::view::View;

/// Recent ops and reports kept for `stats` and `report`.
const KEEP: usize = 1024;

/// Path of the admin socket that `dlcpctl` talks to: the control socket's path
/// with `.admin` appended. Protocol: connect, send one line (`stats` or
/// `status`), read one JSON document until EOF.
pub fn admin_path(control: &Path) -> PathBuf {
    let mut p = control.as_os_str().to_owned();
    p.push(".admin");
    p.into()
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

/// One admin request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Request {
    /// `stats`: every counter.
    Stats,
    /// `status`: version, datapath, peers, trainers, operations.
    Status,
    /// `reload`: re-read the configuration file.
    Reload,
    /// `report OP TENSOR`: what arrived from whom for a completed op.
    Report(OpId),
    /// Not a request this daemon knows; the reply says why.
    Invalid(String),
}

impl Request {
    /// Parse one request line (surrounding whitespace ignored).
    pub(super) fn parse(line: &str) -> Request {
        let req = line.trim();
        let words: Vec<&str> = req.split_whitespace().collect();
        match words.as_slice() {
            ["stats"] => Request::Stats,
            ["status"] => Request::Status,
            ["reload"] => Request::Reload,
            ["report", op, tensor] => match (op.parse(), tensor.parse()) {
                (Ok(seq), Ok(tensor)) => Request::Report(OpId { seq, tensor }),
                _ => Request::Invalid("usage: report OP TENSOR".to_owned()),
            },
            _ => Request::Invalid(format!(
                "unknown request {req:?} (allowed: stats, status, reload, report OP TENSOR)"
            )),
        }
    }
}

/// One accepted admin connection with its request, waiting for the reply.
pub(super) struct Connection {
    stream: std::os::unix::net::UnixStream,
    request: Request,
}

impl Connection {
    /// What was asked.
    pub(super) fn request(&self) -> &Request {
        &self.request
    }

    /// Send the reply and close.
    pub(super) fn reply(mut self, reply: &serde_json::Value) {
        let _ = self.stream.write_all(reply.to_string().as_bytes());
    }
}

/// The admin socket, and what only the admin protocol shows.
pub(super) struct Admin {
    listener: mio::net::UnixListener,
    path: PathBuf,
    recent: VecDeque<OpRecord>,
    reports: BTreeMap<OpId, Box<OpReport>>,
}

impl Admin {
    /// Listen on `path` (a stale socket file there is replaced) with file mode `mode`.
    pub(super) fn bind(path: PathBuf, mode: u32) -> io::Result<Admin> {
        let _ = std::fs::remove_file(&path);
        let listener = mio::net::UnixListener::bind(&path)?;
        let admin = Admin { listener, path, recent: VecDeque::new(), reports: BTreeMap::new() };
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&admin.path, std::fs::Permissions::from_mode(mode))?;
        }
        Ok(admin)
    }

    /// The socket's path.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Watch the socket for connections under `token`.
    pub(super) fn register(&mut self, registry: &Registry, token: Token) -> io::Result<()> {
        registry.register(&mut self.listener, token, Interest::READABLE)
    }

    /// The next waiting connection and its request, if any. A short blocking
    /// exchange: one request line (200 ms to arrive), one JSON reply.
    pub(super) fn accept(&mut self) -> Option<Connection> {
        let (stream, _) = match self.listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e) => {
                log::warn!("admin socket: {e}");
                return None;
            }
        };
        let fd: std::os::fd::OwnedFd = stream.into();
        let mut s = std::os::unix::net::UnixStream::from(fd);
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(StdDuration::from_millis(200)));
        let _ = s.set_write_timeout(Some(StdDuration::from_millis(500)));
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap_or(0);
        let request = Request::parse(&String::from_utf8_lossy(&buf[..n]));
        Some(Connection { stream: s, request })
    }

    /// Keep `r` for `stats` (the last 1024).
    pub(super) fn record(&mut self, r: OpRecord) {
        if self.recent.len() >= KEEP {
            self.recent.pop_front();
        }
        self.recent.push_back(r);
    }

    /// Keep `report` for `report OP TENSOR` (the last 1024).
    pub(super) fn keep_report(&mut self, id: OpId, report: Box<OpReport>) {
        if self.reports.len() >= KEEP {
            self.reports.pop_first();
        }
        self.reports.insert(id, report);
    }

    /// The reply to `report OP TENSOR` on rank `rank`: per reduce-scatter
    /// sender the missing chunks of this rank's shard, per gather owner the
    /// agreed mask, and this rank's own mask.
    pub(super) fn report_json(&self, id: OpId, rank: u32) -> serde_json::Value {
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
            "rank": rank,
            "duration_us": r.duration().as_micros() as u64,
            "own_chunks": r.own_chunks,
            "own_mask": r.own_mask.iter_ones().collect::<Vec<_>>(),
            "scatter": r.scatter.iter().map(transfer).collect::<Vec<_>>(),
            "gather": r.gather.iter().map(transfer).collect::<Vec<_>>(),
            "repairs_sent": r.repairs_sent,
            "deadline_fired": r.deadline_fired,
        })
    }

    /// Everything the daemon counts, as JSON (for `dlcpctl stats --json`).
    pub(super) fn stats_json(&self, v: &View<'_>) -> serde_json::Value {
        let s = v.endpoint.stats();
        let r = &s.rejected;
        let dr = &s.rx_dropped;
        let count = |c: dlcp_proto::endpoint::PacketCount| serde_json::json!({ "packets": c.packets, "bytes": c.bytes });
        let d = v.datapath.stats();
        serde_json::json!({
            "version": crate::VERSION,
            "rank": v.cfg.rank(),
            "world": v.cfg.world_size(),
            "datapath": v.datapath.describe(),
            "trainers": v.trainers.count(),
            "pacing_rate_bytes_per_sec": v.endpoint.pacing_rate(),
            "pacing_rate_cuts": v.rate_cuts,
            "service": v.counters,
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
                "closed_within_budget": s.closed_within_budget, "ops_in_flight": v.endpoint.ops_in_flight(),
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
                "detail": v.datapath.detail_json(),
            },
            "shm": {
                "attached": v.trainers.shm_attached(),
                "rejected_descriptors": v.trainers.rejected_descriptors(),
            },
            "recent_ops": self.recent.iter().rev().take(64).collect::<Vec<_>>(),
        })
    }
}

impl Drop for Admin {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The reply to `status`: version, datapath, peers and trainers, with `ops`
/// (the operations part) inside.
pub(super) fn status_json(v: &View<'_>, ops: serde_json::Value) -> serde_json::Value {
    let peers: Vec<_> = (0..v.cfg.world_size())
        .map(|r| {
            serde_json::json!({
                "rank": r,
                "address": v.peers[r as usize].to_string(),
                "generation": v.endpoint.peer_generation(r),
                "up": r == v.cfg.rank() || v.endpoint.peer_up(r),
                "self": r == v.cfg.rank(),
            })
        })
        .collect();
    serde_json::json!({
        "version": crate::VERSION,
        "rank": v.cfg.rank(),
        "world": v.cfg.world_size(),
        "job": v.cfg.node.job_id,
        "generation": v.endpoint.config().generation,
        "datapath": v.datapath.describe(),
        "trainers": v.trainers.count(),
        "ops_in_flight": v.endpoint.ops_in_flight(),
        "draining": v.draining,
        "peers": peers,
        "ops": ops,
    })
}

/// The reply to a request that could not be served.
pub(super) fn error_json(error: &str) -> serde_json::Value {
    serde_json::json!({ "error": error })
}

/// The inverse of the `report` reply (what `dlcpctl report --json` prints):
/// rebuild the parts of an owner's [`OpReport`] that
/// [`dlcp_proto::oracle::recompute`] needs — per sender the delivered chunks
/// of the owner's shard, and the owner's own mask. Timing fields are zero.
/// Panics on JSON that the `report` reply did not produce (it is for tests and tools).
pub fn report_from_json(v: &serde_json::Value) -> OpReport {
    use dlcp_proto::bitmap::Bitmap;
    use dlcp_proto::endpoint::TransferReport;
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
