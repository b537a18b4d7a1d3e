"""``detprof report --format json``: the report's headline numbers for scripts and notebooks.

The same ``headline.HeadlineRow`` values as the HTML's first screen and the Markdown, one
object per model, device and Keras backend under ``models`` (``headline.row_json``: device,
model, backend, overhead {kernel, wall: {ratio, lo, hi, n}}, verdict, noise_floor,
stability, then the verdict's text, repeats needed, caveats, ...), with the report-level
notes beside them and every backend under ``backends`` with its framework's version. Where a
``detprof verify`` study is among the results, ``verification`` holds each model's
comparison (``ModelVerification.to_json``: held, each mode's first difference, findings).
Undefined numbers are null (``store.json_safe``), never NaN.
"""

from __future__ import annotations

import json
from typing import Any

from detprof.intervals import CHEAP_OVERHEAD
from detprof.reports.headline import interval_json, row_json
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
        "models": [row_json(r) for r in report.headline],
        "notes": [*report.cpu_notes, *report.notes],
        "stability_not_learned": [
            {
                "model": s.model,
                "device": s.device,
                "backend": s.backend,
                "dataset": s.dataset,
                "reason": s.learning.line(),
            }
            for s in report.stability
            if not s.learned
        ],
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
    } | verification(report)


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


def render(report: Report) -> str:
    return json.dumps(json_safe(document(report)), indent=2) + "\n"
