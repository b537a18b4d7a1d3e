"""The one measured-study flow: plan -> launcher -> store -> progress, for the sweep, kernels_bench and programs.

The plan (``profiler.plan``) says what runs in which order; here every run not already
complete is measured, one atomic record per run, ``--resume`` skipping every run already
complete, with the progress display beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from detprof import locks
from detprof.profiler.launcher import WorkerLauncher
from detprof.profiler.plan import (
    MeasurementTarget,
    PlannedRun,
    RunSettings,
    lockstep_sessions,
    measured_parts,
    mode_pairs,
    runs_to_measure,
    session_core,
)
from detprof.profiler.program.run import ProgramLauncher
from detprof.profiler.progress import RunProgress, progress_bar
from detprof.records import MeasuredRun
from detprof.store import ResultsStore, StudyKind


def run_planned(
    plan: Sequence[PlannedRun],
    settings: RunSettings,
    manifest: dict[str, Any],
    store: ResultsStore,
    target: MeasurementTarget,
    *,
    resume: bool,
    command: str,
    progress: RunProgress | None = None,
) -> list[MeasuredRun]:
    """Run every planned run not already complete; returns the records of this invocation."""
    progress = progress or RunProgress()
    store.open(manifest, command, resume=resume)
    launcher_type = ProgramLauncher if target.program else WorkerLauncher
    launcher = launcher_type(store, target.tracer, target.device, settings)
    records: list[MeasuredRun] = []
    plan = runs_to_measure(plan, target.tracer, whole_runs=target.program)
    if settings.pairing == "lockstep":
        return _run_lockstep_pairs(plan, store, launcher, progress)
    todo = [run for run in plan if not store.is_done(run.run_id)]
    for index, run in enumerate(todo, start=len(plan) - len(todo)):
        progress.on_start(run.label, index)
        record = launcher.run(run)
        records.append(record)
        progress.on_done(record)
    return records


def _run_lockstep_pairs(
    plan: Sequence[PlannedRun], store: ResultsStore, launcher: WorkerLauncher, progress: RunProgress
) -> list[MeasuredRun]:
    """Every lockstep pair not yet complete, a repeat at a time, the cores taken in turn.

    The pairs of one repeat share a pair of workers (``WorkerLauncher.run_pairs``); the next
    repeat starts fresh ones, so the worker process stays a random effect across repeats.
    One session at a time: two pairs side by side on two cores interfered through the
    shared caches and memory, which widened A/A intervals several times over. A pair that is
    half done (a crash between its two records) is measured again whole: its two halves must
    share the machine's state. When a session ends early (a worker died, or a pair ran past
    ``--run-timeout``), fresh workers take the pairs left.
    """
    pairs = mode_pairs(plan)
    todo = [pair for pair in pairs if not all(store.is_done(run.run_id) for run in pair)]
    records: list[MeasuredRun] = []
    completed = 2 * (len(pairs) - len(todo))
    for n, left in enumerate(lockstep_sessions(todo)):
        while left:
            progress.on_start(" + ".join(run.label for run in left[0]), completed)
            measured = 0
            for record in launcher.run_pairs(left, cpu_core=session_core(n)):
                records.append(record)
                progress.on_done(record)
                measured += 1
                completed += 1
                if measured % 2 == 0 and measured // 2 < len(left):
                    progress.on_start(" + ".join(run.label for run in left[measured // 2]), completed)
            left = left[max(measured // 2, 1) :]
    return records


def measure(
    kind: StudyKind,
    plan: Sequence[PlannedRun],
    settings: RunSettings,
    manifest: dict[str, Any],
    target: MeasurementTarget,
    out: Path,
    *,
    what: str,
    resume: bool,
    command: str,
    console: Console,
    wait: bool = True,
) -> ResultsStore:
    """``run_planned`` as a command runs it: a line saying what runs where, then the progress display.

    The folder and the device are held (``locks.holding``) before the first line is printed, so that a command
    refused for either says so in one line."""
    store = ResultsStore(out, kind)
    with locks.holding(store.dir, (target.device.lock_key, target.device.label), wait=wait):
        store.open(manifest, command, resume=resume)
        parts = measured_parts(target.tracer, whole_runs=target.program)
        untraced = " (and untraced runs for wall time)" if len(parts) > 1 else ""
        console.print(
            f"detprof {kind}: {what} x 2 modes x {settings.repeats} repeats on {escape(target.device.label)} "
            f"with tracer {target.tracer.name}{untraced}, results in {escape(str(out))}"
        )
        total = len(runs_to_measure(plan, target.tracer, whole_runs=target.program))
        with progress_bar(console, kind, total, store.dir) as progress:
            run_planned(plan, settings, manifest, store, target, resume=resume, command=command, progress=progress)
    return store
