//! `dlcpctl`: ask a running dlcpd for its status and counters.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "dlcpctl", version = dlcp::VERSION, about = "Query a running dlcpd over its admin socket")]
struct Cli {
    /// The daemon's control socket (`control.socket_path` in its config); the
    /// admin socket is this path with `.admin` appended.
    #[arg(long, short, default_value = "/run/dlcp/dlcpd.sock", env = "DLCP_SOCKET")]
    socket: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Version, datapath, peers and trainers.
    Status {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Every counter: per class, per peer, per op, rejections.
    Stats {
        /// Print the raw JSON (for scripts and tests).
        #[arg(long)]
        json: bool,
    },
    /// What arrived from whom for one recent op (missing chunks per sender, masks).
    Report {
        /// Op sequence number.
        op: u64,
        /// Tensor id.
        tensor: u32,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
}

fn query(socket: &Path, request: &str) -> Result<serde_json::Value, String> {
    let admin = dlcp::service::admin_path(socket);
    let mut s = UnixStream::connect(&admin).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            format!(
                "{}: no such socket — is dlcpd running with control.socket_path = {}?",
                admin.display(),
                socket.display()
            )
        }
        std::io::ErrorKind::PermissionDenied => {
            format!(
                "{}: permission denied — run as the daemon's user or a member of its socket group",
                admin.display()
            )
        }
        std::io::ErrorKind::ConnectionRefused => {
            format!("{}: connection refused — dlcpd is not running (stale socket file)", admin.display())
        }
        _ => format!("{}: {e}", admin.display()),
    })?;
    s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    s.write_all(format!("{request}\n").as_bytes()).map_err(|e| format!("{}: {e}", admin.display()))?;
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| format!("{}: {e}", admin.display()))?;
    serde_json::from_str(&out).map_err(|e| format!("{}: bad reply ({e}): {out}", admin.display()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (req, json) = match cli.command {
        Command::Status { json } => ("status".to_string(), json),
        Command::Stats { json } => ("stats".to_string(), json),
        Command::Report { op, tensor, json } => (format!("report {op} {tensor}"), json),
    };
    match query(&cli.socket, &req) {
        Ok(v) if v.get("error").is_some() => {
            eprintln!("dlcpctl: {}", v["error"].as_str().unwrap_or("error"));
            ExitCode::from(1)
        }
        Ok(v) if json => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Ok(v) => {
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dlcpctl: {e}");
            ExitCode::from(2)
        }
    }
}
