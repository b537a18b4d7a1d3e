"""detprof's console tables as a user reads them off a terminal: ``detprof ... | grep``, ``> file``, a CI log.

``run_piped`` runs the real command line in a fresh interpreter with stdout to a pipe;
the helpers read a rich table's header and body rows back as cell texts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from script_runner import ROOT

TERMINAL_ENV = ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")
"""What would make rich lay out or colour the output as for a terminal; a test names its own COLUMNS."""


def run_piped(*args: str | Path, columns: int | None = None) -> subprocess.CompletedProcess[str]:
    """``detprof ARGS`` with stdout to a pipe, and ``COLUMNS`` set only when ``columns`` is given."""
    env = {k: v for k, v in os.environ.items() if k not in TERMINAL_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "detprof.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )


def _cells(line: str, bar: str) -> list[str]:
    return [c.strip() for c in line.strip(bar).split(bar)]


def table_rows(out: str) -> list[list[str]]:
    """The body rows of a rich table, as cell texts (box characters stripped)."""
    return [_cells(line, "│") for line in out.splitlines() if line.startswith("│")]


def header_lines(out: str) -> list[list[str]]:
    """The lines of a rich table's header, as cell texts: one line when no header wraps."""
    return [_cells(line, "┃") for line in out.splitlines() if line.startswith("┃")]
