"""Screen helper (not part of diffsoft): sample_efficiency.py with the evaluation done on an EMA of the policy's
parameters (EMA env var: decay per iteration); the raw policy's evaluation is printed as RAW lines."""
import copy, os, runpy, sys
import torch
from diffsoft import training
DECAY = float(os.environ["EMA"])
state = {"ema": None}
orig_it, orig_dw = training.train_iteration, training.distance_walked
def it_wrap(cfg, sim, policy, *a, **k):
    r = orig_it(cfg, sim, policy, *a, **k)
    with torch.no_grad():
        if state["ema"] is None:
            state["ema"] = copy.deepcopy(policy)
        else:
            for pe, p in zip(state["ema"].parameters(), policy.parameters()):
                pe.mul_(DECAY).add_(p, alpha=1 - DECAY)
    return r
def dw(sim, policy, h):
    raw = orig_dw(sim, policy, h)
    if state["ema"] is None:
        return raw
    e = orig_dw(sim, state["ema"], h)
    print(f"RAW {raw:.4f} EMA {e:.4f}", flush=True)
    return e
training.train_iteration, training.distance_walked = it_wrap, dw
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
