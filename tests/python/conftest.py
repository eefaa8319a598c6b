"""Shared by every Python test: the dtypes and devices tests run in, and seeded random state, so that a test's
data does not depend on which tests ran before it (``pytest -k``, ``-x`` and a full run see the same numbers)."""
import pytest
import torch

F64, F32 = torch.float64, torch.float32
DTYPES = (F64, F32)
"""Float64 first: derivatives are checked against finite differences in it; float32 is the training dtype."""


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global random state."""
    torch.manual_seed(0)


@pytest.fixture(params=DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def dtype(request):
    """Runs a test once per dtype of :data:`DTYPES`."""
    return request.param


DEVICES = ("cpu", "cuda")
"""The CPU always; CUDA where ``torch.cuda.is_available()`` (skipped elsewhere)."""


@pytest.fixture(params=DEVICES)
def device(request):
    """Runs a test once per device of :data:`DEVICES`, skipping those this machine lacks."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device(request.param)


@pytest.fixture
def generator():
    """A ``torch.Generator`` seeded at 0, for tests that draw their own data."""
    return torch.Generator().manual_seed(0)
