"""Sphinx configuration of fedsim's documentation site (``make docs``; built offline, warnings are errors).

Markdown pages are read by MyST-Parser; the reference pages are generated at build time from the code itself:
the scenario keys from the pydantic schema, the command line from ``fedsim.cli.build_parser`` (sphinx-argparse),
the Python API from docstrings (autodoc), the run directory's row columns from ``fedsim.report.columns``.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

project = "fedsim"
author = "fedsim developers"
copyright = "2026, fedsim developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinxarg.ext",
    "fedsim_docs",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# MyST: heading anchors for links such as [text](privacy.md#the-neighbouring-relation)
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
# quotes and ellipses only: "--" stays two hyphens, so flags in prose and in the generated CLI reference
# (argparse help, read as reStructuredText) read as typed (--set, not an en dash)
smartquotes_action = "qe"

html_theme = "furo"
html_title = "fedsim"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"
# (a flag present in this dict is switched on whatever its value: only "members" is named)
autodoc_default_options = {"members": True}
# The pages are built offline: no intersphinx inventories are fetched.
