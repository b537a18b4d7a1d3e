"""The baseline file ``detprof check`` compares against, and the environment fingerprint in it.

A baseline is plain JSON with a ``schema_version``; it is parsed with ``json`` and
validated field by field, so nothing executable is ever loaded from it, and every defect
is one line naming the file and the field. A newer schema is refused rather than half
understood.

The fingerprint records what makes two overhead measurements comparable: the GPU, its
driver, the Keras backend and its framework's versions (TensorFlow; JAX and jaxlib;
PyTorch: null for the frameworks that did not run), the CUDA and cuDNN the framework was
built against, Keras and detprof, the determinism settings in effect in each mode, and a
hash of the measurement configuration. The hash leaves out the repeat count (it changes
only the precision, which the interval accounts for), the model list (models are matched
one by one, and a missing one is reported) and the preset name (its values are in the
configuration already).

Each model's source is fingerprinted too: ``registry`` for detprof's own models (their code
is versioned with detprof), and the sha256 of the file of a model of your own
(``models.own``), so that a check after the model itself changed says so instead of calling
the new model's overhead a regression of the old one's. Models are compared where both
sides have them; one missing on a side is reported as missing, not as a changed source.

The backend is not one more field to wave through: the same model on another framework is
another measurement, so ``check`` refuses a baseline of another backend in one line, with
or without ``--allow-env-change``, and ``baseline`` refuses results that hold sweeps of
several backends (a baseline is of one backend: build one per backend). A baseline without
the backend's fields reads as TensorFlow's (``ADDED_LATER``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detprof import backends, study_kinds
from detprof.check.regression import ModelSample, SweepSamples, baseline_models, samples_from_records
from detprof.determinism import without_implied
from detprof.errors import InputError
from detprof.models.own import REGISTRY_SOURCE, OwnModel
from detprof.records import backend_of, environment_values, finite_number
from detprof.reports.provenance import backend_order, framework
from detprof.store import ResultsStore, config_hash, find_studies, write_output

SCHEMA_VERSION = 1
KIND = "detprof-baseline"
UNHASHED_CONFIG_KEYS = frozenset({"repeats", "models", "preset", "own_models"})
"""``own_models`` holds your own models' specs, file paths included: their hashes are the fingerprint's
``model_source``, and the paths may differ between the checkout that built the baseline and the one checked."""
FRAMEWORK_VERSIONS: tuple[str, ...] = tuple(key for b in backends.all_backends() for key in b.version_keys)
"""Every backend's framework packages (``Backend.version_keys``): tensorflow, jax, jaxlib, torch."""
FINGERPRINT_FIELDS: tuple[str, ...] = (
    "gpu_name",
    "gpu_label",
    "driver",
    "cuda_driver",
    "backend",
    "cuda",
    "cudnn",
    *FRAMEWORK_VERSIONS,
    "keras",
    "detprof",
    "determinism",
    "config_hash",
    "model_source",
)
NESTED_FIELDS = ("determinism", "model_source")
"""Fingerprint fields that map names to values, compared (and named in a difference) key by key."""
ADDED_LATER: dict[str, Any] = {
    "backend": backends.DEFAULT,
    **{key: None for key in FRAMEWORK_VERSIONS if key not in backends.get(backends.DEFAULT).version_keys},
    "model_source": {},
}
"""Fingerprint fields a baseline may lack, and what they are then: TensorFlow's (the implied backend's),
with no other framework's version; an empty ``model_source`` compares no model."""
_SOURCES: dict[str, tuple[str, str]] = {
    "gpu_name": ("device", "name"),
    "gpu_label": ("device", "label"),
    "driver": ("device", "driver"),
    "cuda_driver": ("device", "cuda_driver"),
    "cuda": ("versions", "cuda_build"),
    "cudnn": ("versions", "cudnn_build"),
    **{key: ("versions", key) for key in FRAMEWORK_VERSIONS},
    "keras": ("versions", "keras"),
    "detprof": ("versions", "detprof"),
}


@dataclass(frozen=True)
class SweepResults:
    """A sweep's manifest and records, as the check reads them."""

    path: Path
    manifest: dict[str, Any]
    records: list[dict[str, Any]]
    kind: str = "sweep"
    """The study's kind (``study_kinds``): a sweep, or another kind that ``check`` compares."""

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.manifest.get("config") or {})

    def samples(self) -> SweepSamples:
        return samples_from_records(self.records)


def _compared(path: Path) -> list[ResultsStore]:
    """The studies under ``path`` of the first kind, in the registry's order, that ``check`` compares
    (``StudyKind.compared_by_check``: a sweep, unless the folder holds none)."""
    found = find_studies(Path(path))
    for name in study_kinds.names():
        stores = [s for s in found if s.kind == name]
        if stores and study_kinds.kind(name).compared_by_check:
            return stores
    if found:
        kinds = ", ".join(sorted({store.kind for store in found}))
        raise InputError(
            f"{path}: holds {kinds} results, not a sweep's: a baseline and a check compare sweeps "
            "(detprof sweep --out DIR)"
        )
    raise InputError(f"{path}: holds no sweep results (run detprof sweep --out {path})")


def read_sweep(path: Path) -> SweepResults:
    """The sweep in a results directory (or its ``sweep/`` folder), or the study of another kind that ``check``
    compares, refusing one without repeats or of several backends."""
    stores = _compared(path)
    store = stores[0]
    manifest = store.manifest()
    records = list(store.records())
    if not records:
        raise InputError(f"{path}: the sweep has no run records yet")
    _refuse_several_backends(path, stores, records)
    repeats = (manifest.get("config") or {}).get("repeats")
    if isinstance(repeats, int) and repeats < 2:
        raise InputError(
            f"{path}: the sweep ran {repeats} repeat per model and mode; R < 2 cannot give an interval: "
            "rerun it with --repeats 3 or more (3-10 recommended)"
        )
    return SweepResults(Path(path), manifest, records, store.kind)


def _refuse_several_backends(path: Path, stores: Iterable[ResultsStore], records: Iterable[Mapping[str, Any]]) -> None:
    """One line where the sweeps found (or the runs of the one read) ran on more than one Keras backend.

    A baseline is the overhead of one backend, and a check compares it with the same
    backend: which of several sweeps was meant cannot be guessed.
    """
    found = {str(s.root): backends.named((s.manifest().get("config") or {}).get("backend")) for s in stores}
    ran_on = backend_order([*found.values(), *(backend_of(r) for r in records)])
    if len(ran_on) > 1:
        folders = ", ".join(f"{root} ({backend})" for root, backend in found.items())
        raise InputError(
            f"{path}: holds sweeps of several Keras backends ({', '.join(ran_on)}): a baseline and its check are "
            f"of one backend; give one backend's results directory ({folders})"
        )


def measured_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """What of a sweep's configuration decides what it measures: a check compares only sweeps that agree on it."""
    return {k: v for k, v in without_implied(config).items() if k not in UNHASHED_CONFIG_KEYS}


def measurement_config_hash(config: Mapping[str, Any]) -> str:
    return config_hash(measured_config(config))


def fingerprint(config: Mapping[str, Any], records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The environment of the completed runs; a field the runs disagree on lists every value."""
    ok = [r for r in records if r.get("status") == "ok"]
    result: dict[str, Any] = {}
    for name, (section, key) in _SOURCES.items():
        result[name] = _uniform(environment_values(ok, section, key))
    result["backend"] = _uniform(backend_of(r) for r in ok)
    result["determinism"] = {
        mode: _uniform(_settings(r) for r in ok if r.get("mode") == mode) for mode in ("default", "deterministic")
    }
    result["config_hash"] = measurement_config_hash(config)
    result["model_source"] = model_sources(ok)
    return {name: result[name] for name in FINGERPRINT_FIELDS}


def model_sources(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Per model, where its code came from: ``registry``, or the hash of the file of a model of your own."""
    sources: dict[str, list[str]] = {}
    for record in records:
        spec = record.get("model_spec")
        source = OwnModel.from_record(spec).source if isinstance(spec, Mapping) else REGISTRY_SOURCE
        sources.setdefault(str(record["model"]), []).append(source)
    return {model: _uniform(found) for model, found in sorted(sources.items())}


def _settings(record: Mapping[str, Any]) -> dict[str, Any]:
    """What the framework reported in effect, less the mode (it differs by design) and the backend (its own field)."""
    settings = without_implied(record.get("settings") or {})
    return {k: v for k, v in settings.items() if k not in ("mode", "backend")}


def _uniform(values: Iterable[Any]) -> Any:
    """One value where the runs agree (None where none has one), else every value in a stable order."""
    distinct = {json.dumps(value, sort_keys=True, default=str): value for value in values}
    if len(distinct) <= 1:
        return next(iter(distinct.values()), None)
    return [distinct[key] for key in sorted(distinct)]


@dataclass(frozen=True)
class FieldDifference:
    field: str
    baseline: Any
    current: Any

    def describe(self) -> str:
        return f"{self.field}: {_show(self.baseline)} -> {_show(self.current)}"


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def fingerprint_differences(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> list[FieldDifference]:
    """Every fingerprint field that differs, nested settings named by their dotted path.

    Model sources are compared for the models both sides have (``model_source.NAME``).
    """
    full_b, full_c = ADDED_LATER | dict(baseline), ADDED_LATER | dict(current)
    common = set(full_b["model_source"] or {}) & set(full_c["model_source"] or {})
    for full in (full_b, full_c):
        full["model_source"] = {k: v for k, v in (full["model_source"] or {}).items() if k in common}
    flat_b, flat_c = _flatten(full_b), _flatten(full_c)
    fields = [f for f in FINGERPRINT_FIELDS if f not in NESTED_FIELDS]
    nested = tuple(f"{name}." for name in NESTED_FIELDS)
    order = fields + sorted(k for k in set(flat_b) | set(flat_c) if k.startswith(nested))
    return [
        FieldDifference(key, flat_b.get(key), flat_c.get(key)) for key in order if flat_b.get(key) != flat_c.get(key)
    ]


@dataclass(frozen=True)
class EnvironmentCheck:
    """The fingerprint comparison, and whether the user accepted a change (--allow-env-change)."""

    differences: tuple[FieldDifference, ...]
    allowed: bool

    @property
    def comparable(self) -> bool:
        return not self.differences or self.allowed


def check_environment(
    baseline: Mapping[str, Any],
    current: Mapping[str, Any],
    *,
    allow: bool,
    configs: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None,
) -> EnvironmentCheck:
    """The fingerprints compared; a measurement configuration that differs is named by the options that differ
    (``config.steps: 10 -> 8``) where both ``configs`` (the baseline's, the current's) are known, not by its hash."""
    differences = fingerprint_differences(baseline, current)
    if configs is not None:
        differences = [d for field in differences for d in _config_named(field, *configs)]
    return EnvironmentCheck(tuple(differences), allow)


def _config_named(
    difference: FieldDifference, baseline: Mapping[str, Any], current: Mapping[str, Any]
) -> list[FieldDifference]:
    """A ``config_hash`` difference as the measured options that differ; any other difference as it is."""
    if difference.field != "config_hash":
        return [difference]
    measured = [_flatten(measured_config(config)) for config in (baseline, current)]
    named = [
        FieldDifference(f"config.{key}", measured[0].get(key), measured[1].get(key))
        for key in sorted(set(measured[0]) | set(measured[1]))
        if measured[0].get(key) != measured[1].get(key)
    ]
    return named or [difference]


def refuse_other_backend(baseline: Baseline, results: Path, backend: Any) -> None:
    """One line when ``results`` ran on another Keras backend than the baseline, whatever --allow-env-change says."""
    if backend != baseline.backend:
        raise InputError(
            f"{results} ran on the {backend} backend, the baseline {baseline.path} on {baseline.backend}: overheads "
            "of different Keras backends are never comparable (--allow-env-change does not apply); check a "
            f"{baseline.backend} sweep (detprof check --run runs one), or build a baseline from {results}"
        )


def describe_backend(fp: Mapping[str, Any]) -> str:
    """The fingerprint's backend and its framework's version: "torch (PyTorch 2.5.1)"."""
    backend = backends.named(fp.get("backend"))
    versions = {k: [str(v)] for k, v in fp.items() if isinstance(v, str | int) and not isinstance(v, bool)}
    return f"{backend} ({framework(backend, versions)})"


def _flatten(obj: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _asked_repeats(config: Mapping[str, Any]) -> int | None:
    repeats = config.get("repeats")
    return repeats if isinstance(repeats, int) and not isinstance(repeats, bool) else None


def build_baseline(sweep: SweepResults) -> dict[str, Any]:
    samples = sweep.samples()
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "source": {"results": str(sweep.path), "command": sweep.manifest.get("command"), "study": sweep.kind},
        "fingerprint": fingerprint(sweep.config, sweep.records),
        "config": sweep.config,
        "models": baseline_models(samples, str(sweep.path), _asked_repeats(sweep.config)),
        "unsupported": dict(samples.unsupported),
    }


def write_baseline(path: Path, document: Mapping[str, Any]) -> None:
    data = json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n"
    write_output(Path(path), data.encode(), "the baseline")


@dataclass(frozen=True)
class Baseline:
    path: Path
    document: dict[str, Any]

    @property
    def fingerprint(self) -> dict[str, Any]:
        return self.document["fingerprint"]

    @property
    def config(self) -> dict[str, Any]:
        return self.document["config"]

    @property
    def backend(self) -> str:
        """The Keras backend the baseline's sweep ran; TensorFlow where the baseline names none."""
        return backends.named(self.fingerprint.get("backend"))

    @property
    def unsupported(self) -> dict[str, str]:
        return self.document.get("unsupported", {})

    @property
    def study(self) -> str:
        """The kind of study it froze (``study_kinds``); a sweep where the baseline names none."""
        source = self.document.get("source")
        return str((source.get("study") if isinstance(source, dict) else None) or "sweep")

    def samples(self) -> dict[str, ModelSample]:
        result = {}
        for model, entry in self.document["models"].items():
            shape = entry.get("input_shape")
            result[model] = ModelSample(
                wall=tuple(entry["wall_log_ratios"]),
                kernel=tuple(entry.get("kernel_log_ratios") or ()),
                steps=entry.get("steps"),
                warmup=entry.get("warmup"),
                batch_size=entry.get("batch_size"),
                input_shape=tuple(shape) if shape is not None else None,
            )
        return result


def read_baseline(path: Path) -> Baseline:
    """A validated baseline; any defect is one InputError line naming the file and the field."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path} is a folder, not a baseline file (detprof baseline RESULTS_DIR -o FILE writes one)")
    if not path.is_file():
        raise InputError(f"{path}: no such baseline file (create one with: detprof baseline RESULTS_DIR -o {path})")
    try:
        text = path.read_text(encoding="utf-8")
        document = json.loads(text, parse_constant=_reject_constant)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the baseline ({exc.strerror or exc})") from exc
    except RecursionError as exc:
        raise InputError(f"{path}: malformed baseline (nested too deeply)") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a detprof baseline (not UTF-8 text)") from exc
    except json.JSONDecodeError as exc:
        reason = f"invalid JSON: {exc.msg} at line {exc.lineno}"
        raise InputError(f"{path}: not a detprof baseline ({reason})") from exc
    except ValueError as exc:
        raise InputError(f"{path}: malformed baseline ({exc})") from exc
    validate(document, path)
    return Baseline(path, document)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a baseline may hold")


def validate(document: Any, path: Path) -> None:
    def bad(message: str) -> InputError:
        return InputError(f"{path}: malformed baseline: {message}")

    if not isinstance(document, dict) or "schema_version" not in document:
        raise InputError(f"{path}: not a detprof baseline (no schema_version; create one with detprof baseline)")
    version = document["schema_version"]
    if not _is_int(version) or version < 1:
        raise bad(f"schema_version must be a positive integer, not {json.dumps(version, default=str)}")
    if version > SCHEMA_VERSION:
        raise InputError(
            f"{path}: baseline schema version {version} is newer than this detprof reads ({SCHEMA_VERSION}): "
            "upgrade detprof, or rebuild the baseline with this version"
        )
    if document.get("kind") != KIND:
        raise bad(f"kind must be {KIND!r}, not {_show(document.get('kind'))}")
    fp = document.get("fingerprint")
    if not isinstance(fp, dict):
        raise bad("fingerprint must be an object")
    for name in FINGERPRINT_FIELDS:
        if name not in fp and name not in ADDED_LATER:
            raise bad(f"fingerprint.{name} is missing")
    if not isinstance(fp.get("backend", backends.DEFAULT), str):
        raise bad("fingerprint.backend must be a string (a baseline is of one Keras backend)")
    if not isinstance(fp["config_hash"], str):
        raise bad("fingerprint.config_hash must be a string")
    if not isinstance(fp.get("model_source", {}), dict):
        raise bad("fingerprint.model_source must map model names to their sources")
    if not isinstance(document.get("config"), dict):
        raise bad("config must be an object")
    unsupported = document.get("unsupported", {})
    if not isinstance(unsupported, dict) or not all(isinstance(v, str) for v in unsupported.values()):
        raise bad("unsupported must map model names to reasons")
    models = document.get("models")
    if not isinstance(models, dict) or not models:
        raise bad("models must be a non-empty object")
    for model, entry in models.items():
        _validate_model(model, entry, bad)


def _validate_model(model: str, entry: Any, bad: Any) -> None:
    where = f"models.{model}"
    if not isinstance(entry, dict):
        raise bad(f"{where} must be an object")
    wall = entry.get("wall_log_ratios")
    if not _numbers(wall) or len(wall) < 2:
        raise bad(f"{where}.wall_log_ratios must be a list of at least 2 finite numbers (R < 2 gives no interval)")
    kernel = entry.get("kernel_log_ratios")
    if kernel is not None and not _numbers(kernel):
        raise bad(f"{where}.kernel_log_ratios must be null or a list of finite numbers")
    for key in ("repeats", "steps", "warmup", "batch_size"):
        value = entry.get(key)
        if value is not None and not _is_int(value):
            raise bad(f"{where}.{key} must be an integer or null")
    shape = entry.get("input_shape")
    if shape is not None and not (isinstance(shape, list) and all(_is_int(v) for v in shape)):
        raise bad(f"{where}.input_shape must be a list of integers or null")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _numbers(value: Any) -> bool:
    return isinstance(value, list) and all(finite_number(v) for v in value)
