"""How one step's time and a rollout's memory grow with the problem's size: 3D boxes of tetrahedra, 2D grids.

    .venv/bin/python benchmarks/scaling.py [--quick] [--solver auto,kept,cg] [--no-memory] [--json FILE]
    .venv/bin/python benchmarks/scaling.py --plot FILE.json FIGURE.png

Time: a 3D neo-Hookean box (1 x 0.35 x 0.375 m, E = 1e5, nu = 0.3, density 1000, its x = 0 face clamped, under
gravity, ``ground=None``, dt = 1/30), ``diffsoft.mesh.box`` with 6 tetrahedra per cube, from 432 up to 50,400
tetrahedra (40 x 14 x 15 cubes, 29,520 dofs); and the 2D sheet of ``step_speed.py`` (1 m, same material, left
edge clamped) at n x n vertices. One backward-Euler step from rest: forward time, backward time (gradient of
``|x1|^2`` with respect to x0), Newton iterations, factorizations; best of a few runs (one for the largest).
The exponent is the least-squares slope of log time against log dofs.

Memory: the peak resident memory that a T-step rollout (T = 100) and its backward add, in a fresh
subprocess per size: after a warm-up step the child resets its high-water mark (``/proc/self/clear_refs``),
reads VmRSS as the baseline, runs the rollout with x0 requiring grad, reads VmHWM (forward peak), runs the
backward and reads VmHWM again. The table divides the growth by T x dofs: roughly constant means that the
graph holds a fixed number of values per step and dof (the states, and what each step saves for its
backward), i.e. memory linear in T x state size. Resolution: a few MB (allocator and page granularity).
"""
import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

# Idle OpenMP threads sleep instead of spinning: read once, when torch loads OpenMP (benchmarks/README.md,
# "Threads under load").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from diffsoft.body import SoftBody
from diffsoft.mesh import box, rectangle
from diffsoft.simulator import Simulator
from diffsoft.threads import set_num_threads

# The memory probe (tests/python/memory_probe.py) is test code: it lives with the tests.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))

from memory_probe import status_bytes  # noqa: E402

BOX = (1.0, 0.35, 0.375)
BOXES = [(8, 3, 3), (12, 4, 5), (16, 6, 6), (24, 8, 9), (32, 11, 12), (40, 14, 15)]
GRIDS = [10, 20, 40, 70, 100]
MEMORY_GRIDS = [10, 20, 30, 40, 50, 60, 70]
MEMORY_BOXES = [(8, 3, 3), (12, 4, 5), (16, 6, 6), (24, 8, 9)]


def make(kind, size, solver="auto", dtype=torch.float64):
    """``kind`` "box" (size = cube counts) or "grid" (size = vertices per side): the clamped body's simulator."""
    if kind == "box":
        verts, elems = box(BOX, size, dtype=dtype)
    else:
        verts, elems = rectangle(1.0, 1.0, size - 1, size - 1, dtype=dtype)
    fixed = torch.nonzero(verts[:, 0] == 0).flatten()
    body = SoftBody(verts, elems, material="neo_hookean", density=1000.0, youngs_modulus=1e5, poisson_ratio=0.3,
                    fixed=fixed, dtype=dtype)
    if solver == "kept":  # the direct solver, each backward on the forward's kept factor
        return Simulator(body, dt=1 / 30, ground=None, keep_factors=True)
    return Simulator(body, dt=1 / 30, ground=None, solver=solver)


def label(kind, size):
    return "box " + "x".join(map(str, size)) if kind == "box" else f"grid {size}x{size}"


def one_step(sim):
    x, v = sim.rest_state
    x0 = x.clone().requires_grad_()
    t0 = time.perf_counter()
    x1, v1, info = sim.step(x0, v, return_info=True)
    t1 = time.perf_counter()
    (x1 * x1).sum().backward()
    return t1 - t0, time.perf_counter() - t1, info


def measure(kind, size, solver, repeat):
    sim = make(kind, size, solver)
    fwd = bwd = math.inf
    for _ in range(repeat):
        f, b, info = one_step(sim)
        fwd, bwd = min(fwd, f), min(bwd, b)
    return dict(problem=label(kind, size), kind=kind, solver=solver, dofs=sim.body.num_vertices * sim.body.dim,
                elements=sim.body.num_elements, forward_ms=1e3 * fwd, backward_ms=1e3 * bwd,
                newton=info.iterations, cg=info.cg_iterations, factorizations=info.factorizations,
                converged=bool(info.converged and info.backward_converged))


def slope(xs, ys):
    x, y = torch.tensor(xs, dtype=torch.float64).log(), torch.tensor(ys, dtype=torch.float64).log()
    return (((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()).item()


def _status(field):
    value = status_bytes(field)
    if value is None:
        raise KeyError(field)
    return value


def memory_child(kind, size, steps):
    """Runs in a fresh process: prints a JSON line with the memory a T-step rollout and its backward add."""
    torch.set_num_threads(2)
    sim = make(kind, size)
    one_step(sim)  # warm-up: libraries, kernels, allocator pools
    x, v = sim.rest_state
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        reset = True
    except OSError:
        reset = False
    base = _status("VmRSS")
    x0 = x.clone().requires_grad_()
    xs, vs = sim.rollout(x0, v, steps=steps)
    loss = (xs[-1] * xs[-1]).sum() + (vs * vs).sum()
    forward_peak = _status("VmHWM")
    loss.backward()
    peak = _status("VmHWM")
    print(json.dumps(dict(problem=label(kind, size), kind=kind, steps=steps,
                          dofs=sim.body.num_vertices * sim.body.dim, elements=sim.body.num_elements,
                          forward_growth=forward_peak - base, peak_growth=peak - base, hwm_reset=reset)))


def memory(kind, size, steps):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--memory-child", kind,
                          json.dumps(size), str(steps)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(json_path, png_path):
    """Forward and backward step time against dofs per solver and body kind (log-log), and the rollout's
    memory per step against dofs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(json_path) as f:
        data = json.load(f)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {"auto": "C0", "kept": "C2", "direct": "C0", "cg": "C3"}
    for (kind, solver), group in _groups(data["time"], ("kind", "solver")).items():
        d = [r["dofs"] for r in group]
        marker = "o" if kind == "box" else "s"
        label = f"{kind}, {solver}"
        ax_t.loglog(d, [r["forward_ms"] for r in group], marker + "-", color=styles.get(solver), label=label + " fwd")
        ax_t.loglog(d, [r["backward_ms"] for r in group], marker + ":", color=styles.get(solver), label=label + " bwd")
    ax_t.set_xlabel("dofs")
    ax_t.set_ylabel("one step, ms")
    ax_t.legend(fontsize=6, ncol=2)
    ax_t.grid(True, which="both", alpha=0.3)
    for (kind,), group in _groups([m for m in data["memory"] if m["steps"] == 100], ("kind",)).items():
        ax_m.loglog([m["dofs"] for m in group], [m["peak_growth"] / 2**20 for m in group],
                    ("o" if kind == "box" else "s") + "-", label=f"{kind}: 100-step rollout + backward")
    ax_m.set_xlabel("dofs")
    ax_m.set_ylabel("peak memory added, MB")
    ax_m.legend(fontsize=7)
    ax_m.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    print(f"wrote {png_path}")


def _groups(rows, keys):
    out = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return {k: sorted(v, key=lambda r: r["dofs"]) for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--solver", default="auto",
                    help="comma-separated: auto, direct, cg, or kept (direct with keep_factors=True)")
    ap.add_argument("--max-elements", type=int, default=60000, help="skip 3D boxes with more tetrahedra")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--steps", type=int, default=100, help="rollout length for the memory table")
    ap.add_argument("--threads", type=int, default=2,
                    help="torch and OpenBLAS threads (default 2, as DiffPD's figures)")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"),
                    help="only draw the figure (time and memory against dofs) from a --json file of an earlier run")
    ap.add_argument("--memory-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plot:
        return plot(*args.plot)
    if args.memory_child:
        kind, size, steps = args.memory_child
        size = json.loads(size)
        return memory_child(kind, tuple(size) if kind == "box" else size, int(steps))
    set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads (OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}), "
          f"float64")
    boxes = BOXES[:3] if args.quick else [b for b in BOXES if 6 * b[0] * b[1] * b[2] <= args.max_elements]
    grids = GRIDS[:3] if args.quick else GRIDS
    rows, mem_rows = [], []
    if not args.no_time:
        print("\none step from rest, best of 5 (small), 3, or 1 (above 20k tetrahedra)")
        print(f"{'problem':<15} {'solver':<6} {'dofs':>6} {'elements':>8} {'fwd ms':>9} {'bwd ms':>9} {'bwd/fwd':>7} "
              f"{'newton':>6} {'cg':>5} {'factor.':>7} {'conv':>5}")
        for solver in args.solver.split(","):
            family = [("box", b) for b in boxes] + [("grid", n) for n in grids]
            for kind, size in family:
                big = kind == "box" and 6 * size[0] * size[1] * size[2] > 20000
                small = sum(size) < 60 if kind == "box" else size <= 40
                r = measure(kind, size, solver, 1 if big else (5 if small else 3))
                rows.append(r)
                print(f"{r['problem']:<15} {solver:<6} {r['dofs']:>6} {r['elements']:>8} {r['forward_ms']:>9.1f} "
                      f"{r['backward_ms']:>9.1f} {r['backward_ms'] / r['forward_ms']:>7.2f} {r['newton']:>6} "
                      f"{r['cg']:>5} {r['factorizations']:>7} {str(r['converged']):>5}", flush=True)
            for kind in ("box", "grid"):
                sel = [r for r in rows if r["kind"] == kind and r["solver"] == solver]
                if len(sel) >= 2:
                    d = [r["dofs"] for r in sel]
                    fwd, bwd = slope(d, [r["forward_ms"] for r in sel]), slope(d, [r["backward_ms"] for r in sel])
                    print(f"{kind + ('es' if kind == 'box' else 's')}, {solver}: forward grows as dofs^{fwd:.2f}, "
                          f"backward as dofs^{bwd:.2f} "
                          f"({sel[0]['dofs']}..{sel[-1]['dofs']} dofs)")
    if not args.no_memory:
        T = args.steps
        print(f"\npeak memory added by a {T}-step rollout and its backward (fresh process per size, default solver)")
        print(f"{'problem':<15} {'steps':>5} {'dofs':>6} {'elements':>8} {'fwd MB':>8} {'peak MB':>8} "
              f"{'B/(step dof)':>12} {'B/(step elem)':>13}")
        sizes = [("grid", n) for n in (MEMORY_GRIDS[:3] if args.quick else MEMORY_GRIDS)]
        sizes += [("box", b) for b in (MEMORY_BOXES[:2] if args.quick else MEMORY_BOXES)]
        plan = [(k, s, T) for k, s in sizes]
        if not args.quick:  # the same grid at several lengths: linear in T?
            plan += [("grid", 40, t) for t in (T // 4, T // 2, 2 * T)]
        for kind, size, steps in plan:
            m = memory(kind, size, steps)
            mem_rows.append(m)
            per = m["peak_growth"] / (m["steps"] * m["dofs"])
            print(f"{m['problem']:<15} {m['steps']:>5} {m['dofs']:>6} {m['elements']:>8} "
                  f"{m['forward_growth'] / 2**20:>8.1f} {m['peak_growth'] / 2**20:>8.1f} {per:>12.0f} "
                  f"{m['peak_growth'] / (m['steps'] * m['elements']):>13.0f}"
                  + ("" if m["hwm_reset"] else "  (VmHWM not reset)"), flush=True)
        for kind in ("grid", "box"):
            sel = [m for m in mem_rows if m["kind"] == kind and m["peak_growth"] > 0]
            if len(sel) >= 2:
                n = [m["steps"] * m["dofs"] for m in sel]
                exponent = slope(n, [m["peak_growth"] for m in sel])
                print(f"{kind + ('es' if kind == 'box' else 's')}: peak growth ~ (steps x dofs)^{exponent:.2f}, "
                      f"{min(m['peak_growth'] / k for m, k in zip(sel, n)):.0f}-"
                      f"{max(m['peak_growth'] / k for m, k in zip(sel, n)):.0f} bytes per step and dof")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(time=rows, memory=mem_rows), f, indent=1)


if __name__ == "__main__":
    main()
