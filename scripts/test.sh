#!/usr/bin/env bash
# Installs what is missing, builds, and runs the test suite with ctest.
# Usage: scripts/test.sh [--werror] [--sanitize address|undefined|thread] [--without-torch]
#   [ctest args...]
#   --werror: compiler warnings are errors (what CI builds with).
#   --without-torch: build and test only what does not link libtorch (swap/, tiers/, cpu_optimizer/,
#   the parsers, the fuzzers, the torch-free commands), as CI's sanitizer pass does.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_args=()
if [[ "${1:-}" == "--werror" ]]; then  # warnings are errors (CI); otherwise the cached setting
  build_args+=(-DSTRATA_WERROR=ON)
  shift
fi
if [[ "${1:-}" == "--sanitize" ]]; then
  build_args+=(--sanitize "$2")
  shift 2
fi
if [[ "${1:-}" == "--without-torch" ]]; then
  sanitizer=""
  for ((i = 0; i + 1 < ${#build_args[@]}; ++i)); do
    [[ ${build_args[i]} == --sanitize ]] && sanitizer=${build_args[i + 1]}
  done
  build_args+=(--build-dir "$ROOT/build${sanitizer:+-${sanitizer//,/-}}-notorch"
               -DSTRATA_WITH_TORCH=OFF -DSTRATA_WITH_CUDA=OFF)
  shift
fi
build_dir=$("$ROOT/scripts/build.sh" ${build_args[@]+"${build_args[@]}"} | tail -n 1)
cd "$build_dir"
jobs=$(nproc 2>/dev/null || echo 2)
ctest --output-on-failure -j "$jobs" "$@"
