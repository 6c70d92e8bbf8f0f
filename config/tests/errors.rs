//! Every validation rule: the bad value is rejected with the right file, line and field.

use dlcp_config::{Config, ConfigError, ErrorKind, PacketAuthMode};
use dlcp_proto::wire::PacketAuth;

/// Two ranks; lines 1–14. Sections appended by tests start at line 15.
const BASE: &str = r#"[node]
rank = 1
job_id = 42
job_secret = "0123456789abcdef"

[[peers]]
rank = 0
address = "10.77.0.1"
port = 7700

[[peers]]
rank = 1
address = "10.77.0.2"
port = 7700
"#;

fn load(text: &str) -> Result<Config, ConfigError> {
    Config::from_str_named(text, "/etc/dlcp/dlcp.toml")
}

fn err(text: &str) -> ConfigError {
    match load(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e,
    }
}

/// 1-based line of the only line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    let hits: Vec<usize> =
        text.lines().enumerate().filter(|(_, l)| l.contains(needle)).map(|(i, _)| i + 1).collect();
    assert_eq!(hits.len(), 1, "needle {needle:?} must occur on exactly one line");
    hits[0]
}

/// Assert the error names `field` at the line holding `needle`, and its message
/// contains `msg`; the display is one line starting with file:line:col: field:.
#[track_caller]
fn check(text: &str, field: &str, needle: &str, msg: &str) -> ConfigError {
    let e = err(text);
    let shown = e.to_string();
    assert!(!shown.contains('\n'), "multi-line error: {shown}");
    assert_eq!(e.field(), Some(field), "{shown}");
    assert_eq!(e.line(), Some(line_of(text, needle)), "{shown}");
    assert!(e.message().contains(msg), "message {:?} lacks {msg:?}", e.message());
    let loc = e.location().unwrap();
    assert!(
        shown.starts_with(&format!("/etc/dlcp/dlcp.toml:{}:{}: {field}: ", loc.line, loc.column)),
        "{shown}"
    );
    e
}

fn with(extra: &str) -> String {
    format!("{BASE}{extra}")
}

#[test]
fn base_is_valid() {
    let c = load(BASE).unwrap();
    assert_eq!(c.world_size(), 2);
}

// --- exact renderings -------------------------------------------------------

#[test]
fn budget_over_cap_exact_line() {
    let t = with("\n[loss]\nbudget = 0.25\n");
    let e = err(&t);
    assert_eq!(
        e.to_string(),
        "/etc/dlcp/dlcp.toml:17:10: loss.budget: 0.25 exceeds the hard cap 0.10 (allowed: 0.0 ..= 0.10; \
         a budget is a fraction: write 0.01 or \"1%\" for 1%)"
    );
    assert_eq!(e.kind(), Some(ErrorKind::Value));
}

#[test]
fn unknown_field_exact_line() {
    let t = with("[network]\nmtuu = 9000\n");
    let e = err(&t);
    assert_eq!(
        e.to_string(),
        "/etc/dlcp/dlcp.toml:16:1: network.mtuu: unknown field (allowed: bind_address, mtu, chunk_bytes, heartbeat_interval_ms, peer_timeout_ms, flow_window_bytes, paths)"
    );
    assert_eq!(e.kind(), Some(ErrorKind::UnknownField));
}

#[test]
fn bad_enum_exact_line() {
    let t = with("[datapath]\nkind = \"dpkd\"\n");
    assert_eq!(
        err(&t).to_string(),
        "/etc/dlcp/dlcp.toml:16:8: datapath.kind: invalid value \"dpkd\" (allowed: auto, socket, dpdk)"
    );
}

// --- parse-level errors -----------------------------------------------------

#[test]
fn syntax_error_names_table_and_line() {
    let t = with("[pacing]\nrate_mbps = = 5\n");
    let e = check(&t, "pacing", "rate_mbps", "TOML syntax error");
    assert_eq!(e.kind(), Some(ErrorKind::Syntax));
    let t = "rank = = 1\n";
    let e = check(t, "(top level)", "rank", "syntax");
    assert_eq!(e.location().unwrap().column, 8);
}

#[test]
fn duplicate_key_is_a_syntax_error() {
    let t = with("[loss]\nbudget = 0.01\nbudget = 0.02\n");
    let e = err(&t);
    assert_eq!(e.kind(), Some(ErrorKind::Syntax));
    assert_eq!(e.field(), Some("loss"));
    assert_eq!(e.line(), Some(17));
}

#[test]
fn unknown_keys_everywhere() {
    check(&format!("bogus = 1\n{BASE}"), "bogus", "bogus", "unknown field (allowed: node, peers, network,");
    check(&with("[bogus]\nx = 1\n"), "bogus", "[bogus]", "unknown field");
    check(
        &BASE.replace("job_id = 42", "job_id = 42\njob_secrt = \"x\""),
        "node.job_secrt",
        "job_secrt",
        "allowed: rank, job_id, job_secret, job_secret_file, generation",
    );
    check(
        &BASE.replace("port = 7700\n\n", "port = 7700\nweight = 3\n\n"),
        "peers[0].weight",
        "weight",
        "allowed: rank, address, port",
    );
    check(
        &with("[datapath.dpdk]\nport = 1\n"),
        "datapath.dpdk.port",
        "port = 1",
        "allowed: eal_args, port_id",
    );
    check(&with("[datapath.socket]\ngro = true\n"), "datapath.socket.gro", "gro", "allowed: gso,");
    check(
        &with("[datapath]\ndpdk = { port_id = 1, foo = 2 }\n"),
        "datapath.dpdk.foo",
        "foo",
        "unknown field",
    );
    check(&with("[priority]\nweights = [1]\n"), "priority.weights", "weights", "allowed: scatter_band");
    check(
        &with("[loss]\nbudgett = 0.1\n"),
        "loss.budgett",
        "budgett",
        "allowed: budget, gather_budget, fill",
    );
    check(&with("[pacing]\nrate = 1\n"), "pacing.rate", "rate", "allowed: rate_mbps, burst_bytes, adapt");
    check(&with("[shm]\nsize = 1\n"), "shm.size", "size", "allowed: arena_bytes");
    check(
        &with("[control]\npath = \"/x\"\n"),
        "control.path",
        "path",
        "allowed: socket_path, socket_mode, socket_group, max_admin_connections",
    );
    check(&with("[metrics]\nport = 1\n"), "metrics.port", "port = 1", "allowed: enabled, address");
    check(&with("[log]\nlevl = \"info\"\n"), "log.levl", "levl", "allowed: level");
    // Keys after a [[peers]] header belong to that peer.
    check(&with("bogus = 1\n"), "peers[1].bogus", "bogus", "unknown field (allowed: rank, address, port)");
    // Dotted keys are no way around it.
    check(&format!("network.mtu = 1500\nnetwork.zz = 2\n{BASE}"), "network.zz", "zz", "unknown field");
}

#[test]
fn wrong_types() {
    let e = check(
        &with("[network]\nmtu = \"big\"\n"),
        "network.mtu",
        "big",
        "invalid type: string \"big\" (allowed: an integer 0 ..= 4294967295)",
    );
    assert_eq!(e.kind(), Some(ErrorKind::Type));
    // A string is a fraction or a percentage ("1%" is accepted: see `budgets_are_fractions_or_percent_strings`).
    check(
        &with("[loss]\nbudget = \"1 percent\"\n"),
        "loss.budget",
        "1 percent",
        "(allowed: a fraction such as 0.01, or a percentage such as \"1%\")",
    );
    check(
        &with("[loss]\nbudget = true\n"),
        "loss.budget",
        "budget",
        "(allowed: a fraction such as 0.01, or a percentage string such as \"1%\")",
    );
    check(&with("[loss]\nrescale = 1\n"), "loss.rescale", "rescale", "(allowed: true or false)");
    check(
        &with("[network]\nheartbeat_interval_ms = -5\n"),
        "network.heartbeat_interval_ms",
        "heartbeat",
        "invalid value -5",
    );
    check(
        &with("[priority]\ndscp = [0, 1, 2]\n"),
        "priority.dscp",
        "dscp",
        "invalid length 3 (allowed: an array of length 8)",
    );
    check(
        &with("[priority]\ndscp = [0, 1, 2, 3, 4, 5, 6, 300]\n"),
        "priority.dscp[7]",
        "dscp",
        "invalid value 300 (allowed: an integer 0 ..= 255)",
    );
    check(
        &BASE.replace("port = 7700\n\n", "port = 70000\n\n"),
        "peers[0].port",
        "70000",
        "(allowed: an integer 0 ..= 65535)",
    );
    check(&format!("network = 5\n{BASE}"), "network", "network", "(allowed: a table)");
    check(
        &with("[loss]\nfill = \"random\"\n"),
        "loss.fill",
        "random",
        "invalid value \"random\" (allowed: zero, local)",
    );
    check(
        &with("[log]\nlevel = \"verbose\"\n"),
        "log.level",
        "verbose",
        "(allowed: error, warn, info, debug, trace)",
    );
}

#[test]
fn missing_required() {
    let e = err("[[peers]]\nrank = 0\naddress = \"10.0.0.1\"\nport = 1\n");
    assert_eq!((e.field(), e.kind()), (Some("node"), Some(ErrorKind::MissingField)));
    let t = "[node]\nrank = 0\njob_id = 1\njob_secret = \"0123456789abcdef\"\n";
    let e = err(t);
    assert_eq!(e.field(), Some("peers"));
    check(&BASE.replace("job_id = 42\n", ""), "node.job_id", "[node]", "required field is missing");
    // The second [[peers]] lacks its rank: blamed on that table's header (line 11).
    let t = BASE.replace("rank = 1\naddress", "address");
    let e = err(&t);
    assert_eq!((e.field(), e.line()), (Some("peers[1].rank"), Some(11)), "{e}");
}

// --- [node] -----------------------------------------------------------------

#[test]
fn node_rules() {
    check(
        &BASE.replace("rank = 1\njob_id", "rank = 2\njob_id"),
        "node.rank",
        "rank = 2",
        "not among the 2 peers (allowed: 0 ..= 1)",
    );
    check(
        &BASE.replace("\"0123456789abcdef\"", "\"short\""),
        "node.job_secret",
        "short",
        "secret is 5 bytes (allowed: at least 16 bytes)",
    );
    let t = BASE.replace("job_id = 42\n", "job_id = 42\njob_secret_file = \"/nonexistent/dlcp-secret\"\n");
    check(&t, "node.job_secret_file", "job_secret_file", "conflicts with node.job_secret");
    let t =
        BASE.replace("job_secret = \"0123456789abcdef\"", "job_secret_file = \"/nonexistent/dlcp-secret\"");
    let e = check(&t, "node.job_secret_file", "job_secret_file", "cannot read /nonexistent/dlcp-secret: ");
    assert_eq!(e.location().unwrap().column, 19);
    let t = BASE.replace("job_secret = \"0123456789abcdef\"\n", "");
    check(&t, "node.job_secret", "[node]", "no job secret given (allowed: exactly one of");
    check(
        &BASE.replace("job_id = 42", "job_id = 42\ngeneration = 0"),
        "node.generation",
        "generation",
        "allowed: \"auto\" or an integer 1 ..= 4294967295",
    );
    check(
        &BASE.replace("job_id = 42", "job_id = 42\ngeneration = \"new\""),
        "node.generation",
        "generation",
        "invalid value \"new\"",
    );
}

/// Write `bytes` to `path` with permission bits `mode` (whatever the umask).
fn write_mode(path: &std::path::Path, bytes: &[u8], mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A fresh directory for one test (tests run as threads of one process).
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("dlcp-config-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn secret_file_rules() {
    let dir = scratch("secret-file");
    write_mode(&dir.join("short"), b"tiny\n", 0o600);
    write_mode(&dir.join("good"), &[7u8; 32], 0o600);
    let text = BASE.replace("job_secret = \"0123456789abcdef\"", "job_secret_file = \"short\"");
    let name = dir.join("dlcp.toml");
    std::fs::write(&name, &text).unwrap();
    let e = Config::load(&name).unwrap_err();
    assert_eq!((e.field(), e.line()), (Some("node.job_secret_file"), Some(4)), "{e}");
    assert!(e.to_string().contains("short holds 5 bytes (allowed: at least 16 bytes)"), "{e}");
    assert!(e.to_string().starts_with(&format!("{}:4:19: ", name.display())), "{e}");
    // Relative to the config file's directory, byte for byte.
    std::fs::write(&name, text.replace("\"short\"", "\"good\"")).unwrap();
    let c = Config::load(&name).unwrap();
    assert_eq!(c.job_secret(), &[7u8; 32]);
    let shown = c.to_toml_string();
    assert!(shown.contains("job_secret_file = \"good\""), "{shown}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_secret_file_others_may_read_is_refused_naming_the_file_and_the_fix() {
    let dir = scratch("secret-mode");
    let secret = dir.join("job.secret");
    let text = BASE.replace("job_secret = \"0123456789abcdef\"", "job_secret_file = \"job.secret\"");
    let name = dir.join("dlcp.toml");
    write_mode(&name, text.as_bytes(), 0o644);
    for mode in [0o640, 0o604, 0o644, 0o660, 0o610] {
        write_mode(&secret, &[7u8; 32], mode);
        let e = Config::load(&name).unwrap_err();
        assert_eq!((e.field(), e.line()), (Some("node.job_secret_file"), Some(4)), "{e}");
        let shown = e.to_string();
        assert!(shown.starts_with(&format!("{}:4:19: node.job_secret_file: ", name.display())), "{e}");
        assert!(
            shown.contains(&format!(
                "{} is accessible by group or others (mode {mode:04o})",
                secret.display()
            )),
            "{e}"
        );
        assert!(shown.contains(&format!("run `chmod 600 {}`", secret.display())), "{e}");
        // from_str_named reads the same secret file: the rule holds there too.
        let e = Config::from_str_named(&text, &name.display().to_string()).unwrap_err();
        assert_eq!(e.field(), Some("node.job_secret_file"), "{e}");
    }
    for mode in [0o600, 0o400] {
        write_mode(&secret, &[7u8; 32], mode);
        let c = Config::load(&name).unwrap_or_else(|e| panic!("mode {mode:o}: {e}"));
        assert_eq!(c.job_secret(), &[7u8; 32]);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_inline_secret_only_in_a_config_file_its_owner_alone_can_read() {
    let dir = scratch("inline-mode");
    let name = dir.join("dlcp.toml");
    for mode in [0o644, 0o640, 0o604, 0o660] {
        write_mode(&name, BASE.as_bytes(), mode);
        let e = Config::load(&name).unwrap_err();
        assert_eq!((e.field(), e.line()), (Some("node.job_secret"), Some(4)), "{e}");
        let shown = e.to_string();
        assert!(shown.starts_with(&format!("{}:4:14: node.job_secret: ", name.display())), "{e}");
        assert!(
            shown.contains(&format!(
                "an inline secret in {}, which group or others may access (mode {mode:04o})",
                name.display()
            )),
            "{e}"
        );
        assert!(shown.contains(&format!("run `chmod 600 {}`", name.display())), "{e}");
        assert!(shown.contains("or the secret in node.job_secret_file"), "{e}");
    }
    for mode in [0o600, 0o400] {
        write_mode(&name, BASE.as_bytes(), mode);
        let c = Config::load(&name).unwrap_or_else(|e| panic!("mode {mode:o}: {e}"));
        assert_eq!(c.job_secret(), b"0123456789abcdef");
    }
    // Text that is no file has no permissions to check.
    assert!(Config::from_str_named(BASE, "/etc/dlcp/dlcp.toml").is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_config_file_names_path() {
    let e = Config::load("/nonexistent/dir/dlcp.toml").unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    let s = e.to_string();
    assert!(s.starts_with("/nonexistent/dir/dlcp.toml: cannot read configuration file: "), "{s}");
    assert!(!s.contains('\n'));
}

// --- [[peers]] --------------------------------------------------------------

#[test]
fn peer_rules() {
    check(
        &BASE.replace("rank = 1\naddress", "rank = 2\naddress"),
        "peers[1].rank",
        "rank = 2",
        "rank 2 out of range for 2 peers (allowed: 0 ..= 1, each exactly once)",
    );
    let t = BASE
        .replace("rank = 1\naddress", "rank = 0\naddress")
        .replace("rank = 1\njob_id", "rank = 0\njob_id");
    let e = err(&t);
    assert_eq!((e.field(), e.line()), (Some("peers[1].rank"), Some(12)), "{e}");
    assert!(e.message().contains("duplicate rank 0 (also peers[0])"), "{e}");
    check(
        &BASE.replace("\"10.77.0.2\"", "\"10.77.0.x\""),
        "peers[1].address",
        "10.77.0.x",
        "(allowed: an IPv4 or IPv6 address literal",
    );
    check(
        &BASE.replace("\"10.77.0.2\"", "\"fd00::2\""),
        "peers[1].address",
        "fd00::2",
        "IPv6 but peers[0] is IPv4 (allowed: all peers in one address family)",
    );
    check(
        &BASE.replace("\"10.77.0.2\"", "\"0.0.0.0\""),
        "peers[1].address",
        "0.0.0.0",
        "not a unicast address",
    );
    check(
        &BASE.replace("\"10.77.0.2\"", "\"224.0.0.1\""),
        "peers[1].address",
        "224.0.0.1",
        "not a unicast address",
    );
    let t = BASE.replace("address = \"10.77.0.2\"\nport = 7700", "address = \"10.77.0.1\"\nport =  7700");
    check(
        &t,
        "peers[1].port",
        "port =  7700",
        "10.77.0.1:7700 is also peers[0] (allowed: a distinct address:port per peer)",
    );
    check(
        &BASE.replace("port = 7700\n\n", "port = 0\n\n"),
        "peers[0].port",
        "port = 0",
        "0 is out of range (allowed: 1 ..= 65535)",
    );
    let t = "peers = []\n[node]\nrank = 0\njob_id = 1\njob_secret = \"0123456789abcdef\"\n";
    check(t, "peers", "peers", "no peers (allowed: one [[peers]] table per rank 0 .. N-1)");
}

// --- [network] ----------------------------------------------------------------

#[test]
fn network_rules() {
    check(
        &with("[network]\nbind_address = \"::\"\n"),
        "network.bind_address",
        "bind_address",
        "is IPv6 but the peers are IPv4",
    );
    check(
        &with("[network]\nbind_address = \"10.0.0.256\"\n"),
        "network.bind_address",
        "bind_address",
        "invalid value \"10.0.0.256\"",
    );
    check(
        &with("[network]\nmtu = 500\n"),
        "network.mtu",
        "mtu",
        "500 is out of range (allowed: 576 ..= 65535)",
    );
    check(&with("[network]\nmtu = 70000\n"), "network.mtu", "mtu", "(allowed: 576 ..= 65535)");
    check(
        &with("[network]\nchunk_bytes = 1400\n"),
        "network.chunk_bytes",
        "chunk_bytes",
        "1400 does not fit MTU 1500 − 28 (IP/UDP) − 100 (dlcp header and tag) (allowed: a multiple of 4 in 64 ..= 1372)",
    );
    check(&with("[network]\nchunk_bytes = 1001\n"), "network.chunk_bytes", "chunk_bytes", "a multiple of 4");
    check(&with("[network]\nchunk_bytes = 32\n"), "network.chunk_bytes", "chunk_bytes", "64 ..= 1372");
    // chunk_bytes is checked against the MTU given in the file.
    check(
        &with("[network]\nmtu = 1000\nchunk_bytes = 1000\n"),
        "network.chunk_bytes",
        "chunk_bytes",
        "64 ..= 872",
    );
    check(
        &with("[network]\nheartbeat_interval_ms = 0\n"),
        "network.heartbeat_interval_ms",
        "heartbeat",
        "(allowed: 1 ..= 60000)",
    );
    let e = check(
        &with("[network]\npeer_timeout_ms = 150\n"),
        "network.peer_timeout_ms",
        "peer_timeout",
        "(allowed: 200 ..= 3600000)",
    );
    assert!(e.message().contains("2 × heartbeat_interval_ms"));
    // Blame lands on a defaulted key: its table's header, and the message says so.
    let t = with("[network]\nheartbeat_interval_ms = 2000\n");
    let e =
        check(&t, "network.peer_timeout_ms", "[network]", "3000 is out of range (allowed: 4000 ..= 3600000)");
    assert!(e.message().contains("this is the default"), "{e}");
}

#[test]
fn path_rules() {
    check(
        &with("[network]\npaths = 0\n"),
        "network.paths",
        "paths",
        "0 is out of range (allowed: 1 ..= 256)",
    );
    check(&with("[network]\npaths = 257\n"), "network.paths", "paths", "(allowed: 1 ..= 256)");
    // Two daemons on one host: their source port ranges must not overlap.
    let t = BASE.replace("10.77.0.2", "10.77.0.1").replacen("port = 7700\n\n", "port = 7710\n\n", 1);
    check(
        &format!("{t}[network]\npaths = 16\n"),
        "peers[0].port",
        "port = 7710",
        "7710 is in the source ports 7700 ..= 7715 of peers[1] on 10.77.0.1 (network.paths = 16;",
    );
    assert!(load(&format!("{t}[network]\npaths = 10\n")).is_ok(), "ten paths fit between 7700 and 7710");
    // The default is 16 paths.
    let e = check(&t, "peers[0].port", "port = 7710", "(network.paths = 16;");
    assert!(e.message().contains("allowed: ports of peers on one address at least `paths` apart"), "{e}");
    check(
        &BASE.replacen("port = 7700\n\n", "port = 65530\n\n", 1),
        "peers[0].port",
        "port = 65530",
        "65530 + network.paths 16 runs past port 65535 (allowed: 1 ..= 65520)",
    );
    assert_eq!(load(BASE).unwrap().network.paths, 16);
}

#[test]
fn ipv6_mtu_and_chunk() {
    let t = BASE.replace("10.77.0.1", "fd00::1").replace("10.77.0.2", "fd00::2");
    let c = load(&t).unwrap();
    assert_eq!(c.chunk_bytes(), 1500 - 48 - 100);
    check(&format!("{t}[network]\nmtu = 1000\n"), "network.mtu", "mtu", "(allowed: 1280 ..= 65535)");
}

// --- [datapath] ---------------------------------------------------------------

#[test]
fn datapath_rules() {
    let d = |s: &str| with(&format!("[datapath.dpdk]\n{s}\n"));
    check(&d("rx_queues = 0"), "datapath.dpdk.rx_queues", "rx_queues", "(allowed: 1 ..= 64)");
    check(&d("tx_queues = 65"), "datapath.dpdk.tx_queues", "tx_queues", "(allowed: 1 ..= 64)");
    check(
        &d("rx_ring_size = 1000"),
        "datapath.dpdk.rx_ring_size",
        "rx_ring_size",
        "not a power of two in range (allowed: 64, 128 ..= 32768)",
    );
    check(&d("tx_ring_size = 32"), "datapath.dpdk.tx_ring_size", "tx_ring_size", "not a power of two");
    check(&d("rx_burst = 0"), "datapath.dpdk.rx_burst", "rx_burst", "(allowed: 1 ..= 512)");
    check(
        &d("rx_ring_size = 64\nrx_burst = 128\nmbuf_pool_size = 100000"),
        "datapath.dpdk.rx_burst",
        "rx_burst",
        "(allowed: 1 ..= 64)",
    );
    check(&d("tx_burst = 513"), "datapath.dpdk.tx_burst", "tx_burst", "(allowed: 1 ..= 512)");
    check(&d("mbuf_pool_size = 1000"), "datapath.dpdk.mbuf_pool_size", "mbuf_pool_size", "= 2112)");
    check(
        &d("class_tx_queue = [0, 0, 0, 0, 0, 0, 0, 1]"),
        "datapath.dpdk.class_tx_queue[7]",
        "class_tx_queue",
        "queue 1 does not exist (allowed: 0 ..= 0, below tx_queues)",
    );
    check(
        &d("eal_args = [\"-l\", \"\"]"),
        "datapath.dpdk.eal_args[1]",
        "eal_args",
        "allowed: non-empty strings",
    );
    check(
        &d("neighbours = [\"10.0.0.2 02:00:00:00:00:02\", \"10.0.0.3 02:00:00:00:03\"]"),
        "datapath.dpdk.neighbours[1]",
        "neighbours",
        "is not \"IPv4 MAC\"",
    );
    for bad in ["10.0.0.2", "fd00::1 02:00:00:00:00:02", "10.0.0.2 02:00:00:00:00:2g", "10.0.0.2 a b"] {
        assert!(dlcp_config::DpdkDatapath::parse_neighbour(bad).is_none(), "{bad}");
    }
    assert_eq!(
        dlcp_config::DpdkDatapath::parse_neighbour(" 10.0.0.2   0A:0b:0c:0d:0e:0f "),
        Some(("10.0.0.2".parse().unwrap(), [10, 11, 12, 13, 14, 15]))
    );
    let s = |v: &str| with(&format!("[datapath.socket]\n{v}\n"));
    check(&s("batch = 0"), "datapath.socket.batch", "batch", "(allowed: 1 ..= 1024)");
    check(&s("batch = 2000"), "datapath.socket.batch", "batch", "(allowed: 1 ..= 1024)");
    check(
        &s("gso_max_segments = 65"),
        "datapath.socket.gso_max_segments",
        "gso_max_segments",
        "(allowed: 1 ..= 64)",
    );
    let c =
        load(&d("tx_queues = 2\nclass_tx_queue = [0, 0, 0, 0, 1, 1, 1, 1]\nmbuf_pool_size = 16383")).unwrap();
    assert_eq!(c.datapath.dpdk.class_tx_queue[7], 1);
}

// --- [priority] ---------------------------------------------------------------

#[test]
fn priority_rules() {
    let p = |s: &str| with(&format!("[priority]\n{s}\n"));
    check(
        &p("gather_band = [4, 7]"),
        "priority.gather_band[1]",
        "gather_band",
        "class 7 is out of range (allowed: 0 ..= 6; class 7 is reserved for control)",
    );
    check(
        &p("scatter_band = [3, 1]"),
        "priority.scatter_band",
        "scatter_band",
        "[3, 1] is empty (allowed: [lo, hi] with lo <= hi)",
    );
    check(
        &p("gather_band = [3, 6]"),
        "priority.gather_band",
        "gather_band",
        "[3, 6] does not lie above scatter_band [0, 3] (allowed: gather_band lo > 3)",
    );
    check(&p("layer_levels = 0"), "priority.layer_levels", "layer_levels", "(allowed: 1 ..= 64)");
    check(
        &p("magnitude_levels = 65"),
        "priority.magnitude_levels",
        "magnitude_levels",
        "(allowed: 1 ..= 64)",
    );
    check(
        &p("droppable = [0, 7]"),
        "priority.droppable[1]",
        "droppable",
        "the control class cannot be droppable",
    );
    check(&p("droppable = [0, 1, 1]"), "priority.droppable[2]", "droppable", "class 1 is listed twice");
    check(
        &p("droppable = [9]"),
        "priority.droppable[0]",
        "droppable",
        "class 9 is out of range (allowed: 0 ..= 6)",
    );
    check(
        &p("dscp = [0, 8, 16, 24, 32, 40, 64, 48]"),
        "priority.dscp[6]",
        "dscp",
        "64 is out of range (allowed: 0 ..= 63)",
    );
    check(
        &p("so_priority = [0, 1, 2, 3, 4, 5, 6, 16]"),
        "priority.so_priority[7]",
        "so_priority",
        "(allowed: 0 ..= 15) (above 6 needs CAP_NET_ADMIN)",
    );
    // A multi-line array: the element's own line.
    let t = p("dscp = [\n  0, 8, 16, 24,\n  32, 40, 46, 99,\n]");
    let e = check(&t, "priority.dscp[7]", "99", "99 is out of range");
    assert_eq!(e.location().unwrap().column, 15);
}

// --- [loss] -------------------------------------------------------------------

#[test]
fn loss_rules() {
    let l = |s: &str| with(&format!("[loss]\n{s}\n"));
    check(&l("budget = -0.01"), "loss.budget", "budget", "-0.01 is negative (allowed: 0.0 ..= 0.10)");
    check(&l("budget = nan"), "loss.budget", "budget", "not a finite number");
    check(
        &l("budget = 0.05\ngather_budget = 0.06"),
        "loss.gather_budget",
        "gather_budget",
        "0.06 exceeds loss.budget 0.05 (allowed: 0.0 ..= loss.budget)",
    );
    check(&l("gather_budget = 0.02"), "loss.gather_budget", "gather_budget", "exceeds loss.budget 0.01");
    check(
        &l("budget = 0.1\ngather_budget = 0.2"),
        "loss.gather_budget",
        "gather_budget",
        "exceeds the hard cap",
    );
    check(&l("deadline_min_ms = 0"), "loss.deadline_min_ms", "deadline_min_ms", "(allowed: 1 ..= 3600000)");
    check(
        &l("deadline_min_ms = 50\ndeadline_max_ms = 20"),
        "loss.deadline_max_ms",
        "deadline_max_ms",
        "20 is out of range (allowed: 50 ..= 3600000) (at least deadline_min_ms)",
    );
    check(
        &l("probe_timeout_min_ms = 0"),
        "loss.probe_timeout_min_ms",
        "probe_timeout_min_ms",
        "(allowed: 1 ..= 3600000)",
    );
    check(
        &l("probe_timeout_min_ms = 30\nprobe_timeout_max_ms = 10"),
        "loss.probe_timeout_max_ms",
        "probe_timeout_max_ms",
        "(allowed: 30 ..= 3600000)",
    );
    check(
        &l("hard_timeout_ms = 100"),
        "loss.hard_timeout_ms",
        "hard_timeout_ms",
        "100 is out of range (allowed: 250 ..= 3600000)",
    );
    check(
        &l("initial_per_chunk_us = 0"),
        "loss.initial_per_chunk_us",
        "initial_per_chunk_us",
        "(allowed: 1 ..= 1000000)",
    );
    let c = load(&l("budget = 0\nfill = \"local\"\nrescale = true")).unwrap();
    assert_eq!((c.loss.budget_ppm(), c.loss.gather_budget_ppm()), (0, 0));
    let c = load(&l("budget = 0.1\ngather_budget = 0.000125")).unwrap();
    assert_eq!((c.loss.budget_ppm(), c.loss.gather_budget_ppm()), (100_000, 125));
}

/// Budgets are fractions; a string like "1%" means the same as 0.01, and a bare
/// number written as a percentage (`budget = 1`) is refused saying budgets are
/// fractions, with both ways to write 1%.
#[test]
fn budgets_are_fractions_or_percent_strings() {
    let l = |s: &str| with(&format!("[loss]\n{s}\n"));
    let c = load(&l("budget = \"1%\"\ngather_budget = \"0.5 %\"")).unwrap();
    assert_eq!((c.loss.budget, c.loss.budget_ppm(), c.loss.gather_budget_ppm()), (0.01, 10_000, 5_000));
    let c = load(&l("budget = \"0.02\"")).unwrap();
    assert_eq!(c.loss.budget_ppm(), 20_000);
    // The effective configuration (`dlcpd check-config`) shows the fraction.
    assert!(c.to_toml_string().contains("\nbudget = 0.02\n"), "{}", c.to_toml_string());
    let e = check(
        &l("budget = 1"),
        "loss.budget",
        "budget",
        "1 exceeds the hard cap 0.10 (allowed: 0.0 ..= 0.10; a budget is a fraction: write 0.01 or \"1%\" for 1%)",
    );
    assert_eq!(e.kind(), Some(ErrorKind::Value));
    check(&l("budget = \"20%\""), "loss.budget", "budget", "0.2 exceeds the hard cap 0.10");
    check(&l("gather_budget = \"-1%\""), "loss.gather_budget", "gather_budget", "is not a number >= 0");
}

// --- [pacing], [shm], [control], [metrics] ------------------------------------

#[test]
fn pacing_rules() {
    let p = |s: &str| with(&format!("[pacing]\n{s}\n"));
    check(&p("rate_mbps = 2000000"), "pacing.rate_mbps", "rate_mbps", "(allowed: 0 ..= 1000000)");
    check(
        &p("rate_mbps = 1000\nburst_bytes = 1000"),
        "pacing.burst_bytes",
        "burst_bytes",
        "1000 is below one packet (allowed: at least network.mtu = 1500 when paced)",
    );
    check(
        &p("adapt = true"),
        "pacing.adapt",
        "adapt",
        "allowed: adapt = true only with pacing.rate_mbps > 0",
    );
    let c = load(&p("rate_mbps = 800\nadapt = true")).unwrap();
    assert_eq!(c.pacing.rate_bytes_per_sec(), Some(100_000_000));
}

#[test]
fn shm_rules() {
    let s = |v: &str| with(&format!("[shm]\n{v}\n"));
    check(&s("arena_bytes = 1000"), "shm.arena_bytes", "arena_bytes", "(allowed: 1048576 ..= 17179869184)");
    // Above the shared-memory layout's limit: refused when the file is read, not at start-up.
    check(
        &s("arena_bytes = 1099511627776"),
        "shm.arena_bytes",
        "arena_bytes",
        "(allowed: 1048576 ..= 17179869184)",
    );
    check(
        &s("max_ops_in_flight = 0"),
        "shm.max_ops_in_flight",
        "max_ops_in_flight",
        "(allowed: 1 ..= 65536)",
    );
    check(
        &s("arena_bytes = 1048577"),
        "shm.arena_bytes",
        "arena_bytes",
        "not page aligned (allowed: a multiple of 4096)",
    );
    check(
        &s("ring_entries = 100"),
        "shm.ring_entries",
        "ring_entries",
        "not a power of two in range (allowed: 2, 4 ..= 65536)",
    );
    check(&s("ring_entries = 1"), "shm.ring_entries", "ring_entries", "not a power of two");
    check(
        &s("max_tensor_bytes = 0"),
        "shm.max_tensor_bytes",
        "max_tensor_bytes",
        "(allowed: 1 ..= 268435456)",
    );
    check(
        &s("arena_bytes = 16777216"),
        "shm.max_tensor_bytes",
        "[shm]",
        "67108864 is out of range (allowed: 1 ..= 16777216) (at most shm.arena_bytes)",
    );
    check(
        &s("early_buffer_bytes = 300000000"),
        "shm.early_buffer_bytes",
        "early_buffer_bytes",
        "(allowed: 0 ..= 268435456)",
    );
    check(&s("max_attachments = 0"), "shm.max_attachments", "max_attachments", "(allowed: 1 ..= 4096)");
    check(
        &s("max_attachments = 8\nmax_attachments_per_user = 9"),
        "shm.max_attachments_per_user",
        "max_attachments_per_user",
        "9 is out of range (allowed: 0 ..= 8) (0 = no per-user cap; at most shm.max_attachments)",
    );
    let cfg = load(&s("max_attachments = 8\nmax_attachments_per_user = 2")).unwrap();
    assert_eq!((cfg.shm.max_attachments, cfg.shm.max_attachments_per_user), (8, 2));
}

#[test]
fn control_and_metrics_rules() {
    let c = |v: &str| with(&format!("[control]\n{v}\n"));
    check(
        &c("socket_path = \"dlcpd.sock\""),
        "control.socket_path",
        "socket_path",
        "(allowed: an absolute path of at most 107 bytes)",
    );
    let long = format!("/{}", "x".repeat(107));
    check(
        &c(&format!("socket_path = \"{long}\"")),
        "control.socket_path",
        "socket_path",
        "at most 107 bytes",
    );
    check(
        &c("socket_mode = \"0668\""),
        "control.socket_mode",
        "socket_mode",
        "invalid value \"0668\" (allowed: an octal mode string such as \"0660\"",
    );
    check(&c("socket_mode = \"0666\""), "control.socket_mode", "socket_mode", "is world-writable");
    check(&c("socket_mode = 660"), "control.socket_mode", "socket_mode", "(allowed: a string)");
    check(
        &c("socket_group = \"\""),
        "control.socket_group",
        "socket_group",
        "(allowed: a group name or numeric gid)",
    );
    let cfg = load(&c("socket_mode = \"640\"\nsocket_group = \"dlcp\"")).unwrap();
    assert_eq!(cfg.control.mode(), 0o640);
    check(
        &c("max_admin_connections = 0"),
        "control.max_admin_connections",
        "max_admin_connections",
        "0 is out of range (allowed: 1 ..= 1024)",
    );
    check(
        &c("max_pending_attaches = 1025"),
        "control.max_pending_attaches",
        "max_pending_attaches",
        "1025 is out of range (allowed: 1 ..= 1024)",
    );
    check(
        &c("request_timeout_ms = 50"),
        "control.request_timeout_ms",
        "request_timeout_ms",
        "50 is out of range (allowed: 100 ..= 60000)",
    );
    let cfg =
        load(&c("max_admin_connections = 3\nmax_pending_attaches = 4\nrequest_timeout_ms = 500")).unwrap();
    let ctl = &cfg.control;
    assert_eq!((ctl.max_admin_connections, ctl.max_pending_attaches, ctl.request_timeout_ms), (3, 4, 500));
    let m = |v: &str| with(&format!("[metrics]\n{v}\n"));
    check(&m("address = \"127.0.0.1\""), "metrics.address", "address = \"127", "(allowed: \"ip:port\"");
    check(&m("enabled = \"yes\""), "metrics.enabled", "enabled", "(allowed: true or false)");
}

#[test]
fn security_rules() {
    // The default authenticates; "none" only when written in the file.
    assert_eq!(load(BASE).unwrap().security.packet_auth, PacketAuthMode::AesGmac);
    assert_eq!(load(BASE).unwrap().job_key().auth(), PacketAuth::AesGmac);
    let s = |v: &str| with(&format!("[security]\n{v}\n"));
    let c = load(&s("packet_auth = \"none\"")).unwrap();
    assert_eq!(c.security.packet_auth, PacketAuthMode::None);
    assert_eq!(c.job_key().auth(), PacketAuth::None);
    assert_eq!(
        load(&s("packet_auth = \"aes-128-gmac\"")).unwrap().security.packet_auth,
        PacketAuthMode::AesGmac
    );
    let t = s("packet_auth = \"hmac\"");
    assert_eq!(
        err(&t).to_string(),
        "/etc/dlcp/dlcp.toml:16:15: security.packet_auth: invalid value \"hmac\" (allowed: aes-128-gmac, none)"
    );
    for bad in ["\"None\"", "\"\"", "\"gmac\""] {
        check(&s(&format!("packet_auth = {bad}")), "security.packet_auth", "packet_auth", "aes-128-gmac");
    }
    for bad in ["false", "0"] {
        check(&s(&format!("packet_auth = {bad}")), "security.packet_auth", "packet_auth", "string");
    }
    check(&s("auth = \"none\""), "security.auth", "auth", "allowed: packet_auth");
}

#[test]
fn op_deadline_rules() {
    let s = |v: &str| with(&format!("[loss]\n{v}\n"));
    check(
        &s("op_deadline_ms = 5000"),
        "loss.op_deadline_ms",
        "op_deadline_ms",
        "(0 = none; else at least hard_timeout_ms)",
    );
    assert_eq!(load(&s("op_deadline_ms = 0")).unwrap().loss.op_deadline_ms, 0);
    assert_eq!(
        load(&s("op_deadline_ms = 10000")).unwrap().loss.op_deadline(),
        std::time::Duration::from_secs(10)
    );
}
