"""What determinism costs against what it buys: one point per model and device, and its reading.

The cost comes from a sweep (det/default kernel time, or wall time where no kernel time
was traced); the benefit from a stability study of the same model on the same device
label: the implementation noise that determinism removes. Two measures of that noise:

- churn under ``impl``: with every seed fixed and only the implementation free to vary,
  the fraction of test predictions that differ between two runs. That noise is exactly
  what determinism removes, so it is the y axis and the quadrant reading uses it;
- the drop in accuracy std from ``algo+impl`` to ``algo``: how much tighter the accuracy
  spread gets when determinism is added to a study that varies seeds anyway, with its
  standard error sqrt(se1^2 + se2^2) (the two variants' runs are independent).

Thresholds, and why:

- ``intervals.CHEAP_OVERHEAD = 1.10``: up to 10% more time is within the spread of
  training throughput that users already live with (input pipelines, shared machines) and
  the paper's cheapest models (101%); beyond it, determinism visibly lengthens experiments.
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
from detprof.intervals import CHEAP_OVERHEAD, Metric, Overhead, spans

NOISY_CHURN = 0.01

Quadrant = Literal[
    "cheap and worth it", "expensive but buys a lot", "cheap and buys little", "expensive and buys little"
]
QUADRANT_ADVICE: dict[Quadrant, str] = {
    "cheap and worth it": "turn determinism on: it removes real noise for little time",
    "expensive but buys a lot": (
        "worth paying when results must be reproducible (debugging, audits, papers); "
        "otherwise keep it for the runs that matter"
    ),
    "cheap and buys little": "little noise to remove, and little to pay: turn it on for reproducibility",
    "expensive and buys little": "leave it off unless bitwise reproducibility itself is required",
}


@dataclass(frozen=True)
class Cost:
    """A sweep's overhead for one model on one device; ``metric`` says which time it is."""

    overhead: Overhead
    metric: Metric


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


def quadrant(ratio: float, churn: float) -> Quadrant:
    cheap = ratio <= CHEAP_OVERHEAD
    noisy = churn >= NOISY_CHURN
    if cheap:
        return "cheap and worth it" if noisy else "cheap and buys little"
    return "expensive but buys a lot" if noisy else "expensive and buys little"


def reading(cost: Cost, noise: Noise) -> tuple[Quadrant | None, str]:
    """The quadrant and a plain sentence; no quadrant without churn under ``impl``."""
    o = cost.overhead
    spent = f"determinism changes {cost.metric} time by {o.ratio - 1:+.0%}"
    if noise.churn_impl is None:
        return None, f"{spent}; the stability study has no `impl` variant with 2+ runs, so no reading"
    q = quadrant(o.ratio, noise.churn_impl)
    text = (
        f"{q}: {spent} and removes implementation noise that changes "
        f"{noise.churn_impl:.1%} of test predictions between otherwise identical runs; {QUADRANT_ADVICE[q]}"
    )
    if spans(o, CHEAP_OVERHEAD):
        text += f" (the overhead's 95% CI spans {CHEAP_OVERHEAD:.2f}x: cheap or expensive is not settled)"
    elif o.n < 2:
        text += " (one repeat: no CI on the overhead)"
    return q, text


def pair(costs: Mapping[tuple[str, str], Cost], noises: Iterable[tuple[str, str, Noise]]) -> list[TradeoffPoint]:
    """Join costs keyed by (model, device label) with stability studies of the same model and label."""
    points = []
    for model, device, noise in noises:
        cost = costs.get((model, device))
        if cost is None:
            continue
        q, text = reading(cost, noise)
        points.append(TradeoffPoint(model, device, cost, noise, q, text))
    return points
