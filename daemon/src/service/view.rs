//! A read-only look at the running service, lent to what reports on it: the
//! admin protocol's replies and the metrics samples are built from a [`View`],
//! so neither reaches into the service.

use std::net::SocketAddr;

use dlcp_config::Config;
use dlcp_proto::endpoint::Endpoint;

use dlcp_proto::stats::{Desc, Label};

use super::attach::Attach;
use super::counters::{ServiceCounters, Snapshot};
use super::trainers::Trainers;
use crate::datapath::Datapath;

/// The service's parts, borrowed for one reply or sample.
pub(super) struct View<'a> {
    /// The running configuration.
    pub(super) cfg: &'a Config,
    /// The protocol endpoint.
    pub(super) endpoint: &'a Endpoint,
    /// The datapath.
    pub(super) datapath: &'a dyn Datapath,
    /// Peer addresses by rank.
    pub(super) peers: &'a [SocketAddr],
    /// The service's counters.
    pub(super) counters: &'a ServiceCounters,
    /// The attached trainers.
    pub(super) trainers: &'a Trainers,
    /// The control socket (attachments made, handshakes in progress).
    pub(super) attach: &'a Attach,
    /// Admin connections open.
    pub(super) admin_connections: usize,
    /// Rate cuts of the loss-driven pacing, if it is on.
    pub(super) rate_cuts: Option<u64>,
    /// The service is draining.
    pub(super) draining: bool,
}

impl View<'_> {
    /// The values of [`Snapshot`] now.
    pub(super) fn snapshot(&self) -> Snapshot {
        let (sq_used, cq_used, ring_capacity) = self.trainers.ring_occupancy();
        let (me, world) = (self.cfg.rank(), self.cfg.world_size());
        Snapshot {
            trainers: self.trainers.count() as u64,
            local_ops: self.trainers.ops() as u64,
            ops_in_flight: self.endpoint.ops_in_flight() as u64,
            ops_held: self.endpoint.ops_held() as u64,
            pacing_rate: self.endpoint.pacing_rate(),
            peer_up: (0..world).map(|p| u64::from(p == me || self.endpoint.peer_up(p))).collect(),
            sq_used,
            cq_used,
            ring_capacity,
            shm_attached: self.attach.shm_attached(),
            admin_connections: self.admin_connections as u64,
            attach_handshakes: self.attach.pending() as u64,
            rejected_descriptors: self.trainers.rejected_descriptors(),
            reasons_dropped: self.trainers.reasons_dropped(),
        }
    }

    /// Every counter of the daemon with its description, once: the
    /// protocol's (section `protocol`), the service's (`service`), the
    /// datapath's (`datapath_counters`) and the [`Snapshot`] (keys from the
    /// top). Metrics and `dlcpctl stats --json` are both built from this.
    pub(super) fn visit_counters(&self, f: &mut dyn FnMut(&'static str, &'static Desc, Label, u64)) {
        self.endpoint.stats().visit(&mut |d, l, v| f("protocol", d, l, v));
        self.counters.visit(&mut |d, l, v| f("service", d, l, v));
        self.datapath.stats().visit(&mut |d, l, v| f("datapath_counters", d, l, v));
        self.snapshot().visit(&mut |d, l, v| f("", d, l, v));
    }
}
