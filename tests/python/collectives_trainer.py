#!/usr/bin/python3
"""One trainer of tests/client_python_collectives.rs: runs reduce-scatter (sum
and average), allgather and broadcast from root 2 on float32, float16 and
bfloat16 tensors (numpy views of the daemon's arena; bfloat16 as np.uint16
bits), then a barrier, and checks every result bit for bit against a numpy
reference computed as the contract says, independently of dlcp's code (the
rounding helpers are dtypes_trainer.py's):

- every trainer's values are of the type; a host's input is its trainers'
  values summed in float32 in local-rank order, rounded once to the type;
- host h's shard is elements h*n//hosts .. (h+1)*n//hosts;
- reduce-scatter: the host's shard holds the allreduce's values (the hosts'
  inputs summed in float32 in rank order, divided by the trainers for an
  average, rounded once), the rest of the tensor the trainer's own values;
- allgather: shard s holds host s's input;
- broadcast: every trainer holds local rank 0 of host 2's values.

Prints one line per op with a digest of the result bytes (a reduce-scatter's:
of the host's shard; the Rust test checks who must agree does). Exit status 0 iff every op matched.
"""

import argparse
import hashlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import dlcp  # noqa: E402
from dtypes_trainer import as_float32, rounded, to_view  # noqa: E402

SIZES = (50_001, 5)
ROOT = 2


def trainer_values(host: int, local: int, op: int, n: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng([host, local, op, 1818])
    return rounded((rng.standard_normal(n) * (1 + op)).astype(np.float32), dtype)


def host_input(host: int, op: int, n: int, dtype: str, locals_: int) -> np.ndarray:
    local = trainer_values(host, 0, op, n, dtype)
    for k in range(1, locals_):
        local = local + trainer_values(host, k, op, n, dtype)  # float32 + float32
    return rounded(local, dtype)


def shard(n: int, hosts: int, h: int) -> slice:
    return slice(h * n // hosts, (h + 1) * n // hosts)


def reference(kind: str, op: int, n: int, dtype: str, a) -> np.ndarray:
    if kind == "broadcast":
        return trainer_values(ROOT, 0, op, n, dtype)
    if kind == "allgather":
        out = np.zeros(n, dtype=np.float32)
        for h in range(a.hosts):
            out[shard(n, a.hosts, h)] = host_input(h, op, n, dtype, a.local_world)[shard(n, a.hosts, h)]
        return out
    total = None
    for h in range(a.hosts):
        contribution = host_input(h, op, n, dtype, a.local_world)
        total = contribution if total is None else total + contribution
    if kind == "reduce-scatter average":
        total = total / np.float32(a.hosts * a.local_world)
    reduced = rounded(total.astype(np.float32), dtype)
    out = trainer_values(a.host, a.local_rank, op, n, dtype)
    mine = shard(n, a.hosts, a.host)
    out[mine] = reduced[mine]
    return out


def run(c, g, kind: str) -> "dlcp.Report":
    if kind == "broadcast":
        return c.broadcast(g, root=ROOT, timeout=30)
    if kind == "allgather":
        return c.allgather(g, timeout=30)
    return c.reduce_scatter(g, budget=0, op=kind.split()[1], timeout=30)


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
            for kind in ("reduce-scatter sum", "reduce-scatter average", "allgather", "broadcast"):
                for n in SIZES:
                    g = c.tensor(f"g{op}", n, dtype=dtype)
                    g[:] = to_view(trainer_values(a.host, a.local_rank, op, n, dtype), dtype)
                    r = run(c, g, kind)
                    got = as_float32(g, dtype)
                    want = reference(kind, op, n, dtype, a)
                    same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
                    mine = shard(n, a.hosts, a.host) if kind != "broadcast" else slice(0, 0)
                    told = r.shard == mine
                    ok &= same and told
                    diff = int(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32)))
                    # A reduce-scatter's digest is its shard's (the rest is the trainer's own).
                    held = g.reshape(-1)[mine] if kind.startswith("reduce-scatter") else g
                    digest = hashlib.sha256(held.tobytes()).hexdigest()[:16]
                    verdict = "exact" if same else f"{diff} differ"
                    shard_note = "" if told else f" shard {r.shard} not {mine}"
                    print(f"op {op} {dtype} {kind} n {n}: {verdict}{shard_note} {digest}")
                    op += 1
        r = c.barrier(timeout=30)
        print(f"barrier op {r.op_seq}: ok")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
