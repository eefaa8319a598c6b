"""The fused step kernels as registered operators, ``torch.ops.diffsoft.*`` (csrc/ops.cpp, diffsoft._ops): what
they compute is the step energy's (the reference energy's value, gradient and Hessian products), bad input is a
ValueError naming it, and on torch 2.x ``torch.library.opcheck`` passes on each (schema, fake implementation,
autograd registration, AOT dispatch with dynamic shapes)."""
import pytest
import torch

import diffsoft
from diffsoft import _ops, fused
from diffsoft._compat import TORCH_VERSION
from diffsoft.energies import reference_step_energy

from conftest import F64

OPS = ("step_energy", "step_energy_derivatives", "step_energy_hvp", "step_energy_param_grads")


def _sample(creature, dtype, batch=2, requires_grad=False, seed=0):
    """The operators' arguments at a perturbed state of a creature: model, the state, and the step problem."""
    sim = getattr(diffsoft.creatures, creature)(dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    x, v = sim.rest_state
    x = x + 0.01 * torch.randn(batch, *x.shape, generator=gen, dtype=dtype)
    v = 0.1 * torch.randn(batch, *v.shape, generator=gen, dtype=dtype)
    a = 0.5 + 0.5 * torch.rand(batch, sim.body.num_muscles, generator=gen, dtype=dtype)
    p, top = sim.step_problem(x, v, a)
    y = p.x_hat + 0.01 * torch.randn(p.x_hat.shape, generator=gen, dtype=dtype)
    model, *state = fused._kernel_args(y, p, top)
    if requires_grad:
        state = [t.detach().requires_grad_() for t in state]
    return model, state, (y, p, top)


def test_the_operators_are_registered():
    for name in OPS:
        assert hasattr(torch.ops.diffsoft, name), name


@pytest.mark.parametrize("creature", ["biped", "tetrapod"])
def test_operators_give_the_reference_energy_and_its_derivatives(creature):
    model, state, (y, p, top) = _sample(creature, F64)
    value = _ops.ops.step_energy(*model.args, *state)
    flat = p.flat()
    torch.testing.assert_close(value, reference_step_energy(y, *flat, top), rtol=1e-12, atol=0)
    grad, *blocks = _ops.ops.step_energy_derivatives(*model.args, *state)
    y_ = y.detach().requires_grad_()
    (g_ref,) = torch.autograd.grad(reference_step_energy(y_, *flat, top).sum(), y_, create_graph=True)
    torch.testing.assert_close(grad, g_ref.detach(), rtol=1e-10, atol=1e-10 * g_ref.abs().max().item())
    v = torch.randn_like(y)
    hv = _ops.ops.step_energy_hvp(*model.args, *blocks, v)
    (hv_ref,) = torch.autograd.grad(g_ref, y_, v)
    torch.testing.assert_close(hv, hv_ref, rtol=1e-10, atol=1e-10 * hv_ref.abs().max().item())
    weight = torch.tensor([0.5, 2.0], dtype=F64)
    grads = _ops.ops.step_energy_param_grads(*model.args, *state, weight, None)
    assert len(grads) == len(flat)  # the body's and the state's, then the ground's (a plane's)
    leaves = [t.detach().requires_grad_() if isinstance(t, torch.Tensor) else t for t in flat]
    wanted = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
    refs = torch.autograd.grad(reference_step_energy(y, *leaves, top) @ weight, [leaves[i] for i in wanted],
                               allow_unused=True)
    for i, ref in zip(wanted, refs):
        ref = torch.zeros_like(leaves[i]) if ref is None else ref
        torch.testing.assert_close(grads[i].sum_to_size(ref.shape), ref, rtol=1e-10,
                                   atol=1e-10 * max(ref.abs().max().item(), 1.0), msg=f"parameter {i}")


# torch 1.13's operator calls turn every C++ exception into a RuntimeError; torch 2.x keeps c10's ValueError.
BAD_INPUT = ValueError if TORCH_VERSION >= (2, 0) else RuntimeError


def test_bad_arguments_are_errors_naming_them():
    model, state, _ = _sample("biped", F64)
    kinds, params = model.collider_kinds, model.collider_params
    with pytest.raises(BAD_INPUT, match="the step model must be 11 tensors"):
        _ops.ops.step_energy(model.tensors[:-1], model.material, kinds, params, *state)
    with pytest.raises(BAD_INPUT, match="material must be 0"):
        _ops.ops.step_energy(model.tensors, 7, kinds, params, *state)
    with pytest.raises(BAD_INPUT, match="collider kind 9 is not in"):
        _ops.ops.step_energy(model.tensors, model.material, [9], params, *state)
    with pytest.raises(BAD_INPUT, match="the colliders' kinds take 5 parameters, but 4 were given"):
        _ops.ops.step_energy(model.tensors, model.material, kinds, params[:-1], *state)
    with pytest.raises(BAD_INPUT, match="x0 must be"):
        _ops.ops.step_energy(*model.args, state[0], state[1][:, :-1], *state[2:])
    grad, *blocks = _ops.ops.step_energy_derivatives(*model.args, *state)
    with pytest.raises(BAD_INPUT, match="element_blocks"):
        _ops.ops.step_energy_hvp(*model.args, blocks[0][:, :-1], *blocks[1:], grad)
    # The model's topology, which the loops read as raw pointers (a review: muscles (M, 3) gave another energy,
    # (M, 1) and (M,) a segfault; the hvp checked no index, and crashed or wrote out of bounds; a slot mapping
    # two vertices to one row, or swapping rows, gave other energies).
    elements, muscles, slot = model.tensors[:3]
    for name, bad, why in (("muscles", torch.cat([muscles, muscles[:, :1]], 1), r"muscles must be \(M, 2\)"),
                           ("muscles", muscles[:, 0], r"muscles must be \(M, 2\)"),
                           ("elements", torch.full_like(elements, 10 ** 6), "vertex index out of range"),
                           ("slot", torch.full_like(slot, 10 ** 7), "slot refers to a free vertex beyond y"),
                           ("slot", torch.cat([slot[:1], slot[:1], slot[2:]]), "slot maps two vertices to free row"),
                           ("slot", slot[:3].clone(), "vertex index out of range")):
        tensors = list(model.tensors)
        tensors[_ops.FIELDS.index(name)] = bad
        with pytest.raises(BAD_INPUT, match=why.split("|")[0]):
            _ops.ops.step_energy(tensors, model.material, kinds, params, *state)
        with pytest.raises(BAD_INPUT, match=why.split("|")[-1]):
            _ops.ops.step_energy_hvp(tensors, model.material, kinds, params, *blocks, grad)
    with pytest.raises(BAD_INPUT, match=r"x0 must be a CPU tensor of y's dtype \(Double\), got Float"):
        _ops.ops.step_energy(*model.args, state[0], state[1].float(), *state[2:])
    with pytest.raises(BAD_INPUT, match=r"give weight .* or dir .*, not both"):  # (dir silently won)
        _ops.ops.step_energy_param_grads(*model.args, *state, torch.ones(2, dtype=F64), grad)
    with pytest.raises(BAD_INPUT, match=r"activation must be a CPU tensor of y's dtype"):
        _ops.ops.step_energy(*model.args, *state[:-1], state[-1].long())
    if TORCH_VERSION >= (2, 1):  # (a meta tensor among CPU ones ran the fake as the Meta kernel: CPU garbage)
        with pytest.raises(BAD_INPUT, match="x0 is on meta but the state is on cpu"):
            _ops.ops.step_energy(*model.args, state[0], state[1].to("meta"), *state[2:])


@pytest.mark.parametrize("name", OPS)
def test_asked_for_a_derivative_an_operator_refuses_by_name(name):
    model, state, _ = _sample("biped", F64, requires_grad=True)
    grad, *blocks = _ops.ops.step_energy_derivatives(*model.args, *[t.detach() for t in state])
    args = {"step_energy_hvp": (*model.args, *blocks, state[0]),
            "step_energy_param_grads": (*model.args, *state, torch.ones(2, dtype=F64), None)}.get(
        name, (*model.args, *state))
    with pytest.raises(RuntimeError, match=f"diffsoft::{name} is a kernel without derivatives of its own"):
        getattr(_ops.ops, name)(*args)
    with torch.no_grad():
        getattr(_ops.ops, name)(*args)


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch >= 2.4")
@pytest.mark.parametrize("creature", ["biped", "tetrapod"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", OPS)
def test_opcheck(name, dtype, creature):
    """Schema, fake implementation and AOT dispatch with dynamic shapes on inputs without gradients, then the
    autograd registration on inputs that require grad."""
    model, state, _ = _sample(creature, dtype)
    op = getattr(torch.ops.diffsoft, name)
    if name == "step_energy_hvp":
        grad, *blocks = _ops.ops.step_energy_derivatives(*model.args, *state)
        args = (*model.args, *blocks, torch.randn_like(grad))
    elif name == "step_energy_param_grads":
        args = (*model.args, *state, torch.ones(state[0].shape[0], dtype=dtype), None)
    else:
        args = (*model.args, *state)
    torch.library.opcheck(op, args)
    with_grad = [a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args]
    torch.library.opcheck(op, with_grad, test_utils="test_autograd_registration")
