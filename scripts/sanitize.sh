#!/usr/bin/env bash
# Builds the C++ core and its GoogleTest suite with AddressSanitizer and UndefinedBehaviorSanitizer
# (CMake option DIFFSOFT_SANITIZE) in build-asan/, and runs the suite through ctest. Any report fails the run:
# ASan aborts on the first error (leaks included), UBSan is built with -fno-sanitize-recover. LibTorch itself
# is not instrumented: errors inside it are not seen, errors in our code that corrupt its memory are.
# Usage: bash scripts/sanitize.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/lib/ccache:$PATH"
cmake -S . -B build-asan -G Ninja -DDIFFSOFT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug > build-asan.log 2>&1 \
  || { cat build-asan.log; exit 1; }
cmake --build build-asan -j "${MAX_JOBS:-2}"
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir build-asan --output-on-failure "$@"
