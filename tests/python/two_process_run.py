"""examples/locomotion.py's command line (diffsoft.cli.main) for the two-process tests of test_training.py, with
one process made to fail or to differ: FAIL_RANK=r makes process r's simulator fail every training step from its
FAIL_FROM-th iteration on (max_iter=0); OTHER_SEED=s gives process 1 the seed s (another command)."""
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from diffsoft import training  # noqa: E402
from diffsoft.cli import main  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
FAIL_RANK = int(os.environ.get("FAIL_RANK", "-1"))
FAIL_FROM = int(os.environ.get("FAIL_FROM", "1"))
made = training.make_creature


def make(name, dtype, device="cpu"):
    sim = made(name, dtype, device)
    if RANK != FAIL_RANK:
        return sim
    original = sim.step

    def step(x, *args, **kw):
        if x.dim() == 3 and x.shape[0] == 2:  # a training rollout's step (2 creatures a process), not an evaluation's
            if step.calls >= FAIL_FROM * 2:  # a window of 2 steps per iteration
                sim.solver_options["max_iter"] = 0
            step.calls += 1
        return original(x, *args, **kw)
    step.calls = 0
    sim.step = step
    return sim


training.make_creature = make
if __name__ == "__main__":
    if RANK == 1 and "OTHER_SEED" in os.environ:
        sys.argv += ["--seed", os.environ["OTHER_SEED"]]
    sys.exit(main())
