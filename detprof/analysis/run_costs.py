"""What a study's runs cost beside the overhead they measured: where their time went, and the device memory each
mode held at its peak.

Both are read off the records alone (``time_parts``, ``peak_memory``): a user sizing a batch needs
determinism's memory as much as its time, and a GPU lease is planned from where each model's time
went (``device_time``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from detprof.device_time import process_seconds, steps_fraction

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
