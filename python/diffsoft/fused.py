"""The backward-Euler step energy as one autograd node with analytic derivatives.

The plain-torch step energy (:func:`diffsoft.energies.reference_step_energy`) is the reference and the oracle of the
tests. Differentiated by double backward, each Hessian-vector product walks its autograd graph of about a
hundred small nodes; Newton-CG makes several per Newton iteration. Here:

- ``StepEnergy`` returns the same value; its backward returns the gradient through ``StepGradient``;
- ``StepGradient`` computes the gradient in closed form, and the Hessian as a sum of local blocks: one dense
  ``(d+1)d x (d+1)d`` block per element, one ``2d x 2d`` block per muscle, and a diagonal for the per-vertex
  terms (inertia, contact, friction). Its backward, the Hessian-vector product, is a gather, one batched
  matrix product and a scatter per block kind: the same few nodes whatever the mesh size.

On CPU tensors the value, gradient, blocks and products come from fused C++ kernels
(``csrc/physics/step_energy.cpp``: one loop over elements and muscles, no autograd graph at all); on other
devices from the vectorised torch ops below, which are also the kernels' second oracle in the tests.

Derivatives with respect to the parameters (masses, Lame parameters, rest shapes, activations, ...) are
needed once per backward step, by the adjoint's vector-Jacobian product, not in Newton's inner loop; on CPU
they come from the same kernels in closed form (first order, and the mixed ``d/dtheta [grad_y E . v]``), on
other devices through the reference energy, which is also their oracle in the tests.

Elasticity, for ``psi(I1, J)`` with ``I1 = tr F^T F`` and ``J = det F`` and ``C = dJ/dF`` (the cofactor):
``P = 2 psi_I1 F + psi_J C`` and
``dP/dF = 2 psi_I1 Id + 4 psi_I1I1 F (x) F + psi_JJ C (x) C + psi_J d2J/dF2``.
With ``F = Ds Dm^-1`` linear in the element's vertices, ``vec F = B x_e`` and the element's block is
``B^T (dP/dF) B``.
"""
import dataclasses

import torch

from ._extension import _C
from ._ops import FIELDS, KernelModel, ops
from .energies import deformation_gradient, determinant, reference_step_energy
from .step import Material, StepParams, per_problem, unpack


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
    # The solver's params are the tensors among ours, in order: which parameter each is, and its shape (the
    # kernels' derivative is summed to it).
    which = [k for k, t in enumerate(p) if isinstance(t, torch.Tensor)]
    shapes = [list(p[k].shape) for k in which]
    return _C.step_analytic_energy(*model.args, model.factor_cache, x0, x0_free, x_hat, act, factorize, which,
                                   shapes)


def step_energy(y, *args):
    """The fused step energy: the arguments (:mod:`diffsoft.step`) and value (one energy per problem of a
    batch) of :func:`~diffsoft.energies.reference_step_energy`."""
    return StepEnergy.apply(y, *args)


class StepEnergy(torch.autograd.Function):
    """The step energy as one autograd node: the value by the kernels (CPU) or the reference; its backward
    is the closed-form gradient (:class:`StepGradient`) and parameter derivatives."""

    @staticmethod
    def forward(ctx, y, *args):
        ctx.save_for_backward(y, *args[:-1])
        ctx.topology = args[-1]
        if _on_cpu(y):
            model, *state = _kernel_args(y, *unpack(args))
            value = ops.step_energy(*model.args, *state)
            return value if y.dim() == 3 else value[0]
        return reference_step_energy(y, *args)

    @staticmethod
    def backward(ctx, grad_e):
        y, *tensors = ctx.saved_tensors
        p, top = StepParams(*tensors), ctx.topology
        g = StepGradient.apply(y, *p, top) if ctx.needs_input_grad[0] else None
        param_grads = [None] * len(p)
        wanted = [i for i in range(len(p)) if ctx.needs_input_grad[1 + i]]
        if wanted and _on_cpu(y):
            # One autograd node, so that a double backward through these gradients (rare) still works.
            grads = StepParamGradient.apply(y, grad_e, wanted, top, *p)
            for i, grad in zip(wanted, grads):
                param_grads[i] = grad
        elif wanted:
            param_grads = _reference_param_grads(y, p, top, wanted, grad_e, order=1)
        return (None if g is None else grad_e[..., None, None] * g, *param_grads, None)


class StepGradient(torch.autograd.Function):
    """The step energy's gradient with respect to ``y`` as one autograd node, keeping the Hessian for its
    backward (Hessian-vector products)."""

    @staticmethod
    def forward(ctx, y, *args):
        p, top = unpack(args)
        if _on_cpu(y):
            model, *state = _kernel_args(y, p, top)
            grad, *blocks = ops.step_energy_derivatives(*model.args, *state)
            grad, hessian = grad.view_as(y), KernelHessian(model, blocks)
        else:
            grad, hessian = _gradient_and_hessian(y, p, top)
        ctx.save_for_backward(y, *p)
        ctx.topology, ctx.hessian = top, hessian
        return grad

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, v):
        y, *tensors = ctx.saved_tensors
        p = StepParams(*tensors)
        hv = ctx.hessian.apply(v) if ctx.needs_input_grad[0] else None
        wanted = [i for i in range(len(p)) if ctx.needs_input_grad[1 + i]]
        param_grads = [None] * len(p)
        if wanted and _on_cpu(y):
            param_grads = _kernel_param_grads(y, p, ctx.topology, wanted, dir=v)
        elif wanted:
            param_grads = _reference_param_grads(y, p, ctx.topology, wanted, v, order=2)
        return (hv, *param_grads, None)


class StepParamGradient(torch.autograd.Function):
    """``weight * dE/dtheta`` for the parameters at the indices ``wanted``, by the C++ kernel; its backward, only
    needed to differentiate these gradients again, goes through the reference energy."""

    @staticmethod
    def forward(ctx, y, weight, wanted, top, *tensors):
        ctx.save_for_backward(y, weight, *tensors)
        ctx.wanted, ctx.topology = wanted, top
        grads = _kernel_param_grads(y, StepParams(*tensors), top, wanted, weight=weight)
        return tuple(grads[i] for i in wanted)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *outs):
        y, weight, *tensors = ctx.saved_tensors
        with torch.enable_grad():
            y_, w_ = y.detach().requires_grad_(), weight.detach().requires_grad_()
            leaf = [isinstance(t, torch.Tensor) and t.is_floating_point() for t in tensors]
            ts = [t.detach().requires_grad_() if is_leaf else t for t, is_leaf in zip(tensors, leaf)]
            e = reference_step_energy(y_, *ts, ctx.topology)
            grads = torch.autograd.grad(e, [ts[i] for i in ctx.wanted], w_, create_graph=True, allow_unused=True)
            pairs = [(g, o) for g, o in zip(grads, outs) if g is not None and g.requires_grad and o is not None]
            inputs = [y_, w_] + [t for t, is_leaf in zip(ts, leaf) if is_leaf]
            back = torch.autograd.grad([g for g, _ in pairs], inputs, [o for _, o in pairs], allow_unused=True) \
                if pairs else [None] * len(inputs)
        back = iter(back)
        y_grad, w_grad = next(back), next(back)
        return (y_grad, w_grad, None, None, *[next(back) if is_leaf else None for is_leaf in leaf])


def _kernel_param_grads(y, p, top, wanted, weight=None, dir=None):
    """The C++ kernel's parameter derivatives (``torch.ops.diffsoft.step_energy_param_grads``) for the parameters
    at the indices ``wanted`` of :class:`~diffsoft.step.StepParams`, summed to each one's shape (a parameter shared by
    a batch gets the sum over its problems): ``weight . dE/dtheta`` (``weight`` shaped like the energy), or
    ``d/dtheta [grad_y E . dir]``."""
    m, yb, x0, x0_free, x_hat, act = _kernel_args(y, p, top)
    if weight is not None:
        weight = weight.detach().reshape(-1).expand(yb.shape[0]).contiguous()
    if dir is not None:
        dir = dir.detach().reshape(yb.shape).contiguous()
    grads = ops.step_energy_param_grads(*m.args, yb, x0, x0_free, x_hat, act, weight, dir)
    out = [None] * len(p)
    for i in wanted:
        out[i] = grads[i].sum_to_size(p[i].shape)
    return out


def _reference_param_grads(y, p, top, wanted, weight, order):
    """Through the reference energy, for the parameters at the indices ``wanted``: ``weight . d/dtheta E``
    (order 1, ``weight`` shaped like the energy; differentiable again when grad mode is on, as in a double
    backward), or ``d/dtheta [grad_y E . weight]`` (order 2)."""
    create_graph = torch.is_grad_enabled()
    with torch.enable_grad():
        if order == 1:
            e = reference_step_energy(y, *p, top)
            grads = torch.autograd.grad(e, [p[i] for i in wanted], weight, allow_unused=True,
                                        create_graph=create_graph)
        else:
            y_ = y.detach().requires_grad_()
            ts = [t if t is None else t.detach().requires_grad_(i in wanted) for i, t in enumerate(p)]
            (g_y,) = torch.autograd.grad(reference_step_energy(y_, *ts, top).sum(), y_, create_graph=True)
            grads = torch.autograd.grad(g_y, [ts[i] for i in wanted], weight, allow_unused=True)
    out = [None] * len(p)
    for i, g in zip(wanted, grads):
        out[i] = g
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
             mu=_values(p.mu, (e,)), lam=_values(p.lam, (e,)), h=_values(p.h), gravity=_values(p.gravity),
             contact_stiffness=_values(p.contact_stiffness), friction=_values(p.friction), ground=_values(p.ground),
             friction_eps=_values(p.friction_eps))
    if top.muscles is not None:
        count = (top.muscles.shape[0],)
        t.update(muscles=top.muscles, rest_length=_values(p.muscle_rest_length, count),
                 stiffness=_values(p.muscle_stiffness, count))
    else:
        t["muscles"] = top.elements.new_zeros(0, 2)
    return KernelModel([t.get(name) for name in FIELDS], top.material.code, top.has_ground, top.factor_cache)


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
    diagonal)``."""

    def __init__(self, model, blocks):
        self.model, self.blocks = model, blocks

    def apply(self, v):
        """``H v`` for ``v`` of shape ``(F, d)`` or ``(B, F, d)``."""
        vb = v if v.dim() == 3 else v.unsqueeze(0)
        return ops.step_energy_hvp(*self.model.args, *self.blocks, vb.contiguous()).view_as(v)


class BlockHessian:
    """``H v = sum_blocks scatter(K_b gather(v)) + diag * v`` on ``(B, F, d)`` free-vertex vectors."""

    def __init__(self, free, all_free, num_vertices, blocks, diag):
        self.free, self.all_free, self.num_vertices = free, all_free, num_vertices
        self.blocks = blocks  # [(indices (E, k) into all vertices, K (B, E, kd, kd))]
        self.diag = diag      # (B, F, d)

    def apply(self, v):
        """``H v`` for ``v`` of shape ``(F, d)`` or ``(B, F, d)``."""
        squeeze = v.dim() == 2
        vb = v.unsqueeze(0) if squeeze else v
        b, _, d = vb.shape
        if self.all_free:
            full = vb
        else:
            full = vb.new_zeros(b, self.num_vertices, d)
            full[:, self.free] = vb
        out = torch.zeros_like(full)
        for idx, k in self.blocks:
            local = full[:, idx].reshape(b, idx.shape[0], -1, 1)
            hv = (k @ local).reshape(b, -1, d)
            out.index_add_(1, idx.reshape(-1), hv)
        out = out if self.all_free else out[:, self.free]
        out = out + self.diag * vb
        return out[0] if squeeze else out


def _gradient_and_hessian(y, p, top):
    """The gradient and a :class:`BlockHessian` in vectorised torch ops (the path on non-CPU devices)."""
    squeeze = y.dim() == 2
    x_hat, x0, x0_free, activation = p.x_hat, p.x0, p.x0_free, p.activation
    if squeeze:
        y, x_hat, x0, x0_free = (t.unsqueeze(0) for t in (y, x_hat, x0, x0_free))
        if activation is not None:
            activation = activation.unsqueeze(0)
    b, _, d = y.shape
    x = top.full_positions(y, x0)
    grad = torch.zeros_like(x)
    blocks = []

    k_el, g_el = _elastic_blocks(x, top.elements, p.Dm_inv, p.mu, p.lam, top.material)
    grad.index_add_(1, top.elements.reshape(-1), g_el.reshape(b, -1, d))
    blocks.append((top.elements, k_el))
    if top.muscles is not None:
        k_mu, g_mu = _muscle_blocks(x, top.muscles, activation, p.muscle_rest_length, p.muscle_stiffness)
        grad.index_add_(1, top.muscles.reshape(-1), g_mu.reshape(b, -1, d))
        blocks.append((top.muscles, k_mu))
    grad = grad if top.all_free else grad[:, top.free]

    # Per vertex: a scalar shared by the batch stays 0-dim, one per problem becomes (B, 1).
    h2, mass = per_problem(p.h * p.h), p.mass
    grad = grad + mass[..., None] * (y - x_hat) / h2[..., None]
    grad[..., 1] = grad[..., 1] + mass * per_problem(p.gravity)
    diag = (mass / h2)[..., None].expand_as(y).clone()
    if top.has_ground:
        ground, kc = per_problem(p.ground), per_problem(p.contact_stiffness)
        depth = torch.clamp(y[..., 1] - ground, max=0.0)
        grad[..., 1] = grad[..., 1] + 2 * kc * depth
        diag[..., 1] = diag[..., 1] + 2 * kc * (depth < 0).to(y.dtype)
        band = torch.clamp(per_problem(p.friction_eps) - (x0_free[..., 1] - ground), min=0.0)
        w = 2 * per_problem(p.friction) * band / h2
        tangential = [0] if d == 2 else [0, 2]
        for c in tangential:
            grad[..., c] = grad[..., c] + w * (y[..., c] - x0_free[..., c])
            diag[..., c] = diag[..., c] + w
    hessian = BlockHessian(top.free, top.all_free, x.shape[1], blocks, diag)
    return (grad[0] if squeeze else grad), hessian


def _elastic_blocks(x, elements, Dm_inv, mu, lam, material):
    """Per-element Hessian blocks ``(B, E, (d+1)d, (d+1)d)`` and gradients ``(B, E, d+1, d)``."""
    d = x.shape[-1]
    F = deformation_gradient(x, elements, Dm_inv)  # (B, E, d, d)
    J = determinant(F)
    C = _cofactor(F)
    i1 = (F * F).sum((-2, -1))
    psi_i1, psi_i1i1, psi_j, psi_jj = _invariant_derivatives(material, i1, J, mu, lam, d)
    P = 2 * psi_i1[..., None, None] * F + psi_j[..., None, None] * C
    f = F.reshape(*F.shape[:-2], d * d)
    c = C.reshape(*C.shape[:-2], d * d)
    eye = torch.eye(d * d, dtype=x.dtype, device=x.device)
    A = (2 * psi_i1[..., None, None] * eye
         + psi_jj[..., None, None] * c[..., :, None] * c[..., None, :]
         + psi_j[..., None, None] * _det_hessian(F))
    if psi_i1i1 is not None:
        A = A + 4 * psi_i1i1[..., None, None] * f[..., :, None] * f[..., None, :]
    # vec F = Bm x_e, Bm[(a, b), (j, c)] = delta_ac W[j, b], W = [-sum_k Dm_inv[k]; Dm_inv] (rows j = vertices)
    W = torch.cat([-Dm_inv.sum(-2, keepdim=True), Dm_inv], dim=-2)  # ([B,] E, d+1, d)
    Bm = torch.einsum("ac,...ejb->...eabjc", torch.eye(d, dtype=x.dtype, device=x.device), W)
    Bm = Bm.reshape(*W.shape[:-2], d * d, (d + 1) * d)
    K = Bm.transpose(-1, -2) @ A @ Bm
    g = (W @ P.transpose(-1, -2))  # (B, E, d+1, d): dE/dx_j,a = sum_b P_ab W_jb
    return K, g


def _invariant_derivatives(material, i1, J, mu, lam, d):
    """``psi_I1, psi_I1I1 (None if 0), psi_J, psi_JJ`` of each material, ``mu, lam`` weights folded in."""
    if material == Material.ALGOVIVO:
        dj = J - 1
        q, dq = dj - 0.5 * dj * dj, 1 - dj
        return 0.5 * mu + 0 * J, None, (lam * q - mu) * dq, mu - lam * q + lam * dq * dq
    if material == Material.NEO_HOOKEAN:
        Jc = torch.where(J > 0, J, torch.ones_like(J))
        log_j = torch.log(Jc)
        return 0.5 * mu + 0 * J, None, (lam * log_j - mu) / Jc, (mu + lam - lam * log_j) / (Jc * Jc)
    if material == Material.STABLE_NEO_HOOKEAN:
        mu_s = (d + 1) / d * mu
        lam_s = lam + (d * (d + 1) - 2) / (d * (d + 1)) * mu
        beta = mu / lam_s
        r = 1.0 / (i1 + 1)
        return 0.5 * mu_s * (1 - r), 0.5 * mu_s * r * r, lam_s * (J - 1 - beta), lam_s + 0 * J
    raise ValueError(f"no fused derivatives for material {material!r}")


_LEVI_CIVITA = {}


def _levi_civita(dtype, device):
    key = (dtype, device)
    if key not in _LEVI_CIVITA:
        e = torch.zeros(3, 3, 3, dtype=dtype, device=device)
        for (i, j, k), sign in {(0, 1, 2): 1, (1, 2, 0): 1, (2, 0, 1): 1, (0, 2, 1): -1, (2, 1, 0): -1,
                                (1, 0, 2): -1}.items():
            e[i, j, k] = sign
        _LEVI_CIVITA[key] = e
    return _LEVI_CIVITA[key]


def _cofactor(F):
    """``dJ/dF``: ``(..., d, d)``."""
    if F.shape[-1] == 2:
        return torch.stack([torch.stack([F[..., 1, 1], -F[..., 1, 0]], -1),
                            torch.stack([-F[..., 0, 1], F[..., 0, 0]], -1)], -2)
    e = _levi_civita(F.dtype, F.device)
    return 0.5 * torch.einsum("acm,ben,...ce,...mn->...ab", e, e, F, F)


def _det_hessian(F):
    """``d2J/dF2`` as ``(..., d*d, d*d)`` over row-major vec F."""
    d = F.shape[-1]
    if d == 2:
        h = torch.zeros(4, 4, dtype=F.dtype, device=F.device)
        h[0, 3] = h[3, 0] = 1.0
        h[1, 2] = h[2, 1] = -1.0
        return h.expand(*F.shape[:-2], 4, 4)
    e = _levi_civita(F.dtype, F.device)
    return torch.einsum("acm,ben,...mn->...abce", e, e, F).reshape(*F.shape[:-2], 9, 9)


def _muscle_blocks(x, muscles, activation, rest_length, stiffness):
    """Per-muscle Hessian blocks ``(B, M, 2d, 2d)`` and gradients ``(B, M, 2, d)`` of
    ``k/2 (l / (a l0) - 1)^2`` with ``l = sqrt(|x_i - x_j|^2 + 1e-6)``."""
    d = x.shape[-1]
    delta = x[:, muscles[:, 0]] - x[:, muscles[:, 1]]  # (B, M, d)
    length = torch.sqrt((delta * delta).sum(-1) + 1e-6)
    target = activation * rest_length
    strain = length / target - 1.0
    k = stiffness * torch.ones_like(strain)
    u = delta / length[..., None]
    g = (k * strain / target)[..., None] * u  # dE/d delta
    outer = u[..., :, None] * u[..., None, :]
    eye = torch.eye(d, dtype=x.dtype, device=x.device)
    kd = ((k / (target * target))[..., None, None] * outer
          + (k * strain / (target * length))[..., None, None] * (eye - outer))
    K = torch.cat([torch.cat([kd, -kd], -1), torch.cat([-kd, kd], -1)], -2)
    return K, torch.stack([g, -g], -2)
