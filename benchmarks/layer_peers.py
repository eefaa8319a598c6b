"""The implicit layer against its peers: ``diffsoft.minimize``, Theseus and torchopt, side by side in one run.

    /work/venv2/peers/bin/python benchmarks/layer_peers.py [--threads 1] [--repeat 3] [--only quartic ...]
        [--out benchmarks/results/peers]
    .venv-pip/bin/python benchmarks/layer_peers.py --floor [--only quartic batch fit]   # diffsoft's autograd floor

Needs pip's torch 2.x with ``theseus-ai`` and ``torchopt`` (benchmarks/results/peers/README.md), and diffsoft
built against that torch. Every method gets the same energy, written in torch, and nothing else (no
hand-written derivatives): each one's derivatives come from autograd.

Problems (float64; the loss is ``L(x*) = w . x*`` with a fixed random ``w``; gradients with respect to every
parameter listed):

- ``quartic``: ``1/2 x'Ax + 1/4 sum x^4 - b'x``, 1,000 unknowns, ``A`` dense SPD; parameters A and b.
- ``batch``: 256 independent problems of 10 unknowns, ``1/2 x'A_i x + 1/4 sum x^4 - b_i'x + logsumexp(x)``;
  parameters A (256, 10, 10) and b (256, 10).
- ``sheet``: the 40 x 40 neo-Hookean sheet's step energy (``diffsoft.energies.reference_step_energy`` on
  ``step_speed.cantilever(40)``, 3,120 unknowns), as a user energy; parameter: the inertial prediction x_hat.
- ``fit``: 64 nonlinear least-squares circle fits (centre and radius, 3 unknowns) to 200 noisy points on half a
  circle each; parameter: the points. Theseus' home: a batch of small least-squares problems, its residual
  given as a residual.

Methods:

- ``diffsoft``: ``diffsoft.minimize`` (Newton-CG in C++, implicit backward by CG on Hessian-vector products);
  ``diffsoft sparse``: the same with ``sparsity=`` (the Hessian from coloured probes, factored) on the sheet.
- ``theseus``: ``th.TheseusLayer`` with Gauss-Newton, ``CholeskyDenseSolver`` and ``backward_mode="implicit"``;
  its residual is the energy's gradient ``r = grad_x E`` (``torch.func.grad``; Gauss-Newton on it is Newton's
  method, and its implicit backward is the implicit function theorem at ``r = 0``), except on ``fit``, where it
  is the fit's residual. ``theseus unroll``: ``backward_mode="unroll"`` (on ``fit``, where the implicit mode's
  Gauss-Newton Hessian drops the residual's second-order term).
- ``torchopt``: ``torchopt.diff.implicit.custom_root`` (optimality ``grad_x E = 0``, backward
  ``linear_solve.solve_cg``: CG on Hessian-vector products) around a damped Newton loop written in torch
  (dense Hessians by ``torch.func``, batched per problem, Armijo backtracking); ``torchopt newton-cg``: the
  same around diffsoft's own algorithm written in torch (Newton-CG on Hessian-vector products), which
  separates what the algorithm buys from what diffsoft's C++ buys.

Measures, best of ``--repeat`` with the methods interleaved in each round: forward and backward wall time;
the gradient's error against central differences (the relative error of the directional derivative along two
random directions, the larger; the central differences of ``L``, step 1e-5 relative, solve each perturbed
problem with ``diffsoft.minimize`` and polish it with two undamped Newton steps on dense Hessians, see
:func:`reference_loss`); the forward's distance to that reference solution (relative); peak memory (the
rise of the resident set's high-water mark, ``VmHWM``, over one forward and backward, after the high-water
mark is reset through ``/proc/self/clear_refs``). Writes ``layer_peers.md`` and ``layer_peers.json`` under
``--out``.
"""
import argparse
import dataclasses
import gc
import json
import math
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

import diffsoft
from diffsoft.energies import reference_step_energy
from diffsoft.threads import set_num_threads

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The memory probe (tests/python/memory_probe.py) is test code: it lives with the tests.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from memory_probe import resident_bytes, status_bytes  # noqa: E402
import provenance  # noqa: E402
from step_speed import cantilever, step_params  # noqa: E402
from user_energy import free_pairs  # noqa: E402

F64 = torch.float64
TOL = 1e-8
"""Every method's forward: gradient norm at most TOL times its initial norm (diffsoft's float64 default; 1e-10
is out of reach of an energy-based line search on some of the batch's problems: near ||g|| = 1e-9 their energy's
decrease, ~1e-18, is below its rounding, ~1e-17)."""
BACKWARD_TOL = 1e-10
"""The adjoint solve's relative residual (diffsoft's CG, torchopt's CG; Theseus factors)."""


@dataclasses.dataclass
class Problem:
    """``energy(X, *params) -> (B,)`` for ``X (B, n)`` and params with a leading batch dimension B (B = 1 for a
    single problem); ``residual``: Theseus' own residual ``(B, m)``, or None (then ``grad_x energy``)."""
    name: str
    energy: object
    x0: torch.Tensor
    params: tuple
    batched: bool
    shape: tuple = None  # one problem's unknowns as diffsoft.minimize takes them (sparsity= needs (N, d))
    residual: object = None
    sparsity: torch.Tensor = None
    extra: tuple = ()  # non-tensor arguments after params (the sheet's topology)


def quartic_energy(x, A, b):
    return 0.5 * torch.einsum("bi,bij,bj->b", x, A, x) + 0.25 * (x ** 4).sum(-1) - (b * x).sum(-1)


def batch_energy(x, A, b):
    return quartic_energy(x, A, b) + torch.logsumexp(x, -1)


def quartic(g, n=1000):
    q = torch.randn(n, n, generator=g, dtype=F64) / math.sqrt(n)
    A = (q @ q.T + torch.eye(n, dtype=F64))[None]
    return Problem("quartic", quartic_energy, torch.zeros(1, n, dtype=F64),
                   (A, torch.randn(1, n, generator=g, dtype=F64)), batched=False)


def batch(g, b=256, n=10):
    q = torch.randn(b, n, n, generator=g, dtype=F64) / math.sqrt(n)
    A = q @ q.transpose(1, 2) + torch.eye(n, dtype=F64)
    return Problem("batch", batch_energy, torch.zeros(b, n, dtype=F64),
                   (A, torch.randn(b, n, generator=g, dtype=F64)), batched=True)


def sheet(g, n=40):
    sim = cantilever(n, F64)
    x, v = sim.rest_state
    (x_hat, *rest), x0f = step_params(sim, x, v, None)  # rest: the other StepParams fields, then the topology
    shape = x0f.shape

    def energy(y, x_hat, *rest):  # one problem (B = 1): the step's other parameters have no batch dimension
        return torch.stack([reference_step_energy(yi.reshape(shape), xi.reshape(shape), *rest)
                            for yi, xi in zip(y, x_hat)])
    return Problem("sheet", energy, x0f.reshape(1, -1).clone(), (x_hat.reshape(1, -1).clone(),), batched=False,
                   shape=shape, sparsity=free_pairs(sim), extra=tuple(rest))


def fit_residual(p, pts):
    """Each point's distance to the circle ``p = (cx, cy, r)``: ``(B, K)`` from p ``(B, 3)``, pts ``(B, 2K)``."""
    xy = pts.reshape(len(pts), -1, 2)
    return (xy - p[:, None, :2]).norm(dim=-1) - p[:, 2:]


def fit_energy(p, pts):
    return 0.5 * fit_residual(p, pts).square().sum(-1)


def fit(g, b=64, k=200):
    """Circles fitted to noisy points on half of each circle (noise 2% of the radius): the centroid and the
    mean distance to it start each fit."""
    centre = torch.randn(b, 2, generator=g, dtype=F64)
    radius = 1 + torch.rand(b, 1, generator=g, dtype=F64)
    angle = math.pi * torch.rand(b, k, generator=g, dtype=F64)
    xy = centre[:, None] + radius[:, :, None] * torch.stack([angle.cos(), angle.sin()], -1)
    xy = xy + 0.02 * radius[:, :, None] * torch.randn(b, k, 2, generator=g, dtype=F64)
    mid = xy.mean(1)
    x0 = torch.cat([mid, (xy - mid[:, None]).norm(dim=-1).mean(1, keepdim=True)], 1)
    return Problem("fit", fit_energy, x0, (xy.reshape(b, -1),), batched=True, residual=fit_residual)


PROBLEMS = {"quartic": quartic, "batch": batch, "sheet": sheet, "fit": fit}


# ---- the methods: each returns x* (B, n) as a function of the params, differentiable -------------------------

def run_diffsoft(pb, params, sparse=False, info=False):
    """x* (B, n), or with ``info`` ``(x* as minimize returns it, SolveInfo)``."""
    opts = dict(rtol=TOL, backward_rtol=BACKWARD_TOL, on_failure="raise", max_iter=200, return_info=info)
    if pb.batched:
        return diffsoft.minimize(pb.energy, pb.x0, *params, *pb.extra, batched=True, **opts)
    x0 = pb.x0[0].reshape(pb.shape or pb.x0.shape[1:])
    sparsity = pb.sparsity if sparse else None
    x = diffsoft.minimize(lambda x, *p: pb.energy(x.reshape(1, -1), *p).sum(), x0, *params, *pb.extra,
                          sparsity=sparsity, **opts)
    return x if info else x.reshape(1, -1)


def single(pb):
    """The per-problem energy ``e(x (n,), *params without the batch dimension) -> 0-dim``."""
    return lambda x, *p: pb.energy(x[None], *(q[None] for q in p), *pb.extra)[0]


def derivatives(pb):
    """Per-problem energy, gradient and dense Hessian functions of ``(X (B, n), *params)``, by torch.func (the
    Hessian's rows in chunks where it is large)."""
    from torch.func import grad, hessian, jacrev, vmap
    e = single(pb)
    # forward-over-reverse (torch.func.hessian) is the faster; reverse-over-reverse takes the rows in chunks,
    # which bounds the memory of the sheet's 3,120 rows
    hess = hessian(e) if pb.x0.shape[1] <= 1000 else jacrev(grad(e), chunk_size=128)
    return vmap(e), vmap(grad(e)), vmap(hess)


def dense_newton(pb, params, max_iter=100):
    """Damped Newton on every problem of the batch at once: dense Hessians, Armijo backtracking per problem (up
    to the energy's rounding, without which steps stall near the solution, see :data:`TOL`), a gradient step
    where the Newton direction is no descent direction. Runs without a graph."""
    energy, grad_f, hess_f = derivatives(pb)
    with torch.no_grad():
        x = pb.x0.clone()
        g = grad_f(x, *params)
        g0 = g.norm(dim=1)
        for _ in range(max_iter):
            if (g.norm(dim=1) <= TOL * g0).all():
                return x
            p = -torch.linalg.solve(hess_f(x, *params), g)
            p = torch.where(((g * p).sum(1) < 0)[:, None], p, -g)
            f0, slope = energy(x, *params), (g * p).sum(1)
            rounding = 4 * torch.finfo(x.dtype).eps * f0.abs()
            t = torch.ones(len(x), dtype=x.dtype)
            for _ in range(40):
                xn = x + t[:, None] * p
                ok = energy(xn, *params) <= f0 + 1e-4 * t * slope + rounding
                if ok.all():
                    break
                t = torch.where(ok, t, 0.5 * t)
            x, g = xn, grad_f(xn, *params)
    raise RuntimeError(f"{pb.name}: the dense Newton loop did not converge in {max_iter} iterations")


def newton_cg(pb, params, max_iter=200, cg_max_iter=10_000):
    """Newton-CG on every problem of the batch at once, the algorithm of diffsoft.minimize written in torch:
    Hessian-vector products by double backward, CG to the forcing tolerance ``min(0.5, sqrt(|g| / |g0|)) |g|``,
    stopped at non-positive curvature (truncated Newton), Armijo backtracking as :func:`dense_newton`'s."""
    def energy(x):
        return pb.energy(x, *params, *pb.extra)

    def gradient(x):
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            return torch.autograd.grad(energy(x).sum(), x)[0]

    x = pb.x0.clone()
    g = gradient(x)
    g0 = g.norm(dim=1)
    for _ in range(max_iter):
        gn = g.norm(dim=1)
        if (gn <= TOL * g0).all():
            return x
        with torch.enable_grad():
            xg = x.detach().requires_grad_()
            gx = torch.autograd.grad(energy(xg).sum(), xg, create_graph=True)[0]

        def hvp(v):
            return torch.autograd.grad(gx, xg, v, retain_graph=True)[0].detach()
        forcing = torch.minimum(torch.full_like(gn, 0.5), (gn / g0).sqrt()) * gn
        p, r = torch.zeros_like(x), -g
        d, rr = r.clone(), (r * r).sum(1)
        active = gn > TOL * g0
        for _ in range(cg_max_iter):
            active = active & (rr.sqrt() > forcing)
            if not active.any():
                break
            hd = hvp(d)
            curv = (d * hd).sum(1)
            active = active & (curv > 0)
            alpha = torch.where(active, rr / torch.where(curv > 0, curv, 1.0), 0.0)
            p = p + alpha[:, None] * d
            r = r - alpha[:, None] * hd
            rr_new = (r * r).sum(1)
            d = torch.where(active[:, None], r + (rr_new / rr)[:, None] * d, d)
            rr = torch.where(active, rr_new, rr)
        done = gn <= TOL * g0  # frozen: a gradient step would push a converged problem off its tolerance
        p = torch.where(done[:, None], 0.0, torch.where(((g * p).sum(1) < 0)[:, None], p, -g))
        f0, slope = energy(x).detach(), (g * p).sum(1)
        rounding = 4 * torch.finfo(x.dtype).eps * f0.abs()
        t = torch.ones(len(x), dtype=x.dtype)
        for _ in range(40):
            xn = x + t[:, None] * p
            with torch.no_grad():
                ok = energy(xn) <= f0 + 1e-4 * t * slope + rounding
            if ok.all():
                break
            t = torch.where(ok, t, 0.5 * t)
        x, g = xn.detach(), gradient(xn)
    raise RuntimeError(f"{pb.name}: the Newton-CG loop did not converge in {max_iter} iterations")


def run_torchopt(pb, params, forward=dense_newton):
    import torchopt
    from torch.func import grad, vmap
    e = single(pb)

    def optimality(x, *p):
        return vmap(grad(e))(x, *p)

    solve = torchopt.linear_solve.solve_cg(rtol=BACKWARD_TOL, maxiter=100_000)

    @torchopt.diff.implicit.custom_root(optimality, argnums=tuple(range(1, 1 + len(params))), solve=solve)
    def solver(x0, *p):
        return forward(pb, tuple(q.detach() for q in p))
    return solver(pb.x0, *params)


def theseus_layer(pb, params, unroll=False):
    """The Theseus layer of ``pb`` and its input dict."""
    import theseus as th
    from torch.func import grad
    b, n = pb.x0.shape
    x = th.Vector(tensor=pb.x0.clone(), name="x")
    aux = [th.Variable(p, name=f"p{i}") for i, p in enumerate(params)]

    if pb.residual is not None:
        def err_fn(optim_vars, aux_vars):
            return pb.residual(optim_vars[0].tensor, *(a.tensor for a in aux_vars))
        dim = pb.residual(pb.x0, *params).shape[1]
    else:
        def err_fn(optim_vars, aux_vars):
            p = tuple(a.tensor for a in aux_vars)
            return grad(lambda x: pb.energy(x, *p, *pb.extra).sum())(optim_vars[0].tensor)
        dim = n
    objective = th.Objective(dtype=F64)
    weight = th.ScaleCostWeight(torch.tensor(1.0, dtype=F64))  # its default is float32
    objective.add(th.AutoDiffCostFunction([x], err_fn, dim, cost_weight=weight, aux_vars=aux, name="r"))
    r0 = err_fn([x], aux).detach()
    # Theseus stops when its objective 1/2 |r|^2 (mean over the batch) falls below abs_err_tolerance, or
    # changes by less than that or by rel_err_tolerance: |r| <= TOL |r0|, or stagnation (a fit's minimum).
    abs_tol = 0.5 * (TOL * r0.norm(dim=1)).square().min().item()
    optimizer = th.GaussNewton(objective, th.CholeskyDenseSolver, max_iterations=100 if unroll else 50,
                               abs_err_tolerance=abs_tol, rel_err_tolerance=1e-14)
    layer = th.TheseusLayer(optimizer)
    inputs = {"x": pb.x0.clone(), **{f"p{i}": p for i, p in enumerate(params)}}
    return layer, inputs


def run_theseus(pb, params, unroll=False):
    layer, inputs = theseus_layer(pb, params, unroll)
    mode = "unroll" if unroll else "implicit"
    sol, info = layer.forward(inputs, optimizer_kwargs={"backward_mode": mode, "track_best_solution": False})
    import theseus as th
    failed = sum(s != th.NonlinearOptimizerStatus.CONVERGED for s in info.status)
    if failed:
        raise RuntimeError(f"{pb.name}: Theseus did not converge on {failed} of {len(info.status)} problems")
    return sol["x"]


METHODS = {
    "diffsoft": lambda pb, p: run_diffsoft(pb, p),
    "diffsoft sparse": lambda pb, p: run_diffsoft(pb, p, sparse=True),
    "theseus": lambda pb, p: run_theseus(pb, p),
    "theseus unroll": lambda pb, p: run_theseus(pb, p, unroll=True),
    "torchopt": run_torchopt,
    "torchopt newton-cg": lambda pb, p: run_torchopt(pb, p, newton_cg),
}
APPLIES = {"diffsoft sparse": {"sheet"}, "theseus unroll": {"fit"}}


# ---- the measures ---------------------------------------------------------------------------------------------

def loss_weights(pb, g):
    return torch.randn(pb.x0.shape, generator=g, dtype=F64)


def reference_loss(pb, params, w, polish=2):
    """``L`` at the solution: diffsoft's, then ``polish`` undamped Newton steps on dense Hessians. A line
    search stops where the energy's changes fall below its rounding (the gradient near 1e-9 here); Newton's
    steps without one take the gradient down to its own rounding, so that central differences of ``L`` are
    accurate to ~1e-10 relative."""
    _, grad_f, hess_f = derivatives(pb)
    with torch.no_grad():
        x = run_diffsoft(pb, params, sparse=pb.sparsity is not None)
        for _ in range(polish):
            x = x - torch.linalg.solve(hess_f(x, *params), grad_f(x, *params))
    return (w * x).sum().item(), x


def directions(pb, g, count=2):
    """Random directions in parameter space, each entry scaled by its parameter's root mean square."""
    out = []
    for _ in range(count):
        out.append(tuple(torch.randn(p.shape, generator=g, dtype=F64) * p.square().mean().sqrt() for p in pb.params))
    return out


def central_differences(pb, w, dirs, eps=1e-5):
    out = []
    for d in dirs:
        plus = reference_loss(pb, tuple(p + eps * di for p, di in zip(pb.params, d)), w)[0]
        minus = reference_loss(pb, tuple(p - eps * di for p, di in zip(pb.params, d)), w)[0]
        out.append((plus - minus) / (2 * eps))
    return out


def forward_backward(method, pb, w):
    params = tuple(p.detach().clone().requires_grad_() for p in pb.params)
    t0 = time.perf_counter()
    x = method(pb, params)
    t1 = time.perf_counter()
    grads = torch.autograd.grad((w * x).sum(), params)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, x.detach(), grads


def peak_memory(method, pb, w):
    """The rise of the resident set's high-water mark over one forward and backward, in bytes (None where the
    high-water mark cannot be reset)."""
    base = resident_bytes()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    forward_backward(method, pb, w)
    peak = status_bytes("VmHWM")
    return None if peak is None or base is None else max(peak - base, 0)


def measure(pb, names, repeat, g):
    w = loss_weights(pb, g)
    _, x_ref = reference_loss(pb, pb.params, w)
    dirs = directions(pb, g)
    cd = central_differences(pb, w, dirs)
    rows = {name: {"forward": math.inf, "backward": math.inf} for name in names}
    for _ in range(repeat):
        for name in names:
            try:
                f, b, x, grads = forward_backward(METHODS[name], pb, w)
            except Exception as e:  # a peer that fails on a problem is reported, not hidden
                rows[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
                continue
            row = rows[name]
            if "error" in row:
                continue
            row["forward"], row["backward"] = min(row["forward"], f), min(row["backward"], b)
            row["x_error"] = ((x - x_ref).norm() / x_ref.norm()).item()
            dd = [sum((gi * di).sum() for gi, di in zip(grads, d)).item() for d in dirs]
            row["grad_error"] = max(abs(a - c) / abs(c) for a, c in zip(dd, cd))
    for name in names:
        if "error" not in rows[name]:
            gc.collect()
            rows[name]["peak_bytes"] = peak_memory(METHODS[name], pb, w)
    return rows


def autograd_floor(pb, repeat, calls=50):
    """A lower bound on diffsoft's forward and backward (s): the autograd calls its ``SolveInfo`` counts (products,
    an energy and gradient per Newton iterate, an energy per line-search trial; the adjoint's products and a
    gradient at x*), each kind timed alone at x0, best of ``repeat`` rounds of ``calls``."""
    params = tuple(p.detach().clone().requires_grad_() for p in pb.params)
    x, info = run_diffsoft(pb, params, info=True)
    x.sum().backward()
    if pb.batched:
        energy, x0 = pb.energy, pb.x0
    else:
        energy, x0 = (lambda y, *q: pb.energy(y.reshape(1, -1), *q).sum()), pb.x0[0].reshape(pb.shape or (-1,))

    def with_graph():
        y = x0.detach().requires_grad_()
        (gy,) = torch.autograd.grad(energy(y, *params, *pb.extra).sum(), y, create_graph=True)
        return gy, y
    gy, y = with_graph()
    v = torch.randn_like(gy)

    def value():
        with torch.no_grad():
            return energy(x0, *params, *pb.extra)

    def best(f):
        out = math.inf
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            out = min(out, (time.perf_counter() - t0) / calls)
        return out
    t_graph, t_product, t_value = best(with_graph), best(lambda: torch.autograd.grad(gy, y, v, retain_graph=True)), \
        best(value)
    return {"forward": info.hvp_count * t_product + (info.iterations + 1) * t_graph + info.line_search_steps * t_value,
            "backward": info.backward_cg_iterations * t_product + t_graph,
            "counts": {"products": info.hvp_count, "iterations": info.iterations,
                       "line_search": info.line_search_steps, "adjoint_products": info.backward_cg_iterations}}


def floor_table(pb_names, repeat, peer="torchopt newton-cg"):
    """Per problem (seed 0): diffsoft's forward + backward, its autograd floor and ``peer``'s, side by side."""
    lines = ["| problem | diffsoft ms (measured) | its autograd calls alone, ms (floor) | products, iterations, "
             "line-search trials, adjoint products | " + peer + " ms | a third of it | 3x reachable at zero "
             "overhead? |", "| --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for prob in pb_names:
        g = torch.Generator().manual_seed(0)
        pb = PROBLEMS[prob](g)
        w = loss_weights(pb, g)
        ours, theirs = math.inf, math.inf
        for name in ("diffsoft", peer):  # warm-up
            forward_backward(METHODS[name], pb, w)
        for _ in range(repeat):
            f, b, _, _ = forward_backward(METHODS["diffsoft"], pb, w)
            ours = min(ours, f + b)
            f, b, _, _ = forward_backward(METHODS[peer], pb, w)
            theirs = min(theirs, f + b)
        floor = autograd_floor(pb, repeat)
        total = floor["forward"] + floor["backward"]
        c = floor["counts"]
        lines.append(f"| {prob} | {1e3 * ours:.1f} | {1e3 * total:.1f} | {c['products']}, {c['iterations']}, "
                     f"{c['line_search']}, {c['adjoint_products']} | {1e3 * theirs:.1f} | {1e3 * theirs / 3:.1f} | "
                     f"{'yes' if total <= theirs / 3 else 'no'} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def table(results):
    lines = ["| problem | unknowns | method | forward ms | backward ms | total vs diffsoft | gradient error "
             "(vs central differences) | forward's distance to the reference | peak memory MB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for prob, rows in results["problems"].items():
        ours = [r["forward"] + r["backward"] for n, r in rows.items() if n.startswith("diffsoft") and "error" not in r]
        best = min(ours, default=None)
        for name, r in rows.items():
            if "error" in r:
                lines.append(f"| {prob} | {results['unknowns'][prob]:,} | {name} | failed: {r['error']} | | | | | |")
                continue
            total = r["forward"] + r["backward"]
            ratio = "" if best is None else f"{total / best:.1f}x"
            mem = "" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / 2 ** 20:.0f}"
            lines.append(f"| {prob} | {results['unknowns'][prob]:,} | {name} | {1e3 * r['forward']:.1f} | "
                         f"{1e3 * r['backward']:.1f} | {ratio} | {r['grad_error']:.1e} | {r['x_error']:.1e} | {mem} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=sorted(PROBLEMS), default=list(PROBLEMS))
    ap.add_argument("--methods", nargs="*", choices=sorted(METHODS), default=list(METHODS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "peers"))
    ap.add_argument("--floor", action="store_true",
                    help="instead: diffsoft's autograd floor beside Newton-CG in torch (layer_floor.md)")
    args = ap.parse_args()
    set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    if args.floor:
        md = floor_table(args.only, args.repeat)
        v = provenance.versions("torchopt")
        header = (f"`python benchmarks/layer_peers.py {' '.join(sys.argv[1:])}` at {v['diffsoft_commit']}; torch "
                  f"{v['torch']}, torchopt {v['torchopt']}; {args.threads} thread(s), best of {args.repeat}, "
                  f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n\n")
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "layer_floor.md"), "w") as f:
            f.write(header + md + "\n")
        print(header + md)
        return
    results = {"command": "python benchmarks/layer_peers.py " + " ".join(sys.argv[1:]),
               "versions": provenance.versions("theseus", "torchopt"),
               "threads": args.threads, "repeat": args.repeat, "problems": {}, "unknowns": {},
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for prob in args.only:
        pb = PROBLEMS[prob](g)
        names = [n for n in args.methods if prob in APPLIES.get(n, {prob})]
        results["unknowns"][prob] = pb.x0.numel()
        results["problems"][prob] = measure(pb, names, args.repeat, g)
        print(table({**results, "problems": {prob: results["problems"][prob]}}).splitlines()[-len(names):],
              flush=True)
    os.makedirs(args.out, exist_ok=True)
    md = table(results)
    v = results["versions"]
    header = (f"`{results['command']}` at {v['diffsoft_commit']}; torch {v['torch']}, theseus-ai "
              f"{v['theseus']}, torchopt {v['torchopt']}; {args.threads} thread(s), best of {args.repeat}, "
              f"{results['date']}.\n\n")
    with open(os.path.join(args.out, "layer_peers.md"), "w") as f:
        f.write(header + md + "\n")
    with open(os.path.join(args.out, "layer_peers.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(header + md)


if __name__ == "__main__":
    main()
