"""Creatures: procedural soft robots with muscles, and their files.

Two file formats, both JSON:

* algovivo's (2D; :func:`load_algovivo`, :func:`save_algovivo`): ``pos`` ``(N, 2)``, ``triangles`` ``(T, 3)``,
  ``rsi`` ``(T, 2, 2)`` inverse rest-shape matrices (each row-major ``[[r00, r01], [r10, r11]]``; a flat
  ``[r00, r01, r10, r11]`` is read too), ``muscles`` ``(M, 2)`` and ``l0`` ``(M,)`` (both optional). The file
  holds geometry only; the physical constants are that project's (:data:`ALGOVIVO`). Other keys are ignored.
* diffsoft's own (2D and 3D; :func:`save`, :func:`load`): an object with ``"format": "diffsoft.creature"``,
  ``"version": 1`` and the complete state of a :class:`~diffsoft.simulator.Simulator`:
  ``vertices (N, d)``, ``elements (E, d+1)`` (triangles or positively oriented tetrahedra), ``material``,
  ``Dm_inv (E, d, d)``, ``mass (N,)``, ``mu (E,)``, ``lam (E,)``, ``muscles (M, 2)``,
  ``muscle_rest_length (M,)``, ``muscle_stiffness (M,)``, ``fixed (K,)``, ``min_a`` (the muscles' contraction
  range, :attr:`~diffsoft.body.SoftBody.min_a`; files written before it read 0.25) and ``simulator``:
  ``{"dt", "gravity", "ground" (a number or null), "contact_stiffness", "friction" (each a number, or null: the
  default, which follows the masses), "friction_eps"}`` and, optionally,
  ``"colliders"``: a list of ``{"kind": "plane" | "height_field" | "smooth_height_field" | "sphere" | "capsule",
  its fields, "stiffness", "friction", "friction_eps"}`` (:meth:`diffsoft.colliders.Collider.to_dict`; a contact
  constant that is null follows the simulator's). Lists are nested JSON arrays, numbers are written with full float64 precision.

Procedural creatures (:func:`biped`, :func:`quadruped`, :func:`worm`) are 2D algovivo-style bodies with
algovivo's constants, standing on the ground (y = 0) and facing +x; :func:`tetrapod` and :func:`caterpillar`
are 3D neo-Hookean bodies in SI units. Each returns a :class:`~diffsoft.simulator.Simulator`; ``sim.rest_state`` starts it.
"""
import hashlib
import json
import numbers
import os
import warnings

import numpy as np
import torch

from ._io import only_numbers, read_json
from .body import MIN_A, SoftBody
from .colliders import CONTACT_PARAMS, Collider
from .mesh import grid, voxels
from .simulator import ALGOVIVO_VERTEX_MASS, Simulator

ALGOVIVO = dict(dt=0.033, gravity=9.8, vertex_mass=ALGOVIVO_VERTEX_MASS, mu=500.0, lam=50.0, muscle_stiffness=90.0,
                contact_stiffness=14000.0, friction=300.0)
"""algovivo's published constants: time step h, gravity g, vertex mass, Lame parameters (per triangle, weight
1), muscle stiffness k, contact stiffness k_c, friction k_f."""

FORMAT = "diffsoft.creature"


def algovivo_simulator(vertices, triangles, muscles=None, rsi=None, l0=None, dtype=None):
    """A 2D simulator with algovivo's model and constants (elasticity ``"algovivo"``, :data:`ALGOVIVO`).

    Args:
        vertices: ``(N, 2)``; triangles: ``(T, 3)``; muscles: ``(M, 2)``; rsi: ``(T, 2, 2)`` inverse rest
            shapes (default from ``vertices``); l0: ``(M,)`` muscle rest lengths (default from ``vertices``).
    """
    c = ALGOVIVO
    body = SoftBody(vertices, triangles, material="algovivo", mass=c["vertex_mass"], mu=c["mu"], lam=c["lam"],
                    muscles=muscles, muscle_rest_length=l0, muscle_stiffness=c["muscle_stiffness"], Dm_inv=rsi,
                    dtype=dtype)
    return Simulator(body, dt=c["dt"], gravity=c["gravity"], ground=0.0, contact_stiffness=c["contact_stiffness"],
                     friction=c["friction"])


def load_algovivo(path, dtype=None):
    """Reads a creature in algovivo's JSON format and returns a :class:`~diffsoft.simulator.Simulator` with
    that project's constants (see the module docstring). A malformed file raises ValueError naming the key."""
    return _from_algovivo(read_json(path), path, dtype)


def _from_algovivo(data, path, dtype):
    """The simulator of algovivo's JSON ``data`` (read from ``path``, which errors name)."""
    pos = _array(data, "pos", float, (None, 2), path)
    n = len(pos)
    triangles = _array(data, "triangles", int, (None, 3), path)
    if not len(triangles):
        raise ValueError(f"{path}: key 'triangles' is empty: a creature needs at least one triangle")
    rsi = _array(data, "rsi", float, None, path)
    if rsi.ndim == 2 and rsi.shape[1:] == (4,):
        rsi = rsi.reshape(-1, 2, 2)
    if rsi.shape != (len(triangles), 2, 2):
        raise ValueError(f"{path}: key 'rsi' must hold one 2x2 matrix per triangle ({len(triangles)}, 2, 2), "
                         f"got shape {rsi.shape}")
    muscles = _array(data, "muscles", int, (None, 2), path) if "muscles" in data else np.zeros((0, 2), np.int64)
    l0 = _array(data, "l0", float, (len(muscles),), path) if "l0" in data else None
    info = torch.finfo(dtype or torch.get_default_dtype())
    if l0 is not None and not ((l0 >= info.tiny) & (l0 <= info.max)).all():
        bad = l0[(l0 < info.tiny) | (l0 > info.max)][0]
        raise ValueError(f"{path}: key 'l0' (the muscles' rest lengths) must be positive numbers that "
                         f"{info.dtype} holds, in [{info.tiny:.3g}, {info.max:.3g}], got {bad:g}")
    for key, idx in (("triangles", triangles), ("muscles", muscles)):
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"{path}: key '{key}' has vertex index {idx.max() if idx.max() >= n else idx.min()}, "
                             f"out of range for the {n} vertices of 'pos'")
    try:
        return algovivo_simulator(pos, triangles, muscles, rsi, l0, dtype=dtype)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None


def save_algovivo(sim, path, x=None):
    """Writes ``sim``'s body in algovivo's JSON format (geometry only: ``pos``, ``triangles``, ``rsi``,
    ``muscles``, ``l0``). ``x``: ``(N, 2)`` positions to store as ``pos`` (default the rest positions).

    What is written is checked as :func:`load_algovivo` reads it (a ValueError naming what would not read
    back: ``x`` of another shape, a batch, non-finite positions, an element inverted in ``x`` relative to its
    rest shape), so that the file always reads back."""
    body = sim.body
    if body.dim != 2:
        raise ValueError(f"algovivo's format is 2D; this body is {body.dim}D (use diffsoft.creatures.save)")
    _one_creature(sim, "save_algovivo", ("Dm_inv", 3), ("muscle_rest_length", 1))
    if x is None:
        pos = body.rest_positions
    else:
        pos = torch.as_tensor(x.detach() if isinstance(x, torch.Tensor) else x, dtype=torch.float64).cpu()
        if tuple(pos.shape) != (body.num_vertices, 2):
            raise ValueError(f"save_algovivo: x must be the body's positions ({body.num_vertices}, 2), one creature, got "
                             f"shape {tuple(pos.shape)} (save each creature of a batch on its own)")
        if not bool(torch.isfinite(pos).all()):
            raise ValueError("save_algovivo: x has non-finite (NaN or infinite) positions, which JSON cannot hold")
    data = {
        "pos": _list(pos), "triangles": _list(body.elements), "rsi": _list(body.Dm_inv),
        "muscles": _list(body.muscles), "l0": _list(body.muscle_rest_length),
    }
    _write_readable(path, data, lambda d, where: _from_algovivo(d, where, body.dtype), "save_algovivo")
    # What the format cannot hold (masses, moduli, fixed vertices, the simulator's constants, colliders) is
    # algovivo's own on reading: said, since algovivo's engine then simulates another creature.
    lost = [k for k in fingerprint_changes(fingerprint(sim), load_algovivo(path, body.dtype))
            if not (x is not None and k == "rest_positions")]
    if lost:
        warnings.warn(f"save_algovivo: {path} holds the geometry only, and reads back with algovivo's own "
                      f"{', '.join(lost)} (this creature's differ): algovivo's engine simulates it with those; "
                      f"diffsoft.creatures.save writes all of it", UserWarning, stacklevel=2)


def save(sim, path):
    """Writes ``sim`` (body and simulator constants, 2D or 3D) in diffsoft's JSON format: one creature, so
    fields and constants that hold one value per creature of a batch are refused. What is written is checked as
    :func:`load` reads it, so that the file always reads back. User terms (``sim.terms``) are code, not content:
    they are not written (a UserWarning says so)."""
    b = sim.body
    if sim.terms:
        warnings.warn(f"creatures.save: sim.terms ({len(sim.terms)}) are code, not written to {path}: add them to the "
                      f"simulator that creatures.load returns", UserWarning, stacklevel=2)
    _one_creature(sim, "creatures.save", ("mass", 1), ("Dm_inv", 3), ("mu", 1), ("lam", 1), ("muscle_rest_length", 1),
                  ("muscle_stiffness", 1))
    data = {
        "format": FORMAT, "version": 1, "dim": b.dim, "material": b.material,
        "vertices": _list(b.rest_positions), "elements": _list(b.elements), "Dm_inv": _list(b.Dm_inv),
        "mass": _list(b.mass), "mu": _list(b.mu), "lam": _list(b.lam), "muscles": _list(b.muscles),
        "muscle_rest_length": _list(b.muscle_rest_length), "muscle_stiffness": _list(b.muscle_stiffness),
        "fixed": _list(b.fixed), "min_a": b.min_a,
        "simulator": {k: None if k in _FOLLOW_MASSES and sim.follows_masses(k) else _number(k, getattr(sim, k))
                      for k in ("dt", "gravity", "ground", "contact_stiffness", "friction", "friction_eps")},
    }
    if sim.colliders:
        data["simulator"]["colliders"] = [_collider(k, c, b.dim) for k, c in enumerate(sim.colliders)]
    _write_readable(path, data, lambda d, where: _from_diffsoft(d, where, b.dtype), "creatures.save")


def load(path, dtype=None):
    """Reads a creature written by :func:`save`; a malformed file raises ValueError naming the key."""
    return _from_diffsoft(read_json(path), path, dtype)


def _from_diffsoft(data, path, dtype):
    """The simulator of diffsoft's creature JSON ``data`` (read from ``path``, which errors name)."""
    if data.get("format") != FORMAT or data.get("version") != 1:
        raise ValueError(f"{path}: key 'format' must be {FORMAT!r} with 'version' 1, got "
                         f"{data.get('format')!r} version {data.get('version')!r}")
    dim = data.get("dim")
    if dim not in (2, 3):
        raise ValueError(f"{path}: key 'dim' must be 2 or 3, got {dim!r}")
    verts = _array(data, "vertices", float, (None, dim), path)
    elements = _array(data, "elements", int, (None, dim + 1), path)
    e, n = len(elements), len(verts)
    muscles = _array(data, "muscles", int, (None, 2), path)
    m = len(muscles)
    fields = dict(
        Dm_inv=_array(data, "Dm_inv", float, (e, dim, dim), path), mass=_array(data, "mass", float, (n,), path),
        mu=_array(data, "mu", float, (e,), path), lam=_array(data, "lam", float, (e,), path),
        muscle_rest_length=_array(data, "muscle_rest_length", float, (m,), path),
        muscle_stiffness=_array(data, "muscle_stiffness", float, (m,), path),
        fixed=_array(data, "fixed", int, (None,), path))
    s = data.get("simulator")
    keys = ("dt", "gravity", "ground", "contact_stiffness", "friction", "friction_eps")
    if not isinstance(s, dict) or any(k not in s for k in keys):
        raise ValueError(f"{path}: key 'simulator' must be an object with keys {keys}")
    for k in keys:
        if not (isinstance(s[k], numbers.Real) or (k in ("ground",) + _FOLLOW_MASSES and s[k] is None)) or \
                isinstance(s[k], bool):
            raise ValueError(f"{path}: key 'simulator.{k}' must be a number, got {s[k]!r}")
    colliders = s.get("colliders", [])
    if not isinstance(colliders, list):
        raise ValueError(f"{path}: key 'simulator.colliders' must be a list, got {colliders!r}")
    colliders = [Collider.from_dict(c, f"{path}: key 'simulator.colliders[{k}]'") for k, c in enumerate(colliders)]
    try:
        body = SoftBody(verts, elements, material=data.get("material"), muscles=muscles,
                        min_a=data.get("min_a", MIN_A), dtype=dtype, **fields)
        sim = Simulator(body, colliders=colliders, **{k: s[k] for k in keys})
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None
    for k, c in enumerate(colliders):  # each one's fields fit the body, its contact constants in range
        try:
            c.step_params(sim, None)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}: key 'simulator.colliders[{k}]': {e}") from None
    return sim


def _one_creature(sim, writer, *fields):
    """A ValueError naming ``writer`` and the first of the body's ``(field, dims)`` with more dims (one value per
    creature of a batch): a creature file holds one creature."""
    for name, dims in fields:
        t = getattr(sim.body, name)
        if t.dim() > dims:
            raise ValueError(f"{writer} writes one creature, but body.{name} has shape {tuple(t.shape)} (one per "
                             f"creature of a batch); save each creature's own")


def _write_readable(path, data, read, writer):
    """Writes ``data`` as JSON to ``path`` once ``read(data, where)`` (the reader's checks, on the data in memory)
    accepts it: a file diffsoft writes always reads back."""
    read(data, f"{writer}: the file would not read back")
    with open(path, "w") as f:
        json.dump(data, f, allow_nan=False)


def biped(cell=0.3, dtype=None):
    """A 2D biped (26 vertices, 28 triangles, 16 muscles): a 5 x 2 torso on two legs 1 cell wide and 2
    tall. Each leg has both diagonals of its two cells, its inner and outer sides, and the hip's diagonals."""
    mask = np.array([[1, 0, 0, 0, 1],
                     [1, 0, 0, 0, 1],
                     [1, 1, 1, 1, 1],
                     [1, 1, 1, 1, 1]], dtype=bool)
    return _legged(mask, legs=(0, 4), leg_height=2, cell=cell, dtype=dtype)


def quadruped(cell=0.25, dtype=None):
    """A 2D quadruped (40 vertices, 44 triangles, 24 muscles): a 7 x 2 torso on four legs 1 cell wide and 2
    tall, muscled like :func:`biped`'s legs but without hip diagonals."""
    mask = np.zeros((4, 7), dtype=bool)
    mask[2:] = True
    mask[:2, [0, 2, 4, 6]] = True
    return _legged(mask, legs=(0, 2, 4, 6), leg_height=2, cell=cell, dtype=dtype, hips=False)


def worm(segments=8, cell=0.25, dtype=None):
    """A 2D worm: a ``segments`` x 1 strip of cells lying on the ground, with a muscle along the top and the
    bottom edge of every segment (``2 * segments`` muscles); waves of contraction make it crawl."""
    if not (isinstance(segments, int) and segments >= 2):
        raise ValueError(f"segments must be an integer >= 2, got {segments!r}")
    verts, tris = grid(np.ones((1, segments), dtype=bool), cell_size=cell)
    bottom = [(i, i + 1) for i in range(segments)]
    top = [(segments + 1 + i, segments + 2 + i) for i in range(segments)]
    return algovivo_simulator(verts, tris, bottom + top, dtype=dtype)


def tetrapod(cell=0.1, density=1000.0, youngs_modulus=5e5, poisson_ratio=0.3, material="neo_hookean", min_a=0.35,
             dtype=None):
    """A 3D tetrapod in SI units: a 4 x 1 x 2 cell torso (x long, z wide) on four 1 x 2 x 1 legs at its
    corners, 6 tetrahedra per cell; each leg has a muscle along each of its 4 vertical edges (16 muscles).
    Muscle stiffness is the body's default (see :class:`~diffsoft.body.SoftBody`). Its muscles contract to no
    less than 0.35 of their length (``min_a``): since they run along its legs, a leg is as short as its
    muscles, and at algovivo's 0.25 the gaits trained on it crawl at half its height. Its body is soft rubber
    (5e5 Pa; the other creatures' 5e4 is a gel's) and its muscles as stiff in proportion: it stands as tall at
    each activation as a gel's would (``benchmarks/stance.py``), but follows its muscles faster, and its gaits
    walk further upright (docs/training.md, "The 3D tetrapod")."""
    nx, nz, leg_h = 4, 2, 2
    mask = np.zeros((nz, leg_h + 1, nx), dtype=bool)  # (z, y, x)
    mask[:, leg_h, :] = True
    legs = [(0, 0), (nx - 1, 0), (0, nz - 1), (nx - 1, nz - 1)]  # (x, z) cells
    for i, k in legs:
        mask[k, :leg_h, i] = True
    verts, tets = voxels(mask, cell_size=cell, dtype=torch.float64)
    ids = {tuple(np.round(p / cell).astype(int)): j for j, p in enumerate(verts.numpy())}
    muscles = [(ids[(i + di, 0, k + dk)], ids[(i + di, leg_h, k + dk)]) for i, k in legs for di in (0, 1)
               for dk in (0, 1)]
    body = SoftBody(verts, tets, material=material, density=density, youngs_modulus=youngs_modulus,
                    poisson_ratio=poisson_ratio, muscles=muscles, min_a=min_a,
                    dtype=torch.get_default_dtype() if dtype is None else dtype)
    return Simulator(body, dt=1 / 30, gravity=9.8, ground=0.0)


def caterpillar(segments=8, cell=0.05, density=1000.0, youngs_modulus=5e4, poisson_ratio=0.3,
                material="neo_hookean", dtype=None):
    """A 3D caterpillar in SI units: a ``segments`` x 1 x 2 cell strip (x long, z wide; 0.4 x 0.05 x 0.1 m by
    default) lying on the ground, 6 tetrahedra per cell, with a muscle along every segment's top and bottom
    edges on both of its long sides (``4 * segments`` muscles): waves of contraction make it crawl, as
    :func:`worm` does in 2D."""
    if not (isinstance(segments, int) and segments >= 2):
        raise ValueError(f"segments must be an integer >= 2, got {segments!r}")
    verts, tets = voxels(np.ones((2, 1, segments), dtype=bool), cell_size=cell, dtype=torch.float64)
    ids = {tuple(np.round(p / cell).astype(int)): j for j, p in enumerate(verts.numpy())}
    muscles = [(ids[(i, j, k)], ids[(i + 1, j, k)]) for k in (0, 2) for j in (0, 1) for i in range(segments)]
    body = SoftBody(verts, tets, material=material, density=density, youngs_modulus=youngs_modulus,
                    poisson_ratio=poisson_ratio, muscles=muscles,
                    dtype=torch.get_default_dtype() if dtype is None else dtype)
    return Simulator(body, dt=1 / 30, gravity=9.8, ground=0.0)


CREATURES = {"biped": biped, "quadruped": quadruped, "worm": worm,
             "tetrapod": tetrapod, "caterpillar": caterpillar}
"""Procedural creatures by name; any other ``creature`` is read as a file (algovivo's or diffsoft's JSON)."""


_FOLLOW_MASSES = ("contact_stiffness", "friction")
"""The simulator's constants whose default follows the body's masses (:meth:`Simulator.follows_masses
<diffsoft.simulator.Simulator.follows_masses>`)."""


def fingerprint(sim):
    """What a creature is, as ``{field: SHA-256 hex digest}`` of its content: each of the body's fields (rest
    positions, elements, rest shapes, masses, Lame parameters, muscles, their rest lengths and stiffnesses, fixed
    vertices, material), each of the simulator's constants, as float64 values (int64 for indices; for
    ``contact_stiffness`` and ``friction``, whether they follow the masses instead), and its colliders (each one's kind, fields and contact constants, in order). Two creatures with equal fingerprints
    are the same creature, whatever their names or files (a training checkpoint records it; ``--resume``
    compares it). The muscles' contraction range (``body.min_a``) is a controller's limit, not the body's
    physics: a run records the one it trained with in its settings. User terms (``sim.terms``) are code, not
    content: they are not in it."""
    body = sim.body
    fields = {name: getattr(body, name) for name in ("rest_positions", "elements", "Dm_inv", "mass", "mu", "lam",
                                                     "muscles", "muscle_rest_length", "muscle_stiffness", "fixed")}
    fields.update({name: getattr(sim, name) for name in ("dt", "gravity", "ground", "contact_stiffness", "friction",
                                                         "friction_eps")})
    out = {"version": "2", "material": hashlib.sha256(body.material.encode()).hexdigest()}
    for name, value in fields.items():
        follows = name in _FOLLOW_MASSES and sim.follows_masses(name)  # the default: not a number of its own
        out[name] = hashlib.sha256(b"follows the masses" if follows else _content(value)).hexdigest()
    if sim.colliders:  # none: no key (as in checkpoints written before colliders were part of it)
        digest = hashlib.sha256()
        for c in sim.colliders:  # as a step reads them: in the body's dtype
            digest.update(c.KIND.encode())
            for name in c.FIELDS + CONTACT_PARAMS:
                value = getattr(c, name)
                if value is not None:
                    value = torch.as_tensor(value.detach() if isinstance(value, torch.Tensor) else value,
                                            dtype=body.dtype, device="cpu")
                digest.update(name.encode() + _content(value))
        out["colliders"] = digest.hexdigest()
    return out


def _content(value):
    """A field's value as bytes for :func:`fingerprint`: its shape and float64 (int64) values; b"None" for None."""
    if value is None:
        return b"None"
    t = value.detach().cpu() if isinstance(value, torch.Tensor) else torch.tensor(float(value), dtype=torch.float64)
    t = t.to(torch.int64 if not t.is_floating_point() else torch.float64).contiguous()
    return repr(tuple(t.shape)).encode() + t.numpy().tobytes()


def fingerprint_changes(recorded, sim):
    """The fields (sorted) in which ``sim``'s :func:`fingerprint` differs from a ``recorded`` one; [] for the
    same creature. A fingerprint recorded before its version 2 (no ``"version"``) is compared as it was made:
    with ``contact_stiffness`` and ``friction`` as their values, whether or not they follow the masses."""
    now = fingerprint(sim)
    if "version" not in recorded:
        del now["version"]
        for name in _FOLLOW_MASSES:
            now[name] = hashlib.sha256(_content(getattr(sim, name))).hexdigest()
    return [k for k in sorted(set(now) | set(recorded)) if recorded.get(k) != now.get(k)]


def check_device(device, name="device"):
    """``torch.device(device)`` if tensors can be made there, else a ValueError naming ``name`` (an
    unknown device string, or a device this machine does not have, such as ``"cuda"`` without a GPU)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{name} must be a torch device such as 'cpu' or 'cuda:0', got {device!r} ({e})") from None
    if dev.type == "meta":
        raise ValueError(f"{name} 'meta' holds shapes without values: nothing can be simulated there")
    try:
        torch.empty(0, device=dev)
    except (RuntimeError, AssertionError) as e:  # torch raises AssertionError when built without CUDA
        raise ValueError(f"{name} {device!r} is not available on this machine ({e})") from None
    return dev


def make_creature(creature, dtype=torch.float32, device="cpu"):
    """A :class:`~diffsoft.simulator.Simulator` from a name in :data:`CREATURES` or a JSON file path (a file
    with ``"format": "diffsoft.creature"`` is diffsoft's format, any other algovivo's), on ``device`` (built
    on the CPU, then moved with :meth:`~diffsoft.simulator.Simulator.to`)."""
    device = check_device(device)
    if not isinstance(creature, (str, os.PathLike)):  # (an int would be taken for an open file's descriptor)
        raise TypeError(f"creature must be one of {sorted(CREATURES)} or a creature JSON file's path, got "
                        f"{type(creature).__name__} {creature!r}")
    if creature in CREATURES:
        sim = CREATURES[creature](dtype=dtype)
    elif not os.path.isfile(creature):
        raise ValueError(f"creature must be one of {sorted(CREATURES)} or a creature JSON file, got {creature!r}")
    else:
        # diffsoft's files name their format; algovivo's have no such key (a misspelt one is diffsoft's, refused
        # by load naming the key, rather than read as algovivo's and missing algovivo's keys)
        is_ours = "format" in read_json(creature)
        sim = load(creature, dtype=dtype) if is_ours else load_algovivo(creature, dtype=dtype)
    return sim if sim.body.device == device else sim.to(device=device)


def _legged(mask, legs, leg_height, cell, dtype, hips=True):
    """A grid creature (mask rows from the bottom) whose legs are the 1-cell columns ``legs``."""
    verts, tris = grid(mask, cell_size=cell)
    ids = {tuple(np.round(p / cell).astype(int)): j for j, p in enumerate(verts.numpy())}
    muscles = []
    for i in legs:
        for j in range(leg_height + (1 if hips else 0)):  # the leg's cells, then the hip cell above it
            muscles += [(ids[(i, j)], ids[(i + 1, j + 1)]), (ids[(i + 1, j)], ids[(i, j + 1)])]
        muscles += [(ids[(i, 0)], ids[(i, leg_height)]), (ids[(i + 1, 0)], ids[(i + 1, leg_height)])]
    return algovivo_simulator(verts, tris, muscles, dtype=dtype)


def _array(data, key, kind, shape, path):
    """``data[key]`` as a numpy array of ``kind`` (float or int) with ``shape`` (None entries: any size)."""
    if key not in data:
        raise ValueError(f"{path}: missing key '{key}'")
    try:
        if not only_numbers(data[key]):
            raise TypeError
        a = np.array(data[key], dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: key '{key}' must be a (nested) list of numbers of equal lengths") from None
    if a.size == 0 and shape is not None:
        a = a.reshape([0 if s is None else s for s in shape])
    if shape is not None and (a.ndim != len(shape) or any(s is not None and s != t for s, t in zip(shape, a.shape))):
        want = "(" + ", ".join("n" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        raise ValueError(f"{path}: key '{key}' must have shape {want}, got {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{path}: key '{key}' has non-finite numbers")
    if kind is int:
        if (a != np.round(a)).any():
            raise ValueError(f"{path}: key '{key}' must hold integer vertex indices")
        if (np.abs(a) >= 2 ** 53).any():  # (read through float64, which holds every integer below it exactly)
            raise ValueError(f"{path}: key '{key}' has a vertex index beyond 2**53, which no mesh has")
        return a.astype(np.int64)
    return a


def _number(name, value):
    """A simulator constant as a JSON number (None stays None): a number, or a tensor of one value."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"creatures.save writes one creature, but sim.{name} has shape {tuple(value.shape)} "
                             f"(one per creature of a batch); save each creature's own")
        return value.item()
    return value


def _collider(k, collider, dim):
    """A collider as JSON values, or the ValueError of a collider holding one value per creature of a batch."""
    try:
        return collider.to_dict(dim)
    except ValueError as e:
        raise ValueError(f"creatures.save writes one creature, but sim.colliders[{k}]: {e}") from None


def _list(t):
    return t.detach().cpu().tolist() if isinstance(t, torch.Tensor) else np.asarray(t).tolist()
