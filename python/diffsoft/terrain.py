"""Terrain for a creature: random hilly ground (training with ``TrainConfig.terrain``, evaluation on held-out
draws) and ramps, as :class:`~diffsoft.colliders.SmoothHeightField` s in place of the flat ground.

The generator. Along x, a creature's terrain is a profile of ``PIECES[d]`` pieces, each half the length of its
body at rest, from ``x0`` (one piece ahead of its body's front) on: 96 ahead of the biped (1.5 long), whose
gaits cover about 100 in 1,000 steps; beyond them the ground goes on flat. The profile's slope is piecewise
linear through knots at the pieces' ends, each knot's slope drawn uniformly within ``±max_slope`` degrees
independently of the others (0 at the first and the last knot); the height, its integral, is sampled
``SAMPLES_PER_PIECE[d]`` times per piece, exactly. So no piece of the sampled ground is steeper than
``max_slope``, and the slope changes between neighbouring samples by at most ``2 tan(max_slope) /
SAMPLES_PER_PIECE[d]``: rolling hills. Behind ``x0`` the ground is flat at the simulator's ground height, so the
creature starts at rest on flat ground (its rest state unchanged). In 3D the height is the sum of such a
profile along x and one along z on each side of a flat band under the body (``SIDE_PIECES`` pieces each way),
each profile's slopes drawn within ``±atan(tan(max_slope) / sqrt(2))``, so that no triangle is steeper than
``max_slope``.

The ground is the samples' :class:`~diffsoft.colliders.SmoothHeightField`: the C2 cubic B-spline whose control
points they are, within ``dx^2 h'' / 6`` of them (the profile is flat at its ends), along each axis no steeper
than they are (so within ``max_slope``: in 3D each axis' slope is within ``tan(max_slope) / sqrt(2)``), and flat
up to one sample before ``x0``. On a piecewise linear :class:`~diffsoft.colliders.HeightField` of the same
samples a vertex held at a kink keeps Newton from its tolerance: training the biped on 5-degree terrain left out
about 1 creature-step in 1,000 there, none on the smooth field, and replays stall there (docs/training.md,
"Terrain"; ``benchmarks/terrain.py --solver``).
"""
import contextlib
import math

import torch

from ._checks import is_finite_real
from .body import Copies
from .colliders import SmoothHeightField
from .policy import distance_covered, run_policy

PIECES = {2: 128, 3: 64}
"""Pieces of terrain ahead of the creature along x, by the body's dimension."""

SIDE_PIECES = 8
"""Pieces of terrain on each side of the creature's band, along z (3D)."""

SAMPLES_PER_PIECE = {2: 8, 3: 4}
"""Samples of the height per piece, by the body's dimension (3D has fewer: a creature's ``(nx, nz)`` heights)."""

HELD_OUT_SEED = 20261203
"""The seed of :func:`held_out_heights`' generator. The trainer's terrains come from generators seeded by its seed
and iteration, after other draws (``diffsoft.training``), so the held-out ones are not among them."""


def grid(sim):
    """The sampling of ``sim``'s creature's terrain: ``(x0, dx, samples)``: the first sample's horizontal
    coordinates (a number in 2D, ``[x, z]`` in 3D), the samples' spacing (a number, both axes), and their shape
    ``(nx,)`` or ``(nx, nz)`` (see the module docstring)."""
    rest = sim.body.rest_positions.detach().double()
    lo, hi = rest.min(0).values.tolist(), rest.max(0).values.tolist()
    dim = sim.body.dim
    piece = (hi[0] - lo[0]) / 2
    k = SAMPLES_PER_PIECE[dim]
    x0, dx, nx = hi[0] + piece, piece / k, PIECES[dim] * k + 1
    if dim == 2:
        return x0, dx, (nx,)
    band = max(1, math.ceil((hi[2] - lo[2] + 2 * piece) / dx))  # the flat band's samples: the body, a piece each side
    z0 = (lo[2] + hi[2]) / 2 - (band / 2 + SIDE_PIECES * k) * dx
    return [x0, z0], dx, (nx, 2 * SIDE_PIECES * k + band + 1)


def _profile(pieces, k, bound, batch, generator):
    """``(batch, pieces * k + 1)`` heights every ``1 / k`` of a piece (the piece's length 1): 0, then the integral
    of a slope piecewise linear through knots at the pieces' ends, 0 at the first and last, the others drawn
    uniformly within ``±bound``."""
    knots = bound * (2 * torch.rand(batch, pieces + 1, generator=generator, dtype=torch.float64) - 1)
    knots[:, 0] = knots[:, -1] = 0
    f = torch.arange(k + 1, dtype=torch.float64) / k  # along a piece
    slope = (knots[:, :-1, None] * (1 - f) + knots[:, 1:, None] * f)  # (B, pieces, k + 1) at the samples
    rise = (slope[..., :-1] + slope[..., 1:]) / 2 / k  # each sample interval's exact integral
    return torch.cat([torch.zeros(batch, 1, dtype=torch.float64), rise.flatten(1).cumsum(-1)], -1)


def random_heights(sim, max_slope, batch=None, generator=None):
    """``batch`` terrains' heights for ``sim``'s creature (see the module docstring), above its ground, float64
    on the CPU: ``(B, *samples)`` (``(*samples,)`` when ``batch`` is None); draws from ``generator`` (torch's
    default one when None). ``max_slope`` in degrees, in ``[0, 45)``."""
    if not (is_finite_real(max_slope) and 0 <= max_slope < 45):
        raise ValueError(f"max_slope must be a number of degrees in [0, 45), got {max_slope!r}")
    _, dx, samples = grid(sim)
    dim, b = sim.body.dim, 1 if batch is None else batch
    k = SAMPLES_PER_PIECE[dim]
    bound = math.tan(math.radians(max_slope)) / (1 if dim == 2 else math.sqrt(2))
    heights = _profile(PIECES[dim], k, bound, b, generator) * (k * dx)
    if dim == 3:  # plus a profile along z, outward from the flat band on either side
        band = samples[1] - 1 - 2 * SIDE_PIECES * k
        left, right = (_profile(SIDE_PIECES, k, bound, b, generator) * (k * dx) for _ in range(2))
        across = torch.cat([left.flip(-1), torch.zeros(b, band - 1, dtype=torch.float64), right], -1)
        heights = heights[..., :, None] + across[..., None, :]
    return heights[0] if batch is None else heights


def held_out_heights(sim, max_slope, count=10):
    """``count`` terrains for evaluation that training does not draw, ``(count, *samples)``: the first draws of
    a generator seeded by :data:`HELD_OUT_SEED`."""
    return random_heights(sim, max_slope, count, torch.Generator().manual_seed(HELD_OUT_SEED))


def ramp_heights(sim, degrees):
    """A ramp's heights for ``sim``'s creature, above its ground, float64 on the CPU ``(*samples,)``: flat under
    the creature, then a slope of ``degrees`` (negative: downhill) along +x, reached over the first piece from
    ``x0`` (the slope rising linearly, as between the random terrain's knots) and kept to the grid's end (and
    flat after it)."""
    if not (is_finite_real(degrees) and -45 < degrees < 45):
        raise ValueError(f"degrees must be a number in (-45, 45), got {degrees!r}")
    _, dx, samples = grid(sim)
    k = SAMPLES_PER_PIECE[sim.body.dim]
    slope = torch.full((PIECES[sim.body.dim],), math.tan(math.radians(degrees)), dtype=torch.float64)
    slope = torch.cat([torch.arange(k, dtype=torch.float64) / k * slope[0], slope.repeat_interleave(k)])
    rise = (slope[:-1] + slope[1:]) / 2 * dx  # (nx - 1,) the exact integral of the slope between samples
    heights = torch.cat([torch.zeros(1, dtype=torch.float64), rise.cumsum(0)])[:samples[0]]
    return heights if sim.body.dim == 2 else heights[:, None].expand(samples).clone()


def height_field(sim, heights):
    """The :class:`~diffsoft.colliders.SmoothHeightField` of ``heights`` (``([B,] *samples)``: :func:`random_heights`'
    or :func:`ramp_heights`') on ``sim``'s creature's grid, raised by its ground's height, in its dtype and on
    its device; its contact constants are the simulator's."""
    x0, dx, samples = grid(sim)
    if not isinstance(heights, torch.Tensor) or tuple(heights.shape[max(heights.dim() - len(samples), 0):]) != samples \
            or heights.dim() > len(samples) + 1:
        got = tuple(heights.shape) if isinstance(heights, torch.Tensor) else repr(heights)
        raise ValueError(f"heights must be a tensor of shape ([B,] *{samples}) on {sim.body.dim}D terrain's grid "
                         f"(diffsoft.terrain.grid), got {got}")
    ground = given = sim.ground
    if ground is None or (isinstance(ground, torch.Tensor) and ground.dim()):
        raise ValueError(f"terrain replaces the simulator's ground at its height, so the simulator needs one ground "
                         f"height for every creature (a number), got ground={ground!r}")
    # (a tensor ground stays one: its gradient flows through the terrain, as through the flat ground)
    ground = ground.to(dtype=sim.body.dtype, device=sim.body.device) if isinstance(ground, torch.Tensor) else ground
    field = SmoothHeightField(x0, dx, heights.to(dtype=sim.body.dtype, device=sim.body.device) + ground)
    # a copy of heights (and ground): a step after an in-place change of either (an optimizer's step on the
    # terrain inside on_terrain) raises instead of walking on the old terrain
    field._copies = Copies()
    field._copies.made("heights", field.heights, [heights] + ([given] if isinstance(given, torch.Tensor) else []),
                       "diffsoft.terrain.height_field")
    return field


@contextlib.contextmanager
def on_terrain(sim, heights):
    """Inside the block, ``sim``'s creatures walk on the terrain ``heights`` instead of its ground (``ground=None``
    and the height field first among its colliders); afterwards its ground and colliders are back."""
    field = height_field(sim, heights)
    ground, colliders = sim._ground, sim._colliders
    sim.ground, sim.colliders = None, (field,) + tuple(colliders)
    try:
        yield sim
    finally:
        # as they were, with the simulator's records of them: assigning the ground again forgot that it was a
        # copy of Simulator.to's (whose original's in-place changes the next step then ignored), and checked it
        # again (one made invalid inside the block raised there, leaving the terrain installed); its next step
        # checks it, as any constant changed in place
        sim._ground, sim._colliders = ground, colliders


def distances_on(sim, policy, heights, steps=100):
    """How far the deterministic ``policy`` walks (its centre of mass along +x) in ``steps`` steps from rest
    on each terrain of ``heights`` ``(K, *samples)``: ``(K,)``, one batched rollout of K creatures."""
    if isinstance(heights, torch.Tensor) and heights.dim() != sim.body.dim:
        raise ValueError(f"heights must be (K, *samples), one terrain per row ({sim.body.dim} dimensions for a "
                         f"{sim.body.dim}D creature), got shape {tuple(heights.shape)}: for one terrain, heights[None]")
    with on_terrain(sim, heights):
        xs, _ = run_policy(sim, policy, steps, batch=heights.shape[0])
    return distance_covered(sim, xs)


def ramp_distances(sim, policy, degrees, steps=100):
    """How far the deterministic ``policy`` walks along +x in ``steps`` steps from rest up a ramp of ``degrees``
    (:func:`ramp_heights`) and down it: two numbers."""
    return tuple(distances_on(sim, policy, ramp_heights(sim, s * degrees)[None], steps).item() for s in (1, -1))
