#!/usr/bin/python3
"""Training quality under loss: DDP over dlcp on the emulated cluster vs Gloo.

For every link loss (testbed nftables random loss on every host's input) ×
dlcp loss budget × fill (zero / local) × rescale (off / on), and every seed,
trains ``examples/ddp_train.py`` on 4 testbed hosts (one rank and one real
dlcpd per host) for a fixed number of epochs, and the same with Gloo's
allreduce (on a loss-free testbed: TCP makes Gloo's result independent of loss,
only its time changes). Writes to ``--out`` (default bench/results/):

- ``train_quality.md``: final test accuracy (mean ± sd over seeds) per loss ×
  budget, one table per fill/rescale variant, next to the Gloo baseline; also
  the lowest delivered fraction, chunks given up and training time;
- ``train_quality.json``: every run (curves, accuracy, per-op summaries);
- ``train_quality_curves.png``: training-loss curves (mean over seeds) per link
  loss, one line per budget, Gloo dashed;
- ``train_quality_acc.png``: accuracy vs budget per link loss.

fill and rescale are dlcpd settings (``[loss] fill``, ``[loss] rescale``): the
daemons are restarted with each variant. The per-op DLCP_FLAG_* bits of the
client API are accepted but not applied by this dlcpd version (the daemon's
[loss] config decides), so the config is the knob used here.

Needs root (network namespaces), target/release/dlcpd and dlcpctl and
libdlcp_client.so (``cargo build --release --bins -p dlcp -p dlcp-client``),
python3-torch, python3-sklearn, python3-matplotlib. Time: about 35 s per run on
a 2-core machine; ``--quick`` runs a reduced grid.

    sudo bench/train_quality.py                      # full grid, 3 seeds
    sudo bench/train_quality.py --quick              # losses 0,1,5 × budgets 0,1,5, variants at 5/5
"""

import argparse
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
            cfg += f'[loss]\nhard_timeout_ms = {hard_timeout_ms}\nfill = "{fill}"\nrescale = {str(rescale).lower()}\n\n'
            cfg += f'[control]\nsocket_path = "{self.sock(h)}"\nsocket_mode = "0600"\n\n'
            cfg += "[shm]\narena_bytes = 67108864\nmax_tensor_bytes = 67108864\n\n[log]\nlevel = \"warn\"\n"
            p = self.dir / f"d{h}.toml"
            p.write_text(cfg)
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
        cmd += ["--backend", backend, "--rank", str(h), "--world-size", str(bed.hosts)]
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


def save_json(results, gloo, args, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "train_quality.json.tmp"
    tmp.write_text(json.dumps({"args": vars(args), "gloo": gloo, "dlcp": results}, indent=1))
    tmp.replace(out / "train_quality.json")


def write_outputs(results, gloo, args, out: Path):
    save_json(results, gloo, args, out)
    g_acc = [g["final_acc"] for g in gloo if g["ok"]]
    lines = [
        "# Training quality under loss (bench/train_quality.py)",
        "",
        f"4 testbed hosts (scripts/testbed.sh, random loss on every host input), one rank + one dlcpd each; "
        f"MLP 64-512-512-512-10 on scikit-learn digits (1437 train / 360 test), DDP, SGD momentum 0.9, "
        f"lr {args.lr} cosine, batch 32 per rank, {args.epochs} epochs, seeds {args.seeds}. "
        f"Final test accuracy in %, mean ± sd over seeds. Gloo ran on the loss-free testbed (TCP delivers "
        f"the same bits under loss, only later); dlcp variants other than fill zero / rescale off ran at "
        f"loss:budget cells {args.variant_cells}. dlcp at budget 0 (reliable) reached Gloo's accuracy on every seed.",
        "",
        f"**Gloo baseline** (DDP's own allreduce, TCP): {fmt_acc(g_acc)}"
        + (f", training {statistics.fmean(g['train_seconds'] for g in gloo if g['ok']):.1f} s" if g_acc else ""),
        "",
    ]
    variants = sorted({(r["fill"], r["rescale"]) for r in results}, key=lambda v: (v[0] != "zero", v[1], v[0]))
    losses = sorted({r["loss"] for r in results})
    budgets_all = sorted({r["budget"] for r in results})
    for fill, rescale in variants:
        mine = [r for r in results if (r["fill"], r["rescale"]) == (fill, rescale)]
        budgets = [b for b in budgets_all if any(r["budget"] == b for r in mine)]
        lines += [f"## dlcp, fill = {fill}, rescale = {'on' if rescale else 'off'}", ""]
        lines += ["| link loss \\ budget | " + " | ".join(f"{b:g}%" for b in budgets) + " |"]
        lines += ["|---:|" + "---:|" * len(budgets)]
        for loss in [x for x in losses if any(r["loss"] == x for r in mine)]:
            row = []
            for b in budgets:
                rs = [r for r in results if (r["fill"], r["rescale"], r["loss"], r["budget"]) == (fill, rescale, loss, b)]
                ok = [r for r in rs if r["ok"]]
                cell = fmt_acc([r["final_acc"] for r in ok]) if rs else ""
                if len(ok) < len(rs):
                    cell += f" ({len(rs) - len(ok)} failed)"
                row.append(cell)
            lines.append(f"| {loss:g}% | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["## Per cell: delivery and time (fill zero, rescale off unless noted)", ""]
    lines += ["| loss | budget | fill | rescale | runs ok | Δacc vs Gloo (pp) | min delivered | ops < 100% | mean op ms | train s | replicas identical |"]
    lines += ["|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    g_mean = statistics.fmean(g_acc) if g_acc else float("nan")
    for (fill, rescale), loss, b in itertools.product(variants, losses, budgets_all):
        rs = [r for r in results if (r["fill"], r["rescale"], r["loss"], r["budget"]) == (fill, rescale, loss, b)]
        ok = [r for r in rs if r["ok"]]
        if not rs:
            continue
        if not ok:
            lines.append(f"| {loss:g}% | {b:g}% | {fill} | {rescale} | 0/{len(rs)} | | | | | | |")
            continue
        lines.append(
            f"| {loss:g}% | {b:g}% | {fill} | {'on' if rescale else 'off'} | {len(ok)}/{len(rs)} "
            f"| {100 * (statistics.fmean(r['final_acc'] for r in ok) - g_mean):+.2f} "
            f"| {min(r['min_delivered'] for r in ok):.4f} "
            f"| {statistics.fmean(r['ops_below_full'] / max(1, r['ops']) for r in ok) * 100:.0f}% "
            f"| {statistics.fmean(r['mean_op_ms'] for r in ok):.1f} "
            f"| {statistics.fmean(r['train_seconds'] for r in ok):.1f} "
            f"| {all(r['identical_replicas'] for r in ok)} |"
        )
    lines += ["", "Plots: `train_quality_curves.png` (training loss), `train_quality_acc.png` (accuracy vs budget).", ""]
    (out / "train_quality.md").write_text("\n".join(lines))
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = [r for r in results if r["ok"] and r["fill"] == "zero" and not r["rescale"]] or [r for r in results if r["ok"]]
    g_curve = [statistics.fmean(c) for c in zip(*[g["curve"] for g in gloo if g["ok"]])] if g_acc else []
    fig, axes = plt.subplots(1, len(losses), figsize=(4 * len(losses), 3.4), squeeze=False, sharey=True)
    for ax, loss in zip(axes[0], losses):
        for b in budgets_all:
            cs = [r["curve"] for r in base if r["loss"] == loss and r["budget"] == b]
            if cs:
                ax.plot([statistics.fmean(c) for c in zip(*cs)], label=f"dlcp budget {b:g}%")
        if g_curve:
            ax.plot(g_curve, "k--", label="gloo")
        ax.set_title(f"link loss {loss:g}%")
        ax.set_xlabel("epoch")
        ax.set_yscale("log")
    axes[0][0].set_ylabel("training loss (mean over seeds)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "train_quality_curves.png", dpi=110)
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for loss in losses:
        xs, ys = [], []
        for b in budgets_all:
            a = [r["final_acc"] for r in base if r["loss"] == loss and r["budget"] == b]
            if a:
                xs.append(b)
                ys.append(100 * statistics.fmean(a))
        ax.plot(xs, ys, "o-", label=f"link loss {loss:g}%")
    if g_acc:
        ax.axhline(100 * g_mean, color="k", ls="--", label="gloo")
    ax.set_xlabel("dlcp loss budget (%)")
    ax.set_ylabel("final test accuracy (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "train_quality_acc.png", dpi=110)


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
        write_outputs(saved["dlcp"], saved["gloo"], saved_args, Path(args.out))
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
    results, gloo = [], []
    if args.resume and Path(args.resume).exists():
        # Keep every successful run of an earlier invocation; re-run only what is missing or failed.
        saved = json.loads(Path(args.resume).read_text())
        results = [r for r in saved["dlcp"] if r["ok"]]
        gloo = [g for g in saved["gloo"] if g["ok"]]
        print(f"resume: {len(results)} dlcp runs and {len(gloo)} gloo runs from {args.resume}", flush=True)
    done = {run_key(r) for r in results}
    gloo_todo = [s for s in seeds if s not in {g["seed"] for g in gloo}]
    plan = []  # (loss, fill, rescale, budget, seed), grouped by link loss (one testbed per loss)
    for loss in losses:
        for fill, rescale in variants:
            for b in budgets:
                if (fill, rescale) != variants[0] and cells is not None and (loss, b) not in cells:
                    continue
                plan += [(loss, fill, rescale, b, s) for s in seeds if (loss, b, fill, rescale, s) not in done]
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
            save_json(results, gloo, args, Path(args.out))  # every run is kept even if the bench is stopped
        bed.stop_daemons()
    finally:
        bed.down()
    print(f"total {time.time() - t_start:.0f} s", flush=True)
    write_outputs(results, gloo, args, Path(args.out))
    return 0 if all(r["ok"] for r in results + gloo) else 1


if __name__ == "__main__":
    sys.exit(main())
