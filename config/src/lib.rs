//! # dlcp-config — the TOML configuration schema of dlcpd
#![forbid(unsafe_code)]
