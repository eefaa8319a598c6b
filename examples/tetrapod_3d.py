"""A 3D neo-Hookean tetrapod falls onto the ground and flexes its legs; writes a GIF and a VTK series.

    .venv/bin/python examples/tetrapod_3d.py [--steps 45] [--out results/tetrapod_3d]
"""
import argparse
import math
import os

import torch

from diffsoft import creatures
from diffsoft.mesh import write_vtk_series
from diffsoft.render import render_rollout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=45)
    parser.add_argument("--out", default="results/tetrapod_3d")
    args = parser.parse_args()

    sim = creatures.tetrapod(dtype=torch.float64)
    x, v = sim.rest_state
    x = x + torch.tensor([0.0, 0.1, 0.0], dtype=x.dtype)
    m = sim.body.num_muscles
    t = torch.arange(args.steps, dtype=x.dtype)[:, None]
    leg = torch.arange(m) // 4  # 4 muscles per leg; diagonal legs move together
    activations = 0.85 + 0.15 * torch.cos(0.4 * t + math.pi * (leg % 2 == leg // 2).to(x.dtype))

    with torch.no_grad():
        xs, vs = sim.rollout(x, v, activations)
    print(f"{sim}\nlowest point {xs[..., 1].min().item():+.4f} m")
    os.makedirs(args.out, exist_ok=True)
    render_rollout(sim, xs, activations, gif=os.path.join(args.out, "tetrapod.gif"), every=1)
    pvd = write_vtk_series(os.path.join(args.out, "vtk"), xs, sim.body.elements, name="tetrapod", dt=sim.dt)
    print(f"wrote {args.out}/tetrapod.gif and {pvd}")


if __name__ == "__main__":
    main()
