"""diffsoft: differentiable implicit soft-body physics for PyTorch."""
from . import creatures, energies, mesh, policy, ppo, render, task, training
from ._extension import ConvergenceError, SolveInfo
from ._minimize import minimize
from .body import SoftBody
from .creatures import load_algovivo, save_algovivo
from .simulator import Simulator
from .policy import FramePolicy, load_algovivo_policy, save_algovivo_policy
from .training import TrainConfig, train

__all__ = ["minimize", "ConvergenceError", "SolveInfo", "SoftBody", "Simulator", "load_algovivo", "save_algovivo",
           "creatures", "energies", "mesh", "policy", "render", "task", "training", "ppo", "FramePolicy", "TrainConfig",
           "train", "load_algovivo_policy", "save_algovivo_policy"]
