#!/usr/bin/env bash
# Sets up a fresh machine for diffsoft and builds diffsoft into a virtual environment. Idempotent: a rerun
# rebuilds only what changed (ccache, pip's cache).
#   bash scripts/setup_env.sh              Debian's torch 1.13 (CPU): .venv on Debian's Python with
#                                          --system-site-packages, diffsoft installed editable; build folder build/
#   bash scripts/setup_env.sh --pip-torch  the newest torch on PyPI (a CUDA build of several GB that runs on the
#                                          CPU too) and the test extras: .venv-pip without Debian's site
#                                          packages, diffsoft installed as a copy; build folder build-pip/
# The C++ core is compiled once, by CMake, in the build folder; the Python extension links it (setup.py), and
# the C++ tests and package (scripts/test.sh) reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/leg.sh "$@"
bash scripts/install_deps.sh
export PATH="/usr/lib/ccache:$PATH" MAX_JOBS="${MAX_JOBS:-2}" CCACHE_NOHASHDIR=true CCACHE_BASEDIR="$PWD"
if [ "$LEG" = debian ]; then
  [ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$VENV"
  # Everything from Debian's packages (install_deps.sh) but gymnasium, which Debian lacks (diffsoft[rl]).
  "$VENV/bin/python" -c "import gymnasium" 2>/dev/null || "$VENV/bin/python" -m pip install -q gymnasium
  pip_args=(--no-deps --no-index -e .)
else
  [ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv "$VENV"
  echo "setup_env.sh: the newest torch from PyPI into $VENV (a few GB the first time; pip's cache after)"
  "$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel torch numpy
  pip_args=(".[test,rl]")  # not editable: the source tree's extension is the Debian leg's
fi
torch_version=$("$VENV/bin/python" -c "import torch; print(torch.__version__)")
echo "setup_env.sh: building diffsoft against torch $torch_version in $BUILD (about 4 minutes on 2 cores the first" \
     "time; $BUILD.log has the full output)"
# pip hides the build's output: show each compiled file as it goes, and the whole log if it fails.
if ! DIFFSOFT_BUILD_DIR="$BUILD" "$VENV/bin/python" -m pip install -v --no-build-isolation "${pip_args[@]}" \
    2>&1 | tee "$BUILD.log" | sed -unE 's@^ *(\[[0-9]+/[0-9]+\]) .*[ /](csrc/[^ ]+\.cpp)[ .].*@  \1 \2@p'; then
  tail -n 60 "$BUILD.log"
  echo "setup_env.sh: building diffsoft failed; the full output is in $BUILD.log" >&2
  exit 1
fi
echo "setup_env.sh: diffsoft is built into $VENV ($VENV/bin/python)"
