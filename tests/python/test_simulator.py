"""Simulator.step and rollouts: gradients against finite differences (float64), physics against closed forms,
stability, and input checks. Tests taking the ``device`` fixture run on every device present (CUDA's take the
torch backend; on CPU, tests/python/test_torch_backend.py compares that backend with the C++ one)."""
import math
import warnings

import pytest
import torch

from diffsoft import creatures
from diffsoft.body import SoftBody
from diffsoft.mesh import box, rectangle
from diffsoft.simulator import Simulator

from conftest import F64, TIGHT, small_sim

PHYSICS = dict(on_failure="raise")


def _state(sim, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = sim.body.rest_positions + torch.tensor([0.0, 0.004], dtype=F64)  # bottom row within friction_eps
    x = x + 0.003 * torch.randn(x.shape, generator=g, dtype=F64)
    v = torch.tensor([0.3, -0.4], dtype=F64) + 0.1 * torch.randn(x.shape, generator=g, dtype=F64)
    return x.to(sim.body.device), v.to(sim.body.device)


# Every quantity a step is differentiable with respect to, as (name, getter, setter).
_PARAMS = [
    ("mu", lambda s: s.body.mu, lambda s, t: setattr(s.body, "mu", t)),
    ("lam", lambda s: s.body.lam, lambda s, t: setattr(s.body, "lam", t)),
    ("mass", lambda s: s.body.mass, lambda s, t: setattr(s.body, "mass", t)),
    ("Dm_inv", lambda s: s.body.Dm_inv, lambda s, t: setattr(s.body, "Dm_inv", t)),
    ("muscle_rest_length", lambda s: s.body.muscle_rest_length,
     lambda s, t: setattr(s.body, "muscle_rest_length", t)),
    ("muscle_stiffness", lambda s: s.body.muscle_stiffness, lambda s, t: setattr(s.body, "muscle_stiffness", t)),
    ("gravity", lambda s: s.gravity, lambda s, t: setattr(s, "gravity", t)),
    ("contact_stiffness", lambda s: s.contact_stiffness, lambda s, t: setattr(s, "contact_stiffness", t)),
    ("friction", lambda s: s.friction, lambda s, t: setattr(s, "friction", t)),
    ("dt", lambda s: torch.as_tensor(s.dt, dtype=F64), lambda s, t: setattr(s, "dt", t)),
    ("ground", lambda s: torch.as_tensor(s.ground, dtype=F64), lambda s, t: setattr(s, "ground", t)),
    ("friction_eps", lambda s: torch.as_tensor(s.friction_eps, dtype=F64), lambda s, t: setattr(s, "friction_eps", t)),
]


def _with_params(sim, values):
    for (_, _, setter), t in zip(_PARAMS, values):
        setter(sim, t)


@pytest.mark.parametrize("material,fixed", [("neo_hookean", None), ("algovivo", [2]),
                                            ("stable_neo_hookean", None)])
def test_step_gradients_against_finite_differences(material, fixed, device):
    sim = small_sim(material, fixed, device)
    x0, v0 = _state(sim)
    a = torch.tensor([0.7, 0.9], dtype=F64, device=device)
    originals = [get(sim).detach().clone() for _, get, _ in _PARAMS]
    inputs = tuple(t.clone().requires_grad_() for t in [x0, v0, a] + originals)

    def step(x0, v0, a, *values):
        _with_params(sim, values)
        return sim.step(x0, v0, a)

    x1, _ = step(*inputs)
    assert (x1[:, 1] < 0).any(), "the test must exercise ground contact"
    assert torch.autograd.gradcheck(step, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def _check_directional_derivatives(loss, values, names, eps=1e-6, rel=1e-5, abs=1e-7):
    """For each input, compares grad . d with the central difference (L(v + eps d) - L(v - eps d)) / 2 eps
    along a random direction d scaled to the input's magnitude (the inputs span 1e-2 .. 1e4)."""
    leaves = [t.clone().requires_grad_() for t in values]
    grads = torch.autograd.grad(loss(*leaves), leaves)
    g = torch.Generator().manual_seed(0)
    for name, val, grad in zip(names, values, grads):
        d = torch.randn(val.shape, generator=g, dtype=F64) * val.abs().clamp(min=1e-2)
        with torch.no_grad():
            plus = [w + eps * d if w is val else w for w in values]
            minus = [w - eps * d if w is val else w for w in values]
            fd = (loss(*plus) - loss(*minus)).item() / (2 * eps)
        assert (grad * d).sum().item() == pytest.approx(fd, rel=rel, abs=abs), name


def test_step_gradients_in_3d_against_central_differences():
    v, t = box((0.2, 0.1, 0.1), (1, 1, 1), dtype=F64)
    body = SoftBody(v, t, density=100.0, youngs_modulus=2e3, poisson_ratio=0.3, muscles=[[0, 7], [1, 6]],
                    material="stable_neo_hookean", fixed=[2])
    sim = Simulator(body, dt=0.02, **TIGHT)
    x0 = v + 0.004 * torch.tensor([0.0, 1.0, 0.0], dtype=F64)
    v0 = torch.tensor([0.3, -0.4, -0.2], dtype=F64) + 0.1 * torch.randn(
        x0.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    values = [x0, v0, torch.tensor([0.8, 0.6], dtype=F64)] + [get(sim).detach().clone() for _, get, _ in _PARAMS]
    names = ["x0", "v0", "activation"] + [n for n, _, _ in _PARAMS]
    w = torch.randn(x0.shape, generator=torch.Generator().manual_seed(4), dtype=F64)

    def loss(x0, v0, a, *params):
        _with_params(sim, params)
        x1, v1 = sim.step(x0, v0, a)
        return (w * x1).sum() + 0.01 * (v1 ** 2).sum()

    x1, _ = sim.step(x0, v0)
    assert (x1[:, 1] < 0).any()
    _check_directional_derivatives(loss, values, names)


def _rollout_loss(sim, x0, v0, acts):
    xs, vs = sim.rollout(x0, v0, acts)
    w = torch.linspace(0.5, 1.5, xs.shape[-2], dtype=F64)
    return (w * xs[-1, :, 0]).sum() + (xs[5:, :, 1] ** 2).sum() + 0.1 * (vs[-1] ** 2).sum()


def test_rollout_of_20_steps_with_contact_gradients_against_central_differences():
    v, t = rectangle(0.2, 0.1, 1, 1, dtype=F64)  # 4 vertices, 2 triangles
    body = SoftBody(v, t, material="algovivo", mass=1.0, mu=50.0, lam=5.0, muscles=[[0, 3]], muscle_stiffness=9.0)
    sim = Simulator(body, dt=0.03, **TIGHT)
    x0 = v + torch.tensor([0.0, 0.03], dtype=F64)
    v0 = torch.tensor([[0.5, -1.0], [0.4, -1.1], [0.6, -0.9], [0.5, -1.2]], dtype=F64)
    acts = 0.8 + 0.15 * torch.sin(torch.arange(20, dtype=F64))[:, None]
    values = [x0, v0, acts] + [get(sim).detach().clone() for _, get, _ in _PARAMS]
    names = ["x0", "v0", "activation"] + [n for n, _, _ in _PARAMS]

    def loss(*vals):
        _with_params(sim, vals[3:])
        return _rollout_loss(sim, *vals[:3])

    xs, _ = sim.rollout(x0, v0, acts)
    assert (xs[:, :, 1] < 0).any(dim=1).sum() >= 5, "the rollout must be in contact for several steps"
    _check_directional_derivatives(loss, values, names)


def test_batched_step_matches_separate_steps_and_gradients(device):
    sim = small_sim(fixed=[0], device=device)
    xa, va = _state(sim, 1)
    xb, vb = _state(sim, 2)
    acts = torch.tensor([[0.7, 0.9], [1.0, 0.5]], dtype=F64, device=device, requires_grad=True)
    x0 = torch.stack([xa, xb]).requires_grad_()
    x1, v1 = sim.step(x0, torch.stack([va, vb]), acts)
    assert x1.shape == (2, 6, 2)
    for i, (x, v) in enumerate([(xa, va), (xb, vb)]):
        xi, vi = sim.step(x, v, acts[i].detach())
        assert torch.allclose(x1[i], xi, atol=1e-12) and torch.allclose(v1[i], vi, atol=1e-10)
    # One activation vector shared by the whole batch broadcasts.
    x1s, _ = sim.step(x0.detach(), torch.stack([va, vb]), acts[0].detach())
    assert torch.allclose(x1s[0], x1[0], atol=1e-12)
    ga, gx = torch.autograd.grad(x1[1, :, 0].sum(), [acts, x0])
    assert ga[0].abs().max() == 0 and gx[0].abs().max() == 0 and ga[1].abs().max() > 0


def test_fixed_vertices_do_not_move(device):
    sim = small_sim(fixed=[0, 3], device=device)
    x0, v0 = _state(sim)
    x1, v1, info = sim.step(x0, v0, return_info=True)
    assert torch.equal(x1[[0, 3]], x0[[0, 3]]) and v1[[0, 3]].abs().max() == 0
    assert info.converged and (x1[[1, 2, 4, 5]] != x0[[1, 2, 4, 5]]).all()


def test_free_fall_and_momentum_are_exact():
    v, t = rectangle(0.4, 0.2, 2, 1, dtype=F64)
    body = SoftBody(v, t, density=100.0, youngs_modulus=2e3, poisson_ratio=0.3, muscles=[[0, 5]])
    x = v + 0.01 * torch.randn(v.shape, generator=torch.Generator().manual_seed(0), dtype=F64)
    vel = torch.randn(v.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    m = body.mass[:, None]
    p0 = (m * vel).sum(0)
    sim = Simulator(body, dt=0.01, gravity=9.8, ground=None, rtol=1e-12, atol=1e-10, on_failure="raise")
    acts = torch.full((10, 1), 0.6, dtype=F64)
    xs, vs = sim.rollout(x, vel, acts)
    # Internal forces (elastic, muscles) sum to zero: momentum changes by the weight's impulse only.
    p = (m * vs[-1]).sum(0)
    assert p[0].item() == pytest.approx(p0[0].item(), abs=1e-9)
    assert p[1].item() == pytest.approx(p0[1].item() - body.mass.sum().item() * 9.8 * 0.1, abs=1e-9)


def test_backward_euler_is_stable_where_symplectic_euler_blows_up():
    v, t = rectangle(0.3, 0.1, 3, 1, dtype=F64)
    body = SoftBody(v, t, density=10.0, youngs_modulus=1e6, poisson_ratio=0.3)
    sim = Simulator(body, dt=0.01, gravity=0.0, ground=None, **PHYSICS)
    x0 = v * torch.tensor([1.1, 0.95], dtype=F64)  # stretched, then released
    vel0 = torch.zeros_like(x0)
    total = lambda x, vel: (sim.kinetic_energy(vel) + sim.potential_energy(x)).item()
    e0 = total(x0, vel0)
    # Symplectic Euler with the same stiff body and time step (far above its stability limit ~ 2/omega_max).
    x, vel = x0.clone(), vel0.clone()
    for _ in range(20):
        xr = x.clone().requires_grad_()
        (grad,) = torch.autograd.grad(sim.potential_energy(xr), xr)
        vel = vel - sim.dt * grad / body.mass[:, None]
        x = x + sim.dt * vel
        if not math.isfinite(total(x, vel)) or total(x, vel) > 1e6 * e0:
            break
    assert not math.isfinite(total(x, vel)) or total(x, vel) > 1e6 * e0
    # Backward Euler: bounded, and with no forcing the total energy never grows.
    x, vel = x0, vel0
    energies = [e0]
    for _ in range(40):
        x, vel = sim.step(x, vel)
        energies.append(total(x, vel))
    assert all(b <= a + 1e-12 * e0 for a, b in zip(energies, energies[1:]))  # up to the solver's residual
    assert energies[-1] < e0


def _hanging_bar_tip(ny, E=1e6, rho=1000.0, g=9.8, L=1.0, w=0.1):
    v, t = rectangle(w, L, 1, ny, dtype=F64)
    top = torch.nonzero(v[:, 1] == L).flatten()
    # lam = 0 (Poisson ratio 0): the neo-Hookean bar stretches along y only, a 1D problem with a closed form.
    body = SoftBody(v, t, density=rho, mu=E / 2, lam=0.0, fixed=top)
    sim = Simulator(body, dt=100.0, gravity=g, ground=None, **PHYSICS)  # dt >> any period: a static solve
    x1, _ = sim.step(*sim.rest_state)
    return (v[:, 1] - x1[:, 1])[v[:, 1] == 0].mean().item()


def test_hanging_bar_static_equilibrium_converges_to_the_closed_form():
    # Neo-Hookean uniaxial stress with lam = 0: P = mu (s - 1/s) = rho g (L - X) at height X, so
    # s(X) = (p + sqrt(p^2 + 4)) / 2 with p = rho g (L - X) / mu, and the tip sinks int_0^L (s - 1) dX.
    E, rho, g, L, mu = 1e6, 1000.0, 9.8, 1.0, 5e5
    n = 20000
    X = (torch.arange(n, dtype=F64) + 0.5) / n * L
    p = rho * g * (L - X) / mu
    exact = (((p + torch.sqrt(p * p + 4)) / 2 - 1).sum() * L / n).item()
    assert exact == pytest.approx(rho * g * L ** 2 / (2 * E), rel=0.02)  # the linear-elastic value, roughly
    errors = [abs(_hanging_bar_tip(ny) - exact) / exact for ny in (2, 4, 8)]
    assert errors[-1] < 0.01
    assert errors[0] > errors[1] > errors[2]


def test_friction_slows_a_sliding_block_and_muscles_contract():
    v, t = rectangle(0.4, 0.2, 2, 1, dtype=F64)
    body = SoftBody(v, t, density=100.0, youngs_modulus=2e3, poisson_ratio=0.3, muscles=[[0, 2]])
    vel = torch.zeros_like(v)
    vel[:, 0] = 1.0
    with_friction = Simulator(body, dt=0.02)
    without = Simulator(body, dt=0.02, friction=0.0)
    _, vs_f = with_friction.rollout(v, vel, steps=10)
    _, vs_0 = without.rollout(v, vel, steps=10)
    assert vs_f[-1, :, 0].mean() < 0.5 and vs_0[-1, :, 0].mean() > 0.9
    xs, _ = Simulator(body, dt=0.05, gravity=0.0, ground=None).rollout(
        v, torch.zeros_like(v), torch.full((20, 1), 0.5, dtype=F64))
    assert (xs[-1, 2, 0] - xs[-1, 0, 0]).item() < 0.6 * 0.4


def test_neo_hookean_step_never_inverts():
    v, t = rectangle(0.2, 0.2, 1, 1, dtype=F64)
    body = SoftBody(v, t, density=10.0, youngs_modulus=1e2, poisson_ratio=0.3)
    sim = Simulator(body, dt=0.05, gravity=0.0, ground=None)
    vel = torch.zeros_like(v)
    vel[3] = torch.tensor([0.0, -30.0], dtype=F64)  # would cross the bottom edge within one step
    x1, _ = sim.step(v, vel)
    e = x1[t[:, 1:]] - x1[t[:, :1]]
    assert (torch.det(e) > 0).all()


@pytest.mark.parametrize("make_args, error, match", [
    (lambda x, v, a: (x.float(), v, a), TypeError, "x0 has dtype torch.float32"),
    (lambda x, v, a: (x, v[:-1], a), ValueError, r"v0 must be \(N, d\)"),
    (lambda x, v, a: (x[None].expand(2, -1, -1), v[None].expand(3, -1, -1), a), ValueError, "same shape"),
    (lambda x, v, a: (x, v, a[:1]), ValueError, "one per muscle"),
    (lambda x, v, a: (x, v, a * 0), ValueError, r"activation must be in \[1e-06, 1\]"),
    (lambda x, v, a: (x, v, a + 1), ValueError, r"activation must be in \[1e-06, 1\]"),
    (lambda x, v, a: (x, v, a.float()), TypeError, "activation has dtype"),
    (lambda x, v, a: (x.tolist(), v, a), TypeError, "x0 must be a torch.Tensor"),
    (lambda x, v, a: (x, v, torch.ones(3, 2, dtype=F64)), ValueError, "one per muscle"),
])
def test_bad_state_or_activation_raises(make_args, error, match):
    sim = small_sim()
    x, v = _state(sim)
    with pytest.raises(error, match=match):
        sim.step(*make_args(x, v, torch.tensor([0.5, 0.5], dtype=F64)))


def test_bad_simulator_arguments():
    body = small_sim().body
    with pytest.raises(ValueError, match="dt"):
        Simulator(body, dt=0.0)
    with pytest.raises(ValueError, match="contact_stiffness"):
        Simulator(body, contact_stiffness=-1.0)
    with pytest.raises(TypeError, match="ground"):
        Simulator(body, ground="floor")


def test_default_contact_and_friction_follow_the_masses_and_their_gradients():
    """The defaults are computed from the body's masses at each step: a gradient with respect to the density
    given to SoftBody (through masses, contact stiffness and friction) matches central differences."""
    verts, tris = rectangle(width=0.4, height=0.1, nx=4, ny=1, dtype=torch.float64)

    def loss(rho):
        body = SoftBody(verts, tris, density=rho, youngs_modulus=1e4, poisson_ratio=0.3)
        sim = Simulator(body, dt=0.01, ground=0.0, rtol=1e-12)
        x, v = sim.rest_state
        x = x - torch.tensor([0.0, 0.004], dtype=torch.float64)  # below the ground: contact and friction act
        v = v + torch.tensor([0.5, 0.0], dtype=torch.float64)
        x1, _ = sim.step(x, v)
        return (x1 * torch.linspace(-1, 1, x1.numel(), dtype=torch.float64).reshape(x1.shape)).sum(), sim

    rho = torch.tensor(800.0, dtype=torch.float64, requires_grad=True)
    value, sim = loss(rho)
    (grad,) = torch.autograd.grad(value, rho)
    torch.testing.assert_close(sim.contact_stiffness, 14000 / 6.0714287757873535 * sim.body.mass.mean())
    eps = 1e-3
    fd = (loss(torch.tensor(800.0 + eps, dtype=torch.float64))[0]
          - loss(torch.tensor(800.0 - eps, dtype=torch.float64))[0]) / (2 * eps)
    assert grad.item() == pytest.approx(fd.item(), rel=1e-5)
    sim.contact_stiffness = 5.0
    assert sim.contact_stiffness.item() == 5.0
    with pytest.raises(ValueError, match="contact_stiffness must be a positive number"):
        sim.contact_stiffness = -1.0


def test_a_rollout_whose_activations_read_as_steps_of_a_batch_warns():
    # A review: (B, M) activations for a batch of B ran B steps, each row shared by the batch, without a word.
    sim = creatures.biped(dtype=torch.float64)
    x, v = sim.rest_state
    xb, vb = x.expand(3, -1, -1), v.expand(3, -1, -1)
    with pytest.warns(RuntimeWarning, match=r"activations of shape \(3, 16\) with a batch of 3 creatures are read "
                                            r"as 3 steps"):
        sim.rollout(xb, vb, torch.full((3, 16), 0.8, dtype=torch.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sim.rollout(xb, vb, torch.full((3, 16), 0.8, dtype=torch.float64), steps=3)  # said: no warning


def test_a_float32_step_through_contact_is_not_said_to_lose_a_second_derivative():
    # A review: float32 fused=False rollouts with contact warned that "part of the energy's second derivative is
    # lost" (moves of 3e-3 of x crossed the contact's kink) where the gradient matched float64's to 1e-4.
    sim = creatures.biped(dtype=torch.float32)
    sim.fused = False
    x, v = sim.rest_state
    x, v = x + torch.tensor([0.0, 0.02]), v + torch.tensor([1.0, -0.3])
    t = torch.arange(20, dtype=torch.float32)[:, None]
    acts = 0.75 + 0.2 * torch.cos(0.4 * t + torch.arange(sim.body.num_muscles, dtype=torch.float32))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*second derivative is lost")
        for a in acts:
            sim.body.mu = sim.body.mu.detach().clone().requires_grad_()
            x1, v1 = sim.step(x, v, a)
            x1.sum().backward()
            x, v = x1.detach(), v1.detach()


def test_a_stiff_body_falls_under_gravity():
    # A review: the default atol, scaled by the elastic force at 100% stretch, exceeded a stiff body's weight:
    # every step was converged at its start, and a steel cube (float64) or algovivo's tetrapod (float32) never fell.
    v, t = box((0.1, 0.1, 0.1), (2, 2, 2), dtype=torch.float64)
    sim = Simulator(SoftBody(v, t, density=7800.0, youngs_modulus=2e11, poisson_ratio=0.3), gravity=9.8, ground=None)
    x, vv = sim.rest_state
    for _ in range(30):
        x, vv = sim.step(x, vv)
    fall = sum(9.8 * sim.dt ** 2 * k for k in range(1, 31))  # backward Euler's free fall
    assert float((x - v)[:, 1].mean()) == pytest.approx(-fall, rel=1e-6)
    tet = creatures.tetrapod(dtype=torch.float32, material="algovivo")
    tet.ground = None
    x, vv = tet.rest_state
    x1, _ = tet.step(x, vv)
    assert float((x1 - x)[:, 1].mean()) == pytest.approx(-9.8 * tet.dt ** 2, rel=1e-3)
