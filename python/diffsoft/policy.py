"""Locomotion policies: algovivo's neural frame policy, its file format, and rollouts that evaluate it.

The policy is algovivo's (``NeuralFramePolicy``): an MLP ``fc1 -> ReLU -> fc2 -> tanh`` that reads every
vertex's position (relative to a center vertex) and velocity, both rotated into a frame attached to the
body, and outputs a change of each muscle's activation:

    ``a_t = clamp(a_{t-1} + clamp(pi(obs(x_t, v_t)), -max_abs_da, max_abs_da), min_a, 1)``,
    ``(x_{t+1}, v_{t+1}) = sim.step(x_t, v_t, a_t)``,  ``a_{-1} = 1`` (relaxed).

Both trainers use it: :mod:`diffsoft.training` (gradients through the simulator) and :mod:`diffsoft.ppo`.

A *steered* policy (``FramePolicy(..., steered=True)``, trained with ``TrainConfig.steer``) also reads a commanded
heading: an angle in the ground plane (:func:`heading_direction`: 0 is +x; in 3D it turns toward +z; in 2D it is 0
or pi, forward or backward), given to it as the heading's unit vector in the body frame, so that, like the rest of
its input, it does not depend on where the creature stands or faces. In 3D every policy is steered
(:func:`reads_heading`), +x unless commanded otherwise.

A *mirrored* policy (``FramePolicy(..., mirror=Mirror.of(sim))``, trained with ``TrainConfig.mirror``) is symmetric
by construction for a body whose rest pose is its own mirror image (:class:`Mirror`): its activation change is the
mean of its network's on the state and, mirrored back, on the mirrored state with the mirrored heading, so that
on a mirrored state it does the mirror image of what it does on the state. A gait learnt toward one side is then
also a gait toward the other: in 2D the mirror swaps front and back (forward and backward walking), in 3D left
and right (headings toward +z and toward -z).
"""
import dataclasses
import json
import math
import warnings

import torch
from torch import nn

from ._checks import MIN_ACTIVATION, is_finite_real, is_integer
from ._io import only_numbers, read_json

POLICY_KEYS = ("fc1", "fc2", "min_a", "max_abs_da", "center_vertex_id", "forward_vertex_id")
DIFFSOFT_POLICY_KEYS = ("space_dim", "steered", "mirror")
"""The keys diffsoft's policy files add to algovivo's :data:`POLICY_KEYS` (:func:`save_algovivo_policy`)."""
IGNORED_POLICY_KEYS = ("scale",)
"""Keys some of algovivo's policy files carry that its policy does not need here, and the reader passes over
(algovivo's quadruped's ``scale``: with it ignored, the policy walks as in algovivo's own engine,
``tests/python/test_algovivo_reference.py``). Any other key is refused."""


def heading_direction(heading, dim, dtype=None, device=None):
    """The unit vector of commanded headings in the ground plane: ``heading`` ``(B,)`` angles in radians (a
    tensor, or a number or sequence of them) -> ``(B, dim)``: ``(cos h, 0, sin h)`` in 3D; ``(cos h, 0)`` in 2D,
    where a heading must be 0 or pi (+x or -x: a ValueError otherwise)."""
    if not (is_integer(dim) and dim in (2, 3)):
        raise ValueError(f"dim must be 2 or 3 (the body's dimension), got {dim!r}")
    h = torch.as_tensor(heading, dtype=dtype or torch.get_default_dtype(), device=device)
    h = h.reshape(-1) if h.dim() == 0 else h
    if h.dim() != 1 or not bool(torch.isfinite(h).all()):
        raise ValueError(f"heading must be finite angles (B,) in radians, got {heading!r}")
    zero = torch.zeros_like(h)
    if dim == 2:
        if bool((torch.sin(h).abs() > 1e-6).any()):
            raise ValueError(f"in 2D a heading is 0 (+x) or pi (-x), got {heading!r}")
        return torch.stack([torch.cos(h).sign(), zero], -1)
    return torch.stack([torch.cos(h), zero, torch.sin(h)], -1)


@dataclasses.dataclass(frozen=True)
class Mirror:
    """A body's mirror symmetry: the reflection of the ground plane's axis ``axis`` (2D: x, front and back; 3D:
    z, left and right) that maps its rest pose onto itself, as the permutation of its vertices (vertex ``i``'s
    image is vertex ``vertices[i]``) and of its muscles (muscle ``j``, between vertices ``u`` and ``w``, has for
    image the muscle ``muscles[j]`` between ``vertices[u]`` and ``vertices[w]``). Its elements need not be
    mirror images of each other (the creatures' meshes split their cells one way), so the body's physics is
    only nearly symmetric."""

    axis: int
    vertices: tuple
    muscles: tuple

    @classmethod
    def of(cls, sim, tolerance=1e-6):
        """The mirror symmetry of ``sim``'s body, found from its rest pose (each vertex's image within
        ``tolerance`` of the body's size, a finite number >= 0); a ValueError naming the vertex or muscle without
        an image."""
        if not (is_finite_real(tolerance) and tolerance >= 0):
            raise ValueError(f"tolerance must be a finite number >= 0 (a fraction of the body's size), got "
                             f"{tolerance!r}")
        b = sim.body
        x = b.rest_positions.detach().to(torch.float64).cpu()
        axis = cls.axis_of(b.dim)
        image = x.clone()
        image[:, axis] = x[:, axis].max() + x[:, axis].min() - x[:, axis]
        gap, vertices = torch.cdist(image, x).min(1)
        size = float((x.max(0).values - x.min(0).values).max())
        worst = int(gap.argmax())
        if float(gap[worst]) > tolerance * size or not torch.equal(vertices[vertices], torch.arange(len(x))):
            raise ValueError(f"the body is not its own mirror image across its mid-plane normal to "
                             f"{'xyz'[axis]}: vertex {worst}'s image is {float(gap[worst]):.3g} from the nearest "
                             f"vertex (tolerance {tolerance:g} of its size {size:.3g}), or two vertices share one")
        # Muscles by the edge they pull on; an edge may carry several (the tetrapod's legs share their inner
        # edges), whose images are the image edge's in the same order, or in reverse on an edge that is its own.
        on_edge = {}
        for j, m in enumerate(b.muscles.tolist()):
            on_edge.setdefault(frozenset(m), []).append(j)
        muscles = [None] * b.num_muscles
        for edge, js in on_edge.items():
            u, w = sorted(edge)  # (a muscle joins two vertices: SoftBody's check)
            image = frozenset((int(vertices[u]), int(vertices[w])))
            ks = on_edge.get(image, [])[::-1 if image == edge else 1]
            if len(ks) != len(js):
                raise ValueError(f"muscle {js[0]} (vertices {u}, {w}) has no mirror image: "
                                 f"{len(ks)} muscles join vertices {int(vertices[u])} and {int(vertices[w])}, "
                                 f"{len(js)} join {u} and {w}")
            for j, k in zip(js, ks):
                muscles[j] = k
        return cls(axis, tuple(vertices.tolist()), tuple(muscles))

    @staticmethod
    def axis_of(dim):
        """The axis a ``dim``-D body is mirrored along: 2D x (front and back), 3D z (left and right)."""
        return 0 if dim == 2 else 2

    def check(self, num_vertices, num_muscles, dim, where="mirror"):
        """A ValueError naming ``where`` unless this is a mirror of a ``dim``-D body of these sizes."""
        ok = (self.axis == self.axis_of(dim) and sorted(self.vertices) == list(range(num_vertices))
              and sorted(self.muscles) == list(range(num_muscles))
              and all(self.vertices[self.vertices[i]] == i for i in range(num_vertices))
              and all(self.muscles[self.muscles[j]] == j for j in range(num_muscles)))
        if not ok:
            raise ValueError(f"{where} must be a mirror of a {dim}D body of {num_vertices} vertices and {num_muscles} "
                             f"muscles: axis {self.axis_of(dim)}, and vertices and muscles permutations that are "
                             f"their own inverses (Mirror.of(sim))")

    def state(self, x, v, heading):
        """The mirrored state: positions and velocities ``(B, N, d)`` reflected and permuted (relative positions
        are what the policy observes, so the reflection's plane does not matter), and the mirrored heading
        ``(B,)`` (2D: pi - h, swapping +x and -x; 3D: -h)."""
        index = torch.tensor(self.vertices, device=x.device)
        sign = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
        sign[self.axis] = -1
        mirrored = (math.pi - heading) if x.shape[-1] == 2 else -heading
        return x[:, index] * sign, v[:, index] * sign, mirrored

    def to_dict(self):
        """The mirror as JSON values (policy files)."""
        return {"axis": self.axis, "vertices": list(self.vertices), "muscles": list(self.muscles)}


def reads_heading(dim, steer=False):
    """Whether a frame policy for a ``dim``-D body reads a commanded heading (``FramePolicy``'s ``steered``):
    when it is trained to follow commands (``steer``), and always in 3D, where the body frame that makes the
    observation the same wherever the creature stands and faces also hides which way +x is, so that a policy
    that does not read it cannot hold its course (unsteered, the command is 0: +x; in 2D the frame keeps +x, up
    to turning over). Both trainers and the Gymnasium environments use it."""
    return bool(steer) or dim == 3


def mirrors(sim, steer=False):
    """Whether a frame policy for ``sim``'s body is mirrored unless told otherwise (:class:`~diffsoft.training.TrainConfig`'s
    ``mirror`` None): where it reads a heading (:func:`reads_heading`: in 3D, or steered) and the body is its own
    mirror image (:meth:`Mirror.of` finds one). A mirrored policy cannot drift toward one side: the tetrapod's
    unsteered gaits held their course on 5 seeds of 5 mirrored, 3 of 5 not (docs/training.md, docs/history.md)."""
    if not reads_heading(sim.body.dim, steer):
        return False
    try:
        Mirror.of(sim)
    except ValueError:  # not its own mirror image
        return False
    return True


def frame_vertices(sim):
    """``(center_vertex_id, forward_vertex_id)`` for a body facing +x: the vertex nearest the rest pose's
    centroid, and the vertex nearest the point at the body's front (max x) level with that center."""
    x = sim.body.rest_positions.detach()
    center = int((x - x.mean(0)).norm(dim=1).argmin())
    front = x[center].clone()
    front[0] = x[:, 0].max()
    forward = int((x - front).norm(dim=1).argmin())
    if forward == center:
        raise ValueError("the body is too small to pick distinct center and forward vertices")
    return center, forward


def frame_of(sim, center_vertex_id=None, forward_vertex_id=None):
    """The frame vertices given, both, or :func:`frame_vertices` for neither; a ValueError for one alone (the
    default pair is chosen together: one of it beside another vertex need not make a frame)."""
    if (center_vertex_id is None) != (forward_vertex_id is None):
        given = "center_vertex_id" if forward_vertex_id is None else "forward_vertex_id"
        raise ValueError(f"give both center_vertex_id and forward_vertex_id, or neither (frame_vertices picks the "
                         f"pair), got only {given}")
    return frame_vertices(sim) if center_vertex_id is None else (center_vertex_id, forward_vertex_id)


def body_frame(x, center_vertex_id, forward_vertex_id):
    """The frame attached to the body, as algovivo's ``frame_projection`` defines it in 2D.

    Args:
        x: ``(B, N, d)`` positions.

    Returns:
        ``origin (B, d)`` (the center vertex) and ``R (B, d, d)`` whose rows are the frame's axes: the unit
        vector from the center to the forward vertex, then (2D) its counterclockwise normal, or (3D) the
        world's up (+y) made orthogonal to it and their cross product.
    """
    origin = x[:, center_vertex_id]
    e1 = x[:, forward_vertex_id] - origin
    e1 = e1 / e1.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    if x.shape[-1] == 2:
        e2 = torch.stack([-e1[:, 1], e1[:, 0]], dim=-1)
        return origin, torch.stack([e1, e2], dim=1)
    up = torch.zeros_like(e1)
    up[:, 1] = 1.0
    e2 = up - (up * e1).sum(-1, keepdim=True) * e1
    e2 = e2 / e2.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return origin, torch.stack([e1, e2, torch.cross(e1, e2, dim=-1)], dim=1)


def observe(x, v, center_vertex_id, forward_vertex_id, heading=None):
    """algovivo's policy input: ``(B, 2 N d)``, every vertex's position relative to the center vertex in the
    body frame (vertex-major, ``[p0x, p0y, p1x, ...]``), then every vertex's velocity in that frame; with
    ``heading`` ``(B,)`` (a steered policy's), then the heading's direction (:func:`heading_direction`) in
    that frame: ``(B, 2 N d + d)``. x, v: ``(B, N, d)``; the frame's vertices as :class:`FramePolicy`'s
    (:func:`check_frame`)."""
    check_frame(x.shape[-2], center_vertex_id, forward_vertex_id)
    origin, R = body_frame(x, center_vertex_id, forward_vertex_id)
    p = (x - origin[:, None]) @ R.transpose(1, 2)
    u = v @ R.transpose(1, 2)
    parts = [p.flatten(1), u.flatten(1)]
    if heading is not None:
        parts.append((R @ heading_direction(heading, x.shape[-1], x.dtype, x.device)[..., None])[..., 0])
    return torch.cat(parts, dim=1)


class FramePolicy(nn.Module):
    """algovivo's neural frame policy: ``da = tanh(fc2(relu(fc1(obs))))`` on :func:`observe`'s input.

    Args:
        num_vertices, num_muscles, dim: the body's sizes (``fc1`` takes ``2 * dim * num_vertices`` inputs).
        center_vertex_id, forward_vertex_id: the body frame (see :func:`body_frame`).
        hidden: the hidden layer's width (algovivo: 32).
        min_a, max_abs_da: activations are kept in ``[min_a, 1]``; each step changes them by at most
            ``max_abs_da``.
        steered: the policy also reads a commanded heading (``fc1`` takes ``dim`` more inputs; see the module
            docstring); None (default): :func:`reads_heading` of ``dim``, so in 3D only.
        mirror: a :class:`Mirror` of the body: the policy is symmetric by construction (see the module
            docstring; it must be steered); None (default): it is not.

    These fields may be set later; :meth:`check` checks them as ``__init__`` does wherever they are used.
    """

    def __init__(self, num_vertices, num_muscles, dim, center_vertex_id, forward_vertex_id, hidden=32,
                 min_a=0.25, max_abs_da=0.3, steered=None, mirror=None):
        super().__init__()
        if not (is_integer(hidden) and hidden >= 1):
            raise ValueError(f"hidden must be a positive integer (the hidden layer's width), got {hidden!r}")
        self.num_vertices, self.num_muscles, self.dim = num_vertices, num_muscles, dim
        self.center_vertex_id, self.forward_vertex_id = center_vertex_id, forward_vertex_id
        self.min_a, self.max_abs_da = min_a, max_abs_da
        self.steered = reads_heading(dim) if steered is None else bool(steered)
        self.mirror = mirror
        self.fc1 = nn.Linear(2 * dim * num_vertices + (dim if self.steered else 0), hidden)
        self.fc2 = nn.Linear(hidden, num_muscles)
        self.check()
        self.center_vertex_id, self.forward_vertex_id = int(center_vertex_id), int(forward_vertex_id)
        self.min_a, self.max_abs_da = float(min_a), float(max_abs_da)

    def check(self):
        """A ValueError naming the first field at fault (a TypeError for a mirror that is not a :class:`Mirror`):
        the frame and limits (:func:`check_frame_and_limits`), ``steered`` as ``fc1``'s inputs say, ``mirror`` one
        of this body's sizes on a steered policy. ``__init__`` checks its arguments with it, and :meth:`forward`,
        :meth:`update` and :func:`run_policy` (once a rollout) the fields as they are then, set after
        construction too: plain Python on numbers, no tensor read."""
        check_frame_and_limits(self.num_vertices, self.center_vertex_id, self.forward_vertex_id, self.min_a,
                               self.max_abs_da)
        inputs = 2 * self.dim * self.num_vertices + (self.dim if self.steered else 0)
        if self.fc1.in_features != inputs:
            raise ValueError(f"steered is {self.steered!r}, but fc1 takes {self.fc1.in_features} inputs, not 2 * "
                             f"{self.dim} * {self.num_vertices}{f' + {self.dim}' if self.steered else ''} = {inputs}: "
                             f"a policy reads a heading or not as it was made (FramePolicy(..., steered=...))")
        if self.mirror is not None:
            if not isinstance(self.mirror, Mirror):
                raise TypeError(f"mirror must be a diffsoft.policy.Mirror (Mirror.of(sim)) or None, got "
                                f"{type(self.mirror).__name__}")
            self.mirror.check(self.num_vertices, self.num_muscles, self.dim)
            if not self.steered:
                raise ValueError("a mirrored policy must be steered (steered=True; in training TrainConfig.steer, "
                                 "--steer true): the mirror turns its heading (in 2D forward into backward), "
                                 "which it must read")

    @classmethod
    def for_simulator(cls, sim, **kw):
        """A policy sized for ``sim``'s body (in its dtype, on its device), with :func:`frame_vertices` and the
        body's ``min_a`` (its muscles' contraction range) unless given; ``mirror=True``: the body's
        :meth:`Mirror.of`."""
        b = sim.body
        if kw.get("min_a") is None:
            kw["min_a"] = b.min_a
        if kw.get("mirror") is True:
            kw["mirror"] = Mirror.of(sim)
        elif kw.get("mirror") is False:
            kw["mirror"] = None
        kw["center_vertex_id"], kw["forward_vertex_id"] = frame_of(sim, kw.get("center_vertex_id"),
                                                                  kw.get("forward_vertex_id"))
        return cls(b.num_vertices, b.num_muscles, b.dim, **kw).to(device=b.device, dtype=b.dtype)

    def forward(self, x, v, heading=None):
        """The raw activation change ``tanh(...)``: ``(B, M)`` from x, v ``(B, N, d)``; ``heading`` (a steered
        policy's command, ``(B,)`` radians or one number for all; default 0, along +x)."""
        self.check_state(x, v)
        return self.changes(x, v, self.command(heading, x))

    def check_state(self, x, v):
        """:meth:`forward`'s checks: the policy's fields (:meth:`check`), and positions and velocities x, v
        ``(B, N, d)`` of its creature, in its dtype and on its device (a ValueError or TypeError naming them)."""
        self.check()
        heading_inputs = f" + {self.dim}" if self.steered else ""
        for name, t in (("x", x), ("v", v)):
            if t.dim() != 3 or t.shape[1:] != (self.num_vertices, self.dim):
                raise ValueError(f"{name} has shape {tuple(t.shape)}, but this policy observes (B, "
                                 f"{self.num_vertices}, {self.dim}): {self.num_vertices} vertices in {self.dim}D "
                                 f"(fc1 takes 2 * {self.dim} * {self.num_vertices}{heading_inputs} = "
                                 f"{self.fc1.in_features} values). A policy belongs to the creature it was made for "
                                 f"(FramePolicy.for_simulator): load or train one for this creature, and give a batch "
                                 f"(B, N, d)")
            if t.dtype != self.fc1.weight.dtype:
                raise TypeError(f"{name} is {t.dtype} but this policy's weights are {self.fc1.weight.dtype}: "
                                f"policy.to({t.dtype}), or load_algovivo_policy(path, dtype={t.dtype})")
            if t.device != self.fc1.weight.device:
                raise ValueError(f"{name} is on {t.device} but this policy's weights are on "
                                 f"{self.fc1.weight.device}: policy.to('{t.device}')")
        if v.shape[0] != x.shape[0]:
            raise ValueError(f"x and v must hold the same creatures, got shapes {tuple(x.shape)} and {tuple(v.shape)}")

    def changes(self, x, v, heading, obs=None):
        """:meth:`forward` without its checks, for a caller that has checked its input and may have the
        observation ``obs`` of ``(x, v, heading)`` already; with a mirror, the mean of the network's activation
        change and, mirrored back, its change on the mirrored state."""
        if obs is None:
            obs = observe(x, v, self.center_vertex_id, self.forward_vertex_id, heading)
        da = self.head(obs)
        if self.mirror is None:
            return da
        xm, vm, hm = self.mirror.state(x, v, heading)
        dm = self.head(observe(xm, vm, self.center_vertex_id, self.forward_vertex_id, hm))
        return 0.5 * (da + dm[:, torch.tensor(self.mirror.muscles, device=da.device)])

    def command(self, heading, x):
        """The heading :func:`observe` takes for this policy and positions ``x (B, N, d)``: None for a policy
        that is not steered (a ValueError if a heading is given), else ``(B,)`` radians (default 0)."""
        if not self.steered:
            if heading is not None:
                raise ValueError("this policy is not steered (FramePolicy(..., steered=True), TrainConfig.steer): "
                                 "it takes no heading")
            return None
        h = torch.as_tensor(0.0 if heading is None else heading, dtype=x.dtype, device=x.device)
        if h.dim() == 0:
            return h.expand(x.shape[0])
        if h.shape != (x.shape[0],):
            raise ValueError(f"heading must be one angle or one per creature ({x.shape[0]},), got shape "
                             f"{tuple(h.shape)}")
        return h

    def head(self, obs):
        """The raw activation change ``(B, M)`` from the observation ``(B, 2 N d)`` (:func:`observe`), for a
        caller that needs the observation too."""
        return torch.tanh(self.fc2(torch.relu(self.fc1(obs))))

    def act(self, x, v, a, noise=None, heading=None):
        """The next activation ``(B, M)`` from the previous one ``a`` (B, M); ``noise`` (B, M) is added to
        the activation change before clamping (exploration, as algovivo's stochastic policy does);
        ``heading``: a steered policy's command (see :meth:`forward`)."""
        return self.update(a, self(x, v, heading), noise)

    def update(self, a, da, noise=None, straight_through=False):
        """``clamp(a + clamp(da + noise, -max_abs_da, max_abs_da), min_a, 1)``: (B, M) each.

        ``straight_through``: the same values, but the clamps pass gradients as if they were not there (see
        :class:`TrainConfig`)."""
        self.check()
        if a.shape[-1:] != (self.num_muscles,):
            raise ValueError(f"a has shape {tuple(a.shape)}, but this policy drives {self.num_muscles} muscles: give "
                             f"(B, {self.num_muscles}) activations of the creature it was made for")
        if noise is not None:
            da = da + noise
        return next_activation(a, da, self.min_a, self.max_abs_da, straight_through)


def check_frame_and_limits(num_vertices, center_vertex_id, forward_vertex_id, min_a, max_abs_da):
    """ValueError naming the first argument at fault: ``min_a`` in ``[MIN_ACTIVATION, 1)``, ``max_abs_da``
    positive, the frame as :func:`check_frame` (shared by :class:`FramePolicy` and
    :class:`~diffsoft.task.LocomotionTask`)."""
    if not (is_finite_real(min_a) and MIN_ACTIVATION <= min_a < 1):
        raise ValueError(f"min_a must be a number in [{MIN_ACTIVATION:g}, 1), got {min_a!r}")
    if not (is_finite_real(max_abs_da) and max_abs_da > 0):
        raise ValueError(f"max_abs_da must be a positive finite number, got {max_abs_da!r}")
    check_frame(num_vertices, center_vertex_id, forward_vertex_id)


def check_frame(num_vertices, center_vertex_id, forward_vertex_id):
    """ValueError naming the first argument at fault: the frame's vertices must be distinct indices in
    ``[0, num_vertices)`` (the same vertex twice gives no direction: :func:`observe` would return zeros)."""
    for name, i in (("center_vertex_id", center_vertex_id), ("forward_vertex_id", forward_vertex_id)):
        if not (is_integer(i) and 0 <= i < num_vertices):
            raise ValueError(f"{name} must be a vertex index in [0, {num_vertices}), got {i!r}")
    if center_vertex_id == forward_vertex_id:
        raise ValueError("center_vertex_id and forward_vertex_id must differ (they define the frame)")


def next_activation(a, da, min_a, max_abs_da, straight_through=False):
    """The muscles' next activation ``clamp(a + clamp(da, -max_abs_da, max_abs_da), min_a, 1)``: a, da ``(B, M)``.

    ``straight_through``: the same values, but the clamps pass gradients as if they were not there."""
    clamp = _straight_through_clamp if straight_through else torch.clamp
    return clamp(a + clamp(da, -max_abs_da, max_abs_da), min_a, 1.0)


def _straight_through_clamp(x, lo, hi):
    """``clamp(x, lo, hi)`` in the forward pass, the identity in the backward pass."""
    return x + (x.clamp(lo, hi) - x).detach()


ALGOVIVO_HIDDEN = 32
"""The hidden units of algovivo's policy network (its engine's ``Linear(inputs, 32)``)."""


def save_algovivo_policy(policy, path):
    """Writes ``policy`` in algovivo's policy JSON: ``fc1`` and ``fc2`` as ``{"weight": [[...]] (out, in),
    "bias": [...]}``, ``min_a``, ``max_abs_da``, ``center_vertex_id``, ``forward_vertex_id``; and
    ``space_dim`` (algovivo ignores it; 3 marks a 3D policy, which algovivo cannot run); and for a steered
    policy ``"steered": true`` (algovivo cannot run it: its input has the heading too). Checked as
    :func:`load_algovivo_policy` reads it (a ValueError naming what would not read back, e.g. non-finite
    weights), so that the file always reads back."""
    data = {name: {"weight": getattr(policy, name).weight.detach().cpu().double().tolist(),
                   "bias": getattr(policy, name).bias.detach().cpu().double().tolist()} for name in ("fc1", "fc2")}
    data.update(min_a=policy.min_a, max_abs_da=policy.max_abs_da, center_vertex_id=policy.center_vertex_id,
                forward_vertex_id=policy.forward_vertex_id, space_dim=policy.dim)
    if policy.steered:  # only then: the files of other policies stay algovivo's
        data["steered"] = True
    if policy.mirror is not None:
        data["mirror"] = policy.mirror.to_dict()
    # Checked as load_algovivo_policy reads it (non-finite weights: JSON holds no NaN), so that it reads back.
    _policy_from(data, "save_algovivo_policy: the file would not read back", policy.fc1.weight.dtype)
    with open(path, "w") as f:
        json.dump(data, f, allow_nan=False)
    # algovivo's engine (examples/data/algovivo) builds Linear(inputs, 32) and reads no heading: such a file
    # reads back here, and fails there
    if policy.dim == 2 and not policy.steered and policy.fc1.weight.shape[0] != ALGOVIVO_HIDDEN:
        warnings.warn(f"save_algovivo_policy: {path} holds {policy.fc1.weight.shape[0]} hidden units, and "
                      f"algovivo's engine runs {ALGOVIVO_HIDDEN} only (diffsoft reads it back)", UserWarning,
                      stacklevel=2)


def load_algovivo_policy(path, dtype=torch.float32):
    """Reads a policy in algovivo's JSON (see :func:`save_algovivo_policy`) into a :class:`FramePolicy`.
    Sizes come from the weights: ``fc1.weight`` is ``(hidden, 2 d N)``, ``fc2.weight`` ``(M, hidden)``; a
    malformed file raises ValueError naming the key."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype such as torch.float32, got {dtype!r}")
    return _policy_from(read_json(path), path, dtype)


def _policy_from(data, path, dtype):
    """The :class:`FramePolicy` of algovivo's policy JSON ``data`` (read from ``path``, which errors name)."""
    missing = [k for k in POLICY_KEYS if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{path}: missing key '{missing[0]}' (an algovivo policy has {', '.join(POLICY_KEYS)})")
    unknown = [k for k in data if k not in POLICY_KEYS + DIFFSOFT_POLICY_KEYS + IGNORED_POLICY_KEYS]
    if unknown:  # (a misspelt optional key would read as absent: "mirrror", a policy without its mirror)
        raise ValueError(f"{path}: unknown key(s) {', '.join(map(repr, unknown))} (a policy file holds "
                         f"{', '.join(POLICY_KEYS + DIFFSOFT_POLICY_KEYS)})")
    layers = {}
    for name in ("fc1", "fc2"):
        try:
            if not (only_numbers(data[name]["weight"]) and only_numbers(data[name]["bias"])):
                raise TypeError
            w = torch.tensor(data[name]["weight"], dtype=torch.float64)
            b = torch.tensor(data[name]["bias"], dtype=torch.float64)
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{path}: key '{name}' must be {{'weight': [[...]], 'bias': [...]}} of numbers") from None
        if w.dim() != 2 or b.shape != (w.shape[0],):
            raise ValueError(f"{path}: key '{name}' must have weight (out, in) and bias (out,), got "
                             f"{tuple(w.shape)} and {tuple(b.shape)}")
        if not (torch.isfinite(w).all() and torch.isfinite(b).all()):
            raise ValueError(f"{path}: key '{name}' has non-finite (NaN or infinite) weights")
        layers[name] = (w, b)
    w1, w2 = layers["fc1"][0], layers["fc2"][0]
    if w2.shape[1] != w1.shape[0]:
        raise ValueError(f"{path}: fc2 takes {w2.shape[1]} inputs but fc1 has {w1.shape[0]} outputs")
    for key in ("min_a", "max_abs_da"):
        if isinstance(data[key], bool) or not isinstance(data[key], (int, float)):
            raise ValueError(f"{path}: key '{key}' must be a number, got {data[key]!r}")
    dim = data.get("space_dim", 2)
    if dim not in (2, 3) or isinstance(dim, bool) or not isinstance(dim, int):
        raise ValueError(f"{path}: key 'space_dim' must be 2 or 3, got {dim!r}")
    steered = data.get("steered", False)
    if not isinstance(steered, bool):
        raise ValueError(f"{path}: key 'steered' must be true or false, got {steered!r}")
    mirror = data.get("mirror")
    if mirror is not None:
        try:
            if set(mirror) != {"axis", "vertices", "muscles"} or not all(
                    is_integer(i) for i in [mirror["axis"], *mirror["vertices"], *mirror["muscles"]]):
                raise TypeError
            mirror = Mirror(int(mirror["axis"]), tuple(mirror["vertices"]), tuple(mirror["muscles"]))
        except TypeError:
            raise ValueError(f"{path}: key 'mirror' must be {{'axis': int, 'vertices': [int, ...], 'muscles': "
                             f"[int, ...]}}, got {mirror!r}") from None
    body_inputs = w1.shape[1] - (dim if steered else 0)
    if body_inputs <= 0 or body_inputs % (2 * dim):
        raise ValueError(f"{path}: fc1 takes {w1.shape[1]} inputs, not 2 * space_dim * num_vertices"
                         f"{' + space_dim (steered)' if steered else ''} with space_dim {dim}")
    try:
        policy = FramePolicy(body_inputs // (2 * dim), w2.shape[0], dim, data["center_vertex_id"],
                             data["forward_vertex_id"], hidden=w1.shape[0], min_a=data["min_a"],
                             max_abs_da=data["max_abs_da"], steered=steered, mirror=mirror).to(dtype)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    with torch.no_grad():  # after .to(dtype): float64 weights are read exactly, not through float32
        for name, (w, b) in layers.items():
            getattr(policy, name).weight.copy_(w)
            getattr(policy, name).bias.copy_(b)
    if not all(torch.isfinite(p).all() for p in policy.parameters()):
        raise ValueError(f"{path}: weights too large for {dtype} (they overflow to infinity); load it in a wider dtype")
    return policy


def center_of_mass_x(sim, x):
    """The mass-weighted mean of the vertices' x coordinates: ``(..., N, d)`` -> ``(...)``; masses ``(N,)`` or one
    row per creature ``(B, N)`` (each creature's centre by its own masses)."""
    m = sim.body.mass
    return (x[..., 0] * m).sum(-1) / m.sum(-1)


def center_of_mass(sim, x):
    """The mass-weighted mean of the vertices' positions: ``(..., N, d)`` -> ``(..., d)`` (masses as
    :func:`center_of_mass_x`'s)."""
    m = sim.body.mass
    return (x * m[..., None]).sum(-2) / m.sum(-1)[..., None]


def run_policy(sim, policy, steps, batch=None, a0=None, noise=None, heading=None):
    """A rollout of ``policy`` from the rest pose, without gradients.

    Args:
        steps: the number of steps T; batch: number of creatures B (default 1); a0: ``(M,)`` (for all) or
        ``(B, M)`` initial activations (default relaxed, 1); noise: ``(T, B, M)`` added to the activation changes
        (not broadcast), or None; heading: a steered policy's command (``(B,)`` radians, or one for all; default 0).

    Returns:
        ``xs (T + 1, B, N, d)``, ``activations (T, B, M)``.

    The policy's fields (:meth:`FramePolicy.check`) and a mirrored policy's mirror against the body's (its rest
    pose's, :meth:`Mirror.of`: 0.08 ms on the tetrapod, a thousandth of 100 steps) are checked once, before the
    first step.
    """
    body = sim.body
    m = body.num_muscles
    if not (is_integer(steps) and steps >= 1):
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    b = 1 if batch is None else batch
    if not (is_integer(b) and b >= 1):
        raise ValueError(f"batch must be a positive integer (the number of creatures), got {batch!r}")
    if noise is not None:
        if not isinstance(noise, torch.Tensor):
            raise TypeError(f"noise must be a tensor of shape (T, B, M) = ({steps}, {b}, {m}), got "
                            f"{type(noise).__name__}")
        if noise.dim() != 3 or noise.shape[1:] != (b, m):  # (broadcast, (T, B, 1) gave every muscle one)
            raise ValueError(f"noise must have shape (T, B, M) = ({steps}, {b}, {m}), one change per step, creature "
                             f"and muscle (it is not broadcast), got {tuple(noise.shape)}")
        if len(noise) != steps:
            raise ValueError(f"noise must hold one (B, M) change per step, {steps}, got {len(noise)}")
    if a0 is not None:
        if not isinstance(a0, torch.Tensor):
            raise TypeError(f"a0 must be a tensor of shape ({m},) or ({b}, {m}) (the initial activations), got "
                            f"{type(a0).__name__}")
        if a0.shape not in ((m,), (b, m)):
            raise ValueError(f"a0 must have shape ({m},) or ({b}, {m}) (the initial activations of {m} muscles, for "
                             f"all creatures or each), got {tuple(a0.shape)}")
    if (policy.num_vertices, policy.num_muscles, policy.dim) != (body.num_vertices, m, body.dim):
        raise ValueError(f"the policy was made for a creature of {policy.num_vertices} vertices and "
                         f"{policy.num_muscles} muscles in {policy.dim}D, but this one has {body.num_vertices} "
                         f"vertices and {m} muscles in {body.dim}D: load or train a policy for it")
    x, v = sim.rest_state
    x, v = x.expand(b, -1, -1).clone(), v.expand(b, -1, -1).clone()
    policy.check_state(x, v)
    _check_mirror_fits(sim, policy)
    heading = policy.command(heading, x)
    a = torch.ones(b, m, dtype=x.dtype, device=x.device) if a0 is None else a0
    xs, acts = [x], []
    with torch.no_grad():
        for t in range(steps):  # policy.act, its checks made above
            da = policy.changes(x, v, heading)
            a = next_activation(a, da if noise is None else da + noise[t], policy.min_a, policy.max_abs_da)
            x, v = sim.step(x, v, a)
            xs.append(x)
            acts.append(a)
    return torch.stack(xs), torch.stack(acts)


def _check_mirror_fits(sim, policy):
    """A ValueError unless a mirrored ``policy``'s mirror is ``sim``'s body's (:meth:`Mirror.of`): a policy file
    records the body's sizes only, and its mirror, a permutation that is its own inverse, need not be this
    body's (another creature of the same sizes, a body no longer symmetric, a hand-edited file)."""
    if policy.mirror is None:
        return
    fix = ("A mirrored policy belongs to the body it was made for (FramePolicy.for_simulator(sim, mirror=True)): "
           "load or train one for this creature")
    try:
        body = Mirror.of(sim)
    except ValueError as e:
        raise ValueError(f"the policy's mirror does not fit this body: {e}. {fix}") from None
    for what, ours, theirs in (("vertex", policy.mirror.vertices, body.vertices),
                               ("muscle", policy.mirror.muscles, body.muscles)):
        i = next((i for i, (p, q) in enumerate(zip(ours, theirs)) if p != q), None)
        if i is not None:
            raise ValueError(f"the policy's mirror does not fit this body: it maps {what} {i} to {ours[i]}, the "
                             f"body's mirror (Mirror.of(sim)) to {theirs[i]}. {fix}")


def distance_walked(sim, policy, steps):
    """How far the centre of mass of one creature moves along +x in ``steps`` steps of the deterministic
    policy from the rest pose (relaxed muscles)."""
    xs, _ = run_policy(sim, policy, steps)
    return distance_covered(sim, xs).item()


def moves_along(sim, policy, steps, headings):
    """Where a steered ``policy`` takes its centre of mass toward each commanded heading, in ``steps`` steps
    from rest: two ``(K,)``, its displacement in the ground plane along the heading's direction and the length
    of the rest of it (across the heading), one batched rollout of K creatures, one per heading of ``headings``
    ``(K,)`` (radians)."""
    headings = torch.as_tensor(headings, dtype=sim.body.dtype, device=sim.body.device).reshape(-1)
    if len(headings) == 0:
        raise ValueError("headings must hold at least one heading (radians), got none")
    xs, _ = run_policy(sim, policy, steps, batch=len(headings), heading=headings)
    moved = center_of_mass(sim, xs[-1]) - center_of_mass(sim, xs[0])  # (K, d)
    moved[:, 1] = 0
    d = heading_direction(headings, sim.body.dim, moved.dtype, moved.device)
    along = (moved * d).sum(-1)
    return along, (moved - along[:, None] * d).norm(dim=-1)


def distances_along(sim, policy, steps, headings):
    """How far a steered ``policy`` walks toward each commanded heading, its centre of mass's displacement
    along the heading's direction after ``steps`` steps from rest, and how far off the heading it went (the
    angle in degrees between that displacement in the ground plane and the heading's direction; 90 for a
    creature that did not move): two ``(K,)`` (:func:`moves_along`)."""
    along, across = moves_along(sim, policy, steps, headings)
    cos = along / torch.hypot(along, across).clamp_min(1e-12)
    return along, torch.rad2deg(torch.acos(cos.clamp(-1, 1)))


def distance_covered(sim, xs):
    """How far the centre of mass moves along +x from the first to the last of the positions ``xs (steps + 1,
    ..., N, d)`` of a run (any trainer's rollout: :func:`run_policy`, :meth:`~diffsoft.task.LocomotionTask.rollout`)."""
    return center_of_mass_x(sim, xs[-1]) - center_of_mass_x(sim, xs[0])


class Posture:
    """A body's posture in a state ``x (..., N, d)``: its axis runs from the mean of the lowest fifth of its
    vertices to that of the highest fifth, both fifths chosen at rest (one weighted sum of the positions).
    Building it takes two quantiles of the rest heights; asking it, one product: training builds one per window
    and asks it at every step (its early terminations)."""

    def __init__(self, sim):
        y = sim.body.rest_positions[:, 1]
        top, bottom = y >= y.quantile(0.8), y <= y.quantile(0.2)
        self.weights = top.to(y.dtype) / top.sum() - bottom.to(y.dtype) / bottom.sum()  # (N,)
        self.rest_height = (y * self.weights).sum()

    def axis(self, x):
        """The body's axis ``(..., d)``."""
        return x.transpose(-1, -2) @ self.weights.to(x.dtype)

    def height(self, x):
        """The axis's vertical extent over its value at rest ``(...)``: about 1 standing, lower crouching,
        negative turned over."""
        return self.axis(x)[..., 1] / self.rest_height.to(x.dtype)

    def uprightness(self, x):
        """The cosine of the body's tilt ``(...)``: the world's up (+y) against the axis; 1 as at rest, -1
        upside down."""
        axis = self.axis(x)
        return axis[..., 1] / axis.norm(dim=-1).clamp_min(1e-12)

    def fallen(self, x, least_uprightness=-1.0, least_height=0.0):
        """Whether each state has fallen ``(...)``: its uprightness below ``least_uprightness`` (-1: never) or
        its height below ``least_height`` (0: never; one axis for both)."""
        axis = self.axis(x)
        fallen = axis[..., 1] < least_uprightness * axis.norm(dim=-1).clamp_min(1e-12)
        return fallen | (axis[..., 1] < least_height * self.rest_height.to(x.dtype)) if least_height > 0 else fallen


KEEPS_WALKING = 0.7
"""A lasting gait's last ``window`` steps cover at least this fraction of its first ``window`` steps' distance."""
WALKS = 0.5
"""The least distance along +x a gait's first ``window`` steps cover to count as walking at all (the
sample-efficiency benchmark's first threshold): a creature standing still drifts by some 1e-4."""
STAYS_UP = 0.3
"""A lasting gait's height (:func:`gait`) never drops below this fraction of the rest pose's."""


@dataclasses.dataclass
class Gait:
    """One creature's deterministic gait from rest (:func:`gait`): ``distance[t]``, the centre of mass's
    distance along +x after t steps (``steps + 1`` values), and ``height[t]`` (:meth:`Posture.height`)."""
    distance: list
    height: list
    window: int

    @property
    def first(self):
        """The distance covered in the first ``window`` steps."""
        return self.distance[self.window] - self.distance[0]

    @property
    def last(self):
        """The distance covered in the last ``window`` steps."""
        return self.distance[-1] - self.distance[-1 - self.window]

    @property
    def least_height(self):
        """The least height over the run (1: as at rest)."""
        return min(self.height)

    @property
    def keeps_walking(self):
        """It walks at first (:data:`WALKS`), and its last window covers at least :data:`KEEPS_WALKING` of its
        first."""
        return self.first >= WALKS and self.last >= KEEPS_WALKING * self.first

    @property
    def stays_up(self):
        """Its height never drops below :data:`STAYS_UP` of the rest pose's."""
        return self.least_height >= STAYS_UP

    @property
    def lasts(self):
        """It keeps walking and stays up: a lasting gait."""
        return self.keeps_walking and self.stays_up

    @classmethod
    def of(cls, sim, xs, window=100, heading=None):
        """The gait of one creature of ``sim`` whose positions over a run from rest are ``xs (steps + 1, N, d)``
        (a policy's: :func:`gait`; any trainer's deterministic rollout:
        :meth:`~diffsoft.task.LocomotionTask.rollout`); its distances along +x, or along ``heading`` (radians,
        :func:`heading_direction`: a steered policy's command)."""
        n = sim.body.num_vertices
        if xs.dim() != 3 or xs.shape[1:] != (n, sim.body.dim):
            raise ValueError(f"xs must be one creature's positions (steps + 1, {n}, {sim.body.dim}), got shape "
                             f"{tuple(xs.shape)}")
        if sim.body.mass.shape not in ((n,), (1, n)):  # (a (B, N) weighed step t by creature t's masses)
            raise ValueError(f"body.mass has shape {tuple(sim.body.mass.shape)}, but it must be ({n},) (shared by the "
                             f"batch) or (1, {n}): xs are one creature's positions, and a gait weighs them by its "
                             f"own masses (run it on a simulator of that creature's)")
        steps = xs.shape[0] - 1
        _check_window(window, steps)
        if heading is None:
            com = center_of_mass_x(sim, xs)
        else:
            com = center_of_mass(sim, xs) @ heading_direction([heading], sim.body.dim, xs.dtype, xs.device)[0]
        return cls(distance=(com - com[0]).tolist(), height=Posture(sim).height(xs).tolist(), window=int(window))

    def summary(self):
        """The record a benchmark keeps: steps, first, last, least height and the verdicts."""
        return {"steps": len(self.distance) - 1, "window": self.window, "first": round(self.first, 6),
                "last": round(self.last, 6), "least_height": round(self.least_height, 6),
                "keeps_walking": self.keeps_walking, "stays_up": self.stays_up}


def gait(sim, policy, steps=1000, window=100, heading=None):
    """How a policy's gait lasts: one creature running the deterministic ``policy`` from rest for ``steps``
    steps (:class:`Gait`: its distances and heights; ``lasts`` when it keeps walking and never falls); a
    steered policy toward ``heading`` (radians; default 0, +x), its distances along it."""
    _check_window(window, steps)
    xs, _ = run_policy(sim, policy, steps, heading=heading)
    return Gait.of(sim, xs[:, 0], window, heading)


def _check_window(window, steps):
    """A ValueError unless ``window`` is a positive integer of at most ``steps``."""
    if not (is_integer(window) and window >= 1):
        raise ValueError(f"window must be a positive integer (a number of steps), got {window!r}")
    if not 0 < window <= steps:
        raise ValueError(f"a gait needs 0 < window <= steps, got window={window!r}, steps={steps!r}")
