"""diffsoft.minimize in a few lines: solve, differentiate, inspect convergence.

Fits the stiffness k of a nonlinear spring field so that its equilibrium matches a target, with gradients
through the equilibrium by the implicit function theorem.

    .venv/bin/python examples/minimize_basics.py
"""
import torch

import diffsoft


def energy(x, k, b):
    """Springs 1/2 k x^2 + 1/4 x^4 under a load b: any scalar written with torch ops."""
    return 0.5 * (k * x * x).sum() + 0.25 * (x**4).sum() - (b * x).sum()


def main():
    torch.manual_seed(0)
    n = 100
    b = torch.randn(n, dtype=torch.float64)
    k_true = torch.rand(n, dtype=torch.float64) + 1
    target = diffsoft.minimize(energy, torch.zeros(n, dtype=torch.float64), k_true, b)

    log_k = torch.zeros(n, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([log_k], lr=0.1)
    for step in range(101):
        x, info = diffsoft.minimize(energy, torch.zeros(n, dtype=torch.float64), log_k.exp(), b, return_info=True)
        loss = (x - target).square().sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            print(f"step {step:3d}  loss {loss.item():.3e}  Newton {info.iterations} it, {info.cg_iterations} CG it, "
                  f"|g| {info.grad_norm:.1e}; adjoint {info.backward_cg_iterations} CG it, "
                  f"residual {info.backward_residual:.1e}")
    err = (log_k.detach().exp() - k_true).abs().max().item()
    print(f"max |k - k_true| = {err:.3e}")


if __name__ == "__main__":
    main()
