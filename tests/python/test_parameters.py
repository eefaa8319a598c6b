"""Every differentiable input of a step (docs/parameters.md): the time step, the ground's height and the friction
band as tensors with gradients; and per-creature parameters in a batch (domain randomisation) on the default
fused path, against per-creature runs, the plain-torch reference and central differences (float64)."""
import pytest
import torch
from torch.autograd import gradcheck

from diffsoft import fused
from diffsoft.body import SoftBody
from diffsoft.creatures import biped
from diffsoft.mesh import rectangle
from diffsoft.simulator import Simulator
from diffsoft.step import unpack
from diffsoft.term_blocks import gradient_and_hessian

from conftest import assert_fused_matches_reference, F64, param_names, reference_param_grads, sheet_sim

BODY_FIELDS = ("mass", "Dm_inv", "mu", "lam", "muscle_rest_length", "muscle_stiffness")
CONSTANTS = ("dt", "gravity", "ground", "contact_stiffness", "friction", "friction_eps")


def _tight(sim):
    """Solved well below the defaults, so that central differences resolve the gradients."""
    sim.solver_options.update(on_failure="raise", rtol=1e-12, atol=sim.solver_options["atol"] * 1e-4,
                              backward_rtol=1e-12)
    return sim


def _biped_sliding_onto_the_ground(batch=None):
    """A biped 4 mm above the ground (inside the friction band), moving sideways and down: contact and friction
    are active within a step."""
    sim = _tight(biped(dtype=F64))
    x, v = sim.rest_state
    x = x + torch.tensor([0.0, 0.004], dtype=F64)
    v = v + torch.tensor([0.5, -0.4], dtype=F64)
    if batch:
        x, v = x.expand(batch, -1, -1).clone(), v.expand(batch, -1, -1).clone()
    return sim, x, v


def _sheet(batch):
    """A 2 x 1 sheet with two muscles, its bottom row inside the friction band, as a batch of ``batch``."""
    verts, tris = rectangle(0.4, 0.2, 2, 1, dtype=F64)
    body = SoftBody(verts, tris, density=100.0, youngs_modulus=2e3, poisson_ratio=0.3, muscles=[[0, 4], [1, 5]])
    sim = _tight(Simulator(body, dt=0.02))
    g = torch.Generator().manual_seed(2)
    x = verts + torch.tensor([0.0, 0.004], dtype=F64) + 0.003 * torch.randn((batch,) + verts.shape, generator=g,
                                                                           dtype=F64)
    v = torch.tensor([0.3, -0.4], dtype=F64) + 0.1 * torch.randn(x.shape, generator=g, dtype=F64)
    return sim, x, v


def _per_creature(sim, batch, seed=0):
    """One value of every body field and constant per creature: the shared ones scaled by 1 +- 10 %."""
    g = torch.Generator().manual_seed(seed)
    values = {}
    for name in BODY_FIELDS:
        t = getattr(sim.body, name).detach()
        values[name] = t * (1 + 0.1 * (2 * torch.rand((batch,) + t.shape, generator=g, dtype=F64) - 1))
    for name in CONSTANTS:
        t = torch.as_tensor(getattr(sim, name), dtype=F64).detach()
        shift = 0.002 * torch.randn(batch, generator=g, dtype=F64) if name == "ground" else 0
        values[name] = t * (1 + 0.1 * (2 * torch.rand(batch, generator=g, dtype=F64) - 1)) + shift
    return values


def _assign(sim, values):
    for name, t in values.items():
        setattr(sim.body if name in BODY_FIELDS else sim, name, t)


def test_dt_ground_and_friction_band_gradcheck_through_biped_steps():
    """dt, the ground's height and eps as 0-dim tensors that require grad, through three steps of a biped in
    contact with friction (the default fused path), against central differences."""
    sim, x, v = _biped_sliding_onto_the_ground()
    acts = torch.full((3, sim.body.num_muscles), 0.8, dtype=F64)
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=F64)

    def loss(dt, ground, eps):
        sim.dt, sim.ground, sim.friction_eps = dt, ground, eps
        xs, vs = sim.rollout(x, v, acts)
        return (w * xs[-1]).sum() + 0.1 * (vs[-1] ** 2).sum()

    inputs = tuple(torch.tensor(c, dtype=F64, requires_grad=True) for c in (0.03, 0.001, 0.01))
    with torch.no_grad():
        sim.dt, sim.ground, sim.friction_eps = inputs
        xs, _ = sim.rollout(x, v, acts)
    assert (xs[1:, :, 1] < 0.001).any(), "the test must exercise ground contact"
    assert ((xs[:-1, :, 1] - 0.001).abs() < 0.01).sum() >= 4, "and friction"
    grads = torch.autograd.grad(loss(*inputs), inputs)
    assert all(g.abs() > 1e-3 for g in grads), grads  # each one matters here
    assert gradcheck(loss, inputs, eps=1e-7, atol=1e-6, rtol=1e-5)


def test_per_creature_parameters_match_per_creature_runs():
    """A batch of three bipeds, each with its own masses, rest shapes, Lame parameters, muscles and constants,
    against each biped run alone: states and gradients with respect to every parameter, over two steps."""
    batch = 3
    sim, x, v = _biped_sliding_onto_the_ground(batch)
    shared = {name: getattr(sim.body, name) for name in BODY_FIELDS}
    shared.update({name: getattr(sim, name) for name in CONSTANTS})
    values = _per_creature(sim, batch)
    acts = 0.7 + 0.2 * torch.rand((2, batch, sim.body.num_muscles), generator=torch.Generator().manual_seed(3),
                                  dtype=F64)
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=F64)

    def run(values, x, v, acts, w):
        leaves = {k: t.clone().requires_grad_() for k, t in values.items()}
        _assign(sim, leaves)
        xs, vs = sim.rollout(x, v, acts)
        loss = (w * xs[-1]).sum() + 0.1 * (vs[-1] ** 2).sum()
        return xs[-1].detach(), vs[-1].detach(), dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))

    x1, v1, grads = run(values, x, v, acts, w)
    for b in range(batch):
        _assign(sim, shared)
        xb, vb, gb = run({k: t[b] for k, t in values.items()}, x[b], v[b], acts[:, b], w[b])
        torch.testing.assert_close(x1[b], xb, rtol=0, atol=1e-10)
        torch.testing.assert_close(v1[b], vb, rtol=0, atol=1e-8)
        for name, g in gb.items():
            torch.testing.assert_close(grads[name][b], g, rtol=1e-6, atol=1e-9 * g.abs().max().item(),
                                       msg=f"creature {b}, {name}")
    _assign(sim, shared)


def test_per_creature_parameters_on_the_fused_and_plain_paths_agree():
    """The same per-creature batch on the kernels (default) and on the plain path (double backward through the
    reference energy): states and the gradients with respect to every per-creature parameter."""
    out = []
    for use_kernels in (True, False):
        sim, x, v = _biped_sliding_onto_the_ground(batch=3)
        sim.fused = use_kernels
        leaves = {k: t.requires_grad_() for k, t in _per_creature(sim, 3, seed=9).items()}
        _assign(sim, leaves)
        x1, v1 = sim.step(x, v)
        out.append((x1.detach(), torch.autograd.grad((x1 ** 2).sum() + v1.sum(), list(leaves.values()))))
    (x_fused, g_fused), (x_plain, g_plain) = out
    torch.testing.assert_close(x_fused, x_plain, rtol=0, atol=1e-10)
    for name, a, b in zip(leaves, g_fused, g_plain):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9 * b.abs().max().item(), msg=name)


def test_per_creature_parameters_gradcheck():
    """Every body field and constant with one value per creature, as gradcheck inputs of a two-creature step."""
    sim, x, v = _sheet(batch=2)
    values = _per_creature(sim, 2, seed=5)
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(6), dtype=F64)
    a = torch.tensor([[0.7, 0.9], [0.8, 0.6]], dtype=F64)

    def loss(*ts):
        _assign(sim, dict(zip(values, ts)))
        x1, v1 = sim.step(x, v, a)
        return (w * x1).sum() + 0.01 * (v1 ** 2).sum()

    inputs = tuple(t.clone().requires_grad_() for t in values.values())
    with torch.no_grad():
        _assign(sim, dict(zip(values, inputs)))
        x1, _ = sim.step(x, v, a)
    assert (x1[..., 1] < values["ground"][:, None]).any(dim=1).all(), "each creature must touch the ground"
    assert gradcheck(loss, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_rest_positions_density_and_moduli_through_a_new_body_gradcheck():
    """``body.rest_positions`` cannot be reassigned (``test_misuse.py``); a new SoftBody built from rest positions,
    density, Young's modulus and Poisson ratio that require grad carries their gradients through the rest shapes,
    rest volumes, lumped masses, Lame parameters, default muscle rest lengths and stiffnesses, and the default
    contact and friction constants, into a step with contact: against central differences."""
    verts, tris = rectangle(0.4, 0.2, 2, 1, dtype=F64)
    x0 = verts + torch.tensor([0.01, 0.002], dtype=F64)
    v0 = torch.tensor([0.3, -0.4], dtype=F64).expand_as(x0)
    w = torch.randn(x0.shape, generator=torch.Generator().manual_seed(8), dtype=F64)
    a = torch.tensor([0.7, 0.9], dtype=F64)

    def loss(rest, density, youngs_modulus, poisson_ratio):
        body = SoftBody(rest, tris, density=density, youngs_modulus=youngs_modulus, poisson_ratio=poisson_ratio,
                        muscles=[[0, 4], [1, 5]])
        sim = _tight(Simulator(body, dt=0.02))
        x1, v1 = sim.step(x0, v0, a)
        return (w * x1).sum() + 0.01 * (v1 ** 2).sum()

    inputs = (verts.clone().requires_grad_(), torch.tensor(100.0, dtype=F64, requires_grad=True),
              torch.tensor(2e3, dtype=F64, requires_grad=True), torch.tensor(0.3, dtype=F64, requires_grad=True))
    grads = torch.autograd.grad(loss(*inputs), inputs)
    assert all(g.abs().max() > 0 for g in grads)
    assert gradcheck(loss, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


CASES = [(2, "algovivo", None), (2, "neo_hookean", [0]), (3, "stable_neo_hookean", [0, 1]), (3, "neo_hookean", None)]


def _energy_problem(dim, material, fixed, batch=2):
    """A step problem of ``batch`` problems whose every parameter is per problem, and a point y near x0."""
    sim = sheet_sim(dim, material, fixed)
    body, verts = sim.body, sim.body.rest_positions
    _assign(sim, _per_creature(sim, batch, seed=dim))
    g = torch.Generator().manual_seed(7)
    x0 = verts + 0.01 * torch.randn((batch,) + verts.shape, generator=g, dtype=F64)
    x0[..., 1] -= 0.005  # some vertices below the ground: contact and friction are active
    v0 = 0.3 * torch.randn(x0.shape, generator=g, dtype=F64)
    a = 0.6 + 0.4 * torch.rand((batch, body.num_muscles), generator=g, dtype=F64)
    params, top = sim.step_problem(x0, v0, a)
    y = params.x0_free + 0.005 * torch.randn(params.x0_free.shape, generator=g, dtype=F64)
    return y, params, top


@pytest.mark.parametrize("dim,material,fixed", CASES)
def test_per_problem_kernels_match_the_reference_and_the_torch_path(dim, material, fixed):
    """The kernels with per-problem parameters: value, gradient and Hessian products against the plain-torch
    reference and the device-agnostic torch path; every parameter derivative, first order and mixed."""
    y, params, top = _energy_problem(dim, material, fixed)
    tensors = [p.detach().clone().requires_grad_() for p in params.flat()]
    y = y.detach().clone().requires_grad_()
    v = torch.randn_like(y)
    _, g0, h0 = assert_fused_matches_reference(y, tensors, top, v)
    g_torch, hessian_torch = gradient_and_hessian(y.detach(), unpack((*tensors, top))[0], top)
    torch.testing.assert_close(g_torch, g0.detach(), rtol=1e-10, atol=1e-10 * g0.abs().max().item())
    torch.testing.assert_close(hessian_torch.apply(v), h0, rtol=1e-10, atol=1e-10 * h0.abs().max().item())

    wanted = list(range(len(tensors)))
    weight = torch.rand(y.shape[:-2], dtype=F64) + 0.5
    for order, probe in ((1, weight), (2, v)):
        ours = fused._kernel_param_grads(y, tensors, top, wanted, **({"weight": probe} if order == 1 else
                                                                         {"dir": probe}))
        reference = reference_param_grads(y, tensors, top, wanted, probe, order)
        for name, t, g, r in zip(param_names(params, top), tensors, ours, reference):
            assert g.shape == t.shape, (order, name)
            r = torch.zeros_like(g) if r is None else r
            torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10 * max(r.abs().max().item(), 1e-12),
                                       msg=f"order {order}, parameter {name}")


def test_mismatched_batches_are_refused_by_name():
    sim, x, v = _biped_sliding_onto_the_ground(batch=3)
    body = sim.body
    cases = [("body.mu", lambda: setattr(body, "mu", body.mu.expand(4, -1))),
             ("body.mass", lambda: setattr(body, "mass", body.mass.expand(2, -1))),
             ("body.muscle_stiffness", lambda: setattr(body, "muscle_stiffness", body.muscle_stiffness.expand(2, -1))),
             ("gravity", lambda: setattr(sim, "gravity", torch.full((2,), 9.8, dtype=F64))),
             ("friction_eps", lambda: setattr(sim, "friction_eps", torch.full((4,), 0.01, dtype=F64))),
             ("dt", lambda: setattr(sim, "dt", torch.full((2,), 0.03, dtype=F64)))]
    for name, assign in cases:
        saved = {k: getattr(body, k) for k in BODY_FIELDS}, {k: getattr(sim, k) for k in CONSTANTS}
        assign()
        with pytest.raises(ValueError, match=rf"{name} has shape .* x0's batch of 3"):
            sim.step(x, v)
        _assign(sim, {**saved[0], **saved[1]})
    body.mass = body.mass.expand(3, -1)  # per creature, but x0 is one creature
    with pytest.raises(ValueError, match=r"body.mass has shape \(3, 26\).*x0 is \(N, d\)"):
        sim.step(x[0], v[0])
    # A field of the wrong size, or dtype, is refused when assigned, naming what the body has (not the batch).
    with pytest.raises(ValueError, match=r"body.Dm_inv has shape \(27, 2, 2\), but the body has 28 elements"):
        body.Dm_inv = body.Dm_inv[:-1]
    with pytest.raises(TypeError, match="body.mass has dtype torch.float32"):
        body.mass = body.mass[0].float()


@pytest.mark.parametrize("name, value, error, match", [
    ("dt", torch.tensor(-0.01), ValueError, "dt must be a positive number"),
    ("dt", torch.ones(2, 2), TypeError, "dt must be"), ("dt", torch.tensor(1j), TypeError, "dt must be"),
    ("ground", torch.tensor(float("nan")), ValueError, "ground must be"),
    ("friction_eps", torch.tensor([0.01, -0.01]), ValueError, "friction_eps must be"),
    ("gravity", torch.ones(2, 2), TypeError, "gravity"), ("ground", "0.0", TypeError, "ground must be"),
    ("friction", torch.tensor([1.0, float("inf")]), ValueError, "friction must be")])
def test_bad_constant_tensors_are_refused_by_name(name, value, error, match):
    """A value that is not a number or a 0-dim/(B,) tensor is a TypeError, one out of range a ValueError, for
    each of the six constants alike."""
    with pytest.raises(error, match=match):
        Simulator(biped(dtype=F64).body, **{name: value})


def test_constants_keep_their_kind_and_follow_to():
    body = biped(dtype=F64).body
    ground = torch.tensor(0.1, requires_grad=True)  # float32: kept as given, converted (differentiably) at each step
    sim = Simulator(body, dt=0.02, ground=ground, friction_eps=torch.tensor(0.02))
    assert isinstance(sim.dt, float) and sim.ground is ground
    x1, _ = sim.step(*sim.rest_state)
    assert x1.dtype == F64 and torch.autograd.grad(x1[:, 1].sum(), ground)[0].dtype == torch.float32
    assert len(sim.topology.colliders) == 1
    sim.ground = None  # whether there is a ground is topology: the next step's is rebuilt
    assert sim.topology.colliders == ()
    sim.ground = torch.tensor(0.1, dtype=F64)
    small = sim.to(torch.float32)
    assert small.ground.dtype == torch.float32 and small.friction_eps.dtype == torch.float32 and small.dt == 0.02
    x1, _ = small.step(*small.rest_state)
    assert x1.dtype == torch.float32 and torch.isfinite(x1).all()


def _doc_blocks():
    import os
    import re

    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "parameters.md")
    with open(path) as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.S | re.M)


@pytest.mark.parametrize("index", range(len(_doc_blocks())))
def test_docs_parameters_python_blocks_run(index, capsys):
    """docs/parameters.md's examples run as written, and every leaf they mark gets a finite gradient."""
    namespace = {}
    exec(compile(_doc_blocks()[index], f"docs/parameters.md python block {index + 1}", "exec"), namespace)
    leaves = [v for v in namespace.values() if isinstance(v, torch.Tensor) and v.requires_grad and v.is_leaf]
    assert leaves and all(v.grad is not None and torch.isfinite(v.grad).all() for v in leaves)
