"""docs/errors.md quotes the messages users meet: each row's messages are raised here by the misuse they
describe, and must match what the library says (the doc's placeholders, such as N, PATH or ..., match
anything). A row without a trigger below fails the coverage test, so the catalogue cannot drift."""
import json
import re
import warnings
from pathlib import Path

import pytest
import torch

import diffsoft
from diffsoft import Simulator, SoftBody, colliders, creatures, mesh, policy, ppo, render, terms, terrain
from diffsoft.training import TrainConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
# Rows left to other tests, with where and why.
UNTRIGGERED = {
    "ImportError: diffsoft was built against torch A": "needs a build for another torch (test_packaging)",
    "ImportError: diffsoft's compiled core failed to load": "needs a broken build",
    "diffsoft.training.SimulationFailure": "a training run that fails (test_training, on_failure='stop')",
    "ValueError: the fused step kernels run on CPU tensors only": "needs a non-CPU device",
    "ValueError: backend='cpp' runs on CPU tensors only": "needs a non-CPU device",
    "ValueError: the processes were given other settings": "needs two processes (test_training)",
}
_PLACEHOLDER = re.compile(r"\\\.\\\.\\\.|\\\(\\\.\\\.\\\.\\\)|\\\[\\\.\\\.\\\.\\\]|<criterion>|(?:\\\*)?SHAPE|"
                          r"\b(?:[A-Z]|PATH|NAME|DTYPE|lo|hi|[ijkteravdn])\b")


def _rows():
    """``(section, [quoted messages])`` of every table row of the catalogue that quotes a message."""
    section, rows = None, []
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:]
        elif line.startswith("| `") and section != "Autograd modes":
            rows.append((section, re.findall(r"`([^`]+)`", line.split(" | ")[0])))
    return rows


def _pattern(quoted):
    """The exception's class name (or None) and a regex for its message, placeholders matching anything."""
    m = re.match(r"^([\w.]+(?:Error|Warning|Failure)): (.*)$", quoted)
    kind, text = (m.group(1).split(".")[-1], m.group(2)) if m else (None, quoted)
    return kind, re.compile(_PLACEHOLDER.sub(".*?", re.escape(text)), re.S)


def _body(**kw):
    v, t = mesh.rectangle(0.6, 0.2, 3, 1, dtype=torch.float64)
    args = dict(density=1000.0, youngs_modulus=1e4, poisson_ratio=0.3, muscles=[[0, 6]])
    args.update(kw)
    return SoftBody(v, t, **args)


def _sim(**kw):
    return Simulator(_body(), dt=0.01, **kw)


def _partly_lost_backward():
    b = torch.full((3,), 0.5, dtype=F64, requires_grad=True)
    x = diffsoft.minimize(lambda x, b: (x * x - b * x + _QuarticOnce.apply(x)).sum(), torch.zeros(3, dtype=F64), b)
    x.sum().backward()


def _quadratic(x, k):
    return 0.5 * (k * x * x).sum() - x.sum()


def _collider_step(collider, batch=None):
    sim = _sim(colliders=[collider])
    x, v = sim.rest_state
    if batch:
        x, v = x.expand(batch, -1, -1), v.expand(batch, -1, -1)
    return sim.step(x, v)


def _term_step(rows, k):
    sim = _sim(terms=[terms.Term(lambda x, x0, h, k: k * (x ** 2).sum((-2, -1)), rows=rows, params=(k,))])
    return sim.step(*sim.rest_state)


def _step_with(term):
    sim = _sim(terms=[term])
    return sim.step(*sim.rest_state)


def _json_file(tmp, data, name="f.json"):
    path = tmp / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def _edited(tmp, name, save, edit):
    """The path of the JSON file ``name`` that ``save(path)`` writes, rewritten after ``edit(data)``."""
    path = tmp / name
    save(str(path))
    data = json.loads(path.read_text())
    edit(data)
    return _json_file(tmp, data, name)


def _policy_file(tmp, fc1_weight):
    """A policy file whose first weight is ``fc1_weight``."""
    def edit(data):
        data["fc1"]["weight"][0][0] = fc1_weight
    return _edited(tmp, "policy.json", lambda path: policy.save_algovivo_policy(
        policy.FramePolicy(4, 2, 2, 0, 1, hidden=8), path), edit)


def _creature_file(tmp, save=creatures.save, **edits):
    """A creature file (diffsoft's format, or algovivo's with ``save=creatures.save_algovivo``) with ``edits``."""
    return _edited(tmp, "creature.json", lambda path: save(_sim(), path), lambda data: data.update(edits))


def _per_creature_step(batch, mu_batch):
    """A step whose ``body.mu`` has one row per creature of ``mu_batch`` creatures; ``x0`` a batch of ``batch``
    (None: one creature)."""
    sim = _sim()
    sim.body.mu = sim.body.mu.expand(mu_batch, -1).clone()
    x, v = sim.rest_state
    if batch is not None:
        x, v = x.expand(batch, -1, -1), v.expand(batch, -1, -1)
    sim.step(x, v)


def _mu_in_float32():
    sim = _sim()
    sim.body.mu = sim.body.mu.float()
    sim.step(*sim.rest_state)


def _save_per_creature(tmp):
    sim = _sim()
    sim.body.mass = sim.body.mass.expand(2, -1).clone()
    creatures.save(sim, str(tmp / "c.json"))


def _not_converging():
    diffsoft.minimize(lambda x: (x ** 4).sum() - x.sum(), torch.full((3,), 1e3, dtype=torch.float64), max_iter=2)


def _kink():
    """Not smooth at its minimum: Newton's model is wrong there and the line search runs out of trials."""
    diffsoft.minimize(lambda x: (x - 1).abs().sum() + 1e-3 * (x * x).sum(), torch.zeros(3, dtype=torch.float64),
                      rtol=1e-14)


class _NanGradientAbove(torch.autograd.Function):
    """``sum (x - 1)^2``, whose gradient is NaN where ``x > 0.5``: finite where its gradient is not."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return ((x - 1) ** 2).sum()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.where(x > 0.5, torch.full_like(x, float("nan")), 2 * (x - 1))


class _QuarticOnce(torch.autograd.Function):
    """``x^4`` whose backward reads a detached ``x``: its second derivative is lost."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 4

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 4 * x.detach() ** 3


def _degenerate_backward():
    # x* = 0, where H = diag(0, 2) (a saddle at the start is left along its negative curvature)
    k = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    x = diffsoft.minimize(lambda x, k: k * x[0] ** 4 + x[1] ** 2, torch.zeros(2, dtype=torch.float64), k)
    x.sum().backward()


def _loose_backward():
    k = torch.linspace(1, 1e6, 30, dtype=torch.float64, requires_grad=True)
    x = diffsoft.minimize(_quadratic, torch.zeros(30, dtype=torch.float64), k, backward_max_iter=1)
    x.sum().backward()


def _infinite_curvature(read):
    """Problem 1 of 2 sits at a minimum of infinite curvature (``|x - 2|^1.5``); the loss reads it or not."""
    s = torch.tensor(1.0, dtype=F64, requires_grad=True)

    def energy(x, s):
        return torch.stack([((x[0] - s) ** 2).sum(), (s * (x[1] - 2).abs() ** 1.5).sum()])
    x = diffsoft.minimize(energy, torch.tensor([[0.0, 0.0], [2.0, 2.0]], dtype=F64), s, batched=True)
    (x[1] if read else x[0]).sum().backward()


def _frozen_nan_problem():
    """Problem 1 of 2 frozen where its gradient is NaN; the loss reads problem 0 only, s is shared."""
    s = torch.tensor(2.0, dtype=F64, requires_grad=True)
    t = torch.tensor([1.0, 3.0], dtype=F64)

    def energy(x, s):
        trap = torch.where(x > s, torch.zeros_like(x), 0 * torch.sqrt(s - x))  # NaN derivative where x > s
        return ((x - t[:, None] * s / 2) ** 2).sum(1) + trap.sum(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = diffsoft.minimize(energy, torch.zeros(2, 3, dtype=F64), s, batched=True)
    x[0].sum().backward()


def _create_graph():
    k = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    x = diffsoft.minimize(_quadratic, torch.zeros(3, dtype=torch.float64), k)
    torch.autograd.grad(x.sum(), k, create_graph=True)


def _unconverged_backward():
    k = torch.tensor(2.0, dtype=F64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the forward's own warning
        x = diffsoft.minimize(lambda x, k: (k * x ** 4).sum() - x.sum(), torch.full((3,), 1e3, dtype=F64), k,
                              max_iter=2)
    x.sum().backward()


def _under_vmap():
    func = pytest.importorskip("torch.func" if hasattr(torch, "func") else "functorch")
    func.vmap(lambda x: diffsoft.minimize(_quadratic, x, 2.0))(torch.zeros(2, 3, dtype=F64))


def _changed_in_place(what):
    sim = _sim()
    if what == "dt":
        sim.dt = torch.tensor(0.01, dtype=F64)
        sim.dt.sub_(1.0)
    elif what == "body.mu":
        sim.body.mu.mul_(-1.0)
    elif what == "youngs_modulus":
        E = torch.full((6,), 1e4, dtype=F64)
        sim = Simulator(_body(youngs_modulus=E), dt=0.01)
        E.mul_(2.0)
    elif what == "rest_positions":
        sim.body.rest_positions.add_(1.0)
    elif what == "free":
        sim.body.free.add_(0)
    elif what == "copy":
        sim.dt = torch.tensor(0.01, dtype=F64)
        sim, original = sim.to(torch.float32), sim
        original.dt.add_(0.001)
    elif what == "muscles":
        sim.body.muscles = [[0, 6], [1, 7]]
    sim.step(*sim.rest_state)


def _checkpoint(tmp, edit=None, creature="biped", **kw):
    from diffsoft import training
    cfg = dict(creature=creature, window=2, episode=4, batch=2, iterations=1, critic_iterations=1,
               critic_minibatches=1, eval_every=100, checkpoint_every=1, dtype="float64", out_dir=str(tmp / "run"))
    training.train(TrainConfig(**cfg), progress=False)
    path = tmp / "run" / "checkpoint.pt"
    if edit is not None:
        ckpt = torch.load(path)
        edit(ckpt)
        torch.save(ckpt, path)
    training.train(TrainConfig(**{**cfg, "iterations": 2, **kw}), resume=True, progress=False)


def _terrain_changed_inside_on_terrain():
    from diffsoft import terrain
    sim = _sim()
    heights = terrain.ramp_heights(sim, 10.0)[None]
    x, v = sim.rest_state
    with terrain.on_terrain(sim, heights):
        heights.mul_(0.5)
        sim.step(x[None], v[None])


def _warm_start():
    """``minimize`` with atol 0 from its own answer: the relative tolerance below round-off."""
    def energy(x):
        return (0.5 * x * x + 0.25 * x ** 4 - x).sum()
    diffsoft.minimize(energy, diffsoft.minimize(energy, torch.zeros(3, dtype=F64)), max_iter=3)


def _dual_in_a_closure():
    from torch.autograd import forward_ad
    with forward_ad.dual_level():
        c = forward_ad.make_dual(torch.tensor(1.5, dtype=F64), torch.tensor(1.0, dtype=F64))
        diffsoft.minimize(lambda x: (0.5 * c * x * x + 0.25 * x ** 4 - x).sum(), torch.zeros(3, dtype=F64))


def _grad_in_a_terms_closure():
    target = torch.tensor([0.5, 0.3], dtype=F64, requires_grad=True)
    sim = _sim()
    sim.terms = [terms.Term(lambda x, x0, h: ((x[..., 0, :] - target) ** 2).sum(-1), rows=[[1]])]
    sim.step(*sim.rest_state)


def _negative_index(tmp):
    path = tmp / "negative.vtk"
    path.write_text("# vtk DataFile Version 4.2\nmesh\nASCII\nDATASET UNSTRUCTURED_GRID\nPOINTS 4 double\n"
                    "0 0 0\n1 0 0\n0 1 0\n1 1 0\nCELLS 2 8\n3 0 1 2\n3 1 3 -1\nCELL_TYPES 2\n5\n5\n")
    mesh.read(str(path))


def _train(tmp, **kw):
    from diffsoft import training
    training.train(TrainConfig(**{**dict(batch=2, window=2, episode=4, iterations=1, critic_minibatches=1,
                                         keep_best=False, out_dir=str(tmp / "run")), **kw}), progress=False,
                   log=lambda *a: None)


def _without_muscles(tmp):
    v, t = mesh.rectangle(0.4, 0.2, 2, 1, dtype=F64)
    creatures.save(Simulator(SoftBody(v, t, density=100.0, youngs_modulus=2e3, poisson_ratio=0.3)),
                   str(tmp / "still.json"))
    _train(tmp, creature=str(tmp / "still.json"))


def _over_another_run(tmp):
    _train(tmp)
    _train(tmp)


def _main_from_a_script():
    import os
    from diffsoft import cli
    saved = os.environ.pop("OMP_WAIT_POLICY", None)
    try:
        cli._with_passive_openmp()  # (pytest's own process: not the command)
    finally:
        if saved is not None:
            os.environ["OMP_WAIT_POLICY"] = saved


def _term_of_another_batch():
    sim = _sim()
    sim.terms = [terms.Term(lambda x, x0, h, t: ((x[..., 0, :] - t) ** 2).sum(-1), rows=[[1]],
                            params=(torch.zeros(2, 2, dtype=F64),))]
    sim.step(*sim.rest_state)


def _term_that_fails():
    sim = _sim()
    sim.terms = [terms.Term(lambda x, x0, h, t: ((x[..., 0, :] - t) ** 2).sum(-1), rows=[[1]],
                            params=(torch.zeros(3, dtype=F64),))]
    sim.step(*sim.rest_state)


def _collider_file(tmp, **edit):
    sim = _sim()
    sim.colliders = [colliders.Sphere([0.0, -1.0], 0.5)]
    path = tmp / "c.json"
    creatures.save(sim, str(path))
    data = json.loads(path.read_text())
    data["simulator"]["colliders"][0].update(edit)
    path.write_text(json.dumps(data))
    creatures.load(str(path))


def _save_per_creature_friction(tmp):
    sim = _sim()
    sim.colliders = [colliders.Plane([0.0, -0.01], [0.0, 1.0], friction=torch.tensor([1.0, 2.0], dtype=F64))]
    creatures.save(sim, str(tmp / "c.json"))


def _save_terms(tmp):
    sim = _sim()
    sim.terms = [terms.Term(lambda x, x0, h: (x ** 2).sum((-2, -1)))]
    creatures.save(sim, str(tmp / "c.json"))


def _deep_json(tmp):
    path = tmp / "deep.json"
    path.write_text('{"pos": ' + "[" * 100 + "1" + "]" * 100 + "}")
    policy.load_algovivo_policy(str(path))


def _corrupt_checkpoint(tmp):
    from diffsoft import training
    (tmp / "run").mkdir()
    (tmp / "run" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    training.train(TrainConfig(batch=2, window=2, episode=4, iterations=1, critic_minibatches=1,
                               out_dir=str(tmp / "run")), resume=True, progress=False)


def _another_creature_at_the_same_path(tmp):
    path = str(tmp / "creature.json")
    creatures.save(creatures.biped(dtype=F64), path)

    def replace(ckpt):
        other = creatures.biped(dtype=F64)
        other.body.mass = other.body.mass * 2
        creatures.save(other, path)
    _checkpoint(tmp, replace, creature=path)


def _mesh_read(tmp, kind):
    if kind == "empty":
        return mesh.read(_json_file(tmp, "", "empty.vtu"))
    if kind == "missing":
        return mesh.read(str(tmp / "nothing.vtu"))
    if kind == "dir":
        return mesh.read(str(tmp))
    meshio = pytest.importorskip("meshio")
    import numpy as np
    path = str(tmp / "m.vtu")
    if kind == "lines":
        meshio.write_points_cells(path, np.zeros((2, 3)), [("line", np.array([[0, 1]]))])
    elif kind == "tetra2d":
        meshio.write_points_cells(path, np.eye(4, 3), [("tetra", np.array([[0, 1, 2, 3]]))])
        return mesh.read(path, dim=2)
    elif kind == "surface":
        meshio.write_points_cells(path, np.eye(3), [("triangle", np.array([[0, 1, 2]]))])
    return mesh.read(path)


F64 = torch.float64
X3 = torch.zeros(3, dtype=F64)
# (the message as quoted in docs/errors.md, the misuse that raises or warns it; tmp is a temporary directory)
def _far_out():
    """A float32 biped 10,000 units out, where float32 resolves positions to about 1e-3."""
    sim = creatures.biped()
    x, v = sim.rest_state
    sim.step(x + torch.tensor([1e4, 0.0]), v)


def _envs():
    return pytest.importorskip("diffsoft.envs")


def _task(creature="worm", dtype=torch.float32):
    """A LocomotionTask of episodes of 2 steps (PPOConfig(horizon=2)'s) on a creature by name."""
    from diffsoft.task import LocomotionTask
    return LocomotionTask(creatures.make_creature(creature, dtype), 2)


def _per_creature_masses():
    sim = creatures.worm()
    sim.body.mass = sim.body.mass.expand(2, -1).clone()
    _envs().LocomotionVectorEnv(sim, num_envs=3)


def _ragged_action():
    env = _envs().LocomotionVectorEnv("worm", num_envs=2, horizon=2)
    env.reset()
    env.step([[0.0] * 16, [0.0] * 17])


def _muscles_changed_under_an_env():
    env = _envs().LocomotionEnv("worm", horizon=2)
    body = env.task.sim.body
    body.muscles, body.muscle_rest_length, body.muscle_stiffness = (
        body.muscles[:-1], body.muscle_rest_length[:-1], body.muscle_stiffness[:-1])
    env.reset()
    env.step([0.0] * body.num_muscles)


def _worm_policy(**kw):
    return policy.FramePolicy.for_simulator(creatures.worm(), **kw)


def _edited_policy(**fields):
    p = _worm_policy()
    for name, value in fields.items():
        setattr(p, name, value)
    return p


def _with_options(backend, **options):
    sim = creatures.worm()
    sim.backend = backend
    sim.solver_options.update(options)
    sim.step(*sim.rest_state)


def _nan_creature():
    sim = creatures.worm()
    x, v = (t.expand(2, -1, -1).clone() for t in sim.rest_state)
    x[1, 0, 0] = float("nan")
    sim.step(x, v)


TRIGGERS = [
    ("RuntimeWarning: diffsoft.minimize did not converge: max_iter = N Newton iterations reached with the gradient "
     "norm at R x its tolerance ...", lambda tmp: _not_converging()),
    ("... the line search found no decrease of the energy after K trials at Newton iteration i for problem(s) ... "
     "(||g|| = ..., tolerance ...)", lambda tmp: _kink()),
    ("... (atol is 0, so the tolerance is rtol x ||g0||, here down to T: where that is below the gradient's "
     "round-off, as from a start at or near the minimum, no x reaches it; set atol)", lambda tmp: _warm_start()),
    ("NotImplementedError: ... reads a forward-mode dual tensor that is not among its params (one its closure "
     "captured): ...", lambda tmp: _dual_in_a_closure()),
    ("RuntimeWarning: ... depends on a tensor that requires grad and is not among its params",
     lambda tmp: _grad_in_a_terms_closure()),
    ("ValueError: PATH: a triangle cell has vertex index i, out of range for its N points",
     lambda tmp: _negative_index(tmp)),
    ("ValueError: PATH: tetgen's .ele/.node format is not supported (meshio's reader can hang on it)",
     lambda tmp: mesh.write(str(tmp / "out.ele"), *mesh.rectangle(0.4, 0.2, 2, 1))),
    ("ValueError: creature 'C' has no muscles: a policy has nothing to control", lambda tmp: _without_muscles(tmp)),
    ("UserWarning: terrain (v) with steer: the terrain is laid out along +x ...",
     lambda tmp: _train(tmp, terrain=5.0, steer=True)),
    ("UserWarning: PATH exists and this run does not resume it: the new run's files replace it ...",
     lambda tmp: _over_another_run(tmp)),
    ("RuntimeWarning: keep_best: none of the K evaluated policies it kept (...) has a gait that lasts ...",
     lambda tmp: _train(tmp, keep_best=True)),  # (a run of one iteration does not walk)
    ("RuntimeWarning: OMP_WAIT_POLICY is not set: idle OpenMP threads spin ...", lambda tmp: _main_from_a_script()),
    ("ValueError: sim.terms[k] (Term 'NAME'): its energy must return one energy per row, shape S for rows of shape R "
     "(...), got T ...", lambda tmp: _term_of_another_batch()),
    ("sim.terms[k] (Term 'NAME'): its energy failed at the step's start (...)", lambda tmp: _term_that_fails()),
    ("ValueError: PATH: key 'simulator.colliders[k]': key 'stiffness' must hold numbers (JSON's true is not 1), "
     "got ...",
     lambda tmp: _collider_file(tmp, stiffness=True)),
    ("ValueError: creatures.save writes one creature, but sim.colliders[k]: NAME has shape (B,) (one per creature of "
     "a batch), but a file holds one creature's: save each creature's own",
     lambda tmp: _save_per_creature_friction(tmp)),
    ("UserWarning: creatures.save: sim.terms (K) are code, not written to PATH ...", lambda tmp: _save_terms(tmp)),
    ("UserWarning: write_vtk_series: colliders[k] has no surface within the box around the trajectory ...",
     lambda tmp: mesh.write_vtk_series(str(tmp), torch.tensor([[[0.0, 2.0], [0.1, 2.0], [0.0, 2.1]]], dtype=F64),
                                       torch.tensor([[0, 1, 2]]), colliders=[colliders.Plane([0.0, 0.0], [0.0, 1.0])])),
    ("ValueError: PATH: nested more than 32 levels deep, deeper than any diffsoft file", lambda tmp: _deep_json(tmp)),
    ("ValueError: bounds must span between 1e-6 of their distance from the origin (plus 1) and 1e12 along each axis, "
     "got ...", lambda tmp: render.render_frame(_sim(), _sim().rest_state[0], bounds=(0.3, 0.3 + 1e-9, 0.0, 1.0))),
    ("ValueError: steps must be an integer >= 1, got ...",
     lambda tmp: policy.run_policy(_sim(), policy.FramePolicy.for_simulator(_sim()), 0)),
    ("ValueError: sim.solver_options['K'] is the C++ backend's (diffsoft.minimize) option, and this step runs on the "
     "torch backend, which does not take it: ...", lambda tmp: _with_options(backend="torch", ls_max_iter=5)),
    ("ValueError: x0 has non-finite (NaN or infinite) values for creature(s) [...]", lambda tmp: _nan_creature()),
    ("ValueError: noise must have shape (T, B, M) = (...), one change per step, creature and muscle (it is not "
     "broadcast), got S", lambda tmp: policy.run_policy(creatures.worm(), _worm_policy(), 2, noise=torch.zeros(2, 1, 1))),
    ("ValueError: min_a must be a number in [1e-06, 1), got v",
     lambda tmp: policy.run_policy(creatures.worm(), _edited_policy(min_a=2.0), 1)),
    ("ValueError: the policy's mirror does not fit this body: ... A mirrored policy belongs to the body it was made "
     "for (FramePolicy.for_simulator(sim, mirror=True)): load or train one for this creature",
     lambda tmp: policy.run_policy(creatures.worm(), _worm_policy(steered=True, mirror=policy.Mirror(
         0, tuple(range(18)), tuple(range(16)))), 1)),
    ("ValueError: tolerance must be a finite number >= 0 (a fraction of the body's size), got v",
     lambda tmp: policy.Mirror.of(creatures.worm(), tolerance=float("nan"))),
    ("ValueError: PATH: unknown key(s) 'K' (a policy file holds fc1, fc2, min_a, max_abs_da, center_vertex_id, "
     "forward_vertex_id, space_dim, steered, mirror)",
     lambda tmp: policy.load_algovivo_policy(_edited(tmp, "policy.json", lambda path: policy.save_algovivo_policy(
         policy.FramePolicy(4, 2, 2, 0, 1), path), lambda data: data.update(mirrror=None)))),
    ("ValueError: window must be a positive integer (a number of steps), got v",
     lambda tmp: policy.gait(creatures.worm(), _worm_policy(), 4, 2.5)),
    ("ValueError: dim must be 2 or 3 (the body's dimension), got v", lambda tmp: policy.heading_direction(0.0, 4)),
    ("ValueError: state holds x S, v S and a S, but this task's creature takes x and v (B, N, d) (...) and a (B, M): "
     "a state of another creature (a task steps the states its reset makes)",
     lambda tmp: _task("worm").observe(_task("biped").reset(1))),
    ("ValueError: horizon must be a positive integer below 2**63 (the episode length in steps), got v",
     lambda tmp: _envs().LocomotionEnv("worm", horizon=2 ** 63)),
    ("ValueError: dtype must be torch.float32 or torch.float64 (or 'float32', 'float64'), got v",
     lambda tmp: _envs().LocomotionEnv("worm", dtype="float")),
    ("ValueError: the Simulator cannot step num_envs=N creature(s): NAME has shape S, but "
     "it must be ...", lambda tmp: _per_creature_masses()),
    ("ValueError: action must have shape S (the activation changes of M muscles), got ...",
     lambda tmp: _ragged_action()),
    ("ValueError: the creature has M muscles now, but this environment was made for K (its action_space): its "
     "body's muscles were changed since; make a new environment", lambda tmp: _muscles_changed_under_an_env()),
    ("ValueError: PPOConfig.NAME is v but the task's is v: ...",
     lambda tmp: ppo.GaussianFramePolicy(_task(dtype=torch.float64), ppo.PPOConfig(horizon=2))),
    ("ValueError: inputs must have shape (K, n_obs), n_obs = N, got S: make them with GaussianFramePolicy.inputs(task, "
     "state) ...", lambda tmp: ppo.GaussianFramePolicy(_task(), ppo.PPOConfig(horizon=2)).distribution(
         torch.zeros(1, 3))),
    ("ValueError: the number of threads must be at most K (4 per core of this machine's N, or 64), got n",
     lambda tmp: __import__("diffsoft.threads").threads.set_num_threads(10 ** 6)),
    ("... the gradient is not finite at Newton iteration i",
     lambda tmp: diffsoft.minimize(_NanGradientAbove.apply, torch.zeros(3, dtype=F64))),
    ("UserWarning: diffsoft: adjoint solve failed: the Hessian at x* is not positive definite ...",
     lambda tmp: _degenerate_backward()),
    ("... the adjoint solve's relative residual is r > backward_rtol = t after N CG iterations "
     "(backward_max_iter = M)", lambda tmp: _loose_backward()),
    ("... the adjoint solve's relative residual is r > backward_rtol = t after Hessian-vector products that are "
     "not finite for problem(s) I: the energy's second derivatives hold NaN or inf at their x*",
     lambda tmp: _infinite_curvature(read=True)),
    ("UserWarning: diffsoft: the implicit gradient with respect to the params is not finite: the energy's gradient is "
     "not finite at x* for problem(s) I, which autograd carries into the params' gradient (0 x NaN) even where the "
     "loss does not read them: ...", lambda tmp: _frozen_nan_problem()),
    ("RuntimeError: diffsoft's implicit backward (diffsoft.minimize, Simulator.step) is first order only: "
     "create_graph=True (and so higher-order gradients, gradgradcheck, Hessians) is not supported; differentiate "
     "once, with create_graph=False", lambda tmp: _create_graph()),
    ("UserWarning: diffsoft: implicit gradient at an unconverged solve: the forward solve did not converge for "
     "problem(s) ... (...): the implicit gradient assumes grad E(x*) = 0, which does not hold there, and is "
     "unreliable; the adjoint solve: ...", lambda tmp: _unconverged_backward()),
    ("RuntimeError: diffsoft's implicit backward takes one gradient at a time: batched gradients "
     "(torch.autograd.grad(..., is_grads_batched=True), torch.autograd.functional.jacobian(vectorize=True)) are not "
     "supported; ...", lambda tmp: torch.autograd.functional.jacobian(lambda k: diffsoft.minimize(_quadratic, X3, k),
                                                                       torch.tensor(2.0, dtype=F64), vectorize=True)),
    ("RuntimeError: NAME does not run under torch.func transforms (vmap, grad, jacrev, jacfwd, hessian, jvp): for "
     "many problems at once pass ...; for derivatives use torch.autograd.grad, "
     "torch.autograd.functional.jacobian(vectorize=False) or loss.backward()", lambda tmp: _under_vmap()),
    ("TypeError: energy must be callable", lambda tmp: diffsoft.minimize(3, X3)),
    ("TypeError: x0 must be a torch.Tensor", lambda tmp: diffsoft.minimize(_quadratic, [0.0], 1.0)),
    ("TypeError: params[i] is a list holding K tensor(s) that require grad: they would get no "
     "gradient through the implicit backward",
     lambda tmp: diffsoft.minimize(lambda x, ks: _quadratic(x, ks[0]), X3, [torch.ones((), dtype=F64,
                                                                                        requires_grad=True)])),
    ("ValueError: x0 is empty", lambda tmp: diffsoft.minimize(_quadratic, torch.zeros(0, dtype=F64), 2.0)),
    ("ValueError: batched=True needs x0 with a leading batch dimension",
     lambda tmp: diffsoft.minimize(_quadratic, torch.zeros((), dtype=F64), 2.0, batched=True)),
    ("TypeError: params[i] has dtype A but x0 has dtype B: floating-point params must have x0's dtype ...",
     lambda tmp: diffsoft.minimize(_quadratic, X3, torch.ones(3))),
    ('ValueError: on_failure must be "warn" or "raise"',
     lambda tmp: diffsoft.minimize(_quadratic, X3, 2.0, on_failure="ignore")),
    ("ValueError: rtol must be None or in (0, 1)", lambda tmp: diffsoft.minimize(_quadratic, X3, 2.0, rtol=2.0)),
    ("ValueError: energy must return a torch.Tensor, got T", lambda tmp: diffsoft.minimize(lambda x: 1.0, X3)),
    ("ValueError: energy must return a 0-dim tensor, got shape S", lambda tmp: diffsoft.minimize(lambda x: x * x, X3)),
    ("ValueError: energy must return a floating-point tensor",
     lambda tmp: diffsoft.minimize(lambda x: (x > 0).sum(), X3)),
    ("ValueError: the energy does not depend on x: its value has no autograd graph to x ...",
     lambda tmp: diffsoft.minimize(lambda x, k: k * 2, X3, torch.ones((), dtype=F64))),
    ("ValueError: the energy's second derivative is lost: its gradient changes with x (...), yet "
     "it has no autograd graph to x, so every Hessian-vector product is 0 ...",
     lambda tmp: diffsoft.minimize(lambda x: (_QuarticOnce.apply(x) - x).sum(), torch.ones(3, dtype=F64))),
    ("UserWarning: diffsoft: part of the energy's second derivative is lost: at x* its Hessian-vector products "
     "differ from the gradient's change by P% along the adjoint, alike over moves of two sizes (problem(s) ...), so "
     "the implicit gradient misses that part and is wrong ...", lambda tmp: _partly_lost_backward()),
    ("TypeError: sparsity must be an (E, k) int64 tensor of vertex indices",
     lambda tmp: diffsoft.minimize(_quadratic, torch.zeros(3, 2, dtype=F64), 2.0, sparsity=[[0, 1]])),
    ("ValueError: energy or its gradient is not finite at x0 (energy = e, problem(s) ...)",
     lambda tmp: diffsoft.minimize(lambda x: (x.log() ** 2).sum(), -torch.ones(3, dtype=F64))),
    ("ValueError: material must be one of ('algovivo', 'neo_hookean', 'stable_neo_hookean')",
     lambda tmp: _body(material="rubber")),
    ("ValueError: vertices must be (N, 2) or (N, 3) with N > d",
     lambda tmp: SoftBody(torch.zeros(2, 2), [[0, 1, 0]], density=1.0, youngs_modulus=1.0, poisson_ratio=0.3)),
    ("TypeError: vertices must be numbers",
     lambda tmp: SoftBody([["a", "b"]] * 3, [[0, 1, 2]], density=1.0, youngs_modulus=1.0, poisson_ratio=0.3)),
    ("ValueError: elements is empty",
     lambda tmp: SoftBody(torch.eye(3, 2), torch.zeros(0, 3, dtype=torch.long), density=1.0, youngs_modulus=1.0,
                          poisson_ratio=0.3)),
    ("ValueError: element i [...] is degenerate (zero rest area)",
     lambda tmp: SoftBody([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]], [[0, 1, 2]], density=1.0, youngs_modulus=1.0,
                          poisson_ratio=0.3)),
    ("ValueError: element i [...] is inverted (negatively oriented) in the rest pose",
     lambda tmp: SoftBody([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], [[0, 2, 1]], density=1.0, youngs_modulus=1.0,
                          poisson_ratio=0.3)),
    ("ValueError: Dm_inv must be (E, d, d)", lambda tmp: _body(Dm_inv=torch.eye(2, dtype=F64))),
    ("ValueError: give the material either as youngs_modulus and poisson_ratio, or as mu and lam",
     lambda tmp: _body(mu=1.0, lam=1.0)),
    ("ValueError: NAME has non-finite entries in DTYPE: v", lambda tmp: _body(density=float("nan"))),
    ("ValueError: poisson_ratio must be >= 0 for material 'neo_hookean', whose energy is unbounded below when lam < 0",
     lambda tmp: _body(poisson_ratio=-0.2)),
    ("AttributeError: SoftBody.rest_positions cannot be reassigned",
     lambda tmp: setattr(_body(), "rest_positions", torch.zeros(8, 2, dtype=F64))),
    ("ValueError: youngs_modulus must be positive", lambda tmp: _body(youngs_modulus=-1.0)),
    ("ValueError: NAME must be a number or one value per element (K,)",
     lambda tmp: _body(density=[1.0, 2.0])),
    ("ValueError: give exactly one of density ... and mass", lambda tmp: _body(mass=1.0)),
    ("ValueError: vertex i belongs to no element, so it has no mass",
     lambda tmp: SoftBody(torch.eye(4, 2), [[0, 1, 2]], density=1.0, youngs_modulus=1.0, poisson_ratio=0.3)),
    ("ValueError: fixed lists a vertex twice", lambda tmp: _body(fixed=[0, 0])),
    ("ValueError: muscle i joins vertex j to itself", lambda tmp: _body(muscles=[[1, 1]])),
    ("ValueError: dt must be a positive number in [lo, hi] (seconds; its square must be a normal DTYPE)",
     lambda tmp: Simulator(_body(), dt=-1.0)),
    ("ValueError: NAME has shape S, but it must be SHAPE (shared by the batch) or (B, *SHAPE) (one per creature of "
     "x0's batch of B)", lambda tmp: _per_creature_step(batch=2, mu_batch=3)),
    ("ValueError: NAME has shape S, but it must be SHAPE for one creature: x0 is (N, d); one value per creature needs "
     "a batch x0 of shape (B, N, d) ...", lambda tmp: _per_creature_step(batch=None, mu_batch=3)),
    ("TypeError: body.mu has dtype A but the body has B", lambda tmp: _mu_in_float32()),
    ("ValueError: backend must be 'auto', 'cpp' or 'torch', got ...", lambda tmp: _sim(backend="gpu")),
    ("ValueError: reuse_factor is an option of the C++ backend (CPU tensors): the torch backend refactors at every "
     "Newton step; ...", lambda tmp: _sim(backend="torch", reuse_factor=True).step(*_sim().rest_state)),
    ("ValueError: reuse_factor needs a factored Hessian, but this step solves by CG (...): use solver='direct', or "
     "set sim.solver_options['reuse_factor'] = False",
     lambda tmp: _sim(solver="cg", reuse_factor=True).step(*_sim().rest_state)),
    ("ValueError: creatures.save writes one creature, but body.NAME has shape S (one per creature of a batch); "
     "save each creature's own", lambda tmp: _save_per_creature(tmp)),
    ("ValueError: Simulator.step: energy or its gradient is not finite at x0 ... The step's energy overflows at the "
     "start state: check x0, v0 and the constants ...",
     lambda tmp: _sim().step(_sim().rest_state[0], torch.full((8, 2), 1e200, dtype=F64))),
    ("RuntimeWarning: Simulator.step: x0 lies D from the origin, where DTYPE resolves positions to r, more than "
     "1e-4 of the body's size (S): rounding has changed its shape; ...", lambda tmp: _far_out()),
    ("ValueError: Simulator.step: energy or its gradient is not finite at x0 ... Element i [...] is inverted or "
     "degenerate in x0 relative to its rest shape (det F = ...): the neo-Hookean energy is infinite there. ...",
     lambda tmp: _sim().step(_sim().rest_state[0] * torch.tensor([-1.0, 1.0], dtype=F64), torch.zeros(8, 2, dtype=F64))),
    ("TypeError: x0 must be a torch.Tensor", lambda tmp: _sim().step([[0.0]], [[0.0]])),
    ("ValueError: x0 must be (N, d) = ... or (B, N, d), got shape S",
     lambda tmp: _sim().step(torch.zeros(3, 2, dtype=F64), torch.zeros(3, 2, dtype=F64))),
    ("ValueError: activation must have shape (M,) (one per muscle), got S",
     lambda tmp: _sim().step(*_sim().rest_state, torch.ones(5, dtype=F64))),
    ("ValueError: activation must be in [1e-06, 1] (1 is relaxed; ...), got a",
     lambda tmp: _sim().step(*_sim().rest_state, torch.zeros(1, dtype=F64))),
    ("ValueError: give activations or controller, not both",
     lambda tmp: _sim().rollout(*_sim().rest_state, torch.ones(1, 1, dtype=F64), controller=lambda x, v, t: None)),
    ("TypeError: colliders must be a list or tuple of diffsoft.colliders objects (Plane, HeightField, ...), got T",
     lambda tmp: _sim(colliders=colliders.Plane([0.0, 0.0], [0.0, 1.0]))),
    ("colliders[k] must be a diffsoft.colliders object (Plane, HeightField, ...), got T",
     lambda tmp: _sim(colliders=[colliders.Plane([0.0, 0.0], [0.0, 1.0]), "sphere"])),
    ("ValueError: Plane.normal must not be 0, got ...",
     lambda tmp: _collider_step(colliders.Plane([0.0, 0.0], [0.0, 0.0]))),
    ("ValueError: HeightField.heights must have at least 2 samples along each of its A axes ((nx,), or with a "
     "leading B), got shape S", lambda tmp: _collider_step(colliders.HeightField(0.0, 0.1, [0.0]))),
    ("HeightField.dx must be > 0, got ...", lambda tmp: _collider_step(colliders.HeightField(0.0, -0.1, [0.0, 1.0]))),
    ("TypeError: HeightField.heights must be a tensor or a (nested) sequence of numbers, (nx,) (or with a leading B), "
     "got ...", lambda tmp: _collider_step(colliders.HeightField(0.0, 0.1, [0.0, [1.0, 2.0]]))),
    ("ValueError: NAME must be finite, got v", lambda tmp: _collider_step(colliders.Sphere([0.0, float("nan")], 1.0))),
    ("TypeError: NAME must be a number, a sequence of numbers or a tensor, got ...",
     lambda tmp: _collider_step(colliders.Sphere("centre", 1.0))),
    ("ValueError: NAME has shape S, but it must be SHAPE (shared by the batch) or (B, *SHAPE) (one per creature of "
     "x0's batch of B)", lambda tmp: _collider_step(colliders.Sphere(torch.zeros(3, 2, dtype=F64), 1.0), batch=2)),
    ("... for one creature: x0 is (N, d); ...",
     lambda tmp: _collider_step(colliders.Sphere(torch.zeros(3, 2, dtype=F64), 1.0))),
    ("TypeError: Term: energy must be callable, got T", lambda tmp: terms.Term(3.0)),
    ("ValueError: Term: rows must be a (K, k) integer tensor of vertex indices, K, k >= 1, got S",
     lambda tmp: terms.Term(_quadratic, rows=[0, 1])),
    ("TypeError: Term 'NAME': params[j] must be a torch.Tensor, got T",
     lambda tmp: terms.Term(_quadratic, params=(torch.zeros(2), 1.0))),
    ("TypeError: terms[k] must be a diffsoft.terms.Term, got T", lambda tmp: _sim(terms=[_quadratic])),
    ("ValueError: Term 'NAME': rows has vertex index i, but the body has N vertices",
     lambda tmp: _term_step(rows=[[99]], k=torch.tensor(1.0, dtype=F64))),
    ("ValueError: Term 'NAME': one row's energy reads another row's positions; each row's energy may read only its own row of x ...",
     lambda tmp: _step_with(terms.Term(lambda x, x0, h: (x[..., 0, :].mean(-2) ** 2).sum(-1)[..., None].expand(
         *x.shape[:-2]) / x.shape[-3], rows=[[0], [3]]))),
    ("ValueError: Term 'NAME': its second derivative is lost: its gradient changes with the positions, yet has no autograd graph to them ...",
     lambda tmp: _step_with(terms.Term(lambda x, x0, h: _QuarticOnce.apply(x - x0).sum((-2, -1)), rows=[[0], [3]]))),
    ("ValueError: Term 'NAME': part of its second derivative is lost: its Hessian-vector products differ from its gradient's change by P% ...",
     lambda tmp: _step_with(terms.Term(lambda x, x0, h: (_QuarticOnce.apply(x - x0 + 0.5) + (x - x0).square()).sum(
         (-2, -1)), rows=[[0], [3]]))),
    ("TypeError: terms[k].params[j] has dtype A but the body has B",
     lambda tmp: _term_step(rows=[[0]], k=torch.tensor(1.0))),
    ("ValueError: nx must be a positive integer", lambda tmp: mesh.rectangle(nx=0)),
    ("ValueError: PATH: meshio could not read it (...)", lambda tmp: _mesh_read(tmp, "empty")),
    ("ValueError: PATH: no triangle or tetra cells", lambda tmp: _mesh_read(tmp, "lines")),
    ("ValueError: positions must be (T, N, d)",
     lambda tmp: mesh.write_vtk_series(str(tmp), torch.zeros(3, 2), torch.zeros(1, 3, dtype=torch.long))),
    ("ValueError: PATH: not valid JSON (...)", lambda tmp: creatures.make_creature(_json_file(tmp, "{", "c.json"))),
    ("ValueError: PATH: key 'fc1' has non-finite (NaN or infinite) weights",
     lambda tmp: policy.load_algovivo_policy(_policy_file(tmp, fc1_weight=float("nan")))),
    ("ValueError: PATH: not valid JSON",
     lambda tmp: creatures.load(_json_file(tmp, '{"format": ', "creature.json"))),
    ("ValueError: algovivo's format is 2D; this body is 3D (use diffsoft.creatures.save)",
     lambda tmp: creatures.save_algovivo(creatures.tetrapod(dtype=F64), str(tmp / "t.json"))),
    ("ValueError: segments must be an integer >= 2", lambda tmp: creatures.worm(segments=1)),
    ("ValueError: in 2D a heading is 0 (+x) or pi (-x), got ...", lambda tmp: policy.heading_direction([1.0], 2)),
    ("ValueError: heights must be a tensor of shape ([B,] *SHAPE) on ...",
     lambda tmp: terrain.height_field(creatures.biped(dtype=F64), torch.zeros(5, dtype=F64))),
    ("ValueError: x must be (N, d) positions of the body",
     lambda tmp: render.render_frame(_sim(), torch.zeros(3, 2))),
    ("ValueError: xs holds a batch of B creatures: pass creature= (an index in [0, B)) to say which one to draw",
     lambda tmp: render.render_rollout(_sim(), torch.stack([_sim().rest_state[0]] * 2)[None].expand(2, 2, -1, -1))),
    ("ValueError: material must be one of ...",
     lambda tmp: diffsoft.energies.elastic_energy(torch.zeros(3, 2), torch.tensor([[0, 1, 2]]),
                                                  torch.eye(2)[None], torch.ones(1), torch.ones(1), "rubber")),
    ("ValueError: PATH: key 'fc1' must be {'weight': [[...]], 'bias': [...]} of numbers",
     lambda tmp: policy.load_algovivo_policy(_policy_file(tmp, fc1_weight=True))),
    ("ValueError: PATH: weights too large for DTYPE (they overflow to infinity); load it in a wider dtype",
     lambda tmp: policy.load_algovivo_policy(_policy_file(tmp, fc1_weight=1e300))),
    ("ValueError: PATH: key 'mass' must be a (nested) list of numbers of equal lengths",
     lambda tmp: creatures.load(_creature_file(tmp, mass=["1"] * 8))),
    ("ValueError: PATH: key 'l0' (the muscles' rest lengths) must be positive numbers that DTYPE holds, in [lo, hi], "
     "got v", lambda tmp: creatures.load_algovivo(_creature_file(tmp, creatures.save_algovivo, l0=[0.0]))),
    ("ValueError: size must be (width, height), two integers in [1, 16384] (pixels), got ...",
     lambda tmp: render.render_frame(_sim(), _sim().rest_state[0], size=(0, 10))),
    ("ValueError: x0 is on D but the body is on E",
     lambda tmp: _sim().step(*(torch.zeros(8, 2, dtype=F64, device="meta"),) * 2)),
    ("ValueError: NAME must be positive, got v", lambda tmp: TrainConfig(batch=0).check()),
    ("ValueError: NAME was changed in place (by an optimizer's step?) to T, out of its range: it must be .... Keep it "
     "in range (e.g. optimize its logarithm ...), or assign a valid value", lambda tmp: _changed_in_place("dt")),
    ("ValueError: body.mu must be positive: element i has v", lambda tmp: _changed_in_place("body.mu")),
    ("ValueError: body.NAME has shape S, but the body has K elements: it must be ...",
     lambda tmp: setattr(_body(), "mu", torch.ones(2, dtype=F64))),
    ("ValueError: body.elements has R rows, but the body's per-element fields (Dm_inv, mu, lam) have E: elements can "
     "be reassigned only with as many rows; for another mesh build a new SoftBody",
     lambda tmp: setattr(_body(), "elements", [[0, 1, 4]])),
    ("ValueError: body.muscles has M muscles but body.NAME has K values: assign muscle_rest_length and "
     "muscle_stiffness for the new muscles", lambda tmp: _changed_in_place("muscles")),
    ("ValueError: NAME was changed in place after the body was made from it, but the body's ... computed or "
     "converted from it then and ... not follow: ...", lambda tmp: _changed_in_place("youngs_modulus")),
    ("ValueError: body.rest_positions was changed in place, but the rest shapes (Dm_inv), rest volumes, masses and "
     "muscle rest lengths were derived from it: ...", lambda tmp: _changed_in_place("rest_positions")),
    ("ValueError: body.free was changed in place, but it is the complement of body.fixed: assign body.fixed instead",
     lambda tmp: _changed_in_place("free")),
    ("ValueError: sim.NAME is a copy made by Simulator.to of a tensor that was changed in place since, and does not "
     "follow it: call to() again from the original (or assign sim.NAME)", lambda tmp: _changed_in_place("copy")),
    ("ValueError: sim.colliders[k].heights is a copy made by diffsoft.terrain.height_field of a tensor that was "
     "changed in place since, and does not follow it: ...", lambda tmp: _terrain_changed_inside_on_terrain()),
    ("AttributeError: Simulator.body cannot be reassigned", lambda tmp: setattr(_sim(), "body", _body())),
    ("TypeError: fused must be True or False", lambda tmp: setattr(_sim(), "fused", "no")),
    ("ValueError: vertices has non-finite (NaN or infinite) coordinates: the file would not read back",
     lambda tmp: mesh.write(str(tmp / "m.vtu"), torch.full((3, 2), float("nan")), torch.tensor([[0, 1, 2]]))),
    ("ValueError: save_algovivo: x must be the body's positions (N, 2), one creature, got shape S ...",
     lambda tmp: creatures.save_algovivo(_sim(), str(tmp / "c.json"), x=torch.zeros(2, 8, 2))),
    ("ValueError: NAME: the file would not read back: ...",
     lambda tmp: creatures.save_algovivo(_sim(), str(tmp / "c.json"), x=_sim().rest_state[0] * torch.tensor(
         [-1.0, 1.0], dtype=F64))),
    ("ValueError: activation must have one value per muscle: got K for the body's M muscles",
     lambda tmp: render.render_frame(_sim(), _sim().rest_state[0], torch.ones(5))),
    ("ValueError: x has shape S, but this policy observes (B, N, d): ... A policy belongs to the creature it was made "
     "for ...", lambda tmp: policy.FramePolicy(4, 2, 2, 0, 1)(torch.zeros(1, 8, 2), torch.zeros(1, 8, 2))),
    ("ValueError: PATH is corrupt or not a diffsoft checkpoint...; delete it to start over, or resume from a copy of "
     "the run", lambda tmp: _corrupt_checkpoint(tmp)),
    ("ValueError: PATH lacks key 'pool': an incomplete or hand-edited checkpoint (diffsoft writes ...); delete it to "
     "start over, or resume from a copy of the run", lambda tmp: _checkpoint(tmp, lambda c: c.pop("pool"))),
    ("PATH: key 'iteration' must be an int >= 0, 'history' a list and 'train_seconds' a finite number, got "
     "...", lambda tmp: _checkpoint(tmp, lambda c: c.update(iteration=-5))),
    ("ValueError: PATH: key 'policy.fc1.weight' has non-finite (NaN or infinite) values: a hand-edited or corrupt "
     "checkpoint; delete it to start over, or resume from a copy of the run",
     lambda tmp: _checkpoint(tmp, lambda c: c["policy"]["fc1.weight"].fill_(float("nan")))),
    ("ValueError: PATH: key 'pool.x' must be a finite DTYPE tensor of shape S, got T ...",
     lambda tmp: _checkpoint(tmp, lambda c: c["pool"].update(x=c["pool"]["x"][:1]))),
    ("ValueError: PATH was trained with other settings (NAME=v); resume with the same ones (only iterations, "
     "out_dir, ... may change)", lambda tmp: _checkpoint(tmp, lr=0.1)),
    ("ValueError: PATH was trained on another creature than 'C' is now: its ... differ (the checkpoint records the "
     "creature's content, not its name or path); ...", lambda tmp: _another_creature_at_the_same_path(tmp)),
    ("ValueError: episode (E) must be a multiple of window (W)",
     lambda tmp: TrainConfig(window=30, episode=256).check()),
]


def _raised(trigger, tmp):
    """The exception or warning the trigger raises first: ``(class, message)``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trigger(tmp)
        except Exception as e:  # noqa: BLE001 - what the library raised is what is checked
            return type(e), str(e)
    warned = [w for w in caught if issubclass(w.category, (RuntimeWarning, UserWarning))]
    assert warned, "the misuse raised and warned nothing"
    return warned[0].category, str(warned[0].message)


@pytest.mark.parametrize("quoted, trigger", TRIGGERS, ids=[q[:60] for q, _ in TRIGGERS])
def test_the_quoted_message_is_what_the_library_says(quoted, trigger, tmp_path):
    assert any(quoted in messages for _, messages in _rows()), f"not quoted in docs/errors.md: {quoted}"
    kind, pattern = _pattern(quoted)
    cls, message = _raised(trigger, tmp_path)
    if kind is not None and "/" not in kind:
        assert kind in [c.__name__ for c in cls.__mro__], f"{cls.__name__} raised, the doc says {kind}: {message}"
    assert pattern.search(message), f"the doc quotes {quoted!r}; the library says {message!r}"


def test_every_row_of_the_catalogue_is_triggered():
    triggered = {q for q, _ in TRIGGERS}
    missing = [messages[0] for _, messages in _rows()
               if not triggered & set(messages) and not any(messages[0].startswith(k) for k in UNTRIGGERED)]
    assert not missing, "rows of docs/errors.md that no test raises:\n" + "\n".join(missing)
