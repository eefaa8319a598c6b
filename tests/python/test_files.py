"""Files diffsoft writes read back, and its writers refuse what its readers would (creatures in both formats,
policies, meshes; rendering's activations); a training checkpoint remembers what it was trained on, and
``--resume`` refuses another creature or a hand-edited file by name."""
import json
import os

import pytest
import torch

from diffsoft import creatures, mesh, training
from diffsoft.colliders import Sphere
from diffsoft.policy import FramePolicy, distance_walked, load_algovivo_policy, run_policy, save_algovivo_policy

from conftest import F64

# --- creatures -----------------------------------------------------------------------------------------------


def test_save_algovivo_writes_what_load_algovivo_reads_back(tmp_path):
    sim = creatures.biped(dtype=F64)
    x, v = sim.rest_state
    x1, _ = sim.step(x, v + torch.tensor([0.3, 0.0], dtype=F64))
    path = str(tmp_path / "biped.json")
    creatures.save_algovivo(sim, path, x=x1)
    back = creatures.load_algovivo(path, dtype=F64)
    torch.testing.assert_close(back.body.rest_positions, x1, rtol=0, atol=0)
    for name in ("elements", "Dm_inv", "muscles", "muscle_rest_length"):
        torch.testing.assert_close(getattr(back.body, name), getattr(sim.body, name), rtol=0, atol=0)


@pytest.mark.parametrize("x, match", [
    (lambda x: x[:5], r"save_algovivo: x must be the body's positions \(26, 2\), one creature, got shape \(5, 2\)"),
    (lambda x: x.expand(3, -1, -1), r"got shape \(3, 26, 2\) \(save each creature of a batch on its own\)"),
    (lambda x: x * float("nan"), "save_algovivo: x has non-finite .*JSON"),
    (lambda x: x * torch.tensor([-1.0, 1.0], dtype=F64),  # mirrored: every element inverted w.r.t. its rest shape
     "save_algovivo: the file would not read back: element 0 .* is inverted or degenerate"),
])
def test_save_algovivo_refuses_what_would_not_read_back(tmp_path, x, match):
    sim = creatures.biped(dtype=F64)
    path = tmp_path / "biped.json"
    with pytest.raises(ValueError, match=match):
        creatures.save_algovivo(sim, str(path), x=x(sim.rest_state[0]))
    assert not path.exists()


def test_save_refuses_a_batch_and_round_trips(tmp_path):
    sim = creatures.biped(dtype=F64)
    sim.body.mu = sim.body.mu * 1.5
    sim.friction = torch.tensor(12.0, dtype=F64)
    path = str(tmp_path / "c.json")
    creatures.save(sim, path)
    back = creatures.load(path, dtype=F64)
    assert creatures.fingerprint(back) == creatures.fingerprint(sim)
    assert creatures.fingerprint_changes(creatures.fingerprint(sim), back) == []
    assert creatures.fingerprint_changes(creatures.fingerprint(creatures.biped(dtype=F64)), back) == \
        ["friction", "mu"]
    # colliders are content too, compared as a step reads them (in the body's dtype), and round-trip through files
    sim.colliders = [Sphere([1.6, 0.3], 0.25)]
    assert creatures.fingerprint_changes(creatures.fingerprint(back), sim) == ["colliders"]
    creatures.save(sim, path)
    same = creatures.load(path, dtype=F64)
    same.colliders = [Sphere(torch.tensor([1.6, 0.3], dtype=torch.float32).double(), 0.25)]
    assert creatures.fingerprint_changes(creatures.fingerprint(sim), creatures.load(path, dtype=F64)) == []
    assert creatures.fingerprint_changes(creatures.fingerprint(sim), same) == ["colliders"]  # float32's 1.6
    sim.colliders = [Sphere([1.6, 0.3], 0.25, stiffness=5.0)]
    assert creatures.fingerprint_changes(creatures.fingerprint(same), sim) == ["colliders"]
    for writer in (creatures.save, creatures.save_algovivo):
        batch = creatures.biped(dtype=F64)
        batch.body.Dm_inv = batch.body.Dm_inv.expand(2, -1, -1, -1).clone()
        with pytest.raises(ValueError, match=r"writes one creature, but body.Dm_inv has shape \(2, 28, 2, 2\)"):
            writer(batch, str(tmp_path / "batch.json"))


# --- policies, meshes, rendering ---------------------------------------------------------------------------------

def test_policy_writer_refuses_non_finite_weights_and_round_trips(tmp_path):
    policy = FramePolicy(4, 2, 2, 0, 1, hidden=8).double()
    path = tmp_path / "policy.json"
    save_algovivo_policy(policy, str(path))
    back = load_algovivo_policy(str(path), dtype=F64)
    for p, q in zip(policy.parameters(), back.parameters()):
        assert torch.equal(p, q)
    with torch.no_grad():
        policy.fc2.bias[1] = float("nan")
    path.unlink()
    with pytest.raises(ValueError, match="save_algovivo_policy: the file would not read back: key 'fc2' has non-finite"):
        save_algovivo_policy(policy, str(path))
    assert not path.exists()


def test_mesh_writers_refuse_what_read_would_not_read_back(tmp_path):
    pytest.importorskip("meshio")
    v, t = mesh.rectangle(1.0, 0.5, 2, 1, dtype=F64)
    path = str(tmp_path / "m.vtu")
    mesh.write(path, v, t)
    v2, t2 = mesh.read(path, dtype=F64)
    torch.testing.assert_close(v2, v)
    with pytest.raises(ValueError, match="vertices has non-finite"):
        mesh.write(path, v * float("nan"), t)
    with pytest.raises(ValueError, match="elements has vertex index 6, out of range for the 6 vertices"):
        mesh.write(path, v, t + 1)
    with pytest.raises(ValueError, match=r"positions\[1\] has non-finite"):
        mesh.write_vtk_series(str(tmp_path / "series"), torch.stack([v, v * float("inf")]), t)


def test_render_refuses_activations_of_another_count():
    pytest.importorskip("PIL")
    from diffsoft import render
    sim = creatures.biped(dtype=F64)
    x, _ = sim.rest_state
    with pytest.raises(ValueError, match="activation must have one value per muscle: got 5 for the body's 16 muscles"):
        render.render_frame(sim, x, torch.full((5,), 0.5, dtype=F64))
    render.render_frame(sim, x, torch.full((16,), 0.5, dtype=F64))


def test_a_policy_meeting_another_creature_names_both_sizes():
    biped, quadruped = creatures.biped(dtype=F64), creatures.quadruped(dtype=F64)
    policy = FramePolicy.for_simulator(biped)
    x, v = quadruped.rest_state
    with pytest.raises(ValueError, match=r"x has shape \(1, 40, 2\), but this policy observes \(B, 26, 2\).*creature"):
        policy(x[None], v[None])
    with pytest.raises(ValueError, match="made for a creature of 26 vertices and 16 muscles.* 40 vertices and 24"):
        distance_walked(quadruped, policy, 3)
    with pytest.raises(ValueError, match=r"a has shape \(1, 24\), but this policy drives 16 muscles"):
        policy.update(torch.ones(1, 24, dtype=F64), torch.zeros(1, 16, dtype=F64))
    assert run_policy(biped, policy, 2)[0].shape == (3, 1, 26, 2)


# --- training checkpoints ------------------------------------------------------------------------------------------

def _tiny(tmp_path, creature, **kw):
    cfg = dict(creature=creature, window=2, episode=4, batch=2, iterations=1, critic_iterations=1,
               critic_minibatches=1, eval_every=100, checkpoint_every=1, dtype="float64", out_dir=str(tmp_path / "run"),
               keep_best=False)
    cfg.update(kw)
    return training.TrainConfig(**cfg)


def test_resume_refuses_another_creature_at_the_same_path_naming_what_changed(tmp_path):
    path = str(tmp_path / "creature.json")
    creatures.save(creatures.biped(dtype=F64), path)
    training.train(_tiny(tmp_path, path), progress=False)
    other = creatures.biped(dtype=F64)  # as many vertices and muscles: only its content tells them apart
    other.body.muscle_rest_length = other.body.muscle_rest_length * 0.9
    creatures.save(other, path)
    with pytest.raises(ValueError, match="checkpoint.pt was trained on another creature .* its muscle_rest_length "
                                         "differ.*not its name or path"):
        training.train(_tiny(tmp_path, path, iterations=2), resume=True, progress=False)
    # another creature whose contraction range differs too (min_a: the creature's unless given): the creature
    # is named, not the setting; a changed dtype (the creature's rounding) is named as a setting
    with pytest.raises(ValueError, match="trained on another creature than 'tetrapod' is now: its .*lam"):
        training.train(_tiny(tmp_path, "tetrapod", iterations=2), resume=True, progress=False)
    with pytest.raises(ValueError, match=r"trained with other settings \(dtype='float64'\)"):
        training.train(_tiny(tmp_path, path, iterations=2, dtype="float32"), resume=True, progress=False)
    # the same creature under another path resumes
    moved = str(tmp_path / "moved.json")
    os.replace(path, moved)
    creatures.save(creatures.biped(dtype=F64), moved)
    training.train(_tiny(tmp_path, moved, iterations=2), resume=True, progress=False)


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.pop("pool"), "checkpoint.pt lacks key 'pool': an incomplete or hand-edited checkpoint"),
    (lambda c: c["pool"].pop("age"), "checkpoint.pt lacks key 'pool.age'"),
    (lambda c: c.update(pool={**c["pool"], "x": c["pool"]["x"][:1]}),
     r"key 'pool.x' must be a finite torch.float64 tensor of shape \(2, 26, 2\)"),
    (lambda c: c.update(pool={**c["pool"], "x": c["pool"]["x"].float()}),
     r"key 'pool.x' must be a finite torch.float64"),
    (lambda c: c["pool"]["x"].fill_(float("nan")), r"key 'pool.x' must be a finite"),
    (lambda c: c.update(iteration=-5), r"key 'iteration' must be an int >= 0"),
    (lambda c: c.update(iteration="3"), r"key 'iteration' must be an int >= 0"),
    (lambda c: c.update(policy={"fc1.weight": torch.zeros(1)}), "key 'policy' does not fit this run's policy"),
    (lambda c: c.update(frame=[0, 1]), r"its policy observes the body frame of vertices \[0, 1\]"),
    # NaN in a network or an optimizer's state: before, the run trained on (the critic frozen for good, a warning
    # that blamed reward_scale) or failed on an activation
    (lambda c: c["policy"]["fc1.weight"].view(-1)[0].fill_(float("nan")),
     r"key 'policy.fc1.weight' has non-finite \(NaN or infinite\) values: a hand-edited or corrupt checkpoint"),
    (lambda c: next(iter(c["target_critic"].values())).view(-1)[0].fill_(float("inf")),
     r"key 'target_critic.net.0.weight' has non-finite"),
    (lambda c: c["critic_optimizer"]["state"][0]["exp_avg_sq"].view(-1)[0].fill_(float("nan")),
     r"key 'critic_optimizer.state.0.exp_avg_sq' has non-finite"),
    (lambda c: c["evaluated"][0].update(score="far"), r"key 'evaluated\[0\]' is not an evaluated policy of this run's"),
    (lambda c: c["evaluated"][0]["policy"].pop("fc1.weight"), r"key 'evaluated\[0\]' is not an evaluated policy"),
    (lambda c: c.update(evaluated={"score": 1.0}), r"key 'evaluated\[0\]' is not an evaluated policy"),
    (lambda c: [t.fill_(float("nan")) for t in c["evaluated"][0]["policy"].values()],
     r"key 'evaluated\[0\]' is not an evaluated policy .*weights are not all finite"),
    (lambda c: c.update(best={"score": 1.0, "iteration": "0", "policy": {}}) or c.pop("evaluated"),
     r"key 'best' is not an evaluated policy"),  # (as written before every evaluated policy was kept)
])
def test_a_hand_edited_checkpoint_names_the_file_and_key(tmp_path, edit, match):
    training.train(_tiny(tmp_path, "biped"), progress=False)
    ckpt_path = os.path.join(tmp_path, "run", "checkpoint.pt")
    ckpt = torch.load(ckpt_path)
    edit(ckpt)
    torch.save(ckpt, ckpt_path)
    with pytest.raises(ValueError, match=match):
        training.train(_tiny(tmp_path, "biped", iterations=2), resume=True, progress=False)


def test_a_3d_checkpoint_from_before_the_heading_says_why_it_cannot_resume(tmp_path):
    # A 3D policy written before every 3D policy read its heading has 3 inputs fewer: as such a checkpoint.
    training.train(_tiny(tmp_path, "tetrapod"), progress=False)
    ckpt_path = os.path.join(tmp_path, "run", "checkpoint.pt")
    ckpt = torch.load(ckpt_path)
    ckpt["policy"]["fc1.weight"] = ckpt["policy"]["fc1.weight"][:, :-3].clone()
    torch.save(ckpt, ckpt_path)
    with pytest.raises(ValueError, match="(?s)key 'policy' does not fit .* written before every 3D policy read its "
                                         "heading .*delete the checkpoint"):
        training.train(_tiny(tmp_path, "tetrapod", iterations=2), resume=True, progress=False)


def test_a_checkpoint_records_the_creatures_content(tmp_path):
    training.train(_tiny(tmp_path, "biped"), progress=False)
    ckpt = torch.load(os.path.join(tmp_path, "run", "checkpoint.pt"))
    assert ckpt["creature"] == creatures.fingerprint(creatures.make_creature("biped", F64))
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["config"]["creature"] == "biped"


def test_constants_that_follow_the_masses_still_follow_them_once_saved(tmp_path):
    # The tetrapod leaves contact_stiffness and friction at their defaults, which follow its masses (domain
    # randomisation scales them): a file once wrote their values, and the creature read back kept them fixed.
    sim = creatures.tetrapod(dtype=F64)
    path = str(tmp_path / "t.json")
    creatures.save(sim, path)
    back = creatures.load(path, dtype=F64)
    assert back.follows_masses("contact_stiffness") and back.follows_masses("friction")
    assert creatures.fingerprint_changes(creatures.fingerprint(sim), back) == []
    back.body.mass = back.body.mass * 1.3
    torch.testing.assert_close(back.contact_stiffness, sim.contact_stiffness * 1.3)
    fixed = creatures.load(path, dtype=F64)
    fixed.contact_stiffness = float(fixed.contact_stiffness)  # the same value, now its own
    assert creatures.fingerprint_changes(creatures.fingerprint(sim), fixed) == ["contact_stiffness"]


def test_a_diffsoft_creature_file_with_a_misspelt_format_is_refused_naming_the_key(tmp_path):
    path = tmp_path / "c.json"
    creatures.save(creatures.biped(dtype=F64), str(path))
    data = json.loads(path.read_text())
    data["format"] = "diffsoft.creatur"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="key 'format' must be 'diffsoft.creature'"):  # was: missing key 'pos'
        creatures.make_creature(str(path))



def test_creature_files_check_collider_constants_and_hold_one_creatures(tmp_path):
    # Found by a review: stiffness true, NaN or -5 loaded, and failed only at the first step without the file's
    # name; a per-creature friction was written into a one-creature file; terms were dropped without a word.
    import json
    from diffsoft.colliders import Plane
    from diffsoft.terms import Term
    sim = creatures.biped(dtype=F64)
    sim.colliders = [Sphere([0.0, -1.0], 0.5)]
    path = str(tmp_path / "c.json")
    creatures.save(sim, path)
    data = json.load(open(path))
    for bad, why in ((True, "must hold numbers"), (float("nan"), "must be finite"), (-5, "must be finite and >= 0"),
                     ("abc", "must be a number")):
        data["simulator"]["colliders"][0]["stiffness"] = bad
        json.dump(data, open(path, "w"))
        with pytest.raises(ValueError, match=r"c.json: key 'simulator.colliders\[0\]': .*" + why):
            creatures.load(path)
    sim.colliders = [Plane([0.0, -0.01], [0.1, 1.0], friction=torch.tensor([10.0, 20.0], dtype=F64))]
    with pytest.raises(ValueError, match=r"Plane.friction has shape \(2,\) \(one per creature of a batch\)"):
        creatures.save(sim, path)
    sim.colliders = []
    sim.terms = [Term(lambda x, x0, h: (x ** 2).sum((-2, -1)))]
    with pytest.warns(UserWarning, match=r"sim.terms \(1\) are code, not written"):
        creatures.save(sim, path)


def test_a_vtk_series_leaves_out_a_collider_with_no_surface_in_view(tmp_path):
    from diffsoft.colliders import Plane
    x = torch.tensor([[[0.0, 2.0], [0.1, 2.0], [0.0, 2.1]]], dtype=F64)  # 2 m above a ground at 0
    with pytest.warns(UserWarning, match=r"colliders\[0\] has no surface within the box"):
        mesh.write_vtk_series(str(tmp_path), x, torch.tensor([[0, 1, 2]]), colliders=[Plane([0.0, 0.0], [0.0, 1.0])])
    assert not (tmp_path / "frame_collider0.vtu").exists()
    mesh.read(str(tmp_path / "frame_00000.vtu"))


def test_json_nested_thousands_deep_and_a_bad_frame_late_in_a_series_are_refused_up_front(tmp_path):
    # A review: RecursionError naming no file (5,000 levels in json, 500 in the number checks); a NaN in frame 3
    # raised after frames 0-2 were written, without a .pvd.
    for depth in (500, 6000):
        path = tmp_path / f"deep{depth}.json"
        path.write_text('{"pos": ' + "[" * depth + "1" + "]" * depth + "}")
        with pytest.raises(ValueError, match=f"deep{depth}.json: nested"):
            load_algovivo_policy(str(path))
    v, t = mesh.rectangle(0.4, 0.2, 2, 1, dtype=F64)
    xs = v.expand(5, -1, -1).clone()
    xs[3, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"positions\[3\] has non-finite"):
        mesh.write_vtk_series(str(tmp_path / "series"), xs, t)
    assert not (tmp_path / "series").exists() or not any((tmp_path / "series").iterdir())
