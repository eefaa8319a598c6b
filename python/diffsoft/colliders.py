"""Colliders: the world a body touches. ``Simulator(body, ..., colliders=[...])`` takes any number of them, each
with its own contact stiffness and friction; ``ground=h`` is shorthand for a horizontal :class:`Plane` at height h.

* :class:`Plane` ``(point, normal)``: the half-space on the normal's side of the plane through ``point``, at any
  slope, in 2D (a line) and 3D.
* :class:`HeightField` ``(x0, dx, heights)``: terrain. In 2D ``y = h(x)``, piecewise linear through ``heights``
  sampled from ``x0`` every ``dx``; in 3D ``heights`` is ``(nx, nz)`` over x and z, ``x0`` and ``dx`` per axis,
  and each grid cell is two triangles (split along the diagonal from ``(i + 1, j)`` to ``(i, j + 1)``). Beyond its
  samples the terrain continues flat at its edge's heights.
* :class:`SmoothHeightField` ``(x0, dx, heights)``: the same terrain made C2, the cubic B-spline of the samples
  (no kinks for Newton to stall at; the terrain :mod:`diffsoft.terrain` makes).
* :class:`Sphere` ``(center, radius)``: a ball; a disc in 2D.
* :class:`Capsule` ``(start, end, radius)``: the points within ``radius`` of a segment; a stadium in 2D.

The model (the C++ kernels' ``csrc/diffsoft/physics/contact.h``, and its reference :func:`diffsoft.energies.contact_energy`):
each collider is a signed distance ``phi`` (negative inside) whose gradient is the unit outward normal ``n``; a free
vertex pays ``k_c min(phi(y), 0)^2`` for its depth inside, and a lagged friction ``w |P0 (y - x0)|^2 / h^2`` on its
slip in the collider's tangent plane at the start of the step (``P0 = I - n(x0) n(x0)^T``), with the weight
``w = k_f max(eps - phi(x0), 0)`` from the start of the step: friction acts within ``eps`` of the surface.
``docs/colliders.md`` derives the friction law this gives (a viscous one, with the threshold it implies on a
slope).

Every field may be a number, a sequence, or a tensor that requires grad (the step's outputs are differentiable
with respect to it, by the kernels' closed forms), and may carry a leading batch dimension ``(B, ...)``: one
value per creature of a batched state (randomised terrain). ``stiffness``, ``friction`` and ``friction_eps``
left at None take the simulator's ``contact_stiffness``, ``friction`` and ``friction_eps``.

Each class is also the kind's reference: :meth:`surface` gives ``(phi, n)`` in torch ops, the C++ kernels'
oracle; ``KIND`` and ``PARAMS`` follow ``_C.COLLIDER_KINDS`` (checked at import).
"""
import math
import numbers

import numpy as np
import torch

from ._extension import _C
from .body import Copies

CONTACT_PARAMS = ("stiffness", "friction", "friction_eps")
"""The parameters every collider kind starts with: the contact's ``k_c``, ``k_f`` and ``eps``."""


class Collider:
    """A collider: its geometry's fields (in the subclasses) and its contact constants, each None (the
    simulator's) or a non-negative number or tensor (``()`` or ``(B,)``)."""
    KIND = None       # the C++ kinds' name
    GEOMETRY = ()     # the geometry's parameters as the kernels take them (see step_params)
    PARAMS = ()       # CONTACT_PARAMS + GEOMETRY: the kernels' order (set below for each kind)
    CODE = None       # the kind's position in KINDS, the kernels' Collider::kind
    FIELDS = ()       # the user's fields, as given to the constructor

    def __init__(self, stiffness=None, friction=None, friction_eps=None):
        self.stiffness, self.friction, self.friction_eps = stiffness, friction, friction_eps

    def step_params(self, sim, batch):
        """The collider's parameters for one step, in ``PARAMS`` order, as tensors of the body's dtype and device
        (graphs kept): the contact's (its own, or ``sim``'s), then the geometry's (:meth:`geometry`). ``batch``:
        the state's batch size, or None; a field with a leading dimension must match it (ValueError naming
        the field)."""
        body = sim.body
        contact = []
        for name, default in zip(CONTACT_PARAMS, (sim.contact_stiffness, sim.friction, sim.friction_eps)):
            value = getattr(self, name)
            value = default if value is None else value
            contact.append(self._field(name, value, (), body.dtype, body.device, batch, lo=0.0))
        return (*contact, *self.geometry(body.dim, body.dtype, body.device, batch))

    def geometry(self, dim, dtype, device, batch):
        """The geometry's parameters (``GEOMETRY``) for a ``dim``-dimensional body, checked (a ValueError or
        TypeError naming the field)."""
        raise NotImplementedError

    @staticmethod
    def moved(shift, *geometry):
        """The geometry's parameters (``GEOMETRY``, as :meth:`geometry` gives them) in a frame whose origin is at
        ``shift`` ``([B,] d)``, horizontal (its y is 0): the same surface, with ``q - shift`` for each point q.
        The simulator solves a step far from the origin in such a frame (:meth:`Simulator.step`)."""
        raise NotImplementedError

    def step_params_for_one(self, dim):
        """The geometry's parameters for one creature, float64 on the CPU, values only (a field with a batch
        dimension is a ValueError): what files and pictures show."""
        return tuple(t.detach() for t in self.geometry(dim, torch.float64, torch.device("cpu"), None))

    def mesh(self, dim, lo, hi):
        """The collider's solid within the box ``[lo, hi]`` (``(d,)`` arrays), for pictures and VTK files: in 2D a
        closed polygon ``(P, 2)`` (its boundary, clipped to the box), in 3D ``(points (P, 3), triangles (T, 3))``
        of its surface."""
        raise NotImplementedError

    def to(self, dtype=None, device=None):
        """A copy with its tensors ``t.to(device, dtype)``: differentiable, as :meth:`Simulator.to
        <diffsoft.simulator.Simulator.to>`'s constants (gradients flow back to this collider's tensors); numbers
        stay numbers."""
        out = object.__new__(type(self))
        copies = Copies()
        for name, value in vars(self).items():
            setattr(out, name, copies.to(name, value, dtype, device, source=getattr(self, "_copies", None))
                    if isinstance(value, torch.Tensor) else value)
        out._copies = copies
        return out

    def check_copies(self, where):
        """A ValueError naming ``where`` (e.g. ``sim.colliders[0]``) where a tensor of this copy (:meth:`to`) was
        copied from one changed in place since: the copy does not follow it."""
        copies = getattr(self, "_copies", Copies())
        for name in copies.stale(lambda name: getattr(self, name, None)):
            by = copies.made_by(name)
            again = "call to() again from the original" if by == "Simulator.to" else f"call {by} again"
            raise ValueError(f"{where}.{name} is a copy made by {by} of a tensor that was changed in place since, "
                             f"and does not follow it: {again} (or assign {where}.{name})")

    def to_dict(self, dim):
        """The collider as JSON values (creature files) for a ``dim``-dimensional body: its kind and its fields as
        numbers or nested lists, one creature's (a field with a batch dimension is a ValueError)."""
        self.step_params_for_one(dim)
        for name in CONTACT_PARAMS:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                raise ValueError(f"{type(self).__name__}.{name} has shape {tuple(value.shape)} (one per creature of a "
                                 f"batch), but a file holds one creature's: save each creature's own")
        out = {"kind": self.KIND}
        for name in self.FIELDS + CONTACT_PARAMS:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                value = value.detach().cpu().tolist()
            out[name] = value
        return out

    @staticmethod
    def from_dict(data, where="collider"):
        """The collider that :meth:`to_dict` wrote; a ValueError naming ``where`` and the key otherwise."""
        if not isinstance(data, dict) or data.get("kind") not in _BY_KIND:
            raise ValueError(f"{where} must be an object with 'kind' one of {sorted(_BY_KIND)}, got {data!r}")
        cls = _BY_KIND[data["kind"]]
        missing = [k for k in cls.FIELDS if k not in data]
        if missing:
            raise ValueError(f"{where}: a {data['kind']} needs the keys {cls.FIELDS}, missing {missing}")
        kwargs = {k: data[k] for k in cls.FIELDS + CONTACT_PARAMS if data.get(k) is not None}

        def has_bool(v):
            return isinstance(v, bool) or (isinstance(v, list) and any(has_bool(u) for u in v))
        for k, v in kwargs.items():
            if has_bool(v):
                raise ValueError(f"{where}: key {k!r} must hold numbers (JSON's true is not 1), got {v!r}")
        try:
            return cls(**kwargs)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}: {e}") from None

    def __repr__(self):
        def show(v):
            if isinstance(v, torch.Tensor):
                return f"tensor{tuple(v.shape)}" if v.dim() else f"{v.item():g}"
            return repr(v)

        fields = ", ".join(f"{k}={show(getattr(self, k))}" for k in self.FIELDS + CONTACT_PARAMS
                           if getattr(self, k) is not None)
        return f"{type(self).__name__}({fields})"

    # -- helpers -------------------------------------------------------------------------------------------------

    def _field(self, name, value, shape, dtype, device, batch, lo=None):
        """``value`` as a tensor of ``shape`` (shared) or ``(batch, *shape)`` (per creature), finite (and
        ``>= lo``), keeping its graph; a TypeError or ValueError naming ``type(self).name``."""
        where = f"{type(self).__name__}.{name}"
        if isinstance(value, torch.Tensor):
            if value.is_complex() or value.dtype == torch.bool:
                raise TypeError(f"{where} must be real, got a {value.dtype} tensor")
            t = value.to(dtype=dtype, device=device)
        else:
            try:
                t = torch.as_tensor(value, dtype=dtype, device=device)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(f"{where} must be a number, a sequence of numbers or a tensor, got {value!r}") from None
        shape = tuple(shape)
        if tuple(t.shape) != shape and not (batch is not None and tuple(t.shape) == (batch,) + shape):
            # as the simulator's own fields (Simulator._check_parameters)
            if batch is None:
                raise ValueError(f"{where} has shape {tuple(t.shape)}, but it must be {shape} for one creature: x0 is "
                                 f"(N, d); one value per creature needs a batch x0 of shape (B, N, d) and {where} of "
                                 f"shape (B, *{shape})")
            raise ValueError(f"{where} has shape {tuple(t.shape)}, but it must be {shape} (shared by the batch) or "
                             f"{(batch,) + shape} (one per creature of x0's batch of {batch})")
        v = t.detach()
        if not bool(torch.isfinite(v).all()) or (lo is not None and bool((v < lo).any())):
            rule = "finite" + ("" if lo is None else f" and >= {lo:g}")
            raise ValueError(f"{where} must be {rule}, got {value!r}")
        return t


class Plane(Collider):
    """The half-space on the side of ``normal`` of the plane through ``point``: ``phi = n . (q - point)`` with
    ``n = normal / |normal|``. ``point`` and ``normal`` are ``(d,)`` (or ``(B, d)``); the normal need not be
    unit, but not 0. Its kernels' parameters are the unit normal and ``offset = n . point`` (autograd carries
    their gradients to ``point`` and ``normal``)."""
    KIND = "plane"
    GEOMETRY = ("normal", "offset")
    FIELDS = ("point", "normal")

    def __init__(self, point, normal, stiffness=None, friction=None, friction_eps=None):
        super().__init__(stiffness, friction, friction_eps)
        self.point, self.normal = point, normal

    def geometry(self, dim, dtype, device, batch):
        """The unit normal ``n`` and ``offset = n . point`` (``([B,] d)``, ``([B])``)."""
        point = self._field("point", self.point, (dim,), dtype, device, batch)
        normal = self._field("normal", self.normal, (dim,), dtype, device, batch)
        length = torch.linalg.vector_norm(normal.detach(), dim=-1)
        if not bool((length > 0).all()):
            raise ValueError(f"Plane.normal must not be 0, got {self.normal!r}")
        n = normal / torch.linalg.vector_norm(normal, dim=-1, keepdim=True)
        return n, (n * point).sum(-1)

    def mesh(self, dim, lo, hi):
        """In 2D the solid side (phi < 0) clipped to the box; in 3D a square patch of the plane around its centre."""
        n, offset = (t.numpy() for t in self.step_params_for_one(dim))
        if dim == 2:  # the box's corners inside the plane, and its edges' crossings, around the box
            corners = np.array([[lo[0], lo[1]], [hi[0], lo[1]], [hi[0], hi[1]], [lo[0], hi[1]]])
            return _clip(corners, lambda q: q @ n - offset)
        # a square patch of the plane around the box's centre, as wide as the box's diagonal
        centre = (np.asarray(lo) + np.asarray(hi)) / 2
        centre = centre - (centre @ n - offset) * n
        u = np.cross(n, [1.0, 0.0, 0.0] if abs(n[0]) < 0.9 else [0.0, 0.0, 1.0])
        u /= np.linalg.norm(u)
        v = np.cross(n, u)
        r = 0.5 * np.linalg.norm(np.asarray(hi) - np.asarray(lo))
        points = np.array([centre + r * (a * u + b * v) for a, b in ((-1, -1), (1, -1), (1, 1), (-1, 1))])
        return points, np.array([[0, 1, 2], [0, 2, 3]])

    @staticmethod
    def moved(shift, normal, offset):
        """``offset - n . shift`` (unchanged where the normal has no horizontal part: the ground)."""
        along = (normal * shift).sum(-1)
        return (normal, offset - along) if bool(along.detach().any()) else (normal, offset)

    @staticmethod
    def surface(q, normal, offset):
        """``(phi, n)`` at ``q`` ``(..., F, d)``; normal ``([B,] d)`` unit, offset ``([B])``."""
        n = normal.unsqueeze(-2) if normal.dim() > 1 else normal
        phi = (q * n).sum(-1) - (offset[..., None] if offset.dim() else offset)
        return phi, n.expand_as(q)


class HeightField(Collider):
    """Terrain ``y = h(x)`` (2D) or ``y = h(x, z)`` (3D), piecewise linear through ``heights`` sampled from ``x0``
    every ``dx`` (see the module docstring). 2D: ``x0`` and ``dx`` numbers (or ``(B,)``), ``heights`` ``(nx,)``
    (or ``(B, nx)``); 3D: ``x0`` and ``dx`` ``(2,)`` over x and z (a number for both), ``heights`` ``(nx, nz)``
    (or ``(B, nx, nz)``); at least 2 samples per axis, ``dx > 0``. ``phi = (y - h) / |(-dh/dx, 1, -dh/dz)|``: the
    distance to the piece of terrain below (a sloped height field is the plane it samples)."""
    KIND = "height_field"
    GEOMETRY = ("origin", "spacing", "heights")
    FIELDS = ("x0", "dx", "heights")

    def __init__(self, x0, dx, heights, stiffness=None, friction=None, friction_eps=None):
        super().__init__(stiffness, friction, friction_eps)
        self.x0, self.dx, self.heights = x0, dx, heights

    def geometry(self, dim, dtype, device, batch):
        """``origin`` and ``spacing`` (``([B,] A)``, A = d - 1 horizontal axes) and ``heights``."""
        axes = dim - 1
        try:
            heights = self.heights if isinstance(self.heights, torch.Tensor) else torch.as_tensor(self.heights)
        except (TypeError, ValueError, RuntimeError):  # ragged lists, strings, None: torch's message names nothing
            raise TypeError(f"{type(self).__name__}.heights must be a tensor or a (nested) sequence of numbers, "
                            f"{'(nx,)' if axes == 1 else '(nx, nz)'} (or with a leading B), "
                            f"got {self.heights!r}") from None
        samples = tuple(heights.shape[heights.dim() - axes:]) if heights.dim() >= axes else ()
        if len(samples) != axes or min(samples) < 2:
            raise ValueError(f"{type(self).__name__}.heights must have at least 2 samples along each of its {axes} "
                             f"axes ({'(nx,)' if axes == 1 else '(nx, nz)'}, or with a leading B), got shape "
                             f"{tuple(heights.shape)}")
        heights = self._field("heights", self.heights, samples, dtype, device, batch)
        origin, spacing = (self._per_axis(name, getattr(self, name), axes, dtype, device, batch) for name in ("x0", "dx"))
        if not bool((spacing.detach() > 0).all()):
            raise ValueError(f"{type(self).__name__}.dx must be > 0, got {self.dx!r}")
        return origin, spacing, heights

    def _per_axis(self, name, value, axes, dtype, device, batch):
        """A field given per horizontal axis, as ``([B,] axes)``: in 2D a number (or ``(B,)``); in 3D ``(2,)`` (or
        ``(B, 2)``), or a number for both axes."""
        if axes == 1 or _scalar(value):
            t = self._field(name, value, (), dtype, device, batch)[..., None]
            return t if axes == 1 else t.expand(*t.shape[:-1], axes)
        return self._field(name, value, (axes,), dtype, device, batch)

    def mesh(self, dim, lo, hi):
        """In 2D the terrain's polygon down to the box's floor, in 3D its surface's triangles within the box."""
        origin, spacing, heights = (t.numpy() for t in self.step_params_for_one(dim))
        if dim == 2:  # the samples (and the flat continuation to the box's sides), then down to its bottom
            xs = origin[0] + spacing[0] * np.arange(len(heights))
            left, right = min(lo[0], xs[0]), max(hi[0], xs[-1])
            top = np.concatenate([[[left, heights[0]]], np.stack([xs, heights], 1), [[right, heights[-1]]]])
            bottom = min(lo[1], heights.min()) - 0.1 * (hi[1] - lo[1])
            return np.concatenate([top, [[right, bottom], [left, bottom]]])
        nx, nz = heights.shape
        ix, iz = np.meshgrid(np.arange(nx), np.arange(nz), indexing="ij")
        points = np.stack([origin[0] + spacing[0] * ix, heights, origin[1] + spacing[1] * iz], -1).reshape(-1, 3)
        cell = (ix[:-1, :-1] * nz + iz[:-1, :-1]).reshape(-1)
        # each cell's two triangles, split along the diagonal from (i + 1, j) to (i, j + 1), as the kernels'
        tris = np.concatenate([np.stack([cell, cell + nz, cell + 1], 1), np.stack([cell + nz + 1, cell + 1, cell + nz], 1)])
        return points, tris

    @staticmethod
    def moved(shift, origin, spacing, heights):
        """``origin`` less the shift's horizontal part (x in 2D, x and z in 3D)."""
        return origin - shift[..., [0] if shift.shape[-1] == 2 else [0, 2]], spacing, heights

    @staticmethod
    def surface(q, origin, spacing, heights):
        """``(phi, n)`` at ``q`` ``(..., F, d)``; origin, spacing ``([B,] d - 1)``, heights ``([B,] nx[, nz])``,
        as the C++ kernels' (``colliders.h``)."""
        d = q.shape[-1]
        axes = d - 1
        horizontal = q[..., [0]] if d == 2 else q[..., [0, 2]]  # (..., F, A)
        # per problem, each on its own (a shared origin with spacings per creature): (B, A) against (B, F, A)
        origin = origin.unsqueeze(-2) if origin.dim() > 1 else origin
        spacing = spacing.unsqueeze(-2) if spacing.dim() > 1 else spacing
        coord = (horizontal - origin) / spacing
        counts = torch.tensor(heights.shape[heights.dim() - axes:], device=q.device)
        cell = torch.floor(coord.detach())
        cell = torch.where(cell >= 0, cell, torch.zeros_like(cell))  # NaN too
        cell = torch.minimum(cell, (counts - 2).to(cell.dtype)).long()
        frac = coord - cell.to(coord.dtype)
        clamped = ~((frac >= 0) & (frac <= 1))
        frac = torch.where(clamped, torch.where(frac < 0, torch.zeros_like(frac), torch.ones_like(frac)), frac)
        flat = heights.reshape(*heights.shape[:heights.dim() - axes], -1)

        def sample(i):  # the heights at flat indices i (..., F)
            if flat.dim() == 1:
                return flat[i]
            return torch.gather(flat, -1, i)

        if axes == 1:
            k = cell[..., 0]
            f = frac[..., 0]
            h0, h1 = sample(k), sample(k + 1)
            h = (1 - f) * h0 + f * h1
            rise = (h1 - h0)[..., None]
        else:
            nz = heights.shape[-1]
            i, j = cell[..., 0], cell[..., 1]
            fu, fw = frac[..., 0], frac[..., 1]
            h00, h10, h01, h11 = sample(i * nz + j), sample((i + 1) * nz + j), sample(i * nz + j + 1), \
                sample((i + 1) * nz + j + 1)
            lower = fu + fw <= 1
            h = torch.where(lower, (1 - fu - fw) * h00 + fu * h10 + fw * h01,
                            (fu + fw - 1) * h11 + (1 - fu) * h01 + (1 - fw) * h10)
            rise = torch.stack([torch.where(lower, h10 - h00, h11 - h01), torch.where(lower, h01 - h00, h11 - h10)], -1)
        slope = torch.where(clamped, torch.zeros_like(rise), rise / spacing)
        length = torch.sqrt(1 + (slope * slope).sum(-1))
        up = [-slope[..., 0], torch.ones_like(length)] + ([] if d == 2 else [-slope[..., 1]])
        n = torch.stack(up, -1) / length[..., None]
        return (q[..., 1] - h) / length, n


class SmoothHeightField(HeightField):
    """A :class:`HeightField`'s terrain made smooth: ``h`` is the uniform cubic B-spline whose control points are
    ``heights``, placed at the samples (a tensor product in 3D), the same fields and shapes. It is C2, so a vertex
    on it meets no kink (a piecewise linear field's slope jumps at every sample, which stalls Newton there). The
    spline smooths the samples (at a sample it is ``(h[i-1] + 4 h[i] + h[i+1]) / 6`` along each axis) and
    reproduces linear ones exactly a sample or more in from the edges (a sloped field is its plane there); it bends
    to flat within a sample of the edges, and beyond the samples continues flat.
    ``phi = (y - h) / |(-dh/dx, 1, -dh/dz)|``: the signed distance to first order in ``y - h``, exact on planes; its
    gradient is the unit normal on the surface, and off it not quite unit, so the friction's plane is normal to
    the gradient made unit."""
    KIND = "smooth_height_field"

    def mesh(self, dim, lo, hi):
        """The spline sampled 4 times per sample spacing in 2D (the polygon down to the box's floor), at the samples
        in 3D (the surface's triangles, as :class:`HeightField`'s: finer would multiply a picture's triangles)."""
        origin, spacing, heights = self.step_params_for_one(dim)
        fine = 4 if dim == 2 else 1  # from 2 samples before the first to 2 after the last, where it is flat
        axes = [torch.arange(-2 * fine, (n + 1) * fine + 1, dtype=torch.float64) / fine for n in heights.shape]
        coords = axes[0][:, None] if dim == 2 else torch.stack(torch.meshgrid(*axes, indexing="ij"), -1)
        h = _spline(coords, heights, 0)[0].numpy()
        start, step = (origin - 2 * spacing).tolist(), (spacing / fine).tolist()
        return HeightField(*((start[0], step[0]) if dim == 2 else (start, step)), h).mesh(dim, lo, hi)

    @staticmethod
    def surface(q, origin, spacing, heights):
        """``(phi, n)`` at ``q`` ``(..., F, d)``; origin, spacing ``([B,] d - 1)``, heights ``([B,] nx[, nz])``,
        as the C++ kernels' (``colliders.h``): ``n`` is the unit vector along ``d phi / dq`` (which is unit on the
        surface only; the contact's force is autograd's of ``phi``, the friction's plane is ``n``'s), through the
        spline's value, gradient and Hessian."""
        d = q.shape[-1]
        horizontal = q[..., [0]] if d == 2 else q[..., [0, 2]]  # (..., F, A)
        origin = origin.unsqueeze(-2) if origin.dim() > 1 else origin
        spacing = spacing.unsqueeze(-2) if spacing.dim() > 1 else spacing
        h, g, hess = _spline((horizontal - origin) / spacing, heights, 2)
        g = g / spacing
        hess = hess / (spacing[..., :, None] * spacing[..., None, :])
        length = torch.sqrt(1 + (g * g).sum(-1))
        u = q[..., 1] - h
        rate = (hess @ g[..., None])[..., 0] / length[..., None]  # dL/dx
        across = -g / length[..., None] - (u / length ** 2)[..., None] * rate
        up = [across[..., 0], 1 / length] + ([] if d == 2 else [across[..., 1]])
        grad = torch.stack(up, -1)
        return u / length, grad / torch.linalg.vector_norm(grad, dim=-1, keepdim=True)


def _spline(coord, heights, orders):
    """The uniform cubic B-spline of ``heights`` ``([B,] nx[, nz])`` at ``coord`` ``(..., A)`` (in samples, control
    point i at i; beyond the edges the control points repeat the edge's): its value ``(...)``, and for ``orders``
    >= 1 its gradient ``(..., A)`` and for 2 its Hessian ``(..., A, A)`` in these coordinates."""
    axes = coord.shape[-1]
    counts = heights.shape[heights.dim() - axes:]
    hi = torch.tensor([n + 1 for n in counts], dtype=coord.dtype, device=coord.device)
    coord = torch.where(coord >= -2, coord, torch.full_like(coord, -2))  # NaN too: flat beyond the edges
    coord = torch.minimum(coord, hi)
    cell = torch.floor(coord.detach())
    t = coord - cell
    r = 1 - t
    basis = [torch.stack([r ** 3 / 6, (3 * t ** 3 - 6 * t ** 2 + 4) / 6, (-3 * t ** 3 + 3 * t ** 2 + 3 * t + 1) / 6,
                          t ** 3 / 6], -1),
             torch.stack([-r ** 2 / 2, (3 * t ** 2 - 4 * t) / 2, (-3 * t ** 2 + 2 * t + 1) / 2, t ** 2 / 2], -1),
             torch.stack([r, 3 * t - 2, 1 - 3 * t, t], -1)]  # (..., A, 4) per order
    offsets = torch.arange(-1, 3, device=coord.device)
    index = torch.minimum(torch.clamp(cell.long()[..., None] + offsets, min=0),
                          torch.tensor(counts, device=coord.device)[:, None] - 1)  # (..., A, 4)
    flat = heights.reshape(*heights.shape[:heights.dim() - axes], -1)
    if axes == 1:
        points = index[..., 0, :]
    else:
        points = (index[..., 0, :, None] * counts[1] + index[..., 1, None, :]).flatten(-2)  # (..., 16)
    if flat.dim() == 1:
        values = flat[points]
    else:  # per problem: points (B, F, K) against flat (B, P)
        values = torch.gather(flat, -1, points.flatten(-2)).view(points.shape)

    def weights(o):  # the control points' weights differentiated o[a] times along axis a, (..., K)
        w = basis[o[0]][..., 0, :]
        if axes == 2:
            w = (w[..., :, None] * basis[o[1]][..., 1, None, :]).flatten(-2)
        return w

    def at(o):
        return (weights(o) * values).sum(-1)

    unit = [[int(a == b) for b in range(axes)] for a in range(axes)]
    out = [at([0] * axes)]
    if orders >= 1:
        out.append(torch.stack([at(e) for e in unit], -1))
    if orders >= 2:
        out.append(torch.stack([torch.stack([at([x + y for x, y in zip(ea, eb)]) for eb in unit], -1)
                                for ea in unit], -2))
    return out


class Sphere(Collider):
    """A ball (a disc in 2D): ``phi = |q - center| - radius``. ``center`` ``(d,)`` (or ``(B, d)``), ``radius`` a
    positive number (or ``(B,)``)."""
    KIND = "sphere"
    GEOMETRY = ("center", "radius")
    FIELDS = ("center", "radius")

    def __init__(self, center, radius, stiffness=None, friction=None, friction_eps=None):
        super().__init__(stiffness, friction, friction_eps)
        self.center, self.radius = center, radius

    def geometry(self, dim, dtype, device, batch):
        """``center`` (``([B,] d)``) and ``radius`` (``([B])``)."""
        center = self._field("center", self.center, (dim,), dtype, device, batch)
        radius = self._field("radius", self.radius, (), dtype, device, batch, lo=0.0)
        return center, radius

    def mesh(self, dim, lo, hi):
        """In 2D the disc as a polygon, in 3D the sphere's triangulated surface."""
        center, radius = (t.numpy() for t in self.step_params_for_one(dim))
        if dim == 2:
            a = np.linspace(0, 2 * math.pi, 64, endpoint=False)
            return center + float(radius) * np.stack([np.cos(a), np.sin(a)], 1)
        rings, segments = 12, 24
        theta = np.linspace(0, math.pi, rings + 1)[:, None]
        phi = np.linspace(0, 2 * math.pi, segments, endpoint=False)[None, :]
        unit = np.stack([np.sin(theta) * np.cos(phi), np.cos(theta) * np.ones_like(phi), np.sin(theta) * np.sin(phi)], -1)
        points = (center + float(radius) * unit).reshape(-1, 3)
        return points, _ring_triangles(rings, segments)

    @staticmethod
    def moved(shift, center, radius):
        return center - shift, radius

    @staticmethod
    def surface(q, center, radius):
        """``(phi, n)`` at ``q`` ``(..., F, d)``; center ``([B,] d)``, radius ``([B])``; at the centre itself n is
        +y, as the C++ kernels'."""
        c = center.unsqueeze(-2) if center.dim() > 1 else center
        r = q - c
        dist = torch.linalg.vector_norm(r, dim=-1)
        inside = dist > 0
        safe = torch.where(inside, dist, torch.ones_like(dist))
        up = torch.zeros_like(q)
        up[..., 1] = 1
        n = torch.where(inside[..., None], r / safe[..., None], up)
        return dist - (radius[..., None] if radius.dim() else radius), n


class Capsule(Collider):
    """The points within ``radius`` of the segment from ``start`` to ``end`` (a stadium in 2D): ``phi = |q - p| -
    radius`` with ``p`` the segment's point nearest ``q``. ``start`` and ``end`` ``(d,)`` (or ``(B, d)``; equal
    ones make a sphere), ``radius`` a non-negative number (or ``(B,)``)."""
    KIND = "capsule"
    GEOMETRY = ("start", "end", "radius")
    FIELDS = ("start", "end", "radius")

    def __init__(self, start, end, radius, stiffness=None, friction=None, friction_eps=None):
        super().__init__(stiffness, friction, friction_eps)
        self.start, self.end, self.radius = start, end, radius

    def geometry(self, dim, dtype, device, batch):
        """``start``, ``end`` (``([B,] d)``) and ``radius`` (``([B])``)."""
        start = self._field("start", self.start, (dim,), dtype, device, batch)
        end = self._field("end", self.end, (dim,), dtype, device, batch)
        return start, end, self._field("radius", self.radius, (), dtype, device, batch, lo=0.0)

    def mesh(self, dim, lo, hi):
        """In 2D the stadium as a polygon, in 3D the capsule's triangulated surface (a cylinder and two caps)."""
        start, end, radius = (t.numpy() for t in self.step_params_for_one(dim))
        r = float(radius)
        w = end - start
        length = np.linalg.norm(w)
        u = w / length if length > 0 else np.eye(dim)[0]
        if dim == 2:  # half a circle around each end
            a = np.linspace(-math.pi / 2, math.pi / 2, 33)[:, None]
            v = np.array([-u[1], u[0]])
            cap = np.cos(a) * u + np.sin(a) * v
            return np.concatenate([end + r * cap, start - r * cap])
        v = np.cross(u, [1.0, 0.0, 0.0] if abs(u[0]) < 0.9 else [0.0, 0.0, 1.0])
        v /= np.linalg.norm(v)
        v2 = np.cross(u, v)
        half = np.linspace(0, math.pi / 2, 7)
        theta = np.concatenate([half, half + math.pi / 2])[:, None]  # end's cap (about u), then start's (about -u)
        centre = np.repeat(np.stack([end, start]), len(half), 0)[:, None, :]
        rings, segments = len(theta) - 1, 24
        phi = np.linspace(0, 2 * math.pi, segments, endpoint=False)[None, :]
        unit = (np.cos(theta)[..., None] * u + (np.sin(theta) * np.cos(phi))[..., None] * v +
                (np.sin(theta) * np.sin(phi))[..., None] * v2)
        points = (centre + r * unit).reshape(-1, 3)
        return points, _ring_triangles(rings, segments)

    @staticmethod
    def moved(shift, start, end, radius):
        return start - shift, end - shift, radius

    @staticmethod
    def surface(q, start, end, radius):
        """``(phi, n)`` at ``q`` ``(..., F, d)``; start, end ``([B,] d)``, radius ``([B])``; on the segment itself
        n is +y, as the C++ kernels'."""
        a = start.unsqueeze(-2) if start.dim() > 1 else start
        w = (end.unsqueeze(-2) if end.dim() > 1 else end) - a
        ww = (w * w).sum(-1, keepdim=True)
        long = ww > 0
        t = torch.where(long, ((q - a) * w).sum(-1, keepdim=True) / torch.where(long, ww, torch.ones_like(ww)),
                        torch.zeros_like(ww)).clamp(0, 1)
        r = q - a - t * w
        dist = torch.linalg.vector_norm(r, dim=-1)
        off = dist > 0
        safe = torch.where(off, dist, torch.ones_like(dist))
        up = torch.zeros_like(q)
        up[..., 1] = 1
        n = torch.where(off[..., None], r / safe[..., None], up)
        return dist - (radius[..., None] if radius.dim() else radius), n


def _ring_triangles(rings, segments):
    """The triangles ``(T, 3)`` between ``rings + 1`` rings of ``segments`` points each, numbered ring by ring."""
    i, j = np.meshgrid(np.arange(rings), np.arange(segments), indexing="ij")
    a, b = i * segments + j, i * segments + (j + 1) % segments
    return np.concatenate([np.stack([a, a + segments, b], -1).reshape(-1, 3),
                           np.stack([b, a + segments, b + segments], -1).reshape(-1, 3)])


def _clip(polygon, phi):
    """The part of a convex ``polygon`` ``(P, 2)`` where ``phi <= 0`` (Sutherland-Hodgman against one plane)."""
    out = []
    values = [phi(q) for q in polygon]
    for k, (q, value) in enumerate(zip(polygon, values)):
        nxt, nxt_value = polygon[(k + 1) % len(polygon)], values[(k + 1) % len(polygon)]
        if value <= 0:
            out.append(q)
        if (value <= 0) != (nxt_value <= 0):
            out.append(q + (nxt - q) * value / (value - nxt_value))
    return np.array(out).reshape(-1, 2)


def _scalar(value):
    return isinstance(value, numbers.Real) or (isinstance(value, torch.Tensor) and value.dim() == 0)


KINDS = (Plane, HeightField, Sphere, Capsule, SmoothHeightField)
"""The collider kinds, in the C++ kernels' order (``Collider::kind``, ``_C.COLLIDER_KINDS``)."""
_BY_KIND = {cls.KIND: cls for cls in KINDS}
for _code, _cls in enumerate(KINDS):
    _cls.CODE, _cls.PARAMS = _code, CONTACT_PARAMS + _cls.GEOMETRY

if [(cls.KIND, cls.PARAMS) for cls in KINDS] != [(name, tuple(params)) for name, params in _C.COLLIDER_KINDS]:
    raise ImportError(f"diffsoft.colliders has the kinds {[(c.KIND, c.PARAMS) for c in KINDS]} but the C++ kernels' "
                      f"are {list(_C.COLLIDER_KINDS)}: rebuild diffsoft, or make both agree")
