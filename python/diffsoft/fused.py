"""The backward-Euler step energy as one autograd node with analytic derivatives.

The plain-torch step energy (:func:`diffsoft.simulator._step_energy`) is the reference and the oracle of the
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
import math
import types

import torch

from ._extension import _C
from .energies import deformation_gradient, determinant

_MATERIAL_CODES = {"algovivo": 0, "neo_hookean": 1, "stable_neo_hookean": 2}


def analytic_energy(y, *params, factorize=True):
    """The step energy's autograd-free fast path for the solver (:func:`diffsoft.minimize`'s ``_analytic``) on
    CPU, or None on other devices: the kernels' value, gradient, Hessian products and Jacobi preconditioner,
    with ``factorize`` a factorization per problem for Newton's steps and the adjoint solve, and the
    backward's parameter derivatives.
    ``y`` only gives the shape; the parameters are taken as they are now."""
    if not _on_cpu(y):
        return None
    model, _, x0, x0_free, x_hat, act = _kernel_args(y, *params)
    # The solver's params are the tensors among ours, in order; the kernel's parameter products follow our order.
    slots = [k for k, p in enumerate(params[:-1]) if isinstance(p, torch.Tensor)]
    shapes = [list(params[k].shape) for k in slots]
    return _C.step_analytic_energy(model, x0, x0_free, x_hat, act, factorize, slots, shapes)


def step_energy(y, *params):
    """The fused step energy: same arguments and value (one energy per problem of a batch) as the reference
    ``_step_energy``."""
    return StepEnergy.apply(y, *params)


class StepEnergy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, *params):
        from .simulator import _step_energy

        ctx.save_for_backward(y, *params[:-1])
        ctx.static = params[-1]
        if _on_cpu(y):
            value = _C.step_energy_value(*_kernel_args(y, *params))
            return value if y.dim() == 3 else value[0]
        return _step_energy(y, *params)

    @staticmethod
    def backward(ctx, grad_e):
        y, *tensors = ctx.saved_tensors
        s = ctx.static
        g = StepGradient.apply(y, *tensors, s) if ctx.needs_input_grad[0] else None
        param_grads = [None] * len(tensors)
        wanted = [i for i, t in enumerate(tensors) if ctx.needs_input_grad[1 + i]]
        if wanted and _on_cpu(y):
            # One autograd node, so that a double backward through these gradients (rare) still works.
            grads = StepParamGradient.apply(y, grad_e, wanted, s, *tensors)
            for i, grad in zip(wanted, grads):
                param_grads[i] = grad
        elif wanted:
            param_grads = _reference_param_grads(y, tensors, s, wanted, grad_e, order=1)
        return (None if g is None else grad_e[..., None, None] * g, *param_grads, None)


class StepGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, *params):
        s = params[-1]
        tensors = params[:-1]
        if _on_cpu(y):
            args = _kernel_args(y, *tensors, s)
            derivatives = _C.step_energy_derivatives(*args)
            grad, hessian = derivatives.grad.view_as(y), KernelHessian(args[0], derivatives)
        else:
            grad, hessian = _gradient_and_hessian(y, *tensors, s)
        ctx.save_for_backward(y, *tensors)
        ctx.static, ctx.hessian = s, hessian
        return grad

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, v):
        y, *tensors = ctx.saved_tensors
        hv = ctx.hessian.apply(v) if ctx.needs_input_grad[0] else None
        wanted = [i for i, t in enumerate(tensors) if ctx.needs_input_grad[1 + i]]
        param_grads = [None] * len(tensors)
        if wanted and _on_cpu(y):
            param_grads = _kernel_param_grads(y, tensors, ctx.static, wanted, dir=v)
        elif wanted:
            param_grads = _reference_param_grads(y, tensors, ctx.static, wanted, v, order=2)
        return (hv, *param_grads, None)


class StepParamGradient(torch.autograd.Function):
    """``weight * dE/dtheta`` for the parameters at the indices ``wanted``, by the C++ kernel; its backward, only
    needed to differentiate these gradients again, goes through the reference energy."""

    @staticmethod
    def forward(ctx, y, weight, wanted, s, *tensors):
        ctx.save_for_backward(y, weight, *tensors)
        ctx.wanted, ctx.static = wanted, s
        grads = _kernel_param_grads(y, tensors, s, wanted, weight=weight)
        return tuple(grads[i] for i in wanted)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *outs):
        from .simulator import _step_energy

        y, weight, *tensors = ctx.saved_tensors
        with torch.enable_grad():
            y_, w_ = y.detach().requires_grad_(), weight.detach().requires_grad_()
            leaf = [isinstance(t, torch.Tensor) and t.is_floating_point() for t in tensors]
            ts = [t.detach().requires_grad_() if is_leaf else t for t, is_leaf in zip(tensors, leaf)]
            e = _step_energy(y_, *ts, ctx.static)
            grads = torch.autograd.grad(e, [ts[i] for i in ctx.wanted], w_, create_graph=True, allow_unused=True)
            pairs = [(g, o) for g, o in zip(grads, outs) if g is not None and g.requires_grad and o is not None]
            inputs = [y_, w_] + [t for t, is_leaf in zip(ts, leaf) if is_leaf]
            back = torch.autograd.grad([g for g, _ in pairs], inputs, [o for _, o in pairs], allow_unused=True) \
                if pairs else [None] * len(inputs)
        back = iter(back)
        y_grad, w_grad = next(back), next(back)
        return (y_grad, w_grad, None, None, *[next(back) if is_leaf else None for is_leaf in leaf])


def _kernel_param_grads(y, tensors, s, wanted, weight=None, dir=None):
    """The C++ kernel's parameter derivatives (see ``_C.step_energy_param_grads``) for the tensors at the indices
    ``wanted``, summed to each tensor's shape (a parameter shared by a batch gets the sum over its problems):
    ``weight . dE/dtheta`` (``weight`` shaped like the energy), or ``d/dtheta [grad_y E . dir]``."""
    m, yb, x0, x0_free, x_hat, act = _kernel_args(y, *tensors, s)
    if weight is not None:
        weight = weight.detach().reshape(-1).expand(yb.shape[0]).contiguous()
    if dir is not None:
        dir = dir.detach().reshape(yb.shape).contiguous()
    grads = _C.step_energy_param_grads(m, yb, x0, x0_free, x_hat, act, weight, dir)
    out = [None] * len(tensors)
    for i in wanted:
        out[i] = grads[i].sum_to_size(tensors[i].shape)
    return out


def _reference_param_grads(y, tensors, s, wanted, weight, order):
    """Through the reference energy, for the tensors at the indices ``wanted``: ``weight . d/dtheta E``
    (order 1, ``weight`` shaped like the energy; differentiable again when grad mode is on, as in a double
    backward), or ``d/dtheta [grad_y E . weight]`` (order 2)."""
    from .simulator import _step_energy

    create_graph = torch.is_grad_enabled()
    with torch.enable_grad():
        if order == 1:
            e = _step_energy(y, *tensors, s)
            grads = torch.autograd.grad(e, [tensors[i] for i in wanted], weight, allow_unused=True,
                                        create_graph=create_graph)
        else:
            y_ = y.detach().requires_grad_()
            ts = [t if t is None else t.detach().requires_grad_(i in wanted) for i, t in enumerate(tensors)]
            (g_y,) = torch.autograd.grad(_step_energy(y_, *ts, s).sum(), y_, create_graph=True)
            grads = torch.autograd.grad(g_y, [ts[i] for i in wanted], weight, allow_unused=True)
    out = [None] * len(tensors)
    for i, g in zip(wanted, grads):
        out[i] = g
    return out


def _on_cpu(y):
    return y.device.type == "cpu"


def with_model(s, mass, Dm_inv, mu, lam, rest_length, stiffness, gravity, contact_stiffness, friction):
    """A copy of the static data ``s`` that carries the kernels' model for these parameter values, so that the
    several kernel calls of one step (and of its backward) build it once."""
    out = types.SimpleNamespace(**vars(s))
    out.model = _model(s, mass, Dm_inv, mu, lam, rest_length, stiffness, gravity, contact_stiffness, friction)
    return out


def _model(s, mass, Dm_inv, mu, lam, rest_length, stiffness, gravity, contact_stiffness, friction):
    m = _C.StepModel()
    m.elements = s.elements
    m.muscles = s.muscles if s.muscles is not None else s.elements.new_zeros(0, 2)
    m.slot = s.slot
    m.mass, m.Dm_inv = mass.detach().contiguous(), Dm_inv.detach().contiguous()
    num_elements = s.elements.shape[0]
    m.mu, m.lam = mu.detach().expand(num_elements).contiguous(), lam.detach().expand(num_elements).contiguous()
    if s.muscles is not None:
        m.rest_length = rest_length.detach().contiguous()
        m.stiffness = stiffness.detach().expand(s.muscles.shape[0]).contiguous()
    m.material = _MATERIAL_CODES[s.material]
    m.factor_cache = getattr(s, "factor_cache", None)
    m.h, m.gravity, m.eps = s.h, float(gravity), s.eps
    m.has_ground = s.ground is not None
    if m.has_ground:
        m.ground, m.contact_stiffness, m.friction = s.ground, float(contact_stiffness), float(friction)
    return m


def _kernel_args(y, x_hat, x0, x0_free, mass, Dm_inv, mu, lam, activation, rest_length, stiffness, gravity,
                 contact_stiffness, friction, s):
    """The C++ kernels' arguments: the model and batched ``(y, x0, x0_free, x_hat, activation)``, values only."""
    m = getattr(s, "model", None)
    if m is None:
        m = _model(s, mass, Dm_inv, mu, lam, rest_length, stiffness, gravity, contact_stiffness, friction)
    if y.dim() == 3:
        y, x0, x0_free, x_hat = y.detach(), x0.detach(), x0_free.detach(), x_hat.detach()
    else:
        y, x0, x0_free, x_hat = y.detach()[None], x0.detach()[None], x0_free.detach()[None], x_hat.detach()[None]
    # One activation per creature, (B, M); a single (M,) activation is shared by the batch.
    act = activation.detach().expand(y.shape[0], -1) if s.muscles is not None else y.new_zeros(0)
    return m, y, x0, x0_free, x_hat, act


class KernelHessian:
    """``H v`` by the C++ kernel from the blocks of ``step_energy_derivatives``."""

    def __init__(self, model, derivatives):
        self.model, self.derivatives = model, derivatives

    def apply(self, v):
        vb = v if v.dim() == 3 else v.unsqueeze(0)
        return _C.step_energy_hvp(self.model, self.derivatives, vb.contiguous()).view_as(v)


class BlockHessian:
    """``H v = sum_blocks scatter(K_b gather(v)) + diag * v`` on ``(B, F, d)`` free-vertex vectors."""

    def __init__(self, free, all_free, num_vertices, blocks, diag):
        self.free, self.all_free, self.num_vertices = free, all_free, num_vertices
        self.blocks = blocks  # [(indices (E, k) into all vertices, K (B, E, kd, kd))]
        self.diag = diag      # (B, F, d)

    def apply(self, v):
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


def _gradient_and_hessian(y, x_hat, x0, x0_free, mass, Dm_inv, mu, lam, activation, rest_length, stiffness,
                          gravity, contact_stiffness, friction, s):
    squeeze = y.dim() == 2
    if squeeze:
        y, x_hat, x0, x0_free = (t.unsqueeze(0) for t in (y, x_hat, x0, x0_free))
        if activation is not None:
            activation = activation.unsqueeze(0)
    b, _, d = y.shape
    x = y if s.all_free else x0.index_copy(1, s.free, y)
    grad = torch.zeros_like(x)
    blocks = []

    k_el, g_el = _elastic_blocks(x, s.elements, Dm_inv, mu, lam, s.material)
    grad.index_add_(1, s.elements.reshape(-1), g_el.reshape(b, -1, d))
    blocks.append((s.elements, k_el))
    if s.muscles is not None:
        k_mu, g_mu = _muscle_blocks(x, s.muscles, activation, rest_length, stiffness)
        grad.index_add_(1, s.muscles.reshape(-1), g_mu.reshape(b, -1, d))
        blocks.append((s.muscles, k_mu))
    grad = grad if s.all_free else grad[:, s.free]

    h2 = s.h * s.h
    m = mass[:, None]
    grad = grad + m * (y - x_hat) / h2
    grad[..., 1] = grad[..., 1] + mass * gravity
    diag = (m / h2).expand_as(y).clone()
    if s.ground is not None:
        depth = torch.clamp(y[..., 1] - s.ground, max=0.0)
        grad[..., 1] = grad[..., 1] + 2 * contact_stiffness * depth
        diag[..., 1] = diag[..., 1] + 2 * contact_stiffness * (depth < 0).to(y.dtype)
        w = 2 * friction * torch.clamp(s.eps - (x0_free[..., 1] - s.ground), min=0.0) / h2
        tangential = [0] if d == 2 else [0, 2]
        for c in tangential:
            grad[..., c] = grad[..., c] + w * (y[..., c] - x0_free[..., c])
            diag[..., c] = diag[..., c] + w
    hessian = BlockHessian(s.free, s.all_free, x.shape[1], blocks, diag)
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
    W = torch.cat([-Dm_inv.sum(-2, keepdim=True), Dm_inv], dim=-2)  # (E, d+1, d)
    Bm = torch.einsum("ac,ejb->eabjc", torch.eye(d, dtype=x.dtype, device=x.device), W)
    Bm = Bm.reshape(W.shape[0], d * d, (d + 1) * d)
    K = Bm.transpose(-1, -2) @ A @ Bm
    g = (W @ P.transpose(-1, -2))  # (B, E, d+1, d): dE/dx_j,a = sum_b P_ab W_jb
    return K, g


def _invariant_derivatives(material, i1, J, mu, lam, d):
    """``psi_I1, psi_I1I1 (None if 0), psi_J, psi_JJ`` of each material, ``mu, lam`` weights folded in."""
    if material == "algovivo":
        dj = J - 1
        q, dq = dj - 0.5 * dj * dj, 1 - dj
        return 0.5 * mu + 0 * J, None, (lam * q - mu) * dq, mu - lam * q + lam * dq * dq
    if material == "neo_hookean":
        Jc = torch.where(J > 0, J, torch.ones_like(J))
        log_j = torch.log(Jc)
        return 0.5 * mu + 0 * J, None, (lam * log_j - mu) / Jc, (mu + lam - lam * log_j) / (Jc * Jc)
    if material == "stable_neo_hookean":
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
