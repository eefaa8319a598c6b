"""Simulator: one backward-Euler step of a SoftBody as an energy minimisation, differentiable end to end.

One step solves ``x1 = argmin_x 1/2 sum_i m_i |x_i - (x0_i + h v0_i)|^2 + h^2 U(x)`` and sets
``v1 = (x1 - x0) / h``, where ``U`` sums elasticity, muscles, gravity, contact and lagged friction with each
collider (the ground, :mod:`diffsoft.colliders`), and the user's terms (:mod:`diffsoft.terms`); see
:mod:`diffsoft.energies`. The solver minimises the same objective divided by ``h^2``:

    ``E(x) = 1/(2 h^2) sum_i m_i |x_i - x_hat_i|^2 + U(x)``,  ``grad E = M (x - x_hat) / h^2 - f(x)``,

so its gradient is the residual of the discrete momentum balance ``M a = f`` in units of force, and the
solver's tolerances are force tolerances (see :class:`Simulator`). Scaling changes neither the minimiser,
nor Newton's steps, nor the implicit gradients.
"""
import functools
import inspect
import math
import numbers
import sys
import warnings

import torch

from ._checks import MIN_ACTIVATION, is_finite_real
from ._compat import eager_under_compile
from ._extension import _C
from ._minimize import minimize, refuse_transforms
from .body import Copies, SoftBody, Stamped, stamp
from .colliders import CONTACT_PARAMS, KINDS, Collider, Plane
from .energies import (contact_energy, deformation_gradient, determinant, elastic_energy, gravity_energy,
                       muscle_energy, reference_step_energy)
from .fused import analytic_energy, step_energy, step_energy_values, with_kernel_model
from .step import Material, StepParams, StepTopology
from .terms import Term
from . import torch_backend

_HAS_CHOLMOD = _C.HAS_CHOLMOD

# algovivo's contact and friction constants per unit of its vertex mass: the defaults scale them to a body.
ALGOVIVO_VERTEX_MASS = 6.0714287757873535
_CONTACT_PER_MASS = 14000.0 / ALGOVIVO_VERTEX_MASS
_FRICTION_PER_MASS = 300.0 / ALGOVIVO_VERTEX_MASS
_KIND_NAMES = ", ".join(cls.__name__ for cls in KINDS)  # the collider kinds, for messages


def _constant(value, dtype, device):
    """A number as a 0-dim tensor, made once (a step's constants given as numbers, read at every step), and
    outside inference mode: a tensor made inside it could not enter autograd after the block. The step's
    parameters (:meth:`Simulator.step_problem`) hand it out: one changed in place is made anew."""
    t = _cached_constant(value, dtype, device)
    if t._version:
        _cached_constant.cache_clear()
        t = _cached_constant(value, dtype, device)
    return t


@functools.lru_cache(maxsize=64)
def _cached_constant(value, dtype, device):
    with torch.inference_mode(False):
        return torch.tensor(value, dtype=dtype, device=device)


CONSTANTS = ("dt", "gravity", "ground", "contact_stiffness", "friction", "friction_eps")
"""The simulator's differentiable constants (``docs/parameters.md``)."""


@functools.lru_cache(maxsize=16)
def _user_stacklevel():
    """The ``stacklevel`` that points a warning raised by this module's caller at the first frame outside
    diffsoft and torch: the user's line, however many wrappers (``torch.compiler.disable``'s, once Dynamo is
    loaded) lie between."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in ("diffsoft", "torch"):
        level, frame = level + 1, frame.f_back
    return level


def _unit_y(dim, dtype, device):
    """+y in ``dim`` dimensions, made once: the ground's normal."""
    return torch.eye(dim, dtype=dtype, device=device)[1]


_TORCH_OPTIONS = frozenset(inspect.signature(torch_backend.solve_step).parameters) - {"params", "top",
                                                                                        "linear_solver"}
"""The ``solver_options`` the torch backend takes (:func:`diffsoft.torch_backend.solve_step`'s)."""
_CPP_OPTIONS = frozenset(inspect.signature(minimize).parameters) - {"energy", "x0", "params", "batched",
                                                                    "return_info", "sparsity", "_analytic"}
"""The ``solver_options`` the C++ backend and ``fused=False`` take (:func:`diffsoft.minimize`'s, less what the step
sets itself)."""


class Simulator:
    """Steps a :class:`~diffsoft.body.SoftBody` in time by backward Euler.

    Args:
        body: the SoftBody.
        dt: the time step ``h`` (s).
        gravity: the gravitational acceleration's magnitude ``g``, pulling along -y.
        ground: the ground's height (y), or None for no ground: shorthand for a horizontal
            :class:`~diffsoft.colliders.Plane` through ``(0, ground)``, the first collider, with the
            simulator's contact constants (bit for bit the flat ground's model).
        contact_stiffness: ``k_c`` of the ground's penalty ``k_c min(y - ground, 0)^2`` (and of every collider's
            ``k_c min(phi, 0)^2`` that leaves its own at None); default algovivo's 14000 per 6.0714 of mean
            vertex mass (a vertex resting on the ground sinks ``m g / (2 k_c)``, about 2 mm at g = 9.8).
        friction: ``k_f`` of the lagged friction ``k_f max(eps - (y0 - ground), 0) |v_t|^2`` (likewise for
            the colliders); default algovivo's 300 per 6.0714 of mean vertex mass.
        friction_eps: ``eps``, the height above the ground (the distance from a collider) under which friction
            acts.
        colliders: more colliders (of the kinds in :mod:`diffsoft.colliders`: planes, height fields, ...), each
            with its own contact constants (None: the simulator's); with ``ground=None`` they are the only ones.
        terms: the user's energy terms in torch (:class:`diffsoft.terms.Term`), added to the step on both
            backends, differentiably (their parameters get gradients).
        rtol, atol: the step's convergence test, ``|grad E| <= max(atol, rtol |grad E(x_hat)|)`` per problem, where
            ``grad E`` is the force residual (see the module docstring). ``rtol=None``: the solver's default (1e-8 in
            float64, 1e-4 in float32); ``atol=None``: 1e-8 (float64) or 1e-5 (float32) times the body's force scale (its
            weight plus the elastic force that stretches every element by 100%), at most 5% of its weight (a stiff
            body's elastic scale put the weight below it), kept in ``solver_options["atol"]`` and computed again at the
            first step after the body's masses, Lame parameters, rest shapes or material, or gravity, changed (unless
            ``solver_options["atol"]`` was set to another value; set it to None for the default again). Round-off bounds
            what is reachable: the line search needs energy decreases it can resolve, which for stiff bodies stops near
            ``sqrt(eps * stiffness * |energy terms|)``, well above ``eps``.
        fused: use the fused step energy (:mod:`diffsoft.fused`: closed-form gradient, Hessian-vector products
            from per-element blocks) instead of double backward through the plain-torch energy; the same
            values and derivatives, several times faster.
        solver: how the fused step solves its Newton and adjoint systems (CPU): ``"direct"``, a factorization
            of each creature's Hessian (CG where it is not positive definite); ``"cg"``, Jacobi-preconditioned
            CG on the kernels' Hessian products; ``"auto"`` (default), direct, except CG for 3D bodies of more
            than 5000 unknowns when diffsoft was built without CHOLMOD.
            ``fused=False`` (the paper's plain CG on double-backward products) uses CG. See ``backend`` for
            what it means on the torch backend.
        keep_factors: with the direct solver, each step keeps Newton's last factorization for its backward, which then
            costs back-substitutions instead of a fresh factorization (about 3x cheaper on the sheets of 40x40 and 70x70
            vertices at commit d69349c, ``benchmarks/README.md``, "Step speed"), at the memory of one factor (and the
            Hessian blocks it was made from) per step of a rollout until its backward has run. On the torch backend: the
            Hessian blocks at the solution with their float64 factor (dense Cholesky) or block-Jacobi preconditioner
            (CG), which the backward then does not make again.
        reuse_factor: factor reuse in Newton's loop (:func:`diffsoft.minimize`'s ``reuse_factor``): each
            system after the first is solved by CG preconditioned with the last factorization, and the Hessian
            is factored again only for the problems where that CG has not converged within a budget of
            iterations, about half a factorization's cost. The budget is a count (the factor's flops and
            nonzeros, the Hessian's nonzeros), never a timing, so two runs give bit-identical iterates; where a
            factorization is cheap (creatures, small sheets) no CG is tried at all. ``None`` (default): on
            wherever the step factors its Hessian on the C++ backend (``solver="direct"`` or ``"auto"``), off
            elsewhere (``solver="cg"``, ``fused=False``, the torch backend), where it does not apply. Measured
            against ``False`` on 2D sheets of 10x10 to 100x100 vertices under five loadings
            (``benchmarks/README.md``, "Loadings nobody tuned for", commit 37996ed): within 20% of the best
            solver on 19 of 20 cases, the 20th a 40x40 sheet sagging under gravity, where reuse's CG costs a
            third Newton iteration. ``True``: the same, but a step where it cannot apply raises
            ``ValueError``. ``False``: one factorization per Newton iteration. The backward is unchanged by it (a fresh factorization at the solution, or with
            ``keep_factors`` the forward's last one, then possibly made a few Newton iterations before it).
        backend: where the fused step is solved (``docs/design.md``, "Backends and devices"): ``"cpp"``, the
            C++ kernels and sparse factorizations (CPU tensors only); ``"torch"``, the same problem in batched
            torch ops (:mod:`diffsoft.torch_backend`) on any device: each creature's dense Hessian factored by
            one batched Cholesky (``solver="direct"``, and ``"auto"`` up to 1000 unknowns per creature), or
            block-Jacobi CG on the Hessian's element blocks (``"cg"``, and ``"auto"`` above); its record is a
            :class:`diffsoft.SolveInfo` too (:func:`diffsoft.torch_backend.solve_step`). ``"auto"`` (default):
            ``"cpp"`` for CPU tensors, ``"torch"`` for any other device. ``fused=False`` always takes
            :func:`diffsoft.minimize`'s path.
        max_iter, cg_rtol, cg_max_iter, backward_rtol, backward_max_iter, on_failure: passed to
            :func:`diffsoft.minimize`; all are kept in ``self.solver_options``, which may be edited (with the
            other options of the backend that steps: ``ls_*`` and ``probe_batch`` the C++ backend's,
            ``check_every`` the torch backend's; a key the stepping backend does not take is a ValueError naming
            it).

    Differentiable inputs (``docs/parameters.md`` lists them all): the six constants ``dt``, ``gravity``,
    ``ground``, ``contact_stiffness``, ``friction`` and ``friction_eps`` each take a number, a 0-dim tensor, or
    a ``(B,)`` tensor with one value per creature of a batched state ``x0`` of shape ``(B, N, d)`` (domain
    randomisation); a tensor that requires grad keeps its graph, and every step's outputs are differentiable
    with respect to it (on every path: the fused kernels have its closed-form derivatives). They may also be
    assigned after construction (``sim.friction = ...``), and are checked when assigned. A tensor is kept as
    given, not copied (an optimizer stepping it in place changes the simulator's constant), converted to the
    body's dtype and device at each step (differentiably), and checked again at the first step after an
    in-place change: one stepped out of its range raises there. A number stays a number for ``dt``,
    ``ground`` and ``friction_eps``, and becomes a 0-dim tensor of the body's dtype for ``gravity``,
    ``contact_stiffness`` and ``friction``. Left at their defaults (None), ``contact_stiffness`` and
    ``friction`` follow the body's masses (and carry their gradients). Every floating field of ``body`` may
    likewise require grad, and take a leading batch dimension (see :meth:`step`). Whether there is a ground at all (``ground=None``) is not
    differentiable.
    """

    def __init__(self, body, dt=1 / 30, gravity=9.8, ground=0.0, contact_stiffness=None, friction=None,
                 friction_eps=0.01, rtol=None, atol=None, max_iter=100, cg_rtol=0.5, cg_max_iter=None,
                 backward_rtol=None, backward_max_iter=None, on_failure="warn", fused=True, solver="auto",
                 keep_factors=False, reuse_factor=None, backend="auto", colliders=(), terms=()):
        if not isinstance(body, SoftBody):
            raise TypeError(f"body must be a diffsoft.SoftBody, got {type(body).__name__}")
        self._body = body
        self._checked, self._copies = {}, Copies()
        self.colliders, self.terms = colliders, terms
        self.dt, self.ground, self.friction_eps = dt, ground, friction_eps  # checked by their setters
        self.fused = fused
        self.solver = solver
        self.backend = backend
        if reuse_factor not in (None, True, False):
            raise ValueError(f"reuse_factor must be None (default), True or False, got {reuse_factor!r}")
        self.gravity = gravity
        self.contact_stiffness, self.friction = contact_stiffness, friction
        self._default_atol = None  # (value, what it was computed from) while atol is the default
        self._frame = None  # (quantum, body size): the frames a step far from the origin is solved in (_recentred)
        self.solver_options = dict(rtol=rtol, atol=atol, max_iter=max_iter, cg_rtol=cg_rtol,
                                   cg_max_iter=cg_max_iter, backward_rtol=backward_rtol,
                                   backward_max_iter=backward_max_iter, on_failure=on_failure,
                                   keep_factor=keep_factors, reuse_factor=reuse_factor)
        self._refresh_default_atol()
        self._topology = None
        self._terms_checked = None  # the topology whose terms were checked (Term.check)

    @property
    def colliders(self):
        """The colliders besides the ground (:mod:`diffsoft.colliders`), a tuple; assignable (a list or tuple of
        them), and each collider's fields too."""
        return self._colliders

    @colliders.setter
    def colliders(self, value):
        if isinstance(value, Collider) or not isinstance(value, (list, tuple)):
            raise TypeError(f"colliders must be a list or tuple of diffsoft.colliders objects ({_KIND_NAMES}), got "
                            f"{type(value).__name__}")
        for k, c in enumerate(value):
            if not isinstance(c, Collider):
                raise TypeError(f"colliders[{k}] must be a diffsoft.colliders object ({_KIND_NAMES}), got "
                                f"{type(c).__name__}")
        self._colliders = tuple(value)

    @property
    def all_colliders(self):
        """Every collider of a step, the ground (a horizontal :class:`~diffsoft.colliders.Plane` with the
        simulator's contact constants) first: what pictures and VTK files show."""
        if self._ground is None:
            return self._colliders
        up = [0.0, 1.0, 0.0][:self.body.dim]
        height = self._ground
        point = [0.0, height, 0.0][:self.body.dim] if not isinstance(height, torch.Tensor) else \
            torch.stack([torch.zeros_like(height), height, torch.zeros_like(height)][:self.body.dim], -1)
        return (Plane(point, up),) + self._colliders

    def _collider_kinds(self):
        """The kinds of every collider of a step, the ground first."""
        return ((Plane,) if self._ground is not None else ()) + tuple(type(c) for c in self._colliders)

    @property
    def terms(self):
        """The user's energy terms (:class:`diffsoft.terms.Term`), a tuple; assignable."""
        return self._terms

    @terms.setter
    def terms(self, value):
        if isinstance(value, Term) or not isinstance(value, (list, tuple)):
            raise TypeError(f"terms must be a list or tuple of diffsoft.terms.Term, got {type(value).__name__}")
        for k, t in enumerate(value):
            if not isinstance(t, Term):
                raise TypeError(f"terms[{k}] must be a diffsoft.terms.Term, got {type(t).__name__}")
        self._terms = tuple(value)

    @property
    def topology(self):
        """The step's :class:`~diffsoft.step.StepTopology`, built again (with a new factorization cache) when
        the body's elements, muscles, fixed vertices or material, or the colliders' kinds (whether there is a
        ground), have changed since the last step."""
        key = (self.body.structure(), self._collider_kinds(), self._terms)
        if self._topology is None or self._topology_of != key:
            self._topology, self._topology_of = self._build_topology(), key
        return self._topology

    def _build_topology(self):
        body = self.body
        with torch.inference_mode(False):  # a cache that outlives an inference_mode block
            free_index = torch.full((body.num_vertices,), -1, dtype=torch.long, device=body.device)
            free_index[body.free] = torch.arange(len(body.free), device=body.device)
        return StepTopology(
            elements=body.elements, muscles=body.muscles if body.num_muscles else None, free=body.free,
            free_index=free_index, all_free=len(body.fixed) == 0, material=Material(body.material),
            factor_cache=_C.FactorCache(), colliders=self._collider_kinds(), terms=self._terms)

    def _factorizes(self):
        """Whether the steps factor their Hessians: ``solver="direct"``, or ``"auto"`` unless the body is 3D,
        large, and diffsoft was built without CHOLMOD (Eigen's simplicial factorization then loses to CG
        above about 5000 unknowns in 3D; with CHOLMOD, or in 2D, factoring won at every size measured)."""
        if self.solver != "auto":
            return self.solver == "direct"
        return _HAS_CHOLMOD or self.body.dim == 2 or len(self.body.free) * self.body.dim <= 5000

    def _refresh_default_atol(self):
        """The default atol (``solver_options["atol"]`` None, or still the default it was given) follows the body:
        computed again when what it was computed from (the masses, Lame parameters, rest shapes, material,
        gravity, the dtype) changed. A value the user set is kept."""
        atol, default = self.solver_options["atol"], self._default_atol
        if atol is not None and (default is None or atol != default[0]):
            self._default_atol = None  # the user's own
            return
        b = self.body
        source = (b.material,) + tuple(Stamped(t) for t in (b.mass, b.mu, b.Dm_inv, self._gravity))
        if atol is not None and default[1] == source:
            return
        atol = (1e-8 if b.dtype == torch.float64 else 1e-5) * self._force_scale()
        # At most 5% of the body's weight: where the elastic scale dwarfs it (a stiff body: steel, or algovivo's
        # per-element weighting of a small body in float32) the weight fell below the tolerance, and every step
        # was converged at its start, the body never falling. (The shipped creatures' is 0.04-0.4% of it.)
        atol = min(atol, 5e-2 * self._weight_scale())
        self.solver_options["atol"], self._default_atol = atol, (atol, source)

    def _force_scale(self):
        """The body's weight plus the elastic force that would stretch every element by 100%: round-off in
        the step's force residual is relative to forces of this size."""
        b = self.body  # with per-creature fields (a leading batch dimension), the largest creature's
        vol = b.rest_volume.detach()
        weight = vol if b.material != "algovivo" else torch.ones_like(vol)
        elastic = (b.mu.detach() * weight / vol ** (1.0 / b.dim)).sum(-1).max().item()
        return self._weight_scale() + elastic

    def _weight_scale(self):
        """The body's weight (its mass times gravity, or 1 where gravity is smaller): the largest creature's."""
        gravity = self.gravity.detach().abs().max().item()
        return self.body.mass.detach().sum(-1).max().item() * max(gravity, 1.0)

    def __setstate__(self, state):
        """A copy (``copy.deepcopy``, pickle): its constant tensors are its own, checked again at its first step."""
        self.__dict__.update(state)
        self._checked, self._copies = {}, Copies()
        # its own options (copy.copy shared the dict: a copy's default atol, written into it, froze the original's)
        self.solver_options = dict(self.solver_options)
        self.__dict__.setdefault("_frame", None)
        self.__dict__.setdefault("_terms_checked", None)

    @property
    def body(self):
        """The :class:`~diffsoft.body.SoftBody` stepped. Read-only: the default ``atol`` was set from it; for
        another body build another simulator (``Simulator.to`` converts this one)."""
        return self._body

    @body.setter
    def body(self, value):
        raise AttributeError("Simulator.body cannot be reassigned: the default atol (and the constants' dtype) were "
                             "set from the body; build a new Simulator(body, ...) for another body, or edit this "
                             "body's fields")

    @property
    def fused(self):
        """Whether the step uses the fused kernels (see the class docstring); assignable, and checked."""
        return self._fused

    @fused.setter
    def fused(self, value):
        if value not in (True, False):
            raise TypeError(f"fused must be True or False, got {value!r}")
        if not value and getattr(self, "_backend", "auto") != "auto":
            raise ValueError(f"fused=False needs backend='auto' (it always solves with diffsoft.minimize), but "
                             f"backend is {self._backend!r}: set sim.backend = 'auto' first")
        self._fused = bool(value)

    @property
    def solver(self):
        """``"auto"``, ``"direct"`` or ``"cg"`` (see the class docstring); assignable, and checked."""
        return self._solver

    @solver.setter
    def solver(self, value):
        if value not in ("auto", "direct", "cg"):
            raise ValueError(f"solver must be 'auto', 'direct' or 'cg', got {value!r}")
        self._solver = value

    def to(self, dtype=None, device=None):
        """The simulator with its body and constants in ``dtype`` on ``device``, with ``torch.Tensor.to``'s
        semantics: this simulator itself when it is already there (nothing is copied); else a new one whose
        body (:meth:`SoftBody.to <diffsoft.body.SoftBody.to>`) and constant tensors are ``t.to(...)`` of this
        one's: differentiable functions of them, so that gradients flow back to this simulator's tensors, with
        storage of their own. The copy does not follow later in-place changes of this one's tensors: its next
        step raises, naming them (call ``to`` again). Solver options and the backend are kept (with
        ``backend="auto"`` the copy's steps take the torch backend off the CPU); a default atol is the new
        dtype's default. As ``torch.Tensor.to``, a
        device may come first: ``sim.to("cuda")``."""
        if isinstance(dtype, (str, torch.device)):
            dtype, device = device, dtype
        body = self.body.to(dtype=dtype, device=device)
        if body is self.body:
            return self
        out = object.__new__(Simulator)
        out.__dict__.update(self.__dict__)
        out._body, out._checked, out._copies = body, {}, Copies()
        for name in CONSTANTS:
            value = getattr(self, "_" + name)
            if isinstance(value, torch.Tensor):
                setattr(out, "_" + name, out._copies.to(name, value, body.dtype, body.device, self._copies))
        out._colliders = tuple(c.to(dtype=body.dtype, device=body.device) for c in self._colliders)
        out._terms = tuple(t.to(dtype=body.dtype, device=body.device) for t in self._terms)
        out.solver_options = dict(self.solver_options)
        out._topology = None
        out._check_constants()  # what the new dtype cannot hold (1e300 in float32) is refused here
        out._refresh_default_atol()  # (the new dtype's, at once: the options showed the old one until a step)
        return out

    @property
    def dt(self):
        """The time step ``h`` (s): a number, or a 0-dim or ``(B,)`` tensor (see the class docstring).
        Assignable."""
        return self._dt

    @dt.setter
    def dt(self, value):
        self._set_constant("dt", value)

    @property
    def ground(self):
        """The ground's height: a number, a 0-dim or ``(B,)`` tensor, or None (no ground: no contact, no
        friction). Assignable."""
        return self._ground

    @ground.setter
    def ground(self, value):
        self._set_constant("ground", value)

    @property
    def friction_eps(self):
        """``eps``, the height above the ground under which friction acts: a number, or a 0-dim or ``(B,)``
        tensor. Assignable."""
        return self._friction_eps

    @friction_eps.setter
    def friction_eps(self, value):
        self._set_constant("friction_eps", value)

    @property
    def gravity(self):
        """The gravitational acceleration's magnitude ``g``, pulling along -y: a 0-dim or ``(B,)`` tensor.
        Assignable (a number becomes a tensor of the body's dtype)."""
        return self._gravity

    @gravity.setter
    def gravity(self, value):
        self._set_constant("gravity", value)

    @property
    def contact_stiffness(self):
        """``k_c``, a 0-dim or ``(B,)`` tensor: the value given, or the default, computed from the body's masses
        at each step (one per creature where the masses are), so that gradients with respect to what the
        masses come from (densities, rest shapes) include it. Assign a number or tensor to set it, None for the
        default."""
        if self._contact_stiffness is None:
            return _CONTACT_PER_MASS * self.body.mass.mean(-1)
        return self._contact_stiffness

    @contact_stiffness.setter
    def contact_stiffness(self, value):
        self._set_constant("contact_stiffness", value)

    def follows_masses(self, name):
        """Whether the constant ``name`` (``"contact_stiffness"`` or ``"friction"``) is left at its default,
        which follows the body's masses (None assigned), rather than a value of its own."""
        if name not in ("contact_stiffness", "friction"):
            raise ValueError(f"only contact_stiffness and friction follow the masses, got {name!r}")
        return getattr(self, "_" + name) is None

    @property
    def friction(self):
        """``k_f``, a 0-dim or ``(B,)`` tensor: the value given, or the default, computed from the body's masses
        at each step (see :attr:`contact_stiffness`)."""
        if self._friction is None:
            return _FRICTION_PER_MASS * self.body.mass.mean(-1)
        return self._friction

    @friction.setter
    def friction(self, value):
        self._set_constant("friction", value)

    def _rule(self, name):
        """``(ok, words)``: the range of the constant ``name`` in the body's dtype, as a test that takes numbers and
        tensors alike, and its words. Squares of ``dt``, ``ground`` and ``friction_eps`` stay normal and finite."""
        dtype = self.body.dtype
        finfo = torch.finfo(dtype)
        lo, hi = math.sqrt(finfo.tiny), math.sqrt(finfo.max)
        return {
            "dt": (lambda v: (v >= lo) & (v <= hi),
                   f"a positive number in [{lo:.1g}, {hi:.1g}] (seconds; its square must be a normal {dtype})"),
            "ground": (lambda v: abs(v) <= hi, f"a number (the ground's height, at most {hi:.1g} in size) or None"),
            "friction_eps": (lambda v: (v >= 0) & (v <= hi), f"a number in [0, {hi:.1g}]"),
            "gravity": (lambda v: v >= 0, f"a non-negative number, finite in {dtype}"),
            "contact_stiffness": (lambda v: v >= finfo.tiny, f"a positive number, finite in {dtype}"),
            "friction": (lambda v: v >= 0, f"a non-negative number, finite in {dtype}"),
        }[name]

    def _set_constant(self, name, value):
        """Checks ``value`` for the constant ``name`` (a TypeError for what is not a real number or a 0-dim or
        ``(B,)`` real tensor, a ValueError for a value out of range) and keeps it: a tensor as given, a number as
        a float (or a 0-dim tensor of the body's dtype for gravity and the stiffnesses), None where allowed."""
        if value is None and name in ("ground", "contact_stiffness", "friction"):
            setattr(self, "_" + name, None)
            return
        ok, rule = self._rule(name)
        _check_constant_kind(name, value, rule)
        refuse_transforms(f"sim.{name}", (value,))
        if isinstance(value, torch.Tensor):
            if not self._in_range(value, ok):
                raise ValueError(f"{name} must be {rule}, or a 0-dim or (B,) tensor (one per creature) of them, "
                                 f"got {value!r}")
            self._checked[name] = (value, stamp(value))
        else:
            body = self.body
            t = _constant(float(value), body.dtype, body.device) if is_finite_real(value) else None
            if t is None or not self._in_range(t, ok):
                raise ValueError(f"{name} must be {rule}, got {value!r}")
            value = float(value) if name in ("dt", "ground", "friction_eps") else t.clone()
        self._copies.forget(name)
        setattr(self, "_" + name, value)

    def _in_range(self, t, ok):
        v = t.detach().to(self.body.dtype)
        return bool((torch.isfinite(v) & ok(v)).all())

    def _check_constants(self):
        """Each constant tensor changed in place since it was checked (an optimizer's step) is checked again; a
        ValueError for one out of range, or for a copy (:meth:`to`) whose original was changed in place."""
        for name in self._copies.stale(lambda name: getattr(self, "_" + name)):
            raise ValueError(f"sim.{name} is a copy made by Simulator.to of a tensor that was changed in place "
                             f"since, and does not follow it: call to() again from the original (or assign "
                             f"sim.{name})")
        for name in CONSTANTS:
            value = getattr(self, "_" + name)
            if not isinstance(value, torch.Tensor):
                continue
            seen = self._checked.get(name)
            if seen is not None and seen[0] is value and seen[1] == stamp(value):
                continue
            ok, rule = self._rule(name)
            if not self._in_range(value, ok):
                if seen is None:  # never checked here: a copy's (Simulator.to), converted to this body's dtype
                    raise ValueError(f"sim.{name} is {value.detach()!r} in {self.body.dtype}, out of its range: it "
                                     f"must be {rule}")
                raise ValueError(f"{name} was changed in place (by an optimizer's step?) to {value.detach()!r}, out of "
                                 f"its range: it must be {rule}. Keep it in range (e.g. optimize its logarithm and "
                                 f"assign sim.{name} = log_{name}.exp() before each step), or assign a valid value")
            self._checked[name] = (value, stamp(value))

    @property
    def rest_state(self):
        """``(x, v)``: the body's rest positions and zero velocities, a starting state."""
        x = self.body.rest_positions.detach().clone()
        return x, torch.zeros_like(x)

    @eager_under_compile
    def step(self, x0, v0, activation=None, return_info=False):
        """One backward-Euler step.

        Args:
            x0, v0: ``(N, d)`` or ``(B, N, d)`` positions and velocities, in the body's dtype and device.
            activation: ``(M,)`` or ``(B, M)`` muscle activations in [1e-6, 1] (1 relaxed); None: all 1.
            return_info: also return the solver's record.

        Returns:
            ``(x1, v1)`` shaped like ``x0`` (or ``(x1, v1, info)``), differentiable with respect to ``x0``,
            ``v0``, ``activation``, the body's fields (masses, Lame parameters, rest shapes ``Dm_inv``, muscle
            rest lengths and stiffnesses) and the constants ``dt``, ``gravity``, ``ground``,
            ``contact_stiffness``, ``friction``, ``friction_eps``. Fixed vertices keep their ``x0`` positions.

        With a batch ``x0`` of shape ``(B, N, d)``, each of the body's fields (``mass (B, N)``, ``Dm_inv
        (B, E, d, d)``, ``mu`` and ``lam (B, E)``, ``muscle_rest_length`` and ``muscle_stiffness (B, M)``) and
        each constant (``(B,)``) may carry one value per creature (domain randomisation), on every path, with
        gradients; the others are shared by the batch. A batch dimension that is not ``B`` is refused by name.
        """
        refuse_transforms("Simulator.step", (x0, v0, activation))
        if not torch.is_inference_mode_enabled():  # inference tensors keep no version, which autograd saves: copies do
            x0, v0, activation = (t.clone() if isinstance(t, torch.Tensor) and t.is_inference() else t
                                  for t in (x0, v0, activation))
        batched = self._check_state(x0, v0)
        params, top = self.step_problem(x0, v0, self._check_activation(activation, x0))
        refuse_transforms("Simulator.step", params)
        users = params.colliders[len(params.colliders) - len(self._colliders):]  # (after the ground's)
        for kind, groups in (("terms", params.terms), ("colliders", users)):
            for k, tensors in enumerate(groups):
                refuse_transforms(f"Simulator.step (sim.{kind}[{k}])", tensors)
        for k, term in enumerate(self._terms):  # (params and closures may change between steps)
            term.check_at_start(params, f"sim.terms[{k}]")
        if top.terms and self._terms_checked is not top:  # once per topology: its terms are fixed
            for term in top.terms:
                term.check(params, top.free_index >= 0)
            self._terms_checked = top
        params, shift = self._recentred(params, top)
        backend = self._backend_for(x0)
        self._check_solver_options(backend)
        try:
            if backend == "torch":
                solver = torch_backend.linear_solver_for(self.solver, len(self.body.free) * self.body.dim)
                options = dict(self.solver_options)
                if options.pop("reuse_factor", False):
                    raise ValueError("reuse_factor is an option of the C++ backend (CPU tensors): the torch backend "
                                     "refactors at every Newton step; set sim.solver_options['reuse_factor'] = False")
                y, info = torch_backend.solve_step(params, top, solver, **options)
            else:
                y, info = self._minimize(params, top, batched)
        except ValueError as e:
            if "not finite at x0" not in str(e):
                raise
            raise ValueError(f"Simulator.step: {e}. {self._why_not_finite(x0)}") from None
        x1 = top.full_positions(y if shift is None else y + shift[..., None, :], x0)
        v1 = (x1 - x0) / params.h[..., None, None]  # h: () or (B,), one per creature
        return (x1, v1, info) if return_info else (x1, v1)

    def _check_solver_options(self, backend):
        """A ValueError naming a ``solver_options`` key that the path about to step does not take (each backend
        has a few of its own; ``reuse_factor`` on the torch backend has its own message, below)."""
        torch_path = backend == "torch" and self.fused
        takes = _TORCH_OPTIONS if torch_path else _CPP_OPTIONS
        for key in self.solver_options:
            if key in takes or (torch_path and key == "reuse_factor"):
                continue
            if key not in _TORCH_OPTIONS | _CPP_OPTIONS:
                raise ValueError(f"sim.solver_options[{key!r}] is no solver option (the C++ backend takes "
                                 f"{', '.join(sorted(_CPP_OPTIONS))}; the torch backend "
                                 f"{', '.join(sorted(_TORCH_OPTIONS))}): delete it")
            owner = ("the torch backend's (diffsoft.torch_backend.solve_step)" if key in _TORCH_OPTIONS else
                     "the C++ backend's (diffsoft.minimize)")
            path = "the torch backend" if torch_path else "the C++ backend (or fused=False, diffsoft.minimize)"
            raise ValueError(f"sim.solver_options[{key!r}] is {owner} option, and this step runs on {path}, which "
                             f"does not take it: delete it (del sim.solver_options[{key!r}]), or step on that backend")

    def _recentred(self, params, top):
        """The step's problem in a frame moved horizontally to each creature, and the move ``([B,] d)`` (None:
        not moved). Far from the origin, float32 positions keep too few bits for the force residual to reach its
        tolerance (the biped 100 units out: by 1.6x, after 100 Newton iterations), so a creature whose centre is
        more than half a quantum (a power of two, at least 8 body sizes) out is solved in the frame whose origin
        is the multiple of the quantum nearest its centre, and its solution moved back. The problem is the same:
        the ground, gravity and friction do not see horizontal positions, and each collider moves with the frame
        (:meth:`~diffsoft.colliders.Collider.moved`); a user term sees positions as given, so a step with terms
        is not moved. Near the origin nothing moves (the step is bit for bit what it was). So far out that the
        dtype's rounding of a position exceeds 1e-4 of the body's size, the state itself has lost the body's
        shape: a RuntimeWarning says so."""
        if top.terms:
            return params, None
        if self._frame is None:
            rest = self.body.rest_positions.detach().reshape(-1, self.body.dim)
            size = max(float((rest.amax(0) - rest.amin(0)).max()), 1e-12)
            self._frame = (2.0 ** math.ceil(math.log2(8 * size)), size)
        quantum, size = self._frame
        horizontal = params.x0_free.detach()[..., 0::2]  # x, and z in 3D (a view)
        if float(horizontal.abs().max()) < quantum / 2:  # every vertex near the origin: the common case, one sync
            return params, None
        with torch.no_grad():
            near = torch.round(horizontal.mean(-2) / quantum) * quantum
            far = float(near.abs().max())
            if far == 0:
                return params, None
            if far * torch.finfo(near.dtype).eps > 1e-4 * size:
                warnings.warn(f"Simulator.step: x0 lies {far:.3g} from the origin, where {near.dtype} resolves "
                              f"positions to {far * torch.finfo(near.dtype).eps:.2g}, more than 1e-4 of the body's "
                              f"size ({size:.3g}): rounding has changed its shape; use float64, or keep the world "
                              f"nearer the origin", RuntimeWarning, stacklevel=_user_stacklevel())
            shift = near.new_zeros(*near.shape[:-1], self.body.dim)
            shift[..., 0::2] = near
        s = shift[..., None, :]
        colliders = tuple(p[:len(CONTACT_PARAMS)] + tuple(kind.moved(shift, *p[len(CONTACT_PARAMS):]))
                          for kind, p in zip(top.colliders, params.colliders))
        return params._replace(x_hat=params.x_hat - s, x0=params.x0 - s, x0_free=params.x0_free - s,
                               colliders=colliders), shift

    def _why_not_finite(self, x0):
        """Why the step's energy is not finite at the state ``x0``: an element inverted there (the neo-Hookean
        energy's barrier), or else an overflow."""
        body = self.body
        if body.material == Material.NEO_HOOKEAN:
            J = determinant(deformation_gradient(x0.detach(), body.elements, body.Dm_inv.detach()))
            bad = torch.nonzero(~(J > 0))
            if len(bad):
                where = tuple(bad[0].tolist())
                creature = f" of creature {where[0]}" if len(where) == 2 else ""
                return (f"Element {where[-1]} {body.elements[where[-1]].tolist()}{creature} is inverted or degenerate "
                        f"in x0 relative to its rest shape (det F = {J[where].item():.3g}; {len(bad)} such): the "
                        f"neo-Hookean energy is infinite there. Start from a state without inverted elements (e.g. "
                        f"the rest state), or check the rest shapes body.Dm_inv")
        extra = "".join(f", {what}" for what, items in (("the colliders' fields (sim.colliders)", self._colliders),
                                                          ("the terms' params (sim.terms)", self._terms)) if items)
        return ("The step's energy overflows at the start state: check x0, v0 and the constants (dt, gravity, ground, "
                f"contact_stiffness, friction, and the body's masses, moduli and muscles){extra}")

    @property
    def backend(self):
        """``"auto"``, ``"cpp"`` or ``"torch"`` (see the class docstring); may be assigned, and is checked."""
        return self._backend

    @backend.setter
    def backend(self, value):
        if value not in ("auto", "cpp", "torch"):
            raise ValueError(f"backend must be 'auto', 'cpp' or 'torch', got {value!r}")
        if value != "auto" and not self.fused:
            raise ValueError(f"backend={value!r} needs fused=True: fused=False always solves with "
                             f"diffsoft.minimize (CG on double-backward products, any device)")
        self._backend = value

    def _backend_for(self, x0):
        """``"torch"`` or ``"cpp"`` (also meaning :func:`minimize`'s path with ``fused=False``) for a state."""
        if not self.fused:
            return "cpp"
        if self.backend == "cpp" and x0.device.type != "cpu":
            raise ValueError(f"backend='cpp' runs on CPU tensors only, and the state is on {x0.device}: use "
                             f"backend='torch' or 'auto'")
        if self.backend == "auto":
            return "cpp" if x0.device.type == "cpu" else "torch"
        return self.backend

    def _minimize(self, params, top, batched):
        """The C++ path: :func:`minimize` with the fused kernels' analytic energy (``fused=False``: the plain
        energy's double-backward products)."""
        factorize = self.fused and self._factorizes()
        options = dict(self.solver_options)
        if options.get("reuse_factor") is None:  # the default: wherever the step factors
            options["reuse_factor"] = factorize
        elif options["reuse_factor"] and not factorize:
            raise ValueError("reuse_factor needs a factored Hessian, but this step solves by CG (solver='cg', "
                             "fused=False, or 'auto' choosing CG for a large 3D body without CHOLMOD): use "
                             "solver='direct', or set sim.solver_options['reuse_factor'] = False")
        if self.fused:
            top = with_kernel_model(top, params)
        energy = step_energy if self.fused else reference_step_energy
        with torch.no_grad():
            # Each problem starts from the lower-energy of the inertial prediction and x0. The prediction can
            # leave the energy's domain (an inverted neo-Hookean element) or overflow it (a large dt, fast
            # vertices, float32); x0, a valid state, cannot, and NaN or inf at the prediction selects x0.
            x_hat, start = params.x_hat.detach(), params.x0_free.detach()
            flat = params.flat()
            if self.fused:
                at_hat, at_start = step_energy_values((x_hat, start), *flat, top)
            else:
                at_hat, at_start = (energy(y, *flat, top) for y in (x_hat, start))
            better = at_hat <= at_start
            guess = torch.where(better[..., None, None], x_hat, start)
        analytic = analytic_energy(guess, *flat, top, factorize=factorize) if self.fused else None
        return minimize(energy, guess, *flat, top, batched=batched, return_info=True, _analytic=analytic,
                        **options)

    def step_problem(self, x0, v0, activation):
        """The step from ``(x0, v0)`` under ``activation`` as the problem the solver minimises:
        ``(StepParams, StepTopology)`` (:mod:`diffsoft.step`), the parameters differentiable with respect to
        ``x0``, ``v0``, ``activation``, the body's fields and the simulator's constants. Checks that each of
        those is shared by the batch or has one value per creature of ``x0``'s batch (ValueError naming it);
        the state's checks are :meth:`step`'s, which calls this with a checked state (``activation`` None when
        the body has no muscles)."""
        body = self.body
        body.check()
        self._check_constants()
        for kind, items in (("colliders", self._colliders), ("terms", self._terms)):
            for k, item in enumerate(items):
                item.check_copies(f"sim.{kind}[{k}]")
        self._refresh_default_atol()
        top = self.topology
        constants = self._step_constants()
        batch = x0.shape[0] if x0.dim() == 3 else None
        self._check_parameters(batch, constants)
        h = constants["dt"]
        x0_free = x0 if top.all_free else x0[..., top.free, :]
        v0_free = v0 if top.all_free else v0[..., top.free, :]
        mu, lam = body.mu, body.lam
        if body.material != Material.ALGOVIVO:  # the densities are 1-homogeneous in (mu, lam): fold volumes in
            volume = 1.0 / (math.factorial(body.dim) * determinant(body.Dm_inv).abs())
            mu, lam = mu * volume, lam * volume
        params = StepParams(
            x_hat=x0_free + h[..., None, None] * v0_free, x0=x0, x0_free=x0_free,
            mass=body.mass if top.all_free else body.mass[..., top.free], Dm_inv=body.Dm_inv, mu=mu, lam=lam,
            activation=activation, muscle_rest_length=body.muscle_rest_length,
            muscle_stiffness=body.muscle_stiffness, gravity=constants["gravity"], h=h,
            colliders=self._collider_params(batch, constants),
            terms=tuple(self._term_params(k, t) for k, t in enumerate(self._terms)))
        return params, top

    def _step_constants(self):
        """The constants as the step reads them, by name: tensors of the body's dtype and device."""
        body = self.body
        return {name: c.to(dtype=body.dtype, device=body.device) if isinstance(c, torch.Tensor) else
                _constant(0.0 if c is None else c, body.dtype, body.device)
                for name, c in ((name, getattr(self, name)) for name in CONSTANTS)}

    def _term_params(self, k, term):
        """A user term's parameters, checked: tensors of the body's dtype and device (the term's energy reads
        them as they are, a batch dimension included)."""
        for j, t in enumerate(term.params):
            self._check_tensor(f"terms[{k}].params[{j}]", t)
        return term.params

    def _collider_params(self, batch, constants):
        """Each collider's step parameters (``StepParams.colliders``, in ``topology.colliders``' order) for a
        state of ``batch`` creatures (None: one). The ground's: the simulator's ``constants`` (as the step reads
        them, checked by :meth:`_check_parameters`), the unit normal +y and the height as the offset."""
        body = self.body
        out = ()
        if self._ground is not None:
            out = ((constants["contact_stiffness"], constants["friction"], constants["friction_eps"],
                    _unit_y(body.dim, body.dtype, body.device), constants["ground"]),)
        return out + tuple(c.step_params(self, batch) for c in self._colliders)

    def _check_parameters(self, batch, constants):
        """Each of the body's fields and each constant (``constants``, by name, as the step reads them) is shared
        (its own shape) or has one value per creature of a batch of ``batch`` (None: x0 is one creature), in the
        body's dtype and device; else a ValueError or TypeError naming it."""
        body = self.body
        dtype, device = body.dtype, body.device
        e, m, d = len(body.elements), len(body.muscles), body.dim
        fields = [("body.mass", body.mass, [(body.num_vertices,)]), ("body.Dm_inv", body.Dm_inv, [(e, d, d)]),
                  ("body.mu", body.mu, [(e,), ()]), ("body.lam", body.lam, [(e,), ()]),
                  ("body.muscle_rest_length", body.muscle_rest_length, [(m,)]),
                  ("body.muscle_stiffness", body.muscle_stiffness, [(m,), ()])]
        for name in CONSTANTS:
            if isinstance(getattr(self, "_" + name), torch.Tensor):
                fields.append((name, constants[name], [()]))
        for name, t, shapes in fields:
            if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.device != device:
                self._check_tensor(name, t)  # raises, naming what differs
            shape = tuple(t.shape)
            if shape in shapes or (batch is not None and shape[:1] == (batch,) and shape[1:] == shapes[0]):
                continue
            shared = " or ".join(str(s) for s in shapes)
            if batch is None:
                raise ValueError(f"{name} has shape {shape}, but it must be {shared} for one creature: x0 is (N, d); "
                                 f"one value per creature needs a batch x0 of shape (B, N, d) and {name} of "
                                 f"shape (B, *{shapes[0]})")
            raise ValueError(f"{name} has shape {shape}, but it must be {shared} (shared by the batch) or "
                             f"{(batch,) + shapes[0]} (one per creature of x0's batch of {batch})")

    def rollout(self, x0, v0, activations=None, steps=None, controller=None):
        """``steps`` steps from ``(x0, v0)``; the graph keeps one state per step, not the solver's iterations.

        Args:
            activations: ``(T, M)`` or ``(T, B, M)``, one activation per step; or None.
            steps: the number of steps T (default ``len(activations)``).
            controller: instead of ``activations``, a callable ``controller(x, v, t) -> activation``.

        Returns:
            ``xs, vs``: ``(T + 1, *x0.shape)`` states, ``xs[0] = x0``.
        """
        if activations is not None and controller is not None:
            raise ValueError("give activations or controller, not both")
        if steps is not None and not (isinstance(steps, numbers.Integral) and not isinstance(steps, bool)
                                      and steps >= 0):
            raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
        if steps is None:
            if activations is None:
                raise ValueError("give steps, or activations (one per step)")
            steps = len(activations)
            if (isinstance(activations, torch.Tensor) and activations.dim() == 2 and x0.dim() == 3
                    and len(activations) == x0.shape[0]):
                # (B, M) for a batch of B, one activation per creature, reads as B steps
                warnings.warn(f"rollout: activations of shape {tuple(activations.shape)} with a batch of "
                              f"{x0.shape[0]} creatures are read as {steps} steps, each shared by the batch; for one "
                              f"activation per creature and step give (T, B, M), and pass steps= to say T",
                              RuntimeWarning, stacklevel=2)
        elif activations is not None and len(activations) != steps:
            raise ValueError(f"activations has {len(activations)} entries for {steps} steps")
        xs, vs = [x0], [v0]
        for t in range(steps):
            a = controller(xs[-1], vs[-1], t) if controller is not None else (
                None if activations is None else activations[t])
            x, v = self.step(xs[-1], vs[-1], a)
            xs.append(x)
            vs.append(v)
        return torch.stack(xs), torch.stack(vs)

    def kinetic_energy(self, v):
        """``1/2 sum_i m_i |v_i|^2``; v: ``(..., N, d)`` -> ``v.shape[:-2]``."""
        return 0.5 * (self.body.mass * (v * v).sum(-1)).sum(-1)

    def potential_energy(self, x, activation=None):
        """Elastic + muscle + gravity + contact energy with the colliders (friction, a dissipation, is left out);
        x: ``(..., N, d)`` -> ``x.shape[:-2]``."""
        body = self.body
        weight = None if body.material == "algovivo" else \
            1.0 / (math.factorial(body.dim) * determinant(body.Dm_inv).abs())
        e = elastic_energy(x, body.elements, body.Dm_inv, body.mu, body.lam, body.material, weight)
        if body.num_muscles:
            a = torch.ones_like(body.muscle_rest_length) if activation is None else activation
            e = e + muscle_energy(x, body.muscles, a, body.muscle_rest_length, body.muscle_stiffness)
        e = e + gravity_energy(x, body.mass, self.gravity)
        params = self._collider_params(x.shape[0] if x.dim() == 3 else None, self._step_constants())
        for kind, (kc, _, _, *geometry) in zip(self._collider_kinds(), params):
            e = e + contact_energy(x, x, 1.0, kc, 0.0, 0.0, kind.surface, *geometry)
        return e

    def __repr__(self):
        def show(c):
            if c is None or isinstance(c, float):
                return repr(c)
            return f"{c.item():g}" if c.dim() == 0 else f"<{len(c)} per creature>"

        colliders = f", colliders={list(self._colliders)!r}" if self._colliders else ""
        return (f"Simulator({self.body!r}, dt={show(self.dt)}, gravity={show(self.gravity)}, "
                f"ground={show(self.ground)}, contact_stiffness={show(self.contact_stiffness)}, "
                f"friction={show(self.friction)}, friction_eps={show(self.friction_eps)}{colliders})")

    def _check_tensor(self, name, t):
        """A tensor of the body's dtype and device, or a TypeError/ValueError naming what differs."""
        body = self.body
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != body.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but the body has {body.dtype} (see SoftBody.to)")
        if t.device != body.device:
            raise ValueError(f"{name} is on {t.device} but the body is on {body.device}")

    def _check_state(self, x0, v0):
        body = self.body
        for name, t in (("x0", x0), ("v0", v0)):
            self._check_tensor(name, t)
            if t.dim() not in (2, 3) or t.shape[-2:] != (body.num_vertices, body.dim):
                raise ValueError(f"{name} must be (N, d) = {(body.num_vertices, body.dim)} or (B, N, d), "
                                 f"got shape {tuple(t.shape)}")
        if x0.shape != v0.shape:
            raise ValueError(f"x0 and v0 must have the same shape, got {tuple(x0.shape)} and {tuple(v0.shape)}")
        if x0.dim() == 3 and len(x0) == 0:
            raise ValueError("x0 holds no creatures (a batch of 0): step at least one")
        if not bool(torch.isfinite(x0).all() & torch.isfinite(v0).all()):  # (one host read for both)
            for name, t in (("x0", x0), ("v0", v0)):
                bad = ~torch.isfinite(t).reshape(-1 if t.dim() == 3 else 1, *t.shape[-2:]).flatten(1).all(1)
                if bool(bad.any()):
                    which = f" for creature(s) {torch.nonzero(bad).flatten().tolist()[:10]}" if t.dim() == 3 else ""
                    raise ValueError(f"{name} has non-finite (NaN or infinite) values{which}")
        return x0.dim() == 3

    def _check_activation(self, a, x0):
        body = self.body
        m = body.num_muscles
        if a is None:
            return torch.ones(m, dtype=body.dtype, device=body.device) if m else None
        self._check_tensor("activation", a)
        shapes = [(m,)] + ([(x0.shape[0], m)] if x0.dim() == 3 else [])
        if tuple(a.shape) not in shapes:
            raise ValueError(f"activation must have shape {' or '.join(map(str, shapes))} (one per muscle), "
                             f"got {tuple(a.shape)}")
        if m == 0:
            return None
        ok = (a >= MIN_ACTIVATION) & (a <= 1)
        if not bool(ok.all()):
            bad = a[~ok].flatten()[0].item()
            raise ValueError(f"activation must be in [{MIN_ACTIVATION:g}, 1] (1 is relaxed; a muscle's rest length "
                             f"is scaled by it, and cannot vanish), got {bad:g}")
        return a


def _check_constant_kind(name, value, rule):
    """A TypeError naming ``name`` unless ``value`` is a real number (not a bool) or a 0-dim or ``(B,)`` real
    tensor (one per creature): the kind every simulator constant takes, whatever its range (``rule``)."""
    is_tensor = isinstance(value, torch.Tensor)
    if (is_tensor and (value.dim() > 1 or value.numel() == 0 or value.is_complex() or value.dtype == torch.bool)) or (
            not is_tensor and (isinstance(value, bool) or not isinstance(value, numbers.Real))):
        raise TypeError(f"{name} must be {rule}, or a 0-dim or (B,) tensor (one per creature) of them, got {value!r}")
