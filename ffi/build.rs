//! Probe for DPDK (`pkg-config libdpdk >= 22.11`). The DPDK datapath (bindgen
//! bindings and queue wrappers) is not built yet; this script tells the
//! operator so with a cargo warning and exposes the probe result to the crate.

use std::process::Command;

fn main() {
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_LIBDIR");
    println!("cargo::rerun-if-env-changed=DLCP_NO_DPDK");
    let version = if std::env::var_os("DLCP_NO_DPDK").is_some() {
        None
    } else {
        Command::new("pkg-config")
            .args(["--atleast-version=22.11", "--modversion", "libdpdk"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match &version {
        Some(v) => {
            println!(
                "cargo::warning=libdpdk {v} found; the DPDK datapath is not implemented in this build yet: socket datapath only"
            );
            println!("cargo::rustc-env=DLCP_DPDK_PROBE=libdpdk {v} found, DPDK datapath not implemented yet");
        }
        None => {
            println!(
                "cargo::warning=libdpdk >= 22.11 not found by pkg-config: the DPDK datapath is not built (socket datapath only)"
            );
            println!("cargo::rustc-env=DLCP_DPDK_PROBE=libdpdk not found at build time");
        }
    }
}
