"""The frame policy: observations in the body frame, activation bounds, algovivo's policy JSON."""
import json
import pathlib
import math

import pytest
import torch

from diffsoft import creatures
from diffsoft.policy import (POLICY_KEYS, FramePolicy, Mirror, center_of_mass_x, frame_vertices, mirrors,
                             load_algovivo_policy, observe, run_policy, save_algovivo_policy)
from diffsoft.task import LocomotionTask
from diffsoft.training import TrainConfig

from conftest import F64



def _rotation(theta, dim):
    c, s = math.cos(theta), math.sin(theta)
    if dim == 2:
        return torch.tensor([[c, -s], [s, c]], dtype=F64)
    return torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=F64)  # about the up axis


@pytest.mark.parametrize("make", [creatures.biped, creatures.tetrapod])
def test_observation_is_in_the_body_frame(make):
    sim = make(dtype=F64)
    center, forward = frame_vertices(sim)
    torch.manual_seed(0)
    x = sim.rest_state[0][None] + 0.01 * torch.randn(2, sim.body.num_vertices, sim.body.dim, dtype=F64)
    v = torch.randn_like(x)
    obs = observe(x, v, center, forward)
    assert obs.shape == (2, 2 * x.shape[1] * x.shape[2])
    R = _rotation(0.7, sim.body.dim)
    moved = observe(x @ R.T + torch.tensor([3.0, 0.0, 1.0][:sim.body.dim], dtype=F64), v @ R.T,
                             center, forward)
    torch.testing.assert_close(moved, obs)
    p = obs[:, :obs.shape[1] // 2].reshape(x.shape)
    assert torch.allclose(p[:, center], torch.zeros_like(p[:, center]))
    assert (p[:, forward, 0] > 0).all() and torch.allclose(p[:, forward, 1:], torch.zeros_like(p[:, forward, 1:]))



def test_a_frame_takes_both_vertices_or_neither():
    sim = creatures.tetrapod(dtype=F64)
    center, forward = frame_vertices(sim)
    other = (center + 1, forward + 1)
    assert (FramePolicy.for_simulator(sim).center_vertex_id, FramePolicy.for_simulator(sim).forward_vertex_id) == \
        (center, forward)
    made = FramePolicy.for_simulator(sim, center_vertex_id=other[0], forward_vertex_id=other[1])
    assert (made.center_vertex_id, made.forward_vertex_id) == other
    for one in ({"center_vertex_id": other[0]}, {"forward_vertex_id": other[1]}):
        with pytest.raises(ValueError, match=f"give both center_vertex_id and forward_vertex_id, or neither .* "
                                             f"got only {next(iter(one))}"):
            FramePolicy.for_simulator(sim, **one)
        with pytest.raises(ValueError, match="give both center_vertex_id and forward_vertex_id, or neither"):
            LocomotionTask(sim, **one)


def test_min_a_below_the_least_activation_is_refused_everywhere_up_front():
    # (0, 1) was taken, then a step with an activation under 1e-6 raised in the middle of a training
    sim = creatures.biped(dtype=F64)
    for make in (lambda: FramePolicy.for_simulator(sim, min_a=1e-7), lambda: LocomotionTask(sim, min_a=1e-7),
                 lambda: setattr(sim.body, "min_a", 1e-7)):
        with pytest.raises(ValueError, match=r"min_a must be a number in \[1e-06, 1\)"):
            make()
    with pytest.raises(ValueError, match=r"min_a must be in \[1e-06, 1\)"):
        TrainConfig(min_a=1e-7).check()
    assert FramePolicy.for_simulator(sim, min_a=1e-6).min_a == 1e-6

def test_observation_matches_algovivo_frame_projection():
    # algovivo's frame_projection, written out for one vertex: a = (f - c)/|f - c|, b = (-a_y, a_x).
    x = torch.tensor([[[1.0, 1.0], [2.0, 2.0], [1.0, 3.0]]], dtype=F64)
    v = torch.tensor([[[0.0, 1.0], [1.0, 0.0], [2.0, 2.0]]], dtype=F64)
    obs = observe(x, v, 0, 1)
    r = 1 / math.sqrt(2)
    expected_p = [0, 0, 2 * r, 0, 2 * r, 2 * r]  # (1,3)-(1,1) = (0,2): a.p = 2r, b.p = 2r
    expected_v = [r, r, r, -r, 4 * r, 0]
    torch.testing.assert_close(obs[0], torch.tensor(expected_p + expected_v, dtype=F64))


def test_activations_stay_in_bounds_and_change_by_at_most_max_abs_da():
    sim = creatures.biped(dtype=F64)
    policy = FramePolicy.for_simulator(sim, min_a=0.4, max_abs_da=0.2)
    x, v = sim.rest_state
    x, v = x.expand(5, -1, -1), torch.randn(5, *x.shape, dtype=F64)
    a = torch.rand(5, sim.body.num_muscles, dtype=F64) * 0.6 + 0.4
    a1 = policy.act(x, v, a, noise=torch.randn_like(a))
    assert (a1 >= 0.4).all() and (a1 <= 1).all() and ((a1 - a).abs() <= 0.2 + 1e-12).all()


def test_algovivo_policy_round_trip(tmp_path):
    sim = creatures.biped(dtype=F64)
    policy = FramePolicy.for_simulator(sim, hidden=8)
    path = str(tmp_path / "policy.json")
    save_algovivo_policy(policy, path)
    data = json.loads(pathlib.Path(path).read_text())
    assert set(POLICY_KEYS) <= set(data)
    assert len(data["fc1"]["weight"]) == 8 and len(data["fc1"]["weight"][0]) == 4 * sim.body.num_vertices
    loaded = load_algovivo_policy(path, dtype=F64)
    x, v = sim.rest_state
    x, v = x[None] + 0.02 * torch.randn(3, *x.shape, dtype=F64), torch.randn(3, *x.shape, dtype=F64)
    a = torch.full((3, sim.body.num_muscles), 0.8, dtype=F64)
    assert torch.equal(loaded.act(x, v, a), policy.act(x, v, a))
    assert (loaded.center_vertex_id, loaded.forward_vertex_id) == (policy.center_vertex_id, policy.forward_vertex_id)


def test_hand_written_algovivo_policy_loads_and_runs(tmp_path):
    # The format as algovivo's NeuralFramePolicy.loadData reads it (no space_dim key), for a 3-vertex body.
    sim = creatures.algovivo_simulator([[0, 0], [1, 0], [0, 1]], [[0, 1, 2]], [[1, 2]], dtype=F64)
    data = {"fc1": {"weight": [[0.1] * 12, [-0.1] * 12], "bias": [0.0, 0.5]},
            "fc2": {"weight": [[1.0, -2.0]], "bias": [0.1]},
            "min_a": 0.3, "max_abs_da": 0.25, "center_vertex_id": 0, "forward_vertex_id": 1}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    policy = load_algovivo_policy(str(path), dtype=F64)
    xs, acts = run_policy(sim, policy, 3)
    # At rest: obs is (0,0, 1,0, 0,1, 0...) so fc1 = (0.2, 0.3), fc2 = 0.2 - 0.6 + 0.1, da = tanh(-0.3).
    assert acts[0, 0, 0].item() == pytest.approx(1 + max(math.tanh(-0.3), -0.25))
    bad = dict(data)
    del bad["min_a"]
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="missing key 'min_a'"):
        load_algovivo_policy(str(path))


def test_center_of_mass_with_per_creature_masses_is_each_creatures_own():
    sim = creatures.make_creature("biped", F64)
    x = sim.rest_state[0].expand(2, -1, -1) + torch.tensor([[[1.0, 0.0]], [[3.0, 0.0]]], dtype=torch.float64)
    nominal = center_of_mass_x(sim, x)
    sim.body.mass = sim.body.mass * torch.tensor([[1.0], [2.5]], dtype=torch.float64)
    torch.testing.assert_close(center_of_mass_x(sim, x), nominal)  # uniform scaling moves no centre


@pytest.mark.parametrize("make", [creatures.biped, creatures.tetrapod])
def test_a_steered_policy_reads_its_heading_in_the_body_frame(make, tmp_path):
    from diffsoft.policy import distance_walked, distances_along, heading_direction, moves_along
    sim = make(dtype=F64)
    d = sim.body.dim
    center, forward = frame_vertices(sim)
    torch.manual_seed(0)
    x = sim.rest_state[0][None] + 0.01 * torch.randn(2, sim.body.num_vertices, d, dtype=F64)
    v = torch.randn_like(x)
    heading = torch.tensor([0.0, math.pi] if d == 2 else [0.3, -1.2], dtype=F64)
    obs = observe(x, v, center, forward, heading)
    assert obs.shape == (2, 2 * x.shape[1] * d + d)
    torch.testing.assert_close(obs[:, :-d], observe(x, v, center, forward))
    # the command is the heading's unit vector in the body frame: turning the body and the heading together
    # (in 3D about the up axis; in 2D the body alone, which turns its frame) leaves it where it was in 3D
    assert torch.allclose(obs[:, -d:].norm(dim=-1), torch.ones(2, dtype=F64))
    if d == 3:
        R = _rotation(0.7, 3)  # maps heading h to h - 0.7 (see heading_direction)
        turned = observe(x @ R.T, v @ R.T, center, forward, heading - 0.7)
        torch.testing.assert_close(turned, obs)
    else:  # at rest the frame is the world's: forward is +x, backward -x
        rest = observe(sim.rest_state[0][None].expand(2, -1, -1), torch.zeros_like(x), center, forward, heading)
        torch.testing.assert_close(rest[:, -2:], torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=F64))
    torch.testing.assert_close(heading_direction([0.0, math.pi / 2], 3, F64),
                               torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=F64), atol=1e-15, rtol=0)
    with pytest.raises(ValueError, match="in 2D a heading is 0"):
        heading_direction([math.pi / 2], 2)
    with pytest.raises(ValueError, match="heading must be finite"):
        heading_direction([float("nan")], 3)

    steered = FramePolicy.for_simulator(sim, steered=True)
    assert steered.fc1.in_features == 2 * sim.body.num_vertices * d + d
    # without a heading: 0 (+x); a plain policy refuses one
    torch.testing.assert_close(steered(x, v), steered(x, v, torch.zeros(2, dtype=F64)))
    assert FramePolicy.for_simulator(sim).steered == (d == 3)  # reads_heading: in 3D by default
    plain = FramePolicy.for_simulator(sim, steered=False)
    with pytest.raises(ValueError, match="not steered"):
        plain(x, v, heading)
    with pytest.raises(ValueError, match=r"heading must be one angle or one per creature \(2,\)"):
        steered(x, v, torch.zeros(3, dtype=F64))
    # the file marks it, reads back the same, and the other policies' files do not change
    save_algovivo_policy(steered, str(tmp_path / "steered.json"))
    save_algovivo_policy(plain, str(tmp_path / "plain.json"))
    assert json.loads((tmp_path / "steered.json").read_text())["steered"] is True
    assert "steered" not in json.loads((tmp_path / "plain.json").read_text())
    back = load_algovivo_policy(str(tmp_path / "steered.json"), F64)
    assert back.steered
    torch.testing.assert_close(back(x, v, heading), steered(x, v, heading), rtol=0, atol=0)
    data = json.loads((tmp_path / "steered.json").read_text())
    data["steered"] = "yes"
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="'steered' must be true or false"):
        load_algovivo_policy(str(tmp_path / "bad.json"))
    # distances along headings: heading 0 is distance_walked's; off-heading angles in [0, 180]
    along, off = distances_along(sim, steered, 4, [0.0, math.pi] if d == 2 else [0.0, 1.0])
    assert along.shape == off.shape == (2,) and ((off >= 0) & (off <= 180)).all()
    assert along[0].item() == pytest.approx(distance_walked(sim, steered, 4), abs=1e-12)
    # ... and the move across each heading: its displacement's rest in the ground plane (none in 2D)
    same, across = moves_along(sim, steered, 4, [0.0, math.pi] if d == 2 else [0.0, 1.0])
    torch.testing.assert_close(same, along, rtol=0, atol=0)
    torch.testing.assert_close(torch.rad2deg(torch.atan2(across, along)), off, rtol=0, atol=1e-6)
    if d == 2:
        assert (across == 0).all()


def test_a_steered_gait_is_judged_along_its_heading():
    from diffsoft.policy import Gait, gait
    sim = creatures.biped(dtype=F64)
    torch.manual_seed(0)
    policy = FramePolicy.for_simulator(sim, steered=True)
    back = gait(sim, policy, steps=6, window=3, heading=math.pi)
    xs, _ = run_policy(sim, policy, 6, heading=math.pi)
    forward = Gait.of(sim, xs[:, 0], 3)  # the same run, along +x
    assert back.distance == pytest.approx([-d for d in forward.distance], abs=1e-15)
    assert back.height == forward.height


def test_the_steering_benchmark_reads_steered_policies(tmp_path):
    # benchmarks/steering.py, the measurement docs/training.md quotes, on an untrained policy and few steps
    import subprocess
    import sys
    torch.manual_seed(0)
    sim = creatures.biped(dtype=torch.float32)
    save_algovivo_policy(FramePolicy.for_simulator(sim, steered=True), str(tmp_path / "policy.json"))
    script = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "steering.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "policy.json"), "--steps", "5"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    row = [line for line in out.stdout.splitlines() if line.startswith(f"| {tmp_path}")]
    assert len(row) == 1 and row[0].count(" / ") == 4  # two headings: distance / degrees off / lasts


def test_a_policy_of_another_dtype_and_a_dtype_by_name_are_refused_by_name(tmp_path):
    sim = creatures.biped(dtype=F64)
    path = str(tmp_path / "p.json")
    save_algovivo_policy(FramePolicy.for_simulator(sim), path)
    x, v = sim.rest_state
    with pytest.raises(TypeError, match=r"x is torch.float64 but this policy's weights are torch.float32: "
                                        r"policy.to\(torch.float64\)"):
        load_algovivo_policy(path)(x[None], v[None])  # torch said "mat1 and mat2 must have the same dtype"
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype.*got 'float64'"):
        load_algovivo_policy(path, "float64")  # torch said "Invalid device string"
    assert load_algovivo_policy(path, F64)(x[None], v[None]).dtype == F64



def test_a_mirrored_policy_walks_the_mirror_image_of_its_gait():
    # The worm is its own mirror image, elements included: toward -x a mirrored policy must walk exactly the
    # mirror image of its walk toward +x, from rest, through contact and friction.
    sim = creatures.worm(dtype=F64)
    mirror = Mirror.of(sim)
    assert mirror.axis == 0 and sorted(mirror.vertices) == list(range(sim.body.num_vertices))
    torch.manual_seed(0)
    policy = FramePolicy.for_simulator(sim, steered=True, mirror=True, hidden=16)
    with torch.no_grad():
        policy.fc2.weight.mul_(20)  # a policy that moves the worm (tanh near its bounds)
        xs, _ = run_policy(sim, policy, 12, batch=2, heading=torch.tensor([0.0, math.pi], dtype=F64))
    x = xs[-1]
    mirrored, _, _ = mirror.state(x[:1], x[:1], torch.zeros(1, dtype=F64))
    mid = 2 * sim.rest_state[0][:, 0].mean()  # the rest pose's mid-plane, x = mid / 2
    mirrored[..., 0] += mid
    assert (x[0] - sim.rest_state[0]).abs().max() > 0.05  # it moved
    torch.testing.assert_close(x[1], mirrored[0], rtol=0, atol=1e-7)


@pytest.mark.parametrize("make", [creatures.biped, creatures.tetrapod])
def test_a_mirrored_policy_is_symmetric_by_construction(make, tmp_path):
    sim = make(dtype=F64)
    torch.manual_seed(0)
    policy = FramePolicy.for_simulator(sim, steered=True, mirror=True)
    mirror, d = policy.mirror, sim.body.dim
    # the tetrapod's legs share their inner edges: two muscles on one edge, mapped to each other
    assert all(mirror.muscles[mirror.muscles[j]] == j for j in range(sim.body.num_muscles))
    x = sim.rest_state[0][None] + 0.01 * torch.randn(3, sim.body.num_vertices, d, dtype=F64)
    v = torch.randn_like(x)
    heading = torch.tensor([0.0, math.pi, 0.0] if d == 2 else [0.4, -1.1, 0.0], dtype=F64)
    da = policy(x, v, heading)
    # on the mirrored state, toward the mirrored heading, the mirror image of what it does
    torch.testing.assert_close(policy(*mirror.state(x, v, heading)), da[:, list(mirror.muscles)], rtol=0,
                               atol=1e-15)
    # what the network alone does is not symmetric: the mirror is what makes it so
    plain = FramePolicy.for_simulator(sim, steered=True)
    plain.load_state_dict(policy.state_dict())
    assert (plain(*mirror.state(x, v, heading)) - plain(x, v, heading)[:, list(mirror.muscles)]).abs().max() > 1e-3
    # the file keeps the mirror
    save_algovivo_policy(policy, str(tmp_path / "mirrored.json"))
    back = load_algovivo_policy(str(tmp_path / "mirrored.json"), F64)
    assert back.mirror == mirror
    torch.testing.assert_close(back(x, v, heading), da, rtol=0, atol=0)
    data = json.loads((tmp_path / "mirrored.json").read_text())
    data["mirror"]["vertices"] = data["mirror"]["vertices"][1:]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="bad.json: mirror must be a mirror of a .* body"):
        load_algovivo_policy(str(tmp_path / "bad.json"))
    data["mirror"] = {"axis": 0, "vertices": "all"}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="bad.json: key 'mirror' must be"):
        load_algovivo_policy(str(tmp_path / "bad.json"))


def test_mirrors_are_refused_where_they_do_not_hold():
    algovivo = creatures.make_creature("examples/data/algovivo/biped/mesh.json", F64)
    with pytest.raises(ValueError, match="not its own mirror image across its mid-plane normal to x: vertex"):
        Mirror.of(algovivo)
    sim = creatures.biped(dtype=F64)
    with pytest.raises(ValueError, match="a mirrored policy must be steered"):
        FramePolicy.for_simulator(sim, steered=False, mirror=True)
    with pytest.raises(TypeError, match="mirror must be a diffsoft.policy.Mirror"):
        FramePolicy.for_simulator(sim, steered=True, mirror="x")
    with pytest.raises(ValueError, match="mirror must be a mirror of a 3D body"):
        FramePolicy.for_simulator(creatures.tetrapod(dtype=F64), mirror=Mirror.of(sim))
    # a muscle whose mirror image is missing
    body = sim.body
    moved = body.muscles.clone()
    moved[0] = torch.tensor([moved[0, 0], moved[1, 1]])
    odd = creatures.biped(dtype=F64)
    odd.body.muscles = moved
    with pytest.raises(ValueError, match="muscle 0 .* has no mirror image"):
        Mirror.of(odd)


def test_policies_are_mirrored_wherever_they_can_be_unless_told():
    # mirrors(): a symmetric body whose policy reads a heading (3D, or 2D steered); TrainConfig.mirror None
    biped, tetrapod = creatures.biped(dtype=F64), creatures.tetrapod(dtype=F64)
    algovivo = creatures.make_creature("examples/data/algovivo/biped/mesh.json", F64)
    assert [mirrors(biped), mirrors(biped, steer=True), mirrors(algovivo, steer=True)] == [False, True, False]
    assert mirrors(tetrapod) and mirrors(creatures.caterpillar(dtype=F64))


def test_rollout_steps_and_noise_are_checked_by_name():
    sim = creatures.biped(dtype=torch.float64)
    policy = FramePolicy.for_simulator(sim)
    for steps in (0, -3, True, 2.0):
        with pytest.raises(ValueError, match="steps must be an integer >= 1"):
            run_policy(sim, policy, steps)
    with pytest.raises(ValueError, match="noise must hold one .* per step, 3, got 2"):
        run_policy(sim, policy, 3, noise=torch.zeros(2, 1, sim.body.num_muscles, dtype=torch.float64))


def test_rollout_noise_batch_and_a0_are_checked_by_name():
    # noise (T, B, 1) added one value to all of a creature's muscles, (T, M) one row to every creature; a0 and
    # batch failed in torch; an empty headings failed in the simulator
    from diffsoft.policy import moves_along
    sim = creatures.biped(dtype=F64)
    policy, m = FramePolicy.for_simulator(sim), sim.body.num_muscles
    for shape in ((3, 2, 1), (3, m), (3, 2, m + 1), (3, 1, m)):
        with pytest.raises(ValueError, match=rf"noise must have shape \(T, B, M\) = \(3, 2, {m}\), .* not broadcast"):
            run_policy(sim, policy, 3, batch=2, noise=torch.zeros(shape, dtype=F64))
    with pytest.raises(ValueError, match="noise must hold one .* per step, 3, got 4"):
        run_policy(sim, policy, 3, noise=torch.zeros(4, 1, m, dtype=F64))
    with pytest.raises(TypeError, match=r"noise must be a tensor of shape \(T, B, M\).*got list"):
        run_policy(sim, policy, 3, noise=[[[0.0] * m]] * 3)
    for batch in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="batch must be a positive integer"):
            run_policy(sim, policy, 2, batch=batch)
    with pytest.raises(TypeError, match="a0 must be a tensor of shape"):
        run_policy(sim, policy, 2, a0=[[1.0] * m])
    with pytest.raises(ValueError, match=rf"a0 must have shape \({m},\) or \(2, {m}\).*got \(3, {m}\)"):
        run_policy(sim, policy, 2, batch=2, a0=torch.ones(3, m, dtype=F64))
    one = torch.full((m,), 0.8, dtype=F64)  # one row for all creatures, or one per creature: the same run
    assert torch.equal(run_policy(sim, policy, 2, batch=2, a0=one)[1], run_policy(sim, policy, 2, batch=2,
                                                                                  a0=one.expand(2, m))[1])
    steered = FramePolicy.for_simulator(sim, steered=True)
    with pytest.raises(ValueError, match="headings must hold at least one heading"):
        moves_along(sim, steered, 2, [])


@pytest.mark.parametrize("field, value, message", [
    ("min_a", 2.0, r"min_a must be a number in \[1e-06, 1\), got 2.0"),
    ("max_abs_da", -0.3, "max_abs_da must be a positive finite number, got -0.3"),
    ("center_vertex_id", 100, r"center_vertex_id must be a vertex index in \[0, 26\), got 100"),
    ("forward_vertex_id", "center", "center_vertex_id and forward_vertex_id must differ"),
    ("steered", True, r"steered is True, but fc1 takes 104 inputs, not 2 \* 2 \* 26 \+ 2 = 106"),
    ("mirror", "x", "mirror must be a diffsoft.policy.Mirror")])
def test_fields_set_after_construction_are_checked_where_they_are_used(field, value, message):
    # min_a 2 held every activation at 1 and a distance came back; steered and the frame failed inside torch
    from diffsoft.policy import distance_walked, gait
    sim = creatures.biped(dtype=F64)
    policy = FramePolicy.for_simulator(sim)
    setattr(policy, field, policy.center_vertex_id if value == "center" else value)
    x, v = sim.rest_state
    a = torch.ones(1, sim.body.num_muscles, dtype=F64)
    error = TypeError if field == "mirror" else ValueError
    for use in (lambda: run_policy(sim, policy, 2), lambda: distance_walked(sim, policy, 2),
                lambda: gait(sim, policy, 2, 1), lambda: policy(x[None], v[None]),
                lambda: policy.update(a, torch.zeros_like(a)), lambda: policy.check()):
        with pytest.raises(error, match=message):
            use()


def test_a_mirrored_policy_runs_on_the_body_of_its_mirror_only(tmp_path):
    # a tetrapod's mirrored policy ran on a tetrapod whose +z side is 15% taller, and a file's identity mirror
    # (its own inverse, so Mirror.check passed) ran on the tetrapod, whose mirror maps vertex 0 to another
    from diffsoft.policy import distance_walked
    tetrapod = creatures.tetrapod(dtype=F64)
    creatures.save(tetrapod, str(tmp_path / "tetrapod.json"))
    data = json.loads((tmp_path / "tetrapod.json").read_text())
    top = max(p[2] for p in data["vertices"])
    for p in data["vertices"]:
        if p[2] == top:
            p[1] *= 1.15
    (tmp_path / "taller.json").write_text(json.dumps(data))
    taller = creatures.make_creature(str(tmp_path / "taller.json"), F64)
    policy = FramePolicy.for_simulator(tetrapod, mirror=True)
    distance_walked(tetrapod, policy, 1)
    with pytest.raises(ValueError, match="the policy's mirror does not fit this body: the body is not its own mirror "
                                         "image .* belongs to the body it was made for"):
        distance_walked(taller, policy, 1)
    save_algovivo_policy(policy, str(tmp_path / "policy.json"))
    data = json.loads((tmp_path / "policy.json").read_text())
    data["mirror"]["vertices"] = list(range(tetrapod.body.num_vertices))
    data["mirror"]["muscles"] = list(range(tetrapod.body.num_muscles))
    (tmp_path / "identity.json").write_text(json.dumps(data))
    identity = load_algovivo_policy(str(tmp_path / "identity.json"), F64)
    with pytest.raises(ValueError, match=rf"the policy's mirror does not fit this body: it maps vertex 0 to 0, the "
                                         rf"body's mirror \(Mirror.of\(sim\)\) to {Mirror.of(tetrapod).vertices[0]}"):
        run_policy(tetrapod, identity, 1)
    for tolerance in (float("nan"), float("inf"), -1e-6, "1e-6", True):
        with pytest.raises(ValueError, match="tolerance must be a finite number >= 0"):
            Mirror.of(taller, tolerance=tolerance)


def test_a_policy_file_with_a_key_the_reader_does_not_know_is_refused(tmp_path):
    # a misspelt "mirror" read back as a policy without its mirror: another controller
    sim = creatures.tetrapod(dtype=F64)
    save_algovivo_policy(FramePolicy.for_simulator(sim, mirror=True), str(tmp_path / "policy.json"))
    data = json.loads((tmp_path / "policy.json").read_text())
    assert set(data) == {*POLICY_KEYS, "space_dim", "steered", "mirror"}  # what diffsoft writes reads back
    data["mirrror"] = data.pop("mirror")
    data["hiden"] = 64
    (tmp_path / "typo.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"typo.json: unknown key\(s\) 'mirrror', 'hiden' \(a policy file holds fc1, "
                                         r"fc2, .* space_dim, steered, mirror\)"):
        load_algovivo_policy(str(tmp_path / "typo.json"))


def test_a_gaits_window_is_a_positive_integer_and_its_masses_one_creatures():
    # window 2.5 returned a Gait whose .lasts failed on a list index; (B, N) masses failed in torch or, where
    # steps + 1 == B, weighed step t by creature t's masses
    from diffsoft.policy import Gait, gait
    sim = creatures.biped(dtype=F64)
    policy = FramePolicy.for_simulator(sim)
    for window in (2.5, True, 0, "1"):
        with pytest.raises(ValueError, match="window must be a positive integer"):
            gait(sim, policy, 4, window)
    xs, _ = run_policy(sim, policy, 1, batch=2)
    with pytest.raises(ValueError, match="window must be a positive integer"):
        Gait.of(sim, xs[:, 0], 1.0)
    m = sim.body.mass
    sim.body.mass = torch.stack([m, 2 * m])
    with pytest.raises(ValueError, match=r"body.mass has shape \(2, 26\), but it must be \(26,\) .* or \(1, 26\)"):
        Gait.of(sim, xs[:, 1], 1)
    sim.body.mass = m[None]
    assert Gait.of(sim, xs[:, 0], 1).summary()["window"] == 1


def test_misuses_of_headings_frames_and_devices_name_themselves():
    from diffsoft.policy import heading_direction
    for dim in (1, 4, 3.0):
        with pytest.raises(ValueError, match="dim must be 2 or 3"):
            heading_direction(0.0, dim)
    sim = creatures.biped(dtype=F64)
    x, v = sim.rest_state
    with pytest.raises(ValueError, match="center_vertex_id and forward_vertex_id must differ"):
        observe(x[None], v[None], 11, 11)  # all zeros, before
    with pytest.raises(ValueError, match=r"forward_vertex_id must be a vertex index in \[0, 26\)"):
        observe(x[None], v[None], 11, 26)
    policy = FramePolicy.for_simulator(sim)
    with pytest.raises(ValueError, match="x is on cpu but this policy's weights are on meta"):
        run_policy(sim, policy.to("meta"), 2)
    with pytest.raises(ValueError, match=r"x and v must hold the same creatures, got shapes \(2, 26, 2\) and "
                                         r"\(3, 26, 2\)"):
        FramePolicy.for_simulator(sim)(x.expand(2, -1, -1), v.expand(3, -1, -1))


def test_files_for_algovivo_say_what_algovivo_will_not_run_as_diffsoft_does(tmp_path):
    sim = creatures.biped(dtype=torch.float64)
    with pytest.warns(UserWarning, match="holds 16 hidden units, and algovivo's engine runs 32 only"):
        save_algovivo_policy(FramePolicy.for_simulator(sim, hidden=16), str(tmp_path / "p.json"))
    sim.body.mass = sim.body.mass * 2
    sim.dt = 0.01
    with pytest.warns(UserWarning, match=r"holds the geometry only, and reads back with algovivo's own dt, mass"):
        creatures.save_algovivo(sim, str(tmp_path / "c.json"))
