"""SoftBody: a validated simplicial mesh with materials, masses, muscles and fixed vertices, as tensors."""
import math

import torch

from ._checks import MIN_ACTIVATION, is_finite_real
from ._minimize import refuse_transforms
from .energies import MATERIALS, determinant

MIN_A = 0.25
"""The muscles' contraction range a body has unless given one (:attr:`SoftBody.min_a`): algovivo's."""

# The tensor fields with one value per item, of which kind; the first three may also be one value for all (a
# 0-dim tensor), as the simulator reads them.
_PER = {"mu": "element", "lam": "element", "muscle_stiffness": "muscle", "mass": "vertex", "Dm_inv": "element",
        "muscle_rest_length": "muscle"}
_SCALAR_OK = ("mu", "lam", "muscle_stiffness")
_POSITIVE = ("mu", "muscle_stiffness", "mass", "muscle_rest_length")
# Every tensor a simulator reads from the body at each step: checked when assigned, and by check() again at the
# first step after it was changed in place (an optimizer's step, an edit).
_WATCHED = ("rest_positions", "elements", "muscles") + tuple(_PER)


def stamp(t):
    """What tells that ``t`` was changed in place: its version counter; for an inference tensor, which has none,
    a copy of its values."""
    return _Values(t) if t.is_inference() else t._version


class _Values:
    """An inference tensor's stamp: equal to another while the values are."""

    def __init__(self, t):
        self.values = t.detach().clone()

    def __eq__(self, other):
        return isinstance(other, _Values) and torch.equal(self.values, other.values)


class Stamped:
    """A value as part of a cache's key: equal to another while it is the same object (a tensor: unchanged in
    place since). It holds the object: an ``id`` alone can be reused by a new tensor once the old one is
    collected, with the same version 0, and a cache keyed on it would miss the change."""

    def __init__(self, value):
        self.value = value
        self.stamp = stamp(value) if isinstance(value, torch.Tensor) else None

    def __eq__(self, other):
        if not isinstance(other, Stamped):
            return NotImplemented
        if isinstance(self.value, torch.Tensor):
            return self.value is other.value and self.stamp == other.stamp
        return type(self.value) is type(other.value) and self.value == other.value

    __hash__ = None


class Copies:
    """The tensors a ``to`` method copied (:meth:`Simulator.to <diffsoft.simulator.Simulator.to>`'s constants, a
    collider's fields, a term's parameters), each kept with the tensors it came from and their stamps: its
    original, and where that was itself a copy, the original's own origins (a copy of a copy). A copy still in use
    whose origins were changed in place since (an optimizer's step on the original) does not follow them, and
    :meth:`stale` tells which."""

    def __init__(self):
        self._records = {}

    def to(self, key, t, dtype=None, device=None, source=None):
        """``t.to(device, dtype)``, remembered under ``key`` when it is a copy of ``t`` or when ``t`` is itself a
        copy that ``source`` (the :class:`Copies` of the object copied) remembers under ``key``: what that copy
        came from stays watched."""
        c = t.to(device=device, dtype=dtype)
        inherited = source.origins(key, t) if source is not None else []
        origins = ([(t, stamp(t))] if c is not t else []) + inherited
        if origins:  # (what made the copied copy, where it was not a copy by to: diffsoft.terrain.height_field)
            self._records[key] = (origins, c, source.made_by(key) if inherited else "Simulator.to")
        return c

    def made(self, key, made, origins, by):
        """Remembers under ``key`` the tensor ``made`` from the tensors ``origins`` by ``by`` (a function's name,
        which :meth:`made_by` tells), as a copy of them."""
        self._records[key] = ([(t, stamp(t)) for t in origins], made, by)

    def made_by(self, key):
        """What made the tensor remembered under ``key``: ``"Simulator.to"``, or :meth:`made`'s ``by``."""
        return self._records[key][2]

    def origins(self, key, t):
        """``[(tensor, stamp when copied)]``: what the copy ``t`` remembered under ``key`` came from; [] where
        ``t`` is not that copy."""
        record = self._records.get(key)
        return list(record[0]) if record is not None and record[1] is t else []

    def __getstate__(self):
        """For a copy (``copy.deepcopy``, pickle): each record with whether its origins were changed in place."""
        return {"_records": {k: (origins, c, by, any(stamp(t) != seen for t, seen in origins))
                             for k, (origins, c, by) in self._records.items()}}

    def __setstate__(self, state):
        """A copy's records: its tensors are new, with version counters of their own, so each origin is stamped
        afresh, but one changed in place before the copy was made stays so (its copy still does not follow)."""
        self._records = {k: ([(t, None if changed else stamp(t)) for t, _ in origins], c, by)
                         for k, (origins, c, by, changed) in state["_records"].items()}

    def forget(self, key):
        """No longer a copy to watch: ``key`` was assigned anew."""
        self._records.pop(key, None)

    def stale(self, current):
        """The keys whose copy is still what ``current(key)`` holds and one of whose origins was changed in place
        since it was copied."""
        return [k for k, (origins, c, _) in self._records.items()
                if current(k) is c and any(stamp(t) != seen for t, seen in origins)]


def _field(name):
    """The property of the tensor field ``name`` of a :class:`SoftBody`: assigned through its check."""
    def get(self):
        return getattr(self, "_" + name)

    def put(self, value):
        self._assign(name, value, f"body.{name}")

    return property(get, put, doc=f"One value per {_PER[name]} (see the class docstring): a tensor of the body's "
                                  f"dtype and device (kept, not copied), or numbers; checked as the constructor "
                                  f"checks it when assigned, and at each step after an in-place change.")


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
        min_a: the muscles' contraction range: the least activation their controllers give them (a muscle at
            activation a pulls toward ``a`` times its rest length; 1 is relaxed). The simulator steps any
            activation; trainers, tasks and policies take this one unless given another. Default 0.25
            (algovivo's).
        Dm_inv: ``(E, d, d)`` inverse rest-shape matrices (``Dm``'s columns are the rest edges
            ``X_k - X_0``); default computed from ``vertices``. Given, it may define a rest shape other than
            ``vertices`` (algovivo files store it so).
        dtype, device: default: the dtype of a floating ``vertices`` tensor, else torch's default; its device.

    Fields: ``rest_positions (N, d)``, ``elements (E, d+1)``, ``Dm_inv (E, d, d)``, ``rest_volume (E,)``,
    ``mass (N,)``, ``mu (E,)``, ``lam (E,)``, ``muscles (M, 2)``, ``muscle_rest_length (M,)``,
    ``muscle_stiffness (M,)``, ``fixed (K,)``, ``free (N - K,)`` (int64 indices), ``material``, ``min_a``,
    ``dim``.

    What is kept, and when it is checked (``docs/parameters.md``): a tensor given in the body's dtype and on its
    device is kept as it is, not copied, so that an optimizer stepping it in place moves the body. Every field
    may be assigned (``mass``, ``Dm_inv``, ``mu``, ``lam``, ``muscle_rest_length`` and ``muscle_stiffness``
    also with one row per creature of a batch), and is then checked as the constructor checks it; and
    :meth:`check`, which a simulator calls at every step, checks again every field changed in place since.
    A field the constructor derived or converted from a tensor (``mu`` from ``youngs_modulus``, masses from
    ``density``, a float32 ``mu`` converted for a float64 body) does not follow later in-place changes of that
    tensor: the next check raises, naming it. ``rest_positions``, ``rest_volume`` and ``free`` are read-only.
    """

    def __init__(self, vertices, elements, *, material="neo_hookean", density=None, mass=None,
                 youngs_modulus=None, poisson_ratio=None, mu=None, lam=None, fixed=None, muscles=None,
                 muscle_rest_length=None, muscle_stiffness=None, min_a=MIN_A, Dm_inv=None, dtype=None, device=None):
        if dtype is None:
            is_float = isinstance(vertices, torch.Tensor) and vertices.is_floating_point()
            dtype = vertices.dtype if is_float else torch.get_default_dtype()
        if dtype not in (torch.float32, torch.float64):  # (float16 and others failed deep in torch, unnamed)
            raise TypeError(f"dtype must be torch.float32 or torch.float64 (the dtypes the solver runs in), got "
                            f"{dtype!r}{' (from the vertices)' if isinstance(vertices, torch.Tensor) else ''}")
        if device is None:
            device = vertices.device if isinstance(vertices, torch.Tensor) else torch.device("cpu")
        self._dtype, self._device = dtype, device
        self._material, self._checked, self._sources, self._free_of = None, None, [], None
        self.material = material
        self.min_a = min_a
        # origin[field]: the arguments each field was computed or converted from (the sources of check()).
        origin = {"rest_positions": ["vertices"], "elements": ["elements"], "fixed": ["fixed"], "muscles": ["muscles"]}

        x = self._float("vertices", vertices)
        if x.dim() != 2 or x.shape[1] not in (2, 3) or x.shape[0] < x.shape[1] + 1:
            raise ValueError(f"vertices must be (N, 2) or (N, 3) with N > d, got shape {tuple(x.shape)}")
        self._rest_positions = x
        n, d = x.shape
        self.dim = d
        self._elements = _indices("elements", elements, n, width=d + 1, device=device)
        if len(self._elements) == 0:
            raise ValueError("elements is empty: a soft body needs at least one element")
        _check_distinct("elements", self._elements)

        edges = x[self.elements[:, 1:]] - x[self.elements[:, :1]]  # (E, d, d), rows are rest edges
        if Dm_inv is None:
            det = determinant(edges)
            bad = torch.nonzero(det.abs() <= 1e-10 * edges.norm(dim=-1).amax(-1) ** d).flatten()
            if len(bad):
                raise ValueError(f"element {bad[0].item()} {self.elements[bad[0]].tolist()} is degenerate "
                                 f"(zero rest {'area' if d == 2 else 'volume'}); {len(bad)} such element(s)")
            bad = torch.nonzero(det < 0).flatten()
            if len(bad):
                raise ValueError(f"element {bad[0].item()} {self.elements[bad[0]].tolist()} is inverted "
                                 f"(negatively oriented) in the rest pose; {len(bad)} such element(s). Reorder "
                                 f"its vertices, e.g. with diffsoft.mesh.orient")
            self._assign("Dm_inv", torch.inverse(edges.transpose(-1, -2)), "Dm_inv")
            origin["Dm_inv"] = ["vertices"]
        else:
            Dm_inv_ = self._float("Dm_inv", Dm_inv)
            if Dm_inv_.shape != (len(self.elements), d, d):
                raise ValueError(f"Dm_inv must be (E, d, d) = {(len(self.elements), d, d)}, "
                                 f"got {tuple(Dm_inv_.shape)}")
            self._assign("Dm_inv", Dm_inv_, "Dm_inv")
            origin["Dm_inv"] = ["Dm_inv"]

        origin["mu"], origin["lam"] = self._init_lame(youngs_modulus, poisson_ratio, mu, lam)
        origin["mass"] = self._init_mass(density, mass, origin["Dm_inv"])
        self.fixed = fixed
        origin.update(self._init_muscles(muscles, muscle_rest_length, muscle_stiffness, edges,
                                         origin["mu"] + origin["lam"]))

        args = dict(vertices=vertices, elements=elements, density=density, mass=mass, youngs_modulus=youngs_modulus,
                    poisson_ratio=poisson_ratio, mu=mu, lam=lam, fixed=fixed, muscles=muscles, Dm_inv=Dm_inv,
                    muscle_rest_length=muscle_rest_length, muscle_stiffness=muscle_stiffness)
        made = {f: getattr(self, f) for f in origin}
        for name, value in args.items():
            # An argument kept as a field is watched as that field (an in-place change of it is one of the field,
            # which, as an assignment, leaves what was derived from it alone); one converted or derived from is a
            # source of what it gave.
            if isinstance(value, torch.Tensor) and not any(t is value for t in made.values()):
                fields = tuple(f for f, srcs in origin.items() if name in srcs)
                if fields:
                    self._sources.append((name, value, stamp(value), fields, made))
        self._check_between(_WATCHED)
        self._pending = set()  # fields assigned since the constraints between fields were last checked
        self._checked = {name: (getattr(self, name), stamp(getattr(self, name))) for name in _WATCHED}

    # --- fields ------------------------------------------------------------------------------------------------

    mu = _field("mu")
    lam = _field("lam")
    mass = _field("mass")
    Dm_inv = _field("Dm_inv")
    muscle_rest_length = _field("muscle_rest_length")
    muscle_stiffness = _field("muscle_stiffness")

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
    def elements(self):
        """``(E, d+1)`` int64 vertex indices. Assignable with as many rows (the per-element fields keep theirs),
        checked as in the constructor and against the rest shapes ``Dm_inv``; for another mesh build a new
        SoftBody."""
        return self._elements

    @elements.setter
    def elements(self, value):
        self._assign("elements", value, "body.elements")

    @property
    def muscles(self):
        """``(M, 2)`` int64 vertex pairs. Assignable; when their number changes, assign ``muscle_rest_length``
        and ``muscle_stiffness`` for them too (a step checks that they agree)."""
        return self._muscles

    @muscles.setter
    def muscles(self, value):
        self._assign("muscles", value, "body.muscles")

    @property
    def rest_volume(self):
        """``(E,)`` (or one row per creature): each element's rest area or volume, from ``Dm_inv``."""
        return 1.0 / (math.factorial(self.dim) * determinant(self.Dm_inv).abs())

    @property
    def fixed(self):
        """``(K,)`` int64: the vertices held in place. It may be assigned (indices, checked as in the
        constructor); a :class:`~diffsoft.simulator.Simulator` of this body takes it from its next step."""
        return self._fixed

    @fixed.setter
    def fixed(self, value):
        self._fixed = _check_fixed(value, self.num_vertices, self._device)

    @property
    def free(self):
        """``(N - K,)`` int64: the vertices the solver moves, the complement of :attr:`fixed`. Read-only."""
        # The fixed tensor itself, not its id: a new tensor may reuse a collected one's id (and version 0).
        if self._free_of is not None and self._free_of[0] is self._fixed and self._free_of[1] == stamp(self._fixed):
            if stamp(self._free) != self._free_of[2]:
                raise ValueError("body.free was changed in place, but it is the complement of body.fixed: assign "
                                 "body.fixed instead")
            return self._free
        _check_fixed(self._fixed, self.num_vertices, self._device)  # fixed was assigned, or edited in place
        with torch.inference_mode(False):  # a cache that outlives an inference_mode block
            is_free = torch.ones(self.num_vertices, dtype=torch.bool, device=self._fixed.device)
            is_free[self._fixed] = False
            self._free = torch.nonzero(is_free).flatten()
        self._free_of = (self._fixed, stamp(self._fixed), stamp(self._free))
        return self._free

    @property
    def material(self):
        """The elastic material's name; assigning another (one of :data:`~diffsoft.energies.MATERIALS`) takes
        effect from a simulator's next step, and is checked against the Lame parameters."""
        return self._material

    @material.setter
    def material(self, value):
        if value not in MATERIALS:
            raise ValueError(f"material must be one of {MATERIALS}, got {value!r}")
        if self._material is not None:
            _check_lam_for(value, self.lam, "body.lam")
        self._material = value

    @property
    def min_a(self):
        """The muscles' contraction range: the least activation their controllers give them (a number in
        ``[1e-6, 1)``; see the class docstring)."""
        return self._min_a

    @min_a.setter
    def min_a(self, value):
        if not (is_finite_real(value) and MIN_ACTIVATION <= value < 1):
            raise ValueError(f"min_a must be a number in [{MIN_ACTIVATION:g}, 1) (the least activation of the body's "
                             f"muscles), got {value!r}")
        self._min_a = float(value)

    def check(self):
        """Checks again, as the constructor does, every field changed in place since it was assigned or last
        checked (by an optimizer's step, an edit), then the constraints between fields; a ValueError names the
        field and the element, vertex or muscle at fault. Also raises when a tensor that a field was derived or
        converted from was changed in place since (the field does not follow it). Called by
        :class:`~diffsoft.simulator.Simulator` at every step: with nothing changed it compares version
        counters."""
        changed = self._pending
        for name in _WATCHED:
            t, seen = self._checked[name]
            now = getattr(self, name)
            if now is t and stamp(now) == seen:
                continue
            if name == "rest_positions":
                raise ValueError("body.rest_positions was changed in place, but the rest shapes (Dm_inv), rest "
                                 "volumes, masses and muscle rest lengths were derived from it: build a new "
                                 "SoftBody from the new positions (or assign Dm_inv for the rest shapes alone)")
            self._check_field(name, now, f"body.{name}")
            self._checked[name] = (now, stamp(now))
            changed.add(name)
        for name, t, seen, fields, made in self._sources:
            if stamp(t) == seen:
                continue
            stale = [f for f in fields if getattr(self, f) is made[f]]
            if stale:
                raise ValueError(f"{name} was changed in place after the body was made from it, but the body's "
                                 f"{', '.join(stale)} {'was' if len(stale) == 1 else 'were'} computed or converted "
                                 f"from it then and {'does' if len(stale) == 1 else 'do'} not follow: build a new "
                                 f"SoftBody (or call SoftBody.to again) from it, whose gradients flow, or assign "
                                 f"the field(s)")
        if changed:
            self._check_between(changed)
            self._pending = set()

    def structure(self):
        """What a simulator's step topology is built from (elements, muscles, free vertices, material), as a
        key that changes whenever one of them is assigned or modified in place."""
        return (self._material,) + tuple(Stamped(t) for t in (self.elements, self.muscles, self.free))

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
        """The body in ``dtype`` (its floating fields) on ``device``, with ``torch.Tensor.to``'s semantics: this
        body itself when it is already there; else a new body whose fields are ``field.to(...)`` of this one's,
        differentiable functions of them (gradients flow back to this body's tensors, whose storage is not
        shared). The new body's fields do not follow later in-place changes of this one's: its next
        :meth:`check` (a step) raises, naming them; call ``to`` again."""
        dtype = self.dtype if dtype is None else dtype
        device = self.device if device is None else torch.device(device)
        if dtype == self.dtype and device == self.device:
            return self
        out = object.__new__(SoftBody)
        out.__dict__.update(self.__dict__)
        out._dtype, out._device, out._free_of, out._pending = dtype, device, None, set()
        originals = {name: getattr(self, name) for name in _WATCHED + ("fixed",)}
        for name, t in originals.items():
            setattr(out, "_" + name, t.to(device=device, dtype=dtype if t.is_floating_point() else None))
        made = {name: getattr(out, name) for name in originals}
        out._sources = [(f"the original body's {name} (this body is its copy by SoftBody.to)", t, stamp(t), (name,),
                         made) for name, t in originals.items()]
        # What this body's fields were made from stays watched in the copy (a copy of a copy, or a field computed
        # from a constructor argument): for each field the copy took from one still as it was made.
        for name, t, seen, fields, was in self._sources:
            kept = tuple(f for f in fields if f in made and getattr(self, f) is was[f])
            if kept:
                out._sources.append((name, t, seen, kept, made))
        if not bool(torch.isfinite(out.rest_positions).all()):
            raise ValueError(f"body.rest_positions has non-finite entries in {dtype}: the vertices do not fit it")
        # Every field checked in the new dtype (what it cannot hold, 1e39 in float32, is refused here).
        out._checked = {name: (made[name], stamp(made[name]) if name == "rest_positions" else object())
                        for name in _WATCHED}
        out.check()
        return out

    def __setstate__(self, state):
        """A copy (``copy.deepcopy``, pickle): its tensors are new, with version counters of their own. Its
        first check checks every field again (``rest_positions`` is read-only)."""
        self.__dict__.update(state)
        self._checked = {name: (t, stamp(t) if name == "rest_positions" else object())
                         for name, (t, _) in self._checked.items()}
        self._sources = [(name, t, stamp(t), fields, made) for name, t, _, fields, made in self._sources]
        self._free_of = None

    def __repr__(self):
        return (f"SoftBody({self.dim}D, {self.num_vertices} vertices, {self.num_elements} "
                f"{'triangles' if self.dim == 2 else 'tetrahedra'}, {self.num_muscles} muscles, "
                f"{len(self.fixed)} fixed, material={self.material!r}, dtype={self.dtype})")

    # --- checks ------------------------------------------------------------------------------------------------

    def _assign(self, name, value, label):
        """Sets the field ``name`` to ``value``, checked on its own; ``label`` names it in errors. A tensor must
        have the body's dtype and device and is kept as it is; numbers are converted as the constructor
        converts them."""
        if name in ("elements", "muscles"):
            t = _indices(label, value, self.num_vertices, width=self.dim + 1 if name == "elements" else 2,
                         device=self._device)
        elif isinstance(value, torch.Tensor):
            refuse_transforms(label, (value,))
            t = value
            if t.dtype != self._dtype:
                raise TypeError(f"{label} has dtype {t.dtype} but the body has {self._dtype} (see SoftBody.to)")
            if t.device != self._device:
                raise ValueError(f"{label} is on {t.device} but the body is on {self._device}")
        elif name == "Dm_inv":
            t = self._float(label, value)
        else:
            t = self._per(label, value, *self._rows(name))
        self._check_field(name, t, label)
        setattr(self, "_" + name, t)
        if self._checked is not None:  # after construction (the constructor records its fields at its end)
            self._checked[name] = (t, stamp(t))
            self._pending.add(name)  # the constraints between fields: at the next check

    def _rows(self, name):
        """``(count, what)``: how many values the field ``name`` holds, one per what."""
        what = _PER[name]
        count = {"vertex": self.num_vertices, "element": self.num_elements}.get(what)
        return (self.num_muscles if count is None else count), what

    def _check_field(self, name, t, label):
        """The field ``name`` on its own: for the index fields their indices; for the others their shape (one
        value per item, or one row of them per creature of a batch), finiteness and range. ``label`` names it."""
        d = self.dim
        if name in ("elements", "muscles"):
            _indices(label, t, self.num_vertices, width=d + 1 if name == "elements" else 2, device=self._device)
            if name == "muscles":
                same = torch.nonzero(t[:, 0] == t[:, 1]).flatten()
                if len(same):
                    raise ValueError(f"muscle {same[0].item()} joins vertex {t[same[0], 0].item()} to itself "
                                     f"({label})")
                return
            rows = self._Dm_inv.shape[-3]
            if len(t) != rows:
                raise ValueError(f"{label} has {len(t)} rows, but the body's per-element fields (Dm_inv, mu, lam) "
                                 f"have {rows}: elements can be reassigned only with as many rows; for another mesh "
                                 f"build a new SoftBody")
            _check_distinct(label, t)
            self._check_orientation(t, self._Dm_inv, label)
            return
        count, what = self._rows(name)
        core = (count, d, d) if name == "Dm_inv" else (count,)
        shape = tuple(t.shape)
        if not (shape == core or (len(shape) == len(core) + 1 and shape[1:] == core)
                or (shape == () and name in _SCALAR_OK)):
            one = " or () (one value for all)" if name in _SCALAR_OK else ""
            what = {"vertex": "vertices"}.get(what, what + "s") if count != 1 else what
            raise ValueError(f"{label} has shape {shape}, but the body has {count} {what}: it must be {core}{one}, "
                             f"or (B, {', '.join(map(str, core))}) with one row per creature of a batch")
        v = t.detach()
        if name in _POSITIVE and bool((torch.isfinite(v) & (v >= self._tiny)).all()):
            return  # the common case in one reduction (a step re-checks a field an optimizer moved)
        if not bool(torch.isfinite(v).all()):
            raise ValueError(f"{label} has non-finite entries in {self._dtype}: {v[~torch.isfinite(v)][0].item()!r}")
        if name == "Dm_inv":
            x = self.rest_positions.detach()
            scale = (x[self.elements[:, 1:]] - x[self.elements[:, :1]]).norm(dim=-1).amax(-1) ** d
            inv_det = determinant(v).abs()
            bad = torch.nonzero(~((inv_det > 0) & (inv_det * scale < 1e10)))
            if len(bad):
                i = bad[0, -1].item()
                raise ValueError(f"{label}[{i}] is singular or not finite: element {i} has a degenerate rest shape")
            self._check_orientation(self.elements, v, label)
        elif name == "lam":
            _check_lam_for(self.material, v, label)
        else:  # masses, mu, muscle rest lengths and stiffnesses are positive
            _require(v >= self._tiny, label, what, "must be positive", v)

    def _check_orientation(self, elements, Dm_inv, label):
        """Each element positively oriented in the rest positions relative to its rest shape (det F > 0 at rest)."""
        x = self.rest_positions.detach()
        edges = x[elements[:, 1:]] - x[elements[:, :1]]
        J = determinant(edges.transpose(-1, -2) @ Dm_inv.detach())
        bad = torch.nonzero(~(J > 0))
        if len(bad):
            i = bad[0, -1].item()
            raise ValueError(f"element {i} {elements[i].tolist()} is inverted or degenerate in vertices relative to "
                             f"its rest shape Dm_inv (det F = {J[tuple(bad[0])].item():.3g}, {label}); {len(bad)} such "
                             f"element(s)")

    def _check_between(self, names):
        """The constraints between fields that involve one of ``names``: a positive bulk modulus, one rest length
        and stiffness per muscle."""
        mu, lam = self.mu.detach(), self.lam.detach()
        # With lam >= 0 (every material but stable_neo_hookean: their own checks) and mu > 0 the bulk modulus is.
        bulk_needs_check = self.material == "stable_neo_hookean" and {"mu", "lam"} & set(names)
        if bulk_needs_check and (mu.dim() < 2 or lam.dim() < 2 or mu.shape[0] == lam.shape[0]):  # else two batches:
            # the step names them. Positive bulk modulus, lam + 2 mu / d > 0: the bound -1 < nu for the Lame form.
            bulk = lam + 2 * mu / self.dim
            _require(bulk > 0, "lam", "element", f"must exceed -2 mu / {self.dim} (a positive bulk modulus)",
                     lam.expand_as(bulk))
        m = self.num_muscles
        for name in ("muscle_rest_length", "muscle_stiffness"):
            t = getattr(self, name)
            if t.dim() and t.shape[-1] != m:
                raise ValueError(f"body.muscles has {m} muscles but body.{name} has {t.shape[-1]} values: assign "
                                 f"muscle_rest_length and muscle_stiffness for the new muscles")

    # --- construction --------------------------------------------------------------------------------------------

    def _init_lame(self, youngs_modulus, poisson_ratio, mu, lam):
        """Sets ``mu`` and ``lam``; returns the arguments they come from."""
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
            mu_, lam_ = E / (2 * (1 + nu)), E * nu / ((1 + nu) * (1 - 2 * nu))
            # 1 - 2 nu underflows near 0.5, or E is near the dtype's largest number.
            _require(torch.isfinite(lam_) & torch.isfinite(mu_), "youngs_modulus and poisson_ratio", "element",
                     f"give Lame parameters that are finite in {self._dtype}; lam is", lam_)
            # E at the dtype's smallest normal number gives a subnormal mu, which the body refuses: said of E.
            _require(mu_ >= self._tiny, "youngs_modulus", "element", f"must give mu = E / (2 (1 + nu)) of at least "
                     f"{self._tiny:.3g} (the smallest normal number in {self._dtype}); mu is", mu_)
            _check_lam_for(self.material, nu, "poisson_ratio")
        else:
            mu_, lam_ = self._per("mu", mu, e, "element"), self._per("lam", lam, e, "element")
            _require(mu_ >= self._tiny, "mu", "element", "must be positive", mu_)
            # Positive bulk modulus, lam + 2 mu / d > 0: the Poisson-ratio bound -1 < nu for the Lame form.
            _require(lam_ + 2 * mu_ / self.dim > 0, "lam", "element",
                     f"must exceed -2 mu / {self.dim} (a positive bulk modulus)", lam_)
        self._assign("mu", mu_, "mu")
        self._assign("lam", lam_, "lam")
        return (["youngs_modulus", "poisson_ratio"],) * 2 if by_moduli else (["mu"], ["lam"])

    def _init_mass(self, density, mass, rest_shape_origin):
        """Sets ``mass``; returns the arguments it comes from."""
        n, e = self.num_vertices, self.num_elements
        if (density is None) == (mass is None):
            raise ValueError("give exactly one of density (masses lumped from rest volumes) and mass")
        if mass is not None:
            self._assign("mass", self._per("mass", mass, n, "vertex"), "mass")
            return ["mass"]
        rho = self._per("density", density, e, "element")
        _require(rho >= self._tiny, "density", "element", "must be positive", rho)
        share = (rho * self.rest_volume / (self.dim + 1)).repeat_interleave(self.dim + 1)
        masses = torch.zeros(n, dtype=self._dtype, device=self._device).index_add_(0, self.elements.flatten(), share)
        _require(torch.isfinite(masses), "density", "vertex", f"gives masses that overflow {self._dtype}; the mass is",
                 masses)
        lonely = torch.nonzero(masses == 0).flatten()
        if len(lonely):
            raise ValueError(f"vertex {lonely[0].item()} belongs to no element, so it has no mass; remove it or "
                             f"give mass explicitly ({len(lonely)} such vertices)")
        self._assign("mass", masses, "mass")
        return ["density"] + rest_shape_origin

    def _init_muscles(self, muscles, rest_length, stiffness, rest_edges, lame_origin):
        """Sets the muscles, their rest lengths and stiffnesses; returns the arguments each comes from."""
        self._assign("muscles", [] if muscles is None else muscles, "muscles")
        m = len(self.muscles)
        origin = {}
        if rest_length is None:
            x = self.rest_positions
            self._assign("muscle_rest_length", (x[self.muscles[:, 0]] - x[self.muscles[:, 1]]).norm(dim=-1),
                         "muscle_rest_length")
            origin["muscle_rest_length"] = ["vertices"]
        else:
            self._assign("muscle_rest_length", self._per("muscle_rest_length", rest_length, m, "muscle"),
                         "muscle_rest_length")
            origin["muscle_rest_length"] = ["muscle_rest_length"]
        if stiffness is None:
            E = (self.mu * ((3 * self.lam + 2 * self.mu) / (self.lam + self.mu))).mean()
            s = rest_edges.norm(dim=-1).mean()
            k = E * self.muscle_rest_length * s ** (self.dim - 1)
            _require(torch.isfinite(k) & (k >= self._tiny),
                     "the default muscle_stiffness (Young's modulus x muscle_rest_length x edge length)", "muscle",
                     f"over- or underflows {self._dtype} with these youngs_modulus (or mu, lam) and "
                     f"muscle_rest_length; give muscle_stiffness:", k)
            self._assign("muscle_stiffness", k, "muscle_stiffness")
            origin["muscle_stiffness"] = ["vertices"] + lame_origin + origin["muscle_rest_length"]
        else:
            self._assign("muscle_stiffness", self._per("muscle_stiffness", stiffness, m, "muscle"), "muscle_stiffness")
            origin["muscle_stiffness"] = ["muscle_stiffness"]
        return origin if m else {}

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


def _check_lam_for(material, lam, label):
    """``lam`` (or the Poisson ratio, by its sign) >= 0 unless the material is ``"stable_neo_hookean"``."""
    if material != "stable_neo_hookean":
        # Along F = J^(1/d) I, neo-Hookean's lam/2 log^2 J beats -mu log J as J -> 0, and algovivo's
        # lam/2 q(J)^2 (q quadratic in J) beats everything as |J| -> inf: with lam < 0 the energy has no
        # minimum and a step's solve would follow it to a collapsed or exploded element.
        lam = lam.detach()
        _require(lam >= 0, label, "element", f"must be >= 0 for material {material!r}, whose energy is unbounded "
                 f"below when lam < 0 (a negative Poisson ratio); 'stable_neo_hookean' takes negative ratios", lam)


def _check_fixed(fixed, n, device):
    fixed = _indices("fixed", [] if fixed is None else fixed, n, width=None, device=device)
    if len(torch.unique(fixed)) != len(fixed):
        raise ValueError(f"fixed lists a vertex twice: {fixed.tolist()}")
    if len(fixed) == n:
        raise ValueError("every vertex is fixed: nothing to simulate")
    return fixed


def _check_distinct(name, idx):
    s = idx.sort(dim=1).values
    bad = torch.nonzero((s[:, 1:] == s[:, :-1]).any(dim=1)).flatten()
    if len(bad):
        raise ValueError(f"{name}[{bad[0].item()}] = {idx[bad[0]].tolist()} repeats a vertex")


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
    """A ValueError naming ``name``, the first item (``what`` i, or of creature b in a batch) where ``ok`` is
    False, and its value."""
    if bool(ok.all()):
        return
    bad = torch.nonzero(~ok)
    if len(bad):
        where = tuple(bad[0].tolist())
        if len(where) == 0:
            item = f"every {what}"
        else:
            item = f"{what} {where[-1]}" if len(where) == 1 else f"creature {where[0]}, {what} {where[-1]},"
        raise ValueError(f"{name} {rule}: {item} has {values[where].item():.6g}")
