//! The admin protocol that `dlcpctl` speaks: connect to the control socket's
//! path with `.admin` appended ([`admin_path`]), send one line (`stats`,
//! `status`, `reload` or `report OP TENSOR`), read one JSON document until EOF.
//! [`Admin`] keeps what only the admin protocol shows (the recent ops and
//! their reports); `admin_socket` serves the connections and decides who may
//! ask what. The replies are serde-derived types
//! ([`StatusReply`], [`ReportReply`], [`ErrorReply`]; `reload` replies with
//! the [`ReloadOutcome`]) built from a [`View`] of the service, except
//! `stats`, which is still rendered field by field.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use dlcp_proto::endpoint::{OpId, OpReport, TransferReport};
use dlcp_proto::stats::Label;
use serde::{Deserialize, Serialize};

use super::view::View;
use crate::hot_reload::ReloadOutcome;

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
    /// The collective (`allreduce`, `reduce-scatter`, `allgather`,
    /// `broadcast`, `barrier`; `unknown` for a failed op no local trainer waited on).
    pub collective: String,
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

/// The reply to `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReply {
    /// Version string ([`crate::VERSION`]).
    pub version: String,
    /// This daemon's rank.
    pub rank: u32,
    /// Ranks in the job.
    pub world: u32,
    /// Job id.
    pub job: u32,
    /// The generation this daemon announces.
    pub generation: u32,
    /// The datapath's description.
    pub datapath: String,
    /// `security.packet_auth`: `"aes-128-gmac"`, or `"none"` (datagrams not authenticated).
    pub packet_auth: String,
    /// Flow control's receive window in datagrams (`network.flow_window_bytes`
    /// over the datagram size; 0 = off).
    pub flow_window: u32,
    /// Trainers attached now.
    pub trainers: usize,
    /// Ops in flight on the network.
    pub ops_in_flight: usize,
    /// Ops submitted but waiting for the job's daemons to agree on their run.
    #[serde(default)]
    pub ops_held: usize,
    /// The trainers' current run, if any are attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunStatus>,
    /// True after SIGTERM/SIGINT, while ops in flight drain.
    pub draining: bool,
    /// Every rank, this one included.
    pub peers: Vec<PeerStatus>,
    /// The operations part: configuration file, metrics, reloads, systemd.
    pub ops: OperationsStatus,
}

/// The trainers' current run in [`StatusReply::run`] (see `dlcp_proto::run`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStatus {
    /// This daemon's local run number (1, 2, ... since it started).
    pub epoch: u64,
    /// The run id the job's daemons agreed on (hex), once agreed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Until agreed: why not, by rank.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<String>,
}

/// One rank in [`StatusReply::peers`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// The rank.
    pub rank: u32,
    /// Its configured address.
    pub address: String,
    /// The generation it announced, if it was heard.
    pub generation: Option<u32>,
    /// Its verified session (incarnation), hex, if verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// True if it is up (this rank always is).
    pub up: bool,
    /// True for this daemon's own rank.
    #[serde(rename = "self")]
    pub is_self: bool,
    /// Why its datagrams are refused (another wire version, packet_auth or
    /// chunk size, naming both values), until its settings agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// The operations part of [`StatusReply`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationsStatus {
    /// The configuration file the daemon runs with (reload re-reads it).
    pub config_file: Option<String>,
    /// `datapath.kind` as configured.
    pub datapath_kind: dlcp_config::schema::DatapathKind,
    /// Which datapaths this build has ([`crate::datapath_support`]).
    pub build: String,
    /// Seconds since start.
    pub uptime_s: u64,
    /// The metrics endpoint.
    pub metrics: MetricsStatus,
    /// Reloads that loaded.
    pub reloads_ok: u64,
    /// Reloads rejected.
    pub reloads_failed: u64,
    /// The last reload, if any.
    pub last_reload: Option<LastReload>,
    /// systemd notification and watchdog.
    pub systemd: SystemdStatus,
    /// `log.level` as running.
    pub log_level: String,
    /// `loss.budget` as running.
    pub budget: f64,
}

/// The metrics endpoint in [`OperationsStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsStatus {
    /// `metrics.enabled`.
    pub enabled: bool,
    /// The address it listens on, if it does.
    pub address: Option<String>,
    /// Why it does not, if it should.
    pub error: Option<String>,
}

/// The last reload in [`OperationsStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastReload {
    /// How long ago.
    pub seconds_ago: u64,
    /// What it did.
    pub outcome: ReloadOutcome,
}

/// systemd integration in [`OperationsStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemdStatus {
    /// `NOTIFY_SOCKET` is set: readiness, reload and stop are notified.
    pub notify: bool,
    /// The watchdog interval, if systemd set one.
    pub watchdog_ms: Option<u64>,
}

/// The reply to `report OP TENSOR` (what `dlcpctl report --json` prints).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportReply {
    /// Op sequence.
    pub op: u64,
    /// Tensor id.
    pub tensor: u32,
    /// The reporting rank (owner of the shard described by `own_*` and `scatter`).
    pub rank: u32,
    /// The collective (`allreduce`, `reduce-scatter`, `allgather`,
    /// `broadcast`, `barrier`); `allreduce` in a reply from a daemon older
    /// than this field.
    #[serde(default = "allreduce")]
    pub collective: String,
    /// Time from local start to completion, microseconds.
    pub duration_us: u64,
    /// When this daemon started the op (every local trainer had submitted
    /// it), in microseconds since the daemon started (its monotonic clock:
    /// comparable between the reports of one daemon process, not across hosts
    /// or restarts). 0 in a reply from a daemon older than this field.
    #[serde(default)]
    pub started_us: u64,
    /// When the op completed on this daemon (its completion went to the
    /// trainers), on the clock of `started_us`; `finished_us - started_us` is
    /// `duration_us`.
    #[serde(default)]
    pub finished_us: u64,
    /// Chunks of this rank's shard.
    pub own_chunks: u32,
    /// The chunks of this rank's shard that were zero-filled everywhere.
    pub own_mask: Vec<u32>,
    /// Reduce-scatter into this rank's shard: one per other rank.
    pub scatter: Vec<TransferReply>,
    /// All-gather of other ranks' shards: one per other rank.
    pub gather: Vec<TransferReply>,
    /// Repair DATA packets this rank sent for the op.
    pub repairs_sent: u32,
    /// True if any receive deadline fired during the op.
    pub deadline_fired: bool,
}

/// One transfer in [`ReportReply`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferReply {
    /// The sending rank (for gather: the shard's owner).
    pub peer: u32,
    /// Chunks in the transfer.
    pub chunks: u32,
    /// Chunks that did not arrive before the transfer closed.
    pub missing: Vec<u32>,
    /// Gather only: the agreed mask of zero-filled chunks.
    pub mask: Option<Vec<u32>>,
    /// Chunks that arrived as repairs.
    pub repaired: u32,
    /// True if the adaptive deadline fired.
    pub deadline_fired: bool,
    /// Fraction of chunks whose data is in the result.
    pub delivered_fraction: f64,
}

/// What a `report` reply without a `collective` was.
fn allreduce() -> String {
    "allreduce".to_owned()
}

impl ReportReply {
    /// The reply for `report` of rank `rank`, of an op of `collective`.
    pub fn new(r: &OpReport, rank: u32, collective: &str) -> ReportReply {
        ReportReply {
            op: r.id.seq,
            tensor: r.id.tensor,
            rank,
            collective: collective.to_owned(),
            duration_us: r.duration().as_micros() as u64,
            started_us: r.started.as_nanos() / 1000,
            finished_us: r.finished.as_nanos() / 1000,
            own_chunks: r.own_chunks,
            own_mask: r.own_mask.iter_ones().collect(),
            scatter: r.scatter.iter().map(TransferReply::from).collect(),
            gather: r.gather.iter().map(TransferReply::from).collect(),
            repairs_sent: r.repairs_sent,
            deadline_fired: r.deadline_fired,
        }
    }
}

impl From<&TransferReport> for TransferReply {
    fn from(t: &TransferReport) -> TransferReply {
        TransferReply {
            peer: t.peer,
            chunks: t.chunks,
            missing: t.delivered.iter_zeros().collect(),
            mask: t.mask.as_ref().map(|m| m.iter_ones().collect()),
            repaired: t.repaired,
            deadline_fired: t.deadline_fired,
            delivered_fraction: t.delivered_fraction(),
        }
    }
}

/// The reply to a request that could not be served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// Why.
    pub error: String,
}

/// One admin request. (Public only for the fuzz targets in `fuzz/`, through
/// [`crate::service::fuzzing`].)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `stats`: every counter.
    Stats,
    /// `status`: version, datapath, peers, trainers, operations.
    Status,
    /// `reload`: re-read the configuration file.
    Reload,
    /// `report OP TENSOR`: what arrived from whom for a completed op.
    Report(OpId),
    /// Not a request this daemon knows: the reply.
    Invalid(ErrorReply),
}

impl Request {
    /// Parse one request line (surrounding whitespace ignored).
    pub fn parse(line: &str) -> Request {
        let req = line.trim();
        let words: Vec<&str> = req.split_whitespace().collect();
        match words.as_slice() {
            ["stats"] => Request::Stats,
            ["status"] => Request::Status,
            ["reload"] => Request::Reload,
            ["report", op, tensor] => match (op.parse(), tensor.parse()) {
                // The latest run's op of that sequence and tensor (run 0: any).
                (Ok(seq), Ok(tensor)) => Request::Report(OpId { run: 0, seq, tensor }),
                _ => Request::Invalid(ErrorReply { error: "usage: report OP TENSOR".to_owned() }),
            },
            _ => Request::Invalid(ErrorReply {
                error: format!("unknown request {req:?} (allowed: stats, status, reload, report OP TENSOR)"),
            }),
        }
    }
}

/// What only the admin protocol shows: the recent ops and their reports.
/// (The socket and its connections are `admin_socket`'s.)
pub(super) struct Admin {
    recent: VecDeque<OpRecord>,
    reports: BTreeMap<OpId, (&'static str, Box<OpReport>)>,
}

impl Admin {
    /// Nothing recorded yet.
    pub(super) fn new() -> Admin {
        Admin { recent: VecDeque::new(), reports: BTreeMap::new() }
    }

    /// Keep `r` for `stats` (the last 1024).
    pub(super) fn record(&mut self, r: OpRecord) {
        if self.recent.len() >= KEEP {
            self.recent.pop_front();
        }
        self.recent.push_back(r);
    }

    /// Keep `report` of an op of `collective` for `report OP TENSOR` (the last 1024).
    pub(super) fn keep_report(&mut self, id: OpId, collective: &'static str, report: Box<OpReport>) {
        if self.reports.len() >= KEEP {
            self.reports.pop_first();
        }
        self.reports.insert(id, (collective, report));
    }

    /// The reply to `report OP TENSOR` on rank `rank`: per reduce-scatter
    /// sender the missing chunks of this rank's shard, per gather owner the
    /// agreed mask, and this rank's own mask.
    pub(super) fn report(&self, id: OpId, rank: u32) -> Result<ReportReply, ErrorReply> {
        let latest = self.reports.iter().rev().find(|(k, _)| k.seq == id.seq && k.tensor == id.tensor);
        let found = if id.run == 0 { latest.map(|(_, r)| r) } else { self.reports.get(&id) };
        match found {
            Some((c, r)) => Ok(ReportReply::new(r, rank, c)),
            None => Err(ErrorReply {
                error: format!(
                    "no report for op {} tensor {} (unknown, failed, or too old)",
                    id.seq, id.tensor
                ),
            }),
        }
    }

    /// Everything the daemon counts, as JSON (for `dlcpctl stats --json`):
    /// every counter where its description puts it ([`View::visit_counters`]),
    /// plus who is answering, the datapath's own detail and the recent ops.
    pub(super) fn stats_json(&self, v: &View<'_>) -> serde_json::Value {
        let mut out = serde_json::json!({
            "version": crate::VERSION,
            "rank": v.cfg.rank(),
            "world": v.cfg.world_size(),
            "datapath": v.datapath.describe(),
            "pacing_rate_cuts": v.rate_cuts,
            "recent_ops": self.recent.iter().rev().take(64).collect::<Vec<_>>(),
        });
        v.visit_counters(&mut |section, d, l, value| put_counter(&mut out, section, d.json, l, value));
        out["datapath_counters"]["detail"] = v.datapath.detail_json().unwrap_or_default();
        if v.endpoint.config().paths > 1 {
            out["paths_per_peer"] = paths_per_peer(v);
        }
        out
    }
}

/// Every other rank's paths as this one sees them: weight, verdicts, losses,
/// cuts, and the long window's loss rate (parts per million) and size.
fn paths_per_peer(v: &View<'_>) -> serde_json::Value {
    let me = v.cfg.rank();
    (0..v.cfg.world_size())
        .filter(|&r| r != me)
        .map(|r| {
            let paths: Vec<serde_json::Value> = v
                .endpoint
                .path_health(r)
                .iter()
                .map(|h| {
                    serde_json::json!({
                        "weight": h.weight,
                        "verdicts": h.verdicts,
                        "losses": h.losses,
                        "cuts": h.cuts,
                        "long_loss_ppm": (h.long_rate * 1e6).round() as u64,
                        "long_verdicts": h.long_verdicts.round() as u64,
                    })
                })
                .collect();
            serde_json::json!({ "rank": r, "paths": paths })
        })
        .collect()
}

/// Place one counter value in the stats document: at `section` (empty: the
/// top), then the description's key, whose dots nest objects; a value by
/// class, peer or path is element `i` of an array under its key (the unknown
/// bucket has a key of its own).
fn put_counter(doc: &mut serde_json::Value, section: &str, key: &str, label: Label, value: u64) {
    use serde_json::Value;
    let mut at = doc;
    for part in section.split('.').chain(key.split('.')).filter(|p| !p.is_empty()) {
        if !at.is_object() {
            *at = Value::Object(serde_json::Map::new());
        }
        at = at.as_object_mut().expect("an object").entry(part).or_insert(Value::Null);
    }
    let index = match label {
        Label::Class(Some(c)) => Some(usize::from(c)),
        Label::Peer(Some(p)) => Some(p as usize),
        Label::Path(p) => Some(usize::from(p)),
        _ => None,
    };
    match index {
        None => *at = Value::from(value),
        Some(i) => {
            if !at.is_array() {
                *at = Value::Array(Vec::new());
            }
            let a = at.as_array_mut().expect("an array");
            if a.len() <= i {
                a.resize(i + 1, Value::from(0u64));
            }
            a[i] = Value::from(value);
        }
    }
}

/// The reply to `status`: version, datapath, peers and trainers, with `ops`
/// (the operations part) inside.
pub(super) fn status(v: &View<'_>, ops: OperationsStatus) -> StatusReply {
    let peers = (0..v.cfg.world_size())
        .map(|r| PeerStatus {
            rank: r,
            address: v.peers[r as usize].to_string(),
            generation: v.endpoint.peer_generation(r),
            session: v.endpoint.peer_session(r).map(|s| format!("{s:016x}")),
            up: r == v.cfg.rank() || v.endpoint.peer_up(r),
            is_self: r == v.cfg.rank(),
            refused: v.endpoint.peer_mismatch(r).map(|m| m.to_string()),
        })
        .collect();
    StatusReply {
        version: crate::VERSION.to_owned(),
        rank: v.cfg.rank(),
        world: v.cfg.world_size(),
        job: v.cfg.node.job_id,
        generation: v.endpoint.config().generation,
        datapath: v.datapath.describe(),
        packet_auth: v.cfg.security.packet_auth.as_str().to_owned(),
        flow_window: v.endpoint.config().flow.window,
        trainers: v.trainers.count(),
        ops_in_flight: v.endpoint.ops_in_flight(),
        ops_held: v.endpoint.ops_held(),
        run: v.endpoint.run().map(|(epoch, id)| RunStatus {
            epoch,
            id: (id != 0).then(|| format!("{id:016x}")),
            waiting: v.endpoint.run_waiting().iter().map(ToString::to_string).collect(),
        }),
        draining: v.draining,
        peers,
        ops,
    }
}

/// A reply as the JSON document sent to `dlcpctl`.
pub(super) fn to_json(reply: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(reply).unwrap_or_default()
}

/// The inverse of the `report` reply (what `dlcpctl report --json` prints):
/// rebuild the parts of an owner's [`OpReport`] that
/// [`dlcp_proto::oracle::recompute`] needs — per sender the delivered chunks
/// of the owner's shard, and the owner's own mask, and when the op started
/// and finished (to the microsecond; zero from a daemon too old to say).
/// The transfers' timing fields are zero.
/// Panics on JSON that the `report` reply did not produce (it is for tests and tools).
pub fn report_from_json(v: &serde_json::Value) -> OpReport {
    use dlcp_proto::bitmap::Bitmap;
    use dlcp_proto::endpoint::TransferReport;
    use dlcp_proto::time::Instant;
    use dlcp_proto::wire::Phase;
    let r = ReportReply::deserialize(v).expect("a `report` reply");
    let bits = |n: u32, list: &[u32], set: bool| {
        let mut b = if set { Bitmap::new(n) } else { Bitmap::full(n) };
        for &i in list {
            if set {
                b.set(i);
            } else {
                b.clear(i);
            }
        }
        b
    };
    OpReport {
        id: OpId { run: 1, seq: r.op, tensor: r.tensor },
        started: Instant::from_nanos(r.started_us * 1000),
        finished: Instant::from_nanos(r.finished_us * 1000),
        scatter: r
            .scatter
            .iter()
            .map(|t| TransferReport {
                peer: t.peer,
                phase: Phase::Scatter,
                chunks: t.chunks,
                delivered: bits(t.chunks, &t.missing, false),
                mask: None,
                repaired: 0,
                deadline_fired: false,
                first_at: None,
                closed_at: Instant::ZERO,
            })
            .collect(),
        gather: Vec::new(),
        own_mask: bits(r.own_chunks, &r.own_mask, true),
        own_chunks: r.own_chunks,
        repairs_sent: 0,
        deadline_fired: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlcp_proto::bitmap::Bitmap;
    use dlcp_proto::time::Instant;
    use dlcp_proto::wire::Phase;

    #[test]
    fn requests_parse_and_bad_ones_get_the_error_they_always_got() {
        for (line, want) in [
            ("stats\n", Request::Stats),
            (" status ", Request::Status),
            ("reload", Request::Reload),
            ("report 5 6\n", Request::Report(OpId { run: 0, seq: 5, tensor: 6 })),
        ] {
            assert_eq!(Request::parse(line), want, "{line:?}");
        }
        let error = |line| match Request::parse(line) {
            Request::Invalid(e) => to_json(&e).to_string(),
            other => panic!("{line:?} parsed as {other:?}"),
        };
        assert_eq!(error("report x 6"), r#"{"error":"usage: report OP TENSOR"}"#);
        assert_eq!(
            error(" bogus  thing\n"),
            r#"{"error":"unknown request \"bogus  thing\" (allowed: stats, status, reload, report OP TENSOR)"}"#
        );
    }

    fn transfer(peer: u32, delivered: &Bitmap, mask: Option<Bitmap>) -> TransferReport {
        TransferReport {
            peer,
            phase: if mask.is_some() { Phase::Gather } else { Phase::Scatter },
            chunks: delivered.len(),
            delivered: delivered.clone(),
            mask,
            repaired: 4,
            deadline_fired: true,
            first_at: None,
            closed_at: Instant::from_nanos(5),
        }
    }

    #[test]
    fn a_report_reply_reads_back_into_what_the_oracle_needs() {
        let mut delivered = Bitmap::full(10);
        delivered.clear(3);
        delivered.clear(7);
        let mut mask = Bitmap::new(10);
        mask.set(2);
        let r = OpReport {
            id: OpId { run: 1, seq: 9, tensor: 3 },
            started: Instant::from_nanos(1000),
            finished: Instant::from_nanos(5_001_000),
            scatter: vec![transfer(1, &delivered, None), transfer(2, &Bitmap::full(10), None)],
            gather: vec![transfer(1, &Bitmap::full(10), Some(mask.clone()))],
            own_mask: mask.clone(),
            own_chunks: 10,
            repairs_sent: 6,
            deadline_fired: true,
        };
        let json = to_json(&ReportReply::new(&r, 2, "reduce-scatter"));
        assert_eq!(
            json.to_string(),
            r#"{"collective":"reduce-scatter","deadline_fired":true,"duration_us":5000,"finished_us":5001,"gather":[{"chunks":10,"#
                .to_owned()
                + r#""deadline_fired":true,"#
                + r#""delivered_fraction":0.9,"mask":[2],"missing":[],"peer":1,"repaired":4}],"op":9,"own_chunks":10,"#
                + r#""own_mask":[2],"rank":2,"repairs_sent":6,"scatter":[{"chunks":10,"deadline_fired":true,"#
                + r#""delivered_fraction":0.8,"mask":null,"missing":[3,7],"peer":1,"repaired":4},{"chunks":10,"#
                + r#""deadline_fired":true,"delivered_fraction":1.0,"mask":null,"missing":[],"peer":2,"#
                + r#""repaired":4}],"started_us":1,"tensor":3}"#
        );
        // A reply from a daemon older than `collective` was an allreduce's.
        let mut old = json.clone();
        old.as_object_mut().unwrap().remove("collective");
        assert_eq!(ReportReply::deserialize(&old).unwrap().collective, "allreduce");
        let back = report_from_json(&json);
        assert_eq!(back.id, r.id);
        assert_eq!((back.started, back.finished), (r.started, r.finished));
        assert_eq!(back.own_chunks, 10);
        assert_eq!(back.own_mask, mask);
        assert_eq!(back.scatter.len(), 2);
        assert_eq!((back.scatter[0].peer, &back.scatter[0].delivered), (1, &delivered));
        assert_eq!((back.scatter[1].peer, &back.scatter[1].delivered), (2, &Bitmap::full(10)));
    }

    #[test]
    fn a_status_reply_has_the_keys_dlcpctl_reads_and_reads_back() {
        let st = StatusReply {
            version: "v".into(),
            rank: 1,
            world: 2,
            job: 4,
            generation: 8,
            datapath: "dp".into(),
            packet_auth: "aes-128-gmac".into(),
            flow_window: 1424,
            trainers: 2,
            ops_in_flight: 0,
            ops_held: 1,
            run: Some(RunStatus {
                epoch: 3,
                id: None,
                waiting: vec!["rank 0 has not started this run".into()],
            }),
            draining: false,
            peers: vec![
                PeerStatus {
                    rank: 0,
                    address: "a".into(),
                    generation: None,
                    session: None,
                    up: false,
                    is_self: false,
                    refused: Some("speaks dlcp wire version 4; this daemon speaks version 5".into()),
                },
                PeerStatus {
                    rank: 1,
                    address: "b".into(),
                    generation: Some(8),
                    session: Some("00000000000000ab".into()),
                    up: true,
                    is_self: true,
                    refused: None,
                },
            ],
            ops: OperationsStatus {
                config_file: Some("c".into()),
                datapath_kind: dlcp_config::schema::DatapathKind::Auto,
                build: "b".into(),
                uptime_s: 5,
                metrics: MetricsStatus { enabled: true, address: None, error: Some("x".into()) },
                reloads_ok: 1,
                reloads_failed: 2,
                last_reload: Some(LastReload {
                    seconds_ago: 3,
                    outcome: ReloadOutcome::rejected("f", "e".into()),
                }),
                systemd: SystemdStatus { notify: false, watchdog_ms: Some(7) },
                log_level: "info".into(),
                budget: 0.01,
            },
        };
        let json = to_json(&st);
        assert_eq!(
            json.to_string(),
            r#"{"datapath":"dp","draining":false,"flow_window":1424,"generation":8,"job":4,"ops":{"budget":0.01,"build":"b","#
                .to_owned()
                + r#""config_file":"c","datapath_kind":"auto","last_reload":{"outcome":{"applied":[],"error":"e","#
                + r#""file":"f","needs_restart":[],"not_applied":[],"ok":false},"seconds_ago":3},"log_level":"info","#
                + r#""metrics":{"address":null,"enabled":true,"error":"x"},"reloads_failed":2,"reloads_ok":1,"#
                + r#""systemd":{"notify":false,"watchdog_ms":7},"uptime_s":5},"ops_held":1,"ops_in_flight":0,"#
                + r#""packet_auth":"aes-128-gmac","peers":[{"address":"a","generation":null,"rank":0,"#
                + r#""refused":"speaks dlcp wire version 4; this daemon speaks version 5","self":false,"up":false},"#
                + r#"{"address":"b","#
                + r#""generation":8,"rank":1,"self":true,"session":"00000000000000ab","up":true}],"rank":1,"#
                + r#""run":{"epoch":3,"waiting":["rank 0 has not started this run"]},"#
                + r#""trainers":2,"version":"v","world":2}"#
        );
        assert_eq!(serde_json::from_value::<StatusReply>(json).unwrap(), st);
    }
}
