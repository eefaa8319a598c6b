"""Rendering: image sizes, what is drawn where, PNG frames and an animated GIF."""
import numpy as np
import pytest
import torch
from PIL import Image

from diffsoft import creatures
from diffsoft.policy import FramePolicy, run_policy
from diffsoft.render import render_frame, render_rollout


def _colours(img):
    return np.asarray(img).reshape(-1, 3).astype(int)


def test_2d_frame_draws_body_ground_and_contracted_muscles_in_red():
    sim = creatures.biped()
    x, _ = sim.rest_state
    relaxed = _colours(render_frame(sim, x, size=(200, 150)))
    a = torch.full((sim.body.num_muscles,), 0.5)
    contracted = _colours(render_frame(sim, x, a, size=(200, 150)))
    assert relaxed.shape == (200 * 150, 3)
    red = lambda c: ((c[:, 0] > 200) & (c[:, 1] < 80) & (c[:, 2] < 80)).sum()
    assert red(relaxed) == 0 and red(contracted) > 50
    body_blue = ((relaxed == (120, 170, 220)).all(1)).sum()
    ground = ((relaxed == (200, 196, 186)).all(1)).sum()
    assert body_blue > 1000 and ground > 500
    img = np.asarray(render_frame(sim, x, size=(200, 150)))
    assert (img[-1] == (200, 196, 186)).all()  # the ground is at the bottom of the picture


def test_rollout_writes_png_frames_and_a_gif(tmp_path):
    sim = creatures.worm()
    x, v = sim.rest_state
    v[:, 0] = 3.0  # sliding: every frame differs (a GIF stores identical frames once)
    acts = torch.full((6, sim.body.num_muscles), 0.7)
    xs, _ = sim.rollout(x, v, acts)
    images = render_rollout(sim, xs, acts, gif=str(tmp_path / "worm.gif"), frames_dir=str(tmp_path / "frames"),
                            size=(120, 90))
    assert len(images) == 7
    assert sorted(p.name for p in (tmp_path / "frames").iterdir())[:2] == ["frame_00000.png", "frame_00001.png"]
    gif = Image.open(tmp_path / "worm.gif")
    assert gif.n_frames == 7 and gif.size == (120, 90)
    with pytest.raises(ValueError, match="activations"):
        render_rollout(sim, xs, acts[:3])


def test_3d_frame_shades_the_surface():
    sim = creatures.tetrapod()
    x, _ = sim.rest_state
    c = _colours(render_frame(sim, x, size=(160, 120)))
    bodyish = (c[:, 2] > c[:, 0] + 30).sum()  # bluish, shaded surface pixels
    assert bodyish > 1000
    assert len({tuple(p) for p in c[(c[:, 2] > c[:, 0] + 30)]}) >= 3  # several shades: faces differ in light


def _body_columns(img):
    """The pixel columns where the body's fill colour is."""
    return np.nonzero((np.asarray(img) == (120, 170, 220)).all(-1).any(0))[0]


def _walking_biped(frames=12):
    """The biped carried along +x over four of its lengths (positions need no physics to be drawn)."""
    sim = creatures.biped()
    x, _ = sim.rest_state
    length = np.ptp(x[:, 0].numpy())
    shift = torch.linspace(0, 4 * length, frames)
    return sim, x + torch.stack([shift, torch.zeros(frames)], -1)[:, None]


def test_the_following_camera_keeps_the_creature_centred_at_one_scale():
    sim, xs = _walking_biped()
    follow = render_rollout(sim, xs, size=(160, 120), camera="follow")
    fit = render_rollout(sim, xs, size=(160, 120))
    widths = [np.ptp(_body_columns(img)) for img in follow]
    centres = [_body_columns(img).mean() for img in follow]
    assert max(widths) - min(widths) <= 2  # the same scale in every frame
    assert all(abs(c - 80) <= 4 for c in centres), centres  # centred on the creature
    assert np.ptp(_body_columns(fit[0])) < 0.4 * widths[0]  # the fixed camera frames the whole walk: smaller
    line = np.nonzero((np.asarray(follow[0]) == (120, 116, 108)).all(-1).mean(-1) > 0.5)[0][-1]  # the ground line
    marks = [(np.asarray(img)[line + 2] == (120, 116, 108)).all(-1) for img in follow]  # just under it
    assert marks[0].sum() >= 3 and (marks[0] != marks[1]).any()  # the marks move under the creature


def test_the_following_camera_in_3d():
    sim = creatures.tetrapod()
    x, v = sim.rest_state
    v[:, 0] = 2.0
    xs, _ = sim.rollout(x, v, steps=4)
    images = render_rollout(sim, xs, size=(120, 90), camera="follow")
    bluish = [np.nonzero((np.asarray(img)[..., 2].astype(int) > np.asarray(img)[..., 0].astype(int) + 30).any(0))[0]
              for img in images]
    assert all(abs(b.mean() - 60) <= 8 for b in bluish)


def test_what_run_policy_returns_renders_as_it_is():
    sim = creatures.biped()
    policy = FramePolicy.for_simulator(sim)
    xs, acts = run_policy(sim, policy, 3)  # (T + 1, 1, N, d), (T, 1, M)
    assert len(render_rollout(sim, xs, acts, size=(60, 40))) == 4
    batch_xs, batch_acts = run_policy(sim, policy, 3, batch=3)
    one = render_rollout(sim, batch_xs, batch_acts, size=(60, 40), creature=2)
    alone = render_rollout(sim, batch_xs[:, 2], batch_acts[:, 2], size=(60, 40))
    assert all((np.asarray(a) == np.asarray(b)).all() for a, b in zip(one, alone))
    with pytest.raises(ValueError, match=r"batch of 3 creatures: pass creature="):
        render_rollout(sim, batch_xs, batch_acts)
    with pytest.raises(ValueError, match=r"creature must be an index in \[0, 3\)"):
        render_rollout(sim, batch_xs, batch_acts, creature=3)
    with pytest.raises(ValueError, match=r"activations must be \(T or T - 1, B, M\)"):
        render_rollout(sim, batch_xs, batch_acts[:, 0], creature=0)
    with pytest.raises(ValueError, match=r"creature=0 picks a creature of a batch, but xs is not one"):
        render_rollout(sim, batch_xs[:, 0], creature=0)


def test_unknown_keywords_and_cameras_are_refused_by_name():
    sim, xs = _walking_biped(2)
    with pytest.raises(TypeError, match=r"render_rollout\(\) got an unexpected keyword argument 'zoom'"):
        render_rollout(sim, xs, zoom=2)
    with pytest.raises(ValueError, match=r"camera must be 'fit' or 'follow', got 'track'"):
        render_rollout(sim, xs, camera="track")


def test_rollouts_refuse_up_front_what_they_once_failed_on_after_drawing(tmp_path):
    sim = creatures.biped(dtype=torch.float64)
    x, _ = sim.rest_state
    xs = torch.stack([x, x])
    with pytest.raises(ValueError, match="xs must hold at least one frame, got 0"):
        render_rollout(sim, xs[:0])
    with pytest.raises(ValueError, match=r"fps must be a number >= 0.0015"):
        render_rollout(sim, xs, gif=str(tmp_path / "a.gif"), fps=1e-6)
    with pytest.raises(ValueError, match="activation has non-finite"):
        render_frame(sim, x, torch.full((sim.body.num_muscles,), float("nan")))
    with pytest.raises(ValueError, match="activations has non-finite"):
        render_rollout(sim, xs, torch.full((2, sim.body.num_muscles), float("nan")))
    # a dt that is a tensor (an optimizer's), and a path whose extension is not .gif: a GIF, in real time
    sim.dt = torch.tensor(0.05, dtype=torch.float64, requires_grad=True)
    render_rollout(sim, torch.stack([x, x + 0.05]), gif=str(tmp_path / "a.jpg"))  # (Pillow merges equal frames)
    gif = Image.open(tmp_path / "a.jpg")
    assert gif.format == "GIF" and gif.info["duration"] == 50


def test_a_view_too_small_to_draw_and_a_ground_per_creature_are_refused():
    # A review: bounds 1e-9 wide took PIL 14-22 s a frame (polygons billions of pixels away), 1e-310 drew nothing;
    # one ground height per creature raised "Boolean value of Tensor ... is ambiguous".
    sim = creatures.biped()
    x, _ = sim.rest_state
    for lo, e in ((0.3, 1e-9), (0.0, 1e-310)):
        with pytest.raises(ValueError, match="bounds must span between 1e-6"):
            render_frame(sim, x, bounds=(lo, lo + e, lo, lo + e))
    render_frame(sim, x, size=(20, 20), bounds=(0.3, 0.3 + 1e-4, 0.3, 0.3 + 1e-4))  # (fine: 0.04 s)
    sim.ground = torch.tensor([0.0, -5.0])
    with pytest.raises(ValueError, match=r"sim.ground holds one height per creature \(shape \(2,\)\)"):
        render_frame(sim, x)
