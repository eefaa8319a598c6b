"""Checks shared by the entry points that take plain numbers."""
import math
import numbers


def is_finite_real(value):
    """A finite real number (numpy's included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
