//! Datagrams between the datapath and the protocol endpoint: [`Pump::receive`]
//! hands what arrived to the endpoint with the peer its address belongs to, and
//! [`Pump::transmit`] hands what the endpoint produced to the datapath
//! (keeping what it refused for the next turn). Also the loss-driven pacing
//! ([`RateAdapter`]), which sets the endpoint's transmit rate.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use dlcp_proto::endpoint::{Endpoint, TxBatch};
use dlcp_proto::priority::Class;
use dlcp_proto::time::Instant;

use super::counters::ServiceCounters;
use crate::datapath::fault::{Fate, FaultInjector};
use crate::datapath::{Datapath, SendOutcome};

/// Datagrams taken from the endpoint per `poll_transmit_batch`.
const TX_BATCH: usize = 64;

/// Moves datagrams between the datapath and the endpoint.
pub(super) struct Pump {
    datapath: FaultInjector,
    /// Peer addresses by rank.
    peers: Vec<SocketAddr>,
    peer_rank: HashMap<SocketAddr, u32>,
    /// Datagrams the datapath refused (would-block), sent first next time.
    pending_tx: VecDeque<(SocketAddr, Class, Vec<u8>)>,
    /// The datagrams of one `poll_transmit_batch` call.
    tx_batch: TxBatch,
    /// One datagram, contiguous, for the datapath.
    tx_buf: Vec<u8>,
    adapt: Option<RateAdapter>,
}

impl Pump {
    /// A pump over `datapath` for the peers at `peers` (by rank), with room for
    /// datagrams of `tx_slot` bytes.
    pub(super) fn new(datapath: FaultInjector, peers: Vec<SocketAddr>, tx_slot: usize) -> Pump {
        let peer_rank = peers.iter().enumerate().map(|(r, a)| (*a, r as u32)).collect();
        Pump {
            datapath,
            peers,
            peer_rank,
            pending_tx: VecDeque::new(),
            tx_batch: TxBatch::new(),
            tx_buf: vec![0; tx_slot],
            adapt: None,
        }
    }

    /// The datapath.
    pub(super) fn datapath(&self) -> &FaultInjector {
        &self.datapath
    }

    /// The datapath, mutably (reload re-marks it).
    pub(super) fn datapath_mut(&mut self) -> &mut FaultInjector {
        &mut self.datapath
    }

    /// Peer addresses by rank.
    pub(super) fn peers(&self) -> &[SocketAddr] {
        &self.peers
    }

    /// True while datagrams the datapath refused wait to be sent.
    pub(super) fn blocked(&self) -> bool {
        !self.pending_tx.is_empty()
    }

    /// Hand what the datapath received to the endpoint, each datagram
    /// straight from the datapath's receive slot (the endpoint checks its tag
    /// there, then places its payload), with the peer its source address
    /// belongs to.
    pub(super) fn receive(&mut self, endpoint: &mut Endpoint, counters: &mut ServiceCounters, now: Instant) {
        let Pump { datapath, peer_rank, .. } = self;
        // The last source looked up: datagrams come in runs from one peer.
        let mut last: Option<(SocketAddr, Option<u32>)> = None;
        // Bounded, so a flood cannot starve timers, trainers and transmit.
        for _ in 0..64 {
            let r = datapath.recv_reporting(&mut |from: SocketAddr, bytes: &[u8], fate: Fate| {
                // A configured peer's rank, or none (one bounded "unknown" bucket).
                let peer = match last {
                    Some((a, p)) if a == from => p,
                    _ => {
                        let p = peer_rank.get(&from).copied();
                        last = Some((from, p));
                        p
                    }
                };
                match fate {
                    Fate::Dropped(_) => {
                        counters.rx_debug_dropped += 1;
                        endpoint.count_dropped(bytes, peer);
                    }
                    Fate::Delivered => endpoint.handle_datagram_from(now, bytes, peer),
                }
            });
            // The endpoint counts what its source check rejected; the service's
            // counters of the same name show the endpoint's.
            let rejected = &endpoint.stats().rejected;
            (counters.rx_wrong_source, counters.rx_unknown_source) =
                (rejected.wrong_source, rejected.unknown_source);
            match r {
                Ok(0) if !datapath.rx_pending() => break,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("datapath receive: {e}");
                    break;
                }
            }
        }
    }

    /// Hand what the endpoint has to send to the datapath, refused datagrams
    /// of earlier turns first, and flush.
    pub(super) fn transmit(&mut self, endpoint: &mut Endpoint, counters: &mut ServiceCounters, now: Instant) {
        // Datagrams the datapath refused earlier (would-block) go first, in order.
        while let Some((dst, class, d)) = self.pending_tx.pop_front() {
            match self.datapath.send(dst, class, &d) {
                Ok(SendOutcome::Sent) => {}
                Ok(SendOutcome::WouldBlock) => {
                    self.pending_tx.push_front((dst, class, d));
                    let _ = self.datapath.flush();
                    return;
                }
                Err(e) => log::error!("datapath send: {e}"),
            }
        }
        // Datagrams come from the endpoint TX_BATCH at a time.
        let Pump { datapath, peers, pending_tx, tx_batch, tx_buf, .. } = self;
        'batches: loop {
            let view = endpoint.poll_transmit_batch(now, TX_BATCH, tx_batch);
            let n = view.len();
            for (i, d) in view.iter().enumerate() {
                let Some(&dst) = peers.get(d.dst as usize) else { continue };
                let len = d.write_to(tx_buf);
                let data = &tx_buf[..len];
                if is_probe(data) {
                    // moves to proto (issue 13 step 2): a PROBE says "I have sent
                    // through chunk X": it travels in the control class, which the
                    // datapath flushes first, so push out the data queued before it
                    // or it overtakes that data on the host and the receiver asks
                    // for repairs of chunks in flight.
                    if let Err(e) = datapath.flush() {
                        log::warn!("datapath flush: {e}");
                    }
                    counters.probe_flushes += 1;
                }
                let outcome = datapath.send(dst, d.class, data);
                if !matches!(outcome, Ok(SendOutcome::Sent)) {
                    if let Err(e) = &outcome {
                        log::error!("datapath send: {e}");
                    }
                    // Keep this datagram (unless it failed) and the rest of the
                    // batch, in order, for the next turn.
                    let from = if outcome.is_err() { i + 1 } else { i };
                    for d in view.iter().skip(from) {
                        if let Some(&dst) = peers.get(d.dst as usize) {
                            pending_tx.push_back((dst, d.class, d.parts().concat()));
                        }
                    }
                    break 'batches;
                }
            }
            if n < TX_BATCH {
                break;
            }
        }
        if let Err(e) = datapath.flush() {
            log::warn!("datapath flush: {e}");
        }
    }

    /// Let the rate adapter, if any, look at the last window.
    pub(super) fn adapt_rate(&mut self, endpoint: &mut Endpoint, now: Instant) {
        if let Some(a) = self.adapt.as_mut() {
            a.step(endpoint, now);
        }
    }

    /// (Re)install the rate adapter as `[pacing]` says, starting from the
    /// endpoint's counters now (a reload installs a new one mid-run).
    pub(super) fn install_rate_adaptation(&mut self, pacing: &dlcp_config::Pacing, endpoint: &Endpoint) {
        self.adapt = None;
        let max = pacing.rate_bytes_per_sec().unwrap_or(0);
        if pacing.adapt && max > 0 {
            self.adapt = Some(RateAdapter {
                max,
                min: (max / 100).max(125_000),
                window: StdDuration::from_millis(5),
                last: StdInstant::now(),
                last_tx: endpoint.stats().tx_packets[..7].iter().sum(),
                last_repairs: endpoint.stats().repairs_sent,
                cuts: 0,
            });
        }
    }

    /// Rate cuts so far, if rate adaptation is on.
    pub(super) fn rate_cuts(&self) -> Option<u64> {
        self.adapt.as_ref().map(|a| a.cuts)
    }
}

/// Loss-driven pacing (AIMD): every window, the share of this daemon's data
/// datagrams that receivers asked to have repaired is the loss signal. Above
/// 0.5% the rate is cut to 70%; otherwise it grows by 2% of the maximum, up to
/// `pacing.rate_mbps`. A flood therefore cannot persist, and a clean path runs
/// at the configured rate.
///
/// moves to proto (issue 13 step 2): rate adaptation belongs to the protocol,
/// on its virtual time, where the simulator can test it.
#[derive(Debug, Clone)]
struct RateAdapter {
    max: u64,
    min: u64,
    window: StdDuration,
    last: StdInstant,
    last_tx: u64,
    last_repairs: u64,
    cuts: u64,
}

impl RateAdapter {
    fn step(&mut self, endpoint: &mut Endpoint, now: Instant) {
        if self.last.elapsed() < self.window {
            return;
        }
        self.last = StdInstant::now();
        let s = endpoint.stats();
        let tx: u64 = s.tx_packets[..7].iter().sum();
        let (dtx, drep) = (tx - self.last_tx, s.repairs_sent - self.last_repairs);
        self.last_tx = tx;
        self.last_repairs = s.repairs_sent;
        if dtx == 0 {
            return;
        }
        let rate = endpoint.pacing_rate().max(self.min);
        let new = if drep * 200 > dtx {
            self.cuts += 1;
            (rate * 7 / 10).max(self.min)
        } else {
            (rate + self.max / 50).min(self.max)
        };
        if new != rate {
            endpoint.set_pacing_rate(now, new);
        }
    }
}

/// True if `datagram` is a dlcp PROBE (read from the header's type byte; the
/// datagram came from our own endpoint, so no authentication is needed).
///
/// moves to proto (issue 13 step 2): the endpoint will order its PROBEs
/// behind their data itself.
fn is_probe(datagram: &[u8]) -> bool {
    dlcp_proto::wire::Packet::new_checked(datagram)
        .is_ok_and(|p| p.raw_type() == dlcp_proto::wire::PacketType::Probe as u8)
}
