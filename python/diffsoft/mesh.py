"""Simplicial meshes for soft bodies: generators, meshio file I/O and a VTK time-series writer.

A mesh is a pair ``(vertices, elements)``: ``vertices`` is ``(N, d)`` floating point, ``elements`` is
``(E, d + 1)`` int64 (triangles in 2D, tetrahedra in 3D). Generated elements are positively oriented:
``det([x1 - x0, ..., xd - x0]) > 0``. In 2D and 3D, y (the second coordinate) points up.
"""
import math
import numbers
import os
import warnings
from xml.sax.saxutils import escape

import numpy as np
import torch

from ._optional import require

# Kuhn (Freudenthal) split of the unit cube into 6 tetrahedra along its 0-7 diagonal. Every cube of a grid
# uses the same split, so neighbouring cubes cut their shared face along the same diagonal: the mesh conforms.
# Corner c of a cube is at offset ((c >> 0) & 1, (c >> 1) & 1, (c >> 2) & 1).
_KUHN_TETS = ((0, 1, 3, 7), (0, 1, 5, 7), (0, 2, 3, 7), (0, 2, 6, 7), (0, 4, 5, 7), (0, 4, 6, 7))


def rectangle(width=1.0, height=1.0, nx=1, ny=1, origin=(0.0, 0.0), dtype=None):
    """A ``width`` x ``height`` rectangle of ``nx`` x ``ny`` cells, two triangles per cell.

    The cells' diagonals alternate in a checkerboard so that the mesh has no preferred shear direction.

    Returns:
        vertices ``(( nx + 1) * (ny + 1), 2)`` and triangles ``(2 * nx * ny, 3)`` int64; vertex ``i + j * (nx + 1)``
        is at ``origin + (i * width / nx, j * height / ny)``.
    """
    _check_counts(nx=nx, ny=ny)
    _check_positive(width=width, height=height)
    return grid(np.ones((ny, nx), dtype=bool), cell_size=(width / nx, height / ny), origin=origin, dtype=dtype)


def box(size=(1.0, 1.0, 1.0), resolution=(1, 1, 1), origin=(0.0, 0.0, 0.0), dtype=None):
    """A box of ``size = (sx, sy, sz)`` split into ``resolution = (nx, ny, nz)`` cubes, 6 tetrahedra each.

    Returns:
        vertices ``((nx + 1) (ny + 1) (nz + 1), 3)`` and tetrahedra ``(6 nx ny nz, 4)`` int64; vertex
        ``i + (nx + 1) (j + (ny + 1) k)`` is at ``origin + (i sx / nx, j sy / ny, k sz / nz)``.
    """
    if len(size) != 3 or len(resolution) != 3:
        raise ValueError(f"size and resolution must have 3 entries each, got {size!r} and {resolution!r}")
    nx, ny, nz = resolution
    _check_counts(nx=nx, ny=ny, nz=nz)
    _check_positive(sx=size[0], sy=size[1], sz=size[2])
    cell = (size[0] / nx, size[1] / ny, size[2] / nz)
    return voxels(np.ones((nz, ny, nx), dtype=bool), cell_size=cell, origin=origin, dtype=dtype)


def grid(mask, cell_size=1.0, origin=(0.0, 0.0), dtype=None):
    """Triangulates the filled cells of a 2D occupancy grid; shared corners become one vertex.

    Args:
        mask: ``(ny, nx)`` booleans, ``mask[j, i]`` fills the cell whose lower-left corner is ``(i, j)``
            (row 0 is the bottom row).
        cell_size: a number or ``(sx, sy)``.

    Returns:
        vertices ``(N, 2)`` (only corners of filled cells, ordered by row then column) and triangles
        ``(T, 3)`` int64, counter-clockwise.
    """
    mask = _mask(mask, 2)
    sx, sy = _pair(cell_size, 2)
    ny, nx = mask.shape
    corner = np.zeros((ny + 1, nx + 1), dtype=bool)
    for dj in (0, 1):
        for di in (0, 1):
            corner[dj:dj + ny, di:di + nx] |= mask
    ids = -np.ones_like(corner, dtype=np.int64)
    ids[corner] = np.arange(int(corner.sum()))
    jj, ii = np.nonzero(corner)
    _check_origin(origin, 2)
    verts = np.stack([origin[0] + ii * sx, origin[1] + jj * sy], axis=1)
    tris = []
    for j, i in zip(*np.nonzero(mask)):
        a, b, c, d = ids[j, i], ids[j, i + 1], ids[j + 1, i + 1], ids[j + 1, i]
        if (i + j) % 2 == 0:
            tris += [(a, b, c), (a, c, d)]
        else:
            tris += [(a, b, d), (b, c, d)]
    return _tensors(verts, np.asarray(tris, dtype=np.int64).reshape(-1, 3), dtype)


def voxels(mask, cell_size=1.0, origin=(0.0, 0.0, 0.0), dtype=None):
    """Tetrahedralises the filled cells of a 3D occupancy grid (6 conforming tetrahedra per cube).

    Args:
        mask: ``(nz, ny, nx)`` booleans, ``mask[k, j, i]`` fills the cube with lowest corner ``(i, j, k)``.
        cell_size: a number or ``(sx, sy, sz)``.

    Returns:
        vertices ``(N, 3)`` and positively oriented tetrahedra ``(6 * filled, 4)`` int64.
    """
    mask = _mask(mask, 3)
    sx, sy, sz = _pair(cell_size, 3)
    nz, ny, nx = mask.shape
    corner = np.zeros((nz + 1, ny + 1, nx + 1), dtype=bool)
    for dk in (0, 1):
        for dj in (0, 1):
            for di in (0, 1):
                corner[dk:dk + nz, dj:dj + ny, di:di + nx] |= mask
    ids = -np.ones_like(corner, dtype=np.int64)
    ids[corner] = np.arange(int(corner.sum()))
    kk, jj, ii = np.nonzero(corner)
    _check_origin(origin, 3)
    verts = np.stack([origin[0] + ii * sx, origin[1] + jj * sy, origin[2] + kk * sz], axis=1)
    k, j, i = (a[:, None] for a in np.nonzero(mask))
    c = np.arange(8)
    cube = ids[k + ((c >> 2) & 1), j + ((c >> 1) & 1), i + (c & 1)]  # (cubes, 8)
    tets = cube[:, np.asarray(_KUHN_TETS)].reshape(-1, 4)
    return _tensors(verts, orient(verts, tets), dtype)


def orient(vertices, elements):
    """Returns ``elements`` with the last two vertices of every negatively oriented element swapped.

    Args:
        vertices: ``(N, d)``; elements: ``(E, d + 1)``. Numpy arrays or tensors; the result has the type of
        ``elements``.
    """
    v = np.asarray(vertices.detach().cpu() if isinstance(vertices, torch.Tensor) else vertices, dtype=np.float64)
    e = np.array(elements.cpu() if isinstance(elements, torch.Tensor) else elements, dtype=np.int64)
    edges = v[e[:, 1:]] - v[e[:, :1]]  # (E, d, d), rows are edges
    flip = np.linalg.det(edges) < 0
    e[flip, -2:] = e[flip, -1:-3:-1]
    return torch.as_tensor(e) if isinstance(elements, torch.Tensor) else e


def boundary_facets(elements):
    """The facets (edges in 2D, triangles in 3D) that belong to exactly one element.

    Args:
        elements: ``(E, d + 1)`` int64, positively oriented.

    Returns:
        ``(F, d)`` int64. In 3D each triangle is ordered so that its normal points out of the body; in 2D
        each edge runs counter-clockwise around the body.
    """
    e = torch.as_tensor(elements, dtype=torch.int64)
    if e.shape[1] == 3:
        facets = e[:, [[0, 1], [1, 2], [2, 0]]].reshape(-1, 2)
    elif e.shape[1] == 4:
        # Opposite each vertex, ordered so that the normal points away from that vertex.
        facets = e[:, [[1, 2, 3], [0, 3, 2], [0, 1, 3], [0, 2, 1]]].reshape(-1, 3)
    else:
        raise ValueError(f"elements must have 3 (triangles) or 4 (tetrahedra) columns, got {e.shape[1]}")
    key, inverse, counts = torch.unique(facets.sort(dim=1).values, dim=0, return_inverse=True, return_counts=True)
    return facets[counts[inverse] == 1]


def read(path, dim=None, dtype=None):
    """Reads a triangle or tetrahedron mesh with meshio (gmsh ``.msh``, ``.vtk``, ``.vtu``, ``.obj``, ...).

    Tetrahedra are taken when the file has any, else triangles. Other cells (lines, vertices) are ignored.
    Elements are re-oriented to be positive (see :func:`orient`).

    Args:
        dim: 2 or 3, the dimension of the returned vertices; default 3 for tetrahedra, and for triangles 2
            when every z coordinate is 0 (a flat file), else an error (a 3D surface is not a 2D body).

    Returns:
        vertices ``(N, dim)``, elements ``(E, dim + 1)`` int64. Vertices no element uses are dropped.
    """
    meshio = require("meshio", "io")

    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: a directory, not a mesh file")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such mesh file")
    _refuse_hanging_format(path)
    try:
        m = meshio.read(path)
    except SystemExit:  # some of meshio's readers exit the process on a file they cannot parse
        raise ValueError(f"{path}: meshio could not read it (empty, truncated or not a mesh file)") from None
    except (OSError, ValueError, KeyError, IndexError, TypeError, meshio.ReadError) as e:
        raise ValueError(f"{path}: meshio could not read it ({type(e).__name__}: {e})") from e
    blocks = {}
    for block in m.cells:
        blocks.setdefault(block.type, []).append(np.asarray(block.data, dtype=np.int64))
    kind = "tetra" if "tetra" in blocks else "triangle" if "triangle" in blocks else None
    if kind is None:
        raise ValueError(f"{path}: no triangle or tetra cells (found {sorted(blocks) or 'none'})")
    cells = np.concatenate(blocks[kind])
    points = np.asarray(m.points, dtype=np.float64)
    if cells.size and (cells.min() < 0 or cells.max() >= len(points)):  # (numpy would take -1 as the last point)
        bad = cells.min() if cells.min() < 0 else cells.max()
        raise ValueError(f"{path}: a {kind} cell has vertex index {bad}, out of range for its {len(points)} points")
    if kind == "tetra":
        dim = 3 if dim is None else dim
        if dim != 3 or points.shape[1] != 3:
            raise ValueError(f"{path}: tetrahedra need 3D points and dim=3, got {points.shape[1]}D and dim={dim}")
    else:
        flat = points.shape[1] == 2 or np.all(points[:, 2] == 0)
        dim = (2 if flat else 3) if dim is None else dim
        if dim != 2:
            raise ValueError(f"{path}: triangles make a 2D body only, and this file needs dim=2 with z = 0")
        if not flat:
            raise ValueError(f"{path}: triangles with non-zero z coordinates are a surface, not a 2D body")
        points = points[:, :2]
    used, cells = np.unique(cells, return_inverse=True)
    cells = cells.reshape(-1, dim + 1)
    points = points[used]
    return _tensors(points, orient(points, cells), dtype)


_HANGING_FORMATS = (".ele", ".node")
"""Extensions whose meshio reader (tetgen's) loops for good on some files: on one that ends in blank lines, and
on what meshio itself writes for triangles (measured with meshio 5.0)."""


def _refuse_hanging_format(path):
    """A ValueError naming ``path`` for a format of :data:`_HANGING_FORMATS`, before meshio is called."""
    if os.path.splitext(path)[1].lower() in _HANGING_FORMATS:
        raise ValueError(f"{path}: tetgen's .ele/.node format is not supported (meshio's reader can hang on it): "
                         f"use .vtu, .vtk or .msh")


def write(path, vertices, elements, point_data=None):
    """Writes a mesh with meshio; the format follows the file's extension. 2D vertices get z = 0.

    Args:
        vertices: ``(N, d)``; elements: ``(E, d + 1)``; point_data: optional ``{name: (N, ...)}``.
    """
    meshio = require("meshio", "io")

    points, cells, data = _meshio_arrays(vertices, elements, point_data, "vertices")
    _refuse_hanging_format(path)
    meshio.write(path, meshio.Mesh(points, cells, point_data=data))
    # Some formats drop cells they cannot hold (tetrahedra in .stl, .off, .ply), meshio only printing a warning.
    kind, count = cells[0][0], len(cells[0][1])
    try:
        back = meshio.read(path)
        kept = sum(len(block.data) for block in back.cells if block.type == kind)
    except Exception:  # noqa: BLE001 - a file its own format cannot read back is the same failure
        kept = None
    if kept != count:
        os.remove(path)
        raise ValueError(f"{path}: its format ({os.path.splitext(path)[1] or 'no extension'}) does not hold the "
                         f"{count} {kind} cells (it read back {'nothing' if kept is None else kept}); nothing was "
                         f"written: use .vtu, .vtk or .msh")


def write_vtk_series(directory, positions, elements, name="frame", dt=1.0, point_data=None, colliders=()):
    """Writes a trajectory as one ``.vtu`` per frame plus a ``<name>.pvd`` collection that ParaView opens.

    Args:
        directory: created if missing.
        positions: ``(T, N, d)`` vertex positions over time (tensor or array).
        elements: ``(E, d + 1)``.
        dt: time between frames (the ``timestep`` attribute of the collection).
        point_data: optional ``{name: (T, N, ...)}`` per-frame vertex fields (e.g. velocities).
        colliders: :mod:`diffsoft.colliders` objects to show (e.g. ``sim.all_colliders``, the ground included),
            one creature's: each one's surface within a box around the trajectory (its extent padded by half
            of it on every side), written once as ``<name>_collider<k>.vtu`` (2D: its boundary as lines at z = 0;
            3D: triangles) and listed in the collection as part ``k + 1`` of every frame.

    Returns:
        the path of the ``.pvd`` file.
    """
    meshio = require("meshio", "io")

    try:
        dt = float(dt)  # a number, or a tensor of one (a simulator's dt)
    except (TypeError, ValueError):
        dt = None
    if dt is None or not (math.isfinite(dt) and dt > 0):
        raise ValueError("dt must be a positive number (the time between frames)")
    os.makedirs(directory, exist_ok=True)
    positions = _numpy(positions)
    if positions.ndim != 3:
        raise ValueError(f"positions must be (T, N, d), got shape {tuple(positions.shape)}")
    for t, x in enumerate(positions):  # every frame before any file: a bad one found later left a partial series
        _meshio_arrays(x, elements, None, f"positions[{t}]")
    point_data = {k: _numpy(v) for k, v in (point_data or {}).items()}
    for k, v in point_data.items():
        if v.shape[:2] != positions.shape[:2]:
            raise ValueError(f"point_data[{k!r}] must start with (T, N) = {positions.shape[:2]}, got {v.shape}")
    parts = []
    if len(colliders):
        dim = positions.shape[-1]
        lo, hi = positions.reshape(-1, dim).min(0), positions.reshape(-1, dim).max(0)
        pad = 0.5 * (hi - lo).max()
        for k, collider in enumerate(colliders):
            fname = f"{name}_collider{k}.vtu"
            if dim == 2:
                boundary = collider.mesh(2, lo - pad, hi + pad)
                points = np.concatenate([boundary, np.zeros((len(boundary), 1))], axis=1)
                cells = [("line", np.stack([np.arange(len(boundary)), (np.arange(len(boundary)) + 1) % len(boundary)], 1))]
            else:
                points, tris = collider.mesh(3, lo - pad, hi + pad)
                cells = [("triangle", tris)]
            if len(points) == 0:  # (a file of no points reads back nowhere)
                warnings.warn(f"write_vtk_series: colliders[{k}] has no surface within the box around the "
                              f"trajectory (its extent padded by half), so it is not written", UserWarning,
                              stacklevel=2)
                continue
            meshio.write(os.path.join(directory, fname), meshio.Mesh(points, cells))
            parts.append(fname)
    entries = []
    for t, x in enumerate(positions):
        fname = f"{name}_{t:05d}.vtu"
        points, cells, data = _meshio_arrays(x, elements, {k: v[t] for k, v in point_data.items()}, f"positions[{t}]")
        meshio.write(os.path.join(directory, fname), meshio.Mesh(points, cells, point_data=data))
        entries.append(f'    <DataSet timestep="{t * dt!r}" group="" part="0" file="{escape(fname, _QUOTE)}"/>')
        entries += [f'    <DataSet timestep="{t * dt!r}" group="" part="{k + 1}" file="{escape(part, _QUOTE)}"/>'
                    for k, part in enumerate(parts)]
    pvd = os.path.join(directory, f"{name}.pvd")
    with open(pvd, "w") as f:
        f.write('<?xml version="1.0"?>\n<VTKFile type="Collection" version="0.1">\n  <Collection>\n')
        f.write("\n".join(entries))
        f.write("\n  </Collection>\n</VTKFile>\n")
    return pvd


_QUOTE = {'"': "&quot;"}  # escape's entities inside an attribute's double quotes


def _meshio_arrays(vertices, elements, point_data, name):
    """meshio's points, cells and point data, checked as :func:`read` reads them back (``name`` names the
    vertices in errors)."""
    points = _numpy(vertices).astype(np.float64)
    elements = _numpy(elements)
    if points.ndim != 2 or points.shape[1] not in (2, 3):
        raise ValueError(f"{name} must be (N, 2) or (N, 3), got shape {points.shape}")
    if not np.isfinite(points).all():
        raise ValueError(f"{name} has non-finite (NaN or infinite) coordinates: the file would not read back")
    if elements.dtype.kind not in "iu":
        raise ValueError(f"elements must hold integer vertex indices, got dtype {elements.dtype}")
    cells = elements.astype(np.int64)
    if cells.ndim != 2 or cells.shape[1] != points.shape[1] + 1 or len(cells) == 0:
        raise ValueError(f"elements must be (E, {points.shape[1] + 1}) for {points.shape[1]}D vertices, E >= 1, got "
                         f"{cells.shape}")
    if cells.min() < 0 or cells.max() >= len(points):
        raise ValueError(f"elements has vertex index {cells.max() if cells.max() >= len(points) else cells.min()}, out "
                         f"of range for the {len(points)} vertices")
    kind = "triangle" if points.shape[1] == 2 else "tetra"
    if points.shape[1] == 2:
        points = np.concatenate([points, np.zeros((len(points), 1))], axis=1)
    data = {}
    for k, v in (point_data or {}).items():
        v = _numpy(v).astype(np.float64)
        if v.shape[:1] != (len(points),):
            raise ValueError(f"point_data[{k!r}] must have one row per vertex ({len(points)}, ...), got {v.shape}")
        if v.ndim == 2 and v.shape[1] == 2:  # ParaView expects 3-component vectors
            v = np.concatenate([v, np.zeros((len(v), 1))], axis=1)
        data[k] = v
    return points, [(kind, cells)], data


def _numpy(a):
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def _tensors(verts, elements, dtype):
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if dtype not in (torch.float32, torch.float64):  # (an integer dtype truncated the coordinates: another mesh)
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    verts = torch.as_tensor(np.asarray(verts), dtype=dtype)
    if not torch.isfinite(verts).all():
        raise ValueError(f"the mesh's vertices are not finite in {dtype}: its size (width, height, size, "
                         f"cell_size) or origin is too large")
    return verts, torch.as_tensor(elements, dtype=torch.int64)


def _mask(mask, ndim):
    m = np.asarray(mask, dtype=bool)
    if m.ndim != ndim or not m.any():
        raise ValueError(f"mask must be a {ndim}D boolean array with at least one filled cell, got shape {m.shape}")
    return m


def _pair(v, n):
    if np.ndim(v) == 0:
        v = (v,) * n
    if len(v) != n:
        raise ValueError(f"cell_size must be a number or {n} numbers, got {v!r}")
    _check_positive(**{f"cell_size[{i}]": float(s) for i, s in enumerate(v)})
    return tuple(float(s) for s in v)


def _check_counts(**counts):
    for name, n in counts.items():
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{name} must be a positive integer, got {n!r}")


def _check_positive(**values):
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (v > 0 and math.isfinite(v)):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")


def _check_origin(origin, n):
    if np.ndim(origin) != 1 or len(origin) != n or not all(
            isinstance(c, numbers.Real) and not isinstance(c, bool) and math.isfinite(c) for c in origin):
        raise ValueError(f"origin must be {n} finite numbers, got {origin!r}")
