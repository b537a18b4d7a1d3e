"""One plain sentence per model saying where the time determinism adds goes: THE attribution.

A diff table of hundreds of kernels answers the question only for a reader who adds it
up; the report says it in words, and the sweep's closing console table prints the same
words (``attribution``), so the two can never name different kernels or numbers.

The sentence is read off the per-step kernel diff (default -> deterministic, all repeats
pooled over the steps the headline counts, outlying ones set aside:
``analysis.study_results.summarize_model``). Where the model's headline interval holds 1.00,
it says that no added time was told apart from noise, as the layers' leaderboard does
(``analysis.layers``), and names no kernel. Otherwise, when the net change is an increase of
at least ``NEGLIGIBLE_CHANGE``, it names the one kind of work (kernel category) whose
kernels grew most, how many kernels that is, the library they come from when they share
one, whether they are new or merely slower, their share of the net added kernel time, and
the one of them that grew most; when the single largest increase is a kernel of another
kind, it says that too, so that the kernel named never seems to belong to a group it is
not in. The share is of the *net* change, so it can exceed 100%
when other kernels got faster at the same time; the sentence says so instead of hiding it.
A smaller change, or a fall, reads as no added kernel time: it says by how much the total moved, and,
when some kernel did grow, that its growth was outweighed by kernels that got faster (so a
console table naming that kernel and a report saying "no added time" cannot contradict).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pandas as pd

from detprof.formatting import ratio, signed_ns

if TYPE_CHECKING:
    from detprof.analysis.layers import ModelAttribution
    from detprof.intervals import Overhead

NEGLIGIBLE_CHANGE = 0.01
"""A net change under 1% of the default kernel time is within run-to-run jitter: nothing to attribute."""

CATEGORY_WORDS: dict[str, str] = {
    "conv forward": "convolution forward",
    "conv backward data": "convolution backward-data",
    "conv backward filter": "convolution backward-filter",
    "gemm/matmul": "matrix-multiply",
    "elementwise": "elementwise",
    "reduction": "reduction",
    "batch-norm": "normalization",
    "pooling": "pooling",
    "softmax/loss": "softmax/loss",
    "recurrent": "recurrent-layer",
    "optimizer update": "optimizer-update",
    "memory": "data-movement",
    "communication": "communication",
    "other": "uncategorized",
}
LIBRARIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cuDNN", re.compile(r"cudnn", re.IGNORECASE)),
    ("cuBLAS", re.compile(r"cublas", re.IGNORECASE)),
    ("CUTLASS", re.compile(r"cutlass", re.IGNORECASE)),
    ("Eigen", re.compile(r"Eigen::")),
    ("NCCL", re.compile(r"nccl", re.IGNORECASE)),
    ("oneDNN", re.compile(r"^_Mkl")),
)
NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
STATUS_WORDS = {"added": "new", "slower": "slower", "same": "within jitter", "faster": "faster", "removed": "removed"}
SHORT_NAME_CHARS = 60


def _count(n: int) -> str:
    return NUMBER_WORDS[n] if n < len(NUMBER_WORDS) else str(n)


def _library(names: list[str]) -> str | None:
    """The library every one of these kernels comes from, if they share one."""
    for library, pattern in LIBRARIES:
        if all(pattern.search(n) for n in names):
            return library
    return None


def _short(name: str) -> str:
    return name if len(name) <= SHORT_NAME_CHARS else name[: SHORT_NAME_CHARS - 3] + "..."


def _top(grown: pd.DataFrame) -> tuple[str, float, str] | None:
    return None if grown.empty else _largest(grown)


def _largest(grown: pd.DataFrame) -> tuple[str, float, str]:
    """The kernel that grew most (by name on ties): its short name, growth per step and status."""
    row = grown.sort_values(["delta_ns", "name"], ascending=[False, True]).iloc[0]
    name = str(row["short_name"]) if pd.notna(row["short_name"]) and str(row["short_name"]) else str(row["name"])
    return _short(name), float(row["delta_ns"]), str(row["status"])


def _named(kernel: tuple[str, float, str]) -> str:
    """A kernel, how much it grew per step, and whether it is new or slower."""
    name, delta, status = kernel
    return f"{name} ({signed_ns(delta)}/step, {STATUS_WORDS.get(status, status)})"


def attribution(kernel_diff: pd.DataFrame, overhead: Overhead | None) -> str:
    """The sentence, from a ``kernel_tables.diff`` frame (default as base, deterministic as other) and the model's
    headline ``overhead``: where its interval holds 1.00, no added time was told apart from noise, and no kernel is
    named as if some were."""
    base = int(kernel_diff["total_ns_base"].sum())
    net = int(kernel_diff["total_ns_other"].sum()) - base
    grown = kernel_diff[kernel_diff["delta_ns"] > 0]
    top = _top(grown)
    if base <= 0:
        return "There is no default-mode kernel time to compare against."
    if overhead is not None and overhead.has_interval and overhead.ci_low <= 1.0 <= overhead.ci_high:
        return (
            f"Determinism added no kernel time told apart from noise: the interval {ratio(overhead)} holds 1.00 "
            f"(kernel time per step changed by {net / base:+.1%}, {signed_ns(net)})."
        )
    if net <= 0 or net < NEGLIGIBLE_CHANGE * base:
        moved = f"kernel time per step changed by {net / base:+.1%} ({signed_ns(net)})"
        if net > 0:
            moved += f", under the {NEGLIGIBLE_CHANGE:.0%} that counts as unchanged"
        sentence = f"Determinism added no kernel time here: {moved}."
        if top is not None and net <= 0:
            sentence += f" The largest single increase, {_named(top)}, was outweighed by kernels that got faster."
        return sentence + _outside(net / base, overhead)
    by_category = grown.groupby("category", sort=False)["delta_ns"].sum().sort_values(ascending=False)
    category = str(by_category.index[0])
    kernels = grown[grown["category"] == category]
    share = float(by_category.iloc[0]) / net
    statuses = set(kernels["status"])
    qualifier = {frozenset({"added"}): "new ", frozenset({"slower"}): "slower "}.get(frozenset(statuses), "")
    library = _library([str(n) for n in kernels["name"]])
    what = " ".join(w for w in (library, CATEGORY_WORDS.get(category, category)) if w)
    plural = "kernel" if len(kernels) == 1 else "kernels"
    where = f"{_count(len(kernels))} {qualifier}{what} {plural}"
    if share > 1:
        sentence = (
            f"More than all of the added kernel time ({share:.0%} of the net +{net / base:.1%}) is in {where}; "
            "other kernels got faster."
        )
    else:
        sentence = f"{share:.0%} of the added kernel time (net +{net / base:.1%}) is in {where}."
    group_top = _largest(kernels)
    sentence += f" {'It is' if len(kernels) == 1 else 'Largest of them:'} {_named(group_top)}."
    if top is not None and group_top[0] != top[0]:
        sentence += f" The largest single increase is outside them: {_named(top)}."
    return sentence + _outside(net / base, overhead)


def _outside(change: float, overhead: Overhead | None) -> str:
    """Where the kernels' change per step lies outside the headline's interval, a sentence that says so and why
    (else ""): the kernels' figures are means over every counted step of every run, which steps slowed by other work
    weigh on, and the headline is the median of the paired steps' ratios, which they do not."""
    if overhead is None or not overhead.has_interval or overhead.ci_low - 1 <= change <= overhead.ci_high - 1:
        return ""
    return (
        f" These kernel figures add up to {change:+.1%}, outside the overhead's {ratio(overhead)}: they are means over "
        "the steps, which steps slowed by other work weigh on, and the overhead is the median of the paired steps' "
        "ratios: a run with nothing else on the machine reads where the time went."
    )


def with_layer(parts: ModelAttribution | None, kernels: str | None) -> str | None:
    """What every output says of where the added time went: the layer that carries most of it, where one does
    (``ModelAttribution.sentence``), then the kernels' sentence."""
    return " ".join(filter(None, (parts.sentence() if parts else None, kernels))) or None
