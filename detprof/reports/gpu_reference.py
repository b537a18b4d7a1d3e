"""What detprof itself measured on GPUs, shipped with the package so that every report can show it.

Each GPU run's results stay in the repository under ``reference/<gpu>-<date>/`` (sweeps that
``detprof report`` reads on any machine). A report, though, may run where only ``pip install
detprof`` is: so ``make reference`` reads those folders the way the report reads any results
(``reference_build``) and keeps one row per GPU, framework and model in ``gpu_reference.json``
beside this module (package data): the kernel-time overhead and its interval, its pairs, the
date and the versions. The file is never written by hand: a test reads the folders again and
must find the same rows, so a figure shown cannot drift from the data it came from.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from detprof.errors import InputError
from detprof.store import atomic_write_json

REFERENCE_FILE = "gpu_reference.json"


@dataclass(frozen=True)
class GpuMeasurement:
    """One model's deterministic / default kernel time on one GPU and framework, as detprof measured it."""

    gpu: str
    """The GPU's name, as the machine reported it."""
    date: str
    backend: str
    model: str
    ratio: float
    lo: float | None
    hi: float | None
    """The 95% interval; None where one pair gives none."""
    pairs: int
    versions: str
    """The framework's version and Keras's, as the runs recorded them."""
    driver: str
    """The GPU driver's version and its CUDA."""
    source: str
    """The folder under ``reference/`` it was read from."""
    repeat_s: float | None = None
    """The seconds one repeat of the model took (both modes), the median over its repeats: what ``gpu-study``
    expects a repeat on this GPU to take."""
    steps_s: float | None = None
    """Of those, the seconds its measured steps took (both modes, untraced and traced)."""
    time_parts: dict[str, float] | None = None
    """Where a repeat's time went (``device_time.PARTS``), where its runs kept it; None for runs made before."""
    pairing: str | None = None
    """How its modes were paired: ``in_process`` (both in one process) or ``processes`` (a process per mode)."""

    @property
    def measured(self) -> str:
        if self.lo is None or self.hi is None:
            return f"{self.ratio:.2f}x (one pair)" if self.pairs == 1 else f"{self.ratio:.2f}x"
        return f"{self.ratio:.2f}x [{self.lo:.2f}, {self.hi:.2f}]"


def shipped() -> list[GpuMeasurement]:
    """The rows that came with this installation of detprof (none where the file is missing)."""
    try:
        text = resources.files("detprof.reports").joinpath(REFERENCE_FILE).read_text()
    except FileNotFoundError:
        return []
    try:
        return [GpuMeasurement(**row) for row in json.loads(text)]
    except (json.JSONDecodeError, TypeError) as exc:
        raise InputError(f"{REFERENCE_FILE}: not detprof's GPU reference ({exc})") from exc


def write(rows: Sequence[GpuMeasurement], path: Path) -> None:
    atomic_write_json(path, [asdict(row) for row in rows])
