"""Sphinx configuration of detprof's documentation: MyST Markdown pages, the Furo theme, and ``detprof_docs``,
the extension that renders what the docs show from the CLI and from measured data at build time."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).parent / "_ext")]

project = "detprof"
author = "the detprof team"
extensions = ["myst_parser", "detprof_docs"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "detprof"
myst_heading_anchors = 3
suppress_warnings: list[str] = []
