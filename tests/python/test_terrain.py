"""Random terrain (diffsoft.terrain): the generator's slopes and flat start, ramps, a simulator walking on it
and given back its ground, and training on it (TrainConfig.terrain)."""
import math
import os

import numpy as np
import pytest
import torch

from diffsoft import creatures, terrain, training
from diffsoft.policy import FramePolicy, distance_walked
from diffsoft.training import TrainConfig

F64 = torch.float64


@pytest.fixture(scope="module", params=["biped", "tetrapod"])
def sim(request):
    return creatures.make_creature(request.param, F64)


def _cell_slopes(sim, heights):
    """The steepest slope (a tangent) of every straight piece (2D) or triangle (3D) of ``heights``."""
    _, dx, _ = terrain.grid(sim)
    if sim.body.dim == 2:
        return (heights.diff(dim=-1) / dx).abs()
    h00, h10, h01, h11 = heights[..., :-1, :-1], heights[..., 1:, :-1], heights[..., :-1, 1:], heights[..., 1:, 1:]
    lower = torch.hypot(h10 - h00, h01 - h00) / dx
    upper = torch.hypot(h11 - h01, h11 - h10) / dx
    return torch.maximum(lower, upper)


def test_random_terrain_keeps_its_slopes_and_starts_flat_under_the_creature(sim):
    g = torch.Generator().manual_seed(0)
    x0, dx, samples = terrain.grid(sim)
    heights = terrain.random_heights(sim, 5.0, 8, g)
    assert heights.shape == (8, *samples) and heights.dtype == F64
    slopes = _cell_slopes(sim, heights)
    bound = math.tan(math.radians(5.0))
    assert slopes.max() <= bound * (1 + 1e-12)
    assert slopes.max() > 0.8 * bound  # the draws use the range, not a sliver of it
    # nearly smooth: between neighbouring samples the slope changes by at most 2 bound / SAMPLES_PER_PIECE
    k = terrain.SAMPLES_PER_PIECE[sim.body.dim]
    along = heights.diff(dim=1) / dx  # along x (2D: the profile; 3D: each row across z)
    assert along.diff(dim=1).abs().max() <= 2 * bound / k * (1 + 1e-9)
    # the smooth ground through these samples is no steeper than they are (points on it, over the whole grid)
    field = terrain.height_field(sim, heights)
    origin, spacing, h = field.geometry(sim.body.dim, F64, torch.device("cpu"), 8)
    span = torch.tensor(samples, dtype=F64) * dx
    q = torch.rand(8, 400, sim.body.dim, generator=g, dtype=F64)
    q[..., 0] = (x0 if sim.body.dim == 2 else x0[0]) - dx + q[..., 0] * (span[0] + 2 * dx)
    if sim.body.dim == 3:
        q[..., 2] = x0[1] - dx + q[..., 2] * (span[1] + 2 * dx)
    q[..., 1] = 0
    q.requires_grad_()
    phi, _ = type(field).surface(q, origin, spacing, h)
    up, = torch.autograd.grad(phi.sum(), q)
    q = q.detach()
    q[..., 1] = -phi.detach() / up[..., 1]  # on the surface (phi = -h / L, d phi/dy = 1 / L at y = 0)
    _, n = type(field).surface(q, origin, spacing, h)  # where n_x / n_y = -dh/dx
    horizontal = n[..., [0]] if sim.body.dim == 2 else n[..., [0, 2]]
    assert (horizontal.norm(dim=-1) / n[..., 1]).max() <= bound * (1 + 1e-9)
    # every creature's terrain is its own
    assert not torch.equal(heights[0], heights[1])
    # Flat (at 0) under the creature at rest, and up to one piece ahead of its front: the first sample sits there.
    rest = sim.body.rest_positions
    assert (x0 if sim.body.dim == 2 else x0[0]) == pytest.approx(rest[:, 0].max().item() + k * dx)
    if sim.body.dim == 2:
        assert (heights[:, 0] == 0).all()
    else:
        z = x0[1] + dx * torch.arange(samples[1], dtype=F64)
        under = (z >= rest[:, 2].min() - dx) & (z <= rest[:, 2].max() + dx)
        assert under.any() and (heights[:, 0, under] == 0).all()
    # seeded: the same generator state draws the same terrain; the default generator is torch's
    again = terrain.random_heights(sim, 5.0, 8, torch.Generator().manual_seed(0))
    assert torch.equal(heights, again)
    assert terrain.random_heights(sim, 0.0).abs().max() == 0  # no slope: flat


def test_ramps_and_held_out_terrains(sim):
    _, dx, samples = terrain.grid(sim)
    up = terrain.ramp_heights(sim, 5.0)
    assert up.shape == samples
    rise = up.diff(dim=0) / dx  # the slope rises over the first piece, then stays
    k, tan = terrain.SAMPLES_PER_PIECE[sim.body.dim], math.tan(math.radians(5.0))
    torch.testing.assert_close(rise[k:], torch.full_like(rise[k:], tan), rtol=1e-12, atol=0)
    assert (rise[:k].diff(dim=0) > 0).all() and (0 < rise[0]).all() and (rise[0] < tan / k).all()
    torch.testing.assert_close(terrain.ramp_heights(sim, -5.0), -up, rtol=0, atol=0)
    held = terrain.held_out_heights(sim, 5.0, count=3)
    assert held.shape == (3, *samples) and torch.equal(held, terrain.held_out_heights(sim, 5.0, count=3))
    # not what the trainer draws for its creatures (seed 0, its first iterations)
    cfg = TrainConfig(terrain=5.0, batch=3, dtype="float64")
    for it in range(3):
        drawn = training._iteration_draws(cfg, sim, it, 0, 1)[4]
        assert not any(torch.equal(drawn[i], held[j]) for i in range(3) for j in range(3))


@pytest.mark.parametrize("bad", [-1.0, 45.0, float("nan"), "5"])
def test_bad_slopes_are_named(bad):
    sim = creatures.make_creature("biped", F64)
    with pytest.raises(ValueError, match="max_slope"):
        terrain.random_heights(sim, bad)
    with pytest.raises(ValueError, match="degrees"):
        terrain.ramp_heights(sim, 45.0 if bad == -1.0 else bad)
    with pytest.raises(ValueError, match="terrain"):
        TrainConfig(terrain=bad).check()


def test_heights_off_the_grid_or_a_simulator_without_ground_are_refused():
    sim = creatures.make_creature("biped", F64)
    with pytest.raises(ValueError, match=r"heights must be a tensor of shape \(\[B,\] \*\(1025,\)\)"):
        terrain.height_field(sim, torch.zeros(10, dtype=F64))
    with pytest.raises(ValueError, match="heights"):
        terrain.height_field(sim, torch.zeros(2, 3, 1025, dtype=F64))
    sim.ground = None
    with pytest.raises(ValueError, match="ground=None"):
        terrain.height_field(sim, terrain.ramp_heights(sim, 5.0))


def test_on_terrain_starts_as_on_the_flat_ground_and_gives_the_ground_back(sim):
    # Every vertex starts over the flat part (at the ground's height), so the first steps are the flat
    # ground's to rounding: a flat height field is the horizontal plane's model.
    x, v = sim.rest_state
    a = torch.full((sim.body.num_muscles,), 0.6, dtype=F64)
    flat = [x, v]
    for _ in range(3):
        flat = sim.step(*flat, a)
    colliders = sim.colliders
    with terrain.on_terrain(sim, terrain.random_heights(sim, 5.0, generator=torch.Generator().manual_seed(1))):
        assert sim.ground is None and len(sim.colliders) == 1 + len(colliders)
        hilly = [x, v]
        for _ in range(3):
            hilly = sim.step(*hilly, a)
    torch.testing.assert_close(hilly[0], flat[0], rtol=0, atol=1e-12)
    assert sim.ground == 0.0 and sim.colliders == colliders
    with pytest.raises(RuntimeError, match="inside"):
        with terrain.on_terrain(sim, terrain.ramp_heights(sim, 5.0)):
            raise RuntimeError("inside")
    assert sim.ground == 0.0 and sim.colliders == colliders


def test_terrain_changed_in_place_inside_on_terrain_is_refused_not_ignored(sim):
    # The height field is made from the heights (raised by the ground): before, an in-place change of them inside
    # the block (an optimizer's step when fitting terrain) left the creature walking on the old terrain, silently.
    x, v = sim.rest_state
    heights = terrain.ramp_heights(sim, 10.0)[None]
    with terrain.on_terrain(sim, heights):
        sim.step(x[None], v[None])
        with torch.no_grad():
            heights.mul_(0.5)
        with pytest.raises(ValueError, match=r"sim.colliders\[0\].heights is a copy made by "
                                             r"diffsoft.terrain.height_field of a tensor that was changed in place"):
            sim.step(x[None], v[None])
    sim.step(x, v)  # (its ground is back)
    with terrain.on_terrain(sim, heights):  # made again: follows; a copy by to() names what made the field
        sim.step(x[None], v[None])
        small = sim.to(torch.float32)
        with torch.no_grad():
            heights.mul_(0.5)
        with pytest.raises(ValueError, match="a copy made by diffsoft.terrain.height_field"):
            small.step(x[None].float(), v[None].float())


def test_a_creature_rests_on_the_ramp_it_is_dropped_on():
    # The relaxed biped dropped from above the ramp's slope lands on the ramp (its lowest vertex, measured
    # from the ramp's surface below it, a contact's sag), where on flat ground it falls to height 0; and on
    # terrain distances_on gives each creature of the batch its own ground.
    sim = creatures.make_creature("biped", F64)
    x0, dx, _ = terrain.grid(sim)
    tan = math.tan(math.radians(20.0))
    x, v = sim.rest_state
    x = x + torch.tensor([x0 + 1.0, 0.1 + (x[:, 0].max().item() + 1.0) * tan], dtype=F64)
    a = torch.ones(sim.body.num_muscles, dtype=F64)

    def drop(s):
        state = [x, v]
        for _ in range(30):
            state = s.step(*state, a)
        return state[0]

    heights = terrain.ramp_heights(sim, 20.0)
    with terrain.on_terrain(sim, heights):
        ramp = drop(sim)
    surface = np.interp(ramp[:, 0].numpy(), x0 + dx * np.arange(len(heights)), heights.numpy())
    above = ramp[:, 1] - torch.from_numpy(surface)
    assert -0.03 < above.min() < 0.01
    assert drop(sim)[:, 1].min() < 0.1 and ramp[:, 1].min() > 0.1
    torch.manual_seed(0)
    policy = FramePolicy.for_simulator(sim)
    walked = terrain.distances_on(sim, policy, torch.stack([torch.zeros(1025, dtype=F64),
                                                            terrain.ramp_heights(sim, 5.0)]), steps=5)
    assert walked.shape == (2,)
    assert walked[0].item() == pytest.approx(distance_walked(sim, policy, 5), abs=1e-12)


def test_training_on_terrain_gives_each_creature_its_own_ground(tmp_path, monkeypatch):
    seen, step = [], training._step

    def spy(cfg, sim, *args):
        seen.append((sim.ground, sim.colliders))
        return step(cfg, sim, *args)

    monkeypatch.setattr(training, "_step", spy)
    cfg = dict(creature="biped", window=3, episode=6, batch=2, iterations=3, lr=1e-2, critic_iterations=2,
               critic_minibatches=2, eval_every=2, checkpoint_every=1, dtype="float64", terrain=5.0)
    straight, h1 = training.train(TrainConfig(out_dir=str(tmp_path / "a"), **cfg), progress=False)
    ground, colliders = seen[0]
    assert ground is None and len(colliders) == 1
    heights = colliders[0].heights
    assert heights.shape == (2, 1025) and not torch.equal(heights[0], heights[1])
    # The pool keeps each creature's terrain for its episode: the first reset's, until the next one.
    pool = torch.load(os.path.join(tmp_path / "a", "checkpoint.pt"))["pool"]["terrain"]
    assert pool.shape == (2, 1025) and (pool != 0).any()
    # resume continues exactly (the terrains are kept); the simulator is given back its ground after
    training.train(TrainConfig(out_dir=str(tmp_path / "b"), **dict(cfg, iterations=2)), progress=False)
    resumed, h2 = training.train(TrainConfig(out_dir=str(tmp_path / "b"), **cfg), resume=True, progress=False)
    for p, q in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
    assert [r["distance"] for r in h1] == [r["distance"] for r in h2]
    assert [r.get("eval_distance") for r in h1] == [r.get("eval_distance") for r in h2]


def test_a_checkpoint_from_before_terrain_and_steering_resumes(tmp_path):
    cfg = dict(creature="biped", window=3, episode=6, batch=2, critic_iterations=2, critic_minibatches=2,
               eval_every=100, dtype="float64", out_dir=str(tmp_path))
    training.train(TrainConfig(iterations=2, **cfg), progress=False)
    path = os.path.join(tmp_path, "checkpoint.pt")
    ckpt = torch.load(path)
    for key in ("terrain", "heading"):  # as written before terrain and steering existed
        del ckpt["pool"][key]
    del ckpt["config"]["terrain"], ckpt["config"]["steer"]
    torch.save(ckpt, path)
    with pytest.raises(ValueError, match="terrain=0.0"):
        training.train(TrainConfig(iterations=3, terrain=5.0, **cfg), resume=True, progress=False)
    _, history = training.train(TrainConfig(iterations=3, **cfg), resume=True, progress=False)
    assert len(history) == 3


def test_the_terrain_benchmark_compares_policies(tmp_path):
    # benchmarks/terrain.py, the measurement docs/training.md quotes, on an untrained policy and few steps
    import subprocess
    import sys
    from pathlib import Path
    from diffsoft.policy import save_algovivo_policy
    torch.manual_seed(0)
    sim = creatures.make_creature("biped", torch.float32)
    save_algovivo_policy(FramePolicy.for_simulator(sim), str(tmp_path / "policy.json"))
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "terrain.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "policy.json"), "--terrains", "2",
                          "--steps", "5"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    row = [line for line in out.stdout.splitlines() if line.startswith(f"| {tmp_path}")]
    assert len(row) == 1 and row[0].count("|") == 8 and "last" in row[0]


def test_newton_converges_on_the_smooth_terrain_where_the_piecewise_linear_one_stalls():
    """benchmarks/terrain.py --solver (docs/training.md, "Terrain"): algovivo's own trained biped replayed on 10
    held-out terrains of 10 degrees: on the terrain's SmoothHeightField every creature-step converges within a few
    Newton iterations; on the same samples piecewise linear, Newton takes more (and stalls at kinks)."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    data = root / "examples" / "data" / "algovivo" / "biped"
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "terrain.py"), str(data / "policy.json"),
                          "--creature", str(data / "mesh.json"), "--solver", "--slope", "10", "--steps", "200"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = {}
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and cells[0].endswith("policy.json"):
            mean, most = (float(v) for v in cells[2].split(" / "))
            rows[cells[1].split()[0]] = mean, most, int(cells[3].split()[0])
    assert set(rows) == {"flat", "smooth", "piecewise"}, out.stdout
    assert rows["smooth"][1] <= 8 and rows["smooth"][2] == 0, rows
    assert rows["piecewise"][0] > rows["smooth"][0] + 0.5, rows


def test_the_training_command_reports_terrain_and_steering(tmp_path, capsys):
    from diffsoft import cli
    with pytest.warns(UserWarning, match="the terrain is laid out along"):  # (headings off +x leave it)
        cli.main(["--iterations", "2", "--batch", "2", "--window", "3", "--episode", "6", "--critic-minibatches",
                  "2", "--eval-every", "1", "--eval-horizon", "5", "--terrain", "5", "--steer", "true",
                  "--out-dir", str(tmp_path), "--no-progress"])
    out = capsys.readouterr().out
    assert "on 10 held-out terrains (diffsoft.terrain.held_out_heights, slopes within 5 degrees)" in out
    assert "up a 5-degree ramp" in out
    assert "in 5 steps toward each commanded heading: 0 degrees:" in out and "180 degrees:" in out
    assert "its gait lasts 1,000 steps toward" in out
    assert '"steered": true' in (tmp_path / "policy.json").read_text()


def test_distances_on_refuses_one_terrain_without_its_batch_row_and_a_tensor_ground_keeps_its_gradient():
    sim = creatures.biped(dtype=F64)
    with pytest.raises(ValueError, match=r"heights must be \(K, \*samples\), one terrain per row .*heights\[None\]"):
        terrain.distances_on(sim, FramePolicy.for_simulator(sim), terrain.ramp_heights(sim, 5))  # ran 1,025 creatures
    # the terrain is raised by the ground's height: a tensor ground's gradient flows through it (float() cut it)
    x, v = sim.rest_state

    def moved(ground):
        sim.ground = ground
        with terrain.on_terrain(sim, terrain.ramp_heights(sim, 5)):
            return sim.step(x - torch.tensor([0.0, 0.01], dtype=F64), v + 0.3)[0].sum()
    ground = torch.tensor(0.0, dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(moved(ground), ground)
    with torch.no_grad():
        central = (moved(torch.tensor(1e-6, dtype=F64)) - moved(torch.tensor(-1e-6, dtype=F64))) / 2e-6
    torch.testing.assert_close(g, central, rtol=1e-5, atol=1e-8)
