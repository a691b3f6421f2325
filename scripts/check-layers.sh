#!/usr/bin/env bash
# Checks the include layering of the whole tree (README "Layout"): one table of the edges each
# folder may have, every #include of a project header checked against it, the table itself checked
# to be a DAG, and the torch-free folders checked for libtorch headers. A compiler only notices a
# wrong arrow once it forms a cycle or drags libtorch into a torch-free target, so this reads the
# #include lines themselves. Exits 1 listing every include that breaks a rule; 0 when clean. Run by
# ctest (label `layers`). tests/ and examples/ may include anything and are not checked.
# Usage: scripts/check-layers.sh [SOURCE_ROOT]   (default: this checkout)
set -euo pipefail
ROOT=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$ROOT"
[[ -d runtime ]] || { echo "check-layers: no runtime/ under $ROOT" >&2; exit 2; }

# The layers: a node is a top folder, or a folder of runtime/. Each line: NODE then the nodes its
# headers and sources may include (directly). `strata/` (the generated strata/config.h) may be
# included by anyone. A node not listed here is an error, so a new folder has to be placed.
read -r -d '' LAYERS <<'EOF' || true
base
swap               base
tiers              base swap
gpu                base swap tiers
cpu_optimizer      base
runtime/numerics   base
runtime/config     base cpu_optimizer tiers runtime/numerics
runtime/plan       base swap tiers gpu cpu_optimizer runtime/numerics runtime/config runtime/persist
runtime/persist    base swap tiers cpu_optimizer runtime/numerics runtime/config
runtime/data       base runtime/persist
runtime/metrics    base
runtime/comm       base swap tiers runtime/config
runtime/engine     base swap tiers gpu cpu_optimizer runtime/numerics runtime/config runtime/plan runtime/persist runtime/comm
runtime/models     base swap tiers gpu cpu_optimizer runtime/numerics runtime/config runtime/plan runtime/persist runtime/comm runtime/data runtime/engine
runtime/commands   base swap tiers gpu cpu_optimizer runtime/numerics runtime/config runtime/plan runtime/persist runtime/comm runtime/data runtime/metrics runtime/engine runtime/models
bench              base swap tiers gpu cpu_optimizer runtime/numerics runtime/config runtime/plan runtime/persist runtime/comm runtime/data runtime/engine runtime/models runtime/commands
tools              base swap tiers gpu cpu_optimizer runtime/numerics runtime/config runtime/plan runtime/persist runtime/comm runtime/data runtime/engine runtime/models runtime/commands bench
python             base swap tiers gpu cpu_optimizer runtime/numerics runtime/config runtime/plan runtime/persist runtime/comm runtime/data runtime/engine runtime/models runtime/commands
EOF
# Build fast and serve the torch-free fuzzers and the Python-free consumers: no libtorch header.
TORCH_FREE="base swap tiers gpu cpu_optimizer runtime/numerics runtime/config runtime/plan runtime/persist runtime/data runtime/metrics"

failures=0
declare -A allowed=()
nodes=()
while read -r node deps; do
  [[ -n $node ]] || continue
  nodes+=("$node")
  allowed[$node]=" $deps "
done <<<"$LAYERS"

# The table is a DAG: tsort reports any loop among its own edges.
table_edges=$(for n in "${nodes[@]}"; do for d in ${allowed[$n]}; do echo "$n $d"; done; echo "$n $n"; done)
if ! loops=$(tsort <<<"$table_edges" 2>&1 >/dev/null); then
  echo "check-layers: the layer table itself has a cycle:"
  sed 's/^/  /' <<<"$loops"
  failures=$((failures + 1))
fi

# The node a path belongs to: runtime/X for runtime/X/..., else the top folder.
# The layer of path $1, in $node (no subshell: this runs once per include line of the tree).
node_of() {
  local p=$1
  if [[ $p == runtime/*/* ]]; then p=${p#runtime/}; node="runtime/${p%%/*}"; else node="${p%%/*}"; fi
}
include_re='^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^">]+)[">]'

# Every source under the checked folders: "file:line:included path" for includes of project headers
# (paths with a slash whose first part is a folder of this tree, or strata/).
sources=$(find . -mindepth 1 -maxdepth 1 -type d ! -name '.*' ! -name tests ! -name examples \
  ! -name 'build*' -printf '%P\n' | sort)
# shellcheck disable=SC2086
hits=$(grep -rnE --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' \
  '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"][^">]+/[^">]+[">]' $sources 2>/dev/null || true)

declare -A known=()
for n in "${nodes[@]}"; do known[${n%%/*}]=1; done
bad_edges=""
torch_hits=""
unplaced=""
while IFS= read -r line; do
  [[ -n $line ]] || continue
  file=${line%%:*}
  rest=${line#*:}
  rest=${rest#*:}
  [[ $rest =~ $include_re ]] || continue
  target=${BASH_REMATCH[1]}
  node_of "$file"
  from=$node
  if [[ -z ${allowed[$from]+x} ]]; then
    unplaced+="  $file (folder $from is not in the layer table)"$'\n'
    continue
  fi
  top=${target%%/*}
  if [[ $top =~ ^(torch|ATen|c10|caffe2)$ ]]; then
    if [[ " $TORCH_FREE " == *" $from "* ]]; then torch_hits+="  $line"$'\n'; fi
    continue
  fi
  [[ $top == strata || -z ${known[$top]+x} ]] && continue  # generated header or a system library
  node_of "$target"
  to=$node
  [[ $to == "$from" ]] && continue
  if [[ ${allowed[$from]} != *" $to "* ]]; then
    bad_edges+="  $line   ($from -> $to)"$'\n'
  fi
done <<<"$hits"

if [[ -n $bad_edges ]]; then
  echo "check-layers: includes that point up or sideways (not an edge of the table in this script):"
  printf '%s' "$bad_edges"
  failures=$((failures + 1))
fi
if [[ -n $torch_hits ]]; then
  echo "check-layers: libtorch headers in a torch-free folder ($TORCH_FREE):"
  printf '%s' "$torch_hits"
  failures=$((failures + 1))
fi
if [[ -n $unplaced ]]; then
  echo "check-layers: sources in folders the layer table does not place:"
  printf '%s' "$unplaced"
  failures=$((failures + 1))
fi

if ((failures > 0)); then
  echo "check-layers: $failures rule(s) broken (README \"Layout\")"
  exit 1
fi
echo "check-layers: layering OK (${#nodes[@]} layers)"
