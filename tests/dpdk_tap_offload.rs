//! Checksum offload on a device that offers it: in a network namespace of its
//! own, dlcpd 0 drives `net_tap0` through DPDK (the tap PMD offers IPv4/UDP TX
//! checksum offload, so dlcp leaves the checksums to the device), dlcpd 1 runs on
//! kernel sockets on the tap's kernel side. The kernel drops UDP with a wrong
//! checksum, so bit-exact allreduces prove the offloaded checksums are right; ARP
//! runs both ways (the kernel asks dlcp, dlcp asks the kernel).
//!
//! Needs root and network namespaces; prints a loud SKIPPED message and passes
//! where they are unavailable.
#![cfg(dpdk)]

mod daemon_common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use daemon_common::{JOB, data};

const NS: &str = "dpdktap";

struct Guard {
    dir: tempfile::TempDir,
    children: Vec<Child>,
}

impl Drop for Guard {
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
        let _ = Command::new("ip").args(["netns", "del", NS]).stderr(Stdio::null()).status();
    }
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).status().is_ok_and(|s| s.success())
}

fn config(rank: usize, socket: &Path, extra: &str) -> String {
    format!(
        "[node]\nrank = {rank}\njob_id = {JOB}\njob_secret = \"tap offload test secret 0123456789\"\ngeneration = \"auto\"\n\n\
         [[peers]]\nrank = 0\naddress = \"10.78.0.2\"\nport = 7703\n\n[[peers]]\nrank = 1\naddress = \"10.78.0.1\"\nport = 7703\n\n\
         [network]\nheartbeat_interval_ms = 100\npeer_timeout_ms = 1000\n\n[loss]\nhard_timeout_ms = 10000\n\n\
         [control]\nsocket_path = \"{}\"\n\n[shm]\narena_bytes = 67108864\nmax_tensor_bytes = 67108864\n\n[log]\nlevel = \"info\"\n{extra}\n",
        socket.display()
    )
}

fn ctl(socket: &Path, args: &[&str]) -> Result<serde_json::Value, String> {
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

fn spawn(g: &mut Guard, r: usize, extra: &str) -> PathBuf {
    let socket = g.dir.path().join(format!("d{r}.sock"));
    let cfg = g.dir.path().join(format!("d{r}.toml"));
    std::fs::write(&cfg, config(r, &socket, extra)).unwrap();
    let log = std::fs::File::create(g.dir.path().join(format!("d{r}.log"))).unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", NS, env!("CARGO_BIN_EXE_dlcpd"), "--config"])
        .arg(&cfg)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    g.children.push(child);
    let t0 = Instant::now();
    while ctl(&socket, &["stats", "--json"]).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(20), "dlcpd {r} did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    socket
}

#[test]
fn offloaded_checksums_are_accepted_by_the_kernel() {
    if !Path::new("/dev/net/tun").exists() {
        eprintln!("\n!!!!!!!! SKIPPED tap offload test: no /dev/net/tun !!!!!!!!\n");
        return;
    }
    // A namespace left by a killed run (usually none: its absence is fine).
    let _ = Command::new("ip").args(["netns", "del", NS]).stderr(Stdio::null()).status();
    if !ip(&["netns", "add", NS]) {
        eprintln!(
            "\n!!!!!!!! SKIPPED tap offload test: cannot create a network namespace (not root?) !!!!!!!!\n"
        );
        return;
    }
    let dir = tempfile::Builder::new().prefix("dlcp-tap-").tempdir().unwrap();
    let mut g = Guard { dir, children: Vec::new() };
    assert!(ip(&["-n", NS, "link", "set", "lo", "up"]));
    let dpdk = "[datapath]\nkind = \"dpdk\"\n[datapath.dpdk]\neal_args = [\"--no-huge\", \"--no-pci\", \"--no-shconf\", \"--no-telemetry\", \"-m\", \"256\", \"-l\", \"0\", \"--file-prefix\", \"dpdktap\", \"--vdev=net_tap0,iface=dtap0\"]\n";
    let s0 = spawn(&mut g, 0, dpdk);
    // The tap's kernel side: host 1's address (the kernel owns it, not DPDK).
    assert!(ip(&["-n", NS, "addr", "add", "10.78.0.1/24", "dev", "dtap0"]));
    assert!(ip(&["-n", NS, "link", "set", "dtap0", "up"]));
    let s1 = spawn(&mut g, 1, "");

    let st = ctl(&s0, &["stats", "--json"]).unwrap();
    let detail = &st["datapath_counters"]["detail"];
    assert_eq!(detail["tx_checksum_offload"], true, "net_tap should offer checksum offload: {st}");

    let n = 200_003;
    let handles: Vec<_> = [s0.clone(), s1.clone()]
        .into_iter()
        .enumerate()
        .map(|(r, sock)| {
            std::thread::spawn(move || {
                let mut cl = dlcp::shm::Client::attach(&sock, u64::from(JOB), 0, 1).unwrap();
                let mut out = Vec::new();
                for i in 0..3u32 {
                    let t = cl.alloc(&format!("t{i}"), n as u64).unwrap();
                    cl.write(&t, &data(u64::from(r as u32 * 10 + i), n)).unwrap();
                    let o = dlcp::shm::SubmitOptions { tensor_id: i, budget_ppm: 0, ..Default::default() };
                    cl.submit(&t, o).unwrap();
                    let d = cl.wait_completion(Duration::from_secs(20)).unwrap();
                    assert_eq!(d.status, dlcp::shm::Status::Ok, "rank {r} op {i}");
                    out.push(cl.read(&t).unwrap());
                }
                out
            })
        })
        .collect();
    let got: Vec<Vec<Vec<f32>>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for i in 0..3u64 {
        let want: Vec<u32> = data(i, n).iter().zip(data(10 + i, n)).map(|(a, b)| (a + b).to_bits()).collect();
        for (r, g) in got.iter().enumerate() {
            let g: Vec<u32> = g[i as usize].iter().map(|x| x.to_bits()).collect();
            assert!(g == want, "rank {r} op {i}: not bit-exact");
        }
    }
    let st = ctl(&s0, &["stats", "--json"]).unwrap();
    let detail = &st["datapath_counters"]["detail"];
    eprintln!("DPDK side over net_tap: {detail}");
    assert!(detail["arp_replies_sent"].as_u64().unwrap() >= 1, "the kernel never asked dlcp: {detail}");
    assert!(detail["arp_requests_sent"].as_u64().unwrap() >= 1, "dlcp never asked the kernel: {detail}");
    assert_eq!(detail["rx_bad_udp_checksum"], 0, "{detail}");
    assert!(
        st["datapath_counters"]["tx_packets_per_class"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v.as_u64() > Some(100))
    );
}
