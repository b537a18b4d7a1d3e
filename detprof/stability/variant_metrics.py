"""From stored run records to per-variant metrics and tidy tables.

Works only from what the store holds (records and per-run arrays), so a resumed or
interrupted study is summarized exactly like one that ran in one go, and the report can
recompute anything from the same files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from detprof.errors import InputError
from detprof.intervals import bootstrap_spread
from detprof.models import npz_data
from detprof.records import backend_of
from detprof.stability import metrics
from detprof.stability.datasets import Dataset
from detprof.stability.variants import SEEDED_SOURCES, SOURCES, Variant


def readable_arrays(path: Path) -> bool:
    """Whether ``path`` holds a run's arrays, whole: a run whose arrays do not is trained again on resume."""
    try:
        return bool(npz_data.read_arrays(path))
    except InputError:
        return False


def _arrays(study_dir: Path, record: dict[str, Any]) -> dict[str, np.ndarray]:
    return npz_data.read_arrays(study_dir / record["arrays"])


def _spread_dict(values: Sequence[float]) -> dict[str, float]:
    s = bootstrap_spread(values)
    return {"mean": s.mean, "std": s.std, "std_se": s.std_se}


def summarize_variant(
    variant: Variant, records: Sequence[dict[str, Any]], study_dir: Path, data: Dataset
) -> dict[str, Any]:
    ok = sorted((r for r in records if r["status"] == "ok"), key=lambda r: r["run"])
    failed = [{"run_id": r["run_id"], "reason": r.get("reason", "")} for r in records if r["status"] != "ok"]
    arrays = [_arrays(study_dir, r) for r in ok]
    predictions = [a["predictions"] for a in arrays]
    probabilities = [a["probabilities"] for a in arrays]
    accuracy = _spread_dict([r["accuracy"] for r in ok])
    cross_entropy = _spread_dict([r["cross_entropy"] for r in ok])
    per_class = metrics.per_class_spread(
        np.array([[np.nan if v is None else v for v in r["per_class_accuracy"]] for r in ok]).reshape(
            len(ok), data.classes
        ),
        accuracy["std"],
    )
    eager = bool(ok) and all(str(r.get("train_step", "")).startswith("eager") for r in ok)
    check = metrics.determinism_check([[tuple(d) for d in r["layer_digests"]] for r in ok], _processes(ok), eager)
    return {
        "variant": variant.name,
        "varies": [s for s in SOURCES if s in variant.varies],
        "mode": variant.mode,
        "description": variant.describe(),
        "runs_ok": len(ok),
        "runs_failed": len(failed),
        "failures": failed,
        "accuracy": accuracy,
        "cross_entropy": cross_entropy,
        "learned": data.learned(cross_entropy["mean"]) if ok else None,
        "churn": metrics.churn(predictions),
        "l2": metrics.l2_distance([a["trainable_weights"] for a in arrays]),
        "per_class": asdict(per_class),
        "subgroups": (
            metrics.subgroup_spread(data.test_labels, predictions, data.groups_test, binary=data.classes == 2)
            if data.groups_test is not None and ok
            else None
        ),
        "spearman": metrics.spearman(probabilities),
        "ensemble_gain": metrics.ensemble_gain(probabilities, data.test_labels),
        "cka": metrics.mean_cka([a["representations"] for a in arrays]),
        "distinct_weights": len({r["weights_sha256"] for r in ok}),
        "determinism_check": {
            "applicable": variant.checks_determinism,
            "verified": check.verified,
            "first_differing_layer": check.first_differing_layer,
            "processes": check.processes,
            "eager": check.eager,
            "line": check.line(),
        },
    }


def _processes(records: Sequence[dict[str, Any]]) -> int | None:
    """How many worker processes trained ``records`` (a process by its node and id); None where a record does not
    name its process."""
    if any(r.get("pid") is None for r in records):
        return None
    return len({(r.get("ray_node_id"), r["pid"]) for r in records})


def runs_table(records: Sequence[dict[str, Any]], model: str, dataset: str, device: str) -> pd.DataFrame:
    """One row per run, failed ones included, seeds spelled out: the tidy input of any later analysis."""
    rows = []
    for r in records:
        row: dict[str, Any] = {
            "run_id": r["run_id"],
            "variant": r["variant"],
            "run": r["run"],
            "mode": r["mode"],
            "status": r["status"],
            "reason": r.get("reason"),
            "model": model,
            "dataset": dataset,
            "device": device,
            "backend": backend_of(r),
        }
        row |= {f"seed_{s}": r["seeds"].get(s) for s in SEEDED_SOURCES}
        row |= {
            "accuracy": r.get("accuracy"),
            "cross_entropy": r.get("cross_entropy"),
            "weights_sha256": r.get("weights_sha256"),
            "final_train_loss": r["curve"][-1]["train_loss"] if r.get("curve") else None,
            "train_seconds": r.get("train_seconds"),
        }
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame["seed_bitflip"] = frame["seed_bitflip"].astype("Int64")
    return frame


def curves_table(records: Sequence[dict[str, Any]]) -> pd.DataFrame:
    rows = [
        {"run_id": r["run_id"], "variant": r["variant"], "run": r["run"], **point}
        for r in records
        if r["status"] == "ok"
        for point in r["curve"]
    ]
    return pd.DataFrame(
        rows,
        columns=[
            "run_id",
            "variant",
            "run",
            "epoch",
            "train_loss",
            "train_accuracy",
            "test_loss",
            "test_accuracy",
        ],
    )


def per_class_table(records: Sequence[dict[str, Any]]) -> pd.DataFrame:
    rows = [
        {"run_id": r["run_id"], "variant": r["variant"], "run": r["run"], "class": c, "accuracy": acc}
        for r in records
        if r["status"] == "ok"
        for c, acc in enumerate(r["per_class_accuracy"])
    ]
    frame = pd.DataFrame(rows, columns=["run_id", "variant", "run", "class", "accuracy"])
    frame["accuracy"] = frame["accuracy"].astype("float64")
    return frame
