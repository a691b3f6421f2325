#!/usr/bin/env bash
# ThreadSanitizer over the threaded code that does not link libtorch: base/ (Worker), swap/ (the
# I/O engines, fault injection), tiers/ (TierManager, HostDevice, the arena) and the device and
# I/O conformance suites. Builds only those tests, in build-thread-notorch/.
# Not covered here: the engine's parts (runtime/engine) link libtorch, which is not instrumented
# (its OpenMP/TBB pools would need suppressing wholesale) and costs ~10 min more to build with
# TSan; they run under TSan by hand (README "Building and testing").
# Usage: scripts/tsan.sh [ctest args...]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
targets=(base_test tiers_test device_conformance_test io_conformance_test swap_alignment_test
         swap_io_registry_test swap_fault_injection_test swap_space_test swap_fault_spec_test
         swap_run_dir_test)
build_dir=$("$ROOT/scripts/build.sh" --sanitize thread --build-dir "$ROOT/build-thread-notorch" \
  -DSTRATA_WITH_TORCH=OFF -DSTRATA_WITH_CUDA=OFF "${targets[@]}" | tail -n 1)
cd "$build_dir"
# halt_on_error: the first race fails the test that found it. The posix backend: TSan cannot see
# the hand-off of a request through an io_uring ring (tests/tsan.supp).
export TSAN_OPTIONS="suppressions=$ROOT/tests/tsan.supp halt_on_error=1 ${TSAN_OPTIONS:-}"
export STRATA_IO_BACKEND=${STRATA_IO_BACKEND:-posix}
ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" -L 'base|tiers|swap|conformance' "$@"
