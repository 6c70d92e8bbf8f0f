//! # dlcp-config — the TOML configuration schema of dlcpd
//!
//! One file configures one daemon: who it is (`[node]`), who the other daemons
//! of the job are (`[[peers]]`), and how it moves packets (`[network]`,
//! `[datapath]`, `[priority]`, `[loss]`, `[pacing]`), talks to trainers
//! (`[shm]`, `[control]`), authenticates them (`[security]`) and reports
//! (`[metrics]`, `[log]`). The sections and
//! their defaults are documented in [`schema`] and, for operators, in
//! `deploy/dlcp.toml`. A file with only `[node]` and `[[peers]]` is complete.
//!
//! ```
//! let text = r#"
//! [node]
//! rank = 0
//! job_id = 7
//! job_secret = "0123456789abcdef0123"
//!
//! [[peers]]
//! rank = 0
//! address = "10.77.0.1"
//! port = 7700
//! "#;
//! let cfg = dlcp_config::Config::from_str_named(text, "dlcp.toml").unwrap();
//! assert_eq!(cfg.chunk_bytes(), 1372);
//! assert_eq!(cfg.loss.budget_ppm(), 10_000);
//! ```
//!
//! ## Errors
//!
//! Every error is a [`ConfigError`] whose `Display` is one line naming the
//! file, line, column, dotted field path and what is allowed:
//!
//! ```text
//! /etc/dlcp/dlcp.toml:12:10: loss.budget: 0.25 exceeds the hard cap 0.10 (allowed: 0.0 ..= 0.10; a budget is a fraction: write 0.01 or "1%" for 1%)
//! dlcp.toml:3:1: network.mtuu: unknown field (allowed: bind_address, mtu, chunk_bytes, ...)
//! ```
//!
//! Unknown keys are rejected in every table. Parse errors take their place from
//! toml's spans; validation errors from the span of the blamed key, found by
//! re-reading the document as a spanned tree (a defaulted key that is absent
//! is blamed on its table's header).
//!
//! ## Reload
//!
//! Each setting is [`Reload::Runtime`] (a running daemon applies it on reload)
//! or [`Reload::Restart`]; see [`SETTINGS`], [`reload_class`] and [`Config::diff`].
#![forbid(unsafe_code)]

mod budget;
mod changes;
mod error;
mod locate;
pub mod schema;
mod validate;

use std::net::SocketAddr;
use std::path::Path;

use dlcp_proto::priority::ClassifierConfig;
use dlcp_proto::wire::JobKey;
use serde::{Deserialize, Serialize};

pub use budget::{BUDGET_FORMS, BudgetError, parse_budget, parse_budget_unchecked, percent};
pub use changes::{Change, Reload, SETTINGS, needs_restart, reload_class};
pub use error::{ConfigError, ErrorKind, Location};
pub use schema::{
    Control, Datapath, DatapathKind, DpdkDatapath, Fill, Generation, Log, LogLevel, Loss, Metrics, Network,
    Node, Pacing, PacketAuthMode, Peer, Priority, Secret, Security, Shm, SocketDatapath,
};

use error::{Bad, invalid_at, one_line, rewrite_serde_message};
use locate::Doc;

/// A loaded and validated dlcpd configuration.
///
/// The fields are the file's sections with every default filled in; derived
/// values are resolved (`network.bind_address`, `network.chunk_bytes`) and
/// `peers` is sorted by rank. A `Config` obtained from [`Config::load`] or
/// [`Config::from_str_named`] satisfies every rule of the schema; code that
/// mutates the fields takes over that responsibility.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    /// `[node]`: this daemon's identity.
    pub node: Node,
    /// `[[peers]]`: every daemon of the job, this one included.
    pub peers: Vec<Peer>,
    /// `[network]`.
    pub network: Network,
    /// `[datapath]`.
    pub datapath: Datapath,
    /// `[priority]`.
    pub priority: Priority,
    /// `[loss]`.
    pub loss: Loss,
    /// `[pacing]`.
    pub pacing: Pacing,
    /// `[shm]`.
    pub shm: Shm,
    /// `[control]`.
    pub control: Control,
    /// `[metrics]`.
    pub metrics: Metrics,
    /// `[security]`.
    pub security: Security,
    /// `[log]`.
    pub log: Log,
    /// The resolved job secret (inline or read from `job_secret_file`).
    #[serde(skip)]
    secret: Secret,
    /// The name the config was loaded under.
    #[serde(skip)]
    source: String,
}

/// The document as deserialized, before validation. Private so that the only
/// way to a [`Config`] goes through validation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    node: Node,
    peers: Vec<Peer>,
    #[serde(default)]
    network: Network,
    #[serde(default)]
    datapath: Datapath,
    #[serde(default)]
    priority: Priority,
    #[serde(default)]
    loss: Loss,
    #[serde(default)]
    pacing: Pacing,
    #[serde(default)]
    shm: Shm,
    #[serde(default)]
    control: Control,
    #[serde(default)]
    metrics: Metrics,
    #[serde(default)]
    security: Security,
    #[serde(default)]
    log: Log,
}

impl Config {
    /// Read, parse and validate the file at `path`. Relative `job_secret_file`
    /// paths are taken relative to the file's directory.
    ///
    /// An inline `node.job_secret` is accepted only if the file is readable by
    /// its owner alone (no group or other permission bits), as ssh treats a
    /// private key; a `job_secret_file` must be so too (checked wherever the
    /// text came from).
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        let path = path.as_ref();
        let read = |source| ConfigError::Read { path: path.to_owned(), source };
        let mut f = std::fs::File::open(path).map_err(read)?;
        // The mode of the file read, taken from the open file.
        let mode = f.metadata().map_err(read)?.mode() & 0o7777;
        let mut text = String::new();
        f.read_to_string(&mut text).map_err(read)?;
        let name = path.display().to_string();
        Config::parse(&text, &name, path.parent(), Some(&validate::Source { name: &name, mode }))
    }

    /// Parse and validate `text`; `name` is the file name used in errors.
    /// Relative `job_secret_file` paths are taken relative to `name`'s
    /// directory (the working directory if `name` has none). Text has no file
    /// permissions: an inline secret is not checked for them here (see
    /// [`Config::load`]).
    pub fn from_str_named(text: &str, name: &str) -> Result<Config, ConfigError> {
        Config::parse(text, name, Path::new(name).parent(), None)
    }

    fn parse(
        text: &str,
        name: &str,
        base: Option<&Path>,
        file: Option<&validate::Source<'_>>,
    ) -> Result<Config, ConfigError> {
        let base = base.filter(|b| !b.as_os_str().is_empty());
        let doc = match Doc::parse(text) {
            Ok(doc) => doc,
            Err(e) => return Err(syntax_error(name, text, &e)),
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| deser_error(name, text, &doc, &e))?;
        let mut cfg = Config {
            node: raw.node,
            peers: raw.peers,
            network: raw.network,
            datapath: raw.datapath,
            priority: raw.priority,
            loss: raw.loss,
            pacing: raw.pacing,
            shm: raw.shm,
            control: raw.control,
            metrics: raw.metrics,
            security: raw.security,
            log: raw.log,
            secret: Secret::default(),
            source: String::new(),
        };
        validate::validate(&mut cfg, base, file).map_err(|bad| locate_bad(name, text, &doc, bad))?;
        cfg.source = name.to_owned();
        Ok(cfg)
    }

    /// The effective configuration as TOML: every default filled in, derived
    /// values resolved, the inline secret shown as `"<redacted>"` (a secret file
    /// is shown by path). For `dlcpd check-config`.
    pub fn to_toml_string(&self) -> String {
        let mut out = String::from(
            "# Effective dlcpd configuration: defaults filled in, derived values resolved, secret redacted.\n",
        );
        match toml::to_string(self) {
            Ok(s) => out.push_str(&s),
            Err(e) => out.push_str(&format!("# cannot serialize: {}\n", one_line(&e.to_string()))),
        }
        out
    }

    /// The settings that differ from `self` to `new`, each with its reload class
    /// (see [`needs_restart`]). Arrays of tables are compared element by element
    /// (`peers[2].port`), other arrays as a whole (`priority.dscp`); a changed
    /// secret shows as `node.job_secret` without its value.
    pub fn diff(&self, new: &Config) -> Vec<Change> {
        changes::diff(self, new)
    }

    /// The effective settings as `(dotted path, TOML value)` pairs.
    pub fn settings(&self) -> Vec<(String, String)> {
        changes::leaves(self)
    }

    /// The name the configuration was loaded under.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// This node's rank.
    pub fn rank(&self) -> u32 {
        self.node.rank
    }

    /// Number of daemons in the job (the number of `[[peers]]`).
    pub fn world_size(&self) -> u32 {
        self.peers.len() as u32
    }

    /// The peer of a rank.
    pub fn peer(&self, rank: u32) -> Option<&Peer> {
        self.peers.iter().find(|p| p.rank == rank)
    }

    /// This node's own `[[peers]]` entry.
    ///
    /// # Panics
    /// If the config was mutated so that `node.rank` has no peer entry.
    pub fn own_peer(&self) -> &Peer {
        self.peer(self.node.rank).expect("validated config holds this node's rank")
    }

    /// The local UDP endpoint to bind: `network.bind_address` and this node's port.
    pub fn bind_addr(&self) -> SocketAddr {
        let own = self.own_peer();
        SocketAddr::new(self.network.bind_address.unwrap_or(own.address), own.port)
    }

    /// Payload bytes per DATA packet (`network.chunk_bytes`, resolved).
    pub fn chunk_bytes(&self) -> u32 {
        let v6 = self.peers.first().is_some_and(|p| p.address.is_ipv6());
        self.network.chunk_bytes.unwrap_or_else(|| schema::default_chunk_bytes(self.network.mtu, v6))
    }

    /// The job secret bytes.
    pub fn job_secret(&self) -> &[u8] {
        self.secret.as_bytes()
    }

    /// The job's packet key schedule: from the job secret, or none under
    /// `security.packet_auth = "none"`.
    pub fn job_key(&self) -> JobKey {
        match self.security.packet_auth {
            PacketAuthMode::AesGmac => JobKey::new(self.job_secret()),
            PacketAuthMode::None => JobKey::unauthenticated(),
        }
    }

    /// The classifier parameters of `[priority]`.
    pub fn classifier(&self) -> ClassifierConfig {
        self.priority.classifier()
    }
}

/// A TOML syntax error: no tree, so the field is the enclosing table header.
fn syntax_error(name: &str, text: &str, e: &toml::de::Error) -> ConfigError {
    let span = e.span();
    let pos = span.as_ref().map_or(0, |s| s.start);
    let field = locate::enclosing_header(text, pos).unwrap_or_else(|| "(top level)".to_owned());
    let mut message = format!("TOML syntax error: {}", one_line(e.message()));
    if let Some(s) = &span {
        let snippet = text.get(s.clone()).unwrap_or("");
        if !snippet.is_empty() && snippet.len() <= 40 && !snippet.contains('\n') && !message.contains(snippet)
        {
            message.push_str(&format!(" at `{snippet}`"));
        }
    }
    invalid_at(name, text, span, field, message, ErrorKind::Syntax)
}

/// A deserialization error (type, unknown key, missing key, bad enum value):
/// the span is toml's, the path is the key/value at that span.
fn deser_error(name: &str, text: &str, doc: &Doc<'_>, e: &toml::de::Error) -> ConfigError {
    let rw = rewrite_serde_message(e.message());
    // A span covering the whole document (or none) means "the top level".
    let span = e.span().filter(|s| !(s.start == 0 && (s.end == 0 || s.end >= text.trim_end().len())));
    let base = span.as_ref().map_or_else(String::new, |s| doc.path_at(s.start));
    let field = match (&rw.missing, base.is_empty()) {
        (Some(m), true) => m.clone(),
        (Some(m), false) => format!("{base}.{m}"),
        (None, true) => "(top level)".to_owned(),
        (None, false) => base,
    };
    invalid_at(name, text, span, field, rw.message, rw.kind)
}

/// A validation error: look up the blamed key's span.
fn locate_bad(name: &str, text: &str, doc: &Doc<'_>, bad: Bad) -> ConfigError {
    let span = doc.span_of(&bad.path);
    let mut message = bad.message;
    if !doc.has(&bad.path) && !bad.path.starts_with("peers") {
        message.push_str(" [this is the default; the key is not set in the file]");
    }
    invalid_at(name, text, span, bad.path, message, ErrorKind::Value)
}
