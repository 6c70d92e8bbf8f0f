//! # dlcp-ffi — DPDK bindings for dlcp
//!
//! Where `pkg-config` finds libdpdk ≥ 22.11 this crate will hold bindgen-generated
//! bindings and safe wrappers (EAL, mempool, port, queue, mbuf). Today it only
//! reports what the build-time probe found, so the daemon can say at start-up
//! which datapaths it has.
#![forbid(unsafe_code)]

/// What the build-time DPDK probe found.
pub const DPDK_PROBE: &str = env!("DLCP_DPDK_PROBE");

/// Whether the DPDK datapath is compiled into this build.
pub const DPDK_BUILT: bool = false;

/// A suffix for the daemon's "datapaths: ..." start-up line.
pub fn build_status_suffix() -> String {
    if DPDK_BUILT { ", dpdk".to_string() } else { format!("; dpdk not built ({DPDK_PROBE})") }
}

#[cfg(test)]
mod tests {
    #[test]
    fn status_names_the_probe() {
        assert!(super::build_status_suffix().contains("libdpdk"));
    }
}
