"""What a sweep found, per model: overheads, failures, and where the added time went.

The per-mode kernel tables of all repeats are merged into per-step averages, so that a
mode that lost a repeat to a failure is not made to look cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from detprof.determinism import Mode
from detprof.profiler.kernel_table import SUMMARY_DTYPES, KernelTable, conform
from detprof.profiler.overhead import ModelOverhead, model_overheads
from detprof.profiler.stats import diff, kernel_stats
from detprof.store import ResultsStore


@dataclass
class ModelSummary:
    model: str
    overhead: ModelOverhead
    per_step_tables: dict[Mode, KernelTable]
    kernel_diff: pd.DataFrame | None

    @property
    def top_added_kernel(self) -> dict[str, Any] | None:
        """The kernel whose time grew most under determinism (added or slower)."""
        if self.kernel_diff is None:
            return None
        grown = self.kernel_diff[self.kernel_diff["delta_ns"] > 0]
        if grown.empty:
            return None
        return grown.sort_values("delta_ns", ascending=False).iloc[0].to_dict()


def _run_table(store: ResultsStore, record: dict[str, Any]) -> KernelTable:
    frame = store.read_table(record["kernel_table"])
    if record.get("kernel_table_kind") == "summary":
        return KernelTable(record["run_id"], "nsys-stats-csv", summary=conform(frame, SUMMARY_DTYPES))
    table = KernelTable(record["run_id"], "tf-xplane")
    table.kernels = frame
    return table


def per_step_table(store: ResultsStore, records: list[dict[str, Any]], label: str) -> KernelTable | None:
    """One summary table of a mode: each kernel's instances and time per measured step."""
    stats = []
    steps = 0
    for rec in records:
        if rec.get("status") == "ok" and rec.get("kernel_table"):
            stats.append(kernel_stats(_run_table(store, rec)))
            steps += int(rec["steps"])
    if not stats:
        return None
    merged = pd.concat(stats, ignore_index=True)
    grouped = (
        merged.groupby("name", sort=False)
        .agg(
            short_name=("short_name", "first"),
            instances=("instances", "sum"),
            total_ns=("total_ns", "sum"),
            min_ns=("min_ns", "min"),
            max_ns=("max_ns", "max"),
        )
        .reset_index()
    )
    grouped["avg_ns"] = grouped["total_ns"] / grouped["instances"]
    grouped["instances"] = (grouped["instances"] / steps).round().astype("int64").clip(lower=1)
    grouped["total_ns"] = (grouped["total_ns"] / steps).round().astype("int64")
    return KernelTable(label, "nsys-stats-csv", summary=conform(grouped, SUMMARY_DTYPES))


def summarize(store: ResultsStore) -> list[ModelSummary]:
    records = list(store.records())
    overheads = model_overheads(records)
    models = list(dict.fromkeys(r["model"] for r in records))
    summaries = []
    for model in models:
        tables: dict[Mode, KernelTable] = {}
        for mode in ("default", "deterministic"):
            mode_records = [r for r in records if r["model"] == model and r["mode"] == mode]
            table = per_step_table(store, mode_records, f"{model} {mode}")
            if table is not None:
                tables[mode] = table
        kernel_diff = diff(tables["default"], tables["deterministic"]) if len(tables) == 2 else None
        summaries.append(ModelSummary(model, overheads[model], tables, kernel_diff))
    return summaries
