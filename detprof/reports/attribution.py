"""One plain sentence per model saying where the time determinism adds goes.

A diff table of hundreds of kernels answers the question only for a reader who adds it
up; the report says it in words. The sentence names the one kind of work (kernel
category) whose kernels grew most, how many kernels that is, the library they come from
when they share one, whether they are new or merely slower, and their share of the net
added kernel time. The share is of the *net* change, so it can exceed 100% when other
kernels got faster at the same time; the sentence says so instead of hiding it.
"""

from __future__ import annotations

import re

import pandas as pd

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
    "optimizer update": "optimizer-update",
    "memory": "data-movement",
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


def _count(n: int) -> str:
    return NUMBER_WORDS[n] if n < len(NUMBER_WORDS) else str(n)


def _library(names: list[str]) -> str | None:
    """The library every one of these kernels comes from, if they share one."""
    for library, pattern in LIBRARIES:
        if all(pattern.search(n) for n in names):
            return library
    return None


def attribute(kernel_diff: pd.DataFrame) -> str:
    """The sentence, from a ``stats.diff`` frame (default as base, deterministic as other)."""
    base = int(kernel_diff["total_ns_base"].sum())
    net = int(kernel_diff["total_ns_other"].sum()) - base
    if base <= 0:
        return "There is no default-mode kernel time to compare against."
    if net <= 0 or net < NEGLIGIBLE_CHANGE * base:
        return (
            f"Determinism added no kernel time here: the total changed by {net / base:+.1%} "
            f"(under {NEGLIGIBLE_CHANGE:.0%} counts as unchanged)."
        )
    grown = kernel_diff[kernel_diff["delta_ns"] > 0]
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
        return (
            f"More than all of the added kernel time ({share:.0%} of the net +{net / base:.1%}) is in {where}; "
            "other kernels got faster."
        )
    return f"{share:.0%} of the added kernel time (net +{net / base:.1%}) is in {where}."
