#!/usr/bin/python3
"""One rank of the peer allreduce benchmark: Gloo (torch.distributed) or Open MPI
(mpi4py MPI_Allreduce), the same measurement as `dlcp-bench trainer`.

Inputs are made, then a barrier, then the CPU window opens (see mark()). Each rep
rewrites the input (outside the timing), then times one allreduce (sizes)
or, for a bucketed model, all buckets issued back to front asynchronously, as DDP
does, recording when the front bucket and when all buckets are complete. Prints
one JSON line: per-rep times in seconds, the CPU seconds of the timed loop, and the
CPU window (the system cgroup's and the machine's counters at its start and end).

Peers run at their defaults: Gloo needs only GLOO_SOCKET_IFNAME (set by the
harness); MPI's interface selection is passed to mpirun by the harness.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

CGROUP_ENV = "DLCP_BENCH_CGROUP_CPU_STAT"  # as in bench/src/window.rs
STARTED_ENV = "DLCP_BENCH_STARTED"


def mark():
    """CPU counters now (see bench/src/window.rs): wall time, the system cgroup's
    usage_usec, the machine's busy and total jiffies."""
    cg = None
    try:
        with open(os.environ[CGROUP_ENV]) as f:
            for line in f:
                if line.startswith("usage_usec "):
                    cg = int(line.split()[1])
    except (KeyError, OSError, ValueError):
        pass
    busy = total = None
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu "):
                v = [int(x) for x in line.split()[1:]] + [0] * 10
                busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
                total = busy + v[3] + v[4]
                break
    return {"t": time.time(), "cg": cg, "busy": busy, "total": total}


def window(a, b):
    return {"t0": a["t"], "t1": b["t"], "cg0": a["cg"], "cg1": b["cg"], "busy0": a["busy"], "busy1": b["busy"],
            "total0": a["total"], "total1": b["total"]}


def inputs(seed, n):
    rng = np.random.default_rng(seed)
    return ((rng.random(n, dtype=np.float32) - 0.5) * 0.02).astype(np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["gloo", "mpi"], required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--master", default="10.77.0.1:29500")
    ap.add_argument("--sizes", default="")
    ap.add_argument("--buckets", default="")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out-dir", default="", help="write rank<N>.json there instead of stdout")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",") if x]
    buckets = [int(x) for x in a.buckets.split(",") if x]

    if a.backend == "gloo":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank, world_size=a.world)
        rank = a.rank

        def alloc(n):
            return torch.zeros(n, dtype=torch.float32)

        def fill(t, src):
            t.numpy()[:] = src

        def allreduce(t):
            dist.all_reduce(t)

        def issue(t):
            return dist.all_reduce(t, async_op=True)

        def wait_in_order(works, t0, front_index):
            # Gloo completes a process group's ops in issue order.
            front = None
            for i, w in works:
                w.wait()
                if i == front_index:
                    front = time.perf_counter() - t0
            return front

        def barrier():
            dist.barrier()

        def finish():
            dist.destroy_process_group()

    else:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank = comm.Get_rank()

        def alloc(n):
            return np.zeros(n, dtype=np.float32)

        def fill(t, src):
            t[:] = src

        def allreduce(t):
            comm.Allreduce(MPI.IN_PLACE, t, op=MPI.SUM)

        def issue(t):
            return comm.Iallreduce(MPI.IN_PLACE, t, op=MPI.SUM)

        def wait_in_order(works, t0, front_index):
            reqs = [w for _, w in works]
            idx = [i for i, _ in works]
            front = None
            for _ in reqs:
                k = MPI.Request.Waitany(reqs)
                if idx[k] == front_index:
                    front = time.perf_counter() - t0
            return front

        def barrier():
            comm.Barrier()

        def finish():
            pass

    results = []
    # Inputs first, then a barrier, then the CPU marks: the timed region's CPU
    # covers the allreduces (warm-up included), not imports or input generation.
    srcs = [inputs(a.seed + i, n) for i, n in enumerate(sizes or buckets)]
    barrier()
    cpu0 = time.process_time()
    m0 = mark()
    if os.environ.get(STARTED_ENV):
        open(os.environ[STARTED_ENV], "w").close()
    if sizes:
        for i, n in enumerate(sizes):
            t = alloc(n)
            src = srcs[i]
            times = []
            for rep in range(a.warmup + a.reps):
                fill(t, src)
                t0 = time.perf_counter()
                allreduce(t)
                if rep >= a.warmup:
                    times.append(time.perf_counter() - t0)
            results.append({"elems": n, "times": times})
            del t
    else:
        ts = [alloc(n) for n in buckets]
        times, front = [], []
        for rep in range(a.warmup + a.reps):
            for t, s in zip(ts, srcs):
                fill(t, s)
            t0 = time.perf_counter()
            works = [(i, issue(ts[i])) for i in reversed(range(len(ts)))]
            f = wait_in_order(works, t0, 0)
            if rep >= a.warmup:
                times.append(time.perf_counter() - t0)
                front.append(f)
        results.append({"elems": sum(buckets), "times": times, "front": front})
    m1 = mark()
    cpu = time.process_time() - cpu0
    if os.environ.get(STARTED_ENV):
        open(os.environ[STARTED_ENV] + ".end", "w").close()
    finish()
    line = json.dumps({"system": a.backend, "rank": rank, "cpu_s": cpu, "window": window(m0, m1),
                       "results": results})
    if a.out_dir:
        # mpirun merges the ranks' stdout: lines could interleave.
        with open(f"{a.out_dir}/rank{rank}.json", "w") as f:
            f.write(line + "\n")
    else:
        print(line)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
