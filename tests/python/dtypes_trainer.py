#!/usr/bin/python3
"""One trainer of tests/client_python_dtypes.rs: allreduces float32, float16
and bfloat16 tensors (numpy views of the daemon's arena; bfloat16 as the
np.uint16 bits, numpy having no bfloat16) by sum and by average, and checks
every result bit for bit against a numpy reference computed the same way as
the contract says, independently of dlcp's code:

- every trainer's values are of the type (generated, then rounded to it);
- a host's contribution is its trainers' values summed in float32 in
  local-rank order, rounded once to the type;
- the result is the hosts' contributions summed in float32 in rank order,
  divided by the number of trainers for an average, rounded once to the type.

Every trainer can compute every other's input (seeded), so each checks on
its own, and prints one line per op with a digest of the result bytes (the
Rust test checks the trainers agree). Exit status 0 iff every op matched.
"""

import argparse
import hashlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))

import numpy as np  # noqa: E402

import dlcp  # noqa: E402

SIZES = (50_001, 5)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), as float32; written out
    here, not taken from dlcp. No NaN or infinity occurs in this test."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    lower = u & 0xFFFF
    upper = u >> 16
    up = (lower > 0x8000) | ((lower == 0x8000) & ((upper & 1) == 1))
    return ((upper + up.astype(np.uint64)) << 16).astype(np.uint32).view(np.float32)


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """x (float32) rounded once to dtype, as float32."""
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return bf16_round(x)
    return x.astype(np.float32)


def trainer_values(host: int, local: int, op: int, n: int, dtype: str) -> np.ndarray:
    """Trainer (host, local)'s gradient of op `op`, values of `dtype`, as float32."""
    rng = np.random.default_rng([host, local, op, 18])
    x = (rng.standard_normal(n) * (1 + op)).astype(np.float32)
    return rounded(x, dtype)


def reference(op: int, n: int, dtype: str, reduce: str, hosts: int, locals_: int) -> np.ndarray:
    total = None
    for h in range(hosts):
        local = trainer_values(h, 0, op, n, dtype)
        for k in range(1, locals_):
            local = local + trainer_values(h, k, op, n, dtype)  # float32 + float32
        contribution = rounded(local, dtype)
        total = contribution if total is None else total + contribution
    if reduce == "average":
        total = total / np.float32(hosts * locals_)
    return rounded(total.astype(np.float32), dtype)


def as_float32(view: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (view.astype(np.uint32) << 16).view(np.float32)
    return view.astype(np.float32)


def to_view(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values of the type as what the tensor view holds."""
    if dtype == "bfloat16":
        return (values.view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(np.float16 if dtype == "float16" else np.float32)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--job", type=int, required=True)
    ap.add_argument("--host", type=int, required=True)
    ap.add_argument("--hosts", type=int, required=True)
    ap.add_argument("--local-rank", type=int, required=True)
    ap.add_argument("--local-world", type=int, required=True)
    a = ap.parse_args()
    ok = True
    with dlcp.attach(a.socket, a.job, a.local_rank, a.local_world) as c:
        op = 0
        for dtype in ("float32", "float16", "bfloat16"):
            for reduce in ("sum", "average"):
                for n in SIZES:
                    g = c.tensor(f"g{op}", n, dtype=dtype)
                    g[:] = to_view(trainer_values(a.host, a.local_rank, op, n, dtype), dtype)
                    c.allreduce(g, budget=0, op=reduce, timeout=30)
                    got = as_float32(g, dtype)
                    want = reference(op, n, dtype, reduce, a.hosts, a.local_world)
                    same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
                    ok &= same
                    diff = int(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32)))
                    digest = hashlib.sha256(g.tobytes()).hexdigest()[:16]
                    print(f"op {op} {dtype} {reduce} n {n}: {'exact' if same else f'{diff} differ'} {digest}")
                    op += 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
