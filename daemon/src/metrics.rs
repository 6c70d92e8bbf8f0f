//! Prometheus metrics: `GET /metrics` on `[metrics] address` (default
//! `127.0.0.1:9464`), in the Prometheus text format (0.0.4).
//!
//! The metrics are `prometheus-client` counters, gauges and histograms. The
//! event loop owns the numbers: every [`UPDATE_EVERY`] it copies its counters
//! into the metrics ([`Metrics::update`], a few hundred atomic stores), and on
//! each finished op it records the op's latency, delivered fraction and which
//! peer's contribution arrived last ([`Metrics::op_completed`]). A small thread
//! of its own serves HTTP: it only reads the metrics, so a slow scraper never
//! holds up the datapath (the loop's counters can be up to [`UPDATE_EVERY`]
//! old in a scrape).
//!
//! Port collisions: several daemons on one host (tests, `dlcpd demo`) must not
//! share an address: give each `127.0.0.1:0` (any free port; `dlcpctl status`
//! shows the one bound) or `enabled = false`. A bind failure is logged as an
//! error and shown by `dlcpctl status`; the daemon runs on without metrics
//! (moving gradients matters more than exporting counters about it).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use dlcp_proto::endpoint::{PacketCount, RxDrops};

/// How often the event loop copies its counters into the metrics.
pub const UPDATE_EVERY: Duration = Duration::from_millis(250);

type Labels = Vec<(&'static str, String)>;
type Fraction = Gauge<f64, AtomicU64>;

/// What the event loop reports at each update (plain numbers, no references
/// into the service).
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Datagrams sent per class (protocol view).
    pub tx_packets: [u64; 8],
    /// Bytes sent per class.
    pub tx_bytes: [u64; 8],
    /// Authenticated datagrams received per class.
    pub rx_packets: [u64; 8],
    /// Bytes received per class.
    pub rx_bytes: [u64; 8],
    /// Datagrams sent per peer rank.
    pub tx_packets_peer: Vec<u64>,
    /// Authenticated datagrams received per peer rank.
    pub rx_packets_peer: Vec<u64>,
    /// Bytes sent per peer rank.
    pub tx_bytes_peer: Vec<u64>,
    /// Authenticated bytes received per peer rank.
    pub rx_bytes_peer: Vec<u64>,
    /// Received datagrams (and bytes) discarded on arrival, per class and per
    /// peer, each with an "unknown" bucket.
    pub rx_dropped: RxDrops,
    /// Per peer rank: heard from within the peer timeout (this rank: true).
    pub peer_up: Vec<bool>,
    /// Received datagrams dropped, by reason.
    pub dropped: Vec<(&'static str, u64)>,
    /// Repair DATA packets sent, per class.
    pub repairs_sent_per_class: [u64; 8],
    /// Repair DATA packets received, per class.
    pub repairs_received_per_class: [u64; 8],
    /// Bytes of repair DATA packets sent, per class.
    pub repair_bytes_sent_per_class: [u64; 8],
    /// Bytes of repair DATA packets received, per class.
    pub repair_bytes_received_per_class: [u64; 8],
    /// Repair DATA packets and bytes sent, per peer rank.
    pub repairs_sent_peer: Vec<PacketCount>,
    /// Repair DATA packets and bytes received, per peer rank.
    pub repairs_received_peer: Vec<PacketCount>,
    /// Repair DATA packets sent.
    pub repairs_sent: u64,
    /// Repair DATA packets received.
    pub repairs_received: u64,
    /// PROBEs sent.
    pub probes_sent: u64,
    /// Packet keys derived to check received tags.
    pub key_derivations: u64,
    /// Redundant PROBE copies received and ignored.
    pub probes_duplicate: u64,
    /// Receive deadlines that fired.
    pub deadlines_fired: u64,
    /// Receive transfers a deadline ended (within budget, NACKed once, still no PROBE).
    pub deadline_closes: u64,
    /// Deadlines that re-sent a BITMAP (NACK) to a quiet sender.
    pub deadline_nacks: u64,
    /// Ops failed by the hard timeout.
    pub hard_timeouts: u64,
    /// Ops started on the network.
    pub ops_started: u64,
    /// Ops completed.
    pub ops_completed: u64,
    /// Ops failed.
    pub ops_failed: u64,
    /// Ops in flight now.
    pub ops_in_flight: u64,
    /// Trainers attached now.
    pub trainers: u64,
    /// Submission ring entries waiting, summed over trainers.
    pub sq_used: u64,
    /// Completion ring entries not yet taken by trainers, summed.
    pub cq_used: u64,
    /// Ring capacity (entries) summed over trainers.
    pub ring_capacity: u64,
    /// Pacing rate in bytes per second (0 = unpaced).
    pub pacing_rate: u64,
    /// Datapath send errors, receive errors, would-blocks.
    pub datapath_errors: [(&'static str, u64); 3],
    /// Configuration reloads that applied / were rejected.
    pub reloads: (u64, u64),
}

/// The daemon's metrics (cheap to clone: every metric is shared).
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    class_tx_packets: Family<Labels, Counter>,
    class_tx_bytes: Family<Labels, Counter>,
    class_rx_packets: Family<Labels, Counter>,
    class_rx_bytes: Family<Labels, Counter>,
    peer_tx_packets: Family<Labels, Counter>,
    peer_rx_packets: Family<Labels, Counter>,
    peer_tx_bytes: Family<Labels, Counter>,
    peer_rx_bytes: Family<Labels, Counter>,
    class_dropped_packets: Family<Labels, Counter>,
    class_dropped_bytes: Family<Labels, Counter>,
    peer_dropped_packets: Family<Labels, Counter>,
    peer_dropped_bytes: Family<Labels, Counter>,
    peer_up: Family<Labels, Gauge>,
    peer_last: Family<Labels, Counter>,
    slowest_peer: Gauge,
    dropped: Family<Labels, Counter>,
    repairs: Family<Labels, Counter>,
    class_repairs: Family<Labels, Counter>,
    class_repair_bytes: Family<Labels, Counter>,
    peer_repairs: Family<Labels, Counter>,
    peer_repair_bytes: Family<Labels, Counter>,
    probes_sent: Counter,
    key_derivations: Counter,
    packet_auth: Family<Labels, Gauge>,
    probes_duplicate: Counter,
    deadlines_fired: Counter,
    deadline_closes: Counter,
    deadline_nacks: Counter,
    hard_timeouts: Counter,
    ops: Family<Labels, Counter>,
    ops_in_flight: Gauge,
    trainers: Gauge,
    ring_used: Family<Labels, Gauge>,
    ring_capacity: Gauge,
    pacing_rate: Gauge,
    datapath_errors: Family<Labels, Counter>,
    reloads: Family<Labels, Counter>,
    op_duration: Histogram,
    delivered: Histogram,
    last_delivered: Fraction,
    budget_violations: Counter,
    last_counts: Arc<std::sync::Mutex<Vec<u64>>>,
}

fn set(c: &Counter, v: u64) {
    let cur = c.get();
    if v > cur {
        c.inc_by(v - cur);
    }
}

fn l(k: &'static str, v: impl ToString) -> Labels {
    vec![(k, v.to_string())]
}

impl Metrics {
    /// All metrics, registered, for a daemon of `rank` in a job of `world`
    /// that authenticates datagrams with `packet_auth` (`security.packet_auth`).
    pub fn new(rank: u32, world: u32, datapath: &str, packet_auth: &str) -> Metrics {
        let mut r = Registry::with_prefix("dlcp");
        let m = Metrics {
            registry: Arc::new(Registry::default()),
            class_tx_packets: Family::default(),
            class_tx_bytes: Family::default(),
            class_rx_packets: Family::default(),
            class_rx_bytes: Family::default(),
            peer_tx_packets: Family::default(),
            peer_rx_packets: Family::default(),
            peer_tx_bytes: Family::default(),
            peer_rx_bytes: Family::default(),
            class_dropped_packets: Family::default(),
            class_dropped_bytes: Family::default(),
            peer_dropped_packets: Family::default(),
            peer_dropped_bytes: Family::default(),
            peer_up: Family::default(),
            peer_last: Family::default(),
            slowest_peer: Gauge::default(),
            dropped: Family::default(),
            repairs: Family::default(),
            class_repairs: Family::default(),
            class_repair_bytes: Family::default(),
            peer_repairs: Family::default(),
            peer_repair_bytes: Family::default(),
            probes_sent: Counter::default(),
            key_derivations: Counter::default(),
            packet_auth: Family::default(),
            probes_duplicate: Counter::default(),
            deadlines_fired: Counter::default(),
            deadline_closes: Counter::default(),
            deadline_nacks: Counter::default(),
            hard_timeouts: Counter::default(),
            ops: Family::default(),
            ops_in_flight: Gauge::default(),
            trainers: Gauge::default(),
            ring_used: Family::default(),
            ring_capacity: Gauge::default(),
            pacing_rate: Gauge::default(),
            datapath_errors: Family::default(),
            reloads: Family::default(),
            // 50 µs .. ~105 s.
            op_duration: Histogram::new(exponential_buckets(50e-6, 2.0, 22)),
            delivered: Histogram::new([0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999, 1.0]),
            last_delivered: Fraction::default(),
            budget_violations: Counter::default(),
            last_counts: Arc::new(std::sync::Mutex::new(vec![0; world as usize])),
        };
        r.register(
            "build",
            "dlcpd version, rank, world size and datapath",
            Info::new(vec![
                ("version", crate::VERSION.to_string()),
                ("rank", rank.to_string()),
                ("world", world.to_string()),
                ("datapath", datapath.to_string()),
            ]),
        );
        r.register("class_tx_packets", "Datagrams sent per priority class", m.class_tx_packets.clone());
        r.register("class_tx_bytes", "Bytes sent per priority class", m.class_tx_bytes.clone());
        r.register(
            "class_rx_packets",
            "Authenticated datagrams received per priority class",
            m.class_rx_packets.clone(),
        );
        r.register(
            "class_rx_bytes",
            "Authenticated bytes received per priority class",
            m.class_rx_bytes.clone(),
        );
        r.register("peer_tx_packets", "Datagrams sent per peer rank", m.peer_tx_packets.clone());
        r.register(
            "peer_rx_packets",
            "Authenticated datagrams received per peer rank",
            m.peer_rx_packets.clone(),
        );
        r.register("peer_tx_bytes", "Bytes sent per peer rank", m.peer_tx_bytes.clone());
        r.register("peer_rx_bytes", "Authenticated bytes received per peer rank", m.peer_rx_bytes.clone());
        r.register(
            "class_rx_dropped_packets",
            "Received datagrams discarded on arrival (any reason in rx_dropped but early_expired and \
             truncated), per class their unauthenticated header claims (\"unknown\": no readable header)",
            m.class_dropped_packets.clone(),
        );
        r.register(
            "class_rx_dropped_bytes",
            "Bytes of received datagrams discarded on arrival, per claimed class",
            m.class_dropped_bytes.clone(),
        );
        r.register(
            "peer_rx_dropped_packets",
            "Received datagrams discarded on arrival, per peer rank whose configured address sent them \
             (\"unknown\": any other address)",
            m.peer_dropped_packets.clone(),
        );
        r.register(
            "peer_rx_dropped_bytes",
            "Bytes of received datagrams discarded on arrival, per sending peer rank",
            m.peer_dropped_bytes.clone(),
        );
        r.register("peer_up", "1 if the peer was heard from within the peer timeout", m.peer_up.clone());
        r.register(
            "peer_last_arrival",
            "Ops in which this peer's reduce-scatter contribution was the last to complete here",
            m.peer_last.clone(),
        );
        r.register(
            "slowest_peer",
            "Rank whose contribution most often arrived last (-1 before any op)",
            m.slowest_peer.clone(),
        );
        r.register("rx_dropped", "Received datagrams dropped, by reason", m.dropped.clone());
        r.register("repairs", "Repair DATA packets, by direction", m.repairs.clone());
        r.register(
            "class_repairs",
            "Repair DATA packets per priority class, by direction",
            m.class_repairs.clone(),
        );
        r.register(
            "class_repair_bytes",
            "Bytes of repair DATA packets per priority class, by direction",
            m.class_repair_bytes.clone(),
        );
        r.register(
            "peer_repairs",
            "Repair DATA packets per peer rank, by direction (received: new chunks only)",
            m.peer_repairs.clone(),
        );
        r.register(
            "peer_repair_bytes",
            "Bytes of repair DATA packets per peer rank, by direction",
            m.peer_repair_bytes.clone(),
        );
        r.register(
            "probes_sent",
            "PROBEs sent (\"I have sent through chunk X\"; every copy counts)",
            m.probes_sent.clone(),
        );
        r.register(
            "probes_duplicate",
            "Redundant PROBE copies received (every PROBE is sent twice) and ignored",
            m.probes_duplicate.clone(),
        );
        r.register(
            "deadlines_fired",
            "Receive deadlines that fired (deadline_closes + deadline_nacks)",
            m.deadlines_fired.clone(),
        );
        r.register(
            "deadline_closes",
            "Receive transfers a deadline ended: within budget, NACKed once, and still no PROBE from the sender",
            m.deadline_closes.clone(),
        );
        r.register(
            "deadline_nacks",
            "Deadlines that re-sent the receiver's BITMAP (a NACK) to a sender gone quiet; the transfer goes on",
            m.deadline_nacks.clone(),
        );
        r.register("hard_timeouts", "Ops failed by the hard timeout", m.hard_timeouts.clone());
        r.register(
            "key_derivations",
            "Packet keys derived to check received tags (a few per peer incarnation; more means forged senders)",
            m.key_derivations.clone(),
        );
        r.register(
            "packet_auth",
            "1 for the packet authentication mode in force (security.packet_auth: aes-128-gmac or none)",
            m.packet_auth.clone(),
        );
        m.packet_auth.get_or_create(&l("mode", packet_auth)).set(1);
        r.register("ops", "Allreduce ops, by outcome", m.ops.clone());
        r.register("ops_in_flight", "Allreduce ops in flight", m.ops_in_flight.clone());
        r.register("trainers", "Trainers attached", m.trainers.clone());
        r.register(
            "shm_ring_used_entries",
            "Shared-memory ring entries in use, summed over trainers",
            m.ring_used.clone(),
        );
        r.register(
            "shm_ring_capacity_entries",
            "Entries of one ring, summed over trainers",
            m.ring_capacity.clone(),
        );
        r.register(
            "pacing_rate_bytes_per_second",
            "Current pacing rate (0 = unpaced)",
            m.pacing_rate.clone(),
        );
        r.register("datapath_errors", "Datapath errors and would-blocks, by kind", m.datapath_errors.clone());
        r.register("config_reloads", "Configuration reloads, by result", m.reloads.clone());
        r.register(
            "op_duration_seconds",
            "Allreduce op latency (first packet to result)",
            m.op_duration.clone(),
        );
        r.register(
            "op_delivered_fraction",
            "Least delivered fraction over an op's transfers",
            m.delivered.clone(),
        );
        r.register(
            "last_op_delivered_fraction",
            "Least delivered fraction of the last completed op",
            m.last_delivered.clone(),
        );
        r.register(
            "loss_budget_violations",
            "Completed ops that delivered less than their loss budget allows",
            m.budget_violations.clone(),
        );
        m.slowest_peer.set(-1);
        for p in 0..world {
            let _ = m.peer_last.get_or_create(&l("peer", p));
        }
        Metrics { registry: Arc::new(r), ..m }
    }

    /// Copy the loop's counters in (see [`Sample`]).
    pub fn update(&self, s: &Sample) {
        for c in 0..8 {
            let k = l("class", c);
            set(&self.class_tx_packets.get_or_create(&k), s.tx_packets[c]);
            set(&self.class_tx_bytes.get_or_create(&k), s.tx_bytes[c]);
            set(&self.class_rx_packets.get_or_create(&k), s.rx_packets[c]);
            set(&self.class_rx_bytes.get_or_create(&k), s.rx_bytes[c]);
        }
        for (p, v) in s.tx_packets_peer.iter().enumerate() {
            set(&self.peer_tx_packets.get_or_create(&l("peer", p)), *v);
        }
        for (p, v) in s.rx_packets_peer.iter().enumerate() {
            set(&self.peer_rx_packets.get_or_create(&l("peer", p)), *v);
        }
        for (p, v) in s.tx_bytes_peer.iter().enumerate() {
            set(&self.peer_tx_bytes.get_or_create(&l("peer", p)), *v);
        }
        for (p, v) in s.rx_bytes_peer.iter().enumerate() {
            set(&self.peer_rx_bytes.get_or_create(&l("peer", p)), *v);
        }
        let d = &s.rx_dropped;
        let classes = d.class.iter().enumerate().map(|(c, n)| (c.to_string(), n));
        for (c, n) in classes.chain([("unknown".to_string(), &d.unknown_class)]) {
            self.set_count(&self.class_dropped_packets, &self.class_dropped_bytes, l("class", c), n);
        }
        let peers = d.peer.iter().enumerate().map(|(p, n)| (p.to_string(), n));
        for (p, n) in peers.chain([("unknown".to_string(), &d.unknown_peer)]) {
            self.set_count(&self.peer_dropped_packets, &self.peer_dropped_bytes, l("peer", p), n);
        }
        for (p, up) in s.peer_up.iter().enumerate() {
            self.peer_up.get_or_create(&l("peer", p)).set(i64::from(*up));
        }
        for (reason, v) in &s.dropped {
            set(&self.dropped.get_or_create(&l("reason", reason)), *v);
        }
        for c in 0..8 {
            let k = |dir: &str| vec![("class", c.to_string()), ("direction", dir.to_string())];
            set(&self.class_repairs.get_or_create(&k("sent")), s.repairs_sent_per_class[c]);
            set(&self.class_repairs.get_or_create(&k("received")), s.repairs_received_per_class[c]);
            set(&self.class_repair_bytes.get_or_create(&k("sent")), s.repair_bytes_sent_per_class[c]);
            set(&self.class_repair_bytes.get_or_create(&k("received")), s.repair_bytes_received_per_class[c]);
        }
        for (dir, v) in [("sent", &s.repairs_sent_peer), ("received", &s.repairs_received_peer)] {
            for (p, n) in v.iter().enumerate() {
                let k = vec![("peer", p.to_string()), ("direction", dir.to_string())];
                self.set_count(&self.peer_repairs, &self.peer_repair_bytes, k, n);
            }
        }
        set(&self.repairs.get_or_create(&l("direction", "sent")), s.repairs_sent);
        set(&self.repairs.get_or_create(&l("direction", "received")), s.repairs_received);
        set(&self.probes_sent, s.probes_sent);
        set(&self.key_derivations, s.key_derivations);
        set(&self.probes_duplicate, s.probes_duplicate);
        set(&self.deadlines_fired, s.deadlines_fired);
        set(&self.deadline_closes, s.deadline_closes);
        set(&self.deadline_nacks, s.deadline_nacks);
        set(&self.hard_timeouts, s.hard_timeouts);
        set(&self.ops.get_or_create(&l("outcome", "started")), s.ops_started);
        set(&self.ops.get_or_create(&l("outcome", "completed")), s.ops_completed);
        set(&self.ops.get_or_create(&l("outcome", "failed")), s.ops_failed);
        self.ops_in_flight.set(s.ops_in_flight as i64);
        self.trainers.set(s.trainers as i64);
        self.ring_used.get_or_create(&l("ring", "submission")).set(s.sq_used as i64);
        self.ring_used.get_or_create(&l("ring", "completion")).set(s.cq_used as i64);
        self.ring_capacity.set(s.ring_capacity as i64);
        self.pacing_rate.set(i64::try_from(s.pacing_rate).unwrap_or(i64::MAX));
        for (kind, v) in s.datapath_errors {
            set(&self.datapath_errors.get_or_create(&l("kind", kind)), v);
        }
        set(&self.reloads.get_or_create(&l("result", "ok")), s.reloads.0);
        set(&self.reloads.get_or_create(&l("result", "failed")), s.reloads.1);
    }

    fn set_count(
        &self,
        packets: &Family<Labels, Counter>,
        bytes: &Family<Labels, Counter>,
        k: Labels,
        n: &PacketCount,
    ) {
        set(&packets.get_or_create(&k), n.packets);
        set(&bytes.get_or_create(&k), n.bytes);
    }

    /// Record a completed op: its latency, least delivered fraction, whether
    /// that broke its budget (`budget_ppm`), and the peer whose reduce-scatter
    /// contribution completed last here (`None` if it had none).
    pub fn op_completed(
        &self,
        duration: Duration,
        min_delivered: f64,
        budget_ppm: u32,
        last_peer: Option<u32>,
    ) {
        self.op_duration.observe(duration.as_secs_f64());
        self.delivered.observe(min_delivered);
        self.last_delivered.set(min_delivered);
        // A transfer may give up floor(n * budget) chunks, so delivered >= 1 - budget.
        if min_delivered + 1e-9 < 1.0 - f64::from(budget_ppm) / 1e6 {
            self.budget_violations.inc();
        }
        if let Some(p) = last_peer {
            self.peer_last.get_or_create(&l("peer", p)).inc();
            let mut counts = self.last_counts.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = counts.get_mut(p as usize) {
                *c += 1;
            }
            if let Some((rank, _)) =
                counts.iter().enumerate().max_by_key(|&(r, c)| (*c, std::cmp::Reverse(r)))
            {
                self.slowest_peer.set(rank as i64);
            }
        }
    }

    /// The exposition text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_text::encode(&mut out, &self.registry) {
            out = format!("# encoding failed: {e}\n");
        }
        out
    }
}

/// The HTTP endpoint: a thread answering `GET /metrics`.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Bind `addr` (port 0: any free port) and serve `metrics` from a thread.
    pub fn start(addr: SocketAddr, metrics: Metrics) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new().name("dlcpd-metrics".into()).spawn(move || {
            for conn in listener.incoming() {
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                match conn {
                    Ok(s) => {
                        if let Err(e) = serve(s, &metrics) {
                            log::debug!("metrics: {e}");
                        }
                    }
                    Err(e) => {
                        log::warn!("metrics accept: {e}");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        })?;
        Ok(MetricsServer { addr, stop, thread: Some(thread) })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One request: `GET /metrics` (or `/`) gets the exposition, anything else a 404/405.
fn serve(mut s: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16 * 1024 {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&req);
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (status, ctype, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET" | "HEAD", "/metrics" | "/") => ("200 OK", prometheus_text::CONTENT_TYPE, metrics.encode()),
        ("GET" | "HEAD", _) => ("404 Not Found", "text/plain", "not found: try /metrics\n".to_owned()),
        _ => ("405 Method Not Allowed", "text/plain", "only GET\n".to_owned()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    if method != "HEAD" {
        s.write_all(body.as_bytes())?;
    }
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_set_from_samples_and_slowest_peer() {
        let m = Metrics::new(0, 3, "socket", "none");
        let s = Sample {
            tx_packets: [1, 2, 3, 4, 5, 6, 7, 8],
            repairs_sent_per_class: [0, 3, 0, 0, 0, 0, 0, 0],
            peer_up: vec![true, true, false],
            rx_dropped: RxDrops {
                unknown_class: PacketCount { packets: 2, bytes: 90 },
                peer: vec![PacketCount::default(); 3],
                unknown_peer: PacketCount { packets: 2, bytes: 90 },
                ..RxDrops::default()
            },
            ..Sample::default()
        };
        m.update(&s);
        m.update(&s); // idempotent
        m.op_completed(Duration::from_millis(3), 0.995, 10_000, Some(2));
        m.op_completed(Duration::from_millis(3), 0.98, 10_000, Some(1));
        m.op_completed(Duration::from_millis(3), 1.0, 0, Some(2));
        let t = m.encode();
        assert!(t.contains("dlcp_class_tx_packets_total{class=\"7\"} 8\n"), "{t}");
        assert!(t.contains("dlcp_peer_up{peer=\"2\"} 0\n"), "{t}");
        assert!(t.contains("dlcp_class_repairs_total{class=\"1\",direction=\"sent\"} 3\n"), "{t}");
        assert!(t.contains("dlcp_slowest_peer 2\n"), "{t}");
        assert!(t.contains("dlcp_peer_last_arrival_total{peer=\"0\"} 0\n"), "{t}");
        assert!(t.contains("dlcp_loss_budget_violations_total 1\n"), "{t}");
        assert!(t.contains("dlcp_op_duration_seconds_count 3\n"), "{t}");
        assert!(t.contains("dlcp_peer_rx_dropped_packets_total{peer=\"unknown\"} 2\n"), "{t}");
        assert!(t.contains("dlcp_class_rx_dropped_bytes_total{class=\"unknown\"} 90\n"), "{t}");
        assert!(t.contains("dlcp_peer_rx_dropped_bytes_total{peer=\"2\"} 0\n"), "{t}");
        assert!(t.contains("dlcp_class_rx_dropped_packets_total{class=\"7\"} 0\n"), "{t}");
        assert!(t.contains("dlcp_packet_auth{mode=\"none\"} 1\n"), "{t}");
        assert!(!t.contains("mode=\"aes-128-gmac\""), "{t}");
    }

    #[test]
    fn serves_http() {
        let m = Metrics::new(0, 1, "socket", "aes-128-gmac");
        let srv = MetricsServer::start("127.0.0.1:0".parse().unwrap(), m).unwrap();
        let get = |req: &str| {
            let mut s = TcpStream::connect(srv.local_addr()).unwrap();
            s.write_all(req.as_bytes()).unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        let ok = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.contains("dlcp_build_info{"), "{ok}");
        assert!(get("GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        drop(srv);
    }
}
