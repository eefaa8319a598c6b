"""The step's solver in torch ops: Newton and the implicit backward on any device (``Simulator(backend="torch")``).

The C++ path (``_C.minimize`` with the fused kernels and sparse factorizations) runs on CPU tensors only. This
module solves the same step problem, ``y* = argmin_y E(y; theta)`` with ``E`` the step energy of
:mod:`diffsoft.step`, with nothing but batched torch ops, so that it runs wherever torch does, and the CPU test
suite exercises every line of it.

- Derivatives: the gradient and the Hessian blocks (one per element, muscle, free vertex and user term row) of
  :func:`diffsoft.term_blocks.gradient_and_hessian`, by autograd of the reference energy's terms (a
  :class:`~diffsoft.term_blocks.BlockHessian`); energies of :func:`diffsoft.energies.reference_step_energy`, one
  per creature, for the line search.
- Linear solves, per creature of the batch:

  * ``"cholesky"`` (creature-sized bodies): each creature's dense ``(n, n)`` Hessian is scatter-added from the
    blocks and the batch is factored by one ``torch.linalg.cholesky_ex``; Newton takes exact steps. A creature
    whose Hessian is not positive definite at an iterate takes truncated CG's step there, as on the C++ path
    (on the iterations that read the host: every ``check_every``), else a Jacobi-scaled gradient step, which
    the record counts (``fallback_steps``).
  * ``"block_jacobi_cg"`` (larger bodies): CG on the blocks' Hessian products, preconditioned by each free
    vertex's ``d x d`` diagonal block, truncated at non-positive curvature (inexact Newton, as the C++ CG).

- Line search: one Armijo trial per creature and Newton iteration, fixed-shape masks, no host reads. A
  creature whose trial is rejected stays put, its step size shrinks, and the next iteration tries again from
  the same point; after an accepted step the size doubles back towards 1. Rejections are counted as line
  search steps; ``ls_max_iter`` consecutive ones freeze the creature as failed.
- Host synchronisation: per-creature convergence, failure and counters stay on the device. The host reads
  whether every creature is done every ``check_every`` Newton iterations (1 on CPU, where a read costs
  nothing; :data:`CHECK_EVERY_OFF_CPU` elsewhere), the first read also whether any creature starts stationary
  (where one is at a saddle, a step along its negative curvature follows: :func:`_leave_saddles`, with reads of
  its own), once at the end for the record, and, in the backward,
  once for the record (and a second time only if some creature's Hessian at ``y*`` is not positive
  definite). Truncated CG reads its convergence every ``check_every`` CG iterations too.
- Backward (implicit function theorem; the derivation is above :meth:`ImplicitStep.backward`): the adjoint
  system at ``y*`` by the same kind of solve, then ONE vector-Jacobian product through the gradient with respect
  to the parameters (the gradient's graph, from autograd of the reference's terms).
"""
import dataclasses
import math
import typing
import warnings
import weakref

import torch

from ._compat import own_graphs
from ._extension import ConvergenceError, SolveInfo
from ._minimize import _options, check_backward_mode, default_backward_rtol, refuse_transforms, unsolved_message
from .energies import step_terms, term_rows
from .step import unpack
from .term_blocks import gradient_and_hessian

CHECK_EVERY_OFF_CPU = 4
"""Newton (and CG) iterations between host reads of "is every creature done?" on devices other than the CPU:
each read drains the device's queue; up to this many iterations are spent on creatures already done."""

DENSE_MAX_UNKNOWNS = 1000
"""``solver="auto"``: the dense batched Cholesky up to this many unknowns per creature (the Hessian costs
``B n^2`` memory and ``B n^3 / 3`` flops), block-Jacobi CG above. A judgement, not a measured crossover."""

LINEAR_SOLVERS = ("cholesky", "block_jacobi_cg")


@dataclasses.dataclass(frozen=True)
class Options:
    """The solver options of :class:`~diffsoft.simulator.Simulator` (``solver_options``) as this backend uses
    them; ``linear_solver`` is one of :data:`LINEAR_SOLVERS`."""
    linear_solver: str
    rtol: float
    atol: float
    max_iter: int
    cg_rtol: float
    cg_max_iter: typing.Optional[int]
    backward_rtol: float
    backward_max_iter: typing.Optional[int]
    on_failure: str
    keep_factor: bool
    check_every: int
    ls_c1: float = 1e-4
    ls_shrink: float = 0.5
    ls_max_iter: int = 30


def linear_solver_for(solver, unknowns):
    """The linear solver of :class:`~diffsoft.simulator.Simulator`'s ``solver`` option on this backend:
    ``"direct"`` -> ``"cholesky"``, ``"cg"`` -> ``"block_jacobi_cg"``, ``"auto"`` -> by size
    (:data:`DENSE_MAX_UNKNOWNS` unknowns per creature)."""
    if solver == "direct" or (solver == "auto" and unknowns <= DENSE_MAX_UNKNOWNS):
        return "cholesky"
    if solver in ("cg", "auto"):
        return "block_jacobi_cg"
    raise ValueError(f"solver must be 'auto', 'direct' or 'cg', got {solver!r}")


def solve_step(params, top, linear_solver, rtol=None, atol=0.0, max_iter=100, cg_rtol=0.5, cg_max_iter=None,
               backward_rtol=None, backward_max_iter=None, on_failure="warn", keep_factor=False, check_every=None):
    """Solves one step problem: ``y* = argmin_y E(y; params)``, differentiable with respect to every tensor of
    ``params`` that requires grad.

    Args:
        params: the step's :class:`~diffsoft.step.StepParams`; ``x_hat`` ``(F, d)`` or ``(B, F, d)``.
        top: its :class:`~diffsoft.step.StepTopology`.
        linear_solver: one of :data:`LINEAR_SOLVERS` (see :func:`linear_solver_for`).
        rtol, atol: per creature, converged when ``|grad E| <= max(atol, rtol |grad E(start)|)``;
            ``rtol=None``: 1e-8 (float64) or 1e-4 (float32).
        max_iter: Newton iterations.
        cg_rtol, cg_max_iter: the forcing term's cap and the iteration cap of the truncated CG (block-Jacobi
            CG only; default cap: the unknowns per creature).
        backward_rtol, backward_max_iter: the adjoint solve's relative residual (None: 1e-10 in float64, 1e-5
            in float32), and CG's iteration cap
            (default: 10 x the unknowns per creature).
        on_failure: ``"warn"`` or ``"raise"`` (:class:`diffsoft.ConvergenceError` with ``.info``), forward
            and backward alike.
        keep_factor: keep what Newton's last evaluation made at ``y*`` (the Hessian blocks with their float64
            Cholesky factor, or with the block-Jacobi preconditioner) for the backward, which then skips that
            factorization (it still evaluates the gradient at ``y*`` once, for the vector-Jacobian product).
        check_every: Newton and CG iterations between host reads (default 1 on CPU, else
            :data:`CHECK_EVERY_OFF_CPU`).

    Returns:
        ``(y*, info)``: ``y*`` shaped like ``params.x_hat``, and a :class:`diffsoft.SolveInfo` with the C++
        path's meanings: ``iterations`` counts Newton iterations (a rejected line-search trial is one: the
        creature retries from the same point); ``line_search_steps`` the trials of all creatures;
        ``factorizations`` batched Cholesky factorizations; ``fallback_steps`` the (creature, iteration) pairs
        where the Hessian was not positive definite and a Jacobi-scaled gradient step was taken instead of
        Newton's. Which linear solver ran: ``factorizations > 0`` for ``"cholesky"``, ``cg_iterations`` for
        ``"block_jacobi_cg"``. The ``backward_*`` fields are filled in by the backward.
    """
    if linear_solver not in LINEAR_SOLVERS:
        raise ValueError(f"linear_solver must be one of {LINEAR_SOLVERS}, got {linear_solver!r}")
    if on_failure not in ("warn", "raise"):
        raise ValueError(f'on_failure must be "warn" or "raise", got {on_failure!r}')
    if check_every is not None and (isinstance(check_every, bool) or not isinstance(check_every, int)
                                    or check_every < 1):
        raise ValueError(f"check_every must be None or an integer >= 1, got {check_every!r}")
    if backward_rtol is None:
        backward_rtol = default_backward_rtol(params.x_hat.dtype)
    # The same checks, and errors naming the option, as diffsoft.minimize's.
    _options(batched=True, rtol=rtol, atol=atol, max_iter=max_iter, cg_rtol=cg_rtol, cg_max_iter=cg_max_iter,
             backward_rtol=backward_rtol, backward_max_iter=backward_max_iter, ls_c1=Options.ls_c1,
             ls_shrink=Options.ls_shrink, ls_max_iter=Options.ls_max_iter, raise_on_failure=on_failure == "raise",
             keep_factor=bool(keep_factor))
    dtype = params.x_hat.dtype
    if rtol is None:
        rtol = 1e-8 if dtype == torch.float64 else 1e-4
    if check_every is None:
        check_every = 1 if params.x_hat.device.type == "cpu" else CHECK_EVERY_OFF_CPU
    options = Options(linear_solver=linear_solver, rtol=float(rtol), atol=float(atol), max_iter=int(max_iter),
                      cg_rtol=float(cg_rtol), cg_max_iter=cg_max_iter, backward_rtol=float(backward_rtol),
                      backward_max_iter=backward_max_iter, on_failure=on_failure, keep_factor=bool(keep_factor),
                      check_every=int(check_every))
    refuse_transforms("diffsoft.torch_backend.solve_step", params)
    squeeze = params.x_hat.dim() == 2
    if squeeze:  # one batch layout inside; the unsqueezes are differentiable, outside the Function
        act = params.activation
        params = params._replace(x_hat=params.x_hat[None], x0=params.x0[None], x0_free=params.x0_free[None],
                                 activation=None if act is None else act.reshape(1, -1))
    info = SolveInfo()
    if torch.is_inference_mode_enabled():
        # As diffsoft.minimize: Newton's derivatives are autograd's (diffsoft.term_blocks), which inference mode
        # turns off and whose tensors cannot enter autograd; copies made outside it can, and nothing can be
        # differentiated under inference mode anyway (hence no_grad for the result).
        with torch.inference_mode(False):
            flat = [t.clone() if isinstance(t, torch.Tensor) else t for t in params.flat()]
            with torch.no_grad():
                y = ImplicitStep.apply(options, info, top, *flat)
    else:
        y = ImplicitStep.apply(options, info, top, *params.flat())
    return (y[0] if squeeze else y), info


class ImplicitStep(torch.autograd.Function):
    """Forward: Newton on the step problem, no graph. Backward: the adjoint solve at ``y*`` and one
    vector-Jacobian product of the closed-form gradient with respect to the parameters."""

    @staticmethod
    def forward(ctx, options, info, top, *tensors):
        # Values only: Newton's derivatives need no graph to the parameters.
        p, _ = unpack((*[t.detach() if isinstance(t, torch.Tensor) else t for t in tensors], top))
        with own_graphs():
            y, kept = _newton(p, top, options, info)
        ctx.save_for_backward(y, *tensors)
        ctx.options, ctx.info, ctx.top, ctx.kept = options, info, top, kept
        return y.clone()  # the caller's to change in place (x1 += 1): not the y* the backward keeps

    # Derivation. At the solution g(y*, theta) = grad_y E(y*, theta) = 0 for every theta nearby, so
    # H dy*/dtheta + dg/dtheta = 0 with H = d2E/dy2 at y*. For a loss L, dL/dtheta = dL/dy* . dy*/dtheta
    # = -(H^-1 dL/dy*) . dg/dtheta = -lambda . dg/dtheta with H lambda = dL/dy* (H is symmetric): one adjoint
    # solve, then one first-order vector-Jacobian product of the closed-form gradient g with respect to theta
    # (autograd through gradient_and_hessian's graph), with lambda as the vector.
    @staticmethod
    def backward(ctx, dl_dy):
        check_backward_mode(dl_dy)  # first order only: grad mode is off from here on
        y, *tensors = ctx.saved_tensors
        top, options, info = ctx.top, ctx.options, ctx.info
        wanted = [i for i in range(len(tensors)) if ctx.needs_input_grad[3 + i]]
        grads = [None] * len(tensors)
        if not wanted:
            return (None, None, None, *grads)
        kept, ctx.kept = ctx.kept, None  # the factor's memory goes with the backward
        with torch.enable_grad(), own_graphs():
            # One evaluation at y*: its gradient's graph gives the vector-Jacobian product, its Hessian blocks
            # (used without a graph) the adjoint system, unless the forward kept its own.
            leaves = [t if t is None else t.detach().requires_grad_(i in wanted) for i, t in enumerate(tensors)]
            g, hess = gradient_and_hessian(y, unpack((*leaves, top))[0], top, hessian=kept is None)
        lam = _adjoint(y, top, hess, dl_dy, options, info, kept)
        vjp = torch.autograd.grad(g, [leaves[i] for i in wanted], lam, allow_unused=True)
        for i, v in zip(wanted, vjp):
            grads[i] = None if v is None else -v
        return (None, None, None, *grads)


# ----------------------------------------------------------------------------------------------------------------
# Newton


def _newton(p, top, o, info):
    """Newton on a batch ``(B, F, d)``; returns ``y*`` and what the backward may keep (or None)."""
    x_hat = p.x_hat.detach()
    b, f, d = x_hat.shape
    n = f * d
    dtype, device = x_hat.dtype, x_hat.device
    # The C++ Newton's round-off allowance in the Armijo test, relative to the energy's scale: the sum of its
    # rows' magnitudes, since a total of terms that nearly cancel rounds like its terms, not like itself.
    e_noise = 16 * torch.finfo(dtype).eps

    def energy(y):
        return _energy_and_scale(y, p, top)

    # Each creature starts from the lower-energy of the inertial prediction and x0 (NaN at the prediction, an
    # inverted element or an overflow, selects x0), as the C++ path does.
    start = p.x0_free.detach().expand_as(x_hat)
    (e_hat, s_hat), (e_start, s_start) = energy(x_hat), energy(start)
    better = e_hat <= e_start
    y = torch.where(better[:, None, None], x_hat, start).clone()
    e, scale = torch.where(better, e_hat, e_start), torch.where(better, s_hat, s_start)
    g, hess = gradient_and_hessian(y, p, top)
    g = g.reshape(b, n)
    g_norm = _row_norm(g)
    finite_start = torch.isfinite(e) & torch.isfinite(g_norm)
    g0_norm = g_norm
    threshold = torch.clamp_min(g_norm * o.rtol, o.atol)
    # Why a creature stopped: 0 still going or converged, 1 not finite at the start, 2 gradient not finite,
    # 3 line search exhausted. Counters per creature; all on the device until the end.
    reason = torch.where(finite_start, 0, 1).to(torch.int8)
    failed = ~finite_start
    done = failed | (g_norm <= threshold)
    counts = torch.zeros(2, dtype=torch.long, device=device)  # line-search trials, gradient fallbacks
    still = done & ~failed
    # One read of the host for both: whether a creature starts stationary (a saddle there would be returned as
    # a minimum), and whether every one is done (the loop's first check, unless a step off a saddle moved one)
    any_still, all_done = torch.stack([still.any(), done.all()]).tolist()
    if any_still:
        moved = _leave_saddles(y, e, scale, g, hess, still, p, top, o, energy, counts)
        if moved is not None:
            y, e, scale = moved
            g, hess = gradient_and_hessian(y, p, top)
            g = g.reshape(b, n)
            g_norm = _row_norm(g)
            g0_norm = g_norm
            threshold = torch.clamp_min(g_norm * o.rtol, o.atol)
            done = failed | (g_norm <= threshold)
            all_done = None
    step = torch.ones(b, dtype=dtype, device=device)
    rejections = torch.zeros(b, dtype=torch.long, device=device)
    fail_iteration = torch.full((b,), -1, dtype=torch.long, device=device)
    iterations, factorizations, cg_iterations = 0, 0, 0
    if o.linear_solver == "cholesky":
        workspace = (x_hat.new_empty(b, n * n), x_hat.new_empty(b, n, n).mT,
                     torch.empty(b, dtype=torch.int32, device=device))
    for it in range(o.max_iter):
        if it % o.check_every == 0 and (bool(done.all()) if it or all_done is None else all_done):
            break
        iterations += 1
        active = ~done
        # The forcing term of the C++ Newton: min(cg_rtol, sqrt(|g| / |g0|)).
        eta = torch.clamp_max(torch.sqrt(g_norm / torch.where(active, g0_norm, torch.ones_like(g0_norm))), o.cg_rtol)
        if o.linear_solver == "cholesky":
            direction, pd = _cholesky_direction(hess, top, g, b, n, workspace)
            factorizations += 1
            indefinite = active & ~pd
            # As the C++ Newton, by truncated CG where H is not positive definite (found on the iterations that
            # check on the host anyway; the others take the scaled gradient step below)
            if it % o.check_every == 0 and bool(indefinite.any()):
                cg = _cg(_hessian_product(hess, b, f, d), -g, eta, o.cg_max_iter or n,
                         _block_jacobi(hess, top, b, f, d), indefinite, truncate=True, check_every=o.check_every)
                direction = torch.where(indefinite[:, None], cg.x, direction)
                pd = pd | indefinite
                cg_iterations += cg.iterations
        else:
            cg = _cg(_hessian_product(hess, b, f, d), -g, eta, o.cg_max_iter or n, _block_jacobi(hess, top, b, f, d),
                     active, truncate=True, check_every=o.check_every)
            direction, pd = cg.x, torch.ones_like(active)
            cg_iterations += cg.iterations
        slope = (g * direction).sum(1)
        # A direction without descent (round-off in an ill-conditioned solve) falls back to the scaled gradient.
        descent = slope < 0
        direction = torch.where(descent[:, None], direction, -g / _scale(hess, b, n))
        slope = (g * direction).sum(1)
        counts[1] += (active & ~(pd & descent)).sum()

        trial = y + (step[:, None] * direction).view(b, f, d)
        e_trial, s_trial = energy(trial)
        counts[0] += active.sum()
        ok = active & torch.isfinite(e_trial) & (e_trial <= e + o.ls_c1 * step * slope + e_noise * scale)
        y = torch.where(ok[:, None, None], trial, y)
        e, scale = torch.where(ok, e_trial, e), torch.where(ok, s_trial, scale)
        rejections = torch.where(ok, 0, rejections + active.long())
        step = torch.where(ok, torch.clamp_max(step / o.ls_shrink, 1.0), torch.where(active, step * o.ls_shrink, step))
        stuck = active & (rejections >= o.ls_max_iter)

        g, hess = gradient_and_hessian(y, p, top)
        g = g.reshape(b, n)
        g_norm = _row_norm(g)
        not_finite = active & ~torch.isfinite(g_norm)
        newly = (stuck | not_finite) & ~failed
        reason = torch.where(newly, torch.where(not_finite, 2, 3).to(torch.int8), reason)
        fail_iteration = torch.where(newly, it, fail_iteration)
        failed = failed | newly
        done = done | failed | (g_norm <= threshold)

    kept = None
    if o.keep_factor:
        # Newton's last evaluation is at y* (for every creature: the frozen ones were re-evaluated where they
        # stand); its blocks and their factor or preconditioner spare the backward that work.
        if o.linear_solver == "cholesky":  # float64, as the backward's solve (see _adjoint)
            L, status = torch.linalg.cholesky_ex(_assemble(hess, top, b, n).double())
            kept = (hess, L, status == 0)
            factorizations += 1
        else:
            kept = (hess, _block_jacobi(hess, top, b, f, d))
    _record_forward(info, o, iterations, factorizations, cg_iterations, counts, e, g_norm, g0_norm, threshold,
                    reason, failed, fail_iteration, b)
    return y, kept


def _leave_saddles(y, e, scale, g, hess, still, p, top, o, energy, counts):
    """The C++ Newton's step off a stationary start (``newton.cpp``): for the creatures ``still`` (B,) whose
    Hessian is not positive definite there (a saddle or a maximum), a step along a direction of negative
    curvature (:func:`_negative_curvature`) that lowers the energy; its trials are added to ``counts[0]``.
    Returns ``(y, e, scale)`` after it, or None where no creature moved."""
    b, f, d = y.shape
    n = f * d
    if o.linear_solver == "cholesky":  # the factorization says where H is positive definite
        _, status = torch.linalg.cholesky_ex(_assemble(hess, top, b, n))
        still = still & (status != 0)
    if not bool(still.any()):
        return None
    direction = _negative_curvature(_hessian_product(hess, b, f, d), still, g, min(o.cg_max_iter or n, n))
    has = _row_norm(direction) > 0
    if not bool(has.any()):
        return None
    direction = torch.where(((g * direction).sum(1) > 0)[:, None], -direction, direction)
    length = _row_norm(y.reshape(b, n)).clamp_min(1.0) / torch.where(has, _row_norm(direction), torch.ones_like(e))
    direction = (direction * length[:, None]).view(b, f, d)
    e_noise = 16 * torch.finfo(y.dtype).eps
    # Newton's trial steps from the shortest up (as many as the C++ Newton's escape_trials); the last of the first
    # run of decreases is taken.
    trials = min(o.ls_max_iter, 1 + math.ceil(math.log(torch.finfo(y.dtype).eps) / math.log(o.ls_shrink)))
    step = torch.full_like(e, o.ls_shrink ** (trials - 1))
    growing, dipped = has.clone(), torch.zeros_like(has)
    start, noise = y, e_noise * scale
    for _ in range(trials):
        if not bool(growing.any()):
            break
        trial = start + step[:, None, None] * direction
        e_trial, s_trial = energy(trial)
        counts[0] += growing.sum()
        lower = growing & torch.isfinite(e_trial) & (e_trial < e - noise)
        y = torch.where(lower[:, None, None], trial, y)
        e, scale = torch.where(lower, e_trial, e), torch.where(lower, s_trial, scale)
        growing = growing & (lower | ~dipped)
        dipped = dipped | lower
        step = step / o.ls_shrink
    return (y, e, scale) if bool(dipped.any()) else None


def _negative_curvature(apply, rows, like, max_iter):
    """The C++ Newton's ``negative_curvature`` (``newton.cpp``): per row of ``rows`` (B,), the first CG search
    direction on a fixed right-hand side with negative curvature beyond round-off; zero rows where none is met
    before CG converges or within ``max_iter`` products."""
    n = like.shape[1]
    eps = 1e-10 if like.dtype == torch.float64 else 1e-4
    b = (torch.cos(torch.arange(n, dtype=like.dtype, device=like.device) * 2.4 + 0.3) + 1.5)[None]
    r = b.expand_as(like) * rows[:, None].to(like.dtype)
    p, rr = r.clone(), (r * r).sum(1)
    b_norm = rr.sqrt()
    found, done = torch.zeros_like(like), ~rows
    for _ in range(max_iter):
        if bool(done.all()):
            break
        ap = apply(p)
        pap = (p * ap).sum(1)
        neg = (pap < -eps * _row_norm(p) * _row_norm(ap)) & ~done
        found = torch.where(neg[:, None], p, found)
        done = done | neg | (pap <= 0)
        alpha = torch.where(done, torch.zeros_like(pap), rr / torch.where(done, torch.ones_like(pap), pap))
        r = r - alpha[:, None] * ap
        rr_next = (r * r).sum(1)
        done = done | (rr_next.sqrt() <= eps * b_norm)
        p = r + (rr_next / torch.where(rr > 0, rr, torch.ones_like(rr)))[:, None] * p
        rr = rr_next
    return found


def _energy_and_scale(y, p, top):
    """Per creature, the step energy (the reference's, :func:`~diffsoft.energies.reference_step_energy`) and the
    sum of its terms' rows' magnitudes (the scale of its round-off)."""
    x = top.full_positions(y, p.x0)
    e = scale = 0
    for term in step_terms(top):
        rows = term.energy(term_rows(term, y, x, top), p, top)
        e, scale = e + rows.sum(-1), scale + rows.abs().sum(-1)
    return e, scale


def _record_forward(info, o, iterations, factorizations, cg_iterations, counts, e, g_norm, g0_norm, threshold,
                    reason, failed, fail_iteration, b):
    """The record, from one host read of the device state; raises or warns as ``minimize`` does."""
    ok = (g_norm <= threshold) & ~failed
    fields = dict(ok=ok, reason=reason, fail_it=fail_iteration, counts=counts, energy=e.sum()[None],
                  g_norm=torch.nan_to_num(g_norm, nan=float("inf")), g0_norm=g0_norm, threshold=threshold)
    # One transfer (float64 holds the flags and counts exactly).
    flat = torch.cat([t.to(torch.float64).reshape(-1) for t in fields.values()]).tolist()
    host, at = {}, 0
    for name, t in fields.items():
        host[name], at = flat[at:at + t.numel()], at + t.numel()
    host["ok"] = [bool(v) for v in host["ok"]]
    for name in ("reason", "fail_it", "counts"):
        host[name] = [int(v) for v in host[name]]
    host["energy"] = host["energy"][0]
    if 1 in host["reason"]:
        bad = [i for i, r in enumerate(host["reason"]) if r == 1]
        raise ValueError(f"energy or its gradient is not finite at x0 (problem(s) {_names(bad)})")
    info.converged = all(host["ok"])
    info.iterations = iterations
    info.line_search_steps, info.fallback_steps = host["counts"]
    info.cg_iterations = info.hvp_count = cg_iterations
    info.factorizations = factorizations
    info.energy = host["energy"]
    info.grad_norm, info.grad_norm_initial = max(host["g_norm"]), max(host["g0_norm"])
    info.problem_converged = host["ok"]
    why = []
    for code, text in ((2, "the gradient is not finite (Newton iteration {it}) for problem(s) {who}"),
                       (3, f"the line search found no decrease of the energy after {o.ls_max_iter} trials "
                           f"(Newton iteration {{it}}) for problem(s) {{who}}")):
        rows = [i for i, r in enumerate(host["reason"]) if r == code]
        if rows:
            why.append(text.format(it=max(host["fail_it"][i] for i in rows), who=_names(rows)))
    unfinished = [i for i in range(b) if not host["ok"][i] and host["reason"][i] == 0]
    if unfinished:
        ratio = max(host["g_norm"][i] / max(host["threshold"][i], 1e-300) for i in unfinished)
        why.append(f"max_iter = {o.max_iter} Newton iterations reached with the gradient norm at {ratio:.3g} x "
                   f"its tolerance for problem(s) {_names(unfinished)}")
    note = ""
    if info.fallback_steps:
        note = (f" ({info.fallback_steps} Newton step(s) replaced by scaled gradient steps where the Hessian was "
                f"not positive definite or its step not a descent direction)")
    info.message = ("converged" if info.converged else "; ".join(why)) + note
    if not info.converged:
        if o.on_failure == "raise":
            error = ConvergenceError(f"Newton did not converge: {info.message}")
            error.info = info
            raise error
        warnings.warn(f"diffsoft (torch backend) did not converge: {info.message}", RuntimeWarning, stacklevel=4)


# ----------------------------------------------------------------------------------------------------------------
# The backward's adjoint solve


def _adjoint(y, top, hess, dl_dy, o, info, kept):
    """``lambda`` with ``H(y*) lambda = dL/dy*`` per creature (``(B, F, d)``), ``H`` from the blocks ``hess`` (or
    the forward's, ``kept``), and the record's backward fields.

    The Cholesky path solves in float64 whatever the working dtype, from the Hessian assembled in it, with
    two rounds of iterative refinement against the same dense Hessian (so that ``backward_rtol`` means the
    same in float32 as in float64, as on the C++ path, whose factorizations are float64 too); CG solves in the
    working dtype."""
    b, f, d = y.shape
    n = f * d
    if kept is not None:
        hess = kept[0]
    rhs = dl_dy.reshape(b, n)
    # Solved for b / ||b||: the residual is then the relative one (rows with b = 0 get lambda = 0).
    scale = _row_norm(rhs)
    asked = scale > 0  # a creature a loss leaves out gets no gradient to doubt (see the unconverged check below)
    scale = torch.where(asked, scale, torch.ones_like(scale))[:, None]
    rhs = rhs / scale
    info.backward_ran = True
    if o.linear_solver == "cholesky":
        lam, residual, pd = _dense_adjoint(hess, top, rhs, b, n, kept)
        info.backward_direct = True
        info.backward_cg_iterations = 0
        problem = ~pd
        what = ("the Hessian at y* is not positive definite (y* is not a strict minimum; solved by LU there) for "
                "problem(s) {who}; the implicit gradient is unreliable")
    else:
        precondition = kept[1] if kept is not None else _block_jacobi(hess, top, b, f, d)
        apply = _hessian_product(hess, b, f, d)
        rtol = torch.full((b,), o.backward_rtol, dtype=rhs.dtype, device=rhs.device)
        lam, residual, problem, iterations = _measured_cg(apply, rhs, rtol, o.backward_max_iter or 10 * n,
                                                          precondition, o.check_every)
        info.backward_direct = False
        info.backward_cg_iterations = iterations
        what = ("the Hessian at y* is not positive definite (non-positive curvature met by CG) for problem(s) "
                "{who}; the implicit gradient is unreliable")
    # A creature the loss leaves out is no part of the solve: its lambda is 0 (not 0 x NaN, where its Hessian is
    # not finite), and nothing of it is judged (as on the C++ path).
    lam = torch.where(asked[:, None], lam, torch.zeros_like(lam))
    residual = torch.where(asked, residual, torch.zeros_like(residual))
    problem = problem & asked
    host_residual, host_problem, host_asked = residual.tolist(), problem.tolist(), asked.tolist()
    broken = [i for i, r in enumerate(host_residual) if math.isnan(r) or math.isinf(r)]
    info.backward_residual = math.nan if broken else max(host_residual)
    bad = [i for i, v in enumerate(host_problem) if v and i not in broken]
    slow = [i for i, r in enumerate(host_residual) if not r <= o.backward_rtol]
    unsolved = [i for i, ok in enumerate(info.problem_converged) if not ok and host_asked[i]]
    info.backward_converged = not bad and not slow and not unsolved
    if bad:
        info.backward_message = what.format(who=_names(bad))
    elif slow:
        if broken:  # (the C++ path's words)
            how = (f"Hessian-vector products that are not finite for problem(s) {_names(broken)}: the energy's "
                   f"second derivatives hold NaN or inf at their x*")
        else:
            how = ("a dense Cholesky factorization with iterative refinement (H too ill-conditioned for this "
                   "tolerance)" if info.backward_direct else
                   f"{info.backward_cg_iterations} block-Jacobi CG iterations (backward_max_iter = "
                   f"{o.backward_max_iter or 10 * n})") + f" for problem(s) {_names(slow)}"
        info.backward_message = (f"the adjoint solve's relative residual is {info.backward_residual:.3g} > "
                                 f"backward_rtol = {o.backward_rtol:g} after {how}")
        if rhs.dtype == torch.float32 and not info.backward_direct:  # (the dense solve is in float64)
            info.backward_message += ("; in float32, round-off bounds the residual near H's condition number times "
                                      "1.2e-7: solve in float64, or loosen backward_rtol")
    else:
        info.backward_message = "converged"
    failure = "adjoint solve failed"
    if unsolved:  # the adjoint's own outcome follows, as the C++ backward words it
        failure = "implicit gradient at an unconverged solve"
        info.backward_message = f"{unsolved_message(_names(unsolved), info.message)}; the adjoint solve: " \
                                f"{info.backward_message}"
    if not info.backward_converged:
        if o.on_failure == "raise":
            error = ConvergenceError(f"{failure}: {info.backward_message}")
            error.info = info
            raise error
        warnings.warn(f"diffsoft (torch backend): {failure}: {info.backward_message}", RuntimeWarning)
    return (lam.to(y.dtype) * scale).view(b, f, d)


def _dense_adjoint(hess, top, rhs, b, n, kept):
    """The dense adjoint solve in float64: ``(lambda, relative residual, positive definite)`` per row."""
    H = _assemble(hess, top, b, n).double()
    if kept is not None:
        L, pd = kept[1], kept[2]
    else:
        L, status = torch.linalg.cholesky_ex(H)
        pd = status == 0
    rhs = rhs.double()
    lam = _cholesky_solve(L, rhs)
    if not bool(pd.all()):  # a decision (and an LU factorization) only the backward of such a batch pays
        lam = torch.where(pd[:, None], lam, torch.linalg.solve(H, rhs))
    r = rhs - (H @ lam[..., None])[..., 0]
    res = _row_norm(r)
    for _ in range(2):  # iterative refinement, kept where it lowers the residual
        lam_try = lam + torch.where(pd[:, None], _cholesky_solve(L, r), torch.zeros_like(r))
        r_try = rhs - (H @ lam_try[..., None])[..., 0]
        res_try = _row_norm(r_try)
        better = res_try < res
        lam, r, res = (torch.where(better[:, None], lam_try, lam), torch.where(better[:, None], r_try, r),
                       torch.where(better, res_try, res))
    return lam, res, pd


# ----------------------------------------------------------------------------------------------------------------
# Linear algebra on the element blocks


_ASSEMBLY = weakref.WeakKeyDictionary()


def _assembly_indices(hess, top, n):
    """For each block kind of ``hess``: ``(keep, flat)``, the entries of its flattened blocks that couple two
    free unknowns (None: all of them) and their positions in the flattened ``(n, n)`` Hessian. Cached per
    topology (the index tensors depend on it alone)."""
    cached = _ASSEMBLY.get(top)
    if cached is not None:
        return cached
    d = hess.vertex.shape[-1]
    out = []
    for idx, _ in hess.blocks:
        k = idx.shape[1]
        slot = top.free_index[idx]  # (E, k): each local vertex's index among the free ones, -1 if fixed
        dof = (slot[:, :, None] * d + torch.arange(d, device=idx.device)).reshape(-1, k * d)  # (E, kd)
        free = (slot[:, :, None] >= 0).expand(-1, -1, d).reshape(-1, k * d)
        flat = (dof[:, :, None] * n + dof[:, None, :]).reshape(-1)
        pair = (free[:, :, None] & free[:, None, :]).reshape(-1)
        out.append((None, flat) if bool(pair.all()) else (torch.nonzero(pair).flatten(), flat[pair]))
    _ASSEMBLY[top] = out
    return out


def _assemble(hess, top, b, n, out=None):
    """Each creature's dense Hessian ``(B, n, n)`` over the free unknowns, scatter-added from the blocks (into
    ``out``, a ``(B, n * n)`` buffer, when given)."""
    H = hess.vertex.new_zeros(b, n * n) if out is None else out.zero_()
    for (_, K), (keep, flat) in zip(hess.blocks, _assembly_indices(hess, top, n)):
        values = K.reshape(b, -1)
        H.index_add_(1, flat, values if keep is None else values[:, keep])
    H = H.view(b, n, n)
    f, d = hess.vertex.shape[1:3]
    # The vertex blocks on the block diagonal: H viewed as (B, F, d, F, d), its (s, s) blocks.
    H.view(b, f, d, f, d).diagonal(dim1=1, dim2=3).add_(hess.vertex.permute(0, 2, 3, 1))
    return H


def _cholesky_direction(hess, top, g, b, n, workspace):
    """Newton's direction ``-H^-1 g`` per creature by one batched Cholesky factorization, and which creatures'
    Hessians were positive definite (the others get the scaled gradient step). ``workspace``: buffers for the
    Hessian and its factor, reused by every Newton iteration (fresh allocations of this size cost page faults
    on CPU)."""
    H_buffer, L, status = workspace
    torch.linalg.cholesky_ex(_assemble(hess, top, b, n, out=H_buffer), out=(L, status))
    pd = status == 0
    newton = _cholesky_solve(L, -g)
    return torch.where(pd[:, None], newton, -g / _scale(hess, b, n)), pd


def _cholesky_solve(L, rhs):
    """``(L L^T)^-1 rhs`` for rows ``rhs`` ``(B, n)``, by two triangular solves (``torch.cholesky_solve``
    checks LAPACK's status on the host: a device synchronisation per call)."""
    z = torch.linalg.solve_triangular(L, rhs[..., None], upper=False)
    return torch.linalg.solve_triangular(L.mT, z, upper=True)[..., 0]


def _scale(hess, b, n):
    """The diagonal of the vertex blocks (inertia ``m / h^2``, contact, friction), positive: the scaling of the
    fallback gradient steps (an inertia-scaled gradient step is an explicit step of the dynamics)."""
    diag = torch.diagonal(hess.vertex, dim1=-2, dim2=-1).reshape(b, n).abs()
    # |diag|, floored relative to the row's largest as the C++ Jacobi preconditioner is: a negative entry (inside
    # a sphere, contact's curvature term) clamped to the smallest float made the step leap out of reach
    return torch.max(diag, 1e-8 * diag.amax(1, keepdim=True)).clamp_min(torch.finfo(diag.dtype).tiny)


def _hessian_product(hess, b, f, d):
    return lambda v: hess.apply(v.view(b, f, d)).reshape(b, f * d)


def _block_jacobi(hess, top, b, f, d):
    """The block-Jacobi preconditioner: ``r -> D^-1 r`` with ``D`` each free vertex's ``d x d`` diagonal block
    of the Hessian (the diagonal of its vertex block only where that block is not positive definite)."""
    blocks = hess.vertex.new_zeros(b, hess.num_vertices, d, d)
    for idx, K in hess.blocks:
        e, k = idx.shape
        per_vertex = K.view(b, e, k, d, k, d).diagonal(dim1=2, dim2=4).permute(0, 1, 4, 2, 3)  # (B, E, k, d, d)
        blocks.index_add_(1, idx.reshape(-1), per_vertex.reshape(b, e * k, d, d))
    if not hess.all_free:
        blocks = blocks[:, hess.free]
    diag = torch.diag_embed(torch.diagonal(hess.vertex, dim1=-2, dim2=-1))
    blocks = blocks + hess.vertex
    L, status = torch.linalg.cholesky_ex(blocks)
    L = torch.where((status == 0)[..., None, None], L, diag.clamp_min(torch.finfo(diag.dtype).tiny).sqrt() * (diag > 0))
    eye = torch.eye(d, dtype=blocks.dtype, device=blocks.device).expand_as(blocks)
    inverse = torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, eye, upper=False), upper=True)
    return lambda r: (inverse @ r.view(b, f, d, 1)).reshape(b, f * d)


class _CGResult(typing.NamedTuple):
    x: torch.Tensor                   # (B, n)
    residual: torch.Tensor            # (B,) relative residual
    negative_curvature: torch.Tensor  # (B,) bool: stopped (or, truncated, would have) at p.Hp <= 0
    iterations: int


def _cg(apply, rhs, rtol, max_iter, precondition, active, truncate, check_every):
    """Preconditioned CG on rows ``(B, n)`` of independent systems ``H x = rhs``, masked per row, each to its
    relative tolerance ``rtol`` ``(B,)``; rows not ``active`` return 0. ``truncate``: a row meeting non-positive
    curvature stops with its iterate (the preconditioned right-hand side if on its first iteration: a descent
    direction for ``rhs = -g``), as the C++ truncated CG. Host reads every ``check_every`` iterations."""
    eps = 1e-14 if rhs.dtype == torch.float64 else 1e-6
    scale = _row_norm(rhs)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))[:, None]
    r = torch.where(active[:, None], rhs / scale, torch.zeros_like(rhs))
    x = torch.zeros_like(r)
    z = precondition(r)
    p, first = z, z
    rz = (r * z).sum(1)
    r_norm = _row_norm(r)
    done = ~active | (r_norm <= rtol)
    negative = torch.zeros_like(done)
    fallback = torch.zeros_like(done)
    its = 0
    for k in range(max_iter):
        if k % check_every == 0 and bool(done.all()):
            break
        its += 1
        ap = apply(p)
        pap = (p * ap).sum(1)
        bad = ~done & (pap <= eps * _row_norm(p) * _row_norm(ap))
        negative = negative | bad
        if truncate:
            fallback = fallback | (bad & (k == 0))
        done = done | bad
        run = ~done
        alpha = torch.where(run, rz / torch.where(run, pap, torch.ones_like(pap)), torch.zeros_like(pap))[:, None]
        x = x + alpha * p
        r = r - alpha * ap
        z = precondition(r)
        rz_new = (r * z).sum(1)
        r_norm = torch.where(run, _row_norm(r), r_norm)
        done = done | (r_norm <= rtol) | ~torch.isfinite(r_norm)  # (a row of NaN products stops: it is reported)
        keep_going = ~done & (rz != 0)
        beta = torch.where(keep_going, rz_new / torch.where(keep_going, rz, torch.ones_like(rz)), torch.zeros_like(rz))
        p = torch.where(run[:, None], z + beta[:, None] * p, p)
        rz = torch.where(run, rz_new, rz)
    if truncate:
        x = torch.where(fallback[:, None], first, x)
    return _CGResult(x * scale, r_norm, negative, its)


def _measured_cg(apply, rhs, rtol, max_iter, precondition, check_every):
    """:func:`_cg` on rows ``rhs`` of norm 1 (or 0) whose residual is measured, ``rhs - H x``, and CG restarted on
    it where it is above ``rtol`` (twice at most), as the C++ adjoint solve does: in float32 the recurrence's
    residual drifts from the true one (on the tetrapod it claimed 8e-6 where the true one was 1e-4).
    ``(x, true relative residual, negative curvature met, iterations)``, per row where ``(B,)``."""
    everywhere = torch.ones_like(rtol, dtype=torch.bool)
    cg = _cg(apply, rhs, rtol, max_iter, precondition, everywhere, truncate=False, check_every=check_every)
    x, negative, iterations = cg.x, cg.negative_curvature, cg.iterations
    for restart in range(3):
        r = rhs - apply(x)
        residual = _row_norm(r)
        again = ~negative & (residual > rtol)
        if restart == 2 or iterations >= max_iter or not bool(again.any()):
            return x, residual, negative, iterations
        # the correction's tolerance, relative to its own right-hand side r
        fix = _cg(apply, r, (rtol / residual.clamp_min(torch.finfo(r.dtype).tiny)).clamp_max(1), max_iter - iterations,
                  precondition, again, truncate=False, check_every=check_every)
        x, negative, iterations = x + fix.x, negative | fix.negative_curvature, iterations + fix.iterations


def _row_norm(a):
    return torch.linalg.vector_norm(a, dim=1)


def _names(rows, limit=10):
    return ", ".join(map(str, rows[:limit])) + (f" and {len(rows) - limit} more" if len(rows) > limit else "")
