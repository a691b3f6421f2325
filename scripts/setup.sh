#!/usr/bin/env bash
# Installs what strata needs, only what is missing. Safe to run repeatedly; a second run with
# nothing to do takes well under a second.
#   1. Debian packages (apt-get): compilers, strata's C/C++ libraries, the demo's text.
#   2. The project's Python environment: a venv at $STRATA_VENV (default ~/.venvs/strata-dev) from
#      Debian's python3, filled from requirements/dev.txt (every package pinned: PyTorch 2.x from
#      pip, whose libtorch the C++ build links, the Hugging Face packages, DeepSpeed as a
#      benchmark oracle). The venv lives outside the clone so that a fresh clone, and CI, find it
#      filled; it is refilled when requirements/dev.txt changes (a hash of it is kept in the venv).
# Usage: scripts/setup.sh [--print-python]
#   --print-python: print the venv's python on stdout (what scripts/build.sh configures with).
# Environment: STRATA_VENV (the venv's directory), STRATA_NO_PYTHON_ENV=1 (step 1 only: for a build
# that needs no libtorch, as CI's sanitizer pass).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

PACKAGES=(
  build-essential cmake pkg-config git
  libaio-dev liburing-dev libtbb-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev
  libxxhash-dev                       # checkpoint checksums (xxHash64)
  libboost-dev                        # boost/crc.hpp: CRC-32C of TensorBoard event files (runtime/metrics/)
  libsentencepiece-dev                # tokenizer.model where no Python tokenizer is at hand
  libgloo-dev                         # Gloo headers for c10d's ProcessGroupGloo (runtime/comm/):
                                      # pip's torch ships libgloo inside libtorch_cpu but no headers
  fio                                 # reference figures for `strata bench io`
  fortunes                            # default English text for the `strata train` demo
  python3-dev python3-venv            # the project venv and the Python module's headers
  ccache                              # compiler cache: rebuilds, and builds of another clone
  clang clang-format                  # the thread-safety analysis (scripts/check-threads.sh) and
                                      # the format check (scripts/check-format.sh), both ctest tests
)

print_python=0
[[ "${1:-}" == "--print-python" ]] && print_python=1

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "strata setup: installing ${missing[*]}" >&2
  if [[ -n "$SUDO" ]] && ! command -v sudo >/dev/null; then
    echo "strata setup: need root or sudo to install packages" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "strata setup: Debian packages done" >&2
fi

[[ "${STRATA_NO_PYTHON_ENV:-0}" == 1 ]] && exit 0

venv=${STRATA_VENV:-$HOME/.venvs/strata-dev}
requirements="$ROOT/requirements/dev.txt"
want=$(sha256sum "$requirements" | cut -d' ' -f1)
stamp="$venv/.strata-requirements.sha256"
if [[ ! -x "$venv/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "strata setup: filling the Python environment $venv from requirements/dev.txt" \
       "(PyTorch with CUDA is ~4.5 GB installed)" >&2
  [[ -x "$venv/bin/python" ]] || /usr/bin/python3 -m venv "$venv"
  pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  # DeepSpeed's setup.py imports torch: it is built after the rest, in the venv itself.
  "${pip[@]}" -r <(grep -v -i '^deepspeed==' "$requirements")
  "${pip[@]}" --no-build-isolation --no-deps -r <(grep -i '^deepspeed==' "$requirements")
  echo "$want" >"$stamp"
  echo "strata setup: Python environment done" >&2
fi
if ((print_python)); then echo "$venv/bin/python"; fi
