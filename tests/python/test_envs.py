"""diffsoft.envs: the locomotion task as Gymnasium environments (skipped where gymnasium is not installed;
test_packaging checks that importing diffsoft.envs without it names the extra)."""
import subprocess
import sys

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium")
from gymnasium.utils.env_checker import check_env  # noqa: E402
from gymnasium.vector import AutoresetMode  # noqa: E402

from diffsoft import creatures  # noqa: E402
from diffsoft.envs import LocomotionEnv, LocomotionVectorEnv  # noqa: E402
from diffsoft.ppo import PPOConfig, collect, GaussianFramePolicy  # noqa: E402
from diffsoft.task import LocomotionTask  # noqa: E402

HORIZON = 4


def actions(n, m, steps, seed=0):
    """``(steps, n, m)`` activation changes in [-1, 1], some outside [-max_abs_da, max_abs_da]."""
    return np.random.default_rng(seed).uniform(-1, 1, (steps, n, m)).astype(np.float32)


# The observation (positions and velocities in the body frame) has no bounds: check_env's warnings about them
# say nothing wrong.
UNBOUNDED = pytest.mark.filterwarnings("ignore:.*Box observation space (minimum|maximum) value is:UserWarning")


@UNBOUNDED
def test_check_env_passes():
    check_env(LocomotionEnv(horizon=HORIZON), skip_render_check=True)


@UNBOUNDED
def test_check_env_passes_with_rendering():
    pytest.importorskip("PIL")
    env = gym.make("diffsoft/Locomotion-v0", horizon=HORIZON, render_mode="rgb_array").unwrapped
    check_env(env)
    env.reset()
    frame = env.render()
    assert frame.ndim == 3 and frame.shape[2] == 3 and frame.dtype == np.uint8


def test_spaces_are_the_policys_input_and_output():
    env = LocomotionEnv(horizon=HORIZON)
    body = env.task.sim.body
    assert env.observation_space.shape == (2 * body.dim * body.num_vertices,)
    assert env.observation_space.dtype == np.float32
    assert env.action_space.shape == (body.num_muscles,)
    assert (env.action_space.low == -1).all() and (env.action_space.high == 1).all()
    env64 = LocomotionEnv(horizon=HORIZON, dtype=torch.float64)
    obs, _ = env64.reset()
    assert obs.dtype == np.float64 and env64.action_space.dtype == np.float64
    env3d = LocomotionEnv("tetrapod", horizon=HORIZON)  # in 3D the heading (+x) follows the frame's input
    body = env3d.task.sim.body
    assert env3d.observation_space.shape == (2 * 3 * body.num_vertices + 3,) == env3d.reset()[0].shape


def test_an_episode_returns_the_distance_walked_and_truncates_at_the_horizon():
    env = LocomotionEnv(horizon=HORIZON, dtype=torch.float64)
    env.reset(seed=0)
    task, total = env.task, 0.0
    for t, da in enumerate(actions(1, env.action_space.shape[0], HORIZON)[:, 0]):
        _, reward, terminated, truncated, _ = env.step(da)
        total += reward
        assert not terminated and truncated == (t == HORIZON - 1)
    assert total == pytest.approx(task.distance(env._state).item(), abs=1e-12)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(np.zeros(env.action_space.shape))


def test_the_single_env_steps_as_ppos_collection_does():
    """The same activation changes give the same observations and rewards as diffsoft.ppo's collection (one
    definition of the task): PPO's sampled actions, replayed through the environment."""
    cfg = PPOConfig(horizon=HORIZON, envs=1, dtype="float64")
    task = LocomotionTask(creatures.make_creature("biped", torch.float64), HORIZON)
    roll = collect(task, GaussianFramePolicy(task, cfg), cfg, torch.Generator().manual_seed(0))
    env = LocomotionEnv(horizon=HORIZON, dtype=torch.float64)
    obs, _ = env.reset()
    for t in range(HORIZON):
        np.testing.assert_array_equal(obs, roll["obs"][t, 0].numpy())
        obs, reward, _, _, _ = env.step(roll["u"][t, 0].numpy())
        assert reward * cfg.reward_scale == roll["reward"][t, 0].item()


def test_bad_actions_are_refused():
    env = LocomotionEnv(horizon=HORIZON)
    env.reset()
    m = env.action_space.shape[0]
    with pytest.raises(ValueError, match=rf"action must have shape \({m},\)"):
        env.step(np.zeros(m + 1))
    bad = np.zeros(m)
    bad[1] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        env.step(bad)


def test_vector_env_spaces_and_dtypes():
    env = LocomotionVectorEnv(num_envs=3, horizon=HORIZON)
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    single = LocomotionEnv(horizon=HORIZON)
    assert env.single_observation_space == single.observation_space
    assert env.single_action_space == single.action_space
    obs, info = env.reset(seed=1)
    assert obs.shape == (3,) + single.observation_space.shape and obs.dtype == np.float32 and info == {}
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert obs.shape == (3,) + single.observation_space.shape and obs.dtype == np.float32
    assert reward.shape == (3,) and reward.dtype == np.float64
    assert terminated.dtype == truncated.dtype == np.bool_ and terminated.shape == truncated.shape == (3,)
    assert env.observation_space.contains(obs)


def test_vector_env_equals_single_envs_stepped_with_the_same_actions():
    """Creature i of the batch (one batched sim.step) sees exactly what a single environment sees, through two
    episodes and the autoresets after them (on the CPU each creature of a batch gets its own Newton solve)."""
    n = 3
    vec = LocomotionVectorEnv(num_envs=n, horizon=HORIZON, dtype=torch.float64)
    singles = [LocomotionEnv(horizon=HORIZON, dtype=torch.float64) for _ in range(n)]
    m = vec.single_action_space.shape[0]
    obs, _ = vec.reset(seed=0)
    single_obs = [e.reset(seed=0)[0] for e in singles]
    np.testing.assert_array_equal(obs, np.stack(single_obs))
    done = np.zeros(n, dtype=bool)
    for t, da in enumerate(actions(n, m, 2 * HORIZON + 2, seed=3)):
        obs, reward, terminated, truncated, _ = vec.step(da)
        for i, e in enumerate(singles):
            if done[i]:  # next-step autoreset: the reset's observation, reward 0
                o, r, te, tr = e.reset()[0], 0.0, False, False
            else:
                o, r, te, tr, _ = e.step(da[i])
            np.testing.assert_array_equal(obs[i], o)
            assert reward[i] == r and terminated[i] == te and truncated[i] == tr
        done = terminated | truncated
    assert t == 2 * HORIZON + 1 and not done.any()  # the last step was the second autoreset


def test_vector_env_autoreset_is_next_step():
    env = LocomotionVectorEnv(num_envs=2, horizon=2)
    first, _ = env.reset()
    da = np.ones((2, env.single_action_space.shape[0]), dtype=np.float32)
    _, _, _, truncated, _ = env.step(da)
    assert not truncated.any()
    last, reward, _, truncated, _ = env.step(da)
    assert truncated.all() and (reward != 0).all()
    obs, reward, terminated, truncated, _ = env.step(da)  # ignored: this step resets
    np.testing.assert_array_equal(obs, first)
    assert (reward == 0).all() and not terminated.any() and not truncated.any()


def test_vector_env_partial_reset_by_mask():
    env = LocomotionVectorEnv(num_envs=3, horizon=HORIZON)
    first, _ = env.reset()
    moved, _, _, _, _ = env.step(np.full((3, env.single_action_space.shape[0]), -1.0, dtype=np.float32))
    obs, _ = env.reset(options={"reset_mask": np.array([True, False, True])})
    np.testing.assert_array_equal(obs[[0, 2]], first[[0, 2]])
    np.testing.assert_array_equal(obs[1], moved[1])
    assert env.task.truncated(env._state).tolist() == [False, False, False]
    assert env._state.steps.tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="reset_mask"):
        env.reset(options={"reset_mask": [True, False, True]})


def test_vector_env_seeding_is_reproducible():
    def run(seed):
        env = LocomotionVectorEnv(num_envs=2, horizon=HORIZON)
        out = [env.reset(seed=seed)[0]]
        env.action_space.seed(seed)
        for _ in range(HORIZON + 1):
            out.append(env.step(env.action_space.sample())[0])
        return np.stack(out), env.np_random.random()
    (a, ra), (b, rb) = run(7), run(7)
    np.testing.assert_array_equal(a, b)
    assert ra == rb


def test_every_creature_and_creature_files_work(tmp_path):
    names = sorted(creatures.CREATURES)
    path = tmp_path / "biped_algovivo.json"
    creatures.save_algovivo(creatures.biped(), path)
    ours = tmp_path / "worm.json"
    creatures.save(creatures.worm(), ours)
    for creature in names + [str(path), str(ours)]:
        env = LocomotionVectorEnv(creature, num_envs=2, horizon=2)
        obs, _ = env.reset()
        obs, reward, _, _, _ = env.step(env.action_space.sample())
        assert np.isfinite(obs).all() and np.isfinite(reward).all(), creature


def test_gymnasium_make_and_make_vec():
    env = gym.make("diffsoft/Locomotion-v0", creature="worm", horizon=HORIZON)
    assert isinstance(env.unwrapped, LocomotionEnv)
    env.reset(seed=0)
    env.step(env.action_space.sample())
    vec = gym.make_vec("diffsoft/Locomotion-v0", num_envs=2, vectorization_mode="vector_entry_point",
                       creature="worm", horizon=HORIZON)
    assert isinstance(vec.unwrapped, LocomotionVectorEnv) and vec.num_envs == 2
    # in a fresh process, Gymnasium's "module:id" imports diffsoft.envs, which registers it
    code = ("import gymnasium as gym; env = gym.make('diffsoft.envs:diffsoft/Locomotion-v0', creature='worm', "
            "horizon=2); print(type(env.unwrapped).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "LocomotionEnv", out.stderr


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="num_envs must be a positive integer"):
        LocomotionVectorEnv(num_envs=0)
    with pytest.raises(ValueError, match="horizon must be a positive integer"):
        LocomotionEnv(horizon=0)
    with pytest.raises(ValueError, match="max_abs_da must be a positive"):
        LocomotionEnv(max_abs_da=-1.0)
    with pytest.raises(ValueError, match="render_mode"):
        LocomotionEnv(render_mode="human")
    with pytest.raises(ValueError, match="creature must be one of"):
        LocomotionEnv("no_such_creature")



def test_mistakes_between_calls_are_named(tmp_path):
    # dtypes by name, as PPOConfig takes them; anything else is refused by name
    assert LocomotionEnv("worm", horizon=HORIZON, dtype="float64").task.sim.body.dtype == torch.float64
    assert LocomotionEnv("worm", horizon=HORIZON, dtype=np.float64).task.sim.body.dtype == torch.float64
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        LocomotionEnv("worm", dtype=torch.float16)
    # an int is not a file descriptor to read (and close) but a mistake
    with open(tmp_path / "mine.txt", "w") as mine:
        with pytest.raises(TypeError, match="creature must be one of .* got int"):
            LocomotionEnv(mine.fileno())
        mine.write("still open")
    sim = creatures.worm()
    sim.dt = torch.tensor([1 / 30, 1 / 60])
    with pytest.raises(ValueError, match=r"one dt for every creature .* sim.dt of shape \(2,\)"):
        LocomotionVectorEnv(sim, num_envs=2)
    env = LocomotionEnv("worm", horizon=HORIZON)
    with pytest.raises(ValueError, match=r"reset options \['bogus'\] are not known here"):
        env.reset(options={"bogus": 1})
    env.reset()
    m = env.action_space.shape[0]
    for bad in (np.zeros(m, dtype=bool), np.array(["0"] * m), np.zeros(m, dtype=complex)):
        with pytest.raises(ValueError, match="action must be real numbers"):
            env.step(bad)
    env.close()
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(np.zeros(m, dtype=np.float32))
    vec = LocomotionVectorEnv("worm", num_envs=2, horizon=HORIZON)
    with pytest.raises(ValueError, match=r"options\['reset_mask'\] must be a numpy bool array"):
        vec.reset(options={"reset_mask": "garbage"})  # before the first reset too
    vec.reset()
    vec.close()
    with pytest.raises(RuntimeError, match="reset"):
        vec.step(np.zeros((2, m), dtype=np.float32))
    vec.reset()  # closed again: Gymnasium's close does nothing once closed, and the old episode went on
    vec.close()
    with pytest.raises(RuntimeError, match="reset"):
        vec.step(np.zeros((2, m), dtype=np.float32))


def test_dtypes_devices_renders_and_actions_of_every_kind_are_named_or_taken():
    # dtype None is the default's float32 (numpy's None is float64); beside a Simulator, dtype and device were
    # ignored, even invalid ones: now None or the creature's own
    assert LocomotionEnv("worm", horizon=HORIZON, dtype=None).task.sim.body.dtype == torch.float32
    sim = creatures.worm(dtype=torch.float64)
    assert LocomotionVectorEnv(sim, num_envs=2, dtype="float64", device="cpu").task.sim is sim
    assert LocomotionEnv(sim, device="cpu:0").task.sim is sim
    with pytest.raises(ValueError, match=r"dtype=torch.float32 \(its torch.float64\) do not fit the Simulator"):
        LocomotionEnv(sim, dtype=torch.float32)
    with pytest.raises(ValueError, match="device=meta"):
        LocomotionEnv(sim, device="meta")
    with pytest.raises(ValueError, match="device must be a torch.device or its name .* got 'gpu0'"):
        LocomotionEnv(sim, device="gpu0")
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        LocomotionEnv(sim, dtype="float16")
    # render() drew nothing without a word: without a render mode it warns, before reset or after close it raises
    env = LocomotionEnv("worm", horizon=HORIZON, render_mode="rgb_array")
    with pytest.raises(RuntimeError, match="render.. needs an episode"):
        env.render()
    vec = LocomotionVectorEnv("worm", num_envs=2, horizon=HORIZON)
    vec.reset()
    with pytest.warns(UserWarning, match="without a render mode draws nothing"):
        assert vec.render() is None
    # actions a policy returns (a tensor in autograd's graph, bfloat16) and numpy's wider kinds, taken as values
    env = LocomotionEnv("worm", horizon=HORIZON, dtype="float64")
    m = env.action_space.shape[0]
    taken = []
    for a in (torch.full((m,), 0.25, requires_grad=True), torch.full((m,), 0.25, dtype=torch.bfloat16),
              np.full(m, 0.25, dtype=np.longdouble), np.zeros(m, dtype=np.uint16), np.zeros(m, dtype=np.uint64)):
        env.reset()
        taken.append(env.step(a)[0])
    np.testing.assert_array_equal(taken[0], taken[1])
    np.testing.assert_array_equal(taken[0], taken[2])
    np.testing.assert_array_equal(taken[3], taken[4])
    env.reset()
    np.testing.assert_array_equal(env.step(np.zeros(m))[0], taken[3])


def test_the_creature_changed_after_the_environment_was_made_is_the_one_stepped():
    # The environments read the body's min_a and the simulator's dt when they were made: a min_a or dt set
    # afterwards was ignored (the activations kept the old floor, the frame rate the old dt).
    env = LocomotionEnv("worm", horizon=HORIZON, dtype="float64")
    sim = env.task.sim
    sim.body.min_a = 0.8
    env.reset()
    m = env.action_space.shape[0]
    for _ in range(3):  # contract as hard as allowed: the activations stop at the new floor
        env.step(-np.ones(m))
    assert float(env._state.a.min()) == pytest.approx(0.8)
    sim.dt = 1 / 50
    env.reset()
    assert env.metadata["render_fps"] == pytest.approx(50)
    vec = LocomotionVectorEnv("worm", num_envs=2, horizon=HORIZON)
    vec.task.sim.dt = torch.tensor([1 / 30, 1 / 60])
    with pytest.raises(ValueError, match=r"one dt for every creature .* sim.dt of shape \(2,\)"):
        vec.reset()


def test_muscles_changed_after_the_environment_was_made_are_named_not_a_shape_that_contradicts_itself():
    # The spaces are made with the body's muscles: before, the error said "must have shape (16,) (the activation
    # changes of 14 muscles)" to an action of 14, and the environment's own action_space was refused.
    env = LocomotionEnv("worm", horizon=HORIZON, dtype="float64")
    body = env.task.sim.body
    keep = slice(0, body.num_muscles - 2)
    body.muscles, body.muscle_rest_length, body.muscle_stiffness = (
        body.muscles[keep], body.muscle_rest_length[keep], body.muscle_stiffness[keep])
    env.reset()
    for action in (np.zeros(body.num_muscles), env.action_space.sample()):
        with pytest.raises(ValueError, match=f"the creature has {body.num_muscles} muscles now, but this environment "
                                             f"was made for {body.num_muscles + 2} .*make a new environment"):
            env.step(action)
    fresh = LocomotionEnv(env.task.sim, horizon=HORIZON)
    fresh.reset()
    fresh.step(fresh.action_space.sample())


def test_an_unconverged_step_is_flagged_in_the_info_not_only_by_a_warning():
    # Found by a review: with the solver cut short (max_iter 1) the rewards were wrong by 4x, and only warnings
    # (lost in RL loops and subprocesses) said so.
    single, vector = LocomotionEnv(horizon=HORIZON), LocomotionVectorEnv(num_envs=2, horizon=HORIZON)
    for env in (single, vector):
        env.reset(seed=0)
        _, _, _, _, info = env.step(env.action_space.sample())
        assert np.all(info["converged"])
        env.unwrapped.task.sim.solver_options["max_iter"] = 1
        with pytest.warns(RuntimeWarning, match="did not converge"):
            _, _, _, _, info = env.step(env.action_space.sample())
        assert not np.any(info["converged"])
    assert vector.step(vector.action_space.sample())[4]["_converged"].all()


def test_a_horizon_past_the_int64_step_counter_is_refused_by_name():
    # Found by a review: a horizon of 2**63 was taken, then overflowed the int64 step counter (torch 2: every
    # episode of the vector env truncated after one step; torch 1.13: "Overflow when unpacking long").
    for make in (LocomotionEnv, lambda **kw: LocomotionVectorEnv(num_envs=2, **kw)):
        for horizon in (2 ** 63, 2 ** 70):
            with pytest.raises(ValueError, match=r"horizon must be a positive integer below 2\*\*63"):
                make(creature="worm", horizon=horizon)
    env = LocomotionVectorEnv("worm", num_envs=2, horizon=2 ** 63 - 1)
    env.reset()
    assert not env.step(np.zeros(env.action_space.shape))[3].any()


def test_actions_in_lists_are_taken_as_arrays_or_refused_by_the_actions_shape():
    # Found by a review: lists went to np.asarray unchecked: a ragged one failed with numpy's "inhomogeneous
    # shape", a list of tensors with numpy's error (numpy 1.24) or torch's "Can't call numpy() on Tensor that
    # requires grad", where one such tensor was taken.
    vec = LocomotionVectorEnv("worm", num_envs=2, horizon=HORIZON, dtype="float64")
    m = vec.single_action_space.shape[0]
    da = actions(2, m, 1)[0].astype(np.float64)
    vec.reset()
    with pytest.raises(ValueError, match=rf"action must have shape \(2, {m}\) .* got a ragged sequence"):
        vec.step([np.zeros(m), np.zeros(m + 1)])
    with pytest.raises(ValueError, match=rf"action must have shape \(2, {m}\) .* got \(2, {m + 1}\)"):
        vec.step([torch.zeros(m + 1)] * 2)
    want = vec.step(da)[0]
    for given in ([torch.tensor(row, requires_grad=True) for row in da], tuple(torch.tensor(row) for row in da),
                  [[torch.tensor(v, requires_grad=True) for v in row] for row in da]):
        vec.reset()
        np.testing.assert_array_equal(vec.step(given)[0], want)
    env = LocomotionEnv("worm", horizon=HORIZON, dtype="float64")
    env.reset()
    want = env.step(da[0])[0]
    env.reset()
    np.testing.assert_array_equal(env.step([torch.tensor(v, requires_grad=True) for v in da[0]])[0], want)


def test_only_the_promised_dtype_names_are_taken():
    # Found by a review: names went through numpy, so dtype="float" built a float64 creature (torch.float is
    # float32) and "single", ">f4" were taken.
    for dtype, want in ((np.float32, torch.float32), (np.dtype("float64"), torch.float64), ("float32", torch.float32)):
        assert LocomotionEnv("worm", horizon=HORIZON, dtype=dtype).task.sim.body.dtype == want
    for dtype in ("float", "double", "single", ">f4", "f8", np.dtype(">f8"), float):
        with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
            LocomotionEnv("worm", horizon=HORIZON, dtype=dtype)


def test_the_ignored_action_of_a_creature_being_reset_is_not_checked():
    # Found by a review: the autoreset step's action is documented as ignored (Gymnasium's SyncVectorEnv takes
    # NaN there), yet a NaN in it was refused as non-finite.
    env = LocomotionVectorEnv("worm", num_envs=2, horizon=1)
    m = env.single_action_space.shape[0]
    first, _ = env.reset()
    assert env.step(np.zeros((2, m)))[3].all()
    obs, reward, _, truncated, _ = env.step(np.full((2, m), np.nan))  # every creature resets
    np.testing.assert_array_equal(obs, first)
    assert (reward == 0).all() and not truncated.any()
    env = LocomotionVectorEnv("worm", num_envs=2, horizon=2)
    env.reset()
    env.step(np.zeros((2, m)))
    env.reset(options={"reset_mask": np.array([False, True])})
    assert env.step(np.zeros((2, m)))[3].tolist() == [True, False]
    nan_in_0 = np.zeros((2, m))
    nan_in_0[0] = np.nan
    obs, reward, _, _, _ = env.step(nan_in_0)  # creature 0 resets: its row is ignored
    np.testing.assert_array_equal(obs[0], first[0])
    assert reward[0] == 0 and np.isfinite(obs).all()
    with pytest.raises(ValueError, match="non-finite"):
        env.step(nan_in_0)  # creature 0 steps now


def test_a_simulator_of_per_creature_values_for_another_batch_is_refused_at_construction():
    # Found by a review: a Simulator with one mass per creature of 2 was taken by LocomotionVectorEnv(num_envs=3)
    # and failed at reset() with torch's broadcast error, naming neither body.mass nor num_envs; LocomotionEnv
    # took a per-creature gravity and failed at its first step.
    sim = creatures.make_creature("worm", torch.float64)
    sim.body.mass = torch.stack([sim.body.mass, 3 * sim.body.mass])
    with pytest.raises(ValueError, match=r"num_envs=3 .* body.mass has shape \(2, "):
        LocomotionVectorEnv(sim, num_envs=3, horizon=HORIZON)
    with pytest.raises(ValueError, match=r"num_envs=1 .* body.mass has shape \(2, "):
        LocomotionEnv(sim, horizon=HORIZON)
    vec = LocomotionVectorEnv(sim, num_envs=2, horizon=HORIZON)  # one creature per mass
    vec.reset()
    assert np.isfinite(vec.step(np.full((2, vec.single_action_space.shape[0]), -1.0))[0]).all()
    sim = creatures.make_creature("worm", torch.float64)
    sim.gravity = torch.tensor([9.8, 5.0])
    with pytest.raises(ValueError, match=r"num_envs=1 .* gravity has shape \(2,\)"):
        LocomotionEnv(sim, horizon=HORIZON)


def test_a_ppo_model_reads_an_environments_observation_or_its_inputs():
    # Found by a review: a mirrored model given the environment's observation failed deep in torch ("The size of
    # tensor a (0) must match ..."), and a worm model took a biped's wider observation without a word; the
    # environment's state, which GaussianFramePolicy.inputs reads, was private.
    from diffsoft import ppo
    env = LocomotionEnv("tetrapod", horizon=2, dtype="float64")
    model = GaussianFramePolicy(env.task, PPOConfig(creature="tetrapod", horizon=2, dtype="float64"))
    assert model.mirrored and env.state is None
    obs, _ = env.reset()
    n = model.num_observations
    with pytest.raises(ValueError, match=rf"inputs must have shape \(K, 2 n_obs\).* n_obs = {n}, got \(1, {n}\).*"
                                         r"model.inputs\(env.task, env.state\)"):
        ppo.mean_action(model)(torch.as_tensor(obs)[None])
    inputs = model.inputs(env.task, env.state)
    np.testing.assert_array_equal(inputs[0, :n].numpy(), obs)
    assert ppo.mean_action(model)(inputs).shape == (1, env.action_space.shape[0])
    vec = LocomotionVectorEnv("worm", num_envs=2, horizon=2, dtype="float64")
    vec.reset()
    assert vec.state.x.shape[0] == 2
