"""Which models a study of models runs, and how each is built and fed: the sweep's request resolved.

The sweep, the knob study and ``detprof verify`` all name models as ``--models`` does: registry
names or your own (``models.own``). Your own models are loaded once in a worker before any run
(``own.inspect_with``), so that a missing function, a model that does not load or one that
synthetic data cannot train is one line before the study starts, and each model's plan
(``ModelPlan``) says how its workers build and feed it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from detprof.errors import UsageError
from detprof.models import own, registry
from detprof.models.npz_data import ArrayHeader, headers, npz_path
from detprof.options import RunOptions, parse_duration, parse_precision
from detprof.profiler.launcher import call_in_worker
from detprof.profiler.plan import (
    MeasurementTarget,
    RunSettings,
    choose_target,
    preset_values,
)
from detprof.profiler.presets import PRESETS

MODEL_WORKLOAD = "detprof.profiler.workloads:model_training"
MODEL_ARMS_WORKLOAD = "detprof.profiler.workloads:model_training_arms"


@dataclass(frozen=True)
class ModelPlan:
    """How the workers of one model build it and feed it."""

    given: str
    """The model as ``--models`` named it."""
    label: str
    """What records, reports and ``check`` call it: the registry name, or your function's or file's name."""
    own_model: own.OwnModel | None = None
    input_shape: list[int] | None = None
    """None: the model's own (a registry model's default, or whatever your model fixes)."""
    classes: int | None = None
    feed: dict[str, Any] | None = None
    """Which arrays of ``--data`` feed its inputs and targets (``own.data_feed``); None: a synthetic batch."""

    def workload_spec(self, batch_size: int) -> dict[str, Any]:
        spec = {"model": self.label, "batch_size": batch_size, "input_shape": self.input_shape, "classes": self.classes}
        if self.own_model is not None:
            spec["own_model"] = self.own_model.as_record()
        if self.feed is not None:
            spec["data"] = self.feed
        return spec


@dataclass(frozen=True, kw_only=True)
class SweepConfig(RunSettings):
    models: tuple[str, ...]
    classes: int | None = None
    input_shape: str | None = None
    """``--input-shape`` (HxWxC) of your own models built at one (``own.Inspected.built_at_input_shape``); None: not
    given."""
    data: str | None = None
    """``--data npz:PATH`` as given; None: synthetic batches."""
    plans: tuple[ModelPlan, ...] = field(default=(), compare=False)
    """Each model's plan, once ``SweepRequest.resolve`` made them; without them, registry models' defaults."""

    def __post_init__(self) -> None:
        if not self.models:
            raise UsageError("no models to sweep: pass --models")
        super().__post_init__()
        for model in self.models:
            if not own.is_own(model):
                registry.get(model)

    def manifest(self) -> dict[str, Any]:
        """The configuration; your own models add their specs (file hashes included), so that a sweep of a
        changed model does not resume into the old one's results."""
        config = super().manifest()
        config.pop("plans")
        for key in ("input_shape", "data"):
            if config[key] is None:
                config.pop(key)
        mine = {plan.label: plan.own_model.as_record() for plan in self.model_plans() if plan.own_model is not None}
        if mine:
            config["own_models"] = mine
        return config | {"models": list(self.models)}

    def model_plans(self) -> tuple[ModelPlan, ...]:
        return self.plans or tuple(registry_plan(self, model) for model in self.models)


@dataclass(frozen=True)
class SweepRequest:
    """The sweep's options as given; ``None`` takes the preset's value (the paper's on a GPU)."""

    models: tuple[str, ...] | None
    options: RunOptions

    def resolve(self, *, dry_run: bool = False) -> tuple[SweepConfig, MeasurementTarget]:
        """The device and tracer chosen and checked, and the configuration the sweep will run."""
        run = self.options
        target = choose_target(run, list(PRESETS), dry_run=dry_run)
        given = {
            "models": self.models,
            "steps": run.steps,
            "warmup": run.warmup,
            "repeats": run.repeats,
            "batch_size": run.batch_size,
            "input_size": run.input_size,
            "classes": run.classes,
            "precision": parse_precision(run.precision),
            "budget_s": parse_duration(run.budget, "--budget"),
        }
        data = _data_path(run)
        values = preset_values(PRESETS[target.preset], given)
        if data is not None:
            values["input_size"] = None
        if run.steps is not None:  # the steps asked for, not a number sized to the machine
            values["run_seconds"] = None
        if given["precision"] is None and run.repeats is not None:  # the repeats asked for, no more
            values["precision"] = None
        values["precision"] = values["precision"] or None
        if values["precision"] is None:
            if given["budget_s"] is not None:
                raise UsageError("--budget bounds the repeats --precision adds: give --precision too")
            values["budget_s"] = None
        shape = own.parse_input_shape(run.input_shape)
        lengths = values.pop("run_seconds")
        config = SweepConfig.for_target(
            target,
            run,
            in_process=True,
            **values,
            input_shape=None if shape is None else own.shape_text(shape),
            data=run.data,
        )
        run_seconds = lengths.get(config.pairing) if isinstance(lengths, dict) else lengths
        return replace(config, run_seconds=run_seconds, plans=model_plans(config, data, target.backend)), target


def _data_path(run: RunOptions) -> Path | None:
    """``--data``'s file; the input size then comes from its images, so ``--input-size`` beside it is refused."""
    if run.data is None:
        return None
    path = npz_path(run.data, "--data")
    if path is None:
        raise UsageError(
            f"--data takes npz:PATH (arrays x_train and y_train, or one per input and output), not {run.data!r}"
        )
    if run.input_size is not None:
        raise UsageError("--input-size does not apply with --data: the models are built at the size of its examples")
    return path


def split_models(models: str | None) -> tuple[str, ...] | None:
    """``--models`` as a tuple; registry names are case-blind, your own models' files and functions are not."""
    if models is None:
        return None
    names = tuple(m.strip() if own.is_own(m) else m.strip().lower() for m in models.split(",") if m.strip())
    if not names:
        raise UsageError("--models is empty: give a comma-separated list of model names (see `detprof models`)")
    return names


def model_plans(config: SweepConfig, data: Path | None, backend: str) -> tuple[ModelPlan, ...]:
    """Every model's plan, your own models loaded once in a worker of ``backend`` to check them first.

    A factory that takes ``(input_shape, classes)``, and a model that fixes no input shape of
    its own (a Sequential without ``keras.Input``, an unbuilt subclassed model), is built at
    ``--input-shape``, else the shape of ``--data``'s ``x_train`` examples, else 32x32x3, for
    ``--classes`` (or the preset's), else as many classes as ``--data``'s labels name, else 10.
    """
    mine = {model: own.parse(model) for model in config.models if own.is_own(model)}
    own.refuse_duplicate_labels([mine[m].label if m in mine else m for m in config.models], config.models)
    arrays = headers(data) if data is not None else None
    data_shape = own.image_shape(data, arrays) if data and arrays and own.SINGLE_INPUT_ARRAY in arrays else None
    shape = own.parse_input_shape(config.input_shape) or data_shape or own.DEFAULT_INPUT_SHAPE
    data_classes = own.label_classes(data, arrays) if data and arrays else None
    classes = config.classes or data_classes or own.DEFAULT_CLASSES
    inspected = own.inspect_with(
        call_in_worker, list(mine.values()), backend=backend, input_shape=shape, classes=classes
    )
    if config.input_shape is not None and not any(item.built_at_input_shape for item in inspected):
        raise UsageError(
            "--input-shape applies to your own models that take it: factories of (input_shape, classes), and "
            "models without an input shape of their own (a Sequential without keras.Input, an unbuilt subclassed "
            "model); none of --models is one"
        )
    by_spec = {item.model.given: item for item in inspected}
    plans = []
    for model in config.models:
        item = by_spec.get(model)
        if item is None:
            plans.append(registry_plan(config, model, data, arrays))
            continue
        if data is None or arrays is None:
            own.refuse_synthetic(item)
        feed = None if data is None or arrays is None else own.data_feed(item, data, arrays, config.batch_size)
        built_at = item.built_at_input_shape
        plans.append(
            ModelPlan(
                model, item.label, item.model, list(shape) if built_at else None, classes if built_at else None, feed
            )
        )
    return tuple(plans)


def registry_plan(
    config: SweepConfig, model: str, data: Path | None = None, arrays: Mapping[str, ArrayHeader] | None = None
) -> ModelPlan:
    """A registry model at ``--input-size`` (its own channels) on synthetic data, or at ``--data``'s images on them."""
    spec = registry.get(model)
    if data is None or arrays is None:
        shape = None if config.input_size is None else list(spec.shape_at(config.input_size))
        return ModelPlan(model, model, input_shape=shape, classes=config.classes)
    images = own.image_shape(data, arrays)
    if spec.takes != "images":
        raise UsageError(f"{model} takes {spec.takes}; --data gives a registry model images (x_train, y_train)")
    if len(images) != len(spec.input_shape):
        raise UsageError(f"{data}: {model} takes images (H, W, C); x_train holds {own.shape_text(images)} examples")
    classes = config.classes or own.label_classes(data, arrays) or spec.classes
    feed = own.classifier_feed(data, arrays, config.batch_size, classes)
    return ModelPlan(model, model, input_shape=list(images), classes=classes, feed=feed)
