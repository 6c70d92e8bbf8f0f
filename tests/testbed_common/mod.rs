//! The emulated cluster of `scripts/testbed.sh` for end-to-end tests: the
//! testbed under a test's own name prefix, real `dlcpd` in the host
//! namespaces with generated configs, `dlcpctl` helpers, and teardown (daemons
//! killed, `testbed.sh down`) on drop, even when the test fails.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const JOB: u32 = 7;
pub const PORT: u16 = 7702;

/// Run `scripts/testbed.sh ARGS` with `DLCPTB_PREFIX=prefix`.
pub fn testbed(prefix: &str, args: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed.sh");
    let out = Command::new(&script)
        .args(args)
        .env("DLCPTB_PREFIX", prefix)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    eprintln!(
        "testbed.sh {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Namespaces usable here? (root and `ip netns add` works.)
pub fn namespaces_available(prefix: &str) -> Result<(), String> {
    let uid = Command::new("id").arg("-u").output().map_err(|e| e.to_string())?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Err("not root".into());
    }
    let probe = format!("{prefix}-probe");
    let add = Command::new("ip").args(["netns", "add", &probe]).output().map_err(|e| e.to_string())?;
    if !add.status.success() {
        return Err(format!("ip netns add failed: {}", String::from_utf8_lossy(&add.stderr)));
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    Ok(())
}

/// `(sent, dropped)` packets of every htb class `1:1<c>` on switch port `dev`
/// of the testbed `prefix` (`tc -s class show`), keyed by `c`.
pub fn htb_classes(prefix: &str, dev: &str) -> BTreeMap<u8, (u64, u64)> {
    let out = Command::new("ip")
        .args(["netns", "exec", &format!("{prefix}-sw"), "tc", "-s", "class", "show", "dev", dev])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut m = BTreeMap::new();
    let mut cur: Option<u8> = None;
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.first() == Some(&"class") {
            cur = w.get(2).and_then(|id| id.strip_prefix("1:1")).and_then(|c| c.parse().ok());
        } else if w.first() == Some(&"Sent")
            && let Some(c) = cur
        {
            // "Sent B bytes P pkt (dropped D, overlimits O requeues R)"
            m.insert(c, (w[3].parse().unwrap(), w[6].trim_end_matches(',').parse().unwrap()));
        }
    }
    m
}

/// A dlcp datagram seen in a capture.
#[derive(Clone, Copy, Debug)]
pub struct Mark {
    /// The IPv4 TOS byte (DSCP << 2 | ECN).
    pub tos: u8,
    /// The dlcp header's priority class (byte 5).
    pub class: u8,
    pub src: [u8; 4],
    pub dst: [u8; 4],
}

/// Every IPv4/UDP datagram to or from `port` in an Ethernet pcap file; each
/// must carry the dlcp magic.
pub fn dlcp_marks(pcap: &[u8], port: u16) -> Vec<Mark> {
    assert!(pcap.len() >= 24, "pcap file too short: {} bytes", pcap.len());
    let magic = u32::from_le_bytes(pcap[0..4].try_into().unwrap());
    assert!(magic == 0xa1b2_c3d4 || magic == 0xa1b2_3c4d, "not a little-endian pcap file: {magic:#x}");
    assert_eq!(u32::from_le_bytes(pcap[20..24].try_into().unwrap()), 1, "expected Ethernet captures");
    let mut v = Vec::new();
    let mut off = 24;
    while off + 16 <= pcap.len() {
        let incl = u32::from_le_bytes(pcap[off + 8..off + 12].try_into().unwrap()) as usize;
        let f = &pcap[off + 16..(off + 16 + incl).min(pcap.len())];
        off += 16 + incl;
        if f.len() < 14 + 20 || f[12..14] != [0x08, 0x00] {
            continue;
        }
        let ip = &f[14..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        if ip[9] != 17 || ip.len() < ihl + 8 + 6 {
            continue;
        }
        let udp = &ip[ihl..];
        let (sport, dport) = (u16::from_be_bytes([udp[0], udp[1]]), u16::from_be_bytes([udp[2], udp[3]]));
        if sport != port && dport != port {
            continue;
        }
        let payload = &udp[8..];
        assert_eq!(payload[0..2], [0xD1, 0xC9], "datagram on the dlcp port without dlcp magic");
        v.push(Mark {
            tos: ip[1],
            class: payload[5],
            src: ip[12..16].try_into().unwrap(),
            dst: ip[16..20].try_into().unwrap(),
        });
    }
    v
}

/// A running tcpdump on a switch port; see [`Bed::capture`].
pub struct Capture {
    pub pcap: PathBuf,
    pid: u32,
}

/// The testbed and its daemons; all torn down on drop.
pub struct Bed {
    pub prefix: &'static str,
    pub hosts: usize,
    pub dir: tempfile::TempDir,
    pub daemons: Vec<Option<Child>>,
    pub others: Vec<Child>,
    pub sockets: Vec<PathBuf>,
    pub hard_timeout_ms: u32,
    /// Appended to every daemon's config (e.g. a `[pacing]` section).
    pub extra: String,
    /// Appended to one host's config after `extra` (e.g. its `[datapath]`).
    pub host_extra: Vec<String>,
}

impl Drop for Bed {
    fn drop(&mut self) {
        for c in self.daemons.iter_mut().flatten().chain(self.others.iter_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            for h in 0..self.hosts {
                let log = std::fs::read_to_string(self.dir.path().join(format!("d{h}.log")));
                eprintln!("---- dlcpd {h} log ----\n{}", log.unwrap_or_default());
            }
        }
        // Also kills anything still running inside the namespaces.
        testbed(self.prefix, &["down"]);
    }
}

impl Bed {
    /// Bring up the testbed (`up --hosts N ARGS`) and one daemon per host;
    /// `None` where namespaces are unavailable (after `prereq::skip`, which
    /// fails the test instead where they are required).
    pub fn start(prefix: &'static str, hosts: usize, args: &[&str], hard_timeout_ms: u32) -> Option<Bed> {
        Bed::start_with(prefix, hosts, args, hard_timeout_ms, "")
    }

    /// `start`, with `extra` appended to every daemon's config.
    pub fn start_with(
        prefix: &'static str,
        hosts: usize,
        args: &[&str],
        hard_timeout_ms: u32,
        extra: &str,
    ) -> Option<Bed> {
        if let Err(why) = namespaces_available(prefix) {
            super::prereq::skip(super::prereq::Prereq::Netns, &why);
            return None;
        }
        testbed(prefix, &["down"]);
        let dir = tempfile::Builder::new().prefix("dlcp-testbed-").tempdir().unwrap();
        let sockets = (0..hosts).map(|h| dir.path().join(format!("d{h}.sock"))).collect();
        let mut bed = Bed {
            prefix,
            hosts,
            dir,
            daemons: (0..hosts).map(|_| None).collect(),
            others: Vec::new(),
            sockets,
            hard_timeout_ms,
            extra: extra.into(),
            host_extra: vec![String::new(); hosts],
        };
        let n = hosts.to_string();
        let mut a = vec!["up", "--hosts", &n];
        a.extend_from_slice(args);
        let up = testbed(prefix, &a);
        assert!(up.status.success(), "testbed up {a:?} failed");
        for h in 0..hosts {
            bed.spawn(h);
        }
        for h in 0..hosts {
            bed.wait_ready(h);
        }
        Some(bed)
    }

    /// Capture UDP headers on switch port `dev` (e.g. `p1`) with tcpdump;
    /// `args` go before `-w` (e.g. `["-Q", "in"]`: only frames the host sent).
    /// Returns once the capture file exists; the capture dies with the bed.
    pub fn capture(&mut self, dev: &str, args: &[&str]) -> Capture {
        assert!(
            Command::new("tcpdump").arg("--version").output().is_ok(),
            "tcpdump not found: apt-get install tcpdump"
        );
        let pcap = self.dir.path().join(format!("{dev}.pcap"));
        let sw = format!("{}-sw", self.prefix);
        let child = Command::new("ip")
            .args(["netns", "exec", &sw, "tcpdump", "-i", dev, "-n", "-U", "--immediate-mode", "-s", "96"])
            .args(args)
            .arg("-w")
            .arg(&pcap)
            .arg("udp")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        self.others.push(child);
        let t0 = Instant::now();
        while !pcap.exists() {
            assert!(t0.elapsed() < Duration::from_secs(10), "tcpdump did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        Capture { pcap, pid }
    }

    /// Stop a capture (SIGTERM: tcpdump flushes) and return the pcap file's bytes.
    pub fn finish_capture(&mut self, c: Capture) -> Vec<u8> {
        let _ = Command::new("kill").arg("-TERM").arg(c.pid.to_string()).status();
        if let Some(i) = self.others.iter().position(|o| o.id() == c.pid) {
            let _ = self.others.remove(i).wait();
        }
        std::fs::read(&c.pcap).unwrap_or_else(|e| panic!("{}: {e}", c.pcap.display()))
    }

    /// Wait until something in host `h`'s namespace listens on TCP `port`
    /// (`ss -Hltn`), e.g. an iperf3 server: a fixed sleep lost that race on a
    /// loaded machine, and the cross traffic then never ran.
    pub fn wait_tcp_listen(&self, h: usize, port: u16) {
        let t0 = Instant::now();
        loop {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.ns(h), "ss", "-Hltn", &format!("sport = :{port}")])
                .output()
                .expect("ss (apt-get install iproute2)");
            if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "nothing listens on tcp port {port} in {}",
                self.ns(h)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn ns(&self, h: usize) -> String {
        format!("{}-h{h}", self.prefix)
    }

    fn config(&self, rank: usize) -> String {
        let mut t = format!(
            "[node]\nrank = {rank}\njob_id = {JOB}\njob_secret = \"testbed e2e test secret 0123456789\"\ngeneration = \"auto\"\n\n"
        );
        for r in 0..self.hosts {
            t += &format!("[[peers]]\nrank = {r}\naddress = \"10.77.0.{}\"\nport = {PORT}\n\n", r + 1);
        }
        t += &format!(
            "[network]\nheartbeat_interval_ms = 100\npeer_timeout_ms = 1000\n\n[loss]\nhard_timeout_ms = {}\n\n[control]\nsocket_path = \"{}\"\nsocket_mode = \"0600\"\n\n[shm]\narena_bytes = 67108864\nmax_tensor_bytes = 67108864\n\n[log]\nlevel = \"info\"\n{}\n{}\n",
            self.hard_timeout_ms,
            self.sockets[rank].display(),
            self.extra,
            self.host_extra[rank]
        );
        t
    }

    /// Start (or restart) host `h`'s daemon in its namespace.
    pub fn spawn(&mut self, h: usize) {
        let cfg = self.dir.path().join(format!("d{h}.toml"));
        write_private(&cfg, &self.config(h));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("d{h}.log")))
            .unwrap();
        // `ip netns exec` execs dlcpd: the child's pid is the daemon's.
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(h), env!("CARGO_BIN_EXE_dlcpd"), "--config"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.daemons[h] = Some(child);
    }

    pub fn wait_ready(&self, h: usize) {
        let t0 = Instant::now();
        while self.ctl(h, &["stats", "--json"]).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(20), "dlcpd {h} did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL host `h`'s daemon (by pid) and reap it.
    pub fn kill9(&mut self, h: usize) {
        let mut c = self.daemons[h].take().expect("daemon running");
        let st = Command::new("kill").arg("-9").arg(c.id().to_string()).status().unwrap();
        assert!(st.success(), "kill -9 {} failed", c.id());
        let _ = c.wait();
    }

    /// `dlcpctl --socket <h> ARGS` parsed as JSON.
    pub fn ctl(&self, h: usize, args: &[&str]) -> Result<serde_json::Value, String> {
        let out = Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
            .arg("--socket")
            .arg(&self.sockets[h])
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    }

    pub fn stats(&self, h: usize) -> serde_json::Value {
        self.ctl(h, &["stats", "--json"]).unwrap_or_else(|e| panic!("dlcpctl stats on host {h}: {e}"))
    }

    pub fn status(&self, h: usize) -> serde_json::Value {
        self.ctl(h, &["status", "--json"]).unwrap_or_else(|e| panic!("dlcpctl status on host {h}: {e}"))
    }

    pub fn report(&self, h: usize, op: u64, tensor: u32) -> serde_json::Value {
        let v = self
            .ctl(h, &["report", &op.to_string(), &tensor.to_string(), "--json"])
            .unwrap_or_else(|e| panic!("dlcpctl report {op} {tensor} on host {h}: {e}"));
        assert!(v.get("error").is_none(), "host {h} op {op} tensor {tensor}: {v}");
        v
    }

    /// The testbed's nftables loss counters `(seen, dropped)` summed over hosts.
    pub fn loss_counters(&self) -> (u64, u64) {
        let (mut seen, mut dropped) = (0, 0);
        for h in 0..self.hosts {
            for (name, acc) in [("seen", &mut seen), ("dropped", &mut dropped)] {
                let out = Command::new("ip")
                    .args(["netns", "exec", &self.ns(h), "nft", "list", "counter", "inet", self.prefix, name])
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stdout);
                let w: Vec<&str> = text.split_whitespace().collect();
                if let Some(i) = w.iter().position(|x| *x == "packets") {
                    *acc += w[i + 1].parse::<u64>().unwrap_or(0);
                }
            }
        }
        (seen, dropped)
    }
}

/// Deterministic non-integer test data (as daemon_common's).
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

/// Seed of host `h`'s input to op `i`.
pub fn seed(h: usize, i: usize) -> u64 {
    ((h as u64) << 32) | i as u64
}

/// One trainer per host runs `sizes.len()` allreduce ops in sequence (tensor
/// `i` = op seq `i + 1`, input `data(seed(h, i), n)`); returns each host's
/// (result, completion) per op. Panics (naming host and op) on a non-Ok status.
pub fn run_ops(bed: &Bed, sizes: &[usize], budget_ppm: u32) -> Vec<Vec<(Vec<f32>, dlcp::shm::Completion)>> {
    use dlcp::shm::{Status, SubmitOptions, TrainerChannel};
    let handles: Vec<_> = (0..bed.hosts)
        .map(|h| {
            let socket = bed.sockets[h].clone();
            let sizes = sizes.to_vec();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&socket, u64::from(JOB), 0, 1).expect("attach");
                let mut out = Vec::new();
                for (i, &n) in sizes.iter().enumerate() {
                    let t = cl.alloc(&format!("t{i}"), n as u64).expect("alloc");
                    cl.write(&t, &data(seed(h, i), n)).expect("write");
                    let o = SubmitOptions {
                        tensor_id: i as u32,
                        layer: 0,
                        layers: 1,
                        budget_ppm,
                        ..Default::default()
                    };
                    cl.submit(&t, o).expect("submit");
                    let done = cl.wait_completion(Duration::from_secs(20)).unwrap_or_else(|e| {
                        panic!("host {h} op {i} ({n} elems): no completion within 20 s: {e:?}")
                    });
                    assert_eq!(done.status, Status::Ok, "host {h} op {i} ({n} elems) failed: {done:?}");
                    out.push((cl.read(&t).expect("read"), done));
                    cl.free(&t.name).expect("free");
                }
                out
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("a trainer failed (see its panic above)")).collect()
}

/// p50 and max of durations.
pub fn p50_max(d: &[Duration]) -> (Duration, Duration) {
    let mut v = d.to_vec();
    v.sort();
    (v[v.len() / 2], *v.last().unwrap())
}

/// The second half of the peer-failure tests: the survivors mark `victim` down,
/// it is restarted (a new generation, newer than `gen_before`), everyone marks it
/// up again, and three new ops of `n` elements, numbered from `last_seq + 10` on
/// every host, are exact sums everywhere.
pub fn restart_and_rejoin(
    bed: &mut Bed,
    hosts: usize,
    victim: usize,
    gen_before: Option<u64>,
    last_seq: u64,
    n: usize,
) {
    use dlcp::shm::{Status, SubmitOptions, TrainerChannel};
    // The peers mark the victim down, then it restarts with a new generation.
    let t = Instant::now();
    while (0..hosts).filter(|&h| h != victim).any(|h| bed.status(h)["peers"][victim]["up"] != false) {
        assert!(t.elapsed() < Duration::from_secs(5), "host {victim} never marked down: {}", bed.status(0));
        std::thread::sleep(Duration::from_millis(50));
    }
    bed.spawn(victim);
    bed.wait_ready(victim);
    let t = Instant::now();
    while (0..hosts).filter(|&h| h != victim).any(|h| bed.status(h)["peers"][victim]["up"] != true) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "restarted host {victim} never marked up: {}",
            bed.status(0)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let gen_after = bed.status(0)["peers"][victim]["generation"].as_u64();
    assert!(
        gen_after > gen_before,
        "restart did not bring a new generation: {gen_before:?} -> {gen_after:?}"
    );
    // New ops, numbered alike on all hosts, succeed everywhere and are exact.
    let next = last_seq + 10;
    let x: Vec<Vec<f32>> = (0..hosts).map(|h| data(seed(h, 9999), n)).collect();
    let hs: Vec<_> = (0..hosts)
        .map(|h| {
            let s = bed.sockets[h].clone();
            let x = x[h].clone();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&s, u64::from(JOB), 0, 1).expect("attach after restart");
                cl.set_next_op_seq(next);
                let mut outs = Vec::new();
                for k in 0..3u32 {
                    let t = cl.alloc(&format!("after{k}"), n as u64).unwrap();
                    cl.write(&t, &x).unwrap();
                    cl.submit(&t, SubmitOptions { tensor_id: 2 + k, budget_ppm: 0, ..Default::default() })
                        .unwrap();
                    let d =
                        cl.wait_completion(Duration::from_secs(10)).expect("a completion after the restart");
                    assert_eq!(
                        d.status,
                        Status::Ok,
                        "host {h} op {}: failed after the restart: {d:?}",
                        next + u64::from(k)
                    );
                    outs.push(cl.read(&t).unwrap());
                    cl.free(&t.name).unwrap();
                }
                outs
            })
        })
        .collect();
    let mut want = x[0].clone();
    for xh in &x[1..] {
        want.iter_mut().zip(xh).for_each(|(a, b)| *a += *b);
    }
    for (h, t) in hs.into_iter().enumerate() {
        for (k, out) in t.join().expect("trainer after the restart").iter().enumerate() {
            assert!(
                out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "host {h} op {} after the restart: not the exact sum",
                next + k as u64
            );
        }
    }
}

/// Checks every op of a lossy run with budget `budget_ppm`: every transfer of
/// every host's report delivered ≥ 1 − budget, every trainer's result equals
/// the oracle's recomputation from the inputs and the owners' delivery bitmaps
/// (so all ranks agree), and each trainer saw ≥ 1 − budget delivered. Returns
/// the owners' reports per op and how many ops left a chunk missing (a caller
/// asserts it is > 0, or its loss proved nothing).
pub fn check_against_oracle(
    bed: &Bed,
    sizes: &[usize],
    results: &[Vec<(Vec<f32>, dlcp::shm::Completion)>],
    budget_ppm: u32,
) -> (Vec<Vec<serde_json::Value>>, usize) {
    let min_fraction = 1.0 - f64::from(budget_ppm) / 1e6;
    let mut lossy = 0;
    let mut all = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let reports: Vec<_> = (0..bed.hosts).map(|h| bed.report(h, i as u64 + 1, i as u32)).collect();
        for (h, r) in reports.iter().enumerate() {
            for t in r["scatter"].as_array().unwrap().iter().chain(r["gather"].as_array().unwrap()) {
                let f = t["delivered_fraction"].as_f64().unwrap();
                assert!(f >= min_fraction, "host {h} op {i}: a transfer delivered only {f}: {t}");
            }
        }
        let owners: Vec<_> = reports.iter().map(dlcp::service::report_from_json).collect();
        lossy += usize::from(owners.iter().any(|o| o.scatter.iter().any(|t| !t.delivered.is_full())));
        let inputs: Vec<Vec<f32>> = (0..bed.hosts).map(|h| data(seed(h, i), n)).collect();
        let ins: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let refs: Vec<_> = owners.iter().collect();
        let opts = dlcp::proto::endpoint::OpOptions { budget_ppm, ..Default::default() };
        let want: Vec<u32> =
            dlcp::proto::oracle::recompute(&ins, &refs, opts, 1372 / 4).iter().map(|x| x.to_bits()).collect();
        for (h, r) in results.iter().enumerate() {
            let got: Vec<u32> = r[i].0.iter().map(|x| x.to_bits()).collect();
            assert!(
                got == want,
                "host {h} op {i} ({n} elems): result differs from the oracle's recomputation"
            );
            let ppm = r[i].1.delivered_ppm;
            assert!(f64::from(ppm) / 1e6 >= min_fraction, "host {h} op {i}: delivered {ppm} ppm");
        }
        all.push(reports);
    }
    (all, lossy)
}

/// Write a configuration file readable by its owner alone (dlcpd refuses an
/// inline secret in a file others may read), whatever the umask.
fn write_private(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}
