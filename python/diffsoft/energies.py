"""The energy terms of a backward-Euler step, as plain differentiable torch functions.

Shapes: ``x`` is ``(..., N, d)`` (any leading batch dims, ``d`` = 2 or 3, y = ``x[..., 1]`` up); element and
muscle index tensors are int64 and shared by the batch; per-vertex, per-element and per-muscle parameters
broadcast against the batch dims (``(N,)`` shared, ``(B, N)`` one row per problem), and scalars against
``x.shape[:-2]`` (a number or 0-dim tensor shared, ``(B,)`` one per problem). Every ``*_energy`` function
returns the total over vertices/elements/muscles with shape ``x.shape[:-2]``; every ``*_density`` function
returns one value per element.

They are written with index gathers and elementwise ops only (no Python loop over elements), so the autograd
graph has a fixed, small number of nodes whatever the mesh size: a Hessian-vector product by double backward
costs a few passes over that graph.
"""
import functools
import math
import typing

import torch

from .step import Material, per_problem, unpack

MATERIALS = tuple(m.value for m in Material)
"""The elastic materials' names (see :class:`diffsoft.step.Material`)."""


def deformation_gradient(x, elements, Dm_inv):
    """``F = Ds Dm^-1`` per element, ``Ds``'s columns being the element's edges ``x_k - x_0``.

    Args:
        x: ``(..., N, d)``; elements: ``(E, d + 1)`` int64; Dm_inv: ``(E, d, d)`` inverse rest shapes.

    Returns:
        ``(..., E, d, d)``.
    """
    edges = x[..., elements[:, 1:], :] - x[..., elements[:, :1], :]  # (..., E, d, d), rows are edges
    return edges.transpose(-1, -2) @ Dm_inv


def determinant(F):
    """``det F`` of ``(..., d, d)`` matrices, d = 2 or 3, in closed form (cheap, twice differentiable,
    and exact for singular and inverted matrices, unlike an LU-based det's derivatives)."""
    if F.shape[-1] == 2:
        return F[..., 0, 0] * F[..., 1, 1] - F[..., 0, 1] * F[..., 1, 0]
    return (F[..., 0, :] * torch.cross(F[..., 1, :], F[..., 2, :], dim=-1)).sum(-1)


def strain_invariants(F):
    """``(I1 - d, J - 1)`` of ``(..., d, d)`` matrices, computed from ``G = F - I``.

    Near rest both are small, and forming ``I1 = tr(F^T F)`` or ``det F`` first would leave them as the
    difference of numbers near d and 1: an energy ``mu (I1 - d) / 2`` would carry a round-off of
    ``eps mu`` instead of ``eps mu |G|``, and a line search would stall on noise before the solver
    converges. Expanding in G keeps the error relative to the strain:
    ``I1 - d = |G|^2 + 2 tr G`` and ``det(I + G) - 1 = tr G + (tr^2 G - tr G^2)/2 [3D] + det G``.
    """
    d = F.shape[-1]
    G = F - torch.eye(d, dtype=F.dtype, device=F.device)
    tr = torch.diagonal(G, dim1=-2, dim2=-1).sum(-1)
    i1_minus_d = (G * G).sum((-2, -1)) + 2.0 * tr
    j_minus_1 = tr + determinant(G)
    if d == 3:
        j_minus_1 = j_minus_1 + 0.5 * (tr * tr - (G * G.transpose(-1, -2)).sum((-2, -1)))
    return i1_minus_d, j_minus_1


def algovivo_density(F, mu, lam):
    """algovivo's material: ``mu/2 (I1 - d) - mu q(J) + lam/2 q(J)^2`` with ``q(J) = -1.5 + 2J - J^2/2``,
    the second-order Taylor expansion of ``log J`` at ``J = 1``: finite (and restoring) for inverted elements.
    (Evaluated as ``q = (J - 1) - (J - 1)^2 / 2``, the same polynomial, see :func:`strain_invariants`.)

    Args:
        F: ``(..., E, d, d)``; mu, lam: broadcastable to ``(..., E)``.
    """
    i1, dj = strain_invariants(F)
    q = dj - 0.5 * dj * dj
    return 0.5 * mu * i1 - mu * q + 0.5 * lam * q * q


def neo_hookean_density(F, mu, lam):
    """Compressible Neo-Hookean: ``mu/2 (I1 - d) - mu log J + lam/2 (log J)^2``, and ``+inf`` for ``J <= 0``
    (a barrier: a line search rejects any step that inverts an element).

    Args:
        F: ``(..., E, d, d)``; mu, lam: broadcastable to ``(..., E)``.
    """
    i1, dj = strain_invariants(F)
    valid = dj > -1.0
    # log of a masked J, not log(J) masked afterwards: a NaN in the unused branch would poison the gradient.
    log_J = torch.log1p(torch.where(valid, dj, torch.zeros_like(dj)))
    psi = 0.5 * mu * i1 - mu * log_J + 0.5 * lam * log_J * log_J
    return torch.where(valid, psi, torch.full_like(psi, math.inf))


def stable_neo_hookean_density(F, mu, lam):
    """Stable Neo-Hookean (Smith, de Goes, Kim 2018, eq. 14 with its log term), zero at rest:
    ``mu'/2 (I1 - d) + lam'/2 (J - alpha)^2 - mu'/2 log(I1 + 1) - (same at F = I)``.

    ``mu, lam`` are the Lame parameters of linear elasticity; the model's own parameters are chosen so that
    its linearisation at rest is exactly linear elasticity (the paper's section 3.4, for any d):
    ``mu' = (d + 1)/d mu``, ``lam' = lam + (d (d + 1) - 2)/(d (d + 1)) mu`` (3D: 4/3 mu and lam + 5/6 mu), and
    ``alpha = 1 + mu/lam'`` makes F = I stress-free. Defined for every F, inverted ones included.

    Args:
        F: ``(..., E, d, d)``; mu, lam: broadcastable to ``(..., E)``.
    """
    d = F.shape[-1]
    mu_s = (d + 1) / d * mu
    lam_s = lam + (d * (d + 1) - 2) / (d * (d + 1)) * mu
    beta = mu / lam_s  # alpha - 1
    i1, dj = strain_invariants(F)
    # (J - alpha)^2 - (1 - alpha)^2 = (J - 1)(J - 1 - 2 beta); log(I1 + 1) - log(d + 1) = log1p((I1 - d)/(d + 1))
    return 0.5 * mu_s * i1 + 0.5 * lam_s * dj * (dj - 2.0 * beta) - 0.5 * mu_s * torch.log1p(i1 / (d + 1))


_DENSITIES = {
    Material.ALGOVIVO: algovivo_density,
    Material.NEO_HOOKEAN: neo_hookean_density,
    Material.STABLE_NEO_HOOKEAN: stable_neo_hookean_density,
}


def elastic_energy(x, elements, Dm_inv, mu, lam, material="neo_hookean", weight=None):
    """``sum_e weight_e psi(F_e; mu_e, lam_e)``.

    Args:
        x: ``(..., N, d)``; elements: ``(E, d + 1)``; Dm_inv: ``(E, d, d)`` or broadcastable to
            ``(..., E, d, d)``; mu, lam: ``(E,)`` or broadcastable to ``(..., E)``.
        material: one of :data:`MATERIALS`.
        weight: ``(E,)`` or None (weight 1, algovivo's convention); usually the rest areas/volumes. Every
            density is 1-homogeneous in ``(mu, lam)``, so a weight may equally be folded into them.

    Returns:
        ``x.shape[:-2]``.
    """
    try:
        density = _DENSITIES[Material(material)]
    except ValueError:
        raise ValueError(f"material must be one of {MATERIALS}, got {material!r}") from None
    psi = density(deformation_gradient(x, elements, Dm_inv), mu, lam)
    return (psi if weight is None else weight * psi).sum(-1)


def inertia_energy(x, x_hat, mass):
    """``1/2 sum_i m_i |x_i - x_hat_i|^2``, with ``x_hat = x0 + h v0`` the inertial (free-flight) prediction.

    Args:
        x, x_hat: ``(..., N, d)``; mass: ``(N,)`` or broadcastable to ``(..., N)``.
    """
    r = x - x_hat
    return 0.5 * (mass * (r * r).sum(-1)).sum(-1)


def muscle_energy(x, muscles, activation, rest_length, stiffness):
    """``sum_m k_m/2 ((l_m - a_m l0_m) / (a_m l0_m))^2`` with ``l = sqrt(|x_i - x_j|^2 + 1e-6)``.

    The activation ``a`` in (0, 1] scales the rest length: 1 is relaxed, smaller contracts.

    Args:
        x: ``(..., N, d)``; muscles: ``(M, 2)`` int64 vertex pairs; activation: ``(..., M)``;
        rest_length: ``(M,)`` or broadcastable to ``(..., M)``; stiffness: likewise, or a 0-dim tensor.
    """
    delta = x[..., muscles[:, 0], :] - x[..., muscles[:, 1], :]
    length = torch.sqrt((delta * delta).sum(-1) + 1e-6)
    target = activation * rest_length
    strain = length / target - 1.0
    return (0.5 * stiffness * strain * strain).sum(-1)


def gravity_energy(x, mass, gravity):
    """``sum_i m_i g y_i``.

    Args:
        x: ``(..., N, d)``; mass: ``(N,)`` or broadcastable to ``(..., N)``; gravity: a number or a tensor
            broadcastable to ``x.shape[:-2]`` (one per problem), the acceleration's magnitude.
    """
    return gravity * (mass * x[..., 1]).sum(-1)


def contact_energy(y, x0, h, stiffness, friction, friction_eps, surface, *geometry):
    """Contact and lagged friction against one collider (:mod:`diffsoft.colliders`), summed over the vertices:
    ``sum_i k_c min(phi(y_i), 0)^2 + w_i |P0_i (y_i - x0_i) / h|^2`` with ``w_i = k_f max(eps - phi(x0_i), 0)``
    and ``P0_i = I - n(x0_i) n(x0_i)^T``: a penalty on the depth inside the collider, and a friction on the slip
    in its tangent plane at the start of the step, acting within ``eps`` of its surface. The weight and the
    plane are lagged (they depend on ``x0`` only), so that the term is quadratic in ``y`` away from the surface.

    Args:
        y, x0: ``(..., N, d)``; h (the time step), stiffness, friction, friction_eps: numbers or tensors
            broadcastable to ``y.shape[:-2]`` (one per problem).
        surface: the collider kind's ``surface(q, *geometry) -> (phi, n)`` (e.g.
            :meth:`diffsoft.colliders.Plane.surface`), and ``geometry`` its parameters (``Collider.geometry``).
    """
    return _contact(y, x0, h, stiffness, friction, friction_eps, surface, geometry).sum(-1)


def _contact(y, x0, h, stiffness, friction, friction_eps, surface, geometry):
    """:func:`contact_energy` per vertex, ``(..., N)``."""
    phi, _ = surface(y, *geometry)
    phi0, n0 = surface(x0, *geometry)
    depth = torch.clamp(phi, max=0.0)
    band = torch.clamp(per_problem(friction_eps) - phi0, min=0.0)
    slip = y - x0
    t = slip - n0 * (n0 * slip).sum(-1, keepdim=True)
    return per_problem(stiffness) * depth * depth + per_problem(friction) * band * (t * t).sum(-1) / per_problem(h * h)


class StepTerm(typing.NamedTuple):
    """A term of the step energy, as the torch side sums and differentiates it (the C++ kernels register the same
    terms in ``csrc/diffsoft/physics/terms.h``). ``rows(top)``: its stencil, ``(K, k)`` int64 indices of all vertices (one row
    per element, muscle, ...), or None for one row per free vertex (the term reads ``y``); ``energy(x_rows, p,
    top)``: one energy per row ``(..., K)``, from the rows' positions ``x_rows`` ``(..., K, k, d)`` and the step's
    :class:`~diffsoft.step.StepParams` ``p``. ``blocks(x_rows, p, top)``: optional, each row's Hessian
    ``(..., K, kd, kd)`` (else autograd probes it). ``user``: a user's term (:class:`diffsoft.terms.Term`), which
    the C++ kernels do not have. ``inner``: optional ``(strain, density)`` with ``energy = density(strain(x_rows))``
    and ``strain`` linear in ``x_rows`` (``(..., K, m)``, m < kd): autograd then probes the density's m x m
    Hessian rather than the row's kd x kd one (:mod:`diffsoft.term_blocks`)."""
    name: str
    rows: typing.Callable
    energy: typing.Callable
    blocks: typing.Optional[typing.Callable] = None
    user: bool = False
    inner: typing.Optional[tuple] = None


def _deformation(x_rows, p, top):
    """Each element's F, flattened: ``(..., E, d * d)``, linear in its vertices' positions."""
    edges = x_rows[..., 1:, :] - x_rows[..., :1, :]  # (..., E, d, d), rows are edges
    F = edges.transpose(-1, -2) @ p.Dm_inv
    return F.reshape(*F.shape[:-2], -1)


def _density(F, p, top):
    d = math.isqrt(F.shape[-1])
    return _DENSITIES[top.material](F.reshape(*F.shape[:-1], d, d), p.mu, p.lam)


def _elastic_term(x_rows, p, top):
    return _density(_deformation(x_rows, p, top), p, top)


def _muscle_term(x_rows, p, top):
    delta = x_rows[..., 0, :] - x_rows[..., 1, :]
    length = torch.sqrt((delta * delta).sum(-1) + 1e-6)
    strain = length / (p.activation * p.muscle_rest_length) - 1.0
    return 0.5 * p.muscle_stiffness * strain * strain


def _inertia_term(x_rows, p, top):
    # Gravity relative to the start of the step: the same minimiser and derivatives, but an objective near 0
    # whose changes the line search can still resolve in floating point close to the solution.
    y = x_rows[..., 0, :]
    r = y - p.x_hat
    return (0.5 * p.mass * (r * r).sum(-1) / per_problem(p.h * p.h)
            + per_problem(p.gravity) * p.mass * (y[..., 1] - p.x0_free[..., 1]))


def _contact_term(c, x_rows, p, top):
    kc, kf, eps, *geometry = p.colliders[c]
    return _contact(x_rows[..., 0, :], p.x0_free, p.h, kc, kf, eps, top.colliders[c].surface, geometry)


ELASTIC = StepTerm("elastic", lambda top: top.elements, _elastic_term, inner=(_deformation, _density))
MUSCLE = StepTerm("muscle", lambda top: top.muscles, _muscle_term)
INERTIA = StepTerm("inertia", lambda top: None, _inertia_term)


def step_terms(top, builtin=True, user=True):
    """The terms of the step with topology ``top``, in the C++ kernels' order (``terms.h``): elasticity, the
    muscles (if any), inertia and gravity, contact and friction with each collider (the built-in ones), then the
    user's terms (``top.terms``)."""
    terms = []
    if builtin:
        terms = [ELASTIC] + ([MUSCLE] if top.muscles is not None else []) + [INERTIA]
        terms += [StepTerm(f"contact[{c}]", INERTIA.rows, functools.partial(_contact_term, c))
                  for c in range(len(top.colliders))]
    if user:
        terms += [term.step_term(k) for k, term in enumerate(top.terms)]
    return terms


def terms_energy(y, p, top, terms):
    """The sum of ``terms`` (:class:`StepTerm`) at the free positions ``y``, one energy per problem."""
    x = top.full_positions(y, p.x0)
    e = 0
    for term in terms:
        e = e + term.energy(term_rows(term, y, x, top), p, top).sum(-1)
    return e


def term_rows(term, y, x, top):
    """The positions ``(..., K, k, d)`` of each row of ``term``'s stencil: from all vertices' ``x``, or the free
    ones' ``y`` for a per-free-vertex term."""
    rows = term.rows(top)
    return y.unsqueeze(-2) if rows is None else x[..., rows, :]


def reference_step_energy(y, *args):
    """The backward-Euler step's objective divided by ``h^2``, in plain torch: the reference of the fused
    kernels (:mod:`diffsoft.fused`) and the oracle of their tests; the sum of :func:`step_terms`.

    Args:
        y: the free vertices' positions, ``(F, d)`` or ``(B, F, d)``.
        *args: the step's :class:`~diffsoft.step.StepParams` (:meth:`~diffsoft.step.StepParams.flat`), then its
            :class:`~diffsoft.step.StepTopology`; ``mu, lam`` arrive with the elements' weights folded in.
            Any parameter may be per problem (see :class:`~diffsoft.step.StepParams`).

    Returns:
        ``y.shape[:-2]``: one energy per problem of a batch (so that each gets its own line search), a 0-dim
        tensor for a single problem.
    """
    p, top = unpack(args)
    return terms_energy(y, p, top, step_terms(top))
