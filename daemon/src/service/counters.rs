//! The service's own counters (the protocol's and the datapath's are kept by
//! the endpoint and the datapath). Every part of the service adds to them; the
//! admin protocol and the metrics read them.

use serde::Serialize;

/// Counters of the service itself (the protocol's and datapath's are separate).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServiceCounters {
    /// Trainers attached since start.
    pub trainers_attached: u64,
    /// Trainers whose control socket closed.
    pub trainers_gone: u64,
    /// Trainers refused (other job, handshake failure, policy).
    pub trainers_refused: u64,
    /// Valid submissions received.
    pub submissions: u64,
    /// Submissions rejected by descriptor validation.
    pub submissions_rejected: u64,
    /// Local ops whose trainers disagreed (length, layer, tensor).
    pub local_mismatch: u64,
    /// Ops started on the network.
    pub ops_started: u64,
    /// Ops completed.
    pub ops_completed: u64,
    /// Ops failed (timeout, peer restart, local trainer gone).
    pub ops_failed: u64,
    /// Completions that could not be posted (trainer's completion ring full).
    pub completions_dropped: u64,
    /// Datagrams whose source address does not match the rank they claim: a
    /// copy of the endpoint's `rejected.wrong_source` (the endpoint checks),
    /// kept under this name for `dlcpctl stats` and the metrics.
    pub rx_wrong_source: u64,
    /// Datagrams from addresses that are no peer: a copy of the endpoint's
    /// `rejected.unknown_source`, kept under this name like `rx_wrong_source`.
    pub rx_unknown_source: u64,
    /// Datagrams dropped on purpose by the datapath's fault injector (receive
    /// loss of `dlcpd demo --loss` and the `--debug-rx-loss` test knob).
    pub rx_debug_dropped: u64,
    /// Configuration reloads that loaded (see `crate::hot_reload`).
    pub reloads_ok: u64,
    /// Configuration reloads rejected (the file did not load; old config kept).
    pub reloads_failed: u64,
}
