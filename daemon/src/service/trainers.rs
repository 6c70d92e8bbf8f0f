//! The trainers on shared memory, once attached (see `attach`): adding and
//! detaching them, taking their submissions (no more at a time than the
//! attachment allows) to the local reduce ([`LocalReducer`]), starting an op
//! on the network when all K local trainers have submitted it — their tensors
//! summed out of their arenas into a daemon-owned buffer in one pass — and
//! posting completions (the result copied into each trainer's arena, one pass
//! each).
//!
//! The collectives ([`Opcode`] → [`Collective`]) differ in what the host
//! contributes and what comes back:
//!
//! | opcode         | the host's input                         | written back            |
//! |----------------|------------------------------------------|-------------------------|
//! | allreduce      | the local sum                            | the whole result        |
//! | reduce-scatter | the local sum                            | the host's shard only   |
//! | allgather      | the local sum (its shard is what counts) | the whole result        |
//! | broadcast      | at the root: local rank 0's tensor; elsewhere none | the whole result |
//! | barrier        | none                                     | nothing                 |
//!
//! So with K > 1 trainers a host's allgather shard is the sum of its
//! trainers' tensors over that range (with K = 1, exactly the trainer's);
//! a broadcast's other local contributions are checked for shape only.
//!
//! A trainer whose control socket closes is gone: its attachment is dropped
//! (segment reclaimed) and local ops waiting for it fail for the other
//! trainers.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use dlcp_config::Config;
use dlcp_config::schema::Fill as CfgFill;
use dlcp_proto::elem;
use dlcp_proto::endpoint::{Collective, DType, Endpoint, Fill, OpId, OpOptions, ReduceOp, shard_range};
use dlcp_proto::time::Instant;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use super::counters::ServiceCounters;
use super::local::{Added, Contribution, LocalReducer, Reduced, Shape, Source, sum_in_rank_order};
use super::setup;
use crate::shm::{ArenaError, Attachment, ElemType, Liveness, Opcode, Reduce, Status, Submission};

/// The first mio token of the attachments: attachment slot `i` has the
/// control socket at `ATTACH_BASE + 2i` and the doorbell at `ATTACH_BASE + 2i + 1`.
pub(super) const ATTACH_BASE: usize = 1 << 16;

/// What the trainers' handlers need of the rest of the service.
pub(super) struct Ctx<'a> {
    /// The running configuration.
    pub(super) cfg: &'a Config,
    /// The protocol endpoint (buffers, op start).
    pub(super) endpoint: &'a mut Endpoint,
    /// The service's counters.
    pub(super) counters: &'a mut ServiceCounters,
    /// Where trainers' descriptors are watched.
    pub(super) registry: &'a Registry,
    /// The service is draining: no new ops.
    pub(super) draining: bool,
    /// The service's start (its protocol clock, see [`setup::since`]).
    pub(super) start: StdInstant,
}

/// What a completion tells the trainers of a local op.
#[derive(Debug, Clone, Copy)]
pub(super) struct Completion<'a> {
    /// The outcome.
    pub(super) status: Status,
    /// Least delivered fraction, in parts per million.
    pub(super) delivered_ppm: u32,
    /// Repairs this rank sent.
    pub(super) repairs: u32,
    /// Time since the first local contribution.
    pub(super) duration: StdDuration,
    /// What of the result is copied into each trainer's buffer, and from
    /// which element on.
    pub(super) result: Option<Written<'a>>,
    /// The host's shard told in the completion (reduce-scatter, allgather):
    /// its first element and its length.
    pub(super) shard: Option<(u64, u64)>,
    /// Why the op failed, told to each trainer before its completion.
    pub(super) reason: Option<&'a str>,
}

/// Elements of a result written into each trainer's tensor, from element `at` on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Written<'a> {
    /// The values.
    pub(super) values: &'a [f32],
    /// The tensor element the first value goes to.
    pub(super) at: usize,
}

impl Completion<'_> {
    /// An op that ended without a result after `duration`, for `reason`.
    pub(super) fn failed(status: Status, duration: StdDuration, reason: &str) -> Completion<'_> {
        Completion {
            status,
            delivered_ppm: 0,
            repairs: 0,
            duration,
            result: None,
            shard: None,
            reason: Some(reason),
        }
    }
}

/// A contribution where it lies: a trainer's arena, from byte `offset`, of
/// elements of `dtype` (f16 and bf16 are widened to `f32` as they are read:
/// the local sum is accumulated in `f32`).
struct Arena<'a> {
    att: &'a Attachment,
    offset: u64,
    dtype: ElemType,
}

impl Arena<'_> {
    /// Elements `at ..` of a 2-byte tensor widened into (or added to) `out`.
    fn widen(&self, at: usize, out: &mut [f32], add: bool) -> Result<(), ArenaError> {
        const N: usize = 4096;
        let dtype = wire_dtype(self.dtype);
        let mut raw = [0u8; 2 * N];
        for (i, dst) in out.chunks_mut(N).enumerate() {
            let bytes = &mut raw[..2 * dst.len()];
            self.att.copy_u16s_from_arena_into(self.offset + (at + i * N) as u64 * 2, bytes)?;
            if add { elem::decode_add(dtype, bytes, dst) } else { elem::decode(dtype, bytes, dst) }
        }
        Ok(())
    }
}

impl Source for Arena<'_> {
    type Error = ArenaError;

    fn copy_into(&self, at: usize, out: &mut [f32]) -> Result<(), ArenaError> {
        match self.dtype {
            ElemType::F32 => self.att.copy_from_arena_into(self.offset + at as u64 * 4, out),
            _ => self.widen(at, out, false),
        }
    }

    fn add_into(&self, at: usize, out: &mut [f32]) -> Result<(), ArenaError> {
        match self.dtype {
            ElemType::F32 => self.att.add_from_arena_into(self.offset + at as u64 * 4, out),
            _ => self.widen(at, out, true),
        }
    }
}

/// The wire's element type for a descriptor's.
fn wire_dtype(t: ElemType) -> DType {
    match t {
        ElemType::F32 => DType::F32,
        ElemType::F16 => DType::F16,
        ElemType::Bf16 => DType::Bf16,
    }
}

/// Copy an op's result into the tensor of `sub` (from element `w.at` on),
/// narrowed to its element type (exact: the owners rounded every value to it).
fn write_result(att: &Attachment, sub: &Submission, w: Written<'_>) -> Result<(), ArenaError> {
    let offset = sub.span.offset + w.at as u64 * sub.span.dtype.size();
    match sub.span.dtype {
        ElemType::F32 => att.copy_to_arena(offset, w.values),
        t => {
            let dtype = wire_dtype(t);
            let mut bytes = vec![0u8; w.values.len() * dtype.size()];
            elem::encode(dtype, w.values, &mut bytes);
            att.copy_u16s_to_arena(offset, &bytes)
        }
    }
}

/// The protocol's collective for a descriptor's opcode.
pub(super) fn collective(o: Opcode) -> Collective {
    match o {
        Opcode::AllReduce => Collective::Allreduce,
        Opcode::ReduceScatter => Collective::ReduceScatter,
        Opcode::Allgather => Collective::Allgather,
        Opcode::Broadcast => Collective::Broadcast,
        Opcode::Barrier => Collective::Barrier,
    }
}

/// The options of the network op for `sub` (the lowest local rank's
/// submission, speaking for all K), under the running configuration.
/// `contributors`: what an average divides by.
fn op_options(sub: &Submission, cfg: &Config, contributors: u32) -> OpOptions {
    // loss.budget is the operator's cap on what trainers may ask for.
    let budget = sub.budget_ppm.min(cfg.loss.budget_ppm());
    let (budget_ppm, gather_budget_ppm) = match sub.opcode {
        Opcode::AllReduce | Opcode::ReduceScatter => (budget, cfg.loss.gather_budget_ppm().min(budget)),
        // The trainer's budget for each phase the collective has: an
        // allgather's one, a broadcast's scatter from the root and all-gather.
        Opcode::Allgather | Opcode::Broadcast => (budget, budget),
        Opcode::Barrier => (0, 0),
    };
    OpOptions {
        layer: sub.layer,
        layers: sub.layers,
        budget_ppm,
        gather_budget_ppm,
        // The trainer's flags can only ask for more than `[loss]` sets:
        // a flag bit turns the behaviour on for this op, the config turns
        // it on for every op.
        fill: match cfg.loss.fill {
            CfgFill::Local => Fill::Local,
            CfgFill::Zero if sub.flags & crate::shm::layout::FLAG_FILL_LOCAL != 0 => Fill::Local,
            CfgFill::Zero => Fill::Zero,
        },
        rescale: cfg.loss.rescale || sub.flags & crate::shm::layout::FLAG_RESCALE != 0,
        reduce: match sub.reduce {
            Reduce::Sum => ReduceOp::Sum,
            Reduce::Average => ReduceOp::Average,
        },
        // The endpoint rounds this daemon's local sum to the type once,
        // and each owner its shard once (`dlcp_proto::elem`).
        dtype: wire_dtype(sub.span.dtype),
        contributors,
        collective: collective(sub.opcode),
        root: sub.root,
    }
}

/// Who contributed to a local op: the trainer's attachment and its submission.
#[derive(Debug, Clone, Copy)]
struct Ticket {
    attachment: u64,
    sub: Submission,
}

/// A local op on the network, until it completes.
#[derive(Debug)]
pub(super) struct InFlight {
    /// The contributors, in local-rank order.
    tickets: Vec<Ticket>,
    /// When the first contribution arrived.
    pub(super) first_at: StdInstant,
    /// The budget the op started with (the trainer's, capped by `loss.budget`).
    pub(super) budget_ppm: u32,
    /// The collective.
    pub(super) opcode: Opcode,
    /// This host's shard of the tensor (elements).
    shard: std::ops::Range<usize>,
}

impl InFlight {
    /// The completion of a successful op with `result` (the endpoint's).
    pub(super) fn done<'a>(&self, result: &'a [f32], delivered_ppm: u32, repairs: u32) -> Completion<'a> {
        let whole = Some(Written { values: result, at: 0 });
        let told = Some((self.shard.start as u64, self.shard.len() as u64));
        let (result, shard) = match self.opcode {
            Opcode::AllReduce | Opcode::Broadcast => (whole, None),
            Opcode::Allgather => (whole, told),
            Opcode::ReduceScatter => {
                let part = result.get(self.shard.clone()).unwrap_or_default();
                (Some(Written { values: part, at: self.shard.start }), told)
            }
            Opcode::Barrier => (None, None),
        };
        let duration = self.first_at.elapsed();
        Completion { status: Status::Ok, delivered_ppm, repairs, duration, result, shard, reason: None }
    }
}

/// The attached trainers and their local ops.
pub(super) struct Trainers {
    slots: Vec<Option<Attachment>>,
    /// The local run each slot's trainer attached in (its ops' `OpId::run`).
    epochs: Vec<u64>,
    local_world: Option<u32>,
    /// Local ops collecting their K contributions.
    reducer: LocalReducer<Ticket>,
    /// Local ops started on the network.
    in_flight: BTreeMap<OpId, InFlight>,
}

impl Trainers {
    /// No trainers yet.
    pub(super) fn new() -> Trainers {
        Trainers {
            slots: Vec::new(),
            epochs: Vec::new(),
            local_world: None,
            reducer: LocalReducer::new(),
            in_flight: BTreeMap::new(),
        }
    }

    /// Trainers attached now.
    pub(super) fn count(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Local ops not completed yet (collecting contributions or in flight).
    pub(super) fn ops(&self) -> usize {
        self.reducer.len() + self.in_flight.len()
    }

    /// Descriptors the attached trainers' channels rejected.
    pub(super) fn rejected_descriptors(&self) -> u64 {
        self.slots.iter().flatten().map(|a| a.stats().rejected()).sum()
    }

    /// Failure reasons the attached trainers' control sockets could not take (dropped).
    pub(super) fn reasons_dropped(&self) -> u64 {
        self.slots.iter().flatten().map(|a| a.stats().reasons_dropped).sum()
    }

    /// Submission-ring entries used, completion-ring entries used, and ring
    /// capacity, summed over the attached trainers.
    pub(super) fn ring_occupancy(&self) -> (u64, u64, u64) {
        let (mut sq, mut cq, mut cap) = (0u64, 0u64, 0u64);
        for att in self.slots.iter().flatten() {
            let (a, b, k) = att.ring_occupancy();
            sq += u64::from(a);
            cq += u64::from(b);
            cap += u64::from(k);
        }
        (sq, cq, cap)
    }

    /// Handle an event on attachment token `t` (at least [`ATTACH_BASE`]).
    pub(super) fn on_token(&mut self, t: usize, ctx: &mut Ctx<'_>, now: Instant) {
        let slot = (t - ATTACH_BASE) / 2;
        if (t - ATTACH_BASE) % 2 == 0 {
            self.check(slot, ctx);
        } else {
            self.drain_submissions(slot, ctx, now);
        }
    }

    /// Serve a trainer just attached. (Its job and local world were checked
    /// when it attached, before its segment was made: see `attach`.)
    pub(super) fn add(&mut self, att: Attachment, ctx: &mut Ctx<'_>) {
        self.local_world = Some(att.registration().local_world);
        let i = self.slots.iter().position(Option::is_none).unwrap_or_else(|| {
            self.slots.push(None);
            self.epochs.push(0);
            self.slots.len() - 1
        });
        let reg_result = ctx
            .registry
            .register(
                &mut SourceFd(&att.control_fd().as_raw_fd()),
                Token(ATTACH_BASE + 2 * i),
                Interest::READABLE,
            )
            .and_then(|()| {
                ctx.registry.register(
                    &mut SourceFd(&att.doorbell_fd().as_raw_fd()),
                    Token(ATTACH_BASE + 2 * i + 1),
                    Interest::READABLE,
                )
            });
        if let Err(e) = reg_result {
            log::error!("cannot watch trainer pid {}: {e}; detaching it", att.peer().pid);
            return;
        }
        ctx.counters.trainers_attached += 1;
        // The first trainer of a job's run begins a local run: the daemons
        // agree on its run id before its first op goes out (`dlcp_proto::run`).
        let now = setup::since(ctx.start);
        let first = self.count() == 0;
        self.epochs[i] = ctx.endpoint.begin_run(now);
        if first {
            log::info!("local run {} begins (first trainer attached)", self.epochs[i]);
        }
        self.slots[i] = Some(att);
        // Submissions may already be waiting.
        self.drain_submissions(i, ctx, setup::since(ctx.start));
    }

    fn check(&mut self, slot: usize, ctx: &mut Ctx<'_>) {
        let Some(att) = self.slots.get_mut(slot).and_then(Option::as_mut) else { return };
        match att.liveness() {
            Liveness::Alive => {}
            other => {
                let id = att.id();
                log::info!("trainer attachment {id} (pid {}) is gone ({other:?})", att.peer().pid);
                self.remove(slot, ctx);
            }
        }
    }

    fn remove(&mut self, slot: usize, ctx: &mut Ctx<'_>) {
        let Some(att) = self.slots.get_mut(slot).and_then(Option::take) else { return };
        let id = att.id();
        let rank = att.registration().local_rank as usize;
        let _ = ctx.registry.deregister(&mut SourceFd(&att.control_fd().as_raw_fd()));
        let _ = ctx.registry.deregister(&mut SourceFd(&att.doorbell_fd().as_raw_fd()));
        ctx.counters.trainers_gone += 1;
        drop(att);
        // Local ops not started yet that hold the gone trainer's contribution, or
        // still wait for its local rank, can never start: fail them for the other
        // local trainers. (A replacement trainer continues with new ops.)
        let why = format!(
            "local rank {rank} of this job on this host (attachment {id}) detached before the op started"
        );
        let now = setup::since(ctx.start);
        let contributors = self.contributors(ctx.endpoint.config().world);
        for (op, tickets) in self.reducer.abandon_rank(rank, |t| t.attachment == id) {
            // The peers are told when they ask (else they would wait for this
            // host, up but never starting the op, until their op deadline).
            if let Some(t) = tickets.first() {
                ctx.endpoint.abandon(now, op, &op_options(&t.sub, ctx.cfg, contributors));
            }
            ctx.counters.ops_failed += 1;
            self.post(&tickets, Completion::failed(Status::PeerDown, StdDuration::ZERO, &why), ctx.counters);
        }
        if self.count() == 0 {
            log::info!("local run {} ends (last trainer detached)", self.epochs[slot]);
            ctx.endpoint.end_run(now);
        }
    }

    /// What an average divides by: every trainer of the job, K on each of
    /// the `world` hosts.
    fn contributors(&self, world: u32) -> u32 {
        world * self.local_world.unwrap_or(1)
    }

    fn slot_of(&self, attachment: u64) -> Option<usize> {
        self.slots.iter().position(|s| s.as_ref().is_some_and(|a| a.id() == attachment))
    }

    fn drain_submissions(&mut self, slot: usize, ctx: &mut Ctx<'_>, now: Instant) {
        // The daemon-wide cap (`shm.max_ops_in_flight`): what is over it
        // stays on the ring until ops finish (`resume`).
        let room = (ctx.cfg.shm.max_ops_in_flight as usize).saturating_sub(self.ops());
        let Some(att) = self.slots.get_mut(slot).and_then(Option::as_mut) else { return };
        let _ = att.wait(Some(StdDuration::ZERO));
        let mut subs = Vec::new();
        loop {
            if subs.len() >= room {
                if att.ring_occupancy().0 > 0 {
                    ctx.counters.ops_throttled += 1;
                }
                break;
            }
            match att.next_submission() {
                Ok(Some(sub)) => subs.push(sub),
                Ok(None) => break,
                Err(crate::shm::ChannelError::Rejected { .. }) => {
                    // Answered with an InvalidDescriptor completion and counted by the attachment.
                    ctx.counters.submissions_rejected += 1;
                }
                Err(e) => {
                    log::warn!("trainer attachment {}: {e}; detaching it", att.id());
                    self.remove(slot, ctx);
                    return;
                }
            }
        }
        let att_id = att.id();
        let local_rank = att.registration().local_rank;
        for sub in subs {
            ctx.counters.submissions += 1;
            self.on_submission(slot, att_id, local_rank, sub, ctx, now);
        }
    }

    /// Take what waits on the submission rings again (each loop turn): ops
    /// may have finished since a ring was left with descriptors on it (the
    /// daemon-wide cap, or a trainer's completion ring that was full).
    pub(super) fn resume(&mut self, ctx: &mut Ctx<'_>, now: Instant) {
        for slot in 0..self.slots.len() {
            let waiting = self.slots[slot].as_ref().is_some_and(|a| a.ring_occupancy().0 > 0);
            if waiting && self.ops() < ctx.cfg.shm.max_ops_in_flight as usize {
                self.drain_submissions(slot, ctx, now);
            }
        }
    }

    /// Post a failed completion for `sub`, and why, to the trainer in `slot` (if still there).
    fn answer(&mut self, slot: usize, sub: &Submission, status: Status, reason: &str) {
        if let Some(att) = self.slots[slot].as_mut() {
            att.send_reason(sub.op_seq, sub.tensor_id, reason);
            let _ = att.complete_submission(sub, status, 0, 0, StdDuration::ZERO);
        }
    }

    fn on_submission(
        &mut self,
        slot: usize,
        att_id: u64,
        local_rank: u32,
        sub: Submission,
        ctx: &mut Ctx<'_>,
        now: Instant,
    ) {
        if ctx.draining {
            self.answer(slot, &sub, Status::Shutdown, "the daemon is shutting down: it takes no new ops");
            return;
        }
        let id = OpId { run: self.epochs[slot], seq: sub.op_seq, tensor: sub.tensor_id };
        let world = self.local_world.unwrap_or(1) as usize;
        // An op on the network already has all its contributions.
        if self.in_flight.contains_key(&id) {
            self.refuse_duplicate(slot, att_id, id, &sub, ctx);
            return;
        }
        // The tensor stays in the trainer's arena until all K are in; then the
        // local sum reads every arena once (see `start_op`).
        let shape = Shape {
            len: sub.span.len_elems,
            layer: sub.layer,
            layers: sub.layers,
            dtype: sub.span.dtype,
            reduce: sub.reduce,
            opcode: sub.opcode,
            root: sub.root,
        };
        let c = Contribution { local_rank, shape, ticket: Ticket { attachment: att_id, sub } };
        match self.reducer.add(id, world, c, StdInstant::now()) {
            Added::Waiting => {}
            Added::Reduced(r) => self.start_op(id, r, ctx, now),
            Added::Duplicate(_) => self.refuse_duplicate(slot, att_id, id, &sub, ctx),
            Added::Mismatch { first, ticket, others } => {
                ctx.counters.local_mismatch += 1;
                let why = format!(
                    "the local trainers disagree on op {}/{}: length {} vs {}, layer {}/{} vs {}/{}, \
                     dtype {:?} vs {:?}, reduce {:?} vs {:?}, collective {} vs {}, root {} vs {}",
                    id.seq,
                    id.tensor,
                    first.len,
                    ticket.sub.span.len_elems,
                    first.layer,
                    first.layers,
                    ticket.sub.layer,
                    ticket.sub.layers,
                    first.dtype,
                    ticket.sub.span.dtype,
                    first.reduce,
                    ticket.sub.reduce,
                    first.opcode.name(),
                    ticket.sub.opcode.name(),
                    first.root,
                    ticket.sub.root,
                );
                log::warn!("{why}");
                ctx.counters.ops_failed += 1;
                let done = Completion::failed(Status::InvalidDescriptor, StdDuration::ZERO, &why);
                self.post(&others, done, ctx.counters);
                self.answer(slot, &ticket.sub, Status::InvalidDescriptor, &why);
            }
        }
    }

    /// A second submission of op `id` by one local rank: refuse it.
    fn refuse_duplicate(&mut self, slot: usize, att_id: u64, id: OpId, sub: &Submission, ctx: &mut Ctx<'_>) {
        ctx.counters.local_mismatch += 1;
        log::warn!("attachment {att_id}: duplicate submission of op {}/{}", id.seq, id.tensor);
        let why = format!("op {}/{} was already submitted by this trainer's local rank", id.seq, id.tensor);
        self.answer(slot, sub, Status::InvalidDescriptor, &why);
    }

    /// All K contributions of `id` are in: take the host's input out of the
    /// trainers' arenas ([`Trainers::local_input`]) and start the op on the
    /// network with it.
    fn start_op(&mut self, id: OpId, r: Reduced<Ticket>, ctx: &mut Ctx<'_>, now: Instant) {
        // The lowest local rank's submission speaks for the op (they agree).
        let Some(sub) = r.tickets.first().map(|t| t.sub) else { return };
        let input = match self.local_input(&r.tickets, &sub, ctx.endpoint) {
            Ok(v) => v,
            Err(e) => {
                let why = format!("cannot read the local contributions: {e}");
                log::warn!("op {}/{}: {why}", id.seq, id.tensor);
                ctx.counters.ops_failed += 1;
                let done = Completion::failed(Status::InvalidDescriptor, StdDuration::ZERO, &why);
                self.post(&r.tickets, done, ctx.counters);
                return;
            }
        };
        let (rank, world) = (ctx.endpoint.config().rank, ctx.endpoint.config().world);
        // An average is over every trainer of the job: K on every host.
        let opts = op_options(&sub, ctx.cfg, self.contributors(world));
        let shard = shard_range(usize::try_from(sub.span.len_elems).unwrap_or(0), world, rank);
        match ctx.endpoint.start_allreduce(now, id, input, opts) {
            Ok(()) => {
                ctx.counters.ops_started += 1;
                let op = InFlight {
                    tickets: r.tickets,
                    first_at: r.first_at,
                    budget_ppm: opts.budget_ppm,
                    opcode: sub.opcode,
                    shard,
                };
                self.in_flight.insert(id, op);
            }
            Err(e) => {
                let why = format!("the op could not start: {e}");
                log::warn!("op {}/{}: {why}", id.seq, id.tensor);
                // Every start error is the descriptor's (duplicate id, empty,
                // too large, budget, layer, root, reduction).
                ctx.counters.ops_failed += 1;
                let done = Completion::failed(Status::InvalidDescriptor, StdDuration::ZERO, &why);
                self.post(&r.tickets, done, ctx.counters);
            }
        }
    }

    /// The host's input to the network op of `sub` (see the module docs):
    /// the contributions of `tickets` summed out of the trainers' arenas into
    /// a daemon-owned buffer in one pass ([`sum_in_rank_order`]); at a
    /// broadcast's root only local rank 0's; at its other hosts a pool buffer
    /// of the length, neither filled nor read (the endpoint reads a broadcast's
    /// input at its root only); for a barrier one zero (its data is not used).
    fn local_input(
        &self,
        tickets: &[Ticket],
        sub: &Submission,
        endpoint: &mut Endpoint,
    ) -> Result<Vec<f32>, String> {
        let len = usize::try_from(sub.span.len_elems).unwrap_or(0);
        let read = match sub.opcode {
            Opcode::Barrier => return Ok(vec![0.0]),
            Opcode::Broadcast if sub.root != endpoint.config().rank => return Ok(endpoint.take_buffer(len)),
            Opcode::Broadcast => &tickets[..1],
            Opcode::AllReduce | Opcode::ReduceScatter | Opcode::Allgather => tickets,
        };
        let sources: Option<Vec<Arena<'_>>> = read
            .iter()
            .map(|t| {
                let att = self.slots[self.slot_of(t.attachment)?].as_ref()?;
                Some(Arena { att, offset: t.sub.span.offset, dtype: t.sub.span.dtype })
            })
            .collect();
        let mut sum = endpoint.take_buffer(len);
        let summed = match sources {
            Some(s) => sum_in_rank_order(&s, &mut sum).map_err(|e| e.to_string()),
            None => Err("a contributing trainer is gone".to_string()),
        };
        match summed {
            Ok(()) => Ok(sum),
            Err(e) => {
                endpoint.recycle(sum);
                Err(e)
            }
        }
    }

    /// The local op `id` is over (completed or failed on the network): take it
    /// out, to complete its trainers' submissions.
    pub(super) fn finish(&mut self, id: OpId) -> Option<InFlight> {
        self.in_flight.remove(&id)
    }

    /// Post `done` to every trainer that contributed to `op`.
    pub(super) fn complete(&mut self, op: &InFlight, done: Completion<'_>, counters: &mut ServiceCounters) {
        self.post(&op.tickets, done, counters);
    }

    /// Post `done` to every trainer of `tickets` still attached, first copying
    /// its result into the trainer's buffer if there is one.
    fn post(&mut self, tickets: &[Ticket], done: Completion<'_>, counters: &mut ServiceCounters) {
        for c in tickets {
            let Some(slot) = self.slot_of(c.attachment) else { continue };
            let Some(att) = self.slots[slot].as_mut() else { continue };
            let (mut st, mut why) = (done.status, done.reason.map(str::to_owned));
            if let Some(w) = done.result
                && let Err(e) = write_result(att, &c.sub, w)
            {
                log::warn!("attachment {}: cannot write result: {e}", c.attachment);
                st = Status::InvalidDescriptor;
                why = Some(format!("cannot write the result into the tensor: {e}"));
            }
            if let Some(why) = &why {
                att.send_reason(c.sub.op_seq, c.sub.tensor_id, why);
            }
            let (shard_offset, shard_len) = done.shard.filter(|_| st == Status::Ok).unwrap_or_default();
            let desc = crate::shm::CompletionDesc {
                delivered_ppm: done.delivered_ppm,
                repairs: done.repairs,
                duration_ns: u64::try_from(done.duration.as_nanos()).unwrap_or(u64::MAX),
                shard_offset,
                shard_len,
                ..c.sub.completion(st)
            };
            if att.complete_submission_with(&c.sub, desc).is_err() {
                counters.completions_dropped += 1;
            }
        }
    }
}
