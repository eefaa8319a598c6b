"""A user's energy terms in torch, joining a simulator's step: ``Simulator(body, ..., terms=[Term(...)])``.

A term is a potential energy ``U(x)`` summed over rows of vertices (its stencil): the step minimises
``1/(2 h^2) |x - x_hat|^2_M + U_builtin(x) + U_user(x)``, so the term's force is ``-dU/dx``. It runs next to the
built-in terms on both backends: on the C++ one its value, gradient and Hessian blocks (by autograd, or the
user's own blocks) join the fused kernels' in every Newton step and factorization, and its parameter products
join the kernels' closed forms in the implicit backward; on the torch backend it is one more term of the
reference energy, differentiated like the built-in ones (:mod:`diffsoft.term_blocks`).

Examples (``x``, ``x0``: ``(..., K, k, d)`` the rows' positions at the end and the start of the step; ``h`` the
time step, ``()`` or ``(B, 1)``)::

    # a spring pulling vertex 7 towards a target that moves from step to step (target (d,), or (B, d): one
    # per creature, hence the unsqueeze against the rows' axis)
    spring = Term(lambda x, x0, h, target, k: 0.5 * k * ((x[..., 0, :] - target.unsqueeze(-2)) ** 2).sum(-1),
                  rows=[[7]], params=(target, k))
    spring.params = (next_target, k)            # before the next step
    # linear drag -c v on every vertex: c / (2 h) |x - x0|^2
    drag = Term(lambda x, x0, h, c: c / (2 * h) * ((x - x0) ** 2).sum((-2, -1)), params=(c,))
    # a soft constraint keeping vertices 3 and 9 at distance 0.5
    rod = Term(lambda x, x0, h, k: k * ((x[..., 0, :] - x[..., 1, :]).norm(dim=-1) - 0.5) ** 2,
               rows=[[3, 9]], params=(k,))
"""
import copy
import math

import torch

from ._compat import own_graphs
from ._minimize import check_captured
from .body import Copies
from .energies import StepTerm
from .step import per_problem


def _probe(like):
    """A direction shaped like ``like`` with every component in [0.2, 1], each unlike its neighbours."""
    k = torch.arange(like.numel(), dtype=like.dtype, device=like.device).view_as(like)
    return (torch.cos(2.4 * k + 0.3) + 1.5) / 2.5


def _weighted_gradient(e, x, weight, create_graph=False):
    """``d (weight . e) / dx``, 0 where ``e`` has no graph to ``x`` (a term that reads no position there)."""
    g = torch.autograd.grad(e, x, weight, create_graph=create_graph, allow_unused=True)[0] if e.requires_grad else None
    return torch.zeros_like(x) if g is None else g


class Term:
    """An energy term written in torch (see the module docstring).

    Args:
        energy: ``energy(x, x0, h, *params) -> (..., K)``, one energy per row: ``x`` and ``x0`` ``(..., K, k, d)``
            are each row's vertices' positions at the end of the step (the unknowns; fixed vertices at their
            ``x0``) and at its start; ``h`` the time step (``()``, or ``(B, 1)`` with one per creature). Each
            row's energy may read only its own row's positions (the Hessian is assembled from per-row blocks).
            A step's backward calls it again: what it reads besides its arguments (a closure's tensors) must
            not change until the step's backward has run, and it must be twice differentiable by autograd.
        rows: ``(K, k)`` int64 vertex indices, the term's stencil; default: one row per vertex, ``(N, 1)``.
        params: a tuple of tensors the energy reads after ``h``: each may require grad (the step's outputs are
            differentiable with respect to it, through the implicit backward) and may carry a leading batch
            dimension B (one value per creature; the energy broadcasts it). Assignable between steps
            (``term.params = ...``).
        blocks: optional ``blocks(x, x0, h, *params) -> (..., K, kd, kd)``, each row's Hessian (rows and columns
            ordered (vertex of the row, component)); default: by double backward, ``kd`` probes per step's Newton
            iteration.
        name: how messages name the term.
    """

    def __init__(self, energy, rows=None, params=(), blocks=None, name=None):
        if not callable(energy):
            raise TypeError(f"Term: energy must be callable, got {type(energy).__name__}")
        if blocks is not None and not callable(blocks):
            raise TypeError(f"Term: blocks must be callable or None, got {type(blocks).__name__}")
        if rows is not None:
            rows = torch.as_tensor(rows)
            if rows.dim() != 2 or rows.shape[1] < 1 or rows.shape[0] < 1 or rows.dtype not in (torch.int32,
                                                                                                torch.int64):
                raise ValueError(f"Term: rows must be a (K, k) integer tensor of vertex indices, K, k >= 1, got "
                                 f"{tuple(rows.shape)} {rows.dtype}")
            if int(rows.min()) < 0:
                raise ValueError(f"Term: rows has a negative vertex index {int(rows.min())}")
            rows = rows.long()
        self._rows = rows
        self._energy, self._blocks, self.name = energy, blocks, name or getattr(energy, "__name__", "term")
        self.params = params

    @property
    def energy(self):
        """The energy function. Fixed: a step's backward calls it again, so another one assigned between a
        step and its backward would give that step wrong gradients; make a new Term (and simulator) instead."""
        return self._energy

    @energy.setter
    def energy(self, value):
        raise AttributeError(f"Term {self.name!r}: energy is fixed (a step's backward calls it again, so another "
                             f"one would give the steps before it wrong gradients): make a new Term")

    @property
    def blocks(self):
        """The Hessian blocks' function, or None. Fixed, as :attr:`energy`."""
        return self._blocks

    @blocks.setter
    def blocks(self, value):
        raise AttributeError(f"Term {self.name!r}: blocks is fixed, as energy: make a new Term")

    @property
    def rows(self):
        """The stencil, ``(K, k)`` int64 (None: one row per vertex). Fixed: make a new Term for other rows."""
        return self._rows

    @property
    def params(self):
        """The tensors the energy reads after ``h`` (a tuple); assignable between steps."""
        return self._params

    @params.setter
    def params(self, value):
        if isinstance(value, torch.Tensor) or not isinstance(value, (tuple, list)):
            raise TypeError(f"Term {self.name!r}: params must be a tuple of tensors, got {type(value).__name__}")
        for j, t in enumerate(value):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"Term {self.name!r}: params[{j}] must be a torch.Tensor, got {type(t).__name__}")
        self._params = tuple(value)

    def stencil(self, num_vertices, device):
        """The rows on ``device``: :attr:`rows`, or one per vertex."""
        if self._rows is None:
            return torch.arange(num_vertices, device=device)[:, None]
        lo, hi = int(self._rows.min()), int(self._rows.max())
        if hi >= num_vertices or lo < 0:  # (rows edited in place since the constructor checked them)
            bad = hi if hi >= num_vertices else lo
            raise ValueError(f"Term {self.name!r}: rows has vertex index {bad}, but the body has {num_vertices} "
                             f"vertices")
        return self._rows.to(device)

    def check(self, p, free=None):
        """A ValueError naming the term where its energy is one the step would quietly get wrong, checked at the
        step's start ``p.x0`` (:class:`~diffsoft.step.StepParams`; ``free``, ``(N,)`` bool, the vertices the step
        moves: the checks move only those, and none where no row has one):

        * one row's energy reads another row's positions, which the step cannot see (it assembles the Hessian
          from per-row blocks). Found by two gradients of the rows' energies under different random weights:
          with separate rows, row j's gradient is its weight times its own energy's gradient, under either weight;
        * its second derivative is lost (an op that does not differentiate twice: a ``torch.autograd.Function``
          whose backward reads detached tensors), so its Hessian blocks would be 0: its gradient has no graph to
          the positions, yet changes with them;
        * part of it is lost (such an op beside ops that differentiate twice), so its blocks by autograd would
          miss that part: a Hessian-vector product differs from the gradient's central difference where the
          forward and backward differences agree (a kink makes them differ, and is let through)."""
        rows = self.stencil(p.x0.shape[-2], p.x0.device)
        x0 = p.x0.detach()[..., rows, :]
        h, params = per_problem(p.h).detach(), [t.detach() for t in self.params]
        with torch.enable_grad(), own_graphs():
            x = x0.clone().requires_grad_()
            e = self.energy(x, x0, h, *params)
            g = torch.Generator().manual_seed(0)
            weights = [(1 + torch.rand(e.shape, generator=g, dtype=torch.float64)).to(e) for _ in range(2)]
            grads = [torch.autograd.grad(e, x, w, retain_graph=True, allow_unused=True, create_graph=True)[0]
                     for w in weights]
            if grads[0] is None:  # the positions do not enter it
                return
            # moves of 1% of the positions' scale: along a probe with every component non-zero and unlike its
            # neighbours (no axis of a row missed), and off the start along another direction
            size = 0.01 * x0.abs().max().clamp_min(1)
            moves = torch.ones_like(x0) if free is None else free[rows].to(x0)[..., None].expand_as(x0)
            if not bool(moves.any()):
                return  # the step moves none of its vertices
            probe = size * _probe(x0) * moves
            offset = size * torch.linspace(-1, 1, x0.numel(), dtype=x0.dtype, device=x0.device).view_as(x0) * moves
            second = grads[0].requires_grad and torch.autograd.grad(
                grads[0], x, probe, allow_unused=True)[0] is not None
            if not second and self.blocks is None:
                # 0 for a term linear in the positions, a jump (or 0) across a piecewise-linear one's kink, and
                # growing with the move, at least in proportion, where a second derivative was lost
                def change(t):
                    moved = (x0 + t * probe).requires_grad_()
                    there = _weighted_gradient(self.energy(moved, x0, h, *params), moved, weights[0])
                    return float((there - grads[0].detach()).norm())
                full, half = change(1.0), change(0.5)
                tol = 1e3 * torch.finfo(x0.dtype).eps * float(grads[0].norm())
                if not math.isfinite(full) or (full > tol and half > tol and full > 1.5 * half):
                    raise ValueError(f"Term {self.name!r}: its second derivative is lost: its gradient changes with "
                                     f"the positions, yet has no autograd graph to them (its Hessian blocks would be 0, "
                                     f"the step and its gradients quietly wrong). An op in its energy does "
                                     f"not differentiate twice (a torch.autograd.Function whose backward reads "
                                     f"detached tensors, .numpy() or runs under torch.no_grad()): give it a "
                                     f"differentiable backward, or give the term its blocks")
            elif self.blocks is None:
                self._check_part_of_the_second_derivative(x0, h, params, weights[0], offset, probe)
        per_row = [gr.detach() / w[..., None, None] for gr, w in zip(grads, weights)]
        scale = max(float(per_row[0].abs().max()), torch.finfo(x.dtype).tiny)
        if float((per_row[0] - per_row[1]).abs().max()) > 1e3 * torch.finfo(x.dtype).eps * scale:
            raise ValueError(f"Term {self.name!r}: one row's energy reads another row's positions; each row's energy "
                             f"may read only its own row of x (the step assembles the Hessian from per-row blocks): "
                             f"give the coupled vertices one row together (rows=...)")

    def _check_part_of_the_second_derivative(self, x0, h, params, weight, offset, probe):
        """:meth:`check`'s third case, in float64 (float32's rounding hides a lost part's share of a product
        below about 10%; an energy that does not run in float64 is not checked), at ``x0 + offset`` (off the start,
        where a lost part of a term in ``x - x0`` can be seen: a quartic's vanishes at ``x0``) and along
        ``probe`` (not parallel to ``offset``, so not radial from ``x0``): the weighted energy's Hessian-vector
        product against the gradient's forward and backward differences over moves of 1e-6 of the probe, along
        the moves as rounded. Where the term is smooth the two differences agree, and their mean is then the
        product to their own agreement; where part of the second derivative was lost they agree with each other
        and not with the product. A kink within the move makes them differ: it is let through."""
        f64 = torch.float64
        x0, h, weight = x0.to(f64), h.to(f64), weight.to(f64)
        params = [t.to(f64) if t.is_floating_point() else t for t in params]

        def gradient(at, create_graph=False):
            at = at.detach().requires_grad_()
            return at, _weighted_gradient(self.energy(at, x0, h, *params), at, weight, create_graph)
        at, probe, t = x0 + offset.to(f64), probe.to(f64), 1e-6
        try:
            y, g = gradient(at, create_graph=True)
            ahead, behind = at + t * probe, at - t * probe
            move = 0.5 * (ahead - behind) / t  # the probe as the rounded moves make it
            hv = torch.autograd.grad(g, y, move, allow_unused=True)[0] if g.requires_grad else None
            forward, backward = (gradient(ahead)[1] - g.detach()) / t, (g.detach() - gradient(behind)[1]) / t
        except (RuntimeError, TypeError):  # the energy does not run in float64
            return
        if hv is None:
            return
        central = 0.5 * (forward + backward)
        tol = 1e-3
        noise = 1e3 * torch.finfo(f64).eps * float(g.detach().norm()) / t  # the differences' rounding
        size = max(float(central.norm()), float(hv.norm()))
        smooth = float((forward - backward).norm()) <= tol * float(central.norm()) + noise
        error = float((central - hv).norm())
        if smooth and error > tol * size + noise:
            raise ValueError(f"Term {self.name!r}: part of its second derivative is lost: its Hessian-vector "
                             f"products differ from its gradient's change by {100 * error / size:.2g}% (the "
                             f"step's Hessian blocks, by autograd, would miss that part: the step and its "
                             f"gradients quietly wrong). An op in its energy does not differentiate twice (a "
                             f"torch.autograd.Function whose backward reads detached tensors, .numpy() or runs "
                             f"under torch.no_grad()): give it a differentiable backward, or give the term its "
                             f"blocks")

    def step_term(self, k):
        """This term, the ``k``-th of a topology's, as a :class:`~diffsoft.energies.StepTerm` (its parameters are
        ``StepParams.terms[k]``)."""

        def rows(top):
            return self.stencil(top.free_index.shape[0], top.free_index.device)

        def energy(x_rows, p, top):
            return self.energy(x_rows, p.x0[..., rows(top), :], per_problem(p.h), *p.terms[k])

        def blocks(x_rows, p, top):
            return self.blocks(x_rows, p.x0[..., rows(top), :], per_problem(p.h), *p.terms[k])

        return StepTerm(self.name, rows, energy, None if self.blocks is None else blocks, user=True)

    def to(self, dtype=None, device=None):
        """A copy with its parameters ``t.to(device, dtype)``: differentiable, as :meth:`Simulator.to
        <diffsoft.simulator.Simulator.to>`'s constants (gradients flow back to this term's parameters)."""
        out = copy.copy(self)
        out._copies, source = Copies(), getattr(self, "_copies", None)
        out._params = tuple(out._copies.to(i, t, dtype, device, source) for i, t in enumerate(self._params))
        return out

    def check_at_start(self, p, where):
        """The energy at the step's start ``p.x0`` (:class:`~diffsoft.step.StepParams`) on detached inputs, at every
        step (params and a closure's tensors may change between steps), naming ``where`` (e.g. ``sim.terms[0]``):
        a ValueError where it fails or is not one energy per row (a param with a batch the state lacks, or of
        another batch's length); where it reads a tensor that is not among its params (one its closure
        captured), a RuntimeWarning when that requires grad (the implicit backward gives it no gradient) and a
        NotImplementedError when it is a forward-mode dual tensor (its tangent would be lost), as
        :func:`diffsoft.minimize` checks its energy."""
        x0 = p.x0.detach()[..., self.stencil(p.x0.shape[-2], p.x0.device), :]
        shapes = ", ".join(str(tuple(t.shape)) for t in self.params) or "none"
        state = f"a batch of {x0.shape[0]}" if x0.dim() == 4 else "one creature"
        try:
            with own_graphs():
                e = self.energy(x0, x0, per_problem(p.h).detach(), *[t.detach() for t in self.params])
        except Exception as err:  # noqa: BLE001 - named, with what the step gave it
            raise ValueError(f"{where} (Term {self.name!r}): its energy failed at the step's start "
                             f"({type(err).__name__}: {err}); the state is {state}, its rows {tuple(x0.shape)}, its "
                             f"params' shapes {shapes}") from err
        if not isinstance(e, torch.Tensor) or tuple(e.shape) != tuple(x0.shape[:-2]):
            raise ValueError(f"{where} (Term {self.name!r}): its energy must return one energy per row, shape "
                             f"{tuple(x0.shape[:-2])} for rows of shape {tuple(x0.shape)} ({state}), got "
                             f"{tuple(e.shape) if isinstance(e, torch.Tensor) else type(e).__name__}; its params' "
                             f"shapes: {shapes} (a per-creature param has the state's batch as its first dimension)")
        check_captured(e, f"Simulator.step: {where} (Term {self.name!r})", "in the term's params", stacklevel=5)

    def check_copies(self, where):
        """A ValueError naming ``where`` (e.g. ``sim.terms[0]``) where a parameter of this copy (:meth:`to`) was
        copied from one changed in place since: the copy does not follow it."""
        params = self._params
        if getattr(self, "_copies", Copies()).stale(lambda i: params[i] if i < len(params) else None):
            raise ValueError(f"{where}.params holds a copy made by Simulator.to of a tensor that was changed in "
                             f"place since, and does not follow it: call to() again from the original (or assign "
                             f"{where}.params)")

    def __repr__(self):
        rows = "every vertex" if self._rows is None else f"rows {tuple(self._rows.shape)}"
        return f"Term({self.name!r}, {rows}, {len(self._params)} params)"
