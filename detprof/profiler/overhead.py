"""Overhead of determinism per model, with an honest confidence interval.

Runs are interleaved (deterministic, default, deterministic, ...), so repeat ``r`` of one
mode and repeat ``r`` of the other ran side by side and saw the same drift and thermals.
The statistic is therefore paired: per repeat the log ratio ln(det/default), then a
Student t-interval on the mean log ratio, exponentiated. Log ratios make the interval
multiplicative (an overhead cannot go below 0x), and the t distribution keeps it honest
for the 3-10 repeats a sweep affords.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

Metric = Literal["kernel", "wall"]
METRIC_FIELDS: dict[Metric, str] = {"kernel": "kernel_ns_per_step", "wall": "wall_ns_per_step"}


@dataclass(frozen=True)
class Overhead:
    """det/default ratio of one metric for one model (1.0 = no overhead)."""

    ratio: float
    ci_low: float
    ci_high: float
    log_ratios: tuple[float, ...]
    confidence: float = 0.95

    @property
    def n(self) -> int:
        return len(self.log_ratios)


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


def log_ratio_interval(log_ratios: Iterable[float], confidence: float = 0.95) -> Overhead | None:
    """Mean log ratio with a two-sided t-interval; a single pair gives no interval (NaN bounds)."""
    values = tuple(float(v) for v in log_ratios)
    if not values:
        return None
    mean = float(np.mean(values))
    if len(values) < 2:
        return Overhead(math.exp(mean), math.nan, math.nan, values, confidence)
    from scipy import stats

    sem = float(np.std(values, ddof=1)) / math.sqrt(len(values))
    half = float(stats.t.ppf(0.5 + confidence / 2, df=len(values) - 1)) * sem
    return Overhead(math.exp(mean), math.exp(mean - half), math.exp(mean + half), values, confidence)


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
            setattr(result[model], metric, log_ratio_interval(logs, confidence))
    return result
