"""minimize(..., sparsity=) with its coloured probes batched (several Hessian-vector products per autograd call,
``probe_batch``): the same Hessian, factor, Newton iterates and gradients as one probe per call, and one probe
per call wherever torch cannot batch the energy's backward."""
import pytest
import torch
from torch.autograd import gradcheck

import diffsoft
from diffsoft import _compat, _minimize
from diffsoft.energies import elastic_energy

from conftest import F64


def _sheet(nx, ny):
    verts, tris = diffsoft.mesh.rectangle(width=1.0, height=0.5, nx=nx, ny=ny, dtype=F64)
    return diffsoft.SoftBody(verts, tris, density=100.0, youngs_modulus=1e3, poisson_ratio=0.3)


def neo_hookean(body):
    """A neo-Hookean sheet's step energy in plain torch: indexing ops, which torch 1.13's vmap loops over."""

    def energy(x, x_hat, mu, pull):
        inertia = 0.5 * (body.mass[:, None] * (x - x_hat) ** 2).sum((-2, -1)) / 0.01 ** 2
        e = elastic_energy(x, body.elements, body.Dm_inv, mu, body.lam, body.material, body.rest_volume)
        return inertia + e - pull * x[..., -1, 0]

    return energy


def chain(body):
    """Springs between consecutive vertices, in slices and elementwise ops only: all have vmap batching rules.
    Its sparsity pattern is the consecutive pairs."""

    def energy(x, x_hat, mu, pull):
        s = (x[..., 1:, :] - x[..., :-1, :]).square().sum(-1)
        springs = mu.mean() * (0.25 * s.square() + 0.5 * s).sum(-1)
        return springs + 50.0 * (x - x_hat).square().sum((-2, -1)) - pull * x[..., -1, 0]

    n = body.num_vertices
    return energy, torch.stack([torch.arange(n - 1), torch.arange(1, n)], 1)


class _Doubled(torch.autograd.Function):
    """2 t, with a backward that reads its gradient's data (through numpy), which torch's vmap cannot batch."""

    @staticmethod
    def forward(ctx, t):
        return 2 * t

    @staticmethod
    def backward(ctx, g):
        return torch.from_numpy(2 * g.detach().numpy())


class _Square(torch.autograd.Function):
    """t^2, whose gradient is made by _Doubled: its Hessian-vector products run _Doubled.backward."""

    @staticmethod
    def forward(ctx, t):
        ctx.save_for_backward(t)
        return t * t

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        return g * _Doubled.apply(t)


def unbatchable(body):
    """The neo-Hookean energy plus springs along the triangles' edges, squared by _Square."""
    edges = body.elements[:, [0, 1, 1, 2, 2, 0]].reshape(-1, 2)
    sheet = neo_hookean(body)

    def energy(x, x_hat, mu, pull):
        d = x[..., edges[:, 0], :] - x[..., edges[:, 1], :]
        return sheet(x, x_hat, mu, pull) + 5.0 * _Square.apply(d).sum((-2, -1))

    return energy


@pytest.fixture
def vjp_calls(monkeypatch):
    """Records each batched call of minimize: (its number of probes, whether torch batched it)."""
    calls = []

    def recording(output, input, v):
        out = _compat.batched_vjp(output, input, v)
        calls.append((v.shape[0], out is not None))
        return out

    monkeypatch.setattr(_minimize, "batched_vjp", recording)
    return calls


def _solve(energy, body, probe_batch, batched=False, pattern=None):
    x_hat = body.rest_positions * 1.05
    if batched:
        x_hat = torch.stack([x_hat, body.rest_positions * 0.97])
    x_hat = x_hat.requires_grad_()
    mu = body.mu.clone().requires_grad_()
    pull = torch.tensor(3.0, dtype=F64, requires_grad=True)
    pattern = body.elements if pattern is None else pattern
    x, info = diffsoft.minimize(energy, x_hat.detach(), x_hat, mu, pull, sparsity=pattern, batched=batched,
                                probe_batch=probe_batch, rtol=1e-11, return_info=True, on_failure="raise")
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=F64)
    return x, torch.autograd.grad((w * x).sum(), (x_hat, mu, pull)), info


def _assert_same_solve(got, want):
    """The same probes, so the same factors: the same Newton iterations, factorizations and products, and
    iterates and gradients equal to round-off."""
    (x, g, i), (x_ref, g_ref, i_ref) = got, want
    assert (i.iterations, i.factorizations, i.hvp_count) == (i_ref.iterations, i_ref.factorizations, i_ref.hvp_count)
    torch.testing.assert_close(x, x_ref, rtol=0, atol=1e-12)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12 * b.abs().max().item())


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch of 2"])
@pytest.mark.parametrize("which", ["neo_hookean", "chain"])
def test_batched_probes_give_the_sequential_hessian_iterates_and_gradients(vjp_calls, batched, which):
    body = _sheet(5, 3)
    energy, pattern = (neo_hookean(body), None) if which == "neo_hookean" else chain(body)
    one = _solve(energy, body, probe_batch=1, batched=batched, pattern=pattern)
    assert not vjp_calls  # probe_batch=1: one Hessian-vector product per autograd call
    four = _solve(energy, body, probe_batch=4, batched=batched, pattern=pattern)
    assert vjp_calls and all(k <= 4 and ok for k, ok in vjp_calls)
    assert any(k > 1 for k, _ in vjp_calls)
    _assert_same_solve(four, one)
    assert one[2].cg_iterations == four[2].cg_iterations == 0 and four[2].backward_direct


def test_an_energy_torch_cannot_batch_falls_back_to_one_probe_per_call(vjp_calls):
    body = _sheet(5, 3)
    energy = unbatchable(body)
    one = _solve(energy, body, probe_batch=1)
    eight = _solve(energy, body, probe_batch=8)
    assert vjp_calls[0] == (8, False)  # declined once; the solve's other probes go one at a time
    assert len(vjp_calls) == 1
    _assert_same_solve(eight, one)
    assert eight[2].cg_iterations == 0


def test_probe_batch_measured_gives_the_same_results(vjp_calls):
    body = _sheet(5, 3)
    energy = neo_hookean(body)
    one = _solve(energy, body, probe_batch=1)
    measured = _solve(energy, body, probe_batch=None)
    assert vjp_calls[0][0] == 2  # after two probes alone, a batch of 2, whichever way it then goes
    _assert_same_solve(measured, one)


def test_gradcheck_through_batched_probes(vjp_calls):
    body = _sheet(3, 2)
    energy = neo_hookean(body)

    def solve(x_hat, mu, pull):
        return diffsoft.minimize(energy, body.rest_positions, x_hat, mu, pull, sparsity=body.elements, probe_batch=6,
                                 rtol=1e-13, backward_rtol=1e-13, on_failure="raise")

    args = ((body.rest_positions * 1.05).requires_grad_(), body.mu.clone().requires_grad_(),
            torch.tensor(3.0, dtype=F64, requires_grad=True))
    assert gradcheck(solve, args, eps=1e-6, atol=1e-6, rtol=1e-5)
    assert any(k > 1 and ok for k, ok in vjp_calls)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_bad_probe_batch_is_refused_by_name(bad):
    body = _sheet(3, 2)
    with pytest.raises(ValueError, match="probe_batch must be None or an integer >= 1"):
        diffsoft.minimize(neo_hookean(body), body.rest_positions, body.rest_positions, body.mu,
                          torch.tensor(1.0, dtype=F64), sparsity=body.elements, probe_batch=bad)


def test_a_batch_factors_to_the_same_bits_on_one_thread_and_on_two():
    """The batch's matrices are assembled and factored on its threads (core/parallel.h; conftest.py splits every
    batch): the same iterates and gradients, bit for bit, as on one thread."""
    body = _sheet(5, 3)
    before = torch.get_num_threads()  # the loops' count; OpenBLAS's (diffsoft.threads) is left as it is
    try:
        torch.set_num_threads(1)
        one = _solve(neo_hookean(body), body, probe_batch=4, batched=True)
        torch.set_num_threads(2)
        two = _solve(neo_hookean(body), body, probe_batch=4, batched=True)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one[0], two[0]) and all(torch.equal(a, b) for a, b in zip(one[1], two[1]))
    assert one[2].factorizations == two[2].factorizations > 0
