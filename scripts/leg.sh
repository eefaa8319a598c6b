# Sourced by setup_env.sh and test.sh: which torch to build and test against, from their first argument.
#   (none)       Debian's torch 1.13:        LEG=debian VENV=.venv     BUILD=build
#   --pip-torch  the newest torch on PyPI:   LEG=pip    VENV=.venv-pip BUILD=build-pip
# LEG_FLAG holds the flag given (or nothing), ARGS the remaining arguments.
LEG=debian VENV=.venv BUILD=build LEG_FLAG=()
if [ "${1:-}" = "--pip-torch" ]; then
  LEG=pip VENV=.venv-pip BUILD=build-pip LEG_FLAG=(--pip-torch)
  shift
fi
ARGS=("$@")
