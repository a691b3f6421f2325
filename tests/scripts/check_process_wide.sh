#!/usr/bin/env bash
# Process-wide effects have one visible home each:
# - every environment variable strata reads is in base/env.cc's table (printed by `strata report`):
#   no getenv/secure_getenv call outside base/env.cc, and every GetEnv("NAME") names a listed one;
# - SIGINT/SIGTERM (and SIGPIPE) have one owner, base/signals.cc: no sigaction/signal call for them elsewhere
#   (a forked child resetting them before execve says so on the line).
# Usage: tests/scripts/check_process_wide.sh SOURCE_ROOT
set -euo pipefail
cd "$1"
dirs=(base swap tiers gpu cpu_optimizer runtime bench tools)
direct=$(grep -rnE --include='*.h' --include='*.cc' --include='*.cu' \
  '(^|[^A-Za-z_>.])(std::)?(secure_)?getenv\(' "${dirs[@]}" | grep -v '^base/env\.cc:' |
  grep -vE '^[^:]+:[0-9]+:[[:space:]]*//' || true)
if [[ -n $direct ]]; then
  echo "check_process_wide: getenv outside base/env.cc (use GetEnv and list the variable there):"
  echo "$direct"
  exit 1
fi
listed=$(grep -oE '^    \{"[A-Z_]+"' base/env.cc | tr -d '{" ' | sort -u)
used=$(grep -rhoE --include='*.h' --include='*.cc' 'GetEnv\("[A-Za-z_]+"\)' "${dirs[@]}" |
  sed -E 's/GetEnv\("([^"]+)"\)/\1/' | sort -u)
missing=$(comm -23 <(echo "$used") <(echo "$listed"))
if [[ -n $missing ]]; then
  echo "check_process_wide: variables read but not listed in base/env.cc: $missing"
  exit 1
fi
handlers=$(grep -rnE --include='*.h' --include='*.cc' '(sigaction|[^_a-z]signal)\(' "${dirs[@]}" |
  grep -v '^base/signals\.cc:' | grep -E 'SIGINT|SIGTERM|SIGPIPE|sigaction\(sig' | grep -v 'before execve' || true)
if [[ -n $handlers ]]; then
  echo "check_process_wide: SIGINT/SIGTERM handled outside base/signals.cc (register a cleanup or open"
  echo "a scope there instead):"
  echo "$handlers"
  exit 1
fi
echo "check_process_wide: $(wc -w <<<"$listed") variables listed, every read through GetEnv;" \
  "SIGINT/SIGTERM owned by base/signals.cc"
