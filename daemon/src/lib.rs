//! # dlcp — the daemon crate
//!
//! `dlcpd` is the per-host daemon of dlcp, a transport for distributed DNN
//! training that tolerates a bounded loss of gradient packets. This crate holds
//! the daemon's pieces; the protocol logic lives in [`dlcp_proto`] (sans-IO) and
//! the configuration schema in [`dlcp_config`].
//!
//! - [`service`]: the event loop of `dlcpd --config FILE` and the parts it
//!   composes: trainers and their local reduce, the pump between datapath and
//!   protocol, the `dlcpctl` admin protocol, operations.
//! - [`shm`]: the shared-memory channel to trainers (crate `dlcp-shm`).
//! - [`datapath`]: under the protocol, kernel UDP sockets or DPDK (where
//!   libdpdk was found at build time), and the fault injector that wraps
//!   either for tests and demos.
//! - [`hot_reload`], [`notify`], [`metrics`]: operations — hot reload on SIGHUP,
//!   systemd readiness and watchdog, the Prometheus endpoint.
//! - [`demo`]: `dlcpd demo` — N daemons on loopback with synthetic trainers.
//! - [`simulate`]: `dlcpd simulate` — the protocol core on the deterministic
//!   network simulator.
#![deny(unsafe_code)]
// serde_json::json! of `dlcpctl stats --json` nests deeper than the default 128.
#![recursion_limit = "256"]

pub mod datapath;
pub mod demo;
pub mod hot_reload;
pub mod metrics;
pub mod notify;
pub mod service;
pub mod simulate;

pub use dlcp_config as config;
pub use dlcp_proto as proto;
pub use dlcp_shm as shm;

/// Version string: crate version plus the `git describe` of the build.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("DLCP_GIT_DESCRIBE"), ")");

/// One line saying which datapaths this build has.
pub fn datapath_support() -> String {
    format!("datapaths: socket (always){}", dlcp_ffi::build_status_suffix())
}

/// True if `e` says stdout's reader went away (`dlcpctl status | head -1`).
///
/// Rust ignores SIGPIPE, so such a write fails with `EPIPE` instead of killing
/// the process, and `println!` would panic on it. The command-line tools treat
/// it as the reader having seen all it wanted: they stop writing and exit
/// quietly, with the status they would have had. (SIGPIPE is not reset to its
/// default instead: the daemon, also in `dlcpd demo`, writes to trainers',
/// `dlcpctl`'s and scrapers' sockets, and one of them closing its end must
/// never kill it.)
pub fn is_closed_stdout(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}

/// Writes `text` to stdout and flushes it; a reader that went away is not an
/// error ([`is_closed_stdout`]).
pub fn write_stdout(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if !is_closed_stdout(&e) => Err(e),
        _ => Ok(()),
    }
}
