"""Train a neural controller for a soft creature by backpropagation through the implicit simulator.

    .venv/bin/python examples/locomotion.py --quick                 # the biped, under 2 minutes on 2 cores
    .venv/bin/python examples/locomotion.py --creature quadruped
    .venv/bin/python examples/locomotion.py --creature my_creature.json --resume
    .venv/bin/python -m diffsoft.launch --standalone --nproc_per_node 2 \
        examples/locomotion.py --quick                              # data-parallel, gloo

Prints the distance walked before and after training and writes checkpoint.pt, policy.json (algovivo's
policy format), history.json, learning_curve.png and walk.gif under runs/<creature>/ (see
docs/training.md and ``--help``).
"""
import os
import sys

# Idle OpenMP threads sleep instead of spinning: read once, when torch loads OpenMP (docs/training.md,
# "Threads"). Set here, before torch is imported, so that main() need not re-execute the process to set it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from diffsoft.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
