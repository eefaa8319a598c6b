"""Fuzzing Simulator.step (seeded hypothesis): random 2D and 3D meshes from one element up, materials over six
orders of magnitude of stiffness, activations, time steps from 1e-4 to 1 s and violent impacts with the ground.

Properties of every step: it converges (the gradient tolerance is met, checked independently on the
plain-torch reference energy) or it says it did not (``info.converged`` False with a RuntimeWarning, and
``diffsoft.ConvergenceError`` under ``on_failure="raise"``); positions and velocities are finite; no element of
a ``"neo_hookean"`` body is inverted. On small cases the implicit gradients match central differences.

The cases and ``check_steps`` live in ``tests/python/fuzzing.py``, shared with ``benchmarks/fuzz_report.py``,
which runs a larger campaign of the same cases.
"""
import warnings

import pytest
import torch
from hypothesis import assume, event, given
from hypothesis import strategies as st

import diffsoft

from fuzzing import cases, check_steps, fuzz, make_case


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
