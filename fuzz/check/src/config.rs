//! The configuration loader (`dlcp_config::Config::from_str_named`), from
//! TOML text.
//!
//! Input: a mode byte, then raw text (mode 0), or edits to a valid
//! four-node configuration (modes 1–3): set a known key of a known table to
//! a value from a dictionary of edge cases (or a fuzzed number), remove a
//! key, add an unknown one, add or drop a peer; mode 3 then also edits the
//! rendered bytes. `node.job_secret_file` is never written (it would read
//! files). Checked:
//! - loading never panics; an error names a line inside the text and says something;
//! - a loaded configuration answers every getter the daemon calls at start-up;
//! - its effective form (`to_toml_string`, `dlcpd check-config`) loads again,
//!   with the secret put back, to an equal configuration with no difference.

use dlcp_config::Config;
use dlcp_config::schema::REDACTED;

use crate::input::{Input, mutate};

/// The tables and keys edits choose from (`peers` is the array of tables).
const KEYS: &[(&str, &[&str])] = &[
    ("node", &["rank", "job_id", "job_secret", "generation"]),
    ("peers", &["rank", "address", "port"]),
    (
        "network",
        &[
            "mtu",
            "chunk_bytes",
            "heartbeat_interval_ms",
            "peer_timeout_ms",
            "flow_window_bytes",
            "bind_address",
        ],
    ),
    ("datapath", &["kind"]),
    (
        "datapath.socket",
        &["gso", "gso_max_segments", "batch", "send_buffer_bytes", "recv_buffer_bytes", "gro"],
    ),
    (
        "datapath.dpdk",
        &[
            "eal_args",
            "port_id",
            "rx_queues",
            "tx_queues",
            "rx_burst",
            "tx_burst",
            "rx_ring_size",
            "mbuf_pool_size",
            "class_tx_queue",
            "neighbours",
        ],
    ),
    (
        "priority",
        &[
            "scatter_band",
            "gather_band",
            "layer_levels",
            "magnitude_levels",
            "droppable",
            "dscp",
            "so_priority",
        ],
    ),
    (
        "loss",
        &[
            "budget",
            "gather_budget",
            "fill",
            "rescale",
            "deadline_min_ms",
            "deadline_max_ms",
            "hard_timeout_ms",
            "probe_timeout_min_ms",
            "probe_timeout_max_ms",
            "initial_per_chunk_us",
        ],
    ),
    ("pacing", &["rate_mbps", "burst_bytes", "adapt"]),
    (
        "shm",
        &[
            "arena_bytes",
            "ring_entries",
            "max_tensor_bytes",
            "early_buffer_bytes",
            "max_attachments",
            "max_attachments_per_user",
        ],
    ),
    (
        "control",
        &[
            "socket_path",
            "socket_mode",
            "max_admin_connections",
            "max_pending_attaches",
            "request_timeout_ms",
        ],
    ),
    ("metrics", &["enabled", "address"]),
    ("security", &["packet_auth"]),
    ("log", &["level"]),
];

const VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "3",
    "4",
    "7",
    "8",
    "16",
    "64",
    "255",
    "256",
    "1500",
    "9000",
    "65535",
    "65536",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "1e300",
    "0.5",
    "0.01",
    "0.1",
    "0.10001",
    "-0.0",
    "nan",
    "inf",
    "true",
    "false",
    "\"\"",
    "\"auto\"",
    "\"zero\"",
    "\"local\"",
    "\"socket\"",
    "\"dpdk\"",
    "\"10.77.0.1\"",
    "\"::1\"",
    "\"127.0.0.1:0\"",
    "\"0660\"",
    "\"0777\"",
    "\"aes-128-gmac\"",
    "\"none\"",
    "\"info\"",
    "\"1%\"",
    "\"0.5 %\"",
    "[]",
    "[0, 3]",
    "[4, 6]",
    "[3, 0]",
    "[0, 0, 0, 0, 0, 0, 0, 0]",
    "[0, 10, 18, 26, 34, 40, 46, 48]",
    "[64, 1, 2, 3, 4, 5, 6, 7]",
    "[0, 1, 2, 3, 4, 5, 6, 7, 8]",
    "[\"--no-pci\"]",
    "{}",
    "\"a very secret job key\"",
    "\"/run/dlcp/x.sock\"",
    "[{ address = \"10.0.0.1\", mac = \"02:00:00:00:00:01\" }]",
];

/// The configuration as tables of `key = value` lines, in order.
type Doc = Vec<(String, Vec<(String, String)>)>;

fn base() -> Doc {
    let kv = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let mut doc: Doc = vec![(
        "[node]".into(),
        kv(&[("rank", "0"), ("job_id", "4242"), ("job_secret", "\"a very secret job key\"")]),
    )];
    for r in 0..4 {
        let addr = format!("\"10.77.0.{}\"", r + 1);
        doc.push(("[[peers]]".into(), kv(&[("rank", &r.to_string()), ("address", &addr), ("port", "7700")])));
    }
    for (t, _) in &KEYS[2..] {
        doc.push((format!("[{t}]"), Vec::new()));
    }
    doc
}

fn render(doc: &Doc) -> String {
    let mut s = String::new();
    for (header, kvs) in doc {
        s.push_str(header);
        s.push('\n');
        for (k, v) in kvs {
            s.push_str(&format!("{k} = {v}\n"));
        }
    }
    s
}

fn edit(input: &mut Input<'_>, doc: &mut Doc) {
    for _ in 0..input.below(12) {
        let (table, keys) = input.pick(KEYS);
        let peers: Vec<usize> = (0..doc.len()).filter(|&i| doc[i].0 == "[[peers]]").collect();
        let at = if table == "peers" {
            match peers.is_empty() {
                true => None,
                false => Some(peers[input.below(peers.len())]),
            }
        } else {
            doc.iter().position(|(h, _)| *h == format!("[{table}]"))
        };
        let key = if input.u8() < 240 { input.pick(keys).to_string() } else { "unknown_key".into() };
        let value = match input.u8() {
            0..=219 => input.pick(VALUES).to_string(),
            220..=239 => input.u64().to_string(),
            _ => format!("{}", f64::from(input.u32()) / 1e6),
        };
        match (input.u8() % 8, at) {
            (0, Some(i)) => doc[i].1.retain(|(k, _)| *k != key),
            (1, _) if !peers.is_empty() => {
                doc.remove(*peers.last().expect("not empty"));
            }
            (2, _) => {
                let r = peers.len();
                let kvs = vec![
                    ("rank".into(), r.to_string()),
                    ("address".into(), format!("\"10.77.1.{}\"", r % 250)),
                    ("port".into(), "7700".into()),
                ];
                doc.insert(peers.last().map_or(1, |p| p + 1), ("[[peers]]".into(), kvs));
            }
            (_, Some(i)) => match doc[i].1.iter_mut().find(|(k, _)| *k == key) {
                Some(kv) => kv.1 = value,
                None => doc[i].1.push((key, value)),
            },
            _ => {}
        }
    }
}

/// `s` as a TOML basic string.
fn quote(s: &str) -> String {
    let mut q = String::from("\"");
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                q.push('\\');
                q.push(c);
            }
            c if c.is_control() => q.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// Run one input.
pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    let mode = input.u8() % 4;
    let text = if mode == 0 {
        String::from_utf8_lossy(input.rest()).into_owned()
    } else {
        let mut doc = base();
        edit(&mut input, &mut doc);
        let mut bytes = render(&doc).into_bytes();
        if mode == 3 {
            mutate(&mut input, &mut bytes, 6);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    };
    match Config::from_str_named(&text, "/nonexistent/dlcp.toml") {
        Ok(cfg) => loaded(&cfg),
        Err(e) => {
            assert!(!e.message().is_empty() && !e.to_string().is_empty());
            if let Some(line) = e.line() {
                assert!(line >= 1 && line <= text.lines().count().max(1) + 1, "line {line} of {text:?}: {e}");
            }
        }
    }
}

fn loaded(cfg: &Config) {
    let _ = (cfg.bind_addr(), cfg.chunk_bytes(), cfg.classifier(), cfg.job_key(), cfg.own_peer());
    assert!(cfg.world_size() >= 1 && cfg.rank() < cfg.world_size());
    assert!(!cfg.settings().is_empty());
    let Some(secret) = std::str::from_utf8(cfg.job_secret()).ok().filter(|_| cfg.node.job_secret.is_some())
    else {
        return;
    };
    let shown = cfg.to_toml_string();
    let again = shown.replace(&format!("\"{REDACTED}\""), &quote(secret));
    let reloaded = Config::from_str_named(&again, "/nonexistent/dlcp.toml")
        .unwrap_or_else(|e| panic!("the effective configuration does not load: {e}\n{again}"));
    let diff = cfg.diff(&reloaded);
    assert!(diff.is_empty(), "effective configuration differs: {diff:?}\n{again}");
    assert_eq!(&reloaded, cfg);
}
