"""Sphinx configuration: MyST Markdown pages in the pydata theme, as Jupyter's own projects
build their documentation, plus the references generated from the code (_ext/)."""

import json
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# the references import the package from this checkout, whatever is installed
sys.path[:0] = [str(DOCS / "_ext"), str(ROOT), str(ROOT / "server_extension")]

project = "jupyter-ckpt"
author = "jupyter-ckpt contributors"
copyright = "2026, jupyter-ckpt contributors"
release = json.loads((ROOT / "package.json").read_text())["version"]
version = release

extensions = ["myst_parser", "ckpt_reference"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_generated", "README.md"]

html_theme = "pydata_sphinx_theme"
html_title = "jupyter-ckpt"
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
