#!/usr/bin/env bash
# Sets up a fresh machine (see setup_env.sh), then runs the whole test suite: the C++ GoogleTest suite
# through ctest, and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export PATH="/usr/lib/ccache:$PATH"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j "${MAX_JOBS:-2}"
ctest --test-dir build --output-on-failure
.venv/bin/python -m pytest tests/python "$@"
