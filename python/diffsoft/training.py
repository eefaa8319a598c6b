"""Neural locomotion controllers trained end to end by backpropagation through the implicit simulator.

The policy is :class:`~diffsoft.policy.FramePolicy` (algovivo's neural frame policy). The method is
short-horizon actor-critic (SHAC, Xu et al., ICLR 2022): analytic gradients through a short window of
simulation, and a learned value function that stands for everything after the window.

The task: a reward per step, ``r_t = reward_scale * (com_x(x_{t+1}) - com_x(x_t))`` (progress of the centre of
mass along +x; with ``steer``, along each creature's commanded heading, less ``drift_weight`` times the move
across it in 3D: :func:`rewards`), discounted by ``gamma``; the policy
should maximise the return of an endless walk.

One iteration:
    1. A pool of ``batch`` creatures persists between iterations; a creature whose episode has lasted
       ``episode`` steps (or whose step failed) is put back at rest with random activations. Episodes are
       staggered (creature i's first one is shorter by ``window * (i mod (episode / window))`` steps), so a few
       creatures restart in every iteration and the batch always holds starts, strides and long-run gaits.
    2. Every creature runs ``window`` steps of the policy (with exploration noise on its activation
       changes), keeping the autograd graph through the simulator (implicit adjoint).
    3. The actor's loss is minus the mean over creatures of
       ``(sum_{t<W} gamma^t r_t + gamma^W V(s_W)) / W`` (plus the saturation penalty): the exact gradient of
       the window's reward, plus the critic's gradient with respect to the window's end state. Adam step
       after clipping the gradient norm; the learning rate decays linearly from ``lr`` to ``lr_end`` over
       ``lr_decay_iterations``.
    4. The critic ``V(obs, a)`` is fitted to TD(lambda) targets of the window's (detached) rewards,
       bootstrapped by a slowly moving target critic (``target = alpha * target + (1 - alpha) * critic``).

Why: a gradient through the whole 100-step walk is useless (measured: two independent batches' gradients
have cosine 0.97 at 10 steps, 0.94 at 25, 0.73 at 50 and -0.08 at 100, because the Jacobian of a long
rollout through contacts is a product of many step Jacobians whose norm grows or shrinks geometrically), and
summing per-window progress without a value at the window's end is myopic: a lunge into a crouch that
ends every window ahead scores well, so the former trainer stopped at a crouch (0.68 along +x in 100 steps).
With the value at the window's end the window's gradient also sees what its end state is worth afterwards,
and continuing episodes give the critic (and the policy) the states of a gait rather than only starts.
Window ends are not terminal states (a time limit cuts the walk), so the value bootstraps at every window's
end; episodes end only at window ends (``episode`` is a multiple of ``window``), except with
``terminate_upright`` (early termination): a creature that falls is terminal there (no value after it) and
restarts at rest at once, mid-window.

Data-parallel training: under ``torchrun`` (the ``gloo`` backend), each process simulates its slice of the
global batch; actor gradients are averaged with ``all_reduce``, and every process fits the critic to the
whole batch's window (gathered with ``all_gather``), so all processes hold the same critic. Reset activations
and noise of the global batch come from one generator seeded by (seed, iteration), so any number of
processes trains on the same creatures as one process with the combined batch.

Files (under ``out_dir``): ``checkpoint.pt`` (written every ``checkpoint_every`` iterations and at the end:
policy, critic, target critic, both Adam states, the pool of creature states, iteration, history, config,
the evaluated policies; ``resume=True`` continues from it exactly, because every random number of an
iteration is drawn from a generator seeded by that iteration), ``policy.json`` (algovivo's policy format, see
:func:`~diffsoft.policy.save_algovivo_policy`), ``history.json``; the command line (:mod:`diffsoft.cli`)
adds ``learning_curve.png`` and ``walk.gif``.
"""
import contextlib
import copy
import dataclasses
import json
import math
import os
import re
import time
import warnings
from typing import Optional

import torch
from torch import nn

from ._checks import check_fields, is_integer
from ._compat import load_checkpoint
from ._io import finite_or_null
from ._optional import require
from .creatures import check_device, fingerprint, fingerprint_changes, make_creature
from .policy import (WALKS, FramePolicy, Gait, Posture, center_of_mass, center_of_mass_x, distance_walked, gait,
                     heading_direction, mirrors, moves_along, observe, reads_heading, run_policy, save_algovivo_policy)
from .terrain import grid, on_terrain, random_heights


EVAL_HEADINGS = {2: (0.0, math.pi), 3: tuple(math.radians(a) for a in (-90, -45, 0, 45, 90))}
"""The headings a steered policy is evaluated on during training (radians, by the body's dimension)."""


@dataclasses.dataclass
class TrainConfig:
    """Everything a training run depends on (stored in its checkpoint). Each field is also an option of the
    training command line (``--batch 8``, ``--action-noise-end 0.1``; ``python -m diffsoft.cli --help``), whose
    help is this list.

    Attributes:
        creature: A name in :data:`~diffsoft.creatures.CREATURES` or a creature file (algovivo's mesh format or
            diffsoft's).
        batch: Creatures simulated together, over all processes (each process simulates ``batch / world``).
        window: Simulated steps per iteration, through which the actor's gradient is exact.
        episode: Steps from a creature's reset to its next (a multiple of ``window``). The default, 256, shows
            the policy its gait's states past 128 steps, where gaits trained on episodes of 128 fell over
            (docs/training.md, "Gaits that last").
        iterations: Iterations to run, one Adam step of the actor and one fit of the critic each.
        lr: The actor's learning rate at the start, decaying linearly to ``lr_end``.
        lr_end: The actor's learning rate after ``lr_decay_iterations``.
        lr_decay_iterations: Iterations over which the learning rate decays, then stays at ``lr_end`` (a
            schedule in iterations, so a run resumed with more iterations follows the same one).
        clip: The actor's gradient-norm clip.
        gamma: The discount per step.
        lam: TD(lambda)'s lambda for the critic's targets.
        reward_scale: Rewards are the centre of mass's progress along +x (with ``steer``, along the heading)
            per step times this (a step's progress is about 1e-2 in 2D).
        upright_weight: Subtracted from each step's progress, times ``1 - cos(tilt)`` (see
            :meth:`~diffsoft.policy.Posture.uprightness`: 0 upright, 2 upside down); 0 leaves the reward the
            distance alone.
        terminate_upright: Early termination: a creature whose uprightness after a step is below this has
            fallen: that state is terminal (value 0, for the actor's return and the critic's targets) and the
            creature restarts at once at rest (with the iteration's reset activations, keeping its
            ``randomize`` factors until its next regular reset); -1 never.
        terminate_height: Early termination, likewise: a creature whose height
            (:meth:`~diffsoft.policy.Posture.height`, 1 as at rest) after a step is below this has fallen; 0 never.
        critic_lr: The critic's Adam learning rate.
        critic_hidden: The width of the critic's two hidden layers.
        critic_iterations: Passes over each window's data when the critic is fitted.
        critic_minibatches: Minibatches per pass of the critic's fit.
        target_alpha: The target critic's smoothing: ``target = alpha * target + (1 - alpha) * critic`` after
            each fit.
        hidden: The policy's hidden width (algovivo's: 32).
        min_a: The least activation a muscle may take (1 is relaxed); None: the creature's
            (:attr:`~diffsoft.body.SoftBody.min_a`: algovivo's 0.25, the tetrapod's 0.35), which the run records.
        max_abs_da: The bound on a step's activation change (algovivo's: 0.3).
        init_activation: A reset creature's activations are drawn uniformly from ``[1 - init_activation, 1]``.
        action_noise: The std of the Gaussian exploration noise on activation changes.
        action_noise_end: The noise's std after ``noise_decay_iterations`` (unused while that is 0).
        noise_decay_iterations: Iterations over which the noise's std decays linearly from ``action_noise`` to
            ``action_noise_end``, then stays there; 0: constant.
        saturation_penalty: Weight of ``sum_t sum_i [max(|da_i| - max_abs_da, 0)^2 + max(a_i + da_i - 1, 0)^2 +
            max(min_a - a_i - da_i, 0)^2]`` per step, which keeps the policy's outputs where the clamps do
            not cut their gradient to zero.
        straight_through: The clamps pass gradients as if they were not there (the forward pass is unchanged).
        randomize: Domain randomisation: at each reset, a creature's Lame parameters, masses and friction
            coefficient are each scaled by a factor of its own drawn uniformly from ``[1 - randomize, 1 +
            randomize]`` and kept for its episode (per-creature simulator parameters: the batch is still one
            step); 0 trains on the nominal creature, which evaluations always use.
        terrain: Terrain randomisation: at each reset, a creature draws hilly ground of its own (rolling hills
            whose slope stays within this many degrees either way, flat under it at rest:
            :mod:`~diffsoft.terrain`) and walks on it for its episode; 0 trains on the flat ground, which
            evaluations always use.
        steer: Steering: at each reset, a creature draws a commanded heading (2D: +x or -x, each with
            probability 1/2; 3D: uniformly within 90 degrees of +x either way), which the policy (steered: it
            reads the heading in its body frame) and the critic see, and its reward is its centre of mass's
            progress along that heading; evaluations take the mean over the headings of :data:`EVAL_HEADINGS`
            of the distance walked along each (and in 3D of the distance off each, which ``keep_best`` charges
            as the reward does: :func:`evaluation_score`).
        drift_weight: With ``steer`` in 3D: subtracted from each step's progress along the heading, times the
            absolute value of the centre of mass's move across it in the ground plane (a command tracked, not
            only a distance made good along it); 0 leaves the reward the progress alone (what the trainer did
            before this setting: the steered tetrapod then turned too little toward wide headings). In 2D the
            headings are +x and -x, and no move is across them: where it has no effect (unsteered, or 2D) a
            run records 0.
        mirror: The policy is mirrored (:class:`~diffsoft.policy.Mirror`): symmetric by construction, for a body
            that is its own mirror image, so that a gait learnt toward one side (2D: forward or backward; 3D:
            toward +z or -z) is one toward the other too; it must read a heading (in 2D: with ``steer``). None:
            mirrored wherever it can be (:func:`~diffsoft.policy.mirrors`: a symmetric body in 3D, or steered in
            2D), which the run records.
        eval_every: Iterations between evaluations of :func:`~diffsoft.policy.distance_walked`
            (deterministic, from rest).
        eval_horizon: Steps of each evaluation.
        keep_best: The run's result (returned and written to ``policy.json``) is, of the policies evaluated
            during the run and the final one, the one that walked furthest (steered in 3D: the furthest less
            ``drift_weight`` times off its headings, :func:`evaluation_score`) among those whose gait
            :func:`lasts` (1,000 steps from rest; checked in the order of their scores, up to the first that
            lasts; where none does, the furthest, with a RuntimeWarning), instead of the final policy (the
            checkpoint holds the 32 furthest; ``--resume`` continues from the last).
        backward_rtol: The adjoint solve's relative tolerance (loose is enough for a stochastic gradient and
            halves the backward's cost).
        dtype: ``"float32"`` or ``"float64"``.
        device: Where the creatures, the simulator, the policy and the critic live (``"cpu"``, ``"cuda"``,
            ``"cuda:1"``, ...); random numbers are drawn on the CPU and moved, so a run's draws do not depend
            on it.
        seed: Seeds the networks' initial weights and every iteration's draws (resets and noise).
        out_dir: Where the checkpoint, ``policy.json``, ``history.json`` and the plots are written.
        checkpoint_every: Iterations between checkpoints (one is also written at the end).
        on_failure: ``"skip"`` (leave a creature whose step did not converge out of the iteration's losses and
            reset it) or ``"stop"`` (raise, keeping the finished iterations in the checkpoint).
    """
    creature: str = "biped"
    batch: int = 32
    window: int = 32
    episode: int = 256
    iterations: int = 300
    lr: float = 6e-3
    lr_end: float = 1e-3
    lr_decay_iterations: int = 300
    clip: float = 1.0
    gamma: float = 0.99
    lam: float = 0.95
    reward_scale: float = 100.0
    upright_weight: float = 0.0
    terminate_upright: float = 0.0
    terminate_height: float = 0.3
    critic_lr: float = 2e-3
    critic_hidden: int = 64
    critic_iterations: int = 16
    critic_minibatches: int = 4
    target_alpha: float = 0.2
    hidden: int = 32
    min_a: Optional[float] = None
    max_abs_da: float = 0.3
    init_activation: float = 0.3
    action_noise: float = 0.4
    action_noise_end: float = 0.1
    noise_decay_iterations: int = 60
    saturation_penalty: float = 1.0
    straight_through: bool = False
    randomize: float = 0.0
    terrain: float = 0.0
    steer: bool = False
    drift_weight: float = 2.0
    mirror: Optional[bool] = None
    eval_every: int = 10
    eval_horizon: int = 100
    keep_best: bool = True
    backward_rtol: float = 1e-4
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    out_dir: str = "runs/biped"
    checkpoint_every: int = 10
    on_failure: str = "skip"

    # Fields that may change between a run and its resumption.
    RESUMABLE = ("iterations", "out_dir", "checkpoint_every", "eval_every", "on_failure", "device", "keep_best")

    @classmethod
    def recorded(cls, config):
        """The settings a checkpoint's ``config`` records, where a field it lacks (added since) takes the value
        that does what the trainer did before it (:data:`_BEFORE`), or else its default."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**_BEFORE, **{k: v for k, v in config.items() if k in names}})

    def check(self):
        """Every field's type and range, each error naming the field: called before anything is built."""
        check_fields(self, dict(
            batch=">0", window=">0", episode=">0", lr_decay_iterations=">0", critic_hidden=">0",
            critic_iterations=">0", critic_minibatches=">0", hidden=">0", checkpoint_every=">0", eval_every=">0",
            eval_horizon=">0", iterations=">=0", seed="seed", dtype=("float32", "float64"), lr=">0", lr_end=">0",
            clip=">0", critic_lr=">0", reward_scale=">0", max_abs_da=">0", upright_weight=">=0", drift_weight=">=0",
            action_noise=">=0", action_noise_end=">=0", noise_decay_iterations=">=0", saturation_penalty=">=0",
            gamma="[0,1]", lam="[0,1]", target_alpha="[0,1]", terminate_height="[0,1)",
            backward_rtol="(0,1)", min_a="min_a", on_failure=("skip", "stop"), randomize="[0,1)"))
        if not 0 <= self.terrain < 45:
            raise ValueError(f"terrain must be in [0, 45) (the steepest slope in degrees; 0: flat ground), got "
                             f"{self.terrain!r}")
        if not -1 <= self.terminate_upright <= 1:
            raise ValueError(f"terminate_upright must be in [-1, 1] (an uprightness; -1: never), "
                             f"got {self.terminate_upright!r}")
        if self.episode % self.window:
            raise ValueError(f"episode ({self.episode}) must be a multiple of window ({self.window})")
        if self.critic_minibatches > self.batch * self.window:
            raise ValueError(f"critic_minibatches ({self.critic_minibatches}) must be at most batch * window "
                             f"({self.batch * self.window})")
        check_device(self.device)
        if self.min_a is None:  # the creature's: train() checks again once it is known
            if not 0 <= self.init_activation < 1:
                raise ValueError(f"init_activation must be in [0, 1 - min_a] (min_a: the creature's, > 0), got "
                                 f"{self.init_activation!r}")
        elif not 0 <= self.init_activation <= 1 - self.min_a:
            raise ValueError(f"init_activation must be in [0, 1 - min_a] = [0, {1 - self.min_a:g}], "
                             f"got {self.init_activation!r}")

    def actor_lr(self, iteration):
        """The actor's learning rate at ``iteration`` (linear decay, then constant)."""
        return _linear_decay(self.lr, self.lr_end, iteration, self.lr_decay_iterations)

    def noise_std(self, iteration):
        """The exploration noise's std at ``iteration`` (constant, or a linear decay, then constant)."""
        if not self.noise_decay_iterations:
            return self.action_noise
        return _linear_decay(self.action_noise, self.action_noise_end, iteration, self.noise_decay_iterations)


def _linear_decay(start, end, iteration, iterations):
    """``start`` moving linearly to ``end`` over ``iterations``, then ``end``."""
    f = min(iteration / iterations, 1.0)
    return start + f * (end - start)


class Critic(nn.Module):
    """The value of a creature's state: an MLP (two ELU hidden layers) on the policy's observation
    (:func:`~diffsoft.policy.observe`, in the body frame, so the value does not depend on where the creature
    is) and the muscle activations (part of the state: the next activation is the previous one plus a
    bounded change).

    Args:
        num_obs: the observation's size ``2 N d``; num_muscles: M; hidden: the hidden layers' width.
    """

    def __init__(self, num_obs, num_muscles, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(num_obs + num_muscles, hidden), nn.ELU(), nn.Linear(hidden, hidden),
                                 nn.ELU(), nn.Linear(hidden, 1))

    def forward(self, obs, a):
        """``(K,)`` values from obs ``(K, 2 N d)`` and activations ``a (K, M)``."""
        return self.net(torch.cat([obs, a], dim=-1)).squeeze(-1)


def td_lambda_targets(reward, value, last_value, gamma, lam, done=None):
    """The critic's regression targets ``G_t = r_t + gamma ((1 - lam) V(s_{t+1}) + lam G_{t+1})``, with
    ``G_W = V(s_W)`` (the window's end is bootstrapped, never terminal), and ``G_t = r_t`` where step t
    ended its episode in a terminal state (``done``; the next state is then a fresh start).

    Args:
        reward, value: ``(W, B)`` rewards and target-critic values of the window's states ``s_0..s_{W-1}``;
        last_value: ``(B,)`` the target critic's value of ``s_W``; done: ``(W, B)`` booleans, or None (none).

    Returns:
        ``(W, B)`` targets.
    """
    targets = torch.empty_like(reward)
    g = last_value
    for t in reversed(range(reward.shape[0])):
        next_value = last_value if t + 1 == reward.shape[0] else value[t + 1]
        g = (1 - lam) * next_value + lam * g
        if done is not None:
            g = torch.where(done[t], torch.zeros_like(g), g)
        g = reward[t] + gamma * g
        targets[t] = g
    return targets


def segment_discounts(done, gamma, dtype):
    """The discounts of a window's return when creatures restart after a termination: a creature's return is
    cut into segments, each from its start (step 0, or the step after a termination) to its end (a
    termination, or the window's end, where the critic's value bootstraps it).

    Args:
        done: ``(W, B)`` booleans: step t's state was terminal (the creature restarts after it).

    Returns:
        ``discount (W, B)``, ``gamma^(t - s_t)`` with ``s_t`` the step at which step t's segment began;
        ``end_discount (B,)``, ``gamma^(W - s_W)``, the value's at the window's end; and ``s_W (B,)``, the step
        at which the last segment began (0: no termination in the window). The discounts are computed in
        float64 and returned in ``dtype``.
    """
    w = done.shape[0]
    steps = torch.arange(1, w + 1, device=done.device)[:, None]
    began = torch.where(done, steps, torch.zeros_like(steps)).cummax(0).values  # segment start after step t
    began_before = torch.cat([torch.zeros_like(began[:1]), began[:-1]])
    gamma = torch.tensor(gamma, dtype=torch.float64, device=done.device)
    return (gamma ** (steps - 1 - began_before)).to(dtype), (gamma ** (w - began[-1])).to(dtype), began[-1]


def fit_critic(cfg, critic, target_critic, optimizer, obs, a, targets, valid, generator):
    """``critic_iterations`` passes of ``critic_minibatches`` Adam steps on the squared error to the targets,
    then the target critic's update. obs ``(K, 2 N d)``, a ``(K, M)``, targets ``(K,)``, valid ``(K,)``
    booleans (samples of failed creatures are left out). Returns the last pass's mean loss."""
    keep = valid.nonzero().squeeze(1)
    obs, a, targets = obs[keep], a[keep], targets[keep]
    k = targets.shape[0]
    size = -(-k // cfg.critic_minibatches)
    loss_sum, skipped = 0.0, 0
    for _ in range(cfg.critic_iterations if k else 0):
        order = torch.randperm(k, generator=generator).to(obs.device)
        loss_sum = 0.0
        for idx in order.split(size):
            loss = (critic(obs[idx], a[idx]) - targets[idx]).square().mean()
            value = loss.item()
            loss_sum += value * len(idx)
            if not math.isfinite(value):  # an Adam step on it would make every weight NaN for good
                skipped += 1
                continue
            optimizer.zero_grad(set_to_none=False)  # in place: the gradients may be views (flat_parameters)
            loss.backward()
            optimizer.step()
    if skipped:
        warnings.warn(f"the critic's loss was not finite on {skipped} minibatches (rewards or targets out of float "
                      f"range: reward_scale {cfg.reward_scale:g}?): those steps were skipped", RuntimeWarning)
    with torch.no_grad():
        for pt, pc in zip(target_critic.parameters(), critic.parameters()):
            pt.mul_(cfg.target_alpha).add_(pc, alpha=1 - cfg.target_alpha)
    return loss_sum / max(k, 1)


def flat_parameters(module):
    """One parameter holding all of ``module``'s: the module's parameters and their gradients become views of
    its data and its gradient, so that an optimizer given it alone updates the module. The critic's Adam then
    takes one tensor's operations per step instead of six's, the same arithmetic element by element (an Adam
    step on the critic's small layers costs mostly per-tensor overhead: its fit took 20-25% less time, to the
    same bits; docs/training.md, "Where an iteration's time goes"). Zero its gradient in place
    (``zero_grad(set_to_none=False)``): autograd then accumulates into the views."""
    params = list(module.parameters())
    flat = nn.Parameter(torch.cat([p.detach().flatten() for p in params]))
    flat.grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        p.data = flat.data[offset:offset + p.numel()].view_as(p)
        p.grad = flat.grad[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def _non_finite(state):
    """The path (``"fc1.weight"``, ``"state.0.exp_avg"``) to the first floating tensor with a NaN or an infinity in a
    module's or an optimizer's state dict (nested dicts and lists), ``""`` where ``state`` is such a tensor itself,
    or None."""
    if isinstance(state, torch.Tensor):
        return "" if state.is_floating_point() and not bool(torch.isfinite(state).all()) else None
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, (list, tuple)) else ()
    for key, value in items:
        where = _non_finite(value)
        if where is not None:
            return f"{key}.{where}" if where else str(key)
    return None


def _flat_adam_state(state):
    """An Adam ``state_dict`` over one parameter group of several tensors (the critic's before
    :func:`flat_parameters`) as the same state over their concatenation, in order; others are returned as
    they are."""
    group, = state["param_groups"]
    if len(group["params"]) == 1:
        return state
    per = [state["state"][k] for k in group["params"] if k in state["state"]]
    flat = {} if not per else {0: {"step": per[0]["step"], **{k: torch.cat([p[k].flatten() for p in per])
                                                              for k in ("exp_avg", "exp_avg_sq")}}}
    return {"state": flat, "param_groups": [dict(group, params=[0])]}


def distributed_world():
    """``(rank, world_size)``; joins the gloo process group when launched by torchrun."""
    import torch.distributed as dist
    size = os.environ.get("WORLD_SIZE", "1")
    if not (size.strip().isdigit() and int(size) >= 1):
        raise ValueError(f"the environment variable WORLD_SIZE must be a number of processes >= 1 (torchrun sets "
                         f"it), got {size!r}")
    if int(size) > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _same_settings(cfg, world):
    """A ValueError in every process where the processes' settings differ (out_dir and device aside): each
    would train with its own while the run records process 0's (another seed on one machine trained another run
    than the one a resume continues; another batch size ended in gloo's abort)."""
    if world == 1:
        return
    mine = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("out_dir", "device")}
    every = _gathered_objects(mine, world)
    for r, theirs in enumerate(every):
        differ = [k for k in mine if theirs.get(k) != every[0].get(k)]
        if differ:
            raise ValueError(f"the processes were given other settings: process {r}'s "
                             f"{', '.join(f'{k}={theirs[k]!r}' for k in differ)} against process 0's "
                             f"{', '.join(f'{k}={every[0][k]!r}' for k in differ)}: give every process the same "
                             f"command")


def _resumes(found, ckpt_path, world):
    """Whether the run resumes: ``found`` (this process sees the checkpoint), the same in every process, whose
    collective calls differ between a resumed run and a new one (one process resuming and another starting
    would wait for each other for good): a ValueError in every process where they differ."""
    if world > 1:
        import torch.distributed as dist
        seen = torch.tensor([int(found)])
        dist.all_reduce(seen)
        if 0 < int(seen) < world:
            raise ValueError(f"{ckpt_path}: {int(seen)} of the {world} processes find the checkpoint, the others "
                             f"not: --resume needs out_dir on a filesystem that every process reads (or the "
                             f"checkpoint copied to each machine's out_dir)")
    return found


_LAST_COLLECTIVE = None
"""The handle of :func:`train`'s last barrier, in a process of several (see there)."""


def _all_reduce_mean(tensors, world):
    if world > 1:
        import torch.distributed as dist
        for t in tensors:
            dist.all_reduce(t)
            t.div_(world)


def _gathered_objects(obj, world):
    """Every process's ``obj`` (picklable), in rank order; ``[obj]`` in one process."""
    if world == 1:
        return [obj]
    import torch.distributed as dist
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _all_gather(tensor, world, dim):
    """The processes' ``tensor``s concatenated along ``dim``, in rank order (the global batch's order)."""
    if world == 1:
        return tensor
    if not tensor.numel():  # nothing to send (the pool's terrain without TrainConfig.terrain); gloo dies on it
        shape = list(tensor.shape)
        shape[dim] *= world
        return tensor.new_empty(shape)
    import torch.distributed as dist
    sent = tensor.to(torch.uint8) if tensor.dtype == torch.bool else tensor.contiguous()  # gloo has no bool
    parts = [torch.empty_like(sent) for _ in range(world)]
    dist.all_gather(parts, sent)
    return torch.cat(parts, dim=dim).to(tensor.dtype)


@dataclasses.dataclass
class Pool:
    """The creatures that persist between iterations (this process's slice of the batch, b of them):
    positions and velocities ``(b, N, d)``, activations ``(b, M)``, ``age`` ``(b,)``, the steps since each
    creature's reset (``>= episode``: reset before the next window), ``scale`` ``(b, 3)``, each creature's
    factors on its Lame parameters, masses and friction (``TrainConfig.randomize``; ones without it), and
    ``terrain`` ``(b, *samples)``, each creature's ground (:func:`~diffsoft.terrain.random_heights`; ``(b, 0)``
    without ``TrainConfig.terrain``), and ``heading`` ``(b,)``, each creature's commanded heading in radians
    (``TrainConfig.steer``; zeros without it)."""
    x: torch.Tensor
    v: torch.Tensor
    a: torch.Tensor
    age: torch.Tensor
    scale: torch.Tensor
    terrain: torch.Tensor
    heading: torch.Tensor

    @classmethod
    def at_rest(cls, sim, b, episode, terrain=False):
        """b creatures due for a reset (with ``terrain``, on flat terrain's grid)."""
        x, v = sim.rest_state
        samples = grid(sim)[2] if terrain else (0,)
        return cls(x.expand(b, -1, -1).clone(), v.expand(b, -1, -1).clone(),
                   torch.ones(b, sim.body.num_muscles, dtype=x.dtype, device=x.device),
                   torch.full((b,), episode, device=x.device), torch.ones(b, 3, dtype=x.dtype, device=x.device),
                   torch.zeros(b, *samples, dtype=x.dtype, device=x.device),
                   torch.zeros(b, dtype=x.dtype, device=x.device))

    def to(self, device):
        """The pool on ``device``."""
        return Pool(*(getattr(self, f.name).to(device) for f in dataclasses.fields(self)))


def _iteration_draws(cfg, sim, iteration, rank, world):
    """The iteration's random numbers: a generator seeded by (seed, iteration), and from it the global
    batch's reset activations ``(B, M)``, noise ``(W, B, M)``, (with ``randomize``) reset factors ``(B, 3)``,
    (with ``terrain``) reset terrains ``(B, *samples)`` and (with ``steer``) reset headings ``(B,)``, of which
    this process's slices are returned (on the simulator's device); the generator, on the CPU, then serves the
    critic's minibatches (the same on every process and on every device)."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + iteration)
    m, dtype = sim.body.num_muscles, sim.body.dtype
    a0 = 1.0 - cfg.init_activation * torch.rand(cfg.batch, m, generator=g, dtype=torch.float64)
    noise = cfg.noise_std(iteration) * torch.randn(cfg.window, cfg.batch, m, generator=g, dtype=torch.float64)
    scale = torch.ones(cfg.batch, 3, dtype=torch.float64)
    if cfg.randomize:  # drawn only then, so that runs without it draw what they always drew
        scale = 1.0 + cfg.randomize * (2 * torch.rand(cfg.batch, 3, generator=g, dtype=torch.float64) - 1)
    terrain = torch.zeros(cfg.batch, 0, dtype=torch.float64)
    if cfg.terrain:
        terrain = random_heights(sim, cfg.terrain, cfg.batch, g)
    heading = torch.zeros(cfg.batch, dtype=torch.float64)
    if cfg.steer:  # 2D: forward or backward; 3D: within 90 degrees of +x
        if sim.body.dim == 2:
            heading = math.pi * torch.randint(0, 2, (cfg.batch,), generator=g).double()
        else:
            heading = math.pi * (torch.rand(cfg.batch, generator=g, dtype=torch.float64) - 0.5)
    b = cfg.batch // world
    part = slice(rank * b, (rank + 1) * b)
    device = sim.body.device
    return (g, *(t[..., part, :].to(device=device, dtype=dtype) for t in (a0, noise, scale)),
            *(t[part].to(device=device, dtype=dtype) for t in (terrain, heading)))


def _reset(cfg, sim, pool, a0, scale, terrain, heading, iteration, rank):
    """Puts the pool's creatures whose episode is over back at rest with activations ``a0``, parameter
    factors ``scale``, ground ``terrain`` and command ``heading``. At iteration 0 (every creature at rest) it
    staggers the episodes: creature i starts at age ``window * (i mod (episode / window))``."""
    due = pool.age >= cfg.episode
    x, v = sim.rest_state
    pool.x[due], pool.v[due], pool.a[due], pool.age[due], pool.scale[due] = x, v, a0[due], 0, scale[due]
    pool.terrain[due], pool.heading[due] = terrain[due], heading[due]
    if iteration == 0:
        b = pool.age.shape[0]
        pool.age = cfg.window * ((torch.arange(b, device=pool.age.device) + rank * b) % (cfg.episode // cfg.window))


@contextlib.contextmanager
def _randomized(sim, scale):
    """Inside the block, ``sim``'s Lame parameters, masses and friction coefficient are per creature: scaled
    by ``scale[:, 0]``, ``scale[:, 1]`` and ``scale[:, 2]``; afterwards the nominal values are back."""
    body = sim.body
    saved = body.mu, body.lam, body.mass, sim._friction
    friction = sim.friction.detach()  # the nominal one (given, or the default of the nominal masses)
    body.mu, body.lam = body.mu * scale[:, :1], body.lam * scale[:, :1]
    body.mass = body.mass * scale[:, 1:2]
    sim.friction = friction * scale[:, 2]
    try:
        yield
    finally:
        body.mu, body.lam, body.mass, sim._friction = saved


class SimulationFailure(RuntimeError):
    """The simulator did not converge inside a training rollout (``on_failure="stop"``); the message says
    which iteration, step and creatures, and by which criterion."""


def _stop_together(message, world):
    """Where a process's rollout stopped (``message``, else None), every process raises :class:`SimulationFailure`
    with every stopped process's message, at the same point: one process stopping alone left the others in the
    gradient's all_reduce for good. Called by every process after its rollout, with ``on_failure="stop"``."""
    stopped = [m for m in _gathered_objects(message, world) if m]
    if stopped:
        raise SimulationFailure("; ".join(stopped))


def _gathered_failures(failures, world):
    """Every process's failures (their creature numbers are the global batch's), in rank order."""
    return [f for part in _gathered_objects(failures, world) for f in part]


def _step(cfg, sim, x, v, a, iteration, t, rank, ok, failures):
    """``sim.step`` in a rollout. A creature whose step did not converge is reported (iteration, step of the
    window, creature, criterion); with ``on_failure="skip"`` it is dropped from this iteration's losses (its
    implicit gradient would be wrong; the other creatures' are not affected) and reset before the next
    iteration, with ``"stop"`` the rollout stops."""
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


def train_iteration(cfg, sim, policy, critic, target_critic, optimizer, critic_optimizer, pool, iteration,
                    rank=0, world=1, failures=None):
    """One window of this process's creatures (see the module docstring): resets, the actor's Adam step on
    gradients averaged over processes and clipped, the critic's fit; ``pool`` moves on by ``window`` steps.

    Returns:
        a dict: ``distance`` (the global batch's mean progress along +x, with ``steer`` along each creature's
        heading, per step in this window, times ``eval_horizon``: comparable with the evaluation's distance),
        ``grad_norm`` (the actor's, before clipping), ``critic_loss``, ``value`` (the critic targets' mean) and,
        with ``terminate_upright``, ``terminated`` (the global batch's falls in this window). Steps that did not
        converge are appended to ``failures`` (see ``TrainConfig.on_failure``).
    """
    failures = [] if failures is None else failures
    g, a0, noise, scale, terrain, heading = _iteration_draws(cfg, sim, iteration, rank, world)
    _reset(cfg, sim, pool, a0, scale, terrain, heading, iteration, rank)
    with _randomized(sim, pool.scale) if cfg.randomize else contextlib.nullcontext(), \
            on_terrain(sim, pool.terrain) if cfg.terrain else contextlib.nullcontext():
        return _window(cfg, sim, policy, critic, target_critic, optimizer, critic_optimizer, pool, iteration,
                       rank, world, failures, g, a0, noise)


def rewards(cfg, sim, before, after, heading, posture=None):
    """Each step's progress and reward before ``reward_scale``, ``(W, B)`` each, from the states ``before`` and
    ``after`` it ``(W, B, N, d)``: the progress is the centre of mass's move along +x, or along each creature's
    heading ``(B,)`` with ``steer``; the reward is the progress less ``drift_weight`` times the move across the
    heading (3D) and ``upright_weight`` times ``1 - uprightness`` (``posture``, a :class:`Posture`)."""
    if cfg.steer:  # along each creature's heading
        direction = heading_direction(heading, sim.body.dim, after.dtype, after.device)
        move = center_of_mass(sim, after) - center_of_mass(sim, before)  # (W, B, d)
        progress = (move * direction).sum(-1)
        reward = progress
        if cfg.drift_weight and sim.body.dim == 3:  # across: (-sin h, 0, cos h), the ground plane's normal to it
            drift = move[..., 2] * direction[:, 0] - move[..., 0] * direction[:, 2]
            reward = progress - cfg.drift_weight * drift.abs()
    else:
        progress = reward = center_of_mass_x(sim, after) - center_of_mass_x(sim, before)
    if cfg.upright_weight:
        reward = reward - cfg.upright_weight * (1 - posture.uprightness(after))
    return progress, reward


def _window(cfg, sim, policy, critic, target_critic, optimizer, critic_optimizer, pool, iteration, rank, world,
            failures, g, a0, noise):
    """:func:`train_iteration` after its resets: the window's rollout, the actor's and the critic's updates.

    The loop over the window's steps does only what the next step needs (the observation, the policy, the
    activation update, the step, and the early terminations); the rewards, the saturation penalty, the
    discounts and the return are computed on the stacked window after it (a few tensor operations in place of
    a few per step: at batch 4 the per-step work cost more than the simulator's Newton solves)."""
    for group in optimizer.param_groups:
        group["lr"] = cfg.actor_lr(iteration)
    x, v, a = pool.x, pool.v, pool.a
    b, w = a.shape[0], cfg.window
    ok = torch.ones(b, dtype=torch.bool, device=x.device)
    terminate = cfg.terminate_upright > -1 or cfg.terminate_height > 0
    posture = Posture(sim) if terminate or cfg.upright_weight else None
    rest_x, rest_v = sim.rest_state
    heading = pool.heading if policy.steered else None  # zeros (+x) unless steering
    observations, changes, activations, befores, afters, dones = [], [], [], [], [], []
    try:
        for t in range(w):
            obs = observe(x, v, policy.center_vertex_id, policy.forward_vertex_id, heading)
            da = policy.changes(x, v, heading, obs)
            observations.append(obs)
            changes.append(da)
            activations.append(a)
            befores.append(x)
            a = policy.update(a, da, noise[t], cfg.straight_through)
            x, v = _step(cfg, sim, x, v, a, iteration, t, rank, ok, failures)
            afters.append(x)
            if terminate:
                done = posture.fallen(x.detach(), cfg.terminate_upright, cfg.terminate_height) & ok
                dones.append(done)
                if done.any():  # terminal (value 0): the creature restarts at rest, a new segment of the return
                    keep = ~done[:, None, None]
                    x, v = torch.where(keep, x, rest_x), torch.where(keep, v, rest_v)
                    a = torch.where(done[:, None], a0, a)
    except SimulationFailure as e:  # (on_failure="stop") every process stops here, together
        _stop_together(str(e), world)
        raise
    if cfg.on_failure == "stop":
        _stop_together(None, world)
    done = torch.stack(dones) if terminate else torch.zeros(w, b, dtype=torch.bool, device=x.device)
    da, a_seen = torch.stack(changes), torch.stack(activations)  # (W, B, M)
    target = a_seen + da
    saturation = ((da.abs() - policy.max_abs_da).clamp_min(0).square() + (target - 1).clamp_min(0).square()
                  + (policy.min_a - target).clamp_min(0).square()).sum(-1).sum(0)
    after = torch.stack(afters)
    progress, reward = rewards(cfg, sim, torch.stack(befores), after, heading, posture)
    reward = cfg.reward_scale * reward
    discount, end_discount, began = segment_discounts(done, cfg.gamma, reward.dtype)
    obs_end = observe(x, v, policy.center_vertex_id, policy.forward_vertex_id, heading)
    critic.requires_grad_(False)  # the actor's loss differentiates the critic's input, not its weights
    ret = (discount * reward).sum(0) + end_discount * critic(obs_end, a)
    critic.requires_grad_(True)
    optimizer.zero_grad()
    ((cfg.saturation_penalty * saturation - ret) * ok).sum().div(b * w).backward()
    params = list(policy.parameters())
    distance = (progress.detach().sum(0) * ok).sum().div(b).reshape(1)
    _all_reduce_mean([p.grad for p in params] + [distance], world)
    grad_norm = nn.utils.clip_grad_norm_(params, cfg.clip)
    if torch.isfinite(grad_norm):
        optimizer.step()
    else:  # clipping would scale it by 0 (no step) or NaN (every weight NaN for good)
        warnings.warn(f"iteration {iteration}: the actor's gradient is not finite (norm {float(grad_norm)}; rewards "
                      f"out of float range: reward_scale {cfg.reward_scale:g}?): its step was skipped", RuntimeWarning)

    # The critic, on the whole batch's window: (W, B, ...) gathered along the batch.
    obs_all = _all_gather(torch.stack(observations).detach(), world, 1)
    a_all = _all_gather(a_seen.detach(), world, 1)
    reward_all = _all_gather(reward.detach(), world, 1)
    obs_end_all = _all_gather(obs_end.detach(), world, 0)
    a_end_all = _all_gather(a.detach(), world, 0)
    ok_all = _all_gather(ok, world, 0)
    done_all = _all_gather(done, world, 1)
    with torch.no_grad():
        value = target_critic(obs_all.flatten(0, 1), a_all.flatten(0, 1)).reshape(reward_all.shape)
        targets = td_lambda_targets(reward_all, value, target_critic(obs_end_all, a_end_all), cfg.gamma, cfg.lam,
                                    done_all)
    critic_loss = fit_critic(cfg, critic, target_critic, critic_optimizer, obs_all.flatten(0, 1),
                             a_all.flatten(0, 1), targets.flatten(), ok_all.expand(w, -1).flatten(), g)

    pool.x, pool.v, pool.a = x.detach(), v.detach(), a.detach()
    since = torch.where(began > 0, w - began, pool.age + w)  # steps since each creature's reset
    pool.age = torch.where(ok, since, torch.full_like(pool.age, cfg.episode))
    record = {"distance": distance.item() * cfg.eval_horizon / w, "grad_norm": float(grad_norm),
              "critic_loss": critic_loss, "value": targets[:, ok_all].mean().item() if ok_all.any() else 0.0}
    if terminate:
        record["terminated"] = int(done_all.sum())
    return record


def _gathered_pool(pool, world):
    """The whole batch's pool (every process's slice, in rank order)."""
    return {f.name: _all_gather(getattr(pool, f.name), world, 0) for f in dataclasses.fields(pool)}


def _save_checkpoint(path, cfg, sim, learners, pool_state, iteration, history, train_seconds, evaluated):
    """learners: the networks and optimizers by name (each stored as its ``state_dict``); pool_state: the
    whole batch's pool (:func:`_gathered_pool`); evaluated: the evaluated policies (:class:`_Evaluated`). The
    checkpoint records the creature trained on by its content (:func:`~diffsoft.creatures.fingerprint`)."""
    tmp = path + ".tmp"
    torch.save({"version": 2, "config": dataclasses.asdict(cfg), "creature": fingerprint(sim), "iteration": iteration,
                **{name: m.state_dict() for name, m in learners.items()}, "pool": pool_state,
                "history": history, "train_seconds": train_seconds, "evaluated": evaluated.policies,
                "frame": [learners["policy"].center_vertex_id, learners["policy"].forward_vertex_id]}, tmp)
    os.replace(tmp, path)  # an interrupted write never leaves a truncated checkpoint


_CHECKPOINT_KEYS = ("config", "iteration", "policy", "critic", "target_critic", "optimizer", "critic_optimizer", "pool",
                    "history", "train_seconds")
_POOL_KEYS = ("x", "v", "a", "age")
_BEFORE = {"terminate_height": 0.0, "mirror": False, "drift_weight": 0.0}
"""The TrainConfig fields added with a default that changes what the trainer did, and the value that does what
it did before them: what a checkpoint written before a field existed was trained with."""


def for_creature(cfg, sim):
    """``cfg`` as a run on the creature of simulator ``sim`` records it: the fields that default to the
    creature's (None) taken from it, ``min_a`` (its body's) and ``mirror`` (:func:`~diffsoft.policy.mirrors`),
    and ``drift_weight`` 0 where it has no effect (:func:`_without_idle_drift`; a RuntimeWarning where a weight
    other than the default was given there)."""
    if cfg.min_a is None:
        cfg = dataclasses.replace(cfg, min_a=sim.body.min_a)
    if cfg.mirror is None:
        cfg = dataclasses.replace(cfg, mirror=mirrors(sim, cfg.steer))
    cfg.check()
    idle = _without_idle_drift(cfg, sim)
    if idle.drift_weight != cfg.drift_weight and cfg.drift_weight != TrainConfig.drift_weight:
        warnings.warn(f"drift_weight={cfg.drift_weight!r} has no effect here: it weighs the move across a commanded "
                      f"heading, with steer in 3D only (this run: steer={cfg.steer}, {sim.body.dim}D); the run records "
                      f"0", RuntimeWarning, stacklevel=3)
    return idle


def _without_idle_drift(cfg, sim):
    """``cfg`` with ``drift_weight`` 0 unless it is steered in 3D, the only runs whose reward it changes: so
    that a checkpoint of a run it cannot change resumes whatever the weight (a run before the setting recorded
    none, which reads as 0; one since, the default)."""
    return cfg if cfg.steer and sim.body.dim == 3 else dataclasses.replace(cfg, drift_weight=0.0)


def new_policy(cfg, sim):
    """The policy that :func:`train` starts from for ``cfg`` and its creature ``sim``, drawn from torch's
    generator."""
    cfg = for_creature(cfg, sim)
    return FramePolicy.for_simulator(sim, hidden=cfg.hidden, min_a=cfg.min_a, max_abs_da=cfg.max_abs_da,
                                     steered=reads_heading(sim.body.dim, cfg.steer), mirror=cfg.mirror)


def _load_checkpoint(path, cfg, sim):
    """The checkpoint at ``path``, its tensors on the CPU whichever device wrote it (so that a checkpoint
    written on a GPU loads on a machine without one); :func:`train` moves them to ``cfg.device``. A ValueError
    naming the file and what is wrong: unreadable, a key missing (a checkpoint edited by hand), trained with
    other settings, or on another creature (``sim``'s content differs from the one recorded, whatever its
    name or path)."""
    try:
        ckpt = load_checkpoint(path)
    except Exception as e:  # noqa: BLE001 - truncated, garbage or foreign files fail in many ways
        # torch >= 2.4 loads tensors, numbers and containers only: garbage and foreign objects alike fail there
        # with "Weights only load failed", a page of advice (to load it unsafely) around one line of reason.
        reason = re.search(r"WeightsUnpickler error:\s*(.+)", str(e))
        detail = reason.group(1).strip() if reason else " ".join(str(e).split())
        raise ValueError(f"{path} is corrupt or not a diffsoft checkpoint, which holds only tensors, numbers and "
                         f"containers ({type(e).__name__}: {detail}); delete it to start over, or resume from a "
                         f"copy of the run") from None
    if not isinstance(ckpt, dict) or "version" not in ckpt:
        raise ValueError(f"{path} is not a diffsoft checkpoint (no version); delete it to start over")
    if ckpt.get("version") != 2:
        raise ValueError(f"{path} is a version {ckpt.get('version')} checkpoint (before the critic); this "
                         f"trainer resumes version 2 only")
    missing = [k for k in _CHECKPOINT_KEYS if k not in ckpt]
    pool = ckpt.get("pool")
    if not missing and not isinstance(pool, dict):
        missing = ["pool"]
    missing += [f"pool.{k}" for k in _POOL_KEYS if not missing and k not in pool]
    if missing or not isinstance(ckpt["config"], dict):
        raise ValueError(f"{path} lacks key {(missing or ['config'])[0]!r}: an incomplete or hand-edited checkpoint "
                         f"(diffsoft writes {', '.join(_CHECKPOINT_KEYS)}); delete it to start over, or resume from "
                         f"a copy of the run")
    it, seconds = ckpt["iteration"], ckpt.get("train_seconds")
    if isinstance(it, bool) or not isinstance(it, int) or it < 0 or not isinstance(ckpt.get("history"), list) \
            or isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise ValueError(f"{path}: key 'iteration' must be an int >= 0, 'history' a list and 'train_seconds' a "
                         f"finite number, got {it!r}, {type(ckpt.get('history')).__name__}, {seconds!r}: a hand-edited "
                         f"checkpoint; delete it to start over, or resume from a copy of the run")
    # (drift_weight compared where it changes the reward, on either side: see _without_idle_drift)
    wanted = dataclasses.asdict(_without_idle_drift(cfg, sim))
    stored = dataclasses.asdict(_without_idle_drift(TrainConfig.recorded(ckpt["config"]), sim))
    # A checkpoint that records its creature's content may resume under another name or path for it.
    may_change = TrainConfig.RESUMABLE + (("creature",) if "creature" in ckpt else ())
    differ = [k for k, v in wanted.items() if k not in may_change and stored[k] != v]
    # the creature before the settings, since another one changes those that default to the creature's (min_a)
    # too; not where the dtype changed, which changes the creature's rounding (the settings' error names it)
    if "creature" in ckpt and stored["dtype"] == wanted["dtype"]:
        changed = fingerprint_changes(ckpt["creature"], sim)
        if changed:
            raise ValueError(f"{path} was trained on another creature than {cfg.creature!r} is now: its "
                             f"{', '.join(changed)} differ (the checkpoint records the creature's content, not its "
                             f"name or path); resume with the creature it was trained on, or start a new run in "
                             f"another out_dir")
    if differ:
        raise ValueError(f"{path} was trained with other settings ({', '.join(f'{k}={stored[k]!r}' for k in differ)}"
                         f"); resume with the same ones (only {', '.join(TrainConfig.RESUMABLE)} may change)")
    return ckpt


def _unsteered_3d(ckpt, policy):
    """The reason a 3D checkpoint's policy does not fit, where it was written before 3D policies read their
    heading (:func:`~diffsoft.policy.reads_heading`), else ''."""
    stored = ckpt.get("policy")
    weight = stored.get("fc1.weight") if isinstance(stored, dict) else None
    if policy.dim == 3 and isinstance(weight, torch.Tensor) and weight.dim() == 2 and \
            weight.shape[1] == policy.fc1.in_features - policy.dim:
        return ("; its policy was written before every 3D policy read its heading (diffsoft.policy.reads_heading) "
                "and cannot resume")
    return ""


def evaluate(cfg, sim, policy):
    """The training's evaluation of ``policy``, as its history records it: ``{"eval_distance": ...}``, the
    distance it walks along +x in ``eval_horizon`` steps from rest (:func:`~diffsoft.policy.distance_walked`);
    with ``steer``, the mean over :data:`EVAL_HEADINGS` of the distance along each, and in 3D ``"eval_across"``,
    the mean of how far its centre of mass ended off each heading's line (:func:`~diffsoft.policy.moves_along`)."""
    if not cfg.steer:
        return {"eval_distance": distance_walked(sim, policy, cfg.eval_horizon)}
    along, across = moves_along(sim, policy, cfg.eval_horizon, EVAL_HEADINGS[sim.body.dim])
    evaluation = {"eval_distance": along.mean().item()}
    if sim.body.dim == 3:
        evaluation["eval_across"] = across.mean().item()
    return evaluation


def evaluation_score(cfg, evaluation):
    """What ``keep_best`` ranks an :func:`evaluate` result by: its distance, less ``drift_weight`` times its
    distance off the headings (steered in 3D), as the reward charges each step's move across its heading: the
    policy that went furthest is not the best one if it went there off its commands."""
    return evaluation["eval_distance"] - cfg.drift_weight * evaluation.get("eval_across", 0.0)


def lasts(cfg, sim, policy):
    """Whether ``policy``'s gait lasts (:attr:`~diffsoft.policy.Gait.lasts`: over 1,000 steps from rest it keeps
    walking and never falls), along +x, or with ``steer`` toward each of :data:`EVAL_HEADINGS` (one batch). A
    gait that does not walk in its first 100 steps (:data:`~diffsoft.policy.WALKS`) is told in those 100."""
    headings = EVAL_HEADINGS[sim.body.dim] if cfg.steer else None

    def gaits(steps):
        if headings is None:
            return [gait(sim, policy, steps)]
        xs, _ = run_policy(sim, policy, steps, batch=len(headings),
                           heading=torch.tensor(headings, dtype=sim.body.dtype, device=sim.body.device))
        return [Gait.of(sim, xs[:, i], 100, h) for i, h in enumerate(headings)]

    return all(g.first >= WALKS for g in gaits(100)) and all(g.lasts for g in gaits(1000))


@dataclasses.dataclass
class _Evaluated:
    """The run's evaluated policies, each ``{"score": evaluation_score, "iteration": before which it was
    evaluated, "policy": its state_dict}``, from which ``keep_best`` chooses (:meth:`choose`): the :data:`KEPT`
    that scored highest (the others would be checked only if none of those lasted)."""
    policies: list = dataclasses.field(default_factory=list)
    KEPT = 32

    def add(self, score, iteration, policy):
        self.policies.append({"score": score, "iteration": iteration,
                              "policy": {k: t.detach().clone() for k, t in policy.state_dict().items()}})
        self.trim()

    def trim(self):
        """Keeps the :data:`KEPT` that scored highest (a long run evaluated often: the lowest go, a NaN first)."""
        while len(self.policies) > self.KEPT:
            self.policies.remove(min(self.policies, key=_ranking))

    def choose(self, cfg, sim, policy, rank, world):
        """The highest-scoring evaluated policy whose gait :func:`lasts` (checked in the order of their scores, up
        to the first that lasts; a policy whose score is not finite is never checked), or, where none lasts, the
        highest-scoring one, with a RuntimeWarning. Loads it into ``policy`` and returns ``(its record, whether it
        lasts, how many were checked)``. Process 0 checks, and the others take its choice."""
        ranked = sorted(self.policies, key=_ranking, reverse=True)
        scored = copy.deepcopy(policy)
        chosen = [None, 0]  # (its rank, how many were checked)
        if rank == 0:
            for i, e in enumerate(e for e in ranked if math.isfinite(e["score"])):
                scored.load_state_dict(e["policy"])
                chosen[1] = i + 1
                if lasts(cfg, sim, scored):
                    chosen[0] = i
                    break
        if world > 1:
            import torch.distributed as dist
            dist.broadcast_object_list(chosen, 0)
        best = ranked[chosen[0] or 0]
        policy.load_state_dict(best["policy"])
        if chosen[0] is None and rank == 0:
            warnings.warn(f"keep_best: none of the {len(ranked)} evaluated policies it kept (the run's furthest, at "
                          f"most {self.KEPT}) has a gait that lasts (diffsoft.policy.Gait.lasts: 1,000 steps from "
                          f"rest, walking on and never falling); the result is the one that scored highest (before "
                          f"iteration {best['iteration']}, {best['score']:.3f}): train longer, or on more seeds",
                          RuntimeWarning, stacklevel=3)
        return best, chosen[0] is not None, chosen[1]


def _ranking(evaluated):
    """An evaluated policy's rank: its score, a NaN lowest."""
    return evaluated["score"] if math.isfinite(evaluated["score"]) else -math.inf


def _resumed_evaluated(path, ckpt, cfg, sim, policy):
    """The evaluated policies of the checkpoint ``ckpt`` (read from ``path``), each checked (a ValueError names
    the file and the entry a hand edit spoiled), less those at or past its iteration, which the run evaluates
    again (a run stopped by a failure saved the evaluation before it), and at most :data:`_Evaluated.KEPT`. A
    checkpoint written before every evaluated policy was kept holds only the best one (``"best"``), and one
    written before keep_best scored the drift, its distance alone: its score, where ``drift_weight`` counts
    (steered in 3D; ``cfg`` is :func:`for_creature`'s, 0 elsewhere), is evaluated again. Checkpoints written
    before keep_best hold none."""
    if "evaluated" in ckpt:
        key, entries = "evaluated", ckpt["evaluated"]
    else:
        key, best = "best", ckpt.get("best")
        if isinstance(best, dict):  # (its policy None before the first evaluation)
            best = None if best.get("policy") is None else {"score" if k == "distance" else k: v
                                                            for k, v in best.items()}
        entries = [] if best is None else [best]
    scored = copy.deepcopy(policy)
    if not isinstance(entries, list):
        entries = [entries]
    for i, e in enumerate(entries):
        name = f"{key}[{i}]" if key == "evaluated" else key
        try:
            if not isinstance(e, dict) or isinstance(e["score"], bool) or not isinstance(e["score"], (int, float)) \
                    or not is_integer(e["iteration"]):
                raise TypeError(f"'score' must be a number (NaN for a failed evaluation) and 'iteration' an int, got "
                                f"{e!r:.80}")
            scored.load_state_dict(e["policy"])
            if _non_finite(scored.state_dict()) is not None:
                raise ValueError("its policy's weights are not all finite")
        except (RuntimeError, KeyError, ValueError, TypeError, AttributeError) as err:
            raise ValueError(f"{path}: key {name!r} is not an evaluated policy of this run's ({type(err).__name__}: "
                             f"{err}); delete the checkpoint to start over, or resume from a copy of the run") from None
        if key == "best" and "distance" in ckpt["best"] and cfg.drift_weight:
            e["score"] = evaluation_score(cfg, evaluate(cfg, sim, scored))
    evaluated = _Evaluated([e for e in entries if e["iteration"] < ckpt["iteration"]])
    evaluated.trim()
    return evaluated


def train(cfg, resume=False, progress=True, log=print):
    """Trains a policy (see the module docstring) and writes the run's files under ``cfg.out_dir`` (the
    process of rank 0 writes; ``history.json`` holds the config, the history and which policy the result is).

    Returns:
        ``(policy, history)``: the policy (with ``keep_best``, the default, the furthest evaluated one whose gait
        lasts; else the final one); history is a
        list of per-iteration records: ``iteration``, ``distance``,
        ``grad_norm``, ``critic_loss``, ``value`` (see :func:`train_iteration`), ``terminated`` (with
        ``terminate_upright``: the creatures restarted after a fall in that iteration), ``sim_steps`` (creature-steps
        simulated so far, all processes, evaluation excluded), ``seconds`` (training wall time so far, evaluations
        excluded), ``cpu_seconds`` (this process's CPU time over the same spans, all its threads: on a loaded
        machine nearer the time an idle one would take) and, every ``eval_every`` iterations, :func:`evaluate`'s
        ``eval_distance`` (and, steered in 3D, ``eval_across``), before the update, at ``eval_sim_steps``.
    """
    cfg.check()
    rank, world = distributed_world()
    if cfg.batch % world:
        raise ValueError(f"batch ({cfg.batch}) must be divisible by the number of processes ({world})")
    dtype = getattr(torch, cfg.dtype)
    sim = make_creature(cfg.creature, dtype, cfg.device)
    if sim.body.num_muscles == 0:
        raise ValueError(f"creature {cfg.creature!r} has no muscles: a policy has nothing to control")
    if cfg.terrain > 0 and cfg.steer:
        warnings.warn(f"terrain ({cfg.terrain}) with steer: the terrain is laid out along +x (diffsoft.terrain; in 3D "
                      f"within a few metres of z = 0), so creatures commanded other headings walk part of the "
                      f"way, or all of it, on flat ground", UserWarning, stacklevel=2)
    cfg = for_creature(cfg, sim)  # recorded: a checkpoint compares them, whichever way they were given
    _same_settings(cfg, world)
    sim.solver_options["backward_rtol"] = cfg.backward_rtol
    torch.manual_seed(cfg.seed)
    policy = new_policy(cfg, sim)
    critic = Critic(policy.fc1.in_features, sim.body.num_muscles, cfg.critic_hidden).to(device=cfg.device,
                                                                                          dtype=dtype)
    target_critic = copy.deepcopy(critic).requires_grad_(False)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    critic_optimizer = torch.optim.Adam([flat_parameters(critic)], lr=cfg.critic_lr)
    learners = {"policy": policy, "critic": critic, "target_critic": target_critic, "optimizer": optimizer,
               "critic_optimizer": critic_optimizer}
    b = cfg.batch // world
    pool = Pool.at_rest(sim, b, cfg.episode, cfg.terrain > 0)
    ckpt_path = os.path.join(cfg.out_dir, "checkpoint.pt")
    history, start, train_seconds, evaluated = [], 0, 0.0, _Evaluated()
    if resume and not os.path.exists(ckpt_path) and rank == 0:
        log(f"no checkpoint at {ckpt_path}: a new run")
    elif not resume and os.path.exists(ckpt_path) and rank == 0:
        warnings.warn(f"{ckpt_path} exists and this run does not resume it: the new run's files replace it (resume "
                      f"with resume=True, --resume; or give another out_dir)", UserWarning, stacklevel=2)
    if _resumes(resume and os.path.exists(ckpt_path), ckpt_path, world):
        ckpt = _load_checkpoint(ckpt_path, cfg, sim)
        ckpt["critic_optimizer"] = _flat_adam_state(ckpt["critic_optimizer"])
        for name, m in learners.items():
            bad = _non_finite(ckpt.get(name))
            if bad is not None:  # (an Adam step on it would make every weight NaN for good, and say little)
                raise ValueError(f"{ckpt_path}: key '{name}.{bad}' has non-finite (NaN or infinite) values: a "
                                 f"hand-edited or corrupt checkpoint; delete it to start over, or resume from a copy "
                                 f"of the run")
            try:
                m.load_state_dict(ckpt[name])
            except (RuntimeError, KeyError, ValueError, TypeError) as e:
                raise ValueError(f"{ckpt_path}: key {name!r} does not fit this run's {name} ({type(e).__name__}: "
                                 f"{e}){_unsteered_3d(ckpt, policy)}; delete the checkpoint to start over, or resume "
                                 f"from a copy of the run") from None
        frame = [policy.center_vertex_id, policy.forward_vertex_id]
        if ckpt.get("frame", frame) != frame:  # (the same creature, but the frame's choice changed since)
            raise ValueError(f"{ckpt_path}: its policy observes the body frame of vertices {ckpt['frame']} (center, "
                             f"forward), this run's {frame}; resume with the code it was trained with, or start a new "
                             f"run in another out_dir")
        # scale, terrain, heading: absent from checkpoints written before randomize, terrain and steer
        state = {"scale": torch.ones(cfg.batch, 3, dtype=pool.x.dtype),
                 "terrain": torch.zeros(cfg.batch, 0, dtype=pool.x.dtype),
                 "heading": torch.zeros(cfg.batch, dtype=pool.x.dtype), **ckpt["pool"]}
        for k, t in state.items():
            want, kind = (cfg.batch,) + tuple(getattr(pool, k).shape[1:]), getattr(pool, k).dtype
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want or t.dtype != kind \
                    or (t.is_floating_point() and not bool(torch.isfinite(t).all())):
                raise ValueError(f"{ckpt_path}: key 'pool.{k}' must be a finite {kind} tensor of shape {want}, got "
                                 f"{f'{t.dtype} {tuple(t.shape)}' if isinstance(t, torch.Tensor) else type(t).__name__}"
                                 f"; delete the checkpoint to start over, or resume from a copy of the run")
        pool = Pool(**{k: t[rank * b:(rank + 1) * b].clone() for k, t in state.items()}).to(sim.body.device)
        history, start, train_seconds = ckpt["history"], ckpt["iteration"], ckpt["train_seconds"]
        evaluated = _resumed_evaluated(ckpt_path, ckpt, cfg, sim, policy)
        if rank == 0:
            log(f"resumed from {ckpt_path} at iteration {start}")
        if start > cfg.iterations:
            warnings.warn(f"{ckpt_path} is at iteration {start}, past iterations={cfg.iterations}: nothing is "
                          f"trained, and the result is the checkpoint's "
                          f"{'best evaluated policy (keep_best)' if cfg.keep_best else 'policy'} (resume with "
                          f"iterations >= {start} to train on)", RuntimeWarning, stacklevel=2)
    elif world > 1:
        import torch.distributed as dist
        for m in (policy, critic, target_critic):
            for p in m.parameters():
                dist.broadcast(p.data, 0)
    cpu_seconds = history[-1].get("cpu_seconds", 0.0) if history else 0.0  # absent: histories before it
    if rank == 0:
        os.makedirs(cfg.out_dir, exist_ok=True)
    bar = range(start, cfg.iterations)
    if progress and rank == 0:
        tqdm = require("tqdm", "train").tqdm
        bar = tqdm(bar, initial=start, total=cfg.iterations, desc="train", unit="it", dynamic_ncols=True)
    per_iteration = cfg.batch * cfg.window
    for it in bar:
        record = {"iteration": it}
        if it % cfg.eval_every == 0:
            evaluation = evaluate(cfg, sim, policy)
            record.update(evaluation, eval_sim_steps=it * per_iteration)
            evaluated.add(evaluation_score(cfg, evaluation), it, policy)
        t, cpu = time.perf_counter(), time.process_time()
        failures = []
        try:
            record.update(train_iteration(cfg, sim, policy, critic, target_critic, optimizer, critic_optimizer,
                                          pool, it, rank, world, failures))
        except SimulationFailure as e:  # stop, keeping every finished iteration (the pool is as it was)
            pool_state = _gathered_pool(pool, world)
            if rank == 0:
                _save_checkpoint(ckpt_path, cfg, sim, learners, pool_state, it, history, train_seconds, evaluated)
            raise SimulationFailure(f"{e}; the checkpoint {ckpt_path} holds the {it} finished iterations "
                                    f"(resume with --resume)") from e
        failures = _gathered_failures(failures, world)  # (each process's own: rank 0 logs and records them all)
        if failures:
            record["failures"] = failures
            if rank == 0:
                log(f"skipped non-converged steps: {'; '.join(failures)}")
        train_seconds += time.perf_counter() - t
        cpu_seconds += time.process_time() - cpu
        record["sim_steps"] = (it + 1) * per_iteration
        record["seconds"], record["cpu_seconds"] = train_seconds, cpu_seconds
        history.append(record)
        if progress and rank == 0:
            bar.set_postfix(distance=f"{record['distance']:.3f}", grad=f"{record['grad_norm']:.2g}",
                            critic=f"{record['critic_loss']:.2g}")
        if (it + 1) % cfg.checkpoint_every == 0 or it + 1 == cfg.iterations:
            pool_state = _gathered_pool(pool, world)
            if rank == 0:
                _save_checkpoint(ckpt_path, cfg, sim, learners, pool_state, it + 1, history, train_seconds, evaluated)
    # which policy the result is: the final one, or keep_best's (the iteration before which it was evaluated)
    result = {"iteration": max(start, cfg.iterations), "keep_best": cfg.keep_best}
    if cfg.keep_best:
        last = evaluation_score(cfg, evaluate(cfg, sim, policy))
        evaluated.add(last, max(start, cfg.iterations), policy)  # (a resumed run may be past iterations)
        best, lasting, checked = evaluated.choose(cfg, sim, policy, rank, world)
        result.update(iteration=best["iteration"], score=best["score"], lasts=lasting, checked=checked)
        if rank == 0:
            log(f"the result is the {'best evaluated policy whose gait lasts' if lasting else 'best evaluated policy'}"
                f": before iteration {best['iteration']}, {best['score']:.3f} in {cfg.eval_horizon} steps (the last "
                f"policy: {last:.3f}; evaluation_score; {checked} of {len(evaluated.policies)} checked over 1,000 "
                f"steps)")
    if rank == 0:
        save_algovivo_policy(policy, os.path.join(cfg.out_dir, "policy.json"))
        with open(os.path.join(cfg.out_dir, "history.json"), "w") as f:
            # (a skipped step's non-finite critic loss or gradient norm is written null: strict JSON)
            json.dump(finite_or_null({"config": dataclasses.asdict(cfg), "history": history, "result": result}), f,
                      indent=1, allow_nan=False)
    if world > 1:
        # A gloo thread frees a collective's tensors (their Python objects) when it drops its handle, after the
        # call returned; in a process that had gone on to exit, in the interpreter's teardown, where taking the
        # GIL for that aborted it ("terminate called without an active exception"; one two-process run in about
        # nine under torch 2.15). A last barrier holds the collectives before it, and its handle, kept until
        # exit, is freed by the main thread.
        import torch.distributed as dist
        global _LAST_COLLECTIVE
        _LAST_COLLECTIVE = dist.barrier(async_op=True)
        _LAST_COLLECTIVE.wait()
    return policy, history
