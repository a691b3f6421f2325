#!/usr/bin/env bash
# Installs the Python package `strata` on a fresh Debian 12 machine: the Debian packages it needs
# (scripts/setup.sh: python3-torch, pybind11, python3-venv, ...), a virtual environment that sees
# them (--system-site-packages), and `pip install --no-build-isolation .` into it, which builds
# the engine's module with CMake. Elsewhere (a conda or venv with a CUDA PyTorch), run that pip
# command in the environment yourself.
# Usage: scripts/install-python.sh [VENV_DIR]   (default: $STRATA_VENV, else ~/.venvs/strata)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${1:-${STRATA_VENV:-$HOME/.venvs/strata}}
"$ROOT/scripts/setup.sh"
if [[ ! -x "$venv/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -m pip install --no-index --no-build-isolation --no-deps "$ROOT"
"$venv/bin/python" -c "import strata, torch; print('strata installed for torch', torch.__version__)"
echo "use it with: source $venv/bin/activate   (or run $venv/bin/python)"
