"""Proximal policy optimisation (PPO) on the same locomotion task, with the simulator as a black box.

The baseline for :mod:`diffsoft.training`: same creature, same observations, action bounds and reward (the
centre of mass's progress along +x, per step, so an episode's return is its distance), all from
:class:`~diffsoft.task.LocomotionTask`, and the same evaluation (the deterministic policy, from rest). The
learning signal differs: sampled returns instead of the rollout's gradient (the simulator runs under
``torch.no_grad``); and PPO's episodes are ``horizon`` steps from rest, while the differentiable trainer's
creatures continue across its windows.

The policy is Gaussian, ``u ~ N(mu(obs), diag(sigma^2))``, with ``mu`` the same MLP as
:class:`~diffsoft.policy.FramePolicy` (``fc1 -> ReLU -> fc2 -> tanh``) on normalised observations (running
mean and variance) and a state-independent learned ``log sigma``; the environment clamps ``u`` as it clamps
the deterministic policy's output. Where the trainer's policy is mirrored (:func:`~diffsoft.policy.mirrors`: the
tetrapod), so is PPO's: its mean and ``log sigma`` are symmetric as :class:`~diffsoft.policy.FramePolicy`'s mirrored
output is, so that both methods learn within the same family of policies. PPO's clipped surrogate objective with generalised advantage estimation
(GAE), a separate value MLP, advantage normalisation, and gradient-norm clipping (Schulman et al. 2017).
"""
import dataclasses
import time
import warnings
from typing import Optional

import torch
from torch import nn

from ._checks import check_fields
from ._optional import require
from .creatures import check_device, make_creature
from .policy import FramePolicy, distance_covered, mirrors, observe
from .task import LocomotionTask


LOG_STD_RANGE = (-20.0, 2.0)
"""Where the Gaussian policy's log standard deviation is kept: below, float32's exp underflows to a standard
deviation of 0; above, the actions are noise."""


@dataclasses.dataclass
class PPOConfig:
    """creature, min_a (None: the creature's), max_abs_da, hidden: as in :class:`~diffsoft.training.TrainConfig`;
    horizon: the episode length (every episode starts at rest) and the evaluation's steps; envs: creatures
    simulated together; steps: the budget in simulated creature-steps (whole updates of envs x horizon, at least
    one: rounded down); epochs, minibatch: passes and minibatch size per update; lr; gamma, lam:
    discount and GAE parameter; clip_ratio; value_coef; entropy_coef; max_grad_norm; init_log_std;
    reward_scale: rewards are multiplied by it (progress per step is ~1e-3); eval_every: evaluate the mean
    action every that many updates; mirror: the actor is mirrored (:class:`~diffsoft.policy.Mirror`), None:
    wherever the trainer's is (:func:`~diffsoft.policy.mirrors`: a symmetric 3D body); dtype; device: where the
    creatures, the simulator and the networks live (random numbers are drawn on the CPU and moved); seed.

    :func:`train_ppo` builds the task from creature, dtype, device, horizon, min_a and max_abs_da. The building
    blocks (:class:`GaussianFramePolicy`, :func:`collect`) take a task instead, and refuse a config whose
    horizon, min_a, max_abs_da or dtype differ from the task's; they do not read creature or device (the task's
    creature is used, whatever its name or file)."""
    creature: str = "biped"
    horizon: int = 100
    envs: int = 32
    steps: int = 400_000
    hidden: int = 32
    value_hidden: int = 64
    min_a: Optional[float] = None
    max_abs_da: float = 0.3
    epochs: int = 10
    minibatch: int = 400
    lr: float = 3e-4
    gamma: float = 0.99
    lam: float = 0.95
    clip_ratio: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.0
    max_grad_norm: float = 0.5
    init_log_std: float = -1.5
    reward_scale: float = 100.0
    eval_every: int = 2
    mirror: Optional[bool] = None
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0

    def check(self):
        """Every field's type and range, each error naming the field: called before anything is built."""
        check_fields(self, dict(
            horizon=">0", envs=">0", steps=">0", hidden=">0", value_hidden=">0", min_a="min_a", max_abs_da=">0",
            epochs=">0", minibatch=">0", lr=">0", gamma="[0,1]", lam="[0,1]", clip_ratio="(0,1)", value_coef=">=0",
            entropy_coef=">=0", max_grad_norm=">0", reward_scale=">0", eval_every=">0",
            dtype=("float32", "float64"), seed="seed"))
        if self.horizon >= 2 ** 63:
            raise ValueError(f"horizon must be a positive integer below 2**63 (the episode length in steps), got "
                             f"{self.horizon!r}")
        if not LOG_STD_RANGE[0] <= self.init_log_std <= LOG_STD_RANGE[1]:
            raise ValueError(f"init_log_std must be in [{LOG_STD_RANGE[0]}, {LOG_STD_RANGE[1]}] (the Gaussian's "
                             f"log standard deviation, kept there in training), got {self.init_log_std!r}")
        if self.envs * self.horizon < 2:
            raise ValueError(f"envs * horizon must be at least 2 (the advantages are normalised by their standard "
                             f"deviation), got envs={self.envs}, horizon={self.horizon}")
        check_device(self.device)


class RunningNorm(nn.Module):
    """Observation normalisation by a running mean and variance (parallel Welford updates)."""

    def __init__(self, size, clip=10.0):
        super().__init__()
        self.register_buffer("mean", torch.zeros(size, dtype=torch.float64))
        self.register_buffer("var", torch.ones(size, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip = clip

    def update(self, x):
        """x: ``(K, size)``."""
        x = x.detach().double()
        n, mean, var = x.shape[0], x.mean(0), x.var(0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        self.var = (self.var * self.count + var * n + delta ** 2 * self.count * n / total) / total
        self.mean = self.mean + delta * n / total
        self.count = total

    def forward(self, x):
        """``x`` normalised by the running mean and variance, clipped to ``[-clip, clip]``."""
        z = (x - self.mean.to(x.dtype)) / (self.var.to(x.dtype) + 1e-8).sqrt()
        return z.clamp(-self.clip, self.clip)


class GaussianFramePolicy(nn.Module):
    """The actor (a :class:`~diffsoft.policy.FramePolicy`-shaped mean on normalised observations, and a
    learned log standard deviation) and the critic (an MLP on the same normalised observations).

    Its input (:meth:`inputs`) is the task's observation and, for a mirrored actor, the mirrored state's after
    it: the mean is then, as :meth:`FramePolicy.changes <diffsoft.policy.FramePolicy.changes>` makes it, the
    average of the network's output on the state and, mirrored back, on the mirrored state; ``log sigma`` the
    average of itself and its mirror image. The critic reads the observation alone.

    It is built for the task's creature, in its dtype (``cfg.dtype`` must be the same); ``cfg.creature`` is
    :func:`train_ppo`'s alone."""

    def __init__(self, task, cfg):
        super().__init__()
        cfg.check()  # (train_ppo checks too; a model built here gets the same names for its settings)
        _check_task(task, cfg, ("max_abs_da", "min_a", "dtype"))  # (the actor's; the horizon is collect's)
        sim = task.sim
        mirror = mirrors(sim) if cfg.mirror is None else cfg.mirror
        if mirror and not task.steered:
            raise ValueError("mirror=True: a mirrored actor reads a heading (its mirror image turns it), and PPO's "
                             "reads one in 3D only")
        self.mean_policy = FramePolicy.for_simulator(sim, hidden=cfg.hidden, min_a=task.min_a,
                                                     max_abs_da=task.max_abs_da,
                                                     center_vertex_id=task.center_vertex_id,
                                                     forward_vertex_id=task.forward_vertex_id,
                                                     steered=task.steered, mirror=mirror)
        self.num_observations = task.num_observations
        self.norm = RunningNorm(self.num_observations)
        self.log_std = nn.Parameter(torch.full((sim.body.num_muscles,), cfg.init_log_std, dtype=sim.body.dtype))
        self.value = nn.Sequential(nn.Linear(self.num_observations, cfg.value_hidden), nn.Tanh(),
                                   nn.Linear(cfg.value_hidden, cfg.value_hidden), nn.Tanh(),
                                   nn.Linear(cfg.value_hidden, 1)).to(sim.body.dtype)

    @property
    def mirrored(self):
        """Whether the actor is mirrored (:class:`~diffsoft.policy.Mirror`)."""
        return self.mean_policy.mirror is not None

    def inputs(self, task, state):
        """The model's input for the task's ``state``: its observation ``(B, n_obs)``, followed for a mirrored
        actor by the mirrored state's observation (``(B, 2 n_obs)``)."""
        obs = task.observe(state)
        if not self.mirrored:
            return obs
        heading = state.x.new_zeros(state.x.shape[0])  # the task's command: +x
        x, v, heading = self.mean_policy.mirror.state(state.x, state.v, heading)
        return torch.cat([obs, observe(x, v, task.center_vertex_id, task.forward_vertex_id, heading)], 1)

    def distribution(self, inputs):
        """``N(mu, sigma)`` over activation changes and the value, from :meth:`inputs` ``(K, n_obs)`` (``(K, 2
        n_obs)`` for a mirrored actor); a ValueError for another shape."""
        n = self.num_observations
        width = 2 * n if self.mirrored else n
        if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2 or inputs.shape[1] != width:
            want = "(K, 2 n_obs), the observation and the mirrored state's" if self.mirrored else "(K, n_obs)"
            got = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
            raise ValueError(f"inputs must have shape {want}, n_obs = {n}, got {got}: make them with "
                             f"GaussianFramePolicy.inputs(task, state) (from an environment of diffsoft.envs: "
                             f"model.inputs(env.task, env.state))")
        z = self.norm(inputs[:, :n])
        p = self.mean_policy
        mu, log_std = p.head(z), self.log_std
        if self.mirrored:
            image = torch.tensor(p.mirror.muscles, device=mu.device)
            mu = 0.5 * (mu + p.head(self.norm(inputs[:, n:]))[:, image])
            log_std = 0.5 * (log_std + log_std[image])
        std = log_std.clamp(*LOG_STD_RANGE).exp()  # (a large learning rate may push it past either end)
        return torch.distributions.Normal(mu, std.expand_as(mu)), self.value(z).squeeze(-1)

    def update_norm(self, inputs):
        """The observation normaliser's statistics updated with :meth:`inputs` ``(K, ...)`` (a mirrored
        actor's mirrored observations too: it normalises both)."""
        self.norm.update(inputs.reshape(-1, self.num_observations))


def mean_action(model):
    """The model's deterministic policy as a function of its input (:meth:`GaussianFramePolicy.inputs`): its mean
    activation change."""
    return lambda inputs: model.distribution(inputs)[0].mean


def rollout(task, model, steps):
    """Positions ``(steps + 1, N, d)`` of one creature running the model's mean action from rest
    (:meth:`~diffsoft.task.LocomotionTask.rollout`)."""
    return task.rollout(mean_action(model), steps, observe=lambda state: model.inputs(task, state))


def evaluate(task, model):
    """Distance along +x of one creature running the mean action from rest for the task's horizon (as
    :func:`~diffsoft.policy.distance_walked`)."""
    return distance_covered(task.sim, rollout(task, model, task.horizon)).item()


def _check_task(task, cfg, names=("horizon", "max_abs_da", "min_a", "dtype")):
    """A ValueError naming the first of ``cfg``'s task settings ``names`` that the task does not have: the
    task's would be used, quietly. (Not ``creature``: a task's creature may come from a file or be made by hand,
    and has no name to compare.)"""
    for name in names:
        if name == "dtype":
            want, have = cfg.dtype, str(task.sim.body.dtype).replace("torch.", "")
            fix = "build the task's creature in the config's dtype (make_creature(name, getattr(torch, cfg.dtype)))"
        else:
            want, have = getattr(cfg, name), getattr(task, name)
            fix = ("make the task with the config's settings (LocomotionTask(sim, cfg.horizon, cfg.min_a, "
                   "cfg.max_abs_da))")
        if want is not None and want != have:
            raise ValueError(f"PPOConfig.{name} is {want!r} but the task's is {have!r}: {fix}")


def collect(task, model, cfg, generator):
    """One batch of ``cfg.envs`` episodes of the task (``horizon`` steps from rest). Returns a dict of
    ``(T, E, ...)`` tensors: obs (the model's :meth:`~GaussianFramePolicy.inputs`), u (sampled actions), logp, value, reward (the task's, times
    ``cfg.reward_scale``); and the last value ``V(s_T)``, which bootstraps the return (episodes end at the
    horizon, a time limit, not a terminal state), the mean episode distance, and ``not_converged``: the
    creature-steps whose simulator step stopped short of Newton's tolerance (the simulator warns of each). A
    non-finite state (a simulation that blew up) is a RuntimeError, not NaN observations. ``cfg``'s horizon,
    min_a, max_abs_da and dtype must be the task's; its creature and device are not read (the task's are used)."""
    cfg.check()
    _check_task(task, cfg)
    state = task.reset(cfg.envs)
    not_converged = 0
    buf = {k: [] for k in ("obs", "u", "logp", "value", "reward")}
    with torch.no_grad():
        while not task.truncated(state).all():
            obs = model.inputs(task, state)
            dist, value = model.distribution(obs)
            u = dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=generator,
                                                      dtype=obs.dtype).to(obs.device)
            state, progress, info = task.step(state, u, return_info=True)
            not_converged += sum(not ok for ok in info.problem_converged)
            if not bool(torch.isfinite(state.x).all()):
                bad = (~torch.isfinite(state.x).flatten(1).all(1)).nonzero().flatten().tolist()
                raise RuntimeError(f"diffsoft.ppo.collect: the simulator gave non-finite positions for creature(s) "
                                   f"{bad[:10]} at step {len(buf['obs']) + 1} ({info.message})")
            buf["obs"].append(obs)
            buf["u"].append(u)
            buf["logp"].append(dist.log_prob(u).sum(-1))
            buf["value"].append(value)
            buf["reward"].append(cfg.reward_scale * progress)
        _, last_value = model.distribution(model.inputs(task, state))
    out = {k: torch.stack(t) for k, t in buf.items()}
    out["last_value"] = last_value
    out["distance"] = task.distance(state).mean().item()
    out["not_converged"] = not_converged
    return out


def gae(reward, value, last_value, gamma, lam):
    """Generalised advantage estimates and returns: reward, value ``(T, E)``, last_value ``(E,)``."""
    adv = torch.zeros_like(reward)
    running = torch.zeros_like(last_value)
    for t in reversed(range(len(reward))):
        next_value = last_value if t + 1 == len(reward) else value[t + 1]
        delta = reward[t] + gamma * next_value - value[t]
        running = delta + gamma * lam * running
        adv[t] = running
    return adv, adv + value


def ppo_update(model, optimizer, batch, cfg, generator):
    """``cfg.epochs`` passes of minibatch steps on PPO's clipped objective. batch: flat ``(K, ...)`` tensors
    obs, u, logp, adv, ret. Returns the last minibatch's (policy loss, value loss, approximate KL)."""
    cfg.check()
    k = batch["obs"].shape[0]
    adv = (batch["adv"] - batch["adv"].mean()) / (batch["adv"].std() + 1e-8)
    stats, skipped = (0.0, 0.0, 0.0), 0
    for _ in range(cfg.epochs):
        order = torch.randperm(k, generator=generator).to(batch["obs"].device)
        for i in range(0, k, cfg.minibatch):
            idx = order[i:i + cfg.minibatch]
            dist, value = model.distribution(batch["obs"][idx])
            logp = dist.log_prob(batch["u"][idx]).sum(-1)
            ratio = (logp - batch["logp"][idx]).exp()
            surrogate = torch.min(ratio * adv[idx],
                                  ratio.clamp(1 - cfg.clip_ratio, 1 + cfg.clip_ratio) * adv[idx])
            policy_loss = -surrogate.mean()
            value_loss = (value - batch["ret"][idx]).square().mean()
            entropy = dist.entropy().sum(-1).mean()
            loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy
            optimizer.zero_grad()
            loss.backward()
            if torch.isfinite(nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)):
                optimizer.step()
            else:  # clipping would scale it by 0 (no step) or NaN (every weight NaN for good)
                skipped += 1
            stats = (policy_loss.item(), value_loss.item(), (batch["logp"][idx] - logp).mean().item())
    if skipped:
        warnings.warn(f"PPO's gradient was not finite on {skipped} minibatches (returns out of float range?): those "
                      f"steps were skipped", RuntimeWarning)
    return stats


def learn(model, optimizer, roll, cfg, generator):
    """PPO's update on a rollout of :func:`collect` (:func:`ppo_update` on its advantages and returns), then the
    observation normaliser's statistics: they change between rollouts only, so that the update sees the policy
    that collected the rollout (its first ratios are 1). Returns :func:`ppo_update`'s (which checks ``cfg``).
    Only ``cfg``'s training settings are read (the task's are :func:`collect`'s)."""
    adv, ret = gae(roll["reward"], roll["value"], roll["last_value"], cfg.gamma, cfg.lam)
    batch = {"obs": roll["obs"].flatten(0, 1), "u": roll["u"].flatten(0, 1), "logp": roll["logp"].flatten(),
             "adv": adv.flatten(), "ret": ret.flatten()}
    stats = ppo_update(model, optimizer, batch, cfg, generator)
    model.update_norm(batch["obs"])
    return stats


def train_ppo(cfg, progress=True):
    """Runs PPO until ``cfg.steps`` creature-steps are simulated (evaluation excluded).

    Returns:
        ``(model, history)``; history records per update: ``update``, ``sim_steps``, ``distance`` (mean
        distance of the update's sampled episodes), ``seconds`` (wall time, evaluation excluded), ``cpu_seconds``
        (the process's CPU time over the same spans), ``not_converged`` (the update's creature-steps whose
        simulator step stopped short of Newton's tolerance) and, every
        ``eval_every`` updates, ``eval_distance`` (mean action, from rest, before the update) at
        ``eval_sim_steps``. The last record is the final evaluation's, after the last update: ``update`` (the
        number of updates), ``eval_distance``, ``eval_sim_steps``, and ``sim_steps``, ``seconds`` and
        ``cpu_seconds`` (the totals, as in the last update's record); it has no ``distance`` or
        ``not_converged`` (no episodes were sampled).
    """
    cfg.check()
    torch.manual_seed(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    task = LocomotionTask(make_creature(cfg.creature, getattr(torch, cfg.dtype), cfg.device), cfg.horizon,
                          cfg.min_a, cfg.max_abs_da)
    model = GaussianFramePolicy(task, cfg).to(cfg.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    per_update = cfg.envs * cfg.horizon
    updates = max(cfg.steps // per_update, 1)
    history, seconds, cpu_seconds = [], 0.0, 0.0
    bar = range(updates)
    if progress:
        tqdm = require("tqdm", "train").tqdm
        bar = tqdm(bar, desc="ppo", unit="update", dynamic_ncols=True)
    for u in bar:
        record = {"update": u}
        if u % cfg.eval_every == 0:
            record["eval_distance"] = evaluate(task, model)
            record["eval_sim_steps"] = u * per_update
        t, cpu = time.perf_counter(), time.process_time()
        roll = collect(task, model, cfg, generator)
        learn(model, optimizer, roll, cfg, generator)
        seconds += time.perf_counter() - t
        cpu_seconds += time.process_time() - cpu
        record.update(sim_steps=(u + 1) * per_update, distance=roll["distance"], seconds=seconds,
                      cpu_seconds=cpu_seconds, not_converged=roll["not_converged"])
        history.append(record)
        if progress:
            bar.set_postfix(distance=f"{roll['distance']:.3f}", std=f"{model.log_std.exp().mean().item():.3f}")
    history.append({"update": updates, "eval_distance": evaluate(task, model),
                    "eval_sim_steps": updates * per_update, "sim_steps": updates * per_update, "seconds": seconds,
                    "cpu_seconds": cpu_seconds})
    return model, history
