"""How well steered policies (``--steer true``) follow commanded headings: for each heading, the distance the
centre of mass covers along it in 100 steps from rest, how far off the heading it went (degrees, in the ground
plane), and whether the gait toward it lasts 1,000 steps (``diffsoft.policy.gait``). Float32, as trained.

    .venv/bin/python benchmarks/steering.py runs/biped/policy.json                       # 2D: 0 and 180
    .venv/bin/python benchmarks/steering.py runs/tetrapod/policy.json --creature tetrapod  # 3D: held-out headings
"""
import argparse
import math
import os
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from diffsoft.cli import STEER_HEADINGS  # noqa: E402
from diffsoft.creatures import make_creature  # noqa: E402
from diffsoft.policy import distances_along, gait, load_algovivo_policy  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("policies", nargs="+", help="steered policy.json files")
    ap.add_argument("--creature", default="biped")
    ap.add_argument("--headings", type=float, nargs="+", default=None,
                    help="degrees (default: diffsoft.cli.STEER_HEADINGS, 0 and 180 in 2D)")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    sim = make_creature(args.creature, torch.float32)
    headings = args.headings or STEER_HEADINGS[sim.body.dim]
    print(f"{args.creature}: per commanded heading (degrees), the distance along it in {args.steps} steps from "
          f"rest / degrees off it / whether the gait toward it lasts 1,000 steps\n")
    print("| policy | " + " | ".join(f"{h:g}" for h in headings) + " | worst off |\n|---|"
          + "---|" * len(headings) + "---:|")
    for path in args.policies:
        policy = load_algovivo_policy(path, torch.float32)
        with warnings.catch_warnings():  # steps short of Newton's tolerance in float32 far from the origin
            warnings.simplefilter("ignore", RuntimeWarning)
            along, off = distances_along(sim, policy, args.steps, [math.radians(h) for h in headings])
            lasts = [gait(sim, policy, heading=math.radians(h)).lasts for h in headings]
        cells = [f"{d:.2f} / {o:.0f} / {'lasts' if k else 'no'}" for d, o, k in zip(along, off, lasts)]
        print(f"| {path} | " + " | ".join(cells) + f" | {off.max():.0f} |")


if __name__ == "__main__":
    main()
