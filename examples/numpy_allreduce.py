#!/usr/bin/python3
"""A tiny numpy "training" loop that averages its gradients through dlcpd.

Each trainer fits the same two-layer linear model y = x @ W1 @ W2 to its own
shard of synthetic data. Per step it computes the gradients *directly into* the
dlcp tensors (numpy views of the daemon's shared memory, ``out=``), allreduces
them in backward order (last layer first, as DDP does), divides by the world
size and takes an SGD step. Nothing is copied to or from the daemon.

Run one per trainer, with the daemon up (see README / `dlcpd --config`):

    /usr/bin/python3 examples/numpy_allreduce.py \\
        --socket /run/dlcp/dlcpd.sock --job 7 --local-rank 0 --local-world 2

The world size and this trainer's global rank come from the daemon
(``c.world_size``, ``c.rank``) unless --world-size / --rank say otherwise.

Needs numpy and the dlcp package: installed (`pip install ./client/python`, or
the .deb), or, run from a source checkout, client/python with libdlcp_client.so
from `cargo build --release -p dlcp-client`.
"""

import argparse
import hashlib
import os
import sys

import numpy as np

# In a source checkout, the package next door (a copy of this script elsewhere uses the installed one).
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python")
if os.path.isdir(os.path.join(_SOURCE, "dlcp")):
    sys.path.insert(0, _SOURCE)
import dlcp  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=os.environ.get("DLCP_SOCKET", dlcp.DEFAULT_SOCKET))
    ap.add_argument("--job", type=lambda s: int(s, 0), default=7)
    ap.add_argument("--local-rank", type=int, default=0)
    ap.add_argument("--local-world", type=int, default=1)
    ap.add_argument(
        "--world-size", type=int, default=None, help="trainers in the whole job (default: as the daemon says)"
    )
    ap.add_argument(
        "--rank", type=int, default=None, help="global rank, seeds this trainer's data shard (default: the daemon's)"
    )
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument(
        "--budget", type=dlcp.parse_budget, default=0.01, help='tolerated gradient loss: 0.01 or "1%%" (0 = exact)'
    )
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    d_in, d_hidden, d_out, batch = 32, 16, 4, 256
    truth = np.random.default_rng(0).standard_normal((d_in, d_out)).astype(np.float32) / 4
    init = np.random.default_rng(2)  # same initial weights on every rank
    w1 = (init.standard_normal((d_in, d_hidden)) / np.sqrt(d_in)).astype(np.float32)
    w2 = (init.standard_normal((d_hidden, d_out)) / np.sqrt(d_hidden)).astype(np.float32)

    print(f"dlcp {dlcp.version()} from {os.path.dirname(dlcp.__file__)}", flush=True)
    with dlcp.attach(args.socket, args.job, args.local_rank, args.local_world) as c:
        world_size = c.world_size if args.world_size is None else args.world_size
        rank = c.rank if args.rank is None else args.rank
        print(f"rank {rank} of {world_size}", flush=True)
        rng = np.random.default_rng(1 + rank)  # each rank: its own data shard
        # Same allocation order on every rank: tensor ids match across ranks.
        g1 = c.tensor("w1.grad", w1.shape)
        g2 = c.tensor("w2.grad", w2.shape)
        for step in range(args.steps):
            x = rng.standard_normal((batch, d_in)).astype(np.float32)
            y = x @ truth
            h = x @ w1
            err = h @ w2 - y
            loss = float(np.mean(err**2))
            d_pred = (2.0 / err.size) * err
            # Backward pass, gradients written straight into shared memory.
            np.matmul(h.T, d_pred, out=g2)
            r2 = c.allreduce(g2, layer=1, layers=2, budget=args.budget)
            np.matmul(x.T, d_pred @ w2.T, out=g1)
            r1 = c.allreduce(g1, layer=0, layers=2, budget=args.budget)
            # g1/g2 now hold the sum over all trainers: average and step.
            w2 -= args.lr * (g2 / world_size)
            w1 -= args.lr * (g1 / world_size)
            print(
                f"step {step:3d} loss {loss:.5f}  delivered {min(r1.delivered, r2.delivered):.4f}"
                f"  allreduce {1e3 * (r1.duration + r2.duration):.2f} ms",
                flush=True,
            )
    # With budget 0 every trainer ends with bit-identical weights: compare this line across trainers.
    print(f"final weights sha256 {hashlib.sha256(w1.tobytes() + w2.tobytes()).hexdigest()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
