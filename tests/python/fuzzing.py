"""Seeded fuzz cases and the properties every solve must have: shared by the property-based tests
(``tests/python/test_fuzz_minimize.py``, ``test_fuzz_simulator.py``) and the larger campaign of
``benchmarks/fuzz_report.py`` (which puts ``tests/python`` on ``sys.path``). Test code, not part of the
package: needs hypothesis and pytest (``pip install diffsoft[test]``).

Two families of cases:

* :data:`problems`: random smooth energies for :func:`diffsoft.minimize` (convex, non-convex, unbounded below,
  badly scaled); :func:`check_solve` asserts that a solve converges (checked independently by autograd) or says
  it did not.
* :func:`cases`: random 2D and 3D bodies, materials, time steps and impacts for ``Simulator.step``;
  :func:`check_steps` asserts that each step converges (checked on the plain-torch reference residual) or says
  it did not, with finite states and no inverted neo-Hookean element.
"""
import json
import math
import numbers
import os
import re
import tempfile
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

import diffsoft
from diffsoft import creatures, policy, render
from diffsoft.body import SoftBody
from diffsoft.energies import MATERIALS, deformation_gradient, determinant, reference_step_energy
from diffsoft.mesh import box, rectangle
from diffsoft.ppo import PPOConfig
from diffsoft.simulator import Simulator
from diffsoft.training import TrainConfig

# No shrinking: a failing example is printed as found (shrinking a slow simulation can take many minutes).
_FUZZ = settings(derandomize=True, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def fuzz(max_examples):
    """Seeded (derandomized), no deadline, a bounded number of examples, no shrinking."""
    return settings(_FUZZ, max_examples=max_examples)


# --- energies: energy(x, b, k, scale, D) with x (..., n), summed over everything ------------------------------
# b (..., n) is a linear load, k a positive 0-dim stiffness; scale (0-dim) multiplies the energy and D (n,)
# scales the coordinates (badly scaled problems); a family's own constants ride in the closure.

def quartic_family(n, g):
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    a = q @ torch.diag(10.0 ** (3 * torch.rand(n, generator=g, dtype=torch.float64))) @ q.T

    def energy(y, k):
        return 0.5 * torch.einsum("...i,ij,...j->...", y, a.to(y.dtype), y).sum() + 0.25 * k * (y ** 4).sum()
    return energy, True


def double_well_family(n, g):
    def energy(y, k):
        coupling = 0.5 * ((y[..., 1:] - y[..., :-1]) ** 2).sum() if n > 1 else 0.0
        return k * ((y * y - 1) ** 2).sum() + coupling
    return energy, False


def rosenbrock_family(n, g):
    def energy(y, k):
        if n == 1:
            return k * (1 - y * y).square().sum() + (y - 1).square().sum()
        return (k * (y[..., 1:] - y[..., :-1] ** 2) ** 2).sum() + ((1 - y[..., :-1]) ** 2).sum() + \
            (y[..., -1:] ** 2).sum()
    return energy, False


def log_sum_exp_family(n, g):
    w = torch.randn(2 * n, n, generator=g, dtype=torch.float64)
    c = torch.randn(2 * n, generator=g, dtype=torch.float64)

    def energy(y, k):
        return torch.logsumexp(y @ w.to(y.dtype).T + c.to(y.dtype), -1).sum() + 0.5 * k * (y * y).sum()
    return energy, True


def unbounded_family(n, g):
    """No minimum: every solve must fail, and say so, with finite iterates."""
    def energy(y, k):
        return -0.5 * k * (y * y).sum() - torch.cosh(y).sum()
    return energy, False


FAMILIES = {"quartic": quartic_family, "double_well": double_well_family, "rosenbrock": rosenbrock_family,
            "log_sum_exp": log_sum_exp_family, "unbounded": unbounded_family}


def make_problem(family, n, batch, coordinate_decades, energy_decades, x0_scale, seed, dtype=torch.float64,
                 per_problem=False):
    """``(energy, x0, (b, k, scale, D), convex)`` from plain parameters. ``per_problem`` (with a batch): the
    energy returns one energy per problem, shape ``(B,)``, which gives each problem its own line search."""
    g = torch.Generator().manual_seed(seed)
    f, convex = FAMILIES[family](n, g)
    shape = (n,) if batch is None else (batch, n)
    b = torch.randn(shape, generator=g, dtype=torch.float64)
    k = 10.0 ** (2 * torch.rand((), generator=g, dtype=torch.float64) - 1)
    scale = torch.tensor(10.0 ** energy_decades, dtype=torch.float64)
    D = 10.0 ** (coordinate_decades * (2 * torch.rand(n, generator=g, dtype=torch.float64) - 1))
    x0 = x0_scale * torch.randn(shape, generator=g, dtype=torch.float64) / D

    def energy(x, b, k, scale, D):
        y = D * x
        if per_problem and batch is not None:
            return scale * (torch.stack([f(row, k) for row in y]) - (b * y).sum(-1))
        return scale * (f(y, k) - (b * y).sum())
    return energy, x0.to(dtype), tuple(t.to(dtype) for t in (b, k, scale, D)), convex


def problem_grad_norms(energy, x, params):
    """Per-problem ``|grad_x E|`` by autograd: ``(B,)`` (``(1,)`` unbatched)."""
    x = x.detach().requires_grad_()
    with torch.enable_grad():
        (gx,) = torch.autograd.grad(energy(x, *params).sum(), x)  # summed: per-problem energies too
    return gx.reshape(-1, x.shape[-1]).norm(dim=-1) if x.dim() == 2 else gx.norm().reshape(1)


def check_solve(energy, x0, params, **options):
    """One ``minimize`` with ``on_failure="warn"``; checks the properties, replays a failure with
    ``on_failure="raise"``. Returns ``"converged"`` or ``"reported"``; violations raise AssertionError."""
    batched = x0.dim() == 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x, info = diffsoft.minimize(energy, x0, *params, batched=batched, return_info=True, **options)
    failures = [w for w in caught if issubclass(w.category, RuntimeWarning) and "converge" in str(w.message)]
    assert torch.isfinite(x).all(), f"non-finite x* ({info.message})"
    rtol = options.get("rtol") or (1e-8 if x0.dtype == torch.float64 else 1e-4)
    threshold = (rtol * problem_grad_norms(energy, x0, params)).clamp_min(options.get("atol", 0.0))
    g = problem_grad_norms(energy, x, params)
    # The solver's own gradient and autograd's are the same computation; allow a little for reduction order.
    met = g <= threshold * (1 + 1e-6)
    flags = torch.tensor(info.problem_converged)
    assert len(flags) == len(g)
    assert (flags <= met).all(), f"problems {torch.nonzero(flags & ~met).flatten().tolist()} claim convergence"
    assert info.converged == bool(flags.all())
    if info.converged:
        assert not failures, f"converged but warned: {failures[0].message}"
        return "converged"
    assert failures, f"did not converge and said nothing ({info.message})"
    assert info.message and info.message != "converged"
    if batched:  # the message names every failed problem (the first 10)
        failed = set(torch.nonzero(~flags).flatten().tolist())
        named = {int(i) for group in re.findall(r"problem\(s\) ([\d, ]+)", info.message)
                 for i in group.replace(",", " ").split()}
        assert failed <= named or len(failed) > 10, f"{sorted(failed)} not all named in {info.message!r}"
    with pytest.raises(diffsoft.ConvergenceError):
        diffsoft.minimize(energy, x0, *params, batched=batched, **{**options, "on_failure": "raise"})
    return "reported"


problems = st.fixed_dictionaries(dict(
    family=st.sampled_from(sorted(FAMILIES)), n=st.integers(1, 30), batch=st.one_of(st.none(), st.integers(1, 5)),
    coordinate_decades=st.floats(0.0, 2.0), energy_decades=st.floats(-6.0, 6.0), x0_scale=st.floats(0.0, 10.0),
    seed=st.integers(0, 2**16), per_problem=st.booleans()))


# --- cases -----------------------------------------------------------------------------------------------

def make_mesh(dim, cells, size, dtype):
    """``cells = 0``: a single triangle or tetrahedron; else a rectangle/box of ``cells`` (per axis) cells."""
    if cells == (0,) * len(cells):
        v = torch.cat([torch.zeros(1, dim), torch.eye(dim)]).to(dtype) * size
        return v, torch.arange(dim + 1).reshape(1, -1)
    if dim == 2:
        return rectangle(size * cells[0], size * cells[1], cells[0], cells[1], dtype=dtype)
    return box(tuple(size * c for c in cells), cells, dtype=dtype)


def make_case(dim, cells, size, material, youngs_modulus, poisson_ratio, density, dt, muscles, activation,
              height, impact, spin, noise, seed, dtype=torch.float64, fixed=None, **solver):
    """A simulator and a starting state ``(sim, x0, v0, activation)`` from plain parameters (hypothesis draws
    them here; the fuzz report draws them from a seeded RNG).

    ``size``: cell edge (m); ``muscles``: vertex-pair seeds, reduced modulo the vertex count; ``height``: the
    lowest vertex's height above the ground in cell sizes (negative: starting inside it); ``impact``: the
    downward speed (m/s); ``spin``: the scale (1/s) of a random velocity field relative to the size;
    ``noise``: a random displacement of the vertices in cell sizes (small enough to invert nothing).
    """
    v, t = make_mesh(dim, cells, size, dtype)
    n = len(v)
    pairs = sorted({tuple(sorted((a % n, b % n))) for a, b in muscles if a % n != b % n})
    body = SoftBody(v, t, material=material, density=density, youngs_modulus=youngs_modulus,
                    poisson_ratio=poisson_ratio, muscles=pairs or None, fixed=fixed, dtype=dtype)
    sim = Simulator(body, dt=dt, **solver)
    g = torch.Generator().manual_seed(seed)
    x0 = v + noise * size * (torch.rand(v.shape, generator=g, dtype=dtype) - 0.5)
    x0[:, 1] += height * size - x0[:, 1].min()
    v0 = spin * size * torch.randn(v.shape, generator=g, dtype=dtype)
    v0[:, 1] -= impact
    a = torch.full((len(pairs),), activation, dtype=dtype) if pairs else None
    return sim, x0, v0, a


cells_2d = st.one_of(st.just((0, 0)), st.tuples(st.integers(1, 4), st.integers(1, 3)))
cells_3d = st.one_of(st.just((0, 0, 0)), st.tuples(st.integers(1, 2), st.integers(1, 2), st.integers(1, 2)))
log_uniform = lambda lo, hi: st.floats(math.log10(lo), math.log10(hi)).map(lambda e: 10.0 ** e)  # noqa: E731


@st.composite
def cases(draw, dt_range=(1e-4, 1.0), stiffness=(1e1, 1e7), impact=30.0):
    dim = draw(st.sampled_from([2, 3]))
    return dict(
        dim=dim, cells=draw(cells_2d if dim == 2 else cells_3d), size=draw(log_uniform(0.02, 1.0)),
        material=draw(st.sampled_from(MATERIALS)), youngs_modulus=draw(log_uniform(*stiffness)),
        poisson_ratio=draw(st.floats(0.0, 0.45)), density=draw(log_uniform(10.0, 3000.0)),
        dt=draw(log_uniform(*dt_range)),
        muscles=draw(st.lists(st.tuples(st.integers(0, 63), st.integers(0, 63)), max_size=3)),
        activation=draw(st.floats(0.3, 1.0)), height=draw(st.floats(-0.05, 5.0)),
        impact=draw(st.one_of(st.just(0.0), st.floats(0.0, impact))), spin=draw(log_uniform(1e-3, 10.0)),
        noise=draw(st.floats(0.0, 0.1)), seed=draw(st.integers(0, 2**16)))


# --- the properties ----------------------------------------------------------------------------------------

def residual_norm(sim, x0, v0, a, x1):
    """``max over problems |grad E(x1)|`` of the step's objective, by autograd on the plain-torch reference
    energy in float64 (whatever the simulator's dtype): an oracle independent of the fused derivatives the
    solver uses and of float32 round-off."""
    f64 = torch.float64
    sim = sim.to(dtype=f64)
    x0, v0, x1 = x0.to(f64), v0.to(f64), x1.to(f64)
    a = None if a is None else a.to(f64)
    body = sim.body
    if a is None and body.num_muscles:
        a = torch.ones(body.num_muscles, dtype=f64)
    params, top = sim.step_problem(x0, v0, a)
    y = x1[..., top.free, :].detach().requires_grad_()
    with torch.enable_grad():
        e = reference_step_energy(y, *params.flat(), top)
        (g,) = torch.autograd.grad(e.sum(), y)
    return g.flatten(-2).norm(dim=-1).max().item()


def min_det_f(sim, x):
    return determinant(deformation_gradient(x, sim.body.elements, sim.body.Dm_inv)).min().item()


def check_steps(sim, x0, v0, a, steps):
    """Runs ``steps`` steps with ``on_failure="warn"`` and checks the properties of each; a step that did not
    converge is replayed with ``on_failure="raise"``, which must raise ConvergenceError.

    Returns one outcome per step: ``"converged"`` or ``"reported"`` (failure reported correctly). Violations
    raise AssertionError, so a crash, a non-finite value, an inverted element, a converged claim that the
    reference residual contradicts, or a silent failure all fail the caller.
    """
    sim.solver_options["on_failure"] = "warn"
    rtol = sim.solver_options["rtol"] or (1e-8 if sim.body.dtype == torch.float64 else 1e-4)
    eps = torch.finfo(sim.body.dtype).eps
    outcomes = []
    x, v = x0, v0
    for t in range(steps):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x1, v1, info = sim.step(x, v, a, return_info=True)
        failures = [w for w in caught if issubclass(w.category, RuntimeWarning) and "converge" in str(w.message)]
        assert torch.isfinite(x1).all() and torch.isfinite(v1).all(), f"step {t}: non-finite state ({info.message})"
        if sim.body.material == "neo_hookean":
            assert min_det_f(sim, x1) > 0, f"step {t}: an element inverted"
        assert len(info.problem_converged) == (x.shape[0] if x.dim() == 3 else 1)
        if info.converged:
            assert not failures, f"step {t}: converged but warned: {failures[0].message}"
            assert all(info.problem_converged)
            tol = max(sim.solver_options["atol"], rtol * info.grad_norm_initial)
            # The reference and fused gradients agree to round-off in the force terms they sum.
            slack = 1e3 * eps * (sim._force_scale() + info.grad_norm_initial)
            assert residual_norm(sim, x, v, a, x1) <= 1.01 * tol + slack, f"step {t}: claims convergence"
            outcomes.append("converged")
        else:
            assert failures, f"step {t}: did not converge, and said nothing ({info.message})"
            assert info.message and info.message != "converged"
            assert not all(info.problem_converged)
            if x.dim() == 3:  # a batch: the message names the creatures that failed
                failed = {i for i, ok in enumerate(info.problem_converged) if not ok}
                named = {int(i) for group in re.findall(r"problem\(s\) ([\d, ]+)", info.message)
                         for i in group.replace(",", " ").split()}
                assert failed <= named or len(failed) > 10, f"step {t}: {sorted(failed)} not in {info.message!r}"
            sim.solver_options["on_failure"] = "raise"
            try:
                with pytest.raises(diffsoft.ConvergenceError, match=re.escape(info.message[:40])):
                    sim.step(x, v, a)
            finally:
                sim.solver_options["on_failure"] = "warn"
            outcomes.append("reported")
        x, v = x1.detach(), v1.detach()
    return outcomes


# --- misuse: wrong values at the public entry points ------------------------------------------------------
# Each case passes one argument of one entry point a value from a pool of plausible mistakes (NaN, inf,
# negative, zero, huge, bool, string, None, a list, a tensor of the wrong kind) or of valid look-alikes
# (numpy scalars, ints for floats), the other arguments being valid. The outcome is classified by
# check_misuse: the value must be accepted with a finite result when it is valid, and refused with an error
# that names the argument when it is not.

MISUSE_OUTCOMES = ("right answer", "clear error", "unclear error", "silent", "crash")

_CLEAR = (ValueError, TypeError, OSError, AttributeError)
_MISTAKES = (float("nan"), float("inf"), -float("inf"), -1.0, 0.0, 1e-320, 1e300, True, "1.0", None, [1.0, 2.0],
             complex(1.0, 1.0), torch.tensor([1.0, 2.0]), torch.tensor(1, dtype=torch.int64), 0.5, 2.0, 3)
_LOOK_ALIKES = (np.float32(0.5), np.float64(2.0), np.int64(3), np.float64(0.3), np.int32(1))


def _real(v):
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) and math.isfinite(v)


def _real_or_scalar_tensor(v):
    """A finite real number, or a 0-dim real tensor (the simulator's differentiable constants)."""
    if isinstance(v, torch.Tensor):
        return v.dim() == 0 and not v.is_complex() and v.dtype != torch.bool and bool(torch.isfinite(v))
    return _real(v)


def _positive(v):
    return _real(v) and v > 0


def _normal(v, dtype):
    """A positive number or 0-dim tensor, at least the dtype's smallest normal number."""
    return _real_or_scalar_tensor(v) and v >= torch.finfo(dtype).tiny


def _nonneg(v):
    return _real(v) and v >= 0


def _count(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) and v >= 1


def _unit_open(v):
    return _real(v) and 0 < v < 1


def _min_a(v):
    """A muscles' least activation: in [1e-6, 1) (the least activation a step takes)."""
    return _real(v) and 1e-6 <= v < 1


def _body_args(dtype):
    v, t = rectangle(0.6, 0.2, 3, 1, dtype=dtype)
    return v, t, dict(density=1000.0, youngs_modulus=1e4, poisson_ratio=0.3, muscles=[[0, 6]])


def _soft_body(dtype, **kw):
    v, t, args = _body_args(dtype)
    args.update(kw)
    body = SoftBody(v, t, **args)
    return [getattr(body, name) for name in ("mass", "mu", "lam", "muscle_rest_length", "muscle_stiffness")]


def _step(dtype, dt=0.01, **sim_kw):
    v, t, args = _body_args(dtype)
    sim = Simulator(SoftBody(v, t, **args), dt=dt, **sim_kw)
    return list(sim.step(*sim.rest_state))


def _step_activation(dtype, value):
    v, t, args = _body_args(dtype)
    sim = Simulator(SoftBody(v, t, **args), dt=0.01)
    a = value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        a = torch.tensor([float(value)]).to(dtype)
    return list(sim.step(*sim.rest_state, a))


def _minimize(dtype, **options):
    x = diffsoft.minimize(lambda x, k: 0.5 * (k * x * x).sum() - x.sum(), torch.zeros(3, dtype=dtype),
                          torch.tensor(2.0, dtype=dtype), **options)
    return [x]


def _policy(dtype, **kw):
    from diffsoft.policy import FramePolicy
    args = dict(hidden=8, min_a=0.25, max_abs_da=0.3)
    args.update(kw)
    return list(FramePolicy(4, 2, 2, 0, 1, **args).to(dtype).parameters())


def _config(cls, **kw):
    cls(**kw).check()
    return []


def _render(dtype, rollout=False, **kw):
    v, t, args = _body_args(dtype)
    sim = Simulator(SoftBody(v, t, **args), dt=0.01)
    x = sim.rest_state[0]
    if rollout:
        return render.render_rollout(sim, torch.stack([x, x]), **kw) and []
    return render.render_frame(sim, x, **kw) and []


def _as_json(v):
    """What a file can hold of ``v``: its number(s) for numpy numbers and tensors, else ``v`` itself (a
    string for what JSON cannot write)."""
    if isinstance(v, (np.generic, torch.Tensor)):
        v = v.tolist()
    return str(v) if isinstance(v, complex) else v


def _edit_file(path, key, value, every=False):
    """Rewrites the JSON file ``path`` with ``key`` (``"a.b"`` for a nested key) set to ``value``, or with every
    entry of the list at ``key`` set to it (``every``); NaN and infinities as Python's json writes them."""
    with open(path) as f:
        data = json.load(f)
    *outer, last = key.split(".")
    node = data
    for k in outer:
        node = node[k]
    value = _as_json(value)
    if every:
        node[last] = [[value] * len(r) if isinstance(r, list) else value for r in node[last]]
    else:
        node[last] = value
    with open(path, "w") as f:
        json.dump(data, f)


def _creature_file(dtype, key, value, algovivo=False):
    v, t, args = _body_args(dtype)
    sim = Simulator(SoftBody(v, t, **args), dt=0.01)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "creature.json")
        (creatures.save_algovivo if algovivo else creatures.save)(sim, path)
        _edit_file(path, key, value, every=not key.startswith("simulator.") and key != "min_a")
        loaded = creatures.load_algovivo(path, dtype) if algovivo else creatures.load(path, dtype)
        return list(loaded.step(*loaded.rest_state))


def _policy_file(dtype, key, value):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "policy.json")
        policy.save_algovivo_policy(policy.FramePolicy(4, 2, 2, 0, 1, hidden=8), path)
        if key == "fc1.weight":  # one weight
            with open(path) as f:
                data = json.load(f)
            data["fc1"]["weight"][0][0] = _as_json(value)
            with open(path, "w") as f:
                json.dump(data, f)
        else:
            _edit_file(path, key, value)
        return list(policy.load_algovivo_policy(path, dtype).parameters())


def _json_real(v):
    """A finite real number as a file holds it (a bool is not one)."""
    return _real(_as_json(v))


def _whole(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _within_sqrt_max(v, dtype):
    """What the simulator's dt, ground and friction_eps may be: their squares stay finite in the dtype."""
    return abs(v) <= math.sqrt(torch.finfo(dtype).max)


# (entry point, argument, call(dtype, value) -> tensors to check, valid(value, dtype): should it be accepted?)
MISUSE_TARGETS = (
    [("SoftBody", name, (lambda dtype, v, name=name: _soft_body(dtype, **{name: v})), ok) for name, ok in (
        ("density", _normal), ("youngs_modulus", _normal), ("muscle_stiffness", lambda v, d: v is None or _normal(v, d)),
        ("muscle_rest_length", lambda v, d: v is None or _normal(v, d)),
        ("poisson_ratio", lambda v, d: _real_or_scalar_tensor(v) and 0 <= v < 0.5),
        ("min_a", lambda v, d: _min_a(v)))]
    + [("SoftBody(mass=...)", "mass", lambda dtype, v: _soft_body(dtype, density=None, mass=v), _normal)]
    + [("Simulator", name, (lambda dtype, v, name=name: _step(dtype, **{name: v})), ok) for name, ok in (
        ("gravity", lambda v, d: _real_or_scalar_tensor(v) and v >= 0),
        ("contact_stiffness", lambda v, d: v is None or _normal(v, d)),
        ("friction", lambda v, d: v is None or (_real_or_scalar_tensor(v) and v >= 0)),
        ("friction_eps", lambda v, d: _real_or_scalar_tensor(v) and v >= 0 and _within_sqrt_max(v, d)),
        ("ground", lambda v, d: v is None or (_real_or_scalar_tensor(v) and _within_sqrt_max(v, d))),
        ("max_iter", lambda v, d: _whole(v) and v >= 0), ("rtol", lambda v, d: v is None or _unit_open(v)),
        ("atol", lambda v, d: v is None or _nonneg(v)), ("cg_rtol", lambda v, d: _unit_open(v)),
        ("backward_rtol", lambda v, d: v is None or _unit_open(v)),
        ("dt", lambda v, d: _real_or_scalar_tensor(v) and v > 0 and v * v >= torch.finfo(d).tiny
               and _within_sqrt_max(v, d)))]
    + [("Simulator.step", "activation", _step_activation,
        lambda v, d: v is None or (_real(v) and 1e-6 <= v <= 1))]
    + [("minimize", name, (lambda dtype, v, name=name: _minimize(dtype, **{name: v})), ok) for name, ok in (
        ("rtol", lambda v, d: v is None or _unit_open(v)), ("atol", lambda v, d: _nonneg(v)),
        ("max_iter", lambda v, d: _whole(v) and v >= 0), ("cg_rtol", lambda v, d: _unit_open(v)),
        ("backward_rtol", lambda v, d: v is None or _unit_open(v)),
        ("ls_c1", lambda v, d: _real(v) and 0 < v < 0.5),
        ("ls_shrink", lambda v, d: _unit_open(v)), ("ls_max_iter", lambda v, d: _count(v)),
        ("cg_max_iter", lambda v, d: v is None or _count(v)))]
    + [("mesh.rectangle", name, (lambda dtype, v, name=name: list(rectangle(**{name: v}, dtype=dtype))), ok)
       for name, ok in (("width", lambda v, d: _positive(v)), ("height", lambda v, d: _positive(v)),
                        ("nx", lambda v, d: _count(v)), ("ny", lambda v, d: _count(v)))]
    + [("FramePolicy", name, (lambda dtype, v, name=name: _policy(dtype, **{name: v})), ok) for name, ok in (
        ("min_a", lambda v, d: _min_a(v)), ("max_abs_da", lambda v, d: _positive(v)),
        ("hidden", lambda v, d: _count(v) and v < 1000))]
    + [("PPOConfig", name, (lambda dtype, v, name=name: _config(PPOConfig, **{name: v})), ok) for name, ok in (
        ("lr", lambda v, d: _positive(v)), ("gamma", lambda v, d: _real(v) and 0 <= v <= 1),
        ("lam", lambda v, d: _real(v) and 0 <= v <= 1), ("clip_ratio", lambda v, d: _positive(v)),
        ("entropy_coef", lambda v, d: _nonneg(v)), ("value_coef", lambda v, d: _nonneg(v)),
        ("max_grad_norm", lambda v, d: _positive(v)), ("init_log_std", lambda v, d: _real(v) and -20 <= v <= 2),
        ("min_a", lambda v, d: v is None or _min_a(v)), ("horizon", lambda v, d: _count(v)),
        ("envs", lambda v, d: _count(v)), ("minibatch", lambda v, d: _count(v)), ("epochs", lambda v, d: _count(v)),
        ("steps", lambda v, d: _count(v)), ("seed", lambda v, d: _whole(v) and 0 <= v < 2 ** 32),
        ("dtype", lambda v, d: v in ("float32", "float64") and isinstance(v, str)))]
    + [("TrainConfig", name, (lambda dtype, v, name=name: _config(TrainConfig, **{name: v})), ok) for name, ok in (
        ("lr", lambda v, d: _positive(v)), ("gamma", lambda v, d: _real(v) and 0 <= v <= 1),
        ("backward_rtol", lambda v, d: _unit_open(v)), ("action_noise", lambda v, d: _nonneg(v)),
        ("batch", lambda v, d: _count(v)), ("window", lambda v, d: _count(v) and 256 % v == 0),
        ("iterations", lambda v, d: _whole(v) and v >= 0),
        ("init_activation", lambda v, d: _real(v) and 0 <= v < 1),  # <= 1 - the creature's min_a: train() checks
        ("min_a", lambda v, d: v is None or (_min_a(v) and v <= 0.7)),  # init_activation 0.3 <= 1 - min_a
        ("straight_through", lambda v, d: isinstance(v, bool)),
        ("on_failure", lambda v, d: isinstance(v, str) and v in ("skip", "stop")))]
    + [("render_frame", name, (lambda dtype, v, name=name, wrap=wrap: _render(dtype, **{name: wrap(v)})), ok)
       for name, wrap, ok in (
        ("size", lambda v: (v, 40), lambda v, d: _whole(v) and 1 <= v <= 16384),
        ("bounds", lambda v: (-1.0, v, -1.0, 1.0), lambda v, d: _real(v) and v > -1),
        ("yaw", lambda v: v, lambda v, d: _real(v)), ("pitch", lambda v: v, lambda v, d: _real(v)))]
    + [("render_rollout", name, (lambda dtype, v, name=name: _render(dtype, rollout=True, **{name: v})), ok)
       for name, ok in (("fps", lambda v, d: v is None or _positive(v)), ("every", lambda v, d: _count(v)))]
    + [("creature file", key, (lambda dtype, v, key=key: _creature_file(dtype, key, v)), ok) for key, ok in (
        ("simulator.dt", lambda v, d: _json_real(v) and v > 0 and v * v >= torch.finfo(d).tiny
         and _within_sqrt_max(v, d)),
        ("simulator.gravity", lambda v, d: _json_real(v) and v >= 0),
        ("simulator.ground", lambda v, d: v is None or (_json_real(v) and _within_sqrt_max(v, d))),
        # null: the default, which follows the masses
        ("simulator.contact_stiffness", lambda v, d: v is None or (_json_real(v) and v >= torch.finfo(d).tiny)),
        ("simulator.friction", lambda v, d: v is None or (_json_real(v) and v >= 0)),
        ("simulator.friction_eps", lambda v, d: _json_real(v) and v >= 0 and _within_sqrt_max(v, d)),
        ("mass", lambda v, d: _json_real(v) and v >= torch.finfo(d).tiny),
        ("mu", lambda v, d: _json_real(v) and v >= torch.finfo(d).tiny),
        ("lam", lambda v, d: _json_real(v) and v >= 0),
        ("muscle_rest_length", lambda v, d: _json_real(v) and v >= torch.finfo(d).tiny),
        ("muscle_stiffness", lambda v, d: _json_real(v) and v >= torch.finfo(d).tiny),
        ("min_a", lambda v, d: _json_real(v) and _min_a(v)))]
    + [("algovivo creature file", "l0", lambda dtype, v: _creature_file(dtype, "l0", v, algovivo=True),
        lambda v, d: _json_real(v) and v >= torch.finfo(d).tiny)]
    + [("policy file", key, (lambda dtype, v, key=key: _policy_file(dtype, key, v)), ok) for key, ok in (
        ("min_a", lambda v, d: _json_real(v) and _min_a(v)), ("max_abs_da", lambda v, d: _json_real(v) and v > 0),
        ("center_vertex_id", lambda v, d: _whole(_as_json(v)) and v in (0, 2, 3)),
        ("space_dim", lambda v, d: _whole(_as_json(v)) and v == 2),
        ("fc1.weight", lambda v, d: _json_real(v)))]
)


_PHYSICAL = ("gravity", "contact_stiffness", "friction", "friction_eps", "ground")
# Entry points whose numbers are plain Python numbers, not held in the simulation's dtype.
_PLAIN = ("FramePolicy", "PPOConfig", "TrainConfig", "render_frame", "render_rollout", "policy file")

misuse_cases = st.fixed_dictionaries(dict(
    target=st.integers(0, len(MISUSE_TARGETS) - 1),
    value=st.one_of(st.sampled_from(_MISTAKES + _LOOK_ALIKES), st.floats(-1e3, 1e3), st.integers(-3, 200),
                    st.floats(allow_nan=True, allow_infinity=True)),
    dtype=st.sampled_from([torch.float64, torch.float32])))
"""A misuse case: which target, the value given, the dtype of the rest (random reals and integers, in range
or not, besides the pools of mistakes and look-alikes)."""


def check_misuse(target, value, dtype=torch.float64):
    """Runs one misuse case; returns ``(outcome, detail)`` with outcome one of :data:`MISUSE_OUTCOMES`.

    right answer: a valid value accepted with finite results (a step that did not converge and said so
    counts: failure is reported, not silent); clear error: a value refused with a ValueError, TypeError,
    OSError or AttributeError whose message names the argument; unclear error: any other exception, or one
    that does not name the argument; silent: an invalid value accepted, or a non-finite result without a word;
    crash: the process dies (the campaign then stops, which is how it shows)."""
    entry, name, call, valid = MISUSE_TARGETS[target]
    # A number beyond the dtype's largest is a mistake for anything computed in that dtype (the policy's
    # bounds are plain Python numbers).
    fits = entry in _PLAIN or not _real(value) or abs(float(value)) <= torch.finfo(dtype).max
    # A physical constant is judged as the dtype holds it (a subnormal float64 may be 0 in float32); tolerances
    # and sizes are plain Python numbers.
    physical = (entry.startswith("SoftBody") or entry in ("Simulator.step", "creature file", "algovivo creature file")
                or name in _PHYSICAL) and name != "min_a"  # a controller's bound: a plain Python number
    held = value
    if physical and _real(value) and fits and not _whole(value):
        held = float(torch.tensor(float(value), dtype=torch.float64).to(dtype))
    ok = fits and bool(valid(held, dtype))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            tensors = call(dtype, value)
        except _CLEAR as e:
            # Refused, naming the argument: a clear error, also for a value the predicate took for valid but
            # the library refuses knowingly (a derived quantity that overflows, a state whose energy does).
            # An error about a file names the file too.
            named = name.split(".")[-1] in str(e) and (not entry.endswith("file") or ".json" in str(e))
            why = "refused a valid value" if ok else "refused"
            return ("clear error" if named else "unclear error"), f"{entry}({name}={value!r}) {why}: {type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - any other exception is a finding
            return "unclear error", f"{entry}({name}={value!r}): {type(e).__name__}: {e}"
    warned = any(issubclass(w.category, RuntimeWarning) for w in caught)
    finite = all(torch.isfinite(t).all() for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point())
    if not ok:
        return "silent", f"{entry}({name}={value!r}) was accepted"
    if not finite and not warned:
        return "silent", f"{entry}({name}={value!r}) gave non-finite results without a warning"
    return "right answer", ""
