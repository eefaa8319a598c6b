#!/usr/bin/env bash
# Installs Debian's packages that diffsoft builds and tests with (needs root; no PyPI on these machines).
set -euo pipefail
pkgs=(build-essential cmake ninja-build ccache git
      python3-torch libtorch-dev pybind11-dev libeigen3-dev googletest libgtest-dev libsuitesparse-dev
      libopenblas0-pthread
      python3-pytest python3-numpy python3-matplotlib python3-pil python3-tqdm python3-scipy
      python3-venv python3-pip python3-setuptools python3-wheel python3-dev python3-meshio python3-hypothesis
      python3-sphinx)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
