#!/usr/bin/env bash
# Configures and builds strata. Usage: scripts/build.sh [--sanitize address|undefined|thread]
#   [--build-dir DIR] [--type Release|RelWithDebInfo|Debug] [--python PY] [-DCMAKE_OPTION=VALUE...]
#   [targets...]
#   --python PY: build against PY's torch (pip install . passes its interpreter) instead of the
#   project venv's, which is then neither created nor filled.
# Prints the build directory on the last line of stdout.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

sanitize=""
python=""
build_dir=""
build_type="Release"
targets=()
cmake_args=()
while (($#)); do
  case "$1" in
    --sanitize) sanitize="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --type) build_type="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    -h|--help) sed -n '2,4p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -D*) cmake_args+=("$1"); shift ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [[ -z "$build_dir" ]]; then
  build_dir="$ROOT/build"
  [[ -n "$sanitize" ]] && build_dir="$ROOT/build-${sanitize//,/-}"
fi

# A build without libtorch (-DSTRATA_WITH_TORCH=OFF, CI's sanitizer pass) needs no Python
# environment; any other configures against the project venv's PyTorch (scripts/setup.sh): its
# libtorch, its CUDA version, its NCCL, and its interpreter for the Python package.
torch_args=()
if [[ " ${cmake_args[*]:-} " == *" -DSTRATA_WITH_TORCH=OFF "* ]]; then
  STRATA_NO_PYTHON_ENV=1 "$ROOT/scripts/setup.sh"
else
  if [[ -n "$python" ]]; then
    STRATA_NO_PYTHON_ENV=1 "$ROOT/scripts/setup.sh"
  else
    python=$("$ROOT/scripts/setup.sh" --print-python | tail -n 1)
  fi
  read -r torch_prefix torch_nccl < <("$python" -c '
import torch
v = torch.cuda.nccl.version() if torch.version.cuda else None
print(torch.utils.cmake_prefix_path, ".".join(map(str, v)) if isinstance(v, tuple) else "-")')
  torch_args=(-DPython3_EXECUTABLE:FILEPATH="$python" -DPython_EXECUTABLE:FILEPATH="$python"
              -DCMAKE_PREFIX_PATH="$torch_prefix" -DTorch_DIR="$torch_prefix/Torch")
  [[ "$torch_nccl" != "-" ]] && torch_args+=(-DSTRATA_TORCH_NCCL_VERSION="$torch_nccl")
fi

jobs=$(nproc 2>/dev/null || echo 2)
mkdir -p "$build_dir"
launcher=()
if command -v ccache >/dev/null; then  # rebuilds after moves and across clones are cheaper
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  # Paths under the clone hash as relative ones, so another clone of the same sources hits.
  export CCACHE_BASEDIR="$ROOT" CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
  # The precompiled <torch/torch.h> (cmake/StrataTorchPch.cmake): ccache caches what uses it only
  # with these.
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros}
fi
cmake -S "$ROOT" -B "$build_dir" -DCMAKE_BUILD_TYPE="$build_type" -DSTRATA_SANITIZE="$sanitize" "${launcher[@]}" \
  ${torch_args[@]+"${torch_args[@]}"} ${cmake_args[@]+"${cmake_args[@]}"} \
  >"$build_dir/configure.log" 2>&1 || { cat "$build_dir/configure.log" >&2; exit 1; }
if ((${#targets[@]})); then
  cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}" >&2
else
  cmake --build "$build_dir" -j "$jobs" >&2
fi
echo "$build_dir"
