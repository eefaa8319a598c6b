"""Neural locomotion controllers trained end to end by backpropagation through the implicit simulator.

The policy is algovivo's (``NeuralFramePolicy``): an MLP ``fc1 -> ReLU -> fc2 -> tanh`` that reads every
vertex's position (relative to a center vertex) and velocity, both rotated into a frame attached to the
body, and outputs a change of each muscle's activation:

    ``a_t = clamp(a_{t-1} + clamp(pi(obs(x_t, v_t)), -max_abs_da, max_abs_da), min_a, 1)``,
    ``(x_{t+1}, v_{t+1}) = sim.step(x_t, v_t, a_t)``,  ``a_{-1} = 1`` (relaxed).

Training maximises the distance the centre of mass travels along +x over a horizon of ``T`` steps, for a
batch of creatures simulated together (each starts from the rest pose with random initial activations, and
exploration noise is added to the activation changes), with Adam on the exact gradient of the rollout.

Long horizons: the rollout is cut into windows of ``window`` steps and the state ``(x, v, a)`` is detached
between them (truncated backpropagation through time). The distance is a sum of per-window progress, so
each window's backward pass gives the gradient of its own progress with the earlier state held fixed;
these are summed into one Adam step per rollout and the gradient norm is clipped. Why: through contact
and clamped activations the Jacobian of a long rollout is a product of many step Jacobians whose norm
grows or shrinks geometrically, so full-horizon gradients are dominated by a few unstable directions (and
need O(T) graph memory), while windows of ~20-40 steps (about 1 s of gait) still see the effect of a
stride. Clipping protects Adam from the rare step where a contact switch makes the gradient spike.

Data-parallel training: under ``torchrun`` (the ``gloo`` backend), each process simulates its slice of the
global batch and gradients are averaged with ``all_reduce``; the initial states and noise of the global
batch come from one generator seeded by (seed, iteration), so any number of processes trains on the same
creatures as one process with the combined batch.

Files (under ``out_dir``): ``checkpoint.pt`` (written every ``checkpoint_every`` iterations and at the end:
policy, Adam state, iteration, history, config; ``resume=True`` continues from it exactly, because every
random number of an iteration is drawn from a generator seeded by that iteration), ``policy.json``
(algovivo's policy format, see :func:`save_algovivo_policy`), ``history.json``, ``learning_curve.png`` and
``walk.gif``.
"""
import argparse
import dataclasses
import json
import math
import os
import sys
import time
import warnings

import torch
from torch import nn

from . import creatures

CREATURES = {"biped": creatures.biped, "quadruped": creatures.quadruped, "worm": creatures.worm,
             "tetrapod": creatures.tetrapod}
"""Procedural creatures by name; any other ``creature`` is read as a file (algovivo's or diffsoft's JSON)."""

POLICY_KEYS = ("fc1", "fc2", "min_a", "max_abs_da", "center_vertex_id", "forward_vertex_id")


def make_creature(creature, dtype=torch.float32):
    """A :class:`~diffsoft.simulator.Simulator` from a name in :data:`CREATURES` or a JSON file path (a file
    with ``"format": "diffsoft.creature"`` is diffsoft's format, any other algovivo's)."""
    if creature in CREATURES:
        return CREATURES[creature](dtype=dtype)
    if not os.path.isfile(creature):
        raise ValueError(f"creature must be one of {sorted(CREATURES)} or a creature JSON file, got {creature!r}")
    with open(creature) as f:
        try:
            is_ours = json.load(f).get("format") == creatures.FORMAT
        except (json.JSONDecodeError, AttributeError):
            is_ours = False
    return creatures.load(creature, dtype=dtype) if is_ours else creatures.load_algovivo(creature, dtype=dtype)


def frame_vertices(sim):
    """``(center_vertex_id, forward_vertex_id)`` for a body facing +x: the vertex nearest the rest pose's
    centroid, and the vertex nearest the point at the body's front (max x) level with that center."""
    x = sim.body.rest_positions.detach()
    center = int((x - x.mean(0)).norm(dim=1).argmin())
    front = x[center].clone()
    front[0] = x[:, 0].max()
    forward = int((x - front).norm(dim=1).argmin())
    if forward == center:
        raise ValueError("the body is too small to pick distinct center and forward vertices")
    return center, forward


def body_frame(x, center_vertex_id, forward_vertex_id):
    """The frame attached to the body, as algovivo's ``frame_projection`` defines it in 2D.

    Args:
        x: ``(B, N, d)`` positions.

    Returns:
        ``origin (B, d)`` (the center vertex) and ``R (B, d, d)`` whose rows are the frame's axes: the unit
        vector from the center to the forward vertex, then (2D) its counterclockwise normal, or (3D) the
        world's up (+y) made orthogonal to it and their cross product.
    """
    origin = x[:, center_vertex_id]
    e1 = x[:, forward_vertex_id] - origin
    e1 = e1 / e1.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    if x.shape[-1] == 2:
        e2 = torch.stack([-e1[:, 1], e1[:, 0]], dim=-1)
        return origin, torch.stack([e1, e2], dim=1)
    up = torch.zeros_like(e1)
    up[:, 1] = 1.0
    e2 = up - (up * e1).sum(-1, keepdim=True) * e1
    e2 = e2 / e2.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return origin, torch.stack([e1, e2, torch.cross(e1, e2, dim=-1)], dim=1)


def observe(x, v, center_vertex_id, forward_vertex_id):
    """algovivo's policy input: ``(B, 2 N d)``, every vertex's position relative to the center vertex in the
    body frame (vertex-major, ``[p0x, p0y, p1x, ...]``), then every vertex's velocity in that frame.
    x, v: ``(B, N, d)``."""
    origin, R = body_frame(x, center_vertex_id, forward_vertex_id)
    p = (x - origin[:, None]) @ R.transpose(1, 2)
    u = v @ R.transpose(1, 2)
    return torch.cat([p.flatten(1), u.flatten(1)], dim=1)


class FramePolicy(nn.Module):
    """algovivo's neural frame policy: ``da = tanh(fc2(relu(fc1(obs))))`` on :func:`observe`'s input.

    Args:
        num_vertices, num_muscles, dim: the body's sizes (``fc1`` takes ``2 * dim * num_vertices`` inputs).
        center_vertex_id, forward_vertex_id: the body frame (see :func:`body_frame`).
        hidden: the hidden layer's width (algovivo: 32).
        min_a, max_abs_da: activations are kept in ``[min_a, 1]``; each step changes them by at most
            ``max_abs_da``.
    """

    def __init__(self, num_vertices, num_muscles, dim, center_vertex_id, forward_vertex_id, hidden=32,
                 min_a=0.25, max_abs_da=0.3):
        super().__init__()
        if not 0 < min_a < 1:
            raise ValueError(f"min_a must be in (0, 1), got {min_a!r}")
        if not max_abs_da > 0:
            raise ValueError(f"max_abs_da must be positive, got {max_abs_da!r}")
        for name, i in (("center_vertex_id", center_vertex_id), ("forward_vertex_id", forward_vertex_id)):
            if not (isinstance(i, int) and 0 <= i < num_vertices):
                raise ValueError(f"{name} must be a vertex index in [0, {num_vertices}), got {i!r}")
        if center_vertex_id == forward_vertex_id:
            raise ValueError("center_vertex_id and forward_vertex_id must differ (they define the frame)")
        self.num_vertices, self.num_muscles, self.dim = num_vertices, num_muscles, dim
        self.center_vertex_id, self.forward_vertex_id = center_vertex_id, forward_vertex_id
        self.min_a, self.max_abs_da = float(min_a), float(max_abs_da)
        self.fc1 = nn.Linear(2 * dim * num_vertices, hidden)
        self.fc2 = nn.Linear(hidden, num_muscles)

    @classmethod
    def for_simulator(cls, sim, **kw):
        """A policy sized for ``sim``'s body, with :func:`frame_vertices` unless given."""
        b = sim.body
        if "center_vertex_id" not in kw or "forward_vertex_id" not in kw:
            kw["center_vertex_id"], kw["forward_vertex_id"] = frame_vertices(sim)
        return cls(b.num_vertices, b.num_muscles, b.dim, **kw).to(b.dtype)

    def forward(self, x, v):
        """The raw activation change ``tanh(...)``: ``(B, M)`` from x, v ``(B, N, d)``."""
        obs = observe(x, v, self.center_vertex_id, self.forward_vertex_id)
        return torch.tanh(self.fc2(torch.relu(self.fc1(obs))))

    def act(self, x, v, a, noise=None):
        """The next activation ``(B, M)`` from the previous one ``a`` (B, M); ``noise`` (B, M) is added to
        the activation change before clamping (exploration, as algovivo's stochastic policy does)."""
        return self.update(a, self(x, v), noise)

    def update(self, a, da, noise=None, straight_through=False):
        """``clamp(a + clamp(da + noise, -max_abs_da, max_abs_da), min_a, 1)``: (B, M) each.

        ``straight_through``: the same values, but the clamps pass gradients as if they were not there (see
        :class:`TrainConfig`)."""
        if noise is not None:
            da = da + noise
        clamp = _straight_through_clamp if straight_through else torch.clamp
        return clamp(a + clamp(da, -self.max_abs_da, self.max_abs_da), self.min_a, 1.0)


def _straight_through_clamp(x, lo, hi):
    """``clamp(x, lo, hi)`` in the forward pass, the identity in the backward pass."""
    return x + (x.clamp(lo, hi) - x).detach()


def save_algovivo_policy(policy, path):
    """Writes ``policy`` in algovivo's policy JSON: ``fc1`` and ``fc2`` as ``{"weight": [[...]] (out, in),
    "bias": [...]}``, ``min_a``, ``max_abs_da``, ``center_vertex_id``, ``forward_vertex_id``; and
    ``space_dim`` (algovivo ignores it; 3 marks a 3D policy, which algovivo cannot run)."""
    data = {name: {"weight": getattr(policy, name).weight.detach().cpu().double().tolist(),
                   "bias": getattr(policy, name).bias.detach().cpu().double().tolist()} for name in ("fc1", "fc2")}
    data.update(min_a=policy.min_a, max_abs_da=policy.max_abs_da, center_vertex_id=policy.center_vertex_id,
                forward_vertex_id=policy.forward_vertex_id, space_dim=policy.dim)
    with open(path, "w") as f:
        json.dump(data, f)


def load_algovivo_policy(path, dtype=torch.float32):
    """Reads a policy in algovivo's JSON (see :func:`save_algovivo_policy`) into a :class:`FramePolicy`.
    Sizes come from the weights: ``fc1.weight`` is ``(hidden, 2 d N)``, ``fc2.weight`` ``(M, hidden)``; a
    malformed file raises ValueError naming the key."""
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
    missing = [k for k in POLICY_KEYS if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{path}: missing key '{missing[0]}' (an algovivo policy has {', '.join(POLICY_KEYS)})")
    layers = {}
    for name in ("fc1", "fc2"):
        try:
            w = torch.tensor(data[name]["weight"], dtype=torch.float64)
            b = torch.tensor(data[name]["bias"], dtype=torch.float64)
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{path}: key '{name}' must be {{'weight': [[...]], 'bias': [...]}}") from None
        if w.dim() != 2 or b.shape != (w.shape[0],):
            raise ValueError(f"{path}: key '{name}' must have weight (out, in) and bias (out,), got "
                             f"{tuple(w.shape)} and {tuple(b.shape)}")
        layers[name] = (w, b)
    (w1, b1), (w2, b2) = layers["fc1"], layers["fc2"]
    if w2.shape[1] != w1.shape[0]:
        raise ValueError(f"{path}: fc2 takes {w2.shape[1]} inputs but fc1 has {w1.shape[0]} outputs")
    dim = int(data.get("space_dim", 2))
    if dim not in (2, 3) or w1.shape[1] % (2 * dim):
        raise ValueError(f"{path}: fc1 takes {w1.shape[1]} inputs, not 2 * space_dim * num_vertices "
                         f"with space_dim {dim}")
    policy = FramePolicy(w1.shape[1] // (2 * dim), w2.shape[0], dim, data["center_vertex_id"],
                         data["forward_vertex_id"], hidden=w1.shape[0], min_a=data["min_a"],
                         max_abs_da=data["max_abs_da"])
    with torch.no_grad():
        for name, (w, b) in layers.items():
            getattr(policy, name).weight.copy_(w)
            getattr(policy, name).bias.copy_(b)
    return policy.to(dtype)


def center_of_mass_x(sim, x):
    """The mass-weighted mean of the vertices' x coordinates: ``(..., N, d)`` -> ``(...)``."""
    m = sim.body.mass
    return (x[..., 0] * m).sum(-1) / m.sum()


def run_policy(sim, policy, steps, batch=None, a0=None, noise=None):
    """A rollout of ``policy`` from the rest pose, without gradients.

    Args:
        batch: number of creatures (default 1); a0: ``(B, M)`` initial activations (default relaxed, 1);
        noise: ``(T, B, M)`` added to the activation changes, or None.

    Returns:
        ``xs (T + 1, B, N, d)``, ``activations (T, B, M)``.
    """
    b = 1 if batch is None else batch
    x, v = sim.rest_state
    x, v = x.expand(b, -1, -1).clone(), v.expand(b, -1, -1).clone()
    a = torch.ones(b, sim.body.num_muscles, dtype=x.dtype) if a0 is None else a0
    xs, acts = [x], []
    with torch.no_grad():
        for t in range(steps):
            a = policy.act(x, v, a, None if noise is None else noise[t])
            x, v = sim.step(x, v, a)
            xs.append(x)
            acts.append(a)
    return torch.stack(xs), torch.stack(acts)


def distance_walked(sim, policy, steps):
    """How far the centre of mass of one creature moves along +x in ``steps`` steps of the deterministic
    policy from the rest pose (relaxed muscles)."""
    xs, _ = run_policy(sim, policy, steps)
    return (center_of_mass_x(sim, xs[-1]) - center_of_mass_x(sim, xs[0])).item()


@dataclasses.dataclass
class TrainConfig:
    """Everything a training run depends on (stored in its checkpoint).

    creature: a name in :data:`CREATURES` or a creature file; horizon: steps per rollout (T); window: steps
    per truncated-backprop window; batch: creatures per rollout, over all processes; iterations: Adam steps
    (one per rollout); lr, clip: Adam's learning rate and the gradient-norm clip; hidden, min_a, max_abs_da:
    the policy (algovivo's 32, 0.25, 0.3); init_activation: initial activations are drawn uniformly from
    ``[1 - init_activation, 1]``; action_noise: std of the Gaussian noise on activation changes;
    saturation_penalty: weight of ``sum_t sum_i max(|da_i| - max_abs_da, 0)^2``, which keeps the policy's
    outputs where the clamp at ``max_abs_da`` does not cut their gradient to zero;
    eval_every, eval_horizon: how often to measure :func:`distance_walked` (deterministic, from rest) and
    over how many steps (default ``horizon``); backward_rtol: the adjoint solve's relative tolerance (loose
    is enough for a stochastic gradient and halves the backward's cost); dtype: ``"float32"`` or
    ``"float64"``; seed; out_dir; checkpoint_every.
    """
    creature: str = "biped"
    horizon: int = 100
    window: int = 25
    batch: int = 16
    iterations: int = 100
    lr: float = 3e-3
    clip: float = 1.0
    hidden: int = 32
    min_a: float = 0.25
    max_abs_da: float = 0.3
    init_activation: float = 0.3
    action_noise: float = 0.05
    saturation_penalty: float = 1.0
    straight_through: bool = False
    eval_every: int = 5
    eval_horizon: int = 0
    backward_rtol: float = 1e-4
    dtype: str = "float32"
    seed: int = 0
    out_dir: str = "runs/biped"
    checkpoint_every: int = 5
    on_failure: str = "skip"

    # Fields that may change between a run and its resumption.
    RESUMABLE = ("iterations", "out_dir", "checkpoint_every", "eval_every", "on_failure")

    def check(self):
        for name in ("horizon", "window", "batch", "iterations", "hidden", "checkpoint_every", "eval_every"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= (0 if name == "iterations" else 1)):
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")
        for name in ("lr", "clip", "backward_rtol"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.on_failure not in ("skip", "stop"):
            raise ValueError(f"on_failure must be 'skip' or 'stop', got {self.on_failure!r}")
        if not 0 <= self.init_activation <= 1 - self.min_a:
            raise ValueError(f"init_activation must be in [0, 1 - min_a], got {self.init_activation!r}")


def _world():
    """``(rank, world_size)``; joins the gloo process group when launched by torchrun."""
    import torch.distributed as dist
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce_mean(tensors, world):
    if world > 1:
        import torch.distributed as dist
        for t in tensors:
            dist.all_reduce(t)
            t.div_(world)


def _episode_start(cfg, sim, iteration, rank, world):
    """This process's slice of the iteration's global batch: initial activations ``(b, M)`` and noise
    ``(T, b, M)``, drawn from a generator seeded by (seed, iteration) so that resuming, or splitting the batch
    over processes, sees the same creatures."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + iteration)
    m, dtype = sim.body.num_muscles, sim.body.dtype
    a0 = 1.0 - cfg.init_activation * torch.rand(cfg.batch, m, generator=g, dtype=torch.float64)
    noise = cfg.action_noise * torch.randn(cfg.horizon, cfg.batch, m, generator=g, dtype=torch.float64)
    b = cfg.batch // world
    part = slice(rank * b, (rank + 1) * b)
    return a0[part].to(dtype), noise[:, part].to(dtype)


class SimulationFailure(RuntimeError):
    """The simulator did not converge inside a training rollout (``on_failure="stop"``); the message says
    which iteration, step and creatures, and by which criterion."""


def _step(cfg, sim, x, v, a, iteration, t, rank, ok, failures):
    """``sim.step`` in a rollout. A creature whose step did not converge is reported (iteration, step,
    creature, criterion); with ``on_failure="skip"`` it is dropped from this iteration's loss (its implicit
    gradient would be wrong; the other creatures' are not affected), with ``"stop"`` the rollout stops."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # reported below, with the context a warning lacks
        x, v, info = sim.step(x, v, a, return_info=True)
    if not info.converged:
        first = rank * ok.shape[0]
        bad = [first + i for i, c in enumerate(info.problem_converged) if not c]
        where = f"iteration {iteration}, step {t}, creature(s) {bad}: {info.message}"
        if cfg.on_failure == "stop":
            raise SimulationFailure(f"the simulator did not converge at {where}")
        failures.append(where)
        ok[[i - first for i in bad]] = False
    return x, v


def train_iteration(cfg, sim, policy, optimizer, iteration, rank=0, world=1, failures=None):
    """One rollout of this process's creatures with truncated-backprop windows, gradients averaged over
    processes and clipped, one Adam step. Returns the global batch's mean distance along +x and the
    gradient norm before clipping. Steps that did not converge are appended to ``failures`` (see
    ``TrainConfig.on_failure``)."""
    failures = [] if failures is None else failures
    a, noise = _episode_start(cfg, sim, iteration, rank, world)
    b = a.shape[0]
    ok = torch.ones(b, dtype=torch.bool)
    x, v = sim.rest_state
    x, v = x.expand(b, -1, -1).clone(), v.expand(b, -1, -1).clone()
    optimizer.zero_grad()
    start = center_of_mass_x(sim, x)
    for t0 in range(0, cfg.horizon, cfg.window):
        x, v, a = x.detach(), v.detach(), a.detach()
        x_begin = center_of_mass_x(sim, x)
        saturation = 0.0
        for t in range(t0, min(t0 + cfg.window, cfg.horizon)):
            da = policy(x, v)
            target = a + da
            saturation = saturation + ((da.abs() - policy.max_abs_da).clamp_min(0).square()
                                       + (target - 1).clamp_min(0).square()
                                       + (policy.min_a - target).clamp_min(0).square()).sum(-1)
            a = policy.update(a, da, noise[t], cfg.straight_through)
            x, v = _step(cfg, sim, x, v, a, iteration, t, rank, ok, failures)
        progress = center_of_mass_x(sim, x) - x_begin
        ((cfg.saturation_penalty * saturation - progress) * ok).sum().div(b).backward()
    params = [p for p in policy.parameters()]
    distance = (center_of_mass_x(sim, x.detach()) - start).mean().reshape(1)
    _all_reduce_mean([p.grad for p in params] + [distance], world)
    grad_norm = nn.utils.clip_grad_norm_(params, cfg.clip)
    optimizer.step()
    return distance.item(), float(grad_norm)


def _save_checkpoint(path, cfg, policy, optimizer, iteration, history, train_seconds):
    tmp = path + ".tmp"
    torch.save({"version": 1, "config": dataclasses.asdict(cfg), "iteration": iteration,
                "policy": policy.state_dict(), "optimizer": optimizer.state_dict(), "history": history,
                "train_seconds": train_seconds,
                "frame": [policy.center_vertex_id, policy.forward_vertex_id]}, tmp)
    os.replace(tmp, path)  # an interrupted write never leaves a truncated checkpoint


def _load_checkpoint(path, cfg):
    ckpt = torch.load(path, map_location="cpu")
    stored = ckpt["config"]
    differ = [k for k, v in dataclasses.asdict(cfg).items() if k not in TrainConfig.RESUMABLE and stored.get(k) != v]
    if differ:
        raise ValueError(f"{path} was trained with other settings ({', '.join(f'{k}={stored.get(k)!r}' for k in differ)}"
                         f"); resume with the same ones (only {', '.join(TrainConfig.RESUMABLE)} may change)")
    return ckpt


def train(cfg, resume=False, progress=True, log=print):
    """Trains a policy (see the module docstring) and writes the run's files under ``cfg.out_dir`` (the
    process of rank 0 writes).

    Returns:
        ``(policy, history)``; history is a list of per-iteration records: ``iteration``, ``distance`` (the
        training batch's mean distance along +x over the horizon), ``grad_norm``, ``sim_steps`` (creature-
        steps simulated so far, all processes, evaluation excluded), ``seconds`` (training wall time so far)
        and, every ``eval_every`` iterations, ``eval_distance`` (:func:`distance_walked` before the update) at
        ``eval_sim_steps``.
    """
    cfg.check()
    rank, world = _world()
    if cfg.batch % world:
        raise ValueError(f"batch ({cfg.batch}) must be divisible by the number of processes ({world})")
    dtype = getattr(torch, cfg.dtype)
    sim = make_creature(cfg.creature, dtype)
    sim.solver_options["backward_rtol"] = cfg.backward_rtol
    torch.manual_seed(cfg.seed)
    policy = FramePolicy.for_simulator(sim, hidden=cfg.hidden, min_a=cfg.min_a, max_abs_da=cfg.max_abs_da)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    eval_horizon = cfg.eval_horizon or cfg.horizon
    ckpt_path = os.path.join(cfg.out_dir, "checkpoint.pt")
    history, start, train_seconds = [], 0, 0.0
    if resume and os.path.exists(ckpt_path):
        ckpt = _load_checkpoint(ckpt_path, cfg)
        policy.load_state_dict(ckpt["policy"])
        optimizer.load_state_dict(ckpt["optimizer"])
        history, start, train_seconds = ckpt["history"], ckpt["iteration"], ckpt["train_seconds"]
        if rank == 0:
            log(f"resumed from {ckpt_path} at iteration {start}")
    elif world > 1:
        import torch.distributed as dist
        for p in policy.parameters():
            dist.broadcast(p.data, 0)
    if rank == 0:
        os.makedirs(cfg.out_dir, exist_ok=True)
    bar = range(start, cfg.iterations)
    if progress and rank == 0:
        from tqdm import tqdm
        bar = tqdm(bar, initial=start, total=cfg.iterations, desc="train", unit="it", dynamic_ncols=True)
    for it in bar:
        record = {"iteration": it}
        if it % cfg.eval_every == 0:
            record["eval_distance"] = distance_walked(sim, policy, eval_horizon)
            record["eval_sim_steps"] = it * cfg.batch * cfg.horizon
        t = time.perf_counter()
        failures = []
        try:
            record["distance"], record["grad_norm"] = train_iteration(cfg, sim, policy, optimizer, it, rank, world,
                                                                      failures)
        except SimulationFailure as e:  # stop, keeping every finished iteration
            if rank == 0:
                _save_checkpoint(ckpt_path, cfg, policy, optimizer, it, history, train_seconds)
            raise SimulationFailure(f"{e}; the checkpoint {ckpt_path} holds the {it} finished iterations "
                                    f"(resume with --resume)") from e
        if failures:
            record["failures"] = failures
            if rank == 0:
                log(f"skipped non-converged steps: {'; '.join(failures)}")
        train_seconds += time.perf_counter() - t
        record["sim_steps"] = (it + 1) * cfg.batch * cfg.horizon
        record["seconds"] = train_seconds
        history.append(record)
        if progress and rank == 0:
            bar.set_postfix(distance=f"{record['distance']:.3f}", grad=f"{record['grad_norm']:.2g}")
        if rank == 0 and ((it + 1) % cfg.checkpoint_every == 0 or it + 1 == cfg.iterations):
            _save_checkpoint(ckpt_path, cfg, policy, optimizer, it + 1, history, train_seconds)
    if rank == 0:
        save_algovivo_policy(policy, os.path.join(cfg.out_dir, "policy.json"))
        with open(os.path.join(cfg.out_dir, "history.json"), "w") as f:
            json.dump({"config": dataclasses.asdict(cfg), "history": history}, f, indent=1)
    return policy, history


def plot_learning_curve(history, path, title=None):
    """A PNG of the training batch's distance (and the deterministic evaluation's) against simulated
    creature-steps."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["sim_steps"] for r in history], [r["distance"] for r in history], label="training batch (mean)")
    ev = [r for r in history if "eval_distance" in r]
    if ev:
        ax.plot([r["eval_sim_steps"] for r in ev], [r["eval_distance"] for r in ev], "o-",
                label="deterministic, from rest")
    ax.set_xlabel("simulated creature-steps")
    ax.set_ylabel("distance along +x")
    ax.set_title(title or "learning curve")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def render_policy(sim, policy, steps, path, every=2):
    """A GIF of one creature running ``policy`` from rest for ``steps`` steps."""
    from .render import render_rollout
    xs, acts = run_policy(sim, policy, steps)
    render_rollout(sim, xs[:, 0], acts[:, 0], gif=path, every=every)


QUICK = dict(horizon=100, window=20, batch=8, iterations=60, lr=3e-3, eval_every=10, checkpoint_every=5)
"""``--quick``: sized to train the biped in about 1.5 minutes on 2 cores."""


def _boolean(text):
    if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1", "yes")


def main(argv=None):
    """Command line: ``python -m diffsoft.training --help`` (also ``examples/locomotion.py``)."""
    p = argparse.ArgumentParser(description="Train a neural locomotion controller by backpropagation through "
                                            "the implicit simulator.")
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        kind = type(getattr(defaults, f.name))
        p.add_argument("--" + f.name.replace("_", "-"), type=_boolean if kind is bool else kind, default=None,
                       help=f"default {getattr(defaults, f.name)!r}" + (f" ({QUICK[f.name]!r} with --quick)"
                                                                        if f.name in QUICK else ""))
    p.add_argument("--quick", action="store_true", help="a short run: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    p.add_argument("--resume", action="store_true", help="continue from out_dir/checkpoint.pt if it exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per process")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    values = dict(QUICK) if args.quick else {}
    if args.creature is not None and args.out_dir is None:
        values["out_dir"] = os.path.join("runs", os.path.splitext(os.path.basename(args.creature))[0])
    values.update({f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                   if getattr(args, f.name) is not None})
    cfg = TrainConfig(**values)
    rank, _ = _world()
    t0 = time.perf_counter()
    sim = make_creature(cfg.creature, getattr(torch, cfg.dtype))
    eval_horizon = cfg.eval_horizon or cfg.horizon
    policy, history = train(cfg, resume=args.resume, progress=not args.no_progress)
    if rank != 0:
        return
    torch.manual_seed(cfg.seed)
    initial = FramePolicy.for_simulator(sim, hidden=cfg.hidden, min_a=cfg.min_a, max_abs_da=cfg.max_abs_da)
    before = distance_walked(sim, initial, eval_horizon)
    after = distance_walked(sim, policy, eval_horizon)
    plot_learning_curve(history, os.path.join(cfg.out_dir, "learning_curve.png"),
                        f"{cfg.creature}: batch {cfg.batch}, horizon {cfg.horizon}, window {cfg.window}")
    render_policy(sim, policy, max(eval_horizon, 100), os.path.join(cfg.out_dir, "walk.gif"))
    steps = history[-1]["sim_steps"] if history else 0
    print(f"distance walked along +x in {eval_horizon} steps ({eval_horizon * sim.dt:.2f} s): "
          f"before training {before:.3f}, after training {after:.3f}")
    print(f"{len(history)} iterations, {steps} simulated creature-steps, training {history[-1]['seconds'] if history else 0:.0f} s, "
          f"total {time.perf_counter() - t0:.0f} s; outputs in {cfg.out_dir}/ (checkpoint.pt, policy.json, "
          f"history.json, learning_curve.png, walk.gif)")


if __name__ == "__main__":
    sys.exit(main())
