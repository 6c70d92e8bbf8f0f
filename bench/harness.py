#!/usr/bin/python3
"""dlcp benchmark harness: runs everything bench/run.sh promises on the emulated
cluster of scripts/testbed.sh and writes bench/results/<date>-<host>.md + PNGs.

Systems, all over the same namespaces, veths (offloads off), switch qdiscs:
  dlcp1        dlcpd (socket datapath, default config) + dlcp-bench trainer (Rust client), budget 1%
  dlcp0        the same, budget 0 (reliable, bit-exact, like Gloo)
  dlcp1-paced  budget 1% with [pacing] rate_mbps = 3000: the one tuned setting the bench
               used before; a separately labelled row, never the headline
  dlcp1-noauth / dlcp1-noflow  budget 1% without the MAC / without flow control: labelled
               rows that show what each costs and buys
  dlcp1-path1  budget 1% with [network] paths = 1 (one 5-tuple per peer pair, no spraying):
               what the default 16 paths cost on a one-link star
  gloo         torch.distributed Gloo (bench/peer.py), GLOO_SOCKET_IFNAME=eth0
  mpi          Open MPI MPI_Allreduce via mpi4py (bench/peer.py), TCP BTL on eth0
  floor        dlcp-bench floor: the same bytes over bare sendmmsg/recvmmsg (GSO/GRO), summed;
               no protocol, MAC or repair (clean network only)
TCP peers run under a congestion control set per host namespace (cubic or bbr).
Each system's processes (daemons and trainers) run in one cgroup v2 group; CPU per
GiB comes from it and from /proc/stat net of an idle baseline (bench/measure.py).

Every run prints progress to stderr; summary lines `NAME: dlcp X, peer Y, ratio R`
to stdout. Teardown (processes, testbed, cgroups, sysctl) happens in `finally`
blocks; run.sh adds a trap on top.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import measure
import report_headline
import spine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTBED = os.path.join(ROOT, "scripts", "testbed.sh")
PEER = os.path.join(ROOT, "bench", "peer.py")
PY = "/usr/bin/python3"
MiB = 1 << 20
JOB = 7
PORT = 7702
FLOOR_PORT = 7703
# The bench runs dlcpd's defaults. The one tuned setting it used before (pacing each
# daemon at 3 Gbit/s: before PROBEs stopped overtaking their data, four unpaced daemons
# on two cores overran the veths' receive path) is now a separately labelled row.
PACED_MBPS = 3000
DLCP_PACED = f"[pacing]\nrate_mbps = {PACED_MBPS}\n"
# The same dlcpd without the per-packet MAC: the MAC's share of dlcp's CPU per GiB
# is CPU/GiB with it minus CPU/GiB without it, in the same run (issue 14).
DLCP_NOAUTH = "[security]\npacket_auth = \"none\"\n"
# The flow step's slow port (issue 16: one port at about a third of what the others carry).
FLOW_SLOW_MBPS = 500
# The same dlcpd without flow control (the window's drops and cost, issue 16).
DLCP_NOFLOW = "flow_window_bytes = 0\n"
# One path (one 5-tuple per peer pair, as before spraying): what 16-path spraying costs on one link.
DLCP_PATH1 = "paths = 1\n"
# dlcpd's default [shm] max_tensor_bytes / arena_bytes: a bigger workload must raise them.
SHM_DEFAULT_MAX_TENSOR = 64 * MiB
SHM_DEFAULT_ARENA = 256 * MiB
T_START = time.time()
CC_SAVE = "/run/dlcp-bench-allowed-cc"


def log(msg):
    sys.stderr.write(f"[bench {time.time() - T_START:6.0f}s] {msg}\n")
    sys.stderr.flush()


def sh(args, check=True, **kw):
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return r


class Testbed:
    """scripts/testbed.sh under our prefix; down() is safe to call twice."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.hosts = 0
        self.spines = 0
        self.mtu = 1500
        self.env = dict(os.environ, DLCPTB_PREFIX=prefix)

    def ns(self, h):
        return f"{self.prefix}-h{h}"

    def up(self, hosts, loss=None, rate=None, rate_ports=None, mtu=None, spines=None, spine_rate=None,
           host_gro=False):
        """spines: a leaf-spine fabric of 2 leaves and that many spines (links at spine_rate
        Mbit/s) instead of the one switch; host_gro: GRO on the hosts' own ends (--host-gro)."""
        args = [TESTBED, "up", "--hosts", str(hosts)]
        if loss:
            args += ["--loss", str(loss)]
        if rate:
            args += ["--rate", str(rate)]
        if rate_ports is not None:
            args += ["--rate-ports", rate_ports]
        if mtu:
            args += ["--mtu", str(mtu)]
        if spines:
            args += ["--spines", str(spines)]
            if spine_rate:
                args += ["--spine-rate", str(spine_rate)]
        if host_gro:
            args += ["--host-gro"]
        sh(args, env=self.env)
        self.hosts = hosts
        self.spines = spines or 0
        self.mtu = mtu or 1500
        self.desc = (f"{hosts} hosts, MTU {self.mtu}, loss {loss or 0}%, rate {rate or 'none'} Mbit/s on ports "
                     f"{rate_ports or 'all'}")
        if spines:
            self.desc += f", 2 leaves x {spines} spines at {spine_rate or 10000} Mbit/s"
        if host_gro:
            self.desc += ", GRO on the hosts' own ends"

    def down(self):
        sh([TESTBED, "down"], check=False, env=self.env)
        self.hosts = 0
        self.spines = 0

    def switch_ports(self):
        """(namespace, device) of every switch port whose egress queues can drop."""
        if not self.spines:
            return [(f"{self.prefix}-sw", f"p{h}") for h in range(self.hosts)]
        ports = [(f"{self.prefix}-leaf{h % 2}", f"p{h}") for h in range(self.hosts)]
        for s in range(self.spines):
            ports += [(f"{self.prefix}-leaf{lf}", f"s{s}") for lf in range(2)]
            ports += [(f"{self.prefix}-spine{s}", f"l{lf}") for lf in range(2)]
        return ports

    def link(self, spine, rate=None, loss=None):
        """testbed.sh link spine<S>: rate (Mbit/s or 'none') and/or loss (%) of its links."""
        args = [TESTBED, "link", f"spine{spine}"]
        if rate is not None:
            args += ["--rate", str(rate)]
        if loss is not None:
            args += ["--loss", str(loss)]
        sh(args, env=self.env)

    def pin(self, spine, proto="tcp"):
        """testbed.sh pin: every `proto` packet into the fabric through spine<S> (None: clear)."""
        sh([TESTBED, "pin"] + ([f"spine{spine}", "--proto", proto] if spine is not None else ["--clear"]),
           env=self.env)

    def counters(self):
        """testbed.sh counters, parsed (spines, every switch port, hosts' loss counters)."""
        return json.loads(sh([TESTBED, "counters"], env=self.env).stdout)

    def spine_counters(self):
        """The spines' nftables counters alone, cheaply (one nft per spine; the sampler's
        read): [{counter name: (packets, bytes)}] per spine."""
        out = []
        for s in range(self.spines):
            r = sh(["ip", "netns", "exec", f"{self.prefix}-spine{s}", "nft", "list", "counters", "table", "inet",
                    self.prefix], check=False)
            out.append(parse_nft_counters(r.stdout))
        return out

    def set_cc(self, cc):
        for h in range(self.hosts):
            sh(["ip", "netns", "exec", self.ns(h), "sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={cc}"])

    def loss_counters(self):
        seen = dropped = 0
        for h in range(self.hosts):
            for name in ("seen", "dropped"):
                r = sh(["ip", "netns", "exec", self.ns(h), "nft", "list", "counter", "inet", self.prefix, name],
                       check=False)
                w = r.stdout.split()
                if "packets" in w:
                    v = int(w[w.index("packets") + 1])
                    if name == "seen":
                        seen += v
                    else:
                        dropped += v
        return seen, dropped


def parse_nft_counters(text):
    """{name: (packets, bytes)} from `nft list counters` text."""
    out, name = {}, None
    for line in text.splitlines():
        w = line.split()
        if len(w) >= 2 and w[0] == "counter":
            name = w[1]
        elif len(w) >= 4 and w[0] == "packets" and name:
            out[name] = (int(w[1]), int(w[3]))
    return out


def proc_cpu(pid):
    """CPU seconds (user+system) of a process, from /proc (USER_HZ = 100)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / 100.0
    except (OSError, IndexError, ValueError):
        return 0.0


def wait_all(procs, timeout, what, grace=0.0):
    """Wait for every Popen; kill them all if the deadline passes. Returns stdouts.

    When one exits non-zero, the others get up to `grace` seconds to end by
    themselves (a dlcp trainer whose peer failed fails too, within its op
    timeout, saying what it waited on) before they are killed; the error
    names every process that failed, by its index, with its stderr's tail."""
    deadline = time.time() + timeout
    outs = []
    for i, p in enumerate(procs):
        left = max(0.1, deadline - time.time())
        try:
            out, err = p.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"{what}: timed out after {timeout} s")
        if p.returncode != 0:
            failed = [f"[{i}] exit {p.returncode}: {err.strip()[-1500:]}"]
            end = time.time() + grace
            for j, q in enumerate(procs):
                if j <= i:
                    continue
                try:
                    _, qerr = q.communicate(timeout=max(0.1, end - time.time()))
                except subprocess.TimeoutExpired:
                    q.kill()
                    _, qerr = q.communicate()
                    failed.append(f"[{j}] still running after {grace:.0f} s, killed")
                    continue
                if q.returncode != 0:
                    failed.append(f"[{j}] exit {q.returncode}: {(qerr or '').strip()[-1500:]}")
            raise RuntimeError(f"{what}: " + "; ".join(failed))
        outs.append(out)
    return outs


def parse_json_lines(outs):
    res = []
    for o in outs:
        for line in o.splitlines():
            line = line.strip()
            if line.startswith("{"):
                res.append(json.loads(line))
    return res


def combine(system, per_rank, extra_cpu=0.0):
    """Per-rep time = the slowest rank's; CPU = the sum over ranks (+ daemons)."""
    n_ops = len(per_rank[0]["results"])
    results = []
    for k in range(n_ops):
        rs = [r["results"][k] for r in per_rank]
        times = [max(x) for x in zip(*[r["times"] for r in rs])]
        item = {"elems": rs[0]["elems"], "times": times}
        if "front" in rs[0]:
            item["front"] = [max(x) for x in zip(*[r["front"] for r in rs])]
        results.append(item)
    cpu = sum(r["cpu_s"] for r in per_rank) + extra_cpu
    out = {"system": system, "results": results, "cpu_s": cpu, "cpu": measure.window_cpu(per_rank)}
    ws = [r["window"] for r in per_rank if r.get("window")]
    if ws:  # wall clock of the ranks' timed regions (warm-up included): earliest start, latest end
        out["window_t"] = [min(w["t0"] for w in ws), max(w["t1"] for w in ws)]
    if "min_delivered_ppm" in per_rank[0]:
        out["min_delivered_ppm"] = min(r["min_delivered_ppm"] for r in per_rank)
        out["repairs"] = sum(r["repairs"] for r in per_rank)
    if "lost" in per_rank[0]:
        out["floor"] = {k: sum(r.get(k, 0) for r in per_rank)
                        for k in ("lost", "stale", "malformed", "tx_datagrams", "tx_calls", "rx_datagrams", "rx_calls")}
        out["floor"].update({k: per_rank[0][k] for k in ("datagram_bytes", "gso_segments", "batch", "rcvbuf",
                                                          "sndbuf") if k in per_rank[0]})
    return out


def workload_args(sizes=None, buckets=None):
    if sizes:
        return ["--sizes", ",".join(str(s // 4) for s in sizes)]
    return ["--buckets", ",".join(str(b) for b in buckets)]


def cg_name(system):
    """The cgroup a system's processes run in: one per system (dlcp, gloo, mpi, floor)."""
    return system.split("-")[0].rstrip("01")


# The congested-port condition: host 0's switch port at 300 Mbit/s, and 400 Mbit/s of
# best-effort cross traffic into it from an extra host (testbed args + "cross").
CONGESTED_PORT = {"rate": 300, "rate_ports": "0", "cross": 400}


def wait_tcp_listen(ns, port, timeout=20.0):
    """Wait until something in namespace `ns` listens on TCP `port` (an iperf3
    server): a fixed sleep loses that race on a loaded machine."""
    t0 = time.time()
    while not sh(["ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{port}"]).stdout.strip():
        if time.time() - t0 > timeout:
            sys.exit(f"nothing listens on tcp port {port} in {ns} after {timeout:.0f} s")
        time.sleep(0.02)


def cross_traffic(bed, hosts, mbps, seconds=3600):
    """Best-effort (DSCP 0) iperf3 UDP from an extra host (number `hosts`) into host 0's
    bottleneck port for `seconds`; the processes to kill afterwards (the client first: a
    caller may check with poll() that it still runs)."""
    src = hosts  # the extra host
    srv = subprocess.Popen(["ip", "netns", "exec", bed.ns(0), "iperf3", "-s", "-p", "5302"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_tcp_listen(bed.ns(0), 5302)
    cli = subprocess.Popen(["ip", "netns", "exec", bed.ns(src), "iperf3", "-u", "-c", "10.77.0.1",
                            "-p", "5302", "-b", f"{mbps}M", "-l", "1400", "-t", str(seconds), "--tos", "0"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    if cli.poll() is not None:
        sys.exit(f"the iperf3 cross-traffic client exited at once (status {cli.returncode})")
    return [cli, srv]


def allow_ccs():
    """Machine-wide: add cubic and bbr (where available) to the congestion controls
    namespaces may choose. Returns (the setting to restore or None, the usable ones)."""
    cur = sh(["sysctl", "-n", "net.ipv4.tcp_allowed_congestion_control"]).stdout.strip()
    avail = sh(["sysctl", "-n", "net.ipv4.tcp_available_congestion_control"]).stdout.split()
    want = cur.split()
    for cc in ("cubic", "bbr"):
        if cc in avail and cc not in want:
            want.append(cc)
    saved = None
    if want != cur.split():
        saved = cur
        with open(CC_SAVE, "w") as f:
            f.write(cur)
        sh(["sysctl", "-q", "-w", f"net.ipv4.tcp_allowed_congestion_control={' '.join(want)}"])
    return saved, [c for c in ("cubic", "bbr") if c in want]


def restore_ccs(saved):
    """Undo allow_ccs (saved: what it returned first)."""
    if saved is not None:
        sh(["sysctl", "-q", "-w", f"net.ipv4.tcp_allowed_congestion_control={saved}"], check=False)
        try:
            os.unlink(CC_SAVE)
        except OSError:
            pass


class Runner:
    """Starts one system's processes for one measurement. Every process goes into the
    system's cgroup; kernel drop counters are read around the run and dlcpd's own after
    it; a perf profile is taken when asked."""

    def __init__(self, bed, bindir, workdir, cgroups, profiler):
        self.bed = bed
        self.bindir = bindir
        self.workdir = workdir
        self.cgroups = cgroups
        self.profiler = profiler
        # More [network] settings for every dlcpd (the spine step's `paths`, when asked for).
        self.network_extra = ""
        self.kernel = measure.KernelCounters(bed, sh)
        self.started = None  # file the ranks create when their timed region starts (perf)

    def popen(self, system, args, env=None, **kw):
        """Popen of args in the system's cgroup, with the env the ranks read (window.rs)."""
        env = self.cgroups.env(cg_name(system), env)
        if self.started:
            env[measure.STARTED_ENV] = self.started
        return subprocess.Popen(self.cgroups.wrap(cg_name(system), args), env=env, **kw)

    # ---------------- dlcp
    def dlcp_config(self, rank, hosts, sockpath, extra="", network=""):
        """dlcpd's defaults plus only what a run needs: who the node and its peers are,
        the link's MTU when it is not the default 1500, and the control socket's path.
        network: more [network] settings (a labelled row's)."""
        t = (f"[node]\nrank = {rank}\njob_id = {JOB}\njob_secret = \"dlcp benchmark secret 0123456789\"\n\n")
        for r in range(hosts):
            t += f"[[peers]]\nrank = {r}\naddress = \"10.77.0.{r + 1}\"\nport = {PORT}\n\n"
        if self.bed.mtu != 1500 or network:
            mtu = f"mtu = {self.bed.mtu}\n" if self.bed.mtu != 1500 else ""
            t += f"[network]\n{mtu}{network}\n"
        t += f"[control]\nsocket_path = \"{sockpath}\"\n\n{extra}"
        return t

    @staticmethod
    def shm_for(sizes=None, buckets=None):
        """[shm] for a workload beyond dlcpd's default limits (needed to run; not a tuning)."""
        elems = list(sizes or []) + [b * 4 for b in (buckets or [])]
        biggest, total = max(elems or [0]), sum(elems)
        if biggest <= SHM_DEFAULT_MAX_TENSOR and total <= SHM_DEFAULT_ARENA:
            return ""
        arena = -(-max(SHM_DEFAULT_ARENA, 2 * biggest, total + 16 * MiB) // MiB) * MiB  # whole MiB
        return f"[shm]\narena_bytes = {arena}\nmax_tensor_bytes = {max(biggest, SHM_DEFAULT_MAX_TENSOR)}\n\n"

    def start_daemons(self, system, hosts, extra=""):
        """extra: TOML appended to every host's config, or a function of the host giving it."""
        d = tempfile.mkdtemp(prefix="dlcpd-", dir=self.workdir)
        daemons, socks = [], []
        # Experiments only: DLCP_BENCH_EXTRA_TOML is appended to every dlcp row's config
        # (a run with it is not the default configuration; its log says so).
        exp = os.environ.get("DLCP_BENCH_EXTRA_TOML", "")
        if exp:
            log(f"  (experiment: every dlcpd config ends with {exp!r})")
            base = extra
            extra = (lambda h: (base(h) if callable(base) else base) + "\n" + exp + "\n")
        for h in range(hosts):
            sock = os.path.join(d, f"d{h}.sock")
            cfg = os.path.join(d, f"d{h}.toml")
            # Owner-only: dlcpd refuses an inline secret in a file others may read.
            with open(os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(self.dlcp_config(h, hosts, sock, extra(h) if callable(extra) else extra,
                                         network=(DLCP_NOFLOW if "noflow" in system else "")
                                         + (DLCP_PATH1 if "path1" in system else "") + self.network_extra))
            logf = open(os.path.join(d, f"d{h}.log"), "w")
            p = self.popen(system, ["ip", "netns", "exec", self.bed.ns(h), os.path.join(self.bindir, "dlcpd"),
                                    "--config", cfg], stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)
            daemons.append(p)
            socks.append(sock)
        ctl = os.path.join(self.bindir, "dlcpctl")
        t0 = time.time()
        for h, s in enumerate(socks):
            while sh([ctl, "--socket", s, "stats", "--json"], check=False).returncode != 0:
                if time.time() - t0 > 20 or daemons[h].poll() is not None:
                    self.stop_daemons(daemons)
                    raise RuntimeError(f"dlcpd {h} did not come up (log in {d})")
                time.sleep(0.05)
        # Every daemon sees every peer up before the first op.
        while True:
            st = json.loads(sh([ctl, "--socket", socks[0], "status", "--json"]).stdout)
            if all(p.get("up") for i, p in enumerate(st.get("peers", [])) if i != 0):
                break
            if time.time() - t0 > 20:
                break
            time.sleep(0.05)
        return daemons, socks, d

    @staticmethod
    def stop_daemons(daemons):
        for p in daemons:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in daemons:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def daemon_stats(self, socks):
        """Drop counters of every daemon (dlcpctl stats --json), summed, and the datapath in use."""
        ctl = os.path.join(self.bindir, "dlcpctl")
        docs = [measure.load_json(sh([ctl, "--socket", s, "stats", "--json"], check=False).stdout) for s in socks]
        # Path health per daemon and peer (multipath only): the spine step reports it.
        self.last_paths = [d.get("paths_per_peer") for d in docs]
        return measure.sum_counters(measure.daemon_drops(d) for d in docs), (docs[0].get("datapath", "") if docs else "")

    def run_dlcp(self, system, hosts, budget_ppm, reps, warmup, sizes=None, buckets=None, timeout=900, extra=""):
        if isinstance(extra, str):
            extra += self.shm_for(sizes, buckets)
        daemons, socks, d = self.start_daemons(system, hosts, extra)
        failed = False
        try:
            cpu0 = sum(proc_cpu(p.pid) for p in daemons)
            procs = []
            for h in range(hosts):
                args = ["ip", "netns", "exec", self.bed.ns(h), os.path.join(self.bindir, "dlcp-bench"), "trainer",
                        "--socket", socks[h], "--job", str(JOB), "--reps", str(reps), "--warmup", str(warmup),
                        "--budget-ppm", str(budget_ppm), "--seed", str(1000 * h + 1), "--timeout-s", "120"]
                args += workload_args(sizes, buckets)
                procs.append(self.popen(system, args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            # A trainer that fails is waited on by its peers' own op timeout (10 s): their
            # errors say what each waited on.
            outs = wait_all(procs, timeout, "dlcp trainers", grace=15.0)
            cpu = sum(proc_cpu(p.pid) for p in daemons) - cpu0
            r = combine(LABEL.get(system, system), parse_json_lines(outs), extra_cpu=cpu)
            r["drops"], r["datapath"] = self.daemon_stats(socks)
            if os.environ.get("DLCP_BENCH_KEEP_LOGS") == "1":
                self.dump_daemons(socks, d)
            return r
        except BaseException:
            failed = True
            try:
                self.dump_daemons(socks, d)
            except Exception as e:  # the failure being raised matters more
                log(f"  {system}: dlcpctl dumps incomplete: {e}")
            raise
        finally:
            self.stop_daemons(daemons)
            if failed or os.environ.get("DLCP_BENCH_KEEP_LOGS") == "1":
                self.keep_logs(system, d, failed)
            shutil.rmtree(d, ignore_errors=True)

    def dump_daemons(self, socks, d):
        """What each daemon says of itself as a run fails (or ends, with DLCP_BENCH_KEEP_LOGS=1):
        `dlcpctl stats` and `status`
        (counters, ops in flight, peers) into d/d<h>.<what>.json."""
        ctl = os.path.join(self.bindir, "dlcpctl")
        for h, sock in enumerate(socks):
            for what in ("stats", "status"):
                r = sh([ctl, "--socket", sock, what, "--json"], check=False, timeout=10)
                with open(os.path.join(d, f"d{h}.{what}.json"), "w") as f:
                    f.write(r.stdout if r.returncode == 0 else f"dlcpctl {what}: exit {r.returncode}: {r.stderr}")

    @staticmethod
    def keep_logs(system, d, failed):
        """Copy a dlcp row's daemon logs and dumps (not its configs: they hold the job
        secret) out of the work directory, which the run removes, to
        $DLCP_BENCH_LOG_DIR (default /var/tmp/dlcp-bench-logs)/<time>-<system>[-failed]/."""
        root = os.environ.get("DLCP_BENCH_LOG_DIR", "/var/tmp/dlcp-bench-logs")
        dest = os.path.join(root, time.strftime("%Y%m%d-%H%M%S") + f"-{system}" + ("-failed" if failed else ""))
        try:
            os.makedirs(dest, exist_ok=True)
            for name in sorted(os.listdir(d)):
                if name.endswith((".log", ".json")):
                    shutil.copy2(os.path.join(d, name), dest)
            log(f"  {system}: daemon logs{' of the failed run' if failed else ''} kept in {dest}")
        except OSError as e:
            log(f"  {system}: could not keep the daemon logs in {dest}: {e}")

    # ---------------- the floor
    def run_floor(self, hosts, reps, warmup, sizes, timeout=900):
        peers = ",".join(f"10.77.0.{h + 1}:{FLOOR_PORT}" for h in range(hosts))
        procs = []
        for h in range(hosts):
            args = ["ip", "netns", "exec", self.bed.ns(h), os.path.join(self.bindir, "dlcp-bench"), "floor",
                    "--rank", str(h), "--peers", peers, "--mtu", str(self.bed.mtu), "--reps", str(reps),
                    "--warmup", str(warmup), "--seed", str(1000 * h + 1)]
            args += workload_args(sizes)
            procs.append(self.popen("floor", args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = wait_all(procs, timeout, "floor ranks")
        return combine("floor", parse_json_lines(outs))

    # ---------------- Gloo
    def run_gloo(self, system, hosts, reps, warmup, sizes=None, buckets=None, timeout=900, cc=None):
        env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0")
        port = 29500 + int(time.time()) % 1000
        procs = []
        for h in range(hosts):
            args = ["ip", "netns", "exec", self.bed.ns(h), PY, PEER, "--backend", "gloo", "--rank", str(h),
                    "--world", str(hosts), "--master", f"10.77.0.1:{port}", "--reps", str(reps),
                    "--warmup", str(warmup), "--seed", str(1000 * h + 1)]
            args += workload_args(sizes, buckets)
            procs.append(self.popen(system, args, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = wait_all(procs, timeout, "gloo ranks")
        return combine(f"gloo {cc}" if cc else "gloo", parse_json_lines(outs))

    # ---------------- Open MPI
    def run_mpi(self, system, hosts, reps, warmup, sizes=None, buckets=None, timeout=900, cc=None):
        env = dict(os.environ, PMIX_MCA_ptl_tcp_remote_connections="1",
                   PMIX_MCA_ptl_tcp_if_include="10.77.0.0/24", OMPI_MCA_btl_tcp_if_include="eth0")
        app = []
        out_dir = tempfile.mkdtemp(prefix="mpi-", dir=self.workdir)
        for h in range(hosts):
            if app:
                app.append(":")
            app += ["-np", "1", "ip", "netns", "exec", self.bed.ns(h), PY, PEER, "--backend", "mpi",
                    "--out-dir", out_dir, "--reps", str(reps), "--warmup", str(warmup), "--seed", str(1000 * h + 1)]
            app += workload_args(sizes, buckets)
        env = self.cgroups.env(cg_name(system), env)
        if self.started:
            env[measure.STARTED_ENV] = self.started
        forward = [k for k in ("PMIX_MCA_ptl_tcp_remote_connections", "PMIX_MCA_ptl_tcp_if_include",
                               measure.CGROUP_ENV, measure.STARTED_ENV) if k in env]
        args = ["ip", "netns", "exec", self.bed.ns(0), "mpirun", "--allow-run-as-root", "--oversubscribe"]
        for k in forward:
            args += ["-x", k]
        args += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "eth0",
                 "--mca", "oob_tcp_if_include", "eth0"] + app
        p = self.popen(system, args, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_all([p], timeout, "mpirun")
        outs = []
        for h in range(hosts):
            try:
                with open(os.path.join(out_dir, f"rank{h}.json")) as f:
                    outs.append(f.read())
            except OSError:
                pass
        shutil.rmtree(out_dir, ignore_errors=True)
        ranks = parse_json_lines(outs)
        if len(ranks) != hosts:
            raise RuntimeError(f"mpirun: {len(ranks)} of {hosts} ranks reported")
        return combine(f"mpi {cc}" if cc else "mpi", ranks)

    def run(self, system, hosts, reps, warmup, sizes=None, buckets=None, extra="", profile=None):
        """system: 'dlcp1', 'dlcp0', 'dlcp1-paced', 'floor', 'gloo', 'mpi', 'gloo-bbr', 'mpi-bbr', ...
        profile: a tag to take a perf profile of the timed region under (None: no profile)."""
        t0 = time.time()
        before = self.kernel.snapshot()
        prof = None
        if profile and self.profiler.enabled:
            prof = self.profiler.start(profile, f"{LABEL.get(system, system)}, {self.bed.desc}")
            self.started = self.profiler.started_file(profile)
        try:
            if system.startswith("dlcp"):
                budget = 10000 if system.startswith("dlcp1") else 0
                more = extra
                if "paced" in system:
                    more = (lambda h: DLCP_PACED + extra(h)) if callable(extra) else DLCP_PACED + extra
                if "noauth" in system:
                    inner = more
                    more = (lambda h: DLCP_NOAUTH + inner(h)) if callable(inner) else DLCP_NOAUTH + inner
                r = self.run_dlcp(system, hosts, budget, reps, warmup, sizes, buckets, extra=more)
            elif system == "floor":
                r = self.run_floor(hosts, reps, warmup, sizes)
            else:
                base, _, cc = system.partition("-")
                cc = cc or "cubic"
                self.bed.set_cc(cc)
                fn = self.run_gloo if base == "gloo" else self.run_mpi
                r = fn(system, hosts, reps, warmup, sizes, buckets, cc=cc)
        finally:
            self.started = None
            perf = self.profiler.finish(prof) if prof else None
        r["kernel"] = measure.KernelCounters.delta(before, self.kernel.snapshot())
        if perf:
            r["perf"] = perf
        r["key"] = system
        r["warmup"] = warmup
        r["wall_s"] = time.time() - t0
        return r


# ---------------------------------------------------------------- statistics
def pct(v, q):
    s = sorted(v)
    if not s:
        return float("nan")
    i = min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1) + 0.4999))))
    return s[i]


def stats(times):
    return {"n": len(times), "p50": pct(times, 50), "p99": pct(times, 99), "max": max(times)}


def gib_reduced(run):
    """GiB of tensor reduced, warm-up reps included (the CPU counted covers them too)."""
    return sum(r["elems"] * 4 * (len(r["times"]) + run["warmup"]) for r in run["results"]) / (1 << 30)


def cpu_figures(run, baseline_cores=None):
    """CPU seconds per GiB reduced, by source:
    proc     the ranks' own CPU time over their loops (+ the daemons' over the run), as before;
    cgroup   the system's cgroup (daemons and trainers) over the timed region;
    machine  the whole machine's busy time (/proc/stat) over the timed region: softirq,
             the emulated switch and everything else running included;
    net      machine minus the idle baseline (busy cores measured with nothing of ours
             running, times the region's length)."""
    gib = gib_reduced(run)
    if not gib:
        return {}
    out = {"proc": run["cpu_s"] / gib}
    w = run.get("cpu") or {}
    if "cgroup_s" in w:
        out["cgroup"] = w["cgroup_s"] / gib
    if "machine_s" in w:
        out["machine"] = w["machine_s"] / gib
        if baseline_cores is not None:
            out["net"] = max(0.0, w["machine_s"] - baseline_cores * w["wall_s"]) / gib
    return out


def mac_share(rows):
    """The MAC's share of dlcp's CPU per GiB: (with - without) / with, from the cgroup
    CPU of the dlcp1 and dlcp1-noauth rows of one condition (None if either is missing)."""
    a = rows.get("dlcp1", {}).get("cpu", {}).get("cgroup")
    b = rows.get("dlcp1-noauth", {}).get("cpu", {}).get("cgroup")
    return (a - b) / a if a and b else None


def cpu_per_gib(run):
    """The system's CPU per GiB: from its cgroup when there is one, else per process."""
    f = cpu_figures(run)
    return f.get("cgroup", f.get("proc", float("nan")))


LABEL = report_headline.LABEL


def ms(x):
    return f"{x * 1000:.0f}" if x >= 0.1 else f"{x * 1000:.1f}"


# ---------------------------------------------------------------- benchmarks
class Bench:
    def __init__(self, a):
        self.a = a
        self.quick = a.quick
        self.bed = Testbed(a.prefix)
        self.workdir = tempfile.mkdtemp(prefix="dlcp-bench-")
        self.cgroups = measure.Cgroups(a.prefix, log)
        if not self.cgroups.available:
            log(f"cgroup CPU per system unavailable: {self.cgroups.reason} (per-process CPU instead)")
        self.profiler = measure.Profiler(a.out, a.base, a.perf, self.workdir, log, sh)
        if a.perf and not self.profiler.enabled:
            log("--perf: perf not found (apt-get install linux-perf): no profiles")
        self.runner = Runner(self.bed, a.bindir, self.workdir, self.cgroups, self.profiler)
        self.summary = []  # (name, dlcp, peer, ratio, unit)
        self.md = []
        self.data = {"micro": [], "datapath": {}, "headline": [], "sizes": [], "model": [], "scaling": [],
                     "sim": [], "config": {}, "baselines": [], "flow": [], "spine": []}
        self.saved_allowed_cc = None
        self.errors = []
        self.base = a.base
        self.log = log
        self.sh = sh

    def line(self, name, dlcp, peer, unit, peer_name, lower_better=False):
        ratio = (peer / dlcp if lower_better else dlcp / peer) if dlcp and peer else float("nan")
        s = f"{name}: dlcp {dlcp:.4g} {unit}, peer {peer:.4g} {unit} ({peer_name}), ratio {ratio:.2f}"
        print(s, flush=True)
        self.summary.append(s)

    # ---- machine-wide: allow cubic for the TCP peers, restore after
    def allow_cc(self):
        self.saved_allowed_cc, self.ccs = allow_ccs()

    def restore_cc(self):
        restore_ccs(self.saved_allowed_cc)
        self.saved_allowed_cc = None

    # ---- 2. micro
    def micro(self):
        log("micro benchmarks")
        ms_ = "300" if self.quick else "1000"
        r = sh([os.path.join(self.a.bindir, "dlcp-bench"), "micro", "--ms", ms_])
        for line in r.stdout.splitlines():
            if line.startswith("JSON "):
                self.data["micro"] = json.loads(line[5:])
            else:
                print(line, flush=True)
                self.summary.append(line)

    # ---- 3. datapath
    def iperf(self, mode):
        """iperf3 between host 0 and host 1, both directions at once; Mbit/s per direction."""
        srv = subprocess.Popen(["ip", "netns", "exec", self.bed.ns(1), "iperf3", "-s", "-1", "-p", "5201"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_tcp_listen(self.bed.ns(1), 5201)
            secs = "3" if self.quick else "6"
            args = ["ip", "netns", "exec", self.bed.ns(0), "iperf3", "-c", "10.77.0.2", "-p", "5201", "-t", secs,
                    "--bidir", "-J"]
            if mode == "udp":
                # dlcpd's socket buffers (4 MiB), paced at PACED_MBPS: unpaced (-b 0), UDP
                # loses over half its datagrams at the receiver on two cores.
                args += ["-u", "-b", f"{PACED_MBPS}M", "-w", "4M", "-l", "1472"]
            r = sh(args, timeout=60)
            j = json.loads(r.stdout)
            end = j["end"]
            # Received rates of each direction.
            a = end["sum_received"]["bits_per_second"]
            b = end.get("sum_received_bidir_reverse", end["sum_received"])["bits_per_second"]
            return (a + b) / 2 / 1e6
        finally:
            try:
                srv.wait(timeout=5)
            except subprocess.TimeoutExpired:
                srv.kill()
                srv.wait()

    def datapath(self):
        log("datapath throughput: 2 hosts, dlcpd pair vs iperf3 UDP and TCP on the same veths")
        self.bed.up(2)
        try:
            size = 16 * MiB if self.quick else 64 * MiB
            reps = 3 if self.quick else 8
            r = self.runner.run("dlcp0", 2, reps, 1, sizes=[size])
            t = stats(r["results"][0]["times"])
            # 2 ranks: each sends size/2 in reduce-scatter and size/2 in all-gather per op.
            dl = size * 8 / t["p50"] / 1e6
            udp = self.iperf("udp")
            tcp = self.iperf("tcp")
            self.data["datapath"] = {"size": size, "reps": reps, "dlcp_mbps": dl, "udp_mbps": udp,
                                     "tcp_mbps": tcp, "p50": t["p50"]}
            self.line("datapath_vs_iperf3_udp", dl, udp, "Mbit/s",
                      f"iperf3 UDP 1472 B paced at {PACED_MBPS / 1000:g} Gbit/s, 4 MiB buffers, --bidir")
            self.line("datapath_vs_iperf3_tcp", dl, tcp, "Mbit/s", "iperf3 TCP, --bidir")
            self.dpdk_datapath(size, reps, udp)
        finally:
            self.bed.down()
        self.datapath_jumbo(size, reps)

    def datapath_jumbo(self, size, reps):
        """The daemon pair against iperf3 TCP on the same veth at MTU 9000 (issue 14 asks
        >= 0.8 x TCP's goodput there)."""
        log("datapath throughput at MTU 9000: dlcpd pair vs iperf3 TCP")
        self.bed.up(2, mtu=9000)
        try:
            r = self.runner.run("dlcp0", 2, reps, 1, sizes=[size])
            t = stats(r["results"][0]["times"])
            dl = size * 8 / t["p50"] / 1e6
            tcp = self.iperf("tcp")
            self.data["datapath"]["mtu9000"] = {"dlcp_mbps": dl, "tcp_mbps": tcp, "p50": t["p50"]}
            self.line("datapath_mtu9000_vs_iperf3_tcp", dl, tcp, "Mbit/s", "iperf3 TCP, --bidir, MTU 9000")
        finally:
            self.bed.down()

    def dpdk_datapath(self, size, reps, udp):
        """The same daemon pair on the DPDK datapath (net_af_packet on each host's veth,
        no hugepages), if dlcpd was built with DPDK. Runs last: it takes the kernel's
        addresses off the veths (DPDK owns them; dlcp answers ARP itself)."""
        def dpdk(h):
            return ("[datapath]\nkind = \"dpdk\"\n[datapath.dpdk]\neal_args = [\"--no-huge\", \"--no-pci\", "
                    f"\"--no-shconf\", \"--no-telemetry\", \"-m\", \"256\", \"-l\", \"{h % (os.cpu_count() or 1)}\", "
                    f"\"--file-prefix\", \"{self.bed.prefix}d{h}\", \"--vdev=net_af_packet0,iface=eth0\"]\n"
                    "rx_ring_size = 1024\ntx_ring_size = 1024\n")
        for h in range(2):
            sh(["ip", "netns", "exec", self.bed.ns(h), "ip", "addr", "flush", "dev", "eth0"])
        try:
            r = self.runner.run("dlcp0", 2, reps, 1, sizes=[size], extra=dpdk)
        except Exception as e:
            log(f"  DPDK datapath: not measured ({str(e).splitlines()[0]}; dlcpd built without DPDK?)")
            self.data["datapath"]["dpdk"] = {"error": str(e).splitlines()[0]}
            return
        t = stats(r["results"][0]["times"])
        dl = size * 8 / t["p50"] / 1e6
        used = r.get("datapath", "")
        if not used.startswith("dpdk"):
            log(f"  DPDK datapath: the daemons ran on '{used}', not DPDK: not reported")
            self.data["datapath"]["dpdk"] = {"error": f"datapath in use: {used}"}
            return
        log(f"  DPDK datapath ({used}): {dl:.0f} Mbit/s")
        self.data["datapath"]["dpdk"] = {"dlcp_mbps": dl, "p50": t["p50"], "datapath": used}
        self.line("datapath_dpdk_vs_iperf3_udp", dl, udp, "Mbit/s",
                  "iperf3 UDP on the kernel stack; dlcp on DPDK net_af_packet, which still crosses the kernel")

    # ---- 4. headline
    def cross_traffic(self, hosts, mbps):
        """Best-effort (DSCP 0) iperf3 UDP from an extra host into host 0's bottleneck port."""
        return cross_traffic(self.bed, hosts, mbps)

    def plan(self):
        """The headline conditions: dicts with cond, mtu, testbed args, size, [(system, reps)].
        Clean and 1% loss at MTU 1500 and 9000; the floor in the clean ones."""
        if self.quick:
            size, n = 16 * MiB, 3
            clean = [(s, n) for s in ("dlcp1", "dlcp0", "gloo", "mpi", "floor", "dlcp1-noauth", "dlcp1-path1")]
            lossy = [(s, n) for s in ("dlcp1", "dlcp0", "gloo", "mpi")]
            return [{"cond": c, "mtu": m, "tb": tb, "size": size, "systems": sy}
                    for c, tb, sy in (("clean", {}, clean), ("loss 1%", {"loss": 1}, lossy)) for m in (1500, 9000)]
        # 10 reps for the main systems (the issue's p50 over 10); 5 for the secondary
        # rows (the tuned dlcp row, the TCP peers under bbr) and the slow congested port.
        bbr = [(f"{p}-bbr", 5) for p in ("gloo", "mpi") if "bbr" in self.ccs]
        trio = [("dlcp1", 10), ("gloo", 10), ("mpi", 10)]
        main = trio[:1] + [("dlcp0", 10)] + trio[1:]
        lossy = trio[:1] + [("dlcp0", 5)] + trio[1:]
        big = 64 * MiB
        return [{"cond": "clean", "mtu": 1500, "tb": {}, "size": big,
                 "systems": main + [("floor", 10), ("dlcp1-noauth", 10), ("dlcp1-noflow", 5), ("dlcp1-path1", 5), ("dlcp1-paced", 5)]
                 + bbr},
                {"cond": "clean", "mtu": 9000, "tb": {}, "size": big,
                 "systems": main + [("floor", 10), ("dlcp1-noauth", 10), ("dlcp1-noflow", 5), ("dlcp1-path1", 5)]},
                {"cond": "loss 0.1%", "mtu": 1500, "tb": {"loss": 0.1}, "size": big, "systems": trio},
                {"cond": "loss 1%", "mtu": 1500, "tb": {"loss": 1}, "size": big, "systems": lossy + bbr},
                {"cond": "loss 1%", "mtu": 9000, "tb": {"loss": 1}, "size": big, "systems": lossy},
                {"cond": "congested port", "mtu": 1500, "tb": dict(CONGESTED_PORT),
                 "size": 16 * MiB, "systems": [("dlcp1", 5), ("dlcp0", 3), ("gloo", 3), ("mpi", 3)]}]

    def record_config(self):
        """The configuration dlcpd runs with in the headline: dlcpd check-config of host 0's
        file (defaults filled in, secret redacted), and what the bench sets beyond defaults."""
        d = tempfile.mkdtemp(prefix="cfg-", dir=self.workdir)
        cfg = os.path.join(d, "d0.toml")
        saved, self.bed.mtu = self.bed.mtu, 1500
        try:
            with open(os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(self.runner.dlcp_config(0, 4, os.path.join(d, "d0.sock")))
        finally:
            self.bed.mtu = saved
        text = measure.dlcpd_config(self.a.bindir, cfg, sh)
        self.data["config"] = {
            "effective": text,
            "set": ["[node] rank, job_id, job_secret; [[peers]]: who the hosts are (no default exists)",
                    "[control] socket_path: one socket per daemon in a temporary directory",
                    "[network] mtu = 9000 in the MTU 9000 conditions: the links' MTU",
                    "[shm] arena_bytes / max_tensor_bytes only for workloads beyond the defaults (256 MiB in "
                    "the sizes step): needed to run",
                    f"dlcp b1% paced 3 Gbit/s (tuned): [pacing] rate_mbps = {PACED_MBPS}, a labelled row, "
                    "never the headline"]}
        log("dlcpd configuration (dlcpd check-config of host 0's file; MTU 1500):\n"
            + "\n".join("    " + line for line in text.splitlines()))

    def headline(self):
        hosts = 4
        self.record_config()
        wanted = set(self.a.conds.split(",")) if self.a.conds else None
        for c in self.plan():
            if wanted and c["cond"].split()[0] not in wanted:
                continue
            cname, mtu, csize = c["cond"], c["mtu"], c["size"]
            tb = dict(c["tb"])
            cross = tb.pop("cross", None)
            log(f"headline: {cname}, MTU {mtu}, {csize // MiB} MiB, {hosts} hosts: "
                + ", ".join(f"{s} x{n}" for s, n in self.pick_systems(c["systems"])))
            self.bed.up(hosts + (1 if cross else 0), mtu=mtu, **tb)
            extra = []
            try:
                if cross:
                    extra = self.cross_traffic(hosts, cross)
                base = measure.idle_baseline(2 if self.quick else 4)
                log(f"  idle baseline: {base:.2f} busy cores with nothing of ours running")
                self.data["baselines"].append({"cond": cname, "mtu": mtu, "busy_cores": base})
                for s, reps in self.pick_systems(c["systems"]):
                    self.headline_run(cname, mtu, csize, s, reps, base)
                if tb.get("loss"):
                    seen, dropped = self.bed.loss_counters()
                    log(f"  nftables: {dropped} of {seen} packets dropped ({100 * dropped / max(seen, 1):.2f}%)")
            finally:
                for p in extra:
                    p.kill()
                    p.wait()
                self.bed.down()
            self.headline_lines(cname, mtu, csize)

    def pick_systems(self, systems):
        """The headline rows to run: every one, or `--systems` (a comma list of system names,
        in that order, a name may repeat: `dlcp1,dlcp1-path1,dlcp1,dlcp1-path1` interleaves an
        A/B); `--reps N` overrides the reps of every row."""
        names = [x.strip() for x in (self.a.systems or "").split(",") if x.strip()]
        reps = dict(systems)
        if names:
            unknown = sorted(set(names) - set(LABEL))
            if unknown:
                raise SystemExit(f"--systems: no such system: {', '.join(unknown)} (systems: {', '.join(sorted(LABEL))})")
            systems = [(n, reps.get(n, 3 if self.quick else 10)) for n in names]
        return [(n, self.a.reps or r) for n, r in systems]

    def headline_run(self, cname, mtu, csize, s, reps, base):
        hosts = 4
        profile = None
        if cname == "clean" and s in ("dlcp1", "dlcp0", "floor", "gloo", "mpi", "dlcp1-path1"):
            profile = f"clean-mtu{mtu}-{s}"
        try:
            r = self.runner.run(s, hosts, reps, 1, sizes=[csize], profile=profile)
        except Exception as e:  # a peer failing is a result, not the end of the run
            log(f"  {s}: FAILED: {e}")
            self.errors.append(f"{cname} MTU {mtu} {s}: {e}")
            return
        st = stats(r["results"][0]["times"])
        cpu = cpu_figures(r, base)
        row = {"cond": cname, "mtu": mtu, "size": csize, "hosts": hosts, "system": s, "stats": st, "cpu": cpu,
               "cpu_per_gib": cpu_per_gib(r), "times": r["results"][0]["times"],
               "min_delivered_ppm": r.get("min_delivered_ppm"), "repairs": r.get("repairs"),
               "drops": r.get("drops"), "kernel": r.get("kernel"), "floor": r.get("floor"),
               "perf": r.get("perf"), "window": r.get("cpu"), "baseline_cores": base}
        self.data["headline"].append(row)
        extra = ""
        if r.get("drops") is not None:
            extra = f", daemon rx drops {r['drops'].get('protocol_rx_dropped', '?')}"
        if r.get("floor"):
            extra = f", lost {r['floor']['lost']}"
        log(f"  {LABEL.get(s, s)}: p50 {ms(st['p50'])} ms p99 {ms(st['p99'])} ms max {ms(st['max'])} ms, "
            f"CPU-s/GiB cgroup {cpu.get('cgroup', float('nan')):.1f} machine net "
            f"{cpu.get('net', float('nan')):.1f}, kernel UDP rcvbuf errors "
            f"{r['kernel'].get('udp_rcvbuf_errors', '?')}{extra} ({r['wall_s']:.0f} s)")
        if cname == "clean" and mtu == 1500 and s in ("dlcp1", "gloo", "mpi"):
            self.data["sizes"].append({"cond": cname, "system": s, "size": csize, "stats": st})

    def headline_lines(self, cname, mtu, size):
        """Summary lines of a condition: dlcp b1% and b0 against each peer (p99 under loss,
        p50 when clean), the best peer, and the floor; CPU per GiB against Gloo."""
        rows = {h["system"]: h for h in self.data["headline"] if h["cond"] == cname and h["mtu"] == mtu}
        tag = cname.replace(" ", "_").replace("%", "pct").replace(".", "p") + ("" if mtu == 1500 else f"_mtu{mtu}")
        q = "p50" if cname == "clean" else "p99"
        for d in ("dlcp1", "dlcp0"):
            if d not in rows:
                continue
            who = "" if d == "dlcp1" else "_b0"
            dv = rows[d]["stats"][q] * 1000
            for peer in ("gloo", "mpi", "floor"):
                if peer in rows and (peer != "floor" or cname == "clean"):
                    self.line(f"allreduce_{size // MiB}MiB_{tag}{who}_{q}_vs_{peer}", dv,
                              rows[peer]["stats"][q] * 1000, "ms", LABEL[peer], lower_better=True)
            for peer in ("gloo",):
                a, b = rows[d]["cpu"].get("cgroup"), rows.get(peer, {}).get("cpu", {}).get("cgroup")
                if cname == "clean" and a and b:
                    self.line(f"allreduce_{size // MiB}MiB_{tag}{who}_cpu_per_gib_vs_{peer}", a, b, "CPU-s/GiB",
                              f"{LABEL[peer]}, cgroup", lower_better=True)
        share = mac_share(rows)
        if share is not None:
            self.line(f"allreduce_{size // MiB}MiB_{tag}_mac_share_of_cpu_per_gib", share * 100, 10.0, "%",
                      "the issue's ceiling; CPU/GiB (cgroup) of dlcp b1% minus the same with packet_auth none",
                      lower_better=True)

    # ---- sizes and the bucketed model
    def sizes(self):
        hosts = 4
        sizes = [1 * MiB, 16 * MiB, 256 * MiB]
        reps = 2
        buckets = resnet50_buckets()
        log(f"sizes {[x // MiB for x in sizes]} MiB x {reps} reps and bucketed ResNet-50 "
            f"({len(buckets)} buckets, {sum(buckets) * 4 / MiB:.1f} MiB), 4 hosts, clean")
        self.bed.up(hosts)
        try:
            for s in ["dlcp1", "gloo", "mpi"]:
                try:
                    r = self.runner.run(s, hosts, reps, 1, sizes=sizes)
                    for res in r["results"]:
                        self.data["sizes"].append({"cond": "clean", "system": s, "size": res["elems"] * 4,
                                                   "stats": stats(res["times"])})
                    m = self.runner.run(s, hosts, reps, 1, buckets=buckets)
                    res = m["results"][0]
                    self.data["model"].append({"cond": "clean", "system": s, "stats": stats(res["times"]),
                                               "front": stats(res["front"])})
                    log(f"  {LABEL[s]} done ({r['wall_s'] + m['wall_s']:.0f} s)")
                except Exception as e:
                    log(f"  {s}: FAILED: {e}")
                    self.errors.append(f"sizes {s}: {e}")
        finally:
            self.bed.down()

    # ---- 5. scaling and simulation
    def scaling(self):
        size = 16 * MiB
        reps = 3 if self.quick else 5
        hs = [2, 4] if self.quick else [2, 4, 8]
        for hosts in hs:
            log(f"scaling: {hosts} hosts, {size // MiB} MiB x {reps} reps")
            self.bed.up(hosts)
            try:
                for s in ["dlcp1", "gloo", "mpi"]:
                    try:
                        r = self.runner.run(s, hosts, reps, 1, sizes=[size])
                        self.data["scaling"].append({"hosts": hosts, "system": s,
                                                     "stats": stats(r["results"][0]["times"]),
                                                     "cpu_per_gib": cpu_per_gib(r), "wall_s": r["wall_s"]})
                    except Exception as e:
                        log(f"  {s}: FAILED: {e}")
                        self.errors.append(f"scaling {hosts} {s}: {e}")
            finally:
                self.bed.down()

    def flow(self):
        """Flow control on the emulated cluster (issue 16): 8 hosts, 64 MiB, budget 1%, with
        dlcpd's default window and with flow control off; clean, then with host 0's switch port
        at FLOW_SLOW_MBPS. Per run: the kernel's socket receive-buffer drops, the switch's
        queue drops (on a clean network, all of them are dlcp's own), the least fraction any
        transfer delivered, repairs, and the datagrams into host 0 per op (the slow port's
        share: 2(N-1)/N of the tensor in chunks, once per phase)."""
        hosts = 4 if self.quick else 8
        size = 16 * MiB if self.quick else 64 * MiB
        reps = 2 if self.quick else 5
        for cond, tb in (("clean", {}), (f"host 0's port at {FLOW_SLOW_MBPS} Mbit/s",
                                         {"rate": FLOW_SLOW_MBPS, "rate_ports": "0"})):
            log(f"flow control: {cond}, {hosts} hosts, {size // MiB} MiB x {reps} reps")
            self.bed.up(hosts, **tb)
            try:
                for s in ("dlcp1", "dlcp1-noflow"):
                    try:
                        r = self.runner.run(s, hosts, reps, 1, sizes=[size])
                    except Exception as e:
                        log(f"  {s}: FAILED: {e}")
                        self.errors.append(f"flow {cond} {s}: {e}")
                        continue
                    k = r.get("kernel", {})
                    per_op_into_0 = 2 * (hosts - 1) * -(-size // hosts // 1372)
                    row = {"cond": cond, "hosts": hosts, "size": size, "system": s,
                           "stats": stats(r["results"][0]["times"]), "kernel": k,
                           "min_delivered_ppm": r.get("min_delivered_ppm"), "repairs": r.get("repairs"),
                           "ops": reps + 1, "into_host0_per_op": per_op_into_0, "drops": r.get("drops")}
                    self.data["flow"].append(row)
                    sw = k.get("switch_queue_drops", 0)
                    log(f"  {LABEL.get(s, s)}: p50 {ms(row['stats']['p50'])} ms, kernel UDP rcvbuf errors "
                        f"{k.get('udp_rcvbuf_errors', '?')}, input backlog drops {k.get('backlog_drops', '?')}, "
                        f"device drops (hosts' eth0 rx/tx, switch ports) {k.get('eth0_rx_dropped', '?')}/"
                        f"{k.get('eth0_tx_dropped', '?')}/{k.get('switch_dev_dropped', '?')}, switch queue drops {sw} "
                        f"({100 * sw / max(1, per_op_into_0 * (reps + 1)):.3f}% of the datagrams into host 0), "
                        f"min delivered {(r.get('min_delivered_ppm') or 0) / 1e4:.2f}%, repairs {r.get('repairs')}, "
                        f"early datagrams dropped {(r.get('drops') or {}).get('early_dropped', '?')}, transfers "
                        f"closed within budget {(r.get('drops') or {}).get('closed_within_budget', '?')}, deadline "
                        f"NACKs / closes {(r.get('drops') or {}).get('deadline_nacks', '?')} / "
                        f"{(r.get('drops') or {}).get('deadline_closes', '?')}, quiet NACKs "
                        f"{(r.get('drops') or {}).get('quiet_nacks', '?')}")
            finally:
                self.bed.down()

    def simulate(self):
        ranks = [64] if self.quick else [64, 256, 1024]
        size_mb = 1
        for n in ranks:
            log(f"protocol-core simulation: {n} ranks, {size_mb} MB")
            args = [os.path.join(self.a.bindir, "dlcpd"), "simulate", "--hosts", str(n), "--iters", "1",
                    "--layers", "1", "--size", str(size_mb)]
            t0 = time.time()
            # Own process group: on timeout, /usr/bin/time and the simulator both die.
            p = subprocess.Popen(["/usr/bin/time", "-f", "MAXRSS_KB %M"] + args, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                out, err = p.communicate(timeout=self.a.sim_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
                log(f"  {n} ranks: did not finish within {self.a.sim_timeout} s (CPU-bound on this machine)")
                self.errors.append(f"simulate {n} ranks: not finished within {self.a.sim_timeout} s")
                continue
            if p.returncode != 0:
                raise RuntimeError(f"dlcpd simulate --hosts {n} failed ({p.returncode}): {err[-1500:]}")
            r = subprocess.CompletedProcess(args, p.returncode, out, err)
            row = {"ranks": n, "args": " ".join(args[1:]), "rss_kb": int(r.stderr.split("MAXRSS_KB")[-1].split()[0]),
                   "wall_s": time.time() - t0}
            row.update(parse_simulate(r.stdout, n, size_mb))
            log(f"  {n} ranks: {row['wall_s']:.0f} s wall, {row['rss_kb'] / 1024:.0f} MiB RSS, "
                f"{row.get('data_per_rank_op', 0):.0f} data + {row.get('control_per_rank_op', 0):.0f} control "
                f"packets per rank per op, {row.get('state_kib', 0):.0f} KiB protocol state per rank")
            self.data["sim"].append(row)
            self.line(f"simulate_{n}_ranks_packets_per_rank", row["pkts_per_rank_op"], row["ideal"], "pkts/op",
                      "ideal data packets, no control", lower_better=True)

    # ---------------------------------------------------------------- main
    def run_all(self):
        self.allow_cc()
        steps = [("micro", self.micro), ("datapath", self.datapath), ("headline", self.headline),
                 ("sizes", self.sizes), ("scaling", self.scaling), ("flow", self.flow),
                 ("spine", lambda: spine.step(self, stats)), ("simulate", self.simulate)]
        only = set(self.a.only.split(",")) if self.a.only else None
        if self.quick and not only:
            only = {"micro", "datapath", "headline", "simulate"}
        try:
            for name, fn in steps:
                if only and name not in only:
                    continue
                try:
                    fn()
                except Exception as e:
                    log(f"{name}: FAILED: {e}")
                    self.errors.append(f"{name}: {e}")
                    self.bed.down()
        finally:
            self.bed.down()
            self.restore_cc()
            self.profiler.cleanup()
            self.cgroups.cleanup()
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.elapsed = time.time() - T_START
        self.data["run"] = {"summary": self.summary, "errors": self.errors, "elapsed_s": self.elapsed,
                            "load_note": self.a.load_note, "quick": self.quick,
                            "cgroups": self.cgroups.reason or "cgroup v2, one group per system",
                            "perf_files": self.profiler.files}
        with open(os.path.join(self.a.out, self.base + ".json"), "w") as f:
            json.dump(self.data, f, indent=1)
        import report
        report.write(self, self.a.out)
        return 0 if not self.errors else 1


def resnet50_params():
    """Parameter element counts of torchvision's ResNet-50, front to back (conv, bn w, bn b, ...)."""
    p = [64 * 3 * 7 * 7, 64, 64]
    inp = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        out = width * 4
        for b in range(blocks):
            p += [width * inp, width, width, width * width * 9, width, width, out * width, out, out]
            if b == 0:
                p += [out * inp, out, out]
            inp = out
    p += [1000 * 2048, 1000]
    return p


def resnet50_buckets(cap_bytes=25 * MiB):
    """DDP-style buckets of ~25 MiB in backward order, returned front layer first."""
    params = resnet50_params()
    buckets, cur = [], 0
    for n in reversed(params):
        if cur and (cur + n) * 4 > cap_bytes:
            buckets.append(cur)
            cur = 0
        cur += n
    if cur:
        buckets.append(cur)
    return list(reversed(buckets))


def parse_simulate(stdout, n, size_mb):
    """Figures of one `dlcpd simulate` run from its stdout (keep in sync with daemon/src/simulate.rs)."""
    row = {}
    pk = ctl = 0
    for line in stdout.splitlines():
        w = line.split()
        if "ops completed / failed" in line:
            row["ops"] = f"{w[-3]}/{w[-1]}"
        if len(w) >= 3 and w[0].isdigit() and w[1].isdigit() and int(w[0]) < 8:
            pk += int(w[1])
            if "control" in line:
                ctl += int(w[1])
    row["pkts_per_rank_op"] = pk / n
    row["control_share"] = ctl / pk if pk else 0
    # Data packets one rank sends per op, ideally: 2(N-1)/N of the tensor in chunks of 1372 B
    # (replaced below by the simulator's exact figure: every chunk of every shard once).
    row["ideal"] = 2 * (n - 1) / n * size_mb * 1e6 / 1372
    for line in stdout.splitlines():
        line = line.strip()
        # "packets per rank per op     1529.9 data (ideal 1512.0: every chunk once), 615.2 control (28.7% of all)"
        m = re.match(r"packets per rank per op\s+([\d.]+) data \(ideal ([\d.]+):.*?, ([\d.]+) control", line)
        if m:
            row["data_per_rank_op"], row["ideal"], row["control_per_rank_op"] = map(float, m.groups())
        # "control per rank per op     probe 276.1, bitmap 143.0, done 133.1, hello 63.0"
        if line.startswith("control per rank per op"):
            row["control_types"] = {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+)", line[23:])}
        # "per-rank peak (sampled)     state 202.1 KiB, tensor data 2.85 MiB, open transfers 189, queued datagrams 812"
        m = re.match(r"per-rank peak \(sampled\)\s+state ([\d.]+) KiB, tensor data ([\d.]+) MiB, "
                     r"open transfers (\d+), queued datagrams (\d+)", line)
        if m:
            row["state_kib"], row["tensor_mib"] = float(m.group(1)), float(m.group(2))
            row["open_transfers"], row["queued"] = int(m.group(3)), int(m.group(4))
        m = re.match(r"op time p50 / p99\s+([\d.]+) ms / ([\d.]+) ms", line)
        if m:
            row["op_p50_ms"], row["op_p99_ms"] = float(m.group(1)), float(m.group(2))
    return row


def check_wait_all():
    """wait_all: one process fails, one fails by itself within the grace, one would run
    on and is killed; the error names all three. And the log copy leaves configs behind."""
    def py(code):
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    procs = [py("import sys; sys.exit(0)"), py("import sys; sys.stderr.write('op 8 timeout'); sys.exit(3)"),
             py("import sys, time; time.sleep(0.5); sys.stderr.write('rank 2 waited on op 7'); sys.exit(4)"),
             py("import time; time.sleep(60)")]
    t0 = time.time()
    try:
        wait_all(procs, 30, "trainers", grace=2.0)
        raise AssertionError("wait_all returned although processes failed")
    except RuntimeError as e:
        msg = str(e)
    assert "[1] exit 3: op 8 timeout" in msg and "[2] exit 4: rank 2 waited on op 7" in msg, msg
    assert "[3] still running after 2 s, killed" in msg and time.time() - t0 < 10, msg
    assert all(p.poll() is not None for p in procs)
    with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as kept:
        for name in ("d0.log", "d0.stats.json", "d0.toml"):
            with open(os.path.join(work, name), "w") as f:
                f.write(name)
        old = os.environ.get("DLCP_BENCH_LOG_DIR")
        os.environ["DLCP_BENCH_LOG_DIR"] = kept
        try:
            Runner.keep_logs("dlcp1", work, failed=True)
        finally:
            if old is None:
                del os.environ["DLCP_BENCH_LOG_DIR"]
            else:
                os.environ["DLCP_BENCH_LOG_DIR"] = old
        (sub,) = os.listdir(kept)
        assert sub.endswith("-dlcp1-failed") and sorted(os.listdir(os.path.join(kept, sub))) == \
            ["d0.log", "d0.stats.json"], os.listdir(os.path.join(kept, sub))


def self_check():
    """Cheap checks of the harness's own logic (CI runs this; no root, no testbed)."""
    params = resnet50_params()
    assert len(params) == 161 and sum(params) == 25_557_032, (len(params), sum(params))
    b = resnet50_buckets()
    assert sum(b) == sum(params) and all(x * 4 <= 25 * MiB for x in b[:-1]), b
    assert pct(list(range(1, 21)), 50) == 10 or pct(list(range(1, 21)), 50) == 11
    assert pct(list(range(1, 21)), 99) == 20 and stats([3.0, 1.0, 2.0])["max"] == 3.0
    run = {"results": [{"elems": 1 << 28, "times": [1.0]}], "warmup": 1, "cpu_s": 4.0}
    assert abs(cpu_per_gib(run) - 2.0) < 1e-9
    assert combine("x", [{"cpu_s": 1, "results": [{"elems": 1, "times": [1, 5]}]},
                         {"cpu_s": 2, "results": [{"elems": 1, "times": [3, 2]}]}])["results"][0]["times"] == [3, 5]
    sample = ("  ops completed / failed      64 / 0\n"
              "  op time p50 / p99           3.251 ms / 3.254 ms (virtual)\n"
              "      2      25340    100.000%\n      7      39375    100.000% (control)\n"
              "  packets per rank per op     1529.9 data (ideal 1512.0: every chunk once), 615.2 control (28.7% of all)\n"
              "  control per rank per op     probe 276.1, bitmap 143.0, done 133.1, hello 63.0\n"
              "  per-rank peak (sampled)     state 202.1 KiB, tensor data 2.85 MiB, open transfers 189, "
              "queued datagrams 812\n")
    sim = parse_simulate(sample, 64, 1)
    assert sim["ops"] == "64/0" and abs(sim["pkts_per_rank_op"] - (25340 + 39375) / 64) < 1e-9, sim
    assert sim["ideal"] == 1512.0 and sim["control_per_rank_op"] == 615.2 and sim["data_per_rank_op"] == 1529.9, sim
    assert sim["control_types"] == {"probe": 276.1, "bitmap": 143.0, "done": 133.1, "hello": 63.0}, sim
    assert sim["state_kib"] == 202.1 and sim["open_transfers"] == 189 and sim["op_p99_ms"] == 3.254, sim
    check_measure()
    check_config_and_plan()
    check_report()
    check_wait_all()
    spine.check()
    assert parse_nft_counters("table inet x {\n\tcounter seen {\n\t\tpackets 7 bytes 900\n\t}\n}\n") == \
        {"seen": (7, 900)}
    print("harness self-check: ok (ResNet-50 161 tensors, 25557032 parameters, "
          f"{len(b)} buckets; percentiles, CPU/GiB, per-rep max over ranks; cgroup/proc CPU windows, "
          "drop counters, perf report parsing; default dlcpd config, plan at both MTUs; report tables)")


def check_measure():
    """The parsers of bench/measure.py on samples of what they read."""
    m = measure
    assert m.parse_mounts("tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n") \
        == "/sys/fs/cgroup/unified"
    assert m.parse_mounts("proc /proc proc rw 0 0\n") is None
    assert m.parse_cpu_stat("usage_usec 1500\nuser_usec 1000\n") == 1500 and m.parse_cpu_stat("") is None
    assert m.parse_proc_stat("cpu  10 1 20 300 4 5 6 7 0 0\ncpu0 1 1 1 1 1 1 1 1\n") == (49, 353)
    # The cgroup wrapper moves the shell into the group and execs: the pid written is the command's.
    with tempfile.NamedTemporaryFile("r") as f:
        r = subprocess.run(m.cg_wrap(f.name, ["sh", "-c", "echo $$"]), capture_output=True, text=True, check=True)
        assert f.read().strip() == r.stdout.strip() != "", (f.name, r.stdout)
    wins = [{"window": {"t0": 100.0, "t1": 103.0, "cg0": 5_000_000, "cg1": 9_000_000, "busy0": 1000, "busy1": 1500}},
            {"window": {"t0": 100.5, "t1": 104.0, "cg0": 5_500_000, "cg1": 9_500_000, "busy0": 1010, "busy1": 1600}}]
    w = m.window_cpu(wins)
    assert w == {"wall_s": 4.0, "cgroup_s": 4.5, "machine_s": 6.0}, w
    assert "cgroup_s" not in m.window_cpu([{"window": dict(wins[0]["window"], cg0=None)}])
    assert m.window_cpu([{}]) == {}
    run = {"results": [{"elems": 1 << 27, "times": [1.0]}], "warmup": 1, "cpu_s": 3.0, "cpu": w}
    f = cpu_figures(run, baseline_cores=0.5)  # 1 GiB reduced (2 reps of 512 MiB)
    assert f == {"proc": 3.0, "cgroup": 4.5, "machine": 6.0, "net": 4.0}, f
    assert cpu_per_gib(run) == 4.5 and cpu_per_gib(dict(run, cpu={})) == 3.0
    udp = m.parse_snmp_udp("Ip: Forwarding\nIp: 1\nUdp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors\n"
                           "Udp: 100 0 5 200 4\nUdpLite: InDatagrams\nUdpLite: 0\n")
    assert udp["RcvbufErrors"] == 4 and udp["InErrors"] == 5, udp
    dev = ("Inter-|   Receive |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes\n"
           "    lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n  eth0: 1000 10 0 3 0 0 0 0 2000 20 0 9 0 0 0 0\n")
    assert m.parse_netdev_rx_dropped(dev) == 3
    assert m.parse_netdev_drops(dev) == (3, 9) and m.parse_netdev_drops(dev, {"p0"}) == (0, 0)
    assert m.parse_softnet_drops("00001000 0000000a 00000001\n00002000 00000006 00000000\n") == 16
    tc = ("qdisc htb 1: root refcnt 2 r2q 10 default 0x10 direct_packets_stat 0 direct_qlen 1000\n"
          " Sent 123456 bytes 100 pkt (dropped 7, overlimits 2 requeues 0)\n backlog 0b 0p requeues 0\n"
          "qdisc pfifo 20: parent 1:10 limit 50p\n Sent 1000 bytes 10 pkt (dropped 3, overlimits 0 requeues 0)\n"
          "qdisc pfifo 21: parent 1:11 limit 50p\n Sent 1000 bytes 10 pkt (dropped 4, overlimits 0 requeues 0)\n")
    assert m.parse_qdisc_drops(tc) == 7
    assert m.KernelCounters.delta({"a": 1, "b": 5}, {"a": 4, "b": 5}) == {"a": 3, "b": 0}
    st = {"protocol": {"rx_dropped_packets_per_class": [0, 1, 2, 0, 0, 0, 0, 0],
                       "rx_dropped_unknown_class": {"packets": 3, "bytes": 9}, "rejected": {"early_dropped": 4},
                       "repairs_sent": 10},
          "datapath_counters": {"rx_truncated": 0, "rx_errors": 1,
                                "detail": {"kernel": {"RcvbufErrors": 7}, "rx_ring_overruns": 2, "gro_active": True}},
          "service": {"rx_debug_dropped": 0}}
    d = m.daemon_drops(st)
    assert d == {"protocol_rx_dropped": 6, "early_dropped": 4, "datapath_rx_truncated": 0, "datapath_rx_errors": 1,
                 "repairs_sent": 10, "datapath_counters.detail.kernel.RcvbufErrors": 7,
                 "datapath_counters.detail.rx_ring_overruns": 2}, d
    assert m.daemon_drops({}) == {} and m.daemon_drops({"protocol": {"repairs_sent": "x"}}) == {}
    assert m.sum_counters([{"a": 1}, {"a": 2, "b": 3}, {}]) == {"a": 3, "b": 3}
    rep = ("# Samples: 40K of event 'cpu-clock:pppH'\n# Overhead\tCommand\tShared Object\tSymbol\n#\n"
           " 12.50%  \tdlcpd          \tdlcpd              \t[.] blake3::platform::hash_many   \t-      -\n"
           "  8.00%  \tdlcpd          \t[kernel.kallsyms]  \t[k] copy_user_enhanced_fast_string\n"
           "  5.00%  \topt cgu.0      \tlibLLVM.so.22.1    \t[.] llvm::Foo<[u8; 8], (anonymous namespace)::X>\n"
           "  2.00%  \tdlcp-bench     \tlibc.so.6          \t[.] __memmove_avx_unaligned_erms\n\n"
           "#\n# (Tip: ...)\n")
    rows = m.parse_perf_report(rep)
    assert rows[0] == (12.5, "dlcpd", "dlcpd", "u", "blake3::platform::hash_many") and len(rows) == 4, rows
    assert rows[2] == (5.0, "opt cgu.0", "libLLVM.so.22.1", "u", "llvm::Foo<[u8; 8], (anonymous namespace)::X>"), rows
    sp = m.perf_split(rows)
    assert sp["dlcpd"] == {"k": 8.0, "u": 12.5} and sp["opt cgu.0"] == {"k": 0.0, "u": 5.0}, sp
    cats = m.perf_categories(rows + [(3.0, "dlcpd", "dlcpd", "u", "aws_lc_0_47_0_gcm_ghash_avx"),
                                     (1.0, "dlcpd", "dlcpd", "u", "dlcp_proto::endpoint::allreduce::Op::start"),
                                     (4.0, "swapper", "[kernel.kallsyms]", "k", "pv_native_safe_halt")], m.OURS)
    assert cats["kernel: copies to and from user space"] == 8.0 and cats["MAC (AES-GCM, aws-lc)"] == 3.0, cats
    assert cats["user copies (memcpy / memmove / memset)"] == 2.0, cats
    assert cats["protocol (dlcp_proto: ops, transfers, sums, timers)"] == 1.0, cats
    assert cats["other user space (service, trainer, floor, libc)"] == 12.5, "blake3 is not the MAC now"
    assert abs(sum(cats.values()) - 26.5) < 1e-9, "only dlcpd and dlcp-bench are counted"
    text = m.perf_summary("dlcp b1%", 5.0, rows, sp, cats)
    assert "dlcpd" in text and "kernel   8.00%" in text and "blake3::platform::hash_many" in text, text
    assert "  3.00%   11.3%  MAC (AES-GCM, aws-lc)" in text, text


def check_config_and_plan():
    """dlcpd runs its defaults (only identities, socket, MTU and needed shm sizes are set);
    the headline plan has clean and 1% loss at both MTUs, with the floor when clean."""
    import tomllib
    bed = Testbed("selfcheck")
    rn = Runner(bed, "/nonexistent", "/tmp", None, None)
    cfg = tomllib.loads(rn.dlcp_config(2, 4, "/tmp/x.sock"))
    assert set(cfg) == {"node", "peers", "control"}, cfg
    assert cfg["control"] == {"socket_path": "/tmp/x.sock"} and len(cfg["peers"]) == 4 and cfg["node"]["rank"] == 2
    assert set(cfg["node"]) == {"rank", "job_id", "job_secret"}, cfg["node"]
    bed.mtu = 9000
    cfg = tomllib.loads(rn.dlcp_config(0, 2, "/tmp/x.sock", Runner.shm_for([256 * MiB])))
    assert cfg["network"] == {"mtu": 9000} and cfg["shm"]["max_tensor_bytes"] == 256 * MiB, cfg
    assert cfg["shm"]["arena_bytes"] >= 512 * MiB
    assert Runner.shm_for([64 * MiB]) == "" and Runner.shm_for(buckets=[6_000_000] * 4) == ""
    odd = tomllib.loads(Runner.shm_for(buckets=[16_000_001] * 5))["shm"]  # 305 MB, not whole pages
    assert odd["arena_bytes"] % MiB == 0 and odd["arena_bytes"] >= 5 * 16_000_001 * 4, odd
    assert tomllib.loads(DLCP_PACED) == {"pacing": {"rate_mbps": PACED_MBPS}}
    assert tomllib.loads(DLCP_NOAUTH) == {"security": {"packet_auth": "none"}}
    rows = {"dlcp1": {"cpu": {"cgroup": 20.0}}, "dlcp1-noauth": {"cpu": {"cgroup": 18.0}}}
    assert abs(mac_share(rows) - 0.1) < 1e-12 and mac_share({"dlcp1": rows["dlcp1"]}) is None
    assert [cg_name(s) for s in ("dlcp1", "dlcp0", "dlcp1-paced", "gloo-bbr", "mpi", "floor")] == \
        ["dlcp", "dlcp", "dlcp", "gloo", "mpi", "floor"]
    for quick, size in ((True, 16 * MiB), (False, 64 * MiB)):
        bn = Bench.__new__(Bench)
        bn.quick, bn.ccs = quick, ["cubic", "bbr"]
        plan = {(c["cond"], c["mtu"]): c for c in bn.plan()}
        for cond in ("clean", "loss 1%"):
            for mtu in (1500, 9000):
                c = plan[(cond, mtu)]
                sys_ = [s for s, _ in c["systems"]]
                assert c["size"] == size and {"dlcp1", "dlcp0", "gloo", "mpi"} <= set(sys_), (cond, mtu, sys_)
                assert ("floor" in sys_) == (cond == "clean"), (cond, mtu, sys_)
                assert all(n >= (3 if quick else 5) for _, n in c["systems"]), c
        for mtu in (1500, 9000):
            assert "dlcp1-noauth" in [s for s, _ in plan[("clean", mtu)]["systems"]], "the MAC's share"
        if not quick:
            assert "dlcp1-paced" in [s for s, _ in plan[("clean", 1500)]["systems"]]
            main9000 = [(s, n) for s, n in plan[("clean", 9000)]["systems"] if s not in ("dlcp1-noflow", "dlcp1-path1")]
            assert all(n == 10 for s, n in main9000), "p50 over 10 reps"
            assert "dlcp1-noflow" in [s for s, _ in plan[("clean", 9000)]["systems"]], "flow control off row"
            assert "dlcp1-path1" in [s for s, _ in plan[("clean", 9000)]["systems"]], "one-path row"
    assert set(LABEL) >= {"dlcp1", "dlcp0", "dlcp1-paced", "floor", "gloo", "mpi"}


def check_report():
    """The results file's headline tables from synthetic rows."""
    import report_headline as rh

    def row(cond, mtu, s, p50, cg=None, extra=None):
        r = {"cond": cond, "mtu": mtu, "size": 64 * MiB, "system": s,
             "stats": {"n": 10, "p50": p50, "p99": p50 * 1.2, "max": p50 * 1.3},
             "cpu": {"proc": 1.0, "cgroup": cg, "machine": 2.0, "net": 1.5} if cg else {}}
        r.update(extra or {})
        return r
    h = [row("clean", 1500, "dlcp1", 1.0, 30.0, {"drops": {"protocol_rx_dropped": 5, "kernel.RcvbufErrors": 2},
                                                 "kernel": {"udp_rcvbuf_errors": 9}, "min_delivered_ppm": 990000,
                                                 "perf": {"file": "x-perf.txt", "seconds": 5.0,
                                                          "split": {"dlcpd": {"k": 40.0, "u": 30.0}}}}),
         row("clean", 1500, "gloo", 0.5, 15.0), row("clean", 1500, "mpi", 0.6, 16.0),
         row("clean", 1500, "floor", 0.4, 10.0, {"floor": {"lost": 0}, "kernel": {"udp_rcvbuf_errors": 0}}),
         row("clean", 9000, "dlcp1", 0.5, 16.0), row("clean", 9000, "gloo", 0.16, 6.0),
         row("loss 1%", 1500, "dlcp1", 1.1), row("loss 1%", 1500, "gloo", 4.8)]
    lead = "\n".join(rh.lead(h))
    assert "| 1500 | 1000 | – | 500 | 600 | 400 | 2.00 (Gloo) | – | 2.50 | – |" in lead, lead
    assert "| 9000 | 500 | – | 160 | – | – | 3.12 (Gloo) |" in lead, lead
    assert "| 1500 | 30.0 | – | 15.0 | 16.0 | 10.0 | 2.00 | 3.00 |" in lead, lead
    assert "| 1500 | 1100 / 1320 | – | 4800 / 5760 | – | 1.10 | 0.23 |" in lead, lead
    tables = "\n".join(rh.condition_tables(h, [{"cond": "clean", "mtu": 1500, "busy_cores": 0.25}]))
    assert "### clean, MTU 1500 — 64 MiB float32; idle baseline 0.25 busy cores" in tables
    assert "| dlcp b1% | 10 | 1000 | 1200 | 1300 | 0.54 | 30.0 | 2.0 (1.5) | 1.0 | 2.50 |  | 99.00% |" in tables, tables
    drops = "\n".join(rh.drops_section(h))
    assert "kernel.RcvbufErrors" in drops and "| clean, MTU 1500 | dlcp b1% | – | 5 | – | – | – | 2 | 9 |" in drops, drops
    floor_row = next(line for line in drops.splitlines() if line.startswith("| clean, MTU 1500 | floor (bare UDP) |"))
    assert floor_row.endswith("| 0 | – | – | – | 0 |"), floor_row
    assert "40.0% / 30.0%" in "\n".join(rh.perf_section(h))
    # Per datagram: dlcp 30 CPU-s/GiB over 6 GiB / 1372 B datagrams; half its samples the MAC.
    h[0]["perf"]["categories"] = {"MAC (AES-GCM, aws-lc)": 20.0, "kernel: other": 20.0}
    h[3]["perf"] = {"categories": {"MAC (AES-GCM, aws-lc)": 0.0, "kernel: other": 50.0}}
    costs = "\n".join(rh.datagram_costs(h))
    per = 30e6 / (6 * 2**30 / 1372)
    fl = 10e6 / (6 * 2**30 / 1460)
    assert f"| **all** | {per:.2f} | {fl:.2f} | {per - fl:+.2f} |" in costs, costs
    assert f"| MAC (AES-GCM, aws-lc) | {per / 2:.2f} | 0.00 | {per / 2:+.2f} |" in costs, costs
    assert "### MTU 1500: 1372 B per dlcp datagram, 1460 B per floor datagram" in costs, costs
    assert "MTU 9000" not in costs, "no perf at MTU 9000 in these rows"
    assert "| loss 1% | 1500 | 64 MiB |" in rh.summary_table(h)
    cfg = "\n".join(rh.config_section({"effective": "[node]\nrank = 0\n", "set": ["x"]}))
    assert "```toml\n[node]\nrank = 0\n```" in cfg and "- x" in cfg


def main():
    if sys.argv[1:] == ["--self-check"]:
        self_check()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bindir", default=os.path.join(ROOT, "target", "release"))
    ap.add_argument("--prefix", default="benchr")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default="",
                    help="comma list of steps: micro,datapath,headline,sizes,scaling,flow,spine,simulate")
    ap.add_argument("--conds", default="",
                    help="headline conditions to run, comma list of: clean,loss,congested (default all)")
    ap.add_argument("--systems", default="",
                    help="headline step: only these systems, in this order (a name may repeat, e.g. "
                         "'dlcp1,dlcp1-path1,dlcp1,dlcp1-path1' for an interleaved A/B; default: the plan's rows)")
    ap.add_argument("--reps", type=int, default=0, help="headline step: reps of every row (default: the plan's)")
    ap.add_argument("--sim-timeout", type=int, default=600, help="seconds per simulation")
    ap.add_argument("--spine-rate", type=int, default=0,
                    help=f"spine step: rate of the spine links in Mbit/s (default {spine.SPINE_MBPS})")
    ap.add_argument("--spine-reps", type=int, default=0,
                    help="spine step: reps of every system (default 10, 14 for dlcp, 5 for the bbr peers; 3 with --quick)")
    ap.add_argument("--spine-only", default="",
                    help="spine step: only these conditions and systems, 'cond[,cond...][:system,...]', e.g. "
                         "'spine1 loss 1%%:dlcp1' (default: every condition, every system)")
    ap.add_argument("--paths", type=int, default=0,
                    help="spine step: [network] paths = N for dlcpd, if it accepts the key (default: not set)")
    ap.add_argument("--load-note", default="", help="what else ran on the machine")
    ap.add_argument("--tag", default="", help="appended to the results' names (e.g. before / after)")
    ap.add_argument("--perf", type=float, nargs="?", const=5.0, default=0.0, metavar="SECONDS",
                    help="perf record -a -g for SECONDS (default 5) of each clean headline run's timed region; "
                         "summaries go to results/<base>-perf-*.txt")
    a = ap.parse_args()
    stamp = datetime.datetime.utcnow().strftime("%Y-%m-%d")
    host = socket.gethostname()
    if a.out is None:
        a.out = os.path.join(ROOT, "bench", "results")
    if a.tag and not re.fullmatch(r"[A-Za-z0-9._-]+", a.tag):
        ap.error("--tag: letters, digits, '.', '_' and '-' only")
    a.base = f"{stamp}-{host}" + ("-quick" if a.quick else "") + (f"-{a.tag}" if a.tag else "")
    os.makedirs(a.out, exist_ok=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    b = Bench(a)

    def on_signal(sig, frame):
        raise KeyboardInterrupt

    # SIGINT too: a harness started where SIGINT is ignored (in the background of a
    # non-interactive shell) must still clean up when it gets one.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sys.exit(b.run_all())


if __name__ == "__main__":
    main()
