#!/usr/bin/env bash
# Every environment variable strata reads is in base/env.cc's table (printed by `strata report`):
# no getenv/secure_getenv call outside base/env.cc, and every GetEnv("NAME") names a listed variable.
# Usage: tests/scripts/check_env_reads.sh SOURCE_ROOT
set -euo pipefail
cd "$1"
dirs=(base swap tiers gpu cpu_optimizer runtime bench tools)
direct=$(grep -rnE --include='*.h' --include='*.cc' --include='*.cu' \
  '(^|[^A-Za-z_>.])(std::)?(secure_)?getenv\(' "${dirs[@]}" | grep -v '^base/env\.cc:' |
  grep -vE '^[^:]+:[0-9]+:[[:space:]]*//' || true)
if [[ -n $direct ]]; then
  echo "check_env_reads: getenv outside base/env.cc (use GetEnv and list the variable there):"
  echo "$direct"
  exit 1
fi
listed=$(grep -oE '^    \{"[A-Z_]+"' base/env.cc | tr -d '{" ' | sort -u)
used=$(grep -rhoE --include='*.h' --include='*.cc' 'GetEnv\("[A-Za-z_]+"\)' "${dirs[@]}" |
  sed -E 's/GetEnv\("([^"]+)"\)/\1/' | sort -u)
missing=$(comm -23 <(echo "$used") <(echo "$listed"))
if [[ -n $missing ]]; then
  echo "check_env_reads: variables read but not listed in base/env.cc: $missing"
  exit 1
fi
echo "check_env_reads: $(wc -w <<<"$listed") variables listed; every read goes through GetEnv"
