"""What determinism costs against what it buys: one point per model and device, and its reading.

The cost comes from a sweep (det/default kernel time, or wall time where no kernel time
was traced); the benefit from a stability study of the same model on the same device
label and Keras backend (each framework has its own kernels, so its own noise): the
implementation noise that determinism removes. Two measures of that noise:

- churn under ``impl``: with every seed fixed and only the implementation free to vary,
  the fraction of test predictions that differ between two runs. That noise is exactly
  what determinism removes, so it is the y axis and the quadrant reading uses it;
- the drop in accuracy std from ``algo+impl`` to ``algo``: how much tighter the accuracy
  spread gets when determinism is added to a study that varies seeds anyway, with its
  standard error sqrt(se1^2 + se2^2) (the two variants' runs are independent).

Thresholds, and why:

- the cost side is ``verdict.verdict`` (``intervals.reading`` against
  ``intervals.CHEAP_OVERHEAD = 1.10``): up to 10% more time is within the spread of
  training throughput that users already live with; an interval on both sides of the line
  is "not settled", and so is the reading: never "cheap and ..." for an unsettled cost;
- ``NOISY_CHURN = 0.01``: once 1 prediction in 100 flips between runs that differ in
  nothing but kernel scheduling, evaluation results are not reproducible at the
  precision people compare models at (a fraction of a point of accuracy), so removing
  that noise is worth something; below it, implementation noise is negligible.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from detprof.formatting import finite
from detprof.intervals import Metric, Overhead
from detprof.reports.verdict import Verdict, verdict

NOISY_CHURN = 0.01

Quadrant = Literal[
    "cheap and worth it",
    "expensive but buys a lot",
    "cheap and buys little",
    "expensive and buys little",
    "not settled",
]
QUADRANT_ADVICE: dict[Quadrant, str] = {
    "cheap and worth it": "turn determinism on: it removes real noise for little time",
    "expensive but buys a lot": (
        "worth paying when results must be reproducible (debugging, audits, papers); "
        "otherwise keep it for the runs that matter"
    ),
    "cheap and buys little": "little noise to remove, and little to pay: turn it on for reproducibility",
    "expensive and buys little": "leave it off unless bitwise reproducibility itself is required",
    "not settled": "measure more repeats before deciding on cost",
}


@dataclass(frozen=True)
class Cost:
    """A sweep's overhead for one model on one device; ``metric`` says which time it is."""

    overhead: Overhead
    metric: Metric

    @property
    def verdict(self) -> Verdict:
        return verdict(self.overhead)


@dataclass(frozen=True)
class Noise:
    """From one stability study: None where the study lacks the variants a measure needs."""

    churn_impl: float | None
    std_drop: float | None
    std_drop_se: float | None
    dataset: str


@dataclass(frozen=True)
class TradeoffPoint:
    model: str
    device: str
    backend: str
    cost: Cost
    noise: Noise
    quadrant: Quadrant | None
    reading: str


def noise_of(variants: Sequence[Mapping[str, Any]], dataset: str) -> Noise:
    """The two noise measures from a stability summary's per-variant entries."""
    by_name = {v.get("variant"): v for v in variants if v.get("runs_ok", 0) >= 2}
    churn = finite(by_name["impl"].get("churn")) if "impl" in by_name else None
    drop = se = None
    if "algo+impl" in by_name and "algo" in by_name:
        with_impl, without = by_name["algo+impl"]["accuracy"], by_name["algo"]["accuracy"]
        std_a, std_b = finite(with_impl.get("std")), finite(without.get("std"))
        if std_a is not None and std_b is not None:
            drop = std_a - std_b
            se_a, se_b = finite(with_impl.get("std_se")), finite(without.get("std_se"))
            se = math.hypot(se_a, se_b) if se_a is not None and se_b is not None else None
    return Noise(churn, drop, se, dataset)


def quadrant(overhead: Overhead, churn: float) -> Quadrant:
    """The cost side is the overhead's verdict: an interval across the cheap line reads "not settled"."""
    side = verdict(overhead).reading
    if side not in ("cheap", "expensive"):
        return "not settled"
    noisy = churn >= NOISY_CHURN
    if side == "cheap":
        return "cheap and worth it" if noisy else "cheap and buys little"
    return "expensive but buys a lot" if noisy else "expensive and buys little"


def _interval(o: Overhead) -> str:
    if not o.has_interval:
        return f"{o.ratio - 1:+.0%} (one repeat, no CI)"
    return f"{o.ratio - 1:+.0%} (95% CI {o.ci_low - 1:+.0%} to {o.ci_high - 1:+.0%})"


def reading(cost: Cost, noise: Noise) -> tuple[Quadrant | None, str]:
    """The quadrant and a plain sentence; no quadrant without churn under ``impl``."""
    o = cost.overhead
    spent = f"determinism changes {cost.metric} time by {_interval(o)}"
    if noise.churn_impl is None:
        return None, f"{spent}; the stability study has no `impl` variant with 2+ runs, so no reading"
    q = quadrant(o, noise.churn_impl)
    removes = (
        f"removes implementation noise that changes {noise.churn_impl:.1%} of test predictions "
        "between otherwise identical runs"
    )
    if q == "not settled":
        return q, f"{cost.verdict.text}: {spent}; it {removes}"
    return q, f"{q}: {spent} and {removes}; {QUADRANT_ADVICE[q]}"


StudyKey = tuple[str, str, str]
"""(model, device label, Keras backend): what a sweep's cost and a stability study's noise are joined on."""


def pair(costs: Mapping[StudyKey, Cost], noises: Iterable[tuple[StudyKey, Noise]]) -> list[TradeoffPoint]:
    """Join costs with stability studies of the same model, device label and backend."""
    points = []
    for key, noise in noises:
        cost = costs.get(key)
        if cost is None:
            continue
        q, text = reading(cost, noise)
        points.append(TradeoffPoint(*key, cost, noise, q, text))
    return points
