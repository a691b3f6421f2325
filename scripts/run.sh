#!/usr/bin/env bash
# The main job on defaults: installs what is missing, builds, and runs the training demo
# (`strata train`: a small GPT with parameters and optimizer state on NVMe under /tmp, on the
# English texts of Debian's fortunes package). Any `strata train` flags pass through, e.g.
# --config ds_config.json --model 125M --steps 50 --save ckpt.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=$("$ROOT/scripts/build.sh" strata | tail -n 1)
strata="$build_dir/tools/strata/strata"

# The demo's NVMe scratch directory is /tmp/strata-demo-UID, shared by this user's demo runs: each
# run's swap directory in it is locked while the run lives, and every demo run holds a shared lock
# on the directory itself. strata removes its own swap directory when it exits (and the scratch
# directory if no other demo run holds it), and the next demo run removes those of runs that were
# ended at once (a second Ctrl-C, kill -9, the OOM killer). exec keeps our pid, so strata gets every
# signal and exit code exactly as if run directly; a watcher, deaf to Ctrl-C and to the terminal
# closing, waits for it to end and then runs `strata clean` on the directory: it removes what a
# dead run left (never a live run's) and then the directory itself if it is empty and no demo run
# holds it.
scratch="/tmp/strata-demo-$(id -u)"
watched=$$
(
  trap '' INT TERM HUP
  while kill -0 "$watched" 2>/dev/null; do sleep 1; done
  if [[ -d "$scratch" ]]; then "$strata" clean --path "$scratch" || true; fi
) </dev/null >/dev/null 2>&1 &
exec "$strata" train "$@"
