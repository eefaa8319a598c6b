"""Pictures of a rollout with PIL: PNG frames and an animated GIF.

2D bodies are drawn as filled triangles with muscles coloured by activation (grey-blue relaxed, red
contracted) in front of the colliders (the ground, :mod:`diffsoft.colliders`); 3D bodies as their boundary surface,
flat-shaded, seen from the front-right and slightly above (an orthographic projection, painter's algorithm), with
muscles drawn on top, in front of the colliders' surfaces.
A rollout's camera frames every position in it (``camera="fit"``) or follows the creature's centre of mass at a
fixed scale (``camera="follow"``).
"""
import math
import os

import numpy as np
import torch

from ._checks import is_finite_real, is_integer
from ._optional import require
from .mesh import boundary_facets

_BACKGROUND = (250, 250, 247)
_GROUND = (200, 196, 186)
_GROUND_EDGE = (120, 116, 108)
_MIN_FPS = 1000 / 655350  # GIF frame durations are at most 65535 centiseconds
_BODY = (120, 170, 220)
_EDGE = (60, 90, 130)
_RELAXED = np.array([90, 100, 140])
_CONTRACTED = np.array([225, 40, 40])
_MAX_PIXELS = 16384


def render_frame(sim, x, activation=None, size=(480, 360), bounds=None, yaw=-35.0, pitch=20.0):
    """One image of ``sim``'s body at positions ``x``.

    Args:
        sim: a :class:`~diffsoft.simulator.Simulator` (its body and colliders are drawn; colliders with one
            value per creature of a batch are a ValueError: draw one creature's).
        x: ``(N, d)`` positions.
        activation: ``(M,)`` muscle activations (colours); None: relaxed.
        size: ``(width, height)`` in pixels.
        bounds: ``(xmin, xmax, ymin, ymax)`` of the view in projected units; default: frames ``x``.
        yaw, pitch: the 3D camera's rotation about y and then x, in degrees.

    Returns:
        a PIL RGB image.
    """
    _check_view(size, bounds, yaw, pitch)
    _check_ground(sim)
    if activation is not None and _numpy(activation).size != sim.body.num_muscles:
        raise ValueError(f"activation must have one value per muscle: got {_numpy(activation).size} for the body's "
                         f"{sim.body.num_muscles} muscles")
    if activation is not None and not np.isfinite(_numpy(activation)).all():
        raise ValueError("activation has non-finite (NaN or infinite) values")
    p, depth = _project(_positions("x", x, sim.body), yaw, pitch)
    if bounds is None:
        bounds = _bounds(p[None], sim)
    to_px = _screen(bounds, size)
    Image, ImageDraw = require("PIL.Image", "render"), require("PIL.ImageDraw", "render")
    img = Image.new("RGB", tuple(size), _BACKGROUND)
    draw = ImageDraw.Draw(img)
    body = sim.body
    _draw_colliders(draw, sim, _numpy(x), bounds, to_px, yaw, pitch)
    if sim.ground is not None and body.dim == 2:  # marks fixed in the world: the motion under a following camera
        gy = to_px(np.array([[0.0, sim.ground]]))[0, 1]
        for px in _marks(bounds, size):
            draw.line([px, gy, px, gy + 6], fill=_GROUND_EDGE, width=1)
    elements = body.elements.cpu().numpy()
    if body.dim == 2:
        for tri in to_px(p)[elements]:
            draw.polygon([tuple(v) for v in tri], fill=_BODY, outline=_EDGE)
    else:
        faces = boundary_facets(body.elements).numpy()
        x3 = _numpy(x)
        normals = np.cross(x3[faces[:, 1]] - x3[faces[:, 0]], x3[faces[:, 2]] - x3[faces[:, 0]])
        normals = _rotate(normals, yaw, pitch)
        normals /= np.linalg.norm(normals, axis=1, keepdims=True) + 1e-12
        shade = 0.35 + 0.65 * np.abs(normals[:, 2])
        px = to_px(p)
        for f in np.argsort(depth[faces].mean(1)):  # far to near
            colour = tuple(int(c * shade[f]) for c in _BODY)
            draw.polygon([tuple(v) for v in px[faces[f]]], fill=colour, outline=_EDGE)
    if body.num_muscles:
        a = np.ones(body.num_muscles) if activation is None else _numpy(activation).reshape(-1)
        px = to_px(p)
        for (i, j), ai in zip(body.muscles.cpu().numpy(), a):
            c = min(max((1.0 - ai) / 0.5, 0.0), 1.0)  # 1 relaxed .. 0.5 and below fully red
            colour = tuple(int(v) for v in (1 - c) * _RELAXED + c * _CONTRACTED)
            draw.line([tuple(px[i]), tuple(px[j])], fill=colour, width=3)
    return img


def render_rollout(sim, xs, activations=None, gif=None, frames_dir=None, fps=None, size=(480, 360), every=1, *,
                   creature=None, camera="fit", yaw=-35.0, pitch=20.0):
    """Renders a rollout; writes an animated GIF and/or one PNG per frame.

    ``render_rollout(sim, *run_policy(sim, policy, steps))`` draws a rollout of
    :func:`~diffsoft.policy.run_policy` (one creature); ``render_rollout(sim, xs, activations)`` one of
    :meth:`Simulator.rollout <diffsoft.simulator.Simulator.rollout>`.

    Args:
        sim: the :class:`~diffsoft.simulator.Simulator` of the rollout (its body and ground are drawn).
        xs: ``(T, N, d)`` positions, or ``(T, B, N, d)``: a batch of creatures, of which ``creature`` is drawn.
        activations: ``(T, M)`` or ``(T - 1, M)`` (the activation applied to reach each frame; frame 0 then
            shows relaxed muscles), ``(T, B, M)`` or ``(T - 1, B, M)`` with a batch, or None.
        gif: path of the GIF to write, or None.
        frames_dir: directory for ``frame_00000.png``, ..., or None.
        fps: GIF frame rate; default real time, ``1 / (dt * every)``.
        size: ``(width, height)`` in pixels.
        every: draw every ``every``-th frame.
        creature: which creature of a batch ``xs`` to draw; may be left out when the batch holds one.
        camera: ``"fit"``: fixed, framing every position of the rollout (a long walk makes the creature
            small); ``"follow"``: at a fixed scale that frames the creature's largest extent around its centre
            of mass over the rollout, centred on that centre of mass in every frame (in 2D horizontally,
            with the ground in view at a fixed height; the ground's marks show the motion).
        yaw, pitch: the 3D camera's rotation about y and then x, in degrees.

    Returns:
        the list of PIL images.
    """
    xs = _numpy(xs)
    acts = None if activations is None else _numpy(activations)
    if xs.ndim == 4:
        if creature is None and xs.shape[1] != 1:
            raise ValueError(f"xs holds a batch of {xs.shape[1]} creatures: pass creature= (an index in "
                             f"[0, {xs.shape[1]})) to say which one to draw")
        creature = 0 if creature is None else creature
        if not (is_integer(creature) and 0 <= creature < xs.shape[1]):
            raise ValueError(f"creature must be an index in [0, {xs.shape[1]}) of the batch xs, got {creature!r}")
        if acts is not None and (acts.ndim != 3 or acts.shape[1] != xs.shape[1]):
            raise ValueError(f"activations must be (T or T - 1, B, M) with B = {xs.shape[1]} like xs, got shape "
                             f"{acts.shape}")
        xs, acts = xs[:, creature], None if acts is None else acts[:, creature]
    elif creature is not None:
        raise ValueError(f"creature={creature!r} picks a creature of a batch, but xs is not one: its shape is "
                         f"{xs.shape}, not (T, B, N, d)")
    if len(xs) == 0:
        raise ValueError("xs must hold at least one frame, got 0")
    xs = _positions("xs", xs, sim.body, frames=True)
    if not (is_integer(every) and every >= 1):
        raise ValueError(f"every must be an integer >= 1, got {every!r}")
    if fps is not None and not (is_finite_real(fps) and fps >= _MIN_FPS):
        raise ValueError(f"fps must be a number >= {_MIN_FPS:g} (a GIF shows a frame for at most 655.35 s) or None, "
                         f"got {fps!r}")
    if camera not in ("fit", "follow"):
        raise ValueError(f"camera must be 'fit' or 'follow', got {camera!r}")
    _check_view(size, None, yaw, pitch)
    _check_ground(sim)
    if acts is not None and len(acts) == len(xs) - 1:
        acts = np.concatenate([np.ones_like(acts[:1]), acts])
    if acts is not None and len(acts) != len(xs):
        raise ValueError(f"activations must have T or T - 1 = {len(xs) - 1} entries, got {len(acts)}")
    if acts is not None and not np.isfinite(acts).all():
        raise ValueError("activations has non-finite (NaN or infinite) values")
    frames = range(0, len(xs), every)
    projected = np.stack([_project(xs[t], yaw, pitch)[0] for t in frames])
    if camera == "fit":
        views = [_bounds(projected, sim)] * len(projected)
    else:
        views = _following(projected, _numpy(sim.body.mass), sim)
    images = [render_frame(sim, xs[t], None if acts is None else acts[t], size, view, yaw, pitch)
              for t, view in zip(frames, views)]
    if frames_dir is not None:
        os.makedirs(frames_dir, exist_ok=True)
        for k, img in enumerate(images):
            img.save(os.path.join(frames_dir, f"frame_{k:05d}.png"))
    if gif is not None:
        if fps is None:  # real time (dt: a number, or a tensor, one per creature of a batch: their mean)
            fps = max(1.0 / (float(torch.as_tensor(sim.dt, dtype=torch.float64).mean()) * every), _MIN_FPS)
        images[0].save(gif, format="GIF", save_all=True, append_images=images[1:],
                       duration=max(int(round(1000 / fps)), 20), loop=0)
    return images


def _following(projected, mass, sim, margin=0.15):
    """Per frame, the view of the "follow" camera: one size for every frame, centred on the frame's centre of
    mass (the mass-weighted mean of the projected positions: projection is linear). In 2D the vertical range is
    fixed (the rollout's heights and the ground), so only the horizontal centre moves."""
    mass = mass if mass.ndim == 1 else mass.mean(0)  # per-creature masses: their mean
    weights = mass / mass.sum()
    centres = np.einsum("tnk,n->tk", projected, weights)
    half = np.abs(projected - centres[:, None]).max((0, 1))  # the largest extent about the centre, per axis
    if sim.body.dim == 2:
        lo, hi = projected[..., 1].min(), projected[..., 1].max()
        if sim.ground is not None:
            lo = min(lo, _numpy(sim.ground).min())
        centres[:, 1], half[1] = (lo + hi) / 2, (hi - lo) / 2
    pad = margin * 2 * max(half.max(), 1e-9)
    return [(cx - half[0] - pad, cx + half[0] + pad, cy - half[1] - pad, cy + half[1] + pad) for cx, cy in centres]


def _positions(name, x, body, frames=False):
    """``x`` as a float64 array of the body's ``(N, d)`` positions (``(T, N, d)`` with ``frames``), or a
    ValueError naming ``name`` (and the first frame with a non-finite position)."""
    x = _numpy(x)
    shape = ("T",) * frames + (body.num_vertices, body.dim)
    if x.ndim != len(shape) or x.shape[-2:] != shape[-2:]:
        raise ValueError(f"{name} must be ({', '.join(map(str, shape))}) positions of the body, got shape {x.shape}")
    bad = ~np.isfinite(x).reshape(len(x) if frames else 1, -1).all(-1)
    if bad.any():
        where = f" (frame {int(np.argmax(bad))})" if frames else ""
        raise ValueError(f"{name} has non-finite (NaN or infinite) positions{where}: nothing to draw")
    return x


def _check_ground(sim):
    """A ValueError where ``sim`` holds one ground height per creature: a picture draws one creature's world."""
    if isinstance(sim.ground, torch.Tensor) and sim.ground.numel() > 1:
        raise ValueError(f"sim.ground holds one height per creature (shape {tuple(sim.ground.shape)}), and a picture "
                         f"draws one creature's world: render with a simulator of one ground height")


def _check_view(size, bounds, yaw, pitch):
    """A ValueError naming the first of the view's arguments that is not what :func:`render_frame` takes."""
    if not (isinstance(size, (tuple, list)) and len(size) == 2
            and all(is_integer(n) and 1 <= n <= _MAX_PIXELS for n in size)):
        raise ValueError(f"size must be (width, height), two integers in [1, {_MAX_PIXELS}] (pixels), got {size!r}")
    if bounds is not None and not (isinstance(bounds, (tuple, list)) and len(bounds) == 4
                                   and all(is_finite_real(b) for b in bounds)
                                   and bounds[0] < bounds[1] and bounds[2] < bounds[3]):
        raise ValueError(f"bounds must be (xmin, xmax, ymin, ymax), finite numbers with xmin < xmax and ymin < ymax, "
                         f"or None, got {bounds!r}")
    if bounds is not None:
        # a view of a few pixels per 1e-9 put the body's polygons billions of pixels away, which took PIL seconds
        # a frame; one whose span is within round-off of its place drew nothing
        extent = max(abs(float(b)) for b in bounds) + 1.0
        spans = float(bounds[1]) - float(bounds[0]), float(bounds[3]) - float(bounds[2])
        if min(spans) < 1e-6 * extent or max(spans) > 1e12:
            raise ValueError(f"bounds must span between 1e-6 of their distance from the origin (plus 1) and 1e12 along "
                             f"each axis, got {bounds!r}")
    for name, angle in (("yaw", yaw), ("pitch", pitch)):
        if not is_finite_real(angle):
            raise ValueError(f"{name} must be a finite number (degrees), got {angle!r}")


def _draw_colliders(draw, sim, x, bounds, to_px, yaw, pitch):
    """Each collider's solid (2D: filled, clipped to a box around the view) or surface (3D: shaded triangles
    within a box around the body, far to near)."""
    dim = sim.body.dim
    if dim == 2:
        xmin, xmax, ymin, ymax = bounds
        span = max(xmax - xmin, ymax - ymin)
        lo, hi = np.array([xmin - 2 * span, ymin - 2 * span]), np.array([xmax + 2 * span, ymax + 2 * span])
    else:
        lo, hi = x.min(0), x.max(0)
        pad = 0.5 * (hi - lo).max()
        lo, hi = lo - pad, hi + pad
    for collider in sim.all_colliders:
        if dim == 2:
            polygon = collider.mesh(2, lo, hi)
            if len(polygon) >= 3:
                draw.polygon([tuple(v) for v in to_px(polygon)], fill=_GROUND, outline=_GROUND_EDGE)
            continue
        points, tris = collider.mesh(3, lo, hi)
        p, depth = _project(points, yaw, pitch)
        normals = np.cross(points[tris[:, 1]] - points[tris[:, 0]], points[tris[:, 2]] - points[tris[:, 0]])
        normals = _rotate(normals, yaw, pitch)
        normals /= np.linalg.norm(normals, axis=1, keepdims=True) + 1e-12
        shade = 0.55 + 0.45 * np.abs(normals[:, 2])
        px = to_px(p)
        for t in np.argsort(depth[tris].mean(1)):
            colour = tuple(int(c * shade[t]) for c in _GROUND)
            draw.polygon([tuple(v) for v in px[tris[t]]], fill=colour, outline=colour)


def _numpy(a):
    return a.detach().cpu().numpy().astype(np.float64) if isinstance(a, torch.Tensor) else np.asarray(a, np.float64)


def _rotate(v, yaw, pitch):
    a, b = math.radians(yaw), math.radians(pitch)
    ry = np.array([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]])
    rx = np.array([[1, 0, 0], [0, math.cos(b), -math.sin(b)], [0, math.sin(b), math.cos(b)]])
    return v @ (rx @ ry).T


def _project(x, yaw, pitch):
    """Screen-plane coordinates ``(N, 2)`` (y up) and depth (larger is nearer) of positions."""
    if x.shape[-1] == 2:
        return x, np.zeros(len(x))
    r = _rotate(x, yaw, pitch)
    return r[:, :2], r[:, 2]


def _bounds(projected, sim, margin=0.15):
    lo, hi = projected.reshape(-1, 2).min(0), projected.reshape(-1, 2).max(0)
    if sim.ground is not None and sim.body.dim == 2:
        lo[1] = min(lo[1], sim.ground)
    span = max(hi[0] - lo[0], hi[1] - lo[1], 1e-9)
    pad = margin * span
    return lo[0] - pad, hi[0] + pad, lo[1] - pad, hi[1] + pad


def _marks(bounds, size, count=8):
    """Pixel columns of marks on the ground every 1, 2 or 5 times a power of ten (world units), about ``count``
    across the picture (none where the view is too wide or too narrow for floating point to place them)."""
    xmin, xmax, ymin, ymax = bounds
    scale = min(size[0] / (xmax - xmin), size[1] / (ymax - ymin))  # pixels per world unit, as _screen
    centre, half = (xmin + xmax) / 2, size[0] / 2 / scale
    span = 2 * half
    if not (math.isfinite(span) and span > 0 and math.isfinite(centre)):
        return []
    step = 10.0 ** math.floor(math.log10(span / count))
    step *= next(f for f in (1, 2, 5, 10) if span / (step * f) <= count * 1.5)
    first, last = math.ceil((centre - half) / step), math.floor((centre + half) / step)
    if not 0 <= last - first <= 2 * count:  # the view's edges lost to rounding
        return []
    return [size[0] / 2 + (k * step - centre) * scale for k in range(first, last + 1)]


def _screen(bounds, size):
    """Maps view coordinates to pixels with one scale for both axes (no distortion), y pointing down."""
    xmin, xmax, ymin, ymax = bounds
    w, h = size
    scale = min(w / (xmax - xmin), h / (ymax - ymin))
    cx, cy = (xmin + xmax) / 2, (ymin + ymax) / 2

    def to_px(p):
        return np.stack([w / 2 + (p[:, 0] - cx) * scale, h / 2 - (p[:, 1] - cy) * scale], axis=1)

    return to_px
