#!/usr/bin/env bash
# Issue 15's device checks in one run, for a machine with a GPU and a current torch (pip's, 2.x): the build on
# that torch, the whole pytest suite (its step tests run on CUDA too: conftest's `device` fixture), the
# throughput benchmark on every device present, and quick training on the GPU against 2 CPU threads.
# Everything it writes goes under $OUT (default /tmp/device_check): env.txt, build.log, pytest.log,
# device_throughput.json/.log, train_cpu.log, train_cuda.log.
#
# Such a machine may lack Eigen (header-only) and cannot fetch it: copy it into the checkout first, ignored by
# git, and carry it (`carry: [".device"]` with the device tool):
#   mkdir -p .device && cp -r /usr/include/eigen3 .device/ && echo /.device/ >> .git/info/exclude
# CHOLMOD is optional (the build says whether it found it). Python: $PYTHON, default python3.
# Runs anywhere: without CUDA, the CUDA parts are skipped (so it can be tried on a CPU machine first).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
[ -d .device/eigen3 ] && export EIGEN3_INCLUDE_DIR=${EIGEN3_INCLUDE_DIR:-$PWD/.device/eigen3}
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
status=0
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }

step environment
{
  git log -1 --format='commit %H' 2>/dev/null || echo "commit: not a git checkout"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import torch, platform; print('python', platform.python_version(), 'torch', torch.__version__,
'cuda', torch.version.cuda, 'available', torch.cuda.is_available(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
  nproc
} 2>&1 | tee "$OUT/env.txt"
cuda=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))")

step "build (setup.py build_ext --inplace)"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  MAX_JOBS=${MAX_JOBS:-$(nproc)} "$PY" setup.py build_ext --inplace > "$OUT/build.log" 2>&1 \
    || { echo "BUILD FAILED: see build.log"; tail -30 "$OUT/build.log"; exit 1; }
  grep -i -E "cholmod|warning" "$OUT/build.log" | head -20
fi
"$PY" -c "import diffsoft; print('diffsoft imports from', diffsoft.__file__)" || exit 1

step "pytest (the whole suite; step tests on cpu and cuda)"
"$PY" -m pytest -q -p no:cacheprovider tests/python > "$OUT/pytest.log" 2>&1 || status=1
tail -25 "$OUT/pytest.log"

step "benchmarks/device_throughput.py"
"$PY" benchmarks/device_throughput.py --threads 2 --json "$OUT/device_throughput.json" \
  > "$OUT/device_throughput.log" 2>&1 || status=1
tail -30 "$OUT/device_throughput.log"

step "quick training, 2 CPU threads"
"$PY" examples/locomotion.py --quick --threads 2 --out-dir "$OUT/run_cpu" > "$OUT/train_cpu.log" 2>&1 || status=1
tail -4 "$OUT/train_cpu.log"
if [ "$cuda" = 1 ]; then
  step "quick training, cuda"
  "$PY" examples/locomotion.py --quick --device cuda --out-dir "$OUT/run_cuda" > "$OUT/train_cuda.log" 2>&1 \
    || status=1
  tail -4 "$OUT/train_cuda.log"
fi
rm -rf "$OUT/run_cpu" "$OUT/run_cuda"  # checkpoints and GIFs: not needed back
step "done (status $status)"
exit $status
