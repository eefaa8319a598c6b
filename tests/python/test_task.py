"""diffsoft.task: the locomotion task that diffsoft.ppo and the Gymnasium environments share (no gymnasium
needed here)."""
import pytest
import torch

from diffsoft import creatures
from diffsoft.policy import FramePolicy, Gait, distance_walked, gait, run_policy
from diffsoft.task import LocomotionTask

F64 = torch.float64


@pytest.fixture(scope="module")
def task():
    return LocomotionTask(creatures.make_creature("biped", F64), horizon=3)


def test_an_episode_is_the_frame_policys_rollout(task):
    """Stepping the task with a frame policy's output gives the rollout of policy.distance_walked: the
    returns add up to its distance."""
    policy = FramePolicy.for_simulator(task.sim, center_vertex_id=task.center_vertex_id,
                                       forward_vertex_id=task.forward_vertex_id)
    state, total = task.reset(1), 0.0
    while not task.truncated(state).all():
        state, reward = task.step(state, policy(state.x, state.v))
        total += reward.item()
    assert state.steps.tolist() == [3]
    assert total == pytest.approx(task.distance(state).item(), abs=1e-12)
    assert task.distance(state).item() == pytest.approx(distance_walked(task.sim, policy, 3), abs=1e-12)


def test_a_rollout_runs_past_the_horizon_and_is_the_frame_policys_gait(task):
    """rollout's positions, past the task's horizon of 3, are run_policy's, so a gait from them is
    policy.gait's."""
    policy = FramePolicy.for_simulator(task.sim, center_vertex_id=task.center_vertex_id,
                                       forward_vertex_id=task.forward_vertex_id)
    xs = task.rollout(lambda obs: policy.head(obs), 6)
    assert xs.shape == (7, task.sim.body.num_vertices, task.sim.body.dim)
    assert torch.equal(xs, run_policy(task.sim, policy, 6)[0][:, 0])
    assert Gait.of(task.sim, xs, window=3) == gait(task.sim, policy, steps=6, window=3)
    with pytest.raises(ValueError, match="xs must be one creature's positions"):
        Gait.of(task.sim, xs[None], window=3)
    with pytest.raises(ValueError, match="a gait needs 0 < window <= steps"):
        Gait.of(task.sim, xs, window=7)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        task.rollout(lambda obs: policy.head(obs), 0)


def test_in_3d_the_task_observes_the_heading_as_the_trainers_policy_does():
    """A 3D task reads the heading +x (policy.reads_heading), so its observation is the input of the policy
    the differentiable trainer builds (steered, heading 0), and a PPO actor has that policy's shape."""
    sim = creatures.make_creature("tetrapod", F64)
    task = LocomotionTask(sim, horizon=2)
    policy = FramePolicy.for_simulator(sim, steered=True)
    assert task.steered and task.num_observations == policy.fc1.in_features == 2 * 3 * sim.body.num_vertices + 3
    state, _ = task.step(task.reset(1), torch.full((1, task.num_actions), -0.2, dtype=F64))
    obs = task.observe(state)
    assert obs.shape == (1, task.num_observations)
    torch.testing.assert_close(policy.head(obs), policy(state.x, state.v), rtol=0, atol=0)
    assert not LocomotionTask(creatures.make_creature("biped", F64)).steered


def test_actions_are_clamped_to_max_abs_da_and_activations_to_min_a(task):
    state = task.reset(2)
    da = torch.tensor([5.0, -5.0], dtype=F64)[:, None].expand(2, task.num_actions)
    state, _ = task.step(state, da)
    assert (state.a[0] == 1.0).all() and torch.allclose(state.a[1], torch.full_like(state.a[1], 1 - task.max_abs_da))
    for _ in range(3):
        state, _ = task.step(state, da)
    assert (state.a[1] == task.min_a).all()


def test_reset_where_resets_only_the_masked_creatures(task):
    state = task.reset(3)
    state, _ = task.step(state, torch.full((3, task.num_actions), -1.0, dtype=F64))
    fresh = task.reset(3)
    mixed = task.reset_where(state, torch.tensor([True, False, True]))
    for name in ("x", "v", "a", "steps", "start"):
        got, moved, rest = getattr(mixed, name), getattr(state, name), getattr(fresh, name)
        assert torch.equal(got[[0, 2]], rest[[0, 2]]) and torch.equal(got[1], moved[1]), name
    assert not torch.equal(state.x[1], fresh.x[1])  # the kept creature had moved


def test_reset_where_takes_one_flag_per_creature(task):
    # a (1,) mask reset every creature (or none); int, list and 0-dim masks failed in torch or Python
    state = task.reset(4)
    for mask in (torch.tensor([True]), torch.tensor(True), torch.ones(4, 1, dtype=torch.bool)):
        with pytest.raises(ValueError, match=r"mask must have shape \(4,\) \(one flag per creature"):
            task.reset_where(state, mask)
    for mask, got in ((torch.tensor([1, 0, 1, 0]), "torch.int64"), ([True, False, True, False], "list")):
        with pytest.raises(TypeError, match=rf"mask must be a bool tensor of shape \(4,\) .* got {got}"):
            task.reset_where(state, mask)


def test_a_state_of_another_creature_is_refused_by_shape(task):
    # a worm's task observed a biped's state as a (2, 104) observation of its own 72 inputs; step and distance
    # failed in torch
    worm = LocomotionTask(creatures.worm(dtype=F64))
    state = task.reset(2)
    message = (r"state holds x \(2, 26, 2\), v \(2, 26, 2\) and a \(2, 16\), but this task's creature takes x and "
               r"v \(B, 18, 2\) \(18 vertices in 2D\) and a \(B, 16\)")
    for use in (lambda: worm.observe(state), lambda: worm.step(state, torch.zeros(2, worm.num_actions, dtype=F64)),
                lambda: worm.distance(state), lambda: worm.reset_where(state, torch.ones(2, dtype=torch.bool))):
        with pytest.raises(ValueError, match=message):
            use()


def test_observation_and_action_sizes(task):
    body = task.sim.body
    assert task.observe(task.reset(2)).shape == (2, task.num_observations) == (2, 2 * body.dim * body.num_vertices)
    assert task.num_actions == body.num_muscles


def test_bad_arguments_name_themselves():
    sim = creatures.worm()
    with pytest.raises(ValueError, match="horizon must be a positive integer"):
        LocomotionTask(sim, horizon=2.5)
    with pytest.raises(ValueError, match="min_a must be a number in"):
        LocomotionTask(sim, min_a=1.0)
    with pytest.raises(ValueError, match="center_vertex_id and forward_vertex_id must differ"):
        LocomotionTask(sim, center_vertex_id=1, forward_vertex_id=1)
    for batch in (0, -1, 2.0, True):  # failed in torch (0 at the first step)
        with pytest.raises(ValueError, match="batch must be a positive integer"):
            LocomotionTask(sim).reset(batch)
