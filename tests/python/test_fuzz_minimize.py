"""Fuzzing diffsoft.minimize (seeded hypothesis) with random smooth energies: convex, non-convex (double wells,
Rosenbrock valleys), unbounded below, and badly scaled (per-coordinate scales and overall energy scales over
many orders of magnitude), unbatched and batched (a summed energy, or one per problem), in float64 and float32.

Properties: the solve converges (the gradient tolerance is met, checked independently by autograd) or it says
it did not (a RuntimeWarning and ``info.converged`` False; ``ConvergenceError`` with ``on_failure="raise"``);
``x*`` is finite; the per-problem flags of a batch are right; implicit gradients are finite and, at strict
minima of small problems, match central differences of re-solved problems.

The energies, ``problems`` and ``check_solve`` live in ``tests/python/fuzzing.py``, shared with
``benchmarks/fuzz_report.py``.
"""
import warnings

import pytest
import torch
from hypothesis import assume, event, given
from hypothesis import strategies as st

import diffsoft

from fuzzing import check_solve, fuzz, make_problem, problems


@fuzz(120)
@given(problem=problems)
def test_random_energies_converge_or_say_so(problem):
    energy, x0, params, _ = make_problem(**problem)
    event(f"{problem['family']}: {check_solve(energy, x0, params)}")


@fuzz(40)
@given(problem=problems)
def test_random_energies_in_float32_converge_or_say_so(problem):
    energy, x0, params, _ = make_problem(**problem, dtype=torch.float32)
    event(f"{problem['family']}: {check_solve(energy, x0, params)}")


@fuzz(20)
@given(problem=problems, max_iter=st.integers(0, 3), rtol=st.sampled_from([None, 1e-12, 1e-15]))
def test_capped_or_unreachable_solves_say_so(problem, max_iter, rtol):
    energy, x0, params, _ = make_problem(**problem)
    check_solve(energy, x0, params, max_iter=max_iter, rtol=rtol)


@fuzz(30)
@given(family=st.sampled_from(["quartic", "double_well", "rosenbrock", "log_sum_exp"]), n=st.integers(1, 6),
       batch=st.one_of(st.none(), st.integers(1, 3)), coordinate_decades=st.floats(0.0, 1.0),
       energy_decades=st.floats(-3.0, 3.0), x0_scale=st.floats(0.0, 2.0), seed=st.integers(0, 2**16),
       per_problem=st.booleans())
def test_implicit_gradients_are_finite_and_match_central_differences(family, n, batch, coordinate_decades,
                                                                     energy_decades, x0_scale, seed, per_problem):
    energy, x0, params, _ = make_problem(family, n, batch, coordinate_decades, energy_decades, x0_scale, seed,
                                         per_problem=per_problem)
    # on_failure="raise" would stop at a tight re-solve that ends at round-off short of rtol; such solves are
    # still judged, by the finite differences below, so their warnings are expected here.
    tight = dict(rtol=1e-13, backward_rtol=1e-12, batched=batch is not None)
    leaves = [p.clone().requires_grad_() for p in params]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x, info = diffsoft.minimize(energy, x0, *leaves, return_info=True, **tight)
        assume(info.converged)  # an unreachable tolerance; the tests above check that it is reported
        w = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=x.dtype)
        grads = torch.autograd.grad((w * x).sum(), leaves[:2])
    assert all(torch.isfinite(gr).all() for gr in grads)
    if not info.backward_converged:  # a saddle (indefinite Hessian) or a singular one: it must have said so
        assert any("adjoint" in str(c.message) for c in caught)
        event("adjoint solve reported failure")
        return
    hess = torch.autograd.functional.hessian(lambda y: energy(y, *params).sum(), x.detach())
    eig = torch.linalg.eigvalsh(hess.reshape(x.numel(), x.numel()))
    assume(eig[0] > 1e-6 * eig[-1])  # finite differences need a strict, well-conditioned minimum
    g = torch.Generator().manual_seed(seed + 2)
    for i, grad in enumerate(grads):
        d = torch.randn(params[i].shape, generator=g, dtype=x.dtype) * params[i].abs().clamp(min=0.1)
        fd = []
        for eps in (1e-4, 1e-5):
            ends = []
            for sign in (1, -1):
                shifted = [p + sign * eps * d if j == i else p for j, p in enumerate(params)]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    ends.append((w * diffsoft.minimize(energy, x.detach(), *shifted, **tight)).sum().item())
            fd.append((ends[0] - ends[1]) / (2 * eps))
        scale = abs(fd[1]) + 1e-6 * w.abs().sum().item() * x.abs().max().item()
        assert (grad * d).sum().item() == pytest.approx(fd[1], rel=1e-4, abs=1e-4 * scale), ["b", "k"][i]
    event("compared with finite differences")


def test_unbounded_energy_fails_loudly_with_finite_iterates():
    energy, x0, params, _ = make_problem("unbounded", 5, None, 0.0, 0.0, 1.0, seed=0)
    assert check_solve(energy, x0, params) == "reported"


def test_a_diverging_problem_does_not_stop_the_others_in_a_batch():
    """Problem 1 of 3 has no minimum; problems 0 and 2 converge alone in a few iterations. With per-problem
    energies (shape (B,)) each problem has its own line search: 0 and 2 must converge and only 1 be named.
    With a summed energy the line search is shared, so 0 may be left unconverged, but the flags must be
    honest and the message must name every failed problem."""
    def per_problem(x, k, c):
        return (0.5 * k[:, None] * x * x + 0.25 * c[:, None] * x ** 4).sum(-1)

    def summed(x, k, c):
        return per_problem(x, k, c).sum()

    x0 = torch.ones(3, 4, dtype=torch.float64)
    k = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)
    c = torch.tensor([1.0, -4.0, 1.0], dtype=torch.float64)
    for i in (0, 2):
        alone = diffsoft.minimize(summed, x0[i:i + 1], k[i:i + 1], c[i:i + 1], batched=True, return_info=True)[1]
        assert alone.converged
    with pytest.warns(RuntimeWarning, match=r"problem\(s\) 1(?![,\d])"):
        x, info = diffsoft.minimize(per_problem, x0, k, c, batched=True, return_info=True)
    assert torch.isfinite(x).all()
    assert info.problem_converged == [True, False, True]
    assert check_solve(summed, x0, (k, c)) == "reported"


@fuzz(25)
@given(n=st.integers(1, 12), d=st.integers(1, 3), springs=st.integers(0, 30), drop=st.booleans(),
       batched=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_fuzz_sparsity_pattern_matches_the_matrix_free_path(n, d, springs, drop, batched, seed):
    """Random spring networks (convex: quadratic + quartic springs, and anchors) with their pattern, or with a
    pattern missing some springs: the coloured-probe factorization gives the matrix-free path's x* and
    gradients (a missing coupling only costs speed)."""
    g = torch.Generator().manual_seed(seed)
    pairs = torch.randint(0, n, (springs, 2), generator=g)
    pattern = pairs[: springs // 2] if drop else pairs
    shape = ((2,) if batched else ()) + (n, d)
    target = torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_()

    def energy(x, target):
        s = (x[..., pairs[:, 0], :] - x[..., pairs[:, 1], :]).square().sum(-1)
        per = (0.5 * s + 0.25 * s * s).sum(-1) + 0.5 * (x - target).square().sum((-2, -1))
        return per

    out = []
    for sparsity in (None, pattern):
        x, info = diffsoft.minimize(energy, torch.zeros(shape, dtype=torch.float64), target, batched=batched,
                                    sparsity=sparsity, rtol=1e-10, return_info=True, on_failure="raise")
        assert torch.isfinite(x).all()
        (grad,) = torch.autograd.grad(x.square().sum(), target)
        out.append((x, grad))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=0, atol=1e-8)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-6, atol=1e-8)
