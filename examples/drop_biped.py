"""Drops the biped onto the ground while its legs pulse, then writes an animated GIF, PNG frames and a VTK
time series (open results/drop_biped/vtk/biped.pvd in ParaView).

    .venv/bin/python examples/drop_biped.py [--steps 90] [--out results/drop_biped]
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
    parser.add_argument("--steps", type=int, default=90)
    parser.add_argument("--out", default="results/drop_biped")
    args = parser.parse_args()

    sim = creatures.biped(dtype=torch.float64)
    x, v = sim.rest_state
    x = x + torch.tensor([0.0, 0.5], dtype=x.dtype)  # half a metre above the ground
    m = sim.body.num_muscles
    t = torch.arange(args.steps, dtype=x.dtype)[:, None]
    phase = torch.arange(m, dtype=x.dtype) * (2 * math.pi / m)
    activations = 0.8 + 0.2 * torch.cos(0.3 * t + phase)  # in [0.6, 1]: contract and relax in a wave

    with torch.no_grad():
        xs, vs = sim.rollout(x, v, activations)
    print(f"{sim}\nlowest point {xs[..., 1].min().item():+.4f} m, final centre of mass "
          f"{xs[-1].mean(0).tolist()}")

    os.makedirs(args.out, exist_ok=True)
    render_rollout(sim, xs, activations, gif=os.path.join(args.out, "biped.gif"),
                   frames_dir=os.path.join(args.out, "frames"), every=2)
    pvd = write_vtk_series(os.path.join(args.out, "vtk"), xs, sim.body.elements, name="biped", dt=sim.dt,
                           point_data={"velocity": vs})
    print(f"wrote {args.out}/biped.gif, {args.out}/frames/ and {pvd}")


if __name__ == "__main__":
    main()
