//! The Python client's float16 and bfloat16 tensors against real `dlcpd`
//! processes: 4 daemons on loopback, 2 Python trainers each
//! (`tests/python/dtypes_trainer.py`, separate processes over
//! `libdlcp_client.so`), every one of float32, float16 and bfloat16 by sum
//! and by average, budget 0. Each trainer checks every result bit for bit
//! against a numpy reference it computes itself (float32 accumulation, the
//! local sum and the result each rounded once to the type, bfloat16 rounding
//! written out in numpy); the test checks every trainer matched and all 8
//! hold the same bytes.
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

const HOSTS: u32 = 4;
const TRAINERS: u32 = 2;
/// 3 dtypes × 2 ops × 2 sizes (`SIZES` in the script).
const OPS: usize = 12;

#[test]
fn python_f16_and_bf16_trainers_match_the_numpy_reference_bit_for_bit() {
    let Some(lib) = numpy_and_client_lib() else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cluster = Cluster::start(&Options { hosts: HOSTS, ..Options::default() });
    let mut children = Vec::new();
    for h in 0..HOSTS {
        for k in 0..TRAINERS {
            let child = Command::new(PYTHON)
                .arg(root.join("tests/python/dtypes_trainer.py"))
                .arg("--socket")
                .arg(&cluster.daemons[h as usize].socket)
                .args(["--job", &JOB.to_string(), "--host", &h.to_string(), "--hosts", &HOSTS.to_string()])
                .args(["--local-rank", &k.to_string(), "--local-world", &TRAINERS.to_string()])
                .env("DLCP_LIB", &lib)
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            children.push((h, k, child));
        }
    }
    let mut outputs = Vec::new();
    for (h, k, child) in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let all = format!("{stdout}\n--- stderr ---\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success(),
            "trainer {h}/{k} failed:\n{all}\n--- daemon log ---\n{}",
            cluster.log(h)
        );
        let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("op ")).collect();
        assert_eq!(lines.len(), OPS, "{all}");
        assert!(lines.iter().all(|l| l.contains(": exact ")), "trainer {h}/{k}: not bit-exact:\n{all}");
        for kind in ["float16 sum", "float16 average", "bfloat16 sum", "bfloat16 average"] {
            assert!(lines.iter().any(|l| l.contains(kind)), "no {kind} op:\n{all}");
        }
        outputs.push(lines.iter().map(|l| l.to_string()).collect::<Vec<_>>());
    }
    assert!(outputs.iter().all(|o| *o == outputs[0]), "trainers hold different bytes: {outputs:?}");
    eprintln!("{} Python trainers on {HOSTS} daemons:\n{}", outputs.len(), outputs[0].join("\n"));
}
