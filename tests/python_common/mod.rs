//! Shared by the tests that run Python trainers: the interpreter they use and
//! the client library this test build produced.
#![allow(dead_code)]

use std::path::PathBuf;

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
