//! # dlcp
//!
//! Facade over the pieces of dlcp, a transport for distributed DNN training that
//! tolerates a bounded loss of gradient packets. See the workspace README.
//!
//! - [`proto`]: the sans-IO protocol core (wire format, priority classes,
//!   bounded-loss transfers, allreduce, deterministic simulator).
//! - [`config`]: the TOML configuration schema and its validation.

pub use dlcp_config as config;
pub use dlcp_proto as proto;

/// Version string: crate version plus the `git describe` of the build.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("DLCP_GIT_DESCRIBE"), ")");
