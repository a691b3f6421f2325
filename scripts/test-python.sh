#!/usr/bin/env bash
# Installs the Python package into a virtual environment and runs its tests (tests/python/)
# against the installed package, as a user's `pip install` would have it. The environment sees
# the packages of the interpreter the build was configured with (the project venv of
# scripts/setup.sh: torch, transformers, pytest, ...) through a .pth file, so strata is installed
# apart from them.
# Usage: scripts/test-python.sh BUILD_DIR [pytest arguments...]
#   BUILD_DIR: a CMake build directory that built the target strata_python (scripts/build.sh);
#   the environment goes to BUILD_DIR/python-venv and the module is packaged from BUILD_DIR.
# Exits 77 (ctest: skipped) when BUILD_DIR has no Python module (python3-dev, pybind11 or torch
# missing when it was configured).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(cd "${1:?usage: scripts/test-python.sh BUILD_DIR [pytest args]}" && pwd)
shift
module=$(ls "$BUILD"/python/strata/_C*.so 2>/dev/null | head -1 || true)
if [[ -z "$module" ]]; then
  echo "test-python: no strata._C in $BUILD/python/strata (the package was not built)" >&2
  exit 77
fi
python=$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
python=${python:-python3}
venv="$BUILD/python-venv"
if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi
# The configured interpreter's packages (its site-packages, and the system's when it is itself a
# venv with --system-site-packages), after the test venv's own.
"$python" -c 'import site, sysconfig; print("\n".join([sysconfig.get_paths()["purelib"], *site.getsitepackages()]))' \
  >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/strata-test-base.pth"
# Offline and against the installed torch: no index, no isolated build, no dependencies fetched.
STRATA_PYTHON_MODULE="$module" STRATA_BUILD_DIR="$BUILD" \
  "$venv/bin/python" -m pip install --quiet --no-index --no-build-isolation --no-deps \
  --force-reinstall "$ROOT" >&2
# Outside the source tree, so `import strata` is the installed package.
cd "$BUILD"
# Arguments name the tests to run (default: all of tests/python).
(($#)) || set -- "$ROOT/tests/python"
# STRATA_BUILD_DIR: the tests that run the CLI run this build's (tests/python/hf_fixtures.py).
STRATA_BUILD_DIR="$BUILD" exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
