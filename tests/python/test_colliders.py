"""Colliders (:mod:`diffsoft.colliders`): the kernels' contact and friction against each kind (planes at any slope,
height fields, spheres) against the reference, in 2D and 3D, shared and per creature; and the oracles, on both
backends: a block sliding down a frictionless incline follows 1/2 g sin(theta) t^2, a block on a slope creeps at
the lagged friction law's terminal speed (held on a shallow slope, sliding on a steep one), a ball dropped on a
sphere stays out of it, a flat height field and a horizontal plane are ``ground=0`` bit for bit, and gradients
with respect to slope, heights, sphere centre and radius match central differences."""
import json
import math

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck

from diffsoft import fused
from diffsoft.body import SoftBody
from diffsoft.colliders import Capsule, HeightField, Plane, SmoothHeightField, Sphere
from diffsoft.creatures import biped, tetrapod
from diffsoft.mesh import grid, rectangle, voxels
from diffsoft.simulator import Simulator
from diffsoft.step import unpack
from diffsoft.term_blocks import gradient_and_hessian

from conftest import assert_fused_matches_reference, F64, param_names, reference_param_grads, sheet_sim, small_sim

BACKENDS = ("cpp", "torch")


def _tilt(dim, theta):
    """The unit normal of a slope rising towards -x at angle theta (its downhill direction is +x)."""
    n = [math.sin(theta), math.cos(theta), 0.0]
    return torch.tensor(n[:dim], dtype=F64)


def _downhill(dim, theta):
    t = [math.cos(theta), -math.sin(theta), 0.0]
    return torch.tensor(t[:dim], dtype=F64)


def _every_kind(dim, per_creature=None):
    """A tilted plane, a bumpy height field and a sphere under the sheet_sim body (its vertices in contact with or
    near each), with their own contact constants; with per_creature = B, every field one per creature."""
    g = torch.Generator().manual_seed(dim)
    heights = 0.004 * torch.rand((9,) if dim == 2 else (9, 5), generator=g, dtype=F64) - 0.004
    colliders = [
        Plane([0.0, -0.003, 0.0][:dim], [0.05, 1.0, -0.03][:dim], stiffness=4e3, friction=40.0, friction_eps=0.02),
        HeightField(-0.1 if dim == 2 else [-0.1, -0.1], 0.075 if dim == 2 else [0.075, 0.1], heights, stiffness=3e3,
                    friction=30.0, friction_eps=0.02),
        Sphere([0.2, -0.295, 0.1][:dim], 0.3, stiffness=5e3, friction=50.0, friction_eps=0.02),
        # its ends' caps under the sheet's first and last columns, its side under the middle ones
        Capsule([0.05, -0.19, 0.05][:dim], [0.35, -0.2, 0.15][:dim], 0.2, stiffness=6e3, friction=60.0,
                friction_eps=0.02),
        # bumpier than the other: its curvature matters; the body's columns span its samples and its edges
        SmoothHeightField(-0.05 if dim == 2 else [-0.05, 0.02], 0.06 if dim == 2 else [0.06, 0.05], 3 * heights + 0.004,
                          stiffness=2e3, friction=20.0, friction_eps=0.02)]
    if per_creature:
        scale = 1 + 0.05 * torch.rand(per_creature, 1, generator=g, dtype=F64)
        c0, c1, c2, c3, c4 = colliders
        colliders = [Plane(torch.as_tensor(c0.point, dtype=F64) * scale, torch.as_tensor(c0.normal, dtype=F64) * scale,
                           stiffness=4e3 * scale[:, 0], friction=c0.friction, friction_eps=c0.friction_eps),
                     HeightField(torch.full((per_creature,) + (() if dim == 2 else (2,)), -0.1, dtype=F64),
                                 c1.dx, heights * scale.view(-1, *[1] * heights.dim()), stiffness=c1.stiffness,
                                 friction=30.0 * scale[:, 0], friction_eps=c1.friction_eps),
                     Sphere(torch.as_tensor(c2.center, dtype=F64) * scale, 0.3 * scale[:, 0], stiffness=c2.stiffness,
                            friction=c2.friction, friction_eps=0.02 * scale[:, 0]),
                     Capsule(torch.as_tensor(c3.start, dtype=F64) * scale, torch.as_tensor(c3.end, dtype=F64) * scale,
                             0.2 * scale[:, 0], stiffness=6e3 * scale[:, 0], friction=c3.friction,
                             friction_eps=c3.friction_eps),
                     SmoothHeightField(c4.x0, torch.as_tensor(c4.dx, dtype=F64) * scale.view(-1, *[1] * (dim - 2)),
                                       c4.heights * scale.view(-1, *[1] * heights.dim()), stiffness=c4.stiffness,
                                       friction=c4.friction, friction_eps=0.02 * scale[:, 0])]
    return colliders


def _collider_problem(dim, fixed, batch, per_creature):
    """The sheet_sim body over every kind of collider (no ground), a batch of states near rest, a point y."""
    sim = sheet_sim(dim, "neo_hookean", fixed)
    sim.ground = None
    sim.colliders = _every_kind(dim, batch if per_creature else None)
    g = torch.Generator().manual_seed(3)
    x, _ = sim.rest_state
    shape = ((batch,) if batch else ()) + tuple(x.shape)
    x0 = x + 0.003 * torch.randn(shape, generator=g, dtype=F64)
    v0 = 0.3 * torch.randn(shape, generator=g, dtype=F64)
    a = 0.6 + 0.4 * torch.rand(((batch,) if batch else ()) + (sim.body.num_muscles,), generator=g, dtype=F64)
    params, top = sim.step_problem(x0, v0, a)
    y = params.x0_free + 0.002 * torch.randn(params.x0_free.shape, generator=g, dtype=F64)
    return sim, params, top, y


@pytest.mark.parametrize("dim", (2, 3))
@pytest.mark.parametrize("batch,per_creature", [(0, False), (2, False), (2, True)])
def test_kernels_match_the_reference_for_every_kind(dim, batch, per_creature):
    """The kernels' value, gradient, Hessian products (vertex blocks n n^T, I - n n^T, the sphere's curvature) and
    every parameter derivative, first order and mixed (the colliders' fields included), against the reference;
    and the torch backend's derivatives (autograd of the reference's terms) against the kernels."""
    sim, params, top, y = _collider_problem(dim, [0], batch, per_creature)
    flat = [t.detach().clone().requires_grad_() for t in params.flat()]
    # every kind acts: some vertex inside or within the band of each collider
    for c, kind in enumerate(top.colliders):
        _, _, eps, *geometry = params.colliders[c]
        phi, _ = kind.surface(params.x0_free, *geometry)
        assert (phi < 0.02).any(), kind
    y = y.detach().requires_grad_()
    v = torch.randn_like(y)
    _, g0, h0 = assert_fused_matches_reference(y, flat, top, v)
    yb = y.detach() if batch else y.detach()[None]
    p, _ = unpack((*flat, top))
    if not batch:
        p = p._replace(x_hat=p.x_hat[None], x0=p.x0[None], x0_free=p.x0_free[None], activation=p.activation[None])
    g_t, hess_t = gradient_and_hessian(yb, p, top)
    torch.testing.assert_close(g_t.reshape(g0.shape), g0.detach(), rtol=1e-10, atol=1e-10 * g0.abs().max().item())
    torch.testing.assert_close(hess_t.apply(v.reshape(yb.shape)).reshape(h0.shape), h0, rtol=1e-10,
                               atol=1e-10 * h0.abs().max().item())
    names = param_names(params, top)
    wanted = list(range(len(flat)))
    weight = torch.rand(y.shape[:-2], dtype=F64) + 0.5
    for order, probe in ((1, weight), (2, v)):
        ours = fused._kernel_param_grads(y, flat, top, wanted, **({"weight": probe} if order == 1 else {"dir": probe}))
        reference = reference_param_grads(y, flat, top, wanted, probe, order)
        for name, t, g, r in zip(names, flat, ours, reference):
            assert g.shape == t.shape, (order, name)
            r = torch.zeros_like(g) if r is None else r
            torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10 * max(r.abs().max().item(), 1e-12),
                                       msg=f"order {order}, parameter {name}")


@pytest.mark.parametrize("dim", (2, 3))
@pytest.mark.parametrize("per_creature", (False, True))
def test_a_smooth_height_field_is_c2_its_normal_is_the_gradient_and_linear_heights_are_their_plane(dim, per_creature):
    """SmoothHeightField's reference surface (the kernels' oracle): n is the unit vector along d phi/dq (by
    autograd), at points over the samples and beyond the edges (flat there, at the edge's control point), and
    d phi/dq itself on the surface; h, its slope and its curvature are continuous across the knots (C2), where a
    HeightField's slope jumps; heights sampled from a plane give that plane's phi and n away from the edges."""
    g = torch.Generator().manual_seed(5)
    shape = (7,) if dim == 2 else (7, 6)
    batch = (3,) if per_creature else ()
    heights = 0.2 * torch.rand(batch + shape, generator=g, dtype=F64)
    origin = torch.tensor(-0.3 if dim == 2 else [-0.3, 0.2], dtype=F64).expand(batch + ((2,) if dim == 3 else ()))
    spacing = torch.tensor(0.25 if dim == 2 else [0.25, 0.3], dtype=F64).expand(batch + ((2,) if dim == 3 else ()))
    field = SmoothHeightField(origin, spacing, heights)
    o, s, h = field.geometry(dim, F64, torch.device("cpu"), batch[0] if batch else None)
    # points from 3 spacings before the first sample to 3 after the last, above and below the terrain
    lo = torch.tensor([-0.3 - 0.75, -0.3, 0.2 - 0.9][:dim], dtype=F64)
    span = torch.tensor([6 * 0.25 + 1.5, 0.6, 5 * 0.3 + 1.8][:dim], dtype=F64)
    q = (lo + span * torch.rand(batch + (200, dim), generator=g, dtype=F64)).requires_grad_()
    phi, n = SmoothHeightField.surface(q, o, s, h)
    grad, = torch.autograd.grad(phi.sum(), q)
    torch.testing.assert_close(n, grad / grad.norm(dim=-1, keepdim=True), rtol=1e-12, atol=1e-12)
    assert (grad.norm(dim=-1) - 1).abs().max() > 1e-3  # off the surface d phi/dq is not unit
    far = (q[..., 0] < -0.3 - 0.5) | (q[..., 0] > -0.3 + 6 * 0.25 + 0.5)  # 2 spacings beyond the edges
    assert far.any() and bool((n[far][:, 0] == 0).all())

    # C2 across the knots along x (away from the edges' repeated points): on the surface, phi, n and the
    # curvature are continuous (off it phi's Hessian has the spline's third derivative, times y - h)
    knots = -0.3 + 0.25 * torch.arange(1, 6, dtype=F64)
    point = torch.zeros(batch + (2 * len(knots), dim), dtype=F64)
    point[..., 0] = torch.cat([knots - 1e-9, knots + 1e-9])
    if dim == 3:
        point[..., 2] = 0.2 + 0.3 * 2.4
    point.requires_grad_()
    phi, n = SmoothHeightField.surface(point, o, s, h)
    slope, = torch.autograd.grad(phi.sum(), point)
    point = point.detach()
    point[..., 1] = -phi.detach() / slope[..., 1]  # y = h there (phi = -h / L and d phi/dy = 1 / L at y = 0)
    point.requires_grad_()
    phi, n = SmoothHeightField.surface(point, o, s, h)
    assert phi.abs().max() < 1e-15
    grad, = torch.autograd.grad(phi.sum(), point, retain_graph=True)
    torch.testing.assert_close(n, grad, rtol=1e-12, atol=1e-12)  # on the surface n is d phi/dq
    curvature, = torch.autograd.grad(n[..., 0].sum(), point)
    for value in (phi, n[..., 0], curvature[..., 0]):
        left, right = value[..., :len(knots)], value[..., len(knots):]
        torch.testing.assert_close(left, right, rtol=0, atol=1e-6)
    _, n_linear = HeightField.surface(point, o, s, h)
    jumps = (n_linear[..., :len(knots), 0] - n_linear[..., len(knots):, 0]).abs()
    assert jumps.max() > 1e-3  # the piecewise linear field's slope jumps there

    # a plane sampled: its phi and n wherever the four control points along each axis are samples
    slope = torch.tensor([0.3, -0.2][:dim - 1], dtype=F64)
    grid_axes = [o[..., a, None] + s[..., a, None] * torch.arange(n_, dtype=F64) for a, n_ in enumerate(shape)]
    plane_heights = 0.1 + slope[0] * grid_axes[0] if dim == 2 else \
        0.1 + slope[0] * grid_axes[0][..., :, None] + slope[1] * grid_axes[1][..., None, :]
    inner = lo + span * torch.rand(batch + (100, dim), generator=g, dtype=F64)
    inner[..., 0] = -0.3 + 0.25 * (1 + 4 * torch.rand(batch + (100,), generator=g, dtype=F64))
    if dim == 3:
        inner[..., 2] = 0.2 + 0.3 * (1 + 3 * torch.rand(batch + (100,), generator=g, dtype=F64))
    normal = torch.cat([-slope[:1], torch.ones(1, dtype=F64), -slope[1:]])
    plane = Plane([0.0, 0.1, 0.0][:dim], normal.tolist())
    plane_phi, plane_n = Plane.surface(inner, *plane.geometry(dim, F64, torch.device("cpu"), None))
    phi, n = SmoothHeightField.surface(inner, o, s, plane_heights)
    torch.testing.assert_close(phi, plane_phi, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(n, plane_n, rtol=1e-12, atol=1e-12)


def _same_world(sim, backend, world):
    """sim with its ground replaced by ``world`` ("ground", "plane" or "height field"), all at y = 0."""
    dim = sim.body.dim
    sim.backend = backend
    if world == "plane":
        sim.ground, sim.colliders = None, [Plane([0.0] * dim, [0.0, 1.0, 0.0][:dim])]
    elif world == "height field":
        heights = torch.zeros((7,) if dim == 2 else (7, 4), dtype=F64)
        sim.ground, sim.colliders = None, [HeightField(-1.0 if dim == 2 else [-1.0, -0.5], 0.5, heights)]
    return sim


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make", [lambda: biped(dtype=F64), lambda: tetrapod(dtype=F64)], ids=["biped", "tetrapod"])
def test_a_flat_height_field_and_a_horizontal_plane_are_the_ground_bit_for_bit(make, backend):
    """Rollouts with gradients: ground=0, a horizontal Plane and a flat HeightField (also beyond its samples)
    give the same states and gradients, exactly (max abs difference 0)."""
    out = {}
    for world in ("ground", "plane", "height field"):
        sim = _same_world(make(), backend, world)
        x, v = sim.rest_state
        v = v + torch.tensor([0.5, -0.3, 0.2][:sim.body.dim], dtype=F64)
        x = x.clone().requires_grad_()
        acts = torch.full((4, sim.body.num_muscles), 0.7, dtype=F64, requires_grad=True)
        xs, vs = sim.rollout(x, v, acts)
        out[world] = (xs.detach(), *torch.autograd.grad((xs[-1] ** 2).sum() + vs[-1].sum(), (x, acts)))
    assert (out["ground"][0][1:, :, 1] < 0).any(), "the test must exercise contact"
    for world in ("plane", "height field"):
        for a, b in zip(out[world], out["ground"]):
            assert (a - b).abs().max().item() == 0.0, world


def _block(dim, cell=0.1, stiffness=1e5):
    """A stiff unit-density block of 2 x 1 (x 1) cells of ``cell``, its bottom at y = 0, x from 0."""
    if dim == 2:
        verts, elements = rectangle(2 * cell, cell, 2, 1, dtype=F64)
    else:
        verts, elements = voxels(np.ones((1, 1, 2), dtype=bool), cell_size=cell, dtype=F64)
    return SoftBody(verts, elements, density=1000.0, youngs_modulus=stiffness, poisson_ratio=0.3)


def _on_slope(dim, theta, **collider):
    """The block resting on a slope through the origin (rotated onto it), the slope its only collider."""
    body = _block(dim)
    c, s = math.cos(theta), math.sin(theta)
    rot = torch.eye(dim, dtype=F64)
    rot[0, 0], rot[0, 1], rot[1, 0], rot[1, 1] = c, s, -s, c  # x -> downhill, y -> the slope's normal
    sim = Simulator(body, dt=0.01, ground=None, colliders=[Plane([0.0] * dim, _tilt(dim, theta), **collider)],
                    on_failure="raise")
    x = body.rest_positions @ rot.T
    return sim, x, torch.zeros_like(x)


def _tight(sim, scale=1e-2):
    """Solved below the defaults (the force residual ``scale`` times the default), failures raised."""
    sim.solver_options.update(on_failure="raise", rtol=1e-11, atol=sim.solver_options["atol"] * scale,
                              backward_rtol=1e-12)
    return sim


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim", (2, 3))
def test_a_block_slides_down_a_frictionless_incline_at_g_sin_theta(dim, backend):
    """The centre of mass's motion along a frictionless slope of 30 degrees: contact forces are normal and internal
    ones cancel, so it accelerates at g sin(theta) and backward Euler's positions are exactly 1/2 a h^2 n (n + 1),
    that is 1/2 g sin(theta) t^2 up to backward Euler's 1/2 a h t; and the block stays on the slope. (Exact at
    the default tolerances: the motion along the slope is inertial, which Newton's first step solves exactly.)"""
    theta = math.radians(30)
    sim, x, v = _on_slope(dim, theta, friction=0.0)
    sim.backend = backend
    steps = 40
    with torch.no_grad():
        xs, _ = sim.rollout(x, v, steps=steps)
    mass = sim.body.mass
    com = (mass[:, None] * xs).sum(1) / mass.sum()
    along = (com - com[0]) @ _downhill(dim, theta)
    a, h = 9.8 * math.sin(theta), sim.dt
    n = torch.arange(steps + 1, dtype=F64)
    torch.testing.assert_close(along, 0.5 * a * h * h * n * (n + 1), rtol=1e-12, atol=1e-14)
    t = n * h
    assert ((along - 0.5 * a * t * t).abs() <= 0.5 * a * h * t + 1e-10).all()
    # on the slope, sunk by the weight on its bottom face's vertices over 2 k_c, not through it
    bottom = (xs[0] @ _tilt(dim, theta)).abs() < 1e-12
    sag = mass.sum() * 9.8 * math.cos(theta) / (2 * sim.contact_stiffness * bottom.sum())
    depth = xs[1:] @ _tilt(dim, theta)
    assert (depth[:, bottom] < 0).all() and depth.min() > -2 * sag


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim", (2, 3))
def test_friction_holds_on_a_shallow_slope_and_lets_go_on_a_steep_one(dim, backend):
    """The lagged friction law (docs/colliders.md): a vertex within eps of a collider pays k_f b |v_t|^2 (b = eps -
    phi(x0)), a viscous force 2 k_f b v_t / h, so a block settles at the terminal speed
    v* = M g sin(theta) h / (2 k_f sum_i b_i) along any slope, sum_i b_i = n_c eps + M g cos(theta) / (2 k_c).
    Both slopes creep at their v* (to 0.1%, once settled); with k_c and k_f per kg of block as below, 5 degrees
    creeps under 1 mm/s (held), 45 degrees slides over 3 mm/s. (Steeper, this block tips over: friction at its
    base turns it, as a box's would once tan(theta) nears its width over its height.)"""
    speeds = {}
    mass = _block(dim).mass.sum().item()
    kc, kf, eps = 1e3 * mass, 1.35e3 * mass, 5e-4
    for degrees in (5, 45):
        theta = math.radians(degrees)
        sim, x, v = _on_slope(dim, theta, stiffness=kc, friction=kf, friction_eps=eps)
        sim.backend = backend
        # A force residual of 1 mN, 1e-5 of the forces at play: the default (1e-8 of the body's force scale,
        # 0.1 mN) is where this stiff friction's energy (curvature 2 k_f b / h^2 ~ 1e6 per vertex) stops
        # resolving the line search's decreases in float64.
        sim.solver_options["atol"] = 1e-3
        with torch.no_grad():
            xs, vs = sim.rollout(x, v, steps=150)
        m = sim.body.mass
        velocity = ((m[:, None] * vs[-1]).sum(0) / m.sum()) @ _downhill(dim, theta)
        band = (eps - xs[-2] @ _tilt(dim, theta)).clamp(min=0)  # b_i, lagged: from the step's start
        terminal = m.sum() * 9.8 * math.sin(theta) * sim.dt / (2 * kf * band.sum())
        assert velocity.item() == pytest.approx(terminal.item(), rel=1e-3), degrees
        # the closed form of sum_i b_i: n_c eps plus the weight's component normal to the slope over 2 k_c
        n_c = (band > 0).sum()
        assert band.sum().item() == pytest.approx(float(n_c * eps + mass * 9.8 * math.cos(theta) / (2 * kc)), rel=1e-3)
        speeds[degrees] = velocity.item()
    assert 0 < speeds[5] < 1e-3 and speeds[45] > 3e-3, speeds


def _disc(dim, radius=0.05, cells=6):
    """A ball (a disc in 2D) of ``2 cells`` cells across, centred at the origin."""
    r = np.arange(cells * 2) + 0.5 - cells
    if dim == 2:
        mask = (r[None, :] ** 2 + r[:, None] ** 2) <= cells ** 2
        verts, elements = grid(mask, cell_size=radius / cells, origin=(-radius, -radius), dtype=F64)
    else:
        mask = (r[None, None, :] ** 2 + r[None, :, None] ** 2 + r[:, None, None] ** 2) <= cells ** 2
        verts, elements = voxels(mask, cell_size=radius / cells, origin=(-radius,) * 3, dtype=F64)
    return SoftBody(verts, elements, density=500.0, youngs_modulus=2e4, poisson_ratio=0.3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim", (2, 3))
@pytest.mark.parametrize("kind", ("sphere", "capsule"))
def test_a_ball_dropped_on_a_sphere_does_not_sink_into_it(kind, dim, backend):
    """A ball of radius 5 cm falls from 10 cm onto a sphere of radius 1 (2 cm off its top), hitting it at 1.4 m/s:
    no vertex ever goes deeper into the sphere than 5 mm (with k_c 100 times the default per vertex mass, a
    vertex's kinetic energy at impact, m v^2 / 2 = k_c depth^2, buys 2 mm), and the ball ends on it, outside.
    Likewise on the side of a capsule of radius 1 (a log lying across the ball's path, its axis along z and
    slanting down in x in 2D, where the capsule is a stadium)."""
    body = _disc(dim, cells=3 if dim == 3 else 6)
    radius = 1.0
    center = torch.tensor([0.0, -radius, 0.0][:dim], dtype=F64)
    sim = Simulator(body, dt=0.01, ground=None, backend=backend, on_failure="raise")
    if kind == "sphere":
        collider = Sphere(center, radius, stiffness=100 * sim.contact_stiffness)
    else:
        axis = torch.tensor([1.0, -0.1] if dim == 2 else [0.0, 0.0, 1.0], dtype=F64)
        collider = Capsule(center - axis, center + axis, radius, stiffness=100 * sim.contact_stiffness)
    sim.colliders = [collider]
    x, v = sim.rest_state
    x = x + torch.tensor([0.02, 0.1 + 0.05, 0.0][:dim], dtype=F64)
    with torch.no_grad():
        xs, _ = sim.rollout(x, v, steps=60)
    depth = collider.surface(xs, *collider.step_params_for_one(dim))[0]
    assert depth[1:].min().item() > -5e-3
    assert (depth.min(-1).values < 1e-3).any(), f"the ball touches the {kind}"
    assert depth[-1].min() > -5e-3


def _steps_loss(sim, x, v, steps=3):
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(5), dtype=F64)
    xs, vs = sim.rollout(x, v, steps=steps)
    return (w * xs[-1]).sum() + 0.1 * (vs[-1] ** 2).sum()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim", (2, 3))
@pytest.mark.parametrize("terrain", (HeightField, SmoothHeightField))
def test_gradients_with_respect_to_slope_heights_centre_and_radius_match_central_differences(terrain, dim, backend):
    """Three steps of a block sliding with friction onto a tilted plane, a height field (piecewise linear or
    smooth) and a sphere at once; the loss differentiated with respect to the plane's normal (its slope) and point,
    the heights, the height field's origin and spacing, the sphere's centre and radius and the colliders' contact
    constants (stiffness, friction, friction band), by gradcheck."""
    body = _block(dim, stiffness=2e4)
    body_x = body.rest_positions + torch.tensor([0.0, 0.004, 0.0][:dim], dtype=F64)

    def loss(normal, point, heights, origin, spacing, center, radius, kc, kf, eps):
        colliders = [Plane(point, normal, stiffness=kc, friction=kf, friction_eps=eps),
                     terrain(origin, spacing, heights, stiffness=kc, friction=kf, friction_eps=eps),
                     Sphere(center, radius, stiffness=kc, friction=kf, friction_eps=eps)]
        sim = _tight(Simulator(body, dt=0.01, ground=None, colliders=colliders, backend=backend))
        v = torch.zeros_like(body_x) + torch.tensor([0.4, -0.3, 0.1][:dim], dtype=F64)
        return _steps_loss(sim, body_x, v)

    g = torch.Generator().manual_seed(1)
    heights = 0.003 * torch.rand((6,) if dim == 2 else (6, 4), generator=g, dtype=F64) - 0.003
    inputs = (torch.tensor([0.04, 1.0, 0.02][:dim], dtype=F64), torch.tensor([0.0, -0.001, 0.0][:dim], dtype=F64),
              heights, torch.tensor(-0.1 if dim == 2 else [-0.1, -0.13], dtype=F64),
              torch.tensor(0.07 if dim == 2 else [0.07, 0.09], dtype=F64),
              torch.tensor([0.1, -0.298, 0.05][:dim], dtype=F64), torch.tensor(0.3, dtype=F64),
              torch.tensor(2e3, dtype=F64), torch.tensor(20.0, dtype=F64), torch.tensor(0.01, dtype=F64))
    inputs = tuple(t.requires_grad_() for t in inputs)
    grads = torch.autograd.grad(loss(*inputs), inputs)
    for name, grad in zip(("normal", "point", "heights", "origin", "spacing", "center", "radius", "kc", "kf", "eps"),
                          grads):
        assert grad.abs().max() > 0, f"the loss must depend on {name}"
    assert gradcheck(loss, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim", (2, 3))
def test_gradients_with_respect_to_a_capsules_ends_and_radius_match_central_differences(dim, backend):
    """Three steps of a block sliding with friction over a capsule, its vertices on both the side and an end's
    cap; the loss differentiated with respect to the capsule's start, end, radius and contact constants, by
    gradcheck."""
    body = _block(dim, stiffness=2e4)
    body_x = body.rest_positions + torch.tensor([0.0, 0.004, 0.0][:dim], dtype=F64)

    def loss(start, end, radius, kc, kf):
        sim = _tight(Simulator(body, dt=0.01, ground=None, backend=backend,
                               colliders=[Capsule(start, end, radius, stiffness=kc, friction=kf, friction_eps=0.01)]))
        v = torch.zeros_like(body_x) + torch.tensor([0.4, -0.3, 0.1][:dim], dtype=F64)
        return _steps_loss(sim, body_x, v)

    lo, hi = body_x.min(0).values, body_x.max(0).values
    mid = (lo + hi) / 2
    inputs = (torch.tensor([-0.3, -0.303, -0.05][:dim], dtype=F64) + mid * torch.tensor([0.0, 0.0, 1.0][:dim]),
              torch.tensor([0.0, -0.3, 0.05][:dim], dtype=F64) + mid * torch.tensor([1.0, 0.0, 1.0][:dim]),
              torch.tensor(0.3, dtype=F64), torch.tensor(2e3, dtype=F64), torch.tensor(20.0, dtype=F64))
    inputs = tuple(t.requires_grad_() for t in inputs)
    capsule = Capsule(*inputs[:3])
    phi = capsule.surface(body_x, *capsule.step_params_for_one(dim))[0]
    assert (phi < 0.01).sum() >= 2, "the block starts on the capsule"
    grads = torch.autograd.grad(loss(*inputs), inputs)
    for name, grad in zip(("start", "end", "radius", "kc", "kf"), grads):
        assert grad.abs().max() > 0, f"the loss must depend on {name}"
    assert gradcheck(loss, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tight_solves_converge_where_the_step_energy_nearly_cancels(backend):
    """A 3D block sliding onto a sphere, solved to 1e-2 of the default force residual: there the step energy's
    total is about 11x smaller than the sum of its terms' magnitudes, which is the scale of its round-off. The
    C++ Newton's line search allows for that round-off, as the torch backend's does. When it allowed only for
    the total's, it stopped with "no decrease of the energy" at ||g|| = 1.7e-6, against a tolerance of 3e-8."""
    body = _block(3, stiffness=2e4)
    body_x = body.rest_positions + torch.tensor([0.0, 0.004, 0.0], dtype=F64)
    for shift in (0.0, 1e-6, -1e-6, 2e-6):
        center = torch.tensor([0.05, -0.3, 0.1 + shift], dtype=F64)
        sim = _tight(Simulator(body, dt=0.01, ground=None, backend=backend,
                               colliders=[Sphere(center, 0.3, stiffness=2e3, friction=20.0, friction_eps=0.01)]))
        x, v = body_x, torch.zeros_like(body_x) + torch.tensor([0.4, -0.3, 0.1], dtype=F64)
        for _ in range(3):
            x, v, info = sim.step(x, v, return_info=True)  # on_failure="raise"
            assert info.converged


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_creature_colliders_match_per_creature_runs(backend):
    """A batch of three bipeds, each on its own terrain (heights, a sphere's centre and radius, a slope: fields
    with a leading B), against each biped stepped alone on its own; gradients with respect to the per-creature
    fields likewise."""
    batch = 3
    g = torch.Generator().manual_seed(2)
    heights = 0.02 * torch.rand(batch, 12, generator=g, dtype=F64) - 0.02
    normals = torch.tensor([[0.0, 1.0], [0.05, 1.0], [-0.05, 1.0]], dtype=F64)
    centers = torch.tensor([[0.2, -0.5], [0.3, -0.49], [0.4, -0.51]], dtype=F64)
    radii = torch.tensor([0.5, 0.49, 0.52], dtype=F64)

    def run(heights, normals, centers, radii, x, v):
        leaves = [t.clone().requires_grad_() for t in (heights, normals, centers, radii)]
        sim = biped(dtype=F64)
        sim.backend = backend
        sim.ground = None
        sim.colliders = [HeightField(-1.0, 0.25, leaves[0], friction=50.0), Plane([0.0, -0.01], leaves[1]),
                         Sphere(leaves[2], leaves[3], stiffness=5e3)]
        sim.solver_options.update(on_failure="raise")
        xs, vs = sim.rollout(x, v, steps=3)
        loss = (xs[-1] ** 2).sum() + vs[-1].sum()
        return xs[-1].detach(), torch.autograd.grad(loss, leaves)

    sim = biped(dtype=F64)
    x, v = sim.rest_state
    x, v = x.expand(batch, -1, -1).clone(), (v + torch.tensor([0.4, -0.2], dtype=F64)).expand(batch, -1, -1).clone()
    x1, grads = run(heights, normals, centers, radii, x, v)
    for b in range(batch):
        xb, gb = run(heights[b], normals[b], centers[b], radii[b], x[b], v[b])
        torch.testing.assert_close(x1[b], xb, rtol=0, atol=1e-10)
        for g_batch, g_alone in zip(grads, gb):
            torch.testing.assert_close(g_batch[b], g_alone, rtol=1e-6, atol=1e-8)


def test_several_colliders_each_with_its_own_constants():
    """The ground and a sphere at once, each its own stiffness: a vertex pressed into both pays each one's
    penalty; a collider's constant left at None is the simulator's."""
    sim = biped(dtype=F64)
    sphere = Sphere([0.3, -0.45], 0.5, stiffness=123.0)
    sim.colliders = [sphere]
    params, top = sim.step_problem(*sim.rest_state, torch.ones(sim.body.num_muscles, dtype=F64))
    assert [k.KIND for k in top.colliders] == ["plane", "sphere"]
    assert params.colliders[1][0].item() == 123.0
    assert params.colliders[1][1].item() == sim.friction.item() and params.colliders[0][0] is sim.contact_stiffness
    x1, _ = sim.step(*sim.rest_state)
    assert torch.isfinite(x1).all()


def test_a_collider_without_stiffness_or_friction_steps_alike_on_both_backends():
    """A collider's contact stiffness and friction may be 0 (a collider switched off): the C++ kernels' range
    checks took a stiffness of 0 for an error where the torch backend stepped it; both step it now, alike."""
    out = {}
    for backend in ("cpp", "torch"):
        sim = biped(dtype=F64)
        sim.colliders = [Plane([0.0, 0.5], [0.0, 1.0], stiffness=0.0, friction=0.0)]
        sim.backend = backend
        out[backend] = sim.step(*sim.rest_state)[0]
    torch.testing.assert_close(out["cpp"], out["torch"], rtol=0, atol=1e-12)


def test_bad_colliders_are_refused_by_name():
    sim = biped(dtype=F64)
    x, v = sim.rest_state
    with pytest.raises(TypeError, match=r"colliders\[1\] must be a diffsoft.colliders object"):
        sim.colliders = [Plane([0.0, 0.0], [0.0, 1.0]), "sphere"]
    with pytest.raises(TypeError, match="colliders must be a list or tuple"):
        sim.colliders = Plane([0.0, 0.0], [0.0, 1.0])
    cases = [(Plane([0.0, 0.0], [0.0, 0.0]), ValueError, "Plane.normal must not be 0"),
             (Plane([0.0, 0.0, 0.0], [0.0, 1.0]), ValueError, r"Plane.point has shape \(3,\), but it must be \(2,\)"),
             (HeightField(0.0, 0.1, [0.0]), ValueError, "HeightField.heights must have at least 2 samples"),
             (HeightField(0.0, -0.1, [0.0, 0.0]), ValueError, "HeightField.dx must be > 0"),
             (SmoothHeightField(0.0, 0.1, [0.0, None]), TypeError, "SmoothHeightField.heights must be a tensor or a"),
             (Sphere([0.0, 0.0], -1.0), ValueError, "Sphere.radius must be finite and >= 0"),
             (Sphere([0.0, float("nan")], 1.0), ValueError, "Sphere.center must be finite"),
             (Sphere([0.0, 0.0], 1.0, friction=-1.0), ValueError, "Sphere.friction must be finite and >= 0"),
             (Sphere(torch.zeros(4, 2, dtype=F64), 1.0), ValueError,
              r"Sphere.center has shape \(4, 2\), but it must be \(2,\) for one creature: x0 is \(N, d\)"),
             (Sphere("a", 1.0), TypeError, "Sphere.center must be a number")]
    for collider, error, match in cases:
        sim.colliders = [collider]
        with pytest.raises(error, match=match):
            sim.step(x, v)
    sim.colliders = [Sphere(torch.zeros(4, 2, dtype=F64), 1.0)]
    with pytest.raises(ValueError, match=r"Sphere.center has shape \(4, 2\).*x0's batch of 3"):
        sim.step(x.expand(3, -1, -1), v.expand(3, -1, -1))


def _world(dim):
    """A simulator with the ground and one collider of each kind, as numbers and tensors."""
    sim = biped(dtype=F64) if dim == 2 else tetrapod(dtype=F64)
    heights = torch.linspace(0.0, 0.05, 6, dtype=F64)
    sim.colliders = [Plane([0.0, 0.05, 0.0][:dim], torch.tensor([-0.2, 1.0, 0.1][:dim], dtype=F64), friction=20.0),
                     HeightField(1.0 if dim == 2 else [1.0, -0.5], 0.2, heights if dim == 2 else heights.outer(
                         torch.ones(4, dtype=F64)), stiffness=3e3),
                     Sphere([2.0, -0.3, 0.0][:dim], 0.4, friction_eps=0.02),
                     Capsule([2.5, -0.3, -0.2][:dim], [3.0, -0.2, 0.2][:dim], 0.3, friction=10.0),
                     SmoothHeightField(-3.0 if dim == 2 else [-3.0, -0.5], 0.25, (heights.flip(0) if dim == 2 else
                                       heights.flip(0).outer(torch.ones(4, dtype=F64))) - 0.1)]
    return sim


@pytest.mark.parametrize("dim", (2, 3))
def test_creature_files_keep_the_colliders(dim, tmp_path):
    """creatures.save / load: the same kinds, fields and constants, and the same steps; one collider per creature
    of a batch is refused by name."""
    from diffsoft import creatures

    sim = _world(dim)
    creatures.save(sim, str(tmp_path / "c.json"))
    loaded = creatures.load(str(tmp_path / "c.json"), dtype=F64)
    assert [type(c) for c in loaded.colliders] == [Plane, HeightField, Sphere, Capsule, SmoothHeightField]
    assert loaded.colliders[0].friction == 20.0 and loaded.colliders[1].stiffness == 3e3
    assert loaded.colliders[2].friction_eps == 0.02 and loaded.colliders[2].stiffness is None
    x, v = sim.rest_state
    torch.testing.assert_close(loaded.step(x, v + 0.3)[0], sim.step(x, v + 0.3)[0], rtol=0, atol=0)
    sim.colliders = [Sphere(torch.zeros(3, dim, dtype=F64), 0.5)]
    with pytest.raises(ValueError, match=r"creatures.save writes one creature, but sim.colliders\[0\]: Sphere.center"):
        creatures.save(sim, str(tmp_path / "d.json"))
    data = json.loads((tmp_path / "c.json").read_text())
    data["simulator"]["colliders"][1] = {"kind": "box"}
    (tmp_path / "e.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"e.json: key 'simulator.colliders\[1\]' must be an object with 'kind' one of"):
        creatures.load(str(tmp_path / "e.json"))


@pytest.mark.parametrize("dim", (2, 3))
def test_render_and_vtk_files_show_the_colliders(dim, tmp_path):
    """Pictures draw every collider (they differ from the ground's alone), and write_vtk_series writes each one's
    surface once, listed in the collection for every frame."""
    import meshio

    from diffsoft import mesh, render

    sim = _world(dim)
    x, v = sim.rest_state
    xs, _ = sim.rollout(x, v, steps=2)
    bounds = (-0.5, 3.0, -1.0, 1.0)
    with_colliders = np.asarray(render.render_frame(sim, x, bounds=bounds))
    alone = _world(dim)
    alone.colliders = []
    assert (np.asarray(render.render_frame(alone, x, bounds=bounds)) != with_colliders).any(axis=-1).mean() > 0.01
    pvd = mesh.write_vtk_series(str(tmp_path), xs, sim.body.elements, colliders=sim.all_colliders)
    text = open(pvd).read()
    assert text.count('part="1"') == text.count('part="6"') == len(xs)
    for k in range(6):  # the ground, then the five
        surface = meshio.read(str(tmp_path / f"frame_collider{k}.vtu"))
        assert len(surface.points) >= 2 and surface.cells[0].type == ("line" if dim == 2 else "triangle")


def test_the_docs_example_runs():
    """docs/colliders.md's example: a slope, terrain and a sphere, with gradients."""
    import os
    import re

    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "colliders.md")
    with open(path) as f:
        (block,) = re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.S | re.M)
    scope = {}
    exec(block, scope)
    assert scope["heights"].grad.abs().sum() > 0


def test_to_copies_colliders_and_terms_differentiably():
    """Simulator.to has tensor.to's semantics for the colliders and user terms too: the copy's tensors are
    differentiable functions of the original's, so a loss on the copy reaches the original's leaves."""
    from diffsoft.terms import Term
    sim = biped(dtype=F64)
    radius = torch.tensor(0.3, dtype=F64, requires_grad=True)
    weight = torch.tensor(1e-3, dtype=F64, requires_grad=True)
    sim.colliders = [Sphere([0.2, -0.28], radius, stiffness=5e3)]
    sim.terms = [Term(lambda x, x0, h, w: w * (x * x).sum((-2, -1)), params=(weight,), name="pull")]
    small = sim.to(torch.float32)
    assert small.colliders[0].radius.dtype == torch.float32 and small.terms[0].params[0].dtype == torch.float32
    x1, _ = small.step(*small.rest_state)
    g_radius, g_weight = torch.autograd.grad(x1[:, 1].sum(), [radius, weight])
    assert g_radius.dtype == F64 and g_weight.dtype == F64 and torch.isfinite(g_radius) and g_weight != 0


def _moved_by(collider, offset):
    """``collider`` with its surface moved by ``offset`` ``(d,)``, horizontal."""
    d = len(offset)
    if isinstance(collider, Plane):
        return Plane(torch.as_tensor(collider.point, dtype=F64) + offset, collider.normal, collider.stiffness,
                     collider.friction, collider.friction_eps)
    if isinstance(collider, HeightField):
        x0 = torch.as_tensor(collider.x0, dtype=F64) + (offset[0] if d == 2 else offset[[0, 2]])
        return type(collider)(x0, collider.dx, collider.heights, collider.stiffness, collider.friction,
                              collider.friction_eps)
    if isinstance(collider, Sphere):
        return Sphere(torch.as_tensor(collider.center, dtype=F64) + offset, collider.radius, collider.stiffness,
                      collider.friction, collider.friction_eps)
    return Capsule(torch.as_tensor(collider.start, dtype=F64) + offset, torch.as_tensor(collider.end, dtype=F64) +
                   offset, collider.radius, collider.stiffness, collider.friction, collider.friction_eps)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim", (2, 3))
@pytest.mark.parametrize("per_creature", (False, True))
def test_a_step_far_from_the_origin_is_the_step_near_it_moved(dim, per_creature, backend):
    """The sheet over every kind of collider, the whole world moved 1,000 units (and each of two creatures by
    its own amount): its step (solved in a frame moved next to each creature, Simulator._recentred) is the step
    at the origin moved, and so are its gradients with respect to the state, the activations and the
    colliders' fields (float64)."""
    batch = 2
    horizontal = torch.tensor([1.0, 0.0, 0.37][:dim], dtype=F64)
    offsets = torch.stack([1000.0 * horizontal, -1737.5 * horizontal])

    def run(offset_of):
        sim = sheet_sim(dim, "neo_hookean", [0])
        sim.backend = backend
        sim.solver_options.update(on_failure="raise")
        sim.ground = None
        kinds = _every_kind(dim, batch if per_creature else None)
        if per_creature:  # each creature's world moved by its own offset
            world = torch.stack([offset_of(b) for b in range(batch)])
            kinds = [_moved_by(c, world) if not isinstance(c, HeightField) else
                     type(c)(torch.as_tensor(c.x0, dtype=F64) + (world[:, 0] if dim == 2 else world[:, [0, 2]]),
                             c.dx, c.heights, c.stiffness, c.friction, c.friction_eps) for c in kinds]
        else:
            world = offset_of(0).expand(batch, -1)
            kinds = [_moved_by(c, offset_of(0)) for c in kinds]
        leaves = [f.clone().requires_grad_() if isinstance(f, torch.Tensor) else
                  torch.tensor(f, dtype=F64, requires_grad=True) for f in (kinds[2].radius, kinds[1].heights)]
        kinds[2].radius, kinds[1].heights = leaves
        sim.colliders = kinds
        x, _ = sim.rest_state
        x0 = (x + 0.003 * torch.randn((batch,) + tuple(x.shape), generator=torch.Generator().manual_seed(3),
                                      dtype=F64) + world[:, None]).requires_grad_()
        v0 = (0.3 * torch.randn(x0.shape, generator=torch.Generator().manual_seed(4), dtype=F64)).requires_grad_()
        a = torch.full((batch, sim.body.num_muscles), 0.7, dtype=F64, requires_grad=True)
        x1, v1 = sim.step(x0, v0, a)
        w = torch.randn(x1.shape, generator=torch.Generator().manual_seed(6), dtype=F64)
        loss = ((x1 - world[:, None]) * w).sum() + (v1 * w).sum()
        return (x1 - world[:, None]).detach(), torch.autograd.grad(loss, [x0, v0, a, *leaves])

    if per_creature:
        far, far_grads = run(lambda b: offsets[b])
    else:
        far, far_grads = run(lambda b: offsets[0])
    near, near_grads = run(lambda b: torch.zeros(dim, dtype=F64))
    torch.testing.assert_close(far, near, rtol=0, atol=1e-9)
    for f, n in zip(far_grads, near_grads):
        torch.testing.assert_close(f, n, rtol=1e-6, atol=1e-8)


def test_a_float32_biped_far_out_converges_as_it_does_at_home():
    """Float32 keeps 24 bits: 300 units out the force residual's rounding alone exceeded the step's tolerance
    (100 Newton iterations, then a warning). Solved in a frame next to the creature, every step converges and
    lands where float64's does, to float32's rounding of the position."""
    import warnings
    sim32, sim64 = biped(), biped(dtype=F64)
    x, v = sim32.rest_state
    x, v = x.clone(), v.clone()
    x[:, 0] += 300.0
    v[:, 0] += 1.0
    a = torch.linspace(0.5, 1.0, sim32.body.num_muscles)
    x64, v64 = x.double(), v.double()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(10):
            x, v, info = sim32.step(x, v, a, return_info=True)
            assert info.converged and info.iterations < 20
            x64, v64 = sim64.step(x64, v64, a.double())
    torch.testing.assert_close(x.double(), x64, rtol=0, atol=1e-3)


def test_a_state_too_far_out_for_its_dtype_is_warned_about():
    """Where the dtype's rounding of a position exceeds 1e-4 of the body's size, the state has lost the body's
    shape before the step: a warning names x0, its distance and the dtype (float32: the 1.5-unit biped 10,000
    units out); 300 units out, or in float64 10,000 units out, nothing is said."""
    import warnings
    for dtype, offset, warned in ((torch.float32, 300.0, False), (torch.float32, 1e4, True), (F64, 1e4, False)):
        sim = biped(dtype=dtype)
        x, v = sim.rest_state
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sim.step(x + torch.tensor([offset, 0.0], dtype=dtype), v)
        far = [w for w in caught if "from the origin" in str(w.message)]
        assert bool(far) == warned, (dtype, offset, [str(w.message) for w in caught])
        if warned:
            assert "x0 lies 1e+04 from the origin" in str(far[0].message) and "float32" in str(far[0].message)
            assert far[0].filename == __file__  # stacklevel: the caller's line


@pytest.mark.parametrize("backend", BACKENDS + ("plain",))
def test_a_height_field_with_spacings_per_creature_and_a_shared_origin(backend):
    # The reference surface gave spacings a batch axis only with the origin's: with B equal to the free vertices
    # it read vertex j's spacing for creature j (quietly), else it raised a shape error.
    v, e = rectangle(0.2, 0.1, 1, 1, dtype=F64)  # 4 vertices: a batch of 4
    body = SoftBody(v, e, density=1000.0, youngs_modulus=1e4, poisson_ratio=0.3)
    dx = torch.tensor([0.05, 0.1, 0.2, 0.4], dtype=F64)
    h = torch.tensor([0.0, 0.02, -0.01, 0.03, 0.0, 0.01], dtype=F64)
    options = dict(fused=False) if backend == "plain" else dict(backend=backend)
    sim = Simulator(body, ground=None, colliders=[HeightField(-0.1, dx, h)], **options)
    x, vel = sim.rest_state
    x1, _ = sim.step(x.expand(4, -1, -1), vel.expand(4, -1, -1))
    for k in range(4):
        one = Simulator(body, ground=None, colliders=[HeightField(-0.1, dx[k], h)], **options)
        torch.testing.assert_close(one.step(x, vel)[0], x1[k], rtol=0, atol=1e-12)


def test_the_torch_backend_steps_near_a_spheres_centre_as_the_cpp_one_does():
    # Inside a sphere the contact's curvature term makes vertex blocks indefinite; the torch backend's fallback
    # step divided by their diagonal clamped to the smallest float, leapt out of reach, and its line search
    # failed (x1 = x0) where the C++ backend converges.
    out = []
    for backend in ("cpp", "torch"):
        sim = small_sim(backend=backend, ground=None)
        x, v = sim.rest_state
        sim.colliders = [Sphere((x[0] + torch.tensor([1e-3, 5e-4], dtype=F64)).tolist(), 0.05)]
        x1, _, info = sim.step(x, v, return_info=True)
        assert info.converged, (backend, info.message)
        out.append(x1)
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=1e-8)
