#!/usr/bin/env bash
# Checks the thread-safety annotations (base/thread_annotations.h) with clang's analysis:
# every .cc of the annotated folders that uses them (itself or through its own header) is compiled
# with clang++ -fsyntax-only -Wthread-safety -Werror=thread-safety, with the flags of a clang
# configure of the tree (compile_commands.json; nothing is built). Then a file with an unguarded
# access (tests/base/thread_annotations_negative.cc) must fail to compile with the same flags, so
# the check is known to bite.
# Usage: scripts/check-threads.sh [BUILD_DIR]   (default: build-threads/ under the source root)
# Exit: 0 clean, 1 a finding (or the negative case compiled), 77 skipped (no clang++).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build-threads}
CLANGXX=${CLANGXX:-clang++}
CLANG=${CLANG:-clang}
if ! command -v "$CLANGXX" > /dev/null; then
  echo "check-threads: SKIP: $CLANGXX not found (the thread-safety analysis needs clang)"
  exit 77
fi
FOLDERS=(base swap tiers gpu runtime/engine runtime/comm runtime/commands runtime/data
         runtime/persist)
FLAGS=(-fsyntax-only -Wthread-safety -Werror=thread-safety -Wno-unknown-warning-option
       -Wno-inconsistent-missing-override)

# Configure only (a few seconds once cached): the include paths and definitions of every target.
mkdir -p "$BUILD"
CC=$CLANG CXX=$CLANGXX cmake -S "$ROOT" -B "$BUILD" -DSTRATA_BUILD_TESTS=OFF \
  -DSTRATA_SANITIZE= -DSTRATA_FUZZ=OFF > "$BUILD/configure.log" 2>&1 || {
  cat "$BUILD/configure.log"
  echo "check-threads: configuring $BUILD with $CLANGXX failed"
  exit 1
}

# The annotated translation units: those including the annotations, directly or via their header.
files=()
for dir in "${FOLDERS[@]}"; do
  for cc in "$ROOT/$dir"/*.cc; do
    [[ -e "$cc" ]] || continue
    h="${cc%.cc}.h"
    if grep -qE '#include "base/(mutex|thread_annotations)\.h"' "$cc" ||
       { [[ -e "$h" ]] && grep -qE '#include "base/(mutex|thread_annotations)\.h"' "$h"; }; then
      files+=("$cc")
    fi
  done
done

# One command line per file from compile_commands.json, compiler output replaced by the analysis.
cmds=$(python3 - "$BUILD/compile_commands.json" "${FLAGS[*]}" "${files[@]}" <<'PY'
import json, shlex, sys
db = {e["file"]: e for e in json.load(open(sys.argv[1]))}
flags = sys.argv[2].split()
for f in sys.argv[3:]:
    e = db.get(f)
    if e is None:
        print("SKIP " + f)  # not compiled in this configuration (a backend not found)
        continue
    args = shlex.split(e["command"]) if "command" in e else e["arguments"]
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a == f:
            continue
        out.append(a)
    # clang 14 in C++20 rejects Debian libtorch's autograd/function.h, which instantiates
    # std::vector<c10::IValue> before IValue is complete; declaring IValue first fixes that.
    pre = ["-include", "ATen/core/ivalue.h"] if any("torch" in a.lower() for a in out) else []
    print("RUN cd " + shlex.quote(e["directory"]) + " && " +
          " ".join(shlex.quote(a) for a in out + flags + pre + ["-c", f]))
PY
)
start=$(date +%s)
grep '^SKIP ' <<< "$cmds" | sed 's/^SKIP /check-threads: not configured here, skipped: /' || true
mapfile -t runs < <(grep '^RUN ' <<< "$cmds" | sed 's/^RUN //')
echo "check-threads: analysing ${#runs[@]} files with $("$CLANGXX" --version | head -n 1)"
jobs=$(nproc 2>/dev/null || echo 2)
failed=0
printf '%s\0' "${runs[@]}" | xargs -0 -P "$jobs" -I{} bash -c '{}' || failed=1
if [[ $failed -ne 0 ]]; then
  echo "check-threads: FAILED: thread-safety findings above"
  exit 1
fi

# The negative case: an unguarded access must be an error under the same flags.
neg="$ROOT/tests/base/thread_annotations_negative.cc"
if out=$("$CLANGXX" -std=c++20 -I"$ROOT" "${FLAGS[@]}" "$neg" 2>&1); then
  echo "check-threads: FAILED: $neg compiled; the analysis is not enforced"
  exit 1
fi
if ! grep -q "requires holding mutex" <<< "$out"; then
  echo "$out"
  echo "check-threads: FAILED: $neg failed for another reason than the unguarded access"
  exit 1
fi
echo "check-threads: OK (${#runs[@]} files, negative case rejected) in $(( $(date +%s) - start )) s"
