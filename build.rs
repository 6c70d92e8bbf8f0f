//! Thin build script for the facade crate: stamp a version string that says which
//! commit it was built from. The DPDK probe lives in `ffi/build.rs`.
use std::process::Command;

fn main() {
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
