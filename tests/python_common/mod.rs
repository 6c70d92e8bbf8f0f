//! Shared by the tests that run Python trainers: the interpreter they use and
//! the client library this test build produced.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use crate::prereq::{Prereq, skip};

/// Debian's Python (the one the .deb and `scripts/test.sh` provision).
pub const PYTHON: &str = "/usr/bin/python3";

/// `libdlcp_client.so` of this test's profile, the newer of `target/<profile>/deps/`
/// (what `cargo test` rebuilds) and `target/<profile>/` (what `cargo build` uplifts).
pub fn client_lib() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [deps.join("libdlcp_client.so"), deps.parent()?.join("libdlcp_client.so")]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
}

/// What a numpy trainer needs: `python3-numpy` and [`client_lib`]. `None`
/// after reporting the missing one as a skip (a failure under
/// `DLCP_REQUIRE_PYTHON=1` / `DLCP_CI=1`).
pub fn numpy_and_client_lib() -> Option<PathBuf> {
    let numpy = Command::new(PYTHON).args(["-c", "import numpy"]).output().is_ok_and(|o| o.status.success());
    if !numpy {
        skip(Prereq::Python, &format!("{PYTHON} cannot import numpy (apt-get install -y python3-numpy)"));
        return None;
    }
    let lib = client_lib();
    if lib.is_none() {
        skip(
            Prereq::Python,
            "libdlcp_client.so not built for this profile (cargo build [--release] -p dlcp-client)",
        );
    }
    lib
}
