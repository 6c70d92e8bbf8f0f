//! The DPDK probe's decisions, shared by `ffi/build.rs` (as `mod probe`) and
//! `ffi/tests/probe.rs`: which directories pkg-config searches for `libdpdk.pc`,
//! which one it finds, and what cargo must watch so the probe re-runs when
//! libdpdk appears, changes or goes away. Nothing here runs pkg-config or prints;
//! it only looks at the file system.
//!
//! What cargo does with `rerun-if-changed=PATH` decides what to watch:
//!
//! * a missing path counts as changed on every build, so a directory that does
//!   not exist yet is watched through its parent or grandparent instead (creating
//!   it changes the parent's modification time);
//! * a directory counts as changed when anything in it, at any depth, is newer
//!   than the last run (cargo walks it on every build), so `/` and any directory
//!   that holds the build's own output (which changes on every build) are never
//!   watched, and a missing directory is not watched through an ancestor more than
//!   [`MAX_LEVELS_UP`] levels up (that could be a home directory).
//!
//! Watching a found `libdpdk.pc`'s directory, not only the file, also catches an
//! upgrade by dpkg: it replaces the file by a rename, which keeps the packaged
//! (old) modification time on the file but updates the directory's.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The pkg-config module the probe looks for.
pub const MODULE: &str = "libdpdk";

/// How far up a missing search directory's ancestors are tried for an existing
/// one to watch (`/usr/local/lib/x86_64-linux-gnu/pkgconfig` → `/usr/local/lib`).
pub const MAX_LEVELS_UP: usize = 2;

/// pkgconf's usual built-in search path, for when `pkg-config` itself is missing
/// (so installing it together with libdpdk is still noticed); `multiarch` is
/// Debian's triplet directory (`x86_64-linux-gnu`).
pub fn fallback_pc_path(multiarch: &str) -> String {
    format!(
        "/usr/local/lib/{multiarch}/pkgconfig:/usr/local/lib/pkgconfig:/usr/local/share/pkgconfig:\
         /usr/lib/{multiarch}/pkgconfig:/usr/lib/pkgconfig:/usr/share/pkgconfig"
    )
}

/// The directories pkg-config searches, in its order: `PKG_CONFIG_PATH`'s
/// entries, then `PKG_CONFIG_LIBDIR`'s where that is set (even to nothing), else
/// the built-in `default_pc_path` (`pkg-config --variable pc_path pkg-config`).
/// Empty entries are dropped, repeated ones kept once.
pub fn search_dirs(path: Option<&OsStr>, libdir: Option<&OsStr>, default_pc_path: &OsStr) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let tail = libdir.unwrap_or(default_pc_path);
    for list in path.into_iter().chain([tail]) {
        for d in std::env::split_paths(list) {
            if !d.as_os_str().is_empty() && !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    dirs
}

/// The first `libdpdk.pc` in `dirs`: the one pkg-config reads.
pub fn find_pc(dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(format!("{MODULE}.pc"))).find(|p| p.is_file())
}

/// The paths to hand cargo as `rerun-if-changed`: the found `.pc` file (if any),
/// and every search directory up to and including the one it was found in (all
/// of them when none was found), each missing one through an existing ancestor.
/// `out_dir` is the build's `OUT_DIR`: no watched directory may contain it.
pub fn watch_paths(dirs: &[PathBuf], found: Option<&Path>, out_dir: &Path) -> Vec<PathBuf> {
    let mut watch: Vec<PathBuf> = found.map(Path::to_path_buf).into_iter().collect();
    let found_dir = found.and_then(Path::parent);
    for d in dirs {
        match watchable(d, out_dir) {
            Some(w) if !watch.contains(&w) => watch.push(w),
            _ => {}
        }
        if found_dir == Some(d.as_path()) {
            break;
        }
    }
    watch
}

/// `dir` itself if it exists, else its nearest existing ancestor at most
/// [`MAX_LEVELS_UP`] levels up; `None` if that is `/`, holds `out_dir`, or none
/// exists within reach.
pub fn watchable(dir: &Path, out_dir: &Path) -> Option<PathBuf> {
    let abs = std::path::absolute(dir).ok()?;
    let existing = abs.ancestors().take(MAX_LEVELS_UP + 1).find(|a| a.is_dir())?;
    let real = existing.canonicalize().ok()?;
    let out = out_dir.canonicalize().unwrap_or_else(|_| out_dir.to_path_buf());
    (real.parent().is_some() && !out.starts_with(&real)).then(|| existing.to_path_buf())
}

/// Split pkg-config output into flags (pkg-config escapes spaces inside a flag with `\ `).
pub fn split_flags(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c.is_whitespace() => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}
