"""SoftBody: derived fields against closed forms, and a clear exception for each kind of bad input."""
import pytest
import torch

from diffsoft.body import SoftBody
from diffsoft.mesh import box, rectangle


def _rect():
    return rectangle(1.0, 0.3, 4, 2, dtype=torch.float64)


def test_lumped_masses_rest_shapes_and_lame_parameters():
    v, t = _rect()
    b = SoftBody(v, t, density=1000.0, youngs_modulus=1e5, poisson_ratio=0.3)
    assert b.dim == 2 and b.dtype == torch.float64
    assert b.mass.sum().item() == pytest.approx(1000 * 0.3, rel=1e-12)
    assert b.rest_volume.sum().item() == pytest.approx(0.3, rel=1e-12)
    # Each triangle gives a third of its mass to each vertex: corner 0 is in one or two triangles.
    tri_mass = 1000 * 0.3 / len(t)
    assert b.mass[0].item() == pytest.approx(tri_mass / 3 * (t == 0).any(1).sum().item(), rel=1e-12)
    assert b.mu[0].item() == pytest.approx(1e5 / 2.6, rel=1e-12)
    assert b.lam[0].item() == pytest.approx(1e5 * 0.3 / (1.3 * 0.4), rel=1e-12)
    edges = v[t[:, 1:]] - v[t[:, :1]]
    assert torch.allclose(edges.transpose(-1, -2) @ b.Dm_inv, torch.eye(2, dtype=torch.float64).expand(len(t), 2, 2))
    assert len(b.fixed) == 0 and torch.equal(b.free, torch.arange(len(v)))


def test_3d_body_masses_and_per_element_parameters():
    v, t = box((1.0, 0.2, 0.2), (4, 1, 1), dtype=torch.float64)
    mu = torch.linspace(1.0, 2.0, len(t), dtype=torch.float64)
    b = SoftBody(v, t, density=torch.full((len(t),), 500.0, dtype=torch.float64), mu=mu, lam=3.0,
                 material="stable_neo_hookean")
    assert b.mass.sum().item() == pytest.approx(500 * 0.04, rel=1e-12)
    assert torch.equal(b.mu, mu) and b.lam.shape == (len(t),)


def test_muscles_fixed_and_defaults():
    v, t = _rect()
    b = SoftBody(v, t, mass=2.0, mu=10.0, lam=5.0, fixed=[0, 5], muscles=[[0, 14], [3, 4]])
    assert torch.equal(b.mass, torch.full((15,), 2.0, dtype=torch.float64))
    assert b.muscle_rest_length.tolist() == pytest.approx([(1.0 ** 2 + 0.3 ** 2) ** 0.5, 0.25])
    assert (b.muscle_stiffness > 0).all()
    assert b.fixed.tolist() == [0, 5] and b.free.tolist() == [i for i in range(15) if i not in (0, 5)]
    b2 = SoftBody(v, t, mass=2.0, mu=10.0, lam=5.0, muscles=[[0, 14]], muscle_rest_length=[0.5],
                  muscle_stiffness=90.0)
    assert b2.muscle_rest_length.tolist() == [0.5] and b2.muscle_stiffness.tolist() == [90.0]


def test_given_rest_shapes_may_differ_from_the_vertices():
    v, t = _rect()
    Dm_inv = torch.inverse((2 * (v[t[:, 1:]] - v[t[:, :1]])).transpose(-1, -2))  # rest shape twice as big
    b = SoftBody(v, t, mass=1.0, mu=1.0, lam=1.0, Dm_inv=Dm_inv, material="algovivo")
    assert b.rest_volume.sum().item() == pytest.approx(4 * 0.3, rel=1e-12)


def test_to_casts_floating_fields():
    v, t = _rect()
    b = SoftBody(v, t, mass=1.0, mu=1.0, lam=1.0, muscles=[[0, 1]]).to(torch.float32)
    assert b.dtype == torch.float32 and b.mass.dtype == torch.float32 and b.elements.dtype == torch.int64
    assert "SoftBody(2D, 15 vertices, 16 triangles, 1 muscles" in repr(b)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(elements=[[0, 1, 99]]), ValueError, r"elements\[0\] = \[0, 1, 99\] has vertex 99, out of range"),
    (dict(elements=[[0, 1, -1]]), ValueError, "out of range"),
    (dict(elements=[[0, 1, 1]]), ValueError, r"elements\[0\] = \[0, 1, 1\] repeats a vertex"),
    (dict(elements=[[0, 1, 2]]), ValueError, "element 0 .* is degenerate"),  # collinear bottom-row vertices
    (dict(elements=[[0, 6, 1]]), ValueError, "element 0 .* is inverted"),
    (dict(elements=[[0.0, 1.0, 6.0]]), TypeError, "integer"),
    (dict(elements=[[0, 1]]), ValueError, r"shape \(K, 3\)"),
    (dict(mass=0.0), ValueError, "mass must be positive: vertex 0"),
    (dict(mass=[1.0, 2.0]), ValueError, "one value per vertex"),
    (dict(mass=None, density=-1.0), ValueError, "density must be positive"),
    (dict(density=1.0), ValueError, "exactly one of density"),
    (dict(mu=0.0), ValueError, "mu must be positive"),
    (dict(lam=-10.0), ValueError, "lam must exceed"),
    (dict(mu=None, lam=None, youngs_modulus=1e5, poisson_ratio=0.5), ValueError, r"poisson_ratio must be in \(-1, 0.5\)"),
    (dict(mu=None, lam=None, youngs_modulus=1e5, poisson_ratio=-1.0), ValueError, "poisson_ratio"),
    (dict(mu=None, lam=None, youngs_modulus=-1.0, poisson_ratio=0.3), ValueError, "youngs_modulus must be positive"),
    # E at float64's smallest normal number gives a subnormal mu: named as E's, which the caller gave (was "mu").
    (dict(mu=None, lam=None, youngs_modulus=2.2250738585072014e-308, poisson_ratio=0.3), ValueError,
     r"youngs_modulus must give mu = E / \(2 \(1 \+ nu\)\) of at least 2.23e-308"),
    (dict(youngs_modulus=1.0, poisson_ratio=0.3), ValueError, "either as youngs_modulus"),
    (dict(muscles=[[0, 99]]), ValueError, r"muscles\[0\] = \[0, 99\] has vertex 99"),
    (dict(muscles=[[3, 3]]), ValueError, "muscle 0 joins vertex 3 to itself"),
    (dict(muscles=[[0, 1]], muscle_stiffness=-1.0), ValueError, "muscle_stiffness must be positive"),
    (dict(muscles=[[0, 1]], muscle_rest_length=[0.0]), ValueError, "muscle_rest_length must be positive"),
    (dict(fixed=[0, 15]), ValueError, r"fixed\[1\] = 15 is out of range"),
    (dict(fixed=[2, 2]), ValueError, "twice"),
    (dict(fixed=list(range(15))), ValueError, "every vertex is fixed"),
    (dict(material="rubber"), ValueError, "material must be one of"),
    (dict(Dm_inv=torch.zeros(16, 2, 2)), ValueError, r"Dm_inv\[0\] is singular"),
    (dict(Dm_inv=torch.eye(2).expand(3, 2, 2)), ValueError, r"Dm_inv must be \(E, d, d\)"),
])
def test_bad_input_raises_a_clear_error(kwargs, error, match):
    v, t = _rect()
    args = dict(elements=t, mass=1.0, mu=1.0, lam=1.0)
    args.update(kwargs)
    elements = args.pop("elements")
    args = {k: val for k, val in args.items() if val is not None}
    with pytest.raises(error, match=match):
        SoftBody(v, elements, **args)


def test_rest_shape_that_inverts_an_element_and_bad_vertices():
    v, t = _rect()
    Dm_inv = torch.inverse((v[t[:, 1:]] - v[t[:, :1]]).transpose(-1, -2))
    Dm_inv[3] = Dm_inv[3] @ torch.diag(torch.tensor([-1.0, 1.0], dtype=torch.float64))  # a mirrored rest shape
    with pytest.raises(ValueError, match="element 3 .* inverted"):
        SoftBody(v, t, mass=1.0, mu=1.0, lam=1.0, Dm_inv=Dm_inv)
    with pytest.raises(ValueError, match="vertices must be"):
        SoftBody(torch.zeros(5, 4), t, mass=1.0, mu=1.0, lam=1.0)
    bad = v.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        SoftBody(bad, t, mass=1.0, mu=1.0, lam=1.0)
    with pytest.raises(ValueError, match="vertex 15 belongs to no element"):
        SoftBody(torch.cat([v, torch.ones(1, 2, dtype=v.dtype)]), t, density=1.0, mu=1.0, lam=1.0)


def test_a_dtype_the_solver_does_not_run_in_is_refused_by_name():
    # A review: float16 failed in linalg.inv, int64 in norm, complex in lt; a mesh generator's integer dtype
    # truncated 0.5 to 0 (duplicate vertices, another mesh).
    from diffsoft import mesh
    v, t = mesh.rectangle(0.4, 0.2, 2, 1, dtype=torch.float64)
    for dtype in (torch.float16, torch.bfloat16, torch.int64, torch.complex64):
        with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
            SoftBody(v, t, dtype=dtype)
        with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
            mesh.rectangle(1, 1, 2, 2, dtype=dtype)
    with pytest.raises(TypeError, match=r"dtype must be .* \(from the vertices\)"):
        SoftBody(v.half(), t)
