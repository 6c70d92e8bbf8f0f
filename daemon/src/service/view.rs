//! A read-only look at the running service, lent to what reports on it: the
//! admin protocol's replies and the metrics samples are built from a [`View`],
//! so neither reaches into the service.

use std::net::SocketAddr;

use dlcp_config::Config;
use dlcp_proto::endpoint::Endpoint;

use super::counters::ServiceCounters;
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
    /// Rate cuts of the loss-driven pacing, if it is on.
    pub(super) rate_cuts: Option<u64>,
    /// The service is draining.
    pub(super) draining: bool,
}
