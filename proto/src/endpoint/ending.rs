//! How an op ends here: its result delivered to the caller, the op
//! retired (it lingers, answering late packets, and its buffers go back to
//! the pool), or failed (its peers are told why). Wire version 10 separates
//! the first two for an exact all-gather: the owner delivers before its
//! receivers' ACKs arrive and retires the op when they have.

use crate::endpoint::Endpoint;
use crate::endpoint::allreduce::Op;
use crate::endpoint::api::{Event, OpError, OpId, OpKey};
use crate::endpoint::history::{Failed, Linger};

impl Endpoint {
    /// Deliver op `id`'s result once it is final, and retire the op once
    /// nothing more is owed for it: an exact all-gather's owner delivers as
    /// soon as its own receives are done and retires the op when every
    /// receiver's ACK arrived (wire version 10, [`acks`]).
    pub(super) fn check_complete(&mut self, id: OpId) {
        let Some(slot) = self.ops.slot(&id) else { return };
        let Some(op) = self.ops.at_mut(slot, &id) else { return };
        let me = self.sh.me();
        if op.is_deliverable(op.exact_gather(&self.sh)) {
            // Its all-gather, if still held for its reduce-scatter, goes
            // now: the receivers wait for it, and the delivery below lets
            // the reduce-scatter senders it waited on go.
            op.release_gather(OpKey::new(id, slot), &mut self.sh);
            let now = self.now;
            let report = op.report(id, now, me);
            let result = op.deliver(now, me, &mut self.pool);
            self.sh.stats.ops_completed += 1;
            self.events.push_back(Event::OpComplete { id, result, report: Box::new(report) });
        }
        if self.ops.get(&id).is_some_and(Op::is_complete) {
            self.retire(id);
        }
    }

    /// Op `id` is over here: it lingers (answers late PROBEs and BITMAPs)
    /// and its buffers go back to the pool.
    pub(super) fn retire(&mut self, id: OpId) {
        let Some(op) = self.ops.remove(&id) else { return };
        let now = self.now;
        let me = self.sh.me();
        let exact = op.exact_gather(&self.sh);
        let linger = Linger {
            until: now + self.sh.cfg.timers.linger,
            own_chunks: op.own_chunks(me),
            mask: op.own_mask(me),
            kind: op.kind(),
            exact,
        };
        self.history.completed(now, id, linger);
        self.release(op);
    }

    /// Returns a finished op's input and receive buffers to the pool.
    pub(super) fn release(&mut self, op: Op) {
        for buf in op.into_buffers() {
            self.pool.put(self.now, buf);
        }
    }

    pub(super) fn fail(&mut self, id: OpId, error: OpError) {
        if self.ops.get(&id).is_some_and(Op::is_delivered) {
            // Its result is out: a receiver that never acknowledged the
            // all-gather (it left, or failed the op) changes nothing here.
            self.sh.stats.unacknowledged += 1;
            return self.retire(id);
        }
        if let Some(op) = self.ops.remove(&id) {
            let kind = op.kind();
            self.release(op);
            self.sh.stats.ops_failed += 1;
            let until = self.now + self.sh.cfg.timers.linger;
            let mut failed = Failed::new(until, error.fail_reason());
            failed.kind = kind;
            self.history.failed(self.now, id, failed);
            self.events.push_back(Event::OpFailed { id, error });
        }
    }
}
