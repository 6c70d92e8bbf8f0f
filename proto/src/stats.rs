//! The endpoint's counters, each defined once.
//!
//! Every counter is one line of a table (`counters!`) that gives both the
//! struct field (read as `stats.tx_packets`, `stats.rejected.bad_tag`, …) and
//! a static description of how it is reported: its key in the "protocol"
//! object of `dlcpctl stats --json`, its Prometheus metric name, help text,
//! kind and label. [`Stats::visit`] walks every counter with its description
//! and value, so whatever exports counters (metrics, JSON, reports) lists
//! them once, here, and a new counter is a change in one place.

use crate::class::Class;
use crate::wire;

/// How a counter behaves over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only ever grows.
    Counter,
    /// Goes up and down.
    Gauge,
}

/// What a counter's values are told apart by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// One value.
    Nothing,
    /// Priority class (label `class`): one value per class, or one "unknown" bucket.
    Class,
    /// Peer rank (label `peer`): one value per rank, or one "unknown" bucket.
    Peer,
    /// Reason of a rejection (label `reason`, this name).
    Reason(&'static str),
    /// Path (label `path`): one value per path index ([`crate::paths`]).
    Path,
}

impl By {
    /// The label of the value at `index` (`None`: the unknown bucket, or no index).
    fn label(self, index: Option<usize>) -> Label {
        match self {
            By::Nothing => Label::None,
            By::Class => Label::Class(index.map(|i| i as u8)),
            By::Peer => Label::Peer(index.map(|i| i as u32)),
            By::Reason(r) => Label::Reason(r),
            By::Path => Label::Path(index.unwrap_or(0) as u16),
        }
    }
}

/// The label of one visited value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Label {
    /// No label.
    None,
    /// `class="c"`, or `class="unknown"` for `None`.
    Class(Option<u8>),
    /// `peer="r"`, or `peer="unknown"` for `None`.
    Peer(Option<u32>),
    /// `reason="name"`.
    Reason(&'static str),
    /// `path="i"`: the path index (the source port's offset from the first).
    Path(u16),
}

/// How one counter is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    /// Key in the "protocol" object of `dlcpctl stats --json`; a dot nests an
    /// object (`"rejected.bad_tag"`). A counter by class or by peer is an
    /// array under its key, in label order.
    pub json: &'static str,
    /// Prometheus metric name, without the `dlcp_` prefix and the `_total`
    /// suffix of counters; `None`: not exported as a metric.
    pub metric: Option<&'static str>,
    /// Help text of the metric (of the counter, for one that is not exported).
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// What the values are told apart by.
    pub by: By,
    /// Labels every value of this counter carries (e.g. `direction="sent"`).
    pub fixed: &'static [(&'static str, &'static str)],
}

impl Desc {
    /// A counter with one value, reported under `json` and exported as `metric`.
    pub const fn new(json: &'static str, metric: &'static str, help: &'static str) -> Desc {
        Desc { json, metric: Some(metric), help, kind: Kind::Counter, by: By::Nothing, fixed: &[] }
    }

    /// A counter reported in JSON only.
    pub const fn json_only(json: &'static str, help: &'static str) -> Desc {
        Desc { metric: None, ..Desc::new(json, "", help) }
    }

    /// The same, with values told apart by `by`.
    pub const fn by(self, by: By) -> Desc {
        Desc { by, ..self }
    }

    /// The same, with labels every value carries.
    pub const fn fixed(self, fixed: &'static [(&'static str, &'static str)]) -> Desc {
        Desc { fixed, ..self }
    }

    /// The same, as a gauge (a value that goes up and down).
    pub const fn gauge(self) -> Desc {
        Desc { kind: Kind::Gauge, ..self }
    }
}

/// Receives every counter of a [`Stats`] ([`Stats::visit`]).
pub trait StatsVisitor {
    /// One value: counter `desc`, told apart from its other values by `label`.
    fn counter(&mut self, desc: &'static Desc, label: Label, value: u64);
}

impl<F: FnMut(&'static Desc, Label, u64)> StatsVisitor for F {
    fn counter(&mut self, desc: &'static Desc, label: Label, value: u64) {
        self(desc, label, value)
    }
}

/// A number of datagrams and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketCount {
    /// Datagrams.
    pub packets: u64,
    /// Bytes (whole datagrams as received).
    pub bytes: u64,
}

impl PacketCount {
    pub(crate) fn add(&mut self, bytes: usize) {
        self.packets += 1;
        self.bytes += bytes as u64;
    }
}

/// One value or two (a [`PacketCount`]: packets, then bytes), each with a description.
#[doc(hidden)]
pub trait Cell {
    /// Value `k`.
    fn cell(&self, k: usize) -> u64;
    /// Value `k`, to change.
    fn cell_mut(&mut self, k: usize) -> &mut u64;
}

impl Cell for u64 {
    fn cell(&self, _: usize) -> u64 {
        *self
    }
    fn cell_mut(&mut self, _: usize) -> &mut u64 {
        self
    }
}

impl Cell for PacketCount {
    fn cell(&self, k: usize) -> u64 {
        if k == 0 { self.packets } else { self.bytes }
    }
    fn cell_mut(&mut self, k: usize) -> &mut u64 {
        if k == 0 { &mut self.packets } else { &mut self.bytes }
    }
}

/// What [`Counters::each`] calls per value.
#[doc(hidden)]
pub type Visit<'a> = &'a mut dyn FnMut(&'static Desc, Label, u64);
/// What [`Counters::each_mut`] calls per value.
#[doc(hidden)]
pub type VisitMut<'a> = &'a mut dyn FnMut(&'static Desc, Label, &mut u64);

/// A field of a counter table: a value, a table of values (by class or by
/// peer), or a nested counter struct (which ignores `descs`). Implemented by
/// [`counters!`](crate::counters) for the structs it declares.
#[doc(hidden)]
pub trait Counters {
    /// Every value under `descs`.
    fn each(&self, descs: &'static [Desc], f: Visit<'_>);
    /// Every value under `descs`, to change (tests set distinct values).
    fn each_mut(&mut self, descs: &'static [Desc], f: VisitMut<'_>);
}

/// Every cell of `cells` under each description (`indexed`: by position).
fn each_cell<C: Cell>(cells: &[C], indexed: bool, descs: &'static [Desc], f: Visit<'_>) {
    for (k, d) in descs.iter().enumerate() {
        for (i, c) in cells.iter().enumerate() {
            f(d, d.by.label(indexed.then_some(i)), c.cell(k));
        }
    }
}

fn each_cell_mut<C: Cell>(cells: &mut [C], indexed: bool, descs: &'static [Desc], f: VisitMut<'_>) {
    for (k, d) in descs.iter().enumerate() {
        for (i, c) in cells.iter_mut().enumerate() {
            f(d, d.by.label(indexed.then_some(i)), c.cell_mut(k));
        }
    }
}

macro_rules! cells {
    ($($ty:ty, $indexed:expr, $slice:path, $slice_mut:path;)*) => {$(
        impl Counters for $ty {
            fn each(&self, descs: &'static [Desc], f: Visit<'_>) {
                each_cell($slice(self), $indexed, descs, f)
            }
            fn each_mut(&mut self, descs: &'static [Desc], f: VisitMut<'_>) {
                each_cell_mut($slice_mut(self), $indexed, descs, f)
            }
        }
    )*};
}

cells! {
    u64, false, core::slice::from_ref, core::slice::from_mut;
    PacketCount, false, core::slice::from_ref, core::slice::from_mut;
    [u64; Class::COUNT], true, as_slice, as_mut_slice;
    [PacketCount; Class::COUNT], true, as_slice, as_mut_slice;
    Vec<u64>, true, as_slice, as_mut_slice;
    Vec<PacketCount>, true, as_slice, as_mut_slice;
}

fn as_slice<C, T: AsRef<[C]> + ?Sized>(t: &T) -> &[C] {
    t.as_ref()
}

fn as_mut_slice<C, T: AsMut<[C]> + ?Sized>(t: &mut T) -> &mut [C] {
    t.as_mut()
}

/// Declares a counter struct: each field with its doc, type and the
/// description(s) it is reported under (two for a [`PacketCount`]: packets,
/// then bytes; none for a nested counter struct). Fields are `u64`,
/// [`PacketCount`], `[u64; 8]` / `[PacketCount; 8]` (by class), `Vec<u64>` /
/// `Vec<PacketCount>` (by peer) or another struct declared this way. The
/// struct gets `visit` (every value with its [`Desc`], in declaration order)
/// and `visit_mut`. The daemon declares its own counters with it too, so a
/// counter anywhere is one line that metrics, `dlcpctl stats --json` and the
/// reports all read.
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                pub $field:ident: $ty:ty => [$($desc:expr),* $(,)?],
            )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $(
                $(#[doc = $doc])*
                pub $field: $ty,
            )*
        }

        impl $name {
            /// Calls `v` once per value of every counter, in declaration
            /// order (a table's values by label), with its description.
            pub fn visit(&self, v: &mut impl $crate::stats::StatsVisitor) {
                $crate::stats::Counters::each(self, &[], &mut |d, l, x| v.counter(d, l, x));
            }

            /// Calls `f` once per value of every counter, which it may change
            /// (tests give every counter a distinct value this way).
            pub fn visit_mut(&mut self, f: &mut dyn FnMut(&'static $crate::stats::Desc, $crate::stats::Label, &mut u64)) {
                $crate::stats::Counters::each_mut(self, &[], f)
            }
        }

        impl $crate::stats::Counters for $name {
            fn each(&self, _: &'static [$crate::stats::Desc], f: $crate::stats::Visit<'_>) {
                $({
                    const D: &[$crate::stats::Desc] = &[$($desc),*];
                    $crate::stats::Counters::each(&self.$field, D, f);
                })*
            }
            fn each_mut(&mut self, _: &'static [$crate::stats::Desc], f: $crate::stats::VisitMut<'_>) {
                $({
                    const D: &[$crate::stats::Desc] = &[$($desc),*];
                    $crate::stats::Counters::each_mut(&mut self.$field, D, f);
                })*
            }
        }
    };
}

const DROPPED: &str = "Received datagrams dropped, by reason";
const CLASS_DROPPED: &str = "Received datagrams discarded on arrival (any reason in rx_dropped but early_expired and \
                             truncated), per class their unauthenticated header claims (\"unknown\": no readable header)";
const CLASS_DROPPED_BYTES: &str = "Bytes of received datagrams discarded on arrival, per claimed class";
const PEER_DROPPED: &str = "Received datagrams discarded on arrival, per peer rank whose configured address sent them \
                            (\"unknown\": any other address)";
const PEER_DROPPED_BYTES: &str = "Bytes of received datagrams discarded on arrival, per sending peer rank";
const FLOW_GRANTS: &str = "Flow-control GRANTs (credit from receivers), by direction";
const FLOW_REQUESTS: &str = "Flow-control credit requests (a sender out of credit), by direction";
const REPAIRS: &str = "Repair DATA packets, by direction";
const CLASS_REPAIRS: &str = "Repair DATA packets per priority class, by direction";
const CLASS_REPAIR_BYTES: &str = "Bytes of repair DATA packets per priority class, by direction";
const PEER_REPAIRS: &str = "Repair DATA packets per peer rank, by direction (received: new chunks only)";
const PEER_REPAIR_BYTES: &str = "Bytes of repair DATA packets per peer rank, by direction";
const SENT: &[(&str, &str)] = &[("direction", "sent")];
const FAILURE_NOTICES: &str = "Failing DONEs (\"this rank failed the op\"): sent in answer to a peer still at a failed op, received and failing one here";
const RECEIVED: &[(&str, &str)] = &[("direction", "received")];

/// A rejection reason: JSON `rejected.<name>`, metric `rx_dropped{reason="<name>"}`.
const fn dropped(json: &'static str, reason: &'static str) -> Desc {
    Desc::new(json, "rx_dropped", DROPPED).by(By::Reason(reason))
}

crate::counters! {
    /// Counters of rejected or ignored datagrams, by reason.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct RejectCounters {
        /// Structurally malformed (length, magic, unknown `auth` byte, field values).
        pub malformed: u64 => [dropped("rejected.malformed", "malformed")],
        /// Authentication tag mismatch.
        pub bad_tag: u64 => [dropped("rejected.bad_tag", "bad_tag")],
        /// A dlcp datagram of another wire version.
        pub version_mismatch: u64 => [dropped("rejected.version_mismatch", "version_mismatch")],
        /// Sent with another packet authentication mode (`packet_auth`) than ours.
        pub auth_mismatch: u64 => [dropped("rejected.auth_mismatch", "auth_mismatch")],
        /// From a peer whose HELLO settings (chunk size) differ from ours.
        pub settings_mismatch: u64 => [dropped("rejected.settings_mismatch", "settings_mismatch")],
        /// Another job's packet.
        pub wrong_job: u64 => [dropped("rejected.wrong_job", "wrong_job")],
        /// Addressed to another rank, or from a rank outside the world.
        pub wrong_rank: u64 => [dropped("rejected.wrong_rank", "wrong_rank")],
        /// Of a session of the peer that is not its verified incarnation (an
        /// earlier one, replayed, or a new one before the handshake).
        pub unverified_session: u64 => [dropped("rejected.unverified_session", "unverified_session")],
        /// For a run this daemon has not agreed: another run's, or replayed.
        pub other_run: u64 => [dropped("rejected.other_run", "other_run")],
        /// A PROBE, BITMAP, DONE, GRANT or HELLO no newer than the last one
        /// of its kind taken from its sender: replayed or duplicated (so it
        /// starts no repair and changes no peer state).
        pub stale_control: u64 => [dropped("rejected.stale_control", "stale_control")],
        /// For an op that already finished (and no longer lingers).
        pub stale_op: u64 => [dropped("rejected.stale_op", "stale_op")],
        /// Does not fit the op's layout (chunk count, length, dtype, phase, role).
        pub mismatch: u64 => [dropped("rejected.mismatch", "mismatch")],
        /// A packet of an op whose dtype or reduction (wire version 6) is not
        /// the one this rank's op has: its ranks' trainers disagree.
        pub op_kind_mismatch: u64 => [dropped("rejected.op_kind_mismatch", "op_kind_mismatch")],
        /// A chunk that had already arrived.
        pub duplicate: u64 => [dropped("rejected.duplicate", "duplicate")],
        /// A chunk that arrived after its transfer closed.
        pub late: u64 => [dropped("rejected.late", "late")],
        /// Claims a sender rank other than the configured peer whose address
        /// it came from (`Endpoint::handle_datagram_from`).
        pub wrong_source: u64 => [dropped("rejected.wrong_source", "wrong_source")],
        /// Claims a sender rank but came from an address that is no configured
        /// peer's.
        pub unknown_source: u64 => [dropped("rejected.unknown_source", "unknown_source")],
        /// Buffered because the op had not started locally.
        pub early_buffered: u64 => [Desc::json_only(
            "rejected.early_buffered",
            "Datagrams buffered because their op had not started here yet",
        )],
        /// Dropped because the early buffer was full.
        pub early_dropped: u64 => [dropped("rejected.early_dropped", "early_dropped")],
        /// Buffered early packets discarded unused after the hard timeout.
        pub early_expired: u64 => [dropped("rejected.early_expired", "early_expired")],
        /// A failing DONE (wire version 5) for an op this rank already ended
        /// (completed, or failed itself): ignored, never answered.
        pub failure_notice_ignored: u64 => [dropped("rejected.failure_notice_ignored", "failure_notice_ignored")],
    }
}

impl RejectCounters {
    /// Datagrams discarded on arrival: every counter but `early_buffered` (kept
    /// for later) and `early_expired` (discarded later, out of the buffer).
    pub fn discarded_on_arrival(&self) -> u64 {
        let RejectCounters {
            malformed,
            bad_tag,
            version_mismatch,
            auth_mismatch,
            settings_mismatch,
            wrong_job,
            wrong_rank,
            unverified_session,
            other_run,
            stale_control,
            stale_op,
            mismatch,
            op_kind_mismatch,
            duplicate,
            late,
            wrong_source,
            unknown_source,
            early_buffered: _,
            early_dropped,
            early_expired: _,
            failure_notice_ignored,
        } = self;
        malformed
            + bad_tag
            + version_mismatch
            + auth_mismatch
            + settings_mismatch
            + wrong_job
            + wrong_rank
            + unverified_session
            + other_run
            + stale_control
            + stale_op
            + mismatch
            + op_kind_mismatch
            + duplicate
            + late
            + wrong_source
            + unknown_source
            + early_dropped
            + failure_notice_ignored
    }
}

crate::counters! {
    /// Received datagrams discarded on arrival, per class and per peer: every
    /// datagram `Endpoint::handle_datagram_from` (or `Endpoint::handle_datagram`)
    /// rejects for any reason in [`RejectCounters::discarded_on_arrival`], and every
    /// datagram the caller discards itself and reports with
    /// `Endpoint::count_dropped`. Each such datagram is counted once per table.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct RxDrops {
        /// Per class, as the datagram's fixed header claims ([`wire::peek_class`]:
        /// readable when the datagram starts with the magic and holds a whole fixed
        /// header, whatever else is wrong with it).
        pub class: [PacketCount; 8] => [
            Desc::new("rx_dropped_packets_per_class", "class_rx_dropped_packets", CLASS_DROPPED).by(By::Class),
            Desc::new("rx_dropped_bytes_per_class", "class_rx_dropped_bytes", CLASS_DROPPED_BYTES).by(By::Class),
        ],
        /// Class unreadable (too short for a fixed header, not dlcp, class out of range).
        pub unknown_class: PacketCount => [
            Desc::new("rx_dropped_unknown_class.packets", "class_rx_dropped_packets", CLASS_DROPPED).by(By::Class),
            Desc::new("rx_dropped_unknown_class.bytes", "class_rx_dropped_bytes", CLASS_DROPPED_BYTES).by(By::Class),
        ],
        /// Per peer rank the datagram came from (as the caller knows it; see
        /// `Endpoint::handle_datagram_from`).
        pub peer: Vec<PacketCount> => [
            Desc::new("rx_dropped_packets_per_peer", "peer_rx_dropped_packets", PEER_DROPPED).by(By::Peer),
            Desc::new("rx_dropped_bytes_per_peer", "peer_rx_dropped_bytes", PEER_DROPPED_BYTES).by(By::Peer),
        ],
        /// From no configured peer (or an unknown one): one bounded bucket.
        pub unknown_peer: PacketCount => [
            Desc::new("rx_dropped_unknown_peer.packets", "peer_rx_dropped_packets", PEER_DROPPED).by(By::Peer),
            Desc::new("rx_dropped_unknown_peer.bytes", "peer_rx_dropped_bytes", PEER_DROPPED_BYTES).by(By::Peer),
        ],
    }
}

crate::counters! {
    /// Per-class, per-peer and protocol counters.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct Stats {
        /// Datagrams sent per class.
        pub tx_packets: [u64; 8] => [
            Desc::new("tx_packets_per_class", "class_tx_packets", "Datagrams sent per priority class").by(By::Class),
        ],
        /// Bytes sent per class.
        pub tx_bytes: [u64; 8] => [
            Desc::new("tx_bytes_per_class", "class_tx_bytes", "Bytes sent per priority class").by(By::Class),
        ],
        /// Authenticated datagrams received per class.
        pub rx_packets: [u64; 8] => [Desc::new(
            "rx_packets_per_class",
            "class_rx_packets",
            "Authenticated datagrams received per priority class",
        )
        .by(By::Class)],
        /// Bytes received per class.
        pub rx_bytes: [u64; 8] => [Desc::new(
            "rx_bytes_per_class",
            "class_rx_bytes",
            "Authenticated bytes received per priority class",
        )
        .by(By::Class)],
        /// Datagrams sent per peer.
        pub tx_packets_peer: Vec<u64> => [
            Desc::new("tx_packets_per_peer", "peer_tx_packets", "Datagrams sent per peer rank").by(By::Peer),
        ],
        /// Bytes sent per peer.
        pub tx_bytes_peer: Vec<u64> => [
            Desc::new("tx_bytes_per_peer", "peer_tx_bytes", "Bytes sent per peer rank").by(By::Peer),
        ],
        /// Authenticated datagrams received per peer.
        pub rx_packets_peer: Vec<u64> => [Desc::new(
            "rx_packets_per_peer",
            "peer_rx_packets",
            "Authenticated datagrams received per peer rank",
        )
        .by(By::Peer)],
        /// Authenticated bytes received per peer.
        pub rx_bytes_peer: Vec<u64> => [Desc::new(
            "rx_bytes_per_peer",
            "peer_rx_bytes",
            "Authenticated bytes received per peer rank",
        )
        .by(By::Peer)],
        /// Datagrams sent per path, every peer's path `i` together (one path
        /// unless `paths` > 1; see [`crate::paths`]).
        pub tx_packets_path: Vec<u64> => [
            Desc::new("tx_packets_per_path", "path_tx_packets", "Datagrams sent per path (source port offset), all peers")
                .by(By::Path),
        ],
        /// DATA chunks receivers reported missing, per path they were sent on.
        pub lost_path: Vec<u64> => [Desc::new(
            "lost_per_path",
            "path_lost",
            "DATA chunks the receivers reported missing, per path they were sent on",
        )
        .by(By::Path)],
        /// The lowest weight any peer gives each path (1024: healthy; a path
        /// whose losses stand out is cut to 16 and probed back).
        pub path_weight: Vec<u64> => [Desc::new(
            "weight_per_path",
            "path_weight",
            "Lowest share weight any peer gives the path (1024 healthy, 16 cut for loss)",
        )
        .by(By::Path)
        .gauge()],
        /// Received datagrams discarded on arrival, per class and per peer.
        pub rx_dropped: RxDrops => [],
        /// Rejections.
        pub rejected: RejectCounters => [],
        /// Repair DATA packets sent.
        pub repairs_sent: u64 => [Desc::new("repairs_sent", "repairs", REPAIRS).fixed(SENT)],
        /// Repair DATA packets received (new chunks).
        pub repairs_received: u64 => [Desc::new("repairs_received", "repairs", REPAIRS).fixed(RECEIVED)],
        /// Repair DATA packets sent, per class.
        pub repairs_sent_per_class: [u64; 8] => [
            Desc::new("repairs_sent_per_class", "class_repairs", CLASS_REPAIRS).by(By::Class).fixed(SENT),
        ],
        /// Repair DATA packets received, per class.
        pub repairs_received_per_class: [u64; 8] => [
            Desc::new("repairs_received_per_class", "class_repairs", CLASS_REPAIRS).by(By::Class).fixed(RECEIVED),
        ],
        /// Bytes of repair DATA packets sent, per class.
        pub repair_bytes_sent_per_class: [u64; 8] => [
            Desc::new("repair_bytes_sent_per_class", "class_repair_bytes", CLASS_REPAIR_BYTES)
                .by(By::Class)
                .fixed(SENT),
        ],
        /// Bytes of repair DATA packets received (new chunks), per class.
        pub repair_bytes_received_per_class: [u64; 8] => [
            Desc::new("repair_bytes_received_per_class", "class_repair_bytes", CLASS_REPAIR_BYTES)
                .by(By::Class)
                .fixed(RECEIVED),
        ],
        /// Repair DATA packets (and bytes) sent, per peer.
        pub repairs_sent_peer: Vec<PacketCount> => [
            Desc::new("repairs_sent_per_peer", "peer_repairs", PEER_REPAIRS).by(By::Peer).fixed(SENT),
            Desc::new("repair_bytes_sent_per_peer", "peer_repair_bytes", PEER_REPAIR_BYTES).by(By::Peer).fixed(SENT),
        ],
        /// Repair DATA packets (and bytes) received (new chunks), per peer.
        pub repairs_received_peer: Vec<PacketCount> => [
            Desc::new("repairs_received_per_peer", "peer_repairs", PEER_REPAIRS).by(By::Peer).fixed(RECEIVED),
            Desc::new("repair_bytes_received_per_peer", "peer_repair_bytes", PEER_REPAIR_BYTES)
                .by(By::Peer)
                .fixed(RECEIVED),
        ],
        /// Flow control: GRANTs sent (credit given to senders).
        pub flow_grants_sent: u64 => [Desc::new("flow.grants_sent", "flow_grants", FLOW_GRANTS).fixed(SENT)],
        /// Flow control: GRANTs received.
        pub flow_grants_received: u64 => [Desc::new("flow.grants_received", "flow_grants", FLOW_GRANTS).fixed(RECEIVED)],
        /// Flow control: packets other than GRANTs whose piggybacked credit
        /// (version 9) gave this rank new credit towards their sender.
        pub flow_credit_piggybacked: u64 => [Desc::new(
            "flow.credit_piggybacked",
            "flow_credit_piggybacked",
            "Packets other than GRANTs whose piggybacked credit gave new credit towards their sender",
        )],
        /// Flow control: credit requests sent (out of credit, no GRANT for a retry timeout).
        pub flow_requests_sent: u64 => [Desc::new("flow.requests_sent", "flow_credit_requests", FLOW_REQUESTS).fixed(SENT)],
        /// Flow control: credit requests received.
        pub flow_requests_received: u64 => [
            Desc::new("flow.requests_received", "flow_credit_requests", FLOW_REQUESTS).fixed(RECEIVED),
        ],
        /// Flow control: a sender's window halved by this receiver (a run of
        /// its datagrams lost on the way: a queue overflowed).
        pub flow_window_cuts: u64 => [Desc::new(
            "flow.window_cuts",
            "flow_window_cuts",
            "Senders' flow-control windows halved by this receiver after a run of their datagrams was lost",
        )],
        /// Flow control: DATA datagrams that waited for their receiver's credit.
        pub flow_credit_waits: u64 => [Desc::new(
            "flow.credit_waits",
            "flow_credit_waits",
            "DATA datagrams that waited for their receiver's credit (flow control)",
        )],
        /// PROBEs sent (every copy counts; see [`crate::endpoint::PROBE_COPIES`]).
        pub probes_sent: u64 => [Desc::new(
            "probes_sent",
            "probes_sent",
            "PROBEs sent (\"I have sent through chunk X\"; every copy counts)",
        )],
        /// ACKs sent (wire version 10): each acknowledges the exact
        /// all-gathers of up to 64 ops from one owner ([`crate::wire::AckEntry`]).
        pub acks_sent: u64 => [Desc::new(
            "acks_sent",
            "acks_sent",
            "ACKs sent: one per owner per ACK delay, acknowledging every all-gather received whole meanwhile",
        )],
        /// ACK entries received that ended an all-gather transfer of an op in flight.
        pub acks_received: u64 => [Desc::new(
            "acks_received",
            "acks_received",
            "ACK entries received that ended an all-gather transfer of an op in flight here",
        )],
        /// Ops whose result went to the trainer but whose all-gather a receiver
        /// never acknowledged before the hard timeout (a receiver left or failed).
        pub unacknowledged: u64 => [Desc::new(
            "unacknowledged",
            "unacknowledged_ops",
            "Delivered ops whose all-gather some receiver never acknowledged before the hard timeout",
        )],
        /// Redundant PROBE copies received (same sequence number as one already
        /// acted on) and ignored.
        pub probes_duplicate: u64 => [Desc::new(
            "probes_duplicate",
            "probes_duplicate",
            "Redundant PROBE copies received (every PROBE is sent twice) and ignored",
        )],
        /// Receive deadlines that fired (`deadline_closes + deadline_nacks`).
        pub deadlines_fired: u64 => [Desc::new(
            "deadlines_fired",
            "deadlines_fired",
            "Receive deadlines that fired (deadline_closes + deadline_nacks)",
        )],
        /// Receive transfers a deadline ended: within budget, NACKed once, and
        /// still no PROBE from the sender one retry later, so the receiver closed
        /// on its own.
        pub deadline_closes: u64 => [Desc::new(
            "deadline_closes",
            "deadline_closes",
            "Receive transfers a deadline ended: within budget, NACKed once, and still no PROBE from the sender",
        )],
        /// Deadlines that re-sent the receiver's BITMAP (a NACK) to a sender gone
        /// quiet: always the first firing (a within-budget BITMAP makes the sender
        /// PROBE at once), and every firing while the transfer is not yet within
        /// budget; the transfer goes on.
        pub deadline_nacks: u64 => [Desc::new(
            "deadline_nacks",
            "deadline_nacks",
            "Deadlines that re-sent the receiver's BITMAP (a NACK) to a sender gone quiet; the transfer goes on",
        )],
        /// Receivers' quiet-timer NACKs (wire version 6): a sender's chunks
        /// stopped before its LAST DATA for longer than their spacing
        /// explains (the tail of the round was probably lost), so the
        /// receiver sent its BITMAP; the transfer goes on.
        pub quiet_nacks: u64 => [Desc::new(
            "quiet_nacks",
            "quiet_nacks",
            "BITMAPs (NACKs) a receiver sent when a sender's chunks stopped before its LAST DATA (tail loss)",
        )],
        /// Packet keys derived from the job secret for checking received tags
        /// (cache misses: a few per peer incarnation, one per datagram with a
        /// forged sender).
        pub key_derivations: u64 => [Desc::new(
            "key_derivations",
            "key_derivations",
            "Packet keys derived to check received tags (a few per peer incarnation; more means forged senders)",
        )],
        /// Ops failed by the hard timeout.
        pub hard_timeouts: u64 => [Desc::new("hard_timeouts", "hard_timeouts", "Ops failed by the hard timeout")],
        /// Ops the hard timeout found waiting on ranks that were up but had not
        /// started them (their trainers late): they waited on, up to the op
        /// deadline, instead of failing.
        pub late_rank_waits: u64 => [Desc::new(
            "late_rank_waits",
            "late_rank_waits",
            "Ops that waited past the hard timeout for ranks up but not yet started on them (trainers late)",
        )],
        /// Ops this rank will never start (a trainer of its host that held or
        /// owed a contribution is gone), remembered as failed so the peers
        /// that ask are told ([`crate::endpoint::Endpoint::abandon`]).
        pub ops_abandoned: u64 => [Desc::new(
            "ops_abandoned",
            "ops_abandoned",
            "Ops never started here because a local trainer left; peers asking about them are told it failed",
        )],
        /// Ops completed.
        pub ops_completed: u64 => [Desc::json_only("ops_completed", "Allreduce ops the endpoint completed")],
        /// Ops failed.
        pub ops_failed: u64 => [Desc::json_only("ops_failed", "Allreduce ops the endpoint failed")],
        /// Failing DONEs sent (wire version 5): answers to a peer's PROBE,
        /// BITMAP or DATA for an op this rank failed, at most one per peer
        /// per op per probe interval.
        pub failure_notices_sent: u64 => [Desc::new("failure_notices_sent", "failure_notices", FAILURE_NOTICES).fixed(SENT)],
        /// Failing DONEs received that failed an op here ([`crate::endpoint::OpError::PeerFailed`]).
        pub failure_notices_received: u64 => [
            Desc::new("failure_notices_received", "failure_notices", FAILURE_NOTICES).fixed(RECEIVED)
        ],
        /// Transfers closed within budget but not complete.
        pub closed_within_budget: u64 => [Desc::json_only(
            "closed_within_budget",
            "Receive transfers closed within their loss budget but not complete",
        )],
    }
}

impl Stats {
    /// Zero counters for a world of `world` ranks (per-peer tables sized).
    pub fn new(world: usize) -> Stats {
        Stats {
            tx_packets_peer: vec![0; world],
            tx_bytes_peer: vec![0; world],
            rx_packets_peer: vec![0; world],
            rx_bytes_peer: vec![0; world],
            rx_dropped: RxDrops { peer: vec![PacketCount::default(); world], ..RxDrops::default() },
            repairs_sent_peer: vec![PacketCount::default(); world],
            repairs_received_peer: vec![PacketCount::default(); world],
            ..Stats::default()
        }
    }

    /// Count a datagram of `len` bytes sent to `peer` in `class`.
    pub(crate) fn count_tx(&mut self, peer: u32, class: Class, len: usize) {
        self.tx_packets[class.index()] += 1;
        self.tx_bytes[class.index()] += len as u64;
        self.tx_packets_peer[peer as usize] += 1;
        self.tx_bytes_peer[peer as usize] += len as u64;
    }

    /// Count an authenticated datagram of `len` bytes from `peer` in `class`.
    pub(crate) fn count_rx(&mut self, peer: u32, class: Class, len: usize) {
        self.rx_packets[class.index()] += 1;
        self.rx_bytes[class.index()] += len as u64;
        self.rx_packets_peer[peer as usize] += 1;
        self.rx_bytes_peer[peer as usize] += len as u64;
    }

    /// Count a repair DATA packet of `len` bytes sent to `peer`.
    pub(crate) fn count_repair_sent(&mut self, peer: u32, class: Class, len: usize) {
        self.repairs_sent += 1;
        self.repairs_sent_per_class[class.index()] += 1;
        self.repair_bytes_sent_per_class[class.index()] += len as u64;
        self.repairs_sent_peer[peer as usize].add(len);
    }

    /// Count a repair DATA packet (a new chunk) of `len` bytes from `peer`.
    pub(crate) fn count_repair_received(&mut self, peer: u32, class: Class, len: usize) {
        self.repairs_received += 1;
        self.repairs_received_per_class[class.index()] += 1;
        self.repair_bytes_received_per_class[class.index()] += len as u64;
        if let Some(p) = self.repairs_received_peer.get_mut(peer as usize) {
            p.add(len);
        }
    }

    /// Count a received datagram discarded on arrival in [`Stats::rx_dropped`]:
    /// class from its header when readable, peer `from` (`None` or out of
    /// range: unknown).
    pub(crate) fn count_dropped(&mut self, datagram: &[u8], from: Option<u32>) {
        let d = &mut self.rx_dropped;
        match wire::peek_class(datagram) {
            Some(c) => d.class[c.index()].add(datagram.len()),
            None => d.unknown_class.add(datagram.len()),
        }
        match from.and_then(|p| d.peer.get_mut(p as usize)) {
            Some(p) => p.add(datagram.len()),
            None => d.unknown_peer.add(datagram.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Every number in a `Debug` rendering (only counters are numbers in `Stats`).
    fn numbers(s: &str) -> Vec<u64> {
        s.split(|c: char| !c.is_ascii_digit()).filter(|w| !w.is_empty()).map(|w| w.parse().unwrap()).collect()
    }

    #[test]
    fn the_visitor_reports_every_counter_once_under_unique_names() {
        let world = 3;
        let mut s = Stats::new(world);
        s.tx_packets_path = vec![0; 2];
        s.lost_path = vec![0; 2];
        s.path_weight = vec![0; 2];
        let mut next = 1_000_000u64;
        s.visit_mut(&mut |_, _, v| {
            next += 1;
            *v = next;
        });
        let mut seen = Vec::new();
        let mut json = HashSet::new();
        let mut metric = HashSet::new();
        s.visit(&mut |d: &'static Desc, l: Label, v: u64| {
            seen.push(v);
            // JSON: a key holds one value, or one per class / per peer.
            assert!(json.insert((d.json, l)), "json key {} {l:?} twice", d.json);
            if let Some(m) = d.metric {
                assert!(metric.insert((m, d.fixed, l)), "metric {m} {:?} {l:?} twice", d.fixed);
                assert!(!d.help.is_empty());
            }
            match (d.by, l) {
                (By::Nothing, Label::None) | (By::Reason(_), Label::Reason(_)) => {}
                (By::Class, Label::Class(c)) => assert!(c.is_none_or(|c| usize::from(c) < Class::COUNT)),
                (By::Peer, Label::Peer(p)) => assert!(p.is_none_or(|p| (p as usize) < world)),
                (By::Path, Label::Path(p)) => assert!(p < 2),
                other => panic!("{} labelled {other:?}", d.json),
            }
        });
        // Every value the visitor saw is one it was given, in the same order.
        let given: Vec<u64> = (1_000_001..=next).collect();
        assert_eq!(seen, given);
        // And the struct holds no counter the visitor did not see: every number
        // in its Debug rendering is one of them, each exactly once.
        let mut in_debug = numbers(&format!("{s:?}"));
        in_debug.sort_unstable();
        assert_eq!(in_debug, given);
        // 4×8 + 4×3 per class / per peer, 3×2 per path, 2×(8+1+3+1) dropped,
        // 21 reasons, 2 + 4×8 + 2×2×3 repairs, 7 flow control, 18 others.
        assert_eq!(given.len(), 32 + 12 + 6 + 26 + 21 + 2 + 32 + 12 + 7 + 18);
    }

    #[test]
    fn names_match_what_the_daemon_exports() {
        let mut s = Stats::new(2);
        s.rejected.bad_tag = 5;
        s.rx_dropped.unknown_peer = PacketCount { packets: 2, bytes: 90 };
        s.repairs_sent_peer[1] = PacketCount { packets: 3, bytes: 300 };
        s.tx_packets[7] = 8;
        let mut got = Vec::new();
        s.visit(&mut |d: &'static Desc, l: Label, v: u64| {
            if v > 0 {
                got.push((d.json, d.metric, d.fixed, l, v));
            }
        });
        let sent: &[(&str, &str)] = &[("direction", "sent")];
        assert_eq!(
            got,
            [
                ("tx_packets_per_class", Some("class_tx_packets"), &[][..], Label::Class(Some(7)), 8),
                (
                    "rx_dropped_unknown_peer.packets",
                    Some("peer_rx_dropped_packets"),
                    &[],
                    Label::Peer(None),
                    2
                ),
                ("rx_dropped_unknown_peer.bytes", Some("peer_rx_dropped_bytes"), &[], Label::Peer(None), 90),
                ("rejected.bad_tag", Some("rx_dropped"), &[], Label::Reason("bad_tag"), 5),
                ("repairs_sent_per_peer", Some("peer_repairs"), sent, Label::Peer(Some(1)), 3),
                ("repair_bytes_sent_per_peer", Some("peer_repair_bytes"), sent, Label::Peer(Some(1)), 300),
            ]
        );
    }
}
