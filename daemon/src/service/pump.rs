//! Datagrams between the datapath and the protocol endpoint: [`Pump::receive`]
//! hands what arrived to the endpoint with the peer its address belongs to, and
//! [`Pump::transmit`] hands what the endpoint produced to the datapath
//! (keeping what it refused for the next turn). The loss-driven pacing that
//! sets the endpoint's transmit rate is the endpoint's own
//! (`dlcp_proto::rate`, on its virtual clock).

use std::io;
use std::net::SocketAddr;

use dlcp_proto::endpoint::{Endpoint, TxBatch};
use dlcp_proto::time::Instant;

use super::counters::ServiceCounters;
use super::sources::Sources;
use crate::datapath::fault::{Fate, FaultInjector};
use crate::datapath::{Datapath, Outgoing};

/// Datagrams taken from the endpoint per `poll_transmit_batch`: enough that a
/// run of one class holds GSO-sized runs to each peer once the datapath
/// groups it by destination.
const TX_BATCH: usize = 256;

/// Moves datagrams between the datapath and the endpoint.
pub(super) struct Pump {
    datapath: FaultInjector,
    /// Peer addresses by rank.
    peers: Vec<SocketAddr>,
    /// Peer ranks by source address (a peer sends from one port per path).
    sources: Sources,
    /// The datagrams of one `poll_transmit_batch` call.
    tx_batch: TxBatch,
}

impl Pump {
    /// A pump over `datapath` for the peers at `peers` (by rank), each
    /// sending from `paths` ports.
    pub(super) fn new(datapath: FaultInjector, peers: Vec<SocketAddr>, paths: u16) -> Pump {
        let sources = Sources::new(&peers, paths);
        Pump { datapath, peers, sources, tx_batch: TxBatch::new() }
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

    /// True while datagrams the kernel refused wait in the datapath.
    pub(super) fn blocked(&self) -> bool {
        self.datapath.wants_writable()
    }

    /// Hand what the datapath received to the endpoint, each datagram
    /// straight from the datapath's receive slot (the endpoint checks its tag
    /// there, then places its payload), with the peer its source address
    /// belongs to.
    pub(super) fn receive(&mut self, endpoint: &mut Endpoint, counters: &mut ServiceCounters, now: Instant) {
        let Pump { datapath, sources, .. } = self;
        // The last source looked up: datagrams come in runs from one peer.
        let mut last: Option<(SocketAddr, Option<(u32, u16)>)> = None;
        // Bounded, so a flood cannot starve timers, trainers and transmit.
        for _ in 0..64 {
            let r = datapath.recv_reporting(&mut |from: SocketAddr, bytes: &[u8], fate: Fate| {
                // A configured peer's rank, or none (one bounded "unknown" bucket).
                let source = match last {
                    Some((a, p)) if a == from => p,
                    _ => {
                        let p = sources.peer(from);
                        last = Some((from, p));
                        p
                    }
                };
                let peer = source.map(|(rank, _)| rank);
                if let Some(n) =
                    source.and_then(|(_, path)| counters.rx_packets_path.get_mut(usize::from(path)))
                {
                    *n += 1;
                }
                match fate {
                    Fate::Dropped(_) => {
                        counters.rx_debug_dropped += 1;
                        endpoint.count_dropped(bytes, peer);
                    }
                    Fate::Delivered => endpoint.handle_datagram_from(now, bytes, peer),
                }
            });
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

    /// Hand what the endpoint has to send to the datapath, batch by batch,
    /// each datagram from where it lies (no copy), in the endpoint's order:
    /// the endpoint emits a PROBE after the data it follows, and the datapath
    /// hands datagrams to the kernel in the order given (see
    /// [`Datapath::send_batch`]), so no PROBE overtakes its data on the host.
    /// What the datapath kept from earlier turns (refused by the kernel) goes
    /// first; while it keeps some, the endpoint keeps the rest in its queues
    /// (nothing is copied).
    pub(super) fn transmit(&mut self, endpoint: &mut Endpoint, now: Instant) {
        let Pump { datapath, peers, tx_batch, .. } = self;
        if let Err(e) = datapath.flush() {
            log::warn!("datapath flush: {e}");
        }
        while !datapath.wants_writable() {
            let view = endpoint.poll_transmit_batch(now, TX_BATCH, tx_batch);
            let batch: Vec<Outgoing<'_>> = view
                .iter()
                .filter_map(|d| {
                    let dst = *peers.get(d.dst as usize)?;
                    Some(Outgoing { dst, class: d.class, path: d.path, parts: d.parts() })
                })
                .collect();
            if let Err(e) = datapath.send_batch(&batch) {
                log::error!("datapath send: {e}");
            }
            if view.len() < TX_BATCH {
                break;
            }
        }
    }
}
