#!/usr/bin/env bash
# Emulated cluster for dlcp on one machine: N "hosts" (network namespaces) joined
# by a Linux bridge in a "switch" namespace, each switch port with a strict
# priority scheduler keyed on DSCP (htb + u32 dsfield filters), an optional
# bottleneck rate, small queues, and optional random loss (nftables numgen).
#
# Nothing is created in the root namespace: the veth pairs are made inside the
# switch namespace with their host end moved straight into the host namespace.
# The only machine-wide change is net.core.netdev_max_backlog (raised while up,
# restored by `down`).
#
# Run `scripts/testbed.sh --help` for usage. Needs root, iproute2 (ip, tc) and,
# for --loss, nftables; ethtool is used if present.
set -euo pipefail

PROG=$(basename "$0")
PREFIX=${DLCPTB_PREFIX:-dlcptb}
STATE_ROOT=${DLCPTB_STATE_DIR:-/run/dlcptb}
STATE=$STATE_ROOT/$PREFIX
SW=$PREFIX-sw
BR=br0
SUBNET4=10.77.0
SUBNET6=fd77
DEFAULT_DSCP=0,10,18,26,34,40,46,48
BACKLOG=20000

usage() {
  cat <<EOF
Usage:
  $PROG up [--hosts N] [--rate MBIT] [--rate-ports LIST] [--loss PCT]
           [--mtu M] [--queue PKTS] [--dscp D0,..,D7]
  $PROG down
  $PROG status [-v]            settings, addresses, loss counters, per-class
                             counters of each switch port (-v: raw tc -s too)
  $PROG exec HOST CMD...      run CMD in host namespace HOST (0, 1, .. or h0, h1, ..)
  $PROG --help

Topology (defaults in brackets):
  hosts     namespaces $PREFIX-h0 .. $PREFIX-h<N-1> [N=4]; interface eth0 with
            $SUBNET4.<i+1>/24 and $SUBNET6::<i+1>/64 (host i)
  switch    namespace $SW: bridge $BR, port p<i> = veth peer of host i's eth0
  egress    of every switch port p<i> (the direction towards host i):
              htb root 1: (default class 1:10), parent class 1:1 rate = ceil = the
              port rate; one leaf class per dlcp priority class c = 0..7:
              classid 1:1<c>, htb prio 7-c (class 7 = control is served first),
              guaranteed rate 1% of the port rate, ceil = the port rate, so
              everything above the 1% guarantees goes strictly by priority;
              leaf queue pfifo limit PKTS [50], so congestion drops instead of
              buffering; u32 filters 'ip dsfield <dscp<<2> 0xfc' (IPv4) and
              'ip6 priority <dscp<<2> 0xfc' (IPv6) map DSCP D<c> to class 1:1<c>;
              anything else (ARP, unknown DSCP) goes to 1:10 (best effort).
  --rate    port rate in Mbit/s (the bottleneck); without it 10000 (no bottleneck).
  --rate-ports  comma list of host indices whose switch port gets --rate [all];
            the others run at 10000.
  --dscp    DSCP of dlcp classes 0..7 [$DEFAULT_DSCP] (match [priority].dscp).
  --loss    random loss in percent (0.01 resolution) on input of every host
            namespace (nftables table inet $PREFIX: counters 'seen' and 'dropped';
            IPv6 neighbour discovery is exempt). Each datagram crossing the
            testbed passes one host input, so end-to-end loss = PCT.
  --mtu     MTU of every veth and the bridge [1500].
  --queue   leaf pfifo limit in packets [50].
  Offloads (tso gso gro tx-udp-segmentation tx-gso-list) are off on every veth
  (ethtool), so queues, counters and loss act on wire-sized packets, RPS pins the receive
  processing of each veth to one CPU (no reordering), net.core.netdev_max_backlog
  is raised to $BACKLOG while up. State (settings, saved sysctl) in $STATE.

Environment: DLCPTB_PREFIX (name prefix, default dlcptb), DLCPTB_STATE_DIR.
'up' first removes leftovers of an earlier run; 'down' is safe to run twice.
EOF
}

die() { echo "$PROG: error: $*" >&2; exit 1; }
log() { echo "$PROG: $*" >&2; }
# Run a command, and on failure say which one failed.
run() { "$@" || die "command failed (exit $?): $*"; }

need_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces, tc, sysctl)"
  command -v ip >/dev/null || die "ip not found: apt-get install iproute2"
  command -v tc >/dev/null || die "tc not found: apt-get install iproute2"
}

host_ns() { echo "$PREFIX-h$1"; }

# Namespaces of this prefix that exist now (host namespaces and the switch).
our_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}-(h[0-9]+|sw)\$" || true
}

# ---------------------------------------------------------------------------
# machine-wide settings
# ---------------------------------------------------------------------------
save_and_raise_backlog() {
  mkdir -p "$STATE"
  if [ ! -f "$STATE/netdev_max_backlog" ]; then
    local orig
    orig=$(sysctl -n net.core.netdev_max_backlog)
    # Another testbed (other prefix) may have raised it already: take its original.
    local other
    for other in "$STATE_ROOT"/*/netdev_max_backlog; do
      [ -f "$other" ] && [ "$other" != "$STATE/netdev_max_backlog" ] && orig=$(cat "$other") && break
    done
    echo "$orig" >"$STATE/netdev_max_backlog"
  fi
  local cur
  cur=$(sysctl -n net.core.netdev_max_backlog)
  if [ "$cur" -lt "$BACKLOG" ]; then
    run sysctl -q -w net.core.netdev_max_backlog=$BACKLOG
  fi
}

restore_backlog() {
  local f=$STATE/netdev_max_backlog
  [ -f "$f" ] || return 0
  local orig other busy=0
  orig=$(cat "$f")
  for other in "$STATE_ROOT"/*/netdev_max_backlog; do
    [ -f "$other" ] && [ "$other" != "$f" ] && busy=1
  done
  if [ "$busy" -eq 0 ]; then
    run sysctl -q -w net.core.netdev_max_backlog="$orig"
  else
    log "another testbed is up ($(ls "$STATE_ROOT")): leaving netdev_max_backlog to its down"
  fi
  rm -f "$f"
}

# ---------------------------------------------------------------------------
# down
# ---------------------------------------------------------------------------
cmd_down() {
  need_root
  local ns pids
  for ns in $(our_namespaces); do
    # Processes started inside our namespaces (daemons, iperf3, tcpdump) die
    # with the testbed; a namespace with live processes would otherwise linger.
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      log "killing processes in $ns: $(echo $pids)"
      kill -TERM $pids 2>/dev/null || true
    fi
  done
  for ns in $(our_namespaces); do
    local i
    for i in 1 2 3 4 5 6 7 8 9 10; do
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [ -z "$pids" ] && break
      sleep 0.1
    done
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
  done
  # Deleting the switch namespace destroys every veth pair; then the hosts.
  for ns in $(our_namespaces); do
    ip netns del "$ns" || die "could not delete namespace $ns"
  done
  restore_backlog
  rm -f "$STATE/settings"
  rmdir "$STATE" 2>/dev/null || true
  rmdir "$STATE_ROOT" 2>/dev/null || true
  local left
  left=$(our_namespaces)
  [ -z "$left" ] || die "namespaces still present after down: $left"
  log "down: no $PREFIX-* namespaces left"
}

# ---------------------------------------------------------------------------
# up
# ---------------------------------------------------------------------------
is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
is_num() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }

# htb/pfifo setup of switch port $1 at rate $2 Mbit/s.
setup_port() {
  local dev=$1 rate=$2
  local sw=(ip netns exec "$SW")
  local guar=$(( rate * 10 ))   # 1% of the rate, in kbit
  local quantum=$(( MTU + 100 ))
  # Burst: 1 ms at the port rate, at least two full frames (htb's own default
  # is 0 at multi-Gbit/s rates, which throttles below the configured rate).
  local burst=$(( rate * 1000 / 8 ))
  [ "$burst" -ge $(( 2 * MTU + 100 )) ] || burst=$(( 2 * MTU + 100 ))
  run "${sw[@]}" tc qdisc replace dev "$dev" root handle 1: htb default 10
  run "${sw[@]}" tc class add dev "$dev" parent 1: classid 1:1 htb \
    rate "${rate}mbit" ceil "${rate}mbit" burst "$burst" cburst "$burst" quantum "$quantum"
  local c
  for c in 0 1 2 3 4 5 6 7; do
    run "${sw[@]}" tc class add dev "$dev" parent 1:1 classid "1:1$c" htb \
      rate "${guar}kbit" ceil "${rate}mbit" burst "$burst" cburst "$burst" \
      prio $(( 7 - c )) quantum "$quantum"
    run "${sw[@]}" tc qdisc add dev "$dev" parent "1:1$c" handle "$(( 20 + c )):" pfifo limit "$QUEUE"
  done
  for c in 0 1 2 3 4 5 6 7; do
    local tos=$(( DSCPS[c] << 2 ))
    run "${sw[@]}" tc filter add dev "$dev" parent 1: protocol ip prio 1 u32 \
      match ip dsfield "$tos" 0xfc flowid "1:1$c"
    run "${sw[@]}" tc filter add dev "$dev" parent 1: protocol ipv6 prio 2 u32 \
      match ip6 priority "$tos" 0xfc flowid "1:1$c"
  done
}

offloads_off() {
  local ns=$1 dev=$2
  if command -v ethtool >/dev/null; then
    # tx-udp-segmentation and tx-gso-list too: with only "gso off", UDP GSO
    # super-packets (dlcpd sends them) cross the veth and the bridge whole, and
    # a pfifo limit of N packets would hold N x 64 KiB.
    run ip netns exec "$ns" ethtool -K "$dev" tso off gso off gro off \
      tx-udp-segmentation off tx-gso-list off >/dev/null
  fi
}

# Pin the receive processing of $2 in $1 to CPU $3 (RPS), so packets of a port
# are handled in order on one CPU.
rps_pin() {
  local ns=$1 dev=$2 cpu=$3
  local mask
  mask=$(printf '%x' $(( 1 << cpu )))
  run ip netns exec "$ns" sh -c "for q in /sys/class/net/$dev/queues/rx-*; do echo $mask > \$q/rps_cpus; done"
}

setup_loss() {
  local ns=$1 pct=$2
  local thresh
  thresh=$(awk -v p="$pct" 'BEGIN { printf "%d", p * 100 + 0.5 }')
  run ip netns exec "$ns" nft -f - <<EOF
table inet $PREFIX {
  counter seen { }
  counter dropped { }
  chain input {
    type filter hook input priority -300; policy accept;
    icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert } accept
    counter name "seen"
    numgen random mod 10000 < $thresh counter name "dropped" drop
  }
}
EOF
}

cmd_up() {
  need_root
  HOSTS=4 RATE="" RATE_PORTS="" LOSS="" MTU=1500 QUEUE=50 DSCP_LIST=$DEFAULT_DSCP
  while [ $# -gt 0 ]; do
    case $1 in
      --hosts) HOSTS=${2:?--hosts needs a value}; shift 2 ;;
      --rate) RATE=${2:?--rate needs a value}; shift 2 ;;
      --rate-ports) RATE_PORTS=${2:?--rate-ports needs a value}; shift 2 ;;
      --loss) LOSS=${2:?--loss needs a value}; shift 2 ;;
      --mtu) MTU=${2:?--mtu needs a value}; shift 2 ;;
      --queue) QUEUE=${2:?--queue needs a value}; shift 2 ;;
      --dscp) DSCP_LIST=${2:?--dscp needs a value}; shift 2 ;;
      -h|--help) usage; exit 0 ;;
      *) die "up: unknown argument '$1' (see --help)" ;;
    esac
  done
  is_uint "$HOSTS" && [ "$HOSTS" -ge 2 ] && [ "$HOSTS" -le 64 ] || die "--hosts must be 2..64, got '$HOSTS'"
  [ -z "$RATE" ] || { is_uint "$RATE" && [ "$RATE" -ge 1 ] && [ "$RATE" -le 100000 ]; } \
    || die "--rate must be 1..100000 Mbit/s, got '$RATE'"
  [ -z "$LOSS" ] || { is_num "$LOSS" && awk -v p="$LOSS" 'BEGIN { exit !(p >= 0 && p <= 100) }'; } \
    || die "--loss must be a percentage 0..100, got '$LOSS'"
  is_uint "$MTU" && [ "$MTU" -ge 1280 ] && [ "$MTU" -le 9000 ] || die "--mtu must be 1280..9000, got '$MTU'"
  is_uint "$QUEUE" && [ "$QUEUE" -ge 1 ] || die "--queue must be >= 1 packets, got '$QUEUE'"
  IFS=, read -r -a DSCPS <<<"$DSCP_LIST"
  [ "${#DSCPS[@]}" -eq 8 ] || die "--dscp needs 8 comma-separated values, got '$DSCP_LIST'"
  local d
  for d in "${DSCPS[@]}"; do
    is_uint "$d" && [ "$d" -le 63 ] || die "--dscp values must be 0..63, got '$d'"
  done
  if [ -n "$RATE_PORTS" ]; then
    [ -n "$RATE" ] || die "--rate-ports needs --rate"
    local p
    for p in ${RATE_PORTS//,/ }; do
      is_uint "$p" && [ "$p" -lt "$HOSTS" ] || die "--rate-ports: '$p' is not a host index < $HOSTS"
    done
  fi
  [ -z "$LOSS" ] || command -v nft >/dev/null || die "--loss needs nft: apt-get install nftables"

  if [ -n "$(our_namespaces)" ]; then
    log "removing leftovers of an earlier run"
    cmd_down
  fi
  # From here on, a failure (any exit before the end) tears down what was made.
  UP_DONE=0
  trap 'if [ "$UP_DONE" != 1 ]; then log "up failed, tearing down"; cmd_down || true; fi' EXIT

  save_and_raise_backlog
  local ncpu
  ncpu=$(nproc)

  run ip netns add "$SW"
  run ip -n "$SW" link set lo up
  run ip -n "$SW" link add "$BR" type bridge
  run ip -n "$SW" link set "$BR" mtu "$MTU"
  local i ns port_rate
  for ((i = 0; i < HOSTS; i++)); do
    ns=$(host_ns "$i")
    run ip netns add "$ns"
    run ip -n "$ns" link set lo up
    run ip -n "$SW" link add "p$i" mtu "$MTU" type veth peer name eth0 mtu "$MTU" netns "$ns"
    run ip -n "$SW" link set "p$i" master "$BR"
    offloads_off "$SW" "p$i"
    offloads_off "$ns" eth0
    rps_pin "$SW" "p$i" $(( i % ncpu ))
    rps_pin "$ns" eth0 $(( i % ncpu ))
    run ip -n "$ns" addr add "$SUBNET4.$(( i + 1 ))/24" dev eth0
    run ip -n "$ns" addr add "$SUBNET6::$(( i + 1 ))/64" dev eth0 nodad
    port_rate=10000
    if [ -n "$RATE" ]; then
      if [ -z "$RATE_PORTS" ] || [[ ,$RATE_PORTS, == *,$i,* ]]; then port_rate=$RATE; fi
    fi
    setup_port "p$i" "$port_rate"
    run ip -n "$SW" link set "p$i" up
    run ip -n "$ns" link set eth0 up
    if [ -n "$LOSS" ]; then setup_loss "$ns" "$LOSS"; fi
  done
  run ip -n "$SW" link set "$BR" up
  cat >"$STATE/settings" <<EOF
hosts=$HOSTS
rate=${RATE:-none}
rate_ports=${RATE_PORTS:-all}
loss=${LOSS:-none}
mtu=$MTU
queue=$QUEUE
dscp=$DSCP_LIST
EOF
  UP_DONE=1
  trap - EXIT
  log "up: $HOSTS hosts ($SUBNET4.1..$SUBNET4.$HOSTS, $SUBNET6::1..), switch $SW," \
    "rate ${RATE:-none} Mbit/s on ports ${RATE_PORTS:-all}, loss ${LOSS:-0}%, mtu $MTU, queue $QUEUE"
}

# ---------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------
# Packets counted by nft counter $2 in host namespace $1.
nft_packets() {
  ip netns exec "$1" nft list counter inet "$PREFIX" "$2" | awk '$1 == "packets" { print $2 }'
}

# Per-class counters of switch port $1 as a table (from tc -s class show).
port_table() {
  local dscp=${DSCP_OF_STATE:-$DEFAULT_DSCP}
  ip netns exec "$SW" tc -s class show dev "$1" | awk -v dscp="$dscp" '
    BEGIN { split(dscp, d, ","); printf "  %-6s %-11s %-5s %-4s %12s %14s %10s %9s\n", "class", "htb", "dscp", "prio", "sent_pkts", "sent_bytes", "dropped", "drop%" }
    $1 == "class" { id = $3; prio = ""; for (i = 1; i < NF; i++) if ($i == "prio") prio = $(i + 1) }
    $1 == "Sent" { bytes[id] = $2; pkts[id] = $4; dr = $7; sub(",", "", dr); drops[id] = dr; pr[id] = prio }
    END {
      for (c = 0; c < 8; c++) {
        id = "1:1" c
        if (!(id in pkts)) continue
        tot = pkts[id] + drops[id]
        printf "  %-6s %-11s %-5s %-4s %12d %14d %10d %8.2f%%\n", c, id, d[c + 1], pr[id], pkts[id], bytes[id], drops[id], tot ? 100 * drops[id] / tot : 0
      }
      if ("1:1" in pkts) printf "  %-6s %-11s %-5s %-4s %12d %14d %10d\n", "port", "1:1", "", "", pkts["1:1"], bytes["1:1"], drops["1:1"]
    }'
}

cmd_status() {
  VERBOSE=0
  while [ $# -gt 0 ]; do
    case $1 in
      -v|--verbose) VERBOSE=1; shift ;;
      *) die "status: unknown argument '$1' (see --help)" ;;
    esac
  done
  need_root
  local nss
  nss=$(our_namespaces)
  if [ -z "$nss" ]; then
    echo "testbed $PREFIX: down (no namespaces)"
    return 0
  fi
  echo "testbed $PREFIX: up"
  if [ -f "$STATE/settings" ]; then
    sed 's/^/  /' "$STATE/settings"
    DSCP_OF_STATE=$(sed -n 's/^dscp=//p' "$STATE/settings")
  fi
  echo "  netdev_max_backlog: $(sysctl -n net.core.netdev_max_backlog) (saved: $(cat "$STATE/netdev_max_backlog" 2>/dev/null || echo none))"
  echo
  echo "== namespaces"
  echo "$nss" | sed 's/^/  /'
  local ns
  for ns in $(echo "$nss" | grep -- '-h' | sort -V); do
    echo
    echo "== $ns"
    ip -n "$ns" -br addr show dev eth0 | sed 's/^/  /'
    if command -v nft >/dev/null && ip netns exec "$ns" nft list table inet "$PREFIX" >/dev/null 2>&1; then
      local seen dropped
      seen=$(nft_packets "$ns" seen)
      dropped=$(nft_packets "$ns" dropped)
      echo "  loss (nft table inet $PREFIX, input): seen $seen dropped $dropped" \
        "($(awk -v s="$seen" -v d="$dropped" 'BEGIN { printf "%.2f%%", s ? 100 * d / s : 0 }'))"
    fi
  done
  if echo "$nss" | grep -qx "$SW"; then
    local dev
    for dev in $(ip -n "$SW" -br link show type veth | awk '{print $1}' | cut -d@ -f1 | sort -V); do
      echo
      echo "== $SW port $dev (egress towards host ${dev#p})"
      port_table "$dev"
      if [ "$VERBOSE" = 1 ]; then
        ip netns exec "$SW" tc -s class show dev "$dev" | sed 's/^/  /'
        ip netns exec "$SW" tc -s qdisc show dev "$dev" | sed 's/^/  /'
      fi
    done
  fi
}

cmd_exec() {
  need_root
  local h=${1:?exec needs a host}
  shift
  h=${h#h}
  is_uint "$h" || die "exec: host must be a number or h<number>, got '$h'"
  [ $# -gt 0 ] || die "exec: no command"
  ip netns list | awk '{print $1}' | grep -qx "$(host_ns "$h")" \
    || die "exec: no namespace $(host_ns "$h") (is the testbed up? hosts: $(our_namespaces | grep -- -h | tr '\n' ' '))"
  exec ip netns exec "$(host_ns "$h")" "$@"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) shift; [ $# -eq 0 ] || die "down takes no arguments"; cmd_down ;;
  status) shift; cmd_status "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  -h|--help|help) usage ;;
  "") usage >&2; exit 2 ;;
  *) die "unknown command '$1' (see --help)" ;;
esac
