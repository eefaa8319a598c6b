#!/usr/bin/env bash
# Sets up a fresh machine for diffsoft: Debian packages, a venv on Debian's Python (which sees Debian's
# torch), and diffsoft built into it in editable mode. Idempotent; source nothing, just run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
# ccache keys on file contents, not on the temporary build folder that pip uses.
export PATH="/usr/lib/ccache:$PATH" MAX_JOBS="${MAX_JOBS:-2}" CCACHE_NOHASHDIR=true CCACHE_BASEDIR="$PWD"
.venv/bin/python -m pip install -q --no-build-isolation --no-deps --no-index -e .
