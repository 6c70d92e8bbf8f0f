//! # dlcp-ffi — DPDK bindings for dlcp
//!
//! Where `pkg-config` finds libdpdk ≥ 22.11 at build time (and `DLCP_NO_DPDK` is
//! not set), `build.rs` generates bindings with bindgen from DPDK's headers (an
//! allowlist of what dlcp uses), compiles a small C shim over DPDK's `static
//! inline` functions and macros, links DPDK dynamically (so EAL loads its PMD
//! plugins) and sets the `dpdk` cfg; [`dpdk`] then holds the safe wrappers that
//! own all the `unsafe`: EAL (once per process), mempool, port and queues, mbuf.
//! Without DPDK the crate still builds, [`DPDK_BUILT`] is false and
//! [`DPDK_PROBE`] says why, so the daemon reports it at start-up and falls back
//! to sockets.
#![cfg_attr(not(dpdk), forbid(unsafe_code))]

/// What the build-time DPDK probe found (e.g. `libdpdk 22.11.11`, or why not).
pub const DPDK_PROBE: &str = env!("DLCP_DPDK_PROBE");

/// Whether the DPDK datapath is compiled into this build.
pub const DPDK_BUILT: bool = cfg!(dpdk);

/// A suffix for the daemon's "datapaths: ..." start-up line.
pub fn build_status_suffix() -> String {
    if DPDK_BUILT { format!(", dpdk ({DPDK_PROBE})") } else { format!("; dpdk not built ({DPDK_PROBE})") }
}

#[cfg(dpdk)]
#[allow(
    missing_docs,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    unnecessary_transmutes,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/dpdk_bindings.rs"));
}

#[cfg(dpdk)]
pub mod dpdk;

#[cfg(test)]
mod tests {
    #[test]
    fn status_names_the_probe() {
        let s = super::build_status_suffix();
        assert!(s.contains(super::DPDK_PROBE), "{s}");
        assert_eq!(s.starts_with(", dpdk"), super::DPDK_BUILT);
    }
}
