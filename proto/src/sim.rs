//! Deterministic network simulator for testing the protocol core.
//!
//! OWNED BY THE SIM HELPER — see the task description. The contract below is fixed.

use crate::priority::Class;
use crate::time::Instant;

/// One datagram an endpoint wants to send: `len` bytes written into the buffer
/// passed to [`Node::poll_transmit`], to rank `dst`, with priority `class`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination rank.
    pub dst: u32,
    /// Datagram length.
    pub len: usize,
    /// Priority class (the simulated switch serves and drops by it).
    pub class: Class,
}

/// What the simulator drives: a sans-IO endpoint.
pub trait Node {
    /// A datagram arrived from the network.
    fn handle_datagram(&mut self, now: Instant, datagram: &[u8]);
    /// A timer armed via [`Node::poll_timeout`] may have expired.
    fn handle_timeout(&mut self, now: Instant);
    /// The next datagram to send, if any (the NIC is free).
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit>;
    /// The earliest instant at which the node wants `handle_timeout` (or
    /// `poll_transmit`, when paced) to be called.
    fn poll_timeout(&self) -> Option<Instant>;
}
