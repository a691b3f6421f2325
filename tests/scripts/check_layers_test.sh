#!/usr/bin/env bash
# scripts/check-layers.sh fails on each kind of broken rule and passes the tree as it is: an upward
# include from a lower folder, a libtorch header in a torch-free folder, a folder the table does not
# place. Each case runs on a copy of the source tree with one line added.
# Usage: tests/scripts/check_layers_test.sh SOURCE_ROOT
set -euo pipefail
SRC=$(cd "$1" && pwd)
CHECK="$SRC/scripts/check-layers.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fresh_copy() {
  rm -rf "$work/tree"
  mkdir -p "$work/tree"
  (cd "$SRC" && find base swap tiers gpu cpu_optimizer runtime bench tools scripts \
    \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) -print0 |
    xargs -0 cp --parents -t "$work/tree")
}

expect() {  # expect RC WHAT_IN_OUTPUT DESCRIPTION
  local rc=0 out
  out=$(bash "$CHECK" "$work/tree" 2>&1) || rc=$?
  if [[ $rc != "$1" || $out != *"$2"* ]]; then
    echo "FAIL: $3: exit $rc (wanted $1), output:"; echo "$out"; exit 1
  fi
  echo "ok: $3"
}

fresh_copy
expect 0 "layering OK" "the tree as it is"

fresh_copy
echo '#include "runtime/engine/engine.h"' >>"$work/tree/tiers/tier.h"
expect 1 "tiers/tier.h" "tiers/ including runtime/engine"

fresh_copy
echo '#include "bench/bench_step.h"' >>"$work/tree/runtime/commands/trainer.h"
expect 1 "runtime/commands -> bench" "runtime/ including bench/"

fresh_copy
echo '#include "runtime/engine/engine.h"' >>"$work/tree/runtime/config/config.h"
expect 1 "runtime/config -> runtime/engine" "config/ including engine/"

fresh_copy
echo '#include <ATen/ATen.h>' >>"$work/tree/runtime/plan/memory_plan.h"
expect 1 "torch-free" "libtorch in plan/"

fresh_copy
mkdir -p "$work/tree/runtime/extra"
echo '#include "base/status.h"' >"$work/tree/runtime/extra/x.h"
expect 1 "runtime/extra" "a runtime/ folder not in the table"
