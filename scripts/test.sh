#!/usr/bin/env bash
# Installs what is missing, builds, and runs the test suite with ctest.
# Usage: scripts/test.sh [--sanitize address|undefined|thread] [--without-torch] [ctest args...]
#   --without-torch: build and test only what does not link libtorch (swap/, tiers/, cpu_optimizer/,
#   the parsers, the fuzzers, the torch-free commands), as CI's sanitizer pass does.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_args=()
if [[ "${1:-}" == "--sanitize" ]]; then
  build_args=(--sanitize "$2")
  shift 2
fi
if [[ "${1:-}" == "--without-torch" ]]; then
  build_args+=(--build-dir "$ROOT/build${build_args[1]:+-${build_args[1]}}-notorch"
               -DSTRATA_WITH_TORCH=OFF -DSTRATA_WITH_CUDA=OFF)
  shift
fi
build_dir=$("$ROOT/scripts/build.sh" ${build_args[@]+"${build_args[@]}"} | tail -n 1)
cd "$build_dir"
jobs=$(nproc 2>/dev/null || echo 2)
ctest --output-on-failure -j "$jobs" "$@"
