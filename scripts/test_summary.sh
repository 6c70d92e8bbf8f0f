#!/usr/bin/env bash
# How many tests ran per group, and which were skipped, from the logs
# scripts/test.sh keeps: so a group that vanished (compiled to nothing, every
# test skipped, binary renamed away) is visible, and fails where it is required.
#
# Usage: scripts/test_summary.sh LOG_DIR
#   LOG_DIR/<stage>.log  cargo test output (2>&1) of one stage; <stage> names the
#                        group of binaries the table below does not place
#                        (unit.log: unit, anything else: end-to-end);
#                        testbed.log: scripts/testbed_test.sh's output
#   LOG_DIR/skipped.tsv  tests/prereq's records (binary, test, variable, reason)
# Groups: unit, simulation, end-to-end, testbed, DPDK, Python, torch. A group is
# required as its tests' prerequisite is (tests/prereq): DLCP_REQUIRE_<NAME>=1,
# or DLCP_CI=1 unless DLCP_REQUIRE_<NAME>=0; unit, simulation and end-to-end
# always. Exit status 1 if a required group ran no test.
set -euo pipefail
dir=${1:?usage: $0 LOG_DIR}

# Test binary -> group; $2 is the group of a binary not listed.
group_of() {
  case $1 in
    doctest:*) echo unit ;;
    dpdk_*|testbed_dpdk) echo DPDK ;;
    client_python_ddp|client_python_ddp_bf16|testbed_ddp|testbed_time_to_accuracy) echo torch ;;
    python|client_python_daemon|client_python_dtypes) echo Python ;;
    testbed_*) echo testbed ;;
    allreduce_sim|dtype_sim|scale_sim|sim_net|loss_grid|flow_sim|rate_sim) echo simulation ;;
    *) echo "$2" ;;
  esac
}

# The variable that requires a group (as tests/prereq reads it), or "" if always required.
group_var() {
  case $1 in
    DPDK) echo DLCP_REQUIRE_DPDK ;;
    Python) echo DLCP_REQUIRE_PYTHON ;;
    torch) echo DLCP_REQUIRE_TORCH ;;
    testbed) echo DLCP_REQUIRE_NETNS ;;
    *) echo "" ;;
  esac
}

required() {
  local var; var=$(group_var "$1")
  [ -z "$var" ] && return 0
  if [ -n "${!var+x}" ]; then [ "${!var}" = 1 ]; else [ "${DLCP_CI:-}" = 1 ]; fi
}

# "binary count" for every test binary run: passed + failed per `test result:`
# line, after the `Running ... (target/.../deps/NAME-HASH)` or `Doc-tests NAME`
# line that started it; scripts/testbed_test.sh's cases as one binary.
per_binary() {
  local f
  for f in "$dir"/*.log; do
    [ -e "$f" ] || continue
    awk '
      /^ *Running .*\(.*\)$/ {
        b = $0; sub(/.*\(/, "", b); sub(/\)$/, "", b); sub(/.*\//, "", b); sub(/-[0-9a-f]+$/, "", b)
        next
      }
      /^ *Doc-tests / { b = "doctest:" $2; next }
      /^test result: / {
        n = 0
        if (match($0, /[0-9]+ passed/)) n += substr($0, RSTART, RLENGTH) + 0
        if (match($0, /[0-9]+ failed/)) n += substr($0, RSTART, RLENGTH) + 0
        print (b == "" ? "?" : b), n
      }
      /^--- (ok|FAILED): / { tb++ }
      END { if (tb) print "testbed_test.sh", tb }
    ' "$f" | while read -r b n; do
      local stage; stage=$(basename "$f" .log)
      local g
      case $stage in
        unit) g=$(group_of "$b" unit) ;;
        testbed) g=testbed ;;
        *) g=$(group_of "$b" end-to-end) ;;
      esac
      echo "$g $b $n"
    done
  done
}

declare -A RAN=() SKIPPED=() BINS=()
ALL_GROUPS=(unit simulation end-to-end testbed DPDK Python torch)
for g in "${ALL_GROUPS[@]}"; do RAN[$g]=0; SKIPPED[$g]=0; BINS[$g]=0; done
while read -r g b n; do
  RAN[$g]=$(( ${RAN[$g]:-0} + n ))
  BINS[$g]=$(( ${BINS[$g]:-0} + 1 ))
done < <(per_binary)

skipped_lines=()
if [ -s "$dir/skipped.tsv" ]; then
  while IFS=$'\t' read -r b t var why; do
    case $b in testbed_test.sh) g=testbed ;; *) g=$(group_of "$b" end-to-end) ;; esac
    # A skipped test passed as far as libtest knows: it did not run.
    SKIPPED[$g]=$(( ${SKIPPED[$g]:-0} + 1 ))
    [ "$b" = testbed_test.sh ] || RAN[$g]=$(( ${RAN[$g]:-0} - 1 ))
    skipped_lines+=("$(printf '  %-10s %s::%s: %s [%s]' "$g" "$b" "$t" "$why" "$var")")
  done < "$dir/skipped.tsv"
fi

echo "=== tests per group ==="
printf '  %-11s %6s %8s %9s\n' group ran skipped binaries
status=0
for g in "${ALL_GROUPS[@]}"; do
  note=""
  if [ "${RAN[$g]}" -le 0 ]; then
    if required "$g"; then
      var=$(group_var "$g")
      note="  <- NONE RAN, but required${var:+ ($var=1 or DLCP_CI=1)}"
      status=1
    else
      note="  <- none ran (not required here)"
    fi
  fi
  printf '  %-11s %6d %8d %9d%s\n' "$g" "${RAN[$g]}" "${SKIPPED[$g]}" "${BINS[$g]}" "$note"
done
if ((${#skipped_lines[@]})); then
  echo "skipped (prerequisite missing; its variable makes it a failure):"
  printf '%s\n' "${skipped_lines[@]}"
else
  echo "skipped: none"
fi
exit $status
