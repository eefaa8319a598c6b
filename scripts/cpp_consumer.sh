#!/usr/bin/env bash
# Checks the C++ package: installs the core (diffsoft::core, diffsoft::physics, headers, diffsoftConfig.cmake)
# into a temporary prefix, then configures, builds and runs examples/cpp against that prefix alone. Reuses the
# build/ folder of scripts/test.sh (configuring it the same way when missing); docs/cpp.md describes the package.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# ccache: paths under the temporary folder are keyed relative to it, so that a rerun hits the cache.
export PATH="/usr/lib/ccache:$PATH" CCACHE_BASEDIR="$tmp" CCACHE_NOHASHDIR=true
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 || { cat build.log; exit 1; }
fi
cmake --build build -j "${MAX_JOBS:-2}" --target diffsoft_core diffsoft_physics
cmake --install build --prefix "$tmp/prefix" > "$tmp/install.log"
cmake -S examples/cpp -B "$tmp/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  > "$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/consumer"
"$tmp/consumer/consumer"
