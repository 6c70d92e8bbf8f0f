//! A DSCP-map reload on the DPDK datapath applies live: in a network namespace
//! of its own, dlcpd 0 drives `net_tap0` through DPDK and dlcpd 1 runs on kernel
//! sockets on the tap's kernel side. tcpdump captures the frames DPDK sends
//! during an allreduce; every one carries its class's DSCP (the class read from
//! the dlcp header inside) and a valid IPv4 header and UDP checksum (checked
//! here, independently of dlcp's `frame` module). Then `dlcpctl reload` with a
//! new `[priority] dscp` map reports it applied (not "needs restart"), and the
//! next allreduce's frames carry the new DSCP, checksums still right, results
//! still bit-exact (the kernel drops IPv4 with a bad header checksum).
//!
//! Needs root, network namespaces, /dev/net/tun, tcpdump and a build with DPDK;
//! where one is missing the test fails under `DLCP_REQUIRE_<NAME>=1` /
//! `DLCP_CI=1`, else it is reported as skipped (see `tests/prereq`).

/// A build without DPDK: fails under `DLCP_REQUIRE_DPDK=1` / `DLCP_CI=1`, else
/// reported as skipped (see `tests/prereq`).
#[cfg(not(dpdk))]
#[test]
fn dscp_reload_applies_live_on_dpdk() {
    prereq::skip(prereq::Prereq::Dpdk, dlcp_ffi::DPDK_PROBE);
}

#[cfg(dpdk)]
mod daemon_common;
mod prereq;
#[cfg(dpdk)]
mod tap_common;

#[cfg(dpdk)]
mod on_tap {
    use std::io::{BufRead, BufReader};
    use std::path::PathBuf;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use super::daemon_common::{JOB, data};
    use super::prereq::{Prereq, skip};
    use super::tap_common::{Tap, ctl, ip};

    const NS: &str = "dpdkrl";
    const IFACE: &str = "drltap0";
    /// Every class moves to a DSCP other than its default one.
    const NEW_DSCP: [u8; 8] = [8, 12, 20, 28, 36, 44, 38, 56];

    /// The Internet checksum over `b` (plus `init`) folds to 0xffff.
    fn folds_to_ffff(b: &[u8], init: u32) -> bool {
        let mut s: u32 = init
            + b.chunks(2).map(|c| u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0))).sum::<u32>();
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s == 0xffff
    }

    /// One captured frame from the DPDK side: (dlcp class, DSCP).
    /// Panics unless the IPv4 header and UDP checksums verify.
    fn check_frame(f: &[u8]) -> (u8, u8) {
        assert!(f.len() >= 14 + 20 + 8 + 64, "short frame: {} bytes", f.len());
        assert_eq!(&f[12..14], &[0x08, 0x00], "not IPv4");
        let ip = &f[14..34];
        assert_eq!(ip[0], 0x45, "IPv4 without options");
        assert_eq!(ip[9], 17, "UDP");
        assert!(folds_to_ffff(ip, 0), "IPv4 header checksum wrong: {ip:02x?}");
        let ip_len = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let udp = &f[34..14 + ip_len];
        let udp_len = u16::from_be_bytes([udp[4], udp[5]]);
        assert_eq!(usize::from(udp_len), udp.len());
        // Pseudo header: addresses, protocol, UDP length.
        let pseudo: u32 = ip[12..20].chunks(2).map(|c| u32::from(c[0]) << 8 | u32::from(c[1])).sum::<u32>()
            + 17
            + u32::from(udp_len);
        assert!(u16::from_be_bytes([udp[6], udp[7]]) != 0, "UDP checksum left out");
        assert!(folds_to_ffff(udp, pseudo), "UDP checksum wrong");
        let dlcp = &udp[8..];
        assert_eq!(&dlcp[..2], &[0xd1, 0xc9], "dlcp magic");
        (dlcp[5], ip[1] >> 2)
    }

    /// Frames of a classic pcap file (microsecond or nanosecond, either byte order).
    fn pcap_frames(b: &[u8]) -> Vec<Vec<u8>> {
        assert!(b.len() >= 24, "pcap file of {} bytes", b.len());
        let magic = u32::from_le_bytes(b[..4].try_into().unwrap());
        let le = matches!(magic, 0xa1b2_c3d4 | 0xa1b2_3c4d);
        assert!(le || matches!(magic.swap_bytes(), 0xa1b2_c3d4 | 0xa1b2_3c4d), "pcap magic {magic:#x}");
        let u = |x: &[u8]| {
            let a: [u8; 4] = x.try_into().unwrap();
            if le { u32::from_le_bytes(a) } else { u32::from_be_bytes(a) }
        };
        assert_eq!(u(&b[20..24]), 1, "link type Ethernet");
        let (mut at, mut out) = (24, Vec::new());
        while at + 16 <= b.len() {
            let caplen = u(&b[at + 8..at + 12]) as usize;
            if at + 16 + caplen > b.len() {
                break; // a record still being written when tcpdump stopped
            }
            out.push(b[at + 16..at + 16 + caplen].to_vec());
            at += 16 + caplen;
        }
        out
    }

    /// Capture what dlcpd 0 (DPDK) sends while both ranks run one allreduce
    /// (tensor `id`), check its results; returns (class, DSCP) per frame.
    fn allreduce_captured(g: &Tap, sockets: &[PathBuf; 2], id: u32) -> Vec<(u8, u8)> {
        let file = g.dir.path().join(format!("cap{id}.pcap"));
        let mut dump = Command::new("ip")
            .args(["netns", "exec", NS, "tcpdump", "-i", IFACE, "-nn", "-U", "-s", "2048", "-w"])
            .arg(&file)
            // Every source port of its paths (`[network] paths`, 16 by default).
            .args(["udp and src host 10.78.0.2 and src portrange 7704-7719"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump");
        // Wait for "listening on ..." so no frame of the op is missed.
        let mut err = BufReader::new(dump.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        assert!(line.contains("listening on"), "tcpdump: {line}");
        let n = 60_001;
        let handles: Vec<_> = sockets
            .iter()
            .cloned()
            .enumerate()
            .map(|(r, sock)| {
                std::thread::spawn(move || {
                    let mut cl = dlcp::shm::TrainerChannel::attach(&sock, u64::from(JOB), 0, 1).unwrap();
                    let t = cl.alloc("t", n as u64).unwrap();
                    cl.write(&t, &data(u64::from(r as u32 * 10 + id), n)).unwrap();
                    let o = dlcp::shm::SubmitOptions { tensor_id: id, budget_ppm: 0, ..Default::default() };
                    cl.submit(&t, o).unwrap();
                    let d = cl.wait_completion(Duration::from_secs(20)).unwrap();
                    assert_eq!(d.status, dlcp::shm::Status::Ok, "rank {r} op {id}");
                    cl.read(&t).unwrap()
                })
            })
            .collect();
        let want: Vec<u32> = data(u64::from(id), n)
            .iter()
            .zip(data(10 + u64::from(id), n))
            .map(|(a, b)| (a + b).to_bits())
            .collect();
        for (r, h) in handles.into_iter().enumerate() {
            let got: Vec<u32> = h.join().unwrap().iter().map(|x| x.to_bits()).collect();
            assert!(got == want, "rank {r} op {id}: not bit-exact");
        }
        // The last PROBE copies and DONEs; then stop (every packet is flushed: -U).
        std::thread::sleep(Duration::from_millis(300));
        let _ = dump.kill();
        let _ = dump.wait();
        let frames = pcap_frames(&std::fs::read(&file).unwrap());
        frames.iter().map(|f| check_frame(f)).collect()
    }

    fn assert_marked(frames: &[(u8, u8)], map: [u8; 8], what: &str) {
        assert!(frames.len() >= 100, "{what}: only {} frames captured", frames.len());
        let mut classes = 0u8;
        for &(class, dscp) in frames {
            assert!(class < 8, "{what}: class {class}");
            assert_eq!(dscp, map[usize::from(class)], "{what}: class {class} sent with DSCP {dscp}");
            classes |= 1 << class;
        }
        assert!(classes & 0x80 != 0 && classes & 0x7f != 0, "{what}: control and data seen: {classes:#x}");
        eprintln!(
            "{what}: {} frames, classes {classes:#010b}, every one with its class's DSCP",
            frames.len()
        );
    }

    #[test]
    fn dscp_reload_applies_live_on_dpdk() {
        if let Err(e) = Command::new("tcpdump").arg("--version").output() {
            return skip(Prereq::Tcpdump, &format!("tcpdump --version: {e}"));
        }
        let mut g = match Tap::new(NS, 7704) {
            Ok(g) => g,
            Err(why) => return skip(Prereq::Netns, &why),
        };
        let dpdk = g.dpdk_datapath(IFACE);
        let s0 = g.spawn(0, &dpdk);
        assert!(ip(&["-n", NS, "addr", "add", "10.78.0.1/24", "dev", IFACE]));
        assert!(ip(&["-n", NS, "link", "set", IFACE, "up"]));
        let s1 = g.spawn(1, "");
        let sockets = [s0.clone(), s1];
        let st = ctl(&s0, &["status", "--json"]).unwrap();
        assert!(st.to_string().contains("dpdk (port 0"), "dlcpd 0 runs on DPDK: {st}");

        let before = allreduce_captured(&g, &sockets, 1);
        assert_marked(&before, dlcp::config::schema::DEFAULT_DSCP, "default map");

        let cfg = g.dir.path().join("d0.toml");
        let t = std::fs::read_to_string(&cfg).unwrap();
        std::fs::write(&cfg, format!("{t}\n[priority]\ndscp = {NEW_DSCP:?}\n")).unwrap();
        let o = ctl(&s0, &["reload", "--json"]).unwrap();
        assert_eq!(o["ok"], true, "{o}");
        assert!(o["applied"].to_string().contains("priority.dscp"), "{o}");
        assert_eq!(o["not_applied"], serde_json::json!([]), "{o}");
        assert_eq!(o["needs_restart"], serde_json::json!([]), "{o}");

        let after = allreduce_captured(&g, &sockets, 2);
        assert_marked(&after, NEW_DSCP, "after reload");
    }
}
