#!/usr/bin/env bash
# Run dlcp's cargo-fuzz targets (fuzz/, see fuzz/README.md) on stable Rust.
#
#   scripts/fuzz.sh TARGET [--minutes N]   one target for N minutes (default 10)
#   scripts/fuzz.sh --ci [SECONDS]         one target for SECONDS (default 60),
#                                          chosen by the day of the year
#   scripts/fuzz.sh --list                 the targets
#   scripts/fuzz.sh TARGET --coverage [DIR...]
#                                          line coverage of the committed corpus
#                                          plus DIRs (e.g. a run's new inputs):
#                                          lines reached in the code the target
#                                          is for, and in the whole build
#
# Installs cargo-fuzz if it is missing. Runs one libFuzzer job at nice 10 from
# the committed corpus (fuzz/corpus/TARGET/, read only); inputs that add
# coverage go to a scratch folder whose path is printed (minimise them into
# the corpus with `cargo fuzz cmin`, see fuzz/README.md). Prints the execs,
# the coverage (libFuzzer's `cov:` edges and `ft:` features) and the corpus
# size at the end. A crash fails the script and names the input under
# fuzz/artifacts/TARGET/. DLCP_FUZZ_TARGET overrides --ci's choice.
set -euo pipefail
SELF=$(realpath "$0")
cd "$(dirname "$SELF")/../fuzz"

usage() { sed -n '2,20p' "$SELF" | sed 's/^# \{0,1\}//'; exit 2; }

ensure_cargo_fuzz() {
  if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz not found: installing it (cargo install cargo-fuzz --locked)"
    cargo install cargo-fuzz --locked
  fi
}

targets() { cargo fuzz list; }

# run TARGET SECONDS
run() {
  local target=$1 seconds=$2 scratch log rc list
  list=$(targets)
  grep -qx "$target" <<<"$list" || { echo "unknown target '$target'; targets:" $list >&2; exit 2; }
  scratch=$(mktemp -d "/tmp/dlcp-fuzz-$target.XXXXXX")
  log=$scratch.log
  mkdir -p "corpus/$target" "artifacts/$target"
  echo "fuzzing $target for ${seconds}s (corpus: fuzz/corpus/$target, new inputs: $scratch)"
  nice -n 10 cargo fuzz build -s none "$target"
  set +e
  nice -n 10 cargo fuzz run -s none "$target" "$scratch" "corpus/$target" -- \
    -max_total_time="$seconds" -max_len=4096 -timeout=30 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="artifacts/$target/" 2>&1 | tee "$log" \
    | grep --line-buffered -E '(INITED|pulse|DONE|ERROR|panicked|SUMMARY|Test unit written)'
  rc=${PIPESTATUS[0]}
  set -e
  local last execs rate secs
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log")
  echo "--- fuzz $target: ${execs:-?} execs in ${secs:-<$seconds}s (${rate:-?}/s); last status: ${last:-none}"
  echo "--- $(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+' <<<"$last" || echo 'no coverage line')"
  echo "--- new inputs: $(find "$scratch" -type f | wc -l) in $scratch (log: $log)"
  if [ "$rc" -ne 0 ]; then
    echo "--- fuzz $target FAILED (exit $rc): see $log and fuzz/artifacts/$target/;" \
      "replay with: cd fuzz && cargo fuzz run -s none $target fuzz/artifacts/$target/<file>" >&2
    exit "$rc"
  fi
}

# The code each target is for: coverage reports lines reached there.
focus() {
  case $1 in
    endpoint) echo 'proto/src/' ;;
    frame) echo 'daemon/src/datapath/frame' ;;
    gro) echo 'daemon/src/datapath/socket/queue.rs' ;;
    control) echo 'shm/src/control' ;;
    ring) echo 'shm/src/' ;;
    config) echo 'config/src/' ;;
    admin) echo 'daemon/src/service/admin' ;;
    metrics) echo 'daemon/src/metrics' ;;
    decode|decode_tagged) echo 'proto/src/wire/' ;;
    *) echo '/' ;;
  esac
}

# coverage TARGET DIR...: the corpus (and DIRs) replayed by an instrumented
# build (-C instrument-coverage, llvm-tools), summed by llvm-cov.
coverage() {
  local target=$1 bin tools
  shift
  rustup component list --installed 2>/dev/null | grep -q '^llvm-tools' \
    || { echo "installing llvm-tools (rustup component add llvm-tools)"; rustup component add llvm-tools; }
  tools="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin"
  nice -n 10 cargo fuzz coverage -s none "$target" "corpus/$target" "$@" >/dev/null
  bin=$(find target -path "*coverage*/release/$target" -type f -perm -u+x | head -1)
  "$tools/llvm-cov" export -summary-only "$bin" -instr-profile="coverage/$target/coverage.profdata" \
    --ignore-filename-regex='/\.cargo/|/rustc/|/library/|/fuzz/' \
    | python3 -c '
import json, sys
target, focus = sys.argv[1], sys.argv[2]
files = json.load(sys.stdin)["data"][0]["files"]
def lines(fs):
    return sum(f["summary"]["lines"]["covered"] for f in fs), sum(f["summary"]["lines"]["count"] for f in fs)
fc, fn = lines([f for f in files if focus in f["filename"]])
ac, an = lines(files)
pct = lambda c, n: 100 * c / n if n else 0
print(f"--- coverage {target}: {fc} of {fn} lines reached ({pct(fc, fn):.1f}%) in {focus}; "
      f"{ac} of {an} ({pct(ac, an):.1f}%) in the whole build")' "$target" "$(focus "$target")"
}

case "${1:-}" in
  ""|-h|--help) usage ;;
  --list) ensure_cargo_fuzz; targets ;;
  --ci)
    ensure_cargo_fuzz
    mapfile -t all < <(targets | grep -vE '^decode')
    all+=(decode decode_tagged)
    day=$((10#$(date -u +%j)))
    target=${DLCP_FUZZ_TARGET:-${all[day % ${#all[@]}]}}
    echo "CI fuzz: day $day of the year -> target $target (of ${#all[@]}: ${all[*]})"
    run "$target" "${2:-60}"
    ;;
  -*) usage ;;
  *)
    target=$1; shift
    minutes=10
    while [ $# -gt 0 ]; do
      case $1 in
        --minutes) minutes=${2:?--minutes needs a number}; shift 2 ;;
        --coverage) shift; ensure_cargo_fuzz; coverage "$target" "$@"; exit 0 ;;
        *) usage ;;
      esac
    done
    ensure_cargo_fuzz
    run "$target" $((minutes * 60))
    ;;
esac
