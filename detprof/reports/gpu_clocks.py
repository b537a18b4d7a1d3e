"""The GPU's clocks, temperature and power during a sweep, and the runs it throttled in.

A GPU that slowed its clocks in some runs (power cap, heat) makes an overhead unreadable:
the ratio then mixes determinism with throttling, and the report must say so next to the
number. The sweep's telemetry already decides per run whether it was throttled; here the
verdicts are gathered per model and mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from detprof.records import CLOCK_DROP_FRACTION


@dataclass(frozen=True)
class ClockRow:
    """GPU telemetry of one model's runs in one mode, across repeats."""

    model: str
    mode: str
    runs: int
    sm_clock_min: float | None
    sm_clock_mean: float | None
    sm_clock_max: float | None
    temperature_max: float | None
    power_mean: float | None
    throttled_runs: int
    reasons: tuple[str, ...]


def _pick(summaries: list[Mapping[str, Any]], metric: str, stat: str) -> list[float]:
    return [float(s[metric][stat]) for s in summaries if s.get(metric) and s[metric].get(stat) is not None]


def clock_rows(records: Iterable[Mapping[str, Any]]) -> list[ClockRow]:
    """One row per (model, mode) that has telemetry; empty when no run sampled a GPU."""
    grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for rec in records:
        summary = (rec.get("telemetry") or {}).get("summary")
        if summary and summary.get("sample_count", 1):
            grouped.setdefault((rec["model"], rec["mode"]), []).append(summary)
    rows = []
    for (model, mode), summaries in grouped.items():
        mins = _pick(summaries, "sm_clock_mhz", "min")
        means = _pick(summaries, "sm_clock_mhz", "mean")
        maxes = _pick(summaries, "sm_clock_mhz", "max")
        temps = _pick(summaries, "temperature_c", "max")
        powers = _pick(summaries, "power_w", "mean")
        reasons = sorted({r for s in summaries for r in (s.get("throttle_reasons") or [])})
        rows.append(
            ClockRow(
                model,
                mode,
                len(summaries),
                min(mins) if mins else None,
                fmean(means) if means else None,
                max(maxes) if maxes else None,
                max(temps) if temps else None,
                fmean(powers) if powers else None,
                sum(1 for s in summaries if s.get("throttled")),
                tuple(reasons),
            )
        )
    return rows


def _weighted(rows: list[ClockRow], attr: str) -> float | None:
    pairs = [(getattr(r, attr), r.runs) for r in rows if getattr(r, attr) is not None]
    return sum(v * n for v, n in pairs) / sum(n for _, n in pairs) if pairs else None


def by_mode(rows: Iterable[ClockRow]) -> list[ClockRow]:
    """The same telemetry over all models, one row per mode: what a device did during a whole sweep."""
    rows = list(rows)
    out = []
    for mode in dict.fromkeys(r.mode for r in rows):
        mine = [r for r in rows if r.mode == mode]
        mins = [r.sm_clock_min for r in mine if r.sm_clock_min is not None]
        maxes = [r.sm_clock_max for r in mine if r.sm_clock_max is not None]
        temps = [r.temperature_max for r in mine if r.temperature_max is not None]
        out.append(
            ClockRow(
                "all models",
                mode,
                sum(r.runs for r in mine),
                min(mins) if mins else None,
                _weighted(mine, "sm_clock_mean"),
                max(maxes) if maxes else None,
                max(temps) if temps else None,
                _weighted(mine, "power_mean"),
                sum(r.throttled_runs for r in mine),
                tuple(sorted({reason for r in mine for reason in r.reasons})),
            )
        )
    return out


def throttle_warnings(device: str, rows: Iterable[ClockRow]) -> list[str]:
    clock_drop = f" (clock fell below {CLOCK_DROP_FRACTION:.0%} of its peak)"
    return [
        f"{device}: {row.model} ({row.mode}): clocks throttled in {row.throttled_runs} of {row.runs} runs"
        + (f" ({', '.join(row.reasons)})" if row.reasons else clock_drop)
        + "; its overhead mixes determinism with throttling"
        for row in rows
        if row.throttled_runs
    ]
