"""Factor reuse, the simulator's default (``reuse_factor=None``): Newton's systems after the first by CG on the
previous factorization, with an iteration budget counted from the factor, not timed. Two runs must give
bit-identical states and gradients; the states and gradients must match one factorization per Newton iteration
(``reuse_factor=False``) to the solver's tolerances, including a backward that starts from a stale factor."""
import pytest
import torch

from conftest import F64, TIGHT, small_sim
from diffsoft import _C
from diffsoft.body import SoftBody
from diffsoft.creatures import biped
from diffsoft.mesh import rectangle
from diffsoft.simulator import Simulator


def _sheared_sheet(reuse_factor=None, keep_factors=False, **options):
    """A free 40x40 vertex sheet given a shear velocity (several Newton iterations per step), whose sparse
    factorization is dear enough that the default tries CG on the previous one."""
    verts, tris = rectangle(width=1.0, height=1.0, nx=39, ny=39, dtype=F64)
    body = SoftBody(verts, tris, material="neo_hookean", density=1000.0, youngs_modulus=1e5, poisson_ratio=0.3)
    body.mu.requires_grad_()
    sim = Simulator(body, dt=1 / 30, ground=None, reuse_factor=reuse_factor, keep_factors=keep_factors,
                    **{"on_failure": "raise", **options})
    x, v = sim.rest_state
    v[:, 0] = 10.0 * (x[:, 1] - 0.5)
    return sim, x, v


def _sheet_run(steps=3, **kw):
    """States after each step, gradients of a loss of the last with respect to x0, v0 and mu, and the records."""
    sim, x, v = _sheared_sheet(**kw)
    x0, v0 = x.clone().requires_grad_(), v.clone().requires_grad_()
    xs, infos = [], []
    x, v = x0, v0
    for _ in range(steps):
        x, v, info = sim.step(x, v, return_info=True)
        xs.append(x.detach())
        infos.append(info)
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    grads = torch.autograd.grad((w * x).sum() + 0.1 * (v ** 2).sum(), (x0, v0, sim.body.mu))
    return xs, grads, infos


def _biped_batch_run(reuse_factor=None, batch=8, steps=3):
    sim = biped(dtype=F64)
    sim.solver_options.update(reuse_factor=reuse_factor, on_failure="raise")
    x, v = sim.rest_state
    x0 = x.expand(batch, -1, -1).clone().requires_grad_()
    v0 = (v + torch.tensor([0.5, -0.5], dtype=F64)).expand(batch, -1, -1).clone().requires_grad_()
    acts = (0.6 + 0.4 * torch.rand((steps, batch, sim.body.num_muscles), generator=torch.Generator().manual_seed(2),
                                   dtype=F64)).requires_grad_()
    x, v, infos = x0, v0, []
    for t in range(steps):
        x, v, info = sim.step(x, v, acts[t], return_info=True)
        infos.append(info)
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    grads = torch.autograd.grad((w * x).sum(), (x0, v0, acts))
    return x.detach(), grads, infos


def _bit_identical(a, b):
    assert torch.equal(a, b), f"differ by up to {(a - b).abs().max().item():.3g}"


@pytest.mark.skipif(not _C.HAS_CHOLMOD, reason="diffsoft was built without CHOLMOD")
def test_the_default_reuses_factors_on_a_large_sheet_and_two_runs_are_bit_identical():
    xs1, g1, infos = _sheet_run()
    xs2, g2, _ = _sheet_run()
    # The default did reuse: CG on a stale factor, fewer factorizations than Newton iterations.
    assert sum(i.cg_iterations for i in infos) > 0
    assert sum(i.factorizations for i in infos) < sum(i.iterations for i in infos)
    for a, b in zip(xs1 + list(g1), xs2 + list(g2)):
        _bit_identical(a, b)


@pytest.mark.skipif(not _C.HAS_CHOLMOD, reason="diffsoft was built without CHOLMOD")
@pytest.mark.parametrize("keep_factors", [False, True], ids=["fresh", "kept"])
def test_reuse_matches_one_factorization_per_newton_iteration(keep_factors):
    """States to the solver's tolerance, gradients to the adjoint's (both tight), with the backward on a fresh
    factorization at x* or on the forward's kept factor (with reuse, possibly made Newton iterations before x*)."""
    xs, grads, infos = _sheet_run(keep_factors=keep_factors, **TIGHT)
    xs_ref, grads_ref, infos_ref = _sheet_run(reuse_factor=False, **TIGHT)
    assert all(i.cg_iterations == 0 and i.factorizations == i.iterations for i in infos_ref)
    assert all(i.converged and i.backward_converged for i in infos)
    for x, x_ref in zip(xs, xs_ref):
        torch.testing.assert_close(x, x_ref, rtol=0, atol=1e-10)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-7, atol=1e-9 * g_ref.abs().max().item())


@pytest.mark.skipif(not _C.HAS_CHOLMOD, reason="diffsoft was built without CHOLMOD")
def test_reuse_gradient_matches_central_differences():
    """The gradient with respect to v0 along one direction, against central differences of the reused path
    (which reuses: asserted by the bit-identity test on the same sheet)."""
    sim, x, v = _sheared_sheet(**TIGHT)
    d = torch.randn(v.shape, generator=torch.Generator().manual_seed(5), dtype=F64)
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(6), dtype=F64)

    def loss(v0):
        x1, _ = sim.step(x, v0)
        return (w * x1).sum()

    v0 = v.clone().requires_grad_()
    (g,) = torch.autograd.grad(loss(v0), v0)
    eps = 1e-4
    with torch.no_grad():
        fd = (loss(v + eps * d) - loss(v - eps * d)) / (2 * eps)
    torch.testing.assert_close((g * d).sum(), fd, rtol=1e-5, atol=0)


def test_a_biped_batch_is_bit_identical_and_does_the_same_work_as_without_reuse():
    """Creatures' factorizations are cheap: the default tries no CG on them, and two runs are bit-identical."""
    x1, g1, infos = _biped_batch_run()
    x2, g2, _ = _biped_batch_run()
    x_ref, g_ref, infos_ref = _biped_batch_run(reuse_factor=False)
    assert all(i.cg_iterations == 0 for i in infos)
    assert [i.factorizations for i in infos] == [i.factorizations for i in infos_ref]
    for a, b, c in zip([x1, *g1], [x2, *g2], [x_ref, *g_ref]):
        _bit_identical(a, b)
        _bit_identical(a, c)


def test_the_default_does_not_apply_where_the_step_does_not_factor():
    """CG steps and the torch backend take the default silently; an explicit True is refused there
    (tests/python/test_errors_doc.py), and anything but None, True or False at once."""
    for kw in (dict(solver="cg"), dict(backend="torch"), dict(fused=False)):
        sim = small_sim(**kw)
        x1, _, info = sim.step(*sim.rest_state, return_info=True)
        assert info.converged and torch.isfinite(x1).all()
    with pytest.raises(ValueError, match="reuse_factor must be None"):
        small_sim(reuse_factor="yes")
