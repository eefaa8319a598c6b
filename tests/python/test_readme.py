"""Every Python code block of README.md runs as written (in a temporary directory), so the README cannot
drift from the library."""
import os
import re

import pytest
import torch

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def _blocks():
    with open(README) as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.S | re.M)


def test_the_readme_has_python_blocks():
    assert len(_blocks()) >= 2


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_readme_python_block_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(_blocks()[index], f"README.md python block {index + 1}", "exec"), namespace)
    grads = [v.grad for v in namespace.values() if isinstance(v, torch.Tensor) and v.requires_grad and v.is_leaf]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)  # every leaf the block marks gets one
