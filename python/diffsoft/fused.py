"""The backward-Euler step energy as one autograd node with analytic derivatives, by the C++ kernels (CPU).

The plain-torch step energy (:func:`diffsoft.energies.reference_step_energy`) is the reference and the oracle of the
tests. Differentiated by double backward, each Hessian-vector product walks its autograd graph of about a
hundred small nodes; Newton-CG makes several per Newton iteration. Here, on CPU tensors:

- ``StepEnergy`` returns the same value (the fused kernels of ``csrc/diffsoft/physics/``, the operators ``torch.ops.diffsoft.*``
  of ``csrc/ops.cpp``: one loop over the registered terms
  stencils, no autograd graph at all); its backward returns the gradient through ``StepGradient``;
- ``StepGradient`` computes the gradient in closed form, and the Hessian as a sum of local blocks (one per
  element, per muscle and per free vertex); its backward, the Hessian-vector product, is the kernels' product of
  those blocks.

Derivatives with respect to the parameters (masses, Lame parameters, rest shapes, activations, colliders, ...) are
needed once per backward step, by the adjoint's vector-Jacobian product, not in Newton's inner loop; they come from
the same kernels in closed form (first order, and the mixed ``d/dtheta [grad_y E . v]``). On other devices
:func:`step_energy` is the reference itself (autograd gives every derivative), and the simulator's torch backend
differentiates the reference's terms (:mod:`diffsoft.term_blocks`): every derivative has one source, the C++ closed
forms or autograd of the reference.

A user's torch terms (:class:`diffsoft.terms.Term`, ``StepTopology.terms``) join the kernels' here: their energies
are added to the value, and their gradients, Hessian blocks and parameter products (by autograd) to the solver's
analytic path (:func:`analytic_energy`).
"""
import dataclasses

import torch

from ._compat import own_graphs
from ._extension import _C
from ._ops import FIELDS, KernelModel, ops
from .energies import reference_step_energy, step_terms, terms_energy
from .step import kernel_params, unpack
from .term_blocks import gradient_and_hessian


def analytic_energy(y, *args, factorize=True):
    """The step energy's autograd-free path for the solver (:func:`diffsoft.minimize`'s ``_analytic``) on
    CPU, or None on other devices: the kernels' value, gradient, Hessian products and Jacobi preconditioner,
    with ``factorize`` a factorization per problem for Newton's steps and the adjoint solve, and the
    backward's parameter derivatives. ``args`` are a step energy's (:mod:`diffsoft.step`); ``y`` only gives
    the shape; the parameters are taken as they are now."""
    if not _on_cpu(y):
        return None
    p, top = unpack(args)
    model, _, x0, x0_free, x_hat, act = _kernel_args(y, p, top)
    # The solver's params are the tensors among ours, in order: which parameter each is (its position in
    # StepParams.flat()), and its shape (the kernels' derivative is summed to it).
    flat = p.flat()
    which = [k for k, t in enumerate(flat) if isinstance(t, torch.Tensor)]
    shapes = [list(flat[k].shape) for k in which]
    extra = _UserTerms(y, p, top) if top.terms else None
    return _C.step_analytic_energy(*model.args, model.factor_cache, x0, x0_free, x_hat, act, factorize, which,
                                   shapes, extra)


class _UserTerms:
    """The user's terms (``top.terms``) for the C++ solver's analytic path (``step_solver.h``'s ExtraTerms), at the
    parameter values ``p``: their energies, gradients and Hessian blocks (:func:`diffsoft.term_blocks.
    gradient_and_hessian`: autograd of their torch energies, or their own blocks) at free positions given as
    ``(B, F d)`` rows, and the backward's product ``d/dtheta [grad E . w]`` for their parameters, by autograd.
    Called by the C++ solver with the GIL taken."""

    def __init__(self, y, p, top):
        self.shape = (-1,) + tuple(y.shape[-2:])
        self.p, self.top = p, top
        self.terms = step_terms(top, builtin=False)
        self.params = [t for term in p.terms for t in term]  # the user's parameters, in StepParams.flat() order

    def _p(self, params):
        return self.p._replace(terms=_regroup(params, self.p.terms))

    def value(self, y_rows):
        with torch.no_grad():
            return terms_energy(y_rows.view(self.shape), self.p, self.top, self.terms)

    def derivatives(self, y_rows):
        with own_graphs():  # autograd's blocks: a graph of the solver's own, whatever hooks the caller set
            grad, hessian = gradient_and_hessian(y_rows.view(self.shape), self.p, self.top, self.terms)
        return grad.detach(), [(rows, k) for rows, k in hessian.blocks]

    def mixed_vjp(self, y_rows, w_rows, wanted):
        """``d/dtheta [grad E . w]`` for the user's parameters at the positions ``wanted``, and for the step's
        ``x0`` (-1) and ``h`` (-2), which the terms read too (their rows at the start, the time step): the C++
        side adds those to the kernels' own."""
        leaves = [t.detach().requires_grad_(j in wanted) for j, t in enumerate(self.params)]
        x0, h = (t.detach().requires_grad_(j in wanted) for t, j in ((self.p.x0, -1), (self.p.h, -2)))
        with torch.enable_grad(), own_graphs():
            grad, _ = gradient_and_hessian(y_rows.view(self.shape), self._p(leaves)._replace(x0=x0, h=h), self.top,
                                           self.terms, hessian=False)
            targets = [x0 if j == -1 else h if j == -2 else leaves[j] for j in wanted]
            grads = torch.autograd.grad(grad, targets, w_rows.view(grad.shape), allow_unused=True)
        return [torch.zeros_like(t) if g is None else g for t, g in zip(targets, grads)]


def _regroup(flat, groups):
    """``flat`` cut into tuples of the lengths of ``groups``'."""
    out, at = [], 0
    for g in groups:
        out.append(tuple(flat[at:at + len(g)]))
        at += len(g)
    return tuple(out)


def step_energy(y, *args):
    """The fused step energy: the arguments (:mod:`diffsoft.step`) and value (one energy per problem of a
    batch) of :func:`~diffsoft.energies.reference_step_energy`: the kernels' terms, plus the user's terms in torch.
    On other devices than the CPU, the reference."""
    if not _on_cpu(y):
        return reference_step_energy(y, *args)
    top = args[-1]
    if not top.terms:
        return StepEnergy.apply(y, *args)
    p, _ = unpack(args)
    return StepEnergy.apply(y, *args[:kernel_params(p)], top) + terms_energy(y, p, top, step_terms(top, builtin=False))


def step_energy_values(ys, *args):
    """:func:`step_energy`'s value at each ``y`` of ``ys``, without autograd (the solver's choice of a start):
    on the CPU without user terms, one kernel call each, skipping the autograd Function's bookkeeping."""
    top = args[-1]
    if not _on_cpu(ys[0]) or top.terms:
        return [step_energy(y, *args) for y in ys]
    p, _ = unpack(args, terms=False)
    return [_kernel_value(y, p, top) for y in ys]


def _kernel_value(y, p, top):
    """The kernels' step energy at ``y``, values only: one per problem, or a scalar for an unbatched ``y``."""
    model, *state = _kernel_args(y, p, top)
    value = ops.step_energy(*model.args, *state)
    return value if y.dim() == 3 else value[0]


class StepEnergy(torch.autograd.Function):
    """The kernels' terms (``args``: :func:`~diffsoft.step.kernel_params` parameters, then the topology)."""

    @staticmethod
    def forward(ctx, y, *args):
        ctx.save_for_backward(y, *args[:-1])
        ctx.topology = args[-1]
        return _kernel_value(y, *unpack(args, terms=False))

    @staticmethod
    def backward(ctx, grad_e):
        y, *flat = ctx.saved_tensors
        top = ctx.topology
        g = StepGradient.apply(y, *flat, top) if ctx.needs_input_grad[0] else None
        param_grads = [None] * len(flat)
        wanted = [i for i in range(len(flat)) if ctx.needs_input_grad[1 + i]]
        if wanted:
            # One autograd node, so that a double backward through these gradients (rare) still works.
            grads = StepParamGradient.apply(y, grad_e, wanted, top, *flat)
            for i, grad in zip(wanted, grads):
                param_grads[i] = grad
        return (None if g is None else grad_e[..., None, None] * g, *param_grads, None)


class StepGradient(torch.autograd.Function):
    """The kernels' terms' gradient with respect to ``y`` as one autograd node, keeping the Hessian's blocks for
    its backward (Hessian-vector products)."""

    @staticmethod
    def forward(ctx, y, *args):
        p, top = unpack(args, terms=False)
        model, *state = _kernel_args(y, p, top)
        grad, *blocks = ops.step_energy_derivatives(*model.args, *state)
        ctx.save_for_backward(y, *args[:-1])
        ctx.topology, ctx.hessian = top, KernelHessian(model, blocks)
        return grad.view_as(y)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, v):
        y, *flat = ctx.saved_tensors
        hv = ctx.hessian.apply(v) if ctx.needs_input_grad[0] else None
        wanted = [i for i in range(len(flat)) if ctx.needs_input_grad[1 + i]]
        param_grads = [None] * len(flat)
        if wanted:
            param_grads = _kernel_param_grads(y, flat, ctx.topology, wanted, dir=v)
        return (hv, *param_grads, None)


class StepParamGradient(torch.autograd.Function):
    """``weight * dE/dtheta`` for the parameters at the indices ``wanted`` (of :meth:`StepParams.flat
    <diffsoft.step.StepParams.flat>`), by the C++ kernel; its backward, only needed to differentiate these
    gradients again, goes through the reference energy."""

    @staticmethod
    def forward(ctx, y, weight, wanted, top, *flat):
        ctx.save_for_backward(y, weight, *flat)
        ctx.wanted, ctx.topology = wanted, top
        grads = _kernel_param_grads(y, flat, top, wanted, weight=weight)
        return tuple(grads[i] for i in wanted)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *outs):
        y, weight, *tensors = ctx.saved_tensors
        with torch.enable_grad():
            y_, w_ = y.detach().requires_grad_(), weight.detach().requires_grad_()
            leaf = [isinstance(t, torch.Tensor) and t.is_floating_point() for t in tensors]
            ts = [t.detach().requires_grad_() if is_leaf else t for t, is_leaf in zip(tensors, leaf)]
            p, top = unpack((*ts, ctx.topology), terms=False)
            e = terms_energy(y_, p, top, step_terms(top, user=False))
            grads = torch.autograd.grad(e, [ts[i] for i in ctx.wanted], w_, create_graph=True, allow_unused=True)
            pairs = [(g, o) for g, o in zip(grads, outs) if g is not None and g.requires_grad and o is not None]
            inputs = [y_, w_] + [t for t, is_leaf in zip(ts, leaf) if is_leaf]
            back = torch.autograd.grad([g for g, _ in pairs], inputs, [o for _, o in pairs], allow_unused=True) \
                if pairs else [None] * len(inputs)
        back = iter(back)
        y_grad, w_grad = next(back), next(back)
        return (y_grad, w_grad, None, None, *[next(back) if is_leaf else None for is_leaf in leaf])


def _kernel_param_grads(y, flat, top, wanted, weight=None, dir=None):
    """The C++ kernel's parameter derivatives (``torch.ops.diffsoft.step_energy_param_grads``) for the parameters at the
    indices ``wanted`` of ``flat`` (:meth:`StepParams.flat <diffsoft.step.StepParams.flat>`), summed to each one's
    shape (a parameter shared by a batch gets the sum over its problems): ``weight . dE/dtheta`` (``weight``
    shaped like the energy), or ``d/dtheta [grad_y E . dir]``."""
    p, _ = unpack((*flat, top), terms=False)
    m, yb, x0, x0_free, x_hat, act = _kernel_args(y, p, top)
    if weight is not None:
        weight = weight.detach().reshape(-1).expand(yb.shape[0]).contiguous()
    if dir is not None:
        dir = dir.detach().reshape(yb.shape).contiguous()
    grads = ops.step_energy_param_grads(*m.args, yb, x0, x0_free, x_hat, act, weight, dir)
    out = [None] * len(flat)
    for i in wanted:
        out[i] = grads[i].sum_to_size(flat[i].shape)
    return out


def _on_cpu(y):
    return y.device.type == "cpu"


def with_kernel_model(top, p):
    """A copy of the topology ``top`` that carries the kernels' model for the parameter values ``p``, so that
    the several kernel calls of one step (and of its backward) build it once."""
    return dataclasses.replace(top, kernel_model=_kernel_model(top, p))


def _kernel_model(top, p):
    # Every parameter as the kernels read it (model.h): its shape when shared by the batch, or one per problem
    # with a leading B (domain randomisation). A 0-dim Lame parameter or muscle stiffness is one value for every
    # element or muscle.
    e = top.elements.shape[0]
    t = dict(elements=top.elements, slot=top.free_index, mass=_values(p.mass), Dm_inv=_values(p.Dm_inv),
             mu=_values(p.mu, (e,)), lam=_values(p.lam, (e,)), h=_values(p.h), gravity=_values(p.gravity))
    if top.muscles is not None:
        count = (top.muscles.shape[0],)
        t.update(muscles=top.muscles, rest_length=_values(p.muscle_rest_length, count),
                 stiffness=_values(p.muscle_stiffness, count))
    else:
        t["muscles"] = top.elements.new_zeros(0, 2)
    return KernelModel([t.get(name) for name in FIELDS], top.material.code, [kind.CODE for kind in top.colliders],
                       [_values(x) for params in p.colliders for x in params], top.factor_cache)


def _values(t, shape=None):
    """``t``'s values, contiguous, expanded from 0-dim to ``shape`` when one is given."""
    t = t.detach()
    return (t.expand(shape) if shape is not None and t.dim() == 0 else t).contiguous()


def _kernel_args(y, p, top):
    """The C++ kernels' arguments: the model and batched ``(y, x0, x0_free, x_hat, activation)``, values only."""
    m = top.kernel_model if top.kernel_model is not None else _kernel_model(top, p)
    y, x0, x0_free, x_hat = y.detach(), p.x0.detach(), p.x0_free.detach(), p.x_hat.detach()
    if y.dim() == 2:
        y, x0, x0_free, x_hat = y[None], x0[None], x0_free[None], x_hat[None]
    # One activation per creature, (B, M); a single (M,) activation is shared by the batch.
    act = p.activation.detach().expand(y.shape[0], -1) if top.muscles is not None else y.new_zeros(0)
    return m, y, x0, x0_free, x_hat, act


class KernelHessian:
    """``H v`` by the C++ kernel from the blocks of ``step_energy_derivatives``: ``(element_blocks, muscle_blocks,
    vertex_blocks)``."""

    def __init__(self, model, blocks):
        self.model, self.blocks = model, blocks

    def apply(self, v):
        """``H v`` for ``v`` of shape ``(F, d)`` or ``(B, F, d)``."""
        vb = v if v.dim() == 3 else v.unsqueeze(0)
        return ops.step_energy_hvp(*self.model.args, *self.blocks, vb.contiguous()).view_as(v)
