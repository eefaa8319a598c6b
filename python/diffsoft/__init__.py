"""diffsoft: differentiable implicit soft-body physics for PyTorch."""
from . import creatures, energies, mesh, render
from ._extension import ConvergenceError, SolveInfo
from ._minimize import minimize
from .body import SoftBody
from .creatures import load_algovivo, save_algovivo
from .simulator import Simulator

__all__ = ["minimize", "ConvergenceError", "SolveInfo", "SoftBody", "Simulator", "load_algovivo", "save_algovivo",
           "creatures", "energies", "mesh", "render"]
