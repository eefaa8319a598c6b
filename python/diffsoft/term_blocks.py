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
    if term.inner is not None and term.blocks is None:
        return _through_strain(term, x_rows, p, top, hessian)
    u = torch.zeros_like(x_rows, requires_grad=True)
    e = term.energy(x_rows + u, p, top)
    (g,) = torch.autograd.grad(e.sum(), u, create_graph=True)
    if not hessian:
        return g, None
    if term.blocks is not None:
        return g, term.blocks(x_rows, p, top)
    if not g.requires_grad:  # linear in the positions
        return g, x_rows.new_zeros(b, rows, k * d, k * d)
    return g, _columns(g, u).reshape(b, rows, k * d, k * d)


def _through_strain(term, x_rows, p, top, hessian):
    """:func:`term_derivatives` for ``energy = density(strain(x_rows))`` with ``strain`` linear (an element's F):
    the gradient ``J^T grad density`` and the block ``J^T H J``, ``J`` the strain's Jacobian (autograd's, first
    order: ``m`` backward passes through the strain alone) and ``H`` the density's ``m x m`` Hessian (``m``
    double-backward passes through the density alone, not ``kd`` through both)."""
    strain, density = term.inner
    b, rows, k, d = x_rows.shape
    u = torch.zeros_like(x_rows, requires_grad=True)
    z = strain(x_rows + u, p, top)  # (B, K, m), linear in u; its Jacobian keeps a graph to the parameters
    m = z.shape[-1]
    jac = _columns(z, u, rows_out=m, create_graph=True).reshape(b, rows, k * d, m).transpose(-1, -2)  # (B, K, m, kd)
    w = torch.zeros_like(z, requires_grad=True)  # as u: the density's gradient keeps its graph through z
    (gz,) = torch.autograd.grad(density(z + w, p, top).sum(), w, create_graph=True)
    g = (gz[..., None, :] @ jac)[..., 0, :].reshape(b, rows, k, d)
    if not hessian:
        return g, None
    hz = _columns(gz, w).reshape(b, rows, m, m) if gz.requires_grad else gz.new_zeros(b, rows, m, m)
    j = jac.detach()
    return g, j.transpose(-1, -2) @ hz.detach() @ j


def _columns(g, u, rows_out=None, create_graph=False):
    """The columns of each row's Jacobian of ``g`` ``(B, K, m)`` (each row's gradient, m = n by default) with
    respect to ``u`` ``(B, K, ...)`` (n entries per row), ``(B, K, n [row], m [column])`` flattened to
    ``(B, K, n * m)``: one backward pass per output coordinate, its unit vector in every row, batched by torch's
    vmap over the backward where it runs (for a gradient g, the columns of each row's Hessian)."""
    b, rows = u.shape[:2]
    n = u[0, 0].numel()
    m = n if rows_out is None else rows_out
    probes = torch.eye(m, dtype=g.dtype, device=g.device).view(m, 1, 1, *g.shape[2:]).expand(m, *g.shape)
    columns = batched_vjp(g, u, probes, create_graph)
    if columns is None:  # torch cannot batch this graph's backward: one column at a time
        columns = torch.stack([_vjp(g, u, probes[j], create_graph) for j in range(m)])
    # columns[j] = (dg/du)^T e_j for every row: (m, B, K, ...) -> (B, K, n, m)
    return columns.reshape(m, b, rows, n).permute(1, 2, 3, 0).reshape(b, rows, n * m)


def _vjp(g, u, v, create_graph=False):
    (out,) = torch.autograd.grad(g, u, v, retain_graph=True, allow_unused=True, create_graph=create_graph)
    return torch.zeros_like(u) if out is None else out


class BlockHessian:
    """``H v = vertex blocks . v + sum over stencils of scatter(K gather(v))`` on ``(B, F, d)`` free-vertex
    vectors: the blocks of :func:`gradient_and_hessian`."""

    def __init__(self, free, all_free, num_vertices, blocks, vertex):
        self.free, self.all_free, self.num_vertices = free, all_free, num_vertices
        self.blocks = blocks  # [(indices (K, k) into all vertices, K (B, K, kd, kd))]
        self.vertex = vertex  # (B, F, d, d)

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
        out = out + (self.vertex @ vb[..., None])[..., 0]
        return out[0] if squeeze else out
