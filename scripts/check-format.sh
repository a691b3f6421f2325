#!/usr/bin/env bash
# Checks that every C++/CUDA source of the tree is clang-format clean (.clang-format: Google, 100
# columns). Exits 1 listing the files that are not (and how to fix them); 0 when clean; 77 (a
# skip for ctest) when clang-format is not installed. Run by ctest (label `lint`).
# Usage: scripts/check-format.sh [SOURCE_ROOT]      fix: scripts/check-format.sh --fix [SOURCE_ROOT]
set -euo pipefail
fix=0
if [[ ${1:-} == --fix ]]; then fix=1; shift; fi
ROOT=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$ROOT"
if ! command -v clang-format >/dev/null; then
  echo "check-format: clang-format is not installed (Debian: apt-get install clang-format): skipped"
  exit 77
fi
mapfile -t files < <(find base swap tiers gpu cpu_optimizer runtime bench tools tests examples python \
  -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null | sort)
if ((fix)); then
  printf '%s\0' "${files[@]}" | xargs -0 -n 32 -P "$(nproc)" clang-format -i
  echo "check-format: formatted ${#files[@]} files"
  exit 0
fi
bad=$(printf '%s\0' "${files[@]}" |
  xargs -0 -n 32 -P "$(nproc)" clang-format --dry-run 2>&1 | grep -oE '^[^:]+:[0-9]+:[0-9]+: (warning|error)' |
  cut -d: -f1 | sort -u || true)
if [[ -n $bad ]]; then
  echo "check-format: not clang-format clean (fix with scripts/check-format.sh --fix):"
  sed 's/^/  /' <<<"$bad"
  exit 1
fi
echo "check-format: ${#files[@]} files clean ($(clang-format --version | head -1))"
