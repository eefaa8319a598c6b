"""Forward and backward time of one backward-Euler step: diffsoft against the plain-PyTorch baseline.

Both run in this process, interleaved, on the same problems and tolerances; the table prints ratios.
    .venv/bin/python benchmarks/step_speed.py [--quick] [--json results/step_speed.json]
    .venv/bin/python benchmarks/step_speed.py --family [--sizes 10 40 70 100] [--threads 1]

``--family`` measures instead the loadings nobody tuned for (issue 14): 2D neo-Hookean sheets of n x n vertices
(1 m, 1000 kg/m^3, E = 1e5, nu = 0.3, dt = 1/30), clamped on their left edge or free, under

- ``clamped gravity``: at rest, sagging;
- ``clamped shear`` / ``free shear``: a horizontal velocity of 10 m/s per m of height (+-5 m/s at the edges);
- ``free twist``: spinning at 10 rad/s about the centre;
- ``free impact``: 2 cm above the ground, falling at 6 m/s (and sliding at 1 m/s) into it.

For each it prints one step's forward and backward with the default (``solver="auto"``, a factorization with
factor reuse: Newton's systems after the first by CG on the previous factorization), the same with
``reuse_factor=False`` (one factorization per Newton iteration) and ``solver="cg"``, and the plain-PyTorch
algorithm's forward (benchmarks/baseline.py), measured interleaved in this run (best of ``--repeat``, after a
warm-up step), with the ratios the issue asks for: baseline over default (goal >= 20x) and default over the
best of diffsoft's solvers (goal <= 1.2). Then the default step's
time by phase (diffsoft._C's phase timers: kernels, assembly, symbolic analysis, numeric factorization,
back-substitutions, the rest of the C++ Newton loop, and the Python around it) and its floor: one numeric
factorization plus one solve of that Hessian alone (``reuse_factor=False``'s mean times per call).

``--before DIR`` compares this checkout with another (an older commit's checkout with its own ``.venv``, e.g. a
``git worktree``): each runs its own step_speed.py on the creatures (``--only``, default biped, quadruped and
biped x64, x16 with ``--quick``) in its own process, alternately, ``--rounds`` times; the table gives each side's
median forward and backward ms and the ratio after / before of the medians, with the range of the rounds' own
ratios.
    git worktree add ../before COMMIT && (cd ../before && bash scripts/setup_env.sh)
    .venv/bin/python benchmarks/step_speed.py --before ../before --quick --rounds 10 --repeat 10 --threads 1

``--loop N`` only steps 16 bipeds (``--loop-batch B``: B) N times (forward and backward) after 2 warm-up steps,
and prints their mean wall-clock and CPU time per step; valgrind's instruction count of N steps less that of
N = 2 is load-free. Any checkout's package runs it (this file, run by that checkout's Python from its root), and
with ``--before`` both sides run it, alternately, instead of the creatures' best steps:
    valgrind --tool=callgrind --callgrind-out-file=/dev/null .venv/bin/python benchmarks/step_speed.py --loop N
    .venv/bin/python benchmarks/step_speed.py --before ../before --loop 400 --loop-batch 1 --rounds 8 --threads 1
"""
import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

# Idle OpenMP threads sleep instead of spinning: read once, when torch loads OpenMP (benchmarks/README.md,
# "Threads under load").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from baseline import newton_cg
from diffsoft import _C
from diffsoft.body import SoftBody
from diffsoft.creatures import biped, quadruped
from diffsoft.energies import reference_step_energy
from diffsoft.mesh import rectangle
from diffsoft.simulator import Simulator
from diffsoft.step import unpack
from diffsoft.threads import set_num_threads


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
    return (*params.flat(), top), params.x0_free


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


def _slice(args, i):
    """Problem i's step energy arguments from a batch's."""
    p, top = unpack(args)
    p = p._replace(**{k: getattr(p, k)[i] for k, dims in _PER_PROBLEM.items()
                      if isinstance(getattr(p, k), torch.Tensor) and getattr(p, k).dim() == dims})
    return (*p.flat(), top)


LOADINGS = ("clamped gravity", "clamped shear", "free shear", "free twist", "free impact")


def sheet(n, loading, solver, dtype, reuse_factor=None):
    """The n x n vertex sheet of ``loading`` (see the module's docstring), its simulator and start state."""
    impact = loading == "free impact"
    verts, tris = rectangle(width=1.0, height=1.0, nx=n - 1, ny=n - 1, origin=(0.0, 0.02 if impact else 0.0),
                            dtype=dtype)
    fixed = torch.nonzero(verts[:, 0] == 0).flatten() if loading.startswith("clamped") else None
    body = SoftBody(verts, tris, material="neo_hookean", density=1000.0, youngs_modulus=1e5, poisson_ratio=0.3,
                    fixed=fixed, dtype=dtype)
    sim = Simulator(body, dt=1 / 30, ground=0.0 if impact else None, solver=solver, reuse_factor=reuse_factor)
    x, v = sim.rest_state
    centre = x.mean(0)
    if loading.endswith("shear"):
        v[:, 0] = 10.0 * (x[:, 1] - centre[1])
    elif loading == "free twist":
        v = 10.0 * torch.stack([-(x[:, 1] - centre[1]), x[:, 0] - centre[0]], dim=1)
    elif impact:
        v[:, 0], v[:, 1] = 1.0, -6.0
    return sim, x, v


def one_step(sim, x, v, backward=True):
    """Forward (and backward of a quadratic loss) of one step: (forward s, backward s, info)."""
    x0 = x.clone().requires_grad_(backward)
    t0 = time.perf_counter()
    x1, _, info = sim.step(x0, v, return_info=True)
    t1 = time.perf_counter()
    if backward:
        (x1 * x1).sum().backward()
    return t1 - t0, time.perf_counter() - t1, info


def phases(sim, x, v):
    """The forward's time by phase (seconds) from the C++ phase timers, with calls per phase."""
    _C._phase_timers(True)
    try:
        wall, _, info = one_step(sim, x, v, backward=False)
        times = _C._phase_times()
    finally:
        _C._phase_timers(False)
    return wall, times, info


def measure_family(n, loading, repeat, dtype):
    sims = {"auto": sheet(n, loading, "auto", dtype), "cg": sheet(n, loading, "cg", dtype),
            "no_reuse": sheet(n, loading, "auto", dtype, reuse_factor=False)}
    best = {name: [math.inf, math.inf, None] for name in sims}
    base = math.inf
    sim, x, v = sims["auto"]
    params, x0f = step_params(sim, x, v, None)
    opts = sim.solver_options
    rtol = opts["rtol"] or (1e-8 if dtype == torch.float64 else 1e-4)
    for name, (s, xs, vs) in sims.items():
        one_step(s, xs, vs)  # warm up: the symbolic analysis, once per simulator
    for _ in range(repeat):  # interleaved, best of each
        for name, (s, xs, vs) in sims.items():
            f, b, info = one_step(s, xs, vs)
            best[name][0], best[name][1] = min(best[name][0], f), min(best[name][1], b)
            best[name][2] = info
        t0 = time.perf_counter()
        _, stats = newton_cg(reference_step_energy, x0f, params, rtol, opts["atol"])
        base = min(base, time.perf_counter() - t0)
    wall, times, _ = phases(sim, x, v)
    _, direct_times, _ = phases(*sims["no_reuse"])
    per_call = {k: (t / c if c else math.nan) for k, (t, c) in direct_times.items()}
    floor = per_call["factorization"] + per_call["solves"]
    fwd = {name: b[0] for name, b in best.items()}
    row = dict(problem=f"{n}x{n} {loading}", n=n, loading=loading, dofs=len(sim.body.free) * 2,
               baseline_forward_ms=1e3 * base, baseline_newton=stats["iterations"], baseline_cg=stats["cg_iterations"],
               floor_ms=1e3 * floor, speedup=base / fwd["auto"], over_best=fwd["auto"] / min(fwd.values()),
               phases_ms={k: 1e3 * t for k, (t, _) in times.items()}, phase_calls={k: c for k, (_, c) in times.items()},
               phased_forward_ms=1e3 * wall)
    for name, (f, b, info) in best.items():
        row[name] = dict(forward_ms=1e3 * f, backward_ms=1e3 * b, newton=info.iterations, cg=info.cg_iterations,
                         factorizations=info.factorizations, converged=info.converged)
    return row


def cell(s):
    """forward ms (Newton iterations / CG iterations / factorizations) backward ms"""
    return f"{s['forward_ms']:.1f} ({s['newton']}/{s['cg']}/{s['factorizations']}) {s['backward_ms']:.1f}"


def machine(args):
    """The header's first line: torch, the processor, the threads and their wait policy, the dtype."""
    return (f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {torch.get_num_threads()} "
            f"threads (OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}), {args.dtype}")


def family(args, dtype):
    print(f"{machine(args)}; forward ms (newton its / cg its / factorizations), backward ms")
    print(f"{'case':<22} {'dofs':>5} {'default':>22} {'reuse_factor=False':>22} {'cg':>22} {'base ms':>8} "
          f"{'base/def':>8} {'def/best':>8} {'floor':>6}")
    rows = []
    for n in args.sizes:
        for loading in LOADINGS:
            r = measure_family(n, loading, args.repeat or (2 if n <= 40 else 1), dtype)
            rows.append(r)
            print(f"{r['problem']:<22} {r['dofs']:>5} {cell(r['auto']):>22} {cell(r['no_reuse']):>22} "
                  f"{cell(r['cg']):>22} {r['baseline_forward_ms']:>8.1f} {r['speedup']:>7.1f}x {r['over_best']:>8.2f} "
                  f"{r['floor_ms']:>6.1f}",
                  flush=True)
    print("\ndefault forward by phase, ms (one step; kernels = energy, gradient, Hessian blocks and products; "
          "newton other = the C++ loop's own vector work; python = the step's wall time outside the C++ solve)")
    names = ("kernels", "assembly", "analysis", "factorization", "solves")
    print(f"{'case':<22} {'fwd':>7} " + " ".join(f"{k[:8]:>8}" for k in names) + f" {'newton o.':>9} {'python':>7} "
          f"{'floor':>6} {'fwd/floor':>9}")
    for r in rows:
        p = r["phases_ms"]
        other = p["newton"] - sum(p[k] for k in names)
        python = r["phased_forward_ms"] - p["newton"]
        print(f"{r['problem']:<22} {r['phased_forward_ms']:>7.1f} " + " ".join(f"{p[k]:>8.1f}" for k in names) +
              f" {other:>9.1f} {python:>7.1f} {r['floor_ms']:>6.1f} {r['auto']['forward_ms'] / r['floor_ms']:>9.1f}")
    met = [r for r in rows if r["speedup"] >= 20 and r["over_best"] <= 1.2]
    print(f"\ngoals met (>= 20x the baseline and within 20% of the best solver): {len(met)} of {len(rows)}")
    return rows


def loop(n, dtype, batch=16):
    """``--loop``: ``n`` steps of ``batch`` bipeds at rest pushed at 0.5 m/s (activations 0.8), each with the
    backward of ``|x1|^2`` to ``x0``, after 2 such steps (warm-up); prints their mean wall-clock and CPU ms per
    step. valgrind counts the instructions of ``n`` against 2."""
    sim = biped(dtype=dtype)
    x, v = sim.rest_state
    push = torch.tensor([0.5, 0.0], dtype=dtype)
    x, v = x.expand(batch, -1, -1).clone(), (v + push).expand(batch, -1, -1).clone()
    a = activation(sim, batch)

    def steps(k):
        for _ in range(k):
            x0 = x.clone().requires_grad_()
            x1, _ = sim.step(x0, v, a)
            (x1 * x1).sum().backward()

    steps(2)
    wall, cpu = time.perf_counter(), time.process_time()
    steps(n)
    if n:
        print(f"{batch} bipeds, {n} steps forward and backward: {(time.perf_counter() - wall) / n * 1e3:.4f} ms "
              f"wall-clock, {(time.process_time() - cpu) / n * 1e3:.4f} ms CPU per step")


def before_after(args):
    """``--before``: the creatures' step time of this checkout against another's, in alternated processes."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides = {"before": (os.path.join(args.before, ".venv", "bin", "python"), args.before),
             "after": (sys.executable, here)}
    only = args.only or ["biped", "quadruped", "biped x16" if args.quick else "biped x64"]
    parts = ("forward_ms", "backward_ms")
    if args.loop:  # both sides run this script's --loop, each with its own package
        only, parts = [f"{args.loop_batch} bipeds"], ("wall_ms", "cpu_ms")
    runs = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side in ("before", "after") if r % 2 == 0 else ("after", "before"):  # neither always goes first
                python, root = sides[side]
                out = os.path.join(tmp, "rows.json")
                if args.loop:
                    cmd = [python, os.path.abspath(__file__), "--loop", str(args.loop), "--loop-batch",
                           str(args.loop_batch), "--threads", str(args.threads), "--dtype", args.dtype]
                    wall, cpu = map(float, re.findall(r"([\d.]+) ms", subprocess.run(
                        cmd, check=True, cwd=root, capture_output=True, text=True).stdout))
                    runs[side].append({only[0]: dict(wall_ms=wall, cpu_ms=cpu)})
                    continue
                cmd = [python, os.path.join(root, "benchmarks", "step_speed.py"), "--only", *only, "--json", out,
                       "--threads", str(args.threads), "--repeat", str(args.repeat or 3), "--dtype", args.dtype]
                cmd += ["--quick"] if args.quick else []
                subprocess.run(cmd, check=True, cwd=root, capture_output=True, text=True)
                runs[side].append({row["problem"]: row for row in json.load(open(out))})
            print(f"round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)
    each = f"the mean of {args.loop} steps" if args.loop else f"best of {args.repeat or 3} steps"
    print(f"{machine(args)}; {args.rounds} alternated rounds, {each} per round; before: {args.before}")
    print(f"{'problem':<12} {'':>8} {'before ms':>10} {'after ms':>9} {'after/before':>12} {'rounds':>13}")
    rows = []
    for name in only:
        for part in parts:
            b, a = ([rs[name][part] for rs in runs[side]] for side in ("before", "after"))
            paired = sorted(x / y for x, y in zip(a, b))
            row = dict(problem=name, part=part, before_ms=statistics.median(b), after_ms=statistics.median(a),
                       rounds_lo=paired[0], rounds_hi=paired[-1])
            row["ratio"] = row["after_ms"] / row["before_ms"]
            rows.append(row)
            print(f"{name:<12} {part[:-3]:>8} {row['before_ms']:>10.3f} {row['after_ms']:>9.3f} {row['ratio']:>12.3f} "
                  f"{row['rounds_lo']:>6.2f}-{row['rounds_hi']:<6.2f}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small problems only, fewer repeats")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--family", action="store_true", help="the sheets under every loading (issue 14) instead")
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 40, 70], help="--family: sheets of n x n vertices")
    ap.add_argument("--repeat", type=int, help="steps per solver, best kept (default 3, --quick 2; --family 2, 1 "
                                               "above 40x40)")
    ap.add_argument("--threads", type=int, default=2, help="torch and OpenBLAS threads (default 2)")
    ap.add_argument("--only", nargs="+", help="only the problems of these names (e.g. biped 'grid 70x70')")
    ap.add_argument("--loop", type=int, metavar="N", help="only step 16 bipeds N times forward and backward, "
                                                           "after 2 steps, and print their mean time per step")
    ap.add_argument("--loop-batch", type=int, default=16, metavar="B", help="--loop: bipeds per step (default 16)")
    ap.add_argument("--before", metavar="DIR", help="compare with the checkout in DIR (with its .venv), alternately")
    ap.add_argument("--rounds", type=int, default=10, help="--before: alternated rounds (default 10)")
    args = ap.parse_args()
    set_num_threads(args.threads)
    if args.loop is not None and not args.before:
        return loop(args.loop, getattr(torch, args.dtype), args.loop_batch)
    if args.before:
        rows = before_after(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return
    dtype = getattr(torch, args.dtype)
    if args.family:
        rows = family(args, dtype)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return
    repeat = args.repeat or (2 if args.quick else 3)
    problems = [("biped", lambda: biped(dtype=dtype), None), ("quadruped", lambda: quadruped(dtype=dtype), None),
                ("biped x64", lambda: biped(dtype=dtype), 64)]
    sizes = [10, 20] if args.quick else [10, 20, 40, 70]
    problems += [(f"grid {n}x{n}", (lambda n=n: cantilever(n, dtype)), None) for n in sizes]
    if args.quick:
        problems[2] = ("biped x16", problems[2][1], 16)
    if args.only:
        problems = [p for p in problems if p[0] in args.only]
    rows = []
    print(machine(args))
    head = (f"{'problem':<12} {'dofs':>6} {'fwd ms':>9} {'bwd ms':>8} {'bwd/fwd':>7} {'kept/fwd':>8} {'base ms':>9} "
            f"{'speedup':>8} {'newton':>6} {'cg':>5} {'b.newton':>8} {'b.cg':>6} {'steps/s':>8}")
    print(head)
    for name, make, batch in problems:
        r = measure(name, make(), repeat, batch)
        rows.append(r)
        print(f"{r['problem']:<12} {r['dofs']:>6} {r['forward_ms']:>9.2f} {r['backward_ms']:>8.2f} "
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
