"""What the bench found, per case: time in each mode, the overhead, and the kernels that changed.

A kernel that only one mode launches is the visible trace of an algorithm change (cuDNN
picking another backward algorithm, a reduction replacing atomics, an op moving to the
CPU), so every case lists the kernels determinism added and removed, by name.

For the conv suite the cases of one medium CNN are also summed, per mode and repeat, into
the convolution time of the whole model, which is what the sweep's model-level number for
that network is mostly made of.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from detprof.analysis.overhead import ModelOverhead, model_overheads
from detprof.analysis.study_results import per_step_table
from detprof.errors import InputError
from detprof.intervals import METRIC_FIELDS, Metric, headline_metric
from detprof.kernels_bench.op_names import CONV_OPS
from detprof.store import ResultsStore
from detprof.traces.kernel_tables import diff


@dataclass
class CaseSummary:
    case: str
    op: str
    model: str
    shape: str
    overhead: ModelOverhead
    default_ns: float | None
    deterministic_ns: float | None
    layers: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


@dataclass
class BenchSummary:
    metric: Metric
    cases: list[CaseSummary]
    totals: list[CaseSummary]


def _metric(records: list[dict[str, Any]]) -> Metric:
    """Kernel time where a tracer recorded kernels; wall time for ``--tracer none``."""
    return headline_metric(any(r.get("kernel_ns_per_step") is not None for r in records if r.get("status") == "ok"))


def _mean_per_mode(records: list[dict[str, Any]], metric: Metric) -> dict[str, float | None]:
    means: dict[str, float | None] = {}
    for mode in ("default", "deterministic"):
        values = [
            float(r[METRIC_FIELDS[metric]])
            for r in records
            if r["mode"] == mode and r.get("status") == "ok" and r.get(METRIC_FIELDS[metric]) is not None
        ]
        means[mode] = sum(values) / len(values) if values else None
    return means


def _kernels_that_differ(store: ResultsStore, records: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    tables = {}
    for mode in ("default", "deterministic"):
        table = per_step_table(store, [r for r in records if r["mode"] == mode], mode)
        if table is not None:
            tables[mode] = table
    if len(tables) < 2:
        return [], []
    changes = diff(tables["default"], tables["deterministic"])
    added = changes.loc[changes["status"] == "added", "short_name"].astype(str)
    removed = changes.loc[changes["status"] == "removed", "short_name"].astype(str)
    return list(dict.fromkeys(added)), list(dict.fromkeys(removed))


def _conv_totals(cases: list[dict[str, Any]], records: list[dict[str, Any]], metric: Metric) -> list[CaseSummary]:
    """Per medium CNN, the summed time of its conv cases in each (mode, repeat) where all of them ran."""
    by_model: dict[str, list[str]] = {}
    for case in cases:
        if case["op"] in CONV_OPS:
            by_model.setdefault(case["model"], []).append(case["case"])
    totals = []
    for model, keys in by_model.items():
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for rec in records:
            if rec["case"] in keys and rec.get("status") == "ok":
                runs.setdefault((rec["mode"], int(rec["repeat"])), []).append(rec)
        summed = [
            {
                "model": model,
                "mode": mode,
                "repeat": repeat,
                "status": "ok",
                **{name: _sum(run_records, name) for name in METRIC_FIELDS.values()},
            }
            for (mode, repeat), run_records in sorted(runs.items())
            if len(run_records) == len(keys)
        ]
        if not summed:
            continue
        means = _mean_per_mode(summed, metric)
        overhead = model_overheads(summed, key="model")[model]
        totals.append(
            CaseSummary(
                case=f"{model}.total",
                op="conv2d (all)",
                model=model,
                shape=f"{model}: sum of {len(keys)} cases",
                overhead=overhead,
                default_ns=means["default"],
                deterministic_ns=means["deterministic"],
            )
        )
    return totals


def _sum(records: list[dict[str, Any]], name: str) -> float | None:
    values = [r.get(name) for r in records]
    return None if any(v is None for v in values) else float(sum(values))


CASE_FIELDS = frozenset({"case", "op", "model", "shape", "layers"})


def _manifest_cases(store: ResultsStore) -> list[dict[str, Any]]:
    """The bench's cases as its manifest lists them; a manifest without them is unusable input."""
    cases = store.manifest()["config"].get("cases")
    if not isinstance(cases, list) or not all(isinstance(c, dict) and c.keys() >= CASE_FIELDS for c in cases):
        raise InputError(f"{store.manifest_path}: not a detprof kernels manifest: its config has no valid 'cases'")
    return cases


def summarize(store: ResultsStore) -> BenchSummary:
    records = list(store.records())
    cases = _manifest_cases(store)
    metric = _metric(records)
    overheads = model_overheads(records, key="case")
    summaries = []
    for case in cases:
        case_records = [r for r in records if r["case"] == case["case"]]
        if not case_records:
            continue
        means = _mean_per_mode(case_records, metric)
        added, removed = _kernels_that_differ(store, case_records)
        summaries.append(
            CaseSummary(
                case=case["case"],
                op=case["op"],
                model=case["model"],
                shape=case["shape"],
                overhead=overheads[case["case"]],
                default_ns=means["default"],
                deterministic_ns=means["deterministic"],
                layers=list(case["layers"]),
                added=added,
                removed=removed,
            )
        )
    return BenchSummary(metric, summaries, _conv_totals(cases, records, metric))
