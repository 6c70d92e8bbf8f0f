//! DSCP on the wire, on the emulated cluster of `scripts/testbed.sh`: two real
//! `dlcpd` in two host namespaces with a non-default class → DSCP map, a
//! capture on the switch port of host 1, and a check that every dlcp datagram's
//! DSCP equals the configured value of its class (the class is byte 5 of the
//! dlcp header) — control packets (class 7) included — and that the switch's
//! per-class htb counters saw the same datagrams.
//!
//! Needs root and network namespaces; prints a loud SKIPPED message and passes
//! where they are unavailable. Needs tcpdump (apt-get install tcpdump).

mod daemon_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use daemon_common::{JOB, data};
use dlcp::shm::{Client, Status, SubmitOptions};

/// Namespace prefix of this test's testbed (distinct from the shell tests').
const PREFIX: &str = "dlcptbr";
/// A class → DSCP map unlike the default [0, 10, 18, 26, 34, 40, 46, 48].
const DSCP: [u8; 8] = [2, 14, 22, 30, 38, 42, 44, 56];
const PORT: u16 = 7701;
const HOSTS: usize = 2;

fn testbed(args: &[&str]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed.sh");
    let out = Command::new(&script)
        .args(args)
        .env("DLCPTB_PREFIX", PREFIX)
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
fn namespaces_available() -> Result<(), String> {
    let uid = Command::new("id").arg("-u").output().map_err(|e| e.to_string())?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Err("not root".into());
    }
    let probe = format!("{PREFIX}-probe");
    let add = Command::new("ip").args(["netns", "add", &probe]).output().map_err(|e| e.to_string())?;
    if !add.status.success() {
        return Err(format!("ip netns add failed: {}", String::from_utf8_lossy(&add.stderr)));
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    Ok(())
}

/// The testbed, daemons and capture; all torn down on drop, even on failure.
struct Bed {
    dir: tempfile::TempDir,
    children: Vec<Child>,
}

impl Drop for Bed {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            for h in 0..HOSTS {
                let log = std::fs::read_to_string(self.dir.path().join(format!("d{h}.log")));
                eprintln!("---- dlcpd {h} log ----\n{}", log.unwrap_or_default());
            }
        }
        // Also kills anything still running inside the namespaces.
        testbed(&["down"]);
    }
}

fn ns(h: usize) -> String {
    format!("{PREFIX}-h{h}")
}

fn config(rank: usize, socket: &Path) -> String {
    let mut t = format!(
        "[node]\nrank = {rank}\njob_id = {JOB}\njob_secret = \"testbed dscp test secret 0123456789\"\ngeneration = \"auto\"\n\n"
    );
    for r in 0..HOSTS {
        t += &format!("[[peers]]\nrank = {r}\naddress = \"10.77.0.{}\"\nport = {PORT}\n\n", r + 1);
    }
    let dscp: Vec<String> = DSCP.iter().map(|d| d.to_string()).collect();
    t += &format!(
        "[network]\nheartbeat_interval_ms = 100\npeer_timeout_ms = 1000\n\n[loss]\nhard_timeout_ms = 10000\n\n[priority]\ndscp = [{}]\n\n[control]\nsocket_path = \"{}\"\nsocket_mode = \"0600\"\n\n[shm]\narena_bytes = 67108864\nmax_tensor_bytes = 67108864\n\n[log]\nlevel = \"info\"\n",
        dscp.join(", "),
        socket.display()
    );
    t
}

fn stats(socket: &Path) -> Result<serde_json::Value, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
        .arg("--socket")
        .arg(socket)
        .args(["stats", "--json"])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
}

/// Packets of htb class `1:1<class>` on switch port `dev` (`tc -s class show`).
fn htb_class_packets(dev: &str) -> BTreeMap<u8, u64> {
    let out = Command::new("ip")
        .args(["netns", "exec", &format!("{PREFIX}-sw"), "tc", "-s", "class", "show", "dev", dev])
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
            m.insert(c, w[3].parse().unwrap());
        }
    }
    m
}

/// (TOS byte, dlcp class byte, destination address) of every IPv4/UDP datagram
/// to or from PORT in a pcap file (Ethernet link type).
fn dlcp_marks(pcap: &[u8]) -> Vec<(u8, u8, [u8; 4])> {
    assert!(pcap.len() >= 24, "pcap file too short: {} bytes", pcap.len());
    let magic = u32::from_le_bytes(pcap[0..4].try_into().unwrap());
    assert!(magic == 0xa1b2_c3d4 || magic == 0xa1b2_3c4d, "not a little-endian pcap file: {magic:#x}");
    let linktype = u32::from_le_bytes(pcap[20..24].try_into().unwrap());
    assert_eq!(linktype, 1, "expected Ethernet captures");
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
        if sport != PORT && dport != PORT {
            continue;
        }
        let payload = &udp[8..];
        assert_eq!(payload[0..2], [0xD1, 0xC9], "datagram on the dlcp port without dlcp magic");
        v.push((ip[1], payload[5], ip[16..20].try_into().unwrap()));
    }
    v
}

#[test]
fn dlcp_marks_every_datagram_with_its_class_dscp_on_the_wire() {
    if let Err(why) = namespaces_available() {
        eprintln!("\n!!!!!!!! SKIPPED testbed DSCP test: network namespaces unavailable ({why}) !!!!!!!!\n");
        return;
    }
    assert!(
        Command::new("tcpdump").arg("--version").output().is_ok(),
        "tcpdump not found: apt-get install tcpdump"
    );
    testbed(&["down"]);
    let dir = tempfile::Builder::new().prefix("dlcp-testbed-").tempdir().unwrap();
    let mut bed = Bed { dir, children: Vec::new() };
    let dscp_arg: Vec<String> = DSCP.iter().map(|d| d.to_string()).collect();
    let up = testbed(&["up", "--hosts", "2", "--dscp", &dscp_arg.join(",")]);
    assert!(up.status.success(), "testbed up failed");

    // Capture on switch port p1 (both directions of host 1's link), headers only.
    let pcap = bed.dir.path().join("p1.pcap");
    let tcpdump = Command::new("ip")
        .args([
            "netns",
            "exec",
            &format!("{PREFIX}-sw"),
            "tcpdump",
            "-i",
            "p1",
            "-n",
            "-U",
            "--immediate-mode",
            "-s",
            "96",
        ])
        .arg("-w")
        .arg(&pcap)
        .arg("udp")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    bed.children.push(tcpdump);
    let t0 = Instant::now();
    while !pcap.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "tcpdump did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));

    let mut sockets: Vec<PathBuf> = Vec::new();
    for h in 0..HOSTS {
        let socket = bed.dir.path().join(format!("d{h}.sock"));
        let cfg = bed.dir.path().join(format!("d{h}.toml"));
        std::fs::write(&cfg, config(h, &socket)).unwrap();
        let log = std::fs::File::create(bed.dir.path().join(format!("d{h}.log"))).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &ns(h), env!("CARGO_BIN_EXE_dlcpd"), "--config"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        bed.children.push(child);
        sockets.push(socket);
    }
    for s in &sockets {
        let t0 = Instant::now();
        while stats(s).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(20), "dlcpd at {} did not come up", s.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    // Tensors at every layer position, large and small values, reliable and
    // lossy budgets: reduce-scatter classes 0..3, all-gather 4..6, control 7.
    const LAYERS: u32 = 4;
    let workers: Vec<_> = sockets
        .iter()
        .enumerate()
        .map(|(h, sock)| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let mut cl = Client::attach(&sock, u64::from(JOB), 0, 1).expect("attach");
                let mut out = Vec::new();
                for round in 0..3u32 {
                    for layer in 0..LAYERS {
                        let n = 50_000 + 1000 * layer as usize;
                        let name = format!("l{layer}r{round}");
                        let t = cl.alloc(&name, n as u64).expect("alloc");
                        let x = data(u64::from(layer * 10 + round), n);
                        cl.write(&t, &x).expect("write");
                        let o = SubmitOptions {
                            tensor_id: layer + LAYERS * round,
                            layer,
                            layers: LAYERS,
                            budget_ppm: if round == 1 { 10_000 } else { 0 },
                            ..Default::default()
                        };
                        cl.submit(&t, o).expect("submit");
                        let d = cl.wait_completion(Duration::from_secs(30)).expect("completion");
                        assert_eq!(d.status, Status::Ok, "host {h} op layer {layer} round {round}");
                        out.push(cl.read(&t).unwrap());
                        cl.free(&name).unwrap();
                    }
                }
                out
            })
        })
        .collect();
    let results: Vec<Vec<Vec<f32>>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(results[0], results[1], "ranks disagree");
    // Heartbeats (class 7) keep flowing; give the capture a moment to flush.
    std::thread::sleep(Duration::from_millis(400));
    let htb = htb_class_packets("p1");
    let tcpdump = &mut bed.children[0];
    let _ = Command::new("kill").arg("-TERM").arg(tcpdump.id().to_string()).status();
    let _ = tcpdump.wait();

    let marks = dlcp_marks(&std::fs::read(&pcap).unwrap());
    let mut per_class: BTreeMap<u8, u64> = BTreeMap::new();
    let mut to_h1: BTreeMap<u8, u64> = BTreeMap::new();
    let mut wrong = Vec::new();
    for &(tos, class, dst) in &marks {
        assert!(class < 8, "class byte {class} out of range");
        *per_class.entry(class).or_default() += 1;
        if dst == [10, 77, 0, 2] {
            *to_h1.entry(class).or_default() += 1;
        }
        if tos != DSCP[usize::from(class)] << 2 {
            wrong.push((class, tos >> 2, tos & 3));
        }
    }
    eprintln!("dlcp datagrams on p1 per class: {per_class:?}, of them to host 1: {to_h1:?}");
    eprintln!("htb packets on p1 (egress to host 1) per class: {htb:?}");
    assert!(marks.len() > 200, "only {} dlcp datagrams captured", marks.len());
    assert!(
        wrong.is_empty(),
        "{} of {} datagrams carry a wrong mark, first (class, dscp, ecn): {:?}",
        wrong.len(),
        marks.len(),
        &wrong[..wrong.len().min(10)]
    );
    assert!(per_class.contains_key(&7), "no control packets (class 7) captured: {per_class:?}");
    let scatter = (0..=3).filter(|c| per_class.contains_key(c)).count();
    let gather = (4..=6).filter(|c| per_class.contains_key(c)).count();
    assert!(scatter >= 2 && gather >= 2, "too few data classes on the wire: {per_class:?}");
    // The switch classified by those marks: the datagrams to host 1 left
    // through p1's htb classes; data classes are quiet once
    // the ops are done, so their counts agree exactly. Class 0's htb class
    // also takes unclassified traffic (ARP, neighbour discovery); class 7
    // (heartbeats) keeps flowing between the two readings.
    for c in 1..=6u8 {
        let wire = to_h1.get(&c).copied().unwrap_or(0);
        let sw = htb.get(&c).copied().unwrap_or(0);
        assert_eq!(sw, wire, "class {c}: htb class 1:1{c} counted {sw}, the capture {wire}");
    }
    assert!(htb.get(&0).copied().unwrap_or(0) >= to_h1.get(&0).copied().unwrap_or(0));
}
