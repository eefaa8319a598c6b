"""How far trained policies walk on terrain they were not trained on: the distance in 100 steps from rest
(deterministic policy) on the flat ground, on held-out random terrains (``diffsoft.terrain.held_out_heights``)
and up and down a ramp, and whether the gait lasts 1,000 steps on the flat ground, e.g. to compare a policy
trained with ``--terrain`` against one trained on the flat ground. Float32, as trained.

    .venv/bin/python benchmarks/terrain.py runs/flat/policy.json runs/terrain/policy.json --slope 5
"""
import argparse
import os
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from diffsoft.creatures import make_creature  # noqa: E402
from diffsoft.policy import distance_walked, gait, load_algovivo_policy  # noqa: E402
from diffsoft.terrain import distances_on, held_out_heights, ramp_distances  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("policies", nargs="+", help="policy.json files (algovivo's format)")
    ap.add_argument("--creature", default="biped")
    ap.add_argument("--slope", type=float, default=5.0, help="the terrains' steepest slope and the ramps', degrees")
    ap.add_argument("--terrains", type=int, default=10, help="held-out terrains")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    sim = make_creature(args.creature, torch.float32)
    heights = held_out_heights(sim, args.slope, args.terrains)
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


if __name__ == "__main__":
    main()
