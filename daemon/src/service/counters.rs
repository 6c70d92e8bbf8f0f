//! The service's own counters (the protocol's and the datapath's are kept by
//! the endpoint and the datapath), and [`Snapshot`]: the values read off the
//! running service when it reports. Every part of the service adds to the
//! counters; the admin protocol and the metrics read them, each counter
//! through its one description here (see `dlcp_proto::counters!`).

use dlcp_proto::stats::{By, Desc};

const DROPPED: &str = "Received datagrams dropped, by reason";
const OPS: &str = "Allreduce ops, by outcome";
const RELOADS: &str = "Configuration reloads, by result";
const RING_USED: &str = "Shared-memory ring entries in use, summed over trainers";
const REFUSED: &str = "Connections on the admin and control sockets closed unserved, by reason \
                       (busy: over the cap; timeout: past control.request_timeout_ms; denied: not permitted)";

dlcp_proto::counters! {
    /// Counters of the service itself (`service` in `dlcpctl stats --json`).
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct ServiceCounters {
        /// Datagrams received from configured peers, per path: the offset of
        /// their source port from the peer's `[[peers]]` port (`network.paths`).
        pub rx_packets_path: Vec<u64> => [Desc::new(
            "rx_packets_per_path",
            "path_rx_packets",
            "Datagrams received from configured peers, per path (source port offset from the peer's port)",
        )
        .by(By::Path)],
        /// Trainers attached since start.
        pub trainers_attached: u64 => [Desc::new(
            "trainers_attached",
            "trainers_attached",
            "Trainers attached since start",
        )],
        /// Trainers whose control socket closed.
        pub trainers_gone: u64 => [Desc::new(
            "trainers_gone",
            "trainers_gone",
            "Trainers whose control socket closed (their shared memory reclaimed)",
        )],
        /// Trainers refused (other job, attachment limits, handshake failure, policy).
        pub trainers_refused: u64 => [Desc::new(
            "trainers_refused",
            "trainers_refused",
            "Trainers refused (other job, other local world, attachment limits, handshake failure, policy)",
        )],
        /// Valid submissions received.
        pub submissions: u64 => [Desc::new("submissions", "submissions", "Valid submissions received")],
        /// Submissions rejected by descriptor validation.
        pub submissions_rejected: u64 => [Desc::new(
            "submissions_rejected",
            "submissions_rejected",
            "Submissions rejected (descriptor validation, arena copy)",
        )],
        /// Times the daemon left descriptors on a submission ring because it
        /// held `shm.max_ops_in_flight` local ops (back-pressure).
        pub ops_throttled: u64 => [Desc::new(
            "ops_throttled",
            "ops_throttled",
            "Times descriptors were left on a submission ring because the daemon held shm.max_ops_in_flight ops",
        )],
        /// Local ops whose trainers disagreed (length, layer, tensor).
        pub local_mismatch: u64 => [Desc::new(
            "local_mismatch",
            "local_mismatches",
            "Local ops whose trainers disagreed (length, layer), or a duplicate submission",
        )],
        /// Ops started on the network.
        pub ops_started: u64 => [Desc::new("ops_started", "ops", OPS).fixed(&[("outcome", "started")])],
        /// Ops completed.
        pub ops_completed: u64 => [Desc::new("ops_completed", "ops", OPS).fixed(&[("outcome", "completed")])],
        /// Ops failed (timeout, peer restart, local trainer gone).
        pub ops_failed: u64 => [Desc::new("ops_failed", "ops", OPS).fixed(&[("outcome", "failed")])],
        /// Completions that could not be posted (trainer's completion ring full).
        pub completions_dropped: u64 => [Desc::new(
            "completions_dropped",
            "completions_dropped",
            "Completions that could not be posted (the trainer's completion ring was full)",
        )],
        /// Datagrams dropped on purpose by the datapath's fault injector (receive
        /// loss of `dlcpd demo --loss` and the `--debug-rx-loss` test knob).
        pub rx_debug_dropped: u64 => [Desc::new("rx_debug_dropped", "rx_dropped", DROPPED)
            .by(By::Reason("debug_loss"))],
        /// Admin connections closed at once: `control.max_admin_connections` were open.
        pub refused_admin_busy: u64 => [Desc::new("connections_refused.admin_busy", "connections_refused", REFUSED)
            .by(By::Reason("admin_busy"))],
        /// Admin connections unfinished at `control.request_timeout_ms`, closed.
        pub refused_admin_timeout: u64 => [Desc::new(
            "connections_refused.admin_timeout",
            "connections_refused",
            REFUSED,
        )
        .by(By::Reason("admin_timeout"))],
        /// Admin requests the peer may not make (see `admin_socket`).
        pub refused_admin_denied: u64 => [Desc::new(
            "connections_refused.admin_denied",
            "connections_refused",
            REFUSED,
        )
        .by(By::Reason("admin_denied"))],
        /// Trainers turned away at once: `control.max_pending_attaches` handshakes were in progress.
        pub refused_attach_busy: u64 => [Desc::new(
            "connections_refused.attach_busy",
            "connections_refused",
            REFUSED,
        )
        .by(By::Reason("attach_busy"))],
        /// Attach handshakes unfinished at `control.request_timeout_ms`, closed.
        pub refused_attach_timeout: u64 => [Desc::new(
            "connections_refused.attach_timeout",
            "connections_refused",
            REFUSED,
        )
        .by(By::Reason("attach_timeout"))],
        /// Configuration reloads that loaded (see `crate::hot_reload`).
        pub reloads_ok: u64 => [Desc::new("reloads_ok", "config_reloads", RELOADS).fixed(&[("result", "ok")])],
        /// Configuration reloads rejected (the file did not load; old config kept).
        pub reloads_failed: u64 => [Desc::new("reloads_failed", "config_reloads", RELOADS)
            .fixed(&[("result", "rejected")])],
    }
}

dlcp_proto::counters! {
    /// Values read off the running service each time it reports (gauges, and
    /// counters kept by its parts), with where each is reported: JSON keys are
    /// relative to the top of `dlcpctl stats --json`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct Snapshot {
        /// Trainers attached now.
        pub trainers: u64 => [Desc::new("trainers", "trainers", "Trainers attached").gauge()],
        /// Local ops held (collecting contributions, waiting for their run, or in flight).
        pub local_ops: u64 => [Desc::new(
            "local_ops",
            "local_ops",
            "Local ops held (collecting contributions, waiting for their run, or in flight)",
        )
        .gauge()],
        /// Ops in flight on the network.
        pub ops_in_flight: u64 => [Desc::new(
            "protocol.ops_in_flight",
            "ops_in_flight",
            "Allreduce ops in flight",
        )
        .gauge()],
        /// Ops submitted but waiting for the job's daemons to agree on their run.
        pub ops_held: u64 => [Desc::new(
            "protocol.ops_held",
            "ops_held",
            "Allreduce ops waiting for the job's daemons to agree on their run",
        )
        .gauge()],
        /// Current pacing rate, bytes per second (0 = unpaced).
        pub pacing_rate: u64 => [Desc::new(
            "pacing_rate_bytes_per_sec",
            "pacing_rate_bytes_per_second",
            "Current pacing rate (0 = unpaced)",
        )
        .gauge()],
        /// Per peer rank: 1 if heard from within the peer timeout (this rank: 1
        /// in JSON; not exported as a metric, a daemon is not its own peer).
        pub peer_up: Vec<u64> => [Desc::new(
            "peer_up",
            "peer_up",
            "1 if the peer was heard from within the peer timeout (one series per other rank)",
        )
        .gauge()
        .by(By::Peer)],
        /// Submission ring entries waiting, summed over trainers.
        pub sq_used: u64 => [Desc::new("shm.sq_used", "shm_ring_used_entries", RING_USED)
            .gauge()
            .fixed(&[("ring", "submission")])],
        /// Completion ring entries not yet taken by trainers, summed.
        pub cq_used: u64 => [Desc::new("shm.cq_used", "shm_ring_used_entries", RING_USED)
            .gauge()
            .fixed(&[("ring", "completion")])],
        /// Ring capacity (entries of one ring) summed over trainers.
        pub ring_capacity: u64 => [Desc::new(
            "shm.ring_capacity",
            "shm_ring_capacity_entries",
            "Entries of one ring, summed over trainers",
        )
        .gauge()],
        /// Shared-memory segments created for trainers since start.
        pub shm_attached: u64 => [Desc::new(
            "shm.attached",
            "shm_segments_created",
            "Shared-memory segments created for trainers since start",
        )],
        /// Admin connections open now.
        pub admin_connections: u64 => [Desc::new(
            "connections.admin_open",
            "local_connections",
            "Connections open now: admin (dlcpctl) and attach handshakes in progress",
        )
        .gauge()
        .fixed(&[("socket", "admin")])],
        /// Attach handshakes in progress now.
        pub attach_handshakes: u64 => [Desc::new(
            "connections.attach_pending",
            "local_connections",
            "Connections open now: admin (dlcpctl) and attach handshakes in progress",
        )
        .gauge()
        .fixed(&[("socket", "control")])],
        /// Descriptors the shared-memory channel rejected, over attached trainers.
        pub rejected_descriptors: u64 => [Desc::new(
            "shm.rejected_descriptors",
            "shm_rejected_descriptors",
            "Submission descriptors the channel rejected, summed over attached trainers",
        )
        .gauge()],
        /// Failure reasons not told to trainers (their control socket was full).
        pub reasons_dropped: u64 => [Desc::new(
            "shm.reasons_dropped",
            "shm_failure_reasons_dropped",
            "Reasons for failed ops not told to the trainer (its control socket was full), summed over attached trainers",
        )
        .gauge()],
    }
}
