#!/usr/bin/env bash
# Packet rate of dlcp's datapaths on the same veth, in one run (root):
# namespaces ${P}a (sender) and ${P}b (receiver, a socket datapath), one veth
# pair between them (offloads off, like the testbed). The sender runs first on
# the socket datapath, then on the DPDK datapath with net_af_packet and with
# net_af_xdp on the same veth (its IP address removed: dlcp answers ARP itself). Sender and receiver
# are pinned to different CPUs. The three alternate, REPS times (default 3, env
# DLCP_BENCH_REPS), so a busy machine's swings hit all of them; prints every run
# and the median datagrams/s sent and received per datapath and size.
#
#   scripts/bench_datapath.sh [SECS] [SIZE...]     default 3 s, sizes 1472 and 64
#
# DLCP_BENCH_SEND=lend sends as dlcpd does (datagrams lent as header | payload
# slice | tag, 256 at a time: no user-space copy on the socket datapath, one
# copy into the mbuf on DPDK) instead of one copied buffer per datagram.
# DLCP_BENCH_KINDS chooses the senders (default "socket af_packet af_xdp");
# "null" is the DPDK datapath on net_null, which drops every frame: the
# datapath's own CPU cost per datagram, with no kernel and no receiver (its
# received/s is 0).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-3}; shift || true
SIZES=("${@:-1472}"); [ $# -gt 0 ] || SIZES=(1472 64)
P=${DLCP_BENCH_PREFIX:-dpdkb}
A=${P}a B=${P}b
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; }
trap cleanup EXIT
cleanup
cargo build --release --locked --example datapath_bench >&2
BIN=target/release/examples/datapath_bench
ip netns add "$A"; ip netns add "$B"
ip -n "$A" link add eth0 type veth peer name eth0 netns "$B"
for ns in "$A" "$B"; do
  ip -n "$ns" link set lo up
  ip netns exec "$ns" ethtool -K eth0 tso off gso off gro off tx-udp-segmentation off >/dev/null 2>&1 || true
  ip -n "$ns" link set eth0 mtu 9000 up   # room for 8972-byte datagrams unfragmented
done
ip -n "$B" addr add 10.79.0.2/24 dev eth0

REPS=${DLCP_BENCH_REPS:-3}
MODE=${DLCP_BENCH_SEND:-send}
read -r -a KINDS <<<"${DLCP_BENCH_KINDS:-socket af_packet af_xdp}"
RESULTS=$(mktemp)
printf '%-10s %6s %14s %14s  %s\n' datapath size "sent/s" "received/s" "sender"
for size in "${SIZES[@]}"; do
 for rep in $(seq "$REPS"); do
  for kind in "${KINDS[@]}"; do
    if [ "$kind" = socket ]; then
      ip -n "$A" addr replace 10.79.0.1/24 dev eth0
      eal=()
    elif [ "$kind" = null ]; then
      eal=(--no-huge --no-pci --no-shconf --no-telemetry -m 256 -l 1 --file-prefix "$P" --vdev=net_null0)
    else
      ip -n "$A" addr flush dev eth0
      ip -n "$B" neigh flush all
      eal=(--no-huge --no-pci --no-shconf --no-telemetry -m 256 -l 1 --file-prefix "$P"
           "--vdev=net_${kind}0,iface=eth0")
    fi
    out=$(mktemp)
    ip netns exec "$B" taskset -c 0 "$BIN" recv 10.79.0.2:7800 "$SECS" >"$out" &
    rpid=$!
    sleep 0.3
    dp=dpdk; [ "$kind" = socket ] && dp=socket
    s=$(ip netns exec "$A" taskset -c 1 "$BIN" "$MODE" "$dp" 10.79.0.1:7800 10.79.0.2:7800 "$SECS" "$size" "${eal[@]}" 2>/dev/null | tail -1)
    wait "$rpid"
    r=$(cat "$out"); rm -f "$out"
    py='import json,sys; s=json.loads(sys.argv[1]); r=json.loads(sys.argv[2]); print("%-10s %6d %14.0f %14.0f  %s" % (sys.argv[3], s["size"], s["pps"], r["pps"], s["datapath"][:60]))'
    python3 -c "$py" "$s" "$r" "$kind"
    echo "$kind $size $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["pps"], json.loads(sys.argv[2])["pps"])' "$s" "$r")" >>"$RESULTS"
  done
 done
done
echo
echo "median of $REPS runs of ${SECS} s (datagrams/s), mode $MODE:"
python3 - "$RESULTS" <<'PY'
import sys, statistics, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    kind, size, sent, recv = line.split()
    runs[(int(size), kind)].append((float(sent), float(recv)))
print("%-10s %6s %14s %14s" % ("datapath", "size", "sent/s", "received/s"))
for (size, kind), v in runs.items():
    print("%-10s %6d %14.0f %14.0f" % (kind, size, statistics.median(s for s, _ in v), statistics.median(r for _, r in v)))
PY
rm -f "$RESULTS"
