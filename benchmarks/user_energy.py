"""A user energy through ``diffsoft.minimize``: matrix-free CG (the paper's algorithm) against ``sparsity=``
(the Hessian recovered from coloured probes and factored), side by side in one run.

    .venv/bin/python benchmarks/user_energy.py [--sizes 10 20 40] [--threads 2] [--repeat 3]

The energy is the simulator's plain-torch step energy (``diffsoft.energies.reference_step_energy``) on the clamped
neo-Hookean sheets of ``step_speed.py``, given to ``minimize`` as any user energy would be: autograd gives
its gradient and Hessian-vector products, nothing is fused. The sparsity pattern is the triangles' vertex
pairs among the free vertices. One step from rest, forward and backward (the gradient of ``|x1|^2`` with
respect to the inertial prediction), best of ``--repeat``, the paths interleaved in each round:

- ``cg``: matrix-free CG on Hessian-vector products (the paper's algorithm, in C++);
- ``probes 1``: ``sparsity=``, one probe (Hessian-vector product) per autograd call, ``probe_batch=1``;
- ``probes K``: ``sparsity=``, as many probes per call as the memory bound allows (all of them here);
- ``probes``: ``sparsity=`` by default, ``probe_batch=None``: one probe per call, then 2, 4, 8, ... while
  each is faster per probe (each timed on two calls), settling on the fastest.
"""
import argparse
import math
import os
import time

# Idle OpenMP threads sleep instead of spinning: read once, when torch loads OpenMP (benchmarks/README.md,
# "Threads under load").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

import diffsoft
from diffsoft.energies import reference_step_energy
from diffsoft.threads import set_num_threads
from step_speed import cantilever, step_params


def free_pairs(sim):
    """(P, 2) pairs of free-vertex slots that share an element: the step energy's Hessian sparsity over y."""
    top = sim.topology
    slots = top.free_index[top.elements]  # (E, 3)
    k = slots.shape[1]
    pairs = torch.stack([slots[:, [a for a in range(k) for _ in range(k)]],
                         slots[:, [b for _ in range(k) for b in range(k)]]], -1).reshape(-1, 2)
    return pairs[(pairs >= 0).all(1)].unique(dim=0)


PATHS = {  # name: (with the sparsity pattern, minimize's probe_batch)
    "cg": (False, None),
    "probes 1": (True, 1),
    "probes K": (True, 2 ** 19),  # as many per autograd call as the memory bound allows
    "probes": (True, None),  # the default: measured (1, 2, 4, ... per call while faster per probe)
}


def run(sim, pattern, repeat):
    """Forward and backward times of each path, best of `repeat`, the paths interleaved within each round."""
    x, v = sim.rest_state
    params, x0f = step_params(sim, x, v, None)
    x_hat = params[0].detach().requires_grad_()
    params = (x_hat,) + params[1:]
    opts = dict(sim.solver_options)
    opts.pop("keep_factor", None)
    best = {name: (math.inf, math.inf, None) for name in PATHS}
    for _ in range(repeat):
        for name, (sparse, probe_batch) in PATHS.items():
            t0 = time.perf_counter()
            y, info = diffsoft.minimize(reference_step_energy, x0f, *params, sparsity=pattern if sparse else None,
                                        probe_batch=probe_batch, return_info=True, **opts)
            t1 = time.perf_counter()
            torch.autograd.grad(y.square().sum(), x_hat)
            t2 = time.perf_counter()
            if t1 - t0 < best[name][0]:
                best[name] = (t1 - t0, t2 - t1, info)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 20, 40])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), float64, best of {args.repeat}; the plain-torch step "
          f"energy as a user energy; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'problem':<12} {'dofs':>6} {'path':<9} {'fwd ms':>9} {'bwd ms':>9} {'newton':>6} {'cg':>5} {'hvps':>5} "
          f"{'factor.':>7} {'vs cg fwd':>9} {'bwd':>6} {'vs probes 1 fwd':>15} {'bwd':>6}")
    for n in args.sizes:
        sim = cantilever(n, torch.float64)
        rows = run(sim, free_pairs(sim), args.repeat)
        f0, b0, _ = rows["cg"]
        f1, b1, _ = rows["probes 1"]
        for name, (f, b, info) in rows.items():
            print(f"grid {n}x{n:<4} {sim.body.num_vertices * 2:>6} {name:<9} {1e3 * f:>9.1f} {1e3 * b:>9.1f} "
                  f"{info.iterations:>6} {info.cg_iterations:>5} {info.hvp_count:>5} {info.factorizations:>7} "
                  f"{f0 / f:>8.1f}x {b0 / b:>5.1f}x {f1 / f:>14.2f}x {b1 / b:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
