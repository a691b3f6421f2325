#!/usr/bin/env bash
# Installs what is missing, builds, and runs the test suite with ctest.
# Usage: scripts/test.sh [--sanitize address|undefined|thread] [ctest args...]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_args=()
if [[ "${1:-}" == "--sanitize" ]]; then
  build_args=(--sanitize "$2")
  shift 2
fi
build_dir=$("$ROOT/scripts/build.sh" "${build_args[@]}" | tail -n 1)
cd "$build_dir"
jobs=$(nproc 2>/dev/null || echo 2)
ctest --output-on-failure -j "$jobs" "$@"
