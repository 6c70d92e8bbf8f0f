//! The command-line tools as a shell pipeline uses them: a reader that goes
//! away (`dlcpctl status | head -1`, `dlcpd check-config FILE | head -1`) ends
//! the tool quietly — exit status 0, no panic, no backtrace, nothing on stderr
//! — and budgets are fractions on the command line too (`--budget 0.01` or
//! `--budget 1%`; a bare `1` is refused saying so).

mod daemon_common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use daemon_common::*;

/// How the reader goes away.
#[derive(Clone, Copy, Debug)]
enum Close {
    /// At once, before the tool has written anything.
    AtOnce,
    /// After reading the first line (`| head -1`).
    AfterFirstLine,
}

/// Runs `exe args` with stdout a pipe closed as `close` says; asserts a quiet,
/// successful exit.
fn check_quiet(exe: &Path, args: &[&str], close: Close) {
    let mut child = Command::new(exe)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let first = match close {
        Close::AtOnce => {
            drop(stdout);
            String::new()
        }
        Close::AfterFirstLine => {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).unwrap();
            line
        }
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let what = format!("{} {args:?} ({close:?}, first line {first:?})", exe.display());
    assert!(!stderr.contains("panicked"), "{what} panicked:\n{stderr}");
    assert!(stderr.is_empty(), "{what} wrote to stderr:\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{what}: {}\n{stderr}", out.status);
    if let Close::AfterFirstLine = close {
        assert!(!first.is_empty(), "{what}: no first line");
    }
}

fn dlcpd() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_dlcpd"))
}

fn dlcpctl() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_dlcpctl"))
}

#[test]
fn dlcpd_output_into_a_closed_pipe_is_a_quiet_exit() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dlcp.toml");
    write_config(&file, &config_text(0, &[7700], &dir.path().join("d.sock"), &Options::default()));
    let file = file.to_str().unwrap();
    for close in [Close::AtOnce, Close::AfterFirstLine] {
        check_quiet(&dlcpd(), &["--help"], close);
        check_quiet(&dlcpd(), &["check-config", "--help"], close);
        check_quiet(&dlcpd(), &["--version"], close);
        check_quiet(&dlcpd(), &["check-config", file], close);
        check_quiet(&dlcpd(), &["simulate", "--hosts", "2", "--iters", "3", "--size", "0.1"], close);
    }
}

#[test]
fn dlcpctl_output_into_a_closed_pipe_is_a_quiet_exit() {
    let c = Cluster::start(&Options { hosts: 1, ..Options::default() });
    let socket = c.daemons[0].socket.to_str().unwrap().to_owned();
    for close in [Close::AtOnce, Close::AfterFirstLine] {
        for cmd in [&["status"][..], &["stats"], &["peers"], &["stats", "--json"], &["--help"]] {
            let mut args = vec!["--socket", socket.as_str()];
            args.extend_from_slice(cmd);
            check_quiet(&dlcpctl(), &args, close);
        }
    }
}

#[test]
fn demo_budget_is_a_fraction_or_a_percentage() {
    // A bare number above the cap: refused, saying budgets are fractions, with both forms.
    let out = Command::new(dlcpd()).args(["demo", "--budget", "1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--budget"), "{stderr}");
    assert!(stderr.contains("means 100%, above the hard cap of 10%"), "{stderr}");
    assert!(stderr.contains("a budget is a fraction: write 0.01 or \"1%\" for 1%"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // "1%" and 0.01 are the same budget.
    for budget in ["1%", "0.01"] {
        let out = Command::new(dlcpd())
            .args(["demo", "--hosts", "2", "--iters", "1", "--size", "0.5", "--budget", budget])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains(", budget 1%\n"), "--budget {budget}: {stdout}");
        assert!(stdout.contains("(budget 1%)"), "--budget {budget}: {stdout}");
    }
    let out = Command::new(dlcpd()).args(["simulate", "--budget", "0.5"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("means 50%, above the hard cap"), "{stderr}");
}
