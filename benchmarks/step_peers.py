"""The step against NVIDIA's newton (Warp kernels on the CPU): the same tetrahedral beam, the same dt.

    /work/venv2/peers/bin/python benchmarks/step_peers.py [--refinement 4] [--seconds 2] [--threads 1]
        [--out benchmarks/results/peers]

The beam is benchmarks/cantilever.py's (0.32 x 0.08 x 0.08 m, ``4r x r x r`` cubes of 6 tetrahedra each from
``diffsoft.mesh.box``, E = 1e6, nu = 0.45, density 1e3 kg/m^3 lumped from the tetrahedra's volumes, the x = 0
face fixed, gravity 9.81 along -y, no ground), started from its twisted state (90 degrees at the tip) at rest.
Both simulators get this mesh, these masses and the same material, neither any damping: diffsoft's
``stable_neo_hookean`` and newton's tetrahedral Neo-Hookean are both Smith et al.'s 2018 stable Neo-Hookean with
its log term (:func:`newton_material` maps the parameters). diffsoft runs in float64, newton in float32 (Warp's).

Methods:

- ``diffsoft``: ``Simulator.step`` (backward Euler: Newton on the step's energy to ``rtol`` 1e-8, a direct
  sparse solve per Newton iteration), forward only, under ``torch.no_grad``;
- ``newton semi-implicit``: ``newton.solvers.SolverSemiImplicit`` (symplectic Euler on the elastic forces);
- ``newton VBD``: ``newton.solvers.SolverVBD`` (vertex block descent, ``--vbd-iterations`` sweeps a step).

Stability. A run of ``--seconds`` of simulated time at step ``dt`` is stable when, at every check (every
step, or every 10 ms of simulated time when steps are shorter): every position is finite; no tetrahedron is
inverted or degenerate (``det F > 0``); and the total energy (kinetic + diffsoft's stable Neo-Hookean elastic
energy + gravity, the same function for every method) is at most its initial value plus 10% of the initial
elastic energy (backward Euler and a converged implicit step only lose energy; an explicit step that gains
more than that is blowing up). The largest stable dt is searched on the grid ``DTS`` from the top down: the
first stable dt, where every larger one failed.

Reports per method: the largest stable dt, the forward time per step at it, the wall time per simulated second
there, and the energy each run there lost or gained over its time (a converged backward-Euler step dissipates:
that is what its stability costs); and the time per step at a common dt (the smallest of the largest stable
dts, where all are stable; ``--common-steps`` steps timed). Newton's time per step excludes the stability
checks and includes ``wp.synchronize``; every run builds its model anew, so Warp's kernel compilation (cached
on disk after the first) falls in the first run only. Writes ``step_peers_r<refinement>.md`` and ``.json``
under ``--out``.
"""
import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

from diffsoft.body import SoftBody
from diffsoft.energies import gravity_energy
from diffsoft.mesh import box
from diffsoft.simulator import Simulator
from diffsoft.threads import set_num_threads

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402

SIZE = (0.32, 0.08, 0.08)
DENSITY, E, NU, G = 1e3, 1e6, 0.45, 9.81
DTS = (1e-1, 5e-2, 2e-2, 1e-2, 5e-3, 2e-3, 1e-3, 5e-4, 2e-4, 1e-4, 5e-5, 2e-5, 1e-5)
CHECK_EVERY_S = 0.01
ENERGY_SLACK = 0.1


def beam(refinement):
    """The diffsoft simulator of the beam (float64, dt set per run) and its twisted initial positions."""
    verts, tets = box(SIZE, (4 * refinement, refinement, refinement), dtype=torch.float64)
    fixed = torch.nonzero(verts[:, 0] == 0).flatten()
    body = SoftBody(verts, tets, material="stable_neo_hookean", density=DENSITY, youngs_modulus=E, poisson_ratio=NU,
                    fixed=fixed)
    sim = Simulator(body, dt=1e-2, gravity=G, ground=None)
    theta = (math.pi / 2) * verts[:, 0] / SIZE[0]
    c, s = torch.cos(theta), torch.sin(theta)
    cy, cz = SIZE[1] / 2, SIZE[2] / 2
    y, z = verts[:, 1] - cy, verts[:, 2] - cz
    x0 = torch.stack([verts[:, 0], cy + c * y - s * z, cz + s * y + c * z], dim=1)
    return sim, x0


def newton_material():
    """newton's ``k_mu, k_lambda`` for the same material: newton takes the stable Neo-Hookean's own parameters
    (its ``alpha = 1 + 3/4 k_mu / k_lambda``), diffsoft the Lame parameters, mapped as Smith et al. 2018 (3.4) and
    ``diffsoft.energies.stable_neo_hookean_density`` map them: ``4/3 mu`` and ``lam + 5/6 mu``. With these, the
    two energies are the same function."""
    mu, lam = E / (2 * (1 + NU)), E * NU / ((1 + NU) * (1 - 2 * NU))
    return 4 / 3 * mu, lam + 5 / 6 * mu


class Judge:
    """The stability checks of one run (see the module docstring), on float64 copies of the states."""

    def __init__(self, sim, x0):
        self.sim = sim
        self.elements = sim.body.elements
        self.Dm_inv = sim.body.Dm_inv
        self.e0 = self.energy(x0, torch.zeros_like(x0))
        self.slack = ENERGY_SLACK * (sim.potential_energy(x0) - sim.potential_energy(sim.body.rest_positions)).item()

    def energy(self, x, v):
        return (self.sim.kinetic_energy(v) + self.sim.potential_energy(x)).item()

    def failure(self, x, v):
        """None, or why the state fails."""
        if not (torch.isfinite(x).all() and torch.isfinite(v).all()):
            return "non-finite positions"
        xe = x[self.elements]
        ds = (xe[:, 1:] - xe[:, :1]).transpose(1, 2)
        if (torch.linalg.det(ds @ self.Dm_inv) <= 0).any():
            return "inverted element"
        e = self.energy(x, v)
        if e > self.e0 + self.slack:
            return f"energy gain {e - self.e0:.3g} J > {self.slack:.3g} J"
        return None


def run_diffsoft(sim, x0, dt, steps, judge):
    sim.dt = dt
    x, v = x0.clone(), torch.zeros_like(x0)
    every = max(round(CHECK_EVERY_S / dt), 1)
    spent = 0.0
    with torch.no_grad():
        for k in range(1, steps + 1):
            t = time.perf_counter()
            x, v = sim.step(x, v)
            spent += time.perf_counter() - t
            if k % every == 0 or k == steps:
                why = judge.failure(x, v)
                if why:
                    return {"stable": False, "why": f"{why} at t = {k * dt:.4g} s", "steps": k,
                            "ms_per_step": 1e3 * spent / k}
    return {"stable": True, "steps": steps, "ms_per_step": 1e3 * spent / steps,
            "energy_change": judge.energy(x, v) - judge.e0}


def newton_model(sim, x0, solver_name, vbd_iterations):
    """newton's model of the same mesh, masses and fixed vertices (mass 0), y up, and its solver."""
    import newton
    import warp as wp
    builder = newton.ModelBuilder(up_axis=newton.Axis.Y, gravity=(0.0, -G, 0.0))
    k_mu, k_lambda = newton_material()
    verts = sim.body.rest_positions.numpy()
    builder.add_soft_mesh(pos=wp.vec3(0.0, 0.0, 0.0), rot=wp.quat_identity(), scale=1.0, vel=wp.vec3(0.0, 0.0, 0.0),
                          vertices=[wp.vec3(*p) for p in verts], indices=sim.body.elements.flatten().tolist(),
                          density=DENSITY, k_mu=k_mu, k_lambda=k_lambda, k_damp=0.0)
    for i in sim.body.fixed.tolist():
        builder.particle_mass[i] = 0.0
    if solver_name == "newton VBD":
        builder.color()
    model = builder.finalize(device="cpu")
    masses = model.particle_mass.numpy()
    ours = sim.body.mass.numpy()
    free = masses > 0
    if not np.allclose(masses[free], ours[free], rtol=1e-5):
        raise RuntimeError("newton's lumped masses differ from diffsoft's")
    if solver_name == "newton VBD":
        solver = newton.solvers.SolverVBD(model, iterations=vbd_iterations, particle_enable_self_contact=False,
                                          particle_enable_tile_solve=False)
    else:
        model.particle_grid = None  # no particle-particle contact (its default radius, 0.1 m, spans the mesh)
        solver = newton.solvers.SolverSemiImplicit(model, enable_tri_contact=False)
    state0, state1 = model.state(), model.state()
    state0.particle_q.assign(x0.numpy().astype(np.float32))
    return model, solver, state0, state1, model.control()


def check_same_material(sim, x0):
    """newton's elastic forces at the twisted state must be minus the gradient of diffsoft's elastic energy
    (float32's precision): the same model on both sides. Uses newton's semi-implicit force kernel (private)."""
    import warp as wp
    from newton._src.solvers.semi_implicit.kernels_particle import eval_tetrahedra_forces
    model, _, state, _, control = newton_model(sim, x0, "newton semi-implicit", 0)
    f = wp.zeros(model.particle_count, dtype=wp.vec3, device="cpu")
    eval_tetrahedra_forces(model, state, control, f)
    x = x0.clone().requires_grad_()
    g, = torch.autograd.grad(sim.potential_energy(x) - gravity_energy(x, sim.body.mass, sim.gravity), x)
    err = ((torch.from_numpy(f.numpy()).double() + g).norm() / g.norm()).item()
    if err > 1e-4:
        raise RuntimeError(f"newton's elastic forces differ from diffsoft's by {err:.2g} (relative)")
    return err


def run_newton(name, sim, x0, dt, steps, judge, vbd_iterations):
    import warp as wp
    model, solver, s0, s1, control = newton_model(sim, x0, name, vbd_iterations)
    every = max(round(CHECK_EVERY_S / dt), 1)
    spent = 0.0
    for k in range(1, steps + 1):
        t = time.perf_counter()
        s0.clear_forces()
        solver.step(s0, s1, control, None, dt)
        s0, s1 = s1, s0
        wp.synchronize()
        spent += time.perf_counter() - t
        if k % every == 0 or k == steps:
            x = torch.from_numpy(s0.particle_q.numpy()).double()
            v = torch.from_numpy(s0.particle_qd.numpy()).double()
            why = judge.failure(x, v)
            if why:
                return {"stable": False, "why": f"{why} at t = {k * dt:.4g} s", "steps": k,
                        "ms_per_step": 1e3 * spent / k}
    return {"stable": True, "steps": steps, "ms_per_step": 1e3 * spent / steps,
            "energy_change": judge.energy(x, v) - judge.e0}


def run(name, sim, x0, dt, steps, judge, args):
    """``steps`` steps of ``dt`` from the twisted state at rest, judged (see the module docstring)."""
    if name == "diffsoft":
        return run_diffsoft(sim, x0, dt, steps, judge)
    return run_newton(name, sim, x0, dt, steps, judge, args.vbd_iterations)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--refinement", type=int, default=4, help="cubes across the beam (8: cantilever.py's full bar)")
    ap.add_argument("--seconds", type=float, default=2.0, help="simulated time of each stability run")
    ap.add_argument("--vbd-iterations", type=int, default=10)
    ap.add_argument("--common-steps", type=int, default=100, help="steps timed at the common dt")
    ap.add_argument("--methods", nargs="*", default=["diffsoft", "newton semi-implicit", "newton VBD"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "peers"))
    args = ap.parse_args()
    set_num_threads(args.threads)
    import warp as wp
    wp.config.quiet = True
    wp.init()
    sim, x0 = beam(args.refinement)
    judge = Judge(sim, x0)
    material_error = check_same_material(sim, x0)
    results = {"command": "python benchmarks/step_peers.py " + " ".join(sys.argv[1:]),
               "versions": provenance.versions("newton", "warp"),
               "material_error": material_error, "threads": args.threads, "refinement": args.refinement,
               "vertices": sim.body.num_vertices, "tetrahedra": len(sim.body.elements), "seconds": args.seconds,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": {}}
    largest = {}
    results["initial_elastic_energy"] = judge.slack / ENERGY_SLACK
    for name in args.methods:
        runs = results["runs"][name] = {}
        for dt in DTS:
            r = runs[str(dt)] = run(name, sim, x0, dt, max(round(args.seconds / dt), 1), judge, args)
            print(name, dt, r, flush=True)
            if r["stable"]:
                largest[name] = dt
                break
    common = min(largest.values()) if largest else None
    results["largest_stable_dt"], results["common_dt"] = largest, common
    results["at_common_dt"] = {}
    if common is not None:  # timing only: at most --common-steps steps
        for name in args.methods:
            r = run(name, sim, x0, common, min(args.common_steps, max(round(args.seconds / common), 1)), judge, args)
            results["at_common_dt"][name] = r
            print(name, "at the common dt", common, r, flush=True)
    write(results, args.out)


def write(results, out):
    os.makedirs(out, exist_ok=True)
    v = results["versions"]
    common = results["common_dt"]
    at = results["at_common_dt"]
    ours = at.get("diffsoft", {}).get("ms_per_step")
    lines = [f"`{results['command']}` at {v['diffsoft_commit']}; torch {v['torch']}, newton {v['newton']}, "
             f"warp-lang {v['warp']}; {results['threads']} thread(s); beam of {results['vertices']} vertices, "
             f"{results['tetrahedra']} tetrahedra, initial (twist) elastic energy "
             f"{results['initial_elastic_energy']:.3g} J; newton's elastic forces = -grad of diffsoft's energy to "
             f"{results['material_error']:.1e}; {results['seconds']:g} s simulated per stability run; "
             f"{results['date']}.", "",
             f"| method | largest stable dt (s) | ms per step there | wall s per simulated s there | energy change "
             f"over the run there (J) | first unstable dt (s): why | ms per step at dt = {common:g} | vs diffsoft "
             f"at dt = {common:g} |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, runs in results["runs"].items():
        dt = results["largest_stable_dt"].get(name)
        r = runs.get(str(dt), {})
        failed = sorted((float(k), x["why"]) for k, x in runs.items() if not x["stable"])
        why = f"{failed[0][0]:g}: {failed[0][1]}" if failed else "none failed"
        if dt is None:
            cells = "none | | | "
        else:
            top = " (the grid's largest)" if dt == DTS[0] else ""
            cells = (f"{dt:g}{top} | {r['ms_per_step']:.2f} | {r['ms_per_step'] / 1e3 / dt:.2f} | "
                     f"{r['energy_change']:.3g}")
        c = at.get(name, {})
        timed = f"{c['ms_per_step']:.2f}" if c.get("stable") else c.get("why", "")
        ratio = f"{c['ms_per_step'] / ours:.2f}x" if c.get("stable") and ours else ""
        lines.append(f"| {name} | {cells} | {why} | {timed} | {ratio} |")
    md = "\n".join(lines)
    name = f"step_peers_r{results['refinement']}"
    with open(os.path.join(out, name + ".md"), "w") as f:
        f.write(md + "\n")
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(results, f, indent=1)
    print(md)

if __name__ == "__main__":
    main()
