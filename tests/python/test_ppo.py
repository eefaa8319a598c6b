"""PPO baseline: GAE, observation normalisation, and a smoke test of the update on a tiny rollout."""
import math

import pytest
import torch

from diffsoft import creatures, ppo
from diffsoft.policy import Gait, center_of_mass_x
from diffsoft.ppo import PPOConfig
from diffsoft.task import LocomotionState, LocomotionTask


def test_gae_matches_the_recursion_written_out():
    reward = torch.tensor([[1.0], [2.0], [3.0]])
    value = torch.tensor([[0.5], [1.0], [1.5]])
    last = torch.tensor([2.0])
    g, lam = 0.9, 0.8
    d = [1 + g * 1.0 - 0.5, 2 + g * 1.5 - 1.0, 3 + g * 2.0 - 1.5]
    expected = [d[0] + g * lam * (d[1] + g * lam * d[2]), d[1] + g * lam * d[2], d[2]]
    adv, ret = ppo.gae(reward, value, last, g, lam)
    torch.testing.assert_close(adv[:, 0], torch.tensor(expected))
    torch.testing.assert_close(ret, adv + value)


def test_running_norm_equals_the_statistics_of_all_data():
    torch.manual_seed(0)
    data = torch.randn(50, 3, dtype=torch.float64) * torch.tensor([1.0, 10.0, 0.1], dtype=torch.float64) + 4
    norm = ppo.RunningNorm(3)
    for chunk in data.split(7):
        norm.update(chunk)
    torch.testing.assert_close(norm.mean, data.mean(0), rtol=1e-5, atol=1e-5)
    # up to the prior (mean 0, variance 1, weight 1e-4) that keeps the first normalisation finite
    torch.testing.assert_close(norm.var, data.var(0, unbiased=False), rtol=1e-3, atol=1e-4)


def test_ppo_update_raises_the_probability_of_advantaged_actions():
    cfg = PPOConfig(horizon=4, envs=4, steps=16, epochs=4, minibatch=8, lr=1e-2, dtype="float64")
    task = LocomotionTask(ppo.make_creature(cfg.creature, torch.float64), cfg.horizon)
    torch.manual_seed(0)
    model = ppo.GaussianFramePolicy(task, cfg)
    roll = ppo.collect(task, model, cfg, torch.Generator().manual_seed(0))
    assert roll["obs"].shape == (4, 4, 4 * task.sim.body.num_vertices) and torch.isfinite(roll["reward"]).all()
    # Actions that did better than the mean get positive advantages: the update must make them likelier.
    obs, u = roll["obs"].flatten(0, 1), roll["u"].flatten(0, 1)
    adv = torch.randn(len(obs), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    batch = {"obs": obs, "u": u, "logp": roll["logp"].flatten(), "adv": adv, "ret": torch.zeros(len(obs),
                                                                                              dtype=torch.float64)}
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    before = (model.distribution(obs)[0].log_prob(u).sum(-1) * adv).sum().item()
    ppo.ppo_update(model, optimizer, batch, cfg, torch.Generator().manual_seed(2))
    after = (model.distribution(obs)[0].log_prob(u).sum(-1) * adv).sum().item()
    assert after > before


def test_an_update_sees_the_policy_that_collected_its_rollout():
    # The observation normaliser's statistics once changed between collecting a rollout and the update on it,
    # so that the policy in PPO's ratio was another one before any step: at the defaults 96% of the first
    # update's samples lay outside the clip range. One minibatch, no step: the ratio must be 1 (KL 0).
    cfg = PPOConfig(horizon=8, envs=4, steps=32, epochs=1, minibatch=32, lr=1e-2, dtype="float64")
    task = LocomotionTask(ppo.make_creature(cfg.creature, torch.float64), cfg.horizon)
    torch.manual_seed(0)
    model = ppo.GaussianFramePolicy(task, cfg)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):  # the first rollout meets the prior statistics, the next ones those it updated
        roll = ppo.collect(task, model, cfg, g)
        mean = model.norm.mean.clone()
        _, _, kl = ppo.learn(model, torch.optim.SGD(model.parameters(), lr=0.0), roll, cfg, g)
        assert abs(kl) < 1e-12
        assert not torch.equal(model.norm.mean, mean)  # updated after the update


def test_train_ppo_smoke():
    cfg = PPOConfig(horizon=3, envs=2, steps=12, epochs=2, minibatch=4, eval_every=1, dtype="float64")
    model, history = ppo.train_ppo(cfg, progress=False)
    assert [r["sim_steps"] for r in history] == [6, 12, 12]
    # the last record is the final evaluation's, as train_ppo's docstring says: no episodes, so no distance
    assert set(history[-1]) == {"update", "eval_distance", "eval_sim_steps", "sim_steps", "seconds", "cpu_seconds"}
    assert history[-1]["update"] == 2
    assert 0 < history[0]["cpu_seconds"] < history[1]["cpu_seconds"] == history[2]["cpu_seconds"]
    assert all(math.isfinite(r["eval_distance"]) for r in history)
    # The final evaluation is the mean action's rollout, which runs past the horizon for a gait.
    task = LocomotionTask(creatures.make_creature("biped", torch.float64), horizon=3)
    xs = task.rollout(ppo.mean_action(model), 4)
    assert history[-1]["eval_distance"] == pytest.approx(
        (center_of_mass_x(task.sim, xs[3]) - center_of_mass_x(task.sim, xs[0])).item(), abs=1e-12)
    assert Gait.of(task.sim, xs, window=2).summary()["steps"] == 4


def test_a_3d_ppo_actor_reads_the_heading_as_the_trainers_policy_does():
    cfg = PPOConfig(creature="tetrapod", horizon=2, envs=2, steps=4, epochs=1, minibatch=4, eval_every=1,
                    dtype="float64")
    model, history = ppo.train_ppo(cfg, progress=False)
    task = LocomotionTask(creatures.make_creature("tetrapod", torch.float64), horizon=2)
    assert model.mean_policy.steered and model.mean_policy.fc1.in_features == task.num_observations
    assert model.mirrored  # as the trainer's policy is (policy.mirrors)
    assert all(math.isfinite(r["eval_distance"]) for r in history if "eval_distance" in r)


def test_ppo_device_is_checked():
    with pytest.raises(ValueError, match="device must be a torch device"):
        ppo.train_ppo(PPOConfig(device="gpu0"), progress=False)


def test_a_mirrored_actor_does_on_the_mirrored_state_the_mirror_image_of_what_it_does_on_the_state():
    # PPO's tetrapod actor is mirrored as the differentiable trainer's policy is, so that both learn within the
    # same family of policies: its mean is FramePolicy's mirrored output (on normalised observations), its
    # standard deviation symmetric, and on the mirrored state it acts as the mirror image.
    cfg = PPOConfig(creature="tetrapod", dtype="float64")
    task = LocomotionTask(creatures.make_creature("tetrapod", torch.float64), horizon=4)
    torch.manual_seed(0)
    model = ppo.GaussianFramePolicy(task, cfg)
    with torch.no_grad():
        model.log_std.copy_(torch.linspace(-2, -1, task.num_actions, dtype=torch.float64))
    state = task.reset(2)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        state, _ = task.step(state, torch.rand(2, task.num_actions, generator=g, dtype=torch.float64) * 2 - 1)
    mirror = model.mean_policy.mirror
    x, v, _ = mirror.state(state.x, state.v, state.x.new_zeros(2))
    image = LocomotionState(x, v, state.a, state.steps, state.start)
    with torch.no_grad():
        dist, _ = model.distribution(model.inputs(task, state))
        mirrored, _ = model.distribution(model.inputs(task, image))
        heading = state.x.new_zeros(2)
        trainer = model.mean_policy.changes(state.x, state.v, heading)  # normaliser at its prior: identity
    muscles = list(mirror.muscles)
    torch.testing.assert_close(mirrored.mean, dist.mean[:, muscles], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dist.stddev[:, muscles], dist.stddev, rtol=1e-12, atol=0)
    torch.testing.assert_close(dist.mean, trainer, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(dist.mean, dist.mean[:, muscles])  # a state that is not its own mirror image
    # The normaliser takes both observations: its statistics are those of a symmetric data set.
    model.update_norm(model.inputs(task, state))
    assert model.norm.count.item() == pytest.approx(4, abs=1e-3)


def test_ppo_mirror_is_resolved_or_refused_by_name():
    biped = LocomotionTask(creatures.make_creature("biped", torch.float64), horizon=4)
    assert not ppo.GaussianFramePolicy(biped, PPOConfig(dtype="float64")).mirrored
    with pytest.raises(ValueError, match="mirror=True"):
        ppo.GaussianFramePolicy(biped, PPOConfig(mirror=True, dtype="float64"))
    tetrapod = LocomotionTask(creatures.make_creature("tetrapod", torch.float64), horizon=4)
    assert not ppo.GaussianFramePolicy(tetrapod, PPOConfig(mirror=False, dtype="float64")).mirrored
    with pytest.raises(ValueError, match="mirror must be a bool"):
        PPOConfig(mirror="yes").check()


def test_the_building_blocks_check_their_config_and_the_task_its_actions():
    # train_ppo checked its config, but a model, a collection or an update made by hand took any: a critic of
    # width 0, a NaN gamma's losses of NaN, a minibatch of 0's "range() arg 3 must not be zero"
    cfg = PPOConfig(horizon=2, envs=2, steps=4, epochs=1, minibatch=4, dtype="float64")
    task = LocomotionTask(ppo.make_creature(cfg.creature, torch.float64), cfg.horizon)
    with pytest.raises(ValueError, match="value_hidden"):
        ppo.GaussianFramePolicy(task, PPOConfig(value_hidden=0, dtype="float64"))
    model = ppo.GaussianFramePolicy(task, cfg)
    with pytest.raises(ValueError, match="envs"):
        ppo.collect(task, model, PPOConfig(envs=0, dtype="float64"), torch.Generator())
    roll = ppo.collect(task, model, cfg, torch.Generator().manual_seed(0))
    optimizer = torch.optim.Adam(model.parameters())
    for bad in (dict(gamma=math.nan), dict(minibatch=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ppo.learn(model, optimizer, roll, PPOConfig(horizon=2, envs=2, dtype="float64", **bad), torch.Generator())
    # the task's step broadcast a (B, 1) da to every muscle
    state = task.reset(2)
    with pytest.raises(ValueError, match=rf"da must be a tensor of shape \(2, {task.num_actions}\).* got \(2, 1\)"):
        task.step(state, torch.zeros(2, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="da must be a tensor .* got list"):
        task.step(state, [[0.0] * task.num_actions] * 2)


def test_a_config_the_task_does_not_have_is_refused_and_unconverged_steps_are_counted():
    # A review: a config of another horizon, max_abs_da or min_a collected with the task's own, quietly; a clip
    # ratio of 5 was taken; PPO's runs recorded no unconverged steps (the differentiable trainer's count them).
    cfg = PPOConfig(horizon=2, envs=2, steps=4, epochs=1, minibatch=4, dtype="float64")
    task = LocomotionTask(ppo.make_creature(cfg.creature, torch.float64), cfg.horizon)
    for bad in (dict(max_abs_da=0.1), dict(min_a=0.9)):
        with pytest.raises(ValueError, match=f"PPOConfig.{next(iter(bad))} is .* but the task's is"):
            ppo.GaussianFramePolicy(task, PPOConfig(**{**dict(horizon=2, dtype="float64"), **bad}))
    with pytest.raises(ValueError, match="PPOConfig.horizon is 3 but the task's is 2"):
        ppo.collect(task, ppo.GaussianFramePolicy(task, cfg), PPOConfig(horizon=3, envs=2, dtype="float64"),
                    torch.Generator())
    with pytest.raises(ValueError, match="clip_ratio"):
        PPOConfig(clip_ratio=5.0).check()
    model = ppo.GaussianFramePolicy(task, cfg)
    assert ppo.collect(task, model, cfg, torch.Generator().manual_seed(0))["not_converged"] == 0
    task.sim.solver_options["max_iter"] = 0
    with pytest.warns(RuntimeWarning, match="did not converge"):
        assert ppo.collect(task, model, cfg, torch.Generator().manual_seed(0))["not_converged"] == 4


def test_a_horizon_past_the_int64_step_counter_is_refused_by_name():
    # Found by a review: PPOConfig(horizon=2**63) was taken, then overflowed the task's int64 step counter.
    with pytest.raises(ValueError, match=r"horizon must be a positive integer below 2\*\*63"):
        PPOConfig(horizon=2 ** 63).check()
    PPOConfig(horizon=2 ** 63 - 1).check()


def test_a_config_of_another_dtype_than_the_tasks_is_refused():
    # Found by a review: the building blocks took PPOConfig(dtype="float32") beside a float64 task, quietly
    # (the model was built in float64); creature and device are train_ppo's alone (documented).
    task = LocomotionTask(creatures.make_creature("worm", torch.float64), horizon=2)
    cfg = PPOConfig(creature="worm", horizon=2, envs=2, dtype="float32")
    with pytest.raises(ValueError, match="PPOConfig.dtype is 'float32' but the task's is 'float64'"):
        ppo.GaussianFramePolicy(task, cfg)
    model = ppo.GaussianFramePolicy(task, PPOConfig(creature="worm", horizon=2, envs=2, dtype="float64"))
    with pytest.raises(ValueError, match="PPOConfig.dtype is 'float32' but the task's is 'float64'"):
        ppo.collect(task, model, cfg, torch.Generator())


def test_the_models_input_shape_is_checked():
    # Found by a review: a non-mirrored model read the first n_obs columns of any wider input (a worm model drove
    # a biped's observation), a mirrored one failed deep in torch, a 1-D input with an IndexError.
    biped = LocomotionTask(creatures.make_creature("biped", torch.float64), horizon=2)
    worm = LocomotionTask(creatures.make_creature("worm", torch.float64), horizon=2)
    model = ppo.GaussianFramePolicy(worm, PPOConfig(creature="worm", horizon=2, dtype="float64"))
    n = worm.num_observations
    for bad, got in ((biped.observe(biped.reset(1)), rf"\(1, {biped.num_observations}\)"),
                     (worm.observe(worm.reset(1))[0], rf"\({n},\)"), ([0.0] * n, "list")):
        with pytest.raises(ValueError, match=rf"inputs must have shape \(K, n_obs\), n_obs = {n}, got {got}: make "
                                             rf"them with GaussianFramePolicy.inputs\(task, state\)"):
            ppo.mean_action(model)(bad)
    assert ppo.mean_action(model)(model.inputs(worm, worm.reset(3))).shape == (3, worm.num_actions)
    tetrapod = LocomotionTask(creatures.make_creature("tetrapod", torch.float64), horizon=2)
    mirrored = ppo.GaussianFramePolicy(tetrapod, PPOConfig(creature="tetrapod", horizon=2, dtype="float64"))
    state = tetrapod.reset(1)
    with pytest.raises(ValueError, match=rf"inputs must have shape \(K, 2 n_obs\).* n_obs = "
                                         rf"{tetrapod.num_observations}, got \(1, {tetrapod.num_observations}\)"):
        mirrored.distribution(tetrapod.observe(state))
    mirrored.distribution(mirrored.inputs(tetrapod, state))
