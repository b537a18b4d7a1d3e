"""One measured run's worker process and its files: where its spec, result, log and trace go.

A run of its own has a file of each named after it; both arms of a pair measured in one process
share that process's log and trace, named after both; a session's spec is named after its first
run. Nothing is written here until the launcher makes room for a run (``WorkerProcess.make_room``),
which keeps the log of an attempt that failed before (``FailedAttempt``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from detprof.profiler.machine_load import LoadWatch
from detprof.profiler.measured_runs import ModePair, PlannedRun, arm_of
from detprof.profiler.process import Outcome
from detprof.profiler.telemetry import NoTelemetry, TelemetrySampler
from detprof.profiler.tracers import NO_TRACER, Tracer
from detprof.store import ResultsStore


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class FailedAttempt:
    """A run about to be measured again, whose record says its last attempt failed. The new attempt writes its log
    where that attempt's was, so that log is kept (``kept``); ``failures``: every failed attempt's reason with the
    log it left, for the new record (``earlier_failures``)."""

    failures: tuple[str, ...]
    log: Path
    kept: Path

    def keep_log(self) -> None:
        """Both runs of a pair shared a log: the first of them moves it."""
        if self.log.is_file() and not self.kept.exists():
            self.log.replace(self.kept)


@dataclass
class WorkerProcess:
    """One run of a worker process: what it runs, where its outputs go, and, once started, its process."""

    run: PlannedRun
    spec_path: Path
    result_path: Path
    log_path: Path
    trace_base: Path
    trace_path: Path | None
    fields: dict[str, Any] = field(default_factory=dict)
    """What identifies the run in its record: the planned run's fields, and how it was paired."""
    command: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    control: IO[str] | None = None
    """The worker's answers in a lockstep session (``profiler.lockstep``); None otherwise."""
    sampler: TelemetrySampler | NoTelemetry | None = None
    load: LoadWatch | None = None
    arm: str | None = None
    """Where both arms of a pair ran in one process: this run's arm in the trace they share (``step i ARM``)."""
    earlier: FailedAttempt | None = None
    started: str = ""
    t0: float = 0.0
    finished: str = ""
    duration_s: float = 0.0

    @property
    def stdin(self) -> IO[bytes] | None:
        return None if self.proc is None else self.proc.stdin

    def start(self) -> None:
        self.started, self.t0 = utc_now(), time.monotonic()

    @contextlib.contextmanager
    def watched(self, sampler: TelemetrySampler | NoTelemetry) -> Iterator[None]:
        """While the run runs: its GPU's telemetry, and what else used the machine's cores."""
        with sampler as self.sampler, LoadWatch() as self.load:
            yield

    def end(self) -> None:
        """The run is over: what happens next (reading its trace, filing it) is not part of its duration."""
        self.finished, self.duration_s = utc_now(), round(time.monotonic() - self.t0, 3)

    def make_room(self) -> None:
        """The folders the run writes to, no result left from an earlier attempt, and the log of one that failed
        kept."""
        for folder in (self.spec_path.parent, self.trace_base.parent, self.log_path.parent):
            folder.mkdir(parents=True, exist_ok=True)
        self.result_path.unlink(missing_ok=True)
        if self.earlier is not None:
            self.earlier.keep_log()

    def outcome(self) -> Outcome:
        """0 when the run's result is written, else the process's exit code (it died)."""
        if self.result_path.is_file():
            return 0
        assert self.proc is not None
        return self.proc.wait()


@dataclass(frozen=True)
class RunFiles:
    """Where a study's runs write: its folder (``store``), and the trace its tracer adds to each traced run."""

    store: ResultsStore
    tracer: Tracer

    def tracer_of(self, run: PlannedRun) -> Tracer:
        """The tracer around ``run``: none for the untraced runs that measure wall time."""
        return self.tracer if run.traced else NO_TRACER

    def worker_of(self, run: PlannedRun, **fields: Any) -> WorkerProcess:
        """A run's paths (spec, result, log, trace); nothing is written yet."""
        work = self.store.dir / "work"
        trace_base = self.store.dir / "traces" / run.run_id
        return WorkerProcess(
            run,
            spec_path=work / f"{run.run_id}.spec.json",
            result_path=work / f"{run.run_id}.result.json",
            log_path=self.store.dir / "logs" / f"{run.run_id}.log",
            trace_base=trace_base,
            trace_path=self.tracer_of(run).trace_path(trace_base),
            fields=run.fields | fields,
            earlier=self.failed_attempt(run),
        )

    def failed_attempt(self, run: PlannedRun) -> FailedAttempt | None:
        """What the store's record of ``run`` says of an attempt that failed; None where there is no such record."""
        record = self.store.last_record(run.run_id)
        if record is None or record.get("status") != "failed":
            return None
        earlier = [str(line) for line in record.get("earlier_failures") or ()]
        log = self.store.dir / "logs" / Path(str(record.get("log") or f"{run.run_id}.log")).name
        kept = log.with_name(f"{log.stem}.failed-{len(earlier) + 1}.log")
        said = f"{record.get('reason')} (its log: {kept.relative_to(self.store.dir)})"
        return FailedAttempt((*earlier, said), log, kept)

    def pair_workers(self, pair: ModePair) -> tuple[WorkerProcess, WorkerProcess]:
        """Both arms' paths where one process runs them: a record each, one log and one trace for the pair, named
        after both."""
        name = f"{pair[0].run_id}+{arm_of(pair[1])}"
        workers = []
        for run in pair:
            worker = self.worker_of(run, pairing="in_process")
            worker.log_path = self.store.dir / "logs" / f"{name}.log"
            worker.trace_base = self.store.dir / "traces" / name
            worker.trace_path = self.tracer_of(run).trace_path(worker.trace_base)
            worker.arm = arm_of(run)
            workers.append(worker)
        return workers[0], workers[1]

    def session_spec_path(self, first: PlannedRun) -> Path:
        """The spec of a worker that measures several runs, ``first`` the first of them."""
        return self.store.dir / "work" / f"{first.run_id}.session.json"
