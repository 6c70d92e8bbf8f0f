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
