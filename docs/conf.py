"""Sphinx configuration of diffsoft's API reference, built from the docstrings (autodoc, napoleon):

    .venv/bin/python -m sphinx -W -b html docs docs/_build/html

Sphinx comes from Debian (python3-sphinx, scripts/install_deps.sh), which the venv sees through its system
site packages; diffsoft is imported as installed. tests/python/test_docs.py builds it with warnings as errors.
The user guide is the Markdown in this folder (read on GitHub or in an editor); Sphinx reads only the .rst.
"""
project = "diffsoft"
author = "the diffsoft authors"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
root_doc = "index"
source_suffix = {".rst": "restructuredtext"}
exclude_patterns = ["_build"]
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_typehints = "none"
# Our own docstrings only: torch 2.x's autograd.Function.forward, which ours override, cites torch's own labels.
autodoc_inherit_docstrings = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # Attributes sections as fields: no second description of a dataclass's fields
html_theme = "alabaster"  # Sphinx's own (python3-sphinx depends on it); no theme from outside Debian
html_static_path = []
