"""Reading the project's JSON files (creatures, policies): every way a file can be unreadable becomes an
error that names the file and what is wrong with it, never a bare decoder error."""
import json
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
            data = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a text file ({e.reason} at byte {e.start}); expected JSON") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object with named keys, got {type(data).__name__}")
    return data


def only_numbers(value):
    """Whether ``value`` is a number or (nested) lists of numbers: no strings, booleans or nulls, which numpy and
    torch would otherwise turn into numbers without a word."""
    if isinstance(value, list):
        return all(only_numbers(v) for v in value)
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
