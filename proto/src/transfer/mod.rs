//! One bounded-loss transfer: its send side (`Sender`) and its receive side
//! (`Receiver`), for both phases of an allreduce.
//!
//! ## The round
//!
//! The sender sends every chunk once, highest class first; the last DATA of
//! this first pass carries LAST (wire version 8). The receiver decides on
//! the LAST DATA — or on a PROBE, or when its quiet timer or adaptive
//! deadline fires — exactly as it did on a PROBE before version 8: it closes
//! when it holds every chunk, or when it holds at least `n − ⌊n·p⌋` chunks
//! including every chunk of a non-droppable class (`Receiver`'s
//! `closable`); otherwise it answers with a BITMAP of what it holds (a
//! NACK). The sender repairs exactly the chunks needed to get inside the
//! budget ([`select_repairs`]) and then PROBEs, as before version 8 (see
//! below). Probes, nudges and deadlines retry with a capped exponential
//! backoff (`Retry`).
//!
//! The two phases differ only in who decides (`Mode`): a reduce-scatter
//! transfer decides on its own, an all-gather transfer is one of the owner's
//! transfers of one shard, which must end with one agreed mask.
//!
//! ## Control that does not grow with the job (issue 16)
//!
//! Before version 8 every (peer, phase) transfer cost two PROBEs and a DONE
//! or BITMAP each way: 615 control datagrams per rank per op at 64 ranks
//! (1 MB, `dlcpd simulate`), 29% of all, and 63% at 256 ranks. The receiver
//! already knows everything but one fact — that the sender has nothing more
//! queued — so that fact rides on the last DATA (a flag, as TCP's FIN or
//! PSH rides on a segment; Homa and NDP likewise let the receiver drive
//! recovery from what the data itself says), and answers that only repeat
//! what the data already tells are dropped:
//!
//! - **Reduce-scatter (`Mode::Own`).** A receiver that closes says nothing:
//!   the owner sends its all-gather only after closing every transfer into
//!   its shard, so the first gather DATA (or mask) from owner `s` is the
//!   implicit acknowledgement of this rank's transfer to `s` (`Sender`'s
//!   `acknowledged`). The sender PROBEs only when that is overdue: its probe
//!   timer, armed when the LAST DATA leaves, allows the probe timeout
//!   (backed off) plus as long as this rank's own first pass took — every
//!   rank sends the same (N−1)/N of the data in each phase, so the owner's
//!   all-gather needs about as long again. A PROBE of a closed transfer is
//!   answered with DONE, as before.
//! - **Tail loss.** If the tail of the first pass, its LAST included, is
//!   lost, nothing tells the receiver the pass is over, and the sender's
//!   probe timer is late by design. So until the LAST arrives the receiver
//!   expects the sender's next chunk within four of its chunks' mean spacing
//!   so far plus a probe timeout (the *quiet* timer, in both
//!   phases; a sender still sending this rank DATA of any transfer defers
//!   it) and NACKs when none came — the receiver-side counterpart of TCP's
//!   tail loss probe (RFC 8985). A NACK that is not the answer to a LAST or
//!   a PROBE is no verdict on the sender's paths ([`crate::paths`]). A
//!   NACK that brings nothing (it, or its repairs, lost) is sent again after
//!   twice the probe timeout, backing off. Not while flow control sees the
//!   sender's path overflow (`Flow::congested`): repairs then would meet
//!   the same full queue (`flow_sim`'s slow port dropped 14,291 datagrams
//!   with them against 12,416 without), and the sender's PROBE recovers the
//!   tail later.
//! - **Lossy networks.** Where more than one chunk in a thousand needed
//!   repair lately (the endpoint's loss meter), a transfer's LAST is lost
//!   often enough — 1% of transfers at 1% loss, so most ops at 64 ranks —
//!   that the quiet timer would set the op's pace; there the sender follows
//!   the LAST DATA with its PROBEs at once, as before version 8 (64 ranks,
//!   1% loss, three iterations: p50 3.15 ms without; with it, over ten
//!   iterations, 2.30 ms against version 7's 2.28). A clean network sends
//!   none.
//! - **Repair rounds end in PROBEs**, not in a LAST DATA: repairs happen
//!   only under loss, where a PROBE — in two copies, and in the control
//!   class, which overtakes the data — ends a round sooner than a LAST DATA
//!   that is lost as often as any chunk (4 ranks, 10% loss: 2.9 ms against
//!   2.1 ms per op with LAST on repairs too). The clean path sends none.
//! - **Round trips.** A BITMAP (or an all-gather receiver's COMPLETE report,
//!   or ACK entry) that answers a LAST DATA echoes that DATA's data sequence
//!   number in its `seq` (an ACK entry's `echo`), so the sender takes an
//!   unambiguous round-trip sample from it (Karn's rule) as it does from a
//!   PROBE's round number; less, for an ACK, the time it was held.
//! - **PROBE copies.** A PROBE now goes out only when an answer is overdue —
//!   already a tail event — so it keeps its [`PROBE_COPIES`] copies: a lost
//!   single copy would double that tail.
//! - **Exact all-gather (`Mode::Agreed`, gather budget 0, the default).**
//!   The owner repairs every receiver to every chunk, so the agreed mask is
//!   empty and need not be sent: a receiver that holds every chunk closes on
//!   its own. On a clean network it acknowledges that in an ACK (wire
//!   version 10): one per owner for every op it completed within the ACK
//!   delay (25 ms by default; `endpoint::acks`); on a lossy one (the loss
//!   meter) it reports COMPLETE at once, in two copies, as the owner PROBEs
//!   right after its LAST DATA there anyway. The owner delivers its result as
//!   soon as its own receives are done and keeps a copy of its shard, from
//!   which it repairs a receiver whose BITMAP arrives later; its probe timer
//!   allows the ACK delay plus as long as the op took so far before it PROBEs,
//!   and the receiver — still in the op, or completed and lingering —
//!   answers COMPLETE. Under a gather budget > 0 the owner still agrees a
//!   mask from every receiver's report and announces it in one DONE per
//!   receiver.
//!
//! Measured (`dlcpd simulate --size 1 --layers 1`, defaults: budget 1%,
//! gather budget 0; ten iterations at 64 ranks, five at 256; control
//! datagrams per rank per op (share of all), per peer per op, op time p50):
//!
//! | ranks, loss | version 7 | version 8 |
//! |---|---|---|
//! | 64, 0% | 628 (29.3%), 9.9/peer, 2.72 ms | 183 (10.8%), 2.9/peer, 1.89 ms |
//! | 64, 1% | 2.28 ms | 605 (28.4%), 9.6/peer, 2.38 ms |
//! | 256, 0% | 2,573 (62.7%), 10.1/peer, 2.38 ms | 615 (28.7%), 2.4/peer, 1.95 ms |
//! | 256, 1% | 2,716 (63.7%), 10.6/peer, 3.55 ms | 2,620 (62.9%), 10.3/peer, 3.13 ms |
//!
//! On the clean path what is left is the all-gather's COMPLETE report (one
//! per peer) and flow control's GRANTs (1.4–1.9 per peer). Under loss the
//! LAST is followed by PROBEs (above), so control there is version 7's; at
//! 64 ranks and 1% loss the op is 4% slower than version 7's (whose
//! PROBEs, overtaking the data, let budget-1% transfers close before their
//! tail arrived), at 256 ranks 12% faster.
//!
//! Since then: GRANTs ride as credit on every packet (version 9), and the
//! COMPLETE report is an ACK covering every op of the ACK delay (version 10;
//! `bench/results/2026-12-04-ack-v10.md`): at 1,024 ranks, 1 MB, ten
//! iterations, control falls from 1.07 to 0.21 packets per peer per op
//! (34.9% → 9.7% of all), at 256 ranks from 1.09 to 0.19 (15.4% → 3.0%).
//!
//! Receive deadlines close only after the sender's probe schedule has run
//! out, or after a NACK: a deadline NACKs before it closes, and takes the
//! sender for quiet only after twice the longest pause it was seen to come
//! back from ([`crate::flow`]); on a network that lost next to nothing lately
//! the quiet timer and the grace after a PROBE wait them out too.
//!
//! Nothing here sends, arms an index or counts: every method changes the
//! transfer's state and returns what should happen (an outcome enum), and
//! the op ([`crate::endpoint`]) does it. So a transfer runs in unit tests
//! without an endpoint.

mod recv;
mod rules;
mod send;
#[cfg(test)]
mod tests;

pub use recv::TransferReport;
pub(crate) use recv::{Answer, Arrived, Behind, Fired, Receiver};
pub use rules::{MAX_BUDGET_PPM, PROBE_COPIES, allowed_missing, select_repairs};
pub(crate) use rules::{Mode, Refused, Retry, fill_done, fill_mask, mask_segments};
pub(crate) use send::{Drained, Sender};
