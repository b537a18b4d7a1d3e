"""The one measured-study flow: plan -> launcher -> store -> progress, for the sweep, kernels_bench and programs.

The plan (``profiler.measured_runs``) says what runs in which order; here every run not already
complete is measured, one atomic record per run, ``--resume`` skipping every run already
complete, with the progress display beside it. A study with a precision
(``RunSettings.precision``) then adds repeats, model by model, until each model's interval is
within it (Stein's two-stage design: ``analysis.overhead.repeats_wanted``), while the next repeat
fits the budget: the seconds that the repeats added after the first stage may take.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from detprof import locks
from detprof.invocation import Invocation
from detprof.profiler.launcher import WorkerLauncher
from detprof.profiler.measured_runs import (
    MAX_REPEATS,
    MeasurementTarget,
    ModePair,
    PlannedRun,
    RunSettings,
    lockstep_sessions,
    measured_parts,
    mode_pairs,
    runs_to_measure,
    session_cores,
)
from detprof.profiler.program.run import ProgramLauncher
from detprof.profiler.progress import RunProgress, progress_bar
from detprof.records import MeasuredRun
from detprof.store import ResultsStore, StudyKind

_PAIRING_WORDS = {
    "in_process": "both modes in one process per repeat",
    "lockstep": "a process per mode, stepped in turn",
    "sequential": "a process per mode, one after the other",
}
Extend = Callable[[int, Sequence[str]], list[PlannedRun]]
"""The runs of repeat ``r`` of these models, both modes in the plan's order: how a study adds a repeat."""


@dataclass(frozen=True)
class MeasuredStudy:
    """One measured study as its command asks for it, passed down whole: what runs (the plan, its settings and the
    manifest that names the study), where (the target, the results folder), and how the command was given."""

    kind: StudyKind
    plan: Sequence[PlannedRun]
    settings: RunSettings
    manifest: dict[str, Any]
    target: MeasurementTarget
    out: Path
    given: Invocation
    extend: Extend | None = None
    """How the study adds a repeat for its precision; None: it adds none."""

    @property
    def store(self) -> ResultsStore:
        return ResultsStore(self.out, self.kind)


def run_planned(study: MeasuredStudy, progress: RunProgress | None = None) -> list[MeasuredRun]:
    """Run every planned run not already complete; then, with a precision and ``study.extend``, the repeats each
    model needs to reach it (``_repeat_to_add``). Returns the records of this invocation."""
    progress = progress or RunProgress()
    settings, target, store = study.settings, study.target, study.store
    store.open(study.manifest, study.given.command, resume=study.given.resume)
    launcher_type = ProgramLauncher if target.program else WorkerLauncher
    launcher = launcher_type(store, target.tracer, target.device, settings)
    clock = _Clock(time.monotonic())
    records = clock.timed(_measure_runs(study.plan, settings, target, store, launcher, progress))
    if settings.precision is not None and study.extend is not None:
        from detprof.analysis.overhead import AddedRepeats

        added = 0
        while (more := _repeat_to_add(study, store, clock, progress)) is not None:
            records += clock.timed(_measure_runs(more, settings, target, store, launcher, progress))
            added += 1
        AddedRepeats(settings.repeats, added, clock.added(), settings.budget_s).write(store)
    return records


def _measure_runs(
    plan: Sequence[PlannedRun],
    settings: RunSettings,
    target: MeasurementTarget,
    store: ResultsStore,
    launcher: WorkerLauncher,
    progress: RunProgress,
) -> list[MeasuredRun]:
    """The runs of ``plan`` not yet complete, paired as the study pairs them (``Pairing``)."""
    plan = runs_to_measure(plan, target.tracer, whole_runs=target.program)
    base = progress.done_count
    if settings.pairing == "lockstep":
        return _run_pairs(
            plan,
            store,
            progress,
            base,
            _on_claimed_core(lambda pairs, core: launcher.run_pairs(pairs, cpu_core=core, note=progress.note)),
            lockstep_sessions,
        )
    if settings.pairing == "in_process":
        in_process = (
            (lambda pairs, n: launcher.run_in_process(pairs, cpu_core=None, note=progress.note))
            if target.on_gpu
            else _on_claimed_core(lambda pairs, core: launcher.run_in_process(pairs, cpu_core=core, note=progress.note))
        )

        def sessions(pairs: Sequence[ModePair]) -> list[list[ModePair]]:
            if target.tracer.wraps_process:
                return [[pair] for pair in pairs]
            return settings.in_process_sessions(pairs, target.on_gpu)

        shared, apart = settings.apart_runs(plan)
        records = _run_pairs(shared, store, progress, base, in_process, sessions)
        return records + _run_each(apart, store, progress, base + len(shared), launcher)
    return _run_each(plan, store, progress, base, launcher)


def _on_claimed_core(
    measure: Callable[[Sequence[ModePair], int], Iterator[MeasuredRun]],
) -> Callable[[Sequence[ModePair], int], Iterator[MeasuredRun]]:
    """``measure`` each session's pairs pinned to a core claimed for it (``locks.claimed_core``), held until its
    last record."""

    def session(pairs: Sequence[ModePair], n: int) -> Iterator[MeasuredRun]:
        with locks.claimed_core(session_cores(n)) as core:
            yield from measure(pairs, core)

    return session


def _run_each(
    plan: Sequence[PlannedRun], store: ResultsStore, progress: RunProgress, base: int, launcher: WorkerLauncher
) -> list[MeasuredRun]:
    """Every run of ``plan`` not yet complete, each in a process of its own, one after the other."""
    todo = [run for run in plan if not store.is_done(run.run_id)]
    records: list[MeasuredRun] = []
    for index, run in enumerate(todo, start=base + len(plan) - len(todo)):
        progress.on_start(run.label, index)
        record = launcher.run(run)
        records.append(record)
        progress.on_done(record)
    return records


def _run_pairs(
    plan: Sequence[PlannedRun],
    store: ResultsStore,
    progress: RunProgress,
    base: int,
    measure_session: Callable[[Sequence[ModePair], int], Iterator[MeasuredRun]],
    sessions_of: Callable[[Sequence[ModePair]], list[list[ModePair]]],
) -> list[MeasuredRun]:
    """Every pair not yet complete, by sessions of workers (``sessions_of``): a repeat's pairs at a time.

    A session is a pair of lockstep workers (``lockstep_sessions``), or one worker that runs both arms of each
    pair (``in_process_sessions``; a session per pair for a tracer that wraps the process). The next
    repeat starts fresh workers, so the worker process stays a random effect across repeats,
    and the cores are taken in turn (one that another detprof's session claimed is passed over);
    with ``--shared-repeats`` one session measures every repeat of each model in turn. One
    session at a time: two pairs side by side on two cores
    interfered through the shared caches and memory, which widened A/A intervals several times
    over. A pair that is half done (a crash between its two records) is measured again whole:
    its two halves must share the machine's state. When a session ends early (a worker died,
    or a pair ran past ``--run-timeout``), fresh workers take the pairs left.
    """
    pairs = mode_pairs(plan)
    todo = [pair for pair in pairs if not all(store.is_done(run.run_id) for run in pair)]
    records: list[MeasuredRun] = []
    completed = base + 2 * (len(pairs) - len(todo))
    sessions = sessions_of(todo)
    for n, left in enumerate(sessions):
        while left:
            progress.on_start(" + ".join(run.label for run in left[0]), completed)
            measured = 0
            for record in measure_session(left, n):
                records.append(record)
                progress.on_done(record)
                measured += 1
                completed += 1
                if measured % 2 == 0 and measured // 2 < len(left):
                    progress.on_start(" + ".join(run.label for run in left[measured // 2]), completed)
            left = left[max(measured // 2, 1) :]
    return records


@dataclass
class _Clock:
    """What the repeats added after the first stage have taken (the budget's), and what a repeat of a model costs."""

    started: float
    overheads: list[float] = field(default_factory=list)
    """Per session of workers: its time beyond its pairs' (starting processes, importing, building)."""
    last: float = 0.0
    first_stage_end: float | None = None

    def timed(self, records: list[MeasuredRun]) -> list[MeasuredRun]:
        """Once ``records`` are measured: what their sessions cost beyond their pairs, from the time they took."""
        now = time.monotonic()
        elapsed, self.last = now - (self.last or self.started), now
        self.first_stage_end = self.first_stage_end or now
        sessions = len({record["repeat"] for record in records if not record.get("steps_reused")})
        if sessions:
            beyond = max(0.0, elapsed - sum(_pair_seconds(records).values())) / sessions
            self.overheads += [beyond] * sessions
        return records

    def added(self) -> float:
        """Seconds since the first stage ended: what the repeats added after it have taken."""
        return 0.0 if self.first_stage_end is None else time.monotonic() - self.first_stage_end

    def repeat_seconds(self, models: Sequence[str], store: ResultsStore) -> float:
        """A session of one more repeat of ``models``: a session's overhead and each model's pair, as measured."""
        per_model: dict[str, list[float]] = {}
        for (model, _repeat), seconds in _pair_seconds(store.records()).items():
            per_model.setdefault(model, []).append(seconds)
        overhead = statistics.mean(self.overheads) if self.overheads else 0.0
        return overhead + sum(statistics.median(per_model.get(model) or [0.0]) for model in models)


def _pair_seconds(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], float]:
    """Each (model, repeat)'s pair: the longer of its two runs' durations."""
    pairs: dict[tuple[str, int], float] = {}
    for record in records:
        key = (str(record.get("model")), int(record["repeat"]))
        pairs[key] = max(pairs.get(key, 0.0), float(record.get("duration_s") or 0.0))
    return pairs


def _repeat_to_add(
    study: MeasuredStudy, store: ResultsStore, clock: _Clock, progress: RunProgress
) -> list[PlannedRun] | None:
    """The next repeat of the models whose interval is not yet within the precision, where it fits the budget
    and no model would pass ``MAX_REPEATS``; None when there is none to add."""
    from detprof.analysis.overhead import repeats_wanted

    settings, target, extend = study.settings, study.target, study.extend
    assert settings.precision is not None and extend is not None
    records = list(store.records())
    wanted = repeats_wanted(records, settings.precision)
    models = [model for model, (have, need) in wanted.items() if have < min(need, MAX_REPEATS)]
    if not models:
        return None
    if settings.budget_s is not None and clock.added() + clock.repeat_seconds(models, store) > settings.budget_s:
        return None
    repeat = 1 + max(int(record["repeat"]) for record in records)
    runs = extend(repeat, models)
    count = len(runs_to_measure(runs, target.tracer, whole_runs=target.program))
    needs = ", ".join(f"{model} {wanted[model][0]} of {wanted[model][1]}" for model in models)
    progress.add_runs(count, f"repeat {repeat + 1} for +/-{settings.precision:.0%} (repeats so far of needed: {needs})")
    return runs


def measure(study: MeasuredStudy, *, what: str, console: Console) -> ResultsStore:
    """``run_planned`` as a command runs it: a line saying what runs where, then the progress display.

    The folder and the device are held (``locks.holding``) before the first line is printed, so that a command
    refused for either says so in one line."""
    settings, target, store = study.settings, study.target, study.store
    opened = partial(store.open, study.manifest, study.given.command, resume=study.given.resume)
    with locks.holding(store.dir, (target.device.lock_key, target.device.label), wait=study.given.wait, first=opened):
        parts = measured_parts(target.tracer, whole_runs=target.program)
        untraced = " (and untraced runs for wall time)" if len(parts) > 1 else ""
        repeats = f"{settings.repeats} repeats"
        if settings.precision is not None and study.extend is not None:
            within = f" (within {settings.budget_s:g} s after them)" if settings.budget_s is not None else ""
            repeats += f", then more{within} until each is within +/-{settings.precision:.1%}"
        pairing = _PAIRING_WORDS[settings.pairing]
        if settings.shared_repeats:
            pairing = "both modes and every repeat of a model in one process, its steps built once"
        console.print(
            f"detprof {study.kind}: {what} x 2 modes x {repeats} on {escape(target.device.label)} "
            f"with tracer {target.tracer.name}{untraced}, {pairing}, "
            f"results in {escape(str(study.out))}"
        )
        total = len(runs_to_measure(study.plan, target.tracer, whole_runs=target.program))
        with progress_bar(console, study.kind, total, store.dir) as progress:
            run_planned(study, progress)
    return store
