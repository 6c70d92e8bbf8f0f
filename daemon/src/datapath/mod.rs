//! Datapaths: how dlcpd moves datagrams between its protocol core and the wire.
//!
//! The event loop drives [`dlcp_proto::endpoint::Endpoint`] and hands every
//! datagram it produces to a [`Datapath`], together with the datagram's priority
//! class; the datapath marks the class's DSCP and sends. Received datagrams come
//! back with their source address. Two implementations: [`socket`] (ordinary UDP
//! sockets, always built) and `dpdk` (built where libdpdk is present, see
//! `dlcp-ffi`; Ethernet/IPv4/UDP/ARP from [`frame`]). [`fault`] wraps either
//! to inject faults (receive loss, a full send buffer) for tests and demos.
//!
//! Files: `api.rs` (the trait every datapath implements), `open.rs` (which one
//! the configuration gets), and one file or folder per datapath.

pub use self::api::{Datapath, DatapathStats, Outgoing, SendOutcome};
pub use self::open::{DpdkUnavailable, OpenError, open};

mod api;
#[cfg(dpdk)]
pub mod dpdk;
pub mod fault;
pub mod frame;
pub mod neigh;
mod open;
pub mod socket;
