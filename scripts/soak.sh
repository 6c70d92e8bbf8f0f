#!/usr/bin/env bash
# Soak and chaos on the emulated cluster (tests/soak.rs): four hosts of
# scripts/testbed.sh, rounds of allreduces under a rotating fault (loss 0 -> 5%
# -> 30%, an asymmetric partition, a flapping link, a dying trainer, a peer
# daemon killed and restarted between and in the middle of rounds), asserting
# no hang, delivered >= 1 - budget or an error with its reason, identical
# results on every host, flat RSS and fd counts, consistent counters.
#
# Usage: scripts/soak.sh [--minutes M] [--summary FILE]     (default 2 minutes)
# Needs root, iproute2, nftables (as scripts/testbed.sh). CI runs 2 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

MINUTES=2 SUMMARY=""
while [ $# -gt 0 ]; do
  case $1 in
    --minutes) MINUTES=${2:?--minutes needs a value}; shift 2 ;;
    --summary) SUMMARY=${2:?--summary needs a file}; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case $MINUTES in ''|*[!0-9.]*) echo "soak.sh: --minutes takes a number, not '$MINUTES'" >&2; exit 2 ;; esac

export DLCP_SOAK_MINUTES=$MINUTES DLCP_REQUIRE_NETNS=${DLCP_REQUIRE_NETNS:-1}
[ -z "$SUMMARY" ] || export DLCP_SOAK_SUMMARY=$SUMMARY
exec cargo test -p dlcp --locked --release --test soak -- --ignored --nocapture --test-threads=1
