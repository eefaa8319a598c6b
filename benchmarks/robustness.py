"""How far trained policies walk on perturbed creatures: the distance in 100 steps from rest (deterministic
policy) on the nominal creature and on variants whose Lame parameters, masses and friction are scaled by
factors in {1 - s, 1, 1 + s} (all 27 combinations), e.g. to compare a policy trained with
``--randomize`` against one trained on the nominal creature only.

    .venv/bin/python benchmarks/robustness.py runs/nominal/policy.json runs/randomized/policy.json --spread 0.3
"""
import argparse
import itertools

import torch

from diffsoft.creatures import make_creature
from diffsoft.policy import distance_walked, load_algovivo_policy


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("policies", nargs="+", help="policy.json files (algovivo's format)")
    ap.add_argument("--creature", default="biped")
    ap.add_argument("--spread", type=float, default=0.3, help="s: factors 1 - s, 1, 1 + s")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    factors = (1 - args.spread, 1.0, 1 + args.spread)
    print("| policy | nominal | mean over the 27 variants | worst | best |\n|---|---:|---:|---:|---:|")
    for path in args.policies:
        policy = load_algovivo_policy(path, torch.float64)
        distances = []
        for fm, fmass, ff in itertools.product(factors, repeat=3):
            sim = make_creature(args.creature, torch.float64)
            sim.friction = sim.friction.detach() * ff
            sim.body.mu, sim.body.lam = sim.body.mu * fm, sim.body.lam * fm
            sim.body.mass = sim.body.mass * fmass
            distances.append(distance_walked(sim, policy, args.steps))
        nominal = distance_walked(make_creature(args.creature, torch.float64), policy, args.steps)
        t = torch.tensor(distances)
        print(f"| {path} | {nominal:.2f} | {t.mean():.2f} | {t.min():.2f} | {t.max():.2f} |")


if __name__ == "__main__":
    main()
