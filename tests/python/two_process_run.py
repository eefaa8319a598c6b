"""examples/locomotion.py's command line (diffsoft.cli.main) for the two-process tests of test_training.py, with
one process made to fail or to differ: FAIL_RANK=r makes process r's simulator fail every training step from its
FAIL_FROM-th iteration on (max_iter=0); OTHER_SEED=s gives process 1 the seed s (another command)."""
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from diffsoft import training  # noqa: E402
from diffsoft.cli import main  # noqa: E402

from conftest import failing_creature  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
FAIL_RANK = int(os.environ.get("FAIL_RANK", "-1"))
FAIL_FROM = int(os.environ.get("FAIL_FROM", "1"))
if RANK == FAIL_RANK:
    training.make_creature = failing_creature(FAIL_FROM, window=2)  # (2 creatures a process, windows of 2)

if __name__ == "__main__":
    if RANK == 1 and "OTHER_SEED" in os.environ:
        sys.argv += ["--seed", os.environ["OTHER_SEED"]]
    sys.exit(main())
