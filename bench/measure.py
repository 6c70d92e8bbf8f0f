"""What bench/harness.py measures besides time: CPU per system (a cgroup v2
group per system) and machine-wide (/proc/stat, net of an idle baseline),
receive-side drop counters (dlcpd's own, the kernel's per host namespace, the
emulated switch's), and `perf` profiles. Parsing is kept apart from I/O so the
harness's --self-check can test it without root."""
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time

CGROUP_ENV = "DLCP_BENCH_CGROUP_CPU_STAT"  # read by window.rs and peer.py
STARTED_ENV = "DLCP_BENCH_STARTED"  # a file the ranks create when their timed region starts (+ ".end": ends)
USER_HZ = 100
MIN_PERF_S = 1.0


# ---------------------------------------------------------------- cgroups
def parse_mounts(text):
    """The mount point of the cgroup v2 hierarchy in /proc/mounts text, or None."""
    for line in text.splitlines():
        w = line.split()
        if len(w) >= 3 and w[2] == "cgroup2":
            return w[1]
    return None


def parse_cpu_stat(text):
    """usage_usec of a cgroup v2 cpu.stat text, or None."""
    for line in text.splitlines():
        if line.startswith("usage_usec "):
            return int(line.split()[1])
    return None


def cg_wrap(procs_file, args):
    """args run by a shell that first moves itself into the group (then execs: same pid,
    so everything the command starts is in the group too)."""
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs_file] + list(args)


class Cgroups:
    """One cgroup v2 group per system under <mount>/dlcp-bench-<prefix>; cleanup() removes
    them (ending, through cgroup.kill, only processes this harness put there)."""

    def __init__(self, prefix, log):
        self.log = log
        self.groups = {}
        self.root = None
        try:
            with open("/proc/mounts") as f:
                mount = parse_mounts(f.read())
        except OSError:
            mount = None
        self.reason = "no cgroup v2 hierarchy mounted" if not mount else ""
        if mount:
            self.root = os.path.join(mount, f"dlcp-bench-{prefix}")
            try:
                self.cleanup()  # leftovers of a run that was killed
                os.makedirs(self.root, exist_ok=True)
            except OSError as e:
                self.reason = f"cannot create {self.root}: {e}"
                self.root = None

    @property
    def available(self):
        return self.root is not None

    def group(self, name):
        """The group's directory (created on first use), or None."""
        if not self.root:
            return None
        if name not in self.groups:
            path = os.path.join(self.root, name)
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as e:
                self.log(f"cgroup {path}: {e}")
                return None
            self.groups[name] = path
        return self.groups[name]

    def wrap(self, name, args):
        g = self.group(name)
        return cg_wrap(os.path.join(g, "cgroup.procs"), args) if g else list(args)

    def env(self, name, base=None):
        """Environment naming the group's cpu.stat by a path readable inside a network
        namespace (`ip netns exec` remounts /sys; /proc/<our pid>/root still sees ours)."""
        env = dict(base if base is not None else os.environ)
        g = self.group(name)
        if g:
            env[CGROUP_ENV] = f"/proc/{os.getpid()}/root{g}/cpu.stat"
        return env

    def cleanup(self):
        if not self.root or not os.path.isdir(self.root):
            return
        for d in sorted(os.listdir(self.root)):
            path = os.path.join(self.root, d)
            if not os.path.isdir(path):
                continue
            for _ in range(50):
                try:
                    with open(os.path.join(path, "cgroup.procs")) as f:
                        if not f.read().strip():
                            break
                    with open(os.path.join(path, "cgroup.kill"), "w") as f:
                        f.write("1")
                except OSError:
                    break
                time.sleep(0.1)
            try:
                os.rmdir(path)
            except OSError as e:
                self.log(f"cgroup {path} not removed: {e}")
        try:
            os.rmdir(self.root)
        except OSError as e:
            self.log(f"cgroup {self.root} not removed: {e}")
        self.groups = {}


# ---------------------------------------------------------------- machine CPU
def parse_proc_stat(text):
    """(busy, total) jiffies of the aggregate cpu line (busy = user nice system irq softirq steal)."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            v = [int(x) for x in line.split()[1:]] + [0] * 10
            busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
            return busy, busy + v[3] + v[4]
    return None


def machine_busy():
    with open("/proc/stat") as f:
        return parse_proc_stat(f.read())


def idle_baseline(seconds):
    """Busy cores of the machine while this benchmark runs nothing (other load included)."""
    a = machine_busy()
    t0 = time.time()
    time.sleep(seconds)
    b = machine_busy()
    return (b[0] - a[0]) / USER_HZ / (time.time() - t0)


def window_cpu(per_rank):
    """CPU over the union of the ranks' timed regions (windows printed by window.rs /
    peer.py): wall seconds, the system cgroup's CPU seconds, the machine's busy CPU
    seconds. Counters are cumulative, so latest end minus earliest start."""
    ws = [r["window"] for r in per_rank if r.get("window")]
    if not ws:
        return {}
    out = {"wall_s": max(w["t1"] for w in ws) - min(w["t0"] for w in ws)}
    if all(w.get("cg0") is not None and w.get("cg1") is not None for w in ws):
        out["cgroup_s"] = (max(w["cg1"] for w in ws) - min(w["cg0"] for w in ws)) / 1e6
    if all(w.get("busy0") is not None and w.get("busy1") is not None for w in ws):
        out["machine_s"] = (max(w["busy1"] for w in ws) - min(w["busy0"] for w in ws)) / USER_HZ
    return out


# ---------------------------------------------------------------- drop counters
def parse_snmp_udp(text):
    """The Udp: fields of /proc/net/snmp as a dict."""
    rows = [line.split() for line in text.splitlines() if line.startswith("Udp:")]
    if len(rows) < 2:
        return {}
    return {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:])}


def parse_netdev_rx_dropped(text, dev="eth0"):
    """rx drop count of `dev` in /proc/net/dev text."""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == dev:
            return int(rest.split()[3])
    return 0


def parse_netdev_drops(text, devs=None):
    """(rx dropped, tx dropped) summed over the devices of /proc/net/dev text (all but lo,
    or those named in `devs`)."""
    rx = tx = 0
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        name = name.strip()
        if not sep or name == "lo" or (devs is not None and name not in devs):
            continue
        w = rest.split()
        if len(w) >= 12:
            rx += int(w[3])
            tx += int(w[11])
    return rx, tx


def parse_softnet_drops(text):
    """Packets the kernel dropped because a CPU's input backlog was full
    (net.core.netdev_max_backlog), summed over CPUs: /proc/net/softnet_stat, second column
    (hex). Machine-wide: veth hands every packet to the receiving side through this backlog."""
    total = 0
    for line in text.splitlines():
        w = line.split()
        if len(w) >= 2:
            total += int(w[1], 16)
    return total


def parse_qdisc_drops(text):
    """Packets dropped by the pfifo leaves in `tc -s qdisc show` text (the switch's queues;
    the htb root repeats its leaves' drops, so only leaves are summed)."""
    total, leaf = 0, False
    for line in text.splitlines():
        w = line.split()
        if w[:1] == ["qdisc"]:
            leaf = len(w) > 1 and w[1] == "pfifo"
        elif leaf and w[:1] == ["Sent"] and "(dropped" in w:
            total += int(w[w.index("(dropped") + 1].rstrip(","))
    return total


class KernelCounters:
    """Receive-side drop counters of the testbed's kernel, summed over host namespaces:
    UDP RcvbufErrors / InErrors (/proc/net/snmp, per namespace), eth0 rx drops, and the
    emulated switch's queue drops (every port of the switch, or of the leaves and spines of
    a fabric; network loss, not receive side)."""

    def __init__(self, bed, sh):
        self.bed = bed
        self.sh = sh

    def snapshot(self):
        s = {"udp_rcvbuf_errors": 0, "udp_in_errors": 0, "eth0_rx_dropped": 0, "eth0_tx_dropped": 0,
             "switch_queue_drops": 0, "switch_dev_dropped": 0}
        # Drops no socket or queue counter sees: a CPU's input backlog full (veth delivers
        # through it; machine-wide), a switch port's device dropping (rx or tx).
        try:
            with open("/proc/net/softnet_stat") as f:
                s["backlog_drops"] = parse_softnet_drops(f.read())
        except OSError:
            s["backlog_drops"] = 0
        for h in range(self.bed.hosts):
            ns = ["ip", "netns", "exec", self.bed.ns(h)]
            u = parse_snmp_udp(self.sh(ns + ["cat", "/proc/net/snmp"], check=False).stdout)
            s["udp_rcvbuf_errors"] += u.get("RcvbufErrors", 0)
            s["udp_in_errors"] += u.get("InErrors", 0)
            dev = self.sh(ns + ["cat", "/proc/net/dev"], check=False).stdout
            s["eth0_rx_dropped"] += parse_netdev_rx_dropped(dev)
            s["eth0_tx_dropped"] += parse_netdev_drops(dev, {"eth0"})[1]
        ports = getattr(self.bed, "switch_ports", None)
        ports = ports() if ports else [(f"{self.bed.prefix}-sw", f"p{h}") for h in range(self.bed.hosts)]
        for ns, dev in ports:
            r = self.sh(["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev], check=False)
            s["switch_queue_drops"] += parse_qdisc_drops(r.stdout)
        for ns in sorted({ns for ns, _ in ports}):
            text = self.sh(["ip", "netns", "exec", ns, "cat", "/proc/net/dev"], check=False).stdout
            s["switch_dev_dropped"] += sum(parse_netdev_drops(text))
        return s

    @staticmethod
    def delta(a, b):
        return {k: b[k] - a.get(k, 0) for k in b}


# dlcpctl stats --json: counters of datagrams a daemon received and dropped, by path.
# Keys added later (kernel RcvbufErrors, ring overruns) are found by name (DISCOVER).
DROP_PATHS = {
    "protocol_rx_dropped": [("protocol", "rx_dropped_packets_per_class"), ("protocol", "rx_dropped_unknown_class", "packets")],
    "early_dropped": [("protocol", "rejected", "early_dropped")],
    "datapath_rx_truncated": [("datapath_counters", "rx_truncated")],
    "datapath_rx_errors": [("datapath_counters", "rx_errors")],
    "repairs_sent": [("protocol", "repairs_sent")],
    # Not drops: how transfers ended, beside them (a lossless run that closes
    # within budget shows here).
    "deadline_nacks": [("protocol", "deadline_nacks")],
    "deadline_closes": [("protocol", "deadline_closes")],
    "quiet_nacks": [("protocol", "quiet_nacks")],
    "closed_within_budget": [("protocol", "closed_within_budget")],
}
DISCOVER = ("rcvbuf", "overrun", "ring_full", "ring_drop")


def at_path(obj, path):
    """The value at `path` (keys) in nested dicts, or None where a key is missing."""
    for k in path:
        if not isinstance(obj, dict) or k not in obj:
            return None
        obj = obj[k]
    return obj


def as_number(v):
    """A counter's value: a number, or the sum of a list of numbers (per class); None otherwise."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return sum(v)
    return None


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, path + (str(k),))
    else:
        yield path, obj


def daemon_drops(stats):
    """Named drop counters of one `dlcpctl stats --json` document; a counter whose keys are
    absent is left out (never an error). Keys naming rcvbuf / overrun counters anywhere are
    picked up as they appear (`kernel.RcvbufErrors` -> 'kernel.RcvbufErrors')."""
    out = {}
    for name, paths in DROP_PATHS.items():
        vals = [as_number(at_path(stats, p)) for p in paths]
        vals = [v for v in vals if v is not None]
        if vals:
            out[name] = sum(vals)
    for path, v in _leaves(stats):
        key = ".".join(path)
        if any(d in key.lower() for d in DISCOVER) and as_number(v) is not None:
            out[key] = as_number(v)
    return out


def sum_counters(dicts):
    out = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


# ---------------------------------------------------------------- perf
def parse_perf_report(text):
    """Rows of `perf report --no-children --sort comm,dso,symbol --stdio -g none -t TAB`:
    (percent, comm, dso, 'k' or 'u', symbol). Fields are tab-separated because commands
    ('opt cgu.0') and symbols hold spaces."""
    rows = []
    for line in text.splitlines():
        f = [x.strip() for x in line.split("\t")]
        if len(f) < 4 or line.startswith("#") or not f[0].endswith("%"):
            continue
        try:
            pct = float(f[0].rstrip("%"))
        except ValueError:
            continue
        mark, _, sym = f[3].partition(" ")
        if mark not in ("[k]", "[.]"):
            continue
        rows.append((pct, f[1], f[2], "k" if mark == "[k]" else "u", sym.strip()))
    return rows


# The commands of dlcp's daemons and trainers and of the floor: the samples perf_categories sorts
# (softirq work the kernel ran in other contexts, ksoftirqd or idle, is not among them).
OURS = ("dlcpd", "dlcp-bench")

# Where a system's own samples go: (category, test on (dso, mode, symbol)), first match wins.
PERF_CATEGORIES = [
    ("kernel: copies to and from user space",
     lambda dso, mode, sym: mode == "k" and re.match(r"(_copy_(from|to)_(iter|user)|copy_user|rep_movs|"
                                                     r"copyout|copyin|__check_object_size|check_heap_object)", sym)),
    ("kernel: page faults and page clearing",
     lambda dso, mode, sym: mode == "k" and re.match(r"(exc_page_fault|clear_page|do_anonymous_page|"
                                                     r"handle_mm_fault|__handle_mm_fault)", sym)),
    ("kernel: network stack, switch, scheduler and the rest", lambda dso, mode, sym: mode == "k"),
    ("MAC (AES-GCM, aws-lc)", lambda dso, mode, sym: re.search(r"aws_lc|gcm|aes_|ghash", sym, re.I)),
    ("user copies (memcpy / memmove / memset)", lambda dso, mode, sym: re.match(r"_*mem(move|cpy|set)", sym)),
    ("protocol (dlcp_proto: ops, transfers, sums, timers)", lambda dso, mode, sym: "dlcp_proto::" in sym),
    ("daemon datapath (batching, GSO/GRO, syscalls)", lambda dso, mode, sym: "datapath::" in sym),
    ("other user space (service, trainer, floor, libc)", lambda dso, mode, sym: True),
]


def perf_categories(rows, comms):
    """Percent of all samples per PERF_CATEGORIES category, over the rows of `comms`."""
    out = {name: 0.0 for name, _ in PERF_CATEGORIES}
    for pct, comm, dso, mode, sym in rows:
        if comm not in comms:
            continue
        name = next(n for n, test in PERF_CATEGORIES if test(dso, mode, sym))
        out[name] += pct
    return out


def perf_split(rows):
    """Per comm: percent of all samples in kernel and in user space."""
    out = {}
    for pct, comm, _, mode, _ in rows:
        d = out.setdefault(comm, {"k": 0.0, "u": 0.0})
        d[mode] += pct
    return out


class Profiler:
    """`perf record -a -g` during a run's timed region (from when the first rank says it
    started until the first says it ended, at most `seconds`), summarised to a text file
    ready to commit beside the results."""

    def __init__(self, outdir, base, seconds, workdir, log, sh):
        self.outdir, self.base, self.seconds, self.workdir, self.log, self.sh = (
            outdir, base, seconds, workdir, log, sh)
        self.enabled = seconds > 0 and shutil.which("perf") is not None
        self.files = []
        self.active = []

    def started_file(self, tag):
        return os.path.join(self.workdir, f"started-{tag}")

    def start(self, tag, what):
        """Begins watching for the run's start; returns a handle for finish()."""
        h = {"tag": tag, "what": what, "proc": None, "stop": threading.Event(), "data": os.path.join(
            self.workdir, f"perf-{tag}.data"), "t0": None}
        flag = self.started_file(tag)

        def watch():
            while not h["stop"].is_set():
                if h["proc"] is None and os.path.exists(flag):
                    h["t0"] = time.time()
                    h["proc"] = subprocess.Popen(
                        ["perf", "record", "-a", "-g", "-q", "-o", h["data"], "--", "sleep", str(self.seconds)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                # Stop when the first rank's region ended, but record at least MIN_PERF_S
                # (perf needs a moment to start; a short region would leave no samples).
                if h["proc"] is not None and (h["proc"].poll() is not None or (
                        os.path.exists(flag + ".end") and time.time() - h["t0"] >= MIN_PERF_S)):
                    if h["proc"].poll() is None:
                        h["proc"].send_signal(signal.SIGINT)
                    return
                time.sleep(0.01)

        h["thread"] = threading.Thread(target=watch, daemon=True)
        h["thread"].start()
        self.active.append(h)
        return h

    def cleanup(self):
        """Stops any recording still running (a run that failed or was interrupted)."""
        for h in self.active:
            h["stop"].set()
            h["thread"].join(timeout=1)
            p = h["proc"]
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.active = []

    def finish(self, h):
        """Stops the recording (if the run ended first) and writes the summary; returns
        {'file', 'seconds', 'split'} or None."""
        h["stop"].set()
        h["thread"].join()
        if h in self.active:
            self.active.remove(h)
        p = h["proc"]
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        secs = time.time() - h["t0"]
        r = self.sh(["perf", "report", "-i", h["data"], "--no-children", "--sort", "comm,dso,symbol", "--stdio",
                     "-g", "none", "--percent-limit", "0.01", "-t", "\t"], check=False, timeout=600)
        try:
            if os.environ.get("DLCP_BENCH_KEEP_PERF") == "1":
                # Call graphs stay readable: `perf report -i FILE -g caller -S SYMBOL`.
                keep = os.path.join("/var/tmp/dlcp-bench-perf", f"{self.base}-{h['tag']}.data")
                os.makedirs(os.path.dirname(keep), exist_ok=True)
                shutil.move(h["data"], keep)
                self.log(f"  perf: data kept in {keep}")
            else:
                os.unlink(h["data"])
        except OSError:
            pass
        rows = parse_perf_report(r.stdout)
        if not rows:
            self.log(f"  perf: no samples parsed for {h['tag']} ({r.stderr.strip()[-200:]})")
            return None
        split = perf_split(rows)
        cats = perf_categories(rows, OURS)
        fn = f"{self.base}-perf-{h['tag']}.txt"
        with open(os.path.join(self.outdir, fn), "w") as f:
            f.write(perf_summary(h["what"], secs, rows, split, cats))
        self.files.append(fn)
        return {"file": fn, "seconds": secs, "split": split, "categories": cats}


def perf_summary(what, secs, rows, split, cats=None, top=40):
    lines = [f"# perf profile: {what}",
             f"# perf record -a -g for {secs:.1f} s within the timed region (whole machine: both CPUs,",
             "# every process, softirq and the emulated switch included);",
             "# perf report --no-children --sort comm,dso,symbol --stdio -g none -t TAB (rows >= 0.01%)",
             "",
             "## share of all samples per command (kernel / user)",
             ""]
    for comm, d in sorted(split.items(), key=lambda x: -(x[1]["k"] + x[1]["u"]))[:12]:
        lines.append(f"{comm:<20} {d['k'] + d['u']:6.2f}%   kernel {d['k']:6.2f}%   user {d['u']:6.2f}%")
    ours = sum(cats.values()) if cats else 0.0
    if ours > 0:
        lines += ["", f"## where the samples of {' and '.join(OURS)} go (% of all samples; % of theirs)", ""]
        for name, pct in cats.items():
            lines.append(f"{pct:6.2f}%  {100 * pct / ours:5.1f}%  {name}")
    lines += ["", f"## top {top} symbols", ""]
    for pct, comm, dso, mode, sym in rows[:top]:
        lines.append(f"{pct:6.2f}%  {comm:<16} {dso:<28} [{mode}] {sym}")
    return "\n".join(lines) + "\n"


def dlcpd_config(bindir, cfg_path, sh):
    """`dlcpd check-config`: the effective configuration (defaults filled in, secret redacted)."""
    r = sh([os.path.join(bindir, "dlcpd"), "check-config", cfg_path], check=False)
    return r.stdout if r.returncode == 0 else f"(check-config failed: {r.stderr.strip()})"


def load_json(text):
    try:
        return json.loads(text)
    except ValueError:
        return {}
