"""Overhead of determinism per model (or op case), from the run records of a measured study.

Runs are interleaved (deterministic, default, deterministic, ...), so repeat ``r`` of one
mode and repeat ``r`` of the other ran side by side and saw the same drift and thermals:
each repeat gives one paired log ratio, and ``intervals.paired_t`` turns them into the
interval.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from detprof.intervals import METRIC_FIELDS, Metric, Overhead, paired_t


@dataclass
class ModelOverhead:
    model: str
    kernel: Overhead | None = None
    wall: Overhead | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def unsupported_reason(self) -> str | None:
        for failure in self.failures:
            if failure.get("status") == "unsupported":
                return str(failure.get("reason"))
        return None

    def failure_note(self) -> str | None:
        """Why runs are missing, in the same words in every table, warning and CI output; None if none are."""
        if self.unsupported_reason is not None:
            return f"not supported under determinism: {self.unsupported_reason}"
        if not self.failures:
            return None
        first = self.failures[0]
        reason = first.get("reason") or first.get("status")
        example = f"{first['run_id']}: {reason}" if first.get("run_id") else reason
        return f"{len(self.failures)} run(s) failed, e.g. {example}"


def paired_log_ratios(
    records: Iterable[Mapping[str, Any]], metric: Metric, key: str = "model"
) -> dict[str, list[float]]:
    """ln(det/default) per ``key`` (a model or an op case), pairing both modes' runs of one repeat."""
    field = METRIC_FIELDS[metric]
    by_run: dict[tuple[str, int], dict[str, float]] = {}
    for rec in records:
        value = rec.get(field)
        if rec.get("status") != "ok" or value is None or value <= 0:
            continue
        by_run.setdefault((rec[key], int(rec["repeat"])), {})[rec["mode"]] = float(value)
    ratios: dict[str, list[float]] = {}
    for (model, _repeat), modes in sorted(by_run.items()):
        if "default" in modes and "deterministic" in modes:
            ratios.setdefault(model, []).append(math.log(modes["deterministic"] / modes["default"]))
    return ratios


def model_overheads(
    records: Iterable[Mapping[str, Any]], confidence: float = 0.95, key: str = "model"
) -> dict[str, ModelOverhead]:
    """Every model's (or op case's) kernel-time and wall-time overhead, and the runs that failed."""
    records = list(records)
    result: dict[str, ModelOverhead] = {}
    for rec in records:
        entry = result.setdefault(rec[key], ModelOverhead(rec[key]))
        if rec.get("status") != "ok":
            entry.failures.append({k: rec.get(k) for k in ("run_id", "mode", "repeat", "status", "reason")})
    for metric in ("kernel", "wall"):
        for model, logs in paired_log_ratios(records, metric, key).items():
            setattr(result[model], metric, paired_t(logs, confidence))
    return result
