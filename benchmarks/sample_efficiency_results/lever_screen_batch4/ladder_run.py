"""Screen helper (not part of diffsoft): sample_efficiency.py with per-creature exploration noise: creature i's
noise std is action_noise times LADDER[i % len(LADDER)] (LADDER: comma-separated factors)."""
import os, runpy, sys
import torch
from diffsoft import training
F = [float(x) for x in os.environ["LADDER"].split(",")]
orig = training._iteration_draws
def draws(cfg, sim, iteration, rank, world):
    g, a0, noise, scale = orig(cfg, sim, iteration, rank, world)
    f = torch.tensor([F[i % len(F)] for i in range(noise.shape[1])], dtype=noise.dtype, device=noise.device)
    return g, a0, noise * f[None, :, None], scale
training._iteration_draws = draws
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
