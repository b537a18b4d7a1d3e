"""What a sweep found, per model: overheads, failures, and where the added time went.

The kernel tables of all repeats of one mode are merged into per-step figures, so that a
mode that lost a repeat to a failure is not made to look cheaper. The sweep's console
table, the report and kernels_bench all read them from here, so they agree to the
nanosecond.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args

import pandas as pd

from detprof.analysis.overhead import ModelOverhead, model_overheads
from detprof.determinism import MODES, Mode
from detprof.errors import InputError
from detprof.records import kernel_table_steps, outlying_steps
from detprof.store import ResultsStore
from detprof.traces.kernel_table import SUMMARY_DTYPES, KernelTable, TraceFormat, conform
from detprof.traces.kernel_tables import diff, kernel_stats, sum_per_kernel

TRACE_FORMATS: dict[tuple[str, str], TraceFormat] = {
    ("nsys", "launches"): "nsys-sqlite",
    ("nsys", "summary"): "nsys-stats-csv",
    ("nvprof", "launches"): "nvprof-trace-csv",
    ("nvprof", "summary"): "nvprof-summary-csv",
    ("tf", "launches"): "tf-xplane",
}
"""(record's tracer, its ``kernel_table_kind``) -> the format its kernel table was parsed from, for
records written before they said so themselves (``kernel_table_format``)."""


@dataclass
class ModeKernels:
    """One mode's kernels over all its repeats.

    ``stats`` has ``kernel_stats``' columns with ``instances`` and ``total_ns`` per measured
    step (averages, so not whole numbers); avg, median, min, max and std are per launch.
    """

    label: str
    format: TraceFormat
    stats: pd.DataFrame

    def table(self) -> KernelTable:
        """Per step, in whole instances and nanoseconds: the summary table ``stats.diff`` takes."""
        frame = self.stats.assign(
            instances=self.stats["instances"].round().clip(lower=1).astype("int64"),
            total_ns=self.stats["total_ns"].round().astype("int64"),
        )
        return KernelTable(self.label, self.format, summary=conform(frame, SUMMARY_DTYPES))


@dataclass
class ModelSummary:
    model: str
    overhead: ModelOverhead
    modes: dict[Mode, ModeKernels]
    kernel_diff: pd.DataFrame | None
    """``stats.diff`` default -> deterministic, per step; None unless both modes have kernels."""


def _trace_format(store: ResultsStore, record: Mapping[str, Any]) -> TraceFormat:
    if record.get("kernel_table_format") in get_args(TraceFormat):
        return record["kernel_table_format"]
    key = (str(record.get("tracer")), str(record.get("kernel_table_kind")))
    if key not in TRACE_FORMATS:
        raise InputError(
            f"{store.record_path(str(record.get('run_id')))}: a kernel table of tracer {key[0]!r} "
            f"and kind {key[1]!r} is not one detprof writes"
        )
    return TRACE_FORMATS[key]


def counted_steps(frame: pd.DataFrame, record: Mapping[str, Any]) -> tuple[pd.DataFrame, int]:
    """A run's kernel rows of the steps its overhead counts, and how many steps they are: its outlying steps
    (``records.outlying_steps`` of its ``step_kernel_ns``) set aside, as the median per step sets them aside; all
    of them where the table does not say which step each row ran in."""
    steps = kernel_table_steps(record)
    if "step" not in frame or frame["step"].isna().all():
        return frame, steps
    outlying = outlying_steps(record.get("step_kernel_ns") or [])
    return frame[~frame["step"].isin(outlying)], steps - len(outlying)


def _run_table(store: ResultsStore, record: Mapping[str, Any]) -> tuple[KernelTable, int]:
    """A run's kernel table and the steps it holds (``counted_steps``)."""
    frame = store.read_table(record["kernel_table"])
    fmt = _trace_format(store, record)
    if record.get("kernel_table_kind") == "summary":
        return KernelTable(record["run_id"], fmt, summary=conform(frame, SUMMARY_DTYPES)), kernel_table_steps(record)
    kept, steps = counted_steps(frame, record)
    return KernelTable(record["run_id"], fmt, kernels=kept), steps


def _merged_summaries(tables: Sequence[KernelTable]) -> pd.DataFrame:
    """Summary-only tables add up per kernel; a median or std over all launches cannot be recovered."""
    grouped = sum_per_kernel(
        pd.concat([kernel_stats(t) for t in tables], ignore_index=True), keep=("short_name", "op_type")
    )
    grouped["avg_ns"] = grouped["total_ns"] / grouped["instances"]
    return conform(grouped, SUMMARY_DTYPES)


def mode_kernels(store: ResultsStore, records: Sequence[Mapping[str, Any]], label: str) -> ModeKernels | None:
    """One mode's kernels from its runs' tables, over the steps their overheads count; None when no run of it
    left one.

    Launch-level tables are pooled, so the median is over every launch of every repeat.
    """
    ok = [r for r in records if r.get("status") == "ok" and r.get("kernel_table")]
    if not ok:
        return None
    tables, counted = zip(*(_run_table(store, r) for r in ok), strict=True)
    steps = sum(counted)
    fmt = tables[0].format
    if any(t.is_summary for t in tables):
        pooled = KernelTable(label, fmt, summary=_merged_summaries(tables))
    else:
        pooled = KernelTable(label, fmt, kernels=pd.concat([t.kernels for t in tables], ignore_index=True))
    stats = kernel_stats(pooled)
    stats["instances"] = stats["instances"] / steps
    stats["total_ns"] = stats["total_ns"] / steps
    return ModeKernels(label, fmt, stats)


def per_step_table(store: ResultsStore, records: Sequence[Mapping[str, Any]], label: str) -> KernelTable | None:
    """One summary table of a mode: each kernel's instances and time per measured step."""
    kernels = mode_kernels(store, records, label)
    return None if kernels is None else kernels.table()


def summarize_model(store: ResultsStore, overhead: ModelOverhead, records: Sequence[Mapping[str, Any]]) -> ModelSummary:
    """One model's overheads, each mode's kernels and the diff default -> deterministic."""
    modes: dict[Mode, ModeKernels] = {}
    for mode in MODES:
        kernels = mode_kernels(store, [r for r in records if r["mode"] == mode], f"{overhead.model} {mode}")
        if kernels is not None:
            modes[mode] = kernels
    kernel_diff = None
    if len(modes) == len(MODES):
        kernel_diff = diff(modes["default"].table(), modes["deterministic"].table())
    return ModelSummary(overhead.model, overhead, modes, kernel_diff)


def summarize(store: ResultsStore) -> list[ModelSummary]:
    records = list(store.records())
    overheads = model_overheads(records)
    return [
        summarize_model(store, overhead, [r for r in records if r["model"] == model])
        for model, overhead in overheads.items()
    ]
