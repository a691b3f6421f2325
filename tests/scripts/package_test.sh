#!/usr/bin/env bash
# strata as a CMake package: installs the build into a scratch prefix, builds examples/consumer/
# against it with find_package(strata), runs it, and checks that
#   - the installed package names no path of the source or build tree;
#   - the consumer's losses are finite and equal to `strata train`'s for the same settings;
#   - the SentencePiece module is found from the install: by the installed `strata` (relative to
#     the binary) and by the consumer (its RUNPATH), and a missing one is an error naming where
#     it was looked for.
# Usage: package_test.sh SOURCE_DIR BUILD_DIR   (ctest runs it: tests/CMakeLists.txt)
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
steps=3

tmp=$(mktemp -d "${TMPDIR:-/tmp}/strata-package.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "package_test: FAIL: $*" >&2; exit 1; }
run_logged() {  # run_logged LOG CMD...: runs CMD, showing LOG only when it fails
  local log=$1; shift
  local rc=0
  "$@" >"$log" 2>&1 || rc=$?
  ((rc == 0)) || { cat "$log" >&2; fail "$* (exit $rc)"; }
}
cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }

prefix=$tmp/prefix
SECONDS=0
run_logged "$tmp/install.log" cmake --install "$build" --prefix "$prefix"
for f in "$prefix/lib/cmake/strata/strataConfig.cmake" "$prefix/bin/strata" \
         "$prefix/include/strata/runtime/engine/engine.h" "$prefix/include/strata/strata/config.h"; do
  [[ -e "$f" ]] || fail "the install has no $f"
done
module=$(find "$prefix" -name 'libstrata_sentencepiece.so')
[[ -n "$module" ]] || fail "the install has no libstrata_sentencepiece.so"
if grep -rlF -e "$src" -e "$build" "$prefix/lib/cmake/strata"; then
  fail "the installed package names the source or build tree (above)"
fi
echo "install: ${SECONDS}s"

# The installed binary loads the module beside it: a bogus tokenizer.model then fails in
# SentencePiece itself, not in finding the module.
mkdir -p "$tmp/model"
echo "not a model" >"$tmp/model/tokenizer.model"
echo '{"vocab_size": 32000}' >"$tmp/model/config.json"
printf 'some text\n' >"$tmp/text.txt"
out=$(env -u STRATA_SENTENCEPIECE_SHIM "$prefix/bin/strata" tokenize --model "$tmp/model" \
      --input "$tmp/text.txt" --output "$tmp/tokens.bin" 2>&1) && fail "tokenize of a bogus model passed"
[[ "$out" == *"not a SentencePiece model"* ]] ||
  fail "installed strata did not load its SentencePiece module: $out"
# Without the module: an error that says what was looked for, and where.
mv "$module" "$tmp/module.so"
out=$(env -u STRATA_SENTENCEPIECE_SHIM "$prefix/bin/strata" tokenize --model "$tmp/model" \
      --input "$tmp/text.txt" --output "$tmp/tokens.bin" 2>&1) && fail "tokenize without the module passed"
mv "$tmp/module.so" "$module"
[[ "$out" == *"cannot load libstrata_sentencepiece.so"*"Tried:"*"$(dirname "$module")"* ]] ||
  fail "missing module: unclear error: $out"

# The consumer, with the compiler and the libtorch strata was built with.
args=(-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release
      -DCMAKE_CXX_COMPILER="$(cache CMAKE_CXX_COMPILER)")
torch_dir=$(cache Torch_DIR)
[[ -n "$torch_dir" && "$torch_dir" != *NOTFOUND ]] && args+=(-DTorch_DIR="$torch_dir")
SECONDS=0
run_logged "$tmp/configure.log" cmake -S "$src/examples/consumer" -B "$tmp/consumer" "${args[@]}"
run_logged "$tmp/build.log" cmake --build "$tmp/consumer" -j "$(nproc)"
echo "consumer configure + build: ${SECONDS}s"

out=$(env -u STRATA_SENTENCEPIECE_SHIM "$tmp/consumer/open_tokenizer" "$tmp/model" 2>&1) &&
  fail "open_tokenizer of a bogus model passed"
[[ "$out" == *"not a SentencePiece model"* ]] ||
  fail "the consumer did not find the SentencePiece module: $out"

# The same run twice: the consumer's Trainer and the installed `strata train`.
seq 1 3000 | sed 's/$/ strata trains models larger than memory./' >"$tmp/data.txt"
for who in consumer cli; do
  cat >"$tmp/$who.json" <<EOF
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
   "offload_param": {"device": "nvme", "nvme_path": "$tmp/nvme-$who"},
   "offload_optimizer": {"device": "nvme", "nvme_path": "$tmp/nvme-$who"}}}
EOF
  mkdir -p "$tmp/nvme-$who"
done
SECONDS=0
run_logged "$tmp/consumer.out" "$tmp/consumer/train_tiny" "$tmp/consumer.json" "$tmp/data.txt" "$steps"
cat "$tmp/consumer.out"
run_logged "$tmp/cli.out" "$prefix/bin/strata" train --model tiny --device host --threads 1 --quiet \
  --config "$tmp/cli.json" --data "$tmp/data.txt" --steps "$steps" --log-json "$tmp/cli.jsonl"
echo "two runs of $steps steps: ${SECONDS}s"

grep -q "^strata .*: $steps steps$" "$tmp/consumer.out" || fail "the consumer did not finish"
if command -v python3 >/dev/null; then
  python3 - "$tmp/consumer.out" "$tmp/cli.jsonl" "$steps" <<'EOF' || fail "losses differ (above)"
import json, math, sys
mine = [float(l.split()[3]) for l in open(sys.argv[1]) if l.startswith("step ")]
cli = [json.loads(l)["loss"] for l in open(sys.argv[2])]
steps = int(sys.argv[3])
assert len(mine) == steps and all(math.isfinite(x) for x in mine), mine
assert mine == cli, f"consumer {mine} != strata train {cli}"
EOF
else
  echo "python3 absent: checked only that the consumer's losses are finite"
  [[ $(grep -c '^step ' "$tmp/consumer.out") == "$steps" ]] || fail "the consumer's step count"
  if grep -qiE '^step [0-9]+ loss -?(nan|inf)' "$tmp/consumer.out"; then fail "a loss is not finite"; fi
fi
echo "package_test: OK"
