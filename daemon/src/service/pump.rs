//! Datagrams between the datapath and the protocol endpoint: [`Pump::receive`]
//! hands what arrived to the endpoint (after the source check), and
//! [`Pump::transmit`] hands what the endpoint produced to the datapath
//! (keeping what it refused for the next turn). The loss-driven pacing that
//! sets the endpoint's transmit rate is the endpoint's own
//! (`dlcp_proto::rate`, on its virtual clock).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;

use dlcp_proto::endpoint::Endpoint;
use dlcp_proto::priority::Class;
use dlcp_proto::time::Instant;
use dlcp_proto::wire;

use super::counters::ServiceCounters;
use crate::datapath::fault::{Fate, FaultInjector};
use crate::datapath::{Datapath, SendOutcome};

/// Datagrams taken from the endpoint per `poll_transmit_many`.
const TX_BATCH: usize = 64;

/// A received datagram's bytes in the receive batch and its source peer (`None`: not a configured peer).
type RxSpan = (std::ops::Range<usize>, Option<u32>);

/// Moves datagrams between the datapath and the endpoint.
pub(super) struct Pump {
    datapath: FaultInjector,
    /// Peer addresses by rank.
    peers: Vec<SocketAddr>,
    peer_rank: HashMap<SocketAddr, u32>,
    /// Datagrams the datapath refused (would-block), sent first next time.
    pending_tx: VecDeque<(SocketAddr, Class, Vec<u8>)>,
    /// Room per datagram in `tx_buf`.
    tx_slot: usize,
    /// The datagrams of one `poll_transmit_many` call: (transmit, offset in `tx_buf`).
    tx_batch: Vec<(dlcp_proto::endpoint::Transmit, usize)>,
    tx_buf: Vec<u8>,
    /// Received datagrams of one datapath receive call, back to back, and
    /// their spans with the configured peer each came from (see `receive`).
    rx_batch: (Vec<u8>, Vec<RxSpan>),
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
            tx_slot,
            tx_batch: Vec::new(),
            tx_buf: Vec::new(),
            rx_batch: (Vec::new(), Vec::new()),
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

    /// Hand what the datapath received to the endpoint, a receive call at a time.
    pub(super) fn receive(&mut self, endpoint: &mut Endpoint, counters: &mut ServiceCounters, now: Instant) {
        let Pump { datapath, peers, peer_rank, rx_batch, .. } = self;
        // Datagrams are copied into `rx_batch` and handed to the endpoint a
        // receive call at a time.
        let (buf, spans) = rx_batch;
        // Bounded, so a flood cannot starve timers, trainers and transmit.
        for _ in 0..64 {
            let mut f = |from: SocketAddr, bytes: &[u8], fate: Fate| {
                // Drops are counted per peer by source address: a configured peer's
                // rank, or one bounded "unknown" bucket for any other address.
                let peer = peer_rank.get(&from).copied();
                if let Fate::Dropped(_) = fate {
                    counters.rx_debug_dropped += 1;
                    endpoint.count_dropped(bytes, peer);
                    return;
                }
                // moves to proto (issue 13 step 2): the claimed sender must send
                // from its configured address; the MAC then proves the rest.
                if let Ok(p) = wire::Packet::new_checked(bytes)
                    && peers.get(p.src() as usize).is_some_and(|a| *a != from)
                {
                    if peer.is_some() {
                        counters.rx_wrong_source += 1;
                    } else {
                        counters.rx_unknown_source += 1;
                    }
                    endpoint.count_dropped(bytes, peer);
                    return;
                }
                spans.push((buf.len()..buf.len() + bytes.len(), peer));
                buf.extend_from_slice(bytes);
            };
            let r = datapath.recv_reporting(&mut f);
            if !spans.is_empty() {
                let batch: Vec<(&[u8], Option<u32>)> =
                    spans.iter().map(|(r, p)| (&buf[r.clone()], *p)).collect();
                endpoint.handle_datagrams_from(now, &batch);
                spans.clear();
                buf.clear();
            }
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
        // Datagrams come from the endpoint TX_BATCH at a time, tagged together.
        let slot = self.tx_slot;
        'batches: loop {
            endpoint.poll_transmit_many(now, slot, TX_BATCH, &mut self.tx_buf, &mut self.tx_batch);
            let n = self.tx_batch.len();
            for i in 0..n {
                let (t, off) = self.tx_batch[i];
                let Some(&dst) = self.peers.get(t.dst as usize) else { continue };
                let data = &self.tx_buf[off..off + t.len];
                if is_probe(data) {
                    // moves to proto (issue 13 step 2): a PROBE says "I have sent
                    // through chunk X": it travels in the control class, which the
                    // datapath flushes first, so push out the data queued before it
                    // or it overtakes that data on the host and the receiver asks
                    // for repairs of chunks in flight.
                    if let Err(e) = self.datapath.flush() {
                        log::warn!("datapath flush: {e}");
                    }
                    counters.probe_flushes += 1;
                }
                let outcome = self.datapath.send(dst, t.class, data);
                if !matches!(outcome, Ok(SendOutcome::Sent)) {
                    if let Err(e) = &outcome {
                        log::error!("datapath send: {e}");
                    }
                    // Keep this datagram (unless it failed) and the rest of the
                    // batch, in order, for the next turn.
                    let from = if outcome.is_err() { i + 1 } else { i };
                    for &(t, off) in &self.tx_batch[from..] {
                        if let Some(&dst) = self.peers.get(t.dst as usize) {
                            self.pending_tx.push_back((dst, t.class, self.tx_buf[off..off + t.len].to_vec()));
                        }
                    }
                    break 'batches;
                }
            }
            if n < TX_BATCH {
                break;
            }
        }
        if let Err(e) = self.datapath.flush() {
            log::warn!("datapath flush: {e}");
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
