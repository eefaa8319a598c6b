"""The step energy's gradient and Hessian blocks by autograd of its torch reference, term by term, on any device:
the derivatives of the simulator's torch backend (:mod:`diffsoft.torch_backend`), and of a user's terms on the
C++ path (:mod:`diffsoft.fused`). The C++ kernels' closed forms are the other source of the same derivatives
(their tests compare the two); nothing here is written by hand.

Each term of :func:`diffsoft.energies.step_terms` is a sum over the rows of its stencil (elements, muscles, free
vertices, a user's rows), each row's energy a function of its own vertices' positions. Differentiating the sum
with respect to a per-row copy of the positions, ``x_rows + u`` at ``u = 0``, gives every row's gradient at once
(each row reads only its own copy), and the ``k d`` columns of every row's ``kd x kd`` Hessian block by as many
double-backward passes, each with one local coordinate's unit vector in every row (or one batched pass, where
torch's vmap over the backward runs the graph). The blocks are those the C++ kernels assemble (``model.h``): the
Hessian is their sum, scattered to the free vertices.
"""
import torch

from ._compat import batched_vjp
from .energies import step_terms, term_rows


def gradient_and_hessian(y, p, top, terms=None, hessian=True):
    """The gradient ``(B, F, d)`` and a :class:`BlockHessian` of the step energy (or of ``terms``, a subset of
    :func:`~diffsoft.energies.step_terms`) at the free positions ``y`` ``(B, F, d)``, for the parameters ``p``
    (:class:`~diffsoft.step.StepParams`). The gradient keeps a graph to every parameter that requires grad (the
    backward's vector-Jacobian product goes through it); the blocks do not. ``hessian=False``: the gradient
    alone (the Hessian None)."""
    b, f, d = y.shape
    y = y.detach()
    with torch.enable_grad():
        x = top.full_positions(y, p.x0)
        grad = y.new_zeros(b, top.free_index.shape[0], d)
        free_grad = y.new_zeros(b, f, d)
        blocks, vertex = [], y.new_zeros(b, f, d, d)
        for term in step_terms(top) if terms is None else terms:
            rows = term.rows(top)
            x_rows = term_rows(term, y, x, top)
            g, k = term_derivatives(term, x_rows, p, top, hessian)
            if rows is None:  # one row per free vertex
                free_grad = free_grad + g[:, :, 0]
                vertex = vertex if k is None else vertex + k.detach()
            else:
                grad = grad.index_add(1, rows.reshape(-1), g.reshape(b, -1, d))
                blocks.append((rows, None if k is None else k.detach()))
        grad = (grad if top.all_free else grad[:, top.free]) + free_grad
    if not hessian:
        return grad, None
    return grad, BlockHessian(top.free, top.all_free, top.free_index.shape[0], blocks, vertex)


def term_derivatives(term, x_rows, p, top, hessian=True):
    """One term's per-row gradients ``(B, K, k, d)`` (with their graph to the parameters) and Hessian blocks
    ``(B, K, kd, kd)`` (None without ``hessian``) at the rows' positions ``x_rows`` ``(B, K, k, d)``: the term's
    own ``blocks`` where it has them, else by autograd (see the module docstring)."""
    b, rows, k, d = x_rows.shape
    u = torch.zeros_like(x_rows, requires_grad=True)
    e = term.energy(x_rows + u, p, top)
    (g,) = torch.autograd.grad(e.sum(), u, create_graph=True)
    if not hessian:
        return g, None
    if term.blocks is not None:
        return g, term.blocks(x_rows, p, top)
    kd = k * d
    if not g.requires_grad:  # linear in the positions
        return g, x_rows.new_zeros(b, rows, kd, kd)
    probes = torch.eye(kd, dtype=x_rows.dtype, device=x_rows.device).view(kd, 1, 1, k, d).expand(kd, b, rows, k, d)
    columns = batched_vjp(g, u, probes)
    if columns is None:  # torch cannot batch this graph's backward: one column at a time
        columns = torch.stack([_vjp(g, u, probes[j]) for j in range(kd)])
    # columns[j] = H e_j for every row: (kd, B, K, k, d) -> (B, K, kd [row], kd [column])
    return g, columns.reshape(kd, b, rows, kd).permute(1, 2, 3, 0)


def _vjp(g, u, v):
    (out,) = torch.autograd.grad(g, u, v, retain_graph=True, allow_unused=True)
    return torch.zeros_like(u) if out is None else out


class BlockHessian:
    """``H v = vertex blocks . v + sum over stencils of scatter(K gather(v))`` on ``(B, F, d)`` free-vertex
    vectors: the blocks of :func:`gradient_and_hessian`."""

    def __init__(self, free, all_free, num_vertices, blocks, vertex):
        self.free, self.all_free, self.num_vertices = free, all_free, num_vertices
        self.blocks = blocks  # [(indices (K, k) into all vertices, K (B, K, kd, kd))]
        self.vertex = vertex  # (B, F, d, d)

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
        out = out + (self.vertex @ vb[..., None])[..., 0]
        return out[0] if squeeze else out
