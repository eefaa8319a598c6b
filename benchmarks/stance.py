"""How tall a creature stands when every muscle holds one activation: its height
(``diffsoft.policy.Posture.height``, 1 as at rest) after standing still for ``--steps`` steps, for each
activation and Young's modulus asked.

    .venv/bin/python benchmarks/stance.py [--creature tetrapod] [--activations 1 0.7 0.5 0.25]
        [--youngs-modulus 5e4 2e5] [--steps 60]

Why the tetrapod walks crouched (docs/training.md, "Measured"): a gait's least height follows its muscles'
activations, whatever the body's stiffness (its muscles' default stiffness scales with the body's).
"""
import argparse

import torch

from diffsoft.creatures import CREATURES, make_creature
from diffsoft.policy import Posture


def stance(sim, activation, steps):
    """The height after ``steps`` steps from rest with every muscle at ``activation``, and the least on the way."""
    x, v = sim.rest_state
    a = torch.full((sim.body.num_muscles,), activation, dtype=x.dtype)
    heights, posture = [], Posture(sim)
    for _ in range(steps):
        x, v = sim.step(x, v, a)
        heights.append(float(posture.height(x)))
    return heights[-1], min(heights)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--creature", default="tetrapod")
    p.add_argument("--activations", type=float, nargs="+", default=[1.0, 0.7, 0.5, 0.25])
    p.add_argument("--youngs-modulus", type=float, nargs="+", default=None,
                   help="the tetrapod's Young's modulus (Pa), one run each (default: the creature's own)")
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    moduli = args.youngs_modulus or [None]
    print("| Young's modulus | activation | height after | least height |\n| ---: | ---: | ---: | ---: |")
    for modulus in moduli:
        sim = make_creature(args.creature) if modulus is None else CREATURES[args.creature](youngs_modulus=modulus)
        for a in args.activations:
            last, least = stance(sim, a, args.steps)
            print(f"| {'default' if modulus is None else f'{modulus:g}'} | {a:g} | {last:.2f} | {least:.2f} |")


if __name__ == "__main__":
    main()
