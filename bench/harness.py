#!/usr/bin/python3
"""dlcp benchmark harness: runs everything bench/run.sh promises on the emulated
cluster of scripts/testbed.sh and writes bench/results/<date>-<host>.md + PNGs.

Systems, all over the same namespaces, veths (offloads off), switch qdiscs:
  dlcp b1%   dlcpd (socket datapath) + dlcp-bench trainer (Rust client), budget 1%
  dlcp b0    the same, budget 0 (reliable, bit-exact)
  gloo       torch.distributed Gloo (bench/peer.py), GLOO_SOCKET_IFNAME=eth0
  mpi        Open MPI MPI_Allreduce via mpi4py (bench/peer.py), TCP BTL on eth0
TCP peers run under a congestion control set per host namespace (cubic or bbr).

Every run prints progress to stderr; summary lines `NAME: dlcp X, peer Y, ratio R`
to stdout. Teardown (daemons, testbed, sysctl) happens in `finally` blocks; run.sh
adds a trap on top.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTBED = os.path.join(ROOT, "scripts", "testbed.sh")
PEER = os.path.join(ROOT, "bench", "peer.py")
PY = "/usr/bin/python3"
MiB = 1 << 20
JOB = 7
PORT = 7702
# dlcpd's only non-default setting here: pace each daemon's sends at PACING_MBPS.
# Unpaced, four daemons on two cores overran the veths' receive path and repaired
# half their packets (16 MiB op 1.9 s unpaced, 1.5 s paced at 1 Gbit/s, repairs
# 77397 -> 147) — before PROBEs stopped overtaking their data. Since then (quick
# run, quiet machine, 16 MiB p50): unpaced 720 ms, 1 Gbit/s 662 ms, 3 Gbit/s 608 ms;
# at 1 Gbit/s a daemon pair reached only 0.54x iperf3 UDP, at 3 Gbit/s 1.02x.
PACING_MBPS = 3000
DLCP_PACING = f"[pacing]\nrate_mbps = {PACING_MBPS}\n"
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
        self.env = dict(os.environ, DLCPTB_PREFIX=prefix)

    def ns(self, h):
        return f"{self.prefix}-h{h}"

    def up(self, hosts, loss=None, rate=None, rate_ports=None, mtu=None):
        args = [TESTBED, "up", "--hosts", str(hosts)]
        if loss:
            args += ["--loss", str(loss)]
        if rate:
            args += ["--rate", str(rate)]
        if rate_ports is not None:
            args += ["--rate-ports", rate_ports]
        if mtu:
            args += ["--mtu", str(mtu)]
        sh(args, env=self.env)
        self.hosts = hosts
        self.desc = f"{hosts} hosts, loss {loss or 0}%, rate {rate or 'none'} Mbit/s on ports {rate_ports or 'all'}"

    def down(self):
        sh([TESTBED, "down"], check=False, env=self.env)
        self.hosts = 0

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


def proc_cpu(pid):
    """CPU seconds (user+system) of a process, from /proc (USER_HZ = 100)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / 100.0
    except (OSError, IndexError, ValueError):
        return 0.0


def wait_all(procs, timeout, what):
    """Wait for every Popen; kill them all if the deadline passes. Returns stdouts."""
    deadline = time.time() + timeout
    outs = []
    for p in procs:
        left = max(0.1, deadline - time.time())
        try:
            out, err = p.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"{what}: timed out after {timeout} s")
        if p.returncode != 0:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            raise RuntimeError(f"{what}: exit {p.returncode}: {err.strip()[-1500:]}")
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
    out = {"system": system, "results": results, "cpu_s": cpu}
    if "min_delivered_ppm" in per_rank[0]:
        out["min_delivered_ppm"] = min(r["min_delivered_ppm"] for r in per_rank)
        out["repairs"] = sum(r["repairs"] for r in per_rank)
    return out


def workload_args(sizes=None, buckets=None):
    if sizes:
        return ["--sizes", ",".join(str(s // 4) for s in sizes)]
    return ["--buckets", ",".join(str(b) for b in buckets)]


class Runner:
    def __init__(self, bed, bindir, workdir):
        self.bed = bed
        self.bindir = bindir
        self.workdir = workdir

    # ---------------- dlcp
    def dlcp_config(self, rank, hosts, sockpath, extra=""):
        t = (f"[node]\nrank = {rank}\njob_id = {JOB}\njob_secret = \"dlcp benchmark secret 0123456789\"\n"
             f"generation = \"auto\"\n\n")
        for r in range(hosts):
            t += f"[[peers]]\nrank = {r}\naddress = \"10.77.0.{r + 1}\"\nport = {PORT}\n\n"
        t += ("[network]\nheartbeat_interval_ms = 100\npeer_timeout_ms = 2000\n\n"
              "[loss]\nhard_timeout_ms = 30000\n\n"
              f"[control]\nsocket_path = \"{sockpath}\"\nsocket_mode = \"0600\"\n\n"
              "[shm]\narena_bytes = 536870912\nmax_tensor_bytes = 268435456\n\n"
              f"[log]\nlevel = \"warn\"\n\n{DLCP_PACING}{extra}\n")
        return t

    def start_daemons(self, hosts, extra=""):
        """extra: TOML appended to every host's config, or a function of the host giving it."""
        d = tempfile.mkdtemp(prefix="dlcpd-", dir=self.workdir)
        daemons, socks = [], []
        for h in range(hosts):
            sock = os.path.join(d, f"d{h}.sock")
            cfg = os.path.join(d, f"d{h}.toml")
            with open(cfg, "w") as f:
                f.write(self.dlcp_config(h, hosts, sock, extra(h) if callable(extra) else extra))
            logf = open(os.path.join(d, f"d{h}.log"), "w")
            p = subprocess.Popen(["ip", "netns", "exec", self.bed.ns(h), os.path.join(self.bindir, "dlcpd"),
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

    def run_dlcp(self, hosts, budget_ppm, reps, warmup, sizes=None, buckets=None, timeout=900, extra=""):
        daemons, socks, d = self.start_daemons(hosts, extra)
        try:
            cpu0 = sum(proc_cpu(p.pid) for p in daemons)
            procs = []
            for h in range(hosts):
                args = ["ip", "netns", "exec", self.bed.ns(h), os.path.join(self.bindir, "dlcp-bench"), "trainer",
                        "--socket", socks[h], "--job", str(JOB), "--reps", str(reps), "--warmup", str(warmup),
                        "--budget-ppm", str(budget_ppm), "--seed", str(1000 * h + 1), "--timeout-s", "120"]
                args += workload_args(sizes, buckets)
                procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            outs = wait_all(procs, timeout, "dlcp trainers")
            cpu = sum(proc_cpu(p.pid) for p in daemons) - cpu0
            name = f"dlcp b{budget_ppm / 10000:g}%"
            r = combine(name, parse_json_lines(outs), extra_cpu=cpu)
            st = sh([os.path.join(self.bindir, "dlcpctl"), "--socket", socks[0], "status", "--json"], check=False)
            try:
                r["datapath"] = json.loads(st.stdout).get("datapath", "")
            except ValueError:
                r["datapath"] = ""
            return r
        finally:
            self.stop_daemons(daemons)
            if os.environ.get("DLCP_BENCH_KEEP_LOGS") != "1":
                shutil.rmtree(d, ignore_errors=True)

    # ---------------- Gloo
    def run_gloo(self, hosts, reps, warmup, sizes=None, buckets=None, timeout=900, cc=None):
        env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0")
        port = 29500 + int(time.time()) % 1000
        procs = []
        for h in range(hosts):
            args = ["ip", "netns", "exec", self.bed.ns(h), PY, PEER, "--backend", "gloo", "--rank", str(h),
                    "--world", str(hosts), "--master", f"10.77.0.1:{port}", "--reps", str(reps),
                    "--warmup", str(warmup), "--seed", str(1000 * h + 1)]
            args += workload_args(sizes, buckets)
            procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        outs = wait_all(procs, timeout, "gloo ranks")
        return combine(f"gloo {cc}" if cc else "gloo", parse_json_lines(outs))

    # ---------------- Open MPI
    def run_mpi(self, hosts, reps, warmup, sizes=None, buckets=None, timeout=900, cc=None):
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
        args = ["ip", "netns", "exec", self.bed.ns(0), "mpirun", "--allow-run-as-root", "--oversubscribe",
                "-x", "PMIX_MCA_ptl_tcp_remote_connections", "-x", "PMIX_MCA_ptl_tcp_if_include",
                "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "eth0",
                "--mca", "oob_tcp_if_include", "eth0"] + app
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
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

    def run(self, system, hosts, reps, warmup, sizes=None, buckets=None, extra=""):
        """system: 'dlcp1', 'dlcp0', 'gloo', 'mpi', 'gloo-bbr', 'mpi-bbr', ..."""
        t0 = time.time()
        if system.startswith("dlcp"):
            r = self.run_dlcp(hosts, 10000 if system == "dlcp1" else 0, reps, warmup, sizes, buckets, extra=extra)
        else:
            base, _, cc = system.partition("-")
            cc = cc or "cubic"
            self.bed.set_cc(cc)
            fn = self.run_gloo if base == "gloo" else self.run_mpi
            r = fn(hosts, reps, warmup, sizes, buckets, cc=cc)
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


def cpu_per_gib(run):
    """CPU seconds of all ranks (and daemons) per GiB of tensor reduced; the CPU
    counted covers the warm-up reps too, so they are counted in the GiB."""
    gib = sum(r["elems"] * 4 * (len(r["times"]) + run["warmup"]) for r in run["results"]) / (1 << 30)
    return run["cpu_s"] / gib if gib else float("nan")


LABEL = {"dlcp1": "dlcp b1%", "dlcp0": "dlcp b0", "gloo": "Gloo cubic", "gloo-bbr": "Gloo bbr",
         "mpi": "Open MPI cubic", "mpi-bbr": "Open MPI bbr"}


def ms(x):
    return f"{x * 1000:.0f}" if x >= 0.1 else f"{x * 1000:.1f}"


# ---------------------------------------------------------------- benchmarks
class Bench:
    def __init__(self, a):
        self.a = a
        self.quick = a.quick
        self.bed = Testbed(a.prefix)
        self.workdir = tempfile.mkdtemp(prefix="dlcp-bench-")
        self.runner = Runner(self.bed, a.bindir, self.workdir)
        self.summary = []  # (name, dlcp, peer, ratio, unit)
        self.md = []
        self.data = {"micro": [], "datapath": {}, "headline": [], "sizes": [], "model": [], "scaling": [],
                     "sim": []}
        self.saved_allowed_cc = None
        self.errors = []
        self.base = a.base
        self.log = log

    def line(self, name, dlcp, peer, unit, peer_name, lower_better=False):
        ratio = (peer / dlcp if lower_better else dlcp / peer) if dlcp and peer else float("nan")
        s = f"{name}: dlcp {dlcp:.4g} {unit}, peer {peer:.4g} {unit} ({peer_name}), ratio {ratio:.2f}"
        print(s, flush=True)
        self.summary.append(s)

    # ---- machine-wide: allow cubic for the TCP peers, restore after
    def allow_cc(self):
        cur = sh(["sysctl", "-n", "net.ipv4.tcp_allowed_congestion_control"]).stdout.strip()
        avail = sh(["sysctl", "-n", "net.ipv4.tcp_available_congestion_control"]).stdout.split()
        want = cur.split()
        for cc in ("cubic", "bbr"):
            if cc in avail and cc not in want:
                want.append(cc)
        if want != cur.split():
            self.saved_allowed_cc = cur
            with open(CC_SAVE, "w") as f:
                f.write(cur)
            sh(["sysctl", "-q", "-w", f"net.ipv4.tcp_allowed_congestion_control={' '.join(want)}"])
        self.ccs = [c for c in ("cubic", "bbr") if c in want]

    def restore_cc(self):
        if self.saved_allowed_cc is not None:
            sh(["sysctl", "-q", "-w", f"net.ipv4.tcp_allowed_congestion_control={self.saved_allowed_cc}"],
               check=False)
            self.saved_allowed_cc = None
            try:
                os.unlink(CC_SAVE)
            except OSError:
                pass

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
            time.sleep(0.5)
            secs = "3" if self.quick else "6"
            args = ["ip", "netns", "exec", self.bed.ns(0), "iperf3", "-c", "10.77.0.2", "-p", "5201", "-t", secs,
                    "--bidir", "-J"]
            if mode == "udp":
                # Same socket buffers (4 MiB) and pace (PACING_MBPS) as dlcpd here; unpaced
                # (-b 0) UDP loses over half its datagrams at the receiver on two cores.
                args += ["-u", "-b", f"{PACING_MBPS}M", "-w", "4M", "-l", "1472"]
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
                      f"iperf3 UDP 1472 B paced at {PACING_MBPS / 1000:g} Gbit/s like dlcpd, 4 MiB buffers, --bidir")
            self.line("datapath_vs_iperf3_tcp", dl, tcp, "Mbit/s", "iperf3 TCP, --bidir")
            self.dpdk_datapath(size, reps, udp)
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
    def conditions(self):
        if self.quick:
            return [("clean", {}), ("loss 1%", {"loss": 1})]
        return [("clean", {}), ("loss 0.1%", {"loss": 0.1}), ("loss 1%", {"loss": 1}),
                ("congested port", {"rate": 300, "rate_ports": "0", "cross": 400})]

    def cross_traffic(self, hosts, mbps):
        """Best-effort (DSCP 0) iperf3 UDP from an extra host into host 0's bottleneck port."""
        src = hosts  # the extra host
        srv = subprocess.Popen(["ip", "netns", "exec", self.bed.ns(0), "iperf3", "-s", "-p", "5302"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        cli = subprocess.Popen(["ip", "netns", "exec", self.bed.ns(src), "iperf3", "-u", "-c", "10.77.0.1",
                                "-p", "5302", "-b", f"{mbps}M", "-l", "1400", "-t", "3600", "--tos", "0"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        return [cli, srv]

    def plan(self):
        """(condition, testbed args, size, [(system, reps)]) of the headline."""
        if self.quick:
            trio = [("dlcp1", 5), ("gloo", 5), ("mpi", 5)]
            return [("clean", {}, 16 * MiB, trio), ("loss 1%", {"loss": 1}, 16 * MiB, trio)]
        # >= 20 reps for the 64 MiB headline trio; the secondary systems (dlcp budget 0,
        # the TCP peers under bbr) and the slow congested-port runs get fewer, to keep
        # the full run near 30 minutes on two cores.
        bbr = [(f"{p}-bbr", 5) for p in ("gloo", "mpi") if "bbr" in self.ccs]
        trio = [("dlcp1", 20), ("gloo", 20), ("mpi", 20)]
        main = trio[:1] + [("dlcp0", 5)] + trio[1:]
        return [("clean", {}, 64 * MiB, main + bbr),
                ("loss 0.1%", {"loss": 0.1}, 64 * MiB, trio),
                ("loss 1%", {"loss": 1}, 64 * MiB, main + bbr),
                ("congested port", {"rate": 300, "rate_ports": "0", "cross": 400}, 16 * MiB,
                 [("dlcp1", 5), ("dlcp0", 3), ("gloo", 3), ("mpi", 3)])]

    def headline(self):
        hosts = 4
        for cname, c, csize, systems in self.plan():
            congested = "cross" in c
            log(f"headline: {cname}, {csize // MiB} MiB, {hosts} hosts: "
                + ", ".join(f"{s} x{n}" for s, n in systems))
            self.bed.up(hosts + (1 if congested else 0), loss=c.get("loss"), rate=c.get("rate"),
                        rate_ports=c.get("rate_ports"))
            extra = []
            try:
                if congested:
                    extra = self.cross_traffic(hosts, c["cross"])
                for s, reps in systems:
                    try:
                        r = self.runner.run(s, hosts, reps, 1, sizes=[csize])
                    except Exception as e:  # a peer failing is a result, not the end of the run
                        log(f"  {s}: FAILED: {e}")
                        self.errors.append(f"{cname} {s}: {e}")
                        continue
                    st = stats(r["results"][0]["times"])
                    log(f"  {LABEL.get(s, s)}: p50 {ms(st['p50'])} ms p99 {ms(st['p99'])} ms max "
                        f"{ms(st['max'])} ms ({r['wall_s']:.0f} s)")
                    self.data["headline"].append({"cond": cname, "size": csize, "system": s, "stats": st,
                                                  "cpu_per_gib": cpu_per_gib(r), "times": r["results"][0]["times"],
                                                  "min_delivered_ppm": r.get("min_delivered_ppm")})
                    if cname == "clean" and s in ("dlcp1", "gloo", "mpi"):
                        self.data["sizes"].append({"cond": cname, "system": s, "size": csize, "stats": st})
                if c.get("loss"):
                    seen, dropped = self.bed.loss_counters()
                    log(f"  nftables: {dropped} of {seen} packets dropped ({100 * dropped / max(seen, 1):.2f}%)")
            finally:
                for p in extra:
                    p.kill()
                    p.wait()
                self.bed.down()
            self.headline_lines(cname, csize)

    def headline_lines(self, cname, size):
        rows = {h["system"]: h for h in self.data["headline"] if h["cond"] == cname}
        d = rows.get("dlcp1")
        if not d:
            return
        tag = cname.replace(" ", "_").replace("%", "pct").replace(".", "p")
        for peer in ("gloo", "mpi"):
            if peer in rows:
                self.line(f"allreduce_{size // MiB}MiB_{tag}_p99_vs_{peer}", d["stats"]["p99"] * 1000,
                          rows[peer]["stats"]["p99"] * 1000, "ms", LABEL[peer], lower_better=True)

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
                 ("sizes", self.sizes), ("scaling", self.scaling), ("simulate", self.simulate)]
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
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.elapsed = time.time() - T_START
        self.data["run"] = {"summary": self.summary, "errors": self.errors, "elapsed_s": self.elapsed,
                            "load_note": self.a.load_note, "quick": self.quick}
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
    # Data packets one rank sends per op, ideally: 2(N-1)/N of the tensor in chunks of 1392 B
    # (replaced below by the simulator's exact figure: every chunk of every shard once).
    row["ideal"] = 2 * (n - 1) / n * size_mb * 1e6 / 1392
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
    print("harness self-check: ok (ResNet-50 161 tensors, 25557032 parameters, "
          f"{len(b)} buckets; percentiles, CPU/GiB, per-rep max over ranks)")


def main():
    if sys.argv[1:] == ["--self-check"]:
        self_check()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bindir", default=os.path.join(ROOT, "target", "release"))
    ap.add_argument("--prefix", default="benchr")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default="", help="comma list of steps: micro,datapath,headline,sizes,scaling,simulate")
    ap.add_argument("--sim-timeout", type=int, default=600, help="seconds per simulation")
    ap.add_argument("--load-note", default="", help="what else ran on the machine")
    a = ap.parse_args()
    stamp = datetime.datetime.utcnow().strftime("%Y-%m-%d")
    host = socket.gethostname()
    if a.out is None:
        a.out = os.path.join(ROOT, "bench", "results")
    a.base = f"{stamp}-{host}" + ("-quick" if a.quick else "")
    os.makedirs(a.out, exist_ok=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    b = Bench(a)

    def on_signal(sig, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    sys.exit(b.run_all())


if __name__ == "__main__":
    main()
