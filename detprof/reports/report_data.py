"""Everything the report shows, as one tree of plain data assembled from results directories.

The HTML and Markdown renderers only format what is here, and the words of every cell they
both show come from one place (``cells``), so both always say the same thing; every number
can be checked without a browser. A missing piece (a sweep
without a stability study, a CPU run without GPU telemetry, a sweep traced with
``--tracer none``) is not an error: its section is left out and ``Report.absent`` holds
the one line that says why.

``Report.headline`` is the answer the report opens with (``headline.HeadlineRow``: cost,
verdict, what it buys, noise floor, caveats per model and device); the sections after it
are the evidence, and what ran (provenance) comes last. A ``detprof verify`` study
(``verification_data``) adds whether determinism held to the answer (to a model's row, or in
a table of its own for a model no sweep measured) and a section on where runs part; without
one, neither is there, not even as a line saying it is missing: a verification is an addition
to the cost study, not a part of it. A ``detprof sweep --knobs`` study (``knobs_data``) is such an
addition too: each model's advice on which switch to turn off joins the answer (under the
table beside its row, or in a block of its own), and a section prices every switch.

Each study ran one Keras backend (tensorflow, jax or torch), and the same model on the same
device is a different measurement on each: everything keyed by (model, device) is keyed by
(model, device, backend) too, a stability study pairs only with a sweep of its backend, and
a noise floor only with its backend's calibration. Where the report holds several backends
(or one that is not TensorFlow) it names the backend beside every device (``Report.where``);
a TensorFlow-only report names none, TensorFlow being the implied backend.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import pandas as pd

from detprof import backends, study_kinds
from detprof.analysis.conditions import (
    LoadRow,
    disturbed_runs,
    every_run_shared,
    load_rows,
    shared_device_warnings,
)
from detprof.analysis.layers import ModelAttribution, attribute_model
from detprof.analysis.overhead import ModelOverhead, PrecisionReached, model_overheads, noise_floors
from detprof.analysis.run_costs import TimeRow, memory_line, memory_peaks, time_rows
from detprof.analysis.study_results import summarize_model
from detprof.analysis.verification import ModelVerification
from detprof.determinism import MODES
from detprof.errors import InputError
from detprof.formatting import ratio
from detprof.gpu_labels import is_cpu
from detprof.intervals import Metric, Overhead, headline, inconclusive_reason
from detprof.invocation import resumed_in
from detprof.models import kinds
from detprof.records import REQUIRED_FIELDS, backend_of
from detprof.reports import kernels_data
from detprof.reports.attribution import attribution, with_layer
from detprof.reports.gpu_clocks import ClockRow, clock_rows, throttle_warnings
from detprof.reports.gpu_reference import GpuMeasurement, shipped
from detprof.reports.headline import (
    HeadlineRow,
    StabilityReading,
    advice,
    calibration_advice,
    caveats,
    cpu_notes,
    fleet_options,
    longer_training_advice,
    with_stand_in,
)
from detprof.reports.knobs_data import KnobReading, knob_readings
from detprof.reports.provenance import (
    WHOLE_PROCESS,
    MeasuredStudy,
    StudyOrigin,
    StudyRead,
    backend_order,
    framework,
    study_loader,
    whole_process_programs,
)
from detprof.reports.published import MeasuredDevice, ReferenceRow, reference_rows
from detprof.reports.tradeoff import Cost, StudyKey, TradeoffPoint, noise_of, pair, reading
from detprof.reports.verdict import verdict
from detprof.reports.verification_data import VerifyStudy, verification_caveats, verified
from detprof.stability.learning import Learning, learning_of, references_of
from detprof.store import ResultsStore, find_studies
from detprof.study_kinds import Section, StudyKind

T = TypeVar("T")
TOP_N = 20
DIFF_ROWS = 15
STAT_COLUMNS = ["name", "short_name", "category", "pct", "instances", "total_ns", "avg_ns", "med_ns"]


class SectionTitle(str):
    """A section's title, which is what it reads as anywhere, with its short name in the HTML's navigation bar."""

    nav: str

    def __new__(cls, title: str, nav: str) -> SectionTitle:
        made = super().__new__(cls, title)
        made.nav = nav
        return made


SECTIONS: dict[str, SectionTitle] = {
    "answer": SectionTitle("Should you turn determinism on?", "Answer"),
    "overhead": SectionTitle("Overhead by model", "Overhead"),
    "on-gpus": SectionTitle("Measured by detprof on GPUs", "On GPUs"),
    "kernel-size": SectionTitle("Kernel size", "Kernel size"),
    "cost": SectionTitle("Where the cost comes from", "Where the cost comes from"),
    "knobs": SectionTitle("Which switch costs what", "Switches"),
    "verification": SectionTitle("Where nondeterminism enters and how it spreads", "Nondeterminism"),
    "stability": SectionTitle("Stability", "Stability"),
    "tradeoff": SectionTitle("Cost versus benefit", "Cost versus benefit"),
    "conditions": SectionTitle("Conditions and warnings", "Conditions"),
    "provenance": SectionTitle("What ran, and how to reproduce it", "What ran"),
}
"""The report's own sections, in page order; a kind that brings its own (``Report.sections``) comes before
"conditions"."""
NOISE_FLOOR_TITLE = "Noise floor: deterministic against itself (A/A)"
NOISE_FLOOR_LEAD = (
    "Two deterministic arms of the same model, paired by repeat (true ratio 1.00, 95% CI): an overhead closer to "
    "1.00 than the smallest resolvable one cannot be told from none on this device."
)


def names_backend(names: Sequence[str]) -> bool:
    """Whether a report names the backend beside every device: it holds several, or one that is not TensorFlow."""
    return list(names) not in ([], [backends.DEFAULT])


def where(label: str, backend: str, *, named: bool) -> str:
    """A device label, with the backend that ran on it where the report names backends: ``t4 (torch)``."""
    return f"{label} ({backend})" if named else label


@dataclass
class ModelCost:
    """One model on one device: its overheads, its kernels in each mode and what changed.

    The fields up to ``precision`` come from the overheads; the rest are filled from the kernel tables."""

    model: str
    given: str | None
    """How the commands name it (``model_given``): what a command suggested for it takes."""
    kernel: Overhead | None
    wall: Overhead | None
    unsupported_reason: str | None
    failure_note: str | None
    """``ModelOverhead.failure_note``: why runs are missing, if any are."""
    warning: str | None = None
    """Why the headline interval is too wide to conclude, where it is (``inconclusive_reason``)."""
    precision: str | None = None
    """Where the sweep asked for a precision its interval did not reach: how far it got, and the repeats to reach it."""
    precision_reached: PrecisionReached | None = None
    """Where the sweep asked for a precision: how precise the interval came out, as fields."""
    top: dict[str, pd.DataFrame] = field(default_factory=dict)
    """mode -> the ``TOP_N`` kernels by time per step (``STAT_COLUMNS``), nsys-style."""
    other_ns: dict[str, float] = field(default_factory=dict)
    """mode -> time per step of the kernels beyond the top N."""
    categories: dict[str, dict[str, float]] = field(default_factory=dict)
    """mode -> kernel category -> time per step (ns)."""
    category_top: dict[str, dict[str, str]] = field(default_factory=dict)
    """mode -> kernel category -> its kernel with the most time."""
    diff: pd.DataFrame | None = None
    """The ``DIFF_ROWS`` largest changes of ``stats.diff`` (default -> deterministic), per step."""
    diff_rest: tuple[int, float] = (0, 0.0)
    """How many further kernels changed, and their summed change (ns per step)."""
    attribution: str | None = None
    """Where the added kernel time goes, in one sentence read off the kernel diff (``reports.attribution``)."""
    parts: ModelAttribution | None = None
    """Its layers and ops by added time per step (``analysis.layers``); None where the traces name none."""
    no_kernels: str | None = None
    """Why there are no kernel tables for this model, when there are none."""
    peak_memory: str | None = None
    """The framework allocator's peak on the device, deterministic against default, or why it is not known
    (``analysis.run_costs.memory_line``); None where no run recorded it."""
    disturbed: list[str] = field(default_factory=list)
    """Its runs that something else interrupted or shared the machine with, and the answer without them
    (``analysis.conditions.disturbed_runs``): read beside the answer."""
    under_load: bool = False
    """Whether every run shared the machine (``analysis.conditions.every_run_shared``): its verdict says so."""
    stability_dataset: str | None = None
    """The ``--dataset`` a stability study of it needs (``stability_dataset``); None: the default fits it."""
    stability_refused: str | None = None
    """Why no stability study of it can run as the advice would suggest it (``stability_refusal``): it says so."""
    trained_in: str | None = None
    """The dtype policy its runs trained in where not float32 alone (``--amp``, a transformer's ``mixed_bfloat16`` on
    a GPU): what ran says it, since a ratio in one precision is no answer for another."""

    @property
    def headline_metric(self) -> Metric:
        return headline(self.kernel, self.wall)[0]

    @property
    def headline(self) -> Overhead | None:
        """Kernel time where it was traced, else wall time: what the reference and tradeoff use."""
        return headline(self.kernel, self.wall)[1]


@dataclass(kw_only=True)
class SweepStudy(MeasuredStudy):
    kind: ClassVar[str] = "sweep"
    config: dict[str, Any]
    models: list[ModelCost]
    clocks: list[ClockRow]
    warnings: list[str]
    loads: list[LoadRow] = field(default_factory=list)
    time: list[TimeRow] = field(default_factory=list)
    """Where the runs' time went, per model and in all (``analysis.run_costs``); empty where no run accounted it."""
    """What else used the machine during each mode's runs (``analysis.conditions``)."""


@dataclass(kw_only=True)
class StabilityStudy(StudyOrigin):
    kind: ClassVar[str] = "stability"
    model: str
    dataset: str
    config: dict[str, Any]
    classes: int | None
    runs_ok: int
    runs_failed: int
    variants: list[dict[str, Any]]
    references: tuple[float, float] | None = None
    """A generated language's entropy rate and token-frequency entropy, which its loss is judged by."""

    @property
    def name(self) -> str:
        """One device may hold stability studies of several models: the model names it too."""
        return f"{self.kind} {self.model} {self.label}"

    @property
    def learning(self) -> Learning:
        """Whether its models learned (``stability.learning.learning_of``): one that did not is left out of verdicts."""
        return learning_of(self.variants, self.classes, self.references)

    @property
    def learned(self) -> bool:
        """False only when it clearly did not learn; a study that cannot be told counts."""
        return self.learning.learned is not False

    @property
    def longer_training(self) -> str | None:
        """For a study that did not learn, the same study trained longer (``headline.longer_training_advice``)."""
        return None if self.learned else longer_training_advice(self.config, self.backend, self.command)


@dataclass(kw_only=True)
class CalibrationStudy(MeasuredStudy):
    """A/A runs (both arms deterministic) on one device label: the smallest overhead it resolves per model."""

    kind: ClassVar[str] = "calibration"

    models: dict[str, ModelOverhead]
    """Per model, the A/A ratio of each metric (both arms deterministic: the true ratio is 1)."""
    floors: dict[str, float | None]


@dataclass(frozen=True)
class NoiseFloorRow:
    """One model's A/A result on one device: how far from 1.0 a ratio must be to be told from none there."""

    device: str
    """How the report names the device (``Report.where``)."""
    model: str
    kernel: Overhead | None
    wall: Overhead | None
    floor: float | None


@dataclass(frozen=True)
class KernelSizePoint:
    device: str
    """How the report names the device (``Report.where``): its label, and its backend where backends are named."""
    kernel_size: int
    overhead: Overhead
    metric: str
    source: str
    """"sweep" (the whole training step) or "kernels_bench" (its convolutions alone, op by op)."""


class _Found(Generic[T]):
    """A report's studies of one kind, as ``Report.found`` holds them (every registered kind is there)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __get__(self, report: Report, owner: type | None = None) -> list[T]:
        studies: list[T] = report.found[self.kind]
        return studies


@dataclass
class Report:
    generated_at: str
    sources: list[Path]
    found: dict[str, list[Any]]
    """Kind -> its studies among the inputs, every registered kind in the registry's order (``study_kinds``)."""
    sections: list[Section]
    """The sections of kinds that bring their own (``StudyKind.section``), in the registry's order."""
    knobs: list[KnobReading]
    """Every model of the knob studies, each with the noise floor its costs are read against."""
    headline: list[HeadlineRow]
    cpu_notes: list[str]
    """Shown next to the headline when a device is a CPU: why its cost is not a GPU's, why its churn is 0."""
    notes: list[str]
    """Other report-level lines shown with the headline: studies left out, no calibration."""
    kernel_size: list[KernelSizePoint]
    references: list[ReferenceRow]
    tradeoff: list[TradeoffPoint]
    warnings: list[str]
    absent: dict[str, str]
    """section id -> the one line saying why that section (or part of it) is left out."""
    measured_on_gpus: list[GpuMeasurement] = field(default_factory=list)
    """What detprof measured on GPUs, as this installation shipped it (``gpu_reference``): in every report."""

    @property
    def studies(self) -> list[StudyOrigin]:
        """Every study read, kind by kind in the registry's order: what the devices, backends, versions, settings,
        commands and the provenance table list."""
        return [study for studies in self.found.values() for study in studies]

    sweeps = _Found[SweepStudy]("sweep")
    calibrations = _Found[CalibrationStudy]("calibration")
    kernels = _Found[kernels_data.KernelsStudy]("kernels")
    stability = _Found[StabilityStudy]("stability")
    verifications = _Found[VerifyStudy]("verify")
    """``detprof verify`` studies: shown only where the inputs hold one, so other reports read as they did."""

    @property
    def devices(self) -> dict[str, dict[str, Any]]:
        """Device label -> what its first study recorded about it."""
        found: dict[str, dict[str, Any]] = {}
        for study in self.studies:
            found.setdefault(study.label, study.device)
        return found

    @property
    def backends(self) -> list[str]:
        """Every Keras backend a study here ran, in detprof's order (tensorflow, jax, torch)."""
        return backend_order(study.backend for study in self.studies)

    @property
    def names_backend(self) -> bool:
        return names_backend(self.backends)

    def parts_of(self, sweep: SweepStudy, model: ModelCost) -> ModelAttribution | None:
        """A swept model's layers and ops as its headline row reads them (against its noise floor)."""
        key = (model.model, sweep.label, sweep.backend)
        row = next((r for r in self.headline if (r.model, r.device, r.backend) == key), None)
        return row.parts if row is not None else model.parts

    def where(self, label: str, backend: str) -> str:
        """How every section names a device: ``t4``, or ``t4 (torch)`` where the report names backends."""
        return where(label, backend, named=self.names_backend)

    @property
    def noise_floors(self) -> list[NoiseFloorRow]:
        """Every calibration's A/A results, model by model: the same rows in every format."""
        return [
            NoiseFloorRow(self.where(c.label, c.backend), model, o.kernel, o.wall, c.floors.get(model))
            for c in self.calibrations
            for model, o in c.models.items()
        ]

    @property
    def versions(self) -> dict[str, dict[str, list[str]]]:
        """Backend -> package -> every version its studies ran with (more than one is worth a look)."""
        found: dict[str, dict[str, list[str]]] = {}
        for study in self.studies:
            packages = found.setdefault(study.backend, {})
            for key, values in study.versions.items():
                known = packages.setdefault(key, [])
                known += [v for v in values if v not in known]
        return {b: found[b] for b in backend_order(found)}

    def framework(self, backend: str) -> str:
        """The backend's framework and the version(s) its studies ran: "PyTorch 2.5.1"."""
        return framework(backend, self.versions.get(backend, {}))

    def backend_line(self) -> str:
        """Which backend(s) ran, with their framework's and Keras' versions: what ran always says it. Keras' where
        its models ran through Keras; where none did (native modules, programs), the backends are only frameworks."""
        parts = []
        for backend in self.backends:
            keras = self.versions.get(backend, {}).get("keras")
            parts.append(f"{backend} ({self.framework(backend)}" + (f", Keras {'/'.join(keras)})" if keras else ")"))
        if not parts:
            return ""
        through_keras = any(self.versions.get(backend, {}).get("keras") for backend in self.backends)
        named = ("Keras backend" if through_keras else "Backend") + ("s" if len(parts) > 1 else "")
        return f"{named}: {'; '.join(parts)}."

    def precision_line(self) -> str:
        """The precisions models trained in other than float32 alone, with the models of each: what ran says it."""
        trained: dict[str, list[str]] = {}
        for sweep in self.sweeps:
            for m in sweep.models:
                if m.trained_in is not None:
                    trained.setdefault(m.trained_in, []).append(m.model)
        return " ".join(f"Trained in {p}: {', '.join(dict.fromkeys(models))}." for p, models in trained.items())

    @property
    def settings(self) -> list[tuple[str, str, str, dict[str, Any]]]:
        """(study, backend, mode, effective determinism settings) for every study and mode."""
        return [
            (study.name, study.backend, mode, study.settings[mode])
            for study in self.studies
            for mode in MODES
            if mode in study.settings
        ]

    @property
    def commands(self) -> list[str]:
        """Every study's command line, then the one that rebuilds this report."""
        lines = [study.command for study in self.studies if study.command]
        lines.append("detprof report " + " ".join(str(p) for p in self.sources))
        return list(dict.fromkeys(lines))

    @property
    def verified_headline(self) -> bool:
        """Whether a headline row has a verification: only then does the headline show whether determinism held."""
        return any(r.verification is not None for r in self.headline)

    @property
    def verified_alone(self) -> list[tuple[VerifyStudy, ModelVerification]]:
        """Verified models that no headline row shows (not swept on that label and backend): a table of their own."""
        shown = {(r.model, r.device, r.backend) for r in self.headline}
        return [(s, v) for s in self.verifications for v in s.models if (v.model, s.label, s.backend) not in shown]

    @property
    def knobs_beside_headline(self) -> list[KnobReading]:
        """Knob readings of a model, device label and backend the headline has a row of: a line under its table."""
        shown = {(r.model, r.device, r.backend) for r in self.headline}
        return [k for k in self.knobs if k.key in shown]

    @property
    def knobs_alone(self) -> list[KnobReading]:
        """Knob readings no headline row shows (not swept on that label and backend): a first-screen block."""
        shown = {(r.model, r.device, r.backend) for r in self.headline}
        return [k for k in self.knobs if k.key not in shown]


def _no_kernels_reason(overhead: ModelOverhead, records: Sequence[Mapping[str, Any]]) -> str:
    if overhead.unsupported_reason:
        return str(overhead.failure_note())
    if whole_process_programs(records):
        return WHOLE_PROCESS
    tracers = {r.get("tracer") for r in records}
    if tracers == {"none"}:
        return "traced with --tracer none: overheads from wall time only, no kernel tables"
    if not any(r.get("status") == "ok" for r in records):
        return "no run of this model succeeded"
    return "no kernel tables in one of the modes (its runs failed or were not traced)"


def model_given(record: Mapping[str, Any]) -> str | None:
    """How ``--models`` names a run's model: its registry name, or your model's spec as given (FILE.py:FUNCTION,
    ...); None for a program (``sweep --command``), which only the sweep's ``--command`` takes."""
    if "program" in record:
        return None
    spec = record.get("model_spec")
    return str(spec["given"]) if isinstance(spec, Mapping) and spec.get("given") else str(record["model"])


def stability_dataset(record: Mapping[str, Any]) -> str | None:
    """The built-in dataset a stability study of your own model needs where the default's images (digits, one
    channel) would not fit it: the first whose images have the channels the sweep fed it (a PyTorch module's first
    axis), synthetic's for three. None where the default fits (one channel, token ids), where none does, and for a
    registry model, which the study builds for its dataset."""
    from detprof.stability.datasets import DEFAULT_IMAGES

    fits = _image_datasets(record)
    return fits[0] if fits and fits[0] != DEFAULT_IMAGES else None


def _image_datasets(record: Mapping[str, Any]) -> list[str] | None:
    """The built-in datasets whose images have the channels your own model was swept on; None for a registry model
    and for one that takes no images."""
    from detprof.stability.datasets import IMAGE_SHAPES

    shape = list(record.get("input_shape") or [])
    if not isinstance(record.get("model_spec"), Mapping) or len(shape) != 3:
        return None
    channels = kinds.image_channels(shape, record.get("model_api"))
    return [name for name, images in IMAGE_SHAPES.items() if images[-1] == channels]


def trained_in(records: Sequence[Mapping[str, Any]]) -> str | None:
    """The dtype policies a model's runs trained in, where any is not plain float32 (``ModelCost.trained_in``)."""
    policies = list(dict.fromkeys(str(r["dtype_policy"]) for r in records if r.get("dtype_policy")))
    return None if policies in ([], ["float32"]) else " and ".join(policies)


def stability_refusal(record: Mapping[str, Any]) -> str | None:
    """Why no stability study can train your own model, from what its sweep recorded (its input and its labels per
    example), where none can: a study trains a classifier of images (one label each, on a dataset of its channels)
    or a language model (a next token at every position). None where one can, where the record cannot tell (one from
    before ``labels_shape``), and for a registry model, which the study builds for its dataset."""
    shape, labels = list(record.get("input_shape") or []), record.get("labels_shape")
    if not isinstance(record.get("model_spec"), Mapping):
        return None
    if len(shape) == 3 and labels:
        return (
            "none can train it: it scores each pixel (a segmentation model's), and a study of images trains a "
            "classifier, one label per image"
        )
    if _image_datasets(record) == []:
        channels = kinds.image_channels(shape, record.get("model_api"))
        return f"no built-in dataset has {channels}-channel images: a study of it needs --dataset npz:PATH of yours"
    if len(shape) == 1 and not str(record.get("input_dtype", "int")).startswith(("int", "uint")):
        return (
            f"none can train it: it takes {shape[0]} numbers per example (a feature vector), and a study trains a "
            "classifier of images or a language model of token ids"
        )
    if len(shape) == 1 and labels == []:
        return (
            "none can train it: it scores each sequence once (a text classifier's), and a study of tokens trains a "
            "language model"
        )
    if len(shape) == 1 and labels is not None and list(labels) != shape:
        return (
            f"none can train it: it scores {labels[0]} of the {shape[0]} positions it is given (a strided tagger's), "
            "and a study of tokens labels every position with the next token"
        )
    return None


def model_cost(store: ResultsStore, overhead: ModelOverhead, records: Sequence[Mapping[str, Any]]) -> ModelCost:
    """The model's overheads, each mode's kernels, and the diff default -> deterministic with its sentence."""
    cost = ModelCost(
        overhead.model,
        model_given(records[0]),
        overhead.kernel,
        overhead.wall,
        overhead.unsupported_reason,
        overhead.failure_note(),
        warning=inconclusive_reason(headline(overhead.kernel, overhead.wall)[1]),
        precision=overhead.precision_line() if overhead.precision_short() is not None else None,
        precision_reached=overhead.precision_reached(),
        disturbed=disturbed_runs(records),
        under_load=every_run_shared(records),
        stability_dataset=stability_dataset(records[0]),
        stability_refused=stability_refusal(records[0]),
        trained_in=trained_in(records),
    )
    summary = summarize_model(store, overhead, records)
    for mode, kernels in summary.modes.items():
        stats = kernels.stats
        cost.top[mode] = stats[STAT_COLUMNS].head(TOP_N).reset_index(drop=True)
        cost.other_ns[mode] = float(stats["total_ns"].iloc[TOP_N:].sum())
        by_category = stats.groupby("category", sort=False)
        cost.categories[mode] = {str(k): float(v) for k, v in by_category["total_ns"].sum().items()}
        cost.category_top[mode] = {str(k): str(v) for k, v in by_category["name"].first().items()}
    full = summary.kernel_diff
    if full is None:
        cost.no_kernels = _no_kernels_reason(overhead, records)
        return cost
    changed = full[full["delta_ns"] != 0]
    cost.diff = changed.head(DIFF_ROWS).reset_index(drop=True)
    rest = changed.iloc[DIFF_ROWS:]
    cost.diff_rest = (len(rest), float(rest["delta_ns"].sum()))
    cost.parts = attribute_model(store, records)
    cost.attribution = attribution(full, cost.headline)
    return cost


def _measured_again(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The runs in the answer measured again after an attempt that failed (``earlier_failures``): the first named,
    with why it failed and where its log is kept."""
    again = [r for r in records if r.get("status") == "ok" and r.get("earlier_failures")]
    if not again:
        return []
    first = again[0]
    return [
        f"{len(again)} run{'s' * (len(again) > 1)} measured again after an attempt that failed; "
        f"{first['run_id']}'s: {first['earlier_failures'][-1]}"
    ]


@study_loader
def load_sweep(store: ResultsStore, study: StudyRead) -> SweepStudy:
    manifest, records, where = study
    config = manifest.get("config") or {}
    label = where.label
    by_model: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_model.setdefault(rec["model"], []).append(rec)
    overheads = model_overheads(records)
    asked = [m for m in config.get("models") or [] if m in overheads]
    order = asked + [m for m in overheads if m not in asked]
    models = [model_cost(store, overheads[m], by_model[m]) for m in order]
    peaks = memory_peaks(records)
    for m in models:
        m.peak_memory = memory_line(peaks.get(m.model, {}))
    clocks = clock_rows(records)
    warnings = [*where.warnings, *throttle_warnings(label, clocks)]
    warnings += [f"{label}: {w}" for w in shared_device_warnings(records)]
    warnings += [f"{label}: {w}" for w in _measured_again(records)]
    warnings += [f"{label}: {m.model}: {m.warning}" for m in models if m.warning]
    warnings += [f"{label}: {m.model}: {m.failure_note}" for m in models if m.failure_note and not m.unsupported_reason]
    return SweepStudy(
        **where.study_fields(store.root, manifest),
        config=config,
        models=models,
        clocks=clocks,
        warnings=warnings,
        loads=load_rows(records),
        time=time_rows(records),
    )


def load_stability(store: ResultsStore) -> StabilityStudy | str:
    """The study, or why it cannot be shown (no summary yet: the study is still running or was stopped)."""
    manifest = store.manifest()
    path = store.dir / "summary.json"
    if not path.is_file():
        again = resumed_in(str(manifest.get("command") or "detprof stability"), str(store.root))
        return f"{store.dir} has no summary.json yet (interrupted? `{again}` finishes it)"
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: unreadable stability summary ({exc})") from exc
    if not isinstance(summary, dict) or not isinstance(summary.get("variants"), list):
        raise InputError(f"{path}: not a detprof stability summary (no 'variants' list)")
    return StabilityStudy(
        path=store.root,
        label=str(summary.get("device")),
        device=dict(summary.get("device_info") or {}),
        backend=_stability_backend(store, summary),
        command=str(manifest.get("command") or ""),
        settings=dict(summary.get("determinism") or {}),
        versions={k: [str(v)] for k, v in (summary.get("software") or {}).items()},
        started=None,
        finished=None,
        model=str(summary.get("model")),
        dataset=str(summary.get("dataset")),
        config=dict(summary.get("config") or {}),
        classes=summary.get("classes"),
        runs_ok=int(summary.get("runs_ok") or 0),
        runs_failed=int(summary.get("runs_failed") or 0),
        variants=list(summary["variants"]),
        references=references_of(summary),
    )


def _stability_backend(store: ResultsStore, summary: Mapping[str, Any]) -> str:
    """What its runs trained on (``records.backend_of``), else what its summary says; older studies: TensorFlow."""
    first = next(store.records(), None)
    if first is not None:
        return backend_of(first)
    return backends.named(summary.get("backend") or (summary.get("config") or {}).get("backend"))


@study_loader
def load_calibration(store: ResultsStore, study: StudyRead) -> CalibrationStudy:
    """A calibration study: the noise floor per model (``overhead.noise_floors``); None before any run."""
    manifest, records, where = study
    return CalibrationStudy(
        **where.study_fields(store.root, manifest), models=model_overheads(records), floors=noise_floors(records)
    )


def kernel_size_points(
    sweeps: Iterable[SweepStudy], benches: Iterable[kernels_data.KernelsStudy] = (), named: bool = False
) -> list[KernelSizePoint]:
    """The medium CNN's overhead per kernel size (the paper's Figure 8b), per device, backend and source."""
    points = []
    for sweep in sweeps:
        shown = where(sweep.label, sweep.backend, named=named)
        for m in sweep.models:
            match = kernels_data.MEDIUM_CNN.match(m.model)
            if match and m.headline is not None:
                points.append(KernelSizePoint(shown, int(match.group(1)), m.headline, m.headline_metric, "sweep"))
    for bench in benches:
        shown = where(bench.label, bench.backend, named=named)
        for total in bench.totals:
            if total.kernel_size is not None and total.overhead is not None:
                points.append(KernelSizePoint(shown, total.kernel_size, total.overhead, bench.metric, "kernels_bench"))
    return sorted(points, key=lambda p: (p.device, p.source, p.kernel_size))


def _costs(sweeps: Sequence[SweepStudy]) -> dict[StudyKey, Cost]:
    costs: dict[StudyKey, Cost] = {}
    for sweep in sweeps:
        for m in sweep.models:
            if m.headline is not None:
                costs.setdefault((m.model, sweep.label, sweep.backend), Cost(m.headline, m.headline_metric))
    return costs


def tradeoff_points(sweeps: Sequence[SweepStudy], studies: Sequence[StabilityStudy]) -> list[TradeoffPoint]:
    """Cost against benefit for every model with a stability study on its label and backend whose models learned."""
    learned = [((s.model, s.label, s.backend), noise_of(s.variants, s.dataset)) for s in studies if s.learned]
    return pair(_costs(sweeps), learned)


def calibration_floors(calibrations: Iterable[CalibrationStudy]) -> dict[StudyKey, float | None]:
    """Each calibrated model's noise floor by (model, device label, backend): the first calibration wins."""
    floors: dict[StudyKey, float | None] = {}
    for c in calibrations:
        for model, floor in c.floors.items():
            floors.setdefault((model, c.label, c.backend), floor)
    return floors


@dataclass(frozen=True)
class _Evidence:
    """What the report knows beside the sweeps, each keyed by (model, device label, backend)."""

    studies: dict[StudyKey, StabilityStudy]
    floors: dict[StudyKey, float | None]
    calibrated: set[tuple[str, str]]
    """(device label, backend) of every calibration: a floor of another backend says nothing of this one."""
    verified: dict[StudyKey, ModelVerification]

    @classmethod
    def of(
        cls,
        studies: Sequence[StabilityStudy],
        calibrations: Sequence[CalibrationStudy],
        verifications: Sequence[VerifyStudy],
    ) -> _Evidence:
        by_key = {(s.model, s.label, s.backend): s for s in studies}
        calibrated = {(c.label, c.backend) for c in calibrations}
        return cls(by_key, calibration_floors(calibrations), calibrated, verified(verifications))


def _headline_row(sweep: SweepStudy, m: ModelCost, evidence: _Evidence) -> HeadlineRow:
    key = (m.model, sweep.label, sweep.backend)
    on_cpu = is_cpu(sweep.label, sweep.device)
    v = verdict(m.headline)
    study = evidence.studies.get(key)
    stability = None
    if study is not None:
        stability = StabilityReading(study.dataset, study.learning, noise_of(study.variants, study.dataset))
    q = None
    if stability is not None and stability.used and m.headline is not None:
        q = reading(Cost(m.headline, m.headline_metric), stability.noise)[0]
    floor = evidence.floors.get(key)
    parts = None if m.parts is None else m.parts.against(floor)
    verification = evidence.verified.get(key)
    notes = [m.failure_note, *m.disturbed, *verification_caveats(verification)]
    if m.precision:
        notes.append(f"Precision: {m.precision}.")
    if m.warning and not v.why:
        notes.append(f"Wide interval: {m.warning}.")
    return HeadlineRow(
        device=sweep.label,
        device_name=str(sweep.device.get("name") or ""),
        on_cpu=on_cpu,
        model=m.model,
        backend=sweep.backend,
        framework_version="/".join(sweep.versions.get(sweep.backend, [])) or None,
        kernel=m.kernel,
        wall=m.wall,
        metric=m.headline_metric,
        verdict=v,
        noise_floor=floor,
        calibrated=(sweep.label, sweep.backend) in evidence.calibrated,
        stability=stability,
        quadrant=q,
        advice=advice(
            v,
            q,
            stability,
            m.given,
            sweep.backend,
            held=verification.held if verification else None,
            dataset=m.stability_dataset,
            unstudied=m.stability_refused,
            fleet=fleet_options(sweep.command),
        ),
        attribution=with_layer(parts, m.attribution),
        parts=parts,
        caveats=caveats(
            v,
            m.headline,
            on_cpu=on_cpu,
            noise_floor=floor,
            stability=stability,
            notes=list(dict.fromkeys(notes)),
            backend=sweep.backend,
        ),
        verification=verification,
        precision=m.precision_reached,
        under_load=m.under_load,
    )


def side_by_side(rows: Sequence[HeadlineRow]) -> list[HeadlineRow]:
    """Each model's rows together, and within them each device's backends next to each other (tensorflow, jax,
    torch): what a reader comparing backends looks for first. Models and devices keep the order they came in."""
    models = list(dict.fromkeys(r.model for r in rows))
    devices = list(dict.fromkeys(r.device for r in rows))
    order = backend_order(r.backend for r in rows)
    return sorted(rows, key=lambda r: (models.index(r.model), devices.index(r.device), order.index(r.backend)))


def headline_rows(
    sweeps: Sequence[SweepStudy],
    studies: Sequence[StabilityStudy],
    calibrations: Sequence[CalibrationStudy],
    verifications: Sequence[VerifyStudy],
) -> list[HeadlineRow]:
    """One row per (device label, model, backend) of every sweep, in the order the sweeps asked for them;
    with several backends, grouped by model (``side_by_side``)."""
    evidence = _Evidence.of(studies, calibrations, verifications)
    rows: list[HeadlineRow] = []
    seen: set[StudyKey] = set()
    for sweep in sweeps:
        for m in sweep.models:
            key = (m.model, sweep.label, sweep.backend)
            if key not in seen:
                seen.add(key)
                rows.append(_headline_row(sweep, m, evidence))
    return side_by_side(rows) if len({s.backend for s in sweeps}) > 1 else rows


def report_notes(report: Report) -> list[str]:
    """The lines under the headline table besides the CPU notes: studies left out, calibration."""
    notes = []
    for s in report.stability:
        learning = s.learning
        if learning.learned is False:
            notes.append(
                f"Left out of the verdicts and the cost-versus-benefit plot: the stability study of {s.model} "
                f"on {s.dataset} ({report.where(s.label, s.backend)}) did not learn: {learning.line()}."
            )
    order = report.backends
    swept = sorted({(r.device, r.backend) for r in report.headline}, key=lambda d: (d[0], order.index(d[1])))
    calibrated = {(c.label, c.backend) for c in report.calibrations}
    for device in (d for d in swept if d not in calibrated):
        sweeps = [s for s in report.sweeps if (s.label, s.backend) == device]
        how = "; ".join(
            dict.fromkeys(
                calibration_advice([m.given for m in s.models], s.backend, s.config, fleet=fleet_options(s.command))
                for s in sweeps
            )
        )
        line = (
            f"No noise floor for {report.where(*device)}: no calibration ran; {how}, "
            "the smallest overhead this machine can tell from none"
        )
        notes.append(with_stand_in(line, [m.given for s in sweeps for m in s.models]) + ".")
    return notes


def _knobs_instead(report: Report) -> str:
    """The answer a knob study alone gives: its full determinism against the default, measured beside its arms; a
    user who ran ``detprof sweep --knobs`` is told what the sweep without ``--knobs`` adds, not to run a sweep."""
    totals = "; ".join(
        f"{k.knobs.model} on {report.where(k.study.label, k.study.backend)} {ratio(k.knobs.total)}"
        for k in report.knobs
        if k.knobs.total is not None
    )
    line = "No sweep results among the inputs; "
    if totals:
        line += f"the knob study's full determinism against the default: {totals} (step time, 95% CI). "
    return line + (
        "`detprof sweep` without `--knobs` measures the overhead itself, with its kernel tables and the leaderboard "
        "of layers or modules."
    )


def _absent(report: Report) -> dict[str, str]:
    absent: dict[str, str] = {}
    if not report.sweeps:
        absent["answer"] = "No sweep results among the inputs: `detprof sweep` measures what determinism costs."
        if report.knobs:
            absent["answer"] = _knobs_instead(report)
        elif report.calibrations:
            absent["answer"] = (
                "No sweep results among the inputs, only a calibration: this machine's noise floor is below, "
                "and `detprof sweep` measures what determinism costs."
            )
        without = " without `--knobs`" if report.knobs else ""
        absent["overhead"] = f"No sweep results among the inputs: `detprof sweep`{without} measures the overhead."
        absent["cost"] = "No sweep results among the inputs, so no kernel tables."
    elif not any(m.top for s in report.sweeps for m in s.models):
        absent["cost"] = "No kernel tables: every sweep ran with --tracer none or no run succeeded."
    if not report.kernel_size:
        absent["kernel-size"] = (
            "No medium CNN was swept: `detprof sweep --models "
            "mediumcnn_k1,mediumcnn_k3,mediumcnn_k5,mediumcnn_k7` measures overhead against kernel size."
        )
    if report.sweeps and not any(r.device for r in report.references):
        gpus = ", ".join(dict.fromkeys(r.figure.gpu.upper() for r in report.references))
        absent["references"] = (
            f"No measured device is a GPU with published figures ({gpus}), so none is held against them."
        )
    if not report.kernels:
        absent["kernels-bench"] = f"No kernels_bench results among the inputs: {kernels_data.HOW_TO_RUN}"
    if not report.stability and report.sweeps:
        absent["stability"] = (
            "No stability study among the inputs: the answer names, beside each overhead, the `detprof stability` "
            "that measures what determinism buys it (on its backend, dataset and fleet)."
        )
    elif not report.stability:
        absent["stability"] = (
            "No stability study among the inputs: `detprof stability` (or `detprof sweep --stability`) measures it."
        )
    if not report.tradeoff:
        at = report.where
        swept = sorted(
            {f"{m.model} on {at(s.label, s.backend)}" for s in report.sweeps for m in s.models if m.headline}
        )
        studied = sorted({f"{s.model} on {at(s.label, s.backend)}" for s in report.stability if s.learned})
        left_out = sorted({f"{s.model} on {at(s.label, s.backend)}" for s in report.stability if not s.learned})
        same = "device label and backend" if report.names_backend else "device label"
        line = (
            f"No model has both an overhead and a stability study whose models learned on the same {same} "
            f"(overheads: {', '.join(swept) or 'none'}; stability: {', '.join(studied) or 'none'}"
        )
        if left_out:
            line += f"; left out, did not learn: {', '.join(left_out)}"
        absent["tradeoff"] = line + ")."
    if not any(s.clocks for s in report.sweeps):
        labels = ", ".join(report.where(s.label, s.backend) for s in report.sweeps) or "no sweep"
        absent["telemetry"] = f"No GPU telemetry: the sweeps ran without a GPU to sample ({labels})."
    return absent


def _studies(path: Path) -> list[ResultsStore]:
    try:
        return find_studies(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable results ({exc})") from exc


def _named(lines: Iterable[str], label: str, shown: str) -> list[str]:
    """A study's warnings, which start with its device label, naming the device as the report does."""
    if shown == label:
        return list(lines)
    return [f"{shown}: {line.removeprefix(f'{label}: ')}" for line in lines]


def _warnings(report: Report, loading: Sequence[str]) -> list[str]:
    """What loading the studies found, then each study's own warnings, every device named as the report names it."""
    warnings = list(loading)
    for study in report.studies:
        warnings += _named(getattr(study, "warnings", ()), study.label, report.where(study.label, study.backend))
    for s in report.stability:
        warnings += [
            f"{report.where(s.label, s.backend)}: stability {s.model}: {f['run_id']} failed: {f['reason']}"
            for v in s.variants
            for f in v.get("failures", [])
        ]
    return warnings


def _read_all(paths: Sequence[Path]) -> tuple[dict[str, list[Any]], list[str]]:
    """Every study under ``paths`` by kind (each folder once), and the lines saying which cannot be shown yet."""
    found: dict[str, list[Any]] = {name: [] for name in study_kinds.names()}
    loading: list[str] = []
    seen: set[Path] = set()
    for path in paths:
        for store in _studies(Path(path)):
            key = store.dir.resolve()
            if key in seen:
                continue
            seen.add(key)
            study = study_kinds.kind(store.kind).load(store)
            if study is None:
                loading.append(f"{store.dir} holds no runs yet")
            elif isinstance(study, str):
                loading.append(study)
            else:
                found[store.kind].append(study)
    return found, loading


def kind_sections(report: Report) -> list[Section]:
    """The sections of the kinds that bring their own, for the studies of theirs the report holds."""
    sections = []
    for declared in study_kinds.kinds():
        studies = report.found[declared.name]
        section = declared.section(studies, report.where) if declared.section is not None and studies else None
        if section is not None:
            sections.append(section)
    return sections


def build_report(paths: Sequence[Path], *, with_shipped: bool = True) -> Report:
    """Read every study under ``paths``; InputError when a path holds no results or unreadable ones. Without
    ``with_shipped`` the report leaves out what this installation measured on GPUs (``gpu_reference``), as the
    reading that makes that file again must."""
    if not paths:
        raise InputError("no results directory given")
    found, loading = _read_all(paths)
    sweeps, stability, calibrations = found["sweep"], found["stability"], found["calibration"]
    report = Report(
        generated_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        sources=[Path(p) for p in paths],
        found=found,
        sections=[],
        knobs=knob_readings(found["knobs"], calibration_floors(calibrations)),
        headline=headline_rows(sweeps, stability, calibrations, found["verify"]),
        cpu_notes=[],
        notes=[],
        kernel_size=[],
        references=[],
        tradeoff=tradeoff_points(sweeps, stability),
        warnings=[],
        absent={},
        measured_on_gpus=shipped() if with_shipped else [],
    )
    report.sections = kind_sections(report)
    report.kernel_size = kernel_size_points(sweeps, report.kernels, named=report.names_backend)
    report.references = reference_rows(
        MeasuredDevice(
            s.label,
            s.device.get("name"),
            {m.model: m.kernel for m in s.models if m.kernel is not None},
            report.where(s.label, s.backend),
        )
        for s in sweeps
        if not s.device.get("forced")  # a label forced on another device (a test cluster's) is not that GPU
    )
    report.warnings = _warnings(report, loading)
    report.absent = _absent(report)
    report.cpu_notes = cpu_notes(report.headline)
    report.notes = report_notes(report)
    return report


SWEEP = StudyKind("sweep", REQUIRED_FIELDS["sweep"], load_sweep, compared_by_check=True)
CALIBRATION = StudyKind("calibration", REQUIRED_FIELDS["calibration"], load_calibration)
STABILITY = StudyKind("stability", REQUIRED_FIELDS["stability"], load_stability)
