//! What every op's handlers share with the endpoint: the configuration, the
//! transmit queues, the counters and the learned timing (probe RTT, receive
//! deadlines, how far PROBEs overtake data), the paths datagrams are sprayed
//! over and their health, and the framing of packets: this incarnation's
//! packet key and packet numbers.

use std::cell::Cell;

use crate::class::Class;
use crate::endpoint::acks::Acks;
use crate::endpoint::api::{EndpointConfig, OpId};
use crate::endpoint::tx::TxQueues;
use crate::estimator::{DeadlineEstimator, RttEstimator};
use crate::flow::Flow;
use crate::paths::{FULL, Paths};
use crate::run::Runs;
use crate::stats::Stats;
use crate::time::{Duration, Instant};
use crate::transfer::Retry;
use crate::wire::{self, Header, MacKey, PacketType, Phase};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Shared {
    pub cfg: EndpointConfig,
    pub tx: TxQueues,
    pub stats: Stats,
    pub rtt: RttEstimator,
    /// Receive deadline estimators, per phase (`[scatter, gather]`).
    pub deadlines: [DeadlineEstimator; 2],
    /// How far PROBEs were recently seen to overtake the chunk they name
    /// (see [`Shared::close_grace`]).
    pub overtake: Duration,
    /// This incarnation's packet key (job, rank, session).
    pub key: MacKey,
    /// The packet number (nonce) of the next datagram sealed: never repeats
    /// under `key` (see `wire::mac`).
    next_packet: Cell<u64>,
    /// Credit towards and from every peer, and how many DATA datagrams went
    /// each way ([`crate::flow`]): a PROBE names how many its sender sent.
    pub flow: Flow,
    /// The job's runs: this daemon's, its peers', the agreed ones ([`crate::run`]).
    pub runs: Runs,
    /// The paths towards every peer and their health ([`crate::paths`]).
    pub paths: Paths,
    /// How lossy the network has been lately ([`LossMeter`]).
    pub loss: LossMeter,
    /// Exact all-gathers received whole, to acknowledge ([`Acks`]).
    pub acks: Acks,
    /// An op reduced, or stopped holding its peers' all-gather back, since
    /// the endpoint last looked: it wants that DATA now, and a peer it held
    /// back may need credit (`Endpoint::release_credit`).
    pub want_grew: bool,
    /// A DATA datagram from this peer (with BACKLOG?) is being handled:
    /// whether it earns a GRANT is decided after (`grant_after_data`).
    pub grant_check: Option<(u32, bool)>,
}

/// The share of this rank's first-pass DATA it had to repair lately: the
/// counts halve every 2^15 chunks sent, so the meter follows the last few
/// tens of thousands. On a network that loses more than one chunk in a
/// thousand, a transfer's LAST DATA is lost often enough that waiting for
/// the receiver's quiet timer would set the op's pace, and senders follow
/// the LAST with a PROBE at once (see [`crate::transfer`]); on a clean one
/// they send none.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LossMeter {
    sent: u32,
    lost: u32,
}

impl LossMeter {
    /// A first-pass chunk went out.
    pub(crate) fn sent(&mut self) {
        self.sent += 1;
        if self.sent >= 1 << 15 {
            self.sent /= 2;
            self.lost /= 2;
        }
    }

    /// `k` chunks are repaired.
    pub(crate) fn lost(&mut self, k: u32) {
        self.lost = self.lost.saturating_add(k).min(self.sent.max(k));
    }

    /// More than one chunk in a thousand needed repair lately.
    pub(crate) fn lossy(&self) -> bool {
        u64::from(self.lost) * 1000 > u64::from(self.sent)
    }
}

impl Shared {
    /// Fresh state for `cfg`.
    pub(crate) fn new(cfg: EndpointConfig) -> Shared {
        let t = cfg.timers;
        let deadline = || DeadlineEstimator::new(t.initial_per_chunk, t.deadline_min, t.deadline_max);
        let me = wire::SenderId { job: cfg.job, rank: cfg.rank, session: cfg.session };
        let paths = Paths::new(cfg.paths, cfg.world, cfg.session ^ u64::from(cfg.rank), Instant::ZERO);
        let n = usize::from(paths.count());
        let mut stats = Stats::new(cfg.world as usize);
        stats.tx_packets_path = vec![0; n];
        stats.lost_path = vec![0; n];
        stats.path_weight = vec![u64::from(FULL); n];
        Shared {
            tx: TxQueues::default(),
            stats,
            paths,
            loss: LossMeter::default(),
            acks: Acks::new(cfg.world),
            want_grew: false,
            grant_check: None,
            rtt: RttEstimator::new(t.probe_initial, t.probe_min, t.probe_max),
            deadlines: [deadline(), deadline()],
            overtake: Duration::ZERO,
            key: cfg.key.sender_key(me),
            next_packet: Cell::new(0),
            flow: Flow::new(cfg.flow, cfg.world),
            runs: Runs::new(cfg.rank, cfg.world, cfg.job, cfg.session),
            cfg,
        }
    }

    /// This rank.
    pub(crate) fn me(&self) -> u32 {
        self.cfg.rank
    }

    /// Bytes of a chunk, and of a bitmap segment.
    pub(crate) fn seg_bytes(&self) -> usize {
        self.cfg.chunk_bytes
    }

    /// The retry timing transfers use now.
    pub(crate) fn retry(&self) -> Retry {
        let t = self.cfg.timers;
        Retry {
            rto: self.rtt.timeout(),
            probe_max: t.probe_max,
            deadline_min: t.deadline_min,
            deadline_max: t.deadline_max,
            hold: Duration::ZERO,
        }
    }

    /// The retry timing of a receive transfer from `peer` at `now`: a
    /// deadline takes the sender for quiet only after a silence twice as
    /// long as the pauses it was seen to come back from ([`Flow::pause`]);
    /// where the network lost next to nothing lately, chunks the sender sent
    /// and this rank has not seen are taken for on their way for as long
    /// after the transfer's latest chunk (`Retry::hold`).
    pub(crate) fn retry_from(&self, peer: u32, now: Instant) -> Retry {
        let retry = self.retry();
        let pause = self.flow.pause(peer, now).saturating_mul(2).min(retry.deadline_max);
        Retry {
            deadline_min: retry.deadline_min.max(pause),
            hold: if self.loss.lossy() { Duration::ZERO } else { pause },
            ..retry
        }
    }

    /// How long a receiver waits after a PROBE for chunks it may have overtaken:
    /// the configured `close_grace`, or longer when PROBEs were seen to
    /// overtake data by more (deep switch queues under incast). Answering
    /// before the queued chunks land would NACK chunks that are not lost, and
    /// their repairs would deepen the very queues that delayed them.
    pub(crate) fn close_grace(&self) -> Duration {
        let t = self.cfg.timers;
        if t.close_grace.is_zero() {
            return Duration::ZERO;
        }
        t.close_grace.max((self.overtake * 3 / 2).min(t.deadline_min))
    }

    /// A PROBE overtook the chunk it named by `d`: track the largest recent
    /// overtake (jump up at once, decay by 1/8 per observation).
    pub(crate) fn observe_overtake(&mut self, d: Duration) {
        let est = self.overtake;
        self.overtake = d.max(est - est / 8 + d / 8);
    }

    /// A header from this rank to `peer` about op `id`.
    pub(crate) fn header(&self, ty: PacketType, class: Class, phase: Phase, id: OpId, peer: u32) -> Header {
        let mut h = Header::new(ty, class, phase);
        h.job = self.cfg.job;
        h.src = self.cfg.rank;
        h.dst = peer;
        // An op's epoch as the run id its peers know (0: about no op).
        h.run = if id.run == 0 { 0 } else { self.runs.id_of(id.run).unwrap_or(0) };
        h.op = id.seq;
        h.tensor = id.tensor;
        h.auth = self.key.auth();
        h.session = self.cfg.session;
        h
    }

    /// The next packet number (the nonce of a datagram's tag): never repeats
    /// under `key`.
    pub(crate) fn take_packet(&self) -> u64 {
        let packet = self.next_packet.get();
        self.next_packet.set(packet + 1);
        packet
    }

    /// Encode `h` under the next packet number, with the payload `fill`
    /// writes, but without its tag: a batch computes every datagram's tag
    /// over its slices just before it is sent (`TxBatch::seal`). Returns the
    /// datagram length.
    pub(crate) fn seal(&self, h: &Header, buf: &mut [u8], fill: impl FnOnce(&mut [u8])) -> Option<usize> {
        let n = h.packet_len();
        if buf.len() < n {
            return None;
        }
        let h = Header { packet: self.take_packet(), ..*h };
        h.emit(buf).ok()?;
        fill(&mut buf[wire::HEADER_LEN..n - h.auth.tag_len()]);
        Some(n)
    }

    /// Count a datagram of `len` bytes to `peer` in `class` as sent.
    pub(crate) fn count_transmit(&mut self, peer: u32, class: Class, len: usize) {
        self.stats.count_tx(peer, class, len);
    }

    /// The path of the next datagram to `peer` (a `probe`'s copies take
    /// different paths; a repair `avoid`s its chunk's last), counted as sent.
    pub(crate) fn pick_path(&mut self, peer: u32, avoid: Option<u8>, probe: bool, now: Instant) -> u8 {
        let path = if probe { self.paths.pick_probe(peer, now) } else { self.paths.pick(peer, avoid, now) };
        if let Some(c) = self.stats.tx_packets_path.get_mut(usize::from(path)) {
            *c += 1;
        }
        path
    }

    /// `peer`'s feedback on a chunk sent on `path`: `delivered`, or reported
    /// missing (a loss on that path).
    pub(crate) fn judge_path(&mut self, peer: u32, path: u8, delivered: bool, now: Instant) {
        if !delivered && let Some(c) = self.stats.lost_path.get_mut(usize::from(path)) {
            *c += 1;
        }
        if self.paths.judge(peer, path, delivered, now) {
            for (i, w) in self.stats.path_weight.iter_mut().enumerate() {
                *w = u64::from(self.paths.min_weight(i as u8));
            }
        }
    }
}

#[cfg(test)]
mod loss_meter_tests {
    use super::LossMeter;

    #[test]
    fn lossy_above_one_chunk_in_a_thousand_and_forgets() {
        let mut m = LossMeter::default();
        assert!(!m.lossy(), "nothing sent, nothing lost");
        for _ in 0..10_000 {
            m.sent();
        }
        m.lost(10);
        assert!(!m.lossy(), "exactly 1 in 1000 is not lossy");
        m.lost(1);
        assert!(m.lossy());
        // A long clean stretch halves the counts until the loss is forgotten.
        for _ in 0..200_000 {
            m.sent();
        }
        assert!(!m.lossy());
    }
}
