//! dlcpd, the per-host dlcp daemon.
fn main() {}
