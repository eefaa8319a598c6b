"""Mesh generators, orientation, boundaries, meshio round trips and the VTK time series."""
import os
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

from diffsoft import mesh


def _signed_volumes(v, el):
    edges = v[el[:, 1:]] - v[el[:, :1]]
    return torch.det(edges.double()) / (2 if v.shape[1] == 2 else 6)


def test_rectangle_counts_area_orientation():
    v, t = mesh.rectangle(width=1.0, height=0.3, nx=20, ny=6, origin=(1.0, 2.0))
    assert v.shape == (21 * 7, 2) and t.shape == (2 * 20 * 6, 3) and t.dtype == torch.int64
    vol = _signed_volumes(v, t)
    assert (vol > 0).all()
    assert vol.sum().item() == pytest.approx(0.3, rel=1e-6)
    assert v.min(0).values.tolist() == pytest.approx([1.0, 2.0])
    assert v.max(0).values.tolist() == pytest.approx([2.0, 2.3])
    assert torch.unique(t).numel() == len(v)


def test_box_counts_volume_orientation_and_conformity():
    v, t = mesh.box(size=(1.0, 0.2, 0.3), resolution=(5, 2, 3), dtype=torch.float64)
    assert v.shape == (6 * 3 * 4, 3) and t.shape == (6 * 30, 4)
    vol = _signed_volumes(v, t)
    assert (vol > 0).all()
    assert vol.sum().item() == pytest.approx(0.06, rel=1e-12)
    # A conforming mesh has each interior face in exactly two tetrahedra: the boundary is the box's surface,
    # 2 triangles per boundary square, and encloses the box's volume (divergence theorem).
    f = mesh.boundary_facets(t)
    assert len(f) == 2 * 2 * (5 * 2 + 5 * 3 + 2 * 3)
    p = v[f]
    assert (p[:, 0] * torch.cross(p[:, 1], p[:, 2], dim=1)).sum().item() / 6 == pytest.approx(0.06, rel=1e-12)


def test_grid_and_voxels_share_corners_between_cells():
    v, t = mesh.grid([[1, 0, 0], [1, 1, 1]], cell_size=0.5)  # an L: 4 cells, rows from the bottom
    assert len(t) == 8 and len(v) == 3 * 4 - 2  # the two bottom-right corners belong to no cell
    assert (_signed_volumes(v, t) > 0).all()
    assert _signed_volumes(v, t).sum().item() == pytest.approx(4 * 0.25)
    v3, t3 = mesh.voxels(np.ones((1, 2, 1), dtype=bool))
    assert len(v3) == 12 and len(t3) == 12
    assert (_signed_volumes(v3, t3) > 0).all()


def test_boundary_edges_of_a_rectangle_run_counter_clockwise():
    v, t = mesh.rectangle(2.0, 1.0, 4, 2, dtype=torch.float64)
    e = mesh.boundary_facets(t)
    assert len(e) == 2 * (4 + 2)
    a, b = v[e[:, 0]], v[e[:, 1]]
    # Shoelace over the boundary edges: the enclosed area, positive for counter-clockwise.
    assert 0.5 * (a[:, 0] * b[:, 1] - b[:, 0] * a[:, 1]).sum().item() == pytest.approx(2.0)


def test_orient_fixes_negative_elements():
    v, t = mesh.box(resolution=(2, 1, 1), dtype=torch.float64)
    flipped = t.clone()
    flipped[::2] = flipped[::2][:, [0, 1, 3, 2]]
    assert (_signed_volumes(v, mesh.orient(v, flipped)) > 0).all()


@pytest.mark.parametrize("ext", ["vtu", "vtk", "msh"])
def test_meshio_round_trip(tmp_path, ext):
    for v, el in (mesh.rectangle(1.0, 0.5, 3, 2, dtype=torch.float64), mesh.box((1, 1, 1), (2, 1, 1), dtype=torch.float64)):
        path = str(tmp_path / f"m{v.shape[1]}.{ext}")
        mesh.write(path, v, el)
        v2, el2 = mesh.read(path, dtype=torch.float64)
        assert v2.shape == v.shape and torch.allclose(v2, v)
        assert torch.equal(el2, el)


def test_read_obj_triangles_as_2d_body_and_reorients(tmp_path):
    path = tmp_path / "square.obj"
    path.write_text("v 0 0 0\nv 1 0 0\nv 1 1 0\nv 0 1 0\nf 1 3 2\nf 1 4 3\n")  # clockwise faces
    v, t = mesh.read(str(path))
    assert v.shape == (4, 2)
    assert (_signed_volumes(v, t) > 0).all()


def test_read_rejects_surfaces_and_meshes_without_elements(tmp_path):
    surf = tmp_path / "tilted.obj"
    surf.write_text("v 0 0 0\nv 1 0 1\nv 0 1 0\nf 1 2 3\n")
    with pytest.raises(ValueError, match="surface"):
        mesh.read(str(surf))
    import meshio
    lines = str(tmp_path / "lines.vtu")
    meshio.write(lines, meshio.Mesh(np.zeros((2, 3)), [("line", np.array([[0, 1]]))]))
    with pytest.raises(ValueError, match="no triangle or tetra"):
        mesh.read(lines)


def test_vtk_series_writes_frames_and_a_collection(tmp_path):
    v, t = mesh.rectangle(1.0, 0.5, 2, 1, dtype=torch.float64)
    xs = torch.stack([v + 0.1 * k for k in range(3)])
    pvd = mesh.write_vtk_series(str(tmp_path / "out"), xs, t, name="walk", dt=0.5, point_data={"velocity": xs})
    files = [d.get("file") for d in ET.parse(pvd).getroot().iter("DataSet")]
    steps = [float(d.get("timestep")) for d in ET.parse(pvd).getroot().iter("DataSet")]
    assert files == ["walk_00000.vtu", "walk_00001.vtu", "walk_00002.vtu"] and steps == [0.0, 0.5, 1.0]
    import meshio
    m = meshio.read(os.path.join(str(tmp_path / "out"), files[2]))
    assert np.allclose(m.points[:, :2], xs[2].numpy()) and np.allclose(m.points[:, 2], 0)
    assert m.point_data["velocity"].shape == (len(v), 3)
    # a dt that is a tensor (a simulator's), a name with a quote: the collection still parses; a bad dt is refused
    pvd = mesh.write_vtk_series(str(tmp_path / "q"), xs, t, name='a"b', dt=torch.tensor(0.25, requires_grad=True))
    assert [float(d.get("timestep")) for d in ET.parse(pvd).getroot().iter("DataSet")] == [0.0, 0.25, 0.5]
    for dt in ("abc", float("nan"), -1.0):
        with pytest.raises(ValueError, match="dt must be a positive number"):
            mesh.write_vtk_series(str(tmp_path / "bad"), xs, t, dt=dt)


def test_a_format_that_drops_tetrahedra_is_refused_and_leaves_no_file(tmp_path):
    v, el = mesh.box((1, 1, 1), (2, 1, 1), dtype=torch.float64)
    path = tmp_path / "m.stl"
    with pytest.raises(ValueError, match=r"m.stl: its format \(.stl\) does not hold the 12 tetra cells"):
        mesh.write(str(path), v, el)
    assert not path.exists()


def test_bad_generator_arguments():
    with pytest.raises(ValueError, match="nx"):
        mesh.rectangle(1.0, 1.0, 0, 2)
    with pytest.raises(ValueError, match="width"):
        mesh.rectangle(-1.0, 1.0, 1, 1)
    with pytest.raises(ValueError, match="resolution"):
        mesh.box((1, 1, 1), (1, 1))
    with pytest.raises(ValueError, match="mask"):
        mesh.grid(np.zeros((2, 2)))
