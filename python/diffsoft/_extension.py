"""Loads the compiled core diffsoft._C, and says "rebuild" when it was built for another torch."""
import torch

try:
    from ._build_info import TORCH_VERSION as _BUILT_WITH
except ImportError:  # pragma: no cover - only when the package was never built
    _BUILT_WITH = None

_REBUILD = "rebuild it: pip install --no-build-isolation --force-reinstall -e . (or without -e)"

if _BUILT_WITH is not None and _BUILT_WITH != torch.__version__:
    raise ImportError(
        f"diffsoft was built against torch {_BUILT_WITH} but torch {torch.__version__} is installed; {_REBUILD}"
    )
try:
    from . import _C
except ImportError as e:  # undefined symbols and the like: almost always a torch mismatch
    raise ImportError(f"diffsoft's compiled core failed to load ({e}); {_REBUILD}") from e

ConvergenceError = _C.ConvergenceError
ConvergenceError.__doc__ = """A solve that did not converge, raised instead of a warning under ``on_failure="raise"``
(:func:`diffsoft.minimize`, ``Simulator(on_failure=...)``), forward or backward. A ``RuntimeError``; its message
names the failed criterion and the failed problems of a batch, and ``.info`` holds the solve's
:class:`SolveInfo`."""
SolveInfo = _C.SolveInfo
SolveInfo.__doc__ = """The record of one solve (``minimize(..., return_info=True)``, ``Simulator.step(...,
return_info=True)``): ``converged``, ``iterations``, ``cg_iterations``, ``hvp_count``, ``factorizations``,
``line_search_steps``, ``fallback_steps``, ``energy``, ``grad_norm``, ``grad_norm_initial``,
``problem_converged`` (one flag per problem of a batch) and ``message``; after ``backward()``, the adjoint solve's
``backward_converged``, ``backward_cg_iterations``, ``backward_direct``, ``backward_residual`` (relative) and
``backward_message``. docs/concepts.md describes each."""
SolverOptions = _C.SolverOptions
