"""A study kind made only of this module and one registry line: what a stable sort costs against NumPy's default.

Ties in a default (quicksort) argsort come out in an order the implementation picks; a stable sort fixes it, as a
deterministic kernel fixes a reduction's order. Each run times ``steps`` argsorts of one array size in one mode,
and is filed as a ``records.MeasuredRun`` pair member (default and deterministic per size and repeat), so the
report's intervals and ``detprof check`` read it as they read a sweep. The tests register it with ``REGISTRY_LINE``
(``test_study_kinds.py``): nothing else of detprof knows it.
"""

from __future__ import annotations

import datetime as dt
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, ClassVar

import numpy as np
import typer

from detprof import formatting
from detprof.analysis.overhead import ModelOverhead, model_overheads
from detprof.determinism import MODES
from detprof.records import measured_run
from detprof.reports.provenance import MeasuredStudy, StudyRead, study_loader
from detprof.store import ResultsStore
from detprof.study_kinds import Command, KindEntry, Section, StudyKind, Where

NAME = "sorting"
ALGORITHMS = {"default": "quicksort", "deterministic": "stable"}
"""What each mode sorts with: ties in the order the implementation picks, or in the order they came."""
REGISTRY_LINE = KindEntry(
    NAME,
    f"{__name__}:KIND",
    (NAME, Command(__name__, "sorting", "Time a stable argsort against the default one, in both modes.")),
)


@dataclass(frozen=True)
class SortingRequest:
    """What a sorting study measures: the array sizes, and steps and repeats per size and mode."""

    out: Path
    sizes: tuple[int, ...] = (20_000,)
    repeats: int = 3
    steps: int = 5


@dataclass(frozen=True)
class PlannedRun:
    size: int
    mode: str
    repeat: int

    @property
    def run_id(self) -> str:
        return f"sort{self.size}-{self.mode}-r{self.repeat}"


def plan(request: SortingRequest) -> list[PlannedRun]:
    """Modes in turn within each repeat, so that drift of the machine reaches both modes alike."""
    return [PlannedRun(size, mode, r) for r in range(request.repeats) for size in request.sizes for mode in MODES]


def _step_times(run: PlannedRun, steps: int) -> list[int]:
    keys = np.random.default_rng(run.repeat).integers(0, run.size // 10, run.size)
    times = []
    for _ in range(steps):
        start = time.perf_counter_ns()
        np.argsort(keys, kind=ALGORITHMS[run.mode])
        times.append(time.perf_counter_ns() - start)
    return times


def measure(request: SortingRequest) -> Path:
    """Every planned run, each filed as it finishes (a rerun with the same request resumes)."""
    store = ResultsStore(request.out, NAME)
    config = {"sizes": list(request.sizes), "repeats": request.repeats, "steps": request.steps}
    store.open(config, f"detprof {NAME} --out {request.out}", resume=True)
    device = {"label": "cpu", "name": platform.processor() or platform.machine()}
    for run in plan(request):
        if store.is_done(run.run_id):
            continue
        started = dt.datetime.now(dt.UTC).isoformat()
        times = _step_times(run, request.steps)
        store.write_record(
            measured_run(
                run_id=run.run_id,
                mode=run.mode,
                repeat=run.repeat,
                model=f"sort{run.size}",
                status="ok",
                steps=request.steps,
                warmup=0,
                tracer="none",
                measures="wall",
                device=device,
                started_at=started,
                finished_at=dt.datetime.now(dt.UTC).isoformat(),
                duration_s=sum(times) / 1e9,
                settings={"op_determinism": run.mode == "deterministic", "sort": ALGORITHMS[run.mode]},
                versions={"numpy": np.__version__},
                step_wall_ns=times,
                batch_size=run.size,
            )
        )
    return request.out


def sorting(
    out: Annotated[Path, typer.Option(help="Results directory.")],
    repeats: Annotated[int, typer.Option(help="Repeats per size and mode.")] = 3,
    steps: Annotated[int, typer.Option(help="Argsorts timed per run.")] = 5,
) -> None:
    """The command the kind registers: measure, then say where the results are."""
    typer.echo(f"sorting: {measure(SortingRequest(out, repeats=repeats, steps=steps))}")


@dataclass(kw_only=True)
class SortingStudy(MeasuredStudy):
    kind: ClassVar[str] = NAME
    sizes: dict[str, ModelOverhead] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@study_loader
def load(store: ResultsStore, study: StudyRead) -> SortingStudy:
    manifest, records, where = study
    return SortingStudy(
        **where.study_fields(store.root, manifest), sizes=model_overheads(records), warnings=where.warnings
    )


def section(studies: Sequence[SortingStudy], where: Where) -> Section:
    rows = tuple(
        (where(s.label, s.backend), size, formatting.ratio(o.wall)) for s in studies for size, o in s.sizes.items()
    )
    return Section(
        id=NAME,
        title="What a stable sort costs",
        nav="Sorting",
        lead="Wall time of a stable argsort over NumPy's default one, per array size (95% CI).",
        headers=("Device", "Array", "Stable / default"),
        rows=rows,
    )


KIND = StudyKind(
    NAME,
    (("run_id", str), ("model", str), ("mode", str), ("repeat", int), ("status", str)),
    load,
    section,
    compared_by_check=True,
)
