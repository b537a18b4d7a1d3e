"""Run a script from ``tests/scripts`` in a fresh interpreter: code that must not share pytest's process.

The scripts are ordinary modules that ruff lints; their parameters travel as argv (and,
for stand-ins of external tools, as environment variables), never by formatting code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ROOT = SCRIPTS.parents[1]


def run_script(
    name: str,
    *args: object,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    cwd: Path = ROOT,
) -> subprocess.CompletedProcess[str]:
    """``python tests/scripts/NAME ARGS...`` with the repository importable; never raises on failure."""
    environ = {**os.environ, **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *map(str, args)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )
