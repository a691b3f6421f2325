#!/usr/bin/env bash
# Installs the Debian packages strata needs, only those that are missing. Safe to run repeatedly.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  libaio-dev liburing-dev libtbb-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev
  libxxhash-dev                       # checkpoint checksums (xxHash64)
  libboost-dev                        # boost/crc.hpp: CRC-32C of TensorBoard event files (runtime/metrics/)
  libsentencepiece-dev                # tokenizing text for Hugging Face models (tokenizer.model)
  libtorch-dev libopenblas0-pthread   # openblas: libtorch's BLAS is 60x slower with the reference one
  libgloo-dev                         # Gloo headers for c10d's ProcessGroupGloo (runtime/comm/)
  fio                                 # reference figures for `strata bench io`
  fortunes                            # default English text for the `strata train` demo
  python3-torch                       # PyTorch steps of scripts/gpu-check.sh --rehearse (a ctest test)
  python3-dev pybind11-dev python3-pybind11 python3-venv python3-pip python3-pytest
                                      # the Python package (python/, pip install .) and its tests
  clang clang-format                  # the thread-safety analysis (scripts/check-threads.sh) and
                                      # the format check (scripts/check-format.sh), both ctest tests
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "strata setup: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "strata setup: need root or sudo to install packages" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "strata setup: done" >&2
