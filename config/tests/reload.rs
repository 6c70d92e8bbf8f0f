//! Reload classes and `Config::diff`.

use dlcp_config::{Config, Reload, SETTINGS, needs_restart, reload_class};

const BASE: &str = r#"
[node]
rank = 0
job_id = 1
job_secret = "0123456789abcdef0123"

[[peers]]
rank = 0
address = "10.77.0.1"
port = 7700
[[peers]]
rank = 1
address = "10.77.0.2"
port = 7700
"#;

fn cfg(extra: &str) -> Config {
    Config::from_str_named(&format!("{BASE}{extra}"), "dlcp.toml").unwrap()
}

#[test]
fn classes_of_paths() {
    use Reload::*;
    for (path, want) in [
        ("loss.budget", Runtime),
        ("loss.gather_budget", Runtime),
        ("loss.fill", Runtime),
        ("loss.rescale", Runtime),
        ("loss.hard_timeout_ms", Runtime),
        ("priority.dscp", Runtime),
        ("priority.dscp[3]", Runtime),
        ("priority.so_priority", Runtime),
        ("priority.droppable", Runtime),
        ("priority.layer_levels", Runtime),
        ("pacing.rate_mbps", Runtime),
        ("log.level", Runtime),
        ("network.peer_timeout_ms", Runtime),
        ("node.rank", Restart),
        ("node.job_secret", Restart),
        ("peers[3].address", Restart),
        ("peers", Restart),
        ("network.mtu", Restart),
        ("network.chunk_bytes", Restart),
        ("network.bind_address", Restart),
        ("datapath.kind", Restart),
        ("datapath.dpdk.eal_args", Restart),
        ("shm.arena_bytes", Restart),
        ("control.socket_path", Restart),
        ("metrics.address", Restart),
        // Whole tables: runtime only if all of their settings are.
        ("loss", Runtime),
        ("pacing", Runtime),
        ("priority", Runtime),
        ("network", Restart),
        ("datapath", Restart),
        ("", Restart),
        // Unknown: the safe answer.
        ("no.such.setting", Restart),
    ] {
        assert_eq!(reload_class(path), want, "{path}");
    }
}

#[test]
fn every_setting_has_a_class_and_every_class_a_setting() {
    let full = cfg("[control]\nsocket_group = \"dlcp\"\n");
    let mut paths: Vec<String> = full
        .settings()
        .into_iter()
        .map(|(p, _)| {
            // peers[0].rank -> peers.rank
            let mut s = String::new();
            let mut skip = false;
            for ch in p.chars() {
                match ch {
                    '[' => skip = true,
                    ']' => skip = false,
                    c if !skip => s.push(c),
                    _ => {}
                }
            }
            s
        })
        .collect();
    paths.push("node.job_secret_file".into()); // the alternative to node.job_secret
    paths.sort();
    paths.dedup();
    let mut table: Vec<String> = SETTINGS.iter().map(|(p, _)| p.to_string()).collect();
    table.sort();
    assert_eq!(paths, table);
}

#[test]
fn diff_of_equal_configs_is_empty() {
    assert!(cfg("").diff(&cfg("")).is_empty());
    // Spelling a default out changes nothing.
    assert!(cfg("").diff(&cfg("[loss]\nbudget = 0.01\n[network]\nmtu = 1500\n")).is_empty());
}

#[test]
fn runtime_changes() {
    let old = cfg("");
    let new = cfg(
        "[loss]\nbudget = 0.05\nfill = \"local\"\n[priority]\ndscp = [0, 8, 16, 24, 32, 40, 46, 48]\n[log]\nlevel = \"debug\"\n",
    );
    let ch = old.diff(&new);
    let paths: Vec<&str> = ch.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["priority.dscp", "loss.budget", "loss.fill", "log.level"], "schema order");
    assert!(ch.iter().all(|c| c.reload == Reload::Runtime));
    assert!(!needs_restart(&ch));
    let b = &ch[1];
    assert_eq!((b.old.as_deref(), b.new.as_deref()), (Some("0.01"), Some("0.05")));
    assert_eq!(b.to_string(), "loss.budget: 0.01 -> 0.05 (runtime)");
}

#[test]
fn restart_changes() {
    let old = cfg("");
    let new = cfg("[network]\nmtu = 9000\n[datapath]\nkind = \"socket\"\n");
    let ch = old.diff(&new);
    let paths: Vec<(&str, Reload)> = ch.iter().map(|c| (c.path.as_str(), c.reload)).collect();
    assert_eq!(
        paths,
        [
            ("network.mtu", Reload::Restart),
            ("network.chunk_bytes", Reload::Restart), // derived from the MTU
            ("datapath.kind", Reload::Restart),
        ]
    );
    assert!(needs_restart(&ch));
}

#[test]
fn peer_changes_are_per_element() {
    let old = cfg("");
    let text = format!("{BASE}[[peers]]\nrank = 2\naddress = \"10.77.0.3\"\nport = 7700\n")
        .replace("address = \"10.77.0.2\"", "address = \"10.77.0.9\"");
    let new = Config::from_str_named(&text, "x").unwrap();
    let ch = old.diff(&new);
    let paths: Vec<&str> = ch.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["peers[1].address", "peers[2].rank", "peers[2].address", "peers[2].port"]);
    assert!(ch.iter().all(|c| c.reload == Reload::Restart));
    assert_eq!(ch[1].old, None);
}

#[test]
fn secret_change_is_reported_without_the_secret() {
    let old = cfg("");
    let new =
        Config::from_str_named(&BASE.replace("0123456789abcdef0123", "fedcba9876543210fedc"), "x").unwrap();
    let ch = old.diff(&new);
    assert_eq!(ch.len(), 1);
    assert_eq!((ch[0].path.as_str(), ch[0].reload), ("node.job_secret", Reload::Restart));
    let shown = ch[0].to_string();
    assert!(!shown.contains("0123") && !shown.contains("fedc"), "{shown}");
}
