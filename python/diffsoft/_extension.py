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
SolveInfo = _C.SolveInfo
SolverOptions = _C.SolverOptions
