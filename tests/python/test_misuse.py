"""Misuse a new user meets, class by class (issue "no silent answers"): each gets the right answer or a clear
error naming the argument or file at fault, never a quietly wrong result or an exit of the process."""
import json
import re

import numpy as np
import pytest
import torch

import diffsoft
from diffsoft import creatures, mesh
from diffsoft.body import SoftBody
from diffsoft.policy import FramePolicy, load_algovivo_policy, save_algovivo_policy
from diffsoft.simulator import Simulator

from conftest import F64


def _quadratic(x, k):
    return 0.5 * (k * x * x).sum() - x.sum()


def _sheet(**kw):
    v, t = mesh.rectangle(1.0, 0.3, 4, 2, dtype=F64)
    args = dict(density=1000.0, youngs_modulus=1e4, poisson_ratio=0.3)
    args.update(kw)
    return SoftBody(v, t, **args)


# --- autograd modes --------------------------------------------------------------------------------------

def test_minimize_under_inference_mode_solves():
    k = torch.tensor(2.0, dtype=F64)
    with torch.inference_mode():
        x, info = diffsoft.minimize(_quadratic, torch.zeros(3, dtype=F64), k, return_info=True)
    torch.testing.assert_close(x, torch.full((3,), 0.5, dtype=F64))
    assert info.converged and info.iterations >= 1


@pytest.mark.parametrize("fused", [True, False])
def test_simulator_step_under_inference_and_no_grad_matches_grad_mode(fused):
    sim = creatures.biped(dtype=F64)
    sim.fused = fused
    x, v = sim.rest_state
    a = torch.full((sim.body.num_muscles,), 0.7, dtype=F64)
    reference = sim.step(x, v, a)[0]
    for mode in (torch.inference_mode, torch.no_grad):
        with mode():
            x1, _, info = sim.step(x, v, a, return_info=True)
        assert info.converged
        torch.testing.assert_close(x1, reference, rtol=0, atol=1e-12)


def test_enable_grad_inside_no_grad_gives_the_implicit_gradient():
    k = torch.tensor(2.0, dtype=F64, requires_grad=True)
    with torch.no_grad(), torch.enable_grad():
        x = diffsoft.minimize(_quadratic, torch.zeros(3, dtype=F64), k)
    (g,) = torch.autograd.grad(x.sum(), k)
    torch.testing.assert_close(g, torch.tensor(-3 / 4, dtype=F64))  # d/dk sum(1/k) = -3/k^2


def test_tensors_hidden_in_containers_are_refused():
    k = torch.tensor(2.0, dtype=F64, requires_grad=True)
    for wrapped, kind in (([k], "list"), ((k,), "tuple"), ({"k": k}, "dict"), (torch.nn.Linear(1, 1), "Linear")):
        with pytest.raises(TypeError, match=f"params\\[0\\] is a {kind} holding [12] tensor.*no gradient"):
            diffsoft.minimize(lambda x, p: x.square().sum(), torch.zeros(3, dtype=F64), wrapped)
    # containers without tensors that need gradients pass through, as before
    x = diffsoft.minimize(lambda x, p: _quadratic(x, p[0]), torch.zeros(3, dtype=F64), [k.detach()])
    torch.testing.assert_close(x, torch.full((3,), 0.5, dtype=F64))


# --- values checked where they enter --------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(youngs_modulus=float("inf")), "youngs_modulus has non-finite"),
    (dict(youngs_modulus=1e39, dtype=torch.float32), "youngs_modulus has non-finite entries in torch.float32"),
    (dict(density=float("inf")), "density has non-finite"),
    (dict(poisson_ratio=float("nan")), "poisson_ratio has non-finite"),
    (dict(poisson_ratio=True), "poisson_ratio must be real numbers"),
    (dict(poisson_ratio=-0.2), "poisson_ratio must be >= 0 for material 'neo_hookean'.*unbounded below"),
    (dict(poisson_ratio=-0.2, material="algovivo"), "poisson_ratio must be >= 0 for material 'algovivo'"),
])
def test_body_constants_are_checked(kwargs, match):
    v, t = mesh.rectangle(1.0, 0.3, 4, 2, dtype=F64)
    args = dict(density=1000.0, youngs_modulus=1e4, poisson_ratio=0.3)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        SoftBody(v, t, **args)


def test_negative_poisson_ratio_is_accepted_by_stable_neo_hookean_and_numpy_scalars_anywhere():
    body = _sheet(material="stable_neo_hookean", poisson_ratio=np.float32(-0.3), youngs_modulus=np.float64(1e4),
                  density=np.int64(1000))
    sim = Simulator(body, dt=np.float32(0.01), gravity=np.float64(9.8), ground=np.int32(0),
                    friction_eps=np.float64(0.01))
    x1, _, info = sim.step(*sim.rest_state, return_info=True)
    assert info.converged and torch.isfinite(x1).all()
    assert mesh.rectangle(np.float32(1.0), 0.5, np.int64(2), 1)[0].shape == (6, 2)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(dt=float("inf")), ValueError, "dt must be"), (dict(dt=True), TypeError, "dt must be"),
    (dict(ground=float("nan")), ValueError, "ground"), (dict(friction_eps=float("inf")), ValueError, "friction_eps"),
    (dict(gravity=float("inf")), ValueError, "gravity"), (dict(gravity=True), TypeError, "gravity"),
])
def test_simulator_scalars_are_checked(kwargs, error, match):
    """Out of range: ValueError; not a number (a bool, a string): TypeError; for every constant alike."""
    with pytest.raises(error, match=match):
        Simulator(_sheet(), **kwargs)


@pytest.mark.parametrize("call, match", [
    (lambda: mesh.rectangle(float("inf"), 1.0, 2, 2), "width must be a positive finite number, got inf"),
    (lambda: mesh.rectangle(1.0, 1.0, 2, 2, origin=(0.0, float("nan"))), "origin must be 2 finite numbers"),
    (lambda: mesh.box(size=(1.0, -1.0, 1.0)), "must be a positive finite number"),
    (lambda: mesh.grid(np.ones((2, 2), bool), cell_size=float("nan")), "cell_size"),
])
def test_mesh_generator_arguments_are_checked(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_rollout_lengths_and_render_positions_are_checked():
    sim = creatures.biped(dtype=F64)
    x, v = sim.rest_state
    for steps in (-1, 2.5, True):
        with pytest.raises(ValueError, match="steps must be an integer >= 0"):
            sim.rollout(x, v, steps=steps)
    pytest.importorskip("PIL")
    from diffsoft import render
    with pytest.raises(ValueError, match="x has non-finite"):
        render.render_frame(sim, x * float("nan"))
    with pytest.raises(ValueError, match=r"x must be \(26, 2\) positions"):
        render.render_frame(sim, x[:5])
    xs = torch.stack([x, x, x * float("inf")])
    with pytest.raises(ValueError, match=r"xs has non-finite .* \(frame 2\)"):
        render.render_rollout(sim, xs)


# --- mutation after construction -------------------------------------------------------------------------

def test_fixing_vertices_after_the_simulator_was_built_takes_effect():
    body = _sheet()
    sim = Simulator(body, ground=None)
    x, v = sim.rest_state
    body.fixed = [0, 5]
    x1, _ = sim.step(x, v)
    torch.testing.assert_close(x1[[0, 5]], x[[0, 5]], rtol=0, atol=0)  # held in place
    fresh = Simulator(_sheet(fixed=[0, 5]), ground=None)
    torch.testing.assert_close(x1, fresh.step(x, v)[0], rtol=0, atol=1e-12)
    body.fixed[1] = 10  # in place: also seen
    assert 10 not in body.free.tolist() and 5 in body.free.tolist()
    x2, _ = sim.step(x, v)
    torch.testing.assert_close(x2[[0, 10]], x[[0, 10]], rtol=0, atol=0)
    with pytest.raises(ValueError, match="every vertex is fixed"):
        body.fixed = list(range(body.num_vertices))


def test_changing_material_or_masses_after_the_simulator_was_built_takes_effect():
    def make(change):
        body = _sheet(material="stable_neo_hookean" if change == "material" else "neo_hookean")
        if change == "mass":
            body.mass = body.mass * 3.0
        return body

    # No ground: the default contact stiffness is set from the masses when the simulator is built.
    options = dict(dt=0.01, ground=None, rtol=1e-12)
    results = {}
    for change in ("none", "material", "mass"):
        body = _sheet()
        sim = Simulator(body, **options)
        x, v = sim.rest_state
        x0 = x + 0.02 * torch.sin(7 * x.flip(-1))  # deformed, so that the material matters
        v0 = torch.ones_like(x)  # moving, so that the masses matter
        if change == "material":
            body.material = "stable_neo_hookean"
        if change == "mass":
            body.mass = body.mass * 3.0
        results[change] = sim.step(x0, v0)[0]
        fresh = Simulator(make(change), **options)
        torch.testing.assert_close(results[change], fresh.step(x0, v0)[0], rtol=0, atol=1e-10, msg=change)
    assert (results["material"] - results["none"]).abs().max() > 1e-6
    assert (results["mass"] - results["none"]).abs().max() > 1e-6
    with pytest.raises(ValueError, match="material must be one of"):
        body.material = "rubber"


# --- readers never end the process -----------------------------------------------------------------------

def _bad_files(tmp_path, suffix):
    files = {"empty": b"", "truncated": b'{"pos": [[0, 0], [1, 0', "binary": bytes(range(256)) * 4}
    out = {}
    for name, content in files.items():
        path = tmp_path / f"{name}{suffix}"
        path.write_bytes(content)
        out[name] = str(path)
    return out


@pytest.mark.parametrize("reader", [creatures.load, creatures.load_algovivo, load_algovivo_policy,
                                    creatures.make_creature], ids=lambda f: f.__name__)
def test_json_readers_name_the_file_and_what_is_wrong(tmp_path, reader):
    for name, path in _bad_files(tmp_path, ".json").items():
        with pytest.raises(ValueError, match=f"{path}: (not valid JSON|not a text file)"):
            reader(path)
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        reader(str(tmp_path)) if reader is not creatures.make_creature else creatures.read_json(str(tmp_path))
    huge = tmp_path / "huge.json"  # an integer beyond 64 bits: an OverflowError naming no file, before
    huge.write_text('{"format": "diffsoft.creature", "version": 1, "elements": [[0, 1, ' + "9" * 400 + ']]}')
    with pytest.raises(ValueError, match=f"{huge}: an integer beyond 64 bits"):
        reader(str(huge))


def test_mesh_reader_never_exits_the_process(tmp_path):
    pytest.importorskip("meshio")
    for name, path in _bad_files(tmp_path, ".vtu").items():
        with pytest.raises(ValueError, match=f"{path}: meshio could not read it"):
            mesh.read(path)
    with pytest.raises(IsADirectoryError):
        mesh.read(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no such mesh file"):
        mesh.read(str(tmp_path / "missing.vtu"))


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["fc1"]["weight"][0].__setitem__(0, float("nan")), "key 'fc1' has non-finite"),
    (lambda d: d.update(space_dim="3"), "key 'space_dim' must be 2 or 3"),
    (lambda d: d.update(space_dim=2.5), "key 'space_dim' must be 2 or 3"),
    (lambda d: d.update(min_a="0.2"), "key 'min_a' must be a number"),
])
def test_policy_files_with_wrong_values_are_refused(tmp_path, edit, match):
    path = tmp_path / "policy.json"
    save_algovivo_policy(FramePolicy(4, 2, 2, 0, 1), str(path))
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=match):
        load_algovivo_policy(str(path))


def test_rest_positions_cannot_be_reassigned_and_new_bodies_carry_their_gradients():
    body = _sheet()
    with pytest.raises(AttributeError, match="rest_positions cannot be reassigned.*Build a new SoftBody"):
        body.rest_positions = body.rest_positions * 2
    v, t = mesh.rectangle(1.0, 0.3, 4, 2, dtype=F64)
    v = v.clone().requires_grad_()
    sim = Simulator(SoftBody(v, t, density=1000.0, youngs_modulus=1e4, poisson_ratio=0.3), dt=0.01)
    x, vel = sim.rest_state
    x1, _ = sim.step(x.detach() * 1.01, vel)
    (g,) = torch.autograd.grad(x1.square().sum(), v)
    assert torch.isfinite(g).all() and g.abs().max() > 0


# --- the training command line and its checkpoints -------------------------------------------------------

@pytest.mark.parametrize("flags, name", [
    (["--iterations", "-5"], "iterations"), (["--dtype", "float16"], "dtype"), (["--threads", "0"], "threads"),
    (["--eval-horizon", "-3"], "eval_horizon"), (["--action-noise", "-1"], "action_noise"),
    (["--saturation-penalty", "nan"], "saturation_penalty"), (["--min-a", "2"], "min_a"),
    (["--clip", "inf"], "clip"), (["--lr", "0"], "lr"), (["--window", "0"], "window"),
    (["--terrain", "50"], "terrain"), (["--steer", "maybe"], "steer"),
])
def test_cli_flags_are_checked_before_anything_is_built(flags, name, capsys, monkeypatch, tmp_path):
    from diffsoft import cli
    monkeypatch.setattr(cli, "make_creature", lambda *a, **k: pytest.fail("built a creature before checking"))
    with pytest.raises(SystemExit) as e:
        cli.main(flags + ["--out-dir", str(tmp_path), "--no-progress"])
    assert e.value.code == 2 and name in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--creature", "nosuch"], "creature must be one of"), (["--device", "meta"], "device 'meta' holds shapes"),
    (["--creature", "tetrapod", "--init-activation", "0.7"], r"init_activation must be in \[0, 1 - min_a\]"),
    (["--out-dir", "FILE"], "File exists"), (["--out-dir", ""], "--out-dir must name a directory"),
])
def test_cli_mistakes_found_once_built_are_one_line_not_a_traceback(flags, message, capsys, tmp_path):
    from diffsoft import cli
    (tmp_path / "FILE").write_text("")
    flags = [str(tmp_path / f) if f == "FILE" else f for f in flags]
    with pytest.raises(SystemExit) as e:
        cli.main(["--out-dir", str(tmp_path / "run"), "--iterations", "1", "--batch", "2", "--window", "2",
                  "--episode", "4", "--critic-minibatches", "1", "--no-progress"] + flags)
    err = capsys.readouterr().err
    assert e.value.code in (1, 2) and re.search(message, err) and "Traceback" not in err


def test_a_cli_setting_without_effect_warns_once(tmp_path):
    # --drift-weight on a 2D unsteered run: the trainer and the CLI's own policy before training each warned
    from diffsoft import cli
    with pytest.warns(RuntimeWarning) as caught:
        cli.main(["--out-dir", str(tmp_path), "--iterations", "1", "--batch", "2", "--window", "2", "--episode", "4",
                  "--critic-minibatches", "1", "--no-progress", "--drift-weight", "5"])
    assert [str(w.message) for w in caught].count(
        "drift_weight=5.0 has no effect here: it weighs the move across a commanded heading, with steer in 3D "
        "only (this run: steer=False, 2D); the run records 0") == 1


@pytest.mark.parametrize("content", [b"", b"not a checkpoint", bytes(range(256)) * 8])
def test_a_corrupt_checkpoint_on_resume_says_so(tmp_path, content):
    from diffsoft import training
    cfg = training.TrainConfig(batch=2, window=2, episode=4, iterations=1, critic_minibatches=1,
                               out_dir=str(tmp_path))
    (tmp_path / "checkpoint.pt").write_bytes(content)
    with pytest.raises(ValueError, match="checkpoint.pt is corrupt or not a diffsoft checkpoint.*delete it"):
        training.train(cfg, resume=True, progress=False)


def test_a_checkpoint_that_would_import_other_code_is_refused_before_it_runs(tmp_path):
    # torch 1.13's torch.load (no weights_only there) ran a foreign file's code: os._exit ended the process.
    import os
    import pickle
    from diffsoft import training

    class Foreign:
        def __reduce__(self):
            return os.mkdir, (str(tmp_path / "ran"),)
    (tmp_path / "run").mkdir()
    torch.save({"version": 2, "x": Foreign()}, str(tmp_path / "run" / "checkpoint.pt"))
    cfg = training.TrainConfig(batch=2, window=2, episode=4, iterations=1, critic_minibatches=1,
                               out_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match="checkpoint.pt is corrupt or not a diffsoft checkpoint"):
        training.train(cfg, resume=True, progress=False)
    with open(tmp_path / "run" / "checkpoint.pt", "wb") as f:  # a plain pickle, not torch.save's archive
        pickle.dump({"version": 2, "x": Foreign()}, f)
    with pytest.raises(ValueError, match="checkpoint.pt is corrupt or not a diffsoft checkpoint"):
        training.train(cfg, resume=True, progress=False)
    assert not (tmp_path / "ran").exists()


def test_a_run_says_when_it_resumes_nothing_or_replaces_a_run(tmp_path):
    from diffsoft import training
    cfg = training.TrainConfig(batch=2, window=2, episode=4, iterations=1, critic_minibatches=1,
                               out_dir=str(tmp_path))
    said = []
    training.train(cfg, resume=True, progress=False, log=said.append)  # (a typo'd out_dir trained anew silently)
    assert f"no checkpoint at {tmp_path / 'checkpoint.pt'}: a new run" in said
    with pytest.warns(UserWarning, match="checkpoint.pt exists and this run does not resume it"):
        training.train(cfg, progress=False, log=said.append)


def test_a_creature_without_muscles_is_refused_before_training(tmp_path):
    v, t = mesh.rectangle(0.4, 0.2, 2, 1, dtype=torch.float64)
    path = str(tmp_path / "still.json")
    creatures.save(Simulator(SoftBody(v, t, density=100.0, youngs_modulus=2e3, poisson_ratio=0.3)), path)
    from diffsoft import training
    cfg = training.TrainConfig(creature=path, batch=2, window=2, episode=4, iterations=1, critic_minibatches=1,
                               out_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match="has no muscles: a policy has nothing to control"):
        training.train(cfg, progress=False)


def test_the_training_commands_default_folders_keep_creature_files_apart():
    from diffsoft.cli import _run_name
    assert _run_name("biped") == "biped"
    assert _run_name("examples/data/algovivo/biped/mesh.json") == "biped_mesh"
    assert _run_name("examples/data/algovivo/quadruped/mesh.json") == "quadruped_mesh"
    assert _run_name("mine/biped.json") == "mine_biped" != _run_name("biped")


def test_mesh_files_with_an_index_out_of_range_or_a_format_that_hangs_are_refused(tmp_path):
    path = tmp_path / "negative.vtk"
    path.write_text("# vtk DataFile Version 4.2\nmesh\nASCII\nDATASET UNSTRUCTURED_GRID\nPOINTS 4 double\n"
                    "0 0 0\n1 0 0\n0 1 0\n1 1 0\nCELLS 2 8\n3 0 1 2\n3 1 3 -1\nCELL_TYPES 2\n5\n5\n")
    with pytest.raises(ValueError, match=r"negative.vtk: a triangle cell has vertex index -1, out of range"):
        mesh.read(str(path))  # numpy took -1 as the last point: a quietly other mesh
    v, t = mesh.rectangle(0.4, 0.2, 2, 1)
    for name in ("out.ele", "out.node"):  # meshio's tetgen reader looped for good
        with pytest.raises(ValueError, match=r"tetgen's .ele/.node format is not supported"):
            mesh.write(str(tmp_path / name), v, t)
        (tmp_path / name).write_text("")
        with pytest.raises(ValueError, match=r"tetgen's .ele/.node format is not supported"):
            mesh.read(str(tmp_path / name))
