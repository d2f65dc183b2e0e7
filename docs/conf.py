"""Sphinx configuration: ``make docs`` builds the site into docs/_build/html, warnings as errors."""

from __future__ import annotations

import importlib.metadata
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent / "_ext"))

project = "dask-gpudirect"
author = "dask-gpudirect developers"
copyright = "2026, dask-gpudirect developers"
release = importlib.metadata.version("dask-gpudirect")
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinx_click",
    "myst_parser",
    "gpudirect_config",  # docs/_ext: the configuration table, read from the packaged yaml
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# The measured files under benchmarks/ are included by benchmarks.md, not pages of their own.
exclude_patterns = ["_build", "benchmarks/*.md"]

autosummary_generate = True
autodoc_typehints = "none"  # numpydoc's Parameters sections say it; signatures stay short
autodoc_inherit_docstrings = False  # a page shows what this package says, not its bases
numpydoc_show_class_members = False
numpydoc_validation_checks: set[str] = set()

myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

html_theme = "pydata_sphinx_theme"
html_title = f"dask-gpudirect {release}"
html_static_path = ["_static"]
templates_path = ["_templates"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_show_sourcelink = False
html_sidebars = {"**": []}  # the sections are in the top bar; the page gets the width
