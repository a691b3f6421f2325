#!/usr/bin/env bash
# Builds strata on a GPU machine that has CUDA and PyTorch but no Debian packages and no network
# (a rented cloud GPU, a cluster node). Two halves:
#
#   scripts/gpu-bundle.sh download [DIR]   on a Debian 12 machine with apt: fetches the .deb files of
#                                          strata's libraries into DIR (default .gpu-bundle, which
#                                          git ignores); copy DIR to the GPU machine with the source.
#   scripts/gpu-bundle.sh build [DIR]      on the GPU machine: unpacks DIR's .debs into a prefix with
#                                          `dpkg -x` (never into /), configures strata against that
#                                          prefix, python3's PyTorch (libtorch with CUDA, found through
#                                          torch.utils.cmake_prefix_path) and the CUDA toolkit, and
#                                          builds it in build-cuda. Prints the build directory last.
#
# Environment for `build`: STRATA_DEPS_PREFIX (default /opt/strata-deps), CUDA_ARCHS (default: the
# GPU's, from nvidia-smi, else 90), STRATA_BUILD_DIR (default build-cuda), JOBS (default nproc),
# STRATA_BUILD_TARGETS (space-separated targets to build; default all).
# After `build`, `source $STRATA_DEPS_PREFIX/env.sh` sets LD_LIBRARY_PATH for running the binaries.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The runtime libraries are listed beside their -dev packages: the GPU machine has neither.
PACKAGES=(
  libaio-dev libaio1
  liburing-dev liburing2
  libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5
  nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev
  libxxhash-dev libxxhash0
  libsentencepiece-dev libsentencepiece0
  pkgconf pkgconf-bin libpkgconf3
  fortunes fortunes-min
)

cmd=${1:-}
dir=${2:-$ROOT/.gpu-bundle}

case "$cmd" in
  download)
    mkdir -p "$dir"
    (cd "$dir" && apt-get download "${PACKAGES[@]}")
    du -sh "$dir"
    ;;
  build)
    prefix=${STRATA_DEPS_PREFIX:-/opt/strata-deps}
    ls "$dir"/*.deb >/dev/null 2>&1 || { echo "gpu-bundle: no .deb files in $dir" >&2; exit 1; }
    mkdir -p "$prefix"
    for f in "$dir"/*.deb; do dpkg-deb -x "$f" "$prefix"; done
    lib="$prefix/usr/lib/x86_64-linux-gnu"
    cat >"$prefix/env.sh" <<EOF
export PATH="$prefix/usr/bin:\$PATH"
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$prefix"
EOF
    # shellcheck disable=SC1091
    source "$prefix/env.sh"
    [[ -e "$prefix/usr/bin/pkg-config" ]] || ln -sf pkgconf "$prefix/usr/bin/pkg-config"
    torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
    # The NCCL libtorch runs (its nccl.h must match: runtime/comm/CMakeLists.txt); empty without.
    torch_nccl=$(python3 -c 'import torch; v = torch.cuda.nccl.version(); print(".".join(map(str, v)) if isinstance(v, tuple) else "")' 2>/dev/null || true)
    archs=${CUDA_ARCHS:-}
    if [[ -z "$archs" ]] && command -v nvidia-smi >/dev/null; then
      archs=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d '.')
    fi
    archs=${archs:-90}
    build_dir=${STRATA_BUILD_DIR:-$ROOT/build-cuda}
    cuda_root=${CUDA_HOME:-/usr/local/cuda}
    cmake -S "$ROOT" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix/usr;$torch_prefix" \
      -DCMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc" -DCMAKE_CUDA_ARCHITECTURES="$archs" \
      -DSTRATA_WITH_CUDA=ON -DSTRATA_WITH_TORCH=ON -DSTRATA_WITH_AIO=ON -DSTRATA_WITH_URING=ON \
      -DSTRATA_TORCH_NCCL_VERSION="$torch_nccl" >&2
    read -r -a targets <<<"${STRATA_BUILD_TARGETS:-}"
    cmake --build "$build_dir" -j "${JOBS:-$(nproc)}" ${targets[@]+--target "${targets[@]}"} -- -k >&2
    echo "$build_dir"
    ;;
  *)
    sed -n '2,17p' "${BASH_SOURCE[0]}"
    exit 2
    ;;
esac
