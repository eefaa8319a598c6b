"""The implicit layer: ``x* = argmin_x energy(x, *params)``, differentiable with respect to params."""
import contextlib
import numbers
import warnings

import torch

from ._checks import is_finite_real
from ._compat import (batched_vjp, eager_under_compile, in_dual_level, is_batched, is_dual, is_transformed,
                      own_graphs)
from ._extension import ConvergenceError, SolveInfo, SolverOptions, _C


FIRST_ORDER_ONLY = (
    "diffsoft's implicit backward (diffsoft.minimize, Simulator.step) is first order only: create_graph=True (and so "
    "higher-order gradients, gradgradcheck, Hessians) is not supported; differentiate once, with create_graph=False")
"""The error of a backward run with ``create_graph=True``, on every path (the C++ backward says the same)."""

ONE_GRADIENT_AT_A_TIME = (
    "diffsoft's implicit backward takes one gradient at a time: batched gradients (torch.autograd.grad(..., "
    "is_grads_batched=True), torch.autograd.functional.jacobian(vectorize=True)) are not supported; take them one by "
    "one (is_grads_batched=False, jacobian(vectorize=False))")
"""The error of a backward given batched gradients, on every path (the C++ backward says the same)."""

REVERSE_MODE_ONLY = (
    "diffsoft's implicit layer (diffsoft.minimize, Simulator.step) differentiates in reverse mode only: forward-mode "
    "AD (torch.autograd.forward_ad's dual tensors, jacobian(strategy='forward-mode')) is not supported; use "
    "loss.backward(), torch.autograd.grad or torch.autograd.functional.jacobian(vectorize=False)")
"""The error of a dual tensor (forward-mode AD) given to a solver, on every path."""


def unsolved_message(problems, forward_message):
    """The backward's words for a gradient taken where the forward solve did not converge (``problems`` names
    them); the C++ backward says the same."""
    return (f"the forward solve did not converge for problem(s) {problems} ({forward_message}): the implicit "
            f"gradient assumes grad E(x*) = 0, which does not hold there, and is unreliable")


STEP_BATCH = "a batch x0 of shape (B, N, d), with per-creature parameters of shape (B, ...) (the step is batched)"


def refuse_transforms(what, tensors, batch=STEP_BATCH):
    """A RuntimeError naming ``what`` and the supported ways (``batch``: how to pass many problems at once) when
    one of ``tensors`` (others skipped) is a torch.func transform's wrapper: the solvers are autograd Functions
    on plain tensors, batched and differentiable natively; a NotImplementedError (a RuntimeError) when one is a
    forward-mode dual tensor."""
    if any(isinstance(t, torch.Tensor) and is_transformed(t) for t in tensors):
        raise RuntimeError(f"{what} does not run under torch.func transforms (vmap, grad, jacrev, jacfwd, hessian, "
                           f"jvp): for many problems at once pass {batch}; for derivatives use torch.autograd.grad, "
                           f"torch.autograd.functional.jacobian(vectorize=False) or loss.backward()")
    if any(isinstance(t, torch.Tensor) and is_dual(t) for t in tensors):
        raise NotImplementedError(f"{what}: {REVERSE_MODE_ONLY}")


def check_backward_mode(grad_output):
    """Raises in an implicit backward run in a mode it cannot serve: with create_graph=True (grad mode is then on
    in the backward), or with batched gradients."""
    if torch.is_grad_enabled():
        raise RuntimeError(FIRST_ORDER_ONLY)
    if is_batched(grad_output):
        raise RuntimeError(ONE_GRADIENT_AT_A_TIME)


@eager_under_compile
def minimize(
    energy,
    x0,
    *params,
    batched=False,
    rtol=None,
    atol=0.0,
    max_iter=100,
    cg_rtol=0.5,
    cg_max_iter=None,
    backward_rtol=None,
    backward_max_iter=None,
    ls_c1=1e-4,
    ls_shrink=0.5,
    ls_max_iter=30,
    on_failure="warn",
    return_info=False,
    keep_factor=False,
    reuse_factor=False,
    sparsity=None,
    probe_batch=None,
    _analytic=None,
):
    """Minimize ``energy(x, *params)`` over ``x`` by Newton's method, matrix-free, in C++.

    Invariant: at the returned ``x*``, ``grad_x energy(x*, *params) ~ 0``. ``x*`` is differentiable with
    respect to every tensor in ``params`` that requires grad, by the implicit function theorem: the backward
    solves ``H lambda = dL/dx*`` by CG on Hessian-vector products at ``x*`` and returns
    ``-d/dparams [grad_x energy(x*, params) . lambda]``. It never replays Newton's iterations.

    Args:
        energy: ``energy(x, *params) -> 0-dim tensor`` (see ``batched``), written with torch ops. Every tensor it depends on
            that may need a gradient must be passed in ``params``: tensors captured by a closure get none (a
            RuntimeWarning says so when one requires grad). The
            backward calls it again at ``x*``: what it reads besides its arguments must not change until the
            backward has run, and it must be twice differentiable by autograd (torch drops the second derivative
            of a custom Function marked ``once_differentiable`` without a word).
        x0: floating-point tensor of any shape, the starting guess (it receives no gradient).
        *params: tensors (any may require grad; floating ones must match x0's dtype, all x0's device) or
            plain Python values, passed through to ``energy`` unchanged.
        batched: dim 0 of ``x0`` indexes independent problems. ``energy`` returns either their summed energy
            (0-dim) or, better, one energy per problem (shape ``(B,)``). Each problem is judged on its own: it
            has converged when its gradient norm is ``<= max(atol, rtol * its norm at x0)``; CG runs per
            problem; with per-problem energies the line search does too, and a problem that fails (say, an
            energy unbounded below) is frozen and named in the report while the others go on. With a summed
            energy the line search takes one step size for all.
        rtol, atol: gradient tolerances (see ``batched``); ``rtol=None`` means 1e-8 for float64, 1e-4 for
            float32.
        max_iter: Newton iterations.
        cg_rtol: cap of the forcing term: each Newton system ``H p = -g`` is solved by CG to a relative
            residual ``min(cg_rtol, sqrt(||g|| / ||g0||))``. CG stops at non-positive curvature and returns a
            descent direction (truncated Newton).
        cg_max_iter: CG iterations per Newton step (default: the number of unknowns per problem).
        backward_rtol, backward_max_iter: the adjoint solve's relative residual (measured, not CG's running
            estimate; None: 1e-10 in float64, 1e-5 in float32, where round-off bounds it near the Hessian's
            condition number times 1.2e-7) and CG's iteration cap (default: 10 x the number of unknowns per
            problem).
        ls_c1, ls_shrink, ls_max_iter: backtracking line search, accepting ``E(x + a p) <= E(x) + c1 a g.p``
            (with a round-off allowance), else ``a *= ls_shrink``. Non-finite energies are rejected. Where the
            Hessian is not positive definite (at a stationary start, and along a direction of CG's that met
            non-positive curvature, made as long as ``x``, or 1), the step is instead the first dip along the
            direction: up to ``ls_max_iter`` trials from the shortest up, a factor ``ls_shrink`` apart (or 2,
            where that is coarser), the last of the first run of decreases taken; and a Newton step longer than
            ``x`` (or 1) is tried from ``x``'s length up, taken to its first dip where the energy along it has
            more than one valley, so that the steps do not depend on the energy's scale and do not leap over
            wells (docs/reliability.md). Where no trial along Newton's direction lowers the energy, or the step
            taken is within ``x``'s precision (a Hessian huge at ``x`` alone, as at a start on a sharp kink), the
            gradient, made as long as ``x``, is searched the same way before the problem fails (or creeps on).
        on_failure: ``"warn"`` (a RuntimeWarning and ``info.converged = False``) or ``"raise"``
            (``diffsoft.ConvergenceError``, whose ``info`` attribute holds the record), for the forward and
            the backward alike.
        return_info: also return the :class:`SolveInfo` record.
        sparsity: for energies on a mesh, an ``(E, k)`` int64 tensor of vertex indices (e.g. the mesh's
            elements) such that the energy couples only vertices that share a row; ``x0`` is then ``(N, d)``
            (or ``(B, N, d)`` with ``batched``). The Hessian is recovered from a few Hessian-vector products
            (one per colour of a distance-2 colouring of the vertices, times d) and factored: Newton takes
            exact steps and the adjoint solve is a back-substitution, instead of CG. Pays from a few hundred
            unknowns on. A pattern that misses couplings gives a wrong factor, which measured residuals and
            CG then correct: the answers and gradients stay right, only slower.
        probe_batch: with ``sparsity``, how many of the probes' Hessian-vector products one autograd call takes
            (torch's vmap over the double backward, ``torch.autograd.grad(..., is_grads_batched=True)``):
            ``None`` (default) measures: one probe per call, then 2, 4, 8, ... while each is faster per probe
            (each timed on two calls), settling on the fastest; ``1`` takes them one at a time; ``K`` up to K
            per call. Never more than ``2**19 / x0.numel()`` per call (a batch's backward holds K copies of each
            intermediate: about 140 MB for a neo-Hookean sheet's step energy at that bound), and one at a time
            wherever torch cannot batch the energy's backward (a custom autograd Function reading data in its
            backward, say). The products, and so the results, are the same either way (bit for bit on the
            tests' energies; an operation that sums in another order when batched could change the last bits),
            only the time differs: batches pay where each operation's overhead outweighs its work (small
            meshes), and can lose where allocating their larger buffers is dear (``benchmarks/README.md``).
            Timings of a loaded machine can mislead the measurement: fix ``probe_batch`` where that matters.
        keep_factor: with a factored Hessian (``sparsity``, or the simulator's direct solver), keep Newton's
            last factorization for the backward, which then solves the adjoint system by back-substitution
            and iterative refinement with it instead of factoring again at ``x*``: a cheaper backward, for the
            memory of that factor and of what it was made from (the Hessian's blocks, or with ``sparsity``
            the energy's autograd graph at Newton's last iterate) until the backward has run.
        reuse_factor: with a factored Hessian, solve each Newton system after the first by CG preconditioned
            with Newton's previous factorization, and factor again only where that CG does not converge
            within a budget of iterations: with ``sparsity``, half the Hessian-vector products that probe one
            factorization. A count, never a timing: the iterates are the same on every run. Faster where
            factorizations are dear and the Hessian changes little between Newton iterations (large meshes);
            off by default here, since a user energy's products may cost anything against its factorization
            (:class:`~diffsoft.simulator.Simulator` turns it on for its own kernels, whose costs it counts).
            Results are solved to the same tolerances either way.
        _analytic: internal, for diffsoft's built-in energies: a ``_C.AnalyticEnergy`` giving the same energy's
            value, gradient and Hessian products without autograd, used by Newton and the adjoint solve;
            ``energy`` still gives the derivatives with respect to ``params``.

    Returns:
        ``x*`` with the shape of ``x0``, or ``(x*, info)``. ``info`` holds converged, iterations,
        cg_iterations, hvp_count, factorizations, line_search_steps, fallback_steps, energy, grad_norm,
        grad_norm_initial, problem_converged and message; after ``backward()`` the same object also holds backward_ran,
        backward_converged, backward_cg_iterations, backward_residual and backward_message.
    """
    if not callable(energy):
        raise TypeError(f"energy must be callable, got {type(energy).__name__}")
    if not isinstance(x0, torch.Tensor):
        raise TypeError(f"x0 must be a torch.Tensor, got {type(x0).__name__}")
    if x0.layout != torch.strided or x0.is_meta:
        raise TypeError(f"x0 must be a dense tensor holding values (the solver reads them), got a "
                        f"{'meta' if x0.is_meta else str(x0.layout).replace('torch.', '')} tensor")
    if x0.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"x0 must be a float32 or float64 tensor (the dtypes the solver runs in), got {x0.dtype}")
    for name, flag in (("batched", batched), ("keep_factor", keep_factor), ("reuse_factor", reuse_factor),
                       ("return_info", return_info)):
        if isinstance(flag, str) or flag not in (True, False):  # ("no" would be true)
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if on_failure not in ("warn", "raise"):
        raise ValueError(f'on_failure must be "warn" or "raise", got {on_failure!r}')
    if is_finite_real(atol) and atol > torch.finfo(x0.dtype).max:
        raise ValueError(f"atol must be a finite number >= 0 in x0's dtype {x0.dtype}, got {atol!r}")
    options = _options(
        batched=batched, rtol=rtol, atol=atol, max_iter=max_iter, cg_rtol=cg_rtol, cg_max_iter=cg_max_iter,
        backward_rtol=backward_rtol, backward_max_iter=backward_max_iter, ls_c1=ls_c1, ls_shrink=ls_shrink,
        ls_max_iter=ls_max_iter, raise_on_failure=on_failure == "raise", keep_factor=bool(keep_factor),
        reuse_factor=bool(reuse_factor), probe_batch=probe_batch,
    )

    for i, p in enumerate(params):
        hidden = _tensors_requiring_grad_in(p)
        if hidden:
            raise TypeError(f"params[{i}] is a {type(p).__name__} holding {hidden} tensor(s) that require grad: "
                            f"they would get no gradient through the implicit backward. Pass each tensor as a "
                            f"param of its own (e.g. minimize(energy, x0, *params[{i}]))")
    refuse_transforms("diffsoft.minimize", (x0,) + params,
                      batch="batched=True with x0's leading dimension indexing the problems")
    is_tensor = [isinstance(p, torch.Tensor) for p in params]
    for i, t in enumerate(params):
        if not is_tensor[i]:
            continue
        if t.device != x0.device:
            raise ValueError(f"params[{i}] is on {t.device} but x0 is on {x0.device}")
        if (t.is_floating_point() or t.is_complex()) and t.dtype != x0.dtype:
            raise TypeError(f"params[{i}] has dtype {t.dtype} but x0 has dtype {x0.dtype}: floating-point params "
                            f"must have x0's dtype (the solver runs in float32 or float64, real only)")
    if all(is_tensor):
        fn, tensors = energy, list(params)
    else:
        # The solver takes tensors. For a user's energy an empty one holds each other param's place, so that the
        # solver's params[i] are the caller's (its messages name them); an analytic energy indexes tensors alone.
        template = list(params)
        slots = [i for i, t in enumerate(is_tensor) if t or _analytic is None]
        tensors = [params[i] if is_tensor[i] else x0.new_empty(0) for i in slots]

        def fn(x, *ts):
            full = list(template)
            for i, t in zip(slots, ts):
                if is_tensor[i]:
                    full[i] = t
            return energy(x, *full)

    if sparsity is not None:
        if not isinstance(sparsity, torch.Tensor) or sparsity.dtype != torch.int64 or sparsity.dim() != 2 or \
                sparsity.layout != torch.strided or sparsity.is_meta:
            got = type(sparsity).__name__
            if isinstance(sparsity, torch.Tensor):
                kind = "meta" if sparsity.is_meta else str(sparsity.layout).replace("torch.", "")
                got = f"{'' if kind == 'strided' else kind + ' '}{sparsity.dtype} of shape {tuple(sparsity.shape)}"
            raise TypeError(f"sparsity must be an (E, k) int64 tensor of vertex indices, got {got}")
        if x0.dim() != (3 if batched else 2):
            raise ValueError(f"with sparsity, x0 must be (N, d){' with a leading batch dimension' if batched else ''}"
                             f", got shape {tuple(x0.shape)}")
    if not torch.is_inference_mode_enabled():
        # Inference tensors (made under inference_mode) keep no version, which the backward checks: copies do.
        tensors = [t.clone() if t.is_inference() else t for t in tensors]
        # (diffsoft's own energies, such as the step's with fused=False, take every tensor as a param)
        origin = getattr(energy, "__module__", None) or ""
        if _analytic is None and (torch.is_grad_enabled() or in_dual_level()) and not origin.startswith("diffsoft."):
            _check_captured_tensors(fn, x0, tensors)
    info = SolveInfo()
    # Newton's products by double backward build graphs of the solver's own, which the caller's saved-tensor hooks
    # (non-reentrant checkpointing) must leave alone; the identity hooks that ensure it also reach the tensors
    # this solve saves for its backward (the C++ backward then checks their versions itself). An analytic
    # energy (the fused step) builds no such graphs: the caller's hooks see what it saves.
    own = own_graphs() if _analytic is None else contextlib.nullcontext()
    try:
        if torch.is_inference_mode_enabled():
            # Newton needs autograd (Hessian-vector products by double backward), which inference mode turns
            # off and whose tensors cannot enter autograd; copies made outside it can, and nothing can be
            # differentiated under inference mode anyway, so solving on them loses nothing. (Leaving inference
            # mode also turns grad mode on: hence only here, and under no_grad for the result.)
            with torch.inference_mode(False):
                x0, tensors = x0.clone(), [t.clone() for t in tensors]
                with torch.no_grad(), own:
                    x_star = _C.minimize(fn, x0, tensors, options, info, _analytic, sparsity, batched_vjp)
        else:
            with own:
                x_star = _C.minimize(fn, x0, tensors, options, info, _analytic, sparsity, batched_vjp)
    except ConvergenceError as e:  # keep the record (per-problem flags, residuals) with the exception
        e.info = info
        raise
    if not info.converged:  # with on_failure="raise" the C++ solver has already raised
        warnings.warn(f"diffsoft.minimize did not converge: {info.message}", RuntimeWarning, stacklevel=2)
    return (x_star, info) if return_info else x_star


def default_backward_rtol(dtype):
    """The adjoint solve's default relative residual in ``dtype``, the C++ core's (``default_backward_rtol`` in
    ``core/solver.h``) for the torch backend, which solves in Python: 1e-10 in float64; in float32 1e-5, since
    its round-off bounds the residual to about the Hessian's condition number times float32's epsilon
    (1.2e-7)."""
    return 1e-10 if dtype == torch.float64 else 1e-5


def _check_captured_tensors(fn, x0, tensors):
    """Where the energy depends on a tensor that is not among its params (one its closure captured): a
    RuntimeWarning when it requires grad (the implicit backward gives it no gradient, and a loss that reaches it
    by another way too would get a gradient wrong by that part); a NotImplementedError when it is a forward-mode
    dual tensor (its tangent would flow through Newton's iterations into x*, a wrong tangent). One evaluation,
    on detached inputs: what still requires grad, or is dual, came from elsewhere."""
    try:
        with own_graphs():
            e = fn(x0.detach(), *[t.detach() for t in tensors])
    except Exception:  # noqa: BLE001 - the solve's own first evaluation says what is wrong with the energy
        return
    if isinstance(e, torch.Tensor):
        if is_transformed(e):  # a torch.func transform over a tensor the closure captured
            refuse_transforms("diffsoft.minimize", (e,),
                              batch="batched=True with x0's leading dimension indexing the problems")
        check_captured(e, "diffsoft.minimize: the energy", "as a param (minimize(energy, x0, ..., t))", stacklevel=5)


def check_captured(e, who, as_param, stacklevel):
    """An energy ``e`` evaluated on detached inputs that still depends on a tensor (one its closure captured,
    not among its params): a NotImplementedError when that is a forward-mode dual tensor (its tangent would flow
    through Newton's iterations into x*, a wrong tangent), a RuntimeWarning when it requires grad (the implicit
    backward gives it no gradient). ``who`` names the energy; ``as_param``: how to pass it as a param."""
    if is_dual(e):
        raise NotImplementedError(f"{who} reads a forward-mode dual tensor that is not among its params (one its "
                                  f"closure captured): {REVERSE_MODE_ONLY}")
    if e.requires_grad and torch.is_grad_enabled():
        warnings.warn(f"{who} depends on a tensor that requires grad and is not among its params (one its closure "
                      f"captured): the implicit backward gives it no gradient. Pass it {as_param}, or detach it if "
                      f"it needs none", RuntimeWarning, stacklevel=stacklevel)


def _options(**kw):
    """Checks the options up front, naming the one that is out of range, and packs them for C++."""
    o = SolverOptions()
    kw.setdefault("probe_batch", None)  # only minimize's sparsity= path probes
    top = 2 ** 63 - 1  # the solver's counts are int64
    for name in ("max_iter", "ls_max_iter"):
        v, lo = kw[name], 0 if name == "max_iter" else 1
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= v <= top:
            raise ValueError(f"{name} must be an integer >= {lo} (below 2**63), got {v!r}")
    for name in ("cg_max_iter", "backward_max_iter", "probe_batch"):
        v = kw[name]
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 1 <= v <= top):
            raise ValueError(f"{name} must be None or an integer >= 1 (below 2**63), got {v!r}")
        kw[name] = 0 if v is None else v  # 0: the C++ default (the size, or a measured probe_batch)
    for name in ("rtol", "backward_rtol"):
        if kw[name] is None:
            kw[name] = 0.0  # the C++ side picks the dtype's default
        elif not is_finite_real(kw[name]) or not 0 < kw[name] < 1:
            raise ValueError(f"{name} must be None or in (0, 1), got {kw[name]!r}")
    for name, (lo, hi) in {"cg_rtol": (0, 1), "ls_c1": (0, 0.5), "ls_shrink": (0, 1)}.items():
        if not is_finite_real(kw[name]) or not lo < kw[name] < hi:
            raise ValueError(f"{name} must be in ({lo}, {hi}), got {kw[name]!r}")
    if not is_finite_real(kw["atol"]) or kw["atol"] < 0:
        raise ValueError(f"atol must be a finite number >= 0, got {kw['atol']!r}")
    for name, v in kw.items():
        setattr(o, name, v)
    return o


def _tensors_requiring_grad_in(value):
    """How many tensors that require grad a list, tuple, dict or module holds (nested), where the solver
    cannot see them; 0 for anything else."""
    if isinstance(value, torch.nn.Module):
        return sum(p.requires_grad for p in value.parameters())
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return sum(int(v.requires_grad) if isinstance(v, torch.Tensor) else _tensors_requiring_grad_in(v)
                   for v in value)
    return 0
