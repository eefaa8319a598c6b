"""Simulator: one backward-Euler step of a SoftBody as an energy minimisation, differentiable end to end.

One step solves ``x1 = argmin_x 1/2 sum_i m_i |x_i - (x0_i + h v0_i)|^2 + h^2 U(x)`` and sets
``v1 = (x1 - x0) / h``, where ``U`` sums elasticity, muscles, gravity, ground contact and lagged friction
(see :mod:`diffsoft.energies`). The solver minimises the same objective divided by ``h^2``:

    ``E(x) = 1/(2 h^2) sum_i m_i |x_i - x_hat_i|^2 + U(x)``,  ``grad E = M (x - x_hat) / h^2 - f(x)``,

so its gradient is the residual of the discrete momentum balance ``M a = f`` in units of force, and the
solver's tolerances are force tolerances (see :class:`Simulator`). Scaling changes neither the minimiser,
nor Newton's steps, nor the implicit gradients.
"""
import math
import types

import torch

from ._extension import _C
from ._minimize import minimize
from .fused import analytic_energy, step_energy, with_model
from .energies import (determinant, elastic_energy, friction_energy, gravity_energy, ground_contact_energy,
                       inertia_energy, muscle_energy)

_HAS_CHOLMOD = _C.HAS_CHOLMOD

# algovivo's contact and friction constants per unit of its vertex mass: the defaults scale them to a body.
ALGOVIVO_VERTEX_MASS = 6.0714287757873535
_CONTACT_PER_MASS = 14000.0 / ALGOVIVO_VERTEX_MASS
_FRICTION_PER_MASS = 300.0 / ALGOVIVO_VERTEX_MASS


class Simulator:
    """Steps a :class:`~diffsoft.body.SoftBody` in time by backward Euler.

    Args:
        body: the SoftBody.
        dt: the time step ``h`` (s).
        gravity: the gravitational acceleration's magnitude ``g``, pulling along -y.
        ground: the ground's height (y), or None for no ground (then no contact and no friction).
        contact_stiffness: ``k_c`` of the penalty ``k_c min(y - ground, 0)^2``; default algovivo's
            14000 per 6.0714 of mean vertex mass (a vertex resting on the ground sinks ``m g / (2 k_c)``,
            about 2 mm at g = 9.8).
        friction: ``k_f`` of the lagged friction ``k_f max(eps - (y0 - ground), 0) |v_t|^2``; default
            algovivo's 300 per 6.0714 of mean vertex mass.
        friction_eps: ``eps``, the height above the ground under which friction acts.
        rtol, atol: the step's convergence test, ``|grad E| <= max(atol, rtol |grad E(x_hat)|)`` per problem,
            where ``grad E`` is the force residual (see the module docstring). ``rtol=None``: the solver's
            default (1e-8 in float64, 1e-4 in float32); ``atol=None``: 1e-8 (float64) or 1e-5 (float32)
            times the body's force scale (its weight plus the elastic force that stretches every element by
            100%). Round-off bounds what is reachable: the line search needs energy decreases it can resolve,
            which for stiff bodies stops near ``sqrt(eps * stiffness * |energy terms|)``, well above ``eps``.
        fused: use the fused step energy (:mod:`diffsoft.fused`: closed-form gradient, Hessian-vector products
            from per-element blocks) instead of double backward through the plain-torch energy; the same
            values and derivatives, several times faster.
        solver: how the fused step solves its Newton and adjoint systems (CPU): ``"direct"``, a factorization
            of each creature's Hessian (CG where it is not positive definite); ``"cg"``, Jacobi-preconditioned
            CG on the kernels' Hessian products; ``"auto"`` (default), direct, except CG for 3D bodies of more
            than 5000 unknowns when diffsoft was built without CHOLMOD.
            Other devices, and ``fused=False`` (the paper's plain CG on double-backward products), use CG.
        keep_factors: with the direct solver, each step keeps Newton's last factorization for its backward,
            which then costs back-substitutions instead of a fresh factorization (about 4x cheaper on large
            meshes), at the memory of one factor (and the Hessian blocks it was made from) per step of a
            rollout until its backward has run.
        max_iter, cg_rtol, cg_max_iter, backward_rtol, backward_max_iter, on_failure: passed to
            :func:`diffsoft.minimize`; all are kept in ``self.solver_options``, which may be edited.

    ``gravity``, ``contact_stiffness`` and ``friction`` are stored as 0-dim tensors of the body's dtype and
    may be made to require grad; so may every floating field of ``body``.
    """

    def __init__(self, body, dt=1 / 30, gravity=9.8, ground=0.0, contact_stiffness=None, friction=None,
                 friction_eps=0.01, rtol=None, atol=None, max_iter=100, cg_rtol=0.5, cg_max_iter=None,
                 backward_rtol=1e-10, backward_max_iter=None, on_failure="warn", fused=True, solver="auto",
                 keep_factors=False):
        if not (isinstance(dt, (int, float)) and dt > 0 and math.isfinite(dt)):
            raise ValueError(f"dt must be a positive number, got {dt!r}")
        if ground is not None and not (isinstance(ground, (int, float)) and math.isfinite(ground)):
            raise ValueError(f"ground must be a number (the ground's height) or None, got {ground!r}")
        if not (isinstance(friction_eps, (int, float)) and friction_eps >= 0):
            raise ValueError(f"friction_eps must be a number >= 0, got {friction_eps!r}")
        self.body = body
        self.dt = float(dt)
        self.ground = None if ground is None else float(ground)
        self.friction_eps = float(friction_eps)
        self.fused = bool(fused)
        if solver not in ("auto", "direct", "cg"):
            raise ValueError(f"solver must be 'auto', 'direct' or 'cg', got {solver!r}")
        self.solver = solver
        mean_mass = body.mass.detach().mean().item()
        self.gravity = self._scalar("gravity", gravity, allow_zero=True)
        self.contact_stiffness = self._scalar(
            "contact_stiffness", _CONTACT_PER_MASS * mean_mass if contact_stiffness is None else contact_stiffness)
        self.friction = self._scalar("friction", _FRICTION_PER_MASS * mean_mass if friction is None else friction,
                                     allow_zero=True)
        if atol is None:
            atol = (1e-8 if body.dtype == torch.float64 else 1e-5) * self._force_scale()
        self.solver_options = dict(rtol=rtol, atol=atol, max_iter=max_iter, cg_rtol=cg_rtol,
                                   cg_max_iter=cg_max_iter, backward_rtol=backward_rtol,
                                   backward_max_iter=backward_max_iter, on_failure=on_failure,
                                   keep_factor=keep_factors)
        self._static = self._static_data()

    def _static_data(self):
        """What the step energy needs besides tensors that may require grad: indices and constants."""
        body = self.body
        slot = torch.full((body.num_vertices,), -1, dtype=torch.long, device=body.device)
        slot[body.free] = torch.arange(len(body.free), device=body.device)
        return types.SimpleNamespace(
            elements=body.elements, muscles=body.muscles if body.num_muscles else None, free=body.free,
            slot=slot, all_free=len(body.fixed) == 0, material=body.material, h=self.dt, ground=self.ground,
            eps=self.friction_eps, factor_cache=_C.FactorCache())

    def _factorizes(self):
        """Whether the steps factor their Hessians: ``solver="direct"``, or ``"auto"`` unless the body is 3D,
        large, and diffsoft was built without CHOLMOD (Eigen's simplicial factorization then loses to CG
        above about 5000 unknowns in 3D; with CHOLMOD, or in 2D, factoring won at every size measured)."""
        if self.solver != "auto":
            return self.solver == "direct"
        return _HAS_CHOLMOD or self.body.dim == 2 or len(self.body.free) * self.body.dim <= 5000

    def _force_scale(self):
        """The body's weight plus the elastic force that would stretch every element by 100%: round-off in
        the step's force residual is relative to forces of this size."""
        b = self.body
        vol = b.rest_volume.detach()
        weight = vol if b.material != "algovivo" else torch.ones_like(vol)
        elastic = (b.mu.detach() * weight / vol ** (1.0 / b.dim)).sum().item()
        return b.mass.detach().sum().item() * max(abs(self.gravity.item()), 1.0) + elastic

    def to(self, dtype=None, device=None):
        """A copy on ``device`` in ``dtype`` (body included); solver options are kept, the default atol too."""
        out = object.__new__(Simulator)
        out.__dict__.update(self.__dict__)
        out.body = self.body.to(dtype=dtype, device=device)
        for name in ("gravity", "contact_stiffness", "friction"):
            setattr(out, name, getattr(self, name).detach().to(device=device, dtype=dtype))
        out.solver_options = dict(self.solver_options)
        out._static = out._static_data()
        return out

    @property
    def rest_state(self):
        """``(x, v)``: the body's rest positions and zero velocities, a starting state."""
        x = self.body.rest_positions.detach().clone()
        return x, torch.zeros_like(x)

    def step(self, x0, v0, activation=None, return_info=False):
        """One backward-Euler step.

        Args:
            x0, v0: ``(N, d)`` or ``(B, N, d)`` positions and velocities, in the body's dtype and device.
            activation: ``(M,)`` or ``(B, M)`` muscle activations in (0, 1] (1 relaxed); None: all 1.
            return_info: also return the solver's record.

        Returns:
            ``(x1, v1)`` shaped like ``x0`` (or ``(x1, v1, info)``), differentiable with respect to ``x0``,
            ``v0``, ``activation``, the body's fields (masses, Lame parameters, rest shapes ``Dm_inv``, muscle
            rest lengths and stiffnesses) and ``gravity``, ``contact_stiffness``, ``friction``. Fixed vertices
            keep their ``x0`` positions.
        """
        batched = self._check_state(x0, v0)
        activation = self._check_activation(activation, x0)
        body, s, h = self.body, self._static, self.dt
        x0_free = x0 if s.all_free else x0[..., s.free, :]
        v0_free = v0 if s.all_free else v0[..., s.free, :]
        x_hat = x0_free + h * v0_free
        mass = body.mass if s.all_free else body.mass[s.free]
        mu, lam = body.mu, body.lam
        if body.material != "algovivo":  # the densities are 1-homogeneous in (mu, lam): fold volumes in
            volume = 1.0 / (math.factorial(body.dim) * determinant(body.Dm_inv).abs())
            mu, lam = mu * volume, lam * volume
        materials = (mass, body.Dm_inv, mu, lam, body.muscle_rest_length, body.muscle_stiffness)
        constants = (self.gravity, self.contact_stiffness, self.friction)
        if self.fused and x0.device.type == "cpu":
            s = with_model(s, *materials, *constants)
        params = (x_hat, x0, x0_free, *materials[:4], activation, *materials[4:], *constants, s)
        energy = step_energy if self.fused else _step_energy
        with torch.no_grad():
            # Each problem starts from the lower-energy of the inertial prediction and x0. The prediction can
            # leave the energy's domain (an inverted neo-Hookean element) or overflow it (a large dt, fast
            # vertices, float32); x0, a valid state, cannot, and NaN or inf at the prediction selects x0.
            start = x0_free.detach()
            better = energy(x_hat.detach(), *params) <= energy(start, *params)
            guess = torch.where(better[..., None, None], x_hat.detach(), start)
        analytic = analytic_energy(guess, *params, factorize=self._factorizes()) if self.fused else None
        y, info = minimize(energy, guess, *params, batched=batched, return_info=True, _analytic=analytic,
                           **self.solver_options)
        x1 = y if s.all_free else x0.index_copy(x0.dim() - 2, s.free, y)
        v1 = (x1 - x0) / h
        return (x1, v1, info) if return_info else (x1, v1)

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
        if steps is None:
            if activations is None:
                raise ValueError("give steps, or activations (one per step)")
            steps = len(activations)
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
        """Elastic + muscle + gravity + ground contact energy (friction, a dissipation, is left out);
        x: ``(..., N, d)`` -> ``x.shape[:-2]``."""
        body = self.body
        weight = None if body.material == "algovivo" else \
            1.0 / (math.factorial(body.dim) * determinant(body.Dm_inv).abs())
        e = elastic_energy(x, body.elements, body.Dm_inv, body.mu, body.lam, body.material, weight)
        if body.num_muscles:
            a = torch.ones_like(body.muscle_rest_length) if activation is None else activation
            e = e + muscle_energy(x, body.muscles, a, body.muscle_rest_length, body.muscle_stiffness)
        e = e + gravity_energy(x, body.mass, self.gravity)
        if self.ground is not None:
            e = e + ground_contact_energy(x, self.contact_stiffness, self.ground)
        return e

    def __repr__(self):
        return (f"Simulator({self.body!r}, dt={self.dt:g}, gravity={self.gravity.item():g}, "
                f"ground={self.ground}, contact_stiffness={self.contact_stiffness.item():g}, "
                f"friction={self.friction.item():g})")

    def _scalar(self, name, value, allow_zero=False):
        t = torch.as_tensor(value, dtype=self.body.dtype, device=self.body.device)
        if t.dim() != 0 or not torch.isfinite(t) or t < 0 or (t == 0 and not allow_zero):
            raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} number, got {value!r}")
        return t

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
        ok = (a > 0) & (a <= 1)
        if not bool(ok.all()):
            bad = a[~ok].flatten()[0].item()
            raise ValueError(f"activation must be in (0, 1] (1 is relaxed), got {bad:g}")
        return a


def _step_energy(y, x_hat, x0, x0_free, mass, Dm_inv, mu, lam, activation, rest_length, stiffness, gravity,
                 contact_stiffness, friction, s):
    """The step's objective divided by h^2; ``y`` holds the free vertices, ``(F, d)`` or ``(B, F, d)``.
    ``mu, lam`` arrive with the elements' weights folded in. Returns ``y.shape[:-2]``: one energy per problem of
    a batch (so that each gets its own line search), a 0-dim tensor for a single problem."""
    x = y if s.all_free else x0.index_copy(x0.dim() - 2, s.free, y)
    e = elastic_energy(x, s.elements, Dm_inv, mu, lam, s.material)
    # Gravity relative to the start of the step: the same minimiser and derivatives, but an objective near 0
    # whose changes the line search can still resolve in floating point close to the solution.
    e = e + inertia_energy(y, x_hat, mass) / (s.h * s.h) + gravity_energy(y - x0_free, mass, gravity)
    if s.muscles is not None:
        e = e + muscle_energy(x, s.muscles, activation, rest_length, stiffness)
    if s.ground is not None:
        e = e + ground_contact_energy(y, contact_stiffness, s.ground)
        e = e + friction_energy(y, x0_free, s.h, friction, s.ground, s.eps)
    return e
