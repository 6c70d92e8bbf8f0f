//! Test prerequisites a machine may lack (the DPDK datapath, network namespaces,
//! tcpdump, Python, PyTorch, ...), handled one way everywhere: a test that cannot
//! run never passes silently.
//!
//! * Where the prerequisite is required, its absence FAILS the test, naming it:
//!   `DLCP_REQUIRE_<NAME>=1` requires that one (`scripts/test.sh` sets it for
//!   everything it installs), `DLCP_CI=1` requires all of them (`.ci/run`), and
//!   `DLCP_REQUIRE_<NAME>=0` exempts one even under `DLCP_CI`.
//! * Elsewhere the test is reported as skipped: a `SKIPPED <binary>::<test>: ...`
//!   line written to the real stderr (the test harness does not capture it, so it
//!   shows in `cargo test`'s output even though the test passes) and, where
//!   `DLCP_SKIP_LOG` names a file, one tab-separated line appended to it
//!   (binary, test, variable, reason) for `scripts/test.sh`'s summary.
//!
//! Root-package tests use it as `mod prereq;`; `client/tests` includes this file
//! by path.
#![allow(dead_code)]

use std::io::Write;

/// Something a test needs that a machine may not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prereq {
    /// A build with the DPDK datapath (pkg-config found libdpdk >= 22.11).
    Dpdk,
    /// Root and working network namespaces (`ip netns add`), and /dev/net/tun.
    Netns,
    /// `tcpdump`.
    Tcpdump,
    /// Debian's `/usr/bin/python3` with numpy, and `libdlcp_client.so`.
    Python,
    /// Debian's `/usr/bin/python3` with torch and scikit-learn.
    Torch,
    /// `systemd-analyze`.
    Systemd,
    /// The IPv6 loopback address `::1`.
    Ipv6,
    /// UDP GSO/GRO in the kernel.
    Gso,
}

impl Prereq {
    /// The variable that requires (`1`) or exempts (`0`) it.
    pub fn var(self) -> &'static str {
        match self {
            Prereq::Dpdk => "DLCP_REQUIRE_DPDK",
            Prereq::Netns => "DLCP_REQUIRE_NETNS",
            Prereq::Tcpdump => "DLCP_REQUIRE_TCPDUMP",
            Prereq::Python => "DLCP_REQUIRE_PYTHON",
            Prereq::Torch => "DLCP_REQUIRE_TORCH",
            Prereq::Systemd => "DLCP_REQUIRE_SYSTEMD",
            Prereq::Ipv6 => "DLCP_REQUIRE_IPV6",
            Prereq::Gso => "DLCP_REQUIRE_GSO",
        }
    }

    /// What is missing, in words.
    pub fn what(self) -> &'static str {
        match self {
            Prereq::Dpdk => "the DPDK datapath is not built",
            Prereq::Netns => "no network namespaces",
            Prereq::Tcpdump => "no tcpdump",
            Prereq::Python => "no Python client environment",
            Prereq::Torch => "no PyTorch environment",
            Prereq::Systemd => "no systemd-analyze",
            Prereq::Ipv6 => "no IPv6 loopback",
            Prereq::Gso => "no UDP GSO/GRO in this kernel",
        }
    }

    /// Whether its absence fails a test here.
    pub fn required(self) -> bool {
        match std::env::var(self.var()) {
            Ok(v) => v == "1",
            Err(_) => std::env::var("DLCP_CI").is_ok_and(|v| v == "1"),
        }
    }
}

/// `binary::test` of the running test: the test harness names each test's
/// thread after the test; the binary is the executable's name without cargo's hash.
fn test_name() -> String {
    let exe = std::env::current_exe().ok();
    let stem = exe.as_ref().and_then(|e| e.file_stem()).map(|s| s.to_string_lossy().into_owned());
    let binary = stem.as_deref().map_or("?", |s| s.rsplit_once('-').map_or(s, |(b, _)| b)).to_string();
    let thread = std::thread::current();
    format!("{binary}::{}", thread.name().unwrap_or("?"))
}

/// The running test cannot run because `p` is missing (`why` says how it
/// showed). Panics where `p` is required; otherwise reports the skip (see the
/// module docs) and returns, and the caller returns.
pub fn skip(p: Prereq, why: &str) {
    let name = test_name();
    let var = p.var();
    assert!(
        !p.required(),
        "{name}: {} ({why}); {var}=1 or DLCP_CI=1 requires it here (set {var}=0 to skip instead)",
        p.what()
    );
    let line = format!("\nSKIPPED {name}: {} ({why}); {var}=1 makes this a failure\n", p.what());
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    if let Some(log) = std::env::var_os("DLCP_SKIP_LOG") {
        let (binary, test) = name.split_once("::").unwrap_or(("?", &name));
        let record = format!("{binary}\t{test}\t{var}\t{}: {}\n", p.what(), why.replace(['\t', '\n'], " "));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log);
        if let Err(e) = file.and_then(|mut f| f.write_all(record.as_bytes())) {
            panic!("cannot record the skip in DLCP_SKIP_LOG={}: {e}", log.to_string_lossy());
        }
    }
}
