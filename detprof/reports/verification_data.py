"""``detprof verify`` studies as the report reads them: whether determinism held, per model, device and backend.

A verification study trained each model twice per mode and compared every tensor
(``analysis.verification``); the report shows its answer on the first screen, beside the cost
of the same model on the same device label and backend where a sweep measured it, and in a
section of its own where the runs parted and how the difference grew. Its records carry the
device, versions and settings a measured run does, so where and how it ran is read as the
other studies' is (``provenance``), and warns alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from detprof.analysis.verification import ModelVerification, verifications
from detprof.determinism import MODES
from detprof.findings import Finding
from detprof.formatting import counted
from detprof.records import REQUIRED_FIELDS
from detprof.reports.provenance import StudyOrigin, provenance
from detprof.reports.tradeoff import StudyKey
from detprof.store import ResultsStore
from detprof.study_kinds import StudyKind


@dataclass(kw_only=True)
class VerifyStudy(StudyOrigin):
    """One ``detprof verify`` results folder: its models' verifications, and where and how they ran."""

    kind: ClassVar[str] = "verify"

    models: list[ModelVerification]
    warnings: list[str]


def _warnings(label: str, models: Iterable[ModelVerification]) -> list[str]:
    """Runs that failed, and modes that could not be compared for another reason (an interrupted study)."""
    warnings = []
    for v in models:
        warnings += [f"{label}: verify {v.model}: {failure}" for failure in v.failures]
        if not v.failures:
            warnings += [
                f"{label}: verify {v.model}: {mode} mode not compared: {c.problem}"
                for mode in MODES
                if (c := v.comparisons[mode]).problem and not (mode == "deterministic" and v.findings)
            ]
    return warnings


def load_verify(store: ResultsStore) -> VerifyStudy | None:
    """A verification study, its models compared (``analysis.verification``); None before any run."""
    manifest = store.manifest()
    records = list(store.records())
    if not records:
        return None
    where = provenance(records, manifest.get("config") or {})
    models = verifications(store)
    return VerifyStudy(
        **where.origin_fields(store.root, manifest),
        models=models,
        warnings=[*where.warnings, *_warnings(where.label, models)],
    )


def verified(studies: Iterable[VerifyStudy]) -> dict[StudyKey, ModelVerification]:
    """Each model's verification by (model, device label, backend), as a sweep's rows are keyed: the first wins."""
    found: dict[StudyKey, ModelVerification] = {}
    for study in studies:
        for v in study.models:
            found.setdefault((v.model, study.label, study.backend), v)
    return found


def finding_lines(v: ModelVerification) -> list[str]:
    """Each op that refused determinism, in the words the sweep's notes use (``Finding.line``): op, layer, advice."""
    return [Finding.from_json(f).line() for f in v.findings]


def verification_caveats(v: ModelVerification | None) -> list[str]:
    """What a swept model's verification adds to its headline row's caveats: what refused determinism and what to
    do, where the deterministic runs part, or that the default is deterministic already (determinism then buys
    no reproducibility on this device)."""
    if v is None:
        return []
    deterministic, default = v.comparisons["deterministic"], v.comparisons["default"]
    out = finding_lines(v)
    if not v.findings and deterministic.identical is False and deterministic.first_difference is not None:
        out.append(
            f"Determinism does not hold here: its runs part at {deterministic.first_difference.line(part=v.part)}."
        )
    if deterministic.identical and default.identical:
        out.append(
            f"The default mode is deterministic already on this device: its runs too were bitwise identical over "
            f"{counted(default.steps, 'step')}."
        )
    return out


VERIFY = StudyKind("verify", REQUIRED_FIELDS["verify"], load_verify)
