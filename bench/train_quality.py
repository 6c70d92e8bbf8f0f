#!/usr/bin/python3
"""Training quality under loss: DDP over dlcp on the emulated cluster vs Gloo.

For every link loss (testbed nftables random loss on every host's input) ×
dlcp loss budget × fill (zero / local) × rescale (off / on), and every seed,
trains ``examples/ddp_train.py`` on 4 testbed hosts (one rank and one real
dlcpd per host) for a fixed number of epochs, and the same with Gloo's
allreduce (on a loss-free testbed: TCP makes Gloo's result independent of loss,
only its time changes). Writes to ``--out`` (default bench/results/):

- ``train_quality.md``: final test accuracy (mean ± sd over seeds) per loss ×
  budget, one table per fill/rescale variant, next to the Gloo baseline; the
  variants side by side with a short computed reading (best variant per cell,
  cells more than 1 point below Gloo, paired differences against fill zero);
  checks that budget 0 is bit-identical across variants; per cell the lowest
  delivered fraction, ops with anything missing, time and bit-exact runs;
- ``train_quality.json``: every run (curves, accuracy, per-op summaries),
  rewritten after every run; ``--resume`` starts from it and runs only what is
  missing or failed, so a stopped bench loses nothing and grids can be merged;
- ``train_quality_curves.png``: training-loss curves (mean over seeds), one row
  per variant, one panel per link loss, one line per budget, Gloo dashed;
- ``train_quality_acc.png``: accuracy vs budget per link loss, one panel per
  variant.

fill and rescale are dlcpd settings (``[loss] fill``, ``[loss] rescale``): the
daemons are restarted with each variant (a trainer's per-op flags could only
add to them; examples/ddp_train.py sets none). Every run records the dlcpd build
(sha256 prefix); on --resume, lossy runs of another build are run again.

Needs root (network namespaces), target/release/dlcpd and dlcpctl and
libdlcp_client.so (``cargo build --release --bins -p dlcp -p dlcp-client``),
python3-torch, python3-sklearn, python3-matplotlib. Time: about 35 s per run on
a 2-core machine; ``--quick`` runs a reduced grid.

    sudo bench/train_quality.py                      # full grid, 3 seeds
    sudo bench/train_quality.py --quick              # losses 0,1,5 × budgets 0,1,5, variants at 5/5
    sudo bench/train_quality.py --resume bench/results/train_quality.json \
        --losses 1,5,10 --budgets 1,5,10 --variant-cells lossy   # add the variants where loss is filled
"""

import argparse
import hashlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = "/usr/bin/python3"
JOB = 7
PORT = 7702
LOSS_CAP = 0.1  # dlcpd's [loss] budget: the largest budget a trainer may ask for


def sh(*cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


class Testbed:
    def __init__(self, prefix: str, hosts: int, workdir: Path):
        self.prefix, self.hosts, self.dir = prefix, hosts, workdir
        self.env = dict(os.environ, DLCPTB_PREFIX=prefix)
        self.daemons = []

    def tb(self, *args):
        return subprocess.run([str(ROOT / "scripts/testbed.sh"), *args], env=self.env, capture_output=True, text=True)

    def up(self, loss: float):
        self.down()
        r = self.tb("up", "--hosts", str(self.hosts), *(["--loss", str(loss)] if loss > 0 else []))
        if r.returncode != 0:
            sys.exit(f"testbed up failed:\n{r.stdout}{r.stderr}")

    def down(self):
        self.stop_daemons()
        self.tb("down")

    def ns(self, h):
        return f"{self.prefix}-h{h}"

    def sock(self, h):
        return self.dir / f"d{h}.sock"

    def start_daemons(self, fill: str, rescale: bool, hard_timeout_ms: int = 10000):
        self.stop_daemons()
        for h in range(self.hosts):
            cfg = f'[node]\nrank = {h}\njob_id = {JOB}\njob_secret = "train quality bench secret 0123456789"\n'
            cfg += 'generation = "auto"\n\n'
            for r in range(self.hosts):
                cfg += f'[[peers]]\nrank = {r}\naddress = "10.77.0.{r + 1}"\nport = {PORT}\n\n'
            cfg += "[network]\nheartbeat_interval_ms = 100\npeer_timeout_ms = 1000\n\n"
            # [loss] budget is the operator's cap on what a trainer may ask for (default 1%): at the hard
            # cap (10%) the trainer's per-op budget, the bench's variable, is what applies.
            cfg += f"[loss]\nbudget = {LOSS_CAP}\nhard_timeout_ms = {hard_timeout_ms}\n"
            cfg += f'fill = "{fill}"\nrescale = {str(rescale).lower()}\n\n'
            cfg += f'[control]\nsocket_path = "{self.sock(h)}"\nsocket_mode = "0600"\n\n'
            cfg += "[shm]\narena_bytes = 67108864\nmax_tensor_bytes = 67108864\n\n[log]\nlevel = \"warn\"\n"
            p = self.dir / f"d{h}.toml"
            p.write_text(cfg)
            p.chmod(0o600)  # dlcpd refuses an inline secret in a file others may read
            log = open(self.dir / f"d{h}.log", "a")
            self.daemons.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", self.ns(h), str(ROOT / "target/release/dlcpd"), "--config", str(p)],
                    stdout=log,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                )
            )
        for h in range(self.hosts):
            t0 = time.time()
            while sh(str(ROOT / "target/release/dlcpctl"), "--socket", str(self.sock(h)), "stats", "--json", check=False).returncode:
                if time.time() - t0 > 20:
                    sys.exit(f"dlcpd {h} did not come up: {(self.dir / f'd{h}.log').read_text()[-2000:]}")
                time.sleep(0.05)

    def stop_daemons(self):
        for d in self.daemons:
            d.kill()
            d.wait()
        self.daemons = []

    def loss_counters(self):
        seen = dropped = 0
        for h in range(self.hosts):
            for name in ("seen", "dropped"):
                r = sh("ip", "netns", "exec", self.ns(h), "nft", "list", "counter", "inet", self.prefix, name, check=False)
                w = r.stdout.split()
                if "packets" in w:
                    n = int(w[w.index("packets") + 1])
                    if name == "seen":
                        seen += n
                    else:
                        dropped += n
        return seen, dropped


def train(bed: Testbed, backend: str, budget: float, seed: int, args, port: int) -> dict:
    procs = []
    lib = ROOT / "target/release/libdlcp_client.so"
    for h in range(bed.hosts):
        out = bed.dir / f"r{h}.json"
        if out.exists():
            out.unlink()
        cmd = ["ip", "netns", "exec", bed.ns(h), PY, str(ROOT / "examples/ddp_train.py")]
        cmd += ["--task", "digits", "--backend", backend, "--rank", str(h), "--world-size", str(bed.hosts)]
        cmd += ["--master-addr", "10.77.0.1", "--master-port", str(port), "--ifname", "eth0"]
        cmd += ["--socket", str(bed.sock(h)), "--job", str(JOB), "--budget", str(budget)]
        cmd += ["--epochs", str(args.epochs), "--lr", str(args.lr), "--seed", str(seed), "--out", str(out)]
        log = open(bed.dir / f"r{h}.log", "w")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, env=dict(os.environ, DLCP_LIB=str(lib))))
    t0 = time.time()
    for p in procs:
        try:
            p.wait(timeout=max(1, args.run_timeout - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
    res = []
    for h, p in enumerate(procs):
        p.wait()
        if p.returncode != 0:
            return {"ok": False, "error": (bed.dir / f"r{h}.log").read_text()[-1500:]}
        res.append(json.loads((bed.dir / f"r{h}.json").read_text()))
    identical = len({r["params_sha256"] for r in res}) == 1
    reps = res[0]["reports"]
    return {
        "ok": True,
        "final_acc": res[0]["final_acc"],
        "identical_replicas": identical,
        "curve": [e["loss"] for e in res[0]["curve"]],
        "acc_curve": [e["acc"] for e in res[0]["curve"]],
        "train_seconds": max(r["train_seconds"] for r in res),
        "ops": len(reps),
        "min_delivered": min((r["delivered"] for r in reps), default=1.0),
        "mean_delivered": statistics.fmean(r["delivered"] for r in reps) if reps else 1.0,
        "ops_below_full": sum(r["delivered"] < 1.0 for r in reps),
        "mean_op_ms": 1e3 * statistics.fmean(r["duration"] for r in reps) if reps else 0.0,
    }


def fmt_acc(xs):
    if not xs:
        return "—"
    m = 100 * statistics.fmean(xs)
    sd = 100 * statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{m:.2f} ± {sd:.2f}"


def run_key(r) -> tuple:
    """The cell and seed of a dlcp run: (link loss, budget, fill, rescale, seed)."""
    return (r["loss"], r["budget"], r["fill"], r["rescale"], r["seed"])


def dlcpd_build_id() -> str:
    """First 12 hex digits of the sha256 of target/release/dlcpd: which daemon build made a run."""
    f = ROOT / "target/release/dlcpd"
    return hashlib.sha256(f.read_bytes()).hexdigest()[:12] if f.exists() else "missing"


def save_json(results, gloo, args, out: Path, superseded=()):
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "train_quality.json.tmp"
    doc = {"args": vars(args), "gloo": gloo, "dlcp": results, "superseded": list(superseded)}
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out / "train_quality.json")


BASE = ("zero", False)


def vname(fill: str, rescale: bool) -> str:
    """Short name of a fill/rescale variant: zero, zero+rescale, local, local+rescale."""
    return fill + ("+rescale" if rescale else "")


def mean_pp(xs) -> float:
    return 100 * statistics.fmean(xs)


def write_outputs(results, gloo, args, out: Path, superseded=()):
    save_json(results, gloo, args, out, superseded)
    ok_runs = [r for r in results if r["ok"]]
    g_ok = [g for g in gloo if g["ok"]]
    g_acc = [g["final_acc"] for g in g_ok]
    g_mean = mean_pp(g_acc) if g_acc else float("nan")
    seeds = sorted({r["seed"] for r in ok_runs} | {g["seed"] for g in g_ok})
    variants = sorted({(r["fill"], r["rescale"]) for r in results}, key=lambda v: (v != BASE, v[0] != "zero", v[1]))
    losses = sorted({r["loss"] for r in results})
    budgets_all = sorted({r["budget"] for r in results})
    by_key = {run_key(r): r for r in ok_runs}

    def runs(v, loss, b, only_ok=True):
        return [r for r in (ok_runs if only_ok else results) if (r["fill"], r["rescale"], r["loss"], r["budget"]) == (*v, loss, b)]

    def same_as_base(r) -> bool | None:
        """True when the run's loss curve and accuracies are bit-identical to fill zero / rescale off, same seed."""
        base = by_key.get((r["loss"], r["budget"], *BASE, r["seed"]))
        if base is None:
            return None
        return (r["curve"], r["acc_curve"], r["final_acc"]) == (base["curve"], base["acc_curve"], base["final_acc"])

    def exact(r) -> bool | None:
        """True when the run is bit-identical to the reliable run (budget 0, fill zero) with the same seed."""
        ref = by_key.get((r["loss"], 0.0, *BASE, r["seed"])) or next(
            (x for x in ok_runs if x["budget"] == 0 and x["seed"] == r["seed"]), None
        )
        if ref is None:
            return None
        return (r["curve"], r["acc_curve"], r["final_acc"]) == (ref["curve"], ref["acc_curve"], ref["final_acc"])

    full = set(seeds)
    # The daemon build of the newest run; lossy runs of another build are marked (budget 0 is bit-exact).
    current = next((r["dlcpd"] for r in reversed(results) if r.get("dlcpd")), None)

    def is_current(r) -> bool:
        return r["budget"] == 0 or r.get("dlcpd") == current

    # Cells where every variant ran every seed with the current build: the variants are compared there.
    common = [
        (lo, b)
        for lo in losses
        for b in budgets_all
        if all({r["seed"] for r in runs(v, lo, b) if is_current(r)} >= full for v in variants)
    ]
    older = [r for r in ok_runs if not is_current(r)]
    others = [r for r in ok_runs if (r["fill"], r["rescale"]) != BASE]
    b0 = [r for r in others if r["budget"] == 0]
    l0 = [r for r in others if r["loss"] == 0 and r["budget"] > 0]
    l0_base = [r for r in ok_runs if (r["fill"], r["rescale"]) == BASE and r["loss"] == 0 and r["budget"] > 0]

    lines = [
        "# Training quality under loss (bench/train_quality.py)",
        "",
        f"4 testbed hosts (scripts/testbed.sh, random loss on every host input), one rank + one dlcpd each; "
        f"MLP 64-512-512-512-10 on scikit-learn digits (1437 train / 360 test: one test sample is 0.28 points), "
        f"DDP, SGD momentum 0.9, lr {args.lr} cosine, batch 32 per rank, {args.epochs} epochs, "
        f"seeds {','.join(map(str, seeds))}. Final test accuracy in %, mean ± sd over seeds. Gloo ran on the "
        f"loss-free testbed (TCP delivers the same bits under loss, only later). fill (zero / local) and "
        f"rescale (off / on) are dlcpd's `[loss]` settings; 'zero' below means fill zero, rescale off.",
        "",
        f"**Gloo baseline** (DDP's own allreduce, TCP): {fmt_acc(g_acc)}"
        + (f", training {statistics.fmean(g['train_seconds'] for g in g_ok):.1f} s" if g_acc else ""),
        "",
    ]
    if older:
        lines += [
            f"Cells marked † hold runs of an earlier dlcpd build ({len(older)} runs at link loss "
            + ", ".join(f"{x:g}%" for x in sorted({r['loss'] for r in older}))
            + f"); every other run with budget > 0 is of the current build ({current}, sha256 prefix of "
            f"target/release/dlcpd). Budget-0 runs are reliable and bit-exact whichever build made them. "
            f"Only current-build cells enter the comparisons below.",
            "",
        ]
    if superseded:
        why = {}
        for x in superseded:
            why[x.get("superseded_why", "replaced")] = why.get(x.get("superseded_why", "replaced"), 0) + 1
        lines += [
            "Runs left out of the tables (kept in train_quality.json under `superseded`): "
            + "; ".join(f"{n} {w}" for w, n in why.items())
            + ".",
            "",
        ]
    lines += ["## Where the variants can differ", ""]
    if common:
        lines.append(
            "All four variants ran every seed at loss:budget "
            + ", ".join(f"{lo:g}:{b:g}" for lo, b in common)
            + " (link loss % : budget %)."
        )
    if b0:
        n = sum(bool(same_as_base(r)) for r in b0)
        lines.append(
            f"At budget 0 the op is reliable: every missing packet is repaired, nothing is filled or rescaled, "
            f"so the variants cannot differ. Checked: {n} of {len(b0)} runs of other variants at budget 0 ("
            + ", ".join(f"{vname(r['fill'], r['rescale'])} at {r['loss']:g}:0 seed {r['seed']}" for r in b0)
            + ") gave a training-loss curve and accuracy bit-identical to fill zero with the same seed."
        )
    if l0_base:
        l0_all = l0_base + l0

        def l0_facts(rs) -> str:
            return (
                f"{sum(bool(exact(r)) for r in rs)} of {len(rs)} runs bit-identical to the reliable run with the "
                f"same seed, lowest delivered fraction of an op in rank 0's reports "
                f"{min(r['min_delivered'] for r in rs):.4f}, ops below 100% "
                f"{statistics.fmean(r['ops_below_full'] / max(1, r['ops']) for r in rs) * 100:.1f}%"
            )

        cur0 = [r for r in l0_all if is_current(r)]
        old0 = [r for r in l0_all if not is_current(r)]
        lines.append(
            "At link loss 0 the testbed drops nothing, but the loss contract lets a receiver complete a "
            "transfer once it holds ≥ 1 − budget of the packets, so with a budget > 0 late stragglers of a "
            "transfer may be given up, and the fill applies to them; whether that happens depends on timing. "
            "Runs at loss 0 and budget > 0: "
            + (f"current build: {l0_facts(cur0)} (" + ", ".join(
                f"{vname(r['fill'], r['rescale'])} {r['budget']:g}% seed {r['seed']}" for r in cur0) + ")" if cur0 else "")
            + ("; " if cur0 and old0 else "")
            + (f"earlier build (†): {l0_facts(old0)}" if old0 else "")
            + "."
        )
    lines.append("")

    lines += ["## Accuracy per variant", ""]
    for v in variants:
        mine = [r for r in results if (r["fill"], r["rescale"]) == v]
        budgets = [b for b in budgets_all if any(r["budget"] == b for r in mine)]
        lines += [f"### dlcp, fill = {v[0]}, rescale = {'on' if v[1] else 'off'}", ""]
        lines += ["| link loss \\ budget | " + " | ".join(f"{b:g}%" for b in budgets) + " |"]
        lines += ["|---:|" + "---:|" * len(budgets)]
        for loss in [x for x in losses if any(r["loss"] == x for r in mine)]:
            row = []
            for b in budgets:
                rs, ok = runs(v, loss, b, only_ok=False), runs(v, loss, b)
                cell = fmt_acc([r["final_acc"] for r in ok]) if rs else ""
                if any(not is_current(r) for r in ok):
                    cell += " †"
                if ok and {r["seed"] for r in ok} != full:
                    cell += f" (seed {','.join(str(r['seed']) for r in ok)})"
                if len(ok) < len(rs):
                    cell += f" ({len(rs) - len(ok)} failed)"
                row.append(cell)
            lines.append(f"| {loss:g}% | " + " | ".join(row) + " |")
        lines.append("")

    if common and len(variants) > 1:
        lines += ["## Variants side by side (mean accuracy %, Δ vs Gloo in points)", ""]
        lines += ["| loss | budget | " + " | ".join(vname(*v) for v in variants) + " | best |"]
        lines += ["|---:|---:|" + "---:|" * len(variants) + "---|"]
        wins = {v: 0.0 for v in variants}
        alone = {v: 0 for v in variants}
        for lo, b in common:
            means = {v: mean_pp([r["final_acc"] for r in runs(v, lo, b)]) for v in variants}
            top = max(means.values())
            best = [v for v in variants if abs(means[v] - top) < 1e-3]
            for v in best:
                wins[v] += 1 / len(best)
            if len(best) == 1:
                alone[best[0]] += 1
            lines.append(
                f"| {lo:g}% | {b:g}% | "
                + " | ".join(f"{means[v]:.2f} ({means[v] - g_mean:+.2f})" for v in variants)
                + " | "
                + (" = ".join(vname(*v) for v in best) if len(best) < len(variants) else "all equal")
                + " |"
            )
        lines.append("")
        lines += ["## Reading", ""]
        def cell_delta(v, lo, b) -> float | None:
            """Mean accuracy minus Gloo's, for a cell with every seed run by the current build."""
            rs = [r for r in runs(v, lo, b) if is_current(r)]
            if {r["seed"] for r in rs} >= full:
                return mean_pp([r["final_acc"] for r in rs]) - g_mean
            return None

        deltas = [
            (d, v, lo, b)
            for v in variants
            for lo in losses
            for b in budgets_all
            if (d := cell_delta(v, lo, b)) is not None
        ]
        below = [(v, lo, b, d) for d, v, lo, b in deltas if d < -1.0]
        worst = min(deltas, default=None)
        if below:
            lines.append(
                "- Cells more than 1 point below Gloo (mean over seeds): "
                + ", ".join(f"{vname(*v)} at {lo:g}:{b:g} ({d:+.2f})" for v, lo, b, d in below)
                + "."
            )
        else:
            lines.append(
                f"- No cell of any variant is more than 1 point below Gloo (mean over seeds; {len(deltas)} "
                f"cells with every seed run by the current build)."
            )
        if worst:
            d, v, lo, b = worst
            lines.append(f"- Lowest such cell: {vname(*v)} at loss {lo:g}%, budget {b:g}%: {d:+.2f} points vs Gloo.")
        lines.append(
            f"- Best variant per cell ({len(common)} cells, ties split): "
            + ", ".join(f"{vname(*v)} {wins[v]:g}" for v in sorted(variants, key=lambda v: -wins[v]))
            + "; best alone: "
            + ", ".join(f"{vname(*v)} in {alone[v]}" for v in sorted(variants, key=lambda v: -alone[v]))
            + "."
        )
        lines.append("- Paired with fill zero (same cell, same seed), accuracy difference in points, mean ± standard error:")
        for v in variants[1:]:
            diffs = [
                100 * (r["final_acc"] - by_key[(lo, b, *BASE, r["seed"])]["final_acc"])
                for lo, b in common
                for r in runs(v, lo, b)
                if (lo, b, *BASE, r["seed"]) in by_key
            ]
            if len(diffs) > 1:
                se = statistics.stdev(diffs) / len(diffs) ** 0.5
                lines.append(
                    f"  {vname(*v)} {statistics.fmean(diffs):+.2f} ± {se:.2f} over {len(diffs)} pairs "
                    f"(better in {sum(d > 0 for d in diffs)}, equal in {sum(d == 0 for d in diffs)}, "
                    f"worse in {sum(d < 0 for d in diffs)});"
                )
        g_sd = 100 * statistics.stdev(g_acc) if len(g_acc) > 1 else 0.0
        lines.append(
            f"- Scale of the noise: Gloo's seed-to-seed sd is {g_sd:.2f} points, one test sample 0.28 points; "
            f"a 3-seed mean moves by about sd/√3 ≈ {g_sd / 3**0.5:.2f}."
        )
        lines.append("")

    lines += ["## Per cell: delivery and time", ""]
    lines += [
        "| loss | budget | variant | runs ok | Δacc vs Gloo (pp) | min delivered | ops < 100% | mean op ms "
        "| train s | replicas identical | bit-exact (seeds) |"
    ]
    lines += ["|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for v, loss, b in itertools.product(variants, losses, budgets_all):
        rs, ok = runs(v, loss, b, only_ok=False), runs(v, loss, b)
        if not rs:
            continue
        if not ok:
            lines.append(f"| {loss:g}% | {b:g}% | {vname(*v)} | 0/{len(rs)} | | | | | | | |")
            continue
        same = [exact(r) for r in ok]
        lines.append(
            f"| {loss:g}% | {b:g}% | {vname(*v)}{' †' if any(not is_current(r) for r in ok) else ''} | {len(ok)}/{len(rs)} "
            f"| {mean_pp([r['final_acc'] for r in ok]) - g_mean:+.2f} "
            f"| {min(r['min_delivered'] for r in ok):.4f} "
            f"| {statistics.fmean(r['ops_below_full'] / max(1, r['ops']) for r in ok) * 100:.0f}% "
            f"| {statistics.fmean(r['mean_op_ms'] for r in ok):.1f} "
            f"| {statistics.fmean(r['train_seconds'] for r in ok):.1f} "
            f"| {all(r['identical_replicas'] for r in ok)} "
            f"| {f'{sum(bool(s) for s in same)}/{len(same)}' if None not in same else ''} |"
        )
    lines += [
        "",
        "min delivered, ops < 100%: from rank 0's per-op reports (the lowest delivered fraction of any op, "
        "and the share of ops with anything missing). "
        "bit-exact: runs whose loss curve and accuracy are bit-identical to the reliable run (budget 0) "
        "with the same seed, i.e. runs in which loss and fill changed nothing.",
        "",
        "Plots: `train_quality_curves.png` (training loss per epoch, mean over seeds, one row per variant, "
        "Gloo dashed), `train_quality_acc.png` (final accuracy vs budget, one panel per variant; the budget-0 "
        "point is the reliable run, the same for every variant).",
        "",
    ]
    (out / "train_quality.md").write_text("\n".join(lines))
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g_curve = [statistics.fmean(c) for c in zip(*[g["curve"] for g in g_ok])] if g_acc else []
    fig, axes = plt.subplots(
        len(variants), len(losses), figsize=(3.4 * len(losses), 2.7 * len(variants)), squeeze=False, sharex=True, sharey=True
    )
    for row, v in zip(axes, variants):
        for ax, loss in zip(row, losses):
            for b in budgets_all:
                cs = [r["curve"] for r in runs(v, loss, b)]
                if len(cs) == len(full):  # single-seed checks are left out: the Gloo line is a 3-seed mean
                    lbl = f"budget {b:g}%"
                    ax.plot(
                        range(1, len(cs[0]) + 1),
                        [statistics.fmean(c) for c in zip(*cs)],
                        color=f"C{budgets_all.index(b)}",
                        label=lbl,
                    )
            if g_curve:
                ax.plot(range(1, len(g_curve) + 1), g_curve, "k--", label="gloo")
            ax.set_title(f"{vname(*v)}, link loss {loss:g}%", fontsize=9)
            ax.set_yscale("log")
            if ax.lines:
                ax.legend(fontsize=6)
        row[0].set_ylabel("training loss")
    for ax in axes[-1]:
        ax.set_xlabel("epoch")
    fig.tight_layout()
    fig.savefig(out / "train_quality_curves.png", dpi=100)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(variants), figsize=(3.6 * len(variants), 3.4), squeeze=False, sharex=True, sharey=True)
    for ax, v in zip(axes[0], variants):
        for i, loss in enumerate(losses):
            xs, ys = [], []
            for b in budgets_all:
                # Budget 0 is reliable: nothing is filled or rescaled, so every variant has fill zero's result.
                a = [r["final_acc"] for r in runs(v if b > 0 else BASE, loss, b)]
                if len(a) == len(full):
                    xs.append(b)
                    ys.append(mean_pp(a))
            if xs:
                ax.plot(xs, ys, "o-", color=f"C{i}", label=f"link loss {loss:g}%")
        if g_acc:
            g_sd = 100 * statistics.stdev(g_acc) if len(g_acc) > 1 else 0.0
            ax.axhline(g_mean, color="k", ls="--", label="gloo ± sd")
            ax.axhspan(g_mean - g_sd, g_mean + g_sd, color="k", alpha=0.08)
        ax.set_title(vname(*v), fontsize=9)
        ax.set_xlabel("dlcp loss budget (%)")
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("final test accuracy (%, mean of seeds)")
    fig.tight_layout()
    fig.savefig(out / "train_quality_acc.png", dpi=100)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--losses", default="0,1,5,10", help="link loss, percent")
    ap.add_argument("--budgets", default="0,1,5,10", help="dlcp budget, percent")
    ap.add_argument(
        "--variants",
        default="zero,local,zero+rescale,local+rescale",
        help="fill[+rescale] variants; all but the first only at --variant-cells",
    )
    ap.add_argument(
        "--variant-cells",
        default="5:5,10:10",
        help="loss:budget cells where the other variants run ('all': every cell; 'lossy': every cell with loss and budget > 0)",
    )
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--run-timeout", type=float, default=300)
    ap.add_argument("--prefix", default="torchb", help="testbed name prefix")
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    ap.add_argument("--quick", action="store_true", help="losses 0,1,5, budgets 0,1,5, variants at 5:5, 3 seeds")
    ap.add_argument(
        "--resume",
        metavar="JSON",
        help="start from the runs in this train_quality.json (kept; only missing or failed runs are run, results merged)",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the runs that would be made and exit")
    ap.add_argument("--replot", metavar="JSON", help="only rewrite the table and plots from a train_quality.json")
    args = ap.parse_args()
    if args.replot:
        saved = json.loads(Path(args.replot).read_text())
        saved_args = argparse.Namespace(**{**vars(args), **saved["args"], "replot": None})
        write_outputs(saved["dlcp"], saved["gloo"], saved_args, Path(args.out), saved.get("superseded", []))
        return 0
    if args.quick:
        args.losses, args.budgets, args.variant_cells = "0,1,5", "0,1,5", "5:5"
    for f in ("target/release/dlcpd", "target/release/dlcpctl", "target/release/libdlcp_client.so"):
        if not (ROOT / f).exists():
            sys.exit(f"{f} missing: cargo build --release --bins -p dlcp -p dlcp-client")
    losses = [float(x) for x in args.losses.split(",")]
    budgets = [float(x) for x in args.budgets.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    variants = [(v.split("+")[0], v.endswith("+rescale")) for v in args.variants.split(",")]
    if args.variant_cells == "all":
        cells = None
    elif args.variant_cells == "lossy":
        cells = {(lo, b) for lo in losses for b in budgets if lo > 0 and b > 0}
    else:
        cells = {tuple(float(y) for y in c.split(":")) for c in args.variant_cells.split(",")}
    dlcpd_id = dlcpd_build_id()
    results, gloo, superseded = [], [], []
    if args.resume and Path(args.resume).exists():
        # Keep every successful run of an earlier invocation; re-run only what is missing or failed, and the
        # lossy runs (budget > 0) of a different dlcpd build: their delivery depends on the daemon. Budget 0
        # is reliable (bit-exact), so those runs stand whatever build made them.
        saved = json.loads(Path(args.resume).read_text())
        # Runs of other training settings are not comparable: refuse to mix them.
        for k in ("epochs", "lr", "seeds"):
            if k in saved["args"] and saved["args"][k] != getattr(args, k):
                sys.exit(f"--resume {args.resume}: its runs used --{k} {saved['args'][k]}, this one "
                         f"{getattr(args, k)}; pass --{k} {saved['args'][k]} (or start a new file)")
        results = [r for r in saved["dlcp"] if r["ok"]]
        gloo = [g for g in saved["gloo"] if g["ok"]]
        superseded = saved.get("superseded", [])
        print(f"resume: {len(results)} dlcp runs and {len(gloo)} gloo runs from {args.resume}", flush=True)
    done = {run_key(r) for r in results if r["budget"] == 0 or r.get("dlcpd") == dlcpd_id}
    gloo_todo = [s for s in seeds if s not in {g["seed"] for g in gloo}]
    # Grouped by link loss (one testbed per loss); within a loss, cells in --budgets order, and in a cell
    # every variant of one seed before the next seed, so a stopped run leaves paired comparisons.
    plan = []  # (loss, fill, rescale, budget, seed)
    for loss in losses:
        for b in budgets:
            for s in seeds:
                for fill, rescale in variants:
                    if (fill, rescale) != variants[0] and cells is not None and (loss, b) not in cells:
                        continue
                    if (loss, b, fill, rescale, s) not in done:
                        plan.append((loss, fill, rescale, b, s))
    print(f"plan: {len(gloo_todo)} gloo runs, {len(plan)} dlcp runs", flush=True)
    if args.dry_run:
        for p in plan:
            print("  loss {:g}% fill {} rescale {} budget {:g}% seed {}".format(*p))
        return 0
    if os.geteuid() != 0:
        sys.exit("train_quality.py: needs root (network namespaces)")
    work = Path(subprocess.run(["mktemp", "-d", "/tmp/train_quality.XXXXXX"], capture_output=True, text=True).stdout.strip())
    bed = Testbed(args.prefix, 4, work)
    port = 29700
    t_start = time.time()
    try:
        if gloo_todo:
            bed.up(0)
        for seed in gloo_todo:
            port += 1
            r = train(bed, "gloo", 0, seed, args, port)
            r.update(seed=seed)
            gloo.append(r)
            print(f"[{time.time() - t_start:6.0f}s] gloo seed {seed}: {r.get('final_acc', r.get('error'))}", flush=True)
        current_loss = None
        for i, (loss, fill, rescale, b, seed) in enumerate(plan):
            if loss != current_loss:
                bed.up(loss)
                current_loss = loss
            bed.start_daemons(fill, rescale)
            s0, d0 = bed.loss_counters()
            port += 1
            r = train(bed, "dlcp", b / 100, seed, args, port)
            s1, d1 = bed.loss_counters()
            r.update(loss=loss, budget=b, fill=fill, rescale=rescale, seed=seed, nft_seen=s1 - s0, nft_dropped=d1 - d0)
            r["dlcpd"] = dlcpd_id
            r["loss_cap"] = LOSS_CAP
            if r["ok"]:
                superseded += [
                    {**x, "superseded_why": "run again with the current dlcpd build"}
                    for x in results
                    if run_key(x) == run_key(r)
                ]
                results = [x for x in results if run_key(x) != run_key(r)]
            results.append(r)
            msg = (
                f"acc {r['final_acc']:.4f} min delivered {r['min_delivered']:.4f} "
                f"{r['train_seconds']:.1f} s, nft dropped {d1 - d0}/{s1 - s0}"
                if r["ok"]
                else "FAILED " + r["error"].splitlines()[-1]
            )
            print(
                f"[{time.time() - t_start:6.0f}s] {i + 1}/{len(plan)} loss {loss:g}% budget {b:g}% fill {fill} "
                f"rescale {rescale} seed {seed}: {msg}",
                flush=True,
            )
            save_json(results, gloo, args, Path(args.out), superseded)  # every run is kept even if the bench is stopped
        bed.stop_daemons()
    finally:
        bed.down()
    print(f"total {time.time() - t_start:.0f} s", flush=True)
    write_outputs(results, gloo, args, Path(args.out), superseded)
    return 0 if all(r["ok"] for r in results + gloo) else 1


if __name__ == "__main__":
    sys.exit(main())
