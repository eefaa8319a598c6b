#!/usr/bin/env bash
# Sets up a fresh machine (see setup_env.sh), then runs the whole test suite: the C++ GoogleTest suite
# through ctest, the installed C++ package with its consumer examples/cpp (cpp_consumer.sh), and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export PATH="/usr/lib/ccache:$PATH"
# ccache keyed on paths relative to the clone (and not on the build directory's path), so that clones of the
# project in other directories hit each other's cached objects.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j "${MAX_JOBS:-2}"
ctest --test-dir build --output-on-failure
bash scripts/cpp_consumer.sh
.venv/bin/python -m pytest tests/python "$@"
