#!/usr/bin/env bash
# The main job on defaults: installs what is missing, builds, and runs the training demo
# (`strata train`: a small GPT with parameters and optimizer state on NVMe under /tmp, on the
# English texts of Debian's fortunes package). Any `strata train` flags pass through, e.g.
# --config ds_config.json --model 125M --steps 50 --save ckpt.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=$("$ROOT/scripts/build.sh" strata | tail -n 1)
strata="$build_dir/tools/strata/strata"

# The demo's NVMe scratch directory is /tmp/strata-demo-PID with strata's own pid, which is ours:
# exec keeps it, so strata gets every signal and exit code exactly as if run directly. strata
# removes the directory when it exits, but not when it is ended at once: by a second Ctrl-C (its
# swap files go, the directory stays), kill -9 or the OOM killer. So a watcher, deaf to Ctrl-C
# and to the terminal closing, waits for this pid to end and then removes what is left: the swap
# directories of the dead run (`strata clean` never touches a live run's) and the directory if it
# is then empty (rmdir removes nothing else).
scratch="/tmp/strata-demo-$$"
watched=$$
(
  trap '' INT TERM HUP
  while kill -0 "$watched" 2>/dev/null; do sleep 1; done
  if [[ -d "$scratch" ]] && ! rmdir "$scratch"; then
    "$strata" clean --path "$scratch" || true
    rmdir "$scratch" || true
  fi
) </dev/null >/dev/null 2>&1 &
exec "$strata" train "$@"
