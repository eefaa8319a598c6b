"""SoftBody: a validated simplicial mesh with materials, masses, muscles and fixed vertices, as tensors."""
import math

import torch

from .energies import MATERIALS, determinant


class SoftBody:
    """A 2D (triangles) or 3D (tetrahedra) soft body. All fields are plain tensors that may be made to
    require grad (``body.mu.requires_grad_()``); :class:`~diffsoft.simulator.Simulator` reads them at every
    step and passes them to the solver, so their gradients flow.

    Args:
        vertices: ``(N, d)``, d = 2 or 3, the rest positions (y up).
        elements: ``(E, d + 1)`` vertex indices, positively oriented unless ``Dm_inv`` is given
            (see :func:`diffsoft.mesh.orient`).
        material: ``"neo_hookean"`` (default), ``"stable_neo_hookean"`` or ``"algovivo"``. The first two are
            weighted by the rest area/volume; ``"algovivo"`` by 1 per element, as in that project.
        density: mass per rest area (2D) or volume (3D), a number or ``(E,)``; masses are lumped: each element
            gives ``density * volume / (d + 1)`` to each of its vertices. Or give ``mass``.
        mass: per-vertex masses, a number or ``(N,)``.
        youngs_modulus, poisson_ratio: numbers or ``(E,)``; converted to Lame parameters by the 3D formulas
            (in 2D these are the plane-strain parameters). Or give ``mu`` and ``lam`` directly.
        fixed: vertex indices held in place (Dirichlet); the solver only moves the others.
        muscles: ``(M, 2)`` vertex pairs.
        muscle_rest_length: ``(M,)``, default the rest-pose distances.
        muscle_stiffness: a number or ``(M,)``. Default: a fibre of the body's own material one element thick,
            ``k = E l0 s^(d-1)`` with E the mean Young's modulus and s the mean rest edge length.
        Dm_inv: ``(E, d, d)`` inverse rest-shape matrices (``Dm``'s columns are the rest edges
            ``X_k - X_0``); default computed from ``vertices``. Given, it may define a rest shape other than
            ``vertices`` (algovivo files store it so).
        dtype, device: default: the dtype of a floating ``vertices`` tensor, else torch's default; its device.

    Fields: ``rest_positions (N, d)``, ``elements (E, d+1)``, ``Dm_inv (E, d, d)``, ``rest_volume (E,)``,
    ``mass (N,)``, ``mu (E,)``, ``lam (E,)``, ``muscles (M, 2)``, ``muscle_rest_length (M,)``,
    ``muscle_stiffness (M,)``, ``fixed (K,)``, ``free (N - K,)`` (int64 indices), ``material``, ``dim``.
    """

    def __init__(self, vertices, elements, *, material="neo_hookean", density=None, mass=None,
                 youngs_modulus=None, poisson_ratio=None, mu=None, lam=None, fixed=None, muscles=None,
                 muscle_rest_length=None, muscle_stiffness=None, Dm_inv=None, dtype=None, device=None):
        if dtype is None:
            is_float = isinstance(vertices, torch.Tensor) and vertices.is_floating_point()
            dtype = vertices.dtype if is_float else torch.get_default_dtype()
        if device is None:
            device = vertices.device if isinstance(vertices, torch.Tensor) else torch.device("cpu")
        self._dtype, self._device = dtype, device
        self.material = material

        x = self._float("vertices", vertices)
        if x.dim() != 2 or x.shape[1] not in (2, 3) or x.shape[0] < x.shape[1] + 1:
            raise ValueError(f"vertices must be (N, 2) or (N, 3) with N > d, got shape {tuple(x.shape)}")
        self._rest_positions = x
        n, d = x.shape
        self.dim = d
        self.elements = _indices("elements", elements, n, width=d + 1, device=device)
        if len(self.elements) == 0:
            raise ValueError("elements is empty: a soft body needs at least one element")
        self._check_distinct("elements", self.elements)

        edges = x[self.elements[:, 1:]] - x[self.elements[:, :1]]  # (E, d, d), rows are rest edges
        edge_scale = edges.norm(dim=-1).amax(-1)
        if Dm_inv is None:
            det = determinant(edges)
            bad = torch.nonzero(det.abs() <= 1e-10 * edge_scale ** d).flatten()
            if len(bad):
                raise ValueError(f"element {bad[0].item()} {self.elements[bad[0]].tolist()} is degenerate "
                                 f"(zero rest {'area' if d == 2 else 'volume'}); {len(bad)} such element(s)")
            bad = torch.nonzero(det < 0).flatten()
            if len(bad):
                raise ValueError(f"element {bad[0].item()} {self.elements[bad[0]].tolist()} is inverted "
                                 f"(negatively oriented) in the rest pose; {len(bad)} such element(s). Reorder "
                                 f"its vertices, e.g. with diffsoft.mesh.orient")
            self.Dm_inv = torch.inverse(edges.transpose(-1, -2))
        else:
            self.Dm_inv = self._float("Dm_inv", Dm_inv)
            if self.Dm_inv.shape != (len(self.elements), d, d):
                raise ValueError(f"Dm_inv must be (E, d, d) = {(len(self.elements), d, d)}, "
                                 f"got {tuple(self.Dm_inv.shape)}")
            inv_det = determinant(self.Dm_inv).abs()
            bad = torch.nonzero(~((inv_det > 0) & (inv_det * edge_scale ** d < 1e10))).flatten()
            if len(bad):
                raise ValueError(f"Dm_inv[{bad[0].item()}] is singular or not finite: element {bad[0].item()} "
                                 f"has a degenerate rest shape")
            J = determinant(edges.transpose(-1, -2) @ self.Dm_inv)
            bad = torch.nonzero(~(J > 0)).flatten()
            if len(bad):
                raise ValueError(f"element {bad[0].item()} {self.elements[bad[0]].tolist()} is inverted or "
                                 f"degenerate in vertices relative to its rest shape Dm_inv (det F = "
                                 f"{J[bad[0]].item():.3g}); {len(bad)} such element(s)")
        self.rest_volume = 1.0 / (math.factorial(d) * determinant(self.Dm_inv).abs())

        self._init_lame(youngs_modulus, poisson_ratio, mu, lam)
        self._init_mass(density, mass)
        self._free_of = None
        self.fixed = fixed
        self._init_muscles(muscles, muscle_rest_length, muscle_stiffness, edges)

    @property
    def rest_positions(self):
        """``(N, d)``: the vertices given to the constructor. Read-only: the rest shapes ``Dm_inv``, rest volumes,
        lumped masses and default muscle rest lengths were derived from it. For other rest positions build a
        new SoftBody (from a tensor that requires grad, its gradients flow through all of them), or assign
        ``Dm_inv`` (the rest shapes alone)."""
        return self._rest_positions

    @rest_positions.setter
    def rest_positions(self, value):
        raise AttributeError("SoftBody.rest_positions cannot be reassigned: Dm_inv, rest volumes, masses and muscle "
                             "rest lengths were derived from it. Build a new SoftBody from the new positions, or "
                             "assign Dm_inv to change the rest shapes alone")

    @property
    def fixed(self):
        """``(K,)`` int64: the vertices held in place. It may be assigned (indices, checked as in the
        constructor); a :class:`~diffsoft.simulator.Simulator` of this body takes it from its next step."""
        return self._fixed

    @fixed.setter
    def fixed(self, value):
        self._fixed = self._check_fixed(value)

    @property
    def free(self):
        """``(N - K,)`` int64: the vertices the solver moves, the complement of :attr:`fixed`."""
        key = (id(self._fixed), self._fixed._version)
        if self._free_of != key:  # fixed was assigned, or edited in place
            self._check_fixed(self._fixed)
            is_free = torch.ones(self.num_vertices, dtype=torch.bool, device=self._fixed.device)
            is_free[self._fixed] = False
            self._free, self._free_of = torch.nonzero(is_free).flatten(), key
        return self._free

    @property
    def material(self):
        """The elastic material's name; assigning another (one of :data:`~diffsoft.energies.MATERIALS`) takes
        effect from a simulator's next step."""
        return self._material

    @material.setter
    def material(self, value):
        if value not in MATERIALS:
            raise ValueError(f"material must be one of {MATERIALS}, got {value!r}")
        self._material = value

    def structure(self):
        """What a simulator's step topology is built from (elements, muscles, free vertices, material), as a
        key that changes whenever one of them is assigned or modified in place."""
        return (self._material,) + tuple((id(t), t._version) for t in (self.elements, self.muscles, self.free))

    @property
    def _tiny(self):
        """The smallest positive value a positive constant may take: the dtype's smallest normal number (a
        subnormal modulus or mass underflows to 0 in the quantities derived from it)."""
        return torch.finfo(self._dtype).tiny

    @property
    def num_vertices(self):
        """N, the number of vertices."""
        return self.rest_positions.shape[0]

    @property
    def num_elements(self):
        """E, the number of elements (triangles in 2D, tetrahedra in 3D)."""
        return self.elements.shape[0]

    @property
    def num_muscles(self):
        """M, the number of muscles."""
        return self.muscles.shape[0]

    @property
    def dtype(self):
        """The dtype of the rest positions and of every field."""
        return self.rest_positions.dtype

    @property
    def device(self):
        """The device of the rest positions and of every field."""
        return self.rest_positions.device

    def to(self, dtype=None, device=None):
        """A copy with floating fields cast to ``dtype`` and everything moved to ``device``."""
        out = object.__new__(SoftBody)
        for k, v in self.__dict__.items():
            if isinstance(v, torch.Tensor):
                v = v.detach().to(device=device, dtype=dtype if v.is_floating_point() else None)
            out.__dict__[k] = v
        out._dtype, out._device = out.rest_positions.dtype, out.rest_positions.device
        return out

    def __repr__(self):
        return (f"SoftBody({self.dim}D, {self.num_vertices} vertices, {self.num_elements} "
                f"{'triangles' if self.dim == 2 else 'tetrahedra'}, {self.num_muscles} muscles, "
                f"{len(self.fixed)} fixed, material={self.material!r}, dtype={self.dtype})")

    def _init_lame(self, youngs_modulus, poisson_ratio, mu, lam):
        e = self.num_elements
        by_moduli = youngs_modulus is not None or poisson_ratio is not None
        by_lame = mu is not None or lam is not None
        if by_moduli == by_lame or (by_moduli and (youngs_modulus is None or poisson_ratio is None)) or \
                (by_lame and (mu is None or lam is None)):
            raise ValueError("give the material either as youngs_modulus and poisson_ratio, or as mu and lam")
        if by_moduli:
            E = self._per("youngs_modulus", youngs_modulus, e, "element")
            nu = self._per("poisson_ratio", poisson_ratio, e, "element")
            _require(E >= self._tiny, "youngs_modulus", "element", "must be positive", E)
            _require((nu > -1) & (nu < 0.5), "poisson_ratio", "element", "must be in (-1, 0.5)", nu)
            self.mu = E / (2 * (1 + nu))
            self.lam = E * nu / ((1 + nu) * (1 - 2 * nu))
            # 1 - 2 nu underflows near 0.5, or E is near the dtype's largest number.
            _require(torch.isfinite(self.lam) & torch.isfinite(self.mu), "youngs_modulus and poisson_ratio", "element",
                     f"give Lame parameters that are finite in {self._dtype}; lam is", self.lam)
        else:
            self.mu = self._per("mu", mu, e, "element")
            self.lam = self._per("lam", lam, e, "element")
            _require(self.mu >= self._tiny, "mu", "element", "must be positive", self.mu)
            # Positive bulk modulus, lam + 2 mu / d > 0: the Poisson-ratio bound -1 < nu for the Lame form.
            _require(self.lam + 2 * self.mu / self.dim > 0, "lam", "element",
                     f"must exceed -2 mu / {self.dim} (a positive bulk modulus)", self.lam)
        if self.material != "stable_neo_hookean":
            # Along F = J^(1/d) I, neo-Hookean's lam/2 log^2 J beats -mu log J as J -> 0, and algovivo's
            # lam/2 q(J)^2 (q quadratic in J) beats everything as |J| -> inf: with lam < 0 the energy has no
            # minimum and a step's solve would follow it to a collapsed or exploded element.
            name, values = ("poisson_ratio", nu) if by_moduli else ("lam", self.lam)
            _require(values >= 0, name, "element", f"must be >= 0 for material {self.material!r}, whose energy is "
                     f"unbounded below when lam < 0 (a negative Poisson ratio); 'stable_neo_hookean' takes "
                     f"negative ratios", values)

    def _init_mass(self, density, mass):
        n, e = self.num_vertices, self.num_elements
        if (density is None) == (mass is None):
            raise ValueError("give exactly one of density (masses lumped from rest volumes) and mass")
        if mass is not None:
            self.mass = self._per("mass", mass, n, "vertex")
            _require(self.mass >= self._tiny, "mass", "vertex", "must be positive", self.mass)
            return
        rho = self._per("density", density, e, "element")
        _require(rho >= self._tiny, "density", "element", "must be positive", rho)
        share = (rho * self.rest_volume / (self.dim + 1)).repeat_interleave(self.dim + 1)
        self.mass = torch.zeros(n, dtype=self._dtype, device=self._device).index_add_(
            0, self.elements.flatten(), share)
        _require(torch.isfinite(self.mass), "density", "vertex", f"gives masses that overflow {self._dtype}; the mass is",
                 self.mass)
        lonely = torch.nonzero(self.mass == 0).flatten()
        if len(lonely):
            raise ValueError(f"vertex {lonely[0].item()} belongs to no element, so it has no mass; remove it or "
                             f"give mass explicitly ({len(lonely)} such vertices)")

    def _check_fixed(self, fixed):
        n = self.num_vertices
        fixed = _indices("fixed", [] if fixed is None else fixed, n, width=None, device=self._device)
        if len(torch.unique(fixed)) != len(fixed):
            raise ValueError(f"fixed lists a vertex twice: {fixed.tolist()}")
        if len(fixed) == n:
            raise ValueError("every vertex is fixed: nothing to simulate")
        return fixed

    def _init_muscles(self, muscles, rest_length, stiffness, rest_edges):
        n = self.num_vertices
        self.muscles = _indices("muscles", [] if muscles is None else muscles, n, width=2, device=self._device)
        m = len(self.muscles)
        same = torch.nonzero(self.muscles[:, 0] == self.muscles[:, 1]).flatten()
        if len(same):
            raise ValueError(f"muscle {same[0].item()} joins vertex {self.muscles[same[0], 0].item()} to itself")
        if rest_length is None:
            x = self.rest_positions
            self.muscle_rest_length = (x[self.muscles[:, 0]] - x[self.muscles[:, 1]]).norm(dim=-1)
        else:
            self.muscle_rest_length = self._per("muscle_rest_length", rest_length, m, "muscle")
        _require(self.muscle_rest_length >= self._tiny, "muscle_rest_length", "muscle", "must be positive",
                 self.muscle_rest_length)
        if stiffness is None:
            E = (self.mu * ((3 * self.lam + 2 * self.mu) / (self.lam + self.mu))).mean()
            s = rest_edges.norm(dim=-1).mean()
            self.muscle_stiffness = E * self.muscle_rest_length * s ** (self.dim - 1)
            _require(torch.isfinite(self.muscle_stiffness) & (self.muscle_stiffness >= self._tiny),
                     "the default muscle_stiffness (Young's modulus x muscle_rest_length x edge length)", "muscle",
                     f"over- or underflows {self._dtype} with these youngs_modulus (or mu, lam) and "
                     f"muscle_rest_length; give muscle_stiffness:", self.muscle_stiffness)
        else:
            self.muscle_stiffness = self._per("muscle_stiffness", stiffness, m, "muscle")
        _require(self.muscle_stiffness >= self._tiny, "muscle_stiffness", "muscle", "must be positive", self.muscle_stiffness)

    def _check_distinct(self, name, idx):
        s = idx.sort(dim=1).values
        bad = torch.nonzero((s[:, 1:] == s[:, :-1]).any(dim=1)).flatten()
        if len(bad):
            raise ValueError(f"{name}[{bad[0].item()}] = {idx[bad[0]].tolist()} repeats a vertex")

    def _float(self, name, value):
        if isinstance(value, bool) or (
                isinstance(value, torch.Tensor) and value.dtype in (torch.bool, torch.complex64, torch.complex128)):
            raise TypeError(f"{name} must be real numbers, got {value.dtype if isinstance(value, torch.Tensor) else value!r}")
        try:
            t = torch.as_tensor(value, dtype=self._dtype, device=self._device)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{name} must be numbers, got {type(value).__name__} ({e})") from None
        if not torch.isfinite(t).all():
            bad = value if t.dim() == 0 else t[~torch.isfinite(t)][0].item()
            raise ValueError(f"{name} has non-finite entries in {self._dtype}: {bad!r}")
        return t

    def _per(self, name, value, count, what):
        """A number (numpy's included) or a length-``count`` vector, as a ``(count,)`` tensor."""
        t = self._float(name, value)
        if t.dim() == 0:
            return t.expand(count).clone()
        if t.shape != (count,):
            raise ValueError(f"{name} must be a number or one value per {what} ({count},), got shape {tuple(t.shape)}")
        return t


def _indices(name, value, n, width, device):
    """An int64 index tensor of shape (K, width) (or (K,) when width is None), every entry in [0, n)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer vertex indices, got dtype {value.dtype}")
        t = value.to(device=device, dtype=torch.int64)
    else:
        try:
            t = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{name} must be integer vertex indices ({e})") from None
        if t.numel() and (t.is_floating_point() or t.dtype == torch.bool):
            raise TypeError(f"{name} must hold integer vertex indices, got dtype {t.dtype}")
        t = t.to(device=device, dtype=torch.int64)
        if t.numel() == 0:
            t = t.reshape((0,) if width is None else (0, width))
    expected = "(K,)" if width is None else f"(K, {width})"
    if (width is None and t.dim() != 1) or (width is not None and (t.dim() != 2 or t.shape[1] != width)):
        raise ValueError(f"{name} must have shape {expected}, got {tuple(t.shape)}")
    bad = torch.nonzero((t < 0) | (t >= n))
    if len(bad):
        row = bad[0, 0].item()
        if width is None:
            raise ValueError(f"{name}[{row}] = {t[row].item()} is out of range for {n} vertices")
        raise ValueError(f"{name}[{row}] = {t[row].tolist()} has vertex {t[tuple(bad[0])].item()}, out of range "
                         f"for {n} vertices")
    return t


def _require(ok, name, what, rule, values):
    bad = torch.nonzero(~ok).flatten()
    if len(bad):
        i = bad[0].item()
        raise ValueError(f"{name} {rule}: {what} {i} has {values[i].item():.6g}")
