//! Datapath selection of the real `dlcpd` (`datapath.kind`), in builds with and
//! without DPDK:
//! * `kind = "dpdk"` whose port cannot come up (or in a build without DPDK) exits
//!   at once with status 1 and one line saying why;
//! * `kind = "auto"` in the same situation logs one line saying why and runs on
//!   sockets: two daemons all-reduce bit-exactly on loopback;
//! * the start-up line says whether DPDK is built;
//! * `kind = "auto"` with a port that comes up (`net_null0`, no hugepages) runs on
//!   DPDK (DPDK builds only; elsewhere it fails under `DLCP_REQUIRE_DPDK=1` /
//!   `DLCP_CI=1` and is reported as skipped otherwise, see `tests/prereq`).

mod daemon_common;
mod prereq;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use daemon_common::{Cluster, Options, PORT_BLOCK};

/// EAL arguments for a development box: no hugepages, no PCI, a null device that
/// receives nothing (`no-rx=1`; by default `net_null` receives an endless stream).
fn eal(tag: &str) -> String {
    format!(
        "eal_args = [\"--no-huge\", \"--no-pci\", \"--no-shconf\", \"--no-telemetry\", \"-m\", \"128\", \"-l\", \"0\", \"--file-prefix\", \"dlcpfb{tag}{}\", \"--vdev=net_null0,no-rx=1\"]",
        std::process::id()
    )
}

#[test]
fn dpdk_kind_fails_fast_naming_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("d.toml");
    let extra = format!("[datapath]\nkind = \"dpdk\"\n[datapath.dpdk]\nport_id = 5\n{}\n", eal("a"));
    let text = daemon_common::config_text(
        0,
        &[47_001, 47_001 + PORT_BLOCK],
        &dir.path().join("d.sock"),
        &Options { extra, ..Default::default() },
    );
    daemon_common::write_config(&cfg, &text);
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlcpd"))
        .arg("--config")
        .arg(&cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("dlcpd with an unusable DPDK port kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(1), "{log}");
    let why: Vec<&str> = log.lines().filter(|l| l.contains("datapath.kind = \"dpdk\"")).collect();
    assert_eq!(why.len(), 1, "one line with the reason expected:\n{log}");
    if dlcp_ffi::DPDK_BUILT {
        assert!(why[0].contains("DPDK port 5 does not exist (EAL found 1 port(s)"), "{}", why[0]);
    } else {
        assert!(why[0].contains("this build has no DPDK datapath"), "{}", why[0]);
    }
}

#[test]
fn auto_falls_back_to_sockets_with_one_line_why_and_allreduces() {
    let extra = format!("[datapath]\nkind = \"auto\"\n[datapath.dpdk]\nport_id = 5\n{}\n", eal("b"));
    let c = Cluster::start(&Options { hosts: 2, extra, ..Default::default() });
    for r in 0..2 {
        let s = c.stats(r).unwrap();
        let d = s["datapath"].as_str().unwrap();
        assert!(d.starts_with("socket (udp 127.0.0.1:"), "rank {r}: {d}");
        let log = c.log(r);
        let start = if dlcp_ffi::DPDK_BUILT {
            "datapaths: socket (always), dpdk (libdpdk"
        } else {
            "datapaths: socket (always); dpdk not built (libdpdk >= 22.11 not found by pkg-config"
        };
        assert!(log.contains(start), "rank {r}: the start-up line does not say {start:?}:\n{log}");
        let why: Vec<&str> = log.lines().filter(|l| l.contains("datapath auto: using sockets (")).collect();
        assert_eq!(why.len(), 1, "rank {r}: one line saying why expected:\n{log}");
        let reason = if dlcp_ffi::DPDK_BUILT {
            "DPDK port 5 does not exist"
        } else {
            "no DPDK datapath in this build"
        };
        assert!(why[0].contains(reason), "rank {r}: {}", why[0]);
    }
    // The fallback datapath works: one allreduce, bit-exact.
    let n = 50_000;
    let handles: Vec<_> = (0..2u32)
        .map(|r| {
            let sock = c.daemons[r as usize].socket.clone();
            std::thread::spawn(move || {
                let mut cl =
                    dlcp::shm::TrainerChannel::attach(&sock, u64::from(daemon_common::JOB), 0, 1).unwrap();
                let t = cl.alloc("t", n as u64).unwrap();
                cl.write(&t, &daemon_common::data(u64::from(r), n)).unwrap();
                let o = dlcp::shm::SubmitOptions { tensor_id: 1, budget_ppm: 0, ..Default::default() };
                cl.submit(&t, o).unwrap();
                let d = cl.wait_completion(Duration::from_secs(20)).unwrap();
                assert_eq!(d.status, dlcp::shm::Status::Ok);
                cl.read(&t).unwrap()
            })
        })
        .collect();
    let got: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let want: Vec<f32> =
        daemon_common::data(0, n).iter().zip(daemon_common::data(1, n)).map(|(a, b)| a + b).collect();
    for g in &got {
        assert!(g.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "not bit-exact");
    }
}

#[test]
fn auto_uses_dpdk_when_the_port_comes_up() {
    if !dlcp_ffi::DPDK_BUILT {
        return prereq::skip(prereq::Prereq::Dpdk, dlcp_ffi::DPDK_PROBE);
    }
    let extra = format!("[datapath]\nkind = \"auto\"\n[datapath.dpdk]\n{}\n", eal("c"));
    let c = Cluster::start(&Options { hosts: 1, extra, ..Default::default() });
    let s = c.stats(0).unwrap();
    let d = s["datapath"].as_str().unwrap();
    assert!(d.starts_with("dpdk (port 0 net_null0 driver net_null"), "{d}");
    assert!(c.log(0).contains("datapath auto: using DPDK"), "{}", c.log(0));
    // Idle, the poll loop backs off: far less than a core (a busy poll would use ~100%).
    let ticks = |pid: u32| -> u64 {
        let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let f: Vec<&str> = st.rsplit_once(')').unwrap().1.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let pid = c.daemons[0].child.as_ref().unwrap().id();
    let (t0, c0) = (Instant::now(), ticks(pid));
    std::thread::sleep(Duration::from_secs(2));
    let used = (ticks(pid) - c0) as f64 / 100.0 / t0.elapsed().as_secs_f64();
    eprintln!("idle DPDK daemon used {:.1}% of a core", used * 100.0);
    assert!(
        used < 0.5,
        "idle DPDK daemon used {:.0}% of a core: the poll loop does not back off",
        used * 100.0
    );
}
