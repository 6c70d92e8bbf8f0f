"""The headline part of bench/results/<name>.md: the clean-network lead (dlcp against
the best peer and the floor at both MTUs, times and CPU), the dlcpd configuration,
the per-condition tables, receive-side drops and the perf summaries. Pure
functions of the harness's data (bench/harness.py --self-check runs them)."""

MiB = 1 << 20
LABEL = {"dlcp1": "dlcp b1%", "dlcp0": "dlcp b0", "dlcp1-paced": "dlcp b1% paced 3 Gbit/s (tuned)",
         "gloo": "Gloo cubic", "gloo-bbr": "Gloo bbr", "mpi": "Open MPI cubic", "mpi-bbr": "Open MPI bbr",
         "floor": "floor (bare UDP)", "dlcp1-noauth": "dlcp b1% packet_auth none",
         "dlcp1-noflow": "dlcp b1% flow control off",
         "dlcp1-path1": "dlcp b1% paths = 1"}
ORDER = ["dlcp1", "dlcp0", "floor", "gloo", "mpi", "dlcp1-noauth", "dlcp1-noflow", "dlcp1-path1", "dlcp1-paced", "gloo-bbr",
         "mpi-bbr"]


def ms(x):
    if x is None or x != x:
        return "–"
    return f"{x * 1000:.0f}" if x >= 0.1 else f"{x * 1000:.1f}"


def ratio(a, b):
    return f"{a / b:.2f}" if a and b and a == a and b == b else "–"


def f1(x):
    return f"{x:.1f}" if x is not None and x == x else "–"


def conditions(headline):
    """(cond, mtu) pairs in the order they ran."""
    out = []
    for h in headline:
        k = (h["cond"], h.get("mtu", 1500))
        if k not in out:
            out.append(k)
    return out


def rows_of(headline, cond, mtu):
    return {h["system"]: h for h in headline if h["cond"] == cond and h.get("mtu", 1500) == mtu}


def p50(rows, s):
    return rows[s]["stats"]["p50"] if s in rows else None


def cpu(rows, s, kind="cgroup"):
    return (rows[s].get("cpu") or {}).get(kind) if s in rows else None


def best_peer(rows):
    """The faster (p50) of Gloo and Open MPI under cubic: (key, p50) or (None, None)."""
    peers = [(p50(rows, s), s) for s in ("gloo", "mpi") if s in rows]
    if not peers:
        return None, None
    t, s = min(peers)
    return s, t


def lead(headline):
    """The clean-network lead: p50 of every system at both MTUs, dlcp against the best
    peer and the floor, and CPU per GiB (cgroup and machine net of idle)."""
    clean = [(c, m) for c, m in conditions(headline) if c == "clean"]
    if not clean:
        return []
    size = rows_of(headline, *clean[0])[next(iter(rows_of(headline, *clean[0])))]["size"]
    out = [f"## Clean network, {size // MiB} MiB, 4 hosts: dlcp against the best peer and the floor\n",
           "p50 ms. Ratios are dlcp / reference: below 1 dlcp is faster (issue 14 asks ≤ 0.8 × the best "
           "peer at MTU 9000, ≤ 1.0 at 1500, and ≤ 1.3 × the floor at both).\n",
           "| MTU | dlcp b1% | dlcp b0 | Gloo | Open MPI | floor | b1% / best peer | b0 / best peer | "
           "b1% / floor | b0 / floor |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c, m in clean:
        r = rows_of(headline, c, m)
        who, best = best_peer(r)
        bl = f" ({'Gloo' if who == 'gloo' else 'MPI'})" if who else ""
        out.append(f"| {m} | {ms(p50(r, 'dlcp1'))} | {ms(p50(r, 'dlcp0'))} | {ms(p50(r, 'gloo'))} | "
                   f"{ms(p50(r, 'mpi'))} | {ms(p50(r, 'floor'))} | {ratio(p50(r, 'dlcp1'), best)}{bl} | "
                   f"{ratio(p50(r, 'dlcp0'), best)} | {ratio(p50(r, 'dlcp1'), p50(r, 'floor'))} | "
                   f"{ratio(p50(r, 'dlcp0'), p50(r, 'floor'))} |")
    out += ["",
            "CPU seconds per GiB reduced: **cgroup** = the system's own processes (daemons and trainers), "
            "**machine** = every CPU's busy time over the timed region net of the idle baseline (softirq, the "
            "emulated switch and the kernel's forwarding included; see below). Ratios dlcp / reference "
            "(issue 14 asks dlcp's ≤ 0.8 × Gloo's at MTU 9000, ≤ 1.0 at 1500).\n",
            "| MTU | cgroup: dlcp b1% | dlcp b0 | Gloo | Open MPI | floor | b1% / Gloo | b1% / floor | "
            "machine net of idle: dlcp b1% | Gloo | floor | b1% / Gloo |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c, m in clean:
        r = rows_of(headline, c, m)
        out.append(f"| {m} | {f1(cpu(r, 'dlcp1'))} | {f1(cpu(r, 'dlcp0'))} | {f1(cpu(r, 'gloo'))} | "
                   f"{f1(cpu(r, 'mpi'))} | {f1(cpu(r, 'floor'))} | {ratio(cpu(r, 'dlcp1'), cpu(r, 'gloo'))} | "
                   f"{ratio(cpu(r, 'dlcp1'), cpu(r, 'floor'))} | {f1(cpu(r, 'dlcp1', 'net'))} | "
                   f"{f1(cpu(r, 'gloo', 'net'))} | {f1(cpu(r, 'floor', 'net'))} | "
                   f"{ratio(cpu(r, 'dlcp1', 'net'), cpu(r, 'gloo', 'net'))} |")
    lossy = [(c, m) for c, m in conditions(headline) if c == "loss 1%"]
    if lossy:
        out += ["", "1% random loss (p50 / p99 ms; issue 14 asks dlcp b1%'s p50 ≤ 1.15 × its own clean p50):\n",
                "| MTU | dlcp b1% | dlcp b0 | Gloo | Open MPI | b1% p50 / its clean p50 | b1% p99 / best peer p99 |",
                "|---:|---:|---:|---:|---:|---:|---:|"]
        for c, m in lossy:
            r = rows_of(headline, c, m)
            cl = rows_of(headline, "clean", m)
            pp = [r[s]["stats"]["p99"] for s in ("gloo", "mpi") if s in r]

            def both(s):
                return f"{ms(r[s]['stats']['p50'])} / {ms(r[s]['stats']['p99'])}" if s in r else "–"
            d99 = r["dlcp1"]["stats"]["p99"] if "dlcp1" in r else None
            out.append(f"| {m} | {both('dlcp1')} | {both('dlcp0')} | {both('gloo')} | {both('mpi')} | "
                       f"{ratio(p50(r, 'dlcp1'), p50(cl, 'dlcp1'))} | {ratio(d99, min(pp) if pp else None)} |")
    out.append("")
    return out


def config_section(config):
    if not config:
        return []
    out = ["## dlcpd configuration\n",
           "Every dlcp row runs dlcpd's defaults. The bench sets only what a run needs:\n"]
    out += [f"- {s}" for s in config.get("set", [])]
    out += ["", "The effective configuration of host 0 at MTU 1500 (`dlcpd check-config`: defaults filled in, "
                "secret redacted):\n", "```toml", config.get("effective", "").rstrip(), "```", ""]
    return out


def condition_tables(headline, baselines):
    out = []
    base = {(b["cond"], b["mtu"]): b["busy_cores"] for b in baselines or []}
    for c, m in conditions(headline):
        rows = rows_of(headline, c, m)
        size = next(iter(rows.values()))["size"]
        b = base.get((c, m))
        bs = f"; idle baseline {b:.2f} busy cores" if b is not None else ""
        out.append(f"### {c}, MTU {m} — {size // MiB} MiB float32{bs}\n")
        ref = rows.get("dlcp1")
        fl = rows.get("floor")
        out.append("| system | reps | p50 ms | p99 ms | max ms | algbw Gbit/s | CPU-s/GiB cgroup | machine (net) | "
                   "per process | p50 / floor | p99 peer/dlcp b1% | min delivered |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for s in ORDER:
            if s not in rows:
                continue
            h = rows[s]
            st, cp = h["stats"], h.get("cpu") or {}
            r99 = f"{st['p99'] / ref['stats']['p99']:.2f}" if ref and s not in ("dlcp1", "floor") else ""
            dl = h.get("min_delivered_ppm")
            dl = f"{dl / 1e4:.2f}%" if dl is not None else ("100% (TCP)" if s not in ("floor",) else "")
            fr = ratio(st["p50"], fl["stats"]["p50"]) if fl and s != "floor" else ""
            out.append(f"| {LABEL.get(s, s)} | {st['n']} | {ms(st['p50'])} | {ms(st['p99'])} | {ms(st['max'])} | "
                       f"{size * 8 / st['p50'] / 1e9:.2f} | {f1(cp.get('cgroup'))} | {f1(cp.get('machine'))} "
                       f"({f1(cp.get('net'))}) | {f1(cp.get('proc'))} | {fr} | {r99} | {dl} |")
        out.append("")
    return out


DROP_COLS = [("protocol_rx_dropped", "dlcpd: dropped on arrival"), ("early_dropped", "early dropped"),
             ("datapath_rx_truncated", "truncated"), ("datapath_rx_errors", "rx errors")]
KERNEL_COLS = [("udp_rcvbuf_errors", "kernel UDP RcvbufErrors"), ("udp_in_errors", "UDP InErrors"),
               ("eth0_rx_dropped", "eth0 rx dropped"), ("switch_queue_drops", "switch queue drops")]


def drops_section(headline):
    """Receive-side drops beside every dlcp (and floor) row: dlcpd's own counters (and any
    rcvbuf / overrun counter its stats carry), the kernel's per host namespace, the switch's."""
    rows = [h for h in headline if h["system"].startswith("dlcp") or h["system"] == "floor"]
    if not rows:
        return []
    extra = []
    for h in rows:
        for k in (h.get("drops") or {}):
            if k not in dict(DROP_COLS) and k != "repairs_sent" and k not in extra:
                extra.append(k)
    out = ["## Receive-side drops (summed over the 4 hosts, per run, warm-up included)\n",
           "dlcpd's counters come from `dlcpctl stats --json` of each daemon after the run; the kernel's from "
           "`/proc/net/snmp` and `/proc/net/dev` of each host namespace and the switch's pfifo queues "
           "(`tc -s qdisc`), read before and after. Switch queue drops are the emulated network's congestion "
           "loss, not the receiver's; the floor has no protocol counters, its `lost` is what never arrived.\n"]
    head = (["condition", "system", "repairs sent"] + [n for _, n in DROP_COLS] + extra
            + [n for _, n in KERNEL_COLS] + ["floor lost"])
    out.append("| " + " | ".join(head) + " |")
    out.append("|---|---|" + "---:|" * (len(head) - 2))
    for h in rows:
        d, k, f = h.get("drops") or {}, h.get("kernel") or {}, h.get("floor") or {}

        def cell(src, key):
            return str(src[key]) if key in src else "–"
        cells = [f"{h['cond']}, MTU {h.get('mtu', 1500)}", LABEL.get(h["system"], h["system"]),
                 cell(d, "repairs_sent")]
        cells += [cell(d, key) for key, _ in DROP_COLS] + [cell(d, key) for key in extra]
        cells += [cell(k, key) for key, _ in KERNEL_COLS] + [cell(f, "lost")]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    return out


def perf_section(headline):
    rows = [h for h in headline if h.get("perf")]
    if not rows:
        return []
    out = ["## perf profiles (clean runs)\n",
           "`perf record -a -g` of the whole machine within each run's timed region (from its start until the "
           "first rank ends, at least 1 s, at most `--perf` seconds); summaries "
           "(top symbols, kernel / user split per command) in the files below. Shares are of all samples on "
           "both CPUs.\n",
           "| condition | system | seconds | file | dlcpd kernel / user | trainer or rank kernel / user |",
           "|---|---|---:|---|---:|---:|"]
    for h in rows:
        p = h["perf"]
        sp = p.get("split", {})
        dl = sp.get("dlcpd")
        dls = f"{dl['k']:.1f}% / {dl['u']:.1f}%" if dl else "–"
        mine = [v for c, v in sp.items() if c in ("dlcp-bench", "python3", "python3.11")]
        tr = f"{sum(v['k'] for v in mine):.1f}% / {sum(v['u'] for v in mine):.1f}%" if mine else "–"
        out.append(f"| {h['cond']}, MTU {h.get('mtu', 1500)} | {LABEL.get(h['system'], h['system'])} | "
                   f"{p.get('seconds', 0):.1f} | [{p['file']}]({p['file']}) | {dls} | {tr} |")
    out.append("")
    return out


# Payload bytes per datagram at an MTU: dlcp's default chunk (100 bytes of header and tag) and
# the floor's (a 12-byte header); both in UDP over IPv4 (28 bytes).
def payload_bytes(system, mtu):
    return mtu - 28 - (12 if system == "floor" else 100)


def datagram_costs(headline):
    """CPU time per datagram of dlcp b1% and the floor in the clean runs, split by where perf
    saw their processes' samples: the system's CPU per GiB (cgroup) over the datagrams an
    allreduce of a GiB sends (2 (hosts - 1) GiB / payload: every host sends all but its own
    shard twice, reduce-scatter and all-gather), shared out by perf's categories."""
    out = []
    for c, m in conditions(headline):
        rows = rows_of(headline, c, m)
        have = [s for s in ("dlcp1", "floor") if s in rows and cpu(rows, s)
                and sum(((rows[s].get("perf") or {}).get("categories") or {}).values()) > 0]
        if c != "clean" or "dlcp1" not in have:
            continue
        if not out:
            out = ["## Where each microsecond per datagram goes (clean)\n",
                   "CPU µs per datagram = the system's CPU-s per GiB (cgroup: daemons and trainers, or the "
                   "floor's processes) ÷ the datagrams an allreduce of 1 GiB sends (2 × (hosts − 1) GiB ÷ "
                   "payload per datagram), split in the shares `perf` found in those processes' samples "
                   "(send and receive side together, the emulated switch's work where it ran in their "
                   "context). The difference is what dlcp costs beyond the bare socket datapath.\n"]
        hosts = rows["dlcp1"].get("hosts", 4)
        per = {}
        for s in have:
            dgrams = 2 * (hosts - 1) * (1 << 30) / payload_bytes(s, m)
            total = cpu(rows, s) * 1e6 / dgrams
            cats = rows[s]["perf"]["categories"]
            ours = sum(cats.values())
            per[s] = {"total": total, "dgrams": dgrams, **{k: total * v / ours for k, v in cats.items()}}
        cats = list(rows["dlcp1"]["perf"]["categories"])
        fl = "floor" in per
        out += [f"### MTU {m}: {payload_bytes('dlcp1', m)} B per dlcp datagram"
                + (f", {payload_bytes('floor', m)} B per floor datagram" if fl else "") + "\n",
                "| where | dlcp b1% µs | " + ("floor µs | dlcp − floor µs |" if fl else ""),
                "|---|---:|" + ("---:|---:|" if fl else "")]
        for k in ["total"] + cats:
            d = per["dlcp1"][k]
            cells = f"| {'**all**' if k == 'total' else k} | {d:.2f} |"
            if fl:
                f = per["floor"][k]
                cells += f" {f:.2f} | {d - f:+.2f} |"
            out.append(cells)
        out.append("")
    return out


def summary_table(headline):
    """Compact table: per condition and MTU, p50 / p99 of dlcp b1%, b0, the floor, Gloo and Open MPI."""
    cols = [s for s in ("dlcp1", "dlcp0", "floor", "gloo", "mpi") if any(h["system"] == s for h in headline)]
    out = ["| condition | MTU | size | " + " | ".join(f"{LABEL[s]} p50 / p99 ms" for s in cols)
           + " | p99 Gloo / dlcp b1% | p99 MPI / dlcp b1% |",
           "|---|---:|---:|" + "---:|" * len(cols) + "---:|---:|"]
    for c, m in conditions(headline):
        rows = rows_of(headline, c, m)
        size = next(iter(rows.values()))["size"]
        cells = []
        for s in cols:
            h = rows.get(s)
            cells.append(f"{ms(h['stats']['p50'])} / {ms(h['stats']['p99'])}" if h else "–")
        ratios = []
        for peer in ("gloo", "mpi"):
            if peer in rows and "dlcp1" in rows:
                ratios.append(f"{rows[peer]['stats']['p99'] / rows['dlcp1']['stats']['p99']:.2f}")
            else:
                ratios.append("–")
        out.append(f"| {c} | {m} | {size // MiB} MiB | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return "\n".join(out)
