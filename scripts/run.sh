#!/usr/bin/env bash
# The main job on defaults: installs what is missing, builds, and runs `strata bench io` in the
# current directory (pass any `strata bench io` flags, e.g. --path /mnt/nvme --size 4G).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=$("$ROOT/scripts/build.sh" strata | tail -n 1)
exec "$build_dir/runtime/strata" bench io "$@"
