"""diffsoft: differentiable implicit soft-body physics for PyTorch."""
from . import colliders, creatures, energies, mesh, policy, ppo, render, task, terms, training
from ._extension import ConvergenceError, SolveInfo
from ._minimize import minimize
from .body import SoftBody
from .creatures import load_algovivo, save_algovivo
from .simulator import Simulator
from .terms import Term
from .policy import FramePolicy, load_algovivo_policy, save_algovivo_policy
from .training import TrainConfig, train

__all__ = ["minimize", "ConvergenceError", "SolveInfo", "SoftBody", "Simulator", "Term", "load_algovivo",
           "save_algovivo", "colliders", "creatures", "energies", "mesh", "policy", "render", "task", "terms",
           "training", "ppo", "FramePolicy", "TrainConfig", "train", "load_algovivo_policy", "save_algovivo_policy"]
