"""Per-kernel statistics, top-N tables and diffs: pure functions over KernelTables.

The numbers match NVIDIA's ``cuda_gpu_kern_sum`` report (instances, total, share, mean,
median, min, max, sample standard deviation) so that a user can check detprof against
``nsys stats``. Launch-level and summary-only tables give the same columns; statistics
a summary input cannot know stay null.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd

from detprof.traces.classify import classify
from detprof.traces.kernel_table import SUMMARY_DTYPES, KernelTable, conform

GroupBy = Literal["name", "short_name"]
DiffStatus = Literal["added", "removed", "slower", "faster", "same"]

STAT_COLUMNS = ["instances", "total_ns", "avg_ns", "med_ns", "min_ns", "max_ns", "std_ns"]


def kernel_stats(table: KernelTable, by: GroupBy = "name") -> pd.DataFrame:
    """One row per kernel, ordered by total time (descending), with its share of all kernel time."""
    stats = _merge_summary(table.summary, by) if table.summary is not None else _launch_stats(table.kernels, by)
    total = stats["total_ns"].sum()
    stats["pct"] = stats["total_ns"] / total * 100.0 if total else 0.0
    stats["category"] = [classify(str(n)) for n in stats["name"]]
    stats = stats.sort_values(["total_ns", "name"], ascending=[False, True], kind="stable")
    return stats.reset_index(drop=True)


def _launch_stats(kernels: pd.DataFrame, by: GroupBy) -> pd.DataFrame:
    key = kernels[by]
    if not isinstance(key.dtype, pd.CategoricalDtype):
        key = key.astype("category")
    dur = kernels["dur_ns"].to_numpy(dtype=np.int64)
    grouped = pd.Series(dur).groupby(key.cat.codes.to_numpy(), sort=False)
    agg = grouped.agg(["count", "sum", "mean", "median", "min", "max", "std"])
    codes = agg.index.to_numpy()
    names = key.cat.categories.to_numpy()[codes]
    out = pd.DataFrame(
        {
            "name": names,
            "instances": agg["count"].to_numpy(dtype=np.int64),
            "total_ns": agg["sum"].to_numpy(dtype=np.int64),
            "avg_ns": agg["mean"].to_numpy(dtype=np.float64),
            "med_ns": agg["median"].to_numpy(dtype=np.float64),
            "min_ns": agg["min"].to_numpy(dtype=np.float64),
            "max_ns": agg["max"].to_numpy(dtype=np.float64),
            "std_ns": agg["std"].to_numpy(dtype=np.float64),
        }
    )
    if by == "name":
        short = kernels["short_name"]
        first_short = pd.Series(short.to_numpy()).groupby(key.cat.codes.to_numpy(), sort=False).first()
        out["short_name"] = first_short.loc[codes].to_numpy()
    else:
        out["short_name"] = out["name"]
    return out


ADDITIVE_STATS = {
    "instances": ("instances", "sum"),
    "total_ns": ("total_ns", "sum"),
    "min_ns": ("min_ns", "min"),
    "max_ns": ("max_ns", "max"),
}
"""What summary rows of one kernel add up to; a median or std over all launches cannot be recovered."""


def sum_per_kernel(rows: pd.DataFrame, keep: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per kernel name from rows that each summarize some of its launches; ``keep``: first value."""
    grouped = rows.groupby("name", sort=False)
    return grouped.agg(**{c: (c, "first") for c in keep}, **ADDITIVE_STATS).reset_index()


def _merge_summary(summary: pd.DataFrame, by: GroupBy) -> pd.DataFrame:
    """Summary inputs are already per kernel; merging rows (by short name) keeps only additive stats."""
    frame = conform(summary, SUMMARY_DTYPES)
    if by == "name":
        out = frame.copy()
    else:
        grouped = frame.groupby("short_name", sort=False, dropna=False)
        out = grouped.agg(**ADDITIVE_STATS, rows=("name", "size")).reset_index()
        out["name"] = out["short_name"]
        out["avg_ns"] = out["total_ns"] / out["instances"]
        single = out["rows"] == 1
        first = grouped.first().reset_index()
        out["med_ns"] = np.where(single, first["med_ns"].astype("float64"), np.nan)
        out["std_ns"] = np.where(single, first["std_ns"].astype("float64"), np.nan)
        out = out.drop(columns="rows")
    for col in ("avg_ns", "med_ns", "min_ns", "max_ns", "std_ns"):
        out[col] = out[col].astype("float64")
    out["instances"] = out["instances"].astype("int64")
    out["total_ns"] = out["total_ns"].astype("int64")
    return out[["name", "short_name", *STAT_COLUMNS]]


def top_n(table: KernelTable, n: int = 20, by: GroupBy = "name") -> tuple[pd.DataFrame, int]:
    """The ``n`` kernels with the most total time, and the time of all the others (``other_ns``)."""
    stats = kernel_stats(table, by)
    head = stats.head(n).reset_index(drop=True)
    other_ns = int(stats["total_ns"].iloc[n:].sum()) if len(stats) > n else 0
    return head, other_ns


def diff(base: KernelTable, other: KernelTable, by: GroupBy = "name", tolerance: float = 0.02) -> pd.DataFrame:
    """Per kernel: time in each table, the change, and its share of the total change.

    A kernel counts as slower or faster only when its total moves by more than
    ``tolerance`` of its base total, so that measurement jitter reads as "same".
    The rows are ordered by the size of their change, largest first.
    """
    a = kernel_stats(base, by)[["name", "short_name", "category", "instances", "total_ns"]]
    b = kernel_stats(other, by)[["name", "short_name", "category", "instances", "total_ns"]]
    merged = a.merge(b, on="name", how="outer", suffixes=("_base", "_other"))
    for side in ("base", "other"):
        merged[f"instances_{side}"] = merged[f"instances_{side}"].fillna(0).astype("int64")
        merged[f"total_ns_{side}"] = merged[f"total_ns_{side}"].fillna(0).astype("int64")
    merged["short_name"] = merged["short_name_base"].fillna(merged["short_name_other"])
    merged["category"] = merged["category_base"].fillna(merged["category_other"])
    merged["delta_ns"] = merged["total_ns_other"] - merged["total_ns_base"]
    total_change = int(merged["delta_ns"].sum())
    merged["share_of_change"] = merged["delta_ns"] / total_change if total_change else np.nan
    merged["status"] = [
        _status(nb, no, tb, to, tolerance)
        for nb, no, tb, to in zip(
            merged["instances_base"],
            merged["instances_other"],
            merged["total_ns_base"],
            merged["total_ns_other"],
            strict=True,
        )
    ]
    merged = merged.assign(_abs=merged["delta_ns"].abs()).sort_values(["_abs", "name"], ascending=[False, True])
    columns = [
        "name",
        "short_name",
        "category",
        "status",
        "instances_base",
        "instances_other",
        "total_ns_base",
        "total_ns_other",
        "delta_ns",
        "share_of_change",
    ]
    return merged[columns].reset_index(drop=True)


def _status(n_base: int, n_other: int, t_base: int, t_other: int, tolerance: float) -> DiffStatus:
    if n_base == 0:
        return "added"
    if n_other == 0:
        return "removed"
    if t_other > t_base * (1 + tolerance):
        return "slower"
    if t_other < t_base * (1 - tolerance):
        return "faster"
    return "same"


def kernels_in_common(table: pd.DataFrame) -> int:
    """How many kernels of a ``diff`` ran in both traces; with none, per-kernel changes mean nothing."""
    return int((~table["status"].isin(["added", "removed"])).sum())
