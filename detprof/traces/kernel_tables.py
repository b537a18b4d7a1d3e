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
from detprof.traces.kernel_table import SUMMARY_DTYPES, UNNAMED, KernelTable, conform

GroupBy = Literal["name", "short_name"]
DiffStatus = Literal["added", "removed", "slower", "faster", "same"]

STAT_COLUMNS = ["instances", "total_ns", "avg_ns", "med_ns", "min_ns", "max_ns", "std_ns"]


def _launch_columns(table: KernelTable) -> tuple[str, ...]:
    """The launch columns statistics read: the op type too where the table has it at hand, which classifies the
    kernels whose names say nothing (``_ranked``), without making a parser that deferred it (nsys) read it."""
    return ("name", "short_name", "dur_ns", *(("op_type",) if table.loaded("op_type") else ()))


def kernel_stats(table: KernelTable, by: GroupBy = "name") -> pd.DataFrame:
    """One row per kernel, ordered by total time (descending), with its share of all kernel time."""
    if table.summary is not None:
        stats = _merge_summary(table.summary, by)
    else:
        stats = _launch_stats(table.launches(*_launch_columns(table)), by)
    return _ranked(stats, int(stats["total_ns"].sum()))


def _ranked(stats: pd.DataFrame, total_ns: int) -> pd.DataFrame:
    """``stats`` with each kernel's share of ``total_ns`` and its category, by total time (descending), then name.

    A kernel whose name no rule knows takes the category of the op that ran it, where the trace says
    (``op_type``): XLA:GPU names a kernel after its HLO instruction, and the deterministic gradient of max pooling
    runs as ``sort_5_1`` kernels of a ``select_and_scatter`` op, pooling's cost that its name does not tell."""
    stats["pct"] = stats["total_ns"] / total_ns * 100.0 if total_ns else 0.0
    stats["category"] = [classify(str(name), op) for name, op in zip(stats["name"], stats["op_type"], strict=True)]
    stats = stats.sort_values(["total_ns", "name"], ascending=[False, True], kind="stable")
    return stats.reset_index(drop=True)


def _launch_stats(kernels: pd.DataFrame, by: GroupBy) -> pd.DataFrame:
    """Statistics over launches, grouped by the integer codes of the (Categorical) names.

    Only the distinct names are looked up as strings, so a million launches cost a
    million integers, not a million Python strings.
    """
    key = _named(kernels[by])
    short = key if by == "short_name" else _named(kernels["short_name"])
    launches = pd.DataFrame(
        {"dur": kernels["dur_ns"].to_numpy(dtype=np.int64), "short": short.cat.codes.to_numpy()}, copy=False
    )
    agg = launches.groupby(key.cat.codes.to_numpy(), sort=False).agg(
        instances=("dur", "count"),
        total_ns=("dur", "sum"),
        avg_ns=("dur", "mean"),
        med_ns=("dur", "median"),
        min_ns=("dur", "min"),
        max_ns=("dur", "max"),
        std_ns=("dur", "std"),
        short=("short", "first"),
    )
    out = agg.drop(columns="short").astype(
        {c: np.int64 if c in ("instances", "total_ns") else np.float64 for c in STAT_COLUMNS}
    )
    out.insert(0, "name", key.cat.categories.to_numpy(dtype=object)[agg.index.to_numpy()])
    out["short_name"] = short.cat.categories.to_numpy(dtype=object)[agg["short"].to_numpy()]
    out["op_type"] = _first_op_types(kernels, key.cat.codes.to_numpy(), agg.index.to_numpy())
    return out.reset_index(drop=True)


def _first_op_types(kernels: pd.DataFrame, codes: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """Per kernel (``kinds``, name codes), the op type of its first launch that has one; None where none has."""
    if "op_type" not in kernels:
        return np.full(len(kinds), None, dtype=object)
    ops = kernels["op_type"].to_numpy(dtype=object)
    known = pd.notna(ops)
    first = pd.Series(ops[known], index=codes[known])
    first = first[~first.index.duplicated()]
    return first.reindex(kinds).astype(object).where(lambda s: s.notna(), None).to_numpy(dtype=object)


def _named(names: pd.Series) -> pd.Series:
    """A name column as a Categorical without nulls: a launch without a name is one more kernel.

    Null codes (-1) would otherwise index the last category and merge with that kernel.
    """
    names = names if isinstance(names.dtype, pd.CategoricalDtype) else names.astype("category")
    if not names.hasnans:
        return names
    if UNNAMED not in names.cat.categories:
        names = names.cat.add_categories([UNNAMED])
    return names.fillna(UNNAMED)


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
        out["op_type"] = first["op_type"]
        out = out.drop(columns="rows")
    for col in ("avg_ns", "med_ns", "min_ns", "max_ns", "std_ns"):
        out[col] = out[col].astype("float64")
    out["instances"] = out["instances"].astype("int64")
    out["total_ns"] = out["total_ns"].astype("int64")
    return out[["name", "short_name", *STAT_COLUMNS, "op_type"]]


def top_n(table: KernelTable, n: int = 20, by: GroupBy = "name") -> tuple[pd.DataFrame, int]:
    """The ``n`` kernels with the most total time, and the time of all the others (``other_ns``).

    Over launches, the kernels are ranked on their totals alone (one pass over the integer
    name codes), and only the ``n`` chosen get the statistics that need their launches
    sorted (median) or a name classified: a million launches of hundreds of kernels then
    cost a pass, not a group-by of every kernel. The rows are those ``kernel_stats`` gives.
    """
    if table.summary is not None:
        stats = kernel_stats(table, by)
        other_ns = int(stats["total_ns"].iloc[n:].sum()) if len(stats) > n else 0
        return stats.head(n).reset_index(drop=True), other_ns
    launches = table.launches(*_launch_columns(table))
    key = _named(launches[by])
    codes = key.cat.codes.to_numpy()
    durations = launches["dur_ns"].to_numpy(dtype=np.int64)
    kinds = len(key.cat.categories)
    totals = np.zeros(kinds, np.int64)
    np.add.at(totals, codes, durations)
    ran = np.flatnonzero(np.bincount(codes, minlength=kinds))
    names = key.cat.categories.to_numpy(dtype=object)[ran].astype(str)
    chosen = ran[np.lexsort((names, -totals[ran]))[:n]]
    keep = np.zeros(kinds, bool)
    keep[chosen] = True
    total_ns = int(totals.sum())
    head = _ranked(_launch_stats(launches[keep[codes]], by), total_ns)
    return head, total_ns - int(head["total_ns"].sum())


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
