#!/usr/bin/env bash
# Installs the Python package `strata` on a fresh Debian 12 machine: what scripts/setup.sh installs
# (Debian's packages, and the project venv with pip's PyTorch 2.x and the Hugging Face packages),
# then `pip install --no-build-isolation .` into that venv, which builds the engine's module with
# CMake against its torch. Elsewhere (a conda env or venv with a CUDA PyTorch 2.x), run that pip
# command in the environment yourself, or pass its directory here.
# Usage: scripts/install-python.sh [VENV_DIR]   (default: the project venv, $STRATA_VENV, else
#   ~/.venvs/strata-dev; another VENV_DIR must already have torch)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
project_python=$("$ROOT/scripts/setup.sh" --print-python | tail -n 1)
python=$project_python
if [[ -n "${1:-}" ]]; then
  python="$1/bin/python"
  [[ -x "$python" ]] || { echo "install-python: no $python (create the environment first)" >&2; exit 1; }
  "$python" -c 'import torch' 2>/dev/null ||
    { echo "install-python: $python has no torch (pip install torch first)" >&2; exit 1; }
fi
# A build directory of its own per interpreter: the module is built for that Python and torch.
STRATA_BUILD_DIR=${STRATA_BUILD_DIR:-$ROOT/build}
[[ "$python" == "$project_python" ]] || STRATA_BUILD_DIR="$ROOT/build-python-$(basename "$(dirname "$(dirname "$python")")")"
export STRATA_BUILD_DIR
"$python" -m pip install --no-index --no-build-isolation --no-deps "$ROOT"
"$python" -c "import strata, torch; print('strata installed for torch', torch.__version__)"
echo "use it with: source $(dirname "$python")/activate   (or run $python)"
