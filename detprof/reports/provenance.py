"""What a study's run records say about where and how they ran, and whether that was consistent.

Sweep and kernels_bench records carry the same fields (device, software versions,
effective determinism settings, start and end times). A ratio is only meaningful if both
modes ran on the same device with the same software, with determinism on in exactly the
deterministic runs and XLA pinned to the same value in both: anything else becomes a
warning in the report rather than a silent mix. Each study ran one Keras backend
(``records.backend_of``); the report keys everything it shows by it as well.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, TypeVar

from detprof import backends
from detprof.gpu_labels import is_cpu
from detprof.records import backend_of, environment_values, measures
from detprof.store import ResultsStore

T = TypeVar("T")


def framework_name(backend: str) -> str:
    """The framework as readers know it (``Backend.framework``); its version is ``versions[backend]``
    (``determinism.software_versions``), the rest (jaxlib, CUDA builds) is in the software table."""
    known = backends.REGISTRY.get(backend)
    return known.framework if known else backend


def compiled_step_cache(backend: str) -> str:
    """What keeps a backend's compiled steps across processes, in words (``Backend.compiled_step_cache``)."""
    known = backends.REGISTRY.get(backend)
    return known.compiled_step_cache if known else "compilation cache"


def framework(backend: str, versions: Mapping[str, Sequence[str]]) -> str:
    """The framework a backend ran and its version, as one phrase: "PyTorch 2.5.1" (several: "JAX 0.4.35/0.4.36")."""
    found = versions.get(backend)
    return f"{framework_name(backend)} {'/'.join(found)}" if found else framework_name(backend)


def backend_order(names: Iterable[str]) -> list[str]:
    """Distinct backends in detprof's order (its registry's), so that every table lists them alike."""
    known = list(backends.NAMES)
    return sorted(dict.fromkeys(names), key=lambda b: (known.index(b) if b in known else len(known), b))


def distinct(values: Iterable[Any]) -> list[str]:
    return list(dict.fromkeys(str(v) for v in values if v is not None))


def _env(records: Sequence[Mapping[str, Any]], section: str, key: str) -> list[str]:
    return [str(v) for v in environment_values(records, section, key)]


@dataclass
class Provenance:
    label: str
    device: dict[str, Any]
    backend: str
    """The Keras backend its runs ran (the first, should they differ: a warning says so)."""
    versions: dict[str, list[str]]
    settings: dict[str, dict[str, Any]]
    """mode -> the effective settings of its first run."""
    started: str | None
    finished: str | None
    warnings: list[str]
    timing: str
    """Which runs were traced: where the study's wall and kernel times come from (``timing_note``)."""

    def origin_fields(self, root: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """A ``StudyOrigin``'s fields: where and how any study ran."""
        return {
            "path": root,
            "label": self.label,
            "device": self.device,
            "backend": self.backend,
            "command": str(manifest.get("command") or ""),
            "settings": self.settings,
            "versions": self.versions,
            "started": self.started,
            "finished": self.finished,
        }

    def study_fields(self, root: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """A ``MeasuredStudy``'s fields (its warnings are its own)."""
        return self.origin_fields(root, manifest) | {"timing": self.timing}


@dataclass(kw_only=True)
class StudyOrigin:
    """Where and how a study of the report ran: its folder, device, backend, command, settings and versions, under
    the same names for every kind, so that the report lists its studies' provenance in one pass (``Report.studies``)."""

    kind: ClassVar[str]
    """The study's kind as the provenance table names it (``study_kinds``)."""
    path: Path
    label: str
    device: dict[str, Any]
    backend: str
    command: str
    settings: dict[str, dict[str, Any]]
    versions: dict[str, list[str]]
    started: str | None
    finished: str | None

    @property
    def name(self) -> str:
        """How the settings table names the study: its kind and device label."""
        return f"{self.kind} {self.label}"

    @property
    def traced(self) -> str | None:
        """Which runs were traced, for a study that traces (``MeasuredStudy``)."""
        return None


@dataclass(kw_only=True)
class MeasuredStudy(StudyOrigin):
    """What every measured study of the report (sweep, kernels, calibration) says about where it came from."""

    timing: str
    """Which runs were traced: where the study's wall and kernel times come from (``timing_note``)."""

    @property
    def traced(self) -> str | None:
        return self.timing


WHOLE_PROCESS = (
    "measured as a whole process: the program opens no detprof.measure() window, so its wall time includes "
    "its start-up, imports and everything else it did, and nothing in it was traced"
)


def whole_process_programs(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """The programs (``sweep --command``) whose runs were timed as whole processes rather than in a measured window."""
    return distinct(
        r.get("model")
        for r in records
        if r.get("status") == "ok" and (r.get("program") or {}).get("measured_window") == "process"
    )


def timing_note(records: Sequence[Mapping[str, Any]]) -> str:
    """Where wall and kernel time come from, in the words the report shows, from what each run measured.

    A tracer taxes every launch and call it records, so wall time under it is biased against
    determinism; records from before detprof kept them apart say so plainly.
    """
    ok = [r for r in records if r.get("status") == "ok"] or list(records)
    traced = [r for r in ok if measures(r, "kernel") and r.get("tracer") not in (None, "none")]
    tracers = ", ".join(distinct(r.get("tracer") for r in traced)) or "none"
    if not traced:
        return "Not traced (--tracer none): wall time only, from untraced steps."
    if any("measures" not in r for r in ok):
        return (
            f"Wall time was measured under the tracer ({tracers}), by an older detprof: it taxes every launch, "
            "so wall ratios may be biased against determinism; kernel time is unaffected."
        )
    untraced_runs = [r for r in ok if r.get("measures") == "wall"]
    steps = (
        "A program's steps are those it marked inside its measured window."
        if any("program" in r for r in ok)
        else "One settling step after the capture started is in no measured step."
    )
    if untraced_runs:
        return (
            f"Kernel time from {len(traced)} runs traced by {tracers}; wall time from {len(untraced_runs)} "
            f"untraced runs beside them (a tracer taxes every launch). {steps}"
        )
    return (
        f"Each run timed untraced steps first (wall time), then traced as many with {tracers} (kernel time); "
        "one settling step after the tracer started is in no measured step."
    )


def _as_asked(record: Mapping[str, Any]) -> bool:
    """Whether determinism was in effect as the run asked: op determinism exactly in deterministic mode, or in a
    knob study's arm (``sweep --knobs``, whose mode only says whether it set any) each knob it set, as read back,
    but one that works only with a knob the arm left off (``Knob.needs``: it reads back off) and one that cannot
    matter on the run's device (``Knob.applies``: cuBLAS's workspace on a CPU reads back off)."""
    settings = record["settings"]
    if "knobs" not in record:
        return bool(settings.get("op_determinism")) == (record.get("mode") == "deterministic")
    asked, in_effect = set(record["knobs"]), settings.get("knobs") or {}
    known = backends.REGISTRY.get(backend_of(record))
    device = record.get("device") or {}
    on_gpu = not is_cpu(str(device.get("label", "")), device)
    excused = {knob.name for knob in known.knobs if knob.applies(on_gpu) is not None} if known else set()
    needs = {knob.name: knob.needs for knob in known.knobs} if known else {}
    return all(in_effect.get(name, True) or name in excused or needs.get(name) not in (None, *asked) for name in asked)


def _settings_warnings(label: str, records: Sequence[Mapping[str, Any]]) -> list[str]:
    warnings = []
    wrong = [str(r.get("run_id")) for r in records if r.get("settings") and not _as_asked(r)]
    if wrong:
        warnings.append(f"{label}: determinism was not in effect as the run asked in {', '.join(wrong[:5])}")
    jit = _env(records, "settings", "jit_compile")
    if len(jit) > 1:
        warnings.append(
            f"{label}: jit_compile (XLA) differs between runs ({', '.join(jit)}): ratios mix XLA and non-XLA"
        )
    return warnings


def provenance(records: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> Provenance:
    """From a non-empty list of one study's records; the label falls back to the manifest's."""
    device = next((r["device"] for r in records if r.get("status") == "ok" and r.get("device")), None)
    device = dict(device or records[0].get("device") or {})
    label = str(device.get("label") or config.get("gpu_label") or "unlabelled")
    keys = dict.fromkeys(k for r in records for k in (r.get("versions") or {}))
    versions = {k: _env(records, "versions", k) for k in keys}
    warnings = [f"{label}: runs used different {k}: {', '.join(v)}" for k, v in versions.items() if len(v) > 1]
    names = _env(records, "device", "name")
    if len(names) > 1:
        warnings.append(f"{label}: runs ran on different devices: {', '.join(names)}")
    heaps = distinct(json.dumps(r["worker_env"], sort_keys=True) for r in records if r.get("worker_env"))
    if len(heaps) > 1:
        warnings.append(f"{label}: runs had different malloc settings ({'; '.join(heaps)}): step times may not compare")
    warnings += _settings_warnings(label, records)
    warnings += [f"{label}: {name}: {WHOLE_PROCESS}" for name in whole_process_programs(records)]
    forced = distinct(
        str((r.get("device") or {}).get("name") or "a device without a GPU")
        for r in records
        if (r.get("device") or {}).get("forced")
    )
    if forced:
        warnings.append(
            f"{label}: the label was forced (--force) on {', '.join(forced)}: its times are that device's, not a "
            f"{label.upper()}'s"
        )
    ok = [r for r in records if r.get("status") == "ok"] or list(records)
    ran_on = distinct(backend_of(r) for r in ok)
    if len(ran_on) > 1:
        warnings.append(f"{label}: runs ran on different Keras backends ({', '.join(ran_on)}): ratios mix frameworks")
    settings: dict[str, dict[str, Any]] = {}
    for rec in records:
        if rec.get("settings"):
            settings.setdefault(str(rec.get("mode")), dict(rec["settings"]))
    return Provenance(
        label=label,
        device=device,
        backend=ran_on[0],
        versions=versions,
        settings=settings,
        started=min(distinct(r.get("started_at") for r in records), default=None),
        finished=max(distinct(r.get("finished_at") for r in records), default=None),
        warnings=warnings,
        timing=timing_note(records),
    )


class StudyRead(NamedTuple):
    """A measured study as its loader gets it: manifest, records and their provenance."""

    manifest: dict[str, Any]
    records: list[dict[str, Any]]
    where: Provenance


def study_loader(load: Callable[[ResultsStore, StudyRead], T]) -> Callable[[ResultsStore], T | None]:
    """``load(store, study)`` for a study that holds runs; None for one that holds none yet, which every report
    reader shows as "holds no runs yet" rather than as an empty study."""

    @functools.wraps(load)
    def loader(store: ResultsStore) -> T | None:
        manifest = store.manifest()
        records = list(store.records())
        if not records:
            return None
        return load(store, StudyRead(manifest, records, provenance(records, manifest.get("config") or {})))

    return loader
