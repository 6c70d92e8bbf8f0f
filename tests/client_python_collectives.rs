//! The Python client's collectives against real `dlcpd` processes: 4 daemons
//! on loopback, 2 Python trainers each (`tests/python/collectives_trainer.py`,
//! separate processes over `libdlcp_client.so`) run reduce-scatter (sum and
//! average), allgather and broadcast from root 2 on float32, float16 and
//! bfloat16 tensors at budget 0, then a barrier. Each trainer checks every
//! result bit for bit against a numpy reference it computes itself, and the
//! shard its report names; the test checks every trainer matched, all 8 hold
//! the same bytes after an allgather or a broadcast, and the 2 of a host the
//! same shard after a reduce-scatter.
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
/// 3 dtypes × 4 collectives × 2 sizes (`SIZES` in the script).
const OPS: usize = 24;

#[test]
fn python_trainers_run_every_collective_bit_exact_against_numpy() {
    let Some(lib) = numpy_and_client_lib() else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cluster = Cluster::start(&Options { hosts: HOSTS, ..Options::default() });
    let mut children = Vec::new();
    for h in 0..HOSTS {
        for k in 0..TRAINERS {
            let child = Command::new(PYTHON)
                .arg(root.join("tests/python/collectives_trainer.py"))
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
        let lines: Vec<String> = stdout.lines().filter(|l| l.starts_with("op ")).map(str::to_owned).collect();
        assert_eq!(lines.len(), OPS, "{all}");
        assert!(lines.iter().all(|l| l.contains(": exact ")), "trainer {h}/{k}: not bit-exact:\n{all}");
        for kind in ["reduce-scatter sum", "reduce-scatter average", "allgather", "broadcast"] {
            for dtype in ["float32", "float16", "bfloat16"] {
                let want = format!("{dtype} {kind}");
                assert!(lines.iter().any(|l| l.contains(&want)), "no {want} op:\n{all}");
            }
        }
        assert!(stdout.lines().any(|l| l.starts_with("barrier op ") && l.ends_with(": ok")), "{all}");
        outputs.push((h, lines));
    }
    let common = |l: &String| !l.contains("reduce-scatter");
    for (h, lines) in &outputs {
        let (h0, first) = &outputs[0];
        let same: Vec<_> = lines.iter().filter(|l| common(l)).collect();
        assert_eq!(same, first.iter().filter(|l| common(l)).collect::<Vec<_>>(), "hosts {h0} and {h} differ");
        let host = outputs.iter().find(|(g, _)| g == h).map(|(_, l)| l).unwrap();
        assert_eq!(
            lines, host,
            "the trainers of host {h} hold different bytes (a reduce-scatter's: in the shard)"
        );
    }
    eprintln!("{} Python trainers on {HOSTS} daemons:\n{}", outputs.len(), outputs[0].1.join("\n"));
}
