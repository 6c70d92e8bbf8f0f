//! The service's operations side: hot reload, systemd notification, metrics
//! and the extra `status` fields. Kept apart from the event loop; the loop
//! calls in at a handful of places (ready, each turn, op completion, SIGHUP,
//! the admin `reload` request).

use std::path::PathBuf;
use std::time::Instant as StdInstant;

use dlcp_config::Config;

use super::{Service, endpoint_config};
use crate::datapath::Datapath;
use crate::metrics::{Metrics, MetricsServer, Sample, UPDATE_EVERY};
use crate::notify::Notifier;
use crate::reload::{self, ReloadOutcome};

/// What the service keeps for operations.
#[derive(Debug)]
pub(super) struct OpsState {
    /// The file the daemon was started with (reload re-reads it).
    config_path: Option<PathBuf>,
    pub(super) notifier: Notifier,
    metrics: Option<Metrics>,
    server: Option<MetricsServer>,
    metrics_error: Option<String>,
    metrics_at: Option<StdInstant>,
    last_reload: Option<(StdInstant, ReloadOutcome)>,
    started: StdInstant,
    /// Log level changes on reload only when `RUST_LOG` did not set the filter.
    log_level_from_config: bool,
}

impl OpsState {
    pub(super) fn new(cfg: &Config, datapath: &str) -> OpsState {
        let mut st = OpsState {
            config_path: None,
            notifier: Notifier::new(None, None, None),
            metrics: None,
            server: None,
            metrics_error: None,
            metrics_at: None,
            last_reload: None,
            started: StdInstant::now(),
            log_level_from_config: false,
        };
        if cfg.metrics.enabled {
            let m = Metrics::new(cfg.rank(), cfg.world_size(), datapath);
            match MetricsServer::start(cfg.metrics.address, m.clone()) {
                Ok(srv) => {
                    log::info!("metrics: http://{}/metrics", srv.local_addr());
                    st.server = Some(srv);
                    st.metrics = Some(m);
                }
                Err(e) => {
                    let msg = format!(
                        "cannot listen on metrics.address {}: {e}; running without metrics \
                         (give each daemon on a host its own address, port 0 for any, or enabled = false)",
                        cfg.metrics.address
                    );
                    log::error!("{msg}");
                    st.metrics_error = Some(msg);
                }
            }
        }
        st
    }

    /// Send READY=1 (with a status line).
    pub(super) fn ready(&mut self, cfg: &Config, datapath: &str) {
        let status = format!(
            "READY=1\nSTATUS=rank {}/{} job {}: {datapath}\nMAINPID={}",
            cfg.rank(),
            cfg.world_size(),
            cfg.node.job_id,
            std::process::id()
        );
        self.notifier.notify(&status);
    }

    pub(super) fn metrics_due(&self) -> bool {
        self.metrics.is_some() && self.metrics_at.is_none_or(|t| t.elapsed() >= UPDATE_EVERY)
    }

    pub(super) fn update_metrics(&mut self, s: &Sample) {
        if let Some(m) = &self.metrics {
            m.update(s);
            self.metrics_at = Some(StdInstant::now());
        }
    }

    pub(super) fn op_completed(&self, report: &dlcp_proto::endpoint::OpReport, budget_ppm: u32) {
        let Some(m) = &self.metrics else { return };
        let last = report.scatter.iter().max_by_key(|t| t.closed_at).map(|t| t.peer);
        m.op_completed(report.duration(), report.min_delivered_fraction(), budget_ppm, last);
    }
}

impl Service {
    /// Remember the configuration file (for reload) and notify systemd through
    /// `notifier`. `log_level_from_config`: the log filter follows `log.level`
    /// (false when `RUST_LOG` set it; a reload then leaves it alone).
    pub fn set_operations(&mut self, config_path: PathBuf, notifier: Notifier, log_level_from_config: bool) {
        self.ops.config_path = Some(config_path);
        self.ops.notifier = notifier;
        self.ops.log_level_from_config = log_level_from_config;
    }

    /// The address the metrics endpoint listens on, if it does.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.ops.server.as_ref().map(MetricsServer::local_addr)
    }

    /// The running configuration (after any reloads).
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Re-read the configuration file and apply what can change at runtime
    /// (see [`crate::reload`]). Logged, counted, and told to systemd.
    pub fn reload(&mut self) -> ReloadOutcome {
        let Some(path) = self.ops.config_path.clone() else {
            self.counters.reloads_failed += 1;
            return ReloadOutcome::rejected("(none)", "started without a configuration file".into());
        };
        let file = path.display().to_string();
        self.ops.notifier.notify(&format!("RELOADING=1\nMONOTONIC_USEC={}", crate::notify::monotonic_usec()));
        let outcome = match Config::load(&path) {
            Err(e) => {
                self.counters.reloads_failed += 1;
                let o = ReloadOutcome::rejected(&file, e.to_string());
                log::error!("{}", o.summary());
                o
            }
            Ok(new) => {
                self.counters.reloads_ok += 1;
                let o = self.apply(&file, &new);
                for c in &o.applied {
                    log::info!("reload: applied {c}");
                }
                for c in &o.needs_restart {
                    log::warn!("reload: needs restart, not applied: {c}");
                }
                for c in &o.not_applied {
                    log::warn!("reload: could not apply, kept: {c}");
                }
                log::info!("{}", o.summary());
                o
            }
        };
        let status = if outcome.ok { "configuration reloaded" } else { "configuration reload rejected" };
        self.ops.notifier.notify(&format!("READY=1\nSTATUS={status}"));
        self.ops.last_reload = Some((StdInstant::now(), outcome.clone()));
        outcome
    }

    fn apply(&mut self, file: &str, new: &Config) -> ReloadOutcome {
        let plan = reload::plan(&self.cfg, new);
        let mut merged = plan.merged;
        let mut not_applied = Vec::new();
        let p = &merged.priority;
        if p.dscp != self.cfg.priority.dscp || p.so_priority != self.cfg.priority.so_priority {
            let why = match self.datapath.set_marking(p.dscp, p.so_priority) {
                Ok(true) => None,
                Ok(false) => Some("this datapath cannot re-mark while running (restart)".to_owned()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(why) = why {
                not_applied.push(format!("priority.dscp / priority.so_priority: {why}"));
                merged.priority.dscp = self.cfg.priority.dscp;
                merged.priority.so_priority = self.cfg.priority.so_priority;
            }
        }
        let now = self.now();
        let e = endpoint_config(&merged, self.endpoint.config().generation);
        let pacing_changed = merged.pacing != self.cfg.pacing;
        // An unchanged [pacing] keeps the rate the adapter has reached.
        let rate = if pacing_changed { e.pacing_rate } else { self.endpoint.pacing_rate() };
        self.endpoint.set_tunables(now, e.classifier, e.timers, rate, e.pacing_burst);
        if merged.log.level != self.cfg.log.level {
            if self.ops.log_level_from_config {
                log::set_max_level(reload::level_filter(merged.log.level));
            } else {
                not_applied.push("log.level: RUST_LOG sets the log filter".to_owned());
            }
        }
        self.cfg = merged;
        if pacing_changed {
            self.adapt = None;
            self.install_rate_adaptation();
        }
        let show = |v: Vec<dlcp_config::Change>| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        let mut applied = show(plan.applied);
        if !not_applied.is_empty() {
            applied.retain(|c| !c.starts_with("priority.dscp") && !c.starts_with("priority.so_priority"));
            if !self.ops.log_level_from_config {
                applied.retain(|c| !c.starts_with("log.level"));
            }
        }
        ReloadOutcome {
            ok: true,
            file: file.to_owned(),
            error: None,
            applied,
            needs_restart: show(plan.restart),
            not_applied,
        }
    }

    pub(super) fn metrics_sample(&self) -> Sample {
        let s = self.endpoint.stats();
        let r = &s.rejected;
        let d = self.datapath.stats();
        let c = &self.counters;
        let (mut sq, mut cq, mut cap) = (0u64, 0u64, 0u64);
        for slot in self.slots.iter().flatten() {
            let (a, b, k) = slot.att.ring_occupancy();
            sq += u64::from(a);
            cq += u64::from(b);
            cap += u64::from(k);
        }
        Sample {
            tx_packets: s.tx_packets,
            tx_bytes: s.tx_bytes,
            rx_packets: s.rx_packets,
            rx_bytes: s.rx_bytes,
            tx_packets_peer: s.tx_packets_peer.clone(),
            rx_packets_peer: s.rx_packets_peer.clone(),
            tx_bytes_peer: s.tx_bytes_peer.clone(),
            rx_bytes_peer: s.rx_bytes_peer.clone(),
            rx_dropped: s.rx_dropped.clone(),
            peer_up: (0..self.cfg.world_size())
                .map(|p| p == self.cfg.rank() || self.endpoint.peer_up(p))
                .collect(),
            dropped: vec![
                ("malformed", r.malformed),
                ("bad_tag", r.bad_tag),
                ("wrong_job", r.wrong_job),
                ("wrong_rank", r.wrong_rank),
                ("stale_generation", r.stale_generation),
                ("stale_op", r.stale_op),
                ("mismatch", r.mismatch),
                ("duplicate", r.duplicate),
                ("late", r.late),
                ("early_dropped", r.early_dropped),
                ("early_expired", r.early_expired),
                ("wrong_source", c.rx_wrong_source),
                ("unknown_source", c.rx_unknown_source),
                ("debug_loss", c.rx_debug_dropped),
                ("truncated", d.rx_truncated),
            ],
            repairs_sent_per_class: s.repairs_sent_per_class,
            repairs_received_per_class: s.repairs_received_per_class,
            repair_bytes_sent_per_class: s.repair_bytes_sent_per_class,
            repair_bytes_received_per_class: s.repair_bytes_received_per_class,
            repairs_sent_peer: s.repairs_sent_peer.clone(),
            repairs_received_peer: s.repairs_received_peer.clone(),
            repairs_sent: s.repairs_sent,
            repairs_received: s.repairs_received,
            probes_sent: s.probes_sent,
            probes_duplicate: s.probes_duplicate,
            deadlines_fired: s.deadlines_fired,
            deadline_closes: s.deadline_closes,
            deadline_nacks: s.deadline_nacks,
            hard_timeouts: s.hard_timeouts,
            ops_started: c.ops_started,
            ops_completed: c.ops_completed,
            ops_failed: c.ops_failed,
            ops_in_flight: self.endpoint.ops_in_flight() as u64,
            trainers: self.trainers() as u64,
            sq_used: sq,
            cq_used: cq,
            ring_capacity: cap,
            pacing_rate: self.endpoint.pacing_rate(),
            datapath_errors: [("tx", d.tx_errors), ("rx", d.rx_errors), ("tx_would_block", d.tx_would_block)],
            reloads: (c.reloads_ok, c.reloads_failed),
        }
    }

    /// The operations part of `status`: config file, datapath choice, metrics
    /// endpoint, reloads, systemd.
    pub(super) fn ops_status_json(&self) -> serde_json::Value {
        let o = &self.ops;
        serde_json::json!({
            "config_file": o.config_path.as_ref().map(|p| p.display().to_string()),
            "datapath_kind": self.cfg.datapath.kind,
            "build": crate::datapath_support(),
            "uptime_s": o.started.elapsed().as_secs(),
            "metrics": {
                "enabled": self.cfg.metrics.enabled,
                "address": self.metrics_addr().map(|a| a.to_string()),
                "error": o.metrics_error,
            },
            "reloads_ok": self.counters.reloads_ok,
            "reloads_failed": self.counters.reloads_failed,
            "last_reload": o.last_reload.as_ref().map(|(t, r)| serde_json::json!({
                "seconds_ago": t.elapsed().as_secs(),
                "outcome": r,
            })),
            "systemd": {
                "notify": o.notifier.enabled(),
                "watchdog_ms": o.notifier.watchdog().map(|d| d.as_millis() as u64),
            },
            "log_level": self.cfg.log.level.as_str(),
            "budget": self.cfg.loss.budget,
        })
    }
}

/// The gid of `control.socket_group` (a group name from `/etc/group`, or a
/// number); `None` if unset (the sockets keep the daemon's group).
pub(super) fn socket_gid(c: &dlcp_config::Control) -> Result<Option<u32>, String> {
    let Some(g) = c.socket_group.as_deref() else { return Ok(None) };
    if let Ok(n) = g.parse::<u32>() {
        return Ok(Some(n));
    }
    let groups = std::fs::read_to_string("/etc/group").map_err(|e| format!("/etc/group: {e}"))?;
    groups
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 3 && f[0] == g)
        .and_then(|f| f[2].parse().ok())
        .map(Some)
        .ok_or_else(|| format!("control.socket_group {g:?}: no such group in /etc/group"))
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
pub(super) fn chgrp(path: &std::path::Path, group: Option<u32>) -> std::io::Result<()> {
    match group {
        Some(g) => rustix::fs::chown(path, None, Some(rustix::fs::Gid::from_raw(g)))
            .map_err(|e| std::io::Error::other(format!("chgrp {} to gid {g}: {e}", path.display()))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(g: Option<&str>) -> dlcp_config::Control {
        dlcp_config::Control { socket_group: g.map(str::to_owned), ..dlcp_config::Control::default() }
    }

    #[test]
    fn socket_group_by_number_name_or_not_at_all() {
        assert_eq!(socket_gid(&control(None)), Ok(None));
        assert_eq!(socket_gid(&control(Some("4242"))), Ok(Some(4242)));
        assert_eq!(socket_gid(&control(Some("root"))), Ok(Some(0)));
        let e = socket_gid(&control(Some("no-such-group-dlcp"))).unwrap_err();
        assert!(e.contains("no such group"), "{e}");
        let p = peer_policy(Some(4242));
        let cred = |uid, gid| crate::shm::PeerCred { pid: 1, uid, gid };
        assert!(p.allows_peer(&cred(0, 1)), "root");
        assert!(p.allows_peer(&cred(12345, 4242)), "primary group");
        assert!(!p.allows_peer(&cred(12345, 1)));
        assert!(p.allows_peer_in(&cred(12345, 1), &[7, 4242]), "supplementary group");
        assert!(!p.allows_peer_in(&cred(12345, 1), &[7]));
    }
}
