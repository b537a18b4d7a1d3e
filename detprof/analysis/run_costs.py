"""What a study's runs cost beside the overhead they measured: where their time went, and the device memory each
mode held at its peak.

Both are read off the records alone (``time_parts``, ``peak_memory``): a user sizing a batch needs
determinism's memory as much as its time, and a GPU lease is planned from where each model's time
went (``device_time``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from detprof.analysis.pairing_check import Route
from detprof.device_time import PARTS, process_seconds, steps_fraction

ALL_MODELS = "all models"


@dataclass(frozen=True)
class TimeRow:
    """One model's runs (or all of a study's, ``ALL_MODELS``): seconds per part, a process's pair counted once."""

    model: str
    parts: dict[str, float]

    @property
    def seconds(self) -> float:
        return sum(self.parts.values())

    @property
    def steps_share(self) -> float | None:
        return steps_fraction(self.parts)


@dataclass(frozen=True)
class MemoryPeak:
    """A model's peak device memory in one mode: the largest over its runs, what it covers, or why there is none."""

    bytes: int | None
    covers: str | None
    why: str | None


def time_rows(records: Sequence[Mapping[str, Any]]) -> list[TimeRow]:
    """Per model in the records' order, then all of them; empty where no record accounted its time."""
    accounted = [record for record in records if record.get("time_parts")]
    if not accounted:
        return []
    by_model: dict[str, list[Mapping[str, Any]]] = {}
    for record in accounted:
        by_model.setdefault(str(record.get("model")), []).append(record)
    rows = [TimeRow(model, process_seconds(runs)) for model, runs in by_model.items()]
    return [*rows, TimeRow(ALL_MODELS, process_seconds(accounted))] if len(rows) > 1 else rows


def memory_peaks(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, MemoryPeak]]:
    """Per model and mode, the peak over its successful runs that recorded one."""
    peaks: dict[str, dict[str, MemoryPeak]] = {}
    for record in records:
        field = record.get("peak_memory")
        if not field or record.get("status") != "ok":
            continue
        model, mode = str(record.get("model")), str(record.get("mode"))
        known = peaks.setdefault(model, {}).get(mode)
        size = field.get("bytes")
        if known is None or (size is not None and (known.bytes is None or size > known.bytes)):
            peaks[model][mode] = MemoryPeak(size, field.get("covers"), field.get("why"))
    return peaks


def memory_line(peaks: Mapping[str, MemoryPeak]) -> str | None:
    """A model's peaks, deterministic against default (``2.41 / 2.03 GiB (+19%)``), what they cover where it is the
    process, or why there are none; None where no run recorded one."""
    det, default = peaks.get("deterministic"), peaks.get("default")
    if det is None or default is None:
        return None
    if det.bytes is None or default.bytes is None:
        return f"not known: {det.why or default.why}"
    change = f" ({(det.bytes - default.bytes) / default.bytes:+.0%})" if default.bytes else ""
    shared = " (each the whole process, both modes)" if "process" in (det.covers, default.covers) else ""
    return f"{det.bytes / 2**30:.2f} / {default.bytes / 2**30:.2f} GiB{change}{shared}"


@dataclass(frozen=True)
class RepeatCost:
    """What one repeat of a model cost, both modes: the median over its repeats of the seconds its process(es)
    took, of its measured steps' seconds, and of each part (``time_parts``, where its records kept them)."""

    seconds: float
    steps_s: float
    parts: dict[str, float] | None
    pairing: Route
    """``in_process``: both modes in one process, else ``processes``: a process per mode."""


def repeat_costs(records: Iterable[Mapping[str, Any]], *, reused: bool = False) -> dict[str, RepeatCost]:
    """Per model, what a repeat of its successful pairs cost: its runs' durations counted once where one process ran
    both modes (the same start), added where each mode had a process of its own. ``reused``: of the repeats that
    re-ran steps an earlier repeat built in their process (``--shared-repeats``), else of those that built their
    own."""
    pairs: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for record in records:
        if record.get("status") == "ok" and record.get("duration_s") and bool(record.get("steps_reused")) == reused:
            pairs.setdefault((str(record.get("model")), int(record["repeat"])), []).append(record)
    by_model: dict[str, list[list[Mapping[str, Any]]]] = {}
    for (model, _), runs in pairs.items():
        by_model.setdefault(model, []).append(runs)
    return {model: _repeat_cost(repeats) for model, repeats in by_model.items()}


def _repeat_cost(repeats: Sequence[Sequence[Mapping[str, Any]]]) -> RepeatCost:
    seconds = [sum({r.get("started_at"): float(r["duration_s"]) for r in runs}.values()) for runs in repeats]
    steps = [sum(_timed_s(r) for r in runs) for runs in repeats]
    parts = [process_seconds(runs) for runs in repeats if all(r.get("time_parts") for r in runs)]
    in_process = any(r.get("pairing") == "in_process" for runs in repeats for r in runs)
    return RepeatCost(
        round(statistics.median(seconds), 1),
        round(statistics.median(steps), 3),
        {part: round(statistics.median(p.get(part, 0.0) for p in parts), 3) for part in PARTS} if parts else None,
        "in_process" if in_process else "processes",
    )


def _timed_s(record: Mapping[str, Any]) -> float:
    return sum(sum(record.get(key) or []) for key in ("step_wall_ns", "traced_step_wall_ns")) / 1e9
