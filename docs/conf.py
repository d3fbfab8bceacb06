"""Sphinx configuration: MyST pages, an API reference from the docstrings, doctests that run."""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dsbd_jax  # noqa: E402

project = "dsbd-jax"
author = "dsbd-jax contributors"
copyright = "2026, dsbd-jax contributors"
release = dsbd_jax.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

autosummary_generate = True
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
nitpicky = False

# the examples in the pages run under `sphinx-build -b doctest` on tiny random models
doctest_global_setup = """
import os
os.environ.setdefault("JAX_PLATFORMS", "cpu")
"""

html_theme = "furo"
html_title = f"dsbd-jax {release}"
