//! Defaults, derived values, accessors and the effective-config dump.

use std::net::{IpAddr, SocketAddr};

use dlcp_config::schema::{DEFAULT_DSCP, DEFAULT_SO_PRIORITY, REDACTED};
use dlcp_config::{Config, DatapathKind, Fill, Generation, LogLevel};
use dlcp_proto::class::Class;
use dlcp_proto::priority::ClassifierConfig;

const MINIMAL: &str = r#"
[node]
rank = 2
job_id = 9
job_secret = "a very secret job key"

[[peers]]
rank = 1
address = "10.77.0.2"
port = 7700
[[peers]]
rank = 0
address = "10.77.0.1"
port = 7700
[[peers]]
rank = 2
address = "10.77.0.3"
port = 7701
"#;

#[test]
fn minimal_config_gets_every_default() {
    let c = Config::from_str_named(MINIMAL, "dlcp.toml").unwrap();
    assert_eq!(c.source(), "dlcp.toml");
    assert_eq!((c.rank(), c.world_size(), c.node.job_id), (2, 3, 9));
    assert_eq!(c.node.generation, Generation::Auto);
    assert_eq!(c.job_secret(), b"a very secret job key");
    // Peers sorted by rank; own entry and bind address resolved.
    assert_eq!(c.peers.iter().map(|p| p.rank).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(c.own_peer().port, 7701);
    assert_eq!(c.bind_addr(), "10.77.0.3:7701".parse::<SocketAddr>().unwrap());
    assert_eq!(c.network.bind_address, Some("10.77.0.3".parse::<IpAddr>().unwrap()));
    // network
    assert_eq!(c.network.mtu, 1500);
    assert_eq!(c.chunk_bytes(), 1372); // 1500 - 28 - 100
    assert_eq!(c.network.chunk_bytes, Some(1372));
    assert_eq!((c.network.heartbeat_interval_ms, c.network.peer_timeout_ms), (100, 3000));
    // datapath
    assert_eq!(c.datapath.kind, DatapathKind::Auto);
    assert!(c.datapath.dpdk.eal_args.is_empty());
    assert_eq!((c.datapath.dpdk.rx_queues, c.datapath.dpdk.tx_queues), (1, 1));
    assert_eq!((c.datapath.dpdk.rx_ring_size, c.datapath.dpdk.mbuf_pool_size), (1024, 8191));
    assert!(c.datapath.socket.gso);
    assert_eq!(c.datapath.socket.batch, 32);
    // priority: the protocol core's defaults, plus the marking tables.
    assert_eq!(c.classifier(), ClassifierConfig::default());
    assert_eq!((c.priority.layer_levels, c.priority.magnitude_levels), (2, 2));
    assert_eq!(c.priority.dscp, DEFAULT_DSCP);
    assert_eq!(c.priority.dscp_of(Class::CONTROL), 48);
    assert_eq!(c.priority.so_priority, DEFAULT_SO_PRIORITY);
    assert!(c.priority.so_priority.iter().all(|&p| p <= 6), "defaults must not need CAP_NET_ADMIN");
    // loss
    assert_eq!((c.loss.budget, c.loss.gather_budget), (0.01, 0.0));
    assert_eq!((c.loss.budget_ppm(), c.loss.gather_budget_ppm()), (10_000, 0));
    assert_eq!((c.loss.fill, c.loss.rescale), (Fill::Zero, false));
    assert_eq!(c.loss.hard_timeout_ms, 10_000);
    assert_eq!(c.loss.deadline_max().as_millis(), 250);
    // pacing, shm, control, metrics, log
    assert_eq!((c.pacing.rate_mbps, c.pacing.adapt), (0, false));
    assert_eq!(c.pacing.rate_bytes_per_sec(), None);
    assert_eq!(c.shm.ring_entries, 256);
    assert_eq!(c.control.socket_path.to_str(), Some("/run/dlcp/dlcpd.sock"));
    assert_eq!(c.control.mode(), 0o660);
    assert_eq!(c.control.socket_group, None);
    assert_eq!(c.metrics.address, "127.0.0.1:9464".parse::<SocketAddr>().unwrap());
    assert!(c.metrics.enabled);
    assert_eq!(c.log.level, LogLevel::Info);
}

/// The default marks never fall as the class rises (nor does the IP
/// precedence, their top three bits), control is alone on top, and no class is
/// marked best effort's DSCP 0 (deploy/README.md says why).
#[test]
fn default_dscp_rises_with_control_on_top_and_none_best_effort() {
    assert!(DEFAULT_DSCP.windows(2).all(|w| w[0] <= w[1] && w[0] >> 3 <= w[1] >> 3));
    assert!(DEFAULT_DSCP[..7].iter().all(|&d| d < DEFAULT_DSCP[7]));
    assert!(DEFAULT_DSCP.iter().all(|&d| (1..=63).contains(&d)), "{DEFAULT_DSCP:?}");
    assert!(DEFAULT_SO_PRIORITY.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn chunk_bytes_follows_mtu() {
    let t = format!("{MINIMAL}\n[network]\nmtu = 9000\n");
    // Appending [network] after the last [[peers]] closes the array of tables.
    let c = Config::from_str_named(&t, "x").unwrap();
    assert_eq!(c.chunk_bytes(), (9000 - 28 - 100) & !3);
    let t = format!("{MINIMAL}\n[network]\nmtu = 1499\n");
    let c = Config::from_str_named(&t, "x").unwrap();
    assert_eq!(c.chunk_bytes(), 1368, "1499 - 128 = 1371, rounded down to a multiple of 4");
    let t = format!("{MINIMAL}\n[network]\nchunk_bytes = 1024\nbind_address = \"0.0.0.0\"\n");
    let c = Config::from_str_named(&t, "x").unwrap();
    assert_eq!(c.chunk_bytes(), 1024);
    assert_eq!(c.bind_addr(), "0.0.0.0:7701".parse::<SocketAddr>().unwrap());
}

#[test]
fn generation_fixed() {
    let t = MINIMAL.replace("job_id = 9", "job_id = 9\ngeneration = 17");
    let c = Config::from_str_named(&t, "x").unwrap();
    assert_eq!(c.node.generation, Generation::Fixed(17));
    let t = MINIMAL.replace("job_id = 9", "job_id = 9\ngeneration = \"auto\"");
    assert_eq!(Config::from_str_named(&t, "x").unwrap().node.generation, Generation::Auto);
}

#[test]
fn effective_config_round_trips_and_redacts() {
    let c = Config::from_str_named(MINIMAL, "x").unwrap();
    let dump = c.to_toml_string();
    assert!(!dump.contains("a very secret job key"), "{dump}");
    assert!(dump.contains(&format!("job_secret = \"{REDACTED}\"")), "{dump}");
    assert!(format!("{c:?}").contains("redacted") && !format!("{c:?}").contains("very secret"));
    for key in [
        "chunk_bytes = 1372",
        "bind_address = \"10.77.0.3\"",
        "generation = \"auto\"",
        "[datapath.dpdk]",
        "so_priority = [",
    ] {
        assert!(dump.contains(key), "{key} missing from:\n{dump}");
    }
    // With the secret put back, the dump parses to the same config.
    let again = dump.replace(&format!("\"{REDACTED}\""), "\"a very secret job key\"");
    let d = Config::from_str_named(&again, "x").unwrap();
    assert_eq!(d, c);
    // The redacted dump itself is refused (the placeholder is too short to be a secret).
    let e = Config::from_str_named(&dump, "dump.toml").unwrap_err();
    assert_eq!(e.field(), Some("node.job_secret"));
}
