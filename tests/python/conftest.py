"""Shared by every Python test: the dtypes and devices tests run in, seeded random state, so that a test's
data does not depend on which tests ran before it (``pytest -k``, ``-x`` and a full run see the same numbers),
and the small simulators several test files step."""
import pytest
import torch

from diffsoft.body import SoftBody
from diffsoft.energies import reference_step_energy
from diffsoft.mesh import box, rectangle
from diffsoft.simulator import Simulator

F64, F32 = torch.float64, torch.float32
TIGHT = dict(rtol=1e-12, atol=1e-10, backward_rtol=1e-12, on_failure="raise")
"""Solver options for comparisons with finite differences."""
DTYPES = (F64, F32)
"""Float64 first: derivatives are checked against finite differences in it; float32 is the training dtype."""


@pytest.fixture(autouse=True, scope="session")
def _threaded_loops():
    """The C++ core's loops over a batch split every batch of two or more between torch's threads (the
    machine's count), not only batches with work enough to be worth a thread (csrc/diffsoft/core/parallel.h):
    the suite's small batches run the threaded paths too."""
    from diffsoft import _C
    before = _C._set_min_chunk_ns(0)
    yield
    _C._set_min_chunk_ns(before)


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global random state."""
    torch.manual_seed(0)


@pytest.fixture(params=DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def dtype(request):
    """Runs a test once per dtype of :data:`DTYPES`."""
    return request.param


DEVICES = ("cpu", "cuda")
"""The CPU always; CUDA where ``torch.cuda.is_available()`` (skipped elsewhere)."""


@pytest.fixture(params=DEVICES)
def device(request):
    """Runs a test once per device of :data:`DEVICES`, skipping those this machine lacks."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device(request.param)


@pytest.fixture
def generator():
    """A ``torch.Generator`` seeded at 0, for tests that draw their own data."""
    return torch.Generator().manual_seed(0)


def small_sim(material="neo_hookean", fixed=None, device=None, **kw):
    """2 x 1 cells (6 vertices), 2 muscles, resting near the ground: contact and friction are active; float64,
    :data:`TIGHT` options (``kw`` overrides them, e.g. ``backend``). On ``device`` (default the CPU), where the
    step takes that device's backend."""
    v, t = rectangle(0.4, 0.2, 2, 1, dtype=F64)
    body = SoftBody(v, t, material=material, density=100.0, youngs_modulus=2e3, poisson_ratio=0.3,
                    muscles=[[0, 4], [1, 5]], muscle_stiffness=[30.0, 40.0], fixed=fixed)
    sim = Simulator(body, dt=0.02, **{**TIGHT, **kw})
    return sim if device is None else sim.to(device=device)


def sheet_sim(dim, material, fixed=None):
    """A 2D sheet (3 x 2 cells) or 3D box (2 x 1 x 1 cells) with 2 muscles over the ground, float64."""
    if dim == 2:
        verts, elements = rectangle(width=0.4, height=0.2, nx=3, ny=2, dtype=F64)
        muscles = [[0, 5], [1, 4]]
    else:
        verts, elements = box(size=(0.4, 0.2, 0.2), resolution=(2, 1, 1), dtype=F64)
        muscles = [[0, 7], [1, 6]]
    body = SoftBody(verts, elements, material=material, density=1000.0, youngs_modulus=1e4, poisson_ratio=0.3,
                    fixed=fixed, muscles=muscles)
    return Simulator(body, dt=0.02, ground=0.0)


def assert_fused_matches_reference(y, flat, top, v):
    """The fused step energy's value, gradient and Hessian product along ``v`` (through its autograd nodes)
    against the plain-torch reference's at ``y``; returns the reference's ``(e, g, hv)``."""
    from diffsoft.fused import step_energy
    results = []
    for energy in (reference_step_energy, step_energy):
        e = energy(y, *flat, top)
        (g,) = torch.autograd.grad(e.sum(), y, create_graph=True)
        (hv,) = torch.autograd.grad(g, y, v)
        results.append((e, g, hv))
    (e0, g0, h0), (e1, g1, h1) = results
    torch.testing.assert_close(e1, e0, rtol=1e-12, atol=0)
    torch.testing.assert_close(g1, g0, rtol=1e-10, atol=1e-10 * g0.abs().max().item())
    torch.testing.assert_close(h1, h0, rtol=1e-10, atol=1e-10 * h0.abs().max().item())
    return e0, g0, h0


def reference_param_grads(y, flat, top, wanted, weight, order):
    """Through the reference energy, for the parameters at the indices ``wanted`` of ``flat``
    (``StepParams.flat()``): ``weight . d/dtheta E`` (order 1, ``weight`` shaped like the energy), or
    ``d/dtheta [grad_y E . weight]`` (order 2); None where a parameter does not enter. The oracle of the kernels'
    closed-form parameter derivatives."""
    with torch.enable_grad():
        y_ = y.detach().requires_grad_()
        ts = [t if t is None else t.detach().requires_grad_(i in wanted) for i, t in enumerate(flat)]
        e = reference_step_energy(y_, *ts, top)
        if order == 1:
            grads = torch.autograd.grad(e, [ts[i] for i in wanted], weight, allow_unused=True)
        else:
            (g_y,) = torch.autograd.grad(e.sum(), y_, create_graph=True)
            grads = torch.autograd.grad(g_y, [ts[i] for i in wanted], weight, allow_unused=True)
    out = [None] * len(flat)
    for i, g in zip(wanted, grads):
        out[i] = g
    return out


def param_names(p, top):
    """The name of each of ``StepParams.flat()``'s parameters: the field's, ``colliders[c].name``,
    ``terms[k][j]``."""
    names = list(p._fields[:-2])
    names += [f"colliders[{c}].{n}" for c, kind in enumerate(top.colliders) for n in kind.PARAMS]
    names += [f"terms[{k}][{j}]" for k, params in enumerate(p.terms) for j in range(len(params))]
    return names


def failing_creature(fail_from_iteration, window=3):
    """A ``make_creature`` for training tests: the biped, whose simulator gets max_iter=0 (no Newton iteration:
    every step fails) once training reaches the given iteration, counted by its training rollouts' steps (batches
    of 2 creatures, ``window`` steps an iteration), not its evaluations'."""
    from diffsoft import creatures

    def make(name, dtype, device="cpu"):
        sim = creatures.biped(dtype=dtype)
        original = sim.step

        def step(x, *args, **kw):
            if x.dim() == 3 and x.shape[0] == 2:  # a training rollout's step, not an evaluation's
                if step.calls >= fail_from_iteration * window:
                    sim.solver_options["max_iter"] = 0
                step.calls += 1
            return original(x, *args, **kw)

        step.calls = 0
        sim.step = step
        return sim

    return make
