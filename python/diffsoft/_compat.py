"""The torch-version-specific calls of the Python package, in one place (the C++ side keeps its own in
``csrc/bindings.cpp``)."""
import re

import torch

TORCH_VERSION = tuple(int(n) for n in re.findall(r"\d+", torch.__version__)[:2])
"""``(major, minor)`` of the torch in use, e.g. ``(1, 13)``."""


def load_checkpoint(path):
    """``torch.load`` of a diffsoft checkpoint (tensors, numbers, strings, lists and dicts only) onto the CPU.
    From torch 2.4, with ``weights_only=True``: what torch 2.6 does by default, and 2.4-2.5 warn about; torch
    1.13's ``weights_only`` loader cannot read floats, so it is not asked for there."""
    extra = {"weights_only": True} if TORCH_VERSION >= (2, 4) else {}
    return torch.load(path, map_location="cpu", **extra)
