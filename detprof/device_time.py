"""Where a run's time goes: the parts of a measured process's life, and their sums counted once per process.

A GPU lease is paid by the second, and a measured step is a small part of what a run costs: a
process starts and imports its framework, initialises the device, builds the model, compiles the
step, warms up, runs its measured steps under and outside the tracer, and the parent parses the
trace. Each run's record keeps those parts (``time_parts``), so that a study can say what fraction
of its device time measured something and where the rest went, and a plan can be priced from what
each part cost. Standard library only: the worker, the backends and the read side all use it.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

PARTS = ("start", "device", "build", "compile", "warmup", "steps", "tracing", "parsing", "other")
WORDS = {
    "start": "process start and imports",
    "device": "device initialisation",
    "build": "building the model and its batch",
    "compile": "compiling the step (its first steps' excess where the framework compiles at the first call)",
    "warmup": "warm-up steps",
    "steps": "the steps whose times (untraced and traced) or outputs (verify, stability) are the answer",
    "tracing": "starting and stopping the tracer",
    "parsing": "reading the trace into the record",
    "other": "the rest: writing results, between runs",
}
"""What each part is, as the summary and the report say it."""
HEADINGS = {
    "start": "Start, imports",
    "device": "Device",
    "build": "Build",
    "compile": "Compile",
    "warmup": "Warm-up",
    "steps": "Measured steps",
    "tracing": "Tracing",
    "parsing": "Parsing",
    "other": "Other",
}
"""Each part as a table's column names it."""
SPAWNED_ENV = "DETPROF_SPAWNED_AT"
"""The monotonic clock (system-wide on Linux) when the parent started a worker: the worker's ``start`` part begins
there, so that the interpreter's own start and its imports count."""
PER_RECORD = frozenset({"parsing"})
"""The parts each record of a pair pays on its own (its kernel table read out of the shared trace); every other
part of the two records of a pair is the one process's, counted once."""
IN_PROCESS = "in_process"
"""A record's ``pairing`` where it and its pair's other record were measured in one process and both keep that
process's parts; the runs a process makes one after another (``verify``'s grouped runs, a sweep's shared repeats)
each keep their own."""


class PartClock:
    """Laps of one process's time, each charged to a part: a lap ends where the next begins, so the parts add up
    to the time the clock ran."""

    def __init__(self, since: float | None = None) -> None:
        self.last = time.monotonic() if since is None else since
        self.parts: dict[str, float] = {}

    def lap(self, part: str) -> None:
        """The time since the last lap, charged to ``part``."""
        now = time.monotonic()
        self.add(part, now - self.last)
        self.last = now

    def add(self, part: str, seconds: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + max(seconds, 0.0)

    def move(self, seconds: float, source: str, target: str) -> None:
        """``seconds`` already charged to ``source`` are ``target``'s (at most what ``source`` holds)."""
        moved = min(max(seconds, 0.0), self.parts.get(source, 0.0))
        self.parts[source] = self.parts.get(source, 0.0) - moved
        self.add(target, moved)

    def first_step_compiled(self, step_s: Sequence[float]) -> None:
        """The first of ``step_s`` (steps charged to ``steps``) compiled where the framework compiles at the first
        call: its excess over the median of the others is ``compile``'s."""
        if len(step_s) > 1:
            self.move(step_s[0] - statistics.median(step_s[1:]), "steps", "compile")

    def take(self) -> dict[str, float]:
        """The parts so far, rounded to the millisecond, and the clock starting again from nothing."""
        taken = {part: round(self.parts[part], 3) for part in PARTS if self.parts.get(part)}
        self.parts = {}
        return taken


_running: PartClock | None = None


def spawned_clock(env: Mapping[str, str] = os.environ) -> PartClock:
    """This worker's clock, from when its parent started it (``SPAWNED_ENV``), else from now; code that charges a
    part of its own (``charged``) charges this one."""
    since = env.get(SPAWNED_ENV)
    return clock_since(float(since) if since else None)


def clock_since(since: float | None) -> PartClock:
    """This process's clock from ``since`` (the monotonic clock; None: now), the one ``charged`` charges: a worker
    that a process pool started, not detprof (``spawn_env``), reads when it started off the system."""
    global _running
    _running = PartClock(since)
    return _running


def running_clock() -> PartClock:
    """This worker's clock (``spawned_clock``), or one from now where none runs."""
    return _running or spawned_clock()


@contextlib.contextmanager
def charged(part: str, before: str) -> Iterator[None]:
    """What runs inside is ``part``'s, and what ran since the last lap is ``before``'s, on the worker's clock (a
    no-op outside a worker): a framework that compiles inside a model's build says so here."""
    if _running is None:
        yield
        return
    _running.lap(before)
    try:
        yield
    finally:
        _running.lap(part)


def spawn_env() -> dict[str, str]:
    """What a worker's environment carries for its clock: when it was started."""
    return {SPAWNED_ENV: repr(time.monotonic())}


def process_seconds(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each part's seconds over ``records``, the parts of one process's pair counted once (the records of an
    in-process pair share their log, and their parts but ``PER_RECORD``'s)."""
    sums = dict.fromkeys(PARTS, 0.0)
    seen: set[str] = set()
    for record in records:
        parts = record.get("time_parts") or {}
        paired = record.get("pairing") == IN_PROCESS
        shared = str(record.get("log") or record.get("run_id")) if paired else None
        first = shared not in seen
        if shared is not None:
            seen.add(shared)
        for part, seconds in parts.items():
            if part in sums and (first or part in PER_RECORD):
                sums[part] += float(seconds)
    return {part: round(seconds, 3) for part, seconds in sums.items() if seconds}


def steps_fraction(parts: Mapping[str, float]) -> float | None:
    """The share of the accounted time that ran measured steps; None where nothing was accounted."""
    total = sum(parts.values())
    return None if total <= 0 else parts.get("steps", 0.0) / total
