//! Thin build script for the facade crate: stamp a version string that says which
//! commit it was built from, and pass on dlcp-ffi's `dpdk` cfg. The DPDK probe lives in
//! `ffi/build.rs`.
use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The files whose change means a new commit or checkout: this checkout's `HEAD`
/// (in a worktree `.git` is a file naming another directory, so `.git/HEAD` does
/// not exist) and the branch it points to. Only existing ones: cargo re-runs the
/// script on every build for a missing path, and then rebuilds the whole package.
fn git_watch() -> Vec<String> {
    let mut paths: Vec<String> = git(&["rev-parse", "--git-path", "HEAD"]).into_iter().collect();
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        paths.extend(git(&["rev-parse", "--git-path", &branch]));
        paths.extend(git(&["rev-parse", "--git-path", "packed-refs"]));
    }
    paths.retain(|p| Path::new(p).exists());
    if paths.is_empty() {
        // Not a git checkout: stamp once (not on every change in the package).
        paths.push("build.rs".into());
    }
    paths
}

fn main() {
    // dlcp-ffi (links = "dlcp_dpdk") says whether it built the DPDK bindings;
    // the daemon's DPDK datapath and its tests exist under the same `dpdk` cfg.
    println!("cargo::rustc-check-cfg=cfg(dpdk)");
    if std::env::var("DEP_DLCP_DPDK_BUILT").as_deref() == Ok("1") {
        println!("cargo::rustc-cfg=dpdk");
    }
    for p in git_watch() {
        println!("cargo::rerun-if-changed={p}");
    }
    let describe = git(&["describe", "--always", "--dirty", "--tags"]).unwrap_or_else(|| "unknown".into());
    println!("cargo::rustc-env=DLCP_GIT_DESCRIBE={describe}");
}
