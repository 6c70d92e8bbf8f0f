"""The spine step of bench/harness.py (issue 19): dlcp against Gloo and Open MPI on the
leaf-spine fabric of scripts/testbed.sh (`up --spines 2`): 4 hosts interleaved over 2
leaves (h0, h2 on leaf0; h1, h3 on leaf1), so every ring neighbour is across the fabric,
2 spines, ECMP hashed on the 5-tuple, 64 MiB allreduce, MTU 1500.

Conditions (spine links at SPINE_MBPS unless said):
  clean                 both spines at full rate
  spine1 loss 1%        1% random loss on every link of spine 1 (both directions)
  spine1 at 1/3 rate    spine 1's links at a third of the rate
  hash collision        every TCP packet into the fabric through spine 0 (testbed.sh pin):
                        the peers' flows that leave one leaf all share one spine, the
                        outcome of an unlucky hash made certain; dlcp (UDP) is hashed as ever
  clean, half rate      both spines at half the rate: the clean p50 should about double
                        if the links, not the CPUs, are the bottleneck

Every row records, from the spines' nftables counters, the datagrams (dlcp: UDP) or
segments (peers: TCP) each spine carried over the run, and for dlcp from its tenth op on
(the counters are sampled every SAMPLE_S seconds; the ops' boundaries come from the ranks'
wall-clock window and per-op times). So once dlcp sprays over paths, "both spines carry
50% +- 10%" and "the lossy spine carries <= 20% from the tenth op on" read straight off.

dlcpd runs its defaults. `--paths N` adds `[network] paths = N`, but only if this dlcpd
accepts the key (`dlcpd check-config`); otherwise the run says so and goes on without it.
"""
import bisect
import os
import tempfile
import threading
import time

MiB = 1 << 20
HOSTS = 4
SPINES = 2
# Spine link rate (Mbit/s): low enough that the links, not the two CPUs, bound the clean
# p50 (the half-rate row checks it). Measured on the 2-core VM: see bench/README.md.
SPINE_MBPS = 500
SAMPLE_S = 0.5
FROM_OP = 10


def plan(quick, ccs, rate=SPINE_MBPS):
    """The conditions: cond, rate (both spines' links), link {spine: {rate/loss}}, pin
    (spine, proto) or None, systems [(system, reps)]."""
    n, m = (3, 3) if quick else (10, 5)
    bbr = [(f"{p}-bbr", m) for p in ("gloo", "mpi") if "bbr" in ccs]
    # dlcp's share "from op FROM_OP on" needs ops after it: 4 more (5 ops) in a full run.
    trio = [("dlcp1", n if quick else max(n, FROM_OP + 4)), ("gloo", n), ("mpi", n)]
    return [{"cond": "clean", "rate": rate, "link": {}, "pin": None, "systems": trio + bbr},
            {"cond": "spine1 loss 1%", "rate": rate, "link": {1: {"loss": 1}}, "pin": None, "systems": trio + bbr},
            {"cond": "spine1 at 1/3 rate", "rate": rate, "link": {1: {"rate": rate // 3}}, "pin": None,
             "systems": trio + bbr},
            {"cond": "hash collision", "rate": rate, "link": {}, "pin": (0, "tcp"), "systems": trio + bbr},
            {"cond": "clean, half rate", "rate": rate // 2, "link": {}, "pin": None, "systems": trio}]


class Sampler:
    """The spines' counters every SAMPLE_S seconds in a thread: [(time, per-spine counters)]."""

    def __init__(self, bed, interval=SAMPLE_S):
        self.bed = bed
        self.interval = interval
        self.samples = []
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        while not self.stop_ev.is_set():
            t = time.time()
            c = self.bed.spine_counters()
            self.samples.append(((t + time.time()) / 2, c))
            self.stop_ev.wait(self.interval)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.thread.join(timeout=10)


def packets(counters, spine, name):
    return counters[spine].get(name, (0, 0))[0]


def at_time(samples, t, spine, name):
    """A spine counter at time t, linear between the samples around it (None outside)."""
    ts = [s[0] for s in samples]
    i = bisect.bisect_left(ts, t)
    if i == 0 or i >= len(samples):
        return None
    (t0, c0), (t1, c1) = samples[i - 1], samples[i]
    a, b = packets(c0, spine, name), packets(c1, spine, name)
    return a + (b - a) * (t - t0) / (t1 - t0) if t1 > t0 else b


def op_start(window_t, times, warmup, op):
    """Wall-clock start of op `op` (1-based, warm-up ops first) of a run whose ranks' window
    is window_t and timed reps took `times`: the window's end minus the reps from there on."""
    k = op - 1 - warmup
    if not window_t or k < 0 or k >= len(times):
        return None
    return window_t[1] - sum(times[k:])


def shares(values):
    total = sum(values)
    return [v / total for v in values] if total else [float("nan")] * len(values)


def spine_figures(before, after, samples, run, proto):
    """Per-spine deltas of a run and the shares of `proto` (udp/tcp) packets, over the run
    and (dlcp) from op FROM_OP on."""
    name = f"seen_{proto}"
    sp = []
    for s, (a, b) in enumerate(zip(before["spines"], after["spines"])):
        sp.append({k: b.get(k, 0) - a.get(k, 0) for k in
                   ("seen_packets", "seen_udp_packets", "seen_tcp_packets", "dropped_packets", "sent_packets")})
        # Queue drops on the spine's links, both ends: the leaves' uplinks towards it
        # (where two hosts' traffic meets the link rate) and its own ports towards the leaves.
        sp[-1]["queue_drops"] = link_drops(after, s) - link_drops(before, s)
    out = {"spines": sp, "proto": proto, "share": shares([x[f"{name}_packets"] for x in sp])}
    times = run["results"][0]["times"]
    t = op_start(run.get("window_t"), times, run.get("warmup", 1), FROM_OP)
    if t is not None:
        mids = [at_time(samples, t, s, name) for s in range(len(sp))]
        if None not in mids:
            ends = [b.get(f"{name}_packets", 0) for b in after["spines"]]
            out["share_from_op"] = {"op": FROM_OP, "share": shares([e - m for e, m in zip(ends, mids)])}
    return out


def link_drops(counters, spine):
    """Queue drops of every port on spine `spine`'s links (testbed.sh counters)."""
    return sum(p["queue_drops"] for p in counters.get("ports", [])
               if p["switch"] == f"spine{spine}" or p["towards"] == f"spine{spine}")


def paths_setting(bench, n):
    """`paths = n` for [network] if this dlcpd accepts it (dlcpd check-config), else ''."""
    d = tempfile.mkdtemp(prefix="paths-", dir=bench.workdir)
    cfg = os.path.join(d, "d0.toml")
    with open(os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(bench.runner.dlcp_config(0, HOSTS, os.path.join(d, "d0.sock"), network=f"paths = {n}\n"))
    r = bench.sh([os.path.join(bench.a.bindir, "dlcpd"), "check-config", cfg], check=False)
    if r.returncode == 0:
        return f"paths = {n}\n"
    bench.log(f"  --paths {n}: this dlcpd does not accept [network] paths ({r.stderr.strip()[-200:]}); "
              "running its defaults")
    return ""


def step(bench, stats):
    """The spine step: every condition of plan(), rows into bench.data['spine']."""
    bed, runner = bench.bed, bench.runner
    size = 16 * MiB if bench.quick else 64 * MiB
    rate = bench.a.spine_rate or SPINE_MBPS
    paths = paths_setting(bench, bench.a.paths) if bench.a.paths else ""
    bench.data["spine_meta"] = {"rate": rate, "size": size, "paths": paths.strip() or "dlcpd default",
                                "hosts": HOSTS, "spines": SPINES, "sample_s": SAMPLE_S, "from_op": FROM_OP}
    reps_scale = bench.a.spine_reps
    only_conds, _, only_systems = (getattr(bench.a, "spine_only", "") or "").partition(":")
    only_conds = {x.strip() for x in only_conds.split(",") if x.strip()}
    only_systems = {x.strip() for x in only_systems.split(",") if x.strip()}
    conds = plan(bench.quick, bench.ccs, rate)
    unknown = (only_conds - {c["cond"] for c in conds}) | (only_systems - {s for c in conds for s, _ in c["systems"]})
    if unknown:
        raise SystemExit(f"--spine-only: no such condition or system: {', '.join(sorted(unknown))} (conditions: "
                         + "; ".join(c["cond"] for c in conds) + ")")
    for c in conds:
        if only_conds and c["cond"] not in only_conds:
            continue
        systems = [(s, reps_scale or n) for s, n in c["systems"] if not only_systems or s in only_systems]
        bench.log(f"spine: {c['cond']}, spine links {c['rate']} Mbit/s, {size // MiB} MiB, {HOSTS} hosts: "
                  + ", ".join(f"{s} x{n}" for s, n in systems))
        bed.up(HOSTS, spines=SPINES, spine_rate=c["rate"])
        runner.network_extra = paths
        try:
            for s, opts in c["link"].items():
                bed.link(s, **opts)
            if c["pin"]:
                bed.pin(*c["pin"])
            for s, reps in systems:
                row = run_one(bench, stats, c, s, reps, size)
                if row:
                    bench.data["spine"].append(row)
        finally:
            runner.network_extra = ""
            bed.down()
    lines(bench)


def run_one(bench, stats, c, system, reps, size):
    bed, runner = bench.bed, bench.runner
    before = bed.counters()
    try:
        with Sampler(bed) as smp:
            # With --perf, dlcp's rows are profiled too (a spine figure that
            # moves by scheduling, not CPU, shows it in the profile).
            slug = "".join(ch if ch.isalnum() else "-" for ch in c["cond"]).strip("-")
            profile = f"spine-{slug}-{system}" if system.startswith("dlcp") else None
            r = runner.run(system, HOSTS, reps, 1, sizes=[size], profile=profile)
    except Exception as e:  # a peer failing is a result, not the end of the run
        bench.log(f"  {system}: FAILED: {e}")
        bench.errors.append(f"spine {c['cond']} {system}: {e}")
        return None
    after = bed.counters()
    proto = "udp" if system.startswith("dlcp") else "tcp"
    fig = spine_figures(before, after, smp.samples, r, proto)
    st = stats(r["results"][0]["times"])
    row = {"cond": c["cond"], "rate": c["rate"], "link": {str(k): v for k, v in c["link"].items()},
           "pin": c["pin"], "system": system, "size": size, "stats": st, "times": r["results"][0]["times"],
           "spine": fig, "kernel": r.get("kernel"), "drops": r.get("drops"),
           "min_delivered_ppm": r.get("min_delivered_ppm"), "repairs": r.get("repairs"), "wall_s": r["wall_s"]}
    if proto == "udp":
        row["paths"] = getattr(runner, "last_paths", None)
        for line in path_health_lines(row["paths"], reps + 1):
            bench.log("    " + line)
    sh_ = " / ".join(f"{x * 100:.1f}%" for x in fig["share"])
    later = fig.get("share_from_op")
    later = f", from op {later['op']} " + " / ".join(f"{x * 100:.1f}%" for x in later["share"]) if later else ""
    lost = [x["dropped_packets"] for x in fig["spines"]]
    qd = [x["queue_drops"] for x in fig["spines"]]
    bench.log(f"  {system}: p50 {st['p50'] * 1000:.0f} ms p99 {st['p99'] * 1000:.0f} ms max {st['max'] * 1000:.0f} ms; "
              f"{proto} per spine {sh_}{later}; random loss per spine {lost}, queue drops on each spine's links {qd}, "
              f"switch queue drops {(r.get('kernel') or {}).get('switch_queue_drops', '?')} ({r['wall_s']:.0f} s)")
    return row


def path_health_lines(per_host, ops):
    """One line per daemon and peer from `dlcpctl stats --json`'s paths_per_peer: verdicts
    per path per op, cuts, paths below full weight, and the long-window loss % by path."""
    out = []
    for h, peers in enumerate(per_host or []):
        for p in peers or []:
            paths = p.get("paths") or []
            if not paths:
                continue
            verdicts = sum(x.get("verdicts", 0) for x in paths)
            cuts = sum(x.get("cuts", 0) for x in paths)
            low = sum(1 for x in paths if x.get("weight", 1024) < 1024)
            loss = " ".join(f"{x.get('long_loss_ppm', 0) / 1e4:.2f}" for x in paths)
            out.append(f"host {h} -> rank {p.get('rank')}: {verdicts / len(paths) / max(ops, 1):.0f} verdicts "
                       f"per path per op, {cuts} cuts, {low} of {len(paths)} paths below full weight; "
                       f"loss % by path {loss}")
    return out


def lines(bench):
    """Summary lines: dlcp against each peer per condition (p50), dlcp's p50 under each
    impaired condition against its clean p50, and the half-rate p50 against the clean."""
    rows = {(r["cond"], r["system"]): r for r in bench.data["spine"]}
    tags = {"clean": "clean", "spine1 loss 1%": "lossy_spine", "spine1 at 1/3 rate": "slow_spine",
            "hash collision": "hash_collision", "clean, half rate": "half_rate"}
    for cond, tag in tags.items():
        d = rows.get((cond, "dlcp1"))
        if not d:
            continue
        for peer in ("gloo", "mpi", "gloo-bbr", "mpi-bbr"):
            if (cond, peer) in rows:
                bench.line(f"spine_{tag}_p50_vs_{peer.replace('-', '_')}", d["stats"]["p50"] * 1000,
                           rows[(cond, peer)]["stats"]["p50"] * 1000, "ms", peer, lower_better=True)
    clean = rows.get(("clean", "dlcp1"))
    for cond, ceiling in (("spine1 loss 1%", 1.2), ("spine1 at 1/3 rate", 1.3)):
        d = rows.get((cond, "dlcp1"))
        if clean and d:
            bench.line(f"spine_{tags[cond]}_dlcp_p50_over_clean", d["stats"]["p50"] / clean["stats"]["p50"],
                       ceiling, "x", "the issue's ceiling", lower_better=True)
    for s in ("dlcp1", "gloo", "mpi"):
        a, b = rows.get(("clean", s)), rows.get(("clean, half rate", s))
        if a and b:
            bench.line(f"spine_half_rate_{s}_p50_over_clean", b["stats"]["p50"] / a["stats"]["p50"], 2.0, "x",
                       "2: link-bound", lower_better=False)


def report(rows, meta, label):
    """Markdown section of the results file."""
    if not rows:
        return []
    out = [f"## Leaf-spine fabric (issue 19): {meta['hosts']} hosts on 2 leaves x {meta['spines']} spines, "
           f"{meta['size'] // MiB} MiB, spine links {meta['rate']} Mbit/s, dlcpd [network] paths: {meta['paths']}\n",
           "| condition | system | reps | p50 ms | p99 ms | max ms | proto | spine0 / spine1 share | "
           f"share from op {meta['from_op']} | random loss per spine | queue drops per spine | min delivered | repairs |",
           "|---|---|---:|---:|---:|---:|---|---|---|---|---|---:|---:|"]
    for r in rows:
        f = r["spine"]
        later = f.get("share_from_op")
        md_ = r.get("min_delivered_ppm")
        out.append(f"| {r['cond']} | {label.get(r['system'], r['system'])} | {r['stats']['n']} | "
                   f"{r['stats']['p50'] * 1000:.0f} | {r['stats']['p99'] * 1000:.0f} | {r['stats']['max'] * 1000:.0f} | "
                   f"{f['proto']} | {' / '.join(f'{x * 100:.1f}%' for x in f['share'])} | "
                   f"{' / '.join(f'{x * 100:.1f}%' for x in later['share']) if later else '–'} | "
                   f"{' / '.join(str(x['dropped_packets']) for x in f['spines'])} | "
                   f"{' / '.join(str(x['queue_drops']) for x in f['spines'])} | "
                   f"{'–' if md_ is None else f'{md_ / 1e4:.2f}%'} | {r.get('repairs') if r.get('repairs') is not None else '–'} |")
    out += ["", "Shares: the UDP (dlcp) or TCP (peers) packets each spine's forward hook counted over the run "
            "(lost ones included; both directions; warm-up op included). Random loss: the spine's nftables drops; "
            "queue drops: the pfifo drops on the spine's links, the leaves' uplinks towards it included. Hash collision: testbed.sh pin sends every "
            "TCP packet into the fabric through spine 0, so the peers' flows leaving a leaf share one spine; dlcp's "
            "UDP is hashed on its 5-tuples as in every other condition.", ""]
    return out


def check():
    """Self-check of the share arithmetic on synthetic counters (no root, no testbed)."""
    ph = path_health_lines([[{"rank": 1, "paths": [{"weight": 1024, "verdicts": 300, "cuts": 0, "long_loss_ppm": 3000},
                                                    {"weight": 16, "verdicts": 100, "cuts": 2, "long_loss_ppm": 13000}]}],
                            None], 2)
    assert ph == ["host 0 -> rank 1: 100 verdicts per path per op, 2 cuts, 1 of 2 paths below full weight; "
                  "loss % by path 0.30 1.30"], ph
    samples = [(100.0, [{"seen_udp": (0, 0)}, {"seen_udp": (0, 0)}]),
               (101.0, [{"seen_udp": (100, 0)}, {"seen_udp": (300, 0)}]),
               (102.0, [{"seen_udp": (200, 0)}, {"seen_udp": (400, 0)}])]
    assert at_time(samples, 101.5, 1, "seen_udp") == 350 and at_time(samples, 99, 0, "seen_udp") is None
    # 1 warm-up op + 10 reps of 0.1 s, ending at 102.0: op 10 starts at 102.0 - 0.2.
    assert abs(op_start([100.0, 102.0], [0.1] * 10, 1, 10) - 101.8) < 1e-9
    assert op_start([100.0, 102.0], [0.1] * 3, 1, 10) is None
    spines = lambda a, b: {"spines": [{"seen_udp_packets": a, "dropped_packets": 0},  # noqa: E731
                                      {"seen_udp_packets": b, "dropped_packets": 0}]}
    run = {"results": [{"times": [0.1] * 10}], "warmup": 1, "window_t": [100.0, 102.0]}
    f = spine_figures(spines(0, 0), spines(200, 400), samples, run, "udp")
    assert f["share"] == [1 / 3, 2 / 3], f
    # From op 10 (t = 101.8): spine0 at 180, spine1 at 380; ends 200 / 400: 20 / 20.
    assert [round(x, 9) for x in f["share_from_op"]["share"]] == [0.5, 0.5], f
    ports = {"ports": [{"switch": "leaf0", "towards": "spine1", "queue_drops": 5},
                       {"switch": "spine1", "towards": "leaf0", "queue_drops": 2},
                       {"switch": "leaf0", "towards": "h0", "queue_drops": 9}]}
    assert link_drops(ports, 1) == 7 and link_drops(ports, 0) == 0
    ps = plan(False, ["cubic", "bbr"])
    assert [c["cond"] for c in ps] == ["clean", "spine1 loss 1%", "spine1 at 1/3 rate", "hash collision",
                                       "clean, half rate"]
    assert ps[2]["link"] == {1: {"rate": SPINE_MBPS // 3}} and ps[4]["rate"] == SPINE_MBPS // 2
    assert ps[3]["pin"] == (0, "tcp") and all(n == (14 if s == "dlcp1" else 10) for s, n in ps[0]["systems"] if "bbr" not in s)
    assert {s for s, _ in ps[0]["systems"]} == {"dlcp1", "gloo", "mpi", "gloo-bbr", "mpi-bbr"}
    lines_ = report([{"cond": "clean", "system": "dlcp1", "stats": {"n": 10, "p50": 1.0, "p99": 1.2, "max": 1.3},
                      "spine": dict(f, spines=[{"dropped_packets": 0, "queue_drops": 1},
                                               {"dropped_packets": 2, "queue_drops": 3}]),
                      "min_delivered_ppm": 990000, "repairs": 4}],
                    {"hosts": 4, "spines": 2, "size": 64 * MiB, "rate": 1000, "paths": "dlcpd default",
                     "from_op": 10}, {"dlcp1": "dlcp b1%"})
    assert "| clean | dlcp b1% | 10 | 1000 | 1200 | 1300 | udp | 33.3% / 66.7% | 50.0% / 50.0% | 0 / 2 | 1 / 3 | " \
           "99.00% | 4 |" in lines_, lines_
