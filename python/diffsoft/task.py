"""The locomotion task: one definition of what a creature observes, how an action moves its muscles, what it is
rewarded for and when its episode ends, shared by :mod:`diffsoft.ppo` and the Gymnasium environments of
:mod:`diffsoft.envs`.

* reset: every creature at rest (``sim.rest_state``) with relaxed muscles (activation 1);
* observation: :func:`~diffsoft.policy.observe`, the frame policy's input ``(B, 2 N d)``; in 3D it also reads the
  heading +x (``(B, 2 N d + 3)``: :func:`~diffsoft.policy.reads_heading`), as the trainer's policies do;
* action: an activation change ``da (B, M)``, the frame policy's ``tanh`` output in ``[-1, 1]``; the muscles
  take ``a_t = clamp(a_{t-1} + clamp(da, -max_abs_da, max_abs_da), min_a, 1)``
  (:func:`~diffsoft.policy.next_activation`), then the simulator steps once;
* reward: the progress of the centre of mass along +x in that step, so that an episode's return is the
  distance walked;
* end: a time limit of ``horizon`` steps (a truncation: nothing terminates an episode early).
"""
import dataclasses

import torch

from ._checks import is_integer
from .policy import (center_of_mass_x, check_frame_and_limits, frame_of, next_activation, observe,
                     reads_heading)


@dataclasses.dataclass
class LocomotionState:
    """A batch of B creatures of one task: positions ``x (B, N, d)``, velocities ``v (B, N, d)``, activations
    ``a (B, M)``, the steps taken since each creature's reset ``steps (B,)`` int64, and the centre of mass's x
    at that reset ``start (B,)``."""
    x: torch.Tensor
    v: torch.Tensor
    a: torch.Tensor
    steps: torch.Tensor
    start: torch.Tensor


class LocomotionTask:
    """The task on ``sim``'s creature (see the module docstring).

    Args:
        sim: the :class:`~diffsoft.simulator.Simulator` of one creature (its dtype and device are the task's).
        horizon: the episode length in steps.
        min_a, max_abs_da: activations stay in ``[min_a, 1]`` and change by at most ``max_abs_da`` per step;
            ``min_a`` None: the body's (:attr:`~diffsoft.body.SoftBody.min_a`, its muscles' contraction range), as
            it is at each step.
        center_vertex_id, forward_vertex_id: the body frame of the observation (default
            :func:`~diffsoft.policy.frame_vertices`).
    """

    def __init__(self, sim, horizon=100, min_a=None, max_abs_da=0.3, center_vertex_id=None, forward_vertex_id=None):
        if not (is_integer(horizon) and 1 <= int(horizon) < 2 ** 63):  # (steps are counted in int64)
            raise ValueError(f"horizon must be a positive integer below 2**63 (the episode length in steps), got "
                             f"{horizon!r}")
        center_vertex_id, forward_vertex_id = frame_of(sim, center_vertex_id, forward_vertex_id)
        check_frame_and_limits(sim.body.num_vertices, center_vertex_id, forward_vertex_id,
                               sim.body.min_a if min_a is None else min_a, max_abs_da)
        self.sim, self.horizon = sim, int(horizon)
        self._min_a, self.max_abs_da = None if min_a is None else float(min_a), float(max_abs_da)
        self.center_vertex_id, self.forward_vertex_id = int(center_vertex_id), int(forward_vertex_id)
        self.steered = reads_heading(sim.body.dim)

    @property
    def min_a(self):
        """The least activation: the one given, or the body's as it is now (a body whose ``min_a`` is set after
        the task was made is stepped with the new one)."""
        return self.sim.body.min_a if self._min_a is None else self._min_a

    @property
    def num_observations(self):
        """The observation's length: ``2 N d``, and ``d`` more for the heading in 3D."""
        d = self.sim.body.dim
        return 2 * self.sim.body.num_vertices * d + (d if self.steered else 0)

    @property
    def num_actions(self):
        """The action's length: the number of muscles ``M``."""
        return self.sim.body.num_muscles

    def reset(self, batch):
        """``batch`` creatures at rest with relaxed muscles."""
        if not (is_integer(batch) and batch >= 1):
            raise ValueError(f"batch must be a positive integer (the number of creatures), got {batch!r}")
        x, v = self.sim.rest_state
        x, v = x.expand(batch, -1, -1).clone(), v.expand(batch, -1, -1).clone()
        a = torch.ones(batch, self.num_actions, dtype=x.dtype, device=x.device)
        steps = torch.zeros(batch, dtype=torch.int64, device=x.device)
        return LocomotionState(x, v, a, steps, center_of_mass_x(self.sim, x))

    def reset_where(self, state, mask):
        """``state`` with the creatures where ``mask (B,)`` (bool) is True reset (the others unchanged)."""
        self._check(state)
        b = state.x.shape[0]
        if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool):
            raise TypeError(f"mask must be a bool tensor of shape ({b},) (one flag per creature of the state), got "
                            f"{mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__}")
        if mask.shape != (b,):  # (broadcast, a (1,) mask reset every creature or none)
            raise ValueError(f"mask must have shape ({b},) (one flag per creature of the state), got "
                             f"{tuple(mask.shape)}")
        fresh = self.reset(b)
        mask = mask.to(state.x.device)

        def pick(new, old):
            return torch.where(mask.view(-1, *[1] * (old.dim() - 1)), new, old)
        return LocomotionState(*(pick(getattr(fresh, f.name), getattr(state, f.name))
                                 for f in dataclasses.fields(LocomotionState)))

    def observe(self, state):
        """The frame policy's input, ``(B, num_observations)``: with the heading +x (0) where it reads one."""
        self._check(state)
        x = state.x
        heading = x.new_zeros(x.shape[0]) if self.steered else None
        return observe(x, state.v, self.center_vertex_id, self.forward_vertex_id, heading)

    def step(self, state, da, return_info=False):
        """Applies the activation changes ``da (B, M)`` (clamped to ``max_abs_da``) and steps the simulator
        once, without gradients. Returns the next state and the reward ``(B,)``: each centre of mass's
        progress along +x; with ``return_info`` also the step's :class:`~diffsoft.SolveInfo` (its
        ``problem_converged``: whether each creature's step reached Newton's tolerance)."""
        self._check(state)
        want = (state.x.shape[0], self.num_actions)
        if not isinstance(da, torch.Tensor) or tuple(da.shape) != want:  # (broadcast, (B, 1) gave every muscle one)
            raise ValueError(f"da must be a tensor of shape {want} (each creature's activation changes), got "
                             f"{tuple(da.shape) if isinstance(da, torch.Tensor) else type(da).__name__}")
        with torch.no_grad():
            before = center_of_mass_x(self.sim, state.x)
            a = next_activation(state.a, da, self.min_a, self.max_abs_da)
            x, v, info = self.sim.step(state.x, state.v, a, return_info=True)
            reward = center_of_mass_x(self.sim, x) - before
        state = LocomotionState(x, v, a, state.steps + 1, state.start)
        return (state, reward, info) if return_info else (state, reward)

    def truncated(self, state):
        """Whether each creature's episode has reached the time limit ``horizon``: ``(B,)`` bool."""
        return state.steps >= self.horizon

    def rollout(self, act, steps, observe=None):
        """One creature from reset for ``steps`` steps (past the horizon too), each action ``act(observation)``
        (``(1, 2 N d)`` to ``(1, M)``: a trained policy's deterministic one), without gradients; ``observe``: what
        ``act`` reads, from the state (default :meth:`observe`). Returns its positions ``(steps + 1, N, d)`` (for
        :meth:`~diffsoft.policy.Gait.of`)."""
        if not (is_integer(steps) and steps >= 1):
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        observe = self.observe if observe is None else observe
        state = self.reset(1)
        xs = [state.x[0]]
        with torch.no_grad():
            for _ in range(steps):
                state, _ = self.step(state, act(observe(state)))
                xs.append(state.x[0])
        return torch.stack(xs)

    def distance(self, state):
        """How far each centre of mass has moved along +x since the reset, ``(B,)``."""
        self._check(state)
        return center_of_mass_x(self.sim, state.x) - state.start

    def _check(self, state):
        """A ValueError unless ``state`` holds creatures of this task's: x and v ``(B, N, d)``, a ``(B, M)``
        (shapes only: no tensor read)."""
        n, d, m = self.sim.body.num_vertices, self.sim.body.dim, self.num_actions
        x, v, a = state.x, state.v, state.a
        if x.dim() != 3 or x.shape[1:] != (n, d) or v.shape != x.shape or a.shape != (x.shape[0], m):
            raise ValueError(f"state holds x {tuple(x.shape)}, v {tuple(v.shape)} and a {tuple(a.shape)}, but this "
                             f"task's creature takes x and v (B, {n}, {d}) ({n} vertices in {d}D) and a (B, {m}): a "
                             f"state of another creature (a task steps the states its reset makes)")
