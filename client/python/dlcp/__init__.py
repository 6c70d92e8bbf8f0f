"""dlcp — Python client of the dlcp transport daemon (``dlcpd``).

A trainer attaches to the local daemon, asks for named gradient tensors — numpy
arrays that *are* the daemon's shared-memory buffers, so a gradient is written
once, in place — and allreduces them; the reduced result appears in the same
array::

    import numpy as np
    import dlcp

    with dlcp.attach("/run/dlcp/dlcpd.sock", job=0x10B, local_rank=0, local_world=1) as c:
        g = c.tensor("layer3.grad", 4096)      # float32 view of the shared arena
        g[:] = compute_gradient()              # written once, no copy
        report = c.allreduce(g, layer=3, layers=12, budget=0.01)
        # g now holds the reduced gradient
        print(report.delivered, report.duration)

Install it with ``pip install ./client/python`` (after ``cargo build --release
-p dlcp-client``; the package bundles that library), or use the Debian package.

This package is pure Python over the C ABI of ``libdlcp_client.so`` (ctypes);
the ring operations and their atomics stay in that Rust library. The library is
found, in order, at ``$DLCP_LIB`` when it is set (an explicit override), next
to this package (the one a wheel or the .deb installed), or in
``target/{release,debug}/`` of the source tree (or ``$CARGO_TARGET_DIR``).

:func:`attach` takes its defaults from the environment, as the PyTorch hook
does: ``DLCP_SOCKET``, ``DLCP_JOB``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``
(explicit arguments win). A daemon that refuses the attachment (another job,
a rank in use, ...) raises :class:`RejectedError` with its reason, e.g.
"the trainer registered for job 999 but this daemon serves job 7".

Element types: ``c.tensor(name, n)`` is float32; ``dtype="float16"`` gives a
``np.float16`` view and ``dtype="bfloat16"`` a bfloat16 tensor. **numpy has no
bfloat16**, so a bfloat16 tensor is an ``np.uint16`` array of the raw bf16 bits
(the upper half of each float32); :func:`bf16_from_float32` and
:func:`bf16_to_float32` convert (round to nearest even), and a
``torch.bfloat16`` tensor's ``.view(torch.uint16)`` / ``.view(torch.int16)``
bits can be copied in as they are. f16 and bf16 tensors are reduced with
float32 accumulation at each owner and rounded once to their type (to nearest
even), so every rank gets the same bytes. ``op="average"`` divides by the
job's number of trainers once, in the daemons (the trainer does not).

Budgets are fractions of a tensor that may be lost (``0.01`` = 1%, ``0`` =
exact); the string ``"1%"`` means the same. The default of :meth:`Client.allreduce`
(and :meth:`Client.reduce_scatter`) is ``0.01``: lossy unless you pass
``budget=0``; :meth:`Client.allgather` and :meth:`Client.broadcast` are exact
unless you pass a budget.

Besides allreduce: :meth:`Client.reduce_scatter` (this host's shard of the
tensor reduced, the rest left as it was; the :class:`Report`'s ``shard`` is
the slice, ``t.reshape(-1)[report.shard]``), :meth:`Client.allgather` (each
host contributes its shard, everyone gets the whole tensor),
:meth:`Client.broadcast` (every trainer gets local rank 0's tensor on the host
of daemon rank ``root``) and :meth:`Client.barrier` (no tensor). A host's shard
is elements ``r*n//nodes .. (r+1)*n//nodes`` of its daemon's rank ``r``
(:attr:`World.node_rank` of :attr:`World.nodes`); with several trainers on a
host, what it contributes to an allgather is the sum of its trainers' tensors
over its shard. All take float32, float16 and bfloat16 tensors.

The daemon tells each trainer where it stands: :attr:`Client.rank` and
:attr:`Client.world_size` (and :attr:`Client.world`). A failed op says why in
the daemon's words: :class:`OpFailedError`'s message ends with it (the ranks a
timeout waited on, the descriptor field the daemon rejected, ...), and a failed
:class:`Completion` from :meth:`Client.wait` has it in ``reason``.

Rules: do not read or write a tensor between :meth:`Client.submit` and the
receipt of its completion (``allreduce`` does both for you); allocate tensors in
the same order on every rank (their ids go on the wire). Errors raise
:class:`DlcpError` subclasses that name the operation and say what happened.

Tested with Debian's ``/usr/bin/python3`` and ``python3-numpy``.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

import numpy as np

__all__ = [
    "attach",
    "Client",
    "Report",
    "Completion",
    "World",
    "DlcpError",
    "InvalidArgumentError",
    "ClosedError",
    "AttachError",
    "ConnectError",
    "RejectedError",
    "ProtocolError",
    "ArenaFullError",
    "NameInUseError",
    "BusyError",
    "TensorBusyError",
    "DlcpTimeoutError",
    "DaemonGoneError",
    "OpFailedError",
    "DlcpIOError",
    "InternalError",
    "FLAG_RESCALE",
    "FLAG_FILL_LOCAL",
    "DEFAULT_SOCKET",
    "MAX_BUDGET",
    "load_library",
    "parse_budget",
    "version",
    "bf16_from_float32",
    "bf16_to_float32",
    "DTYPES",
    "OPS",
]

#: Element types a tensor may have: name -> (C ``enum dlcp_dtype``, numpy dtype of
#: its view). bfloat16 has no numpy dtype: its view holds the raw bits as uint16.
DTYPES = {
    "float32": (1, np.dtype(np.float32)),
    "float16": (2, np.dtype(np.float16)),
    "bfloat16": (3, np.dtype(np.uint16)),
}
_DTYPE_ALIASES = {"f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16", "half": "float16",
                  "bf16": "bfloat16"}
#: Reductions: name -> C ``enum dlcp_op``.
OPS = {"sum": 0, "average": 1}
_OP_ALIASES = {"avg": "average", "mean": "average"}


def _dtype_name(dtype) -> str:
    """The canonical name of ``dtype``: a name ("float16", "bf16", ...) or a
    numpy float32/float16 dtype (bfloat16 only by name: numpy has none)."""
    if isinstance(dtype, str):
        name = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
        if name in DTYPES:
            return name
    else:
        try:
            d = np.dtype(dtype)
        except TypeError:
            d = None
        if d == np.float32:
            return "float32"
        if d == np.float16:
            return "float16"
    raise InvalidArgumentError(
        "tensor", -3, f"dtype {dtype!r}: use float32, float16 or 'bfloat16' (numpy has no bfloat16)"
    )


def _op_code(op: str) -> int:
    name = _OP_ALIASES.get(str(op).lower(), str(op).lower())
    if name not in OPS:
        raise InvalidArgumentError("allreduce", -3, f"op {op!r}: use 'sum' or 'average'")
    return OPS[name]


def bf16_from_float32(x) -> np.ndarray:
    """float32 values as bfloat16 bits (``np.uint16``), rounded to nearest even
    (NaN stays NaN). What to write into a bfloat16 tensor's view."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = np.isnan(b.view(np.float32))
    r = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    return np.where(nan, ((b >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16), r)


def bf16_to_float32(bits) -> np.ndarray:
    """bfloat16 bits (``np.uint16``) as float32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)

#: The daemon's default control socket (``control.socket_path``).
DEFAULT_SOCKET = "/run/dlcp/dlcpd.sock"
#: The hard cap on a loss budget (10%), as in the daemon's configuration.
MAX_BUDGET = 0.10
#: After a partial delivery, rescale by the delivered count.
FLAG_RESCALE = 0x1
#: Fill what is missing with the local value instead of zero.
FLAG_FILL_LOCAL = 0x2

# ---------------------------------------------------------------------------
# Errors (codes mirror enum dlcp_error in client/include/dlcp.h)
# ---------------------------------------------------------------------------


class DlcpError(Exception):
    """A dlcp call failed.

    Attributes: ``op`` (the operation, e.g. ``"allreduce"``), ``code`` (the
    negative ``DLCP_ERR_*`` value), ``name`` (its C name) and ``reason`` (the
    library's message saying what happened).
    """

    def __init__(self, op: str, code: int, reason: str):
        self.op = op
        self.code = code
        self.name = _ERROR_NAMES.get(code, "DLCP_ERR_UNKNOWN")
        self.reason = reason
        super().__init__(f"{op}: {reason} [{self.name}]")


class InvalidArgumentError(DlcpError, ValueError):
    """An argument is invalid (unknown tensor, bad name, layer >= layers, ...)."""


class ClosedError(DlcpError):
    """The client is closed (or its handle is not live)."""


class AttachError(DlcpError, ConnectionError):
    """Attaching to the daemon failed."""


class ConnectError(AttachError):
    """No daemon answers on the control socket (is dlcpd running? right path?)."""


class RejectedError(AttachError):
    """The daemon refused the attachment (rank in use, world size mismatch, policy)."""


class ProtocolError(AttachError):
    """The attach handshake or the shared segment was invalid (version skew?)."""


class ArenaFullError(DlcpError, MemoryError):
    """No room left in the shared arena for the tensor."""


class NameInUseError(DlcpError):
    """A tensor of that name already exists with another size."""


class BusyError(DlcpError):
    """Too many operations in flight; wait for a completion first."""


class TensorBusyError(BusyError):
    """The tensor has an operation in flight; wait for its completion first."""


class DlcpTimeoutError(DlcpError, TimeoutError):
    """No completion within the timeout (the operation may still complete)."""


class DaemonGoneError(DlcpError, ConnectionError):
    """The daemon closed the control socket; every operation in flight is lost."""


class OpFailedError(DlcpError):
    """The operation completed with a status other than ``"ok"``.

    ``completion`` holds the :class:`Completion` (``status``, ``detail``); the
    message (``reason``) ends with the daemon's own reason: the ranks a
    timeout waited on, the descriptor field it rejected, the local trainer
    that left, ...
    """

    def __init__(self, op: str, code: int, reason: str, completion: "Completion"):
        super().__init__(op, code, reason)
        self.completion = completion
        self.status = completion.status


class DlcpIOError(DlcpError, OSError):
    """I/O error on a doorbell or the control socket, or corrupted shared rings."""


class InternalError(DlcpError):
    """A bug in the dlcp library; detach and report it."""


_ERRORS = {
    -1: ("DLCP_ERR_NULL_ARG", InvalidArgumentError),
    -2: ("DLCP_ERR_BAD_HANDLE", ClosedError),
    -3: ("DLCP_ERR_INVALID_ARG", InvalidArgumentError),
    -4: ("DLCP_ERR_CONNECT", ConnectError),
    -5: ("DLCP_ERR_REJECTED", RejectedError),
    -6: ("DLCP_ERR_PROTOCOL", ProtocolError),
    -7: ("DLCP_ERR_ARENA_FULL", ArenaFullError),
    -8: ("DLCP_ERR_NAME_IN_USE", NameInUseError),
    -9: ("DLCP_ERR_BUSY", BusyError),
    -10: ("DLCP_ERR_TENSOR_BUSY", TensorBusyError),
    -11: ("DLCP_ERR_TIMEOUT", DlcpTimeoutError),
    -12: ("DLCP_ERR_DAEMON_GONE", DaemonGoneError),
    -13: ("DLCP_ERR_OP_FAILED", OpFailedError),
    -14: ("DLCP_ERR_IO", DlcpIOError),
    -15: ("DLCP_ERR_CORRUPTED", DlcpIOError),
    -16: ("DLCP_ERR_INTERNAL", InternalError),
}
_ERROR_NAMES = {code: name for code, (name, _) in _ERRORS.items()}
_STATUS_NAMES = {0: "ok", 1: "invalid_descriptor", 2: "timeout", 3: "peer_down", 4: "shutdown"}

# ---------------------------------------------------------------------------
# The shared library
# ---------------------------------------------------------------------------


class _CCompletion(ctypes.Structure):
    """``dlcp_completion`` (48 bytes)."""

    _fields_ = [
        ("op_seq", ctypes.c_uint64),
        ("cookie", ctypes.c_uint64),
        ("duration_ns", ctypes.c_uint64),
        ("tensor", ctypes.c_uint32),
        ("status", ctypes.c_uint32),
        ("detail", ctypes.c_uint32),
        ("delivered_ppm", ctypes.c_uint32),
        ("repairs", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


assert ctypes.sizeof(_CCompletion) == 48


class _CWorld(ctypes.Structure):
    """``dlcp_world`` (24 bytes)."""

    _fields_ = [(name, ctypes.c_uint32) for name in ("rank", "size", "node_rank", "nodes", "local_rank", "local_world")]


assert ctypes.sizeof(_CWorld) == 24


class _CWaitFds(ctypes.Structure):
    """``dlcp_fds`` (8 bytes)."""

    _fields_ = [("completion", ctypes.c_int), ("control", ctypes.c_int)]


assert ctypes.sizeof(_CWaitFds) == 8

_lib: Optional[ctypes.CDLL] = None


def _candidates():
    here = Path(__file__).resolve().parent
    # An explicit $DLCP_LIB first (the user's override), then the library
    # bundled next to the package (a wheel, the .deb), then a source tree's.
    env = os.environ.get("DLCP_LIB")
    out = [Path(env)] if env else []
    out.append(here / "libdlcp_client.so")
    roots = []
    if os.environ.get("CARGO_TARGET_DIR"):
        roots.append(Path(os.environ["CARGO_TARGET_DIR"]))
    roots.append(here.parents[2] / "target")  # client/python/dlcp -> repository root
    for root in roots:
        out += [root / "release" / "libdlcp_client.so", root / "debug" / "libdlcp_client.so"]
    return out


def load_library(path: Union[str, os.PathLike, None] = None) -> ctypes.CDLL:
    """Loads ``libdlcp_client.so`` (once) and declares its functions.

    ``path`` overrides the search ($DLCP_LIB, next to the package, target/).
    Raises ``OSError`` naming every place looked at if it is not found.
    """
    global _lib
    if _lib is not None and path is None:
        return _lib
    tried = [Path(path)] if path is not None else _candidates()
    found = next((p for p in tried if p.is_file()), None)
    if found is None:
        raise OSError(
            "libdlcp_client.so not found; looked at: "
            + ", ".join(str(p) for p in tried)
            + " (build it with `cargo build --release -p dlcp-client` or set DLCP_LIB)"
        )
    lib = ctypes.CDLL(str(found))
    h, c_int, u32, u64, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64
    sigs = {
        "dlcp_attach": (c_int, [ctypes.c_char_p, u64, u32, u32, ctypes.POINTER(ctypes.c_void_p)]),
        "dlcp_detach": (c_int, [h]),
        "dlcp_alloc": (c_int, [h, ctypes.c_char_p, u64, ctypes.POINTER(u32)]),
        "dlcp_alloc_dtype": (c_int, [h, ctypes.c_char_p, u64, u32, ctypes.POINTER(u32)]),
        "dlcp_submit_op": (c_int, [h, u32, u32, u32, u32, u32, u32, ctypes.POINTER(u64)]),
        "dlcp_allreduce_op": (c_int, [h, u32, u32, u32, u32, u32, u32, i64, ctypes.POINTER(_CCompletion)]),
        "dlcp_reduce_scatter": (
            c_int,
            [h, u32, u32, u32, u32, u32, u32, i64, ctypes.POINTER(_CCompletion), ctypes.POINTER(u64),
             ctypes.POINTER(u64)],
        ),
        "dlcp_allgather": (
            c_int,
            [h, u32, u32, u32, u32, i64, ctypes.POINTER(_CCompletion), ctypes.POINTER(u64), ctypes.POINTER(u64)],
        ),
        "dlcp_broadcast": (c_int, [h, u32, u32, u32, u32, u32, i64, ctypes.POINTER(_CCompletion)]),
        "dlcp_barrier": (c_int, [h, i64, ctypes.POINTER(_CCompletion)]),
        "dlcp_tensor_len": (c_int, [h, u32, ctypes.POINTER(u64)]),
        "dlcp_tensor_data": (ctypes.c_void_p, [h, u32]),
        "dlcp_submit": (c_int, [h, u32, u32, u32, u32, u32, ctypes.POINTER(u64)]),
        "dlcp_wait": (c_int, [h, i64, ctypes.POINTER(_CCompletion)]),
        "dlcp_wait_op": (c_int, [h, u64, i64, ctypes.POINTER(_CCompletion)]),
        "dlcp_wait_fds": (c_int, [h, ctypes.POINTER(_CWaitFds)]),
        "dlcp_allreduce": (c_int, [h, u32, u32, u32, u32, u32, i64, ctypes.POINTER(_CCompletion)]),
        "dlcp_next_op_seq": (c_int, [h, ctypes.POINTER(u64)]),
        "dlcp_set_next_op_seq": (c_int, [h, u64]),
        "dlcp_get_world": (c_int, [h, ctypes.POINTER(_CWorld)]),
        "dlcp_strerror": (ctypes.c_char_p, [c_int]),
        "dlcp_status_str": (ctypes.c_char_p, [u32]),
        "dlcp_last_error": (ctypes.c_char_p, [h]),
        "dlcp_version": (ctypes.c_char_p, []),
    }
    for name, (restype, argtypes) in sigs.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise OSError(
                f"{found} lacks {name}: it is older than this dlcp package; rebuild it"
                " (`cargo build --release -p dlcp-client`) or point DLCP_LIB at a current one"
            ) from None
        f.restype, f.argtypes = restype, argtypes
    if path is None:
        _lib = lib
    return lib


def _last_error(lib: ctypes.CDLL, handle) -> str:
    raw = lib.dlcp_last_error(handle) or b""
    msg = raw.decode("utf-8", "replace")
    # Drop the C function's name ("dlcp_alloc: ..."): the exception names the Python op.
    head, sep, rest = msg.partition(": ")
    return rest if sep and head.startswith("dlcp_") else msg


def _raise(lib: ctypes.CDLL, handle, op: str, rc: int, completion: "Optional[Completion]" = None):
    reason = _last_error(lib, handle) or (lib.dlcp_strerror(rc) or b"").decode()
    name, cls = _ERRORS.get(rc, ("DLCP_ERR_UNKNOWN", DlcpError))
    if cls is OpFailedError and completion is not None:
        raise OpFailedError(op, rc, reason, completion)
    raise cls(op, rc, reason)


def _timeout_ms(timeout: Optional[float]) -> int:
    if timeout is None:
        return -1
    if timeout < 0:
        raise InvalidArgumentError("timeout", -3, f"timeout must be >= 0 seconds or None, not {timeout}")
    return int(round(timeout * 1000))


_BUDGET_FORMS = 'a budget is a fraction: write 0.01 or "1%" for 1%'


def parse_budget(budget: Union[float, int, str]) -> float:
    """A loss budget as a fraction: a number (``0.01``) or a string holding a
    fraction (``"0.01"``) or a percentage (``"1%"``). Raises
    :class:`InvalidArgumentError` (a ``ValueError``) for anything else, for a
    negative budget, and above :data:`MAX_BUDGET` (a bare ``1`` is 100%, not 1%).
    """
    text = budget.strip() if isinstance(budget, str) else None
    try:
        if text is not None and text.endswith("%"):
            value = float(text[:-1].strip()) / 100.0
        else:
            value = float(text if text is not None else budget)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            "budget", -3, f"invalid budget {budget!r} ({_BUDGET_FORMS}; 0 = exact)"
        ) from None
    if not 0.0 <= value <= MAX_BUDGET:  # also NaN
        raise InvalidArgumentError(
            "budget",
            -3,
            f"budget {budget!r} is not in 0 ..= {MAX_BUDGET} (the hard cap, 10%): {_BUDGET_FORMS}; 0 = exact",
        )
    return value


def _budget_ppm(budget: Union[float, int, str]) -> int:
    return int(round(parse_budget(budget) * 1_000_000))


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    """A completed operation, as delivered by :meth:`Client.wait`."""

    op_seq: int
    tensor: str  #: tensor name
    status: str  #: "ok", "invalid_descriptor", "timeout", "peer_down", "shutdown", "unknown"
    detail: int  #: status detail (for invalid_descriptor: which rule)
    delivered_ppm: int
    repairs: int
    duration: float  #: seconds the daemon spent
    #: why it failed, with the daemon's reason ("" if it is ok)
    reason: str = ""

    @property
    def ok(self) -> bool:
        """True if the result is in the tensor."""
        return self.status == "ok"


@dataclass(frozen=True)
class World:
    """Where a trainer stands in its job (:attr:`Client.world`).

    The daemon knows its rank and the number of daemons (``[[peers]]``); every
    host is taken to run ``local_world`` trainers (as torchrun's
    ``--nproc-per-node``), so ``rank = node_rank * local_world + local_rank``
    of ``size = nodes * local_world``."""

    rank: int  #: this trainer's global rank
    size: int  #: the job's trainers on all hosts (the world size)
    node_rank: int  #: the daemon's rank among the job's daemons
    nodes: int  #: the job's number of daemons (hosts)
    local_rank: int  #: this trainer's rank on this host
    local_world: int  #: the job's trainers on this host


@dataclass(frozen=True)
class Report:
    """What a successful op (:meth:`Client.allreduce`, ...) reports."""

    op_seq: int
    tensor: str  #: tensor name ("" for a barrier)
    delivered_ppm: int  #: parts per million of the tensor that arrived
    repairs: int  #: packets repaired
    duration: float  #: seconds the daemon spent
    #: reduce-scatter and allgather: the first element of this host's shard
    shard_offset: int = 0
    #: reduce-scatter and allgather: the elements of this host's shard (0 otherwise)
    shard_len: int = 0

    @property
    def delivered(self) -> float:
        """Fraction of the tensor that arrived (1.0 = all of it)."""
        return self.delivered_ppm / 1_000_000

    @property
    def shard(self) -> slice:
        """This host's shard as a slice of the flattened tensor
        (``t.reshape(-1)[report.shard]``): what a reduce-scatter reduced, what
        an allgather took from this host; empty for the other collectives."""
        return slice(self.shard_offset, self.shard_offset + self.shard_len)


# ---------------------------------------------------------------------------
# Client
# ---------------------------------------------------------------------------


class _Handle:
    """Owns the C handle; detaches when the last reference (client or view) goes."""

    def __init__(self, lib: ctypes.CDLL, ptr: int):
        self.lib = lib
        self.ptr = ptr

    def __del__(self):
        lib, self.lib = self.lib, None
        if lib is not None:
            try:
                lib.dlcp_detach(self.ptr)
            except Exception:  # interpreter shutdown: nothing useful to do
                pass


class _Buffer:
    """Exposes one tensor's arena memory to numpy (``__array_interface__``) and
    keeps the handle — hence the mapping — alive as long as any view exists."""

    def __init__(self, addr: int, shape: Tuple[int, ...], handle: _Handle, dtype: np.dtype):
        self.__array_interface__ = {
            "shape": shape,
            "typestr": dtype.str,
            "data": (addr, False),
            "version": 3,
        }
        self._handle = handle


@dataclass
class _Tensor:
    tid: int
    name: str
    n: int
    addr: int
    dtype: str = "float32"


class Client:
    """A trainer's attachment to the local daemon. Create with :func:`attach`.

    Use as a context manager or call :meth:`close`. The C library serialises the
    calls on one handle, so two threads may share a client — one submitting,
    one waiting, as the DDP hook and its completion waiter do — but a
    :meth:`wait` delays the other thread's calls until it returns: wait in short
    slices. (A failed call's message is the handle's last error, read right
    after the call: a failure on the other thread in between could replace it.)
    """

    def __init__(self, lib: ctypes.CDLL, ptr: int, socket: str, job: int, local_rank: int, local_world: int):
        self._lib = lib
        self._h: Optional[_Handle] = _Handle(lib, ptr)
        self.socket, self.job, self.local_rank, self.local_world = socket, job, local_rank, local_world
        self._by_name: Dict[str, _Tensor] = {}
        self._by_id: Dict[int, _Tensor] = {}

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"{len(self._by_name)} tensors"
        return f"<dlcp.Client job={self.job:#x} rank={self.local_rank}/{self.local_world} {state}>"

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._h is None

    def close(self) -> None:
        """Detaches from the daemon. Idempotent.

        Tensor views stay valid memory: if some are still alive, the actual detach
        happens when the last of them is garbage-collected.
        """
        self._h = None

    def _ptr(self, op: str) -> int:
        if self._h is None:
            raise ClosedError(op, -2, "the client is closed")
        return self._h.ptr

    def _check(self, op: str, rc: int) -> None:
        if rc != 0:
            _raise(self._lib, self._ptr(op), op, rc)

    @property
    def world(self) -> World:
        """Where this trainer stands in its job (global rank, world size), as
        the daemon told it at attach. Raises :class:`ProtocolError` from a
        daemon too old to say."""
        out = _CWorld()
        self._check("world", self._lib.dlcp_get_world(self._ptr("world"), ctypes.byref(out)))
        return World(*(getattr(out, f) for f, _ in _CWorld._fields_))

    @property
    def rank(self) -> int:
        """This trainer's global rank (:attr:`world`)."""
        return self.world.rank

    @property
    def world_size(self) -> int:
        """The job's trainers on all hosts (:attr:`world`)."""
        return self.world.size

    @property
    def next_op_seq(self) -> int:
        """The op sequence number the next submit uses (1 after attach).

        The daemon matches an op across trainers by (op_seq, tensor): every trainer
        of a job must submit the same sequence of ops. After a failed op, or when a
        replacement trainer joins a running job, the trainers agree where to
        continue and set it (refused if an op in flight has a number >= it)."""
        out = ctypes.c_uint64()
        self._check("next_op_seq", self._lib.dlcp_next_op_seq(self._ptr("next_op_seq"), ctypes.byref(out)))
        return out.value

    @next_op_seq.setter
    def next_op_seq(self, seq: int) -> None:
        self._check("next_op_seq", self._lib.dlcp_set_next_op_seq(self._ptr("next_op_seq"), seq))

    def tensor(self, name: str, shape: Union[int, Tuple[int, ...]], dtype="float32") -> np.ndarray:
        """An array of ``shape`` that is a view of tensor ``name`` in the
        shared arena (allocated on first use; asking again with the same size gives
        another view of the same memory). Write the gradient into it in place
        (``g[:] = grad``, ``np.copyto(g, grad)``, or compute into it with ``out=g``);
        after :meth:`allreduce` it holds the result. Do not touch it while an op on
        it is in flight. Tensor ids follow allocation order: allocate tensors in
        the same order on every rank.

        ``dtype``: ``"float32"`` (``np.float32``, the default), ``"float16"``
        (``np.float16``) or ``"bfloat16"`` (``"bf16"``): numpy has no bfloat16,
        so that view is ``np.uint16`` holding the raw bf16 bits (see
        :func:`bf16_from_float32`). Every rank must use the same dtype.
        """
        dname = _dtype_name(dtype)
        code, npdtype = DTYPES[dname]
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        n = prod(shape)
        ptr = self._ptr("tensor")
        t = self._by_name.get(name)
        if t is None:
            if n <= 0:
                raise InvalidArgumentError("tensor", -3, f"tensor {name!r} needs at least one element, not {n}")
            tid = ctypes.c_uint32()
            self._check("tensor", self._lib.dlcp_alloc_dtype(ptr, name.encode(), n, code, ctypes.byref(tid)))
            addr = self._lib.dlcp_tensor_data(ptr, tid.value)
            if not addr:
                _raise(self._lib, ptr, "tensor", -3)
            t = _Tensor(tid.value, name, n, addr, dname)
            self._by_name[name] = t
            self._by_id[t.tid] = t
        elif t.n != n or t.dtype != dname:
            raise NameInUseError(
                "tensor", -8, f"tensor {name!r} already exists with {t.n} {t.dtype} elements, not {n} {dname}"
            )
        return np.asarray(_Buffer(t.addr, shape, self._h, npdtype))

    def tensor_id(self, name: str) -> int:
        """The id of tensor ``name`` (what ``dlcpctl report OP TENSOR`` takes)."""
        t = self._by_name.get(name)
        if t is None:
            raise InvalidArgumentError("tensor_id", -3, f"no tensor named {name!r}")
        return t.tid

    def _tensor_of(self, op: str, array) -> _Tensor:
        if isinstance(array, str):
            t = self._by_name.get(array)
            if t is None:
                raise InvalidArgumentError(op, -3, f"no tensor named {array!r}")
            return t
        if not isinstance(array, np.ndarray):
            raise InvalidArgumentError(op, -3, f"expected a tensor view from Client.tensor(), got {type(array).__name__}")
        addr = array.__array_interface__["data"][0]
        t = next((t for t in self._by_name.values() if t.addr == addr), None)
        if t is None or array.size != t.n or array.dtype != DTYPES[t.dtype][1] or not array.flags.c_contiguous:
            raise InvalidArgumentError(
                op,
                -3,
                "array is not a whole view of a dlcp tensor: get one with Client.tensor(name, n) and write the"
                " gradient into it (g[:] = grad) instead of passing a separate array",
            )
        return t

    def _completion(self, c: _CCompletion, reason: str = "") -> Completion:
        t = self._by_id.get(c.tensor)
        return Completion(
            op_seq=c.op_seq,
            tensor=t.name if t else f"#{c.tensor}",
            status=_STATUS_NAMES.get(c.status, "unknown"),
            detail=c.detail,
            delivered_ppm=c.delivered_ppm,
            repairs=c.repairs,
            duration=c.duration_ns / 1e9,
            reason=reason,
        )

    def submit(
        self,
        array,
        layer: int = 0,
        layers: int = 1,
        budget: Union[float, str] = 0.01,
        flags: int = 0,
        op: str = "sum",
    ) -> int:
        """Submits an allreduce of a tensor (a view from :meth:`tensor`, or
        its name) without waiting; returns the op's sequence number. ``budget`` is
        the tolerated loss fraction (0.01 or "1%" = 1%, 0 = reliable); ``op`` is
        ``"sum"`` or ``"average"`` (over every trainer of the job, divided once
        by the daemons). Wait with :meth:`wait` before touching the tensor again."""
        t = self._tensor_of("submit", array)
        code = _op_code(op)
        seq = ctypes.c_uint64()
        ptr = self._ptr("submit")
        rc = self._lib.dlcp_submit_op(ptr, t.tid, layer, layers, _budget_ppm(budget), flags, code, ctypes.byref(seq))
        self._check("submit", rc)
        return seq.value

    def wait(self, op_seq: Optional[int] = None, timeout: Optional[float] = 60.0) -> Completion:
        """Waits for the completion of op ``op_seq`` (or of any op if None) for at
        most ``timeout`` seconds (None: no limit; 0: poll). Returns the
        :class:`Completion`, whatever its status (a failed one says why in
        ``reason``); raises :class:`DlcpTimeoutError` or :class:`DaemonGoneError`."""
        ptr = self._ptr("wait")
        c = _CCompletion()
        if op_seq is None:
            rc = self._lib.dlcp_wait(ptr, _timeout_ms(timeout), ctypes.byref(c))
        else:
            rc = self._lib.dlcp_wait_op(ptr, op_seq, _timeout_ms(timeout), ctypes.byref(c))
        self._check("wait", rc)
        # A failed completion leaves its reason as the handle's last error.
        return self._completion(c, "" if c.status == 0 else _last_error(self._lib, ptr))

    def wait_fds(self) -> Tuple[int, int]:
        """The descriptors a completion waiter may ``poll`` for readability
        itself, beside descriptors of its own (:meth:`wait` polls them inside
        and does not hold the handle while it sleeps either):
        ``(completion, control)``. When either is readable, call :meth:`wait`
        with ``timeout=0`` until it raises :class:`DlcpTimeoutError` (with only
        ``control`` readable, a timeout of a few ms: that is how a daemon gone
        is noticed), then poll again; no completion is missed. They belong to
        the client until :meth:`close`: never read, write or close them."""
        out = _CWaitFds()
        self._check("wait_fds", self._lib.dlcp_wait_fds(self._ptr("wait_fds"), ctypes.byref(out)))
        return out.completion, out.control

    def allreduce(
        self,
        array,
        layer: int = 0,
        layers: int = 1,
        budget: Union[float, str] = 0.01,
        timeout: Optional[float] = 60.0,
        flags: int = 0,
        op: str = "sum",
    ) -> Report:
        """Allreduces (sums, or with ``op="average"`` averages over every
        trainer of the job) a tensor in place and returns a :class:`Report`.

        ``array`` is a view from :meth:`tensor` (or the tensor's name); the result
        replaces its contents. ``layer``/``layers`` give the tensor's layer index
        (priority: front layers first); ``budget`` is the tolerated loss fraction
        (0.01 or "1%" = 1%, 0 = bit-exact; the default 0.01 is lossy);
        ``timeout`` in seconds (None: no limit).
        Raises :class:`OpFailedError` if the op completed with a non-OK status,
        :class:`DlcpTimeoutError` (the op is then still in flight), or another
        :class:`DlcpError` subclass.
        """
        t = self._tensor_of("allreduce", array)
        code = _op_code(op)
        return self._run("allreduce", t, lambda ptr, c: self._lib.dlcp_allreduce_op(
            ptr, t.tid, layer, layers, _budget_ppm(budget), flags, code, _timeout_ms(timeout), c
        ))

    def reduce_scatter(
        self,
        array,
        layer: int = 0,
        layers: int = 1,
        budget: Union[float, str] = 0.01,
        timeout: Optional[float] = 60.0,
        flags: int = 0,
        op: str = "sum",
    ) -> Report:
        """Reduce-scatters a tensor in place: this host's shard of it (the
        returned :class:`Report`'s ``shard``, a slice of the flattened tensor)
        is replaced by the reduced values, exactly as :meth:`allreduce` would
        reduce them; the rest of the tensor is left as it was. Arguments and
        errors as for :meth:`allreduce` (the default budget, 0.01, is lossy)."""
        t = self._tensor_of("reduce_scatter", array)
        code = _op_code(op)
        return self._run("reduce_scatter", t, lambda ptr, c, off, n: self._lib.dlcp_reduce_scatter(
            ptr, t.tid, layer, layers, _budget_ppm(budget), flags, code, _timeout_ms(timeout), c, off, n
        ), shard=True)

    def allgather(
        self,
        array,
        layer: int = 0,
        layers: int = 1,
        budget: Union[float, str] = 0,
        timeout: Optional[float] = 60.0,
    ) -> Report:
        """Allgathers a tensor in place: this host contributes its shard (the
        :class:`Report`'s ``shard``; with several trainers on the host, the sum
        of their tensors over it) and every trainer's tensor is replaced by all
        the hosts' shards. Exact by default; ``budget`` is the loss budget of
        its one (gather) phase. Errors as for :meth:`allreduce`."""
        t = self._tensor_of("allgather", array)
        return self._run("allgather", t, lambda ptr, c, off, n: self._lib.dlcp_allgather(
            ptr, t.tid, layer, layers, _budget_ppm(budget), _timeout_ms(timeout), c, off, n
        ), shard=True)

    def broadcast(
        self,
        array,
        root: int = 0,
        layer: int = 0,
        layers: int = 1,
        budget: Union[float, str] = 0,
        timeout: Optional[float] = 60.0,
    ) -> Report:
        """Broadcasts a tensor in place from local rank 0 of the host of daemon
        rank ``root`` (:attr:`World.node_rank`): every trainer's tensor is
        replaced by it (the other trainers' contents are not read). Exact by
        default. A ``root`` that is not a daemon rank of the job raises
        :class:`OpFailedError` naming it. Errors as for :meth:`allreduce`."""
        t = self._tensor_of("broadcast", array)
        return self._run("broadcast", t, lambda ptr, c: self._lib.dlcp_broadcast(
            ptr, t.tid, root, layer, layers, _budget_ppm(budget), _timeout_ms(timeout), c
        ))

    def barrier(self, timeout: Optional[float] = 60.0) -> Report:
        """Returns once every trainer of the job has entered this barrier (no
        tensor). Raises :class:`DlcpTimeoutError` after ``timeout`` seconds (the
        barrier is then still in flight) or :class:`OpFailedError`."""
        return self._run("barrier", None, lambda ptr, c: self._lib.dlcp_barrier(ptr, _timeout_ms(timeout), c))

    def _run(self, name: str, t: Optional[_Tensor], call, shard: bool = False) -> Report:
        """Calls ``call(ptr, completion[, shard offset, shard len])`` (a C
        submit-and-wait) and turns its outcome into a :class:`Report` or an error."""
        ptr = self._ptr(name)
        c = _CCompletion()
        off, n = ctypes.c_uint64(), ctypes.c_uint64()
        rc = call(ptr, ctypes.byref(c), ctypes.byref(off), ctypes.byref(n)) if shard else call(ptr, ctypes.byref(c))
        if rc != 0:
            done = self._completion(c, _last_error(self._lib, ptr)) if rc == -13 else None
            _raise(self._lib, ptr, name, rc, done)
        return Report(
            op_seq=c.op_seq,
            tensor=t.name if t else "",
            delivered_ppm=c.delivered_ppm,
            repairs=c.repairs,
            duration=c.duration_ns / 1e9,
            shard_offset=off.value,
            shard_len=n.value,
        )


def _env_int(name: str, default: int, base: int = 10) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw.strip(), base)
    except ValueError:
        raise InvalidArgumentError("attach", -3, f"${name} is {raw!r}, not an integer") from None


def attach(
    socket: Union[str, os.PathLike, None] = None,
    job: Optional[int] = None,
    local_rank: Optional[int] = None,
    local_world: Optional[int] = None,
) -> Client:
    """Attaches to the local daemon as ``local_rank`` of ``local_world`` trainers
    of job ``job`` on this host.

    Each argument left out comes from the environment, as the PyTorch hook's do:
    ``socket`` from ``$DLCP_SOCKET`` (else :data:`DEFAULT_SOCKET`), ``job`` from
    ``$DLCP_JOB`` (decimal or ``0x`` hex; else 0), ``local_rank`` from
    ``$LOCAL_RANK`` (else 0), ``local_world`` from ``$LOCAL_WORLD_SIZE`` (else 1;
    torchrun sets both). ``job`` must be the daemon's ``node.job_id``.

    Raises :class:`ConnectError` if no daemon answers, :class:`RejectedError` if
    it refuses, with its reason (another job — naming both job ids —, the rank
    taken, another local world size, too many attachments),
    :class:`InvalidArgumentError` for a rank not below the local world size."""
    lib = load_library()
    path = os.fspath(socket) if socket is not None else os.environ.get("DLCP_SOCKET") or DEFAULT_SOCKET
    job = _env_int("DLCP_JOB", 0, 0) if job is None else job
    local_rank = _env_int("LOCAL_RANK", 0) if local_rank is None else local_rank
    local_world = _env_int("LOCAL_WORLD_SIZE", 1) if local_world is None else local_world
    out = ctypes.c_void_p()
    rc = lib.dlcp_attach(os.fsencode(path), job, local_rank, local_world, ctypes.byref(out))
    if rc != 0:
        _raise(lib, None, "attach", rc)
    return Client(lib, out.value, path, job, local_rank, local_world)


def version() -> str:
    """Version of the loaded ``libdlcp_client``."""
    return load_library().dlcp_version().decode()
