//! The Prometheus endpoint end to end: two real daemons, a real allreduce, the
//! exposition parsed strictly (Prometheus text format 0.0.4); a taken metrics
//! port is reported, not fatal.

mod daemon_common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use daemon_common::*;
use dlcp::shm::{Status, SubmitOptions, TrainerChannel};

/// One sample: metric name, labels, value.
type Samples = Vec<(String, BTreeMap<String, String>, f64)>;

/// A strict parser of the Prometheus text format: every line is a `# HELP`,
/// a `# TYPE` (before the family's samples, once per family) or a sample
/// `name{label="value",...} value` whose name belongs to the declared family
/// (`_total` for counters, `_bucket`/`_sum`/`_count` for histograms, `_info`
/// for info); names and label names match the allowed grammar, label values
/// use only the allowed escapes, values are floats. Histograms: buckets
/// cumulative, ending in `le="+Inf"` equal to `_count`. Panics on violations.
fn parse_exposition(text: &str) -> (Samples, BTreeMap<String, String>) {
    fn is_name(s: &str, colon: bool) -> bool {
        let mut it = s.chars();
        let ok0 = |c: char| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':');
        it.next().is_some_and(ok0) && it.all(|c| ok0(c) || c.is_ascii_digit())
    }
    assert!(text.ends_with('\n'), "exposition must end with a newline");
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = Samples::new();
    let mut current: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let ln = i + 1;
        if let Some(rest) = line.strip_prefix("# ") {
            let mut w = rest.splitn(3, ' ');
            let (kw, name) = (w.next().unwrap(), w.next().unwrap_or(""));
            assert!(is_name(name, true), "line {ln}: bad metric name {name:?}");
            match kw {
                "HELP" => {}
                "TYPE" => {
                    let t = w.next().unwrap_or("");
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&t),
                        "line {ln}: type {t:?}"
                    );
                    assert!(types.insert(name.to_owned(), t.to_owned()).is_none(), "line {ln}: TYPE twice");
                    current = Some(name.to_owned());
                }
                _ => panic!("line {ln}: unknown comment {line:?}"),
            }
            continue;
        }
        assert!(!line.is_empty(), "line {ln}: empty line");
        let (name_labels, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("line {ln}: no value"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v.parse().unwrap_or_else(|_| panic!("line {ln}: value {v:?}")),
        };
        let (name, labels) = match name_labels.split_once('{') {
            None => (name_labels, BTreeMap::new()),
            Some((n, rest)) => {
                let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("line {ln}: unclosed labels"));
                let mut labels = BTreeMap::new();
                let mut s = body;
                while !s.is_empty() {
                    let (k, r) = s.split_once("=\"").unwrap_or_else(|| panic!("line {ln}: label syntax"));
                    assert!(is_name(k, false), "line {ln}: label name {k:?}");
                    let mut v = String::new();
                    let mut chars = r.char_indices();
                    let end = loop {
                        match chars.next() {
                            Some((_, '\\')) => match chars.next() {
                                Some((_, 'n')) => v.push('\n'),
                                Some((_, c @ ('\\' | '"'))) => v.push(c),
                                other => panic!("line {ln}: bad escape {other:?}"),
                            },
                            Some((j, '"')) => break j,
                            Some((_, c)) => v.push(c),
                            None => panic!("line {ln}: unterminated label value"),
                        }
                    };
                    assert!(labels.insert(k.to_owned(), v).is_none(), "line {ln}: duplicate label");
                    s = &r[end + 1..];
                    s = s.strip_prefix(',').unwrap_or(s);
                }
                (n, labels)
            }
        };
        assert!(is_name(name, true), "line {ln}: bad sample name {name:?}");
        let fam = current.as_deref().unwrap_or_else(|| panic!("line {ln}: sample before any TYPE"));
        let ok = match types[fam].as_str() {
            "counter" => name == fam || name == format!("{fam}_total"),
            "histogram" => ["_bucket", "_sum", "_count"].iter().any(|s| name == format!("{fam}{s}")),
            _ => name == fam || name == format!("{fam}_info"),
        };
        assert!(ok, "line {ln}: sample {name} outside its family {fam} ({})", types[fam]);
        samples.push((name.to_owned(), labels, value));
    }
    // Histograms: cumulative buckets ending at +Inf == _count.
    for (fam, t) in &types {
        if t != "histogram" {
            continue;
        }
        let buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter(|(n, _, _)| *n == format!("{fam}_bucket"))
            .map(|(_, l, v)| {
                let le = &l["le"];
                (if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() }, *v)
            })
            .collect();
        assert!(!buckets.is_empty(), "{fam}: no buckets");
        assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "{fam}: not cumulative");
        let count = samples.iter().find(|(n, _, _)| *n == format!("{fam}_count")).unwrap().2;
        assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, count), "{fam}: +Inf bucket != count");
    }
    (samples, types)
}

fn get(s: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    s.iter()
        .find(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .unwrap_or_else(|| panic!("no sample {name} {labels:?}"))
        .2
}

fn body_has_help(body: &str, family: &str, text: &str) -> bool {
    body.lines().any(|l| l.starts_with(&format!("# HELP {family}_total ")) && l.contains(text))
}

fn scrape(addr: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.to_owned(), body.to_owned())
}

fn metrics_addr(c: &Cluster, r: u32) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
        .arg("--socket")
        .arg(&c.daemons[r as usize].socket)
        .args(["status", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["ops"]["metrics"]["address"].as_str().unwrap_or_else(|| panic!("no metrics address: {v}")).to_owned()
}

#[test]
fn counters_move_after_an_allreduce_and_parse_as_prometheus_text() {
    const N: usize = 100_000;
    // 5% of received datagrams dropped (seeded): budget 0 repairs them all.
    let c = Cluster::start(&Options { hosts: 2, rx_loss_pct: 5.0, ..Options::default() });
    let addr = metrics_addr(&c, 0);
    assert!(addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"), "{addr}");
    let (head, body) = scrape(&addr);
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4"), "{head}");
    let (before, _) = parse_exposition(&body);
    assert_eq!(get(&before, "dlcp_ops_total", &[("outcome", "completed")]), 0.0);

    let handles: Vec<_> = (0..2u32)
        .map(|h| {
            let socket = c.daemons[h as usize].socket.clone();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&socket, u64::from(JOB), 0, 1).unwrap();
                let t = cl.alloc("g", N as u64).unwrap();
                cl.write(&t, &data(u64::from(h), N)).unwrap();
                cl.submit(&t, SubmitOptions { tensor_id: 1, budget_ppm: 0, ..Default::default() }).unwrap();
                cl.wait_completion(Duration::from_secs(30)).unwrap()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap().status, Status::Ok);
    }
    // The loop publishes every 250 ms.
    let t0 = Instant::now();
    let (after, types) = loop {
        let (_, body) = scrape(&addr);
        let (s, t) = parse_exposition(&body);
        if get(&s, "dlcp_ops_total", &[("outcome", "completed")]) >= 1.0
            || t0.elapsed() > Duration::from_secs(5)
        {
            break (s, t);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(get(&after, "dlcp_ops_total", &[("outcome", "completed")]), 1.0);
    assert_eq!(types["dlcp_ops_total"], "counter");
    assert_eq!(types["dlcp_build_info"], "gauge");
    assert_eq!(types["dlcp_op_duration_seconds"], "histogram");
    let class_sum =
        |s: &Samples, n: &str| (0..8).map(|k| get(s, n, &[("class", &k.to_string())])).sum::<f64>();
    let chunks = (N * 4 / 2).div_ceil(1372) as f64; // half the tensor goes to the peer
    assert!(class_sum(&after, "dlcp_class_tx_packets_total") >= 2.0 * chunks, "scatter + gather data sent");
    assert!(class_sum(&after, "dlcp_class_tx_bytes_total") > class_sum(&before, "dlcp_class_tx_bytes_total"));
    assert!(class_sum(&after, "dlcp_class_rx_packets_total") >= 2.0 * chunks);
    assert!(get(&after, "dlcp_peer_tx_packets_total", &[("peer", "1")]) >= 2.0 * chunks);
    assert!(
        get(&after, "dlcp_peer_rx_packets_total", &[("peer", "1")])
            > get(&before, "dlcp_peer_rx_packets_total", &[("peer", "1")])
    );
    assert_eq!(get(&after, "dlcp_peer_up", &[("peer", "1")]), 1.0);
    let has = |name: &str, k: &str, v: &str| {
        after.iter().any(|(n, l, _)| n == name && l.get(k).map(String::as_str) == Some(v))
    };
    assert!(!has("dlcp_peer_up", "peer", "0"), "daemon 0 is not its own peer");
    // A reload the daemon refuses is "rejected" in the metrics, as dlcpctl says.
    assert_eq!(get(&after, "dlcp_config_reloads_total", &[("result", "rejected")]), 0.0);
    assert!(!has("dlcp_config_reloads_total", "result", "failed"));
    assert_eq!(get(&after, "dlcp_op_duration_seconds_count", &[]), 1.0);
    assert!(get(&after, "dlcp_op_duration_seconds_sum", &[]) > 0.0);
    assert_eq!(get(&after, "dlcp_op_delivered_fraction_count", &[]), 1.0);
    assert_eq!(get(&after, "dlcp_last_op_delivered_fraction", &[]), 1.0);
    assert_eq!(get(&after, "dlcp_loss_budget_violations_total", &[]), 0.0);
    // Repairs, per class and in total, each way; the per-class ones add up.
    for dir in ["sent", "received"] {
        let total = get(&after, "dlcp_repairs_total", &[("direction", dir)]);
        let per_class: f64 = (0..8)
            .map(|k| {
                get(&after, "dlcp_class_repairs_total", &[("class", &k.to_string()), ("direction", dir)])
            })
            .sum();
        assert!(total > 0.0, "5% loss at budget 0 needs repairs ({dir})");
        assert_eq!(per_class, total, "{dir}");
        // Two ranks: every repair is to or from peer 1.
        assert_eq!(
            get(&after, "dlcp_peer_repairs_total", &[("peer", "1"), ("direction", dir)]),
            total,
            "{dir}"
        );
        assert_eq!(
            get(&after, "dlcp_peer_repairs_total", &[("peer", "0"), ("direction", dir)]),
            0.0,
            "{dir}"
        );
        let bytes = get(&after, "dlcp_peer_repair_bytes_total", &[("peer", "1"), ("direction", dir)]);
        let class_bytes = sum_where(&after, "dlcp_class_repair_bytes_total", "direction", dir);
        assert_eq!(bytes, class_bytes, "{dir}");
        assert!(bytes >= total * 80.0, "{dir}: {bytes} bytes for {total} repairs");
    }
    assert!(get(&after, "dlcp_rx_dropped_total", &[("reason", "debug_loss")]) > 0.0);
    // Two ranks: the one peer is necessarily the last to arrive.
    assert_eq!(get(&after, "dlcp_peer_last_arrival_total", &[("peer", "1")]), 1.0);
    assert_eq!(get(&after, "dlcp_slowest_peer", &[]), 1.0);
    assert_eq!(get(&after, "dlcp_trainers", &[]), 0.0, "trainers detached after the op");
    assert!(get(&after, "dlcp_build_info", &[("rank", "0"), ("world", "2")]) == 1.0);
    for name in [
        "dlcp_shm_ring_used_entries",
        "dlcp_rx_dropped_total",
        "dlcp_config_reloads_total",
        "dlcp_repairs_total",
    ] {
        assert!(after.iter().any(|(n, _, _)| n == name), "{name} missing");
    }
    // The PROBE and deadline counters are exported as the protocol counts them.
    let proto = c.stats(0).unwrap()["protocol"].clone();
    for (metric, key) in [
        ("dlcp_probes_sent_total", "probes_sent"),
        ("dlcp_probes_duplicate_total", "probes_duplicate"),
        ("dlcp_deadlines_fired_total", "deadlines_fired"),
        ("dlcp_deadline_closes_total", "deadline_closes"),
        ("dlcp_deadline_nacks_total", "deadline_nacks"),
    ] {
        assert_eq!(types[metric], "counter", "{metric}");
        assert_eq!(get(&after, metric, &[]), proto[key].as_f64().unwrap(), "{metric} vs stats {key}");
    }
    assert!(get(&after, "dlcp_probes_sent_total", &[]) > 0.0);
    assert_eq!(
        get(&after, "dlcp_deadlines_fired_total", &[]),
        get(&after, "dlcp_deadline_closes_total", &[]) + get(&after, "dlcp_deadline_nacks_total", &[])
    );
    assert!(body_has_help(&scrape(&addr).1, "dlcp_probes_duplicate", "Redundant PROBE copies"));
    assert!(body_has_help(&scrape(&addr).1, "dlcp_deadline_nacks", "re-sent the receiver's BITMAP"));
    // Bytes per peer, each way.
    assert!(get(&after, "dlcp_peer_tx_bytes_total", &[("peer", "1")]) >= (N * 4 / 2) as f64);
    assert!(get(&after, "dlcp_peer_rx_bytes_total", &[("peer", "1")]) >= (N * 4 / 2) as f64);
    // Both daemons serve, on different ports.
    assert_ne!(metrics_addr(&c, 1), addr);
}

#[test]
fn a_taken_metrics_port_is_logged_and_the_daemon_runs_on() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut c = Cluster::start(&Options { hosts: 1, late: vec![0], ..Options::default() });
    let cfg = c.daemons[0].config.clone();
    let t = std::fs::read_to_string(&cfg).unwrap().replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    std::fs::write(&cfg, t).unwrap();
    c.spawn(0, 0.0);
    c.wait_ready(0);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
        .arg("--socket")
        .arg(&c.daemons[0].socket)
        .arg("status")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("metrics: NOT SERVED — cannot listen on metrics.address 127.0.0.1:{port}")),
        "{text}"
    );
    assert!(c.log(0).contains("running without metrics"), "{}", c.log(0));
}

#[test]
fn the_strict_parser_rejects_what_it_should() {
    let ok = "# HELP a_total x\n# TYPE a counter\na_total{k=\"v\\\"w\"} 1\n";
    parse_exposition(ok);
    for bad in [
        "a_total 1\n",                                                                    // no TYPE
        "# TYPE a counter\nb_total 1\n",            // outside the family
        "# TYPE a counter\na_total{k=v} 1\n",       // unquoted label
        "# TYPE a counter\na_total one\n",          // not a number
        "# TYPE a counter\na_total{k=\"\\x\"} 1\n", // bad escape
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n", // not cumulative
        "# TYPE a counter\na_total 1",              // no final newline
    ] {
        assert!(std::panic::catch_unwind(|| parse_exposition(bad)).is_err(), "accepted: {bad:?}");
    }
}

/// Sum of `name` over every sample whose `label` is `value`.
fn sum_where(s: &Samples, name: &str, label: &str, value: &str) -> f64 {
    s.iter()
        .filter(|(n, l, _)| n == name && l.get(label).map(String::as_str) == Some(value))
        .map(|x| x.2)
        .sum()
}

/// Forged, damaged and foreign datagrams sent to a real daemon from its peer's
/// configured address and from an address that is no peer: each is counted
/// once per class (the one its header claims, or "unknown") and once per
/// sending peer (or "unknown"), in packets and bytes, in the metrics and in
/// `dlcpctl stats`; then the peer starts and an allreduce still completes.
#[test]
fn dropped_datagrams_are_counted_per_class_and_per_peer() {
    use dlcp_proto::class::Class;
    use dlcp_proto::wire::{self, Header, JobKey, PacketType, Phase};
    use std::net::UdpSocket;
    const N: usize = 20_000;
    // Rank 1 starts late: until then the test owns its configured address.
    let mut c = Cluster::start(&Options { hosts: 2, late: vec![1], ..Options::default() });
    let addr = metrics_addr(&c, 0);
    let (_, body) = scrape(&addr);
    let (before, _) = parse_exposition(&body);
    let peer = UdpSocket::bind(("127.0.0.1", c.ports[1])).unwrap();
    // From no peer's address: a port outside every daemon's block (one per path).
    let stranger = socket_apart(&c.ports);
    let dst = ("127.0.0.1", c.ports[0]);

    let forged_key = JobKey::new(b"not this job's secret");
    let packet = |class: u8| {
        let mut h = Header::new(PacketType::Data, Class::new(class).unwrap(), Phase::Scatter);
        h.job = JOB;
        h.run = 1;
        h.src = 1; // always claims to be rank 1
        h.dst = 0;
        h.op = 1;
        h.tensor = 1;
        h.chunk_count = 4;
        let mut buf = vec![0u8; 2048];
        let n = wire::encode(&forged_key, &h, &[0x5a; 300], &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    let bad_version = |class: u8| {
        let mut p = packet(class);
        p[2] = wire::VERSION + 1;
        p
    };
    let truncated = packet(4)[..40].to_vec();
    let garbage = b"not a dlcp datagram".to_vec();
    // (socket, datagram, copies, class label, peer label)
    let plan: Vec<(&UdpSocket, Vec<u8>, usize, &str, &str)> = vec![
        (&peer, packet(3), 3, "3", "1"),                // bad MAC: reason bad_tag
        (&peer, bad_version(5), 2, "5", "1"),           // version_mismatch, class still readable
        (&peer, truncated.clone(), 4, "unknown", "1"),  // malformed, no whole header
        (&stranger, packet(2), 5, "2", "unknown"),      // claims rank 1 from elsewhere: unknown_source
        (&stranger, bad_version(6), 1, "6", "unknown"), // version_mismatch
        (&stranger, garbage.clone(), 2, "unknown", "unknown"),
    ];
    let mut want_class: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    let mut want_peer: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for (sock, d, copies, class, from) in &plan {
        for _ in 0..*copies {
            sock.send_to(d, dst).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        for (m, k) in [(&mut want_class, class), (&mut want_peer, from)] {
            let e = m.entry(k).or_default();
            e.0 += *copies as f64;
            e.1 += (*copies * d.len()) as f64;
        }
    }
    let sent: usize = plan.iter().map(|p| p.2).sum();
    let delta = |s: &Samples, n: &str, label: &str, v: &str| {
        sum_where(s, n, label, v) - sum_where(&before, n, label, v)
    };
    let t0 = Instant::now();
    let after = loop {
        let (_, body) = scrape(&addr);
        let (s, _) = parse_exposition(&body);
        let total: f64 =
            s.iter().filter(|(n, _, _)| n == "dlcp_peer_rx_dropped_packets_total").map(|x| x.2).sum();
        if total >= sent as f64 || t0.elapsed() > Duration::from_secs(5) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let classes = (0..8).map(|k| k.to_string()).chain(["unknown".to_string()]);
    for k in classes {
        let (p, b) = want_class.get(k.as_str()).copied().unwrap_or_default();
        assert_eq!(delta(&after, "dlcp_class_rx_dropped_packets_total", "class", &k), p, "class {k} packets");
        assert_eq!(delta(&after, "dlcp_class_rx_dropped_bytes_total", "class", &k), b, "class {k} bytes");
    }
    for k in ["0", "1", "unknown"] {
        let (p, b) = want_peer.get(k).copied().unwrap_or_default();
        assert_eq!(delta(&after, "dlcp_peer_rx_dropped_packets_total", "peer", k), p, "peer {k} packets");
        assert_eq!(delta(&after, "dlcp_peer_rx_dropped_bytes_total", "peer", k), b, "peer {k} bytes");
    }
    // No other peer label: the label set stays bounded whatever the sender.
    let peer_labels: std::collections::BTreeSet<&str> = after
        .iter()
        .filter(|(n, _, _)| n == "dlcp_peer_rx_dropped_packets_total")
        .map(|(_, l, _)| l["peer"].as_str())
        .collect();
    assert_eq!(peer_labels, ["0", "1", "unknown"].into());
    // The same datagrams by reason.
    let reason = |r: &str| delta(&after, "dlcp_rx_dropped_total", "reason", r);
    let reasons =
        [reason("bad_tag"), reason("malformed"), reason("version_mismatch"), reason("unknown_source")];
    assert_eq!(reasons, [3.0, 6.0, 3.0, 5.0]);

    // dlcpctl stats: --json and the human tables agree with the metrics.
    let st = c.stats(0).unwrap();
    let p = &st["protocol"];
    assert_eq!(p["rx_dropped_packets_per_class"][3], 3, "{p}");
    assert_eq!(p["rx_dropped_unknown_class"]["packets"], 6, "{p}");
    assert_eq!(p["rx_dropped_packets_per_peer"][1], 9, "{p}");
    assert_eq!(p["rx_dropped_unknown_peer"]["packets"], 8, "{p}");
    assert_eq!(p["rx_dropped_unknown_peer"]["bytes"], want_peer["unknown"].1 as u64, "{p}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
        .arg("--socket")
        .arg(&c.daemons[0].socket)
        .arg("stats")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("dlcpctl stats after the forged datagrams:\n{text}");
    let table_row = |table: &str, key: &str| -> Vec<u64> {
        let mut lines = text.lines().skip_while(|l| l.split_whitespace().next() != Some(table)).skip(1);
        let row =
            lines.find(|l| l.split_whitespace().next() == Some(key)).unwrap_or_else(|| panic!("{text}"));
        row.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect()
    };
    assert_eq!(table_row("peer", "unknown")[4..6], [8, want_peer["unknown"].1 as u64], "{text}");
    assert_eq!(table_row("peer", "1")[4..6], [9, want_peer["1"].1 as u64], "{text}");
    assert_eq!(table_row("class", "unknown")[4], 6, "{text}");
    assert_eq!(table_row("class", "2")[4], 5, "{text}");
    assert!(text.contains("duplicate copies ignored; deadlines:"), "{text}");
    assert!(
        text.contains("rejected datagrams: bad_tag 3, malformed 6, version_mismatch 3, unknown_source 5\n"),
        "{text}"
    );

    // The peer takes its address back; the daemon still reduces correctly.
    drop((peer, stranger));
    c.spawn(1, 0.0);
    c.wait_ready(1);
    let x: Vec<Vec<f32>> = (0..2).map(|h| data(100 + h, N)).collect();
    let handles: Vec<_> = (0..2usize)
        .map(|h| {
            let socket = c.daemons[h].socket.clone();
            let x = x[h].clone();
            std::thread::spawn(move || {
                let mut cl = TrainerChannel::attach(&socket, u64::from(JOB), 0, 1).unwrap();
                let t = cl.alloc("g", N as u64).unwrap();
                cl.write(&t, &x).unwrap();
                cl.submit(&t, SubmitOptions { tensor_id: 1, budget_ppm: 0, ..Default::default() }).unwrap();
                let done = cl.wait_completion(Duration::from_secs(30)).unwrap();
                (done.status, cl.read(&t).unwrap())
            })
        })
        .collect();
    let want: Vec<u32> = x[0].iter().zip(&x[1]).map(|(a, b)| (a + b).to_bits()).collect();
    for h in handles {
        let (status, got) = h.join().unwrap();
        assert_eq!(status, Status::Ok);
        assert!(got.iter().map(|v| v.to_bits()).eq(want.iter().copied()), "result differs from the sum");
    }
}

/// The kernel's receive-buffer drops on the daemon's sockets (a counter
/// declared once in the datapath's table) reach `dlcpctl stats --json`, the
/// human `dlcpctl stats` and the metrics: the daemon is stopped with SIGSTOP
/// while a flood fills its small receive buffer, then continued.
#[test]
fn kernel_receive_buffer_drops_are_counted_and_exported() {
    let c = Cluster::start(&Options {
        hosts: 1,
        extra: "[datapath.socket]\nrecv_buffer_bytes = 65536\n".into(),
        ..Options::default()
    });
    let addr = metrics_addr(&c, 0);
    let pid = c.daemons[0].child.as_ref().unwrap().id().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill").args([sig, &pid]).status().unwrap().success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let flood = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let datagram = [0u8; 1200];
    for _ in 0..4000 {
        let _ = flood.send_to(&datagram, ("127.0.0.1", c.ports[0]));
    }
    signal("-CONT");
    // The loop catches up and the next metrics update (every 250 ms) has it.
    let t0 = Instant::now();
    let st = loop {
        let st = c.stats(0).unwrap();
        if st["datapath_counters"]["rx_rcvbuf_drops"].as_u64().unwrap_or(0) > 0 || t0.elapsed().as_secs() > 10
        {
            break st;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let drops = st["datapath_counters"]["rx_rcvbuf_drops"].as_u64().expect("rx_rcvbuf_drops in stats --json");
    assert!(drops > 1000, "4000 datagrams into a 64 KiB buffer of a stopped daemon, {drops} dropped: {st}");
    assert_eq!(st["datapath_counters"]["rx_ring_overruns"], 0, "{st}");
    std::thread::sleep(Duration::from_millis(600));
    let (samples, _) = parse_exposition(&scrape(&addr).1);
    assert_eq!(get(&samples, "dlcp_rx_dropped_total", &[("reason", "socket_buffer")]), drops as f64);
    assert_eq!(get(&samples, "dlcp_rx_dropped_total", &[("reason", "nic_ring")]), 0.0);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dlcpctl"))
        .arg("--socket")
        .arg(&c.daemons[0].socket)
        .arg("stats")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("receive-side drops before dlcpd read them: {drops} by the kernel")),
        "{text}"
    );
}
