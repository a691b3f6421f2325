#!/usr/bin/env bash
# Builds the libFuzzer fuzzers of strata's input parsers (tests/fuzz/libfuzzer: config,
# checkpoint, safetensors, hf_index) with clang and -fsanitize=fuzzer,address,undefined, and runs
# each for SECONDS (default 180) from a seed corpus, at most JOBS (default 2) at a time.
# Usage: scripts/fuzz.sh [SECONDS] [FUZZER...]
#   Env: BUILD_DIR (default build-fuzz), JOBS, CC/CXX (default clang/clang++).
# Corpora grow in $BUILD_DIR/corpus/<name>; crashes land in $BUILD_DIR/findings/<name>; each run's
# log is $BUILD_DIR/logs/<name>.log and its last stats line is printed at the end. Exit status 1
# if any fuzzer found something.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-180}
shift || true
fuzzers=("$@")
((${#fuzzers[@]})) || fuzzers=(config checkpoint safetensors hf_index)
build=${BUILD_DIR:-$ROOT/build-fuzz}
jobs=${JOBS:-2}

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
mkdir -p "$build"
CC=${CC:-clang} CXX=${CXX:-clang++} cmake -S "$ROOT" -B "$build" -DSTRATA_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j "$jobs" --target "${fuzzers[@]/%/_fuzzer}" >&2

run() {
  local name=$1 bin="$build/tests/fuzz/${1}_fuzzer"
  local corpus="$build/corpus/$name" findings="$build/findings/$name"
  mkdir -p "$corpus" "$findings" "$build/logs"
  # Seeds: real configs for the config parser; the file targets write their own.
  if [[ $name == config ]]; then
    cp "$ROOT"/examples/*.json "$ROOT"/tests/data/deepspeed_configs/*.json "$corpus"/
  else
    STRATA_FUZZ_SEED_CORPUS="$corpus" "$bin" -runs=0 "$corpus" >/dev/null 2>&1
  fi
  [[ -d $ROOT/tests/fuzz/regressions/$name ]] && cp -r "$ROOT/tests/fuzz/regressions/$name/." "$corpus"/
  "$bin" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$findings/" "$corpus" >"$build/logs/$name.log" 2>&1
}

status=0
pids=()
names=()
for name in "${fuzzers[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do sleep 1; done
  run "$name" &
  pids+=($!)
  names+=("$name")
done
for i in "${!pids[@]}"; do
  name=${names[$i]}
  if wait "${pids[$i]}"; then result=clean; else result=FOUND; status=1; fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/logs/$name.log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -E '^#[0-9]+' "$build/logs/$name.log" | tail -1 | grep -o 'cov: [0-9]* ft: [0-9]*' || true)
  echo "$name: $result, $execs executions, $cov, corpus $(ls "$build/corpus/$name" | wc -l) files, findings: $(ls "$build/findings/$name" | wc -l)"
done
exit $status
