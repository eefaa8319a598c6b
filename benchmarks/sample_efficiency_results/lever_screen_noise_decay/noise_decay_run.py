"""Screen helper (not part of diffsoft): sample_efficiency.py with the exploration noise's std decaying
linearly from action_noise to action_noise * NOISE_END_FACTOR over NOISE_ITERS iterations, then constant."""
import os, runpy, sys
from diffsoft import training
END = float(os.environ["NOISE_END_FACTOR"]); ITERS = int(os.environ["NOISE_ITERS"])
orig = training._iteration_draws
def draws(cfg, sim, iteration, rank, world):
    g, a0, noise, scale = orig(cfg, sim, iteration, rank, world)
    f = 1.0 + min(iteration / ITERS, 1.0) * (END - 1.0)
    return g, a0, noise * f, scale
training._iteration_draws = draws
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
