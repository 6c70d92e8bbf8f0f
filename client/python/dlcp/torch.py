"""dlcp.torch — PyTorch DistributedDataParallel over dlcpd.

One line switches DDP's gradient allreduce to dlcp::

    import dlcp.torch
    model = torch.nn.parallel.DistributedDataParallel(net)
    model.register_comm_hook(dlcp.torch.DlcpState(model), dlcp.torch.allreduce_hook)

PyTorch stays the distributed engine (process group, bucketing, the optimizer);
dlcp only carries the gradient buckets. For each bucket the hook copies DDP's
flat bucket buffer once into a tensor of the daemon's shared arena (the one copy
the bucket API forces: DDP owns that buffer), allreduces it in place with the
bucket's layer position (the position of its front-most parameter in
``module.parameters()``, so front layers get the higher priority class — DDP's
bucket 0 holds the *last* layers), divides by the world size and returns a
completed ``torch.futures.Future`` whose value *is* the arena tensor (DDP copies
it into the gradients).

Every op's report (delivered fraction, packets repaired, daemon time) is kept in
:attr:`DlcpState.reports` as :class:`BucketReport` rows, per step and bucket.

Failure semantics: if the daemon is not running, attaching raises
:class:`dlcp.ConnectError` when the state is created. If an op fails (a peer
silent for ``loss.hard_timeout_ms``, a peer restarted, the daemon gone, no
completion within ``timeout`` seconds), the hook raises :class:`DlcpHookError`
naming the op (step, bucket, op sequence) and the reason; PyTorch surfaces it
from ``loss.backward()`` as a ``RuntimeError`` carrying that text. The ranks are
then out of step: every later call raises too, at once, until the job restarts
(or falls back to Gloo: just do not register the hook).

Settings come from arguments or the environment: ``DLCP_SOCKET`` (control
socket), ``DLCP_JOB`` (job id, must match the daemon's ``node.job_id``),
``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (set by torchrun: the trainers sharing this
host's daemon), ``DLCP_BUDGET`` (loss budget: a fraction, or a percentage such as "1%").

Tested with Debian 12's ``python3-torch`` 1.13 (CPU, Gloo process group) and
``/usr/bin/python3`` 3.11. Only float32 gradients are supported (dlcp reduces f32).
"""

import collections
import os
import time
from dataclasses import dataclass
from typing import Callable, Deque, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

import dlcp

__all__ = ["DlcpState", "BucketReport", "DlcpHookError", "allreduce_hook"]


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
    numel: int  #: float32 elements in the bucket
    op_seq: int  #: dlcp op sequence number (`dlcpctl report OP_SEQ TENSOR`)
    tensor: str  #: dlcp tensor name
    tensor_id: int  #: dlcp tensor id (`dlcpctl report OP_SEQ TENSOR_ID`)
    delivered: float  #: fraction of the bucket that arrived (1.0 = all)
    repairs: int  #: packets repaired
    duration: float  #: seconds the daemon spent on the op
    wall: float  #: seconds the hook spent (copy in, op, average)


class DlcpState:
    """State of :func:`allreduce_hook`: the dlcp client, the bucket tensors in the
    shared arena, the layer positions and the reports.

    ``module``: the model (DDP-wrapped or not) whose parameters DDP buckets.
    ``client``: an attached :class:`dlcp.Client` (else one is attached with
    ``socket``/``job``/``local_rank``/``local_world``, defaults from the
    environment). ``world_size``: trainers of the job on all hosts (default
    ``torch.distributed.get_world_size()``); the sum is divided by it.
    ``budget``: tolerated loss fraction per op (0 = reliable, bit-exact).
    ``fill_local``: a chunk given up counts as this host's own contribution
    instead of zero; ``rescale``: scale partially delivered sums up by the
    delivered count. Both are per-op flags on top of the daemon's ``[loss]``
    settings (they can turn the behaviour on, not off).
    ``timeout``: seconds to wait for an op's completion (the daemon itself fails
    an op whose peers stay silent for ``loss.hard_timeout_ms``).
    ``max_reports``: keep at most this many recent reports. ``on_report``:
    called with each :class:`BucketReport`.
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
        self._tensors: Dict[Tuple[int, int], Tuple[str, torch.Tensor]] = {}
        self._failed: Optional[DlcpHookError] = None

    def __repr__(self) -> str:
        return f"<dlcp.torch.DlcpState step={self.step} budget={self.budget} {self.client!r}>"

    def close(self) -> None:
        """Detaches from the daemon (the hook fails afterwards)."""
        self.client.close()

    def step_reports(self, step: int) -> List[BucketReport]:
        """The reports of one step, in hook order."""
        return [r for r in self.reports if r.step == step]

    def _arena_tensor(self, index: int, numel: int) -> Tuple[str, torch.Tensor]:
        # Buckets change size once (DDP rebuilds them after the first step): one
        # arena tensor per (bucket, size). Every rank sees the same sequence, so
        # tensor ids (allocation order) agree across ranks.
        key = (index, numel)
        t = self._tensors.get(key)
        if t is None:
            name = f"ddp.bucket{index}.n{numel}"
            view = self.client.tensor(name, numel)
            t = (name, torch.from_numpy(view))
            self._tensors[key] = t
        return t

    def _layer_of(self, bucket) -> int:
        pos = [self._position.get(p.data_ptr()) for p in bucket.parameters()]
        known = [p for p in pos if p is not None]
        return min(known) if known else 0


def allreduce_hook(state: DlcpState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average ``bucket`` over all trainers through dlcpd.

    Register with ``ddp_model.register_comm_hook(DlcpState(ddp_model), allreduce_hook)``.
    Returns a completed future holding the averaged bucket; raises
    :class:`DlcpHookError` if the op fails.
    """
    index = bucket.index()
    step = state.step
    if bucket.is_last():
        state.step += 1
    if state._failed is not None:
        raise DlcpHookError(
            step, index, None, f"an earlier op failed, the ranks are out of step ({state._failed.reason})"
        )
    t0 = time.perf_counter()
    buf = bucket.buffer()
    if buf.dtype != torch.float32 or buf.is_sparse or buf.device.type != "cpu":
        raise DlcpHookError(
            step, index, None, f"unsupported gradient bucket ({buf.dtype}, {buf.device}): dlcp reduces CPU float32"
        )
    numel = buf.numel()
    seq = None
    try:
        name, arena = state._arena_tensor(index, numel)
        arena.copy_(buf.reshape(-1))  # the one copy: DDP's bucket -> shared memory
        layer = state._layer_of(bucket)
        seq = state.client.next_op_seq
        rep = state.client.allreduce(
            name, layer=layer, layers=state.layers, budget=state.budget, timeout=state.timeout, flags=state.flags
        )
    except dlcp.DlcpError as e:
        err = DlcpHookError(step, index, seq, f"{e.op}: {e.reason} [{e.name}]", e)
        if isinstance(e, dlcp.OpFailedError):
            err = DlcpHookError(step, index, seq, f"the op completed with status {e.status!r}: {e.reason}", e)
        state._failed = err
        raise err from e
    world = state.world_size or (dist.get_world_size() if dist.is_initialized() else 1)
    arena.div_(world)
    r = BucketReport(
        step=step,
        bucket=index,
        layer=layer,
        layers=state.layers,
        numel=numel,
        op_seq=rep.op_seq,
        tensor=name,
        tensor_id=state.client.tensor_id(name),
        delivered=rep.delivered,
        repairs=rep.repairs,
        duration=rep.duration,
        wall=time.perf_counter() - t0,
    )
    state.reports.append(r)
    if state.on_report is not None:
        state.on_report(r)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(arena)
    return fut
