"""How far trained policies walk on terrain they were not trained on: the distance in 100 steps from rest
(deterministic policy) on the flat ground, on held-out random terrains (``diffsoft.terrain.held_out_heights``)
and up and down a ramp, and whether the gait lasts 1,000 steps on the flat ground, e.g. to compare a policy
trained with ``--terrain`` against one trained on the flat ground. Float32, as trained.

    .venv/bin/python benchmarks/terrain.py runs/flat/policy.json runs/terrain/policy.json --slope 5

With ``--solver``, instead: what the terrain's surface costs Newton. Each policy's gait replayed from rest on the
held-out terrains (one batched rollout, ``--steps`` long), on the flat ground, on the terrains as
``diffsoft.terrain`` makes them (:class:`~diffsoft.colliders.SmoothHeightField`) and on the same samples as a
piecewise linear :class:`~diffsoft.colliders.HeightField`: Newton iterations per batched step (mean and most),
creature-steps that stopped short of Newton's tolerance, the rollout's wall time (1 thread) and the mean distance.

    .venv/bin/python benchmarks/terrain.py runs/flat/policy.json --solver --slope 10 --steps 1000
"""
import argparse
import os
import time
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from diffsoft.colliders import HeightField  # noqa: E402
from diffsoft.creatures import make_creature  # noqa: E402
from diffsoft.policy import distance_covered, distance_walked, gait, load_algovivo_policy  # noqa: E402
from diffsoft.terrain import distances_on, height_field, held_out_heights, ramp_distances  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("policies", nargs="+", help="policy.json files (algovivo's format)")
    ap.add_argument("--creature", default="biped")
    ap.add_argument("--slope", type=float, default=5.0, help="the terrains' steepest slope and the ramps', degrees")
    ap.add_argument("--terrains", type=int, default=10, help="held-out terrains")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--solver", action="store_true", help="Newton's cost on the terrains' surfaces instead")
    args = ap.parse_args()
    sim = make_creature(args.creature, torch.float32)
    heights = held_out_heights(sim, args.slope, args.terrains)
    if args.solver:
        return solver_costs(sim, args, heights)
    print(f"{args.creature}, {args.steps} steps from rest; {args.terrains} held-out terrains with slopes within "
          f"{args.slope:g} degrees; ramps of {args.slope:g} degrees\n")
    print("| policy | flat | held-out terrains: mean | least | up the ramp | down the ramp | gait on flat ground "
          "(1,000 steps): last / first 100, least height |\n|---|---:|---:|---:|---:|---:|---|")
    for path in args.policies:
        policy = load_algovivo_policy(path, torch.float32)
        with warnings.catch_warnings():
            # steps that stop short of Newton's tolerance (a vertex held at a height field's kink, float32 far
            # from the origin): rare, and without effect on these distances (docs/training.md, "Terrain")
            warnings.simplefilter("ignore", RuntimeWarning)
            flat = distance_walked(sim, policy, args.steps)
            hilly = distances_on(sim, policy, heights, args.steps)
            up, down = ramp_distances(sim, policy, args.slope, args.steps)
            g = gait(sim, policy)
        verdict = "lasts" if g.lasts else "does not last"
        print(f"| {path} | {flat:.2f} | {hilly.mean():.2f} | {hilly.min():.2f} | {up:.2f} | {down:.2f} | "
              f"{g.last / max(g.first, 1e-9):.2f}, {g.least_height:.2f}: {verdict} |")


def replay(sim, policy, batch, steps):
    """A deterministic rollout from rest of ``batch`` creatures: Newton's iterations per batched step, the
    creature-steps that stopped short, the wall time and the distances."""
    x, v = sim.rest_state
    x, v = x.expand(batch, -1, -1).clone(), v.expand(batch, -1, -1).clone()
    a = torch.ones(batch, sim.body.num_muscles, dtype=x.dtype)
    iterations, short, xs = [], 0, [x]
    start = time.perf_counter()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the steps that stop short, counted here
        for _ in range(steps):
            a = policy.act(x, v, a, None, None)
            x, v, info = sim.step(x, v, a, return_info=True)
            iterations.append(int(info.iterations))
            short += int((~torch.as_tensor(info.problem_converged)).sum())
            xs.append(x)
    seconds = time.perf_counter() - start
    return iterations, short, seconds, distance_covered(sim, torch.stack(xs))


def solver_costs(sim, args, heights):
    torch.set_num_threads(1)
    print(f"{args.creature}, {args.steps} steps from rest on {args.terrains} held-out terrains with slopes within "
          f"{args.slope:g} degrees (one batched rollout)\n")
    print("| policy | ground | Newton iterations per batched step: mean / most | creature-steps stopped short | "
          "seconds | mean distance |\n|---|---|---:|---:|---:|---:|")
    smooth = height_field(sim, heights)
    grounds = {"flat": None, "smooth (SmoothHeightField)": smooth,
               "piecewise linear (HeightField)": HeightField(smooth.x0, smooth.dx, smooth.heights)}
    for path in args.policies:
        policy = load_algovivo_policy(path, torch.float32)
        for name, field in grounds.items():
            ground, colliders = sim.ground, sim.colliders
            if field is not None:
                sim.ground, sim.colliders = None, (field,)
            try:
                iterations, short, seconds, walked = replay(sim, policy, args.terrains, args.steps)
            finally:
                sim.ground, sim.colliders = ground, colliders
            print(f"| {path} | {name} | {sum(iterations) / len(iterations):.2f} / {max(iterations)} | {short} of "
                  f"{args.steps * args.terrains} | {seconds:.1f} | {walked.mean():.2f} |")


if __name__ == "__main__":
    main()
