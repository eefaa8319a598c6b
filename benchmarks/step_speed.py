"""Forward and backward time of one backward-Euler step: diffsoft against the plain-PyTorch baseline.

Both run in this process, interleaved, on the same problems and tolerances; the table prints ratios.
    .venv/bin/python benchmarks/step_speed.py [--quick] [--json results/step_speed.json]
"""
import argparse
import json
import math
import platform
import time

import torch

from baseline import newton_cg
from diffsoft.body import SoftBody
from diffsoft.creatures import biped, quadruped
from diffsoft.energies import reference_step_energy
from diffsoft.mesh import rectangle
from diffsoft.simulator import Simulator
from diffsoft.step import StepParams


def cantilever(n, dtype):
    """An n x n vertex neo-Hookean sheet (1 m x 1 m), its left edge clamped, sagging under gravity."""
    verts, tris = rectangle(width=1.0, height=1.0, nx=n - 1, ny=n - 1, dtype=dtype)
    fixed = torch.nonzero(verts[:, 0] == 0).flatten()
    body = SoftBody(verts, tris, material="neo_hookean", density=1000.0, youngs_modulus=1e5, poisson_ratio=0.3,
                    fixed=fixed, dtype=dtype)
    return Simulator(body, dt=1 / 30, ground=None)


def step_params(sim, x0, v0, a):
    """The step energy's arguments exactly as Simulator.step builds them (for the baseline), and the free
    vertices' start positions."""
    params, top = sim.step_problem(x0, v0, a)
    return (*params, top), params.x0_free


def activation(sim, batch=None):
    m = sim.body.num_muscles
    if not m:
        return None
    shape = (m,) if batch is None else (batch, m)
    return torch.full(shape, 0.8, dtype=sim.body.dtype)


def timed(fn, repeat):
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def measure(name, sim, repeat, batch=None):
    x, v = sim.rest_state
    if batch:
        x, v = x.expand(batch, -1, -1).clone(), v.expand(batch, -1, -1).clone()
    v = v + torch.tensor([0.5] + [0.0] * (sim.body.dim - 1), dtype=x.dtype)  # moving: contact, friction
    a = activation(sim, batch)
    opts = sim.solver_options

    def ours(keep_factor=False):
        sim.solver_options["keep_factor"] = keep_factor
        x0 = x.clone().requires_grad_()
        t0 = time.perf_counter()
        x1, v1, info = sim.step(x0, v, a, return_info=True)
        t1 = time.perf_counter()
        (x1 * x1).sum().backward()
        return t1 - t0, time.perf_counter() - t1, info

    def baseline():
        params, x0f = step_params(sim, x, v, a)
        atol = opts["atol"]
        rtol = opts["rtol"] or (1e-8 if x.dtype == torch.float64 else 1e-4)
        t0 = time.perf_counter()
        if batch:  # the paper's loop steps creatures one by one
            stats = [newton_cg(lambda y, *p: reference_step_energy(y, *p), x0f[i], _slice(params, i), rtol, atol)[1]
                     for i in range(batch)]
        else:
            stats = [newton_cg(reference_step_energy, x0f, params, rtol, atol)[1]]
        return time.perf_counter() - t0, stats

    ours()  # warm up
    fwd = bwd = bwd_kept = math.inf
    base = math.inf
    for _ in range(repeat):  # interleaved, best of each
        f, b, info = ours()
        fwd, bwd = min(fwd, f), min(bwd, b)
        f, b, _ = ours(keep_factor=True)  # the backward on the forward's kept factor
        fwd, bwd_kept = min(fwd, f), min(bwd_kept, b)
        t, stats = baseline()
        base = min(base, t)
    sim.solver_options["keep_factor"] = False
    creatures = batch or 1
    return dict(problem=name, dofs=sim.body.num_vertices * sim.body.dim, creatures=creatures,
                forward_ms=1e3 * fwd, backward_ms=1e3 * bwd, backward_over_forward=bwd / fwd,
                backward_kept_ms=1e3 * bwd_kept, backward_kept_over_forward=bwd_kept / fwd,
                baseline_forward_ms=1e3 * base, speedup=base / fwd, newton=info.iterations, cg=info.cg_iterations,
                baseline_newton=sum(s["iterations"] for s in stats) / len(stats),
                baseline_cg=sum(s["cg_iterations"] for s in stats) / len(stats),
                creature_steps_per_s=creatures / fwd)


# The step parameters that carry a batch dimension (an activation may also be shared by the batch).
_PER_PROBLEM = {"x_hat": 3, "x0": 3, "x0_free": 3, "activation": 2}


def _slice(params, i):
    """Problem i's step energy arguments from a batch's."""
    named = zip(StepParams._fields + ("topology",), params)
    return tuple(p[i] if isinstance(p, torch.Tensor) and p.dim() == _PER_PROBLEM.get(k) else p for k, p in named)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small problems only, fewer repeats")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    args = ap.parse_args()
    torch.set_num_threads(2)
    dtype = getattr(torch, args.dtype)
    repeat = 2 if args.quick else 3
    problems = [("biped", lambda: biped(dtype=dtype), None), ("quadruped", lambda: quadruped(dtype=dtype), None),
                ("biped x64", lambda: biped(dtype=dtype), 64)]
    sizes = [10, 20] if args.quick else [10, 20, 40, 70]
    problems += [(f"grid {n}x{n}", (lambda n=n: cantilever(n, dtype)), None) for n in sizes]
    if args.quick:
        problems[2] = ("biped x16", problems[2][1], 16)
    rows = []
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, {args.dtype}")
    head = (f"{'problem':<12} {'dofs':>6} {'fwd ms':>9} {'bwd ms':>8} {'bwd/fwd':>7} {'kept/fwd':>8} {'base ms':>9} "
            f"{'speedup':>8} {'newton':>6} {'cg':>5} {'b.newton':>8} {'b.cg':>6} {'steps/s':>8}")
    print(head)
    for name, make, batch in problems:
        r = measure(name, make(), repeat, batch)
        rows.append(r)
        print(f"{r['problem']:<12} {r['dofs']:>6} {r['forward_ms']:>9.1f} {r['backward_ms']:>8.1f} "
              f"{r['backward_over_forward']:>7.2f} {r['backward_kept_over_forward']:>8.2f} "
              f"{r['baseline_forward_ms']:>9.1f} {r['speedup']:>7.1f}x "
              f"{r['newton']:>6} {r['cg']:>5} {r['baseline_newton']:>8.1f} {r['baseline_cg']:>6.0f} "
              f"{r['creature_steps_per_s']:>8.0f}", flush=True)
    grids = [r for r in rows if r["problem"].startswith("grid")]
    if len(grids) >= 2:
        n = torch.tensor([float(r["dofs"]) for r in grids]).log()
        t = torch.tensor([r["forward_ms"] for r in grids]).log()
        slope = ((n - n.mean()) * (t - t.mean())).sum() / ((n - n.mean()) ** 2).sum()
        print(f"forward time on grids grows as n^{slope.item():.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
