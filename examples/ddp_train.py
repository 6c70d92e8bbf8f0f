#!/usr/bin/python3
"""Data-parallel training with PyTorch DDP: MNIST-1D (default) or scikit-learn's digits.

Gradients are averaged by dlcpd (``--backend dlcp``, the default: DDP with the
asynchronous ``dlcp.torch`` communication hook) or by Gloo's own allreduce
(``--backend gloo``, for comparison). Either way PyTorch's Gloo process group
does the rendezvous (TCP store at MASTER_ADDR:MASTER_PORT) and DDP's initial
broadcast; with dlcp, only the gradients take dlcp's path.

Tasks (``--task``):

- ``mnist1d`` (default): MNIST-1D generated offline (examples/mnist1d_task.py:
  16,000 training / 4,000 test samples from ``--data-seed``, cached in
  ``--data-dir``) and a 4.4 M-parameter 1D CNN + wide MLP, so each step moves
  17.4 MB of gradients. Trains ``--steps`` steps and measures test accuracy on
  rank 0 every ``--eval-every`` steps against a training clock that stops while
  it does (so evaluation costs no transport time). Every step is timed: compute
  (forward, backward until the last bucket was handed to the transport, the
  hooks' copies and submits included, optimizer) and exposed communication (from
  then until backward returned: DDP waiting for the buckets' futures; with
  ``--no-overlap``, which makes each hook call wait for its bucket's allreduce
  as a synchronous hook would, those waits too). For that
  the Gloo run goes through PyTorch's Python ``default_hooks.allreduce_hook``
  (the same allreduce DDP does built in) wrapped like dlcp's hook by a timer.
  ``--time-cap`` stops training once the clock passes it, and ``--stop-at-acc``
  at the first evaluation at or above that accuracy (both decided by rank 0 at
  an evaluation, so every rank stops at the same step).
- ``digits``: the MLP 64-512-512-512-10 on scikit-learn's digits for
  ``--epochs`` epochs, accuracy per epoch; Gloo with DDP's built-in allreduce
  (the end-to-end tests and bench/train_quality.py use it).

One process per rank, e.g. 4 ranks, one per testbed host (scripts/testbed.sh):

    ip netns exec dlcptb-h$R /usr/bin/python3 examples/ddp_train.py --rank $R --world-size 4 \\
        --master-addr 10.77.0.1 --ifname eth0 --socket /tmp/d$R.sock --job 7 --budget 0.01

``--dtype bf16`` trains in bfloat16 (parameters, activations and so DDP's
gradient buckets; the dlcp hook reduces them as bf16: float32 accumulation
at each owner, one rounding) to compare with the float32 run. (float16 is
not offered: torch 1.13 has no float16 matrix multiply on the CPU.)

It prints ``epoch E ...`` (digits) or ``step S time T loss L acc A ...``
(mnist1d) at every evaluation (rank-local mean training loss since the last
one, test accuracy of this replica), then ``final acc A params sha256 H`` (H
must be the same on every rank: the replicas are identical). ``--out FILE``
writes the same as JSON, with every per-bucket dlcp report and the per-step
times.

Needs Debian's python3-torch (1.13 tested), python3-numpy, for ``mnist1d``
the mnist1d package 0.0.2.post1 (scripts/test.sh installs it), for ``digits``
python3-sklearn, and for dlcp libdlcp_client.so (`cargo build --release -p
dlcp-client`; found via $DLCP_LIB or target/{release,debug}) and a running
dlcpd whose node.job_id is --job.
"""

import argparse
import ctypes
import dataclasses
import hashlib
import json
import os
import sys
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "client", "python"))
sys.path.insert(0, HERE)

# One BLAS thread per rank, as torch.set_num_threads(1) in main() asks of torch's own pool.
# Debian's OpenBLAS (the pthread build, which numpy and torch load) starts a worker per core
# whatever torch is told, and between matrix products its threads spin in sched_yield: with
# several ranks on one machine (the testbed's four on two cores) that spinning takes the CPU
# the transport needs (dlcpd, or the kernel's TCP for Gloo). Set before numpy or torch loads
# the library; a value from the environment wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def machine() -> dict:
    """What this rank computed on: the CPU model the machine shows and the kernel set OpenBLAS
    chose for it (torch's matrix products; another kernel set rounds differently, so curves of
    one seed compare bit for bit only on one). None where not found."""
    cpu = blas = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), None)
        with open("/proc/self/maps") as f:
            libs = sorted({l.split()[-1] for l in f if "blas" in l.rsplit("/", 1)[-1]})
    except OSError:
        libs = []
    for lib in libs:
        try:
            get = ctypes.CDLL(lib).openblas_get_corename
        except (OSError, AttributeError):
            continue
        get.restype = ctypes.c_char_p
        blas = get().decode(errors="replace")
        break
    return {"cpu_model": cpu, "openblas_core": blas}


def digits_model(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )


def load_task(args):
    """(x_train, y_train, x_test, y_test, model) of --task; the model seeded with --seed."""
    if args.task == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        x = (digits.data / 16.0).astype(np.float32)
        y = digits.target.astype(np.int64)
        x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=args.seed, stratify=y)
        data = tuple(map(torch.from_numpy, (x_tr, y_tr, x_te, y_te)))
        torch.manual_seed(args.seed)
        return (*data, digits_model(args.hidden or 512))
    import mnist1d_task

    data = mnist1d_task.load(args.data_dir, args.data_seed, args.train_samples, args.test_samples)
    torch.manual_seed(args.seed)
    return (*data, mnist1d_task.model(args.hidden or 1536))


class StepClock:
    """When the last bucket of a step was handed to the transport (the hook
    returned), and, with ``overlap=False``, how long the hooks waited.

    ``overlap=False`` makes every hook call wait for its bucket's future before
    it returns, as a synchronous hook does: backward stalls for each bucket's
    allreduce, one bucket is in flight at a time, and nothing overlaps. That
    wait is communication, so it counts as exposed (``waited``), not compute.
    It exists to measure what overlap buys (``--no-overlap``)."""

    def __init__(self, overlap: bool = True):
        self.handed = 0.0
        self.waited = 0.0
        self.overlap = overlap

    def wrap(self, hook):
        def timed(state, bucket):
            fut = hook(state, bucket)
            if not self.overlap:
                t = time.perf_counter()
                fut.wait()  # raises the hook's error (a DlcpHookError) here, inside backward
                self.waited += time.perf_counter() - t
            self.handed = time.perf_counter()
            return fut

        return timed


def sync_bf16_through_f32():
    """Gloo in torch 1.13 cannot broadcast bfloat16, which DDP's constructor does
    to start every replica from rank 0's parameters: broadcast float32 copies
    instead (exact: bf16 widens to f32 without loss) and copy them back."""
    import torch.nn.parallel.distributed as ddp_module

    def sync(module, process_group, broadcast_bucket_size, src, params_and_buffers_to_ignore):
        states = list(module.named_parameters()) + list(module.named_buffers())
        for name, t in states:
            if name not in params_and_buffers_to_ignore:
                wide = t.detach().float()
                dist.broadcast(wide, src, group=process_group)
                t.detach().copy_(wide)

    ddp_module._sync_module_states = sync


def parse_args():
    env = os.environ
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--backend", choices=["dlcp", "gloo"], default="dlcp", help="who averages the gradients")
    ap.add_argument("--task", choices=["mnist1d", "digits"], default="mnist1d")
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
    ap.add_argument("--no-overlap", action="store_true",
                    help="every hook call waits for its bucket's allreduce before it returns (a "
                         "synchronous hook: no overlap with backward, one bucket in flight), to measure what "
                         "overlap buys; the waits count as exposed communication (dlcp, or Gloo on mnist1d)")
    ap.add_argument("--epochs", type=int, default=12, help="digits: epochs")
    ap.add_argument("--steps", type=int, default=600, help="mnist1d: training steps")
    ap.add_argument("--eval-every", type=int, default=25, help="mnist1d: steps between test evaluations")
    ap.add_argument("--time-cap", type=float, default=0.0, help="mnist1d: stop once the training clock passes this (s)")
    ap.add_argument("--stop-at-acc", type=float, default=0.0,
                    help="mnist1d: stop at the first evaluation at or above this test accuracy (fraction; 0 = never)")
    ap.add_argument("--data-dir", help="mnist1d: cache directory of the generated dataset (default: a new temp dir)")
    ap.add_argument("--data-seed", type=int, default=42, help="mnist1d: the dataset's seed")
    ap.add_argument("--train-samples", type=int, default=16000, help="mnist1d")
    ap.add_argument("--test-samples", type=int, default=4000, help="mnist1d")
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--hidden", type=int, default=None, help="width (digits 512, mnist1d 1536)")
    ap.add_argument("--bucket-kb", type=int, default=None, help="DDP bucket cap, also the first bucket's (digits 1024, mnist1d 4096)")
    ap.add_argument("--seed", type=int, default=0, help="initial weights, shuffling (digits: also the split)")
    ap.add_argument("--out", help="write results (curves, accuracy, reports, step times) as JSON here")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32", help="parameters and gradient buckets")
    args = ap.parse_args()
    if args.no_overlap and args.backend == "gloo" and args.task == "digits":
        ap.error("--no-overlap needs a communication hook: Gloo on digits uses DDP's built-in allreduce")
    if args.bucket_kb is None:
        args.bucket_kb = 1024 if args.task == "digits" else 4096
    return args


def main() -> int:
    args = parse_args()
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
    digits = args.task == "digits"

    x_tr, y_tr, x_te, y_te, net = load_task(args)
    if args.dtype == "bf16":
        # bfloat16 parameters: DDP's gradient buckets are bfloat16, and so is what dlcp reduces.
        net, x_tr, x_te = net.to(torch.bfloat16), x_tr.to(torch.bfloat16), x_te.to(torch.bfloat16)
    steps_per_epoch = len(x_tr) // (world * args.batch)  # every rank takes the same number of steps
    steps = args.epochs * steps_per_epoch if digits else args.steps

    if args.dtype == "bf16":
        sync_bf16_through_f32()
    # Several buckets: DDP's first bucket (the last layers) and the others capped alike.
    dist._DEFAULT_FIRST_BUCKET_BYTES = args.bucket_kb * 1024
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=args.bucket_kb / 1024)
    clock = StepClock(overlap=not args.no_overlap)
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
        ddp.register_comm_hook(state, clock.wrap(dlcp.torch.allreduce_hook))  # the one line (timer aside)
    elif not digits:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, clock.wrap(default_hooks.allreduce_hook))
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    # Cosine decay to 0: the last steps settle, so the final accuracy is a stable figure.
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    lossf = torch.nn.CrossEntropyLoss()

    def accuracy() -> float:
        with torch.no_grad():
            return float((net(x_te).argmax(1) == y_te).float().mean())

    curve, step_times = [], []  # step_times: [compute s, exposed communication s] per step
    train_clock, total, since, stopped, at_target = 0.0, 0.0, 0, False, False
    t0 = time.perf_counter()
    order = None
    for step in range(steps):
        epoch, s = divmod(step, steps_per_epoch)
        if s == 0:
            g = torch.Generator().manual_seed(args.seed * 1000 + epoch)  # same order on every rank
            order = torch.randperm(len(x_tr), generator=g)
        base = s * world * args.batch
        idx = order[base + rank * args.batch : base + (rank + 1) * args.batch]
        ts = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = lossf(ddp(x_tr[idx]), y_tr[idx])
        clock.handed, clock.waited = 0.0, 0.0
        loss.backward()  # DDP averages the gradients here (dlcp hook or Gloo)
        tb = time.perf_counter()
        opt.step()
        sched.step()
        te = time.perf_counter()
        exposed = clock.waited + tb - clock.handed if clock.handed else None
        step_times.append([te - ts - (exposed or 0.0), exposed])
        train_clock += te - ts
        total += float(loss)
        since += 1
        if digits and s == steps_per_epoch - 1:
            acc = accuracy()
            curve.append({"epoch": epoch, "step": step + 1, "time": train_clock, "loss": total / since, "acc": acc})
            extra = ""
            if state is not None:
                reps = state.step_reports(state.step - 1)
                extra = f"  dlcp min delivered {min(r.delivered for r in reps):.4f} ops/step {len(reps)}"
            print(f"epoch {epoch} loss {total / since:.5f} acc {acc:.4f}{extra}", flush=True)
            total, since = 0.0, 0
        elif not digits and ((step + 1) % args.eval_every == 0 or step + 1 == steps):
            # Rank 0 measures its replica; the clock is stopped meanwhile on every rank, and the
            # broadcast (Gloo's process group) carries rank 0's stop decision so all stop together.
            flag = torch.zeros(3)
            if rank == 0:
                flag[0] = accuracy()
                flag[1] = float(args.time_cap > 0 and train_clock >= args.time_cap)
                flag[2] = float(args.stop_at_acc > 0 and flag[0] >= args.stop_at_acc)
            dist.broadcast(flag, 0)
            acc = float(flag[0])
            curve.append({"epoch": epoch, "step": step + 1, "time": train_clock, "loss": total / since, "acc": acc})
            recent = step_times[-since:]
            comm = [e for _, e in recent if e is not None]
            print(
                f"step {step + 1} time {train_clock:.2f} loss {total / since:.5f} acc {acc:.4f} "
                f"compute {1e3 * sum(c for c, _ in recent) / len(recent):.1f} ms "
                f"exposed {1e3 * sum(comm) / max(1, len(comm)):.1f} ms",
                flush=True,
            )
            total, since = 0.0, 0
            if flag[1]:  # first: an evaluation past the cap reaches nothing in time
                stopped = True
                print(f"time cap {args.time_cap:g} s reached at step {step + 1}", flush=True)
                break
            if flag[2]:
                at_target = True
                print(f"accuracy {acc:.4f} reached --stop-at-acc {args.stop_at_acc:g} at step {step + 1}", flush=True)
                break
    elapsed = time.perf_counter() - t0
    # numpy has no bfloat16: hash a bf16 parameter's bits (as int16).
    raw = [(p.detach().view(torch.int16) if p.dtype == torch.bfloat16 else p.detach()) for p in net.parameters()]
    digest = hashlib.sha256(b"".join(r.numpy().tobytes() for r in raw)).hexdigest()
    acc = accuracy()
    print(f"final acc {acc:.4f} params sha256 {digest}", flush=True)
    if args.out:
        res = {
            "backend": args.backend,
            "task": args.task,
            "dtype": args.dtype,
            "rank": rank,
            "world": world,
            "budget": args.budget if args.backend == "dlcp" else None,
            "seed": args.seed,
            "epochs": args.epochs if digits else None,
            "steps_per_epoch": steps_per_epoch,
            "steps": len(step_times),
            "planned_steps": steps,
            "overlap": not args.no_overlap,
            "time_capped": stopped,
            "stopped_at_acc": at_target,
            "parameters": sum(p.numel() for p in net.parameters()),
            "train_samples": len(x_tr),
            "test_samples": len(x_te),
            "final_acc": acc,
            "params_sha256": digest,
            "machine": machine(),
            "train_seconds": elapsed,
            "train_clock": train_clock,
            "curve": curve,
            "step_times": step_times,
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
