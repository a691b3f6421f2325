#!/usr/bin/env bash
# The main job on defaults: installs what is missing, builds, and runs the training demo
# (`strata train`: a small GPT with parameters and optimizer state on NVMe under /tmp, on the
# English texts of Debian's fortunes package). Any `strata train` flags pass through, e.g.
# --config ds_config.json --model 125M --steps 50 --save ckpt.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=$("$ROOT/scripts/build.sh" strata | tail -n 1)
exec "$build_dir/tools/strata/strata" train "$@"
