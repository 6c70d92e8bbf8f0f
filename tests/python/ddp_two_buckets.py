#!/usr/bin/python3
"""One DDP rank for the overlap and priority tests of tests/client_python_ddp.rs.

The model is two equal linear layers (``dim`` x ``dim``, no bias) and DDP's
bucket cap is one layer, so every backward has two buckets of equal size:
bucket 0 holds the back layer (layer position 1, ready first, submitted
first) and bucket 1 the front layer (layer position 0, submitted second).
The gradients go through the asynchronous ``dlcp.torch`` hook at budget 0 for
``--steps`` steps. Writes JSON to ``--out``: the hook's reports, and per hook
call the step, the bucket, how many of the state's ops were in flight when it
was called and whether its future was already done when it returned.

Needs Debian's python3-torch and libdlcp_client.so ($DLCP_LIB).
"""

import argparse
import dataclasses
import json
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import dlcp.torch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--master-port", type=int, required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--job", type=int, required=True)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--op-timeout", type=float, default=30.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.master_port}",
        rank=args.rank,
        world_size=args.world_size,
        timeout=timedelta(seconds=120),
    )
    torch.manual_seed(0)
    d = args.dim
    net = torch.nn.Sequential(torch.nn.Linear(d, d, bias=False), torch.nn.Tanh(), torch.nn.Linear(d, d, bias=False))
    layer_bytes = d * d * 4
    # One layer per bucket, the first bucket (DDP's bucket 0: the back layer) too.
    dist._DEFAULT_FIRST_BUCKET_BYTES = layer_bytes
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=layer_bytes / 2**20)
    state = dlcp.torch.DlcpState(ddp, socket=args.socket, job=args.job, budget=0, timeout=args.op_timeout)
    calls = []

    def hook(st: dlcp.torch.DlcpState, bucket: dist.GradBucket):
        step, in_flight = st.step, len(st._waiter.pending)
        fut = dlcp.torch.allreduce_hook(st, bucket)
        calls.append({"step": step, "bucket": bucket.index(), "in_flight": in_flight, "done": fut.done()})
        return fut

    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1 + args.rank)
    for step in range(args.steps):
        x = torch.randn(32, d, generator=g)
        opt.zero_grad(set_to_none=True)
        loss = ddp(x).pow(2).mean()
        loss.backward()
        opt.step()
        print(f"step {step} loss {float(loss):.6f}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"reports": [dataclasses.asdict(r) for r in state.reports], "calls": calls}, f)
    state.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
