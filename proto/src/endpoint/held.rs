//! Ops submitted before the job's daemons agreed on their run
//! ([`crate::run`]): held with their input until the run is agreed, failed
//! at the hard timeout or when their run ends.

use std::collections::VecDeque;

use crate::endpoint::api::{OpId, OpOptions};
use crate::time::{Duration, Instant};

/// An op waiting for its run.
#[derive(Debug)]
pub(crate) struct HeldOp {
    pub id: OpId,
    pub data: Vec<f32>,
    pub opts: OpOptions,
    /// When it was submitted.
    pub since: Instant,
}

/// The held ops, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Held {
    ops: VecDeque<HeldOp>,
}

impl Held {
    /// Hold `op`.
    pub(crate) fn push(&mut self, op: HeldOp) {
        self.ops.push_back(op);
    }

    /// Whether op `id` is held.
    pub(crate) fn contains(&self, id: &OpId) -> bool {
        self.ops.iter().any(|o| o.id == *id)
    }

    /// Every held op, to start (their run was agreed).
    pub(crate) fn take_all(&mut self) -> Vec<HeldOp> {
        self.ops.drain(..).collect()
    }

    /// Held ops submitted `timeout` or longer before `now`, and those not of
    /// run `epoch` (`None`: every one).
    pub(crate) fn take_expired(
        &mut self,
        now: Instant,
        timeout: Duration,
        epoch: Option<u64>,
    ) -> Vec<HeldOp> {
        let (gone, keep): (Vec<_>, Vec<_>) =
            self.ops.drain(..).partition(|o| o.since + timeout <= now || Some(o.id.run) != epoch);
        self.ops = keep.into();
        gone
    }

    /// When the oldest held op times out.
    pub(crate) fn next_deadline(&self, timeout: Duration) -> Option<Instant> {
        self.ops.front().map(|o| o.since + timeout)
    }

    /// Number of held ops.
    pub(crate) fn len(&self) -> usize {
        self.ops.len()
    }

    /// Bytes of input held.
    pub(crate) fn bytes(&self) -> usize {
        self.ops.iter().map(|o| o.data.capacity() * 4).sum::<usize>()
            + self.ops.capacity() * size_of::<HeldOp>()
    }
}
