#!/usr/bin/env bash
# Emulated cluster for dlcp on one machine: N "hosts" (network namespaces) joined
# by a Linux bridge in a "switch" namespace, or (--spines S) by a leaf-spine fabric
# of routing namespaces with ECMP; every switch port with a strict priority
# scheduler keyed on DSCP (htb + u32 dsfield filters), an optional bottleneck
# rate, small queues, and optional random loss (nftables numgen).
#
# Nothing is created in the root namespace: the veth pairs are made inside the
# switch namespace with their host end moved straight into the host namespace.
# The only machine-wide changes are net.core.netdev_max_backlog (raised while up,
# restored by `down`) and, where br_netfilter is a module not loaded yet, loading
# it (unloaded by `down`; see bridge_nf_on).
#
# Run `scripts/testbed.sh --help` for usage. Needs root, iproute2 (ip, tc) and,
# for --loss and --spines, nftables; ethtool is used if present.
set -euo pipefail

PROG=$(basename "$0")
PREFIX=${DLCPTB_PREFIX:-dlcptb}
STATE_ROOT=${DLCPTB_STATE_DIR:-/run/dlcptb}
STATE=$STATE_ROOT/$PREFIX
SW=$PREFIX-sw
BR=br0
SUBNET4=10.77.0
SUBNET6=fd77
DEFAULT_DSCP=10,10,18,26,34,40,46,48
BACKLOG=20000

usage() {
  cat <<EOF
Usage:
  $PROG up [--hosts N] [--rate MBIT] [--rate-ports LIST] [--loss PCT]
           [--mtu M] [--queue PKTS] [--dscp D0,..,D7]
           [--spines S [--leaves L] [--spine-rate MBIT] [--hash-seed N]]
           [--host-gro]
  $PROG down
  $PROG status [-v]            settings, addresses, loss counters, per-spine
                             counters, per-class counters of each switch port
                             (-v: raw tc -s too)
  $PROG counters              the same counters as one JSON object (for programs)
  $PROG link spine<S> [--rate MBIT|none] [--loss PCT]
                             fabric only: rate / random loss of every link of
                             spine S, both directions, while up
  $PROG pin spine<S> [--proto tcp|udp] | pin --clear
                             fabric only: every packet of that protocol [tcp] a
                             leaf sends into the fabric goes through spine S (the
                             outcome of a hash collision, made certain)
  $PROG exec HOST CMD...      run CMD in host namespace HOST (0, 1, .. or h0, h1, ..)
  $PROG --help

Topology (defaults in brackets):
  hosts     namespaces $PREFIX-h0 .. $PREFIX-h<N-1> [N=4]; interface eth0 with
            $SUBNET4.<i+1>/24 and $SUBNET6::<i+1>/64 (host i)
  switch    (without --spines) namespace $SW: bridge $BR, port p<i> = veth peer
            of host i's eth0
  egress    of every switch port (the direction away from the switch):
              htb root 1: (default class 1:10), parent class 1:1 rate = ceil = the
              port rate; one leaf class per dlcp priority class c = 0..7:
              classid 1:1<c>, htb prio 7-c (class 7 = control is served first),
              guaranteed rate 1% of the port rate, ceil = the port rate, so
              everything above the 1% guarantees goes strictly by priority;
              leaf queue pfifo limit PKTS [50], so congestion drops instead of
              buffering; u32 filters 'ip dsfield <dscp<<2> 0xfc' (IPv4) and
              'ip6 priority <dscp<<2> 0xfc' (IPv6) map DSCP D<c> to class 1:1<c>
              (a DSCP listed for several classes to the highest of them);
              anything else (ARP, unknown DSCP, best effort's DSCP 0 by
              default) goes to 1:10.
  --rate    rate in Mbit/s of the ports towards hosts (the bottleneck); without
            it 10000 (no bottleneck).
  --rate-ports  comma list of host indices whose port gets --rate [all];
            the others run at 10000.
  --dscp    DSCP of dlcp classes 0..7 [$DEFAULT_DSCP] (match [priority].dscp;
            with the default, classes 0 and 1 share class 1's queue and class
            0's queue, 1:10, carries only other traffic: best effort).
  --loss    random loss in percent (0.01 resolution) on input of every host
            namespace (nftables table inet $PREFIX: counters 'seen' and 'dropped';
            IPv6 neighbour discovery is exempt). Each datagram crossing the
            testbed passes one host input, so end-to-end loss = PCT.
  --mtu     MTU of every veth and the bridge [1500].
  --queue   leaf pfifo limit in packets [50].

Leaf-spine fabric (--spines S, 1..8): L3 routing with ECMP instead of the bridge.
  leaves    namespaces $PREFIX-leaf0 .. [L=2, 2..16; N >= L]; host i hangs off leaf
            i mod L (interleaved: h0, h2, .. on leaf0, h1, h3, .. on leaf1) at
            leaf port p<i>; the leaf is the hosts' gateway ($SUBNET4.254, fe80::1)
            and routes each local host's /32 (/128) to its port
  spines    namespaces $PREFIX-spine0 .. $PREFIX-spine<S-1>; leaf l's port s<s>
            is a veth to spine s's port l<l> (10.78.<s>.<4l+1>/30 on the leaf,
            .<4l+2> on the spine; fd78:<s>::/126 alike)
  ECMP      each leaf routes $SUBNET4.0/24 ($SUBNET6::/64) with one nexthop per
            spine, hashed on each packet's 5-tuple as a switch does
            (net.ipv{4,6}.fib_multipath_hash_policy=3, _fields=0x37: addresses,
            protocol, ports; policy 1 would reuse the sending socket's random
            hash): UDP/TCP source and destination ports pick the spine, and
            'ip -n $PREFIX-leaf0 route get DST from SRC iif p0 ipproto udp
            sport P dport Q' names it. Spines route each host's /32 to its
            leaf. The hash is per direction: a flow and its reverse may take
            different spines.
  egress    of every leaf and spine port (towards a host, a spine, a leaf): the
            htb/pfifo/DSCP scheduler above. Host ports run at --rate, links
            between leaves and spines at --spine-rate [10000, no bottleneck].
  counters  nftables table inet $PREFIX in every spine, forward hook: counters
            'seen' (every packet into the spine, lost ones included),
            'seen_udp', 'seen_tcp', 'dropped' (the random loss set with 'link');
            packets and bytes.
  --hash-seed  net.ipv4.fib_multipath_hash_seed (IPv4 and IPv6) in leaves and
            spines, for a repeatable hash [the kernel's random seed].
  --host-gro  GRO on each host's own end (eth0), as a host's NIC has it: the
            switch's queues and counters still carry wire-sized packets; the
            host's kernel merges runs of one flow before its UDP or TCP stack.
            Not with --loss (that acts on the host's input, after GRO).
  link      changes spine links only; --rate none = back to 10000, --loss 0 = no
            loss. Rates change in place (htb class change: counters kept).

Offloads (tso gso gro tx-udp-segmentation tx-gso-list) are off on every veth
(ethtool; with --host-gro, GRO is on again on the hosts' eth0), so queues,
counters and loss act on wire-sized packets, RPS pins the
receive processing of each veth to one CPU (no reordering), and
net.core.netdev_max_backlog is raised to $BACKLOG while up. The switch's
bridge runs with br_netfilter (loaded if needed; bridge-nf-call-* = 1 in its
namespace): its hooks take each frame off the sending socket's account at the
switch's ingress, as a NIC's transmit completion does, so a full switch queue
drops instead of throttling the sender. State (settings, saved sysctl) in
$STATE.

Environment: DLCPTB_PREFIX (name prefix, default dlcptb), DLCPTB_STATE_DIR;
DLCPTB_HOST_GRO=1 is --host-gro (for tools that run 'up' themselves).
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

# Namespaces of this prefix that exist now (hosts, the switch, leaves, spines).
our_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}-(h[0-9]+|sw|leaf[0-9]+|spine[0-9]+)\$" || true
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

# Unload br_netfilter if this testbed's up loaded it (see bridge_nf_on), unless
# another testbed is up: then that one's down does it.
restore_br_netfilter() {
  local f=$STATE/br_netfilter_loaded other
  [ -f "$f" ] || return 0
  for other in "$STATE_ROOT"/*/; do
    other=${other%/}
    if [ "$other" != "$STATE" ] && [ -f "$other/settings" ]; then
      cp "$f" "$other/br_netfilter_loaded"
      log "another testbed is up ($(basename "$other")): leaving br_netfilter to its down"
      rm -f "$f"
      return 0
    fi
  done
  modprobe -r br_netfilter 2>/dev/null || log "could not unload br_netfilter (in use?): left loaded"
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
  restore_br_netfilter
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
is_pct() { is_num "$1" && awk -v p="$1" 'BEGIN { exit !(p >= 0 && p <= 100) }'; }
is_rate() { is_uint "$1" && [ "$1" -ge 1 ] && [ "$1" -le 100000 ]; }

# htb burst for rate $1 Mbit/s: 1 ms at the port rate, at least two full frames
# (htb's own default is 0 at multi-Gbit/s rates, which throttles below the rate).
htb_burst() {
  local burst=$(( $1 * 1000 / 8 ))
  [ "$burst" -ge $(( 2 * MTU + 100 )) ] || burst=$(( 2 * MTU + 100 ))
  echo "$burst"
}

# Whether class $1's DSCP is also a higher class's (DSCPS): that class's
# queue serves it.
dscp_served_above() {
  local c=$1 k
  for (( k = c + 1; k < 8; k++ )); do
    [ "${DSCPS[k]}" = "${DSCPS[c]}" ] && return 0
  done
  return 1
}

# htb/pfifo setup of port $2 in namespace $1 at rate $3 Mbit/s.
setup_port() {
  local ns=$1 dev=$2 rate=$3
  local sw=(ip netns exec "$ns")
  local guar=$(( rate * 10 ))   # 1% of the rate, in kbit
  local quantum=$(( MTU + 100 ))
  local burst
  burst=$(htb_burst "$rate")
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
    # A DSCP listed for several classes is served by the highest of them
    # (dlcpd's default marks classes 0 and 1 both AF11: class 1's queue).
    dscp_served_above "$c" && continue
    local tos=$(( DSCPS[c] << 2 ))
    run "${sw[@]}" tc filter add dev "$dev" parent 1: protocol ip prio 1 u32 \
      match ip dsfield "$tos" 0xfc flowid "1:1$c"
    run "${sw[@]}" tc filter add dev "$dev" parent 1: protocol ipv6 prio 2 u32 \
      match ip6 priority "$tos" 0xfc flowid "1:1$c"
  done
}

# Change the rate of port $2 in namespace $1 (set up by setup_port) to $3 Mbit/s
# in place: the classes and their counters stay.
change_port_rate() {
  local ns=$1 dev=$2 rate=$3
  local sw=(ip netns exec "$ns")
  local guar=$(( rate * 10 )) quantum=$(( MTU + 100 ))
  local burst c
  burst=$(htb_burst "$rate")
  run "${sw[@]}" tc class change dev "$dev" parent 1: classid 1:1 htb \
    rate "${rate}mbit" ceil "${rate}mbit" burst "$burst" cburst "$burst" quantum "$quantum"
  for c in 0 1 2 3 4 5 6 7; do
    run "${sw[@]}" tc class change dev "$dev" parent 1:1 classid "1:1$c" htb \
      rate "${guar}kbit" ceil "${rate}mbit" burst "$burst" cburst "$burst" \
      prio $(( 7 - c )) quantum "$quantum"
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

# Both ends of a veth: offloads off, receive processing on CPU $5.
veth_tune() {
  offloads_off "$1" "$2"
  offloads_off "$3" "$4"
  rps_pin "$1" "$2" "$5"
  rps_pin "$3" "$4" "$5"
}

setup_loss() {
  local ns=$1 pct=$2
  local thresh
  thresh=$(loss_threshold "$pct")
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

# PCT percent as a threshold of 'numgen random mod 10000'.
loss_threshold() { awk -v p="$1" 'BEGIN { printf "%d", p * 100 + 0.5 }'; }

# Host i's namespace with eth0 as the peer of port p<i> made in namespace $2.
make_host() {
  local i=$1 parent=$2 ncpu=$3
  local ns
  ns=$(host_ns "$i")
  run ip netns add "$ns"
  run ip -n "$ns" link set lo up
  run ip -n "$parent" link add "p$i" mtu "$MTU" type veth peer name eth0 mtu "$MTU" netns "$ns"
  veth_tune "$parent" "p$i" "$ns" eth0 $(( i % ncpu ))
  if [ "$HOST_GRO" = 1 ]; then
    run ip netns exec "$ns" ethtool -K eth0 gro on >/dev/null
  fi
}

# The rate of host i's port: --rate where --rate-ports selects it, else 10000.
host_port_rate() {
  local i=$1
  if [ -n "$RATE" ]; then
    if [ -z "$RATE_PORTS" ] || [[ ,$RATE_PORTS, == *,$i,* ]]; then echo "$RATE"; return; fi
  fi
  echo 10000
}

parse_up_args() {
  HOSTS=4 RATE="" RATE_PORTS="" LOSS="" MTU=1500 QUEUE=50 DSCP_LIST=$DEFAULT_DSCP
  SPINES=0 LEAVES="" SPINE_RATE="" HASH_SEED="" HOST_GRO=${DLCPTB_HOST_GRO:-0}
  while [ $# -gt 0 ]; do
    case $1 in
      --hosts) HOSTS=${2:?--hosts needs a value}; shift 2 ;;
      --rate) RATE=${2:?--rate needs a value}; shift 2 ;;
      --rate-ports) RATE_PORTS=${2:?--rate-ports needs a value}; shift 2 ;;
      --loss) LOSS=${2:?--loss needs a value}; shift 2 ;;
      --mtu) MTU=${2:?--mtu needs a value}; shift 2 ;;
      --queue) QUEUE=${2:?--queue needs a value}; shift 2 ;;
      --dscp) DSCP_LIST=${2:?--dscp needs a value}; shift 2 ;;
      --spines) SPINES=${2:?--spines needs a value}; shift 2 ;;
      --leaves) LEAVES=${2:?--leaves needs a value}; shift 2 ;;
      --spine-rate) SPINE_RATE=${2:?--spine-rate needs a value}; shift 2 ;;
      --hash-seed) HASH_SEED=${2:?--hash-seed needs a value}; shift 2 ;;
      --host-gro) HOST_GRO=1; shift ;;
      -h|--help) usage; exit 0 ;;
      *) die "up: unknown argument '$1' (see --help)" ;;
    esac
  done
  is_uint "$HOSTS" && [ "$HOSTS" -ge 2 ] && [ "$HOSTS" -le 64 ] || die "--hosts must be 2..64, got '$HOSTS'"
  [ -z "$RATE" ] || is_rate "$RATE" || die "--rate must be 1..100000 Mbit/s, got '$RATE'"
  [ -z "$LOSS" ] || is_pct "$LOSS" || die "--loss must be a percentage 0..100, got '$LOSS'"
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
  [ "$HOST_GRO" = 1 ] || [ "$HOST_GRO" = 0 ] || die "DLCPTB_HOST_GRO must be 0 or 1, got '$HOST_GRO'"
  if [ "$HOST_GRO" = 1 ]; then
    [ -z "$LOSS" ] || [ "$LOSS" = 0 ] \
      || die "--host-gro with --loss: the loss acts on the host's input, after GRO, and would drop merged packets"
    command -v ethtool >/dev/null || die "--host-gro needs ethtool: apt-get install ethtool"
  fi
  is_uint "$SPINES" && [ "$SPINES" -le 8 ] || die "--spines must be 1..8, got '$SPINES'"
  if [ "$SPINES" -eq 0 ]; then
    [ -z "$LEAVES$SPINE_RATE$HASH_SEED" ] || die "--leaves, --spine-rate and --hash-seed need --spines"
    return 0
  fi
  LEAVES=${LEAVES:-2}
  is_uint "$LEAVES" && [ "$LEAVES" -ge 2 ] && [ "$LEAVES" -le 16 ] || die "--leaves must be 2..16, got '$LEAVES'"
  [ "$HOSTS" -ge "$LEAVES" ] || die "--hosts ($HOSTS) must be >= --leaves ($LEAVES): every leaf needs a host"
  [ -z "$SPINE_RATE" ] || is_rate "$SPINE_RATE" || die "--spine-rate must be 1..100000 Mbit/s, got '$SPINE_RATE'"
  [ -z "$HASH_SEED" ] || { is_uint "$HASH_SEED" && [ "$HASH_SEED" -le 4294967295 ]; } \
    || die "--hash-seed must be 0..4294967295, got '$HASH_SEED'"
  command -v nft >/dev/null || die "--spines needs nft (the spines' counters): apt-get install nftables"
}

cmd_up() {
  need_root
  parse_up_args "$@"
  if [ -n "$(our_namespaces)" ]; then
    log "removing leftovers of an earlier run"
    cmd_down
  fi
  # From here on, a failure (any exit before the end) tears down what was made.
  UP_DONE=0
  trap 'if [ "$UP_DONE" != 1 ]; then log "up failed, tearing down"; cmd_down || true; fi' EXIT

  save_and_raise_backlog
  if [ "$SPINES" -gt 0 ]; then
    up_fabric
  else
    up_switch
  fi
  cat >"$STATE/settings" <<EOF
hosts=$HOSTS
rate=${RATE:-none}
rate_ports=${RATE_PORTS:-all}
loss=${LOSS:-none}
mtu=$MTU
queue=$QUEUE
dscp=$DSCP_LIST
host_gro=$([ "$HOST_GRO" = 1 ] && echo on || echo off)
bridge_nf=on
EOF
  if [ "$SPINES" -gt 0 ]; then
    local s
    {
      echo "spines=$SPINES"
      echo "leaves=$LEAVES"
      echo "placement=host i on leaf i mod $LEAVES"
      echo "hash_seed=${HASH_SEED:-random}"
      echo "pin=none"
      for ((s = 0; s < SPINES; s++)); do
        echo "spine${s}_rate=${SPINE_RATE:-none}"
        echo "spine${s}_loss=none"
      done
    } >>"$STATE/settings"
  fi
  UP_DONE=1
  trap - EXIT
  local what="switch $SW"
  [ "$SPINES" -eq 0 ] || what="$LEAVES leaves x $SPINES spines (spine links ${SPINE_RATE:-10000} Mbit/s)"
  log "up: $HOSTS hosts ($SUBNET4.1..$SUBNET4.$HOSTS, $SUBNET6::1..), $what," \
    "rate ${RATE:-none} Mbit/s on ports ${RATE_PORTS:-all}, loss ${LOSS:-0}%, mtu $MTU, queue $QUEUE"
}

# The switch must take each frame off its sender's socket account when the
# frame enters the switch, as a NIC's transmit completion does. A frame that
# crosses a veth into another namespace keeps its socket reference (kernel
# commit 9c4c325252c5, "skbuff: preserve sock reference when scrubbing the
# skb"), so without that a frame stays charged to the sending socket until the
# switch port sends it, and a full switch queue throttles the sender's socket
# instead of dropping: a lossless fabric, not what a switch does (an iperf3
# UDP sender into a congested port slows down with no drop; the 'priority'
# case of scripts/testbed_test.sh fails). The bridge's netfilter hooks
# (br_netfilter, on by default in a namespace where it is loaded) take the
# frame over as IP input does: br_nf_pre_routing's setup_pre_routing() calls
# skb_orphan() on every IPv4 and IPv6 frame. So br_netfilter must be loaded
# (modprobe; some kernels have it built in), and the switch namespace's
# bridge-nf-call sysctls are set on explicitly. Every testbed result was
# measured so.
#
# Loading the module is a machine-wide change: every namespace, the root one
# included, starts with the hooks on. So when up loads it, the root
# namespace's bridge-nf-call sysctls go back to 0 (its bridges had no hooks
# before), and down unloads it again once no testbed that needs it is up
# (marker $STATE/br_netfilter_loaded). On this project's VM the module is
# built into the kernel, so that branch has not run here.
bridge_nf_on() {
  local ns=$1 t
  if ! ip netns exec "$ns" test -e /proc/sys/net/bridge/bridge-nf-call-iptables; then
    if command -v modprobe >/dev/null && modprobe br_netfilter 2>/dev/null; then
      mkdir -p "$STATE"
      echo loaded >"$STATE/br_netfilter_loaded"
      for t in iptables ip6tables arptables; do
        sysctl -q -w "net.bridge.bridge-nf-call-$t=0" >/dev/null 2>&1 || true
      done
      log "loaded br_netfilter (down unloads it); the root namespace's bridge-nf-call-* stay 0"
    fi
  fi
  ip netns exec "$ns" test -e /proc/sys/net/bridge/bridge-nf-call-iptables \
    || die "the switch needs the br_netfilter kernel module (so a full switch queue drops rather than throttles the sender): apt-get install kmod; modprobe br_netfilter"
  for t in iptables ip6tables arptables; do
    run ip netns exec "$ns" sysctl -q -w "net.bridge.bridge-nf-call-$t=1"
  done
}

up_switch() {
  local ncpu i ns
  ncpu=$(nproc)
  run ip netns add "$SW"
  run ip -n "$SW" link set lo up
  run ip -n "$SW" link add "$BR" type bridge
  run ip -n "$SW" link set "$BR" mtu "$MTU"
  bridge_nf_on "$SW"
  for ((i = 0; i < HOSTS; i++)); do
    ns=$(host_ns "$i")
    make_host "$i" "$SW" "$ncpu"
    run ip -n "$SW" link set "p$i" master "$BR"
    run ip -n "$ns" addr add "$SUBNET4.$(( i + 1 ))/24" dev eth0
    run ip -n "$ns" addr add "$SUBNET6::$(( i + 1 ))/64" dev eth0 nodad
    setup_port "$SW" "p$i" "$(host_port_rate "$i")"
    run ip -n "$SW" link set "p$i" up
    run ip -n "$ns" link set eth0 up
    if [ -n "$LOSS" ]; then setup_loss "$ns" "$LOSS"; fi
  done
  run ip -n "$SW" link set "$BR" up
}

# ---------------------------------------------------------------------------
# leaf-spine fabric
# ---------------------------------------------------------------------------
leaf_ns() { echo "$PREFIX-leaf$1"; }
spine_ns() { echo "$PREFIX-spine$1"; }
# Addresses of the link between leaf $1 and spine $2: leaf end, spine end.
link4() { echo "10.78.$2.$(( 4 * $1 + ${3:-1} ))"; }
link6() { printf 'fd78:%x::%x' "$2" $(( 4 * $1 + ${3:-1} )); }

# A routing namespace: forwarding on, L4 multipath hash, no reverse-path filter
# (with ECMP a packet may come back on another spine), no DAD delay.
make_router() {
  local ns=$1
  run ip netns add "$ns"
  run ip -n "$ns" link set lo up
  local k
  for k in net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 \
      net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
      net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0; do
    run ip netns exec "$ns" sysctl -q -w "$k"
  done
  # The multipath hash of a switch: the 5-tuple of every packet (policy 3, fields
  # src/dst address, protocol, src/dst port = 0x37). Policy 1 hashes the same
  # fields but first takes a hash the sender's socket left on the packet (it
  # survives the veth): a random draw per socket, which TCP re-draws after a
  # timeout, not the 5-tuple a real switch sees.
  local v
  for v in ipv4 ipv6; do
    if ! ip netns exec "$ns" sysctl -q -w "net.$v.fib_multipath_hash_fields=0x37" \
        "net.$v.fib_multipath_hash_policy=3" 2>/dev/null; then
      log "warning: no custom multipath hash (kernel < 5.12?): policy 1, a per-socket hash on local traffic"
      run ip netns exec "$ns" sysctl -q -w "net.$v.fib_multipath_hash_policy=1"
    fi
  done
  if [ -n "$HASH_SEED" ]; then
    # One seed for IPv4 and IPv6 (kernel >= 6.11).
    ip netns exec "$ns" sysctl -q -w net.ipv4.fib_multipath_hash_seed="$HASH_SEED" \
      || die "--hash-seed: this kernel has no net.ipv4.fib_multipath_hash_seed (needs >= 6.11)"
  fi
}

# The spine's counters, and its random loss rule ($2 percent, or none).
spine_nft() {
  local ns=$1 pct=$2 rule=""
  if [ "$pct" != none ] && [ "$(loss_threshold "$pct")" -gt 0 ]; then
    rule="numgen random mod 10000 < $(loss_threshold "$pct") counter name \"dropped\" drop"
  fi
  if ip netns exec "$ns" nft list table inet "$PREFIX" >/dev/null 2>&1; then
    run ip netns exec "$ns" nft flush chain inet "$PREFIX" loss
    [ -z "$rule" ] || run ip netns exec "$ns" nft add rule inet "$PREFIX" loss "$rule"
    return 0
  fi
  run ip netns exec "$ns" nft -f - <<EOF
table inet $PREFIX {
  counter seen { }
  counter seen_udp { }
  counter seen_tcp { }
  counter dropped { }
  chain tally {
    type filter hook forward priority -300; policy accept;
    counter name "seen"
    meta l4proto udp counter name "seen_udp"
    meta l4proto tcp counter name "seen_tcp"
  }
  chain loss {
    type filter hook forward priority -200; policy accept;
    $rule
  }
}
EOF
}

up_fabric() {
  local ncpu l s i ns lf sp rate
  ncpu=$(nproc)
  rate=${SPINE_RATE:-10000}
  for ((l = 0; l < LEAVES; l++)); do make_router "$(leaf_ns "$l")"; done
  for ((s = 0; s < SPINES; s++)); do
    sp=$(spine_ns "$s")
    make_router "$sp"
    spine_nft "$sp" none
    for ((l = 0; l < LEAVES; l++)); do
      lf=$(leaf_ns "$l")
      run ip -n "$lf" link add "s$s" mtu "$MTU" type veth peer name "l$l" mtu "$MTU" netns "$sp"
      veth_tune "$lf" "s$s" "$sp" "l$l" $(( (l + s) % ncpu ))
      run ip -n "$lf" addr add "$(link4 "$l" "$s")/30" dev "s$s"
      run ip -n "$sp" addr add "$(link4 "$l" "$s" 2)/30" dev "l$l"
      run ip -n "$lf" addr add "$(link6 "$l" "$s")/126" dev "s$s" nodad
      run ip -n "$sp" addr add "$(link6 "$l" "$s" 2)/126" dev "l$l" nodad
      setup_port "$lf" "s$s" "$rate"
      setup_port "$sp" "l$l" "$rate"
      run ip -n "$lf" link set "s$s" up
      run ip -n "$sp" link set "l$l" up
    done
  done
  for ((i = 0; i < HOSTS; i++)); do
    ns=$(host_ns "$i")
    l=$(( i % LEAVES ))
    lf=$(leaf_ns "$l")
    make_host "$i" "$lf" "$ncpu"
    run ip netns exec "$ns" sysctl -q -w net.ipv6.conf.eth0.accept_dad=0
    # The host sees its usual /24 and /64, reached through the leaf (its gateway).
    run ip -n "$ns" addr add "$SUBNET4.$(( i + 1 ))/24" dev eth0 noprefixroute
    run ip -n "$ns" addr add "$SUBNET6::$(( i + 1 ))/64" dev eth0 nodad noprefixroute
    run ip -n "$lf" addr add "$SUBNET4.254/32" dev "p$i"
    run ip -n "$lf" addr add fe80::1/64 dev "p$i" nodad
    setup_port "$lf" "p$i" "$(host_port_rate "$i")"
    run ip -n "$lf" link set "p$i" up
    run ip -n "$ns" link set eth0 up
    run ip -n "$ns" route add "$SUBNET4.254/32" dev eth0 scope link
    run ip -n "$ns" route add "$SUBNET4.0/24" via "$SUBNET4.254" dev eth0
    run ip -n "$ns" -6 route add "$SUBNET6::/64" via fe80::1 dev eth0
    run ip -n "$lf" route add "$SUBNET4.$(( i + 1 ))/32" dev "p$i" src "$SUBNET4.254"
    run ip -n "$lf" -6 route add "$SUBNET6::$(( i + 1 ))/128" dev "p$i"
    for ((s = 0; s < SPINES; s++)); do
      sp=$(spine_ns "$s")
      run ip -n "$sp" route add "$SUBNET4.$(( i + 1 ))/32" via "$(link4 "$l" "$s")" dev "l$l"
      run ip -n "$sp" -6 route add "$SUBNET6::$(( i + 1 ))/128" via "$(link6 "$l" "$s")" dev "l$l"
    done
    if [ -n "$LOSS" ]; then setup_loss "$ns" "$LOSS"; fi
  done
  # Everything not on the leaf: one nexthop per spine (ECMP).
  local nh4 nh6
  for ((l = 0; l < LEAVES; l++)); do
    nh4=() nh6=()
    for ((s = 0; s < SPINES; s++)); do
      nh4+=(nexthop via "$(link4 "$l" "$s" 2)" dev "s$s")
      nh6+=(nexthop via "$(link6 "$l" "$s" 2)" dev "s$s")
    done
    run ip -n "$(leaf_ns "$l")" route add "$SUBNET4.0/24" "${nh4[@]}"
    run ip -n "$(leaf_ns "$l")" -6 route add "$SUBNET6::/64" "${nh6[@]}"
  done
}

# Settings line $1 of the running testbed (empty if none).
setting() { sed -n "s/^$1=//p" "$STATE/settings" 2>/dev/null || true; }

# Replace settings line $1 with value $2.
set_setting() { run sed -i "s|^$1=.*|$1=$2|" "$STATE/settings"; }

# The running fabric's SPINES, LEAVES and MTU (dies if the testbed is not one).
load_fabric() {
  SPINES=$(setting spines)
  [ -n "$SPINES" ] || die "the testbed is not a leaf-spine fabric (up --spines S)"
  LEAVES=$(setting leaves)
  MTU=$(setting mtu)
}

# The index of spine argument $1 (spine<S> or S), checked against SPINES.
spine_index() {
  local s=${1#spine}
  is_uint "$s" && [ "$s" -lt "$SPINES" ] || die "no spine '$1' (spines: spine0..spine$(( SPINES - 1 )))"
  echo "$s"
}

cmd_link() {
  need_root
  [ $# -ge 1 ] || die "link needs a spine (spine0, spine1, ..)"
  local s rate="" loss="" l
  load_fabric
  s=$(spine_index "$1") || exit 1
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --loss) loss=${2:?--loss needs a value}; shift 2 ;;
      *) die "link: unknown argument '$1' (see --help)" ;;
    esac
  done
  [ -n "$rate$loss" ] || die "link: nothing to change (--rate MBIT|none, --loss PCT)"
  [ -z "$rate" ] || [ "$rate" = none ] || is_rate "$rate" || die "link --rate must be 1..100000 Mbit/s or none, got '$rate'"
  [ -z "$loss" ] || is_pct "$loss" || die "link --loss must be a percentage 0..100, got '$loss'"
  if [ -n "$rate" ]; then
    local mbit=$rate
    [ "$rate" != none ] || mbit=10000
    for ((l = 0; l < LEAVES; l++)); do
      change_port_rate "$(leaf_ns "$l")" "s$s" "$mbit"
      change_port_rate "$(spine_ns "$s")" "l$l" "$mbit"
    done
    set_setting "spine${s}_rate" "$rate"
  fi
  if [ -n "$loss" ]; then
    [ "$(loss_threshold "$loss")" -gt 0 ] || loss=none
    spine_nft "$(spine_ns "$s")" "$loss"
    set_setting "spine${s}_loss" "$loss"
  fi
  log "link: spine$s rate $(setting "spine${s}_rate") (Mbit/s), loss $(setting "spine${s}_loss") (%)"
}

# Policy routing on every leaf: packets of protocol $2 from the leaf's hosts to
# other leaves go through spine $1 only (fwmark 0x77, table 177); local hosts'
# /32 and /128 routes still win (lookup main suppress_prefixlength 24 / 64).
cmd_pin() {
  need_root
  [ $# -ge 1 ] || die "pin needs a spine (spine0, ..) or --clear"
  local s="" proto=tcp l lf
  load_fabric
  if [ "$1" = --clear ]; then
    [ $# -eq 1 ] || die "pin --clear takes no other arguments"
  else
    s=$(spine_index "$1") || exit 1
    shift
    while [ $# -gt 0 ]; do
      case $1 in
        --proto) proto=${2:?--proto needs a value}; shift 2 ;;
        *) die "pin: unknown argument '$1' (see --help)" ;;
      esac
    done
    [ "$proto" = tcp ] || [ "$proto" = udp ] || die "pin --proto must be tcp or udp, got '$proto'"
  fi
  for ((l = 0; l < LEAVES; l++)); do
    lf=$(leaf_ns "$l")
    ip netns exec "$lf" nft delete table inet "${PREFIX}_pin" 2>/dev/null || true
    local fam
    for fam in -4 -6; do
      while ip -n "$lf" "$fam" rule del pref 100 2>/dev/null; do :; done
      while ip -n "$lf" "$fam" rule del pref 101 2>/dev/null; do :; done
      ip -n "$lf" "$fam" route flush table 177 2>/dev/null || true
    done
    [ -n "$s" ] || continue
    run ip netns exec "$lf" nft -f - <<EOF
table inet ${PREFIX}_pin {
  chain pre {
    type filter hook prerouting priority -150; policy accept;
    iifname "p*" meta l4proto $proto meta mark set 0x77
  }
}
EOF
    run ip -n "$lf" -4 rule add pref 100 fwmark 0x77 lookup main suppress_prefixlength 24
    run ip -n "$lf" -4 rule add pref 101 fwmark 0x77 lookup 177
    run ip -n "$lf" -6 rule add pref 100 fwmark 0x77 lookup main suppress_prefixlength 64
    run ip -n "$lf" -6 rule add pref 101 fwmark 0x77 lookup 177
    run ip -n "$lf" route add "$SUBNET4.0/24" via "$(link4 "$l" "$s" 2)" dev "s$s" table 177
    run ip -n "$lf" -6 route add "$SUBNET6::/64" via "$(link6 "$l" "$s" 2)" dev "s$s" table 177
  done
  if [ -n "$s" ]; then
    set_setting pin "$proto:spine$s"
    log "pin: $proto from every leaf into the fabric goes through spine$s"
  else
    set_setting pin none
    log "pin: cleared (ECMP for everything)"
  fi
}

# ---------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------
# Packets counted by nft counter $2 in host namespace $1.
nft_packets() {
  ip netns exec "$1" nft list counter inet "$PREFIX" "$2" | awk '$1 == "packets" { print $2 }'
}

# "NAME PACKETS BYTES" for every counter of table inet $PREFIX in namespace $1.
nft_counters() {
  ip netns exec "$1" nft list counters table inet "$PREFIX" 2>/dev/null \
    | awk '$1 == "counter" { name = $2 } $1 == "packets" { print name, $2, $4 }'
}

# Every switch port: "NAMESPACE DEVICE TOWARDS" (the port's egress goes towards
# TOWARDS: h<i>, spine<s>, leaf<l>), in a stable order.
switch_ports() {
  local ns dev
  for ns in $(our_namespaces | grep -E -- "-(sw|leaf[0-9]+|spine[0-9]+)\$" | sort -V); do
    for dev in $(ip -n "$ns" -br link show type veth | awk '{print $1}' | cut -d@ -f1 | sort -V); do
      case $dev in
        p*) echo "$ns $dev h${dev#p}" ;;
        s*) echo "$ns $dev spine${dev#s}" ;;
        l*) echo "$ns $dev leaf${dev#l}" ;;
      esac
    done
  done
}

# Per-class counters of port $2 in namespace $1 as a table (from tc -s class show).
# A class whose DSCP a higher class's queue serves (dscp_served_above) shows "-".
port_table() {
  local -a DSCPS
  local c labels=""
  IFS=, read -r -a DSCPS <<<"${DSCP_OF_STATE:-$DEFAULT_DSCP}"
  for c in 0 1 2 3 4 5 6 7; do
    if dscp_served_above "$c"; then labels+="-,"; else labels+="${DSCPS[c]},"; fi
  done
  ip netns exec "$1" tc -s class show dev "$2" | awk -v labels="$labels" '
    BEGIN { split(labels, d, ","); printf "  %-6s %-11s %-5s %-4s %12s %14s %10s %9s\n", "class", "htb", "dscp", "prio", "sent_pkts", "sent_bytes", "dropped", "drop%" }
    $1 == "class" { id = $3; prio = ""; for (i = 1; i < NF; i++) if ($i == "prio") prio = $(i + 1) }
    $1 == "Sent" { bytes[id] = $2; pkts[id] = $4; dr = $7; sub(",", "", dr); drops[id] = dr; pr[id] = prio }
    END {
      for (c = 0; c < 8; c++) {
        id = "1:1" c
        if (!(id in pkts)) continue
        tot = pkts[id] + drops[id]
        printf "  %-6s %-11s %-5s %-4s %12.0f %14.0f %10.0f %8.2f%%\n", c, id, d[c + 1], pr[id], pkts[id], bytes[id], drops[id], tot ? 100 * drops[id] / tot : 0
      }
      if ("1:1" in pkts) printf "  %-6s %-11s %-5s %-4s %12.0f %14.0f %10.0f\n", "port", "1:1", "", "", pkts["1:1"], bytes["1:1"], drops["1:1"]
    }'
}

# One port's counters as a JSON object: the port (htb class 1:1) sent, the root
# qdisc's drops (every class), and [sent packets, dropped] of each class 0..7.
port_json() {
  local ns=$1 dev=$2 towards=$3
  { ip netns exec "$ns" tc -s qdisc show dev "$dev"; echo "--"; ip netns exec "$ns" tc -s class show dev "$dev"; } \
    | awk -v sw="${ns#"$PREFIX"-}" -v dev="$dev" -v to="$towards" '
    $1 == "--" { part = 2; next }
    part != 2 && $1 == "qdisc" { on = ($2 == "htb") }
    part != 2 && on && $1 == "Sent" { qd = $7; sub(",", "", qd); on = 0 }
    part == 2 && $1 == "class" { id = $3 }
    part == 2 && $1 == "Sent" { bytes[id] = $2; pkts[id] = $4; dr = $7; sub(",", "", dr); drops[id] = dr }
    END {
      printf "{\"switch\":\"%s\",\"port\":\"%s\",\"towards\":\"%s\",\"sent_packets\":%.0f,\"sent_bytes\":%.0f,\"queue_drops\":%.0f,\"classes\":[", sw, dev, to, pkts["1:1"], bytes["1:1"], qd
      for (c = 0; c < 8; c++) printf "%s[%.0f,%.0f]", c ? "," : "", pkts["1:1" c], drops["1:1" c]
      printf "]}"
    }'
}

# `counters`: spines, switch ports and hosts' loss counters as one JSON object.
cmd_counters() {
  [ $# -eq 0 ] || die "counters takes no arguments"
  need_root
  local nss first ns name p b sent sbytes qd s
  nss=$(our_namespaces)
  printf '{"prefix":"%s","up":%s,"fabric":%s,"pin":"%s","spines":[' "$PREFIX" \
    "$([ -n "$nss" ] && echo true || echo false)" \
    "$(echo "$nss" | grep -q -- '-spine[0-9]*$' && echo true || echo false)" "$(setting pin)"
  first=1
  for ns in $(echo "$nss" | grep -- '-spine[0-9]*$' | sort -V); do
    s=${ns##*-spine}
    [ $first = 1 ] || printf ','
    first=0
    printf '{"name":"spine%s","rate":"%s","loss":"%s"' "$s" "$(setting "spine${s}_rate")" "$(setting "spine${s}_loss")"
    while read -r name p b; do
      [ -n "$name" ] && printf ',"%s_packets":%.0f,"%s_bytes":%.0f' "$name" "$p" "$name" "$b"
    done < <(nft_counters "$ns")
    # What the spine's ports sent on (after loss) and their queues dropped.
    read -r sent sbytes qd < <(switch_ports | awk -v ns="$ns" '$1 == ns' | while read -r pns dev to; do
        port_json "$pns" "$dev" "$to" | sed 's/.*"sent_packets":\([0-9]*\),"sent_bytes":\([0-9]*\),"queue_drops":\([0-9]*\).*/\1 \2 \3/'
        echo
      done | awk '{ a += $1; b += $2; c += $3 } END { printf "%.0f %.0f %.0f\n", a, b, c }')
    printf ',"sent_packets":%.0f,"sent_bytes":%.0f,"queue_drops":%.0f}' "$sent" "$sbytes" "$qd"
  done
  printf '],"ports":['
  first=1
  while read -r pns dev to; do
    [ -n "$pns" ] || continue
    [ $first = 1 ] || printf ','
    first=0
    port_json "$pns" "$dev" "$to"
  done < <(switch_ports)
  printf '],"hosts":['
  first=1
  for ns in $(echo "$nss" | grep -- '-h[0-9]*$' | sort -V); do
    [ $first = 1 ] || printf ','
    first=0
    printf '{"name":"h%s"' "${ns##*-h}"
    while read -r name p b; do
      [ -n "$name" ] && printf ',"loss_%s_packets":%.0f' "$name" "$p"
    done < <(nft_counters "$ns")
    printf '}'
  done
  printf ']}\n'
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
    DSCP_OF_STATE=$(setting dscp)
  fi
  echo "  netdev_max_backlog: $(sysctl -n net.core.netdev_max_backlog) (saved: $(cat "$STATE/netdev_max_backlog" 2>/dev/null || echo none))"
  echo
  echo "== namespaces"
  echo "$nss" | sed 's/^/  /'
  local ns
  for ns in $(echo "$nss" | grep -- '-h[0-9]*$' | sort -V); do
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
  if echo "$nss" | grep -q -- '-spine[0-9]*$'; then
    echo
    echo "== spines (nft table inet $PREFIX, forward: packets / bytes into the spine; dropped = its random loss)"
    printf '  %-8s %-7s %-6s %12s %14s %12s %12s %10s %8s\n' spine rate loss seen_pkts seen_bytes udp_pkts tcp_pkts dropped share
    local total=0 s
    for ns in $(echo "$nss" | grep -- '-spine[0-9]*$'); do
      total=$(( total + $(nft_packets "$ns" seen) ))
    done
    for ns in $(echo "$nss" | grep -- '-spine[0-9]*$' | sort -V); do
      s=${ns##*-spine}
      nft_counters "$ns" | awk -v n="spine$s" -v r="$(setting "spine${s}_rate")" -v l="$(setting "spine${s}_loss")" -v t="$total" '
        { p[$1] = $2; b[$1] = $3 }
        END { printf "  %-8s %-7s %-6s %12.0f %14.0f %12.0f %12.0f %10.0f %7.1f%%\n", n, r, l, p["seen"], b["seen"], p["seen_udp"], p["seen_tcp"], p["dropped"], t ? 100 * p["seen"] / t : 0 }'
    done
  fi
  local pns dev to
  while read -r pns dev to; do
    [ -n "$pns" ] || continue
    echo
    echo "== ${pns#"$PREFIX"-} port $dev (egress towards $to)"
    port_table "$pns" "$dev"
    if [ "$VERBOSE" = 1 ]; then
      ip netns exec "$pns" tc -s class show dev "$dev" | sed 's/^/  /'
      ip netns exec "$pns" tc -s qdisc show dev "$dev" | sed 's/^/  /'
    fi
  done < <(switch_ports)
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
  counters) shift; cmd_counters "$@" ;;
  link) shift; cmd_link "$@" ;;
  pin) shift; cmd_pin "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  -h|--help|help) usage ;;
  "") usage >&2; exit 2 ;;
  *) die "unknown command '$1' (see --help)" ;;
esac
