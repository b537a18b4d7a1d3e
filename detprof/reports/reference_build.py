"""``make reference``: the GPU runs under ``reference/`` read as ``detprof report`` reads them, into the shipped file.

``python -m detprof.reports.reference_build [FOLDER ...]`` (every ``reference/*`` by default) writes
``gpu_reference.json`` beside ``gpu_reference``, one row per GPU, framework and model.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from detprof import bundle
from detprof.analysis.run_costs import RepeatCost, repeat_costs
from detprof.reports.gpu_reference import REFERENCE_FILE, GpuMeasurement, write
from detprof.reports.provenance import framework
from detprof.reports.report_data import build_report
from detprof.store import ResultsStore

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "reference"
"""Where the repository keeps each GPU run's results (absent from an installed package, which has the file)."""


def measurements_in(folder: Path) -> list[GpuMeasurement]:
    """Every swept model's kernel-time overhead in one GPU run's folder (``reference/<gpu>-<date>``): its results
    as they are, or the bundle ``detprof gpu-study`` brought back, kept as it came (``bundle.sources``)."""
    with bundle.unpacked([folder]) as sources:
        return _measurements(sources, folder)


def _measurements(sources: Sequence[Path], folder: Path) -> list[GpuMeasurement]:
    report = build_report(sources, with_shipped=False)
    found = []
    for sweep in report.sweeps:
        gpu = str(sweep.device.get("name") or sweep.label)
        date = (sweep.started or folder.name)[:10]
        keras = sweep.versions.get("keras")
        versions = framework(sweep.backend, sweep.versions) + (f", Keras {'/'.join(keras)}" if keras else "")
        driver = f"{sweep.device.get('driver') or '?'} (CUDA {sweep.device.get('cuda_driver') or '?'})"
        repeats = repeat_costs(ResultsStore(sweep.path, "sweep").records())
        for model in sweep.models:
            o = model.kernel
            if o is None:
                continue
            lo, hi = (o.ci_low, o.ci_high) if o.has_interval else (None, None)
            row = GpuMeasurement(
                gpu,
                date,
                sweep.backend,
                model.model,
                o.ratio,
                lo,
                hi,
                o.n,
                versions,
                driver,
                folder.name,
                **_costs(repeats.get(model.model)),
            )
            found.append(row)
    return sorted(found, key=lambda m: (m.gpu, m.date, m.backend, m.model))


def _costs(cost: RepeatCost | None) -> dict[str, Any]:
    """What ``gpu-study`` plans from: one repeat's seconds, its measured steps' and its parts, and its pairing."""
    if cost is None:
        return {}
    return {"repeat_s": cost.seconds, "steps_s": cost.steps_s, "time_parts": cost.parts, "pairing": cost.pairing}


def summarize(folders: Iterable[Path]) -> list[GpuMeasurement]:
    return [m for folder in sorted(folders) for m in measurements_in(folder)]


def main(argv: Sequence[str]) -> int:
    """``python -m detprof.reports.gpu_reference [FOLDER ...]``: the shipped file made again from the GPU runs'
    folders (every ``reference/*`` by default); ``make reference`` runs it."""
    folders = [Path(a) for a in argv] or [p for p in REFERENCE_DIR.iterdir() if p.is_dir()]
    rows = summarize(folders)
    write(rows, Path(__file__).with_name(REFERENCE_FILE))
    print(f"{len(rows)} GPU measurements from {len(folders)} folder(s) into {REFERENCE_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
