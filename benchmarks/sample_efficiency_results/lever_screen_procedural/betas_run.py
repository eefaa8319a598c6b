"""Screen helper (not part of diffsoft): sample_efficiency.py with Adam's betas set by BETAS="b1,b2" (the actor's and the critic's)."""
import functools, os, runpy, sys
import torch
B = tuple(float(x) for x in os.environ["BETAS"].split(","))
torch.optim.Adam = functools.partial(torch.optim.Adam, betas=B)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
