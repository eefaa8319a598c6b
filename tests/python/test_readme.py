"""Every Python code block of README.md and of the how-tos runs as written (in a temporary directory), so the
docs cannot drift from the library."""
import os
import re

import pytest
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FILES = ["README.md", "docs/system_identification.md", "docs/trajectory_optimization.md"]
"""(docs/parameters.md's blocks run in test_parameters.py.)"""


def _blocks(name):
    with open(os.path.join(ROOT, name)) as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.S | re.M)


def test_the_readme_and_the_how_tos_have_python_blocks():
    assert len(_blocks("README.md")) >= 2
    assert all(_blocks(name) for name in FILES)


@pytest.mark.parametrize("name, index", [(name, i) for name in FILES for i in range(len(_blocks(name)))])
def test_python_block_runs(name, index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(_blocks(name)[index], f"{name} python block {index + 1}", "exec"), namespace)
    grads = [v.grad for v in namespace.values() if isinstance(v, torch.Tensor) and v.requires_grad and v.is_leaf]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)  # every leaf the block marks gets one
