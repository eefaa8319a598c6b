"""Creatures, algovivo's file format and constants, and diffsoft's own format."""
import copy
import json
import pathlib
import math

import pytest
import torch

from diffsoft import creatures
from diffsoft.body import SoftBody
from diffsoft.simulator import Simulator

from conftest import F64



def _algovivo_objective(x, x0, v0, a, data):
    """algovivo's backward-Euler loss, written from its published model independently of diffsoft.energies:
    1/2 sum m |x - x0 - h v0|^2 + h^2 (triangles + muscles + gravity + collision + friction)."""
    h, m, mu, lam, k, kc, kf = 0.033, 6.0714287757873535, 500.0, 50.0, 90.0, 14000.0, 300.0
    inertia = 0.5 * m * ((x - x0 - h * v0) ** 2).sum()
    pot = torch.zeros((), dtype=x.dtype)
    for (i, j, l), rsi in zip(data["triangles"], data["rsi"]):
        ab, ac = x[j] - x[i], x[l] - x[i]
        r = torch.tensor(rsi, dtype=x.dtype).reshape(2, 2)
        sm = torch.stack([torch.stack([ab[0], ac[0]]), torch.stack([ab[1], ac[1]])])
        F = sm @ r
        I1 = (F ** 2).sum()
        J = F[0, 0] * F[1, 1] - F[0, 1] * F[1, 0]
        q = -1.5 + 2 * J - 0.5 * J * J
        pot = pot + 0.5 * mu * (I1 - 2) - mu * q + 0.5 * lam * q * q
    for (i, j), l0, ai in zip(data["muscles"], data["l0"], a):
        d = x[i] - x[j]
        length = torch.sqrt((d ** 2).sum() + 1e-6)
        pot = pot + 0.5 * k * ((length - ai * l0) / (ai * l0)) ** 2
    for p, p0 in zip(x, x0):
        pot = pot + m * 9.8 * p[1] + kc * torch.clamp(p[1], max=0) ** 2
        if p0[1] - 0.01 < 0:
            pot = pot + kf * ((p[0] - p0[0]) / h) ** 2 * (0.01 - p0[1])
    return inertia + h * h * pot


def test_biped_is_algovivo_sized_and_the_others_build():
    sim = creatures.biped()
    b = sim.body
    assert 20 <= b.num_vertices <= 40 and 10 <= b.num_muscles <= 20
    assert b.material == "algovivo" and b.rest_positions[:, 1].min().item() == 0.0
    for make in (creatures.quadruped, creatures.worm, creatures.tetrapod, creatures.caterpillar):
        s = make()
        assert s.body.num_muscles > 0
    assert creatures.tetrapod().body.dim == creatures.caterpillar().body.dim == 3
    assert creatures.caterpillar().body.num_muscles == 32 and creatures.caterpillar(segments=4).body.num_muscles == 16
    with pytest.raises(ValueError, match="segments"):
        creatures.caterpillar(segments=1)


def test_algovivo_round_trip_and_constants(tmp_path):
    sim = creatures.biped(dtype=F64)
    path = str(tmp_path / "biped.json")
    creatures.save_algovivo(sim, path)
    data = json.loads(pathlib.Path(path).read_text())
    assert set(data) == {"pos", "triangles", "rsi", "muscles", "l0"}
    assert len(data["rsi"][0]) == 2 and len(data["rsi"][0][0]) == 2
    loaded = creatures.load_algovivo(path, dtype=F64)
    b, lb = sim.body, loaded.body
    for name in ("rest_positions", "elements", "Dm_inv", "muscles", "muscle_rest_length"):
        assert torch.equal(getattr(b, name), getattr(lb, name)), name
    c = creatures.ALGOVIVO
    assert loaded.dt == 0.033 and loaded.gravity.item() == 9.8 and loaded.ground == 0.0
    assert (lb.mass == 6.0714287757873535).all() and (lb.mu == 500).all() and (lb.lam == 50).all()
    assert (lb.muscle_stiffness == 90).all() and lb.material == "algovivo"
    assert loaded.contact_stiffness.item() == 14000 and loaded.friction.item() == 300
    assert c["vertex_mass"] == 6.0714287757873535


def test_algovivo_step_minimises_algovivo_objective(tmp_path):
    # A hand-written file: flat rsi rows, an extra key, a triangle wound clockwise (algovivo allows it).
    pos = [[0.0, 0.005], [0.3, 0.0], [0.3, 0.3], [0.0, 0.3]]
    tris = [[0, 1, 2], [0, 3, 2]]
    rsi = []
    for i, j, l in tris:
        m = torch.tensor([[pos[j][0] - pos[i][0], pos[l][0] - pos[i][0]],
                          [pos[j][1] - pos[i][1], pos[l][1] - pos[i][1]]], dtype=F64)
        rsi.append(torch.inverse(m).flatten().tolist())
    data = {"pos": pos, "triangles": tris, "rsi": rsi, "muscles": [[0, 2], [1, 3]], "l0": [0.4, 0.45],
            "depth": [0, 0, 0, 0]}
    path = tmp_path / "square.json"
    path.write_text(json.dumps(data))
    sim = creatures.load_algovivo(str(path), dtype=F64)
    sim.solver_options.update(rtol=1e-12, atol=1e-10)
    x0 = torch.tensor(pos, dtype=F64)
    v0 = torch.tensor([[0.5, -0.8]] * 4, dtype=F64)
    a = torch.tensor([0.6, 0.9], dtype=F64)
    x1, v1 = sim.step(x0, v0, a)
    assert (x1[:, 1] < 0).any()
    xr = x1.clone().requires_grad_()
    data["rsi"] = [r for r in rsi]
    (g,) = torch.autograd.grad(_algovivo_objective(xr, x0, v0, a, data), xr)
    xr0 = x0.clone().requires_grad_()
    (g0,) = torch.autograd.grad(_algovivo_objective(xr0, x0, v0, a, data), xr0)
    assert g.norm().item() < 1e-9 * g0.norm().item() + 1e-12
    assert torch.allclose(v1, (x1 - x0) / 0.033)


@pytest.mark.parametrize("make", [creatures.worm, creatures.tetrapod])
def test_diffsoft_format_round_trip(tmp_path, make):
    sim = make(dtype=F64)
    b = sim.body  # a round trip keeps every field, fixed vertices and non-default constants included
    body = SoftBody(b.rest_positions, b.elements, material=b.material, mass=b.mass, mu=b.mu, lam=b.lam,
                    muscles=b.muscles, muscle_rest_length=b.muscle_rest_length, muscle_stiffness=b.muscle_stiffness,
                    Dm_inv=b.Dm_inv, fixed=[0, 3], min_a=0.4)
    sim = Simulator(body, dt=0.02, gravity=5.0, ground=-0.1, friction=7.0)
    path = str(tmp_path / "creature.json")
    creatures.save(sim, path)
    loaded = creatures.load(path, dtype=F64)
    for name, value in vars(sim.body).items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, getattr(loaded.body, name)), name
    for name in ("dt", "ground", "friction_eps"):
        assert getattr(sim, name) == getattr(loaded, name)
    assert loaded.body.min_a == 0.4
    for name in ("gravity", "contact_stiffness", "friction"):
        assert getattr(sim, name).item() == getattr(loaded, name).item()
    x, v = sim.rest_state
    assert torch.equal(sim.step(x, v)[0], loaded.step(x, v)[0])


def test_biped_stands_and_a_gait_moves_it():
    sim = creatures.biped(dtype=F64)
    x, v = sim.rest_state
    T, M = 45, sim.body.num_muscles
    t = torch.arange(T, dtype=F64)[:, None]
    left = torch.arange(M) < M // 2
    phase = torch.where(left, torch.zeros(M, dtype=F64), torch.full((M,), math.pi, dtype=F64))
    acts = (0.85 + 0.15 * torch.sin(0.35 * t + phase + torch.arange(M) * 0.7)).clamp(0.5, 1.0)
    xs, _ = sim.rollout(x, v, acts)
    assert xs[:, :, 1].min().item() > -0.05  # on the ground, not through it
    assert xs[-1, :, 1].mean().item() > 0.6 * x[:, 1].mean().item()  # still standing
    assert torch.isfinite(xs).all()


@pytest.mark.parametrize("content, match", [
    ("not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"triangles": [[0, 1, 2]], "rsi": [[[1, 0], [0, 1]]]}', "missing key 'pos'"),
    ('{"pos": [[0, 0], [1, 0]], "triangles": [[0, 1, 2]], "rsi": [[[1, 0], [0, 1]]]}', "key 'triangles' has vertex index 2"),
    ('{"pos": [[0, 0, 0], [1, 0, 0], [0, 1, 0]], "triangles": [[0, 1, 2]], "rsi": [[[1, 0], [0, 1]]]}', r"key 'pos' must have shape \(n, 2\)"),
    ('{"pos": [[0, 0], [1, 0], [0, 1]], "triangles": [[0, 1, 2]], "rsi": [[1, 0], [0, 1]]}', "key 'rsi' must hold one 2x2 matrix per triangle"),
    ('{"pos": [[0, 0], [1, 0], [0, 1]], "triangles": [[0, 1, 2.5]], "rsi": [[[1, 0], [0, 1]]]}', "key 'triangles' must hold integer"),
    ('{"pos": [[0, 0], [1, 0], [0, 1]], "triangles": [[0, 1, 2]], "rsi": [[[1, 0], [0, 1]]], "muscles": [[0, 1]], "l0": [1, 2]}', r"key 'l0' must have shape \(1,\)"),
    ('{"pos": [[0, 0], [1, "a"], [0, 1]], "triangles": [[0, 1, 2]], "rsi": [[[1, 0], [0, 1]]]}', "key 'pos' must be a"),
    ('{"pos": [[0, 0], [1, 0], [0, 1]], "triangles": [[0, 1, 2]], "rsi": [[[0, 0], [0, 0]]]}', "singular"),
    ('{"pos": [[0, 0], [1, 0], [0, 1]], "triangles": [[0, 1, 9007199254740993]], "rsi": [[[1, 0], [0, 1]]]}',
     r"key 'triangles' has a vertex index beyond 2\*\*53"),
    ('{"pos": [[0, 0], [1, 0], [0, 1]], "triangles": [], "rsi": []}', "key 'triangles' is empty"),
])
def test_malformed_algovivo_file_names_the_key(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        creatures.load_algovivo(str(path))


def test_malformed_diffsoft_file_names_the_key(tmp_path):
    sim = creatures.worm(dtype=F64)
    path = tmp_path / "worm.json"
    creatures.save(sim, str(path))
    good = json.loads(path.read_text())
    for key, value, match in [("format", "other", "key 'format'"), ("mu", [1.0], r"key 'mu' must have shape"),
                              ("simulator", {"dt": 0.1}, "key 'simulator'"), ("dim", 4, "key 'dim'"),
                              ("mass", [-1.0] * 18, "mass must be positive"),
                              ("min_a", 1.0, "min_a must be a number in"), ("min_a", "0.5", "min_a must be a number in")]:
        bad = dict(good, **{key: value})
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=match):
            creatures.load(str(path))
    with pytest.raises(ValueError, match="2D"):
        creatures.save_algovivo(creatures.tetrapod(), str(tmp_path / "x.json"))
    path.write_text(json.dumps(good))
    assert isinstance(creatures.load(str(path)), Simulator)
    del good["min_a"]  # a file written before the key: algovivo's contraction range
    path.write_text(json.dumps(good))
    assert creatures.load(str(path)).body.min_a == 0.25


def test_the_muscles_contraction_range_is_the_creatures():
    # algovivo's 0.25 for the 2D creatures and files; the tetrapod's legs are as short as their muscles: 0.35.
    # Kept through copies and dtype/device moves; assigned through its check.
    assert [creatures.make_creature(c).body.min_a for c in ("biped", "worm", "tetrapod")] == [0.25, 0.25, 0.35]
    sim = creatures.tetrapod()
    assert sim.to(dtype=F64).body.min_a == copy.deepcopy(sim).body.min_a == 0.35
    assert creatures.tetrapod(min_a=0.3).body.min_a == 0.3
    for bad in (0.0, 1.0, float("nan"), True, "0.5", None):
        with pytest.raises(ValueError, match="min_a must be a number in"):
            sim.body.min_a = bad
    assert sim.body.min_a == 0.35
