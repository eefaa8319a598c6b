"""The fused step kernels as torch operators, ``torch.ops.diffsoft.*`` (registered by the C++ extension,
``csrc/ops.cpp``, whose comment gives their schemas), the step model as they take it, and their fake
implementations: the outputs' shapes without data, which torch 2.x's FakeTensor, ``torch.compile`` and
``torch.library.opcheck`` use (torch 1.13 has no use for them).

The operators are kernels without autograd formulas: :mod:`diffsoft.fused`'s autograd Functions compose them.
"""
import typing

import torch

from ._compat import register_fake
from ._extension import _C

ops = torch.ops.diffsoft

FIELDS = ("elements", "muscles", "slot", "mass", "Dm_inv", "mu", "lam", "rest_length", "stiffness", "h", "gravity")
"""The step model's tensors, in the operators' order (csrc/ops.h's ``kKernelModelFields``, checked at import)."""

if FIELDS != tuple(_C.KERNEL_MODEL_FIELDS):
    raise ImportError(f"diffsoft._ops.FIELDS is {FIELDS} but the C++ operators take {tuple(_C.KERNEL_MODEL_FIELDS)}: "
                      f"rebuild diffsoft, or make both agree")


class KernelModel(typing.NamedTuple):
    """The C++ kernels' step model (``StepModel`` of ``csrc/diffsoft/physics/model.h``) as the operators take it:
    ``tensors``, one per name of :data:`FIELDS` (None where absent), the material's code, each collider's kind
    (its ``CODE``, :mod:`diffsoft.colliders`), every collider's parameters one after the other (its kind's
    ``PARAMS``), and the factorizations' shared analysis (a ``_C.FactorCache`` or None; the solver's path only)."""
    tensors: list
    material: int
    collider_kinds: list
    collider_params: list
    factor_cache: typing.Any = None

    @property
    def args(self):
        """The operators' first four arguments."""
        return self.tensors, self.material, self.collider_kinds, self.collider_params


def _count(model, name):
    return model[FIELDS.index(name)].shape[0]


def _one_device(like, model, collider_params, **named):
    """A ValueError naming the first tensor not on ``like``'s device. Torch 2.x runs a fake implementation as the
    Meta kernel too, whenever any input is a meta tensor: with the others on the CPU it returned uninitialised
    CPU tensors."""
    tensors = [*zip(FIELDS, model), *((f"collider_params[{k}]", t) for k, t in enumerate(collider_params)),
               *named.items()]
    for name, t in tensors:
        if isinstance(t, torch.Tensor) and t.device != like.device:
            raise ValueError(f"{name} is on {t.device} but the state is on {like.device}: the step kernels take every "
                             f"tensor on one device")


@register_fake("diffsoft::step_energy")
def _step_energy(model, material, collider_kinds, collider_params, y, x0, x0_free, x_hat, activation):
    _one_device(y, model, collider_params, x0=x0, x0_free=x0_free, x_hat=x_hat, activation=activation)
    return y.new_empty(y.shape[0])


@register_fake("diffsoft::step_energy_derivatives")
def _step_energy_derivatives(model, material, collider_kinds, collider_params, y, x0, x0_free, x_hat, activation):
    _one_device(y, model, collider_params, x0=x0, x0_free=x0_free, x_hat=x_hat, activation=activation)
    b, d = y.shape[0], y.shape[-1]
    e, m = _count(model, "elements"), _count(model, "muscles")
    return (y.new_empty(y.shape), y.new_empty(b, e, (d + 1) * d, (d + 1) * d), y.new_empty(b, m, 2 * d, 2 * d),
            y.new_empty(*y.shape, d))


@register_fake("diffsoft::step_energy_hvp")
def _step_energy_hvp(model, material, collider_kinds, collider_params, element_blocks, muscle_blocks, vertex_blocks,
                     v):
    _one_device(v, model, collider_params, element_blocks=element_blocks, muscle_blocks=muscle_blocks,
                vertex_blocks=vertex_blocks)
    return v.new_empty(v.shape)


@register_fake("diffsoft::step_energy_param_grads")
def _step_energy_param_grads(model, material, collider_kinds, collider_params, y, x0, x0_free, x_hat, activation,
                             weight=None, dir=None):
    _one_device(y, model, collider_params, x0=x0, x0_free=x0_free, x_hat=x_hat, activation=activation, weight=weight,
                dir=dir)
    b, f, d = y.shape
    n, e, m = x0.shape[1], _count(model, "elements"), _count(model, "muscles")
    shapes = {"x_hat": (f, d), "x0": (n, d), "x0_free": (f, d), "mass": (f,), "Dm_inv": (e, d, d), "mu": (e,),
              "lam": (e,), "activation": (m,), "muscle_rest_length": (m,), "muscle_stiffness": (m,)}
    out = [y.new_empty(b, *shapes.get(name, ())) for name in _C.STEP_PARAM_NAMES]
    params = iter(collider_params)
    for kind in collider_kinds:
        for j in range(len(_C.COLLIDER_KINDS[kind][1])):
            t, rank = next(params), _C.collider_param_rank(kind, j, d)
            out.append(y.new_empty(b, *t.shape[t.dim() - rank:]))
    return out
