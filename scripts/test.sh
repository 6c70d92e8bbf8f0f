#!/usr/bin/env bash
# Install what a fresh Debian 12 machine lacks, then run every dlcp test.
# Usage: ./scripts/test.sh            (as root, or with sudo available for apt)
# Prints how long each stage took and how many tests ran per group (unit,
# simulation, end-to-end, testbed, DPDK, Python, torch), and which were skipped.
# Exits non-zero on the first failure, or if a required group ran no test.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR=never
export DEBIAN_FRONTEND=noninteractive
T0=$(date +%s)
declare -a TIMES=()
# Each test stage's output is kept here too (and shown as it runs), with the
# skipped tests' records (tests/prereq), for scripts/test_summary.sh at the end.
LOG_DIR=$(mktemp -d /tmp/dlcp-test-logs.XXXXXX)
export DLCP_SKIP_LOG=$LOG_DIR/skipped.tsv
: >"$DLCP_SKIP_LOG"
logged() {
  local log=$1; shift
  "$@" 2>&1 | tee -a "$LOG_DIR/$log.log"
}

stage() {
  local name=$1; shift
  local t=$(date +%s)
  echo
  echo "=== stage: $name ==="
  "$@"
  local dt=$(( $(date +%s) - t ))
  TIMES+=("$(printf '%-22s %4ds' "$name" "$dt")")
  echo "=== stage $name done in ${dt}s ==="
}

# Debian packages the build and tests need.
# systemd: systemd-analyze for the unit's tests (systemd itself is not started);
# adduser: the .deb's maintainer scripts; python3-yaml: the Kubernetes manifest check;
# util-linux: setpriv (dlcpctl permission test, running the installed daemon as dlcp);
# kmod: modprobe br_netfilter (scripts/testbed.sh: the switch's bridge hooks);
# python3-venv/-pip/-setuptools/-wheel: the Python client's wheel, built offline and
# pip-installed into a fresh virtualenv (tests/client_python_wheel.rs).
# python3-scipy/-requests (+ numpy, matplotlib): mnist1d's dependencies, from Debian.
APT_PACKAGES=(build-essential pkg-config ca-certificates git python3 python3-numpy
              python3-venv python3-pip python3-setuptools python3-wheel
              iproute2 nftables tcpdump iperf3 ethtool iputils-ping
              dpdk-dev libdpdk-dev clang libclang-dev
              python3-torch python3-sklearn python3-matplotlib python3-scipy python3-requests
              systemd adduser python3-yaml util-linux kmod)

# MNIST-1D's generator (examples/mnist1d_task.py: the DDP example's task, the
# time-to-accuracy bench and its smoke test), pinned; no Debian package has it.
# Its dependencies come from Debian (APT_PACKAGES), hence --no-deps; it goes to
# /usr/local (pip's --break-system-packages only lifts Debian's guard against that).
MNIST1D_VERSION=0.0.2.post1
install_mnist1d() {
  local have
  have=$(/usr/bin/python3 -c 'import importlib.metadata as m; print(m.version("mnist1d"))' 2>/dev/null || true)
  if [ "$have" = "$MNIST1D_VERSION" ]; then
    echo "mnist1d $have present"
    return
  fi
  local SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "installing: mnist1d==$MNIST1D_VERSION (pip, no deps)"
  $SUDO /usr/bin/python3 -m pip install -q --no-deps --break-system-packages "mnist1d==$MNIST1D_VERSION"
}

install_deps() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if ((${#missing[@]})); then
    local SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    echo "installing: ${missing[*]}"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "apt packages present: ${APT_PACKAGES[*]}"
  fi
  install_mnist1d
  if ! command -v cargo >/dev/null; then
    echo "error: cargo not found. Install a Rust toolchain >= 1.85 (https://rustup.rs), then rerun." >&2
    exit 1
  fi
  cargo --version
  rustup component list --installed 2>/dev/null | grep -E 'clippy|rustfmt' || true
}

# What install_deps installed is required from here on: a test that misses it
# fails naming it (tests/prereq) instead of being reported as skipped. Under CI
# (DLCP_CI=1, which .ci/run sets, or CI set by a CI system) every prerequisite
# is, network namespaces (root) included. A variable set beforehand wins
# (e.g. DLCP_REQUIRE_TORCH=0).
require_installed() {
  if [ -n "${CI:-}" ]; then export DLCP_CI=${DLCP_CI:-1}; fi
  if pkg-config --atleast-version=22.11 libdpdk; then
    export DLCP_REQUIRE_DPDK=${DLCP_REQUIRE_DPDK:-1}
  fi
  export DLCP_REQUIRE_PYTHON=${DLCP_REQUIRE_PYTHON:-1} DLCP_REQUIRE_TORCH=${DLCP_REQUIRE_TORCH:-1} \
    DLCP_REQUIRE_TCPDUMP=${DLCP_REQUIRE_TCPDUMP:-1} DLCP_REQUIRE_SYSTEMD=${DLCP_REQUIRE_SYSTEMD:-1}
  echo "required test prerequisites: $(env | grep -E '^DLCP_(CI|REQUIRE_[A-Z0-9]+)=' | sort | tr '\n' ' ')"
}

fmt_check() { cargo fmt --all -- --check; }
clippy() { cargo clippy --workspace --all-targets --locked -- -D warnings; }
build() { cargo build --workspace --release --locked; }
# Unit tests, property tests and the protocol simulations (everything but the
# daemon package's end-to-end tests).
unit_and_sim_tests() {
  logged unit cargo test --workspace --locked --exclude dlcp
  logged unit cargo test -p dlcp --locked --lib --bins
}
# End-to-end tests of the daemon package (real dlcpd processes, trainers, UDP on
# loopback, shared memory): release build, one test at a time (2 cores).
# The Python trainer test needs libdlcp_client.so of the same profile (a missing
# Python/numpy is a failure: require_installed).
e2e_tests() {
  cargo build -p dlcp-client --release --locked
  logged e2e cargo test -p dlcp --locked --release --tests -- --test-threads=1
}
# The build without DPDK (libdpdk hidden from pkg-config by an empty
# PKG_CONFIG_LIBDIR): clippy is clean, the build succeeds, dlcpd says DPDK is not
# built and runs on sockets (auto falls back, dpdk fails fast). Rebuilds only the
# workspace crates; the release binary is rebuilt with DPDK at the end.
no_dpdk() {
  local empty; empty=$(mktemp -d)
  echo "clippy without DPDK"
  PKG_CONFIG_LIBDIR=$empty cargo clippy --workspace --all-targets --locked -- -D warnings
  echo "fallback tests without DPDK (the one test that needs DPDK reports a skip)"
  logged no-dpdk env PKG_CONFIG_LIBDIR="$empty" DLCP_REQUIRE_DPDK=0 \
    cargo test -p dlcp --locked --release --test datapath_fallback -- --test-threads=1
  rmdir "$empty"
  cargo build --workspace --release --locked
}
# The benchmark tools, cheaply: the micro-benchmark binary runs (20 ms per figure)
# and prints a ratio line for each of its figures; the harness's self-check
# (ResNet-50 parameter list, bucketing, percentiles), the slow-port tool's
# parsers and the time-to-accuracy report's arithmetic. The benchmarks themselves
# (bench/run.sh) are not CI.
bench_smoke() {
  local out name
  out=$(./target/release/dlcp-bench micro --ms 20)
  echo "$out" | grep -v '^JSON'
  for name in header_codec packet_codec_mac mac_verify mac_single aggregation shm_round_trip shm_tensor \
    endpoint_allreduce endpoint_allreduce_jumbo endpoint_allreduce_noauth; do
    echo "$out" | grep -q "^$name: dlcp .*, peer .*, ratio " \
      || { echo "dlcp-bench micro: no summary line for $name" >&2; return 1; }
  done
  /usr/bin/python3 bench/harness.py --self-check
  /usr/bin/python3 bench/slow_port.py --self-check
  /usr/bin/python3 bench/step_ab.py --self-check
  /usr/bin/python3 bench/time_to_accuracy.py --self-check
  /usr/bin/python3 bench/perf_stages.py --self-check
}
demo() {
  ./target/release/dlcpd --version
  ./target/release/dlcpd demo --iters 3 --loss 1
}

stage install install_deps
require_installed
stage fmt fmt_check
stage clippy clippy
stage build-release build
stage test unit_and_sim_tests
stage e2e e2e_tests
# The emulated cluster: namespaces, a bridge switch with DSCP priority queues,
# loss (as root; skipped loudly otherwise, a failure under CI).
stage testbed logged testbed ./scripts/testbed_test.sh
# Soak and chaos on the emulated cluster, 2 minutes (scripts/soak.sh --minutes M
# for long runs).
stage soak logged testbed ./scripts/soak.sh --minutes 2
stage no-dpdk no_dpdk
# The Debian package: cargo-deb (installed if missing), apt install, check-config,
# the installed daemon + Python client, remove, purge; the k8s manifest offline.
stage deb ./scripts/deb_test.sh
stage demo demo
stage bench-smoke bench_smoke
# One fuzz target for about a minute, a different one each day (scripts/fuzz.sh
# --ci: installs cargo-fuzz if missing; the first build of fuzz/ takes minutes).
# The corpora themselves are replayed by the test stage (fuzz/check).
stage fuzz ./scripts/fuzz.sh --ci 60

echo
echo "=== stage times ==="
for t in "${TIMES[@]}"; do echo "  $t"; done
echo "  total                  $(( $(date +%s) - T0 ))s"
echo
echo "(test logs: $LOG_DIR)"
./scripts/test_summary.sh "$LOG_DIR"
