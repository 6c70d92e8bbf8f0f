#!/usr/bin/env python3
"""Where a machine-wide `perf record -a -g` spent its samples, by stage of the network path.

Every sample is put in one bucket: user space of dlcpd, of the trainers (python3) or of anything
else, or, for kernel samples, the stage of the innermost (closest to the leaf) frame of its call
chain that names one: the UDP or TCP socket calls, the IP receive path (route lookup, local
delivery), the emulated switch (bridge, qdisc, veth), the softirq plumbing around them, GSO
segmentation, scheduling, idle. So a UDP receive that is run inside a sender's `sendmmsg` (the
softirq at the end of the system call) counts as receive, not as send: the stage is the work, not
the context. With `--step-ms` the shares become CPU-ms per training step (2 CPUs busy for
`step` ms is 2 x step CPU-ms), which is how two runs of different step times compare.

    perf record -a -g -F 999 -o dlcp.data -- sleep 10     # inside a run of the task
    bench/perf_stages.py dlcp.data --step-ms 252 --cpus 2
"""
import argparse
import collections
import subprocess
import sys

# (kernel function, stage): a frame matches the function or its `function_*` helpers (whole words,
# compiler suffixes and leading underscores ignored); the first frame from the leaf that matches
# any decides.
STAGES = (
    ("__udp_enqueue_schedule_skb", "rx softirq: UDP deliver to socket"),
    ("udp_queue_rcv_skb", "rx softirq: UDP deliver to socket"),
    ("udp_queue_rcv_one_skb", "rx softirq: UDP deliver to socket"),
    ("udp_unicast_rcv_skb", "rx softirq: UDP deliver to socket"),
    ("__udp4_lib_rcv", "rx softirq: UDP receive"),
    ("udp_rcv", "rx softirq: UDP receive"),
    ("tcp_v4_rcv", "rx softirq: TCP receive"),
    ("tcp_v4_do_rcv", "rx softirq: TCP receive"),
    ("ip_forward", "switch: IP forward"),
    ("br_handle_frame", "switch: bridge"),
    ("br_forward", "switch: bridge"),
    ("ip_route_input", "IP receive: route lookup"),
    ("ip_rcv", "IP receive"),
    ("ip_local_deliver", "IP receive: local delivery"),
    ("__qdisc_run", "qdisc"),
    ("sch_direct_xmit", "qdisc"),
    ("dev_qdisc_enqueue", "qdisc"),
    ("veth_xmit", "veth transmit"),
    ("__dev_queue_xmit", "device transmit"),
    ("dev_gro_receive", "GRO: merging"),
    ("napi_gro_receive", "GRO: merging"),
    ("gro_receive_skb", "GRO: merging"),
    ("veth_poll", "veth receive (NAPI)"),
    ("__netif_receive_skb", "softirq: other receive plumbing"),
    ("process_backlog", "softirq: other receive plumbing"),
    ("net_rx_action", "softirq: other receive plumbing"),
    ("udp_recvmsg", "syscall: UDP recvmsg"),
    ("tcp_recvmsg", "syscall: TCP recvmsg"),
    ("__sys_recvmmsg", "syscall: recvmmsg, other"),
    ("____sys_recvmsg", "syscall: recvmmsg, other"),
    ("__udp_gso_segment", "GSO segmentation"),
    ("skb_segment", "GSO segmentation"),
    ("ip_make_skb", "send: UDP build + copy"),
    ("udp_send_skb", "send: UDP send_skb"),
    ("udp_sendmsg", "send: UDP other"),
    ("__sys_sendmmsg", "send: sendmmsg other"),
    ("____sys_sendmsg", "send: sendmmsg other"),
    ("tcp_write_xmit", "send: TCP"),
    ("tcp_sendmsg", "send: TCP"),
    ("tcp_ack", "TCP ACK processing"),
    ("ep_poll", "epoll: waits and wake-ups"),
    ("do_sys_poll", "poll"),
    ("futex", "futex"),
    ("do_futex", "futex"),
    ("__x64_sys_futex", "futex"),
    ("schedule", "scheduler"),
    ("do_idle", "idle"),
    ("exc_page_fault", "page faults"),
)


def classify(frames, comm):
    """The bucket of one sample: `frames` leaf first, as `perf script` prints them."""
    if not frames or "kernel.kallsyms" not in frames[0]:
        if "dlcpd" in comm:
            return "user: dlcpd"
        if comm.startswith(("python", "pt_")):
            return "user: trainers"
        return "user: other"
    for f in frames:
        parts = f.split()
        name = function(parts[1] if len(parts) > 1 else "")
        for key, stage in STAGES:
            if matches(name, key):
                return "kernel: " + stage
    return "kernel: other"


def function(sym: str) -> str:
    """A symbol without its compiler suffix (`.constprop.0`, `.part.0`, `.isra.0`) and leading `_`s."""
    return sym.split(".")[0].lstrip("_")


def matches(name: str, key: str) -> bool:
    """`name` is the function `key` or one of its `key_*` helpers: whole words, so `schedule`
    is not `__udp_enqueue_schedule_skb`."""
    key = key.lstrip("_")
    return name == key or name.startswith(key + "_")


def stages(data: str) -> tuple[collections.Counter, int]:
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,ip,sym,dso"],
                         capture_output=True, text=True, check=True).stdout
    counts, total = collections.Counter(), 0
    for sample in out.split("\n\n"):
        lines = [ln.strip() for ln in sample.strip().split("\n") if ln.strip()]
        if len(lines) < 2:
            continue
        total += 1
        counts[classify(lines[1:], lines[0].split()[0])] += 1
    return counts, total


def self_check() -> None:
    """classify() on call chains as `perf script` prints them (leaf first)."""
    k = "([kernel.kallsyms])"
    cases = (
        # A UDP receive run in a sender's softirq is receive work, not send work.
        ([f"ffff __udp_enqueue_schedule_skb {k}", f"ffff udp_queue_rcv_skb {k}", f"ffff udp_rcv {k}",
          f"ffff net_rx_action {k}", f"ffff udp_sendmsg {k}", f"ffff __sys_sendmmsg {k}"], "dlcpd",
         "kernel: rx softirq: UDP deliver to socket"),
        # udp_rcv and __udp4_lib_rcv inlined, as on Debian's 6.x kernels.
        ([f"ffff _raw_spin_lock {k}", f"ffff __udp_enqueue_schedule_skb {k}", f"ffff udp_queue_rcv_one_skb {k}",
          f"ffff udp_unicast_rcv_skb {k}", f"ffff ip_protocol_deliver_rcu {k}", f"ffff ip_local_deliver_finish {k}"],
         "dlcpd", "kernel: rx softirq: UDP deliver to socket"),
        ([f"ffff skb_gro_receive {k}", f"ffff udp_gro_receive {k}", f"ffff inet_gro_receive {k}",
          f"ffff dev_gro_receive {k}", f"ffff veth_poll {k}"], "dlcpd", "kernel: GRO: merging"),
        ([f"ffff fdb_find_rcu {k}", f"ffff br_handle_frame {k}", f"ffff __netif_receive_skb {k}"], "python3",
         "kernel: switch: bridge"),
        ([f"ffff htb_dequeue {k}", f"ffff __qdisc_run {k}", f"ffff br_forward {k}"], "dlcpd", "kernel: qdisc"),
        ([f"ffff _copy_to_iter {k}", f"ffff udp_recvmsg {k}", f"ffff __sys_recvmmsg {k}"], "dlcpd",
         "kernel: syscall: UDP recvmsg"),
        ([f"ffff fib_table_lookup {k}", f"ffff ip_route_input_slow {k}", f"ffff ip_rcv_finish {k}"], "dlcpd",
         "kernel: IP receive: route lookup"),
        ([f"ffff finish_task_switch.isra.0 {k}", f"ffff __schedule {k}", f"ffff schedule_hrtimeout_range {k}"],
         "dlcpd", "kernel: scheduler"),
        ([f"ffff _raw_spin_lock {k}", f"ffff futex_wait_setup {k}", f"ffff do_futex {k}"], "python3",
         "kernel: futex"),
        ([f"ffff native_write_msr {k}"], "swapper", "kernel: other"),
        (["7f00 aws_lc_gcm_ghash (/usr/bin/dlcpd)"], "dlcpd", "user: dlcpd"),
        (["7f00 sgemm_kernel (/usr/lib/libopenblas.so)"], "python3", "user: trainers"),
        (["7f00 main (/usr/bin/iperf3)"], "iperf3", "user: other"),
    )
    for frames, comm, want in cases:
        got = classify(frames, comm)
        assert got == want, f"{frames[0]} ({comm}): {got!r}, want {want!r}"
    print(f"perf_stages self-check ok ({len(cases)} call chains)")


def main() -> int:
    if sys.argv[1:] == ["--self-check"]:
        self_check()
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", nargs="+", help="perf.data files (one column each); --self-check alone: CI's check")
    ap.add_argument("--step-ms", default="", help="comma list, one per file: CPU-ms per step instead of %%")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs the recording covered [2]")
    a = ap.parse_args()
    steps = [float(s) for s in a.step_ms.split(",")] if a.step_ms else []
    if steps and len(steps) != len(a.data):
        ap.error("--step-ms needs one value per file")
    cols = [stages(d) for d in a.data]
    keys = sorted({k for c, _ in cols for k in c}, key=lambda k: -max(c[k] / t for c, t in cols))
    unit = "CPU-ms per step" if steps else "% of samples"
    print(f"| stage ({unit}) | " + " | ".join(a.data) + " |")
    print("|---|" + "---:|" * len(a.data))
    for k in keys:
        vals = []
        for i, (c, t) in enumerate(cols):
            share = c[k] / t if t else 0.0
            vals.append(f"{share * a.cpus * steps[i]:.0f}" if steps else f"{100 * share:.1f}")
        print(f"| {k} | " + " | ".join(vals) + " |")
    print("| samples | " + " | ".join(str(t) for _, t in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
