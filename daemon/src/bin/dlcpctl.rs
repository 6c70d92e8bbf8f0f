//! `dlcpctl`: ask a running dlcpd for its status and counters, or to reload
//! its configuration.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde_json::Value;

#[derive(Parser)]
#[command(
    name = "dlcpctl",
    version = dlcp::VERSION,
    about = "Query or reload a running dlcpd over its admin socket",
    long_about = "Query or reload a running dlcpd over its admin socket (the control socket's path \
                  with `.admin` appended, same permissions). Exit status: 0 ok, 1 the daemon answered \
                  with an error (or rejected a reload), 2 the daemon could not be reached."
)]
struct Cli {
    /// The daemon's control socket (`control.socket_path` in its config); the
    /// admin socket is this path with `.admin` appended.
    #[arg(long, short, default_value = "/run/dlcp/dlcpd.sock", env = "DLCP_SOCKET")]
    socket: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Version, datapath in use and why, peers up/down, trainers, metrics endpoint, reloads.
    Status {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Every counter: per class, per peer, per op, rejections.
    Stats {
        /// Print the raw JSON (for scripts and tests).
        #[arg(long)]
        json: bool,
    },
    /// The peers of the job: address, up/down, generation, datagrams each way.
    Peers {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Re-read the configuration file (same as SIGHUP) and print what changed.
    Reload {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// What arrived from whom for one recent op (missing chunks per sender, masks).
    Report {
        /// Op sequence number.
        op: u64,
        /// Tensor id.
        tensor: u32,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
}

fn query(socket: &Path, request: &str) -> Result<Value, String> {
    let admin = dlcp::service::admin_path(socket);
    let mut s = UnixStream::connect(&admin).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            let dir = admin.parent().filter(|d| !d.as_os_str().is_empty());
            let hint = if dir.is_some_and(|d| !d.exists()) {
                format!(" (its directory {} does not exist either)", dir.unwrap_or(Path::new("")).display())
            } else {
                String::new()
            };
            format!(
                "{}: no such socket{hint} — is dlcpd running with control.socket_path = {}? \
                 (systemctl status dlcpd; pass --socket or set DLCP_SOCKET for another path)",
                admin.display(),
                socket.display()
            )
        }
        std::io::ErrorKind::PermissionDenied => format!(
            "{}: permission denied — run as the daemon's user (dlcp), root, or a member of the \
             socket's group (control.socket_group)",
            admin.display()
        ),
        std::io::ErrorKind::ConnectionRefused => format!(
            "{}: connection refused — dlcpd is not running (a stale socket file was left behind)",
            admin.display()
        ),
        _ => format!("{}: {e}", admin.display()),
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    s.write_all(format!("{request}\n").as_bytes()).map_err(|e| format!("{}: {e}", admin.display()))?;
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| format!("{}: {e}", admin.display()))?;
    serde_json::from_str(&out).map_err(|e| format!("{}: bad reply ({e}): {out}", admin.display()))
}

/// Appends a formatted line to the output (what `println!` would print):
/// everything goes to stdout at the end in one write, whose failure for a
/// reader that went away (`dlcpctl status | head -1`) is no error.
macro_rules! outln {
    ($o:expr) => {
        $o.push('\n')
    };
    ($o:expr, $($arg:tt)*) => {{
        $o.push_str(&format!($($arg)*));
        $o.push('\n');
    }};
}

/// Appends formatted text to the output (what `print!` would print).
macro_rules! out {
    ($o:expr, $($arg:tt)*) => {
        $o.push_str(&format!($($arg)*))
    };
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn list(v: &Value) -> Vec<u64> {
    v.as_array().map(|a| a.iter().map(u).collect()).unwrap_or_default()
}

fn print_status(w: &mut String, v: &Value) {
    let o = &v["ops"];
    outln!(w, "dlcpd {}", v["version"].as_str().unwrap_or("?"));
    outln!(
        w,
        "  rank {} of {}, job {}, generation {}{}",
        v["rank"],
        v["world"],
        v["job"],
        v["generation"],
        if v["draining"].as_bool() == Some(true) { " — DRAINING" } else { "" }
    );
    outln!(w, "  datapath: {}", v["datapath"].as_str().unwrap_or("?"));
    outln!(
        w,
        "    configured kind: {} — {}",
        o["datapath_kind"].as_str().unwrap_or("?"),
        o["build"].as_str().unwrap_or("")
    );
    // Every rank but this daemon's own.
    let peers: Vec<serde_json::Value> =
        v["peers"].as_array().into_iter().flatten().filter(|p| p["self"] != true).cloned().collect();
    let up = peers.iter().filter(|p| p["up"].as_bool() == Some(true)).count();
    let down: Vec<String> = peers
        .iter()
        .filter(|p| p["up"].as_bool() != Some(true))
        .map(|p| format!("{} ({})", p["rank"], p["address"].as_str().unwrap_or("?")))
        .collect();
    outln!(
        w,
        "  peers: {up}/{} up{}",
        peers.len(),
        if down.is_empty() { String::new() } else { format!("; down: {}", down.join(", ")) }
    );
    for p in peers.iter().filter(|p| p["refused"].is_string()) {
        outln!(
            w,
            "    REFUSED: rank {} ({}) {}",
            p["rank"],
            p["address"].as_str().unwrap_or("?"),
            p["refused"].as_str().unwrap_or("?")
        );
    }
    match v["packet_auth"].as_str() {
        Some("none") => {
            outln!(w, "  packet auth: none — datagrams are NOT authenticated (security.packet_auth)")
        }
        Some(a) => outln!(w, "  packet auth: {a}"),
        None => {}
    }
    match v["flow_window"].as_u64() {
        Some(0) => outln!(w, "  flow control: off (network.flow_window_bytes = 0)"),
        Some(n) => outln!(w, "  flow control: receive window {n} datagrams, shared by the senders"),
        None => {}
    }
    outln!(
        w,
        "  trainers attached: {}, ops in flight: {}, waiting for their run: {}",
        v["trainers"],
        v["ops_in_flight"],
        v["ops_held"]
    );
    let run = &v["run"];
    match (run["epoch"].as_u64(), run["id"].as_str()) {
        (Some(e), Some(id)) => outln!(w, "  run: local run {e}, agreed with every peer as {id}"),
        (Some(e), None) => {
            let why: Vec<&str> =
                run["waiting"].as_array().into_iter().flatten().filter_map(|s| s.as_str()).collect();
            outln!(w, "  run: local run {e}, NOT agreed yet: {}", why.join("; "))
        }
        _ => outln!(w, "  run: none (no trainer attached)"),
    }
    if let Some(f) = o["config_file"].as_str() {
        outln!(
            w,
            "  config: {f} (log level {}, loss budget {})",
            o["log_level"].as_str().unwrap_or("?"),
            o["budget"]
        );
    }
    let m = &o["metrics"];
    match (m["enabled"].as_bool(), m["address"].as_str(), m["error"].as_str()) {
        (Some(false), _, _) => outln!(w, "  metrics: disabled"),
        (_, Some(a), _) => outln!(w, "  metrics: http://{a}/metrics"),
        (_, _, Some(e)) => outln!(w, "  metrics: NOT SERVED — {e}"),
        _ => {}
    }
    out!(w, "  reloads: {} ok, {} rejected", o["reloads_ok"], o["reloads_failed"]);
    if let Some(r) = o["last_reload"].as_object() {
        let ok = r["outcome"]["ok"].as_bool() == Some(true);
        out!(w, " (last {}s ago: {})", r["seconds_ago"], if ok { "ok" } else { "rejected" });
    }
    outln!(w);
    let sd = &o["systemd"];
    if sd["notify"].as_bool() == Some(true) {
        outln!(
            w,
            "  systemd: notify on, watchdog {}",
            sd["watchdog_ms"].as_u64().map_or("off".into(), |w| format!("{w} ms"))
        );
    }
}

fn print_peers(w: &mut String, status: &Value, stats: &Value) {
    let tx = list(&stats["protocol"]["tx_packets_per_peer"]);
    let rx = list(&stats["protocol"]["rx_packets_per_peer"]);
    outln!(
        w,
        "{:>5}  {:<40} {:<5} {:>11} {:>12} {:>12}",
        "rank",
        "address",
        "state",
        "generation",
        "tx datagrams",
        "rx datagrams"
    );
    for p in status["peers"].as_array().cloned().unwrap_or_default() {
        let r = u(&p["rank"]) as usize;
        let state = if p["self"].as_bool() == Some(true) {
            "self"
        } else if p["up"].as_bool() == Some(true) {
            "up"
        } else {
            "DOWN"
        };
        outln!(
            w,
            "{:>5}  {:<40} {:<5} {:>11} {:>12} {:>12}",
            r,
            p["address"].as_str().unwrap_or("?"),
            state,
            p["generation"].as_u64().map_or("-".into(), |g| g.to_string()),
            tx.get(r).copied().unwrap_or(0),
            rx.get(r).copied().unwrap_or(0)
        );
    }
}

fn print_stats(w: &mut String, v: &Value) {
    let p = &v["protocol"];
    let s = &v["service"];
    outln!(
        w,
        "dlcpd {} — rank {} of {}, {} trainers",
        v["version"].as_str().unwrap_or("?"),
        v["rank"],
        v["world"],
        v["trainers"]
    );
    outln!(
        w,
        "ops: {} started, {} completed, {} failed, {} in flight; {} hard timeouts, {} waits for late ranks, \
         {} deadlines fired",
        s["ops_started"],
        s["ops_completed"],
        s["ops_failed"],
        p["ops_in_flight"],
        p["hard_timeouts"],
        p["late_rank_waits"],
        p["deadlines_fired"]
    );
    outln!(
        w,
        "repairs: {} sent, {} received; {} transfers closed within budget",
        p["repairs_sent"],
        p["repairs_received"],
        p["closed_within_budget"]
    );
    outln!(
        w,
        "probes: {} sent, {} duplicate copies ignored; deadlines: {} fired = {} closes + {} NACKs",
        p["probes_sent"],
        p["probes_duplicate"],
        p["deadlines_fired"],
        p["deadline_closes"],
        p["deadline_nacks"]
    );
    let f = &p["flow"];
    outln!(
        w,
        "flow control: {} GRANTs sent, {} received; {} credit waits; {} credit requests sent, {} received",
        u(&f["grants_sent"]),
        u(&f["grants_received"]),
        u(&f["credit_waits"]),
        u(&f["requests_sent"]),
        u(&f["requests_received"])
    );
    print_traffic_tables(w, v);
    let mut rej = p["rejected"].as_object().cloned().unwrap_or_default();
    // The source-address check's reasons, then the service's own drops (debug
    // loss), after the others as always, by the same reason names as
    // dlcp_rx_dropped_total.
    let source =
        ["wrong_source", "unknown_source"].map(|k| (k.to_string(), rej.remove(k).unwrap_or_default()));
    let own = source.into_iter().chain([("debug_loss".to_string(), s["rx_debug_dropped"].clone())]);
    let nonzero: Vec<String> =
        rej.into_iter().chain(own).filter(|(_, n)| u(n) > 0).map(|(k, n)| format!("{k} {}", u(&n))).collect();
    outln!(
        w,
        "\nrejected datagrams: {}",
        if nonzero.is_empty() { "none".to_string() } else { nonzero.join(", ") }
    );
    let d = &v["datapath_counters"];
    outln!(
        w,
        "datapath: {} rx datagrams, {} tx would-block, {} tx errors, {} rx errors, {} truncated",
        d["rx_packets"],
        d["tx_would_block"],
        d["tx_errors"],
        d["rx_errors"],
        d["rx_truncated"]
    );
    outln!(
        w,
        "receive-side drops before dlcpd read them: {} by the kernel (socket receive buffer full), \
         {} by the NIC (ring full)",
        u(&d["rx_rcvbuf_drops"]),
        u(&d["rx_ring_overruns"])
    );
    outln!(
        w,
        "trainers: {} attached, {} gone, {} refused; {} submissions, {} rejected, {} completions dropped",
        s["trainers_attached"],
        s["trainers_gone"],
        s["trainers_refused"],
        s["submissions"],
        s["submissions_rejected"],
        s["completions_dropped"]
    );
    outln!(w, "reloads: {} ok, {} rejected", s["reloads_ok"], s["reloads_failed"]);
    print_recent_ops(w, v);
}

/// Per class and per peer: sent, received, dropped on arrival, repairs.
fn print_traffic_tables(w: &mut String, v: &Value) {
    let p = &v["protocol"];
    // Dropped: received datagrams discarded on arrival, by the class their
    // header claims and by the configured peer address that sent them.
    let header = |key: &str| {
        format!(
            "\n{key:>7} {:>12} {:>14} {:>12} {:>14} {:>10} {:>13} {:>11} {:>11}",
            "tx packets",
            "tx bytes",
            "rx packets",
            "rx bytes",
            "dropped",
            "dropped bytes",
            "repairs out",
            "repairs in"
        )
    };
    let row = |w: &mut String, key: &str, cols: [u64; 8]| {
        let [a, b, c, d, e, f, g, h] = cols;
        outln!(w, "{key:>7} {a:>12} {b:>14} {c:>12} {d:>14} {e:>10} {f:>13} {g:>11} {h:>11}");
    };
    let g = |x: &Vec<u64>, i: usize| x.get(i).copied().unwrap_or(0);
    let unknown = |k: &str| [0, 0, 0, 0, u(&p[k]["packets"]), u(&p[k]["bytes"]), 0, 0];
    outln!(w, "{}", header("class"));
    let cols = [
        "tx_packets_per_class",
        "tx_bytes_per_class",
        "rx_packets_per_class",
        "rx_bytes_per_class",
        "rx_dropped_packets_per_class",
        "rx_dropped_bytes_per_class",
        "repairs_sent_per_class",
        "repairs_received_per_class",
    ]
    .map(|k| list(&p[k]));
    for c in 0..8 {
        row(w, &c.to_string(), cols.each_ref().map(|x| g(x, c)));
    }
    row(w, "unknown", unknown("rx_dropped_unknown_class"));
    outln!(w, "{}", header("peer"));
    let cols = [
        "tx_packets_per_peer",
        "tx_bytes_per_peer",
        "rx_packets_per_peer",
        "rx_bytes_per_peer",
        "rx_dropped_packets_per_peer",
        "rx_dropped_bytes_per_peer",
        "repairs_sent_per_peer",
        "repairs_received_per_peer",
    ]
    .map(|k| list(&p[k]));
    for r in 0..u(&v["world"]) as usize {
        row(w, &r.to_string(), cols.each_ref().map(|x| g(x, r)));
    }
    row(w, "unknown", unknown("rx_dropped_unknown_peer"));
    print_path_table(w, v);
    print_paths_per_peer(w, v);
}

/// Per path (source port offset): sent, chunks reported lost, the lowest
/// weight any peer gives it, received.
fn print_path_table(w: &mut String, v: &Value) {
    let p = &v["protocol"];
    let cols = [
        list(&p["tx_packets_per_path"]),
        list(&p["lost_per_path"]),
        list(&p["weight_per_path"]),
        list(&v["service"]["rx_packets_per_path"]),
    ];
    let n = cols.iter().map(Vec::len).max().unwrap_or(0);
    if n == 0 {
        return;
    }
    outln!(w, "\n{:>7} {:>12} {:>12} {:>8} {:>12}", "path", "tx packets", "lost", "weight", "rx packets");
    for i in 0..n {
        let [a, b, c, d] = cols.each_ref().map(|x| x.get(i).copied().unwrap_or(0));
        outln!(w, "{i:>7} {a:>12} {b:>12} {c:>8} {d:>12}");
    }
}

/// Per peer, the paths that are not at full weight and the loss rates of
/// its paths (long window): why a path carries little.
fn print_paths_per_peer(w: &mut String, v: &Value) {
    let Some(peers) = v["paths_per_peer"].as_array() else { return };
    outln!(w, "\npath health per peer (long-window loss; weight below 1024 = cut or recovering):");
    for peer in peers {
        let paths = peer["paths"].as_array().cloned().unwrap_or_default();
        let verdicts: u64 = paths.iter().map(|p| u(&p["verdicts"])).sum();
        let cuts: u64 = paths.iter().map(|p| u(&p["cuts"])).sum();
        let low: Vec<String> = paths
            .iter()
            .enumerate()
            .filter(|(_, p)| u(&p["weight"]) < 1024)
            .map(|(i, p)| format!("{i}:{}", u(&p["weight"])))
            .collect();
        let loss: Vec<String> =
            paths.iter().map(|p| format!("{:.2}", u(&p["long_loss_ppm"]) as f64 / 1e4)).collect();
        outln!(
            w,
            "  rank {:>4}: {verdicts} verdicts, {cuts} cuts; below full weight: {}; loss % by path: {}",
            u(&peer["rank"]),
            if low.is_empty() { "none".to_owned() } else { low.join(" ") },
            loss.join(" ")
        );
    }
}

/// The last ten ops, newest first.
fn print_recent_ops(w: &mut String, v: &Value) {
    let recent = v["recent_ops"].as_array().cloned().unwrap_or_default();
    if !recent.is_empty() {
        outln!(
            w,
            "\nrecent ops (newest first):\n{:>8} {:>7} {:>10} {:>11} {:>10} {:>8}",
            "op",
            "tensor",
            "elements",
            "time (µs)",
            "delivered",
            "repairs"
        );
        for r in recent.iter().take(10) {
            // Numbers as u64: a JSON value's own Display ignores the width.
            let (op, tensor) = (u(&r["op"]), u(&r["tensor"]));
            match r["error"].as_str() {
                Some(e) => outln!(w, "{op:>8} {tensor:>7}  FAILED: {e}"),
                None => outln!(
                    w,
                    "{op:>8} {tensor:>7} {:>10} {:>11} {:>9.4}% {:>8}",
                    u(&r["len"]),
                    u(&r["duration_us"]),
                    r["min_delivered"].as_f64().unwrap_or(0.0) * 100.0,
                    u(&r["repairs_sent"])
                ),
            }
        }
    }
}

fn print_reload(w: &mut String, v: &Value) {
    if let Some(e) = v["error"].as_str() {
        outln!(w, "reload REJECTED, running configuration kept:\n  {e}");
        return;
    }
    outln!(w, "reloaded {}", v["file"].as_str().unwrap_or("?"));
    let section = |w: &mut String, title: &str, key: &str| {
        let items = v[key].as_array().cloned().unwrap_or_default();
        if !items.is_empty() {
            outln!(w, "{title}:");
            for i in items {
                outln!(w, "  {}", i.as_str().unwrap_or("?"));
            }
        }
    };
    section(w, "applied (new ops use it)", "applied");
    section(w, "needs a restart (not applied)", "needs_restart");
    section(w, "could not be applied (kept)", "not_applied");
    if ["applied", "needs_restart", "not_applied"].iter().all(|k| v[*k].as_array().is_none_or(Vec::is_empty))
    {
        outln!(w, "no changes");
    }
}

/// `peers --json`: the status's peers, each with its datagram counts.
fn peers_json(v: &Value) -> Value {
    let peers: Vec<Value> = v["status"]["peers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|mut p| {
            let r = u(&p["rank"]) as usize;
            p["tx_packets"] = v["stats"]["protocol"]["tx_packets_per_peer"][r].clone();
            p["rx_packets"] = v["stats"]["protocol"]["rx_packets_per_peer"][r].clone();
            p
        })
        .collect();
    Value::from(peers)
}

/// Chunk indices for people: the first 16, then how many more.
fn chunk_list(v: &Value) -> String {
    let all = list(v);
    if all.is_empty() {
        return "none".into();
    }
    let shown: Vec<String> = all.iter().take(16).map(u64::to_string).collect();
    let more = all.len().saturating_sub(16);
    if more == 0 { shown.join(" ") } else { format!("{} (+{more} more)", shown.join(" ")) }
}

/// `report OP TENSOR` as text: the op, this rank's shard, then one row per
/// transfer of each phase.
fn print_report(w: &mut String, v: &Value) {
    let yes = |b: &Value| if b.as_bool() == Some(true) { "yes" } else { "no" };
    outln!(
        w,
        "op {} tensor {} at rank {}: {} µs, {} repairs sent, a deadline fired: {}",
        v["op"],
        v["tensor"],
        v["rank"],
        v["duration_us"],
        v["repairs_sent"],
        yes(&v["deadline_fired"])
    );
    outln!(w, "collective: {}", v["collective"].as_str().unwrap_or("allreduce"));
    outln!(
        w,
        "started at {} µs, finished at {} µs (since the daemon started)",
        v["started_us"],
        v["finished_us"]
    );
    outln!(
        w,
        "own shard: {} chunks; zero-filled everywhere: {}",
        v["own_chunks"],
        chunk_list(&v["own_mask"])
    );
    for (title, key, who) in
        [("reduce-scatter into this rank's shard", "scatter", "from"), ("all-gather", "gather", "owner")]
    {
        let rows = v[key].as_array().cloned().unwrap_or_default();
        outln!(w, "\n{title}:");
        if rows.is_empty() {
            outln!(w, "  (no transfers)");
            continue;
        }
        outln!(
            w,
            "{who:>7} {:>8} {:>8} {:>9} {:>9} {:>10}  missing chunks",
            "chunks",
            "missing",
            "repaired",
            "deadline",
            "delivered"
        );
        for t in rows {
            outln!(
                w,
                "{:>7} {:>8} {:>8} {:>9} {:>9} {:>9.3}%  {}",
                t["peer"],
                t["chunks"],
                list(&t["missing"]).len(),
                t["repaired"],
                yes(&t["deadline_fired"]),
                t["delivered_fraction"].as_f64().unwrap_or(0.0) * 100.0,
                chunk_list(&t["missing"])
            );
            if t["mask"].is_array() {
                outln!(w, "{:>7} agreed zero-filled mask: {}", "", chunk_list(&t["mask"]));
            }
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (req, json) = match &cli.command {
        Command::Status { json } | Command::Peers { json } => ("status".to_string(), *json),
        Command::Stats { json } => ("stats".to_string(), *json),
        Command::Reload { json } => ("reload".to_string(), *json),
        Command::Report { op, tensor, json } => (format!("report {op} {tensor}"), *json),
    };
    let reply = query(&cli.socket, &req).and_then(|v| match &cli.command {
        Command::Peers { .. } => query(&cli.socket, "stats").map(|s| {
            let tx = s["protocol"]["tx_packets_per_peer"].clone();
            let rx = s["protocol"]["rx_packets_per_peer"].clone();
            serde_json::json!({ "status": v, "stats": { "protocol": { "tx_packets_per_peer": tx, "rx_packets_per_peer": rx } } })
        }),
        _ => Ok(v),
    });
    match reply {
        Ok(v)
            if v.get("error").is_some()
                && v["error"].is_string()
                && !matches!(cli.command, Command::Reload { .. }) =>
        {
            eprintln!("dlcpctl: {}", v["error"].as_str().unwrap_or("error"));
            ExitCode::from(1)
        }
        Ok(v) => {
            let failed = matches!(cli.command, Command::Reload { .. }) && v["ok"].as_bool() != Some(true);
            let mut o = String::new();
            if json {
                match &cli.command {
                    Command::Peers { .. } => outln!(o, "{}", peers_json(&v)),
                    _ => outln!(o, "{v}"),
                }
            } else {
                match &cli.command {
                    Command::Status { .. } => print_status(&mut o, &v),
                    Command::Stats { .. } => print_stats(&mut o, &v),
                    Command::Peers { .. } => print_peers(&mut o, &v["status"], &v["stats"]),
                    Command::Reload { .. } => print_reload(&mut o, &v),
                    Command::Report { .. } => print_report(&mut o, &v),
                }
            }
            if let Err(e) = dlcp::write_stdout(&o) {
                eprintln!("dlcpctl: writing to stdout: {e}");
                return ExitCode::from(1);
            }
            if failed { ExitCode::from(1) } else { ExitCode::SUCCESS }
        }
        Err(e) => {
            eprintln!("dlcpctl: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_health_names_the_cut_paths_of_each_peer() {
        let v: Value = serde_json::from_str(
            r#"{"paths_per_peer": [
                {"rank": 1, "paths": [{"weight": 1024, "verdicts": 900, "cuts": 0, "long_loss_ppm": 2000},
                                      {"weight": 16, "verdicts": 100, "cuts": 3, "long_loss_ppm": 12500}]},
                {"rank": 2, "paths": [{"weight": 1024, "verdicts": 5, "cuts": 0, "long_loss_ppm": 0},
                                      {"weight": 1024, "verdicts": 5, "cuts": 0, "long_loss_ppm": 0}]}
            ]}"#,
        )
        .unwrap();
        let mut w = String::new();
        print_paths_per_peer(&mut w, &v);
        assert!(
            w.contains(
                "rank    1: 1000 verdicts, 3 cuts; below full weight: 1:16; loss % by path: 0.20 1.25"
            ),
            "{w}"
        );
        assert!(w.contains("rank    2: 10 verdicts, 0 cuts; below full weight: none;"), "{w}");
        let mut none = String::new();
        print_paths_per_peer(&mut none, &serde_json::json!({}));
        assert!(none.is_empty(), "one path: no section");
    }

    #[test]
    fn the_recent_ops_table_is_aligned() {
        let v: Value = serde_json::from_str(
            r#"{"recent_ops": [
                {"op": 12345, "tensor": 7, "len": 1048576, "duration_us": 98765, "min_delivered": 0.99875, "repairs_sent": 12},
                {"op": 3, "tensor": 0, "len": 16, "duration_us": 5, "min_delivered": 1.0, "repairs_sent": 0},
                {"op": 2, "tensor": 1, "error": "no progress for 1s; waiting on ranks [1]"}
            ]}"#,
        )
        .unwrap();
        let mut w = String::new();
        print_recent_ops(&mut w, &v);
        let lines: Vec<&str> = w.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 5, "{w}");
        // Every column ends where its header ends (right-aligned), counted in characters.
        let ends = |l: &str| -> Vec<usize> {
            let chars: Vec<char> = l.chars().collect();
            (0..chars.len())
                .filter(|&i| chars[i] != ' ' && chars.get(i + 1).is_none_or(|c| *c == ' '))
                .collect()
        };
        let header = ends(&lines[1].replace("time (µs)", "time_(µs)"));
        assert_eq!(header.len(), 6, "{w}");
        for row in &lines[2..4] {
            assert_eq!(ends(row), header, "misaligned row:\n{w}");
        }
        assert_eq!(&ends(lines[4])[..2], &header[..2], "op and tensor of a failed op:\n{w}");
        assert!(lines[2].contains(" 99.8750% "), "{w}");
    }
}
