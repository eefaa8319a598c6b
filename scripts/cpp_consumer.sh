#!/usr/bin/env bash
# Checks the C++ package: installs the core (diffsoft::core, diffsoft::physics, headers, diffsoftConfig.cmake)
# into a temporary prefix, then configures, builds and runs examples/cpp against that prefix and the torch the
# core was built with. Reuses the build folder $DIFFSOFT_BUILD_DIR (default build/) of scripts/test.sh, which
# setup.py configured (configuring it when missing); docs/cpp.md describes the package.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# ccache: paths under the temporary folder are keyed relative to it, so that a rerun hits the cache.
export PATH="/usr/lib/ccache:$PATH" CCACHE_BASEDIR="$tmp" CCACHE_NOHASHDIR=true
build="${DIFFSOFT_BUILD_DIR:-build}"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$build.cmake.log" 2>&1 || { cat "$build.cmake.log"; exit 1; }
fi
cmake --build "$build" -j "${MAX_JOBS:-2}" --target diffsoft_core diffsoft_physics
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
# Every header under include/diffsoft/: consumers write <diffsoft/core/solver.h>, nothing collision-prone.
if [ "$(ls "$tmp/prefix/include")" != diffsoft ]; then
  echo "cpp_consumer.sh: the install put headers outside include/diffsoft: $(ls "$tmp/prefix/include")"; exit 1
fi
# The prefixes the core found its torch in (a pip torch's, set by setup.py), after the package's own.
torch_prefixes=$(sed -n 's/^CMAKE_PREFIX_PATH:[A-Z]*=//p' "$build/CMakeCache.txt")
cmake -S examples/cpp -B "$tmp/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix${torch_prefixes:+;$torch_prefixes}" \
  > "$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/consumer"
"$tmp/consumer/consumer"
