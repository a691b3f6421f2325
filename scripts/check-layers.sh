#!/usr/bin/env bash
# Checks the include layering of runtime/ (ARCHITECTURE.md §2): arrows point down only, and
# config/, plan/, persist/ and engine/numerics/ build without libtorch. A compiler only notices a
# wrong arrow once it forms a cycle or drags libtorch into a torch-free target, so this checks the
# #include lines themselves. Exits 1 listing every include that breaks a rule (and any cycle between
# runtime/ folders); 0 when clean. Run by ctest (label `layers`).
# Usage: scripts/check-layers.sh [SOURCE_ROOT]   (default: this checkout)
set -euo pipefail
ROOT=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$ROOT"
[[ -d runtime ]] || { echo "check-layers: no runtime/ under $ROOT" >&2; exit 2; }

failures=0

# The #include lines of the C++/CUDA sources under $1, as "file:line:text".
includes() {
  grep -rnE --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' \
    '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]' "$1" || true
}

# forbid DIR PATTERN WHY [ALLOWED]: every include under DIR whose path starts with the extended
# regex PATTERN is an error, unless its path also starts with ALLOWED.
forbid() {
  local dir=$1 pattern=$2 why=$3 allowed=${4:-}
  [[ -d $dir ]] || return 0
  local hits
  hits=$(includes "$dir" | grep -E "include[[:space:]]*[<\"](${pattern})" || true)
  if [[ -n $allowed && -n $hits ]]; then
    hits=$(grep -vE "include[[:space:]]*[<\"](${allowed})" <<<"$hits" || true)
  fi
  if [[ -n $hits ]]; then
    echo "check-layers: $dir/ must not include $why:"
    sed 's/^/  /' <<<"$hits"
    failures=$((failures + 1))
  fi
}

# runtime/ sits below bench/ and tools/.
forbid runtime 'bench/|tools/' "bench/ or tools/ (they are above runtime/)"

# The torch-free folders: fast builds and torch-free fuzzers (their CMake targets do not link
# torch either; this catches a header that would only fail in a -DSTRATA_WITH_TORCH=OFF build).
for dir in runtime/config runtime/plan runtime/persist runtime/data runtime/engine/numerics; do
  forbid "$dir" 'torch/|ATen/|c10/|caffe2/' "libtorch (it builds without it)"
  forbid "$dir" 'runtime/(engine|models|commands)/' \
    "runtime/engine (other than engine/numerics), runtime/models or runtime/commands" \
    'runtime/engine/numerics/'
done

# Inside runtime: commands -> models -> engine -> {comm, numerics, plan, persist, config};
# config -> numerics.
forbid runtime/config 'runtime/(plan|persist|comm|engine)/' \
  "runtime/plan, persist, comm or engine (other than engine/numerics)" 'runtime/engine/numerics/'
forbid runtime/engine/numerics 'runtime/(config|plan|persist|comm)/' \
  "runtime/config, plan, persist or comm (numerics is below them)"
forbid runtime/comm 'runtime/(engine|models|commands)/' "runtime/engine, models or commands"
forbid runtime/engine 'runtime/(models|commands)/' "runtime/models or runtime/commands"
forbid runtime/models 'runtime/commands/' "runtime/commands"
# data/ (token files, tokenizers) sits beside persist/: models and commands use it.
forbid runtime/data 'runtime/(config|plan|comm|engine|models|commands)/' \
  "runtime/config, plan, comm, engine, models or commands"

# Whatever the rules above miss: no cycle between runtime/ folders (tsort reports any loop in the
# graph "folder of the includer -> folder of the included header").
edges=$(includes runtime | awk '
  function dir(p) { sub(/\/[^\/]*$/, "", p); return p }
  match($0, /include[ \t]*"runtime\/[^"]+"/) {
    target = substr($0, RSTART, RLENGTH)
    sub(/^include[ \t]*"/, "", target)
    sub(/"$/, "", target)
    split($0, where, ":")
    print dir(where[1]), dir(target)
  }' | sort -u)
if [[ -n $edges ]] && ! loops=$(tsort <<<"$edges" 2>&1 >/dev/null); then
  echo "check-layers: include cycle between runtime/ folders:"
  sed 's/^/  /' <<<"$loops"
  failures=$((failures + 1))
fi

if ((failures > 0)); then
  echo "check-layers: $failures rule(s) broken (see ARCHITECTURE.md §2)"
  exit 1
fi
echo "check-layers: runtime/ layering OK"
