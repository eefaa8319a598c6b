"""Stable-Baselines3's PPO on ``diffsoft.envs.LocomotionVectorEnv``: the third method of
benchmarks/sample_efficiency.py (``--only sb3``, ``--tune-sb3``). Needs pip's torch 2.x with
``stable-baselines3`` and diffsoft built against it (benchmarks/results/peers/README.md).

SB3 has its own vector-environment interface (same-step autoreset, the final observation in ``infos``), so
:class:`SB3VecEnv` adapts the Gymnasium one: N creatures still step as one batched ``sim.step``. Evaluation is
the other methods' (the deterministic policy from rest for the horizon, the centre of mass's distance), through
the same :class:`~diffsoft.task.LocomotionTask`; creature-steps count training steps only.
"""
import time

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv, VecNormalize
from torch import nn

from diffsoft.envs import LocomotionVectorEnv
from diffsoft.policy import Gait, distance_covered

BASELINE = dict(envs=32, lr=3e-4, n_steps=100, batch_size=64, n_epochs=10, clip_range=0.2, normalize=False,
                net="sb3", log_std_init=0.0)
"""SB3's PPO defaults (MlpPolicy 64-64 tanh for both heads, log std 0, minibatch 64), except rollouts of one
episode (``n_steps`` = the horizon, 100) from each of 32 creatures, as diffsoft.ppo collects them."""

NETS = {"sb3": dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=nn.Tanh),
        "ours": dict(net_arch=dict(pi=[32], vf=[64, 64]), activation_fn=nn.ReLU)}
"""SB3's default MlpPolicy, and diffsoft.ppo's sizes (frame policy 32 ReLU; value 64-64; SB3 has one
activation for both heads, and its mean has no tanh: actions are clipped to [-1, 1])."""


class SB3VecEnv(VecEnv):
    """A :class:`~diffsoft.envs.LocomotionVectorEnv` behind SB3's VecEnv interface: a creature whose episode ends
    is reset in the same step (``reset_mask``), its last observation in ``infos[i]["terminal_observation"]``
    and ``"TimeLimit.truncated"`` set (the horizon is a time limit: SB3 bootstraps the value there)."""

    def __init__(self, venv):
        self.venv = venv
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)

    def reset(self):
        return self.venv.reset()[0]

    def step_async(self, actions):
        self._actions = actions

    def step_wait(self):
        obs, reward, terminated, truncated, _ = self.venv.step(self._actions)
        done = terminated | truncated
        infos = [{} for _ in range(self.num_envs)]
        if done.any():
            for i in np.flatnonzero(done):
                infos[i] = {"terminal_observation": obs[i],
                            "TimeLimit.truncated": bool(truncated[i] and not terminated[i])}
            obs = self.venv.reset(options={"reset_mask": done})[0]
        return obs, reward.astype(np.float32), done, infos

    def close(self):
        self.venv.close()

    def get_attr(self, attr_name, indices=None):
        return [getattr(self.venv, attr_name)] * len(list(self._get_indices(indices)))

    def set_attr(self, attr_name, value, indices=None):
        raise NotImplementedError("the creatures of a LocomotionVectorEnv share their attributes")

    def env_method(self, method_name, *method_args, indices=None, **method_kwargs):
        raise NotImplementedError("the creatures of a LocomotionVectorEnv have no methods of their own")

    def env_is_wrapped(self, wrapper_class, indices=None):
        return [False] * len(list(self._get_indices(indices)))


def deterministic(model, norm, task):
    """The deterministic policy as a function of the task's observation (normalised by ``norm``'s statistics
    when there is one), for ``task.rollout``."""
    body = task.sim.body

    def act(obs):
        obs = obs.cpu().numpy()
        if norm is not None:
            obs = norm.normalize_obs(obs)
        action, _ = model.predict(obs, deterministic=True)
        return torch.as_tensor(action, dtype=body.dtype, device=body.device)
    return act


def evaluate(model, norm, task):
    """The deterministic policy's distance from rest over the task's horizon."""
    xs = task.rollout(deterministic(model, norm, task), task.horizon)
    return distance_covered(task.sim, xs).item()


class Recorder(BaseCallback):
    """diffsoft.ppo's history: per rollout and the update after it, ``sim_steps``, ``seconds`` and ``cpu_seconds``
    (training wall-clock and process CPU time so far, evaluations excluded), and every ``eval_every`` rollouts, before it, ``eval_distance`` at
    ``eval_sim_steps``."""

    def __init__(self, task, norm, eval_every):
        super().__init__()
        self.task, self.norm, self.eval_every = task, norm, eval_every
        self.history, self.rollouts, self.eval_seconds, self.eval_cpu = [], 0, 0.0, 0.0

    def _on_training_start(self):
        self.start, self.start_cpu = time.perf_counter(), time.process_time()

    def _on_rollout_start(self):
        if self.history:  # the previous rollout's update is done
            self.history[-1].update(self.seconds())
        record = {"update": self.rollouts}
        if self.rollouts % self.eval_every == 0:
            t, cpu = time.perf_counter(), time.process_time()
            record.update(eval_distance=evaluate(self.model, self.norm, self.task), eval_sim_steps=self.num_timesteps)
            self.eval_seconds += time.perf_counter() - t
            self.eval_cpu += time.process_time() - cpu
        self.history.append(record)
        self.rollouts += 1

    def _on_rollout_end(self):
        self.history[-1]["sim_steps"] = self.num_timesteps

    def seconds(self):
        """``{"seconds": wall-clock, "cpu_seconds": CPU time}`` of training so far, evaluations excluded."""
        return {"seconds": time.perf_counter() - self.start - self.eval_seconds,
                "cpu_seconds": time.process_time() - self.start_cpu - self.eval_cpu}

    def _on_step(self):
        return True


def train_sb3(creature, horizon, budget, seed, eval_every=2, device="cpu", **settings):
    """SB3's PPO for ``budget`` creature-steps with :data:`BASELINE` updated by ``settings``. Returns
    ``(config, history, gait)``: the history in diffsoft.ppo's format, the final evaluation last, and the final
    policy's :class:`~diffsoft.policy.Gait` over 1,000 steps from rest."""
    cfg = {**BASELINE, **settings}
    unknown = set(cfg) - set(BASELINE)
    if unknown:
        raise ValueError(f"unknown SB3 settings {sorted(unknown)}; known: {sorted(BASELINE)}")
    torch.manual_seed(seed)
    venv = LocomotionVectorEnv(creature, num_envs=cfg["envs"], horizon=horizon, device=device)
    env = SB3VecEnv(venv)
    norm = VecNormalize(env, gamma=0.99) if cfg["normalize"] else None
    model = PPO("MlpPolicy", norm or env, learning_rate=cfg["lr"], n_steps=cfg["n_steps"], batch_size=cfg["batch_size"],
                n_epochs=cfg["n_epochs"], clip_range=cfg["clip_range"], seed=seed, device=device, verbose=0,
                policy_kwargs=dict(NETS[cfg["net"]], log_std_init=cfg["log_std_init"]))
    recorder = Recorder(venv.task, norm, eval_every)
    model.learn(total_timesteps=budget, callback=recorder)
    history = recorder.history
    history[-1].update(recorder.seconds())
    history.append({"update": len(history), "eval_distance": evaluate(model, norm, venv.task),
                    "eval_sim_steps": model.num_timesteps, "sim_steps": model.num_timesteps,
                    "seconds": history[-1]["seconds"], "cpu_seconds": history[-1]["cpu_seconds"]})
    task = venv.task
    gait = Gait.of(task.sim, task.rollout(deterministic(model, norm, task), 1000))
    return dict(cfg, creature=creature, horizon=horizon, steps=budget, seed=seed), history, gait
