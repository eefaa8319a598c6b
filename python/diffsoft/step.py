"""The backward-Euler step problem, named: what one :meth:`Simulator.step <diffsoft.simulator.Simulator.step>`
minimises, as two records.

* :class:`StepParams`: the step's differentiable parameters: the body's and the state's, 12 tensors in one field
  order, then each collider's and each user term's (a variable tail, which :class:`StepTopology` describes).
  :meth:`StepParams.flat` lists them all: they are the ``*params`` of :func:`diffsoft.minimize` (so the implicit
  backward returns a gradient for each one that requires grad) and the arguments of every step energy (the
  plain-torch reference :func:`diffsoft.energies.reference_step_energy` and the fused
  :func:`diffsoft.fused.step_energy`). The first 12 follow the C++ kernels' ``enum class StepParam``
  (``csrc/diffsoft/physics/model.h``), checked at import against ``_C.STEP_PARAM_NAMES``; each collider's follow its
  kind's order (:mod:`diffsoft.colliders`, checked against ``_C.COLLIDER_KINDS``).
* :class:`StepTopology`: everything else the energy needs, none of it differentiable: indices, the
  material, the colliders' kinds, the user terms, the factorizations' shared analysis, and (on the fused path)
  the kernels' model built once per step.

Every step energy is called as ``energy(y, *params.flat(), topology)`` with ``y`` the free vertices' positions,
``(F, d)`` or ``(B, F, d)``; :func:`unpack` turns its arguments back into the two records.
"""
import dataclasses
import enum
import itertools
import typing

import torch

from ._extension import _C


class StepParams(typing.NamedTuple):
    """The step's differentiable parameters (B problems, N vertices, F free, E elements, M muscles). A field
    marked ``[B]`` may carry a leading batch dimension, one value per problem (a batch of creatures with
    different bodies or worlds: domain randomisation), or lack it (shared by the batch)."""
    x_hat: torch.Tensor                # ([B,] F, d) the inertial prediction x0 + h v0 of the free vertices
    x0: torch.Tensor                   # ([B,] N, d) start-of-step positions, fixed vertices included
    x0_free: torch.Tensor              # ([B,] F, d) start-of-step positions of the free vertices
    mass: torch.Tensor                 # ([B,] F) masses of the free vertices
    Dm_inv: torch.Tensor               # ([B,] E, d, d) inverse rest shapes
    mu: torch.Tensor                   # ([B,] E) or () Lame parameters, elements' weights folded in
    lam: torch.Tensor                  # ([B,] E) or ()
    activation: typing.Optional[torch.Tensor]  # ([B,] M) muscle activations, None without muscles
    muscle_rest_length: torch.Tensor   # ([B,] M)
    muscle_stiffness: torch.Tensor     # ([B,] M) or ()
    gravity: torch.Tensor              # ([B]) the gravitational acceleration, along -y
    h: torch.Tensor                    # ([B]) the time step (x_hat depends on it too, through autograd)
    colliders: tuple = ()  # per collider of StepTopology.colliders, its parameters in its kind's PARAMS order
    terms: tuple = ()      # per user term of StepTopology.terms, its parameters

    def flat(self):
        """Every parameter in one tuple: the body's and the state's fields, then each collider's, then each
        user term's (the solver's ``*params``; :func:`unpack` reverses it)."""
        return (*self[:len(BODY_PARAMS)], *itertools.chain(*self.colliders), *itertools.chain(*self.terms))


BODY_PARAMS = StepParams._fields[:-2]
"""The names of :class:`StepParams`' fixed fields, the body's and the state's (``_C.STEP_PARAM_NAMES``)."""


class Material(str, enum.Enum):
    """The elastic materials. Members equal their names (``Material.NEO_HOOKEAN == "neo_hookean"``);
    :attr:`code` is the C++ kernels' code (``StepModel::material``), the member's position here."""
    ALGOVIVO = "algovivo"
    NEO_HOOKEAN = "neo_hookean"
    STABLE_NEO_HOOKEAN = "stable_neo_hookean"

    @property
    def code(self):
        """The C++ kernels' code of the material (its position in this enum)."""
        return list(Material).index(self)


@dataclasses.dataclass(frozen=True, eq=False)
class StepTopology:
    """The step's static data: indices and constants that receive no gradient.

    elements ``(E, d+1)`` int64; muscles ``(M, 2)`` int64 or None; free ``(F,)`` int64, the free vertices;
    free_index ``(N,)`` int64, each vertex's index among the free ones (-1 if fixed); all_free: no vertex is
    fixed (then ``y`` is the whole body); material: a :class:`Material`; factor_cache: the factorizations'
    symbolic analysis, shared by every step of a simulator; colliders: each collider's kind (a class of
    :mod:`diffsoft.colliders`; its parameters are :attr:`StepParams.colliders`); terms: the user's energy terms
    (:class:`diffsoft.terms.Term`; their parameters are :attr:`StepParams.terms`); kernel_model: the C++ kernels'
    model (a
    :class:`diffsoft._ops.KernelModel`) for one step's parameter values (see :func:`diffsoft.fused.with_kernel_model`), or None.
    """
    elements: torch.Tensor
    muscles: typing.Optional[torch.Tensor]
    free: torch.Tensor
    free_index: torch.Tensor
    all_free: bool
    material: Material
    factor_cache: typing.Any
    colliders: tuple = ()
    terms: tuple = ()
    kernel_model: typing.Any = None

    def full_positions(self, y, x0):
        """All vertices' positions ``([B,] N, d)`` from the free ones ``y``: fixed vertices keep ``x0`` (one
        ``(N, d)`` for every row of a batched ``y``: the C++ path's rows of an unbatched step are ``(1, F, d)``)."""
        if self.all_free:
            return y
        return x0.expand(*y.shape[:-2], *x0.shape[-2:]).index_copy(y.dim() - 2, self.free, y)


def per_problem(t):
    """A step scalar (a number, a 0-dim tensor, or ``(B,)`` one per problem) shaped to broadcast against one
    value per vertex, ``([B,] N)``: ``(B, 1)`` for a per-problem tensor."""
    return t[..., None] if isinstance(t, torch.Tensor) and t.dim() else t


def unpack(args, terms=True):
    """``(StepParams, StepTopology)`` from a step energy's ``*args`` (:meth:`StepParams.flat`, then the
    topology); with ``terms=False``, args without the user terms' parameters (the fused kernels' arguments,
    :func:`kernel_params`), and a StepParams without them."""
    top = args[-1]
    flat = args[:-1]
    at = len(BODY_PARAMS)
    colliders = []
    for kind in top.colliders:
        colliders.append(tuple(flat[at:at + len(kind.PARAMS)]))
        at += len(kind.PARAMS)
    user = []
    for term in top.terms if terms else ():
        user.append(tuple(flat[at:at + len(term.params)]))
        at += len(term.params)
    if at != len(flat):
        raise ValueError(f"a step energy got {len(flat)} parameters, but its topology's body, colliders and terms "
                         f"take {at}")
    return StepParams(*flat[:len(BODY_PARAMS)], colliders=tuple(colliders), terms=tuple(user)), top


def kernel_params(p):
    """How many of :meth:`StepParams.flat`'s parameters the C++ kernels take: all but the user terms'."""
    return len(BODY_PARAMS) + sum(len(c) for c in p.colliders)


if tuple(BODY_PARAMS) != tuple(_C.STEP_PARAM_NAMES):
    raise ImportError(f"diffsoft.step.StepParams has the fields {BODY_PARAMS} but the C++ kernels' "
                      f"StepParam order is {tuple(_C.STEP_PARAM_NAMES)}: rebuild diffsoft, or make both agree")
