"""The process's memory as Linux reports it (``/proc/self/status``), for the long-run tests and benchmarks."""
import ctypes
import gc

try:
    _LIBC = ctypes.CDLL("libc.so.6")
except OSError:  # not glibc: resident memory is read without trimming the heap first
    _LIBC = None


def status_bytes(field):
    """A memory field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ...) in bytes, or None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def resident_bytes():
    """Resident memory after a garbage collection and returning free heap pages to the system, or None."""
    gc.collect()
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)
    return status_bytes("VmRSS")
