"""Reading and writing the project's JSON files (creatures, policies, training histories): every way a file can
be unreadable becomes an error that names the file and what is wrong with it, never a bare decoder error; every
file written is strict JSON, which any reader parses."""
import json
import math
import numbers
import os


def read_json(path):
    """The JSON object (a dict) in ``path``.

    Raises:
        FileNotFoundError, IsADirectoryError, PermissionError: naming ``path``.
        ValueError: ``path`` is empty, truncated, binary, not JSON, or holds something other than an object.
    """
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: a directory, not a JSON file")
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"), parse_int=_int64)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a text file ({e.reason} at byte {e.start}); expected JSON") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except ValueError as e:  # _int64's
        raise ValueError(f"{path}: {e}") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to read (JSON arrays or objects within each other thousands "
                         f"of levels deep)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object with named keys, got {type(data).__name__}")
    if _depth(data) > MAX_DEPTH:  # (the readers' checks recurse: a RecursionError naming nothing)
        raise ValueError(f"{path}: nested more than {MAX_DEPTH} levels deep, deeper than any diffsoft file")
    return data


MAX_DEPTH = 32
"""How deep a JSON file diffsoft reads may nest (its own files: 5 levels)."""


def _depth(value):
    """How deeply ``value``'s lists and dicts nest, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            if d <= MAX_DEPTH:
                stack.extend((u, d + 1) for u in (v.values() if isinstance(v, dict) else v))
    return deepest


def _int64(text):
    """A JSON integer, refused beyond 64 bits (as an index or a count it is garbage; as a float it overflows
    later, in an OverflowError that names no file)."""
    value = int(text)
    if not -2 ** 63 <= value < 2 ** 63:
        raise ValueError(f"an integer beyond 64 bits ({text[:20]}{'...' if len(text) > 20 else ''})")
    return value


def only_numbers(value):
    """Whether ``value`` is a number or (nested) lists of numbers: no strings, booleans or nulls, which numpy and
    torch would otherwise turn into numbers without a word."""
    if isinstance(value, list):
        return all(only_numbers(v) for v in value)
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def finite_or_null(value):
    """``value`` (nested dicts, lists and tuples) with every non-finite float made None: Python's ``json`` writes
    them as ``NaN`` and ``Infinity``, which strict readers (JavaScript's ``JSON.parse``, jq) refuse."""
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
