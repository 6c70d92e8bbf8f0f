//! A network namespace of its own for the DPDK `net_tap` tests: dlcpd 0 drives
//! the tap through DPDK, dlcpd 1 runs on kernel sockets on the tap's kernel
//! side (10.78.0.1; DPDK's side is 10.78.0.2). Daemons are killed and the
//! namespace deleted on drop, even when the test fails (their logs printed).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::daemon_common::JOB;

/// The namespace, its daemons and their files.
pub struct Tap {
    pub ns: &'static str,
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub children: Vec<Child>,
}

impl Drop for Tap {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            for r in 0..2 {
                let log = std::fs::read_to_string(self.dir.path().join(format!("d{r}.log")));
                eprintln!("---- dlcpd {r} log ----\n{}", log.unwrap_or_default());
            }
        }
        let _ = Command::new("ip").args(["netns", "del", self.ns]).stderr(Stdio::null()).status();
    }
}

/// `ip ARGS` succeeded.
pub fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).status().is_ok_and(|s| s.success())
}

/// `dlcpctl --socket S ARGS` parsed as JSON.
pub fn ctl(socket: &Path, args: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
}

impl Tap {
    /// Namespace `ns` (leftovers of a killed run removed first) with `lo` up;
    /// `Err` says why it cannot run here (no /dev/net/tun, not root).
    pub fn new(ns: &'static str, port: u16) -> Result<Tap, String> {
        if !Path::new("/dev/net/tun").exists() {
            return Err("no /dev/net/tun".into());
        }
        let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
        if !ip(&["netns", "add", ns]) {
            return Err("cannot create a network namespace (not root?)".into());
        }
        let dir = tempfile::Builder::new().prefix(&format!("dlcp-{ns}-")).tempdir().unwrap();
        let tap = Tap { ns, port, dir, children: Vec::new() };
        assert!(ip(&["-n", ns, "link", "set", "lo", "up"]));
        Ok(tap)
    }

    /// The `[datapath]` section of the DPDK daemon: `net_tap0` named `iface`.
    pub fn dpdk_datapath(&self, iface: &str) -> String {
        format!(
            "[datapath]\nkind = \"dpdk\"\n[datapath.dpdk]\neal_args = [\"--no-huge\", \"--no-pci\", \"--no-shconf\", \
             \"--no-telemetry\", \"-m\", \"256\", \"-l\", \"0\", \"--file-prefix\", \"{}\", \"--vdev=net_tap0,iface={iface}\"]\n",
            self.ns
        )
    }

    fn config(&self, rank: usize, socket: &Path, extra: &str) -> String {
        let port = self.port;
        format!(
            "[node]\nrank = {rank}\njob_id = {JOB}\njob_secret = \"tap test secret 0123456789 {}\"\ngeneration = \"auto\"\n\n\
             [[peers]]\nrank = 0\naddress = \"10.78.0.2\"\nport = {port}\n\n[[peers]]\nrank = 1\naddress = \"10.78.0.1\"\nport = {port}\n\n\
             [network]\nheartbeat_interval_ms = 100\npeer_timeout_ms = 1000\n\n[loss]\nhard_timeout_ms = 10000\n\n\
             [control]\nsocket_path = \"{}\"\n\n[shm]\narena_bytes = 67108864\nmax_tensor_bytes = 67108864\n\n\
             [metrics]\nenabled = false\n\n[log]\nlevel = \"info\"\n{extra}\n",
            self.ns,
            socket.display()
        )
    }

    /// Start dlcpd `r` in the namespace with `extra` appended to its config;
    /// returns its control socket once it answers.
    pub fn spawn(&mut self, r: usize, extra: &str) -> PathBuf {
        let socket = self.dir.path().join(format!("d{r}.sock"));
        let cfg = self.dir.path().join(format!("d{r}.toml"));
        write_private(&cfg, &self.config(r, &socket, extra));
        let log = std::fs::File::create(self.dir.path().join(format!("d{r}.log"))).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", self.ns, env!("CARGO_BIN_EXE_dlcpd"), "--config"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.push(child);
        let t0 = Instant::now();
        while ctl(&socket, &["stats", "--json"]).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(20), "dlcpd {r} did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        socket
    }
}

/// Write a configuration file readable by its owner alone (dlcpd refuses an
/// inline secret in a file others may read), whatever the umask.
fn write_private(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}
