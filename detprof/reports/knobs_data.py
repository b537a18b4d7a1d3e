"""``detprof sweep --knobs`` studies as the report reads them: which determinism switch costs what, per model.

A knob study priced each switch added to the default alone and left out of full determinism,
and checked bitwise whether the model stays deterministic without it (``analysis.knobs``).
The report shows each model's advice on the first screen (beside its headline row where a
sweep measured the same model, device label and backend) and a table per model in a section
of its own. Its costs are read against the noise floor of a calibration of the same model,
device label and backend, where the report holds one. Its records carry the device,
versions and settings a sweep's do, so where and how it ran is read as the other studies'
is (``provenance``); its arms set knobs rather than modes, so the settings it shows are
those of its ``total`` comparison: the default and full determinism.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from detprof.analysis.knobs import TOTAL, ModelKnobs, read_knob_study
from detprof.records import REQUIRED_FIELDS
from detprof.reports.provenance import MeasuredStudy, StudyRead, study_loader
from detprof.reports.tradeoff import StudyKey
from detprof.store import ResultsStore
from detprof.study_kinds import StudyKind


@dataclass(kw_only=True)
class KnobStudy(MeasuredStudy):
    """One ``detprof sweep --knobs`` results folder: its models' knob costs, and where and how they ran."""

    kind: ClassVar[str] = "knobs"

    models: list[ModelKnobs]
    warnings: list[str]


@dataclass(frozen=True)
class KnobReading:
    """One model of a knob study as the report shows it: the study it came from, and the noise floor its costs are
    read against (None: no calibration of this model, device label and backend)."""

    study: KnobStudy
    knobs: ModelKnobs
    floor: float | None

    @property
    def key(self) -> StudyKey:
        """(model, device label, backend): how a headline row is keyed."""
        return (self.knobs.model, self.study.label, self.study.backend)

    @property
    def advice(self) -> str:
        return self.knobs.advice(self.floor)


def _mode_settings(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each mode's settings from the ``total`` comparison's runs, whose arms are the default and full determinism
    (another arm's deterministic mode is full determinism less a knob, or one knob alone)."""
    settings: dict[str, dict[str, Any]] = {}
    for record in records:
        if record.get("comparison") == TOTAL and record.get("settings"):
            settings.setdefault(str(record.get("mode")), dict(record["settings"]))
    return settings


@study_loader
def load_knobs(store: ResultsStore, study: StudyRead) -> KnobStudy:
    """A knob study, its models read (``analysis.knobs``); None before any run."""
    manifest, records, where = study
    models = read_knob_study(store)
    failures = [f"{where.label}: knobs {m.model}: {failure}" for m in models for failure in m.failures]
    fields = where.study_fields(store.root, manifest) | {"settings": _mode_settings(records) or where.settings}
    return KnobStudy(**fields, models=models, warnings=[*where.warnings, *failures])


def knob_readings(studies: Iterable[KnobStudy], floors: Mapping[StudyKey, float | None]) -> list[KnobReading]:
    """Every model of every knob study, with the noise floor of its (model, device label, backend) where known."""
    return [
        KnobReading(study, m, floors.get((m.model, study.label, study.backend)))
        for study in studies
        for m in study.models
    ]


KNOBS = StudyKind("knobs", REQUIRED_FIELDS["knobs"], load_knobs)
