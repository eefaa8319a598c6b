"""The backward-Euler step problem, named: what one :meth:`Simulator.step <diffsoft.simulator.Simulator.step>`
minimises, as two records.

* :class:`StepParams`: the step's differentiable parameters, 16 tensors in one field order. They are the
  ``*params`` of :func:`diffsoft.minimize` (so the implicit backward returns a gradient for each one that
  requires grad), the arguments of every step energy (the plain-torch reference
  :func:`diffsoft.energies.reference_step_energy` and the fused :func:`diffsoft.fused.step_energy`), and the
  order of the C++ kernels' ``enum class StepParam`` (``csrc/physics/model.h``), checked at import against
  ``_C.STEP_PARAM_NAMES``.
* :class:`StepTopology`: everything else the energy needs, none of it differentiable: indices, the
  material, whether there is a ground, the factorizations' shared analysis, and (on the fused path) the
  kernels' model built once per step.

Every step energy is called as ``energy(y, *params, topology)`` with ``y`` the free vertices' positions,
``(F, d)`` or ``(B, F, d)``; :func:`unpack` turns its arguments back into the two records.

Adding a differentiable parameter: a field here, its value in :meth:`Simulator.step_problem
<diffsoft.simulator.Simulator.step_problem>`, its term in the reference energy, and the kernels' enum and
derivatives (``docs/design.md`` walks through it).
"""
import dataclasses
import enum
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
    contact_stiffness: torch.Tensor    # ([B]) k_c of the ground penalty
    friction: torch.Tensor             # ([B]) k_f of the lagged friction
    h: torch.Tensor                    # ([B]) the time step (x_hat depends on it too, through autograd)
    ground: torch.Tensor               # ([B]) the ground's height (unused without a ground)
    friction_eps: torch.Tensor         # ([B]) the height above the ground under which friction acts


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
    fixed (then ``y`` is the whole body); material: a :class:`Material`; has_ground: whether there is a ground
    (contact and friction; its height is :attr:`StepParams.ground`); factor_cache: the factorizations' symbolic
    analysis, shared by every step of a simulator; kernel_model: the C++ kernels' model (a
    :class:`diffsoft._ops.KernelModel`) for one step's parameter values (see
    :func:`diffsoft.fused.with_kernel_model`), or None.
    """
    elements: torch.Tensor
    muscles: typing.Optional[torch.Tensor]
    free: torch.Tensor
    free_index: torch.Tensor
    all_free: bool
    material: Material
    has_ground: bool
    factor_cache: typing.Any
    kernel_model: typing.Any = None

    def full_positions(self, y, x0):
        """All vertices' positions ``([B,] N, d)`` from the free ones ``y``: fixed vertices keep ``x0``."""
        return y if self.all_free else x0.index_copy(x0.dim() - 2, self.free, y)


def per_problem(t):
    """A step scalar (a number, a 0-dim tensor, or ``(B,)`` one per problem) shaped to broadcast against one
    value per vertex, ``([B,] N)``: ``(B, 1)`` for a per-problem tensor."""
    return t[..., None] if isinstance(t, torch.Tensor) and t.dim() else t


def unpack(args):
    """``(StepParams, StepTopology)`` from a step energy's ``*args`` (the parameters, then the topology)."""
    return StepParams(*args[:-1]), args[-1]


if tuple(StepParams._fields) != tuple(_C.STEP_PARAM_NAMES):
    raise ImportError(f"diffsoft.step.StepParams has the fields {StepParams._fields} but the C++ kernels' "
                      f"StepParam order is {tuple(_C.STEP_PARAM_NAMES)}: rebuild diffsoft, or make both agree")
