//! The service's operations side — hot reload, systemd notification, metrics
//! and the extra `status` fields — as [`Operations`]. Kept apart from the event
//! loop; the loop calls in at a handful of places (ready, each turn, op
//! completion, SIGHUP, the admin `reload` request). ("Operations" as in running
//! the daemon, not the allreduce ops it serves.)

use std::path::PathBuf;
use std::time::Instant as StdInstant;

use dlcp_config::Config;
use dlcp_proto::endpoint::Endpoint;

use super::admin::{LastReload, MetricsStatus, OperationsStatus, SystemdStatus};
use super::counters::ServiceCounters;
use super::pump::Pump;
use super::setup::{self, endpoint_config};
use crate::datapath::Datapath;
use crate::hot_reload::{self, ReloadOutcome};
use crate::metrics::{Metrics, MetricsServer, UPDATE_EVERY};
use crate::notify::Notifier;

/// What a reload changes: the parts of the service it reaches.
pub(super) struct Reloadable<'a> {
    /// The running configuration (replaced by the merged one).
    pub(super) cfg: &'a mut Config,
    /// The endpoint (its tunables).
    pub(super) endpoint: &'a mut Endpoint,
    /// The pump (the datapath's marking).
    pub(super) pump: &'a mut Pump,
    /// The service's counters (reloads).
    pub(super) counters: &'a mut ServiceCounters,
    /// The service's start (its protocol clock, see [`setup::since`]).
    pub(super) start: StdInstant,
}

/// What the service keeps for operations.
#[derive(Debug)]
pub(super) struct Operations {
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

impl Operations {
    /// Operations without metrics yet (see [`Operations::start_metrics`]).
    pub(super) fn new() -> Operations {
        Operations {
            config_path: None,
            notifier: Notifier::new(None, None, None),
            metrics: None,
            server: None,
            metrics_error: None,
            metrics_at: None,
            last_reload: None,
            started: StdInstant::now(),
            log_level_from_config: false,
        }
    }

    /// Serve `m` on `[metrics] address`; a bind failure is logged and shown
    /// by `status`, and the daemon runs on without metrics.
    pub(super) fn start_metrics(&mut self, cfg: &Config, m: Metrics) {
        match MetricsServer::start(cfg.metrics.address, m.clone()) {
            Ok(srv) => {
                log::info!("metrics: http://{}/metrics", srv.local_addr());
                self.server = Some(srv);
                self.metrics = Some(m);
            }
            Err(e) => {
                let msg = format!(
                    "cannot listen on metrics.address {}: {e}; running without metrics \
                     (give each daemon on a host its own address, port 0 for any, or enabled = false)",
                    cfg.metrics.address
                );
                log::error!("{msg}");
                self.metrics_error = Some(msg);
            }
        }
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

    /// True when the metrics are due for an update.
    pub(super) fn metrics_due(&self) -> bool {
        self.metrics.is_some() && self.metrics_at.is_none_or(|t| t.elapsed() >= UPDATE_EVERY)
    }

    /// The metrics, if they are served (cheap to clone).
    pub(super) fn metrics(&self) -> Option<Metrics> {
        self.metrics.clone()
    }

    /// Note that the metrics were just updated.
    pub(super) fn metrics_updated(&mut self) {
        self.metrics_at = Some(StdInstant::now());
    }

    /// Count a completed op in the metrics.
    pub(super) fn op_completed(&self, report: &dlcp_proto::endpoint::OpReport, budget_ppm: u32) {
        let Some(m) = &self.metrics else { return };
        let last = report.scatter.iter().max_by_key(|t| t.closed_at).map(|t| t.peer);
        m.op_completed(report.duration(), report.min_delivered_fraction(), budget_ppm, last);
    }

    /// Remember the configuration file (for reload) and notify systemd through
    /// `notifier`. `log_level_from_config`: the log filter follows `log.level`
    /// (false when `RUST_LOG` set it; a reload then leaves it alone).
    pub(super) fn set(&mut self, config_path: PathBuf, notifier: Notifier, log_level_from_config: bool) {
        self.config_path = Some(config_path);
        self.notifier = notifier;
        self.log_level_from_config = log_level_from_config;
    }

    /// The address the metrics endpoint listens on, if it does.
    pub(super) fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.server.as_ref().map(MetricsServer::local_addr)
    }

    /// Re-read the configuration file and apply what can change at runtime
    /// (see [`crate::hot_reload`]). Logged, counted, and told to systemd.
    pub(super) fn reload(&mut self, mut to: Reloadable<'_>) -> ReloadOutcome {
        let Some(path) = self.config_path.clone() else {
            to.counters.reloads_failed += 1;
            return ReloadOutcome::rejected("(none)", "started without a configuration file".into());
        };
        let file = path.display().to_string();
        self.notifier.notify(&format!("RELOADING=1\nMONOTONIC_USEC={}", crate::notify::monotonic_usec()));
        let outcome = match Config::load(&path) {
            Err(e) => {
                to.counters.reloads_failed += 1;
                let o = ReloadOutcome::rejected(&file, e.to_string());
                log::error!("{}", o.summary());
                o
            }
            Ok(new) => {
                to.counters.reloads_ok += 1;
                let o = self.apply(&file, &new, &mut to);
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
        self.notifier.notify(&format!("READY=1\nSTATUS={status}"));
        self.last_reload = Some((StdInstant::now(), outcome.clone()));
        outcome
    }

    fn apply(&mut self, file: &str, new: &Config, to: &mut Reloadable<'_>) -> ReloadOutcome {
        let running = &*to.cfg;
        let plan = hot_reload::plan(running, new);
        let mut merged = plan.merged;
        let mut not_applied = Vec::new();
        let p = &merged.priority;
        if p.dscp != running.priority.dscp || p.so_priority != running.priority.so_priority {
            let why = match to.pump.datapath_mut().set_marking(p.dscp, p.so_priority) {
                Ok(true) => None,
                Ok(false) => Some("this datapath cannot re-mark while running (restart)".to_owned()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(why) = why {
                not_applied.push(format!("priority.dscp / priority.so_priority: {why}"));
                merged.priority.dscp = running.priority.dscp;
                merged.priority.so_priority = running.priority.so_priority;
            }
        }
        let now = setup::since(to.start);
        let running_id = to.endpoint.config();
        let e = endpoint_config(&merged, running_id.generation, running_id.session);
        let pacing_changed = merged.pacing != running.pacing;
        // An unchanged [pacing] keeps the rate the adapter has reached.
        let rate = if pacing_changed { e.pacing_rate } else { to.endpoint.pacing_rate() };
        to.endpoint.set_tunables(now, e.classifier, e.timers, rate, e.pacing_burst);
        if merged.log.level != running.log.level {
            if self.log_level_from_config {
                log::set_max_level(hot_reload::level_filter(merged.log.level));
            } else {
                not_applied.push("log.level: RUST_LOG sets the log filter".to_owned());
            }
        }
        *to.cfg = merged;
        if pacing_changed {
            to.endpoint.set_rate_adaptation(now, setup::rate_adaptation(&to.cfg.pacing));
        }
        let show = |v: Vec<dlcp_config::Change>| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        let mut applied = show(plan.applied);
        if !not_applied.is_empty() {
            applied.retain(|c| !c.starts_with("priority.dscp") && !c.starts_with("priority.so_priority"));
            if !self.log_level_from_config {
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

    /// The operations part of `status`: config file, datapath choice, metrics
    /// endpoint, reloads, systemd.
    pub(super) fn status(&self, cfg: &Config, counters: &ServiceCounters) -> OperationsStatus {
        OperationsStatus {
            config_file: self.config_path.as_ref().map(|p| p.display().to_string()),
            datapath_kind: cfg.datapath.kind,
            build: crate::datapath_support(),
            uptime_s: self.started.elapsed().as_secs(),
            metrics: MetricsStatus {
                enabled: cfg.metrics.enabled,
                address: self.metrics_addr().map(|a| a.to_string()),
                error: self.metrics_error.clone(),
            },
            reloads_ok: counters.reloads_ok,
            reloads_failed: counters.reloads_failed,
            last_reload: self
                .last_reload
                .as_ref()
                .map(|(t, r)| LastReload { seconds_ago: t.elapsed().as_secs(), outcome: r.clone() }),
            systemd: SystemdStatus {
                notify: self.notifier.enabled(),
                watchdog_ms: self.notifier.watchdog().map(|d| d.as_millis() as u64),
            },
            log_level: cfg.log.level.as_str().to_owned(),
            budget: cfg.loss.budget,
        }
    }
}
