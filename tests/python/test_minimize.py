"""The implicit layer diffsoft.minimize: solutions, implicit gradients and errors."""
import threading
import warnings

import pytest
import torch
from torch.autograd import gradcheck

import diffsoft
from diffsoft._minimize import default_backward_rtol

from conftest import F64



def quadratic(x, a, b):
    return 0.5 * x @ (a @ x) - b @ x


def spd(n, seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(n, n, generator=g, dtype=F64)
    return m @ m.T + n * torch.eye(n, dtype=F64)


def quartic(x, k, b):
    return 0.5 * (k * x * x).sum() + 0.25 * (x**4).sum() - (b * x).sum()


def coupled(x, w, c):
    """Parameters enter nonlinearly: exp, softplus and a coupling matrix."""
    y = w @ x
    return (torch.nn.functional.softplus(c) * torch.cosh(y - c)).sum() + 0.5 * (x * x).sum() * torch.exp(c[0])


def barrier(x, s, t):
    """A log barrier: infinite outside x > 0, so the line search must reject such steps."""
    return (s * x - torch.log(x) * t.square()).sum() + 0.5 * (x[1:] - x[:-1]).square().sum()


def test_quadratic_matches_linear_solve_and_its_gradients():
    n = 12
    a = spd(n, 0).requires_grad_()
    b = torch.randn(n, dtype=F64, requires_grad=True)
    x, info = diffsoft.minimize(quadratic, torch.zeros(n, dtype=F64), a, b, rtol=1e-12, return_info=True)
    assert info.converged and info.grad_norm <= 1e-12 * info.grad_norm_initial
    a_ref = a.detach().clone().requires_grad_()
    b_ref = b.detach().clone().requires_grad_()
    # 0.5 x^T A x has gradient sym(A) x, so the reference solves with the symmetric part.
    x_ref = torch.linalg.solve(0.5 * (a_ref + a_ref.T), b_ref)
    torch.testing.assert_close(x, x_ref, rtol=1e-9, atol=1e-10)
    w = torch.randn(n, dtype=F64)
    (x @ w).backward()
    (x_ref @ w).backward()
    torch.testing.assert_close(b.grad, b_ref.grad, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(a.grad, a_ref.grad, rtol=1e-8, atol=1e-10)


def test_quartic_gradients_match_closed_form():
    torch.manual_seed(0)
    k = (torch.rand(100, dtype=F64) + 1).requires_grad_()
    b = torch.randn(100, dtype=F64, requires_grad=True)
    x, info = diffsoft.minimize(quartic, torch.zeros(100, dtype=F64), k, b, rtol=1e-12, return_info=True)
    x.square().sum().backward()
    xs = x.detach()
    lam = 2 * xs / (k.detach() + 3 * xs**2)  # diagonal Hessian
    torch.testing.assert_close(b.grad, lam, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(k.grad, -lam * xs, rtol=1e-8, atol=1e-10)
    assert info.backward_ran and info.backward_converged and info.backward_cg_iterations > 0
    assert info.backward_residual <= 1e-10


@pytest.mark.parametrize(
    "energy,make",
    [
        (quartic, lambda: (torch.rand(6, dtype=F64) + 1, torch.randn(6, dtype=F64))),
        (coupled, lambda: (0.3 * torch.randn(4, 5, dtype=F64), 0.5 * torch.randn(4, dtype=F64))),
        (barrier, lambda: (torch.rand(5, dtype=F64) + 0.5, torch.rand(5, dtype=F64) + 0.5)),
    ],
    ids=["quartic", "coupled", "barrier"],
)
def test_gradcheck_nonlinear_energies(energy, make):
    torch.manual_seed(1)
    params = [p.requires_grad_() for p in make()]
    n = params[0].shape[-1]
    x0 = torch.ones(n, dtype=F64)

    def solve(*ps):
        return diffsoft.minimize(energy, x0, *ps, rtol=1e-13, on_failure="raise")

    assert gradcheck(solve, params, eps=1e-6, atol=1e-6, rtol=1e-5)


def unrolled_newton(energy, x0, params, iterations=30):
    """Plain PyTorch reference: dense Newton with the graph kept through every iteration."""
    x = x0.clone()
    for _ in range(iterations):
        g = torch.autograd.grad(energy(x, *params), x, create_graph=True)[0] if x.requires_grad else None
        if g is None:
            x = x.requires_grad_()
            g = torch.autograd.grad(energy(x, *params), x, create_graph=True)[0]
        h = torch.stack([torch.autograd.grad(g[i], x, create_graph=True)[0] for i in range(x.numel())])
        x = x - torch.linalg.solve(h, g)
    return x


def test_implicit_gradient_matches_unrolled_converged_solve():
    torch.manual_seed(2)
    w = (0.3 * torch.randn(4, 5, dtype=F64)).requires_grad_()
    c = (0.5 * torch.randn(4, dtype=F64)).requires_grad_()
    x0 = torch.ones(5, dtype=F64)
    x = diffsoft.minimize(coupled, x0, w, c, rtol=1e-13)
    x_ref = unrolled_newton(coupled, x0, (w, c))
    torch.testing.assert_close(x, x_ref, rtol=1e-10, atol=1e-12)
    v = torch.randn(5, dtype=F64)
    g_impl = torch.autograd.grad(x @ v, (w, c))
    g_unrolled = torch.autograd.grad(x_ref @ v, (w, c))
    for a, b in zip(g_impl, g_unrolled):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_central_finite_differences():
    torch.manual_seed(3)
    k = torch.rand(8, dtype=F64) + 1
    b = torch.randn(8, dtype=F64, requires_grad=True)
    v = torch.randn(8, dtype=F64)
    x0 = torch.zeros(8, dtype=F64)

    def loss(b_):
        return diffsoft.minimize(quartic, x0, k, b_, rtol=1e-14) @ v

    (g,) = torch.autograd.grad(loss(b), b)
    h = 1e-6
    for i in range(8):
        e = torch.zeros(8, dtype=F64)
        e[i] = h
        fd = (loss(b.detach() + e) - loss(b.detach() - e)) / (2 * h)
        assert abs(fd.item() - g[i].item()) < 1e-7


def double_well(x, b):
    return ((x * x - 1) ** 2).sum() + 0.1 * (x[1:] - x[:-1]).square().sum() - (b * x).sum()


def test_nonconvex_start_at_indefinite_hessian_reaches_a_minimum():
    n = 6
    b = torch.linspace(-0.2, 0.2, n, dtype=F64)
    x0 = torch.zeros(n, dtype=F64)  # Hessian -4 I + coupling: indefinite
    h0 = torch.autograd.functional.hessian(lambda x: double_well(x, b), x0)
    assert torch.linalg.eigvalsh(h0).min() < 0
    x, info = diffsoft.minimize(double_well, x0, b, return_info=True)
    assert info.converged
    h = torch.autograd.functional.hessian(lambda x: double_well(x, b), x)
    assert torch.linalg.eigvalsh(h).min() > 0
    assert info.energy < double_well(x0, b).item()


def test_batched_problems_match_separate_solves_and_converge_per_problem():
    torch.manual_seed(4)
    batch, n = 5, 7
    k = (torch.rand(batch, n, dtype=F64) + 1).requires_grad_()
    b = (torch.randn(batch, n, dtype=F64) * torch.logspace(-3, 3, batch, dtype=F64)[:, None]).requires_grad_()
    x, info = diffsoft.minimize(quartic, torch.zeros(batch, n, dtype=F64), k, b, batched=True, return_info=True)
    assert info.converged and info.problem_converged == [True] * batch
    v = torch.randn(batch, n, dtype=F64)
    gk, gb = torch.autograd.grad((x * v).sum(), (k, b))
    for i in range(batch):
        ki, bi = k[i].detach().requires_grad_(), b[i].detach().requires_grad_()
        xi = diffsoft.minimize(quartic, torch.zeros(n, dtype=F64), ki, bi)
        # Each problem meets its own relative tolerance, even the one 1e6 times smaller than the largest.
        torch.testing.assert_close(x[i], xi, rtol=1e-7, atol=1e-12 * bi.abs().max().item())
        gki, gbi = torch.autograd.grad(xi @ v[i], (ki, bi))
        torch.testing.assert_close(gk[i], gki, rtol=1e-6, atol=1e-12)
        torch.testing.assert_close(gb[i], gbi, rtol=1e-6, atol=1e-12)


def test_float32_and_any_shape():
    k = torch.rand(3, 4, 2) + 1
    b = torch.randn(3, 4, 2, requires_grad=True)
    x, info = diffsoft.minimize(quartic, torch.zeros(3, 4, 2), k, b, return_info=True)
    assert x.dtype == torch.float32 and x.shape == (3, 4, 2) and info.converged
    x.sum().backward()
    assert b.grad.dtype == torch.float32 and torch.isfinite(b.grad).all()


def test_non_tensor_params_pass_through():
    def energy(x, scale, kind, b):
        assert kind == "soft"
        return scale * 0.5 * (x * x).sum() - (b * x).sum()

    b = torch.randn(3, dtype=F64, requires_grad=True)
    x = diffsoft.minimize(energy, torch.zeros(3, dtype=F64), 2.0, "soft", b)
    torch.testing.assert_close(x, b / 2)
    x.sum().backward()
    torch.testing.assert_close(b.grad, torch.full((3,), 0.5, dtype=F64))


def test_no_param_requires_grad_gives_plain_tensor():
    x = diffsoft.minimize(quartic, torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64), torch.ones(3, dtype=F64))
    assert not x.requires_grad


def test_threads_give_the_same_results_without_deadlock():
    torch.manual_seed(5)
    ks = [torch.rand(20, dtype=F64) + 1 for _ in range(4)]
    bs = [torch.randn(20, dtype=F64) for _ in range(4)]

    def run(i):
        b = bs[i].clone().requires_grad_()
        x = diffsoft.minimize(quartic, torch.zeros(20, dtype=F64), ks[i], b)
        x.square().sum().backward()
        return x.detach(), b.grad

    expected = [run(i) for i in range(4)]
    results = [None] * 4

    def worker(i):
        for _ in range(5):
            results[i] = run(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    for (x, g), (xe, ge) in zip(results, expected):
        torch.testing.assert_close(x, xe, rtol=0, atol=0)
        torch.testing.assert_close(g, ge, rtol=0, atol=0)


# ---- non-convergence is reported, never silent -------------------------------------------------------------


def test_nonconvergence_warns_with_the_failed_criterion():
    b = torch.randn(10, dtype=F64)
    with pytest.warns(RuntimeWarning, match="max_iter = 1 Newton iterations"):
        x, info = diffsoft.minimize(quartic, torch.zeros(10, dtype=F64) + 5, torch.ones(10, dtype=F64), b,
                                    max_iter=1, return_info=True)
    assert not info.converged and "tolerance" in info.message and info.iterations == 1


def test_nonconvergence_raises_when_asked():
    with pytest.raises(diffsoft.ConvergenceError, match="max_iter") as raised:
        diffsoft.minimize(quartic, torch.zeros(10, dtype=F64) + 5, torch.ones(10, dtype=F64),
                          torch.randn(10, dtype=F64), max_iter=1, on_failure="raise")
    assert raised.value.info.problem_converged == [False] and raised.value.info.iterations == 1


def test_unbounded_energy_reports_line_search_or_iteration_failure():
    def unbounded(x, b):
        return -(b * x).sum() - (x**4).sum()

    with pytest.raises(diffsoft.ConvergenceError):
        diffsoft.minimize(unbounded, torch.ones(3, dtype=F64), torch.ones(3, dtype=F64), on_failure="raise")


def test_adjoint_failure_warns_in_backward_and_is_recorded():
    n = 30
    a = spd(n, 6)
    b = torch.randn(n, dtype=F64, requires_grad=True)
    x, info = diffsoft.minimize(quadratic, torch.zeros(n, dtype=F64), a, b, backward_max_iter=1, return_info=True)
    with pytest.warns(UserWarning, match="adjoint solve failed"):
        x.square().sum().backward()
    assert info.backward_ran and not info.backward_converged and info.backward_cg_iterations == 1
    assert "backward_max_iter" in info.backward_message


def test_adjoint_failure_raises_when_asked():
    n = 30
    b = torch.randn(n, dtype=F64, requires_grad=True)
    x = diffsoft.minimize(quadratic, torch.zeros(n, dtype=F64), spd(n, 7), b, backward_max_iter=1,
                          on_failure="raise")
    with pytest.raises(RuntimeError, match="adjoint solve failed"):
        x.sum().backward()


# ---- bad input gets a clear exception ----------------------------------------------------------------------


def test_energy_must_be_0_dim():
    with pytest.raises(ValueError, match="0-dim tensor, got shape \\[3\\]"):
        diffsoft.minimize(lambda x: x * x, torch.zeros(3, dtype=F64))


def test_energy_must_return_a_tensor():
    with pytest.raises(ValueError, match="must return a torch.Tensor, got float"):
        diffsoft.minimize(lambda x: 1.0, torch.zeros(3, dtype=F64))


def test_energy_not_finite_at_x0():
    with pytest.raises(ValueError, match="not finite at x0"):
        diffsoft.minimize(lambda x: torch.log(x).sum(), -torch.ones(3, dtype=F64))


def test_gradient_not_finite_at_x0():
    with pytest.raises(ValueError, match="not finite at x0"):
        diffsoft.minimize(lambda x: torch.sqrt(x).sum(), torch.zeros(3, dtype=F64))


def test_x0_checks():
    for dtype in (torch.long, torch.float16, torch.bfloat16, torch.complex128):
        with pytest.raises(TypeError, match=f"float32 or float64 tensor .*got {dtype}"):
            diffsoft.minimize(lambda x: x.sum(), torch.zeros(3, dtype=dtype))
    with pytest.raises(TypeError, match="torch.Tensor"):
        diffsoft.minimize(lambda x: x.sum(), [0.0, 1.0])
    with pytest.raises(ValueError, match="non-finite"):
        diffsoft.minimize(lambda x: (x * x).sum(), torch.tensor([0.0, float("nan")], dtype=F64))
    with pytest.raises(TypeError, match="callable"):
        diffsoft.minimize(3, torch.zeros(3, dtype=F64))


def test_params_device_and_dtype_must_match_x0():
    with pytest.raises(TypeError, match="params\\[0\\] has dtype torch.float32"):
        diffsoft.minimize(quartic, torch.zeros(3, dtype=F64), torch.ones(3), torch.ones(3, dtype=F64))
    with pytest.raises(ValueError, match="params\\[1\\] is on meta"):
        diffsoft.minimize(quartic, torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64),
                          torch.ones(3, dtype=F64, device="meta"))


@pytest.mark.parametrize(
    "option,value",
    [("rtol", 2.0), ("rtol", -1e-3), ("atol", -1.0), ("atol", float("nan")), ("max_iter", -1), ("max_iter", 2.5),
     ("cg_rtol", 0.0), ("cg_rtol", 1.0), ("cg_max_iter", 0), ("backward_rtol", 1.5), ("backward_max_iter", -3),
     ("ls_c1", 0.7), ("ls_shrink", 1.0), ("ls_max_iter", 0), ("on_failure", "ignore")],
)
def test_options_out_of_range(option, value):
    with pytest.raises(ValueError, match=option):
        diffsoft.minimize(quartic, torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64), torch.ones(3, dtype=F64),
                          **{option: value})


def test_user_exception_in_energy_propagates():
    def energy(x):
        raise KeyError("my energy broke")

    with pytest.raises(KeyError, match="my energy broke"):
        diffsoft.minimize(energy, torch.zeros(3, dtype=F64))


def test_per_problem_energies_give_each_problem_its_own_line_search():
    """One problem of the batch is unbounded below: it is reported, and the others still converge."""

    def energy(x, c):  # (B,) energies; c = -1 turns the quartic upside down
        return c * 0.25 * (x**4).sum(1) + 0.5 * (x * x).sum(1) - x.sum(1)

    c = torch.tensor([1.0, -1.0, 1.0], dtype=F64)
    x0 = torch.full((3, 4), 2.0, dtype=F64)
    with pytest.warns(RuntimeWarning, match="problem\\(s\\) 1"):
        x, info = diffsoft.minimize(energy, x0, c, batched=True, return_info=True)
    assert info.problem_converged == [True, False, True]
    g = x**3 + x - 1
    assert g[0].norm() < 1e-6 and g[2].norm() < 1e-6


@pytest.mark.parametrize("batched", (False, True))
def test_a_taken_trial_step_is_not_evaluated_again(batched):
    """The line search evaluates each backtracking trial with its graph, and Newton's next iteration builds its
    gradient from the trial it took rather than calling the energy again: one call per trial, one for the
    start, and one for the captured-tensor check; the same minimiser and implicit gradient as differentiating
    the optimality condition at it."""
    calls = []

    def energy(x, k, b):
        calls.append(torch.is_grad_enabled())
        e = 0.5 * (k * x * x).sum(-1) + 0.25 * (x ** 4).sum(-1) - (b * x).sum(-1)
        return e if batched else e.sum()

    g = torch.Generator().manual_seed(0)
    shape = (3, 5) if batched else (5,)
    # Newton's steps shorter than 1 (longer ones are first tried along a ladder of trials without graphs)
    k = (torch.rand(shape, generator=g, dtype=F64) + 1).requires_grad_()
    b = (0.6 * torch.rand(shape, generator=g, dtype=F64) + 0.2).requires_grad_()
    x, info = diffsoft.minimize(energy, torch.zeros(shape, dtype=F64), k, b, batched=batched, return_info=True)
    assert info.converged and info.iterations >= 3
    assert len(calls) == 2 + info.line_search_steps, (len(calls), info.iterations, info.line_search_steps)
    assert all(calls)  # every trial with its graph
    torch.testing.assert_close(k * x + x ** 3, b.detach(), rtol=0, atol=1e-9)
    # dx/db = (k + 3 x^2)^-1 elementwise, dx/dk = -x (k + 3 x^2)^-1
    gk, gb = torch.autograd.grad(x.sum(), (k, b))
    curvature = k.detach() + 3 * x.detach() ** 2
    torch.testing.assert_close(gb, 1 / curvature, rtol=1e-8, atol=0)
    torch.testing.assert_close(gk, -x.detach() / curvature, rtol=1e-8, atol=0)


def test_the_solvers_graphs_are_freed_after_the_solve_and_its_backward():
    """The graphs that Newton builds of its own (under identity-like saved-tensor hooks that keep the caller's
    hooks off them) are freed: an op that saves its output (exp) saved as itself held its own graph node, a
    reference cycle across C++ that leaked every graph (2 GB in 21 solves of an 8 MB intermediate)."""
    import gc
    import weakref

    refs = []
    line = torch.linspace(0, 1e-3, 1000, dtype=F64)

    def energy(x, b):
        big = torch.exp(x.unsqueeze(-1) * line)
        refs.append(weakref.ref(big))
        return torch.sqrt(1 + (x - b) ** 2).sum() + 1e-6 * big.sum()

    b = torch.ones(20, dtype=F64, requires_grad=True)
    x = diffsoft.minimize(energy, torch.full((20,), 1.8, dtype=F64), b)
    x.sum().backward()
    del x
    gc.collect()
    assert len(refs) > 3 and not [r for r in refs if r() is not None]


def test_per_problem_energy_shape_needs_batched():
    with pytest.raises(ValueError, match="0-dim tensor, got shape \\[2\\]"):
        diffsoft.minimize(lambda x: (x * x).sum(1), torch.ones(2, 3, dtype=F64))
    with pytest.raises(ValueError, match="one energy per problem, shape \\[2\\]"):
        diffsoft.minimize(lambda x: (x * x).sum(0), torch.ones(2, 3, dtype=F64), batched=True)


def test_batched_scalar_and_per_problem_energies_agree():
    torch.manual_seed(8)
    k = torch.rand(4, 6, dtype=F64) + 1
    b = torch.randn(4, 6, dtype=F64, requires_grad=True)

    def per_problem(x, k, b):
        return (0.5 * k * x * x + 0.25 * x**4 - b * x).sum(1)

    x1 = diffsoft.minimize(quartic, torch.zeros(4, 6, dtype=F64), k, b, batched=True, rtol=1e-12)
    x2 = diffsoft.minimize(per_problem, torch.zeros(4, 6, dtype=F64), k, b, batched=True, rtol=1e-12)
    torch.testing.assert_close(x1, x2, rtol=1e-10, atol=1e-12)
    g1, g2 = (torch.autograd.grad(x.square().sum(), b)[0] for x in (x1, x2))
    torch.testing.assert_close(g1, g2, rtol=1e-8, atol=1e-12)


def test_the_graph_holds_one_node_not_the_newton_iterations():
    """Backward memory does not grow with Newton's iterations: x* hangs from one node whose inputs are the
    parameters, however many iterations the forward took."""
    b = torch.randn(50, dtype=F64, requires_grad=True)
    k = torch.rand(50, dtype=F64) + 1
    x, info = diffsoft.minimize(quartic, torch.full((50,), 30.0, dtype=F64), k, b, return_info=True)
    assert info.iterations > 5
    node = x.grad_fn
    inputs = [fn for fn, _ in node.next_functions if fn is not None]
    assert len(inputs) == 1 and type(inputs[0]).__name__ == "AccumulateGrad"


def test_import_under_another_torch_says_rebuild(monkeypatch):
    import importlib
    import sys
    import types

    fake = types.ModuleType("diffsoft._build_info")
    fake.TORCH_VERSION = "0.0.0-not-this-torch"
    monkeypatch.setitem(sys.modules, "diffsoft._build_info", fake)
    with pytest.raises(ImportError, match="built against torch 0.0.0-not-this-torch .* rebuild"):
        importlib.reload(importlib.import_module("diffsoft._extension"))
    monkeypatch.undo()
    importlib.reload(importlib.import_module("diffsoft._extension"))


def _sheet(n=6):
    """A neo-Hookean sheet's step energy written as a user energy (plain torch), and its triangles."""
    from diffsoft.energies import elastic_energy

    verts, tris = diffsoft.mesh.rectangle(width=1.0, height=0.5, nx=n - 1, ny=n // 2, dtype=torch.float64)
    body = diffsoft.SoftBody(verts, tris, density=100.0, youngs_modulus=1e3, poisson_ratio=0.3)

    def energy(x, x_hat, mu, pull):
        inertia = 0.5 * (body.mass[:, None] * (x - x_hat) ** 2).sum((-2, -1)) / 0.01 ** 2
        e = elastic_energy(x, body.elements, body.Dm_inv, mu, body.lam, body.material, body.rest_volume)
        return inertia + e - pull * x[..., -1, 0]

    return body, energy


def test_sparsity_gives_the_same_minimiser_and_gradients_by_factorization():
    body, energy = _sheet()
    x_hat = (body.rest_positions * 1.05).requires_grad_()
    mu = body.mu.clone().requires_grad_()
    pull = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    out = []
    for sparsity in (None, body.elements):
        x, info = diffsoft.minimize(energy, body.rest_positions, x_hat, mu, pull, sparsity=sparsity, rtol=1e-11,
                                    return_info=True, on_failure="raise")
        w = torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
        grads = torch.autograd.grad((w * x).sum(), (x_hat, mu, pull))
        out.append((x, grads, info))
    (x0, g0, i0), (x1, g1, i1) = out
    assert i0.cg_iterations > 0 and i0.factorizations == 0
    assert i1.cg_iterations == 0 and i1.factorizations > 0 and i1.backward_direct
    assert i1.iterations <= i0.iterations
    torch.testing.assert_close(x1, x0, rtol=0, atol=1e-10)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9 * b.abs().max().item())


def test_sparsity_batched_and_with_a_pattern_that_misses_couplings():
    body, energy = _sheet()
    x_hat = torch.stack([body.rest_positions * 1.05, body.rest_positions * 0.97]).requires_grad_()
    mu, pull = body.mu, torch.tensor(3.0, dtype=torch.float64)
    reference = diffsoft.minimize(energy, x_hat.detach(), x_hat, mu, pull, batched=True, rtol=1e-11)
    (g_ref,) = torch.autograd.grad(reference.square().sum(), x_hat)
    for pattern in (body.elements, body.elements[:, :2]):  # the second keeps one edge of each triangle
        x, info = diffsoft.minimize(energy, x_hat.detach(), x_hat, mu, pull, batched=True, rtol=1e-11,
                                    sparsity=pattern, return_info=True)
        (g,) = torch.autograd.grad(x.square().sum(), x_hat)
        assert info.converged
        torch.testing.assert_close(x, reference, rtol=0, atol=1e-9)
        torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-8)


def test_bad_sparsity_is_refused_by_name():
    body, energy = _sheet()
    args = (body.rest_positions, body.rest_positions, body.mu, torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(TypeError, match="sparsity must be an .E, k. int64"):
        diffsoft.minimize(energy, *args, sparsity=body.elements.double())
    with pytest.raises(ValueError, match="out of range"):
        diffsoft.minimize(energy, *args, sparsity=body.elements + body.num_vertices)
    with pytest.raises(ValueError, match="x0 must be .N, d."):
        diffsoft.minimize(energy, args[0].reshape(-1), *args[1:], sparsity=body.elements)


def test_reuse_factor_gives_the_same_minimiser_and_gradients_with_fewer_factorizations():
    """reuse_factor: Newton's systems after the first by CG preconditioned with the previous factorization."""
    body, energy = _sheet(16)
    x_hat = (body.rest_positions * 1.05).requires_grad_()
    mu = body.mu.clone().requires_grad_()
    pull = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    out = []
    for reuse in (False, True):
        x, info = diffsoft.minimize(energy, body.rest_positions, x_hat, mu, pull, sparsity=body.elements,
                                    reuse_factor=reuse, rtol=1e-11, return_info=True, on_failure="raise")
        w = torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
        out.append((x, torch.autograd.grad((w * x).sum(), (x_hat, mu, pull)), info))
    (x0, g0, i0), (x1, g1, i1) = out
    assert i0.iterations >= 2 and i0.cg_iterations == 0
    # CG on the stale factor gets half the probes that one factorization takes (a count: the same every run).
    assert i1.cg_iterations > 0 and i1.factorizations < i0.factorizations
    torch.testing.assert_close(x1, x0, rtol=0, atol=1e-10)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9 * b.abs().max().item())


@pytest.mark.skipif(not diffsoft._C.HAS_CHOLMOD, reason="diffsoft was built without CHOLMOD")
def test_a_simulators_factorizations_reuse_the_memory_of_freed_ones():
    """Each Newton iteration's CHOLMOD factor, freed, is factored again in place by the next (no fresh
    allocation: its page faults had made the default forward slower than keep_factors)."""
    verts, tris = diffsoft.mesh.rectangle(width=1.0, height=1.0, nx=24, ny=24, dtype=torch.float64)
    body = diffsoft.SoftBody(verts, tris, density=1000.0, youngs_modulus=1e5, poisson_ratio=0.3)
    sim = diffsoft.Simulator(body, dt=1 / 30, ground=None, solver="direct", reuse_factor=False)
    x, v = sim.rest_state
    v[:, 0] = 10.0 * (x[:, 1] - 0.5)  # a shear: several Newton iterations per step
    made = 0
    for _ in range(2):
        x, v, info = sim.step(x, v, return_info=True)
        assert info.converged
        made += info.factorizations
    cache = sim.topology.factor_cache
    assert cache.analyses == 1 and made >= 3 and cache.reused == made - 1


def test_the_adjoint_residual_is_measured_not_cg_s_running_estimate():
    # In float32 CG's recurrence drives its residual far below what float32 resolves (it once reported 1e-11,
    # converged, for a true residual of 6e-4): the record is the true ||H lambda - dL/dx*|| / ||dL/dx*||.
    n = 60
    g = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=F64))
    a = (q * torch.logspace(0, 2.5, n, dtype=F64)) @ q.T  # condition number 3e2
    b = torch.randn(n, generator=g, dtype=F64)
    for dtype, rtol in ((torch.float32, 1e-6), (torch.float32, None), (F64, None)):
        a_, b_ = a.to(dtype), b.to(dtype).requires_grad_(True)
        x, info = diffsoft.minimize(quadratic, torch.zeros(n, dtype=dtype), a_, b_, backward_rtol=rtol,
                                    backward_max_iter=10 * n, return_info=True)
        assert info.converged
        w = torch.randn(n, generator=g, dtype=F64)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (x * w.to(dtype)).sum().backward()
        lam = b_.grad.double()  # d/db of w.x* = H^-1 w: the adjoint itself
        true = ((a @ lam - w).norm() / w.norm()).item()
        assert info.backward_residual == pytest.approx(true, rel=0.5, abs=1e-9)
        wanted = rtol or default_backward_rtol(dtype)
        assert info.backward_converged == (info.backward_residual <= wanted)
        if not info.backward_converged:
            assert any("in float32, round-off bounds the residual" in str(c.message) for c in caught)
    assert default_backward_rtol(torch.float32) == 1e-5


def test_a_tensor_requiring_grad_that_the_energy_captures_is_named_in_a_warning():
    t = torch.tensor([1.0, 2.0], dtype=F64, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="depends on a tensor that requires grad and is not among its params"):
        diffsoft.minimize(lambda x: quartic(x, 1.0, t), torch.zeros(2, dtype=F64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        diffsoft.minimize(quartic, torch.zeros(2, dtype=F64), 1.0, t)  # passed: no word
        diffsoft.minimize(lambda x: quartic(x, 1.0, t.detach()), torch.zeros(2, dtype=F64))
        with torch.no_grad():  # nothing is differentiated: no word either
            diffsoft.minimize(lambda x: quartic(x, 1.0, t), torch.zeros(2, dtype=F64))


def test_flags_must_be_booleans_and_inference_tensors_are_params_like_any():
    for name in ("batched", "keep_factor", "reuse_factor", "return_info"):
        with pytest.raises(TypeError, match=f"{name} must be True or False, got 'no'"):
            diffsoft.minimize(quartic, torch.zeros(2, dtype=F64), 1.0, torch.ones(2, dtype=F64), **{name: "no"})
    with torch.inference_mode():
        b = torch.tensor([1.0, 2.0], dtype=F64)
    k = torch.tensor(2.0, dtype=F64, requires_grad=True)
    x = diffsoft.minimize(quartic, torch.zeros(2, dtype=F64), k, b)
    x.sum().backward()
    torch.testing.assert_close(k.grad, -(x / (k + 3 * x * x)).sum().detach())  # d x*/dk = -x / (k + 3 x^2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_solve_started_at_its_own_answer_says_to_set_atol(dtype):
    # There ||g0|| is round-off, and with atol 0 the tolerance, rtol times it, lies below what any x reaches: the
    # failure says why and what to set; with atol the warm start converges at once.
    def energy(x, k, b):
        return (0.5 * k * x * x + 0.25 * x ** 4 - b * x).sum(-1)
    k, b = torch.linspace(1.0, 2.0, 4, dtype=dtype), torch.ones(4, dtype=dtype)
    x1 = diffsoft.minimize(energy, torch.zeros(4, dtype=dtype), k, b)
    if dtype == torch.float64:  # (float32's round-off may land below it)
        with pytest.raises(diffsoft.ConvergenceError, match=r"atol is 0, so the tolerance is rtol x \|\|g0\|\|.*"
                                                            r"as from a start at or near the minimum, no x reaches "
                                                            r"it; set atol"):
            diffsoft.minimize(energy, x1, k, b, on_failure="raise", max_iter=5)
    again, info = diffsoft.minimize(energy, x1, k, b, atol=1e3 * torch.finfo(dtype).eps, on_failure="raise",
                                    return_info=True)
    assert info.converged and info.iterations <= 2, info.message
    close = 1e-8 if dtype == torch.float64 else 1e-5  # (x1 is within the first solve's tolerance of x*)
    torch.testing.assert_close(again, x1, rtol=0, atol=close)


@pytest.mark.parametrize("solver", [{}, {"sparsity": "one"}, {"sparsity": "one", "keep_factor": True}])
def test_a_problem_the_loss_does_not_read_cannot_spoil_the_others_gradients(solver):
    """Problem 1 sits at a minimum of infinite curvature (|x - 2|^1.5: its Hessian-vector products are NaN there).
    A loss of problem 0 alone gets its exact gradient, with no warning (problem 1's adjoint is 0, not 0 x NaN); a
    loss that reads problem 1 is told at once which problem's second derivatives are not finite."""
    def energy(x, s):
        x = x.reshape(len(x), -1)
        return torch.stack([((x[0] - s) ** 2 + 0.1 * x[0] ** 4).sum(), (s * (x[1] - 2).abs() ** 1.5).sum()])
    x0 = torch.tensor([[0.0, 0.0], [2.0, 2.0]], dtype=F64)
    if solver:
        solver = {**solver, "sparsity": torch.tensor([[0, 1]])}
        x0 = x0[..., None]  # (B, N, d)
    s = torch.tensor(1.0, dtype=F64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x, info = diffsoft.minimize(energy, x0, s, batched=True, return_info=True, on_failure="raise", **solver)
        (grad,) = torch.autograd.grad(x[0].sum(), s)
    x_0 = x.detach()[0].flatten()[0]
    assert info.backward_converged, info.backward_message
    torch.testing.assert_close(grad, 2 * 2 / (2 + 1.2 * x_0 ** 2))  # d/ds of 2 x0: 2 (x - s) + 0.4 x^3 = 0
    x = diffsoft.minimize(energy, x0, s, batched=True, **solver)
    with pytest.warns(UserWarning, match=r"adjoint solve failed: .* Hessian-vector products that are not finite "
                                         r"for problem\(s\) 1: the energy's second derivatives hold NaN or inf"):
        torch.autograd.grad(x.sum(), s)


def test_a_problem_frozen_where_its_gradient_is_nan_is_named_when_it_reaches_a_shared_param():
    """Problem 1 is frozen where its gradient is NaN; the loss reads problem 0 only, through a param both share:
    autograd's chain rule carries problem 1's NaN derivatives times its zero adjoint into the param's gradient,
    which cannot be helped from outside the energy; the backward says so, naming problem 1."""
    t = torch.tensor([1.0, 3.0], dtype=F64)

    def energy(x, s):
        trap = torch.where(x > s, torch.zeros_like(x), 0 * torch.sqrt(s - x))  # NaN derivative where x > s
        return ((x - t[:, None] * s / 2) ** 2).sum(1) + trap.sum(1)
    s = torch.tensor(2.0, dtype=F64, requires_grad=True)
    with pytest.warns(RuntimeWarning, match=r"not finite at Newton iteration \d+ for problem\(s\) 1"):
        x, info = diffsoft.minimize(energy, torch.zeros(2, 3, dtype=F64), s, batched=True, return_info=True)
    assert info.problem_converged == [True, False]
    with pytest.warns(UserWarning, match=r"the implicit gradient with respect to the params is not finite: the "
                                         r"energy's gradient is not finite at x\* for problem\(s\) 1, "):
        torch.autograd.grad(x[0].sum(), s)
    assert not info.backward_converged


@pytest.mark.parametrize("name", ["max_iter", "ls_max_iter", "cg_max_iter", "backward_max_iter", "probe_batch"])
def test_a_count_past_int64_is_refused_by_name(name):
    with pytest.raises(ValueError, match=rf"^{name} must be (None or )?an integer >= \d \(below 2\*\*63\), got "):
        diffsoft.minimize(lambda x: ((x - 1) ** 2).sum(), torch.zeros(2, dtype=F64), **{name: 2 ** 63})


def test_an_x0_or_pattern_without_values_is_refused_by_name():
    energy = lambda x: ((x - 1) ** 2).sum()  # noqa: E731
    for x0, kind in ((torch.zeros(2, 2, dtype=F64, device="meta"), "meta"),
                     (torch.zeros(2, 2, dtype=F64).to_sparse(), "sparse_coo")):
        with pytest.raises(TypeError, match=f"x0 must be a dense tensor holding values .*, got a {kind} tensor"):
            diffsoft.minimize(energy, x0)
    with pytest.raises(TypeError, match=r"sparsity must be an \(E, k\) int64 tensor .*, got meta torch.int64"):
        diffsoft.minimize(energy, torch.zeros(3, 2, dtype=F64), sparsity=torch.zeros(2, 2, dtype=torch.long,
                                                                                       device="meta"))


def test_a_diverging_problem_gets_no_advice_meant_for_a_warm_start():
    """The atol hint (a tolerance below round-off, as from a start at the minimum) is for problems whose gradient
    has not grown since the start; an energy unbounded below diverges, and its report says only that."""
    def energy(x):
        return torch.stack([((x[0] - 1) ** 2).sum(), (-(x[1] ** 4)).sum() - x[1].sum()])
    with pytest.warns(RuntimeWarning) as caught:
        _, info = diffsoft.minimize(energy, torch.zeros(2, 2, dtype=F64), batched=True, return_info=True,
                                    max_iter=60)
    assert info.problem_converged == [True, False]
    assert "for problem(s) 1" in info.message and "atol is 0" not in info.message, info.message
    assert "atol is 0" not in str(caught[0].message)


def test_a_param_changed_before_the_backward_is_named_by_its_place_among_all_params():
    """Non-tensor params before it (a number, a string) count: the message names params[3], the caller's."""
    a = torch.tensor([1.0, 2.0], dtype=F64, requires_grad=True)
    b = torch.tensor([3.0, 4.0], dtype=F64, requires_grad=True)

    def energy(x, scale, name, a, b):
        return (scale * (x - a[:, None]) ** 2 + (x - b[:, None]) ** 4).sum(1)
    x = diffsoft.minimize(energy, torch.zeros(2, 2, dtype=F64), 2.0, "label", a, b, batched=True)
    with torch.no_grad():
        b.mul_(1.0)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation: diffsoft's implicit layer's "
                                           r"params\[3\] \(shape \[2\]\)"):
        x.sum().backward()
    x = diffsoft.minimize(energy, torch.zeros(2, 2, dtype=F64), 2.0, "label", a, b, batched=True)
    ga, gb = torch.autograd.grad(x.sum(), [a, b])  # and the non-tensor params still reach the energy
    xs = x.detach()
    h = 2 * 2.0 + 12 * (xs - b.detach()[:, None]) ** 2  # d/da: -H^-1 d(grad)/da, per coordinate
    torch.testing.assert_close(ga, (2 * 2.0 / h).sum(1))
    torch.testing.assert_close(gb, (12 * (xs - b.detach()[:, None]) ** 2 / h).sum(1))
