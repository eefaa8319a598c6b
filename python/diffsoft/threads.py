"""How many threads the libraries under diffsoft use: torch's own pool, and the OpenBLAS that Debian's torch and
the CHOLMOD behind the sparse factorizations call, which ``torch.set_num_threads`` does not reach."""
import ctypes
import os

import torch


def _loaded_blas_paths():
    """The shared libraries mapped into this process whose file name names a BLAS (``/proc/self/maps``; none
    where there is no ``/proc``)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except OSError:
        return []
    return sorted(p for p in paths if "blas" in os.path.basename(p) and ".so" in os.path.basename(p))


def set_blas_threads(n):
    """Sets the thread count of every OpenBLAS loaded in this process to ``n`` and returns how many it set (0
    when none is loaded, e.g. torch with MKL, which ``torch.set_num_threads`` already governs). OpenBLAS's
    pthread build starts one worker per core at load; left alone, on 2 cores they took two thirds of a core
    more CPU time, spinning, in a training process told to use one thread (``docs/training.md``, "Threads")."""
    setters = {}  # by address: Debian's libblas.so.3 reaches the same OpenBLAS as libopenblas*.so
    for path in _loaded_blas_paths():
        try:  # RTLD_NOLOAD: a handle to the copy already loaded, never a second copy
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        setter = getattr(lib, "openblas_set_num_threads", None)
        if setter is not None:
            setters[ctypes.cast(setter, ctypes.c_void_p).value] = setter
    for setter in setters.values():
        setter.argtypes, setter.restype = [ctypes.c_int], None
        setter(n)
    return len(setters)


def set_num_threads(n):
    """``torch.set_num_threads(n)`` and :func:`set_blas_threads`\\ ``(n)``: what ``--threads N`` means in the
    examples and benchmarks. n: a positive integer."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of threads must be a positive integer, got {n!r}")
    most = max(64, 4 * (os.cpu_count() or 1))  # (torch's pool of a million threads never got going)
    if n > most:
        raise ValueError(f"the number of threads must be at most {most} (4 per core of this machine's "
                         f"{os.cpu_count()}, or 64), got {n}")
    torch.set_num_threads(n)
    set_blas_threads(n)
