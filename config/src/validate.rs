//! Semantic validation: the rules serde's types cannot express.
//!
//! Every rule yields a [`Bad`] naming the dotted path of the field to blame and
//! ending its message with what is allowed; the caller turns the path into a
//! file:line:column.

use std::collections::HashMap;
use std::fmt::Display;
use std::io::Read;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use dlcp_proto::class::Class;
use dlcp_proto::priority::ClassifierError;

use crate::Config;
use crate::error::Bad;
use crate::schema::*;

type R = Result<(), Bad>;

fn in_range<T: PartialOrd + Display>(path: &str, v: T, lo: T, hi: T) -> R {
    if v < lo || v > hi {
        return Err(Bad::new(path, format!("{v} is out of range (allowed: {lo} ..= {hi})")));
    }
    Ok(())
}

fn power_of_two(path: &str, v: u64, lo: u64, hi: u64) -> R {
    if !v.is_power_of_two() || v < lo || v > hi {
        return Err(Bad::new(
            path,
            format!("{v} is not a power of two in range (allowed: {lo}, {} ..= {hi})", lo * 2),
        ));
    }
    Ok(())
}

/// The configuration file as read from disk: its name (for messages) and
/// permission bits (an inline secret needs a file only its owner can read).
pub(crate) struct Source<'a> {
    /// The file name as given.
    pub name: &'a str,
    /// `st_mode & 0o7777` of the file, as read.
    pub mode: u32,
}

/// Group and other permission bits: a secret, or a file holding one inline,
/// with any of them set is refused (as ssh refuses such a private key).
const NOT_OWNER_ONLY: u32 = 0o077;

/// Check everything and resolve the derived values (bind address, chunk size,
/// secret). `base` is the directory relative secret-file paths are taken from;
/// `file` is the configuration file when the text was read from one.
pub(crate) fn validate(cfg: &mut Config, base: Option<&Path>, file: Option<&Source<'_>>) -> R {
    let secret = node_secret(&cfg.node, base)?;
    if let (Some(_), Some(f)) = (&cfg.node.job_secret, file)
        && f.mode & NOT_OWNER_ONLY != 0
    {
        return Err(Bad::new(
            "node.job_secret",
            format!(
                "an inline secret in {name}, which group or others may access (mode {mode:04o}) \
                 (allowed: an inline secret only in a file its owner alone can read — run \
                 `chmod 600 {name}` — or the secret in node.job_secret_file)",
                name = f.name,
                mode = f.mode
            ),
        ));
    }
    peers(cfg)?;
    network(cfg)?;
    datapath(&cfg.datapath)?;
    priority(&cfg.priority)?;
    loss(&cfg.loss)?;
    pacing(&cfg.pacing, cfg.network.mtu)?;
    shm(&cfg.shm)?;
    control(&cfg.control)?;
    cfg.secret = secret;
    cfg.peers.sort_by_key(|p| p.rank);
    Ok(())
}

fn node_secret(node: &Node, base: Option<&Path>) -> Result<Secret, Bad> {
    const ALLOWED: &str = "allowed: exactly one of node.job_secret and node.job_secret_file";
    match (&node.job_secret, &node.job_secret_file) {
        (Some(_), Some(_)) => {
            Err(Bad::new("node.job_secret_file", format!("conflicts with node.job_secret ({ALLOWED})")))
        }
        (None, None) => Err(Bad::new("node.job_secret", format!("no job secret given ({ALLOWED})"))),
        (Some(s), None) => {
            if s.len() < MIN_SECRET_BYTES {
                return Err(Bad::new(
                    "node.job_secret",
                    format!("secret is {} bytes (allowed: at least {MIN_SECRET_BYTES} bytes)", s.len()),
                ));
            }
            Ok(s.clone())
        }
        (None, Some(file)) => {
            const P: &str = "node.job_secret_file";
            let path = match base {
                Some(b) if file.is_relative() => b.join(file),
                _ => file.clone(),
            };
            let shown = path.display();
            let f =
                std::fs::File::open(&path).map_err(|e| Bad::new(P, format!("cannot read {shown}: {e}")))?;
            // The mode of the file opened (not of the path, which may change meanwhile).
            let mode =
                f.metadata().map_err(|e| Bad::new(P, format!("cannot read {shown}: {e}")))?.mode() & 0o7777;
            if mode & NOT_OWNER_ONLY != 0 {
                return Err(Bad::new(
                    P,
                    format!(
                        "{shown} is accessible by group or others (mode {mode:04o}) (allowed: a secret \
                         file only its owner can read, mode 0600 or 0400 — run `chmod 600 {shown}`)"
                    ),
                ));
            }
            let mut bytes = Vec::new();
            f.take(MAX_SECRET_FILE_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| Bad::new(P, format!("cannot read {shown}: {e}")))?;
            if bytes.len() as u64 > MAX_SECRET_FILE_BYTES {
                return Err(Bad::new(
                    P,
                    format!(
                        "{shown} is too large (allowed: {MIN_SECRET_BYTES} ..= {MAX_SECRET_FILE_BYTES} bytes)"
                    ),
                ));
            }
            if bytes.len() < MIN_SECRET_BYTES {
                return Err(Bad::new(
                    P,
                    format!(
                        "{shown} holds {} bytes (allowed: at least {MIN_SECRET_BYTES} bytes)",
                        bytes.len()
                    ),
                ));
            }
            Ok(Secret::new(bytes))
        }
    }
}

fn family(a: &IpAddr) -> &'static str {
    if a.is_ipv4() { "IPv4" } else { "IPv6" }
}

fn peers(cfg: &Config) -> R {
    let n = cfg.peers.len();
    if n == 0 {
        return Err(Bad::new("peers", "no peers (allowed: one [[peers]] table per rank 0 .. N-1)"));
    }
    let max = n - 1;
    let mut seen_rank: HashMap<u32, usize> = HashMap::new();
    let mut seen_ep = HashMap::new();
    let first = cfg.peers[0].address;
    for (i, p) in cfg.peers.iter().enumerate() {
        let at = |f: &str| format!("peers[{i}].{f}");
        if p.rank as usize >= n {
            return Err(Bad::new(
                at("rank"),
                format!(
                    "rank {} out of range for {n} peers (allowed: 0 ..= {max}, each exactly once)",
                    p.rank
                ),
            ));
        }
        if let Some(j) = seen_rank.insert(p.rank, i) {
            return Err(Bad::new(
                at("rank"),
                format!(
                    "duplicate rank {} (also peers[{j}]) (allowed: 0 ..= {max}, each exactly once)",
                    p.rank
                ),
            ));
        }
        let a = p.address;
        if a.is_unspecified() || a.is_multicast() || a == IpAddr::from([255, 255, 255, 255]) {
            return Err(Bad::new(
                at("address"),
                format!("{a} is not a unicast address (allowed: a unicast IPv4 or IPv6 address)"),
            ));
        }
        if a.is_ipv4() != first.is_ipv4() {
            return Err(Bad::new(
                at("address"),
                format!(
                    "{a} is {} but peers[0] is {} (allowed: all peers in one address family)",
                    family(&a),
                    family(&first)
                ),
            ));
        }
        if p.port == 0 {
            return Err(Bad::new(at("port"), "0 is out of range (allowed: 1 ..= 65535)"));
        }
        if let Some(j) = seen_ep.insert(p.socket_addr(), i) {
            return Err(Bad::new(
                at("port"),
                format!("{} is also peers[{j}] (allowed: a distinct address:port per peer)", p.socket_addr()),
            ));
        }
    }
    if cfg.node.rank as usize >= n {
        return Err(Bad::new(
            "node.rank",
            format!("rank {} is not among the {n} peers (allowed: 0 ..= {max})", cfg.node.rank),
        ));
    }
    Ok(())
}

fn network(cfg: &mut Config) -> R {
    let own =
        cfg.peers.iter().find(|p| p.rank == cfg.node.rank).map(|p| p.address).unwrap_or(cfg.peers[0].address);
    let v6 = own.is_ipv6();
    let net = &mut cfg.network;
    if let Some(b) = net.bind_address {
        if b.is_ipv6() != v6 {
            return Err(Bad::new(
                "network.bind_address",
                format!(
                    "{b} is {} but the peers are {} (allowed: an address of the peers' family)",
                    family(&b),
                    family(&own)
                ),
            ));
        }
        if b.is_multicast() {
            return Err(Bad::new(
                "network.bind_address",
                format!("{b} is multicast (allowed: a local unicast or unspecified address)"),
            ));
        }
    }
    let min_mtu = if v6 { 1280 } else { 576 };
    in_range("network.mtu", net.mtu, min_mtu, 65535)?;
    if net.flow_window_bytes != 0 {
        in_range("network.flow_window_bytes", net.flow_window_bytes, 65536, 1 << 30)?;
    }
    in_range("network.paths", net.paths, 1, dlcp_proto::paths::MAX_PATHS)?;
    path_ports(&cfg.peers, cfg.network.paths)?;
    let net = &mut cfg.network;
    let max_chunk = max_chunk_bytes(net.mtu, v6);
    match net.chunk_bytes {
        Some(c) => {
            let cap = max_chunk & !3;
            if c % 4 != 0 || c < MIN_CHUNK_BYTES || c > cap {
                let ip = if v6 { IPV6_UDP_OVERHEAD } else { IPV4_UDP_OVERHEAD };
                return Err(Bad::new(
                    "network.chunk_bytes",
                    format!(
                        "{c} does not fit MTU {} − {ip} (IP/UDP) − {DLCP_OVERHEAD} (dlcp header and tag) (allowed: a multiple of 4 in {MIN_CHUNK_BYTES} ..= {cap})",
                        net.mtu
                    ),
                ));
            }
        }
        None => net.chunk_bytes = Some(default_chunk_bytes(net.mtu, v6)),
    }
    in_range("network.heartbeat_interval_ms", net.heartbeat_interval_ms, 1, 60_000)?;
    let min_timeout = net.heartbeat_interval_ms.saturating_mul(2);
    in_range("network.peer_timeout_ms", net.peer_timeout_ms, min_timeout, 3_600_000)
        .map_err(|b| Bad::new(b.path, format!("{} (2 × heartbeat_interval_ms is the minimum)", b.message)))?;
    net.bind_address.get_or_insert(own);
    Ok(())
}

/// Every peer sends from ports `port .. port + paths`: the range must fit
/// and not overlap another peer's on the same address.
fn path_ports(peers: &[Peer], paths: u16) -> R {
    for (i, p) in peers.iter().enumerate() {
        let last = u32::from(p.port) + u32::from(paths) - 1;
        if last > 65535 {
            return Err(Bad::new(
                format!("peers[{i}].port"),
                format!(
                    "{} + network.paths {paths} runs past port 65535 (allowed: 1 ..= {})",
                    p.port,
                    65536 - u32::from(paths)
                ),
            ));
        }
        let overlap = peers.iter().enumerate().find(|(j, q)| {
            *j != i
                && q.address == p.address
                && q.port <= p.port
                && u32::from(q.port) + u32::from(paths) > u32::from(p.port)
        });
        if let Some((j, q)) = overlap {
            return Err(Bad::new(
                format!("peers[{i}].port"),
                format!(
                    "{} is in the source ports {} ..= {} of peers[{j}] on {} (network.paths = {paths}; allowed: \
                     ports of peers on one address at least `paths` apart)",
                    p.port,
                    q.port,
                    u32::from(q.port) + u32::from(paths) - 1,
                    q.address
                ),
            ));
        }
    }
    Ok(())
}

fn datapath(d: &Datapath) -> R {
    let s = &d.socket;
    in_range("datapath.socket.gso_max_segments", s.gso_max_segments, 1, 64)?;
    in_range("datapath.socket.batch", s.batch, 1, 1024)?;
    let p = &d.dpdk;
    in_range("datapath.dpdk.rx_queues", p.rx_queues, 1, 64)?;
    in_range("datapath.dpdk.tx_queues", p.tx_queues, 1, 64)?;
    power_of_two("datapath.dpdk.rx_ring_size", p.rx_ring_size.into(), 64, 32768)?;
    power_of_two("datapath.dpdk.tx_ring_size", p.tx_ring_size.into(), 64, 32768)?;
    in_range("datapath.dpdk.rx_burst", u32::from(p.rx_burst), 1, p.rx_ring_size.min(512))
        .map_err(|b| Bad::new(b.path, format!("{} (at most 512 and rx_ring_size)", b.message)))?;
    in_range("datapath.dpdk.tx_burst", u32::from(p.tx_burst), 1, p.tx_ring_size.min(512))
        .map_err(|b| Bad::new(b.path, format!("{} (at most 512 and tx_ring_size)", b.message)))?;
    let need = u64::from(p.rx_queues) * u64::from(p.rx_ring_size + u32::from(p.rx_burst))
        + u64::from(p.tx_queues) * u64::from(p.tx_ring_size + u32::from(p.tx_burst));
    if u64::from(p.mbuf_pool_size) < need {
        return Err(Bad::new(
            "datapath.dpdk.mbuf_pool_size",
            format!(
                "{} cannot fill the rings (allowed: at least rx_queues × (rx_ring_size + rx_burst) + tx_queues × (tx_ring_size + tx_burst) = {need})",
                p.mbuf_pool_size
            ),
        ));
    }
    for (c, &q) in p.class_tx_queue.iter().enumerate() {
        if q >= p.tx_queues {
            return Err(Bad::new(
                format!("datapath.dpdk.class_tx_queue[{c}]"),
                format!("queue {q} does not exist (allowed: 0 ..= {}, below tx_queues)", p.tx_queues - 1),
            ));
        }
    }
    for (i, n) in p.neighbours.iter().enumerate() {
        if DpdkDatapath::parse_neighbour(n).is_none() {
            return Err(Bad::new(
                format!("datapath.dpdk.neighbours[{i}]"),
                format!("{n:?} is not \"IPv4 MAC\" (allowed: e.g. \"10.0.0.2 02:00:00:00:00:02\")"),
            ));
        }
    }
    for (i, a) in p.eal_args.iter().enumerate() {
        if a.is_empty() || a.contains('\0') {
            return Err(Bad::new(
                format!("datapath.dpdk.eal_args[{i}]"),
                "empty or NUL-containing argument (allowed: non-empty strings)",
            ));
        }
    }
    Ok(())
}

fn priority(p: &Priority) -> R {
    let top = Class::MAX_DATA.get();
    for (name, band) in [("scatter_band", p.scatter_band), ("gather_band", p.gather_band)] {
        for (i, &c) in band.iter().enumerate() {
            if c > top {
                return Err(Bad::new(
                    format!("priority.{name}[{i}]"),
                    format!(
                        "class {c} is out of range (allowed: 0 ..= {top}; class 7 is reserved for control)"
                    ),
                ));
            }
        }
        if band[0] > band[1] {
            return Err(Bad::new(
                format!("priority.{name}"),
                format!("[{}, {}] is empty (allowed: [lo, hi] with lo <= hi)", band[0], band[1]),
            ));
        }
    }
    if p.gather_band[0] <= p.scatter_band[1] {
        return Err(Bad::new(
            "priority.gather_band",
            format!(
                "[{}, {}] does not lie above scatter_band [{}, {}] (allowed: gather_band lo > {})",
                p.gather_band[0], p.gather_band[1], p.scatter_band[0], p.scatter_band[1], p.scatter_band[1]
            ),
        ));
    }
    in_range("priority.layer_levels", p.layer_levels, 1, 64)?;
    in_range("priority.magnitude_levels", p.magnitude_levels, 1, 64)?;
    let mut seen = [false; 8];
    for (i, &c) in p.droppable.iter().enumerate() {
        let path = format!("priority.droppable[{i}]");
        if c == Class::CONTROL.get() {
            return Err(Bad::new(
                path,
                format!("the control class cannot be droppable (allowed: classes 0 ..= {top})"),
            ));
        }
        if c > top {
            return Err(Bad::new(path, format!("class {c} is out of range (allowed: 0 ..= {top})")));
        }
        if std::mem::replace(&mut seen[c as usize], true) {
            return Err(Bad::new(
                path,
                format!("class {c} is listed twice (allowed: each class at most once)"),
            ));
        }
    }
    for (c, &d) in p.dscp.iter().enumerate() {
        in_range(&format!("priority.dscp[{c}]"), d, 0, 63)?;
    }
    for (c, &d) in p.so_priority.iter().enumerate() {
        in_range(&format!("priority.so_priority[{c}]"), d, 0, 15)
            .map_err(|b| Bad::new(b.path, format!("{} (above 6 needs CAP_NET_ADMIN)", b.message)))?;
    }
    // The protocol core's own invariants, as a safety net for the checks above.
    p.classifier().validate().map_err(|e| {
        let path = match e {
            ClassifierError::BadBands => "priority.gather_band",
            ClassifierError::ZeroLevels => "priority.layer_levels",
            ClassifierError::DroppableControl => "priority.droppable",
        };
        Bad::new(path, format!("invalid classifier ({e})"))
    })
}

fn budget(path: &str, v: f64, cap: f64, cap_name: &str) -> R {
    if !v.is_finite() {
        return Err(Bad::new(path, format!("{v} is not a finite number (allowed: 0.0 ..= {cap:.2})")));
    }
    if v < 0.0 {
        return Err(Bad::new(path, format!("{v} is negative (allowed: 0.0 ..= {cap:.2})")));
    }
    if v > cap {
        return Err(Bad::new(
            path,
            format!(
                "{v} exceeds {cap_name} {cap:.2} (allowed: 0.0 ..= {cap:.2}; {})",
                crate::budget::BUDGET_FORMS
            ),
        ));
    }
    Ok(())
}

fn loss(l: &Loss) -> R {
    budget("loss.budget", l.budget, MAX_BUDGET, "the hard cap")?;
    if l.gather_budget.is_finite() && l.gather_budget > l.budget && l.gather_budget <= MAX_BUDGET {
        return Err(Bad::new(
            "loss.gather_budget",
            format!("{} exceeds loss.budget {} (allowed: 0.0 ..= loss.budget)", l.gather_budget, l.budget),
        ));
    }
    budget("loss.gather_budget", l.gather_budget, MAX_BUDGET, "the hard cap")?;
    in_range("loss.deadline_min_ms", l.deadline_min_ms, 1, 3_600_000)?;
    in_range("loss.deadline_max_ms", l.deadline_max_ms, l.deadline_min_ms, 3_600_000)
        .map_err(|b| Bad::new(b.path, format!("{} (at least deadline_min_ms)", b.message)))?;
    in_range("loss.ack_delay_ms", l.ack_delay_ms, 0, 1_000)?;
    in_range("loss.probe_timeout_min_ms", l.probe_timeout_min_ms, 1, 3_600_000)?;
    in_range("loss.probe_timeout_max_ms", l.probe_timeout_max_ms, l.probe_timeout_min_ms, 3_600_000)
        .map_err(|b| Bad::new(b.path, format!("{} (at least probe_timeout_min_ms)", b.message)))?;
    let floor = l.deadline_max_ms.max(l.probe_timeout_max_ms);
    in_range("loss.hard_timeout_ms", l.hard_timeout_ms, floor, 3_600_000).map_err(|b| {
        Bad::new(b.path, format!("{} (at least deadline_max_ms and probe_timeout_max_ms)", b.message))
    })?;
    if l.op_deadline_ms != 0 {
        in_range("loss.op_deadline_ms", l.op_deadline_ms, l.hard_timeout_ms, 86_400_000).map_err(|b| {
            Bad::new(b.path, format!("{} (0 = none; else at least hard_timeout_ms)", b.message))
        })?;
    }
    in_range("loss.initial_per_chunk_us", l.initial_per_chunk_us, 1, 1_000_000)
}

fn pacing(p: &Pacing, mtu: u32) -> R {
    in_range("pacing.rate_mbps", p.rate_mbps, 0, 1_000_000)?;
    if p.rate_mbps > 0 && p.burst_bytes < mtu {
        return Err(Bad::new(
            "pacing.burst_bytes",
            format!(
                "{} is below one packet (allowed: at least network.mtu = {mtu} when paced)",
                p.burst_bytes
            ),
        ));
    }
    if p.adapt && p.rate_mbps == 0 {
        return Err(Bad::new(
            "pacing.adapt",
            "rate adaptation needs a starting rate (allowed: adapt = true only with pacing.rate_mbps > 0)",
        ));
    }
    Ok(())
}

fn shm(s: &Shm) -> R {
    in_range("shm.arena_bytes", s.arena_bytes, 1 << 20, MAX_ARENA_BYTES)?;
    if s.arena_bytes % 4096 != 0 {
        return Err(Bad::new(
            "shm.arena_bytes",
            format!("{} is not page aligned (allowed: a multiple of 4096)", s.arena_bytes),
        ));
    }
    power_of_two("shm.ring_entries", s.ring_entries.into(), 2, 65536)?;
    in_range("shm.max_tensor_bytes", s.max_tensor_bytes, 1, s.arena_bytes)
        .map_err(|b| Bad::new(b.path, format!("{} (at most shm.arena_bytes)", b.message)))?;
    in_range("shm.early_buffer_bytes", s.early_buffer_bytes, 0, s.arena_bytes)
        .map_err(|b| Bad::new(b.path, format!("{} (at most shm.arena_bytes)", b.message)))?;
    in_range("shm.max_attachments", s.max_attachments, 1, MAX_ATTACHMENTS)?;
    in_range("shm.max_ops_in_flight", s.max_ops_in_flight, 1, 65_536)?;
    in_range("shm.max_attachments_per_user", s.max_attachments_per_user, 0, s.max_attachments).map_err(|b| {
        Bad::new(b.path, format!("{} (0 = no per-user cap; at most shm.max_attachments)", b.message))
    })
}

fn control(c: &Control) -> R {
    in_range("control.max_admin_connections", c.max_admin_connections, 1, MAX_LOCAL_CONNECTIONS)?;
    in_range("control.max_pending_attaches", c.max_pending_attaches, 1, MAX_LOCAL_CONNECTIONS)?;
    in_range("control.request_timeout_ms", c.request_timeout_ms, 100, 60_000)?;
    let p = &c.socket_path;
    let len = p.as_os_str().len();
    if !p.is_absolute() || len > 107 || p.as_os_str().as_encoded_bytes().contains(&0) {
        return Err(Bad::new(
            "control.socket_path",
            format!(
                "{:?} is not usable (allowed: an absolute path of at most 107 bytes)",
                p.display().to_string()
            ),
        ));
    }
    match parse_mode(&c.socket_mode) {
        None => Err(Bad::new(
            "control.socket_mode",
            format!(
                "invalid value {:?} (allowed: an octal mode string such as \"0660\", at most \"0777\")",
                c.socket_mode
            ),
        )),
        Some(m) if m & 0o002 != 0 => Err(Bad::new(
            "control.socket_mode",
            format!(
                "{:?} is world-writable (allowed: modes without the 0002 bit, e.g. \"0660\")",
                c.socket_mode
            ),
        )),
        Some(_) => match &c.socket_group {
            Some(g) if g.trim().is_empty() || g.contains(['\0', ':', '/']) => Err(Bad::new(
                "control.socket_group",
                format!("invalid group {g:?} (allowed: a group name or numeric gid)"),
            )),
            _ => Ok(()),
        },
    }
}
