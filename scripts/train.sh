#!/usr/bin/env bash
# The main job on a fresh machine: sets everything up (scripts/setup_env.sh), then trains the default creature
# (the biped) in quick mode by backpropagation through the simulator, and prints the distance it walks
# before and after training. Outputs go to runs/biped/ (checkpoints, policy.json, learning_curve.png,
# walk.gif). Extra arguments go to examples/locomotion.py (e.g. --resume, --creature quadruped).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup_env.sh
echo "setup took $(( $(date +%s) - start )) s"
.venv/bin/python examples/locomotion.py --quick "$@"
echo "scripts/train.sh took $(( $(date +%s) - start )) s in all"
