"""Checks shared by the entry points that take plain numbers."""
import dataclasses
import math
import numbers
import typing

MIN_ACTIVATION = 1e-6
"""The least activation a muscle may have (the step refuses less; a muscle at ``a`` targets ``a`` times its rest
length), and so the least ``min_a`` a body, policy or training may give."""

_RANGES = {
    ">0": (lambda v: v > 0, "positive"),
    ">=0": (lambda v: v >= 0, "non-negative"),
    "(0,1)": (lambda v: 0 < v < 1, "in (0, 1)"),
    "[0,1]": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "[0,1)": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "min_a": (lambda v: MIN_ACTIVATION <= v < 1, f"in [{MIN_ACTIVATION:g}, 1) (the least activation a muscle may have)"),
    # (torch's CPU generator keeps 32 bits of a seed: seeds 2**32 apart would draw the same numbers)
    "seed": (lambda v: 0 <= v < 2 ** 32, "in [0, 2**32) (the 32 bits torch's CPU generator keeps of a seed)"),
}


def is_finite_real(value):
    """A finite real number (numpy's included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def is_integer(value):
    """An integer (numpy's included), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def setting_kind(cls, name):
    """The type the settings dataclass ``cls``'s field ``name`` takes: its annotation's, ``Optional[T]``'s T
    for a field whose default None takes its value from elsewhere (the creature's ``min_a``)."""
    kind = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if args else kind


def check_fields(config, ranges):
    """Checks a dataclass of settings before anything is built, raising ValueError naming the first field at
    fault: every field has its default's kind (a float field takes any finite real number, an int field any
    integer, numpy's included), and the fields in ``ranges`` lie in theirs: ``">0"``, ``">=0"``, ``"(0,1)"``,
    ``"[0,1]"``, or a tuple of the values allowed. A field whose default is None takes None (its value comes
    from elsewhere: the creature's ``min_a``) or its annotation's kind. Numpy numbers become Python's (configs are written as
    JSON)."""
    defaults = type(config)()
    for f in dataclasses.fields(config):
        value, default = getattr(config, f.name), getattr(defaults, f.name)
        if default is None and value is None:
            continue
        kind = setting_kind(type(config), f.name)
        ok = {float: is_finite_real, int: is_integer}.get(kind, lambda v: isinstance(v, kind))(value)
        if not ok:
            what = "a finite float" if kind is float else f"an {kind.__name__}" if kind is int else f"a {kind.__name__}"
            raise ValueError(f"{f.name} must be {what}, got {value!r}")
        if kind in (float, int):
            value = kind(value)
            setattr(config, f.name, value)
        allowed = ranges.get(f.name)
        if isinstance(allowed, tuple):
            if value not in allowed:
                raise ValueError(f"{f.name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        elif allowed is not None:
            inside, words = _RANGES[allowed]
            if not inside(value):
                raise ValueError(f"{f.name} must be {words}, got {value!r}")
