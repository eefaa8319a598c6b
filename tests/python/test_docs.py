"""The API reference (docs/conf.py: Sphinx, autodoc and napoleon) builds from the docstrings with warnings as
errors; it covers every public module; every public name of the package has a docstring."""
import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys

import pytest

import diffsoft

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs")
PUBLIC_MODULES = sorted(m.name for m in pkgutil.iter_modules(diffsoft.__path__, "diffsoft.")
                        if not m.name.rsplit(".", 1)[1].startswith("_"))


def test_the_api_reference_builds_with_warnings_as_errors(tmp_path):
    pytest.importorskip("sphinx", reason="Sphinx (Debian's python3-sphinx, scripts/install_deps.sh) is not installed")
    run = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                          "-d", str(tmp_path / "doctrees"), DOCS, str(tmp_path / "html")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(tmp_path / "html" / "api" / "simulator.html") as f:
        page = f.read()
    assert "diffsoft.simulator.Simulator.step" in page  # autodoc ran: the methods are there


def test_the_reference_covers_every_public_module():
    documented = set()
    for name in os.listdir(os.path.join(DOCS, "api")):
        with open(os.path.join(DOCS, "api", name)) as f:
            documented |= set(re.findall(r"^\.\. automodule:: (\S+)", f.read(), flags=re.M))
    assert documented == set(PUBLIC_MODULES)


def _public(module):
    """``(qualified name, object)`` of the module's public functions and classes, and of those classes' public
    methods and properties (what they define themselves)."""
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj
        elif inspect.isclass(obj):
            yield f"{module.__name__}.{name}", obj
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and (inspect.isfunction(member) or isinstance(member, property)):
                    yield f"{module.__name__}.{name}.{attr}", member


def test_every_public_name_has_a_docstring():
    missing = [name for m in PUBLIC_MODULES for name, obj in _public(importlib.import_module(m))
               if not (obj.__doc__ or "").strip()]
    missing += [m for m in PUBLIC_MODULES if not (importlib.import_module(m).__doc__ or "").strip()]
    missing += [f"diffsoft.{name}" for name in diffsoft.__all__ if not (getattr(diffsoft, name).__doc__ or "").strip()]
    assert not missing, missing
