//! Build the DPDK bindings where `pkg-config libdpdk >= 22.11` finds DPDK:
//!
//! * bindgen reads `csrc/dlcp_shim.h` (DPDK's public headers plus dlcp's shim
//!   declarations) with every cflag pkg-config gives (it includes
//!   `-include rte_config.h` and `-march=corei7`; never `-march=native`), keeping
//!   only an allowlist of what dlcp uses;
//! * `cc` compiles `csrc/dlcp_shim.c`, which wraps DPDK's `static inline`
//!   functions and macros (rx/tx burst, mbuf alloc/free/mtod/append, rte_errno),
//!   with the same cflags;
//! * the DPDK libraries are linked dynamically, so EAL loads its PMD plugins
//!   (`net_ring`, `net_af_packet`, `mempool_ring`, …) from the directory it was
//!   built with (Debian: `/usr/lib/x86_64-linux-gnu/dpdk/pmds-23.0`).
//!
//! Without libdpdk (or with `DLCP_NO_DPDK` set) the crate builds without them and
//! a cargo warning says so; the `dpdk` cfg tells the crate which case it is in.
//!
//! The probe re-runs when libdpdk is installed, upgraded or removed after a first
//! build (no `cargo clean` needed): cargo watches the `libdpdk.pc` found and the
//! pkg-config search directories (see `probe.rs`, which decides what to watch).

use std::path::PathBuf;
use std::process::Command;

mod probe;

fn pkg_config(args: &[&str]) -> Option<String> {
    Command::new("pkg-config")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// Tell cargo to re-run this script when `libdpdk.pc` appears, changes or goes
/// away in any directory pkg-config searches.
fn watch_pkg_config(out_dir: &std::path::Path) {
    let default_pc_path = pkg_config(&["--variable", "pc_path", "pkg-config"]).unwrap_or_else(|| {
        let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
        probe::fallback_pc_path(&format!("{arch}-linux-gnu"))
    });
    let dirs = probe::search_dirs(
        std::env::var_os("PKG_CONFIG_PATH").as_deref(),
        std::env::var_os("PKG_CONFIG_LIBDIR").as_deref(),
        default_pc_path.as_ref(),
    );
    let found = probe::find_pc(&dirs);
    for p in probe::watch_paths(&dirs, found.as_deref(), out_dir) {
        println!("cargo::rerun-if-changed={}", p.display());
    }
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(dpdk)");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_LIBDIR");
    println!("cargo::rerun-if-env-changed=DLCP_NO_DPDK");
    println!("cargo::rerun-if-changed=csrc/dlcp_shim.h");
    println!("cargo::rerun-if-changed=csrc/dlcp_shim.c");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    if std::env::var_os("DLCP_NO_DPDK").is_some() {
        println!("cargo::warning=DLCP_NO_DPDK is set: the DPDK datapath is not built (socket datapath only)");
        println!("cargo::rustc-env=DLCP_DPDK_PROBE=DPDK disabled at build time (DLCP_NO_DPDK)");
        println!("cargo::metadata=built=0");
        return;
    }
    watch_pkg_config(&out);
    // Two calls: pkgconf prints nothing for `--modversion` combined with `--atleast-version`.
    let version = pkg_config(&["--atleast-version=22.11", "libdpdk"])
        .and_then(|_| pkg_config(&["--modversion", "libdpdk"]));
    let Some(version) = version else {
        println!(
            "cargo::warning=libdpdk >= 22.11 not found by pkg-config: the DPDK datapath is not built (socket datapath only)"
        );
        println!("cargo::rustc-env=DLCP_DPDK_PROBE=libdpdk >= 22.11 not found by pkg-config at build time");
        println!("cargo::metadata=built=0");
        return;
    };
    let cflags = pkg_config(&["--cflags", "libdpdk"]).unwrap_or_default();
    let libs = pkg_config(&["--libs", "libdpdk"]).unwrap_or_default();
    let cflags = probe::split_flags(&cflags);
    assert!(
        !cflags.iter().any(|f| f == "-march=native"),
        "pkg-config libdpdk asks for -march=native; dlcp refuses to build a host-specific binary"
    );

    // The shim: DPDK's inline functions and macros as real symbols.
    let mut build = cc::Build::new();
    build.file("csrc/dlcp_shim.c").include("csrc").warnings(true);
    for f in &cflags {
        build.flag(f);
    }
    build.compile("dlcp_dpdk_shim");

    // Dynamic linking of every DPDK library pkg-config names (rustc passes
    // --as-needed, so only those used end up in DT_NEEDED); the plugins are
    // loaded by EAL at run time.
    for f in probe::split_flags(&libs) {
        if let Some(dir) = f.strip_prefix("-L") {
            println!("cargo::rustc-link-search=native={dir}");
        } else if let Some(lib) = f.strip_prefix("-l") {
            println!("cargo::rustc-link-lib=dylib={lib}");
        }
    }

    let mut b = bindgen::Builder::default()
        .header("csrc/dlcp_shim.h")
        .rust_edition(bindgen::RustEdition::Edition2024)
        .rust_target(bindgen::RustTarget::stable(85, 0).expect("Rust 1.85 is a stable target"))
        .use_core()
        .layout_tests(false)
        .derive_default(true)
        .generate_comments(false)
        .wrap_unsafe_ops(true)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .opaque_type("rte_mbuf")
        .opaque_type("rte_mempool")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for f in &cflags {
        b = b.clang_arg(f);
    }
    for f in [
        "rte_eal_init",
        "rte_eal_cleanup",
        "rte_strerror",
        "rte_socket_id",
        "rte_eth_dev_count_avail",
        "rte_eth_dev_is_valid_port",
        "rte_eth_dev_info_get",
        "rte_eth_dev_configure",
        "rte_eth_rx_queue_setup",
        "rte_eth_tx_queue_setup",
        "rte_eth_dev_start",
        "rte_eth_dev_stop",
        "rte_eth_dev_close",
        "rte_eth_dev_socket_id",
        "rte_eth_dev_get_name_by_port",
        "rte_eth_macaddr_get",
        "rte_eth_promiscuous_enable",
        "rte_eth_link_get_nowait",
        "rte_eth_stats_get",
        "rte_eth_dev_set_mtu",
        "rte_pktmbuf_pool_create",
        "rte_mempool_free",
        "rte_mempool_avail_count",
        "dlcp_.*",
    ] {
        b = b.allowlist_function(f);
    }
    for t in ["rte_eth_conf", "rte_eth_dev_info", "rte_ether_addr", "rte_eth_stats", "rte_eth_link"] {
        b = b.allowlist_type(t);
    }
    b = b.allowlist_var("dlcp_.*").allowlist_var("RTE_ETH_MQ_.*");
    let bindings = b.generate().expect("bindgen failed on csrc/dlcp_shim.h with pkg-config libdpdk's cflags");
    bindings.write_to_file(out.join("dpdk_bindings.rs")).expect("write dpdk_bindings.rs");

    println!("cargo::rustc-cfg=dpdk");
    println!("cargo::metadata=built=1");
    println!("cargo::rustc-env=DLCP_DPDK_PROBE=libdpdk {version}");
}
