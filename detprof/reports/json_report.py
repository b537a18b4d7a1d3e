"""``detprof report --format json``: the report's headline numbers for scripts and notebooks.

The same ``headline.HeadlineRow`` values as the HTML's first screen and the Markdown, one
object per model, device and Keras backend under ``models`` (``headline.row_json``: device,
model, backend, overhead {kernel, wall: {ratio, lo, hi, n}}, verdict, noise_floor,
stability, then the verdict's text, repeats needed, caveats, ...), with the report-level
notes beside them and every backend under ``backends`` with its framework's version. Where a
``detprof verify`` study is among the results, ``verification`` holds each model's
comparison (``ModelVerification.to_json``: held, each mode's first difference, findings).
Where a ``detprof sweep --knobs`` study is, ``knobs`` holds each of its models (model,
device_label, backend, total {ratio, lo, hi, n}, advice, and per knob ``analysis.knobs.knobs_json``:
knob, applies, reason, add_one and leave_one_out {ratio, lo, hi}, needed, ...), and the headline
entry of the same model, device and backend carries its knobs too.
Undefined numbers are null (``store.json_safe``), never NaN.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from detprof.analysis.knobs import helpers_json, knobs_json
from detprof.intervals import CHEAP_OVERHEAD
from detprof.reports.headline import HeadlineRow, interval_json, row_json
from detprof.reports.knobs_data import KnobReading
from detprof.reports.published import PUBLISHED, SOURCE
from detprof.reports.report_data import Report
from detprof.reports.tradeoff import NOISY_CHURN
from detprof.store import json_safe

SCHEMA = "detprof.report.headline/1"


def document(report: Report) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "generated_at": report.generated_at,
        "sources": [str(p) for p in report.sources],
        "thresholds": {"cheap_overhead": CHEAP_OVERHEAD, "noisy_churn": NOISY_CHURN},
        "backends": {b: report.framework(b) for b in report.backends},
        "models": [row_json(r) | knobs_of(r, report.knobs_beside_headline) for r in report.headline],
        "notes": [*report.cpu_notes, *report.notes],
        "stability_not_learned": [
            {
                "model": s.model,
                "device": s.label,
                "backend": s.backend,
                "dataset": s.dataset,
                "reason": s.learning.line(),
                "advice": s.longer_training,
            }
            for s in report.stability
            if not s.learned
        ],
        "measured_on_gpus": [asdict(m) for m in report.measured_on_gpus],
        "published_gpu_reference": {
            "source": SOURCE,
            "figures": [
                {"gpu": f.gpu, "subject": f.subject, "kind": f.kind, "low": f.low, "high": f.high} for f in PUBLISHED
            ],
        },
        "noise_floors": [
            {
                "device": r.device,
                "model": r.model,
                "aa": {"kernel": interval_json(r.kernel), "wall": interval_json(r.wall)},
                "noise_floor": r.floor,
            }
            for r in report.noise_floors
        ],
        "warnings": report.warnings,
    } | additions(report)


def additions(report: Report) -> dict[str, Any]:
    """The keys of the studies that only add to a report (``verification``, ``knobs``, and ``sections``: the
    sections of kinds that bring their own, by id): absent without them."""
    sections = {"sections": {s.id: s.as_json() for s in report.sections}} if report.sections else {}
    return verification(report) | knobs(report) | sections


def verification(report: Report) -> dict[str, Any]:
    """``verification``: each verified model's ``ModelVerification.to_json()`` with the device label and backend of
    its study, the keys its headline row would be matched by. Left out without a verification study, so the
    document of results without one is as it was."""
    if not report.verifications:
        return {}
    return {
        "verification": [
            v.to_json() | {"device_label": study.label, "backend": study.backend}
            for study in report.verifications
            for v in study.models
        ]
    }


def knob_json(k: KnobReading) -> dict[str, Any]:
    """One model of a knob study: where it ran, full determinism's total, the advice, and every knob
    (``knobs_json``, read against the noise floor of the same model, device label and backend where known)."""
    return {
        "model": k.knobs.model,
        "device_label": k.study.label,
        "backend": k.study.backend,
        "total": interval_json(k.knobs.total),
        **({"every": interval_json(k.knobs.every)} if k.knobs.has_every else {}),
        "noise_floor": k.floor,
        "advice": k.advice,
        "unexplained": k.knobs.unexplained(),
        "knobs": knobs_json(k.knobs, k.floor),
        "helpers": helpers_json(k.knobs),
        "least_set": k.knobs.least_set(),
    }


def knobs(report: Report) -> dict[str, Any]:
    """``knobs``: each knob study's models (``knob_json``); left out without one, as ``verification`` is."""
    if not report.knobs:
        return {}
    return {"knobs": [knob_json(k) for k in report.knobs]}


def knobs_of(row: HeadlineRow, readings: Iterable[KnobReading]) -> dict[str, Any]:
    """A headline entry's ``knobs``, where a knob study measured its model, device label and backend."""
    key = (row.model, row.device, row.backend)
    found = next((k for k in readings if k.key == key), None)
    return {} if found is None else {"knobs": knobs_json(found.knobs, found.floor)}


def render(report: Report) -> str:
    return json.dumps(json_safe(document(report)), indent=2) + "\n"
