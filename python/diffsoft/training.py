"""Neural locomotion controllers trained end to end by backpropagation through the implicit simulator.

The policy is :class:`~diffsoft.policy.FramePolicy` (algovivo's neural frame policy).

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
(algovivo's policy format, see :func:`save_algovivo_policy`), ``history.json``; the command line (:mod:`diffsoft.cli`) adds
``learning_curve.png`` and ``walk.gif``.
"""
import dataclasses
import json
import os
import time
import warnings

import torch
from torch import nn

from .creatures import make_creature
from .policy import FramePolicy, center_of_mass_x, distance_walked, save_algovivo_policy


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


def distributed_world():
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
    rank, world = distributed_world()
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
