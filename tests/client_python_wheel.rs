//! The installable Python client: a wheel built from `client/python` (with the
//! `libdlcp_client.so` of this test's profile bundled), pip-installed into a
//! fresh virtualenv (`--system-site-packages`, for Debian's numpy), used from a
//! temporary directory with `DLCP_LIB` and `PYTHONPATH` unset: `import dlcp`
//! comes from the virtualenv, loads the bundled library, and
//! `examples/numpy_allreduce.py` (a copy, outside the source tree) trains
//! through 2 real daemons, bit-identically with budget 0; a wrong job id is
//! refused at `attach()` naming both job ids.
//!
//! Needs Debian's `/usr/bin/python3` with `python3-numpy`, `python3-venv`,
//! `python3-pip`, `python3-setuptools` and `python3-wheel` (offline: the wheel is
//! built with `--no-build-isolation`, installed with `--no-index`), and the
//! library built (`cargo build [--release] -p dlcp-client`). Without them the test
//! fails under `DLCP_REQUIRE_PYTHON=1` / `DLCP_CI=1` and is skipped otherwise.

mod daemon_common;
mod prereq;
mod python_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use daemon_common::*;
use prereq::{Prereq, skip};
use python_common::{PYTHON, client_lib};

fn text(o: &Output) -> String {
    format!("{}\n--- stderr ---\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Runs `cmd` in `dir` with no Python or dlcp variables from this environment.
fn clean(mut cmd: Command, dir: &Path) -> Command {
    for var in
        ["DLCP_LIB", "PYTHONPATH", "DLCP_SOCKET", "DLCP_JOB", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "VIRTUAL_ENV"]
    {
        cmd.env_remove(var);
    }
    cmd.env("PYTHONDONTWRITEBYTECODE", "1").env("PIP_DISABLE_PIP_VERSION_CHECK", "1").current_dir(dir);
    cmd
}

fn run_ok(cmd: Command, dir: &Path, what: &str) -> String {
    let out = clean(cmd, dir).output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what} failed:\n{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn command(program: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

/// Copies what building the package reads (client/python, the workspace
/// manifest for the version) into `dst`, at the same relative places: the
/// build writes build/ and *.egg-info/ beside setup.py, not in the source tree.
fn copy_package_source(root: &Path, dst: &Path) {
    let pkg = dst.join("client/python/dlcp");
    std::fs::create_dir_all(&pkg).unwrap();
    for f in ["setup.py", "pyproject.toml"] {
        std::fs::copy(root.join("client/python").join(f), dst.join("client/python").join(f)).unwrap();
    }
    for f in ["__init__.py", "torch.py"] {
        std::fs::copy(root.join("client/python/dlcp").join(f), pkg.join(f)).unwrap();
    }
    std::fs::copy(root.join("Cargo.toml"), dst.join("Cargo.toml")).unwrap();
}

#[test]
fn pip_installed_wheel_imports_from_the_venv_and_trains_through_real_daemons() {
    let tools = Command::new(PYTHON)
        .args(["-c", "import numpy, setuptools, wheel, venv, ensurepip, pip"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !tools {
        return skip(
            Prereq::Python,
            &format!(
                "{PYTHON} lacks numpy, venv, pip, setuptools or wheel \
                 (apt-get install -y python3-numpy python3-venv python3-pip python3-setuptools python3-wheel)"
            ),
        );
    }
    let Some(lib) = client_lib() else {
        return skip(
            Prereq::Python,
            "libdlcp_client.so not built for this profile (cargo build [--release] -p dlcp-client)",
        );
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::Builder::new().prefix("dlcp-wheel-").tempdir().unwrap();
    let t = tmp.path();
    // 1. The wheel, offline, bundling this profile's library.
    copy_package_source(root, &t.join("src"));
    let mut wheel = command(
        Path::new(PYTHON),
        &[
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "-w",
            "dist",
            "src/client/python",
        ],
    );
    wheel.env("DLCP_CLIENT_LIB", &lib);
    run_ok(wheel, t, "pip wheel");
    let wheels: Vec<PathBuf> = std::fs::read_dir(t.join("dist"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    assert_eq!(wheels.len(), 1, "{wheels:?}");
    let name = wheels[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with(&format!("dlcp-{}-py3-none-linux_", env!("CARGO_PKG_VERSION"))), "{name}");
    let listing =
        run_ok(command(Path::new(PYTHON), &["-m", "zipfile", "-l", wheels[0].to_str().unwrap()]), t, "zip");
    for f in ["dlcp/__init__.py", "dlcp/torch.py", "dlcp/libdlcp_client.so"] {
        assert!(listing.contains(f), "the wheel lacks {f}:\n{listing}");
    }
    // 2. A fresh virtualenv (Debian's numpy and torch visible), the wheel installed offline.
    run_ok(
        command(Path::new(PYTHON), &["-m", "venv", "--system-site-packages", "venv"]),
        t,
        "python3 -m venv",
    );
    let py = t.join("venv/bin/python");
    let install = ["-m", "pip", "install", "--no-index", "--no-deps", wheels[0].to_str().unwrap()];
    run_ok(command(&py, &install), t, "pip install");
    // 3. From a temporary directory, no DLCP_LIB, no PYTHONPATH: the venv's dlcp, its bundled library.
    let work = t.join("work");
    std::fs::create_dir(&work).unwrap();
    let probe = "import dlcp, os; print(os.path.realpath(dlcp.__file__)); dlcp.load_library(); \
                 print(os.path.realpath(dlcp._lib._name)); print(dlcp.version())";
    let out = run_ok(command(&py, &["-c", probe]), &work, "import dlcp");
    let lines: Vec<&str> = out.lines().collect();
    let venv = std::fs::canonicalize(t.join("venv")).unwrap();
    let site = venv.to_string_lossy().into_owned();
    assert!(lines[0].starts_with(&site) && lines[0].contains("site-packages"), "dlcp imported from {out}");
    assert!(lines[1].starts_with(&site) && lines[1].ends_with("/dlcp/libdlcp_client.so"), "library: {out}");
    // 4. Real daemons: the example (a copy outside the source tree) on 1 trainer per host, budget 0.
    std::fs::copy(root.join("examples/numpy_allreduce.py"), work.join("numpy_allreduce.py")).unwrap();
    let cluster = Cluster::start(&Options { hosts: 2, ..Options::default() });
    // A wrong job id is refused at attach(), naming both job ids.
    let wrong = format!(
        "import dlcp\ntry:\n    dlcp.attach({:?}, job=999)\nexcept dlcp.RejectedError as e:\n    print(e)\n",
        cluster.daemons[0].socket.to_str().unwrap()
    );
    let out = run_ok(command(&py, &["-c", &wrong]), &work, "wrong job");
    assert!(out.contains("registered for job 999 but this daemon serves job 7"), "{out}");
    let mut children = Vec::new();
    for h in 0..2u32 {
        let mut cmd = command(&py, &["numpy_allreduce.py", "--steps", "8", "--budget", "0", "--lr", "0.2"]);
        cmd.arg("--socket").arg(&cluster.daemons[h as usize].socket);
        cmd.args(["--job", &JOB.to_string(), "--world-size", "2", "--rank", &h.to_string()]);
        let child = clean(cmd, &work).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        children.push(child);
    }
    let mut digests = Vec::new();
    for (h, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let all = text(&out);
        assert!(
            out.status.success(),
            "trainer {h} failed:\n{all}\n--- daemon log ---\n{}",
            cluster.log(h as u32)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let from = stdout.lines().find_map(|l| l.strip_prefix("dlcp ")).unwrap_or_default();
        assert!(from.contains(&format!("from {site}")), "the example used another dlcp: {all}");
        assert!(stdout.contains("delivered 1.0000"), "budget 0 delivers everything:\n{all}");
        let digest = stdout.lines().find_map(|l| l.strip_prefix("final weights sha256 ")).map(str::to_owned);
        digests.push(digest.unwrap_or_else(|| panic!("no digest:\n{all}")));
    }
    assert_eq!(digests[0], digests[1], "replicas drifted apart");
}
