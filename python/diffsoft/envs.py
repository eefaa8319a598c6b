"""Gymnasium environments of the locomotion task (:class:`~diffsoft.task.LocomotionTask`), so that any RL library
trains on diffsoft: :class:`LocomotionEnv` (one creature, a ``gymnasium.Env``) and :class:`LocomotionVectorEnv`
(``num_envs`` creatures stepped as one batched ``sim.step``, a ``gymnasium.vector.VectorEnv``).

* observation: the frame policy's input (:func:`~diffsoft.policy.observe`), ``Box(-inf, inf, (2 N d,))`` in
  the creature's dtype (in 3D ``(2 N d + 3,)``, the heading +x last: :attr:`LocomotionTask.num_observations`);
* action: the activation change before the ``max_abs_da`` clamp, the frame policy's ``tanh`` output,
  ``Box(-1, 1, (M,))``; actions outside it are accepted and clamped to ``max_abs_da`` as
  :mod:`diffsoft.ppo` clamps its Gaussian samples;
* reward: the centre of mass's progress along +x in the step (metres), so that an episode's return is the
  distance walked (:mod:`diffsoft.ppo` trains on it times ``reward_scale``);
* episodes: ``horizon`` steps from rest, then ``truncated`` (a time limit); ``terminated`` is always False.

The task has no randomness (every episode starts at rest): ``reset(seed=...)`` seeds ``np_random`` only.
Needs the extra ``diffsoft[rl]`` (gymnasium). Also registered as ``gymnasium.make("diffsoft/Locomotion-v0",
creature=...)`` and ``gymnasium.make_vec("diffsoft/Locomotion-v0", num_envs=N,
vectorization_mode="vector_entry_point")``, once ``diffsoft.envs`` is imported; Gymnasium's
``"diffsoft.envs:diffsoft/Locomotion-v0"`` imports it first (without it, Gymnasium's error says only that the
namespace is not found).
"""
import warnings

import numpy as np
import torch

from ._optional import require
from .creatures import make_creature
from .simulator import Simulator
from .task import LocomotionTask

gym = require("gymnasium", "rl")
from gymnasium.vector import AutoresetMode  # noqa: E402  (after the check that names the extra)


def _task(creature, horizon, min_a, max_abs_da, dtype, device, num_envs):
    """The task of ``num_envs`` creatures on ``creature``: a name that :func:`~diffsoft.creatures.make_creature`
    knows, a creature JSON file (built in ``dtype``, float32 where None, on ``device``, the CPU where None), or a
    :class:`~diffsoft.simulator.Simulator` (whose dtype and device a ``dtype`` or ``device`` given must be, and
    whose per-creature values, if any, must be for ``num_envs`` creatures)."""
    dtype, device = _dtype(dtype), _device(device)
    if isinstance(creature, Simulator):
        sim, body = creature, creature.body
        wrong = [f"dtype={dtype} (its {body.dtype})"] if dtype not in (None, body.dtype) else []
        if device is not None and (device.type != body.device.type or device.type != "cpu" and
                                   device.index not in (None, body.device.index)):  # (the CPU has one device)
            wrong.append(f"device={device} (its {body.device})")
        if wrong:
            raise ValueError(f"{' and '.join(wrong)} do not fit the Simulator's creature: leave them None, or pass "
                             f"the creature's name or file to build it in them")
    else:
        sim = make_creature(creature, torch.float32 if dtype is None else dtype, device or "cpu")
    _frame_rate(sim)
    _check_batch(sim, num_envs)
    return LocomotionTask(sim, horizon, min_a, max_abs_da)


def _check_batch(sim, num_envs):
    """A ValueError naming the first of the Simulator's values that a step of ``num_envs`` creatures refuses (a
    body field, constant or collider's with one value per creature for another number of creatures): the
    simulator's own check (:meth:`~diffsoft.simulator.Simulator.step_problem`), here rather than at a step."""
    x, v = sim.rest_state
    a = x.new_ones(num_envs, sim.body.num_muscles) if sim.body.num_muscles else None
    try:
        with torch.no_grad():
            sim.step_problem(x.expand(num_envs, -1, -1), v.expand(num_envs, -1, -1), a)
    except ValueError as e:
        raise ValueError(f"the Simulator cannot step num_envs={num_envs} creature(s)"
                         f"{' (a LocomotionEnv steps 1)' if num_envs == 1 else ''}: {e}") from None


def _device(device):
    """``device`` as a torch.device (None stays None), or a ValueError naming it."""
    if device is None or isinstance(device, torch.device):
        return device
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be a torch.device or its name ('cpu', 'cuda:0', ...), got {device!r} "
                         f"({e})") from None


def _frame_rate(sim):
    """Frames per second of real time, one per step of ``sim.dt``; a ValueError where it has one per creature."""
    if isinstance(sim.dt, torch.Tensor) and sim.dt.numel() > 1:
        raise ValueError(f"the environments need a Simulator with one dt for every creature (a frame rate), got "
                         f"sim.dt of shape {tuple(sim.dt.shape)}")
    return 1.0 / float(sim.dt)


def _dtype(dtype):
    """torch.float32 or torch.float64, also by name ('float32', 'float64') or as numpy's (np.float32, np.float64
    or their np.dtype; None stays None); a ValueError for anything else, numpy's other names included: its
    'float' is float64, torch's float32."""
    if dtype is None or dtype in (torch.float32, torch.float64):
        return dtype
    if isinstance(dtype, str):
        name = dtype
    else:
        name = np.dtype(dtype).name if dtype in (np.float32, np.float64) else None
    if name not in ("float32", "float64"):
        raise ValueError(f"dtype must be torch.float32 or torch.float64 (or 'float32', 'float64'), got {dtype!r}")
    return getattr(torch, name)


def _spaces(task):
    """The single observation and action spaces."""
    dtype = np.dtype(str(task.sim.body.dtype).replace("torch.", ""))
    observation = gym.spaces.Box(-np.inf, np.inf, (task.num_observations,), dtype)
    action = gym.spaces.Box(-1.0, 1.0, (task.num_actions,), dtype)
    return observation, action


def _metadata(env):
    """The class's metadata and the frame rate of real time: one frame per step of ``dt``, as it is now (made
    again at each reset and render, so that a ``dt`` set after the environment was made is the one rendered)."""
    return {**type(env).metadata, "render_fps": _frame_rate(env.task.sim)}


def _values(actions):
    """``actions`` with each torch tensor in it, itself or in its lists and tuples (a policy's output, perhaps on
    a device or in autograd's graph), as a numpy array."""
    if isinstance(actions, torch.Tensor):
        t = actions.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()  # (numpy has no bfloat16)
    if isinstance(actions, (list, tuple)):
        return [_values(a) for a in actions]
    return actions


def _actions(task, actions, shape, ignored=None):
    """``actions`` as a tensor of the creature's dtype and device, or a ValueError naming what is wrong; the rows
    where ``ignored`` (``(num_envs,)`` bool) is True are taken as 0, whatever they hold."""
    if shape[-1] != task.num_actions:  # (the spaces were made with the body's muscles then)
        raise ValueError(f"the creature has {task.num_actions} muscles now, but this environment was made for "
                         f"{shape[-1]} (its action_space): its body's muscles were changed since; make a new "
                         f"environment")
    try:
        a = np.asarray(_values(actions))
    except ValueError:  # a ragged sequence (numpy's "inhomogeneous shape")
        a = None
    if a is None or a.shape != shape:
        raise ValueError(f"action must have shape {shape} (the activation changes of {task.num_actions} muscles), "
                         f"got {'a ragged sequence' if a is None else a.shape}")
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"action must be real numbers (the activation changes), got dtype {a.dtype}")
    if ignored is not None and ignored.any():
        a = np.where(ignored[:, None], 0, a)
    if not np.isfinite(a).all():
        raise ValueError("action has non-finite (NaN or infinite) entries")
    body = task.sim.body
    # (through float64: torch takes neither numpy's unsigned integers wider than 8 bits nor its long double)
    return torch.as_tensor(a.astype(np.float64), dtype=body.dtype, device=body.device)


def _check_options(options, known):
    """A ValueError for reset options that are not a dict, or that hold keys other than ``known``."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise ValueError(f"reset options must be a dict, got {type(options).__name__}")
    unknown = sorted(map(str, set(options) - set(known)))
    if unknown:
        raise ValueError(f"reset options {unknown} are not known here; this environment takes "
                         f"{list(known) or 'none'}")


def _numpy(t):
    return t.detach().cpu().numpy()


def _render(env, frames):
    """``frames(task, state)`` with ``render_mode="rgb_array"``; None, with a warning, without a render mode (as
    Gymnasium's environments do); a RuntimeError before ``reset()`` or after ``close()``."""
    if env.render_mode is None:
        warnings.warn(f"{type(env).__name__}.render() without a render mode draws nothing: make the environment "
                      f"with render_mode='rgb_array'", UserWarning, stacklevel=3)
        return None
    if env._state is None:
        raise RuntimeError("render() needs an episode: call reset() first (and again after close())")
    env.metadata = _metadata(env)
    return frames(env.task, env._state)


def _frame(task, state, i):
    """An RGB array ``(H, W, 3)`` of creature ``i`` (:func:`~diffsoft.render.render_frame`)."""
    from .render import render_frame
    return np.asarray(render_frame(task.sim, state.x[i], state.a[i]))


class LocomotionEnv(gym.Env):
    """One creature of the locomotion task (see the module docstring).

    Args:
        creature: a name of :data:`~diffsoft.creatures.CREATURES`, a creature JSON file (algovivo's or
            diffsoft's), or a :class:`~diffsoft.simulator.Simulator`.
        horizon, min_a, max_abs_da: the task's (:class:`~diffsoft.task.LocomotionTask`; :mod:`diffsoft.ppo`'s
            defaults; ``min_a`` None: the creature's).
        dtype, device: the creature's, when it is built here from a name or file (None: float32, on the CPU);
            with a Simulator, None or its own. ``dtype``: torch.float32 or torch.float64, by name (``"float32"``,
            ``"float64"``) or numpy's (``np.float32``, ``np.float64``).
        render_mode: None or ``"rgb_array"`` (:func:`~diffsoft.render.render_frame`; needs ``diffsoft[render]``).

    A Simulator with per-creature values (a body field or constant with a leading batch dimension, domain
    randomisation) needs as many creatures as the environment steps: one here, ``num_envs`` in
    :class:`LocomotionVectorEnv`. Actions may be numpy arrays, torch tensors (detached), or lists and tuples of
    either, of the action space's shape.
    """
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, creature="biped", horizon=100, min_a=None, max_abs_da=0.3, dtype=None, device=None,
                 render_mode=None):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.task = _task(creature, horizon, min_a, max_abs_da, dtype, device, 1)
        self.metadata = _metadata(self)
        self.observation_space, self.action_space = _spaces(self.task)
        self.render_mode = render_mode
        self._state = None

    def reset(self, *, seed=None, options=None):
        """The creature at rest at its start: ``(observation, {})`` (the task's reset is deterministic; ``seed``
        seeds ``self.np_random`` as Gymnasium's contract asks)."""
        super().reset(seed=seed)
        _check_options(options, ())
        self.metadata = _metadata(self)
        self._state = self.task.reset(1)
        return self._observation(), {}

    def step(self, action):
        """One simulator step under ``action`` (the activation changes, clamped to ``max_abs_da``):
        ``(observation, reward, False, truncated, {"converged": c})``, ``c`` whether the simulator's step reached
        Newton's tolerance (where not, the simulator also warns); the episode is truncated after ``horizon``
        steps."""
        if self._state is None or bool(self.task.truncated(self._state)):
            raise RuntimeError("step() needs an episode in progress: call reset() first (and after each episode's "
                               f"{self.task.horizon} steps)")
        da = _actions(self.task, action, self.action_space.shape)
        self._state, reward, info = self.task.step(self._state, da[None], return_info=True)
        truncated = bool(self.task.truncated(self._state))
        return self._observation(), float(reward), False, truncated, {"converged": bool(info.problem_converged[0])}

    def render(self):
        """An RGB frame (``(H, W, 3)`` uint8) of the creature with ``render_mode="rgb_array"``; else None, with a
        warning."""
        return _render(self, lambda task, state: _frame(task, state, 0))

    @property
    def state(self):
        """The episode's task state (:class:`~diffsoft.task.LocomotionState`, a batch of one; None before
        ``reset()`` and after ``close()``): with ``self.task``, what
        :meth:`GaussianFramePolicy.inputs <diffsoft.ppo.GaussianFramePolicy.inputs>` reads."""
        return self._state

    def close(self):
        """Ends the episode: ``step()`` then needs ``reset()`` again."""
        self._state = None
        super().close()

    def _observation(self):
        return _numpy(self.task.observe(self._state))[0]


class LocomotionVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` creatures of the locomotion task stepped together: one batched ``sim.step`` per step.

    Autoreset is Gymnasium's default, ``AutoresetMode.NEXT_STEP``: the step after the one that returned
    ``truncated`` for a creature resets it (its action is ignored, unchecked, as in Gymnasium's
    ``SyncVectorEnv``: NaN is taken; its reward is 0, and the observation is its first).
    ``reset(options={"reset_mask": mask})`` resets only the creatures in ``mask`` (``(num_envs,)`` bool). Arguments
    as :class:`LocomotionEnv`'s; ``render()`` returns one frame per creature.
    """
    metadata = {"render_modes": ["rgb_array"], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, creature="biped", num_envs=1, horizon=100, min_a=None, max_abs_da=0.3, dtype=None,
                 device=None, render_mode=None):
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.task = _task(creature, horizon, min_a, max_abs_da, dtype, device, int(num_envs))
        self.metadata = _metadata(self)
        self.num_envs = int(num_envs)
        self.single_observation_space, self.single_action_space = _spaces(self.task)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.render_mode = render_mode
        self._state = None
        self._autoreset = np.zeros(self.num_envs, dtype=np.bool_)

    def reset(self, *, seed=None, options=None):
        """Every creature at rest at its start, or those of ``options["reset_mask"]``: ``(observations, {})``."""
        super().reset(seed=seed)
        _check_options(options, ("reset_mask",))
        self.metadata = _metadata(self)
        mask = (options or {}).get("reset_mask")
        if mask is not None and not (isinstance(mask, np.ndarray) and mask.dtype == np.bool_
                                     and mask.shape == (self.num_envs,)):
            raise ValueError(f"options['reset_mask'] must be a numpy bool array of shape ({self.num_envs},), "
                             f"got {mask!r}")
        if mask is None or self._state is None:
            self._state = self.task.reset(self.num_envs)
            self._autoreset[:] = False
        else:
            self._state = self.task.reset_where(self._state, torch.as_tensor(mask))
            self._autoreset[mask] = False
        return self._observation(), {}

    def step(self, actions):
        """One batched step under ``actions`` (``(num_envs, n_muscles)``), with next-step autoreset:
        ``(observations, rewards, terminated (all False), truncated, infos)``; ``infos["converged"]`` says whether
        each creature's simulator step reached Newton's tolerance (True for a creature reset this step; where
        not, the simulator also warns), with Gymnasium's mask ``infos["_converged"]`` (all True)."""
        if self._state is None:
            raise RuntimeError("step() needs reset() first")
        resetting = self._autoreset
        da = _actions(self.task, actions, self.action_space.shape, ignored=resetting)
        converged = np.ones(self.num_envs, dtype=np.bool_)
        if resetting.all():  # the common case: every episode lasts `horizon` steps from the same reset
            self._state = self.task.reset(self.num_envs)
            reward = np.zeros(self.num_envs)
        else:
            state, reward, info = self.task.step(self._state, da, return_info=True)
            converged = np.asarray(info.problem_converged, dtype=np.bool_) | resetting
            reward = _numpy(reward).astype(np.float64)
            if resetting.any():
                state = self.task.reset_where(state, torch.as_tensor(resetting))
                reward[resetting] = 0.0
            self._state = state
        truncated = _numpy(self.task.truncated(self._state))
        self._autoreset = truncated.copy()
        infos = {"converged": converged, "_converged": np.ones(self.num_envs, dtype=np.bool_)}
        return self._observation(), reward, np.zeros(self.num_envs, dtype=np.bool_), truncated, infos

    def render(self):
        """One RGB frame per creature with ``render_mode="rgb_array"``; else None, with a warning."""
        return _render(self, lambda task, state: tuple(_frame(task, state, i) for i in range(self.num_envs)))

    @property
    def state(self):
        """The episodes' task state (:class:`~diffsoft.task.LocomotionState`, a batch of ``num_envs``; None
        before ``reset()`` and after ``close()``), as :attr:`LocomotionEnv.state`."""
        return self._state

    def close(self, **kwargs):
        """Ends the episodes: ``step()`` then needs ``reset()`` again (after every close: Gymnasium's own
        ``close`` does nothing once the environment is closed)."""
        self._state = None
        super().close(**kwargs)

    def _observation(self):
        return _numpy(self.task.observe(self._state))


gym.register("diffsoft/Locomotion-v0", entry_point=LocomotionEnv, vector_entry_point=LocomotionVectorEnv)
