//! A cluster of real `dlcpd` processes on loopback for end-to-end tests: configs
//! in a private temp dir, free UDP ports, control sockets, and cleanup (kill
//! and reap, remove files) even when a test fails.
#![allow(dead_code)]

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const JOB: u32 = 7;

pub struct Daemon {
    pub rank: u32,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub child: Option<Child>,
    pub log: PathBuf,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub daemons: Vec<Daemon>,
    pub ports: Vec<u16>,
}

/// Ports a daemon binds: one per path (`network.paths`, 16 by default; a
/// test may configure fewer), from its `[[peers]]` port up.
pub const PORT_BLOCK: u16 = 16;

/// The first ports of `n` blocks of [`PORT_BLOCK`] free UDP ports each on
/// 127.0.0.1 (or ::1), not overlapping: every port is bound until all blocks
/// are found, then released (the window is tiny).
pub fn free_ports(n: usize, ipv6: bool) -> Vec<u16> {
    let ip = if ipv6 { "::1" } else { "127.0.0.1" };
    dlcp::demo::free_port_blocks(n, PORT_BLOCK, ip.parse().unwrap()).unwrap()
}

/// A UDP socket on 127.0.0.1 whose port is outside every daemon's block of
/// ports starting at one of `bases` and at least [`PORT_BLOCK`] from each
/// (so it can stand in a configuration as another peer's port).
pub fn socket_apart(bases: &[u16]) -> UdpSocket {
    for _ in 0..10_000 {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let p = s.local_addr().unwrap().port();
        if bases.iter().all(|&b| p.abs_diff(b) >= PORT_BLOCK) {
            return s;
        }
    }
    panic!("no UDP port on 127.0.0.1 apart from {bases:?}");
}

pub struct Options {
    pub hosts: u32,
    pub hard_timeout_ms: u32,
    pub extra: String,
    pub rx_loss_pct: f64,
    /// Ranks not started by `Cluster::start` (start them later with `spawn`).
    pub late: Vec<u32>,
    /// Use ::1 instead of 127.0.0.1.
    pub ipv6: bool,
    /// `network.paths` (None: the default, 16; at most [`PORT_BLOCK`]).
    pub paths: Option<u16>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            hosts: 4,
            hard_timeout_ms: 3000,
            extra: String::new(),
            rx_loss_pct: 0.0,
            late: Vec::new(),
            ipv6: false,
            paths: None,
        }
    }
}

/// Write a configuration file readable by its owner alone (dlcpd refuses an
/// inline secret in a file others may read), whatever the umask.
pub fn write_config(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

pub fn config_text(rank: u32, ports: &[u16], socket: &Path, o: &Options) -> String {
    let mut t = format!(
        "[node]\nrank = {rank}\njob_id = {JOB}\njob_secret = \"loopback test secret 0123456789\"\ngeneration = \"auto\"\n\n"
    );
    for (r, p) in ports.iter().enumerate() {
        let addr = if o.ipv6 { "::1" } else { "127.0.0.1" };
        t += &format!("[[peers]]\nrank = {r}\naddress = \"{addr}\"\nport = {p}\n\n");
    }
    t += &format!(
        "[network]\nheartbeat_interval_ms = 100\npeer_timeout_ms = 1000\n{}\n[loss]\nhard_timeout_ms = {}\n\n[control]\nsocket_path = \"{}\"\nsocket_mode = \"0600\"\n\n[shm]\narena_bytes = 134217728\nmax_tensor_bytes = 134217728\n\n[log]\nlevel = \"info\"\n\n[metrics]\naddress = \"127.0.0.1:0\"\n{}\n",
        o.paths.map_or(String::new(), |n| format!("paths = {n}\n")),
        o.hard_timeout_ms,
        socket.display(),
        o.extra
    );
    t
}

impl Cluster {
    pub fn start(o: &Options) -> Cluster {
        let dir = tempfile::Builder::new().prefix("dlcp-e2e-").tempdir().unwrap();
        let ports = free_ports(o.hosts as usize, o.ipv6);
        let mut c = Cluster { dir, daemons: Vec::new(), ports };
        for r in 0..o.hosts {
            let socket = c.dir.path().join(format!("d{r}.sock"));
            let config = c.dir.path().join(format!("d{r}.toml"));
            write_config(&config, &config_text(r, &c.ports, &socket, o));
            let log = c.dir.path().join(format!("d{r}.log"));
            c.daemons.push(Daemon { rank: r, config, socket, child: None, log });
            if !o.late.contains(&r) {
                c.spawn(r, o.rx_loss_pct);
            }
        }
        for r in (0..o.hosts).filter(|r| !o.late.contains(r)) {
            c.wait_ready(r);
        }
        c
    }

    pub fn spawn(&mut self, r: u32, rx_loss_pct: f64) {
        let d = &mut self.daemons[r as usize];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&d.log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_dlcpd"))
            .arg("--config")
            .arg(&d.config)
            .arg("--debug-rx-loss")
            .arg(rx_loss_pct.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        d.child = Some(child);
    }

    /// Wait until the daemon's admin socket answers.
    pub fn wait_ready(&self, r: u32) {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            if self.stats(r).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("dlcpd {r} did not come up; log:\n{}", self.log(r));
    }

    pub fn log(&self, r: u32) -> String {
        std::fs::read_to_string(&self.daemons[r as usize].log).unwrap_or_default()
    }

    /// `dlcpctl stats --json` of daemon `r`.
    pub fn stats(&self, r: u32) -> Result<serde_json::Value, String> {
        self.ctl_json(r, "stats")
    }

    /// `dlcpctl status --json` of daemon `r` (null if it does not answer).
    pub fn status(&self, r: u32) -> serde_json::Value {
        self.ctl_json(r, "status").unwrap_or_default()
    }

    /// `dlcpctl report OP TENSOR --json` of daemon `r` (panics if it fails).
    pub fn report(&self, r: u32, op: u64, tensor: u32) -> serde_json::Value {
        self.ctl_json(r, &format!("report {op} {tensor}")).unwrap_or_else(|e| panic!("dlcpctl report: {e}"))
    }

    /// `dlcpctl CMD --json` of daemon `r` (CMD may be several words).
    fn ctl_json(&self, r: u32, cmd: &str) -> Result<serde_json::Value, String> {
        let out = Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
            .arg("--socket")
            .arg(&self.daemons[r as usize].socket)
            .args(cmd.split(' '))
            .arg("--json")
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    }

    pub fn kill(&mut self, r: u32, signal: i32) {
        if let Some(c) = self.daemons[r as usize].child.as_mut() {
            // SAFETY-free: use the kill(1) command to avoid unsafe libc in tests.
            let _ = Command::new("kill").arg(format!("-{signal}")).arg(c.id().to_string()).status();
        }
    }

    pub fn wait_exit(&mut self, r: u32, timeout: Duration) -> Option<std::process::ExitStatus> {
        let t0 = Instant::now();
        let c = self.daemons[r as usize].child.as_mut()?;
        while t0.elapsed() < timeout {
            if let Ok(Some(st)) = c.try_wait() {
                self.daemons[r as usize].child = None;
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            if let Some(mut c) = d.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if std::thread::panicking() {
            for d in &self.daemons {
                eprintln!(
                    "---- dlcpd {} log ----\n{}",
                    d.rank,
                    std::fs::read_to_string(&d.log).unwrap_or_default()
                );
            }
        }
    }
}

/// Deterministic non-integer test data.
pub fn data(seed: u64, len: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0 + 0.001
        })
        .collect()
}
