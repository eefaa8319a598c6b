"""The torch backend (``Simulator(backend="torch")``, :mod:`diffsoft.torch_backend`): the C++ path's states and
gradients on a batch of bipeds, gradients against finite differences, the block-Jacobi CG path, honest records
and failures, on every device present (the ``device`` fixture)."""
import contextlib
import warnings

import pytest
import torch

import diffsoft
from diffsoft import torch_backend
from diffsoft.body import SoftBody
from diffsoft.creatures import biped
from diffsoft.mesh import box, rectangle
from diffsoft.simulator import Simulator
from diffsoft.terms import Term

from conftest import F64, TIGHT, small_sim


def _biped_batch(batch, dtype=F64, seed=0):
    """``batch`` bipeds moving sideways and down at different speeds: ground contact and friction act."""
    sim = biped(dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    x, v = sim.rest_state
    x = x.expand(batch, -1, -1).clone()
    v = v.expand(batch, -1, -1) + torch.tensor([0.5, -0.3], dtype=dtype) * torch.rand(batch, 1, 2, generator=g,
                                                                                       dtype=dtype)
    acts = 0.6 + 0.4 * torch.rand(3, batch, sim.body.num_muscles, generator=g, dtype=dtype)
    return sim, x, v, acts


def _rollout_and_grads(sim, x0, v0, acts):
    """Three steps; the final states and the gradients of a loss w.r.t. x0, v0, the activations, the Lame
    parameters, the masses and the muscle stiffnesses."""
    body = sim.body
    leaves = [x0.clone().requires_grad_(), v0.clone().requires_grad_(), acts.clone().requires_grad_()]
    fields = {name: getattr(body, name).detach().clone().requires_grad_() for name in ("mu", "mass",
                                                                                        "muscle_stiffness")}
    for name, t in fields.items():
        setattr(body, name, t)
    x, v = leaves[0], leaves[1]
    for t in range(len(acts)):
        x, v = sim.step(x, v, leaves[2][t])
    loss = (x[..., 0] * x[..., 1]).sum() + (v * v).sum()
    grads = torch.autograd.grad(loss, leaves + list(fields.values()))
    return x.detach(), v.detach(), grads


def test_torch_backend_matches_the_cpp_path_on_64_bipeds(device):
    sim, x0, v0, acts = _biped_batch(64)
    sim.solver_options.update(on_failure="raise")
    ref = _rollout_and_grads(sim, x0, v0, acts)
    sim_t = sim.to(device=device)
    sim_t.backend = "torch"
    out = _rollout_and_grads(sim_t, x0.to(device), v0.to(device), acts.to(device))
    x_ref = ref[0]
    assert (x_ref[..., 1] < 0).any(), "the test must exercise ground contact"
    torch.testing.assert_close(out[0].cpu(), ref[0], rtol=0, atol=1e-8)
    torch.testing.assert_close(out[1].cpu(), ref[1], rtol=0, atol=1e-8 / sim.dt)
    for g_out, g_ref in zip(out[2], ref[2]):
        torch.testing.assert_close(g_out.cpu(), g_ref, rtol=1e-8, atol=1e-8 * g_ref.abs().max().item())


def test_one_material_per_creature_matches_the_cpp_path():
    sim, x0, v0, acts = _biped_batch(4)
    mu0 = sim.body.mu.detach()
    out = {}
    for backend in ("cpp", "torch"):
        sim.backend = backend
        mu = (mu0 * torch.tensor([[0.5], [1.0], [1.5], [2.0]], dtype=F64)).requires_grad_()  # (B, E)
        sim.body.mu = mu
        x1, _ = sim.step(x0, v0, acts[0])
        out[backend] = (x1.detach(), torch.autograd.grad((x1 ** 2).sum(), mu)[0])
    torch.testing.assert_close(out["torch"][0], out["cpp"][0], rtol=0, atol=1e-10)
    torch.testing.assert_close(out["torch"][1], out["cpp"][1], rtol=1e-8, atol=1e-8 * out["cpp"][1].abs().max().item())


_FIELDS = [("mu", "body"), ("lam", "body"), ("mass", "body"), ("Dm_inv", "body"), ("muscle_rest_length", "body"),
           ("muscle_stiffness", "body"), ("gravity", "sim"), ("contact_stiffness", "sim"), ("friction", "sim"),
           ("dt", "sim"), ("ground", "sim"), ("friction_eps", "sim")]


@pytest.mark.parametrize("material,fixed,solver", [("neo_hookean", None, "direct"), ("algovivo", [2], "direct"),
                                                   ("stable_neo_hookean", None, "cg")])
def test_step_gradients_against_finite_differences(material, fixed, solver, device):
    sim = small_sim(material, fixed, device, solver=solver, backend="torch")
    g = torch.Generator().manual_seed(0)
    x0 = sim.body.rest_positions + torch.tensor([0.0, 0.004], dtype=F64, device=device)
    x0 = x0 + 0.003 * torch.randn(x0.shape, generator=g, dtype=F64).to(device)
    v0 = torch.tensor([0.3, -0.4], dtype=F64) + 0.1 * torch.randn(x0.shape, generator=g, dtype=F64)
    v0 = v0.to(device)
    a = torch.tensor([0.7, 0.9], dtype=F64, device=device)
    owners = {"body": sim.body, "sim": sim}
    originals = [torch.as_tensor(getattr(owners[o], name), dtype=F64, device=device).detach().clone()
                 for name, o in _FIELDS]  # dt, ground and friction_eps are kept as numbers until given tensors
    inputs = tuple(t.clone().requires_grad_() for t in [x0, v0, a] + originals)

    def step(x0, v0, a, *values):
        for (name, o), t in zip(_FIELDS, values):
            setattr(owners[o], name, t)
        return sim.step(x0, v0, a)

    x1, _ = step(*inputs)
    assert (x1[:, 1] < 0).any(), "the test must exercise ground contact"
    assert torch.autograd.gradcheck(step, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def _sheet(n, solver, **kw):
    """An n x n vertex neo-Hookean sheet, its left edge clamped, sagging onto the ground."""
    verts, tris = rectangle(width=1.0, height=1.0, nx=n - 1, ny=n - 1, dtype=F64)
    fixed = torch.nonzero(verts[:, 0] == 0).flatten()
    body = SoftBody(verts + torch.tensor([0.0, 0.005], dtype=F64), tris, material="neo_hookean", density=1000.0,
                    youngs_modulus=1e5, poisson_ratio=0.3, fixed=fixed)
    return Simulator(body, dt=1 / 30, solver=solver, **{**TIGHT, **kw})


@pytest.mark.parametrize("keep_factors", [False, True])
def test_block_jacobi_cg_path_matches_the_cpp_path_on_a_larger_body(keep_factors):
    sim = _sheet(12, "cg", keep_factors=keep_factors)  # 264 unknowns
    x0, v0 = sim.rest_state
    v0 = v0 + torch.tensor([0.4, -0.2], dtype=F64)
    out = {}
    for backend in ("cpp", "torch"):
        sim.backend = backend
        x = x0.clone().requires_grad_()
        x1, v1, info = sim.step(x, v0, return_info=True)
        (grad,) = torch.autograd.grad((x1[:, 1] ** 2).sum(), x)
        out[backend] = x1.detach(), grad, info
    info = out["torch"][2]
    assert info.cg_iterations > 0 and info.factorizations == 0
    assert info.converged and info.backward_converged and not info.backward_direct
    assert info.backward_cg_iterations > 0
    torch.testing.assert_close(out["torch"][0], out["cpp"][0], rtol=0, atol=1e-9)
    torch.testing.assert_close(out["torch"][1], out["cpp"][1], rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("solver", ["direct", "cg"])
def test_3d_batch_matches_the_cpp_path(solver):
    v, t = box((0.4, 0.2, 0.2), (2, 1, 1), dtype=F64)
    body = SoftBody(v, t, density=100.0, youngs_modulus=2e3, poisson_ratio=0.3, muscles=[[0, 7], [1, 6]],
                    material="stable_neo_hookean", fixed=[2])
    sim = Simulator(body, dt=0.02, solver=solver, **TIGHT)
    g = torch.Generator().manual_seed(3)
    x0 = (v + 0.004 * torch.tensor([0.0, 1.0, 0.0], dtype=F64)).expand(3, -1, -1).clone()
    v0 = torch.tensor([0.3, -0.4, -0.2], dtype=F64) + 0.1 * torch.randn(x0.shape, generator=g, dtype=F64)
    a = 0.5 + 0.5 * torch.rand(3, 2, generator=g, dtype=F64)
    out = {}
    for backend in ("cpp", "torch"):
        sim.backend = backend
        x, act = x0.clone().requires_grad_(), a.clone().requires_grad_()
        x1, _ = sim.step(x, v0, act)
        out[backend] = (x1.detach(), *torch.autograd.grad((x1[..., 1] ** 2).sum() + x1[..., 0].sum(), [x, act]))
    assert (out["cpp"][0][..., 1] < 0).any(), "the test must exercise ground contact"
    for t_out, t_ref in zip(out["torch"], out["cpp"]):
        torch.testing.assert_close(t_out, t_ref, rtol=1e-8, atol=1e-10)


def test_solver_option_maps_to_a_linear_solver():
    assert torch_backend.linear_solver_for("direct", 10 ** 6) == "cholesky"
    assert torch_backend.linear_solver_for("cg", 10) == "block_jacobi_cg"
    assert torch_backend.linear_solver_for("auto", torch_backend.DENSE_MAX_UNKNOWNS) == "cholesky"
    assert torch_backend.linear_solver_for("auto", torch_backend.DENSE_MAX_UNKNOWNS + 1) == "block_jacobi_cg"
    sim, x0, v0, acts = _biped_batch(2)
    sim.backend = "torch"
    info = sim.step(x0, v0, acts[0], return_info=True)[2]
    assert isinstance(info, diffsoft.SolveInfo) and info.factorizations > 0 and info.cg_iterations == 0
    sim.solver = "cg"
    info = sim.step(x0, v0, acts[0], return_info=True)[2]
    assert info.factorizations == 0 and info.cg_iterations > 0


def test_keep_factors_gives_the_same_gradients():
    sim, x0, v0, acts = _biped_batch(4)
    sim.backend = "torch"
    grads = []
    for keep in (False, True):
        sim.solver_options["keep_factor"] = keep
        x = x0.clone().requires_grad_()
        x1, _, info = sim.step(x, v0, acts[0], return_info=True)
        grads.append(torch.autograd.grad((x1 ** 2).sum(), x)[0])
        assert info.factorizations == info.iterations + keep and info.backward_direct
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-10)


def test_host_checks_every_few_iterations_leave_finished_creatures_where_they_stopped(monkeypatch):
    sim, x0, v0, acts = _biped_batch(8)
    params, top = sim.step_problem(x0, v0, acts[0])
    common = dict(rtol=1e-10, atol=0.0, on_failure="raise")
    y1, info1 = torch_backend.solve_step(params, top, "cholesky", check_every=1, **common)
    reads = []
    for name in ("__bool__", "item", "tolist"):  # every read of a tensor's value on the host
        read = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, read=read: reads.append(1) or read(t, *a))
    y3, info3 = torch_backend.solve_step(params, top, "cholesky", check_every=3, **common)
    monkeypatch.undo()
    assert info3.iterations % 3 == 0 and info3.iterations >= info1.iterations
    assert torch.equal(y1, y3)  # creatures already done are frozen, bit for bit
    # Two reads per check (every creature done; any Hessian not positive definite), the first of which also
    # says whether any creature starts stationary, and one for the record
    assert len(reads) == 2 * info3.iterations // 3 + 2


def test_float32_steps_converge_with_a_float64_adjoint():
    sim, x0, v0, acts = _biped_batch(8, dtype=torch.float32)
    sim.backend = "torch"
    x = x0.clone().requires_grad_()
    x1, _, info = sim.step(x, v0, acts[0], return_info=True)
    (x1 ** 2).sum().backward()
    assert info.converged and info.backward_converged and info.backward_residual <= 1e-10


def test_failures_are_reported_and_raised_with_the_record():
    sim, x0, v0, acts = _biped_batch(4)
    sim.backend = "torch"
    sim.solver_options.update(max_iter=1, rtol=1e-14, atol=0.0)
    with pytest.warns(RuntimeWarning, match="max_iter = 1 Newton iterations reached"):
        _, _, info = sim.step(x0, v0, acts[0], return_info=True)
    assert not info.converged and info.problem_converged == [False] * 4 and info.iterations == 1
    assert info.grad_norm > 0 and "problem(s) 0, 1, 2, 3" in info.message
    sim.solver_options["on_failure"] = "raise"
    with pytest.raises(diffsoft.ConvergenceError, match="Newton did not converge") as caught:
        sim.step(x0, v0, acts[0])
    assert caught.value.info.problem_converged == [False] * 4


def test_adjoint_failure_is_reported_and_raised():
    sim = _sheet(6, "cg", backward_max_iter=1, backend="torch")
    x0, v0 = sim.rest_state
    x = x0.clone().requires_grad_()
    x1, _, info = sim.step(x, v0, return_info=True)
    with pytest.raises(diffsoft.ConvergenceError, match="adjoint solve failed") as caught:
        (x1 ** 2).sum().backward()
    assert caught.value.info is info
    assert info.backward_ran and not info.backward_converged and info.backward_cg_iterations == 1
    assert info.backward_residual > 1e-12


def test_not_positive_definite_rows_take_truncated_cg_steps_as_on_the_cpp_path():
    # An energy made non-convex on purpose: stiff muscles three times longer at rest than the biped's are
    # compressed, and a compressed spring's transverse stiffness is negative: the Hessian is indefinite. Where
    # the Cholesky factorization fails, the direction is truncated CG's (it took the scaled gradient step, which
    # crawls: 100 of them did not leave a saddle that the C++ Newton, by CG there, leaves in a few).
    sim, x0, v0, acts = _biped_batch(4)
    sim.backend = "torch"
    sim.body.muscle_rest_length = sim.body.muscle_rest_length * 3
    sim.body.muscle_stiffness = torch.full_like(sim.body.muscle_stiffness, 3e4)
    sim.solver_options.update(max_iter=3, on_failure="warn")
    with pytest.warns(RuntimeWarning):
        _, _, info = sim.step(x0, v0, acts[0] * 0.5, return_info=True)
    assert info.factorizations == 3 and info.cg_iterations > 0


def test_non_finite_start_is_a_value_error():
    sim, x0, v0, acts = _biped_batch(2)
    sim.backend = "torch"
    v0 = v0.clone()
    v0[1] = 1e300
    with pytest.raises(ValueError, match="not finite at x0"):
        sim.step(x0, v0, acts[0])


def test_backend_option_is_checked():
    body = biped().body
    with pytest.raises(ValueError, match="backend must be"):
        Simulator(body, backend="cuda")
    with pytest.raises(ValueError, match="needs fused=True"):
        Simulator(body, backend="torch", fused=False)
    with pytest.raises(ValueError, match="backend must be"):
        Simulator(body).backend = "gpu"
    sim = Simulator(body, backend="torch")
    x0, v0 = sim.rest_state
    sim.solver_options["max_iter"] = -1
    with pytest.raises(ValueError, match="max_iter must be an integer >= 0"):
        sim.step(x0, v0)
    copy = sim.to("cpu", torch.float64)  # a device first, as torch.Tensor.to
    assert copy.backend == "torch" and copy.body.dtype == torch.float64 and copy.body.device.type == "cpu"


def _bump(x, x0, h, k):
    """A pull on vertex 0 along y that is a maximum at the start and a minimum 0.05 away."""
    y = (x - x0)[..., 0, 1]
    return k * (-0.5 * y ** 2 + 100 * y ** 4)


def _bump_sim(k, **options):
    """A body without muscles, gravity or ground, at rest: its step energy's gradient is 0 at the start, where
    :func:`_bump` makes the Hessian indefinite."""
    v, t = rectangle(0.4, 0.2, 2, 1, dtype=F64)
    body = SoftBody(v, t, material="neo_hookean", density=100.0, youngs_modulus=2e3, poisson_ratio=0.3)
    return Simulator(body, dt=0.02, gravity=0.0, ground=None, terms=[Term(_bump, rows=[[0]], params=(k,))],
                     **{**TIGHT, **options})


def test_a_step_that_starts_at_a_saddle_leaves_it_alike_on_every_path():
    # Newton stopped at such a start at once, returning the saddle as the step. Every path now steps along the
    # negative curvature and goes on to the same minimum, with the same gradients.
    outs = []
    for options in (dict(backend="cpp"), dict(backend="torch"), dict(fused=False)):
        k = torch.tensor(1e5, dtype=F64, requires_grad=True)
        sim = _bump_sim(k, **options)
        x, v = sim.rest_state
        x1, _ = sim.step(x, v)
        (dk,) = torch.autograd.grad(x1[0, 1], k)
        outs.append((x1.detach(), dk))
        assert (x1 - x)[0, 1].abs() > 0.04, options
    for x1, dk in outs[1:]:
        torch.testing.assert_close(x1, outs[0][0], rtol=0, atol=1e-8)
        torch.testing.assert_close(dk, outs[0][1], rtol=1e-6, atol=0)
    # the implicit gradient against central differences of re-solved steps

    def moved(k):
        sim = _bump_sim(torch.tensor(k, dtype=F64))
        return sim.step(*sim.rest_state)[0][0, 1]
    eps = 10.0
    torch.testing.assert_close(outs[0][1], (moved(1e5 + eps) - moved(1e5 - eps)) / (2 * eps), rtol=1e-5, atol=0)


def test_the_adjoint_cg_reports_its_true_residual():
    # In float32 the recurrence's residual drifts from the true one: on an SPD system of condition 1e3 CG claimed
    # 9e-6 (<= rtol 1e-5) where rhs - H x was 3e-5, and the backward reported converged (the C++ adjoint measures
    # it and restarts; on the tetrapod the torch backend claimed 8e-6 at 1e-4). Now it measures and restarts too.
    g = torch.Generator().manual_seed(0)
    n = 300
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=F64))
    A = ((q * torch.logspace(0, 3, n, dtype=F64)) @ q.T).float()
    rhs = torch.randn(2, n, generator=g).float()
    rhs = rhs / rhs.norm(dim=1, keepdim=True)
    rtol = torch.full((2,), 1e-5)
    plain = torch_backend._cg(lambda v: v @ A, rhs, rtol, 3000, lambda r: r, torch.ones(2, dtype=torch.bool),
                              truncate=False, check_every=1)
    assert bool((plain.residual <= rtol).all()) and bool(((rhs - plain.x @ A).norm(dim=1) > 2 * rtol).all())
    x, residual, negative, iterations = torch_backend._measured_cg(lambda v: v @ A, rhs, rtol, 3000, lambda r: r, 1)
    torch.testing.assert_close(residual, (rhs - x @ A).norm(dim=1), rtol=0, atol=0)
    assert bool((residual < (rhs - plain.x @ A).norm(dim=1)).all()) and not negative.any()
    # in float64 the same system meets the tolerance
    x, residual, _, _ = torch_backend._measured_cg(lambda v: v @ A.double(), rhs.double(), rtol.double(), 3000,
                                                     lambda r: r, 1)
    assert bool((residual <= 1e-5).all())


def _trapped_creature_step(path, batch=2):
    """A batch of bipeds whose creature 1 lands, in Newton's first step, where a user Term's gradient is NaN (its
    energy finite: the torch.where / sqrt trap), so that its step stops, named; the loss reads creature 0 only,
    through the shared mu. Returns (dL/dx0, dL/dmu, info)."""
    sim = biped(dtype=F64)
    sim.solver = path.get("solver", "auto")
    if "backend" in path:
        sim.backend = path["backend"]
    mu = sim.body.mu.detach().clone().requires_grad_()
    sim.body.mu = mu
    x, v = (t.expand(2, -1, -1).clone() for t in sim.rest_state)
    v[..., 0] += 0.8
    v[1, :, 1] -= 3.0
    top = int(x[0, :, 1].argmax())
    c = torch.tensor([[-100.0], [float(x[1, top, 1] + sim.dt * v[1, top, 1]) - 0.001]], dtype=F64)

    def trap(y, y0, h, c):
        s = y[..., 0, 1] - c
        return torch.where(s < 0, torch.zeros_like(s), torch.sqrt(s) ** 4)
    sim.terms = [Term(trap, rows=[[top]], params=(c[:batch],))]
    x = x[:batch].clone().requires_grad_()
    with pytest.warns(RuntimeWarning, match="not finite") if batch == 2 else contextlib.nullcontext():
        x1, _, info = sim.step(x, v[:batch], return_info=True)
    x1[0].sum().backward()
    return x.grad, mu.grad, info


@pytest.mark.parametrize("path", [{}, {"backend": "torch", "solver": "direct"}, {"backend": "torch", "solver": "cg"}],
                         ids=["cpp", "torch-direct", "torch-cg"])
def test_a_failed_creature_the_loss_leaves_out_spoils_no_gradient_on_any_backend(path):
    """Found by a review: on the torch backend the left-out creature's NaN Hessian made its zero adjoint NaN (0 x
    NaN), so dL/dx0 of that creature and the shared dL/dmu came back NaN, under a warning that reported the NaN
    residual as a number below the tolerance; the C++ backend gave exact zeros and the one-creature gradient."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the backward itself must not complain
        gx, gmu, info = _trapped_creature_step(path)
    assert info.problem_converged == [True, False]
    assert torch.equal(gx[1], torch.zeros_like(gx[1]))
    _, alone, _ = _trapped_creature_step(path, batch=1)
    torch.testing.assert_close(gmu, alone, rtol=1e-12, atol=1e-14)


def test_solver_options_of_the_other_backend_and_non_finite_states_are_named():
    """Found by a review: ls_* on the torch backend and check_every on the C++ one were torch's TypeError naming an
    internal function; a NaN in one creature's state was "the energy overflows" or "element 0 is inverted"
    depending on the backend; an empty batch reached torch's max()."""
    for backend, key, value in (("torch", "ls_max_iter", 5), ("cpp", "check_every", 2)):
        sim = small_sim()
        sim.backend = backend
        sim.solver_options[key] = value
        with pytest.raises(ValueError, match=rf"sim.solver_options\['{key}'\] is the .* option, and this step runs on"):
            sim.step(*sim.rest_state)
    sim = small_sim()
    sim.solver_options["tolerance"] = 1e-3
    with pytest.raises(ValueError, match=r"sim.solver_options\['tolerance'\] is no solver option"):
        sim.step(*sim.rest_state)
    for backend in ("cpp", "torch"):
        sim = small_sim(backend=backend)
        x, v = (t.expand(3, -1, -1).clone() for t in sim.rest_state)
        x[2, 1, 0] = float("nan")
        with pytest.raises(ValueError, match=r"x0 has non-finite \(NaN or infinite\) values for creature\(s\) \[2\]"):
            sim.step(x, v)
        with pytest.raises(ValueError, match=r"x0 holds no creatures \(a batch of 0\)"):
            sim.step(x[:0], v[:0])
