"""Rendering: image sizes, what is drawn where, PNG frames and an animated GIF."""
import numpy as np
import pytest
import torch
from PIL import Image

from diffsoft import creatures
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
