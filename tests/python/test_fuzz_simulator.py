"""Fuzzing Simulator.step (seeded hypothesis): random 2D and 3D meshes from one element up, materials over six
orders of magnitude of stiffness, activations, time steps from 1e-4 to 1 s and violent impacts with the ground.

Properties of every step: it converges (the gradient tolerance is met, checked independently on the
plain-torch reference energy) or it says it did not (``info.converged`` False with a RuntimeWarning, and
``diffsoft.ConvergenceError`` under ``on_failure="raise"``); positions and velocities are finite; no element of
a ``"neo_hookean"`` body is inverted. On small cases the implicit gradients match central differences.

``check_steps`` is shared with ``benchmarks/fuzz_report.py``, which runs a larger campaign of the same cases.
"""
import math
import re
import warnings

import pytest
import torch
from hypothesis import HealthCheck, Phase, assume, event, given, settings
from hypothesis import strategies as st

import diffsoft
from diffsoft.body import SoftBody
from diffsoft.energies import MATERIALS, deformation_gradient, determinant
from diffsoft.mesh import box, rectangle
from diffsoft.simulator import Simulator, _step_energy

# No shrinking: a failing example is printed as found (shrinking a slow simulation can take many minutes).
_FUZZ = settings(derandomize=True, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def fuzz(max_examples):
    """Seeded (derandomized), no deadline, a bounded number of examples."""
    return settings(_FUZZ, max_examples=max_examples)


# --- cases -----------------------------------------------------------------------------------------------

def make_mesh(dim, cells, size, dtype):
    """``cells = 0``: a single triangle or tetrahedron; else a rectangle/box of ``cells`` (per axis) cells."""
    if cells == (0,) * len(cells):
        v = torch.cat([torch.zeros(1, dim), torch.eye(dim)]).to(dtype) * size
        return v, torch.arange(dim + 1).reshape(1, -1)
    if dim == 2:
        return rectangle(size * cells[0], size * cells[1], cells[0], cells[1], dtype=dtype)
    return box(tuple(size * c for c in cells), cells, dtype=dtype)


def make_case(dim, cells, size, material, youngs_modulus, poisson_ratio, density, dt, muscles, activation,
              height, impact, spin, noise, seed, dtype=torch.float64, fixed=None, **solver):
    """A simulator and a starting state ``(sim, x0, v0, activation)`` from plain parameters (hypothesis draws
    them here; the fuzz report draws them from a seeded RNG).

    ``size``: cell edge (m); ``muscles``: vertex-pair seeds, reduced modulo the vertex count; ``height``: the
    lowest vertex's height above the ground in cell sizes (negative: starting inside it); ``impact``: the
    downward speed (m/s); ``spin``: the scale (1/s) of a random velocity field relative to the size;
    ``noise``: a random displacement of the vertices in cell sizes (small enough to invert nothing).
    """
    v, t = make_mesh(dim, cells, size, dtype)
    n = len(v)
    pairs = sorted({tuple(sorted((a % n, b % n))) for a, b in muscles if a % n != b % n})
    body = SoftBody(v, t, material=material, density=density, youngs_modulus=youngs_modulus,
                    poisson_ratio=poisson_ratio, muscles=pairs or None, fixed=fixed, dtype=dtype)
    sim = Simulator(body, dt=dt, **solver)
    g = torch.Generator().manual_seed(seed)
    x0 = v + noise * size * (torch.rand(v.shape, generator=g, dtype=dtype) - 0.5)
    x0[:, 1] += height * size - x0[:, 1].min()
    v0 = spin * size * torch.randn(v.shape, generator=g, dtype=dtype)
    v0[:, 1] -= impact
    a = torch.full((len(pairs),), activation, dtype=dtype) if pairs else None
    return sim, x0, v0, a


cells_2d = st.one_of(st.just((0, 0)), st.tuples(st.integers(1, 4), st.integers(1, 3)))
cells_3d = st.one_of(st.just((0, 0, 0)), st.tuples(st.integers(1, 2), st.integers(1, 2), st.integers(1, 2)))
log_uniform = lambda lo, hi: st.floats(math.log10(lo), math.log10(hi)).map(lambda e: 10.0 ** e)  # noqa: E731


@st.composite
def cases(draw, dt_range=(1e-4, 1.0), stiffness=(1e1, 1e7), impact=30.0):
    dim = draw(st.sampled_from([2, 3]))
    return dict(
        dim=dim, cells=draw(cells_2d if dim == 2 else cells_3d), size=draw(log_uniform(0.02, 1.0)),
        material=draw(st.sampled_from(MATERIALS)), youngs_modulus=draw(log_uniform(*stiffness)),
        poisson_ratio=draw(st.floats(0.0, 0.45)), density=draw(log_uniform(10.0, 3000.0)),
        dt=draw(log_uniform(*dt_range)),
        muscles=draw(st.lists(st.tuples(st.integers(0, 63), st.integers(0, 63)), max_size=3)),
        activation=draw(st.floats(0.3, 1.0)), height=draw(st.floats(-0.05, 5.0)),
        impact=draw(st.one_of(st.just(0.0), st.floats(0.0, impact))), spin=draw(log_uniform(1e-3, 10.0)),
        noise=draw(st.floats(0.0, 0.1)), seed=draw(st.integers(0, 2**16)))


# --- the properties ----------------------------------------------------------------------------------------

def residual_norm(sim, x0, v0, a, x1):
    """``max over problems |grad E(x1)|`` of the step's objective, by autograd on the plain-torch reference
    energy in float64 (whatever the simulator's dtype): an oracle independent of the fused derivatives the
    solver uses and of float32 round-off."""
    f64 = torch.float64
    sim = sim.to(dtype=f64)
    x0, v0, x1 = x0.to(f64), v0.to(f64), x1.to(f64)
    a = None if a is None else a.to(f64)
    body, s, h = sim.body, sim._static, sim.dt
    x0_free, v0_free = x0[..., s.free, :], v0[..., s.free, :]
    volume = 1.0 / (math.factorial(body.dim) * determinant(body.Dm_inv).abs())
    mu, lam = (body.mu, body.lam) if body.material == "algovivo" else (body.mu * volume, body.lam * volume)
    if a is None and body.num_muscles:
        a = torch.ones(body.num_muscles, dtype=f64)
    y = x1[..., s.free, :].detach().requires_grad_()
    with torch.enable_grad():
        e = _step_energy(y, x0_free + h * v0_free, x0, x0_free, body.mass[s.free], body.Dm_inv, mu, lam, a,
                         body.muscle_rest_length, body.muscle_stiffness, sim.gravity, sim.contact_stiffness,
                         sim.friction, s)
        (g,) = torch.autograd.grad(e.sum(), y)
    return g.flatten(-2).norm(dim=-1).max().item()


def min_det_f(sim, x):
    return determinant(deformation_gradient(x, sim.body.elements, sim.body.Dm_inv)).min().item()


def check_steps(sim, x0, v0, a, steps):
    """Runs ``steps`` steps with ``on_failure="warn"`` and checks the properties of each; a step that did not
    converge is replayed with ``on_failure="raise"``, which must raise ConvergenceError.

    Returns one outcome per step: ``"converged"`` or ``"reported"`` (failure reported correctly). Violations
    raise AssertionError, so a crash, a non-finite value, an inverted element, a converged claim that the
    reference residual contradicts, or a silent failure all fail the caller.
    """
    sim.solver_options["on_failure"] = "warn"
    rtol = sim.solver_options["rtol"] or (1e-8 if sim.body.dtype == torch.float64 else 1e-4)
    eps = torch.finfo(sim.body.dtype).eps
    outcomes = []
    x, v = x0, v0
    for t in range(steps):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x1, v1, info = sim.step(x, v, a, return_info=True)
        failures = [w for w in caught if issubclass(w.category, RuntimeWarning) and "converge" in str(w.message)]
        assert torch.isfinite(x1).all() and torch.isfinite(v1).all(), f"step {t}: non-finite state ({info.message})"
        if sim.body.material == "neo_hookean":
            assert min_det_f(sim, x1) > 0, f"step {t}: an element inverted"
        assert len(info.problem_converged) == (x.shape[0] if x.dim() == 3 else 1)
        if info.converged:
            assert not failures, f"step {t}: converged but warned: {failures[0].message}"
            assert all(info.problem_converged)
            tol = max(sim.solver_options["atol"], rtol * info.grad_norm_initial)
            # The reference and fused gradients agree to round-off in the force terms they sum.
            slack = 1e3 * eps * (sim._force_scale() + info.grad_norm_initial)
            assert residual_norm(sim, x, v, a, x1) <= 1.01 * tol + slack, f"step {t}: claims convergence"
            outcomes.append("converged")
        else:
            assert failures, f"step {t}: did not converge, and said nothing ({info.message})"
            assert info.message and info.message != "converged"
            assert not all(info.problem_converged)
            if x.dim() == 3:  # a batch: the message names the creatures that failed
                failed = {i for i, ok in enumerate(info.problem_converged) if not ok}
                named = {int(i) for group in re.findall(r"problem\(s\) ([\d, ]+)", info.message)
                         for i in group.replace(",", " ").split()}
                assert failed <= named or len(failed) > 10, f"step {t}: {sorted(failed)} not in {info.message!r}"
            sim.solver_options["on_failure"] = "raise"
            try:
                with pytest.raises(diffsoft.ConvergenceError, match=re.escape(info.message[:40])):
                    sim.step(x, v, a)
            finally:
                sim.solver_options["on_failure"] = "warn"
            outcomes.append("reported")
        x, v = x1.detach(), v1.detach()
    return outcomes


@fuzz(60)
@given(case=cases())
def test_random_steps_converge_or_say_so(case):
    check_steps(*make_case(**case), steps=3)


@fuzz(20)
@given(case=cases(impact=100.0), dtype=st.just(torch.float32))
def test_random_steps_in_float32_converge_or_say_so(case, dtype):
    check_steps(*make_case(**case, dtype=dtype), steps=2)


@fuzz(15)
@given(case=cases(dt_range=(0.05, 1.0), stiffness=(1e5, 1e7), impact=100.0))
def test_violent_impacts_of_stiff_bodies_with_large_steps(case):
    check_steps(*make_case(**{**case, "height": min(case["height"], 0.2)}), steps=3)


@fuzz(12)
@given(case=cases(), batch=st.integers(2, 4), bad=st.integers(0, 3), shared_activation=st.booleans())
def test_batched_steps_flag_each_problem(case, batch, bad, shared_activation):
    """One problem of the batch is hit much harder than the others, with max_iter=3: the per-problem flags
    must match the problems' unbatched solves. The activation is ``(M,)`` (shared) or ``(B, M)``."""
    sim, x0, v0, a = make_case(**case, max_iter=3)
    xs, vs = x0.repeat(batch, 1, 1), v0.repeat(batch, 1, 1)
    xs[:, :, 1] += 0.1 * case["size"] * torch.arange(batch, dtype=x0.dtype)[:, None]
    vs[bad % batch, :, 1] -= 50.0
    if a is not None and not shared_activation:
        a = a.expand(batch, -1).clone()
    check_steps(sim, xs, vs, a, steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _, _, info = sim.step(xs, vs, a, return_info=True)
        for i in range(batch):
            alone = sim.step(xs[i], vs[i], None if a is None else a[i] if a.dim() == 2 else a, return_info=True)[2]
            event(f"problem {'converged' if alone.converged else 'failed'} alone")
            assert info.problem_converged[i] == alone.converged, i


# --- gradients against finite differences on small cases ---------------------------------------------------

@fuzz(15)
@given(case=cases(dt_range=(1e-3, 0.1), stiffness=(1e2, 1e5), impact=5.0), direction_seed=st.integers(0, 99))
def test_small_case_gradients_are_finite_and_match_central_differences(case, direction_seed):
    """Stiffness up to 1e5 here: finite differences of stiffer bodies are limited by round-off in the
    forward solves (their error is ~ tolerance / (smallest Hessian eigenvalue * eps)), not by the gradients."""
    case = {**case, "cells": tuple(min(c, 1) for c in case["cells"]), "muscles": [(0, 1)] + case["muscles"],
            "activation": min(case["activation"], 0.95)}
    sim, x0, v0, a = make_case(**case, rtol=1e-13, atol=1e-11, backward_rtol=1e-12, on_failure="raise")
    g = torch.Generator().manual_seed(direction_seed)
    w = torch.randn(x0.shape, generator=g, dtype=x0.dtype)
    mu = sim.body.mu.detach().clone()

    def loss(x0, v0, a, mu):
        sim.body.mu = mu
        x1, v1 = sim.step(x0, v0, a)
        return (w * x1).sum() + 1e-2 * sim.dt * (w * v1).sum()

    values = [x0, v0, a, mu]
    leaves = [t.clone().requires_grad_() for t in values]
    try:
        grads = torch.autograd.grad(loss(*leaves), leaves)
    except diffsoft.ConvergenceError:
        assume(False)  # the converge-or-say-so tests cover this; here only converged steps are compared
    for name, value, grad in zip(["x0", "v0", "activation", "mu"], values, grads):
        assert torch.isfinite(grad).all(), name
        magnitude = {"x0": case["size"], "v0": v0.abs().max().item() + case["size"], "activation": 0.1}
        d = torch.randn(value.shape, generator=g, dtype=value.dtype) * magnitude.get(name, value.abs())
        if name == "activation":
            d = d.clamp(-0.1, 0.1)
        fd = []
        for eps in (1e-5, 1e-6):
            with torch.no_grad():
                plus = [u + eps * d if u is value else u for u in values]
                minus = [u - eps * d if u is value else u for u in values]
                try:
                    fd.append((loss(*plus) - loss(*minus)).item() / (2 * eps))
                except diffsoft.ConvergenceError:  # the tight tolerance is out of round-off's reach there
                    break
        if len(fd) < 2:
            event("a perturbed solve did not reach the tight tolerance: not compared")
            continue
        scale = abs(fd[1]) + 1e-8 * (w.abs().sum().item() * case["size"])
        # Two step sizes that disagree mean a contact or friction kink lies within eps: not differentiable there.
        if abs(fd[0] - fd[1]) > 1e-4 * scale:
            event("finite differences disagree at two step sizes (a kink): not compared")
            continue
        event("compared with finite differences")
        assert (grad * d).sum().item() == pytest.approx(fd[1], rel=1e-4, abs=1e-4 * scale), name
    sim.body.mu = mu


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batched_step_with_one_activation_for_all_creatures(dtype):
    """``activation`` may be ``(M,)`` (shared by the batch), ``(B, M)`` or None (relaxed): the same steps."""
    from diffsoft import creatures

    sim = creatures.quadruped(dtype=dtype)
    x, v = sim.rest_state
    x, v = x.expand(3, -1, -1).clone(), v.expand(3, -1, -1).clone()
    m = sim.body.num_muscles
    for shared, per_creature in ((None, torch.ones(3, m, dtype=dtype)),
                                 (torch.full((m,), 0.8, dtype=dtype), torch.full((3, m), 0.8, dtype=dtype))):
        expected = sim.step(x, v, per_creature)[0]
        torch.testing.assert_close(sim.step(x, v, shared)[0], expected, rtol=0, atol=0)
