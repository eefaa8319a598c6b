"""Energy terms: closed forms, rigid-motion invariance, gradients and Hessian-vector products by finite
differences (gradcheck / gradgradcheck in float64)."""
import math

import pytest
import torch

from diffsoft import energies
from diffsoft.colliders import Plane
from diffsoft.mesh import box, rectangle

MATERIALS = energies.MATERIALS
DIMS = (2, 3)


def _mesh(dim):
    if dim == 2:
        return rectangle(1.0, 0.5, 2, 1, dtype=torch.float64)
    return box((1.0, 0.5, 0.5), (1, 1, 1), dtype=torch.float64)


def _Dm_inv(x, elements):
    edges = x[elements[:, 1:]] - x[elements[:, :1]]
    return torch.inverse(edges.transpose(-1, -2))


def _rotation(dim, seed):
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def _deformed(x, seed, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    return x + scale * torch.randn(x.shape, generator=g, dtype=x.dtype)


def _lame(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    mu = 1.0 + torch.rand(n, generator=g, dtype=torch.float64)
    lam = 2.0 + torch.rand(n, generator=g, dtype=torch.float64)
    return mu, lam


def _density(material):
    return getattr(energies, f"{material}_density")


def test_deformation_gradient_of_affine_map_is_its_matrix():
    for dim in DIMS:
        X, el = _mesh(dim)
        A = torch.eye(dim, dtype=torch.float64) + 0.3 * torch.arange(dim * dim, dtype=torch.float64).reshape(dim, dim)
        x = X @ A.T + 0.7
        F = energies.deformation_gradient(x, el, _Dm_inv(X, el))
        assert torch.allclose(F, A.expand_as(F), atol=1e-12)


def test_determinant_matches_torch():
    for dim in DIMS:
        F = torch.randn(5, dim, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(dim))
        assert torch.allclose(energies.determinant(F), torch.det(F), atol=1e-12)


@pytest.mark.parametrize("material", MATERIALS)
@pytest.mark.parametrize("dim", DIMS)
def test_rigid_motion_has_zero_energy_and_zero_force(material, dim):
    X, el = _mesh(dim)
    mu, lam = _lame(len(el))
    x = (X @ _rotation(dim, 1).T + torch.tensor([0.3, -1.2, 2.0][:dim], dtype=torch.float64)).requires_grad_()
    e = energies.elastic_energy(x, el, _Dm_inv(X, el), mu, lam, material)
    (force,) = torch.autograd.grad(e, x)
    assert abs(e.item()) < 1e-12
    assert force.abs().max().item() < 1e-12


@pytest.mark.parametrize("material", MATERIALS)
@pytest.mark.parametrize("dim", DIMS)
def test_elastic_energy_is_invariant_under_rotation_and_translation(material, dim):
    X, el = _mesh(dim)
    mu, lam = _lame(len(el))
    Dm_inv = _Dm_inv(X, el)
    x = _deformed(X, 2, 0.1)
    R, t = _rotation(dim, 3), torch.full((dim,), 0.4, dtype=torch.float64)
    e = energies.elastic_energy(x, el, Dm_inv, mu, lam, material)
    e_moved = energies.elastic_energy(x @ R.T + t, el, Dm_inv, mu, lam, material)
    assert e.item() > 1e-3
    assert e_moved.item() == pytest.approx(e.item(), rel=1e-11)


@pytest.mark.parametrize("dim", DIMS)
def test_other_energies_are_invariant_under_their_symmetries(dim):
    X, _ = _mesh(dim)
    n = len(X)
    x, x0 = _deformed(X, 4) - 0.02, _deformed(X, 5) - 0.01  # some vertices under the ground
    mass = torch.linspace(1.0, 2.0, n, dtype=torch.float64)
    muscles = torch.tensor([[0, n - 1], [1, 2]])
    a, l0, k = torch.tensor([0.7, 0.9], dtype=torch.float64), torch.tensor([0.8, 0.4], dtype=torch.float64), 3.0
    R, t = _rotation(dim, 6), torch.tensor([0.3, -0.2, 0.5][:dim], dtype=torch.float64)
    # Any rigid motion: inertia (applied to x and x_hat alike) and muscles.
    assert energies.inertia_energy(x @ R.T + t, x0 @ R.T + t, mass).item() == pytest.approx(
        energies.inertia_energy(x, x0, mass).item(), rel=1e-12)
    assert energies.muscle_energy(x @ R.T + t, muscles, a, l0, k).item() == pytest.approx(
        energies.muscle_energy(x, muscles, a, l0, k).item(), rel=1e-12)
    # Motions that keep y: horizontal translations and, in 3D, rotations about the y axis.
    th = 0.8
    Ry = torch.tensor([[math.cos(th), 0, math.sin(th)], [0, 1, 0], [-math.sin(th), 0, math.cos(th)]],
                      dtype=torch.float64) if dim == 3 else torch.eye(2, dtype=torch.float64)
    th_ = torch.tensor([0.7, 0.0, -0.3][:dim], dtype=torch.float64)
    moved, moved0 = x @ Ry.T + th_, x0 @ Ry.T + th_
    up = torch.eye(dim, dtype=torch.float64)[1]
    ground = torch.tensor(0.01, dtype=torch.float64)
    for f in (lambda y, y0: energies.gravity_energy(y, mass, 9.8),
              lambda y, y0: energies.contact_energy(y, y0, 0.03, 100.0, 0.0, 0.01, Plane.surface, up, ground),
              lambda y, y0: energies.contact_energy(y, y0, 0.03, 0.0, 20.0, 0.01, Plane.surface, up, ground)):
        assert f(moved, moved0).item() == pytest.approx(f(x, x0).item(), rel=1e-12)
        assert f(x, x0).item() != 0.0


def _uniaxial(dim, s):
    return torch.diag(torch.tensor([s] + [1.0] * (dim - 1), dtype=torch.float64))


def _shear(dim, g):
    F = torch.eye(dim, dtype=torch.float64)
    F[0, 1] = g
    return F


def _snh_closed(dim, mu, lam, I1, J):
    mu_s = (dim + 1) / dim * mu
    lam_s = lam + (dim * (dim + 1) - 2) / (dim * (dim + 1)) * mu
    alpha = 1 + mu / lam_s
    def psi(I1, J):
        return 0.5 * mu_s * (I1 - dim) + 0.5 * lam_s * (J - alpha) ** 2 - 0.5 * mu_s * math.log(I1 + 1)
    return psi(I1, J) - psi(dim, 1.0)


@pytest.mark.parametrize("dim", DIMS)
def test_materials_match_closed_forms_in_uniaxial_stretch_and_pure_shear(dim):
    mu, lam = 3.0, 5.0
    q = lambda J: -1.5 + 2 * J - 0.5 * J * J
    for s in (0.6, 1.3, 2.0):
        F = _uniaxial(dim, s)
        I1 = s * s + dim - 1
        expected = {
            "neo_hookean": 0.5 * mu * (I1 - dim) - mu * math.log(s) + 0.5 * lam * math.log(s) ** 2,
            "algovivo": 0.5 * mu * (I1 - dim) - mu * q(s) + 0.5 * lam * q(s) ** 2,
            "stable_neo_hookean": _snh_closed(dim, mu, lam, I1, s),
        }
        for material, value in expected.items():
            assert _density(material)(F, mu, lam).item() == pytest.approx(value, rel=1e-12), (material, s)
    for g in (0.1, 0.5):
        F = _shear(dim, g)
        I1 = dim + g * g
        assert energies.neo_hookean_density(F, mu, lam).item() == pytest.approx(0.5 * mu * g * g, rel=1e-12)
        assert energies.algovivo_density(F, mu, lam).item() == pytest.approx(0.5 * mu * g * g, rel=1e-12)
        assert energies.stable_neo_hookean_density(F, mu, lam).item() == pytest.approx(
            _snh_closed(dim, mu, lam, I1, 1.0), rel=1e-12)


def test_neo_hookean_in_2d_uniaxial_stretch_by_hand():
    # s = 2, mu = lam = 1: 1/2 (4 + 1 - 2) - log 2 + 1/2 log(2)^2
    F = _uniaxial(2, 2.0)
    assert energies.neo_hookean_density(F, 1.0, 1.0).item() == pytest.approx(1.5 - 0.6931471805599453
                                                                             + 0.5 * 0.4804530139182014, rel=1e-14)


@pytest.mark.parametrize("material", ["neo_hookean", "stable_neo_hookean"])
@pytest.mark.parametrize("dim", DIMS)
def test_small_strain_limit_is_linear_elasticity(material, dim):
    # d^2/de^2 psi(I + e G) at e = 0 must be 2 mu |sym G|^2 + lam tr(G)^2, for any G.
    mu, lam = 2.0, 7.0
    for seed in range(3):
        G = torch.randn(dim, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        e = torch.zeros((), dtype=torch.float64, requires_grad=True)
        psi = _density(material)(torch.eye(dim, dtype=torch.float64) + e * G, mu, lam)
        (d1,) = torch.autograd.grad(psi, e, create_graph=True)
        (d2,) = torch.autograd.grad(d1, e)
        sym = 0.5 * (G + G.T)
        expected = 2 * mu * (sym * sym).sum() + lam * torch.trace(G) ** 2
        assert abs(d1.item()) < 1e-12  # stress-free at rest
        assert d2.item() == pytest.approx(expected.item(), rel=1e-10)


@pytest.mark.parametrize("dim", DIMS)
def test_neo_hookean_is_infinite_for_inverted_elements_and_the_others_are_finite(dim):
    F = _uniaxial(dim, -0.5)
    assert math.isinf(energies.neo_hookean_density(F, 1.0, 1.0).item())
    assert math.isinf(energies.neo_hookean_density(0 * F, 1.0, 1.0).item())
    for material in ("algovivo", "stable_neo_hookean"):
        psi = _density(material)(F.requires_grad_(), 1.0, 1.0)
        (g,) = torch.autograd.grad(psi, F)
        assert math.isfinite(psi.item()) and torch.isfinite(g).all()
    # The gradient of a finite neo-Hookean energy stays finite next to inverted elements in the batch.
    Fs = torch.stack([_uniaxial(dim, 1.2), _uniaxial(dim, 0.9)]).requires_grad_()
    (g,) = torch.autograd.grad(energies.neo_hookean_density(Fs, 1.0, 1.0).sum(), Fs)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("material", MATERIALS)
@pytest.mark.parametrize("dim", DIMS)
def test_elastic_energy_gradient_and_hvp_against_finite_differences(material, dim):
    X, el = _mesh(dim)
    mu, lam = _lame(len(el))
    x = _deformed(X, 7).requires_grad_()
    Dm_inv = _Dm_inv(X, el).requires_grad_()
    mu.requires_grad_()
    lam.requires_grad_()
    fn = lambda x, Dm_inv, mu, lam: energies.elastic_energy(x, el, Dm_inv, mu, lam, material)
    assert torch.autograd.gradcheck(fn, (x, Dm_inv, mu, lam))
    # gradgradcheck differentiates the gradient again: Hessian-vector products (and mixed second derivatives).
    assert torch.autograd.gradgradcheck(fn, (x, Dm_inv, mu, lam))


@pytest.mark.parametrize("dim", DIMS)
def test_other_energies_gradient_and_hvp_against_finite_differences(dim):
    X, _ = _mesh(dim)
    n = len(X)
    g = torch.Generator().manual_seed(8)
    x = (_deformed(X, 9) - 0.03).requires_grad_()
    x0 = (_deformed(X, 10) - 0.005).requires_grad_()
    mass = (1 + torch.rand(n, generator=g, dtype=torch.float64)).requires_grad_()
    muscles = torch.tensor([[0, n - 1], [1, 2], [0, 3]])
    a = torch.tensor([0.6, 0.9, 1.0], dtype=torch.float64, requires_grad=True)
    l0 = torch.tensor([0.8, 0.4, 0.5], dtype=torch.float64, requires_grad=True)
    k = torch.tensor([3.0, 4.0, 5.0], dtype=torch.float64, requires_grad=True)
    s = lambda v: torch.tensor(v, dtype=torch.float64, requires_grad=True)
    cases = [
        (lambda x, x0, m: energies.inertia_energy(x, x0, m), (x, x0, mass)),
        (lambda x, a, l0, k: energies.muscle_energy(x, muscles, a, l0, k), (x, a, l0, k)),
        (lambda x, m, gr: energies.gravity_energy(x, m, gr), (x, mass, s(9.8))),
        (lambda x, kc: energies.contact_energy(x, x, 0.03, kc, 0.0, 0.01, Plane.surface, *_ground(x, 0.01)),
         (x, s(100.0))),
        (lambda x, x0, kf: energies.contact_energy(x, x0, 0.03, 0.0, kf, 0.01, Plane.surface, *_ground(x, 0.0)),
         (x, x0, s(20.0))),
    ]
    for fn, args in cases:
        assert torch.autograd.gradcheck(fn, args)
        assert torch.autograd.gradgradcheck(fn, args)


def test_muscle_gravity_contact_friction_closed_forms():
    x = torch.tensor([[0.0, -0.1], [3.0, 4.0 - 0.1]], dtype=torch.float64)  # |x1 - x0| = 5
    l = math.sqrt(25 + 1e-6)
    a, l0, k = 0.5, 8.0, 90.0
    assert energies.muscle_energy(x, torch.tensor([[0, 1]]), torch.tensor([a], dtype=torch.float64),
                                  torch.tensor([l0], dtype=torch.float64), k).item() == pytest.approx(
        0.5 * k * ((l - a * l0) / (a * l0)) ** 2, rel=1e-14)
    mass = torch.tensor([2.0, 3.0], dtype=torch.float64)
    assert energies.gravity_energy(x, mass, 9.8).item() == pytest.approx(9.8 * (2 * -0.1 + 3 * 3.9), rel=1e-14)
    def contact(y, kc, ground=0.0):
        return energies.contact_energy(y, y, 1.0, kc, 0.0, 0.01, Plane.surface, *_ground(y, ground)).item()

    assert contact(x, 14000.0) == pytest.approx(14000 * 0.01, rel=1e-14)
    assert contact(x, 14000.0, ground=4.0) == pytest.approx(14000 * (4.1 ** 2 + 0.1 ** 2), rel=1e-14)

    # Friction: only vertex 0 starts within eps of the ground (lagged weight eps - y0), x only in 2D.
    def friction(y, y0, h, kf):
        return energies.contact_energy(y, y0, h, 0.0, kf, 0.01, Plane.surface, *_ground(y, 0.0)).item()

    x0 = torch.tensor([[0.0, 0.004], [1.0, 0.5]], dtype=torch.float64)
    x1 = x0 + torch.tensor([[0.02, -0.3], [0.5, 0.5]], dtype=torch.float64)
    h = 0.033
    assert friction(x1, x0, h, 300.0) == pytest.approx(300 * (0.01 - 0.004) * (0.02 / h) ** 2, rel=1e-12)
    x0_3, x1_3 = torch.zeros(1, 3, dtype=torch.float64), torch.tensor([[0.1, 0.2, -0.3]], dtype=torch.float64)
    assert friction(x1_3, x0_3, h, 300.0) == pytest.approx(300 * 0.01 * (0.1 ** 2 + 0.3 ** 2) / h ** 2, rel=1e-12)


def _ground(x, height):
    """A horizontal plane at ``height`` as Plane.surface's parameters, for positions like ``x``."""
    return torch.eye(x.shape[-1], dtype=x.dtype)[1], torch.tensor(height, dtype=x.dtype)


@pytest.mark.parametrize("material", MATERIALS)
def test_energies_batch_over_leading_dims(material):
    X, el = _mesh(3)
    mu, lam = _lame(len(el))
    xs = torch.stack([_deformed(X, s) for s in range(3)]).reshape(3, 1, len(X), 3)
    batched = energies.elastic_energy(xs, el, _Dm_inv(X, el), mu, lam, material)
    single = torch.stack([energies.elastic_energy(x[0], el, _Dm_inv(X, el), mu, lam, material) for x in xs])
    assert batched.shape == (3, 1)
    assert torch.allclose(batched[:, 0], single, rtol=1e-13)
    muscles = torch.tensor([[0, 5], [2, 7]])
    acts = torch.rand(3, 1, 2, dtype=torch.float64) * 0.5 + 0.5
    m = energies.muscle_energy(xs, muscles, acts, torch.ones(2, dtype=torch.float64), 2.0)
    assert m.shape == (3, 1)
    assert m[1, 0].item() == pytest.approx(
        energies.muscle_energy(xs[1, 0], muscles, acts[1, 0], torch.ones(2, dtype=torch.float64), 2.0).item())


def test_unknown_material_is_rejected():
    X, el = _mesh(2)
    with pytest.raises(ValueError, match="material"):
        energies.elastic_energy(X, el, _Dm_inv(X, el), 1.0, 1.0, "rubber")
