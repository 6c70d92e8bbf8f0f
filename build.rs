//! Thin build script for the facade crate: stamp a version string that says which
//! commit it was built from, and pass on dlcp-ffi's `dpdk` cfg. The DPDK probe lives in
//! `ffi/build.rs`.
use std::process::Command;

fn main() {
    // dlcp-ffi (links = "dlcp_dpdk") says whether it built the DPDK bindings;
    // the daemon's DPDK datapath and its tests exist under the same `dpdk` cfg.
    println!("cargo::rustc-check-cfg=cfg(dpdk)");
    if std::env::var("DEP_DLCP_DPDK_BUILT").as_deref() == Ok("1") {
        println!("cargo::rustc-cfg=dpdk");
    }
    println!("cargo::rerun-if-changed=.git/HEAD");
    let describe = Command::new("git")
        .args(["describe", "--always", "--dirty", "--tags"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo::rustc-env=DLCP_GIT_DESCRIBE={describe}");
}
