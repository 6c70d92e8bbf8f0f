//! Tests of the deterministic network simulator (`dlcp_proto::sim`) with a toy node
//! that sends pre-planned DATA datagrams and records what it receives.

use std::collections::VecDeque;

use dlcp_proto::class::Class;
use dlcp_proto::endpoint::Transmit;
use dlcp_proto::sim::{ChunkKey, NetConfig, NetStats, Node, PathConfig, Sim, TraceEvent};
use dlcp_proto::time::{Duration, Instant};
use dlcp_proto::wire::{self, Header, JobKey, PacketType, Phase, WireError};

const SECRET: &[u8] = b"sim_net test secret";
/// 1108 payload + 100 wire overhead = 1208 bytes; + 42 framing = 1250 bytes = 1 µs at 10 Gbit/s.
const PAYLOAD: usize = 1208 - wire::OVERHEAD;

fn cls(c: u8) -> Class {
    Class::new(c).unwrap()
}

fn ns(n: u64) -> Instant {
    Instant::from_nanos(n)
}

/// One planned DATA datagram.
#[derive(Debug, Clone, Copy)]
struct Plan {
    dst: u32,
    class: Class,
    chunk: u32,
    count: u32,
}

/// What a toy node observed, in order.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Rx { at: Instant, hdr: Result<Header, WireError> },
    Timer { at: Instant },
}

struct Toy {
    rank: u32,
    key: JobKey,
    out: VecDeque<Plan>,
    /// Minimum spacing between sends (0 = back to back).
    gap: Duration,
    next_send: Instant,
    /// Pending timer deadlines, ascending.
    timers: Vec<Instant>,
    verify: bool,
    /// Report a send deadline of "now" (epoch) whenever data is queued, like a
    /// paced endpoint whose next send is due while its NIC is busy.
    eager: bool,
    seen: Vec<Seen>,
    rx_ok: u64,
    rx_bad: u64,
    polls: u64,
}

impl Toy {
    fn new(rank: u32) -> Toy {
        Toy {
            rank,
            key: JobKey::new(SECRET),
            out: VecDeque::new(),
            gap: Duration::ZERO,
            next_send: Instant::ZERO,
            timers: Vec::new(),
            verify: true,
            eager: false,
            seen: Vec::new(),
            rx_ok: 0,
            rx_bad: 0,
            polls: 0,
        }
    }

    /// `k` chunks to every other rank of `n`, round-robin over destinations, with
    /// class `class(dst, i)`.
    fn all_to_all(rank: u32, n: u32, k: u32, class: impl Fn(u32, u32) -> u8) -> Toy {
        let mut t = Toy::new(rank);
        for i in 0..k {
            for dst in (0..n).filter(|&d| d != rank) {
                t.out.push_back(Plan { dst, class: cls(class(dst, i)), chunk: i, count: k });
            }
        }
        t
    }

    fn received(&self) -> impl Iterator<Item = (Instant, &Header)> {
        self.seen.iter().filter_map(|s| match s {
            Seen::Rx { at, hdr: Ok(h) } => Some((*at, h)),
            _ => None,
        })
    }

    fn timer_times(&self) -> Vec<Instant> {
        self.seen.iter().filter_map(|s| if let Seen::Timer { at } = s { Some(*at) } else { None }).collect()
    }
}

impl Node for Toy {
    fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        if !self.verify {
            self.rx_ok += 1;
            return;
        }
        let hdr = wire::decode(&self.key, datagram).map(|(h, _)| h);
        if hdr.is_ok() {
            self.rx_ok += 1;
        } else {
            self.rx_bad += 1;
        }
        self.seen.push(Seen::Rx { at: now, hdr });
    }

    fn handle_timeout(&mut self, now: Instant) {
        while self.timers.first().is_some_and(|&t| t <= now) {
            let t = self.timers.remove(0);
            assert!(t <= now, "timer for {t:?} fired early at {now:?}");
            self.seen.push(Seen::Timer { at: now });
        }
    }

    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.polls += 1;
        if now < self.next_send {
            return None;
        }
        let p = self.out.pop_front()?;
        let mut h = Header::new(PacketType::Data, p.class, Phase::Scatter);
        h.job = 1;
        h.src = self.rank;
        h.dst = p.dst;
        h.op = 3;
        h.tensor = 4;
        h.chunk_index = p.chunk;
        h.chunk_count = p.count;
        h.payload_len = PAYLOAD as u16;
        let len = wire::encode_in_place(&self.key, &h, buf, |b| b.fill(p.chunk as u8)).unwrap();
        self.next_send = now + self.gap;
        Some(Transmit { dst: p.dst, len, class: p.class, path: 0 })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if self.eager && !self.out.is_empty() {
            return Some(Instant::ZERO);
        }
        let pacing = (!self.out.is_empty() && self.gap > Duration::ZERO).then_some(self.next_send);
        match (self.timers.first().copied(), pacing) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

fn key(src: u32, chunk: u32) -> ChunkKey {
    ChunkKey { op: 3, tensor: 4, phase: Phase::Scatter, src, chunk }
}

fn run_idle<N: Node>(sim: &mut Sim<N>) {
    let done = sim.run_until(Instant::MAX, |_| false);
    assert!(!done);
    assert_eq!(sim.next_event_time(), None);
}

// ---------------------------------------------------------------------------

#[test]
fn clean_two_node_timing_is_exact() {
    let mut a = Toy::new(0);
    for i in 0..3 {
        a.out.push_back(Plan { dst: 1, class: cls(2), chunk: i, count: 3 });
    }
    let mut sim = Sim::new(NetConfig::default(), vec![a, Toy::new(1)]);
    run_idle(&mut sim);
    // Uplink: 1 µs per packet, back to back; +5 µs to the switch; the egress port
    // serializes each in 1 µs (the second arrives exactly as the first leaves);
    // +5 µs to the receiver.
    let want = [ns(12_000), ns(13_000), ns(14_000)];
    let got: Vec<Instant> = sim.node(1).received().map(|(t, _)| t).collect();
    assert_eq!(got, want);
    for (i, &t) in want.iter().enumerate() {
        assert_eq!(sim.log().first_delivery(1, &key(0, i as u32)), Some(t));
    }
    assert_eq!(
        sim.log().transfer(1, 3, 4, Phase::Scatter, 0).collect::<Vec<_>>(),
        [(0, want[0]), (1, want[1]), (2, want[2])]
    );
    assert_eq!(sim.log().len(), 3);
    assert_eq!(sim.log().count_to(0), 0);
    let s = sim.stats();
    assert_eq!(s.offered[2], 3);
    assert_eq!(s.delivered[2], 3);
    assert_eq!(s.offered_bytes, 3 * 1208);
    assert_eq!(s.delivered_bytes, 3 * 1208);
    assert_eq!(NetStats::total(&s.switch_drops) + NetStats::total(&s.lost), 0);
    assert_eq!(s.ports[1].arrivals[2], 3);
    assert_eq!(s.ports[1].max_queue, 0);
    assert_eq!(sim.now(), ns(14_000));
}

#[test]
fn bottleneck_port_and_propagation_timing_is_exact() {
    let mut a = Toy::new(0);
    for i in 0..3 {
        a.out.push_back(Plan { dst: 1, class: cls(2), chunk: i, count: 3 });
    }
    let cfg = NetConfig::default().with_port_rate(1, 5_000_000_000).with_prop_delay(Duration::from_micros(2));
    let mut sim = Sim::new(cfg, vec![a, Toy::new(1)]);
    run_idle(&mut sim);
    // Switch arrivals at 3, 4, 5 µs; the port takes 2 µs each: done at 5, 7, 9 µs; +2 µs.
    let got: Vec<Instant> = sim.node(1).received().map(|(t, _)| t).collect();
    assert_eq!(got, [ns(7_000), ns(9_000), ns(11_000)]);
    assert_eq!(sim.stats().ports[1].max_queue, 1);
}

/// A mesh with every fault enabled and a congested port.
fn faulty_mesh(cfg: NetConfig) -> Sim<Toy> {
    let n = 6;
    let nodes = (0..n).map(|r| Toy::all_to_all(r, n, 200, |dst, i| ((dst + i * 3 + r) % 7) as u8)).collect();
    let cfg = cfg.with_port_rate(2, 2_000_000_000).with_queue(8);
    let mut sim = Sim::new(cfg, nodes);
    run_idle(&mut sim);
    sim
}

fn faults(seed: u64) -> NetConfig {
    NetConfig::default()
        .with_seed(seed)
        .with_loss(0.05)
        .with_reorder(0.1, Duration::from_micros(20))
        .with_duplicate(0.05)
        .with_corrupt(0.05)
}

#[test]
fn same_seed_is_bit_for_bit_reproducible() {
    let a = faulty_mesh(faults(42));
    let b = faulty_mesh(faults(42));
    assert_eq!(a.log(), b.log());
    assert_eq!(a.stats(), b.stats());
    assert_eq!(a.now(), b.now());
    for r in 0..6 {
        assert_eq!(a.node(r).seen, b.node(r).seen, "rank {r}");
    }
    // Every fault actually happened.
    let s = a.stats();
    assert!(NetStats::total(&s.lost) > 0);
    assert!(NetStats::total(&s.switch_drops) > 0);
    assert!(s.reordered > 0 && s.duplicated > 0 && s.corrupted > 0);
}

#[test]
fn different_seed_differs_under_loss() {
    let a = faulty_mesh(faults(42));
    let b = faulty_mesh(faults(43));
    assert_ne!(a.log(), b.log());
    assert_ne!(a.stats().lost, b.stats().lost);
}

#[test]
fn changing_one_fault_probability_does_not_reshuffle_the_others() {
    // The toy nodes are open-loop, so each sender's sequence of datagrams is the
    // same in both runs: the same datagrams must be lost.
    let a = faulty_mesh(faults(7));
    let b = faulty_mesh(faults(7).with_corrupt(0.0).with_duplicate(0.3));
    assert_eq!(a.stats().lost, b.stats().lost);
    assert_eq!(a.stats().reordered, b.stats().reordered);
    assert_eq!(b.stats().corrupted, 0);
}

#[test]
fn loss_rate_within_statistical_bounds() {
    // 4 nodes × 3 peers × 1700 = 20 400 datagrams; 5% loss ± 1% is > 6 σ.
    let n = 4;
    let nodes = (0..n)
        .map(|r| {
            let mut t = Toy::all_to_all(r, n, 1700, |_, i| (i % 7) as u8);
            t.verify = false;
            t
        })
        .collect();
    let mut sim = Sim::new(NetConfig::default().with_loss(0.05).with_seed(99), nodes);
    run_idle(&mut sim);
    let s = sim.stats();
    let offered = NetStats::total(&s.offered);
    let lost = NetStats::total(&s.lost);
    assert_eq!(offered, 20_400);
    let rate = lost as f64 / offered as f64;
    assert!((0.04..=0.06).contains(&rate), "loss rate {rate}");
    // Nothing else drops; everything not lost is delivered and logged exactly once.
    assert_eq!(NetStats::total(&s.switch_drops), 0);
    assert_eq!(NetStats::total(&s.delivered), offered - lost);
    assert_eq!(sim.log().len() as u64, offered - lost);
    let rx: u64 = (0..n).map(|r| sim.node(r).rx_ok).sum();
    assert_eq!(rx, offered - lost);
    // Loss hits every class.
    assert!(s.lost.iter().take(7).all(|&l| l > 100), "{:?}", s.lost);
}

#[test]
fn a_run_without_the_delivery_log_logs_nothing_and_is_otherwise_the_same() {
    let run = |logging: bool| {
        let nodes = (0..3).map(|r| Toy::all_to_all(r, 3, 50, |_, i| (i % 7) as u8)).collect();
        let mut sim = Sim::new(NetConfig::default().with_loss(0.05).with_seed(5), nodes);
        sim.set_delivery_log(logging);
        run_idle(&mut sim);
        sim
    };
    let (on, off) = (run(true), run(false));
    assert!(!on.log().is_empty());
    assert!(off.log().is_empty());
    assert_eq!(on.stats(), off.stats());
    assert_eq!(on.now(), off.now());
}

#[test]
fn strict_priority_under_incast() {
    // Ranks 0..3 each send 2100 datagrams to rank 3 at a third of line rate
    // (10 Gbit/s offered in total) into a 5 Gbit/s port with an 8-packet queue.
    // Classes 4–6 (3/7 of the load, 4.3 Gbit/s) fit; class 3 partly; 0–2 starve.
    let senders = 3;
    let k = 2100;
    let mut nodes: Vec<Toy> = (0..senders)
        .map(|r| {
            let mut t = Toy::new(r);
            t.gap = Duration::from_nanos(3000);
            for i in 0..k {
                t.out.push_back(Plan { dst: 3, class: cls(((i + r * 2) % 7) as u8), chunk: i, count: k });
            }
            t
        })
        .collect();
    nodes.push(Toy::new(3));
    let cfg = NetConfig::default().with_port_rate(3, 5_000_000_000).with_queue(8);
    let mut sim = Sim::new(cfg, nodes);
    run_idle(&mut sim);
    let port = &sim.stats().ports[3];
    let frac: Vec<f64> = Class::all().take(7).map(|c| port.drop_fraction(c)).collect();
    for c in 0..7 {
        assert_eq!(port.arrivals[c], u64::from(k) * 3 / 7, "class {c} arrivals");
    }
    // Higher classes never lose more than lower ones (up to the few packets that
    // reach an idle port at start-up)...
    for c in 0..6 {
        assert!(frac[c] + 0.005 >= frac[c + 1], "class {c} lost less than class {}: {frac:?}", c + 1);
    }
    // ...and strictly less across the congestion boundary.
    assert!(frac[0] > 0.9 && frac[2] > frac[3] && frac[3] > frac[4], "{frac:?}");
    // The top classes get through, class 6 entirely.
    assert_eq!(port.drops[6], 0, "{frac:?}");
    assert!(frac[4] < 0.02 && frac[5] < 0.02, "{frac:?}");
    // Low classes were pushed out of the queue by arriving high classes.
    assert!(port.pushed_out[0] + port.pushed_out[1] + port.pushed_out[2] > 0);
    assert_eq!(port.pushed_out[6], 0);
    assert!(port.max_queue <= 8);
    // Every class-6 chunk of every sender is in the log.
    for src in 0..senders {
        for i in (0..k).filter(|i| (i + src * 2) % 7 == 6) {
            assert!(sim.log().first_delivery(3, &key(src, i)).is_some(), "src {src} chunk {i}");
        }
    }
    // The bottleneck ran near capacity: 5 Gbit/s of 1250-byte frames = one per 2 µs.
    let delivered = NetStats::total(&sim.stats().delivered);
    let span = sim.now().as_nanos() as f64;
    assert!(delivered as f64 * 2000.0 > 0.95 * span, "{delivered} in {span} ns");
}

#[test]
fn duplicates_and_corruption_are_counted_and_corrupt_copies_not_logged() {
    let n = 3;
    let nodes = (0..n).map(|r| Toy::all_to_all(r, n, 1000, |_, _| 1)).collect();
    let cfg = NetConfig::default().with_duplicate(0.2).with_corrupt(0.2).with_seed(5);
    let mut sim = Sim::new(cfg, nodes);
    run_idle(&mut sim);
    let s = sim.stats().clone();
    let offered = NetStats::total(&s.offered);
    assert_eq!(offered, 6000);
    // ~20% duplicated, ~20% of all delivered copies corrupted.
    assert!((1000..1400).contains(&s.duplicated), "{}", s.duplicated);
    let copies = NetStats::total(&s.delivered);
    assert_eq!(copies, offered + s.duplicated);
    let c = s.corrupted as f64 / copies as f64;
    assert!((0.17..0.23).contains(&c), "corruption rate {c}");
    // The receivers' MAC checks reject exactly the corrupted copies.
    let bad: u64 = (0..n).map(|r| sim.node(r).rx_bad).sum();
    let ok: u64 = (0..n).map(|r| sim.node(r).rx_ok).sum();
    assert_eq!(bad, s.corrupted);
    assert_eq!(ok, copies - s.corrupted);
    // The log holds exactly the first intact copy of each chunk.
    let mut logged = 0;
    for dst in 0..n {
        let mut first = std::collections::BTreeMap::new();
        for (t, h) in sim.node(dst).received() {
            let k = ChunkKey { op: h.op, tensor: h.tensor, phase: h.phase, src: h.src, chunk: h.chunk_index };
            first.entry(k).or_insert(t);
        }
        let log: Vec<(ChunkKey, Instant)> = sim.log().delivered_to(dst).map(|(k, t)| (*k, t)).collect();
        let want: Vec<(ChunkKey, Instant)> = first.into_iter().collect();
        assert_eq!(log, want, "dst {dst}");
        logged += log.len();
    }
    assert!(logged < 6000, "some chunks only arrived corrupted");
    assert_eq!(logged, sim.log().len());
    assert_eq!(sim.log().iter().count(), logged);
}

#[test]
fn reordering_delays_some_packets() {
    let mk = |cfg: NetConfig| {
        let mut sim = Sim::new(cfg, vec![Toy::all_to_all(0, 2, 1000, |_, _| 3), Toy::new(1)]);
        run_idle(&mut sim);
        sim.node(1).received().map(|(_, h)| h.chunk_index).collect::<Vec<u32>>()
    };
    let in_order = mk(NetConfig::default());
    assert_eq!(in_order, (0..1000).collect::<Vec<_>>());
    let cfg = NetConfig::default().with_reorder(0.3, Duration::from_micros(20));
    let mut sim = Sim::new(cfg.clone(), vec![Toy::all_to_all(0, 2, 1000, |_, _| 3), Toy::new(1)]);
    run_idle(&mut sim);
    assert!((250..350).contains(&sim.stats().reordered), "{}", sim.stats().reordered);
    let shuffled = mk(cfg);
    assert_ne!(shuffled, in_order);
    let mut sorted = shuffled.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, in_order, "reordering neither loses nor duplicates");
}

#[test]
fn silent_node_receives_nothing_and_sends_nothing() {
    let n = 3;
    let nodes = (0..n).map(|r| Toy::all_to_all(r, n, 10, |_, _| 2)).collect();
    let mut sim = Sim::new(NetConfig::default(), nodes);
    sim.node_mut(2).timers.push(ns(1_000));
    sim.set_silent(2, true);
    assert!(sim.is_silent(2));
    run_idle(&mut sim);
    let dead = sim.node(2);
    assert_eq!(dead.polls, 0, "a silent node is not polled");
    assert!(dead.seen.is_empty(), "a silent node gets no datagrams and no timers");
    assert_eq!(dead.out.len(), 20);
    assert_eq!(sim.log().count_to(2), 0);
    assert_eq!(sim.stats().silent_drops, 20);
    for r in 0..2 {
        assert_eq!(sim.node(r).rx_ok, 10, "rank {r} hears only its live peer");
        assert!(sim.node(r).received().all(|(_, h)| h.src != 2));
    }
    // Revived, it sends its backlog and fires its overdue timer now.
    let t = sim.now();
    sim.set_silent(2, false);
    run_idle(&mut sim);
    assert_eq!(sim.node(2).out.len(), 0);
    assert_eq!(sim.node(2).timer_times(), [t]);
    assert_eq!(sim.log().transfer(0, 3, 4, Phase::Scatter, 2).count(), 10);
    assert_eq!(sim.node(2).rx_ok, 0);
}

#[test]
fn in_flight_datagrams_of_a_node_that_goes_silent_are_dropped() {
    let mut sim = Sim::new(NetConfig::default(), vec![Toy::all_to_all(0, 2, 5, |_, _| 1), Toy::new(1)]);
    // Stop just after the first two datagrams left the sender's uplink.
    sim.run_to(ns(1_500));
    sim.set_silent(0, true);
    run_idle(&mut sim);
    assert_eq!(sim.node(1).rx_ok, 0);
    assert_eq!(sim.stats().silent_drops, 2);
}

#[test]
fn replaced_node_is_polled_and_its_old_timer_forgotten() {
    let mut a = Toy::new(0);
    a.timers.push(ns(50_000));
    let mut sim = Sim::new(NetConfig::default(), vec![a, Toy::new(1)]);
    sim.run_to(ns(10_000));
    let mut fresh = Toy::all_to_all(0, 2, 4, |_, _| 5);
    fresh.timers.push(ns(70_000));
    let old = sim.replace_node(0, fresh);
    assert!(old.seen.is_empty());
    run_idle(&mut sim);
    assert_eq!(sim.node(0).timer_times(), [ns(70_000)]);
    assert_eq!(sim.node(1).rx_ok, 4);
    // The new node started sending at the replacement time.
    assert_eq!(sim.log().first_delivery(1, &key(0, 0)), Some(ns(10_000 + 12_000)));
}

#[test]
fn timers_fire_in_order_at_their_deadlines() {
    let mut a = Toy::new(0);
    a.timers = vec![ns(10), ns(20_000), ns(20_000), ns(30_000), ns(5_000_000)];
    let mut sim = Sim::new(NetConfig::default(), vec![a, Toy::new(1)]);
    // An overdue timer (registered after time passed) fires immediately.
    sim.run_to(ns(25_000));
    assert_eq!(sim.node(0).timer_times(), [ns(10), ns(20_000), ns(20_000)]);
    assert_eq!(sim.now(), ns(25_000));
    sim.node_mut(1).timers.push(ns(1_000));
    run_idle(&mut sim);
    assert_eq!(sim.node(0).timer_times(), [ns(10), ns(20_000), ns(20_000), ns(30_000), ns(5_000_000)]);
    assert_eq!(sim.node(1).timer_times(), [ns(25_000)]);
    assert_eq!(sim.stats().timers_fired, 5);
}

#[test]
fn datagrams_are_delivered_before_timers_at_the_same_instant() {
    let mut a = Toy::new(0);
    a.out.push_back(Plan { dst: 1, class: cls(0), chunk: 0, count: 1 });
    a.timers.push(ns(12_000));
    let mut b = Toy::new(1);
    b.timers.push(ns(12_000)); // exactly when the datagram arrives
    let mut sim = Sim::new(NetConfig::default(), vec![a, b]);
    run_idle(&mut sim);
    let seen = &sim.node(1).seen;
    assert_eq!(seen.len(), 2);
    assert!(matches!(seen[0], Seen::Rx { at, hdr: Ok(_) } if at == ns(12_000)), "{seen:?}");
    assert_eq!(seen[1], Seen::Timer { at: ns(12_000) });
}

#[test]
fn paced_sender_keeps_its_gap() {
    let mut a = Toy::all_to_all(0, 2, 5, |_, _| 4);
    a.gap = Duration::from_micros(3);
    let mut sim = Sim::new(NetConfig::default(), vec![a, Toy::new(1)]);
    run_idle(&mut sim);
    let got: Vec<u64> = sim.node(1).received().map(|(t, _)| t.as_nanos()).collect();
    assert_eq!(got, [12_000, 15_000, 18_000, 21_000, 24_000]);
}

#[test]
fn due_sender_with_busy_uplink_waits_for_the_wire() {
    // The node says "call me now" the whole time it has data; the simulator must
    // wait for the uplink instead of spinning on handle_timeout.
    let mut a = Toy::all_to_all(0, 2, 50, |_, _| 4);
    a.eager = true;
    let mut sim = Sim::new(NetConfig::default(), vec![a, Toy::new(1)]);
    run_idle(&mut sim);
    let got: Vec<u64> = sim.node(1).received().map(|(t, _)| t.as_nanos()).collect();
    assert_eq!(got, (0..50).map(|i| 12_000 + 1000 * i).collect::<Vec<_>>());
    assert!(sim.stats().timers_fired <= 2 * 50, "{}", sim.stats().timers_fired);
}

#[test]
fn a_rated_path_queues_and_drops_tail_when_its_queue_is_full() {
    // 1,250-byte frames: 1 µs on the 10 Gbit/s uplink, 4 µs on a 2.5 Gbit/s
    // path. Ten back to back, one a µs: the path serves one every 4 µs and
    // holds two waiting besides the one in service, and drops one that
    // finds two waiting (drop-tail). #3 finds #1 and #2 waiting behind #0:
    // dropped; #4 comes as #1 starts: admitted; #5-#7 find #2 and #4:
    // dropped; #8 comes as #2 starts: admitted; #9: dropped.
    let run = |queue_packets: usize| {
        let mut a = Toy::all_to_all(0, 2, 10, |_, _| 4);
        a.eager = true;
        let path = PathConfig { rate_bps: 2_500_000_000, queue_packets, ..PathConfig::clean() };
        let mut sim = Sim::new(NetConfig::default().with_paths(vec![path]), vec![a, Toy::new(1)]);
        run_idle(&mut sim);
        let got: Vec<(u32, u64)> =
            sim.node(1).received().map(|(t, h)| (h.chunk_index, t.as_nanos())).collect();
        let st = sim.stats();
        (got, st.paths[0].offered[4], st.paths[0].dropped[4], st.lost[4])
    };
    let (got, offered, dropped, lost) = run(2);
    let chunks: Vec<u32> = got.iter().map(|g| g.0).collect();
    assert_eq!(chunks, [0, 1, 2, 4, 8], "{got:?}");
    assert_eq!((offered, dropped, lost), (10, 5, 5));
    // Each admitted datagram leaves the path 4 µs after the one before it.
    for w in got.windows(2) {
        assert_eq!(w[1].1 - w[0].1, 4_000, "{got:?}");
    }
    // Without a queue limit the path only delays: all ten, 4 µs apart.
    let (got, offered, dropped, lost) = run(0);
    assert_eq!(got.len(), 10);
    assert_eq!((offered, dropped, lost), (10, 0, 0));
    assert_eq!(got[9].1 - got[0].1, 36_000);
}

/// A node whose timer never moves past `now`.
struct Spinner;
impl Node for Spinner {
    fn handle_datagram(&mut self, _: Instant, _: &[u8]) {}
    fn handle_timeout(&mut self, _: Instant) {}
    fn poll_transmit(&mut self, _: Instant, _: &mut [u8]) -> Option<Transmit> {
        None
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Some(Instant::ZERO)
    }
}

#[test]
#[should_panic(expected = "node 0 keeps asking for a timeout at 0 ns without making progress")]
fn a_timer_that_never_advances_panics_clearly() {
    let mut sim = Sim::new(NetConfig::default(), vec![Spinner]);
    sim.run_to(Instant::from_nanos(1_000_000));
}

#[test]
fn run_until_checks_done_after_every_event() {
    let nodes = vec![Toy::all_to_all(0, 2, 100, |_, _| 1), Toy::new(1)];
    let mut sim = Sim::new(NetConfig::default(), nodes);
    assert!(sim.run_until(Instant::MAX, |s| s.node(1).rx_ok == 5));
    assert_eq!(sim.node(1).rx_ok, 5);
    assert_eq!(sim.now(), ns(16_000));
    // Stopping at a limit advances the clock to it.
    assert!(!sim.run_until(ns(20_500), |_| false));
    assert_eq!(sim.now(), ns(20_500));
    assert_eq!(sim.node(1).rx_ok, 9);
    assert!(sim.step());
    run_idle(&mut sim);
    assert!(!sim.step());
    assert_eq!(sim.node(1).rx_ok, 100);
}

#[test]
fn trace_hook_sees_every_datagram_event() {
    use std::cell::RefCell;
    use std::rc::Rc;
    let events = Rc::new(RefCell::new(Vec::new()));
    let nodes = vec![Toy::all_to_all(0, 2, 200, |_, i| (i % 7) as u8), Toy::new(1)];
    let cfg =
        NetConfig::default().with_loss(0.1).with_corrupt(0.1).with_port_rate(1, 1_000_000_000).with_queue(4);
    let mut sim = Sim::new(cfg, nodes);
    let sink = events.clone();
    sim.set_trace(Some(Box::new(move |r| sink.borrow_mut().push((r.event, r.class, r.datagram.len())))));
    run_idle(&mut sim);
    let ev = events.borrow();
    let count = |e: TraceEvent| ev.iter().filter(|x| x.0 == e).count() as u64;
    let s = sim.stats();
    assert_eq!(count(TraceEvent::Sent), 200);
    assert_eq!(count(TraceEvent::Lost), NetStats::total(&s.lost));
    assert_eq!(count(TraceEvent::Dropped) + count(TraceEvent::PushedOut), NetStats::total(&s.switch_drops));
    assert_eq!(count(TraceEvent::PushedOut), NetStats::total(&s.pushed_out));
    assert_eq!(count(TraceEvent::DeliveredCorrupt), s.corrupted);
    assert_eq!(count(TraceEvent::Delivered) + s.corrupted, NetStats::total(&s.delivered));
    assert_eq!(count(TraceEvent::Enqueued) + count(TraceEvent::Dropped), NetStats::total(&s.switch_arrivals));
    assert!(ev.iter().all(|x| x.2 == 1208));
}

#[test]
fn misaddressed_datagrams_are_counted_and_dropped() {
    let mut a = Toy::new(0);
    a.out.push_back(Plan { dst: 9, class: cls(1), chunk: 0, count: 1 });
    a.out.push_back(Plan { dst: 1, class: cls(1), chunk: 0, count: 1 });
    let mut sim = Sim::new(NetConfig::default(), vec![a, Toy::new(1)]);
    run_idle(&mut sim);
    assert_eq!(sim.stats().misaddressed, 1);
    assert_eq!(sim.node(1).rx_ok, 1);
}

#[test]
fn boxed_heterogeneous_nodes_run() {
    let nodes: Vec<Box<dyn Node>> = vec![Box::new(Toy::all_to_all(0, 2, 3, |_, _| 0)), Box::new(Toy::new(1))];
    let mut sim = Sim::new(NetConfig::default(), nodes);
    run_idle(&mut sim);
    assert_eq!(sim.log().count_to(1), 3);
}

#[test]
fn thirty_three_nodes_hundred_thousand_packets() {
    // 33 × 32 × 100 = 105 600 datagrams through a congested, lossy fabric.
    let n = 33;
    let nodes = (0..n)
        .map(|r| {
            let mut t = Toy::all_to_all(r, n, 100, |dst, i| ((dst + i) % 7) as u8);
            t.verify = false;
            t
        })
        .collect();
    let cfg = NetConfig::default().with_loss(0.01).with_queue(16).with_seed(3);
    let mut sim = Sim::new(cfg, nodes);
    let mut steps = 0u64;
    while sim.step() {
        steps += 1;
    }
    let s = sim.stats();
    assert_eq!(NetStats::total(&s.offered), 105_600);
    let rx: u64 = (0..n).map(|r| sim.node(r).rx_ok).sum();
    assert_eq!(rx, NetStats::total(&s.delivered));
    assert_eq!(rx + NetStats::total(&s.lost) + NetStats::total(&s.switch_drops), NetStats::total(&s.offered));
    assert!(NetStats::total(&s.switch_drops) > 0, "synchronized round-robin senders make 32:1 bursts");
    assert!(steps > 200_000, "{steps}");
}
