"""diffsoft.threads.set_num_threads: what ``--threads N`` means. It sets torch's pool and every loaded OpenBLAS
(whose pthread build otherwise keeps one worker per core, busy beside a process told to use one thread)."""
import ctypes
import os

import pytest
import torch

from diffsoft import threads


def openblas_getters():
    """openblas_get_num_threads of each OpenBLAS loaded in this process (one per distinct function)."""
    getters = {}
    for path in threads._loaded_blas_paths():
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        getter = getattr(lib, "openblas_get_num_threads", None)
        if getter is not None:
            getter.restype = ctypes.c_int
            getters[ctypes.cast(getter, ctypes.c_void_p).value] = getter
    return list(getters.values())


@pytest.fixture
def restore_threads():
    before_torch = torch.get_num_threads()
    before_blas = [g() for g in openblas_getters()]
    yield
    torch.set_num_threads(before_torch)
    if before_blas:
        threads.set_blas_threads(before_blas[0])


@pytest.mark.parametrize("n", [1, 2])
def test_set_num_threads_sets_torch_and_every_loaded_openblas(n, restore_threads):
    getters = openblas_getters()
    threads.set_num_threads(n)
    assert torch.get_num_threads() == n
    assert [g() for g in getters] == [n] * len(getters)
    assert threads.set_blas_threads(n) == len(getters)


def test_debians_torch_runs_on_openblas():
    """The machines this project targets (Debian's python3-torch and CHOLMOD) load OpenBLAS, so the test above
    is not vacuous there; elsewhere (a pip torch with MKL) there may be none to set."""
    if not os.path.isdir("/usr/lib/x86_64-linux-gnu/openblas-pthread"):
        pytest.skip("no Debian OpenBLAS (pthread build) on this machine")
    assert openblas_getters()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None])
def test_set_num_threads_refuses_what_is_not_a_positive_integer(bad):
    with pytest.raises(ValueError, match="positive integer"):
        threads.set_num_threads(bad)
