"""Golden float64 trajectories and gradients, stored once (``tests/python/golden.json``) and compared on every
torch diffsoft is tested with (``test_golden.py``), so that a torch upgrade that changes diffsoft's numbers is
caught: the step's arithmetic is our own kernels', and the results should not depend on the torch version.

Each case runs a few steps of a creature (or one ``minimize``) at tight tolerances (no ``atol``, ``rtol`` near
round-off), so that the results are the solutions' and not the solver's path: torch's own ops may sum in
another order in another version, and where the solver's iterates use them (``fused=False``, the torch backend)
its path differs, while a Newton iteration more or less moves a loosely converged result by about the
tolerance. Each returns named float64 tensors: the trajectory, and the gradient of a fixed loss with respect to
the inputs. The torch backend has no case: its Newton iterates run on torch's own linear algebra (MKL in pip's
torch, OpenBLAS in Debian's) and its line search stalls near 1e-8 of the first gradient on torch 2.15, so its
results agree across torch versions only to its tolerance; the suite checks it against the C++ backend instead.

Regenerate (only when a change to diffsoft's numbers is intended, and say why in the commit):
``.venv/bin/python tests/python/golden.py``.
"""
import json
import sys
from pathlib import Path

import torch

import diffsoft

PATH = Path(__file__).with_name("golden.json")
TIGHT = dict(rtol=1e-13, atol=0.0, backward_rtol=1e-12, on_failure="raise")
F64 = torch.float64


def _rollout_case(sim, steps, fused=True):
    """``steps`` steps from rest under fixed activations; the loss is a weighted sum of the final positions and
    velocities, differentiated with respect to the activations, the Lame parameters and the time step."""
    sim.fused = fused
    sim.solver_options.update(TIGHT)
    body = sim.body
    gen = torch.Generator().manual_seed(0)
    mu = body.mu.detach().clone().requires_grad_()
    body.mu = mu
    dt = torch.tensor(float(sim.dt), dtype=F64, requires_grad=True)
    sim.dt = dt
    acts = (0.75 + 0.25 * torch.rand(steps, body.num_muscles, generator=gen, dtype=F64)).requires_grad_()
    x, v = sim.rest_state
    xs = [x]
    for t in range(steps):
        x, v = sim.step(x, v, acts[t])
        xs.append(x)
    weights = torch.randn(2, *x.shape, generator=gen, dtype=F64)
    loss = (weights[0] * x).sum() + (weights[1] * v).sum()
    g_act, g_mu, g_dt = torch.autograd.grad(loss, [acts, mu, dt])
    return {"trajectory": torch.stack(xs).detach(), "d_loss/d_activation": g_act, "d_loss/d_mu": g_mu,
            "d_loss/d_dt": g_dt}


def _biped():
    return _rollout_case(diffsoft.creatures.biped(dtype=F64), steps=8)


def _biped_double_backward():
    """``fused=False``: Newton-CG on double-backward products of the plain-torch energy."""
    return _rollout_case(diffsoft.creatures.biped(dtype=F64), steps=3, fused=False)


def _tetrapod():
    return _rollout_case(diffsoft.creatures.tetrapod(youngs_modulus=5e4, dtype=F64), steps=4)  # as stored


def _minimize():
    """A batch of quartic energies with a coupling term, solved by the layer; gradients of a loss of x*."""
    gen = torch.Generator().manual_seed(1)
    k = (1 + torch.rand(3, 20, generator=gen, dtype=F64)).requires_grad_()
    b = torch.randn(3, 20, generator=gen, dtype=F64, requires_grad=True)

    def energy(x, k, b):
        return (0.5 * k * x * x + 0.25 * x ** 4 - b * x).sum(-1) + 0.1 * (x[:, 1:] * x[:, :-1]).sum(-1)

    x = diffsoft.minimize(energy, torch.zeros(3, 20, dtype=F64), k, b, batched=True, **TIGHT)
    w = torch.randn(3, 20, generator=gen, dtype=F64)
    g_k, g_b = torch.autograd.grad((w * x).sum(), [k, b])
    return {"x_star": x.detach(), "d_loss/d_k": g_k, "d_loss/d_b": g_b}


CASES = {"biped": _biped, "biped_double_backward": _biped_double_backward, "tetrapod": _tetrapod, "minimize": _minimize}


def write():
    """Runs every case and writes their results, with the torch they were made with, to :data:`PATH`."""
    out = {"made_with_torch": torch.__version__, "cases": {}}
    for name, case in CASES.items():
        out["cases"][name] = {k: {"shape": list(t.shape), "values": t.flatten().tolist()}
                              for k, t in case().items()}
    PATH.write_text(json.dumps(out) + "\n")


def read():
    """``{case: {name: tensor}}`` from :data:`PATH`."""
    data = json.loads(PATH.read_text())
    return {case: {k: torch.tensor(v["values"], dtype=F64).reshape(v["shape"]) for k, v in results.items()}
            for case, results in data["cases"].items()}


if __name__ == "__main__":
    write()
    print(f"wrote {PATH} with torch {torch.__version__}", file=sys.stderr)
