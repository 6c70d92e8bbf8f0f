//! The Python client against real `dlcpd` processes: 2 daemons on loopback, 2
//! Python trainers each (`examples/numpy_allreduce.py`, separate processes using
//! `client/python/dlcp` over `libdlcp_client.so`), reliable allreduce (budget 0).
//! Every trainer must see its loss fall and end with bit-identical weights.
//!
//! Needs Debian's `/usr/bin/python3` with `python3-numpy`, and
//! `libdlcp_client.so` built for the same profile as this test
//! (`cargo build [--release] -p dlcp-client`). Without them the test fails under
//! `DLCP_REQUIRE_PYTHON=1` / `DLCP_CI=1` and is reported as skipped otherwise
//! (see `tests/prereq`).

mod daemon_common;
mod prereq;
mod python_common;

use std::path::Path;
use std::process::{Command, Stdio};

use daemon_common::*;
use python_common::{PYTHON, numpy_and_client_lib};

const HOSTS: u32 = 2;
const TRAINERS: u32 = 2;
const STEPS: usize = 12;

#[test]
fn python_trainers_train_through_real_daemons_bit_identically() {
    let Some(lib) = numpy_and_client_lib() else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cluster = Cluster::start(&Options { hosts: HOSTS, ..Options::default() });
    let mut children = Vec::new();
    for h in 0..HOSTS {
        for k in 0..TRAINERS {
            let child = Command::new(PYTHON)
                .arg(root.join("examples/numpy_allreduce.py"))
                .arg("--socket")
                .arg(&cluster.daemons[h as usize].socket)
                .args(["--job", &JOB.to_string(), "--local-rank", &k.to_string()])
                .args([
                    "--local-world",
                    &TRAINERS.to_string(),
                    "--world-size",
                    &(HOSTS * TRAINERS).to_string(),
                ])
                .args(["--rank", &(h * TRAINERS + k).to_string(), "--steps", &STEPS.to_string()])
                .args(["--budget", "0", "--lr", "0.2"])
                .env("DLCP_LIB", &lib)
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            children.push((h, k, child));
        }
    }
    let mut digests = Vec::new();
    for (h, k, child) in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let all = format!("{stdout}\n--- stderr ---\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success(),
            "trainer {h}/{k} failed:\n{all}\n--- daemon log ---\n{}",
            cluster.log(h)
        );
        let losses: Vec<f64> = stdout
            .lines()
            .filter_map(|l| l.split("loss ").nth(1)?.split_whitespace().next()?.parse().ok())
            .collect();
        assert_eq!(losses.len(), STEPS, "{all}");
        assert!(losses[STEPS - 1] < losses[0] * 0.7, "trainer {h}/{k}: loss should fall: {losses:?}");
        assert!(stdout.contains("delivered 1.0000"), "budget 0 delivers everything:\n{all}");
        let digest = stdout.lines().find_map(|l| l.strip_prefix("final weights sha256 ")).map(str::to_owned);
        digests.push(digest.unwrap_or_else(|| panic!("no digest:\n{all}")));
    }
    assert!(digests.iter().all(|d| *d == digests[0]), "replicas drifted apart: {digests:?}");
    eprintln!("{} Python trainers on {HOSTS} daemons: identical final weights {}", digests.len(), digests[0]);
}
