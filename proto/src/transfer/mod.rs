//! One bounded-loss transfer: its send side (`Sender`) and its receive side
//! (`Receiver`), for both phases of an allreduce.
//!
//! The sender sends every chunk once, highest class first, then a PROBE. The
//! receiver closes the transfer when it holds every chunk, or — on a PROBE or
//! when its adaptive deadline fires — when it holds at least `n − ⌊n·p⌋`
//! chunks including every chunk of a non-droppable class (`Receiver`'s
//! `closable`). Otherwise it answers with a BITMAP of what it holds; the
//! sender repairs exactly the chunks needed to get inside the budget
//! ([`select_repairs`]) and probes again. Probes, nudges and deadlines retry
//! with a capped exponential backoff (`Retry`).
//!
//! The two phases differ only in who decides (`Mode`): a reduce-scatter
//! transfer decides on its own, an all-gather transfer is one of the owner's
//! transfers of one shard, which must end with one agreed mask.
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
