"""The paper's algorithm in plain PyTorch, in Python: the reference that the benchmarks measure against.

Newton's method; each Newton system solved by CG on Hessian-vector products from torch double backward
through the plain-torch energy; the same forcing term, truncation, line search and tolerances as diffsoft's
C++ solver (see csrc/diffsoft/core/newton.cpp), so that both do the same mathematical work.
"""
import math

import torch


def newton_cg(energy, x0, params, rtol, atol, max_iter=100, cg_rtol=0.5, ls_c1=1e-4, ls_shrink=0.5, ls_max_iter=30):
    """Minimizes ``energy(x, *params)`` from ``x0`` (one problem). Returns ``(x, stats)``."""
    x = x0.detach().clone()
    stats = dict(iterations=0, cg_iterations=0)
    noise = 16 * torch.finfo(x.dtype).eps
    g0 = None
    for it in range(max_iter + 1):
        x.requires_grad_(True)
        e = energy(x, *params)
        (g,) = torch.autograd.grad(e, x, create_graph=True)
        gd, ed = g.detach(), e.item()
        gn = gd.norm().item()
        if g0 is None:
            g0 = gn
            tol = max(atol, rtol * g0)
        stats["iterations"] = it
        if gn <= tol or it == max_iter:
            break
        eta = min(cg_rtol, math.sqrt(gn / g0))
        p, k = _truncated_cg(lambda v: torch.autograd.grad(g, x, v, retain_graph=True)[0], -gd, eta * gn, x.numel())
        stats["cg_iterations"] += k
        x = x.detach()
        slope = (gd * p).sum().item()
        if not slope < 0:
            p, slope = -gd, -gn * gn
        step = 1.0
        with torch.no_grad():
            for _ in range(ls_max_iter):
                trial = x + step * p
                et = energy(trial, *params).item()
                if math.isfinite(et) and et <= ed + ls_c1 * step * slope + noise * abs(ed):
                    x = trial
                    break
                step *= ls_shrink
            else:
                break
    return x.detach(), stats


def _truncated_cg(hvp, b, tol, max_iter):
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = (r * r).sum()
    k = 0
    while k < max_iter and rr.sqrt() > tol:
        ap = hvp(p)
        k += 1
        pap = (p * ap).sum()
        if pap <= 1e-14 * (p * p).sum():
            return (b if k == 1 else x), k
        alpha = rr / pap
        x = x + alpha * p
        r = r - alpha * ap
        rr_new = (r * r).sum()
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x, k
