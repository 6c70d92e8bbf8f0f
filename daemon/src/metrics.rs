//! Prometheus metrics: `GET /metrics` on `[metrics] address` (default
//! `127.0.0.1:9464`), in the Prometheus text format (0.0.4).
//!
//! The metrics are `prometheus-client` counters, gauges and histograms. The
//! event loop owns the numbers: every [`UPDATE_EVERY`] it copies its counters
//! into the metrics ([`Metrics::update`], a few hundred atomic stores), and on
//! each finished op it records the op's latency, delivered fraction and which
//! peer's contribution arrived last ([`Metrics::op_completed`]). Threads of
//! their own serve HTTP ([`MetricsServer`]): they only read the metrics, so a
//! slow scraper never holds up the datapath (the loop's counters can be up to
//! [`UPDATE_EVERY`] old in a scrape), and several scrapes run at once, each
//! bounded by a whole-request deadline, so a slow one never holds up another.
//!
//! Port collisions: several daemons on one host (tests, `dlcpd demo`) must not
//! share an address: give each `127.0.0.1:0` (any free port; `dlcpctl status`
//! shows the one bound) or `enabled = false`. A bind failure is logged as an
//! error and shown by `dlcpctl status`; the daemon runs on without metrics
//! (moving gradients matters more than exporting counters about it).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use std::collections::HashMap;

use dlcp_proto::stats::{Desc, Kind, Label};

/// How often the event loop copies its counters into the metrics.
pub const UPDATE_EVERY: Duration = Duration::from_millis(250);

type Labels = Vec<(&'static str, String)>;
type Fraction = Gauge<f64, AtomicU64>;

/// Walks every counter of the daemon with its description (the service's
/// `View::visit_counters`, without the JSON section): what [`Metrics::new`]
/// registers and [`Metrics::update`] copies. A counter whose description has
/// a metric name is exported under `dlcp_<name>` (`_total` for counters) with
/// its fixed labels and its class, peer or reason label.
pub type EachCounter<'a> = &'a dyn Fn(&mut dyn FnMut(&'static Desc, Label, u64));

/// The daemon's metrics (cheap to clone: every metric is shared).
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Counter families by metric name, from the counters' descriptions.
    counters: Arc<HashMap<&'static str, Family<Labels, Counter>>>,
    /// Gauge families by metric name, likewise.
    gauges: Arc<HashMap<&'static str, Family<Labels, Gauge>>>,
    peer_last: Family<Labels, Counter>,
    slowest_peer: Gauge,
    op_duration: Histogram,
    delivered: Histogram,
    last_delivered: Fraction,
    budget_violations: Counter,
    last_counts: Arc<std::sync::Mutex<Vec<u64>>>,
    /// This daemon's rank (not exported as its own peer).
    rank: u32,
}

/// Whether value `label` of counter `d` is exported by the daemon of `rank`:
/// all are but `dlcp_peer_up{peer=<rank>}` (a daemon is not its own peer, so
/// `sum(dlcp_peer_up)` counts the peers up).
fn exported(d: &Desc, label: Label, rank: u32) -> bool {
    !(d.metric == Some("peer_up") && label == Label::Peer(Some(rank)))
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

/// The labels of one value: its class, peer, reason or path, then the
/// description's fixed ones.
fn labels(d: &Desc, label: Label) -> Labels {
    let unknown = || "unknown".to_owned();
    let mut out: Labels = match label {
        Label::Class(c) => vec![("class", c.map_or_else(unknown, |c| c.to_string()))],
        Label::Peer(p) => vec![("peer", p.map_or_else(unknown, |p| p.to_string()))],
        Label::Reason(r) => vec![("reason", r.to_owned())],
        Label::Path(p) => vec![("path", p.to_string())],
        Label::None => Vec::new(),
    };
    out.extend(d.fixed.iter().map(|&(k, v)| (k, v.to_owned())));
    out
}

impl Metrics {
    /// Every metric, registered, for a daemon of `rank` in a job of `world`
    /// that authenticates datagrams with `packet_auth` (`security.packet_auth`):
    /// one family per metric name among the counters `each` walks, the op
    /// metrics of [`Metrics::op_completed`], and `dlcp_packet_auth{mode}`.
    pub fn new(rank: u32, world: u32, datapath: &str, packet_auth: &str, each: EachCounter<'_>) -> Metrics {
        let mut r = Registry::with_prefix("dlcp");
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
        let auth: Family<Labels, Gauge> = Family::default();
        r.register(
            "packet_auth",
            "1 for the packet authentication mode in force (security.packet_auth: aes-128-gmac or none)",
            auth.clone(),
        );
        auth.get_or_create(&l("mode", packet_auth)).set(1);
        let mut counters = HashMap::new();
        let mut gauges = HashMap::new();
        each(&mut |d, label, _| {
            let Some(name) = d.metric.filter(|_| exported(d, label, rank)) else { return };
            let key = labels(d, label);
            match d.kind {
                Kind::Counter => {
                    let f: &mut Family<Labels, Counter> = counters.entry(name).or_insert_with(|| {
                        let f = Family::default();
                        r.register(name, d.help, f.clone());
                        f
                    });
                    let _ = f.get_or_create(&key);
                }
                Kind::Gauge => {
                    let f: &mut Family<Labels, Gauge> = gauges.entry(name).or_insert_with(|| {
                        let f = Family::default();
                        r.register(name, d.help, f.clone());
                        f
                    });
                    let _ = f.get_or_create(&key);
                }
            }
        });
        let m = Metrics {
            registry: Arc::new(Registry::default()),
            counters: Arc::new(counters),
            gauges: Arc::new(gauges),
            peer_last: Family::default(),
            slowest_peer: Gauge::default(),
            // 50 µs .. ~105 s.
            op_duration: Histogram::new(exponential_buckets(50e-6, 2.0, 22)),
            delivered: Histogram::new([0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999, 1.0]),
            last_delivered: Fraction::default(),
            budget_violations: Counter::default(),
            last_counts: Arc::new(std::sync::Mutex::new(vec![0; world as usize])),
            rank,
        };
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

    /// Copy the loop's counters in: every value `each` walks goes to its
    /// metric (a counter only ever grows; a value of a metric registered at
    /// start is set, any other is skipped).
    pub fn update(&self, each: EachCounter<'_>) {
        each(&mut |d, label, v| {
            let Some(name) = d.metric.filter(|_| exported(d, label, self.rank)) else { return };
            match d.kind {
                Kind::Counter => {
                    if let Some(f) = self.counters.get(name) {
                        set(&f.get_or_create(&labels(d, label)), v);
                    }
                }
                Kind::Gauge => {
                    if let Some(f) = self.gauges.get(name) {
                        f.get_or_create(&labels(d, label)).set(i64::try_from(v).unwrap_or(i64::MAX));
                    }
                }
            }
        });
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

/// Scrapes served at once; one more is answered `503` and closed at once.
pub const MAX_CLIENTS: usize = 8;
/// The whole exchange of one scrape (request in, response out) must fit in
/// this; a client still sending or reading after it is cut off.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// How long turning a client away may take (see [`MetricsServer`]).
const BUSY_WAIT: Duration = Duration::from_millis(50);

/// The HTTP endpoint: an accepting thread and one thread per scrape, at most
/// [`MAX_CLIENTS`] at once, each bounded by [`REQUEST_DEADLINE`]. A client that
/// connects and sends nothing (or trickles) holds one of them until the
/// deadline, never the others.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Bind `addr` (port 0: any free port) and serve `metrics` from threads.
    pub fn start(addr: SocketAddr, metrics: Metrics) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let active = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new().name("dlcpd-metrics".into()).spawn(move || {
            for conn in listener.incoming() {
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                match conn {
                    Ok(s) => admit(s, &metrics, &active),
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
        // Wake the blocking accept. (Scrapes in progress end by their deadline.)
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serve `s` on a thread of its own, or answer `503` at once if
/// [`MAX_CLIENTS`] are being served.
fn admit(s: TcpStream, metrics: &Metrics, active: &Arc<AtomicUsize>) {
    if active.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
        active.fetch_sub(1, Ordering::AcqRel);
        // Answer, then take the request off the socket (waiting 50 ms at most)
        // so that closing it sends the answer and a FIN, not a reset.
        let _ = s.set_write_timeout(Some(BUSY_WAIT));
        let _ = s.set_read_timeout(Some(BUSY_WAIT));
        let _ = (&s).write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\nConnection: close\r\n\r\n",
        );
        let _ = s.shutdown(std::net::Shutdown::Write);
        let _ = (&s).read(&mut [0u8; 1024]);
        log::debug!("metrics: {MAX_CLIENTS} scrapes in progress; one more turned away");
        return;
    }
    let (m, left) = (metrics.clone(), active.clone());
    let spawned = std::thread::Builder::new().name("dlcpd-scrape".into()).spawn(move || {
        if let Err(e) = serve(s, &m, Instant::now() + REQUEST_DEADLINE) {
            log::debug!("metrics: {e}");
        }
        left.fetch_sub(1, Ordering::AcqRel);
    });
    if let Err(e) = spawned {
        active.fetch_sub(1, Ordering::AcqRel);
        log::warn!("metrics: cannot start a thread for a scrape: {e}");
    }
}

/// The time left until `deadline`, as a socket timeout (an error once it passed).
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "scrape deadline passed"));
    }
    Ok(d)
}

/// Write `bytes`, every write bounded by what is left until `deadline`.
fn write_by(s: &mut TcpStream, mut bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    while !bytes.is_empty() {
        s.set_write_timeout(Some(left(deadline)?))?;
        match s.write(bytes) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What a scrape request asks for. (Public only for the fuzz targets in `fuzz/`.)
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `GET` or `HEAD` of `/metrics` or `/` (any query): the exposition.
    Metrics,
    /// `GET` or `HEAD` of another path: 404.
    NotFound,
    /// Another method: 405.
    NotAllowed,
}

/// Route a request from the bytes read of it (request line first, any bytes,
/// not necessarily UTF-8); the flag is true for `HEAD` (no body in the answer).
/// (Public only for the fuzz targets in `fuzz/`.)
#[doc(hidden)]
pub fn route(req: &[u8]) -> (Route, bool) {
    let line = String::from_utf8_lossy(req);
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let route = match (method, path.split('?').next().unwrap_or("")) {
        ("GET" | "HEAD", "/metrics" | "/") => Route::Metrics,
        ("GET" | "HEAD", _) => Route::NotFound,
        _ => Route::NotAllowed,
    };
    (route, method == "HEAD")
}

/// One request: `GET /metrics` (or `/`) gets the exposition, anything else a
/// 404/405; all of it, reading and writing, before `deadline`.
fn serve(mut s: TcpStream, metrics: &Metrics, deadline: Instant) -> std::io::Result<()> {
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16 * 1024 {
        s.set_read_timeout(Some(left(deadline)?))?;
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let (route, head) = route(&req);
    let (status, ctype, body) = match route {
        Route::Metrics => ("200 OK", prometheus_text::CONTENT_TYPE, metrics.encode()),
        Route::NotFound => ("404 Not Found", "text/plain", "not found: try /metrics\n".to_owned()),
        Route::NotAllowed => ("405 Method Not Allowed", "text/plain", "only GET\n".to_owned()),
    };
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    write_by(&mut s, header.as_bytes(), deadline)?;
    if !head {
        write_by(&mut s, body.as_bytes(), deadline)?;
    }
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    use dlcp_proto::endpoint::{PacketCount, Stats};

    /// A daemon's tables as the service walks them: the protocol's counters
    /// and one daemon-side table of the same kind.
    fn walk(
        s: &Stats,
        d: &crate::datapath::DatapathStats,
    ) -> impl Fn(&mut dyn FnMut(&'static Desc, Label, u64)) {
        let (s, d) = (s.clone(), d.clone());
        move |f: &mut dyn FnMut(&'static Desc, Label, u64)| {
            s.visit(&mut |a, b, c| f(a, b, c));
            d.visit(&mut |a, b, c| f(a, b, c));
        }
    }

    #[test]
    fn every_value_is_exported_under_its_description_and_slowest_peer() {
        let mut s = Stats::new(3);
        let d = crate::datapath::DatapathStats { rx_rcvbuf_drops: 4, tx_errors: 2, ..Default::default() };
        let m = Metrics::new(0, 3, "socket", "none", &walk(&s, &d));
        s.tx_packets = [1, 2, 3, 4, 5, 6, 7, 8];
        s.repairs_sent_per_class[1] = 3;
        s.rx_dropped.unknown_class = PacketCount { packets: 2, bytes: 90 };
        s.rx_dropped.unknown_peer = PacketCount { packets: 2, bytes: 90 };
        s.rejected.bad_tag = 6;
        m.update(&walk(&s, &d));
        m.update(&walk(&s, &d)); // idempotent
        m.op_completed(Duration::from_millis(3), 0.995, 10_000, Some(2));
        m.op_completed(Duration::from_millis(3), 0.98, 10_000, Some(1));
        m.op_completed(Duration::from_millis(3), 1.0, 0, Some(2));
        let t = m.encode();
        assert!(t.contains("dlcp_class_tx_packets_total{class=\"7\"} 8\n"), "{t}");
        assert!(t.contains("dlcp_class_repairs_total{class=\"1\",direction=\"sent\"} 3\n"), "{t}");
        assert!(t.contains("dlcp_slowest_peer 2\n"), "{t}");
        assert!(t.contains("dlcp_peer_last_arrival_total{peer=\"0\"} 0\n"), "{t}");
        assert!(t.contains("dlcp_loss_budget_violations_total 1\n"), "{t}");
        assert!(t.contains("dlcp_op_duration_seconds_count 3\n"), "{t}");
        assert!(t.contains("dlcp_peer_rx_dropped_packets_total{peer=\"unknown\"} 2\n"), "{t}");
        assert!(t.contains("dlcp_class_rx_dropped_bytes_total{class=\"unknown\"} 90\n"), "{t}");
        assert!(t.contains("dlcp_peer_rx_dropped_bytes_total{peer=\"2\"} 0\n"), "{t}");
        assert!(t.contains("dlcp_class_rx_dropped_packets_total{class=\"7\"} 0\n"), "{t}");
        assert!(t.contains("dlcp_rx_dropped_total{reason=\"bad_tag\"} 6\n"), "{t}");
        assert!(t.contains("dlcp_rx_dropped_total{reason=\"socket_buffer\"} 4\n"), "{t}");
        assert!(t.contains("dlcp_datapath_errors_total{kind=\"tx\"} 2\n"), "{t}");
        assert!(t.contains("dlcp_packet_auth{mode=\"none\"} 1\n"), "{t}");
        assert!(!t.contains("mode=\"aes-128-gmac\""), "{t}");
        // Every exported value of the tables is in the exposition, with its help.
        walk(&s, &d)(&mut |desc, label, v| {
            let Some(name) = desc.metric else { return };
            let suffix = if desc.kind == Kind::Counter { "_total" } else { "" };
            let key = labels(desc, label);
            let rendered = key.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect::<Vec<_>>().join(",");
            let line = if rendered.is_empty() {
                format!("dlcp_{name}{suffix} {v}\n")
            } else {
                format!("dlcp_{name}{suffix}{{{rendered}}} {v}\n")
            };
            assert!(t.contains(&line), "missing {line:?} in {t}");
            assert!(t.contains(&format!("# HELP dlcp_{name}{suffix} ")), "no help for {name}");
        });
    }

    #[test]
    fn serves_http() {
        let each = |_: &mut dyn FnMut(&'static Desc, Label, u64)| {};
        let m = Metrics::new(0, 1, "socket", "aes-128-gmac", &each);
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

    #[test]
    fn silent_clients_hold_no_scrape_up_are_capped_and_cut_off_at_the_deadline() {
        let m =
            Metrics::new(0, 1, "socket", "aes-128-gmac", &|_: &mut dyn FnMut(&'static Desc, Label, u64)| {});
        let srv = MetricsServer::start("127.0.0.1:0".parse().unwrap(), m).unwrap();
        let get = || {
            let mut s = TcpStream::connect(srv.local_addr()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        // Clients that connect and say nothing, all but one of the places.
        let started = Instant::now();
        let silent: Vec<TcpStream> =
            (0..MAX_CLIENTS - 1).map(|_| TcpStream::connect(srv.local_addr()).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(200));
        let t0 = Instant::now();
        assert!(get().starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(t0.elapsed() < Duration::from_secs(2), "a scrape waited {:?}", t0.elapsed());
        // All places taken (once the scrape's thread has given its place
        // back, a moment after its client saw the end): one more is told so at once.
        std::thread::sleep(Duration::from_millis(200));
        let _last = TcpStream::connect(srv.local_addr()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let t0 = Instant::now();
        let busy = get();
        assert!(busy.starts_with("HTTP/1.1 503"), "{busy:?}");
        assert!(t0.elapsed() < Duration::from_secs(2));
        // The silent ones are cut off at the whole-request deadline.
        let mut first = &silent[0];
        first.set_read_timeout(Some(REQUEST_DEADLINE * 2)).unwrap();
        let mut b = [0u8; 16];
        assert_eq!(first.read(&mut b).unwrap(), 0, "closed by the server");
        let held = started.elapsed();
        assert!(held >= REQUEST_DEADLINE - Duration::from_millis(500), "{held:?}");
        assert!(held < REQUEST_DEADLINE + Duration::from_secs(2), "{held:?}");
        // And then there is room again.
        std::thread::sleep(Duration::from_millis(500));
        assert!(get().starts_with("HTTP/1.1 200 OK\r\n"));
    }
}
