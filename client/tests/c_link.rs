//! The C side: `include/dlcp.h` agrees with the Rust ABI, and C programs compiled
//! against it with `cc` link with the cdylib and with the staticlib and run
//! against the fake reducer (see `common`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{FakeReducer, lib_dir, workspace_root};
use dlcp_client::ErrorCode;

fn header() -> String {
    std::fs::read_to_string(workspace_root().join("client/include/dlcp.h")).unwrap()
}

/// Runs `cc` with `args`, panicking with its stderr on failure.
fn cc(args: &[&str]) {
    let out = Command::new("cc").args(args).output().expect("cc (Debian: build-essential) is needed");
    assert!(out.status.success(), "cc {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

fn run(exe: &Path, args: &[&str]) -> String {
    // cargo's LD_LIBRARY_PATH (which beats a RUNPATH) may list target/<profile>, whose
    // uplifted libdlcp_client.so can be older than the one in deps/ we linked with.
    let out = Command::new(exe).args(args).env_remove("LD_LIBRARY_PATH").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

const CFLAGS: [&str; 5] = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"];

fn build_abi_test(out: &Path, link: &[&str]) -> PathBuf {
    let root = workspace_root();
    let inc = root.join("client/include");
    let src = root.join("client/tests/c/abi_test.c");
    let mut args: Vec<&str> = CFLAGS.to_vec();
    args.extend(["-I", p(&inc), p(&src), "-o", p(out)]);
    args.extend(link);
    cc(&args);
    out.to_path_buf()
}

#[test]
fn header_declares_every_error_code_and_every_exported_function() {
    let h = header();
    // Every `DLCP_ERR_X = -N` enumerator, in order, exactly the Rust codes.
    let enumerators: Vec<(String, i32)> = h
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("DLCP_ERR_") && l.contains(" = "))
        .map(|l| {
            let (name, rest) = l.split_once(" = ").unwrap();
            let num = rest.split(|c: char| c == ',' || c.is_whitespace()).next().unwrap();
            (name.to_owned(), num.parse().unwrap())
        })
        .collect();
    let want: Vec<(String, i32)> = ErrorCode::ALL.iter().map(|c| (c.name().to_owned(), *c as i32)).collect();
    assert_eq!(enumerators, want);
    assert!(h.contains("DLCP_OK = 0,"));
    let capi = std::fs::read_to_string(workspace_root().join("client/src/capi.rs")).unwrap();
    let exported: Vec<&str> =
        capi.split("pub extern \"C\" fn ").skip(1).map(|rest| rest.split('(').next().unwrap()).collect();
    assert_eq!(exported.len(), 26, "{exported:?}");
    // Function declarations: lines starting with a return type and `dlcp_name(`.
    let mut declared: Vec<&str> = h
        .lines()
        .filter_map(|l| ["int ", "float *", "const char *"].iter().find_map(|t| l.strip_prefix(t)))
        .filter_map(|rest| rest.strip_prefix("dlcp_").map(|_| rest.split('(').next().unwrap()))
        .collect();
    let mut exported = exported;
    declared.sort_unstable();
    exported.sort_unstable();
    assert_eq!(declared, exported, "dlcp.h declarations vs. the library's exports");
}

#[test]
fn c_program_links_with_the_cdylib_and_runs() {
    let fake = FakeReducer::start();
    let job7 = FakeReducer::for_job(7);
    let lib = lib_dir();
    let rpath = format!("-Wl,-rpath,{}", p(&lib));
    let exe = build_abi_test(&fake.dir().join("abi_test_shared"), &["-L", p(&lib), "-ldlcp_client", &rpath]);
    assert!(run(&exe, &[p(fake.socket()), p(job7.socket())]).contains("C ABI OK"));
    assert_eq!(job7.served(), 0);
    assert_eq!(fake.served(), 9);
}

#[test]
fn c_program_links_with_the_staticlib_and_runs() {
    let fake = FakeReducer::start();
    let a = lib_dir().join("libdlcp_client.a");
    assert!(a.exists(), "{} missing", a.display());
    let link = [p(&a), "-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"];
    let exe = build_abi_test(&fake.dir().join("abi_test_static"), &link);
    // Statically linked: the binary must not need the shared library.
    let ldd = Command::new("ldd").arg(&exe).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if let Ok(ldd) = ldd {
        assert!(!ldd.contains("libdlcp_client"), "{ldd}");
    }
    let job7 = FakeReducer::for_job(7);
    assert!(run(&exe, &[p(fake.socket()), p(job7.socket())]).contains("C ABI OK"));
}

#[test]
fn c_example_builds_and_runs() {
    let fake = FakeReducer::start();
    let lib = lib_dir();
    let root = workspace_root();
    let exe = fake.dir().join("allreduce");
    let rpath = format!("-Wl,-rpath,{}", p(&lib));
    let inc = root.join("client/include");
    let src = root.join("examples/c/allreduce.c");
    let mut args: Vec<&str> = CFLAGS.to_vec();
    args.extend(["-O2", "-I", p(&inc), p(&src), "-o", p(&exe), "-L", p(&lib), "-ldlcp_client", &rpath]);
    cc(&args);
    let out = run(&exe, &[p(fake.socket()), "7", "0", "1", "2"]);
    assert_eq!(out.lines().count(), 4, "{out}");
    // Step 0, layer 1 (first in backward order): sum of 2*(0.001*(i%97)) over 4096 elements.
    let want: f64 = (0..4096).map(|i| 2.0 * f64::from(0.001f32 * (i % 97) as f32)).sum();
    assert!(out.lines().next().unwrap().contains(&format!("sum {want:.3}")), "{out}");
    assert_eq!(fake.served(), 4);
}
