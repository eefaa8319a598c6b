#!/usr/bin/env bash
# Sets up a fresh machine (see setup_env.sh), then runs the whole test suite: the C++ GoogleTest suite
# through ctest, the installed C++ package with its consumer examples/cpp (cpp_consumer.sh), and pytest.
#   bash scripts/test.sh [pytest arguments]              against Debian's torch 1.13 (.venv, build/)
#   bash scripts/test.sh --pip-torch [pytest arguments]  against the newest torch on PyPI (.venv-pip, build-pip/)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/leg.sh "$@"
bash scripts/setup_env.sh "${LEG_FLAG[@]}"
# ccache keyed on paths relative to the clone (and not on the build directory's path), so that clones of the
# project in other directories hit each other's cached objects.
export PATH="/usr/lib/ccache:$PATH" CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
# setup_env.sh configured and built the core in $BUILD (setup.py); this builds the tests beside it.
if ! grep -q '^DIFFSOFT_BUILD_TESTS:BOOL=ON' "$BUILD/CMakeCache.txt"; then
  cmake -S . -B "$BUILD" -DDIFFSOFT_BUILD_TESTS=ON > "$BUILD.cmake.log" 2>&1 || { cat "$BUILD.cmake.log"; exit 1; }
fi
cmake --build "$BUILD" -j "${MAX_JOBS:-2}"
ctest --test-dir "$BUILD" --output-on-failure
DIFFSOFT_BUILD_DIR="$BUILD" bash scripts/cpp_consumer.sh
"$VENV/bin/python" -m pytest tests/python "${ARGS[@]}"
