#!/usr/bin/env python3
"""Interleaved A/B of the training step: short runs of bench/time_to_accuracy.py's task, variant
after variant, round after round, and their step times side by side.

A change to dlcpd that is meant to shorten the DDP step is judged here. The machines are shared
and noisy: on the 2-vCPU VM one variant's step varies by 5-10% from run to run. So the variants
run interleaved (A, B, C, A, B, C, ...), never in blocks, and the table shows every run, not
only the mean. A variant is ``NAME=BINDIR,TRANSPORT[,TABLE:LINE ...]``:

- BINDIR holds the dlcpd, dlcpctl and libdlcp_client.so to run (build each version into its own
  directory);
- TRANSPORT is one of time_to_accuracy.py's transports (gloo-cubic, dlcp-b1, the tuned
  dlcp-b1-paths1, ...);
- each TABLE:LINE adds a line to a table of every dlcpd's config (time_to_accuracy.py
  ``--dlcpd-set``), e.g. ``datapath.socket:gso_max_segments = 32``; a comma inside a
  line's brackets or quotes (a TOML array, a string) belongs to the line.

For dlcp variants it also sums the daemons' datapath counters over each run (datagrams, system
calls, GSO messages): datagrams per GSO message and GSO messages per ``sendmmsg`` call say how
well the sends batch. With ``--cpu-window DELAY,SECONDS`` it samples the machine's CPU
(/proc/stat) and every process's (/proc/<pid>/stat) over that window of each run, which must
lie inside the training of every variant, and reports CPU-ms per training step: busy, kernel,
dlcpd's user time, the trainers' user time, idle. On 2 CPU-bound cores that says where a
step's time goes better than a profile's percentages do.

    sudo bench/step_ab.py --variant main=/tmp/b0,dlcp-b1 --variant new=/tmp/b1,dlcp-b1 \\
        --variant paths1=/tmp/b0,dlcp-b1-paths1 --rounds 3
    sudo bench/step_ab.py --variant gso16=target/release,dlcp-b1-paths1 \\
        --variant 'gso32=target/release,dlcp-b1-paths1,datapath.socket:gso_max_segments = 32'
    sudo bench/step_ab.py --variant gloo=target/release,gloo-cubic --variant dlcp=target/release,dlcp-b1 \
        --rounds 2 --cpu-window 22,12    # where each transport's step goes, CPU-ms per step
    bench/step_ab.py --self-check       # the parsing and the summary, no network

Defaults: clean MTU 1500, seed 0, 200 steps, a training-clock cap of 200 s, target 99% (so no
run stops early: the step is what is measured); about 1.2 min per run at MTU 1500 on the VM.
Writes ``step_ab[-TAG].md`` and ``.json`` into ``--out``. Needs what time_to_accuracy.py needs,
and root.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TTA = ROOT / "bench/time_to_accuracy.py"
sys.path.insert(0, str(ROOT / "bench"))
from measure import sum_counters  # noqa: E402
from time_to_accuracy import ALL_TRANSPORTS, dlcpd_set  # noqa: E402  (the variants' lines are its --dlcpd-set)


def split_top(text: str) -> list:
    """``text`` split at commas outside brackets, braces and quotes, so a TOML line such as
    ``priority:dscp = [0, 10]`` stays whole."""
    parts, cur, depth, quote = [], [], 0, None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_variant(spec: str) -> dict:
    """``NAME=BINDIR,TRANSPORT[,TABLE:LINE ...]`` as {name, bindir, transport, set}; commas inside
    a line's brackets or quotes do not split it."""
    name, sep, rest = spec.partition("=")
    parts = [p.strip() for p in split_top(rest)] if sep else []
    if not name.strip() or len(parts) < 2 or not parts[0] or not parts[1]:
        raise ValueError(f"--variant {spec!r}: expected NAME=BINDIR,TRANSPORT[,TABLE:LINE ...]")
    if parts[1] not in ALL_TRANSPORTS:
        raise ValueError(f"--variant {spec!r}: unknown transport {parts[1]!r} (one of {', '.join(ALL_TRANSPORTS)})")
    try:
        dlcpd_set(parts[2:])
    except ValueError as e:
        raise ValueError(f"--variant {spec!r}: {e}") from None
    return {"name": name.strip(), "bindir": parts[0], "transport": parts[1], "set": parts[2:]}


def ratio(a, b):
    return a / b if a is not None and b else None


def summarize(variants: list, runs: list) -> list:
    """Per variant: its runs' steps (in round order), mean, median, the mean's ratio to the first
    variant's, compute and exposed medians, and the summed datapath counters' ratios."""
    rows = []
    base = None
    for v in variants:
        mine = [r for r in runs if r["variant"] == v["name"] and r.get("ok")]
        steps = [r["step_ms"] for r in mine]
        dp = sum_counters([r.get("daemon_datapath") or {} for r in mine])
        row = {
            "variant": v["name"],
            "spec": v,
            "steps": steps,
            "failed": sum(1 for r in runs if r["variant"] == v["name"] and not r.get("ok")),
            "mean": statistics.fmean(steps) if steps else None,
            "median": statistics.median(steps) if steps else None,
            "compute": statistics.median([r["compute_ms"] for r in mine]) if mine else None,
            "exposed": statistics.median([r["exposed_ms"] for r in mine]) if mine else None,
            "segments_per_message": ratio(dp.get("gso_segments"), dp.get("gso_messages")),
            "messages_per_call": ratio(dp.get("gso_messages"), dp.get("tx_syscalls")),
            "datagrams_per_rx_call": ratio(dp.get("rx_datagrams"), dp.get("rx_syscalls")),
            "cpu_per_step": {k: statistics.median([r["cpu_per_step"][k] for r in mine if "cpu_per_step" in r])
                             for k in CPU_COLUMNS} if any("cpu_per_step" in r for r in mine) else None,
        }
        if base is None:
            base = row["mean"]
        row["vs_first"] = ratio(row["mean"], base)
        rows.append(row)
    return rows


CPU_COLUMNS = ("busy", "kernel", "dlcpd_user", "trainer_user", "idle")


def fmt(x, spec=".1f", none="–"):
    return none if x is None else format(x, spec)


def table(rows: list) -> list:
    lines = ["| variant | step ms, every run (round order) | mean | median | mean ÷ first | compute ms | "
             "exposed ms | datagrams per GSO message | GSO messages per `sendmmsg` | datagrams per `recvmmsg` |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        runs = ", ".join(fmt(s) for s in r["steps"]) + (f" ({r['failed']} failed)" if r["failed"] else "")
        lines.append(f"| {r['variant']} | {runs} | {fmt(r['mean'])} | {fmt(r['median'])} | "
                     f"{fmt(r['vs_first'], '.3f')} | {fmt(r['compute'])} | {fmt(r['exposed'])} | "
                     f"{fmt(r['segments_per_message'])} | {fmt(r['messages_per_call'], '.2f')} | "
                     f"{fmt(r['datagrams_per_rx_call'])} |")
    if any(r["cpu_per_step"] for r in rows):
        lines += ["", "CPU-ms per training step (medians over runs; machine-wide from /proc/stat, processes "
                  "from /proc/<pid>/stat, over the --cpu-window):", "",
                  "| variant | busy | kernel (system + softirq + irq) | dlcpd user | trainers' user | idle |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in rows:
            c = r["cpu_per_step"] or {}
            lines.append(f"| {r['variant']} | " + " | ".join(fmt(c.get(k), ".0f") for k in CPU_COLUMNS) + " |")
    return lines


def self_check():
    v = [parse_variant("a=/x,dlcp-b1"), parse_variant("b = /y , dlcp-b1-paths1, datapath.socket:gso_max_segments = 32")]
    assert v[1] == {"name": "b", "bindir": "/y", "transport": "dlcp-b1-paths1",
                    "set": ["datapath.socket:gso_max_segments = 32"]}, v[1]
    arr = parse_variant('c=/z,dlcp-b1,priority:dscp = [0, 10, 18, 26, 34, 40, 46, 48],log:level = "a,b"')
    assert arr["set"] == ["priority:dscp = [0, 10, 18, 26, 34, 40, 46, 48]", 'log:level = "a,b"'], arr
    assert split_top("a,[b,{c,d}],'e,f',g") == ["a", "[b,{c,d}]", "'e,f'", "g"]
    for bad in ("a", "a=/x", "=/x,dlcp-b1", "a=/x,dlcp-b1,paths = 1", "a=/x,dlcp-b1,network:paths", "a=/x,dlcp-b9"):
        try:
            parse_variant(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")
    dp = {"gso_segments": 300, "gso_messages": 20, "tx_syscalls": 10, "rx_datagrams": 320, "rx_syscalls": 16}
    runs = [{"variant": "a", "ok": True, "step_ms": 300.0, "compute_ms": 50, "exposed_ms": 250, "daemon_datapath": dp},
            {"variant": "b", "ok": True, "step_ms": 270.0, "compute_ms": 40, "exposed_ms": 230},
            {"variant": "a", "ok": True, "step_ms": 280.0, "compute_ms": 60, "exposed_ms": 220, "daemon_datapath": dp},
            {"variant": "b", "ok": False, "error": "x"}]
    a, b = summarize(v, runs)
    assert a["steps"] == [300.0, 280.0] and a["mean"] == 290.0 and a["vs_first"] == 1.0, a
    assert a["segments_per_message"] == 15.0 and a["messages_per_call"] == 2.0 and a["datagrams_per_rx_call"] == 20.0, a
    assert b["steps"] == [270.0] and b["failed"] == 1 and abs(b["vs_first"] - 270 / 290) < 1e-12, b
    assert b["segments_per_message"] is None, b
    text = "\n".join(table([a, b]))
    assert "| a | 300.0, 280.0 | 290.0 | 290.0 | 1.000 | 55.0 | 235.0 | 15.0 | 2.00 | 20.0 |" in text, text
    assert "| b | 270.0 (1 failed) |" in text, text
    p0 = {"1": ("dlcpd", 100, 200), "2": ("ksoftirqd/0", 0, 10), "3": ("ksoftirqd/1", 0, 20), "4": ("gone", 1, 1)}
    p1 = {"1": ("dlcpd", 150, 400), "2": ("ksoftirqd/0", 0, 30), "3": ("ksoftirqd/1", 0, 20), "5": ("new", 9, 9)}
    cpu = cpu_delta(p0, [0] * 8, p1, [100, 0, 50, 20, 0, 0, 30, 0], 100.0)
    assert cpu["procs"] == {"dlcpd": [500.0, 2000.0], "ksoftirqd": [0.0, 200.0]}, cpu
    assert cpu["machine"]["user"] == 1000.0 and cpu["machine"]["softirq"] == 300.0, cpu
    ps = per_step(cpu, 2.0, 500.0)  # 4 steps
    assert ps["steps"] == 4 and ps["busy"] == 450.0 and ps["kernel"] == 200.0 and ps["dlcpd_user"] == 125.0, ps
    assert ps["idle"] == 50.0 and ps["trainer_user"] == 0, ps
    runs[0]["cpu_per_step"] = ps
    a = summarize(v, runs)[0]
    assert a["cpu_per_step"]["busy"] == 450.0, a
    assert "| a | 450 | 200 | 125 | 0 | 50 |" in "\n".join(table([a])), table([a])
    print("step_ab self-check ok")


def log(msg: str):
    print(f"[step_ab {time.strftime('%H:%M:%S')}] {msg}", flush=True)


CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def proc_times() -> dict:
    """Per process: (comm, utime, stime) in clock ticks, from /proc/<pid>/stat."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            s = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        rest = s[s.rindex(")") + 2:].split()
        out[pid] = (s[s.index("(") + 1:s.rindex(")")], int(rest[11]), int(rest[12]))
    return out


def machine_times() -> list:
    return [int(x) for x in open("/proc/stat").readline().split()[1:1 + len(CPU_FIELDS)]]


def cpu_delta(p0: dict, m0: list, p1: dict, m1: list, hz: float) -> dict:
    """CPU-ms between two samples: the machine's by /proc/stat field, and per process name
    (ksoftirqd/N as one) user and system, for processes alive at both samples."""
    procs: dict = {}
    for pid, (comm, u, s) in p1.items():
        if pid in p0:
            name = "ksoftirqd" if comm.startswith("ksoftirqd/") else comm
            a = procs.setdefault(name, [0.0, 0.0])
            a[0] += (u - p0[pid][1]) * 1000 / hz
            a[1] += (s - p0[pid][2]) * 1000 / hz
    machine = {f: (b - a) * 1000 / hz for f, a, b in zip(CPU_FIELDS, m0, m1)}
    return {"machine": machine, "procs": {k: v for k, v in procs.items() if v[0] + v[1] > 0}}


def per_step(cpu: dict, window_s: float, step_ms: float) -> dict:
    """A CPU window's figures in CPU-ms per training step: busy, kernel (system + softirq + irq),
    dlcpd user, trainers' (python3) user."""
    steps = window_s * 1000 / step_ms
    m, p = cpu["machine"], cpu["procs"]
    busy = sum(v for k, v in m.items() if k not in ("idle", "iowait"))
    return {"steps": steps, "busy": busy / steps, "idle": m["idle"] / steps,
            "kernel": (m["system"] + m["softirq"] + m["irq"]) / steps,
            "dlcpd_user": p.get("dlcpd", [0, 0])[0] / steps, "trainer_user": p.get("python3", [0, 0])[0] / steps}


def run_one(args, v: dict, rnd: int, scratch: Path) -> dict:
    out = scratch / f"{v['name']}-{rnd}"
    cmd = [sys.executable, str(TTA), "--conds", args.cond, "--transports", v["transport"], "--seeds", str(args.seed),
           "--steps", str(args.steps), "--time-cap", str(args.time_cap), "--target", str(args.target),
           "--bindir", v["bindir"], "--out", str(out)]
    for item in v["set"]:
        cmd += ["--dlcpd-set", item]
    cpu: dict = {}
    stop = threading.Event()

    def sample():
        if stop.wait(args.cpu_window[0]):
            return
        p0, m0, t0 = proc_times(), machine_times(), time.time()
        if stop.wait(args.cpu_window[1]):
            return  # the run ended inside the window: no sample
        cpu.update(cpu_delta(p0, m0, proc_times(), machine_times(), os.sysconf("SC_CLK_TCK")), window_s=time.time() - t0)

    sampler = threading.Thread(target=sample, daemon=True)
    if args.cpu_window:
        sampler.start()
    p = subprocess.run(cmd, capture_output=True, text=True)
    stop.set()
    if args.cpu_window:
        sampler.join()
    found = list(out.glob("time_to_accuracy*.json"))
    if not found:
        last = (p.stderr or p.stdout).strip().splitlines()[-1:]
        return {"variant": v["name"], "round": rnd, "ok": False, "error": last[0] if last else f"exit {p.returncode}"}
    r = json.loads(found[0].read_text())["runs"][-1]
    r.update(variant=v["name"], round=rnd)
    r.pop("curve", None)
    if cpu and r.get("ok"):
        r["cpu"] = cpu
        r["cpu_per_step"] = per_step(cpu, cpu["window_s"], r["step_ms"])
    return r


def main() -> int:
    if sys.argv[1:] == ["--self-check"]:
        self_check()
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--variant", action="append", required=True, metavar="NAME=BINDIR,TRANSPORT[,TABLE:LINE ...]",
                    help="a variant (at least two; the first is the reference of the ratios)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of every variant, interleaved [%(default)s]")
    ap.add_argument("--cond", default="clean1500", help="time_to_accuracy.py's condition [%(default)s]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--time-cap", type=float, default=200.0)
    ap.add_argument("--target", type=float, default=0.99, help="high, so that no run stops early [%(default)s]")
    ap.add_argument("--cpu-window", type=lambda x: tuple(float(y) for y in x.split(",")), metavar="DELAY,SECONDS",
                    help="sample the machine's and the processes' CPU from DELAY s after a run's start for SECONDS "
                         "(inside every variant's training: e.g. 22,12 at MTU 1500) and report CPU-ms per step")
    ap.add_argument("--out", default="/tmp", help="where step_ab[-TAG].md/.json go [%(default)s]")
    ap.add_argument("--tag", default="")
    ap.add_argument("--note", default="", help="a paragraph at the top of the markdown")
    args = ap.parse_args()
    try:
        variants = [parse_variant(s) for s in args.variant]
    except ValueError as e:
        ap.error(str(e))
    if len({v["name"] for v in variants}) != len(variants):
        ap.error("variant names must differ")
    if args.cpu_window and (len(args.cpu_window) != 2 or min(args.cpu_window) <= 0):
        ap.error("--cpu-window: expected DELAY,SECONDS, both positive")
    if len(variants) < 2 or args.rounds < 1:
        ap.error("needs two variants or more and one round or more")
    for v in variants:
        if not (Path(v["bindir"]) / "dlcpd").exists():
            ap.error(f"variant {v['name']}: {v['bindir']}/dlcpd missing")
    scratch = Path(tempfile.mkdtemp(prefix="step_ab."))
    runs = []
    t0 = time.time()
    total = args.rounds * len(variants)
    for rnd in range(1, args.rounds + 1):
        for v in variants:
            r = run_one(args, v, rnd, scratch)
            runs.append(r)
            done = len(runs)
            eta = (time.time() - t0) / done * (total - done)
            what = (f"step {r['step_ms']:.1f} ms (compute {r['compute_ms']:.1f}, exposed {r['exposed_ms']:.1f})"
                    if r.get("ok") else f"FAILED {r.get('error')}")
            log(f"{done}/{total} round {rnd} {v['name']}: {what}; about {eta / 60:.0f} min left")
    rows = summarize(variants, runs)
    name = "step_ab" + (f"-{args.tag}" if args.tag else "")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Step A/B (bench/step_ab.py){' — ' + args.tag if args.tag else ''}", ""]
    if args.note:
        lines += [args.note, ""]
    lines += [f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {(time.time() - t0) / 60:.1f} min. "
              f"Task: bench/time_to_accuracy.py's, condition {args.cond}, seed {args.seed}, {args.steps} steps, "
              f"{args.rounds} rounds, variants interleaved in the order below. Step: the median over a run's steps "
              "after the first 5 (compute and exposed likewise); datapath ratios from the four daemons' counters "
              "summed over every run of the variant (their whole life, setup included).", ""]
    lines += [f"- **{v['name']}**: `{v['bindir']}`, {v['transport']}" + (
        " + " + "; ".join(f"`{s}`" for s in v["set"]) + " (tuned)" if v["set"] else "") for v in variants]
    lines += [""] + table(rows) + [""]
    (out / f"{name}.md").write_text("\n".join(lines))
    (out / f"{name}.json").write_text(json.dumps({"args": vars(args), "variants": variants, "runs": runs,
                                                  "summary": [{k: x for k, x in r.items() if k != "spec"} for r in rows]},
                                                 indent=1))
    print("\n".join(table(rows)))
    log(f"wrote {out / name}.md and .json")
    return 0 if all(r.get("ok") for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
