"""dlcp.torch — PyTorch DistributedDataParallel over dlcpd.

One line switches DDP's gradient allreduce to dlcp::

    import dlcp.torch
    model = torch.nn.parallel.DistributedDataParallel(net)
    model.register_comm_hook(dlcp.torch.DlcpState(model), dlcp.torch.allreduce_hook)

PyTorch stays the distributed engine (process group, bucketing, the optimizer);
dlcp only carries the gradient buckets.

The hook is asynchronous. DDP calls it as each bucket's gradients become ready
during ``backward()``; the hook copies DDP's flat bucket buffer once into a
tensor of the daemon's shared arena (one arena tensor per bucket), submits an
allreduce of it with the bucket's layer position (the position of its
front-most parameter in ``module.parameters()``, so front layers get the higher
priority class — DDP's bucket 0 holds the *last* layers) and returns a
``torch.futures.Future`` at once. Backward goes on computing the next buckets'
gradients while the daemon reduces the earlier ones, and several buckets are in
flight together, so dlcpd's priority classes decide which finishes first (the
front layers', submitted last, can overtake the back layers'). DDP waits for
all the futures at the end of ``backward()``.

A completion waiter, one daemon thread per :class:`DlcpState`, completes the
futures: it waits for the client's completions by polling the client's
completion doorbell and control socket (``Client.wait_fds``) beside its own
wake-up descriptor (which :meth:`DlcpState.close` uses), and takes the
completions with non-blocking ``Client.wait`` calls; it sleeps on a condition
while nothing is in flight) and sets each reduced arena tensor as the future's
value (DDP copies it into the gradients), or fails the future with a
:class:`DlcpHookError`. The ops are averages (``op="average"``): the daemons
divide by the job's number of trainers once, so the hook does not divide. If the ring of ops in flight
is full the hook waits for a completion before submitting.

Why one copy: DDP owns the bucket buffer (it allocates it and lays the
gradients out in it as views), and dlcp can only reduce memory inside the
daemon's shared arena, which the daemon maps and writes into. The hook cannot
hand DDP an arena tensor as its bucket buffer (the comm-hook API gives no say
over that allocation), so it copies the buffer into the arena; the result
comes back without a copy (the future's value *is* the arena tensor, which DDP
copies into the gradients as it does with any hook's result).

Every op's report (delivered fraction, packets repaired, daemon time) is kept in
:attr:`DlcpState.reports` as :class:`BucketReport` rows, per step and bucket,
in hook (submission) order; ``on_report`` is called from the waiter thread.

Failure semantics: if the daemon is not running, attaching raises
:class:`dlcp.ConnectError` when the state is created. If an op fails (a peer
silent for ``loss.hard_timeout_ms``, a peer restarted, the daemon gone, no
completion within ``timeout`` seconds of its submission), its future fails with
a :class:`DlcpHookError` naming the op (step, bucket, op sequence) and the
reason, and so do the futures of the other ops in flight; PyTorch surfaces it
from ``loss.backward()`` as a ``RuntimeError`` carrying that text. No future
outlives its op's ``timeout``: the waiter fails it then. The ranks are then out
of step: every later hook call raises too, at once, until the job restarts (or
falls back to Gloo: just do not register the hook).

Settings come from arguments or the environment: ``DLCP_SOCKET`` (control
socket), ``DLCP_JOB`` (job id, must match the daemon's ``node.job_id``),
``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (set by torchrun: the trainers sharing this
host's daemon), ``DLCP_BUDGET`` (loss budget: a fraction, or a percentage such as "1%").

Gradient buckets may be float32, float16 or bfloat16 (CPU, dense): a bucket
is reduced in its own type (f16/bf16: accumulated in float32 at each owner,
rounded once to the type, the same bytes on every rank), in an arena tensor
of that type (bfloat16's arena view is the raw bits: numpy has no bfloat16;
the hook views them as ``torch.bfloat16`` without a copy).

Tested with Debian 12's ``python3-torch`` 1.13 (CPU, Gloo process group) and
``/usr/bin/python3`` 3.11.
"""

import collections
import os
import select
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

import dlcp

#: Bucket dtypes the hook reduces, and the dlcp tensor dtype of each.
_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}

__all__ = ["DlcpState", "BucketReport", "DlcpHookError", "allreduce_hook"]

#: Longest sleep of the completion waiter in one ``poll`` (seconds). It wakes
#: on a completion, on the control socket, when closed, and at an op's deadline;
#: this only bounds how late anything else is noticed. (Until session 52 it
#: blocked in ``Client.wait`` in 2 ms slices, because the library holds the
#: handle's lock while it waits: 500 wake-ups a second per trainer, each taking
#: the GIL, 29 CPU-ms per clean MTU-1500 training step over four trainers, 7
#: with poll; bench/results/2026-12-06-waiter-poll.md.)
POLL_MAX = 1.0
#: How long a ``Client.wait`` may block when only the control socket is
#: readable: the library reads it, and reports a daemon that closed it.
CONTROL_WAIT = 0.005


class DlcpHookError(RuntimeError):
    """A dlcp allreduce of a DDP bucket failed (or an earlier one did).

    Attributes: ``step``, ``bucket`` (DDP bucket index), ``op_seq`` (the dlcp op
    sequence number, None if it was never submitted), ``reason`` (what
    happened) and ``cause`` (the underlying :class:`dlcp.DlcpError`, if any).
    """

    def __init__(self, step: int, bucket: int, op_seq: Optional[int], reason: str, cause=None):
        self.step, self.bucket, self.op_seq, self.reason, self.cause = step, bucket, op_seq, reason, cause
        op = f"op {op_seq}" if op_seq is not None else "no op submitted"
        super().__init__(f"dlcp allreduce of DDP bucket {bucket} (step {step}, {op}) failed: {reason}")


@dataclass(frozen=True)
class BucketReport:
    """What one bucket's allreduce reported."""

    step: int  #: training step (counts hook rounds: +1 after DDP's last bucket)
    bucket: int  #: DDP bucket index (0 = the last layers)
    layer: int  #: layer position sent to dlcpd (0 = front layer, highest priority)
    layers: int  #: number of layer positions (parameters of the module)
    numel: int  #: elements in the bucket (of its dtype)
    op_seq: int  #: dlcp op sequence number (`dlcpctl report OP_SEQ TENSOR`)
    tensor: str  #: dlcp tensor name
    tensor_id: int  #: dlcp tensor id (`dlcpctl report OP_SEQ TENSOR_ID`)
    delivered: float  #: fraction of the bucket that arrived (1.0 = all)
    repairs: int  #: packets repaired
    duration: float  #: seconds the daemon spent on the op
    wall: float  #: seconds from the hook's call to the op's completion (copy in, op, average)


@dataclass(eq=False)
class _Op:
    """One bucket's op, from the hook's call to its completion."""

    step: int
    bucket: int
    layer: int
    layers: int
    name: str
    tensor_id: int
    arena: torch.Tensor
    timeout: Optional[float]  # seconds from its submission to its completion, at most
    t0: float  # perf_counter() at the hook's call
    fut: torch.futures.Future = field(default_factory=torch.futures.Future)
    seq: Optional[int] = None
    deadline: Optional[float] = None  # time.monotonic() by which it must complete
    report: Optional[BucketReport] = None


def _why(e: dlcp.DlcpError) -> str:
    """A library error as the hook's reason (the same text as before the hook was asynchronous)."""
    return f"{e.op}: {e.reason} [{e.name}]"


class _Waiter:
    """The completion waiter of one :class:`DlcpState`: a daemon thread that
    waits for the client's completions and completes the hook's futures.

    ``cv`` guards ``pending`` (ops in flight by op_seq), ``order`` (the same ops
    in submission order, for the reports) and ``failed``. The hook submits while
    holding it, so a completion never arrives for an op not yet registered; the
    thread never holds it while it waits.

    The thread waits in ``poll`` on the client's completion doorbell, its
    control socket and its own wake-up eventfd (``close``), never inside the
    library; it takes completions with ``Client.wait(timeout=0)``, which drains
    the doorbell before its last look at the ring, so a completion posted after
    that rings it again and no wake-up is lost."""

    def __init__(self, client: dlcp.Client, reports: Deque[BucketReport], on_report):
        self.client = client
        self.reports = reports
        self.on_report = on_report
        self.cv = threading.Condition(threading.RLock())
        self.pending: Dict[int, _Op] = {}
        self.order: Deque[_Op] = collections.deque()
        self.failed: Optional[DlcpHookError] = None
        self.stopping = False
        self.wake: Optional[int] = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.completion_fd, self.control_fd = client.wait_fds()
        self.poller = select.poll()
        for fd in (self.completion_fd, self.control_fd, self.wake):
            self.poller.register(fd, select.POLLIN)
        self.thread = threading.Thread(target=self._run, name="dlcp-completions", daemon=True)
        self.thread.start()

    def submit(self, op: _Op, submit: Callable[[], int]) -> None:
        """Submits ``op`` (``submit()`` returns its op_seq) and registers it. A
        full ring (:class:`dlcp.BusyError`) waits for a completion of an op in
        flight, at most ``op.timeout``. Raises :class:`DlcpHookError` (and fails
        the state) if the submit fails."""
        room_by = None if op.timeout is None else time.monotonic() + op.timeout
        with self.cv:
            while True:
                if self.failed is not None:
                    raise self.later_error(op.step, op.bucket)
                try:
                    op.seq = submit()
                    break
                except dlcp.BusyError as e:
                    if not self.pending or (room_by is not None and time.monotonic() >= room_by):
                        raise self._fail(_why(e), e, caller=(op.step, op.bucket)) from e
                    self.cv.wait(0.1)  # each completion notifies
                except dlcp.DlcpError as e:
                    raise self._fail(_why(e), e, caller=(op.step, op.bucket)) from e
            op.deadline = None if op.timeout is None else time.monotonic() + op.timeout
            self.pending[op.seq] = op
            self.order.append(op)
            self.cv.notify_all()

    def later_error(self, step: int, bucket: int) -> DlcpHookError:
        """The error of a hook call after a failure."""
        reason = self.failed.reason if self.failed is not None else "?"
        return DlcpHookError(step, bucket, None, f"an earlier op failed, the ranks are out of step ({reason})")

    def close(self) -> None:
        """Stops the thread; ops still in flight fail."""
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
            wake = self.wake
        if wake is None:  # closed already
            return
        os.eventfd_write(wake, 1)
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=5.0)
        with self.cv:
            if not self.thread.is_alive() and self.wake is not None:
                os.close(self.wake)  # the thread is gone: nothing polls it any more
                self.wake = None

    def _run(self) -> None:
        try:
            while self._turn():
                pass
        except BaseException as e:  # never leave a future pending
            self._fail(f"the completion waiter stopped: {type(e).__name__}: {e}")

    def _turn(self) -> bool:
        """Sleeps while nothing is in flight; else takes the completions that
        are ready, or sleeps in ``poll`` until one may be (at most until the
        first op's deadline, or POLL_MAX), and fails the ops past their
        deadline. False once stopped."""
        with self.cv:
            while not self.pending and not self.stopping:
                self.cv.wait()
            if self.stopping:
                if self.pending:
                    self._fail("the dlcp state was closed with the op in flight")
                return False
            deadlines = [op.deadline for op in self.pending.values() if op.deadline is not None]
        if not self._take(0):
            sleep = POLL_MAX if not deadlines else min(POLL_MAX, max(0.0, min(deadlines) - time.monotonic()))
            ready = {fd for fd, _ in self.poller.poll(int(sleep * 1000) + 1)}
            if self.wake in ready:
                os.eventfd_read(self.wake)
            if self.control_fd in ready and self.completion_fd not in ready:
                self._take(CONTROL_WAIT)  # a note, or the daemon gone: the library reads it
        now = time.monotonic()
        with self.cv:
            late = [op for op in self.pending.values() if op.deadline is not None and now > op.deadline]
        if late:
            why = f"wait: no completion within {late[0].timeout:g} s of the submit (the op may still complete)"
            self._fail(why + " [DLCP_ERR_TIMEOUT]", op=late[0])
        return True

    def _take(self, timeout: float) -> bool:
        """Completes the ops whose completions are ready (the first call may
        block ``timeout``, the others do not); fails the state on an error of
        the library (the daemon gone, the client closed, an I/O error). True if
        anything was taken or failed."""
        took = False
        while True:
            try:
                c = self.client.wait(None, timeout=timeout)
            except dlcp.DlcpTimeoutError:
                return took
            except dlcp.DlcpError as e:
                self._fail(_why(e), e)
                return True
            self._complete(c)
            took, timeout = True, 0

    def _complete(self, c: dlcp.Completion) -> None:
        with self.cv:
            op = self.pending.get(c.op_seq)
            if op is None:  # not one of the hook's, or already failed (past its deadline)
                return
            if not c.ok:
                self._fail(f"the op completed with status {c.status!r}: {c.reason}", op=op)
                return
            del self.pending[c.op_seq]
            op.report = BucketReport(
                step=op.step,
                bucket=op.bucket,
                layer=op.layer,
                layers=op.layers,
                numel=op.arena.numel(),
                op_seq=c.op_seq,
                tensor=op.name,
                tensor_id=op.tensor_id,
                delivered=c.delivered_ppm / 1_000_000,
                repairs=c.repairs,
                duration=c.duration,
                wall=time.perf_counter() - op.t0,
            )
            # Reports in submission order: move the completed head of the queue.
            flushed = []
            while self.order and self.order[0].report is not None:
                flushed.append(self.order.popleft().report)
            self.reports.extend(flushed)
            self.cv.notify_all()  # a submit may wait for room in the ring
        if self.on_report is not None:
            for r in flushed:
                self.on_report(r)
        op.fut.set_result(op.arena)

    def _fail(self, reason: str, cause=None, op: Optional[_Op] = None, caller=None) -> DlcpHookError:
        """Fails the state (unless it failed before) and every op in flight.
        What failed: ``op`` (an op in flight), ``caller`` (the (step, bucket) of
        a hook call that could not submit) or, with neither, every op in flight
        alike (the daemon gone...). The others fail saying so. Returns the error
        of what failed."""
        with self.cv:
            victims = list(self.pending.values())
            self.pending.clear()
            self.order.clear()
            if op is not None:
                mine, what = DlcpHookError(op.step, op.bucket, op.seq, reason, cause), f"op {op.seq}"
            elif caller is not None:
                mine, what = DlcpHookError(*caller, None, reason, cause), f"the submit of bucket {caller[1]}"
            else:
                first = victims[0] if victims else None
                at = (first.step, first.bucket, first.seq) if first is not None else (-1, -1, None)
                mine, what = DlcpHookError(*at, reason, cause), None
            if self.failed is None:
                self.failed = mine
            self.cv.notify_all()
        for o in victims:
            if o is op:
                err = mine
            elif what is None:
                err = DlcpHookError(o.step, o.bucket, o.seq, reason, cause)
            else:
                err = DlcpHookError(o.step, o.bucket, o.seq, f"in flight when {what} failed: {reason}", cause)
            if not o.fut.done():
                o.fut.set_exception(err)
        return mine

class DlcpState:
    """State of :func:`allreduce_hook`: the dlcp client, the bucket tensors in the
    shared arena, the layer positions, the completion waiter and the reports.

    ``module``: the model (DDP-wrapped or not) whose parameters DDP buckets.
    ``client``: an attached :class:`dlcp.Client` (else one is attached with
    ``socket``/``job``/``local_rank``/``local_world``, defaults from the
    environment); the state's waiter takes every completion of it, so do not
    use it for other ops meanwhile. ``world_size``: trainers of the job on all
    hosts (default ``torch.distributed.get_world_size()``), for information:
    the ops are averages, which the daemons divide by the job's trainers.
    ``budget``: tolerated loss fraction per op (0 = reliable, bit-exact).
    ``fill_local``: a chunk given up counts as this host's own contribution
    instead of zero; ``rescale``: scale partially delivered sums up by the
    delivered count. Both are per-op flags on top of the daemon's ``[loss]``
    settings (they can turn the behaviour on, not off).
    ``timeout``: seconds from an op's submission to its completion, at most
    (the daemon itself fails an op whose peers stay silent for
    ``loss.hard_timeout_ms``); None: no limit of the hook's own.
    ``max_reports``: keep at most this many recent reports. ``on_report``:
    called with each :class:`BucketReport`, from the waiter thread.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        client: Optional[dlcp.Client] = None,
        *,
        socket: Optional[str] = None,
        job: Optional[int] = None,
        local_rank: Optional[int] = None,
        local_world: Optional[int] = None,
        world_size: Optional[int] = None,
        budget: Optional[float] = None,
        fill_local: bool = False,
        rescale: bool = False,
        timeout: Optional[float] = 60.0,
        max_reports: int = 200_000,
        on_report: Optional[Callable[[BucketReport], None]] = None,
    ):
        env = os.environ
        # A fraction or a percentage string ("1%"); dlcp.InvalidArgumentError is a ValueError.
        self.budget = dlcp.parse_budget(env.get("DLCP_BUDGET", "0.01") if budget is None else budget)
        self.flags = (dlcp.FLAG_FILL_LOCAL if fill_local else 0) | (dlcp.FLAG_RESCALE if rescale else 0)
        self.timeout = timeout
        self.world_size = world_size
        self.on_report = on_report
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the module has no parameters that require gradients")
        # Layer position of each parameter: its index in module.parameters().
        self._position: Dict[int, int] = {p.data_ptr(): i for i, p in enumerate(params)}
        self.layers = len(params)
        if client is None:
            # Unset arguments come from DLCP_SOCKET, DLCP_JOB, LOCAL_RANK, LOCAL_WORLD_SIZE.
            client = dlcp.attach(socket, job, local_rank, local_world)
        self.client = client
        self.step = 0
        self.reports: Deque[BucketReport] = collections.deque(maxlen=max_reports)
        self._tensors: Dict[Tuple[int, int, torch.dtype], Tuple[str, torch.Tensor]] = {}
        self._waiter = _Waiter(client, self.reports, on_report)

    def __repr__(self) -> str:
        return f"<dlcp.torch.DlcpState step={self.step} budget={self.budget} {self.client!r}>"

    @property
    def failed(self) -> Optional[DlcpHookError]:
        """The first failure (None while every op succeeded): every later hook call raises."""
        return self._waiter.failed

    def close(self) -> None:
        """Stops the completion waiter (ops still in flight fail) and detaches
        from the daemon (the hook fails afterwards)."""
        self._waiter.close()
        self.client.close()

    def step_reports(self, step: int) -> List[BucketReport]:
        """The reports of one step, in hook order."""
        return [r for r in self.reports if r.step == step]

    def _arena_tensor(self, index: int, numel: int, dtype: torch.dtype = torch.float32) -> Tuple[str, torch.Tensor]:
        # Buckets change size once (DDP rebuilds them after the first step): one
        # arena tensor per (bucket, size, dtype). Every rank sees the same
        # sequence, so tensor ids (allocation order) agree across ranks.
        key = (index, numel, dtype)
        t = self._tensors.get(key)
        if t is None:
            kind = _DTYPES[dtype]
            name = f"ddp.bucket{index}.n{numel}" + ("" if dtype == torch.float32 else f".{kind}")
            view = self.client.tensor(name, numel, dtype=kind)
            if dtype == torch.bfloat16:
                # numpy has no bfloat16: the arena view holds the raw bits as
                # uint16, which torch 1.13 cannot wrap; as int16 it can, and a
                # same-size view reinterprets them as bfloat16 (no copy).
                arena = torch.from_numpy(view.view(np.int16)).view(torch.bfloat16)
            else:
                arena = torch.from_numpy(view)
            t = (name, arena)
            self._tensors[key] = t
        return t

    def _layer_of(self, bucket) -> int:
        pos = [self._position.get(p.data_ptr()) for p in bucket.parameters()]
        known = [p for p in pos if p is not None]
        return min(known) if known else 0


def _value(fut: torch.futures.Future) -> torch.Tensor:
    # Re-raises a DlcpHookError set with set_exception: torch then fails the
    # chained future with its text ("DlcpHookError: dlcp allreduce of ..."),
    # which DDP raises from backward(). (DDP would read an exception set on the
    # hook's own future as the value, not as an error.)
    return fut.value()


def allreduce_hook(state: DlcpState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average ``bucket`` over all trainers through dlcpd
    (float32, float16 or bfloat16 buckets; the daemons divide).

    Register with ``ddp_model.register_comm_hook(DlcpState(ddp_model), allreduce_hook)``.
    Copies the bucket into its arena tensor, submits the allreduce and returns
    at once a future that the state's completion waiter completes with the
    averaged bucket, or fails with a :class:`DlcpHookError`. Raises
    :class:`DlcpHookError` at once if the submit fails or an earlier op failed.
    """
    index = bucket.index()
    step = state.step
    if bucket.is_last():
        state.step += 1
    waiter = state._waiter
    if waiter.failed is not None:
        raise waiter.later_error(step, index)
    t0 = time.perf_counter()
    buf = bucket.buffer()
    if buf.dtype not in _DTYPES or buf.is_sparse or buf.device.type != "cpu":
        raise DlcpHookError(
            step,
            index,
            None,
            f"unsupported gradient bucket ({buf.dtype}, {buf.device}): dlcp reduces CPU float32, float16, bfloat16",
        )
    try:
        name, arena = state._arena_tensor(index, buf.numel(), buf.dtype)
        tensor_id = state.client.tensor_id(name)
    except dlcp.DlcpError as e:
        raise waiter._fail(_why(e), e, caller=(step, index)) from e
    arena.copy_(buf.reshape(-1))  # the one copy: DDP's bucket -> shared memory
    layer = state._layer_of(bucket)
    op = _Op(step, index, layer, state.layers, name, tensor_id, arena, state.timeout, t0)
    waiter.submit(
        op,
        lambda: state.client.submit(
            name, layer=layer, layers=state.layers, budget=state.budget, flags=state.flags, op="average"
        ),
    )
    return op.fut.then(_value)
