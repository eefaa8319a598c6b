"""Where a benchmark's figures come from: the commit of this checkout, and the commit the diffsoft it imported was
built from where that is another one.

An installed (not editable) copy of diffsoft, such as the pip leg's venv holds, runs the code of when it was
installed whatever this checkout says; an editable one runs this checkout's Python with the compiled core of its
last build. setup.py records the build's commit in ``diffsoft._build_info.SOURCE_COMMIT``.
"""
import os
import platform
import subprocess

import torch

import diffsoft

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def checkout_commit():
    """``"abc1234"``, with ``" with uncommitted changes"`` where python/, csrc/ or benchmarks/ differ from it; None
    outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--", "python", "csrc", "benchmarks"],
                               capture_output=True).returncode
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + (" with uncommitted changes" if dirty else "")


def built_commit():
    """The commit the imported diffsoft was built from (setup.py's record), or None where it has none."""
    try:
        from diffsoft._build_info import SOURCE_COMMIT
    except ImportError:  # built before setup.py recorded it, or never built
        return None
    return SOURCE_COMMIT


def commit():
    """``"commit abc1234"``, and where the imported diffsoft was built from another commit, which one and whether
    its Python is this checkout's (editable) or its own (installed): the text a report's source line names."""
    here = checkout_commit()
    text = f"commit {here}" if here else "not in a git checkout"
    built = built_commit()
    editable = os.path.dirname(os.path.abspath(diffsoft.__file__)).startswith(os.path.join(ROOT, "python") + os.sep)
    if not editable:
        return text + f" (diffsoft installed from {built or 'an unrecorded commit'}, {diffsoft.__file__})"
    if built and built != here:
        return text + f" (diffsoft's compiled core built at {built})"
    return text


def versions(*peers):
    """torch's and Python's versions, each of the ``peers`` modules' (None where it is not installed), and
    :func:`commit`'s text: a report's record of what ran."""
    out = {"torch": torch.__version__, "python": platform.python_version()}
    for module in peers:
        try:
            out[module] = __import__(module).__version__
        except ImportError:
            out[module] = None
    out["diffsoft_commit"] = commit()
    return out
