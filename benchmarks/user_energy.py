"""A user energy through ``diffsoft.minimize``: matrix-free CG (the paper's algorithm) against ``sparsity=``
(the Hessian recovered from coloured probes and factored), side by side in one run.

    .venv/bin/python benchmarks/user_energy.py [--sizes 10 20 40]

The energy is the simulator's plain-torch step energy (``diffsoft.energies.reference_step_energy``) on the clamped
neo-Hookean sheets of ``step_speed.py``, given to ``minimize`` as any user energy would be: autograd gives
its gradient and Hessian-vector products, nothing is fused. The sparsity pattern is the triangles' vertex
pairs among the free vertices. One step from rest, forward and backward (the gradient of ``|x1|^2`` with
respect to the inertial prediction), best of 3.
"""
import argparse
import math
import time

import torch

import diffsoft
from diffsoft.energies import reference_step_energy
from step_speed import cantilever, step_params


def free_pairs(sim):
    """(P, 2) pairs of free-vertex slots that share an element: the step energy's Hessian sparsity over y."""
    top = sim.topology
    slots = top.free_index[top.elements]  # (E, 3)
    k = slots.shape[1]
    pairs = torch.stack([slots[:, [a for a in range(k) for _ in range(k)]],
                         slots[:, [b for _ in range(k) for b in range(k)]]], -1).reshape(-1, 2)
    return pairs[(pairs >= 0).all(1)].unique(dim=0)


def run(sim, sparsity, repeat=3):
    x, v = sim.rest_state
    params, x0f = step_params(sim, x, v, None)
    x_hat = params[0].detach().requires_grad_()
    params = (x_hat,) + params[1:]
    opts = dict(sim.solver_options)
    opts.pop("keep_factor", None)
    best = (math.inf, math.inf, None)
    for _ in range(repeat):
        t0 = time.perf_counter()
        y, info = diffsoft.minimize(reference_step_energy, x0f, *params, sparsity=sparsity, return_info=True, **opts)
        t1 = time.perf_counter()
        torch.autograd.grad(y.square().sum(), x_hat)
        t2 = time.perf_counter()
        if t1 - t0 < best[0]:
            best = (t1 - t0, t2 - t1, info)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 20, 40])
    args = ap.parse_args()
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, 2 threads, float64; the plain-torch step energy as a user energy")
    print(f"{'problem':<12} {'dofs':>6} {'path':<9} {'fwd ms':>9} {'bwd ms':>9} {'newton':>6} {'cg':>5} {'hvps':>5} "
          f"{'factor.':>7} {'speedup fwd':>11} {'bwd':>6}")
    for n in args.sizes:
        sim = cantilever(n, torch.float64)
        pattern = free_pairs(sim)
        rows = [("cg", run(sim, None)), ("sparsity", run(sim, pattern))]
        f0, b0, _ = rows[0][1]
        for name, (f, b, info) in rows:
            print(f"grid {n}x{n:<4} {sim.body.num_vertices * 2:>6} {name:<9} {1e3 * f:>9.1f} {1e3 * b:>9.1f} "
                  f"{info.iterations:>6} {info.cg_iterations:>5} {info.hvp_count:>5} {info.factorizations:>7} "
                  f"{f0 / f:>10.1f}x {b0 / b:>5.1f}x", flush=True)


if __name__ == "__main__":
    main()
