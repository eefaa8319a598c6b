"""Every autograd mode on every path: ``diffsoft.minimize``, the fused C++ step (``backend="cpp"``), the torch
backend (``backend="torch"``) and the plain step (``fused=False``). Each pair gives the right answer, or the same
clear error on every path naming the supported way; none gives a quietly wrong result or breaks what follows."""
import importlib
import re
from contextlib import nullcontext

import pytest
import torch
from torch.autograd import forward_ad
from torch.utils.checkpoint import checkpoint

import diffsoft
from diffsoft import creatures
from diffsoft.colliders import Plane
from diffsoft._minimize import FIRST_ORDER_ONLY, ONE_GRADIENT_AT_A_TIME, REVERSE_MODE_ONLY

from conftest import F64, small_sim


def _func():
    """torch.func (torch 2.x), or functorch, its name on torch 1.13, or None."""
    for name in ("torch.func", "functorch"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "vmap") and hasattr(module, "grad"):
            return module
    return None


FUNC = _func()
needs_func = pytest.mark.skipif(FUNC is None, reason="neither torch.func (torch 2.x) nor functorch is installed")
PATHS = ("minimize", "cpp", "torch", "plain")
SIM_OPTIONS = {"cpp": dict(backend="cpp"), "torch": dict(backend="torch"), "plain": dict(fused=False)}


def _quartic(x, k, b):
    return (0.5 * k * x * x + 0.25 * x ** 4 - b * x).sum()


class Problem:
    """One path's solve as a function of one parameter tensor ``p`` (a body's Lame parameter mu for the
    simulator's paths, the stiffness k for minimize) and of the start ``x0``: ``solve(p, x0) -> x*``. ``fresh()``
    builds it anew (a fresh simulator, for modes that must work from the first step)."""

    def __init__(self, path):
        self.path = path
        self.fresh()

    def fresh(self):
        if self.path == "minimize":
            self.p0 = torch.linspace(1.0, 2.0, 4, dtype=F64)
            self.x0 = torch.zeros(4, dtype=F64)
            self.sim = None
        else:
            self.sim = small_sim(**SIM_OPTIONS[self.path])
            x, v = self.sim.rest_state
            self.x0 = x + 0.01 * torch.sin(3 * x.flip(-1))  # deformed, so that mu matters
            self.v0 = v
            self.p0 = self.sim.body.mu.detach().clone()
        return self

    def solve(self, p, x0=None):
        x0 = self.x0 if x0 is None else x0
        if self.sim is None:
            b = torch.ones(4, dtype=F64)
            return diffsoft.minimize(_quartic, x0, p, b, rtol=1e-13)
        self.sim.body.mu = p
        return self.sim.step(x0, self.v0 if x0.dim() == 2 else self.v0.expand_as(x0))[0]

    def loss(self, p):
        return (self.solve(p) * torch.arange(self.x0.numel(), dtype=F64).view_as(self.x0)).sum()

    def batch(self, n):
        """``n`` starts, for a batch along a new leading dimension."""
        return torch.stack([self.x0 * (1 + 0.01 * i) for i in range(n)])


def _grad(problem):
    p = problem.p0.clone().requires_grad_()
    (g,) = torch.autograd.grad(problem.loss(p), p)
    return g


def _central_difference(problem, direction, h=1e-6):
    with torch.no_grad():
        return (problem.loss(problem.p0 + h * direction) - problem.loss(problem.p0 - h * direction)) / (2 * h)


@pytest.fixture(params=PATHS)
def problem(request):
    return Problem(request.param)


def test_grad_mode_gradient_matches_central_differences(problem):
    """The reference every other mode is compared with: the implicit gradient against central differences."""
    d = torch.linspace(-1.0, 1.0, problem.p0.numel(), dtype=F64).view_as(problem.p0)
    torch.testing.assert_close((_grad(problem) * d).sum(), _central_difference(problem, d), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_no_grad_and_inference_mode_from_the_first_step(problem, mode):
    """The first solve of a fresh simulator under ``mode`` gives the grad-mode answer, and leaves the simulator
    working: a later solve in grad mode differentiates as before (inference mode once broke both)."""
    expected_x, expected_g = problem.solve(problem.p0).detach(), _grad(problem)
    problem.fresh()
    with getattr(torch, mode)():
        x = problem.solve(problem.p0)
    assert not x.requires_grad
    torch.testing.assert_close(x, expected_x, rtol=0, atol=1e-12)
    torch.testing.assert_close(_grad(problem), expected_g, rtol=1e-10, atol=1e-12)
    with getattr(torch, mode)():  # and again, now that the simulator has made its caches in grad mode
        torch.testing.assert_close(problem.solve(problem.p0), expected_x, rtol=0, atol=1e-12)


def test_enable_grad_inside_no_grad_differentiates(problem):
    expected = _grad(problem)
    p = problem.p0.clone().requires_grad_()
    with torch.no_grad(), torch.enable_grad():
        loss = problem.loss(p)
    (g,) = torch.autograd.grad(loss, p)
    torch.testing.assert_close(g, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("hooks", ["checkpoint", "pack_hooks"])
def test_the_callers_saved_tensor_hooks_leave_the_solvers_own_graphs_alone(problem, hooks):
    """Non-reentrant activation checkpointing and saved-tensor hooks apply to the caller's graph; the solvers
    differentiate graphs of their own several times within one call, which those hooks once broke (torch's
    "saved by autograd multiple times" and "a tensor that is never exposed")."""
    expected = _grad(problem)
    p = problem.p0.clone().requires_grad_()
    if hooks == "checkpoint":
        loss = checkpoint(problem.loss, p, use_reentrant=False)
    else:
        packed = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(1) or t.clone(), lambda t: t):
            loss = problem.loss(p)
        assert packed  # the caller's graph went through them
    (g,) = torch.autograd.grad(loss, p)
    torch.testing.assert_close(g, expected, rtol=1e-10, atol=1e-12)


def test_forward_mode_is_refused_with_the_same_message(problem):
    """Dual tensors reached the autograd Functions, which have no forward-mode rule: torch's own errors, of
    another type per path, named neither diffsoft nor the supported way."""
    with forward_ad.dual_level():
        for dual_x0 in (False, True):
            p, x0 = problem.p0.clone(), problem.x0.clone()
            if dual_x0:
                x0 = forward_ad.make_dual(x0, torch.ones_like(x0))
            else:
                p = forward_ad.make_dual(p, torch.ones_like(p))
            with pytest.raises(NotImplementedError, match=f"{REVERSE_MODE_ONLY.replace('(', '.').replace(')', '.')}"):
                problem.solve(p, x0)
    problem.fresh()
    torch.testing.assert_close(problem.solve(problem.p0), problem.solve(problem.p0.clone()))  # nothing broken
    with pytest.raises(RuntimeError, match="first order only"):  # reverse mode twice
        torch.autograd.functional.jvp(problem.loss, problem.p0.clone(), torch.ones_like(problem.p0))


@pytest.mark.parametrize("hooks", [False, True])
def test_a_parameter_changed_in_place_before_the_backward_is_refused_or_harmless(problem, hooks):
    """The backward needs the parameters as the solve saw them: a change in place before it raises autograd's
    error, or (where the solver saw a tensor computed from the parameter, which the change leaves alone) leaves
    the gradient as it was. Autograd's own check of saved tensors is off under saved-tensor hooks, which the
    solvers set around their own graphs: the C++ path then gave quietly wrong gradients, until it checked the
    versions itself."""
    context = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t) if hooks else nullcontext()
    expected = _grad(problem)
    p = problem.p0.clone().requires_grad_()
    with context:
        loss = problem.loss(p)
    with torch.no_grad():
        p.add_(0.1 * p.abs().max())
    try:
        (g,) = torch.autograd.grad(loss, p)
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e)
    else:
        torch.testing.assert_close(g, expected, rtol=1e-10, atol=1e-12)
    # the biped's fused step reads its Lame parameter as given, and so refuses the change
    if problem.path == "cpp":
        sim = creatures.biped(dtype=F64)
        sim.body.mu = mu = sim.body.mu.detach().clone().requires_grad_()
        x, v = sim.rest_state
        with context:
            x1, _ = sim.step(x, v + 0.5)
        with torch.no_grad():
            mu.mul_(1.1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            x1.square().sum().backward()


def test_create_graph_is_refused_with_the_same_message(problem):
    """A second derivative through the first-order backward would be silently wrong (the torch backend once
    returned a gradient without its graph): every path refuses it, with one message."""
    p = problem.p0.clone().requires_grad_()
    loss = problem.loss(p)
    with pytest.raises(RuntimeError) as caught:
        torch.autograd.grad(loss, p, create_graph=True)
    assert FIRST_ORDER_ONLY in str(caught.value)
    with pytest.raises(RuntimeError, match="first order only"):
        torch.autograd.functional.hessian(problem.loss, problem.p0)


@pytest.mark.parametrize("how", ["is_grads_batched", "jacobian_vectorize"])
def test_batched_gradients_are_refused_with_the_same_message(problem, how):
    p = problem.p0.clone().requires_grad_()
    with pytest.raises(RuntimeError) as caught:
        if how == "is_grads_batched":
            x = problem.solve(p)
            torch.autograd.grad(x, p, torch.eye(x.numel(), dtype=F64).view(-1, *x.shape), is_grads_batched=True)
        else:
            torch.autograd.functional.jacobian(problem.solve, problem.p0, vectorize=True)
    assert ONE_GRADIENT_AT_A_TIME in str(caught.value)


def test_jacobian_without_vectorize_is_right(problem):
    """The supported way to a Jacobian: one backward per output, each against central differences."""
    jac = torch.autograd.functional.jacobian(problem.solve, problem.p0)
    d = torch.linspace(-1.0, 1.0, problem.p0.numel(), dtype=F64).view_as(problem.p0)
    with torch.no_grad():
        fd = (problem.solve(problem.p0 + 1e-6 * d) - problem.solve(problem.p0 - 1e-6 * d)) / 2e-6
    jvp = (jac.reshape(problem.x0.numel(), -1) @ d.reshape(-1)).view_as(problem.x0)
    torch.testing.assert_close(jvp, fd, rtol=1e-5, atol=1e-8)


@needs_func
@pytest.mark.parametrize("transform", ["vmap", "grad", "jacrev"])
def test_torch_func_transforms_are_refused_naming_the_supported_way(problem, transform):
    """torch.func's transforms would reach the solver's internals ("the energy does not depend on x", "doesn't have
    storage"); each is refused before the solve, naming the native batch and torch.autograd."""
    if transform == "vmap":
        call = lambda: FUNC.vmap(lambda x0: problem.solve(problem.p0, x0))(problem.batch(2))  # noqa: E731
    elif transform == "grad":
        call = lambda: FUNC.grad(problem.loss)(problem.p0)  # noqa: E731
    else:
        call = lambda: FUNC.jacrev(problem.solve)(problem.p0)  # noqa: E731
    expected = _grad(problem)
    with pytest.raises(RuntimeError, match="does not run under torch.func transforms.*torch.autograd.grad"):
        call()
    torch.testing.assert_close(_grad(problem), expected, rtol=1e-10, atol=1e-12)  # and the path still works


@needs_func
def test_a_transformed_tensor_an_energy_captured_is_refused_as_the_others():
    """vmap over a tensor that minimize's energy reads through its closure (x0 and params plain): the energy
    comes back transformed, and the solve says what the transforms' message says (it said "the energy does not
    depend on x" on torch 1.13, and torch's own Function error on 2.x)."""
    def solve(c):
        return diffsoft.minimize(lambda x: ((x - c) ** 2).sum(-1), torch.zeros(3, 2, dtype=torch.float64),
                                 batched=True)
    with pytest.raises(RuntimeError, match=r"diffsoft.minimize does not run under torch.func transforms.*batched=True"):
        FUNC.vmap(solve)(torch.randn(2, 3, 2, dtype=torch.float64))


def test_the_native_batch_is_what_vmap_would_give(problem):
    """The way the vmap error names: a batch along the leading dimension, each problem's answer its own solve."""
    starts = problem.batch(3)
    if problem.sim is not None:
        problem.sim.solver_options.update(rtol=1e-10, atol=1e-9)  # a batch's round-off is not one creature's
    if problem.sim is None:
        b = torch.ones(4, dtype=F64)
        batch = diffsoft.minimize(lambda x, k, b: (0.5 * k * x * x + 0.25 * x ** 4 - b * x).sum(-1), starts,
                                  problem.p0, b, batched=True, rtol=1e-13)
    else:
        batch = problem.solve(problem.p0, starts)
    for i in range(len(starts)):
        torch.testing.assert_close(batch[i], problem.solve(problem.p0, starts[i]), rtol=0, atol=1e-9)


def test_a_step_result_can_be_changed_in_place(problem):
    """``x += 1`` on a result: the solver's output is a tensor of its own, not a view of its internals (autograd
    refuses in-place changes of views made inside a custom Function)."""
    p = problem.p0.clone().requires_grad_()
    x = problem.solve(p)
    x += 1.0
    (g,) = torch.autograd.grad((x * x).sum(), p)
    assert torch.isfinite(g).all()


def test_a_gradient_at_an_unconverged_solve_is_reported_by_the_backward(problem):
    """Newton stopped short (the forward warned): the backward's gradient is the derivative of an equation that
    does not hold there, and it says so, naming the problem, on every path; a converged solve's does not."""
    p = problem.p0.clone().requires_grad_()
    options = dict(max_iter=1, on_failure="warn")
    if problem.sim is None:
        x0 = torch.full_like(problem.x0, 30.0)
        with pytest.warns(RuntimeWarning, match="did not converge"):
            x, info = diffsoft.minimize(_quartic, x0, p, torch.ones(4, dtype=F64), return_info=True, **options)
    else:
        problem.sim.solver_options.update(options)
        problem.sim.body.mu = p
        with pytest.warns(RuntimeWarning, match="did not converge"):
            x, _, info = problem.sim.step(problem.x0, problem.v0 + 3.0, return_info=True)
    with pytest.warns((UserWarning, RuntimeWarning), match=r"implicit gradient at an unconverged solve: the forward "
                                                          r"solve did not converge for problem\(s\) 0"):
        torch.autograd.grad(x.sum(), p)
    assert info.backward_ran and not info.backward_converged
    assert "the implicit gradient assumes grad E(x*) = 0" in info.backward_message


def test_a_dual_tensor_in_the_energys_closure_is_refused_not_dropped():
    # Its tangent flowed through Newton's iterations into x*: a wrong tangent (-0.40 against -0.23), or None from
    # another start, without a word.
    x0, b = torch.zeros(4, dtype=F64), torch.ones(4, dtype=F64)
    with forward_ad.dual_level():
        c = forward_ad.make_dual(torch.tensor(1.5, dtype=F64), torch.tensor(1.0, dtype=F64))
        with pytest.raises(NotImplementedError, match=re.escape("closure captured): " + REVERSE_MODE_ONLY)):
            diffsoft.minimize(lambda x: (0.5 * c * x * x + 0.25 * x ** 4 - b * x).sum(), x0)


def _spring_to(target):
    from diffsoft.terms import Term
    return Term(lambda x, x0, h, k: 0.5 * k * ((x[..., 0, :] - target) ** 2).sum(-1), rows=[[5]],
                params=(torch.tensor(50.0, dtype=F64),), name="spring")


@pytest.mark.parametrize("path", [{}, {"backend": "torch"}, {"fused": False}], ids=["cpp", "torch", "unfused"])
def test_a_terms_closure_is_checked_at_every_step_on_every_path(path):
    target = torch.tensor([0.5, 0.3], dtype=F64, requires_grad=True)
    sim = small_sim(terms=[_spring_to(target)], **path)
    x, v = sim.rest_state
    sim.body.mu = sim.body.mu.detach().clone().requires_grad_()
    with pytest.warns(RuntimeWarning, match=r"sim.terms\[0\] \(Term 'spring'\) depends on a tensor that requires grad"):
        sim.step(x, v)  # its gradient would be quietly missing
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(torch.tensor([0.5, 0.3], dtype=F64), torch.ones(2, dtype=F64))
        sim = small_sim(terms=[_spring_to(dual)], **path)
        with pytest.raises(NotImplementedError, match=r"sim.terms\[0\] \(Term 'spring'\) reads a forward-mode dual"):
            sim.step(x, v)
        sim = small_sim(colliders=[Plane(dual - 0.4, torch.tensor([0.0, 1.0], dtype=F64))],
                        **path)
        with pytest.raises(NotImplementedError, match=r"sim.colliders\[0\]"):
            sim.step(x, v)


@pytest.mark.parametrize("path", [{}, {"backend": "torch"}, {"fused": False}], ids=["cpp", "torch", "unfused"])
def test_a_state_made_under_inference_mode_steps_with_gradients_on_every_path(path):
    sim = small_sim(**path)
    x, v = sim.rest_state
    with torch.inference_mode():
        xi, a = x.clone(), torch.tensor([0.8, 0.9], dtype=F64)
    sim.body.mu = mu = sim.body.mu.detach().clone().requires_grad_()
    (g,) = torch.autograd.grad(sim.step(xi, v, a)[0].sum(), mu)
    (want,) = torch.autograd.grad(sim.step(x, v, a.clone())[0].sum(), mu)
    torch.testing.assert_close(g, want)
