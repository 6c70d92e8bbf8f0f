#!/usr/bin/env python3
"""Where and when the slow port drops (issue 16): the flow step's slow-port condition of
bench/harness.py, one system, with the switch port towards host 0 sampled while it runs.

8 emulated hosts (scripts/testbed.sh), host 0's switch port at --rate Mbit/s (the others
unshaped), dlcpd's default configuration, a 64 MiB allreduce with budget 1% for --reps
reps after one warm-up. Every --sample-ms the port's htb classes are read (`tc -s class
show`), and the run prints:

  - per-op times (the slowest rank's);
  - per priority class, the datagrams the port sent and dropped, and the total drop
    share (dropped / (sent + dropped): every packet into the port, dlcp's and the
    control's);
  - a timeline: each sample in which the port dropped, with what it sent and dropped
    per class since the previous one;
  - flow-control and repair counters of daemons 0 (behind the slow port) and 1.

Slower than the harness row (the sampler costs CPU on a 2-core machine), and one run
varies a lot (2026-12-04: 0.18% to 1.29% for the same binary): compare binaries with
several runs each, alternated (--bindir). Experiments only: not part of bench/run.sh.

    sudo python3 bench/slow_port.py [--rate 500] [--reps 5] [--bindir target/release]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness as H  # noqa: E402
import measure  # noqa: E402

CLASS_LINE = re.compile(r"class htb 1:1(\d) ")
SENT_LINE = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+)")


def parse_classes(text):
    """{class: (sent packets, dropped)} of the leaf classes 1:10 .. 1:17 in `tc -s class show`.

    `testbed.sh counters` (Testbed.counters) reports the same per-class pairs, but for every
    port, spine and host at once, from a bash script: too much CPU to run every 20 ms on two
    cores during the measurement. One `tc` call on one port, parsed here, is the sampler."""
    out, cur = {}, None
    for line in text.splitlines():
        m = CLASS_LINE.match(line)
        if m:
            cur = int(m.group(1))
            continue
        m = SENT_LINE.search(line)
        if m and cur is not None:
            out[cur] = (int(m.group(2)), int(m.group(3)))
            cur = None
    return out


def flow_counters(doc):
    """The non-zero flow, repair and deadline counters of one `dlcpctl stats --json`."""
    flat = {}

    def walk(x, p=""):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{p}.{k}" if p else k)
        elif isinstance(x, (int, float)) and x and any(s in p for s in ("flow", "repair", "deadline", "early")):
            flat[p] = x
    walk(doc)
    return flat


def self_check():
    text = ("class htb 1:12 parent 1:1 leaf 22: prio 5 rate 5Mbit\n"
            " Sent 1500 bytes 10 pkt (dropped 3, overlimits 0 requeues 0)\n"
            "class htb 1:1 root rate 500Mbit\n Sent 9 bytes 9 pkt (dropped 0, overlimits 0 requeues 0)\n")
    assert parse_classes(text) == {2: (10, 3)}, parse_classes(text)
    assert flow_counters({"protocol": {"flow": {"window_cuts": 4, "grants_sent": 0}, "probes": 2}}) == \
        {"protocol.flow.window_cuts": 4}
    print("slow_port self-check ok")


def main():
    if sys.argv[1:] == ["--self-check"]:
        self_check()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=H.FLOW_SLOW_MBPS, help="host 0's port, Mbit/s [%(default)s]")
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--sample-ms", type=int, default=20)
    ap.add_argument("--extra", default="",
                    help="TOML appended to every daemon's config (a variant's settings, e.g. "
                         "'[datapath.socket]\\ngso = false'; \\n is a newline)")
    ap.add_argument("--bindir", default=os.path.join(H.ROOT, "target", "release"))
    ap.add_argument("--prefix", default="slowp", help="testbed namespace prefix [%(default)s]")
    a = ap.parse_args()

    def on_signal(sig, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_signal)

    bed = H.Testbed(a.prefix)
    wd = tempfile.mkdtemp(prefix="dlcp-slowport-")
    runner = H.Runner(bed, a.bindir, wd, measure.Cgroups(a.prefix, H.log),
                      measure.Profiler(wd, "slowport", 0.0, wd, H.log, H.sh))
    plain = H.Runner.daemon_stats

    # Runner.daemon_stats reads every daemon's stats before they stop and returns only
    # drop counters, summed: read daemons 0 and 1 once more here, just before it.
    def daemon_stats(self, socks):
        ctl = os.path.join(self.bindir, "dlcpctl")
        for i, s in enumerate(socks[:2]):
            doc = measure.load_json(H.sh([ctl, "--socket", s, "stats", "--json"], check=False).stdout) or {}
            print(f"daemon {i}: {json.dumps(flow_counters(doc), sort_keys=True)}", flush=True)
        return plain(self, socks)
    runner.daemon_stats = daemon_stats.__get__(runner)

    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            r = subprocess.run(["ip", "netns", "exec", f"{a.prefix}-sw", "tc", "-s", "class", "show", "dev", "p0"],
                               capture_output=True, text=True)
            samples.append((time.time(), parse_classes(r.stdout)))
            stop.wait(a.sample_ms / 1000)

    bed.up(a.hosts, rate=a.rate, rate_ports="0")
    try:
        th = threading.Thread(target=sample, daemon=True)
        t0 = time.time()
        th.start()
        r = runner.run("dlcp1", a.hosts, a.reps, 1, sizes=[a.mib * H.MiB], extra=a.extra.replace("\\n", "\n") + "\n")
        stop.set()
        th.join()
        print("op times ms:", [round(t * 1000) for t in r["results"][0]["times"]])
        print("daemon drop counters (summed):", {k: v for k, v in (r.get("drops") or {}).items() if v})
        last = samples[-1][1] if samples else {}
        print("port 0 per class (sent packets, dropped):", dict(sorted(last.items())))
        dropped = sum(v[1] for v in last.values())
        sent = sum(v[0] for v in last.values())
        print(f"port 0: {dropped} dropped of {sent + dropped} ({100 * dropped / max(1, sent + dropped):.3f}%)")
        print("timeline (samples with drops): seconds from start, sent, dropped per class")
        prev = None
        for t, d in samples:
            if prev is not None:
                inc = {c: d.get(c, (0, 0))[1] - prev.get(c, (0, 0))[1] for c in d}
                inc = {c: v for c, v in inc.items() if v}
                if inc:
                    sent = sum(d.get(c, (0, 0))[0] - prev.get(c, (0, 0))[0] for c in d)
                    print(f"  {t - t0:7.2f}  {sent:5d}  {inc}")
            prev = d
    finally:
        stop.set()
        bed.down()


if __name__ == "__main__":
    main()
