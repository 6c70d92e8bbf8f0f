#!/usr/bin/env bash
# dlcp benchmarks: dlcp against Gloo and Open MPI on the same emulated cluster,
# and against the machine's limits. Usage: bench/run.sh [--quick] [--load-note TEXT]
#
# Installs what it needs (Debian 12, as root), builds release, runs every
# benchmark (bench/harness.py) on the testbed of scripts/testbed.sh, tears the
# testbed down even on failure, and writes bench/results/<date>-<host>.md + PNGs.
# --quick: under 5 minutes, 16 MiB headline at MTU 1500 and 9000, one summary line
# per benchmark. --perf [SECONDS]: perf profiles of the clean headline runs.
# Extra arguments go to bench/harness.py (--only STEPS, --load-note TEXT, --perf, --tag NAME;
# the leaf-spine step: --only spine [--spine-rate MBIT] [--spine-reps N] [--paths N]).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PREFIX=${DLCP_BENCH_PREFIX:-benchr}
APT_PACKAGES="build-essential pkg-config iproute2 nftables ethtool iperf3 time python3 python3-numpy \
python3-torch python3-matplotlib openmpi-bin python3-mpi4py python3-scipy python3-requests"
# MNIST-1D's generator for bench/time_to_accuracy.py, pinned; its dependencies come from Debian.
MNIST1D_VERSION=0.0.2.post1

say() { echo "[bench/run.sh] $*" >&2; }

[ "$(id -u)" -eq 0 ] || { say "must run as root (network namespaces, tc, sysctl)"; exit 1; }

missing=""
for p in $APT_PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  say "installing:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends $missing >/dev/null
fi
if [ "$(/usr/bin/python3 -c 'import importlib.metadata as m; print(m.version("mnist1d"))' 2>/dev/null)" != "$MNIST1D_VERSION" ]; then
  say "installing: mnist1d==$MNIST1D_VERSION (pip, no deps)"
  /usr/bin/python3 -m pip install -q --no-deps --break-system-packages "mnist1d==$MNIST1D_VERSION" >/dev/null
fi
case " $* " in
  *" --perf"*)
    command -v perf >/dev/null || {
      say "installing: linux-perf (for --perf)"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends linux-perf >/dev/null
    } ;;
esac
command -v cargo >/dev/null || { say "cargo not found: install a Rust toolchain >= 1.85 (rustup)"; exit 1; }

say "building release (dlcpd, dlcpctl, dlcp-bench)"
cargo build --release --locked -q -p dlcp -p dlcp-bench

CC_SAVE=/run/dlcp-bench-allowed-cc
cleanup() {
  DLCPTB_PREFIX=$PREFIX scripts/testbed.sh down >/dev/null 2>&1 || true
  # The harness removes its cgroups itself; this covers a harness that was killed:
  # end what is still in them (only processes the harness started) and remove them.
  local mnt g c
  for mnt in $(awk '$3 == "cgroup2" { print $2 }' /proc/mounts); do
    g=$mnt/dlcp-bench-$PREFIX
    [ -d "$g" ] || continue
    for c in "$g"/*/; do
      [ -f "$c/cgroup.kill" ] && echo 1 >"$c/cgroup.kill" 2>/dev/null || true
    done
    sleep 0.5
    for c in "$g"/*/; do rmdir "$c" 2>/dev/null || true; done
    rmdir "$g" 2>/dev/null || true
  done
  # The harness restores this itself; this covers a harness that was killed.
  if [ -f "$CC_SAVE" ]; then
    sysctl -q -w net.ipv4.tcp_allowed_congestion_control="$(cat "$CC_SAVE")" || true
    rm -f "$CC_SAVE"
  fi
}
trap cleanup EXIT INT TERM

say "running benchmarks (progress below; summary lines on stdout)"
/usr/bin/python3 bench/harness.py --prefix "$PREFIX" --bindir "$ROOT/target/release" "$@"
