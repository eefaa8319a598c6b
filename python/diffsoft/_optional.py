"""Optional dependencies: ``import diffsoft`` needs only torch and numpy; the modules of the extras
(``extras_require`` in setup.py) are imported by the functions that use them, through :func:`require`."""
import importlib


def require(module, extra):
    """Imports ``module``, or raises an ImportError that says to install the extra ``diffsoft[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{e}: this part of diffsoft needs the optional dependencies of diffsoft[{extra}]; "
                          f"pip install 'diffsoft[{extra}]'") from e
