"""diffsoft: differentiable implicit soft-body physics for PyTorch."""
from ._extension import ConvergenceError, SolveInfo
from ._minimize import minimize

__all__ = ["minimize", "ConvergenceError", "SolveInfo"]
