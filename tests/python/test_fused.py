"""The fused step energy against its plain-torch reference: values, gradients, Hessian-vector products,
parameter derivatives (gradcheck and gradgradcheck in float64), and whole simulator steps."""
import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from diffsoft._extension import _C
from diffsoft.body import SoftBody
from diffsoft.creatures import biped, tetrapod
from diffsoft.energies import reference_step_energy
from diffsoft.fused import step_energy, step_energy_values
from diffsoft.mesh import box
from diffsoft.simulator import Simulator
from diffsoft.step import unpack
from diffsoft.term_blocks import gradient_and_hessian
from diffsoft.terms import Term

from conftest import F64, param_names, reference_param_grads, sheet_sim



def _params(sim, x0, v0, activation):
    """The step energy's arguments (:mod:`diffsoft.step`), as Simulator.step builds them."""
    params, top = sim.step_problem(x0, v0, activation)
    return [*params.flat(), top]


def _state(sim, batch, seed):
    g = torch.Generator().manual_seed(seed)
    x, _ = sim.rest_state
    shape = ((batch,) if batch else ()) + tuple(x.shape)
    x0 = x + 0.01 * torch.randn(shape, generator=g, dtype=F64)
    x0[..., 1] -= 0.005  # some vertices below the ground: contact and friction are active
    v0 = 0.3 * torch.randn(shape, generator=g, dtype=F64)
    a = 0.6 + 0.4 * torch.rand(((batch,) if batch else ()) + (sim.body.num_muscles,), generator=g, dtype=F64)
    top = sim.topology
    y = (x0 if top.all_free else x0[..., top.free, :]) + 0.005 * torch.randn(
        shape[:-2] + (len(top.free), sim.body.dim), generator=g, dtype=F64)
    return x0, v0, a, y


CASES = [(2, "algovivo", None), (2, "neo_hookean", [0]), (2, "stable_neo_hookean", None),
         (3, "neo_hookean", None), (3, "stable_neo_hookean", [0, 1]), (3, "algovivo", None)]


@pytest.mark.parametrize("dim,material,fixed", CASES)
@pytest.mark.parametrize("batch", [0, 2])
def test_value_gradient_and_hvp_match_the_reference(dim, material, fixed, batch):
    sim = sheet_sim(dim, material, fixed)
    x0, v0, a, y = _state(sim, batch, seed=dim)
    params = _params(sim, x0, v0, a)
    y = y.requires_grad_()
    v = torch.randn_like(y)
    results = []
    for energy in (reference_step_energy, step_energy):
        e = energy(y, *params)
        assert e.shape == y.shape[:-2]  # one energy per problem
        (g,) = torch.autograd.grad(e.sum(), y, create_graph=True)
        (hv,) = torch.autograd.grad(g, y, v)
        results.append((e, g, hv))
    (e0, g0, h0), (e1, g1, h1) = results
    torch.testing.assert_close(e1, e0, rtol=1e-13, atol=0)
    torch.testing.assert_close(g1, g0, rtol=1e-10, atol=1e-10 * g0.abs().max().item())
    torch.testing.assert_close(h1, h0, rtol=1e-10, atol=1e-10 * h0.abs().max().item())


@pytest.mark.parametrize("user_term", [False, True])
@pytest.mark.parametrize("batch", [0, 2])
def test_values_without_autograd_are_the_step_energys(batch, user_term):
    # The solver's choice of a start reads the kernels directly: the same values as the autograd path, a user
    # term's energy included.
    sim = sheet_sim(2, "neo_hookean", [0])
    if user_term:
        sim.terms = [Term(lambda x, x0, h, k: k * (x ** 2).sum((-2, -1)), params=(torch.tensor(3.0, dtype=F64),))]
    x0, v0, a, y = _state(sim, batch, seed=5)
    params = _params(sim, x0, v0, a)
    ys = (y, params[0].detach())
    with torch.no_grad():
        got = step_energy_values(ys, *params)
        want = [step_energy(z, *params) for z in ys]
    assert len(got) == 2
    for g, w in zip(got, want):
        assert g.shape == w.shape == y.shape[:-2]
        assert torch.equal(g, w)


@pytest.mark.parametrize("dim,material,fixed", CASES)
@pytest.mark.parametrize("batch", [0, 2])
def test_parameter_derivatives_match_the_reference(dim, material, fixed, batch):
    """The kernels' closed-form parameter derivatives, first order and mixed (the adjoint's product), against
    double backward through the plain-torch energy, for every parameter tensor."""
    from diffsoft import fused

    sim = sheet_sim(dim, material, fixed)
    x0, v0, a, y = _state(sim, batch, seed=11)
    params = _params(sim, x0, v0, a)
    tensors = [p.detach().clone().requires_grad_() for p in params[:-1]]
    top = params[-1]
    names = param_names(unpack((*tensors, top))[0], top)
    wanted = list(range(len(tensors)))
    weight = torch.rand(y.shape[:-2], dtype=F64) + 0.5
    direction = torch.randn_like(y)
    for order, probe in ((1, dict(weight=weight)), (2, dict(dir=direction))):
        ours = fused._kernel_param_grads(y, tensors, top, wanted, **probe)
        reference = reference_param_grads(y, tensors, top, wanted, weight if order == 1 else direction, order)
        for i, (g, r) in enumerate(zip(ours, reference)):
            assert g.shape == tensors[i].shape, (order, i)
            r = torch.zeros_like(g) if r is None else r  # e.g. x0's free vertices do not enter
            scale = max(r.abs().max().item(), 1e-12)
            torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10 * scale, msg=f"order {order}, parameter {names[i]}")


@pytest.mark.parametrize("dim,material,fixed", CASES[:4])
def test_gradcheck_and_gradgradcheck_in_every_input(dim, material, fixed):
    sim = sheet_sim(dim, material, fixed)
    x0, v0, a, y = _state(sim, 0, seed=3)
    params = _params(sim, x0, v0, a)
    tensors = [p.detach().clone().requires_grad_() if isinstance(p, torch.Tensor) else p for p in params]
    y = y.detach().clone().requires_grad_()

    def fn(y_, *ts):
        return step_energy(y_, *ts, params[-1])

    inputs = (y, *tensors[:-1])
    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-5)
    assert gradgradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("make", [lambda: biped(dtype=F64), lambda: tetrapod(dtype=F64)], ids=["biped", "tetrapod"])
def test_fused_and_plain_simulators_agree_over_steps_and_gradients(make):
    sim = make()
    plain = make()
    plain.fused = False
    for s in (sim, plain):  # solved well below the defaults, so that what differs is the implementation
        s.solver_options.update(on_failure="raise", rtol=1e-11, atol=s.solver_options["atol"] * 1e-3)
    x, v = sim.rest_state
    x = x.clone().requires_grad_()
    acts = torch.full((6, sim.body.num_muscles), 0.7, dtype=F64, requires_grad=True)
    out = []
    for s in (sim, plain):
        xs, vs = s.rollout(x, torch.zeros_like(x), acts)
        out.append((xs[-1], torch.autograd.grad((xs[-1][:, 0] + vs[-1][:, 1]).sum(), (x, acts))))
    (x1, g1), (x2, g2) = out
    # Both solves stop at the step's force tolerance: positions agree to about that over the stiffness, and
    # the gradients to the adjoint's accuracy at slightly different x*.
    torch.testing.assert_close(x1, x2, rtol=0, atol=1e-9)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dim,material,fixed", CASES)
def test_cpu_kernels_and_device_agnostic_torch_path_agree(dim, material, fixed):
    """The two sources of the step's derivatives: the C++ kernels' closed forms (CPU) and autograd of the
    reference's terms (the torch backend, any device), against each other."""
    from diffsoft import fused

    sim = sheet_sim(dim, material, fixed)
    x0, v0, a, y = _state(sim, 2, seed=7)
    p, top = unpack(_params(sim, x0, v0, a))
    model, *state = fused._kernel_args(y, p, top)
    grad, *blocks = fused.ops.step_energy_derivatives(*model.args, *state)
    grad_torch, hessian_torch = gradient_and_hessian(y, p, top)
    v = torch.randn_like(y)
    torch.testing.assert_close(grad, grad_torch, rtol=1e-11, atol=1e-11 * grad_torch.abs().max().item())
    hv = fused.KernelHessian(model, blocks).apply(v)
    hv_torch = hessian_torch.apply(v)
    torch.testing.assert_close(hv, hv_torch, rtol=1e-11, atol=1e-11 * hv_torch.abs().max().item())


def _block(dtype=F64):
    """A 3D block of 1080 free unknowns, its x = 0 face clamped: large enough for the supernodal path."""
    verts, tets = box(size=(0.5, 0.25, 0.25), resolution=(10, 5, 5), dtype=dtype)
    body = SoftBody(verts, tets, density=1000.0, youngs_modulus=1e5, poisson_ratio=0.4,
                    fixed=torch.nonzero(verts[:, 0] == 0).flatten())
    return Simulator(body, dt=0.01, ground=None)


@pytest.mark.parametrize("make", [lambda: biped(dtype=F64), lambda: tetrapod(dtype=F64),
                                  lambda: sheet_sim(2, "neo_hookean", fixed=[0, 3]), _block],
                         ids=["biped", "tetrapod", "fixed", "block"])
def test_sparse_direct_and_cg_solvers_agree(make):
    """solver="direct" (sparse LDL^T of each creature's Hessian, also for the adjoint) against "cg"."""
    results = []
    for solver in ("direct", "cg"):
        sim = make()
        sim.solver = solver
        sim.solver_options.update(on_failure="raise", rtol=1e-11, atol=sim.solver_options["atol"] * 1e-3)
        x, v = sim.rest_state
        x = torch.stack([x, x + 0.01]).requires_grad_()  # a batch of two
        v = torch.zeros_like(x) + 0.3
        x1, v1, info = sim.step(x, v, return_info=True)
        (g,) = torch.autograd.grad((x1[..., 0] ** 2 + v1[..., 1]).sum(), x)
        results.append((x1.detach(), g))
        if solver == "direct":  # CG only on a stale factor: the default's factor reuse (the block's)
            assert info.factorizations > 0 and info.backward_direct
        else:
            assert info.factorizations == 0 and info.cg_iterations > 0 and not info.backward_direct
    (x_d, g_d), (x_c, g_c) = results
    torch.testing.assert_close(x_d, x_c, rtol=0, atol=1e-9)
    torch.testing.assert_close(g_d, g_c, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("solver", ["direct", "cg"])
def test_batched_step_gradients_for_every_parameter_match_the_plain_path(solver):
    """The direct path's closed-form parameter product, summed over a batch for shared parameters (the body's
    fields, one activation for both creatures), against the plain path's double backward."""
    grads = []
    for fused in (True, False):
        sim = sheet_sim(2, "neo_hookean", fixed=[0])
        sim.fused, sim.solver = fused, solver
        sim.solver_options.update(on_failure="raise", rtol=1e-11, atol=sim.solver_options["atol"] * 1e-3)
        body = sim.body
        leaves = [body.mu, body.lam, body.mass, body.Dm_inv, body.muscle_rest_length, body.muscle_stiffness]
        leaves = [t.detach().clone().requires_grad_() for t in leaves]
        body.mu, body.lam, body.mass, body.Dm_inv, body.muscle_rest_length, body.muscle_stiffness = leaves
        for name in ("gravity", "contact_stiffness", "friction"):
            setattr(sim, name, getattr(sim, name).detach().clone().requires_grad_())
            leaves.append(getattr(sim, name))
        x0, v0, a, _ = _state(sim, 2, seed=5)
        a = a[0].clone().requires_grad_()  # shared by the batch
        x0, v0 = x0.requires_grad_(), v0.requires_grad_()
        x1, v1 = sim.step(x0, v0, a)
        w = torch.randn(x1.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
        grads.append(torch.autograd.grad((w * x1).sum() + (v1 * v1).sum(), [x0, v0, a] + leaves))
    for name, g, r in zip(["x0", "v0", "a", "mu", "lam", "mass", "Dm_inv", "l0", "k", "g", "kc", "kf"], *grads):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-8 * r.abs().max().item(), msg=name)


@pytest.mark.skipif(not _C.HAS_CHOLMOD, reason="diffsoft was built without CHOLMOD")
def test_supernodal_factorizations_share_one_symbolic_analysis():
    sim = _block()
    x, v = sim.rest_state
    for _ in range(3):
        x, v, info = sim.step(x, v, return_info=True)
        assert info.converged and info.factorizations > 0
    assert sim.topology.factor_cache.analyses == 1


@pytest.mark.parametrize("make", [lambda: biped(dtype=F64), _block], ids=["biped", "block"])
def test_backward_with_the_forwards_kept_factor_gives_the_same_gradient(make):
    """keep_factors: the adjoint solve by the forward's last factor (refined) instead of a fresh one at x*. With
    factor reuse (the default; the block's) that factor may be several Newton iterations old: the adjoint
    residuals are held to 1e-12, so that the two gradients agree to 1e-8."""
    grads = []
    for keep in (False, True):
        sim = make()
        sim.solver_options.update(keep_factor=keep, backward_rtol=1e-12)
        x, v = sim.rest_state
        x = x.clone().requires_grad_()
        x1, v1, info = sim.step(x, v + 0.3, return_info=True)
        (g,) = torch.autograd.grad((x1[..., 0] ** 2 + v1[..., 1]).sum(), x)
        assert info.backward_converged and info.backward_direct and info.backward_residual <= 1e-12
        grads.append(g)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-8, atol=1e-10 * grads[0].abs().max().item())


def test_a_copied_simulator_steps_with_its_own_factor_cache():
    import copy
    import pickle

    sim = _block()
    x, v = sim.rest_state
    x1, _ = sim.step(x, v)
    for other in (copy.deepcopy(sim), pickle.loads(pickle.dumps(sim))):
        assert other.topology.factor_cache is not sim.topology.factor_cache
        torch.testing.assert_close(other.step(x, v)[0], x1, rtol=0, atol=1e-12)


def test_auto_solver_factors_unless_a_large_3d_body_lacks_cholmod(monkeypatch):
    from diffsoft import simulator

    verts, tets = box(size=(1.0, 0.5, 0.5), resolution=(20, 10, 10), dtype=F64)
    big = Simulator(SoftBody(verts, tets, density=1e3, youngs_modulus=1e5, poisson_ratio=0.3), ground=None)
    assert len(big.body.free) * 3 > 5000
    assert big._factorizes() and _block()._factorizes() and biped(dtype=F64)._factorizes()
    monkeypatch.setattr(simulator, "_HAS_CHOLMOD", False)
    assert not big._factorizes() and _block()._factorizes() and biped(dtype=F64)._factorizes()
    big.solver = "direct"
    assert big._factorizes()
    big.solver = "cg"
    assert not big._factorizes()


def test_one_material_per_creature_in_a_batch():
    """``mu``, ``lam`` of shape (B, E) (domain randomisation) on the kernels: each creature steps as it would
    alone, and the gradients with respect to the per-creature materials match the plain path's."""
    sim = biped(dtype=F64)
    x, v = sim.rest_state
    batch = 3
    xb, vb = x.expand(batch, -1, -1).clone(), v.expand(batch, -1, -1).clone()
    xb[..., 1] -= 0.01  # in contact
    scale = torch.tensor([[0.6], [1.0], [1.4]], dtype=F64)
    mu0, lam0 = sim.body.mu.clone(), sim.body.lam.clone()
    a = torch.full((batch, sim.body.num_muscles), 0.7, dtype=F64)
    out = {}
    for fused in (True, False):
        sim.fused = fused
        sim.body.mu, sim.body.lam = (mu0 * scale).requires_grad_(), (lam0 * scale).requires_grad_()
        x1, _ = sim.step(xb, vb, a)
        out[fused] = (x1, *torch.autograd.grad((x1 * x1).sum(), [sim.body.mu, sim.body.lam]))
    for ours, plain in zip(out[True], out[False]):
        torch.testing.assert_close(ours, plain, rtol=1e-6, atol=1e-7)
    for b in range(batch):
        alone = biped(dtype=F64)
        alone.body.mu, alone.body.lam = mu0 * scale[b], lam0 * scale[b]
        torch.testing.assert_close(alone.step(xb[b], vb[b], a[b])[0], out[True][0][b], rtol=0, atol=1e-12)
