"""Trajectory optimisation: open-loop muscle activations that bring a creature's centre of mass to a target
point, found by gradient descent through the whole rollout.

The unknowns are one activation per muscle and step, ``a = min_a + (1 - min_a) sigmoid(theta)`` (always
valid, never saturated). The loss is the squared distance from the centre of mass at the last step to the
target, plus a small penalty on activation changes between steps (smooth, physically plausible patterns).
Adam on theta; the gradient runs back through every implicit step.

    .venv/bin/python examples/trajectory_optimization.py [--creature biped] [--steps 40] [--target 0.3 0.55]
"""
import argparse

import torch

from diffsoft import render
from diffsoft.creatures import make_creature
from diffsoft.policy import center_of_mass_x


def center_of_mass(sim, x):
    m = sim.body.mass
    return (x * m[:, None]).sum(-2) / m.sum()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--creature", default="biped")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--target", type=float, nargs="+", default=None,
                   help="the target point (default: 0.3 ahead of the rest pose's centre of mass, same height)")
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--min-a", type=float, default=0.25)
    p.add_argument("--smoothness", type=float, default=1e-3)
    p.add_argument("--gif", default=None, help="write a GIF of the optimised motion here")
    args = p.parse_args(argv)
    sim = make_creature(args.creature, torch.float64)
    x0, v0 = sim.rest_state
    start = center_of_mass(sim, x0)
    target = start.clone()
    if args.target is None:
        target[0] += 0.3
    else:
        target = torch.tensor(args.target, dtype=x0.dtype)
    theta = torch.full((args.steps, sim.body.num_muscles), 1.0, dtype=x0.dtype)  # a = 0.8: sigmoid not flat
    theta += 0.1 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(0), dtype=x0.dtype)
    theta.requires_grad_()
    optimizer = torch.optim.Adam([theta], lr=args.lr)
    losses = []
    for it in range(args.iterations):
        a = args.min_a + (1 - args.min_a) * torch.sigmoid(theta)
        xs, _ = sim.rollout(x0, v0, a)
        miss = (center_of_mass(sim, xs[-1]) - target).square().sum()
        loss = miss + args.smoothness * (a[1:] - a[:-1]).square().sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(miss.item())
        if it % 10 == 0 or it + 1 == args.iterations:
            print(f"iteration {it:3d}  distance to target {miss.sqrt().item():.4f}")
    with torch.no_grad():
        a = args.min_a + (1 - args.min_a) * torch.sigmoid(theta)
        xs, _ = sim.rollout(x0, v0, a)
        final = (center_of_mass(sim, xs[-1]) - target).norm().item()
    initial = losses[0] ** 0.5
    print(f"distance to the target at the last step: {initial:.4f} with the initial activations, {final:.4f} "
          f"optimised; the centre of mass moved {(center_of_mass_x(sim, xs[-1]) - center_of_mass_x(sim, x0)).item():.4f} along +x")
    if args.gif:
        render.render_rollout(sim, xs, a, gif=args.gif)
    return {"losses": losses, "final_distance": final, "initial_distance": initial}


if __name__ == "__main__":
    main()
