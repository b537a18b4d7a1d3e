"""A call for a worker that leaves a mark at each stage of its process's end (``test_device_time``)."""

from __future__ import annotations

import atexit
import sys
from pathlib import Path


class _TornDown:
    """Marks the interpreter's teardown, which frees it with its module."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __del__(self) -> None:
        (self.folder / "torn-down").touch()


kept: list[_TornDown] = []


def leave_marks(folder: str) -> str:
    """Registers an exit function, keeps an object only the teardown frees, and writes unflushed output."""
    atexit.register((Path(folder) / "exit-function-ran").touch)
    kept.append(_TornDown(Path(folder)))
    sys.stdout.write("said just before the end")
    return "answered"
