//! Hot reload: what a running daemon does with a re-read configuration file.
//! (Which settings may change at runtime is the configuration crate's
//! business: `dlcp_config`'s reload classes and [`Config::diff`].)
//!
//! On `SIGHUP` (or `dlcpctl reload`) the service re-reads the file it was
//! started with. A file that does not load (syntax, schema, validation — the
//! error names `file:line:col`) is rejected whole and the running configuration
//! is kept. Otherwise [`plan`] compares the two with [`Config::diff`]: every
//! changed setting whose [`Reload`] class is `Runtime` is taken from the new
//! file, every `Restart` one is reported as needing a restart and left as it
//! runs. The service then applies the merged configuration: timers, classifier,
//! pacing, loss settings and log level in the protocol endpoint and the
//! service (for ops that start from now on; an op in flight keeps its budget,
//! classes and droppable set), the DSCP and `SO_PRIORITY` maps in the datapath
//! ([`crate::datapath::Datapath::set_marking`]: the socket datapath re-marks its
//! class sockets, the DPDK datapath writes the new DSCP into every frame it
//! builds from then on; a datapath that cannot reports it and keeps the old maps).

use dlcp_config::{Change, Config, Reload};
use serde::{Deserialize, Serialize};

/// The outcome of one reload, as logged and as `dlcpctl reload` prints it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReloadOutcome {
    /// True if the file loaded (even if nothing changed or some changes need a restart).
    pub ok: bool,
    /// The file that was read.
    pub file: String,
    /// The load error (`file:line:col: field: message`), if the file was rejected.
    pub error: Option<String>,
    /// Changes applied (`path: old -> new (runtime)`).
    pub applied: Vec<String>,
    /// Changes left unapplied because they need a restart.
    pub needs_restart: Vec<String>,
    /// Runtime changes the running datapath could not apply (kept as before).
    pub not_applied: Vec<String>,
}

impl ReloadOutcome {
    /// A rejected file.
    pub fn rejected(file: &str, error: String) -> ReloadOutcome {
        ReloadOutcome {
            ok: false,
            file: file.to_owned(),
            error: Some(error),
            applied: Vec::new(),
            needs_restart: Vec::new(),
            not_applied: Vec::new(),
        }
    }

    /// One line for the log.
    pub fn summary(&self) -> String {
        if let Some(e) = &self.error {
            return format!("reload of {} rejected, running configuration kept: {e}", self.file);
        }
        let mut s = format!(
            "reload of {}: {} change(s) applied, {} need a restart",
            self.file,
            self.applied.len(),
            self.needs_restart.len()
        );
        if !self.not_applied.is_empty() {
            s.push_str(&format!(", {} could not be applied", self.not_applied.len()));
        }
        s
    }
}

/// The configuration to run after a reload, and what changed.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The running configuration with every runtime setting taken from the new file.
    pub merged: Config,
    /// Changes that take effect now.
    pub applied: Vec<Change>,
    /// Changes that need a restart (left as they run).
    pub restart: Vec<Change>,
}

/// Merge the runtime settings of `new` into `running` (see the module docs).
pub fn plan(running: &Config, new: &Config) -> Plan {
    let changes = running.diff(new);
    let (applied, restart): (Vec<Change>, Vec<Change>) =
        changes.into_iter().partition(|c| c.reload == Reload::Runtime);
    let mut merged = running.clone();
    // Every `Runtime` entry of dlcp_config::SETTINGS, section by section (a
    // unit test checks this stays in step with SETTINGS).
    merged.network.heartbeat_interval_ms = new.network.heartbeat_interval_ms;
    merged.network.peer_timeout_ms = new.network.peer_timeout_ms;
    merged.priority = new.priority.clone();
    merged.loss = new.loss.clone();
    merged.pacing = new.pacing.clone();
    merged.log = new.log.clone();
    Plan { merged, applied, restart }
}

/// `log.level` as the `log` crate's filter.
pub fn level_filter(l: dlcp_config::LogLevel) -> log::LevelFilter {
    use dlcp_config::LogLevel as L;
    match l {
        L::Error => log::LevelFilter::Error,
        L::Warn => log::LevelFilter::Warn,
        L::Info => log::LevelFilter::Info,
        L::Debug => log::LevelFilter::Debug,
        L::Trace => log::LevelFilter::Trace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(extra: &str) -> String {
        format!(
            "[node]\nrank = 0\njob_id = 7\njob_secret = \"0123456789abcdef0123\"\n\n\
             [[peers]]\nrank = 0\naddress = \"10.0.0.1\"\nport = 7700\n\n\
             [[peers]]\nrank = 1\naddress = \"10.0.0.2\"\nport = 7700\n\n{extra}"
        )
    }

    fn load(extra: &str) -> Config {
        Config::from_str_named(&base(extra), "t.toml").unwrap()
    }

    /// Every setting of `SETTINGS` changed at once: after merging, exactly the
    /// restart-class changes remain between the merged and the new config, so
    /// `plan` applies every runtime setting and no restart setting.
    #[test]
    fn merge_takes_exactly_the_runtime_settings() {
        let old = load("");
        let new = Config::from_str_named(
            "[node]\nrank = 1\njob_id = 8\njob_secret = \"another secret 0123456\"\ngeneration = 5\n\n\
             [[peers]]\nrank = 0\naddress = \"10.0.0.1\"\nport = 7701\n\n\
             [[peers]]\nrank = 1\naddress = \"10.0.0.3\"\nport = 7700\n\n\
             [network]\nbind_address = \"0.0.0.0\"\nmtu = 9000\nchunk_bytes = 8000\n\
             heartbeat_interval_ms = 50\npeer_timeout_ms = 900\npaths = 4\n\n\
             [datapath]\nkind = \"socket\"\n[datapath.socket]\ngso = false\nbatch = 8\n\n\
             [priority]\nscatter_band = [0, 2]\ngather_band = [3, 6]\nlayer_levels = 4\nmagnitude_levels = 1\ndroppable = [0, 1]\n\
             dscp = [0, 8, 16, 24, 32, 40, 46, 56]\nso_priority = [0, 0, 1, 1, 2, 2, 3, 3]\n\n\
             [loss]\nbudget = 0.05\ngather_budget = 0.01\nfill = \"local\"\nrescale = true\n\
             deadline_min_ms = 2\ndeadline_max_ms = 300\nhard_timeout_ms = 5000\nop_deadline_ms = 60000\n\
             probe_timeout_min_ms = 2\nprobe_timeout_max_ms = 100\ninitial_per_chunk_us = 20\nack_delay_ms = 10\n\n\
             [pacing]\nrate_mbps = 1000\nburst_bytes = 100000\nadapt = true\n\n\
             [shm]\narena_bytes = 33554432\nring_entries = 64\nmax_tensor_bytes = 1048576\n\
             early_buffer_bytes = 1048576\n\n\
             [control]\nsocket_path = \"/tmp/x.sock\"\nsocket_mode = \"0600\"\n\n\
             [metrics]\nenabled = false\naddress = \"127.0.0.1:1\"\n\n[log]\nlevel = \"debug\"\n",
            "new.toml",
        )
        .unwrap();
        let p = plan(&old, &new);
        assert!(!p.applied.is_empty() && !p.restart.is_empty());
        assert!(p.applied.iter().all(|c| c.reload == Reload::Runtime));
        assert!(p.restart.iter().all(|c| c.reload == Reload::Restart));
        // Every runtime setting of SETTINGS was changed by the test file...
        for (path, class) in dlcp_config::SETTINGS {
            if *class == Reload::Runtime {
                assert!(p.applied.iter().any(|c| c.path.starts_with(path)), "{path} not exercised");
            }
        }
        // ...and is applied; what remains differs only in restart settings.
        let left = p.merged.diff(&new);
        assert!(left.iter().all(|c| c.reload == Reload::Restart), "{left:?}");
        assert_eq!(left.len(), p.restart.len(), "{left:?} vs {:?}", p.restart);
        // Nothing restart-class moved (the number of paths among them).
        assert!(old.diff(&p.merged).iter().all(|c| c.reload == Reload::Runtime));
        assert!(p.restart.iter().any(|c| c.path == "network.paths"), "{:?}", p.restart);
    }

    #[test]
    fn unchanged_file_is_a_no_op() {
        let a = load("[loss]\nbudget = 0.02\n");
        let p = plan(&a, &a.clone());
        assert!(p.applied.is_empty() && p.restart.is_empty());
        assert_eq!(p.merged, a);
    }
}
