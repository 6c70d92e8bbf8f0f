//! Shared by the PyTorch DDP tests: finding Debian's Python with torch and
//! scikit-learn and the client library, and running `examples/ddp_train.py`
//! ranks as processes (killed on drop, bounded by a deadline).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::prereq::{Prereq, skip};

pub use super::python_common::{PYTHON, client_lib};

/// The client library, if Python can import torch, sklearn and numpy; else
/// `None` after `prereq::skip` (which fails the test instead under
/// `DLCP_REQUIRE_TORCH=1` / `DLCP_REQUIRE_PYTHON=1` / `DLCP_CI=1`).
pub fn prerequisites() -> Option<PathBuf> {
    let ok = Command::new(PYTHON)
        .args(["-c", "import torch, torch.distributed, sklearn, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip(
            Prereq::Torch,
            &format!(
                "{PYTHON} cannot import torch/sklearn/numpy (apt-get install -y python3-torch python3-sklearn)"
            ),
        );
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

pub fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ddp_train.py")
}

/// A finished rank: exit status, stdout+stderr.
pub struct Finished {
    pub rank: usize,
    pub ok: bool,
    pub output: String,
    pub elapsed: Duration,
}

/// Rank processes, killed on drop.
#[derive(Default)]
pub struct Ranks {
    pub children: Vec<(usize, Child, PathBuf)>,
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for (_, c, _) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Ranks {
    /// Spawn `cmd` as rank `rank`, its output to `log`.
    pub fn spawn(&mut self, rank: usize, mut cmd: Command, log: PathBuf) {
        let f = std::fs::File::create(&log).unwrap();
        cmd.stdin(Stdio::null()).stdout(f.try_clone().unwrap()).stderr(f).env("PYTHONDONTWRITEBYTECODE", "1");
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot spawn rank {rank}: {e}"));
        self.children.push((rank, child, log));
    }

    /// Wait for every rank, at most `deadline` in all; panics (after the Drop
    /// kills the rest) naming the ranks still running with their output so far.
    pub fn wait_all(&mut self, deadline: Duration) -> Vec<Finished> {
        let t0 = Instant::now();
        let mut done: Vec<Option<Finished>> = self.children.iter().map(|_| None).collect();
        while done.iter().any(Option::is_none) {
            for (i, (rank, c, log)) in self.children.iter_mut().enumerate() {
                if done[i].is_some() {
                    continue;
                }
                if let Some(st) = c.try_wait().unwrap() {
                    done[i] = Some(Finished {
                        rank: *rank,
                        ok: st.success(),
                        output: std::fs::read_to_string(log).unwrap_or_default(),
                        elapsed: t0.elapsed(),
                    });
                }
            }
            if t0.elapsed() > deadline {
                let running: Vec<String> = self
                    .children
                    .iter()
                    .zip(&done)
                    .filter(|(_, d)| d.is_none())
                    .map(|((r, _, log), _)| {
                        format!("rank {r}:\n{}", std::fs::read_to_string(log).unwrap_or_default())
                    })
                    .collect();
                panic!("ranks still running after {deadline:?} (a hang):\n{}", running.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        done.into_iter().map(Option::unwrap).collect()
    }
}

/// The value after `key ` on the last line of `out` that has it.
pub fn last_field<'a>(out: &'a str, key: &str) -> Option<&'a str> {
    out.lines().rev().find_map(|l| l.split(&format!("{key} ")).nth(1)?.split_whitespace().next())
}
