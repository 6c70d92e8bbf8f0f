#!/usr/bin/python3
"""Data-parallel training of an MLP on scikit-learn's digits with PyTorch DDP.

Gradients are averaged by dlcpd (``--backend dlcp``, the default: DDP with the
``dlcp.torch`` communication hook) or by Gloo's own allreduce (``--backend
gloo``, for comparison). Either way PyTorch's Gloo process group does the
rendezvous (TCP store at MASTER_ADDR:MASTER_PORT) and DDP's initial broadcast;
with dlcp, only the gradients take dlcp's path.

One process per rank, e.g. 4 ranks, one per testbed host (scripts/testbed.sh):

    ip netns exec dlcptb-h$R /usr/bin/python3 examples/ddp_train.py --rank $R --world-size 4 \\
        --master-addr 10.77.0.1 --ifname eth0 --socket /tmp/d$R.sock --job 7 --budget 0.01

Per epoch it prints ``epoch E loss L acc A`` (rank-local mean training loss,
test accuracy of this replica), then ``final acc A params sha256 H`` (H must be
the same on every rank: the replicas are identical). ``--out FILE`` writes the
same as JSON, with every per-bucket dlcp report.

Needs Debian's python3-torch (1.13 tested), python3-sklearn, python3-numpy and,
for dlcp, libdlcp_client.so (`cargo build --release -p dlcp-client`; found via
$DLCP_LIB or target/{release,debug}) and a running dlcpd whose node.job_id is
--job.
"""

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402


def model(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )


def main() -> int:
    env = os.environ
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["dlcp", "gloo"], default="dlcp", help="who averages the gradients")
    ap.add_argument("--rank", type=int, default=int(env.get("RANK", "0")))
    ap.add_argument("--world-size", type=int, default=int(env.get("WORLD_SIZE", "1")))
    ap.add_argument("--master-addr", default=env.get("MASTER_ADDR", "127.0.0.1"))
    ap.add_argument("--master-port", type=int, default=int(env.get("MASTER_PORT", "29510")))
    ap.add_argument("--ifname", default=env.get("GLOO_SOCKET_IFNAME"), help="Gloo's interface (GLOO_SOCKET_IFNAME)")
    ap.add_argument("--socket", default=env.get("DLCP_SOCKET"), help="dlcpd control socket")
    ap.add_argument("--job", type=lambda s: int(s, 0), default=int(env.get("DLCP_JOB", "0"), 0))
    ap.add_argument("--local-rank", type=int, default=int(env.get("LOCAL_RANK", "0")))
    ap.add_argument("--local-world", type=int, default=int(env.get("LOCAL_WORLD_SIZE", "1")))
    ap.add_argument("--budget", type=float, default=0.01, help="dlcp loss budget, fraction (0 = exact)")
    ap.add_argument("--op-timeout", type=float, default=30.0, help="seconds to wait for one dlcp op")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--bucket-kb", type=int, default=1024, help="DDP bucket cap (also the first bucket's)")
    ap.add_argument("--seed", type=int, default=0, help="data split, initial weights, shuffling")
    ap.add_argument("--out", help="write results (curves, accuracy, reports) as JSON here")
    args = ap.parse_args()

    torch.set_num_threads(1)
    if args.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master_addr}:{args.master_port}",
        rank=args.rank,
        world_size=args.world_size,
        timeout=timedelta(seconds=120),
    )
    world, rank = args.world_size, args.rank

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=args.seed, stratify=y)
    x_tr, y_tr, x_te, y_te = map(torch.from_numpy, (x_tr, y_tr, x_te, y_te))
    steps_per_epoch = len(x_tr) // (world * args.batch)  # every rank takes the same number of steps

    torch.manual_seed(args.seed)
    net = model(args.hidden)
    # Several buckets: DDP's first bucket (the last layers) and the others capped alike.
    dist._DEFAULT_FIRST_BUCKET_BYTES = args.bucket_kb * 1024
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=args.bucket_kb / 1024)
    state = None
    if args.backend == "dlcp":
        import dlcp.torch

        state = dlcp.torch.DlcpState(
            ddp,
            socket=args.socket,
            job=args.job,
            local_rank=args.local_rank,
            local_world=args.local_world,
            budget=args.budget,
            timeout=args.op_timeout,
        )
        ddp.register_comm_hook(state, dlcp.torch.allreduce_hook)  # the one line
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    # Cosine decay to 0: the last epochs settle, so the final accuracy is a stable figure.
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs * steps_per_epoch)
    lossf = torch.nn.CrossEntropyLoss()

    def accuracy() -> float:
        with torch.no_grad():
            return float((net(x_te).argmax(1) == y_te).float().mean())

    curve = []
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(args.seed * 1000 + epoch)  # same order on every rank
        order = torch.randperm(len(x_tr), generator=g)
        total = 0.0
        for s in range(steps_per_epoch):
            base = s * world * args.batch
            idx = order[base + rank * args.batch : base + (rank + 1) * args.batch]
            opt.zero_grad(set_to_none=True)
            loss = lossf(ddp(x_tr[idx]), y_tr[idx])
            loss.backward()  # DDP averages the gradients here (dlcp hook or Gloo)
            opt.step()
            sched.step()
            total += float(loss)
        acc = accuracy()
        curve.append({"epoch": epoch, "loss": total / steps_per_epoch, "acc": acc})
        extra = ""
        if state is not None:
            reps = state.step_reports(state.step - 1)
            extra = f"  dlcp min delivered {min(r.delivered for r in reps):.4f} ops/step {len(reps)}"
        print(f"epoch {epoch} loss {total / steps_per_epoch:.5f} acc {acc:.4f}{extra}", flush=True)
    elapsed = time.perf_counter() - t0
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in net.parameters())).hexdigest()
    acc = accuracy()
    print(f"final acc {acc:.4f} params sha256 {digest}", flush=True)
    if args.out:
        res = {
            "backend": args.backend,
            "rank": rank,
            "world": world,
            "budget": args.budget if args.backend == "dlcp" else None,
            "seed": args.seed,
            "epochs": args.epochs,
            "steps_per_epoch": steps_per_epoch,
            "steps": steps_per_epoch * args.epochs,
            "final_acc": acc,
            "params_sha256": digest,
            "train_seconds": elapsed,
            "curve": curve,
            "reports": [dataclasses.asdict(r) for r in state.reports] if state is not None else [],
        }
        with open(args.out, "w") as f:
            json.dump(res, f)
    if state is not None:
        state.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
