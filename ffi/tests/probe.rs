//! The DPDK probe re-runs when libdpdk appears, changes or goes away, and only
//! then. `ffi/probe.rs` (the build script's decisions) is tested directly, and a
//! scratch crate whose build script makes the same calls is built with cargo
//! (offline, no dependencies) against temporary pkg-config directories: a
//! `libdpdk.pc` added, shadowed, replaced dpkg-style and removed between builds
//! makes the next build re-run the probe; a build with nothing changed does not.

#[path = "../probe.rs"]
mod probe;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
        let p = std::env::temp_dir().join(format!("dlcp-probe-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pc(version: &str) -> String {
    format!("Name: DPDK\nDescription: test\nVersion: {version}\nLibs: -lrte_eal\nCflags: -I/nonexistent\n")
}

#[test]
fn search_dirs_follow_pkg_config_order() {
    let d = |s: &str| probe::search_dirs(Some(s.as_ref()), None, "/x:/y".as_ref());
    assert_eq!(d("/p:/q"), [Path::new("/p"), Path::new("/q"), Path::new("/x"), Path::new("/y")]);
    assert_eq!(
        d(":/p::/x"),
        [Path::new("/p"), Path::new("/x"), Path::new("/y")],
        "empty and repeated entries"
    );
    let libdir = probe::search_dirs(Some("/p".as_ref()), Some("/l".as_ref()), "/x:/y".as_ref());
    assert_eq!(libdir, [Path::new("/p"), Path::new("/l")], "PKG_CONFIG_LIBDIR replaces the built-in path");
    let empty = probe::search_dirs(None, Some("".as_ref()), "/x".as_ref());
    assert!(empty.is_empty(), "an empty PKG_CONFIG_LIBDIR searches nothing: {empty:?}");
    let fallback = probe::fallback_pc_path("x86_64-linux-gnu");
    let dirs = probe::search_dirs(None, None, fallback.as_ref());
    assert!(dirs.contains(&PathBuf::from("/usr/lib/x86_64-linux-gnu/pkgconfig")), "{dirs:?}");
    assert_eq!(dirs.len(), 6);
}

#[test]
fn watches_found_file_and_the_directories_that_could_shadow_it() {
    let t = TempDir::new("watch");
    let (a, b, c) = (t.0.join("a/pkgconfig"), t.0.join("b/pkgconfig"), t.0.join("c/pkgconfig"));
    for d in [&a, &b, &c] {
        std::fs::create_dir_all(d).unwrap();
    }
    let out = t.0.join("target/out");
    std::fs::create_dir_all(&out).unwrap();
    let dirs = vec![a.clone(), b.clone(), c.clone()];
    assert_eq!(probe::find_pc(&dirs), None);
    assert_eq!(probe::watch_paths(&dirs, None, &out), dirs, "nothing found: every search directory");

    std::fs::write(c.join("libdpdk.pc"), pc("22.11.0")).unwrap();
    std::fs::write(b.join("libdpdk.pc"), pc("23.11.0")).unwrap();
    let found = probe::find_pc(&dirs).expect("found");
    assert_eq!(found, b.join("libdpdk.pc"), "the first directory wins");
    assert_eq!(probe::watch_paths(&dirs, Some(&found), &out), [found.clone(), a, b], "not c: b shadows it");
}

#[test]
fn missing_directories_are_watched_through_a_near_existing_ancestor() {
    let t = TempDir::new("missing");
    let out = t.0.join("target/out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(t.0.join("opt")).unwrap();
    let w = |p: &Path| probe::watchable(p, &out);
    assert_eq!(w(&t.0.join("opt/lib/pkgconfig")), Some(t.0.join("opt")), "two levels up");
    assert_eq!(w(&t.0.join("opt/pkgconfig")), Some(t.0.join("opt")), "one level up");
    assert_eq!(w(&t.0.join("opt/x/lib/pkgconfig")), None, "three levels up is too far");
    assert_eq!(w(&t.0.join("nothing")), None, "the parent holds OUT_DIR: it changes on every build");
    assert_eq!(w(&t.0.join("target")), None, "holds OUT_DIR");
    assert_eq!(w(Path::new("/")), None, "cargo would walk the whole file system");
    assert_eq!(w(Path::new("/nonexistent-dlcp-probe/pkgconfig")), None, "only / exists above it");
    let dirs = [t.0.join("opt/lib/pkgconfig"), t.0.join("opt/share/pkgconfig")];
    assert_eq!(probe::watch_paths(&dirs, None, &out), [t.0.join("opt")], "watched once");
}

#[test]
fn split_flags_keeps_escaped_spaces() {
    assert_eq!(
        probe::split_flags(" -I/a\\ b  -include rte_config.h\n"),
        ["-I/a b", "-include", "rte_config.h"]
    );
}

/// A scratch crate whose build script runs the probe's watch logic against
/// `PKG_CONFIG_PATH` / `PKG_CONFIG_LIBDIR` and appends what it found to `log`.
fn scratch_crate(dir: &Path, log: &Path) {
    let probe_rs = Path::new(env!("CARGO_MANIFEST_DIR")).join("probe.rs");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        "[package]\nname = \"probe-scratch\"\nversion = \"0.1.0\"\nedition = \"2024\"\n[workspace]\n",
    )
    .unwrap();
    std::fs::write(dir.join("src/lib.rs"), "//! Empty.\n").unwrap();
    let build = format!(
        r#"#[path = {probe_rs:?}]
mod probe;
use std::io::Write;
fn main() {{
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_LIBDIR");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let dirs = probe::search_dirs(
        std::env::var_os("PKG_CONFIG_PATH").as_deref(),
        std::env::var_os("PKG_CONFIG_LIBDIR").as_deref(),
        "".as_ref(),
    );
    let found = probe::find_pc(&dirs);
    for p in probe::watch_paths(&dirs, found.as_deref(), &out) {{
        println!("cargo::rerun-if-changed={{}}", p.display());
    }}
    let version = found.as_ref().map(|p| std::fs::read_to_string(p).unwrap().lines().find(|l| l.starts_with("Version:")).unwrap().to_string());
    let mut log = std::fs::OpenOptions::new().append(true).create(true).open({log:?}).unwrap();
    writeln!(log, "{{found:?}} {{version:?}}").unwrap();
}}
"#
    );
    std::fs::write(dir.join("build.rs"), build).unwrap();
}

#[test]
fn a_scratch_build_reprobes_when_libdpdk_appears_changes_or_goes() {
    let t = TempDir::new("cargo");
    let (libdir, path) = (t.0.join("pc"), t.0.join("opt/lib/pkgconfig"));
    std::fs::create_dir_all(&libdir).unwrap();
    std::fs::create_dir_all(t.0.join("opt")).unwrap(); // opt/lib/pkgconfig does not exist yet
    let (krate, log) = (t.0.join("crate"), t.0.join("probes.log"));
    scratch_crate(&krate, &log);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let build = || {
        let out = Command::new(&cargo)
            .args(["build", "--offline", "--quiet", "--manifest-path"])
            .arg(krate.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(krate.join("target"))
            .env("PKG_CONFIG_PATH", &path)
            .env("PKG_CONFIG_LIBDIR", &libdir)
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .expect("run cargo");
        assert!(out.status.success(), "scratch build failed: {}", String::from_utf8_lossy(&out.stderr));
        std::fs::read_to_string(&log).unwrap_or_default().lines().map(String::from).collect::<Vec<_>>()
    };
    let last = |probes: &[String]| probes.last().cloned().unwrap_or_default();

    let probes = build();
    assert_eq!(probes, ["None None"], "first build probes once, finds nothing");
    assert_eq!(build().len(), 1, "nothing changed: no re-probe");

    std::fs::write(libdir.join("libdpdk.pc"), pc("22.11.0")).unwrap();
    let probes = build();
    assert_eq!(probes.len(), 2, "libdpdk.pc installed: re-probed ({probes:?})");
    assert!(last(&probes).contains("pc/libdpdk.pc") && last(&probes).contains("22.11.0"), "{probes:?}");
    assert_eq!(build().len(), 2, "nothing changed: no re-probe");

    // A search directory that did not exist appears, earlier in the search order.
    std::fs::create_dir_all(&path).unwrap();
    std::fs::write(path.join("libdpdk.pc"), pc("22.11.4")).unwrap();
    let probes = build();
    assert_eq!(probes.len(), 3, "a shadowing libdpdk.pc appeared: re-probed ({probes:?})");
    assert!(last(&probes).contains("opt/lib/pkgconfig/libdpdk.pc"), "{probes:?}");

    // dpkg's upgrade: the new file (with the package's old modification time) renamed over the old one.
    let new = path.join("libdpdk.pc.dpkg-new");
    std::fs::write(&new, pc("22.11.5")).unwrap();
    let old_time = SystemTime::now() - Duration::from_secs(30 * 86_400);
    std::fs::File::options().write(true).open(&new).unwrap().set_modified(old_time).unwrap();
    std::fs::rename(&new, path.join("libdpdk.pc")).unwrap();
    let probes = build();
    assert_eq!(probes.len(), 4, "libdpdk.pc upgraded: re-probed ({probes:?})");
    assert!(last(&probes).contains("22.11.5"), "{probes:?}");

    std::fs::remove_file(path.join("libdpdk.pc")).unwrap();
    let probes = build();
    assert_eq!(probes.len(), 5, "libdpdk.pc removed: re-probed ({probes:?})");
    assert!(last(&probes).contains("pc/libdpdk.pc") && last(&probes).contains("22.11.0"), "{probes:?}");
    assert_eq!(build().len(), 5, "nothing changed: no re-probe");
}
