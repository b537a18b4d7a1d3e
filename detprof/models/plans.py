"""What each model a study names is, and how its workers build and feed it: one call (``model_plans``).

The sweep, the knob study and ``detprof verify`` all name models as ``--models`` does: registry
names or your own (``models.own``). Your own models are loaded once in a worker before any run
(``own.inspect_with``), so that a missing function, a model that does not load or one that
synthetic data cannot train is one line before the study starts, and each model's plan
(``ModelPlan``) says how its workers build and feed it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detprof.errors import InputError, UsageError
from detprof.models import kinds, own, registry
from detprof.models.npz_data import channels_last, npz_path


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
    warning: str | None = None
    """What the study says of the model before it measures anything: a native module's ops without a deterministic
    implementation on the device (``own.without_deterministic_implementation``)."""

    @property
    def kind(self) -> kinds.ModelKind | None:
        """The native kind of the model, the user's or the registry's (``own.OwnModel.api``); None: a Keras model."""
        return None if self.own_model is None else kinds.native(self.own_model.api)

    def workload_spec(self, batch_size: int, amp: str | None = None) -> dict[str, Any]:
        """What a worker builds and feeds (``amp``: ``--amp``, None: the model's own precision)."""
        spec = {"model": self.label, "batch_size": batch_size, "input_shape": self.input_shape, "classes": self.classes}
        if amp is not None:
            spec["amp"] = amp
        if self.own_model is not None:
            spec["own_model"] = self.own_model.as_record()
        if self.feed is not None:
            spec["data"] = self.feed
        return spec


@dataclass(frozen=True)
class ModelsAsked:
    """What a study asks of its models: their names as ``--models`` gave them, and the sizes and data they are built
    and fed at (None: each model's own)."""

    models: tuple[str, ...]
    batch_size: int
    input_size: int | None = None
    input_shape: str | None = None
    """``--input-shape`` (HxWxC) of your own models built at one; None: not given."""
    classes: int | None = None
    data: Path | None = None
    """``--data``'s file; None: synthetic batches."""
    amp: str | None = None
    """``--amp``: the mixed precision each native module is first trained a step in; None: its own precision."""


def split_models(models: str | None) -> tuple[str, ...] | None:
    """``--models`` as a tuple; registry names are case-blind, your own models' files and functions are not."""
    if models is None:
        return None
    names = tuple(m.strip() if own.is_own(m) else m.strip().lower() for m in models.split(",") if m.strip())
    if not names:
        raise UsageError("--models is empty: give a comma-separated list of model names (see `detprof models`)")
    return names


def check_known(models: tuple[str, ...]) -> None:
    """UsageError naming the first of ``models`` that is neither your own nor in the registry."""
    for model in models:
        if not own.is_own(model):
            registry.get(model)


def data_path(data: str | None, input_size: int | None) -> Path | None:
    """``--data``'s file; the input size then comes from its images, so ``--input-size`` beside it is refused."""
    if data is None:
        return None
    path = npz_path(data, "--data")
    if path is None:
        raise UsageError(
            f"--data takes npz:PATH (arrays x_train and y_train, or one per input and output), not {data!r}"
        )
    if input_size is not None:
        raise UsageError("--input-size does not apply with --data: the models are built at the size of its examples")
    return path


DATA_FED = (
    "store --data's x_train as it takes them (images NxHxWxC, moved channels first for a PyTorch module, or "
    "stored NxCxHxW)"
)
"""What a module whose forward fails on ``--data``'s examples is told: they are fed as stored, save images stored
channels last, which a PyTorch module is fed channels first."""


def model_plans(asked: ModelsAsked, backend: str, call: Callable[..., Any]) -> tuple[ModelPlan, ...]:
    """Every model's plan, your own models loaded once in a worker of ``backend`` (started by ``call``,
    ``worker_call.call_in_worker``'s signature) to check them first.

    A factory that takes ``(input_shape, classes)``, and a model that fixes no input shape of
    its own (a Sequential without ``keras.Input``, an unbuilt subclassed model), is built at
    ``--input-shape``, else the shape of ``--data``'s ``x_train`` examples, else 32x32x3, for
    ``--classes`` (or the preset's), else as many classes as ``--data``'s labels name, else 10.
    A native module (PyTorch's, Flax's) is fed the input it was inspected at (``own_build.describe``):
    ``--input-shape``, or ``--data``'s examples in its own layout (images stored HxWxC moved channels first for a
    PyTorch module, as ``stability --dataset`` reads one file either way), and trained on the classes its logits
    score.
    """
    data = None if asked.data is None else own.NpzData.read(asked.data)
    mine = {model: own.parse(model) for model in asked.models if own.is_own(model)}
    native = {model: found for model in asked.models if (found := registry.native_model(model)) is not None}
    own.refuse_duplicate_labels([mine[m].label if m in mine else m for m in asked.models], asked.models)
    shape = own.parse_input_shape(asked.input_shape) or (data.images if data else None) or own.DEFAULT_INPUT_SHAPE
    classes = asked.classes or (data.classes if data else None) or own.DEFAULT_CLASSES
    inspected = own.inspect_with(
        call,
        [*mine.values(), *native.values()],
        backend=backend,
        input_shape=shape,
        classes=classes,
        shape_given=asked.input_shape is not None or data is not None,
        sizes={model: native_size(asked, model) for model in native if data is None},
        fed=None if data is None or asked.input_shape is not None else DATA_FED,
        images_last=asked.input_shape is None and data is not None and channels_last(data.images or ()),
        amp=asked.amp,
    )
    if asked.input_shape is not None and not any(item.built_at_input_shape for item in inspected[: len(mine)]):
        raise UsageError(
            "--input-shape applies to your own models that take it: factories of (input_shape, classes), and "
            "models without an input shape of their own (a Sequential without keras.Input, an unbuilt subclassed "
            "model); none of --models is one"
        )
    by_spec = {item.model.given: item for item in inspected}
    plans = []
    for model in asked.models:
        item = by_spec.get(model)
        if item is None:
            plans.append(registry_plan(asked, model, data))
            continue
        if data is None:
            own.refuse_synthetic(item)
        feed = None if data is None else own.data_feed(item, data.path, data.arrays, asked.batch_size)
        if kinds.native(item.model.api) is not None:
            warning = own.without_deterministic_implementation(item.label, item.nondeterministic_ops)
            shape_in = list(item.inputs[0].shape)
            plans.append(ModelPlan(model, item.label, item.model, shape_in, item.classes, feed, warning))
            continue
        built_at = item.built_at_input_shape
        plans.append(
            ModelPlan(
                model, item.label, item.model, list(shape) if built_at else None, classes if built_at else None, feed
            )
        )
    return tuple(plans)


def native_size(asked: ModelsAsked, model: str) -> tuple[registry.InputShape, int]:
    """A native registry model's input shape (in its own layout) and classes: its own, at ``--input-size`` and
    ``--classes`` where given."""
    spec = registry.get(model)
    shape = spec.input_shape if asked.input_size is None else spec.shape_at(asked.input_size)
    return shape, asked.classes or spec.classes


def registry_plan(asked: ModelsAsked, model: str, data: own.NpzData | None = None) -> ModelPlan:
    """A registry model at ``--input-size`` (its own channels) on synthetic data, or at ``--data``'s images on them."""
    spec = registry.get(model)
    if data is None:
        shape = None if asked.input_size is None else list(spec.shape_at(asked.input_size))
        return ModelPlan(model, model, input_shape=shape, classes=asked.classes)
    images = data.images or own.image_shape(data.path, data.arrays)
    if spec.takes != "images":
        raise UsageError(
            f"{model} takes {spec.takes}: --data feeds a registry model images (x_train) and class labels (y_train); "
            f"without --data it is fed synthetic {spec.takes} (kernel time does not depend on their values)"
        )
    if len(images) != len(spec.input_shape):
        each = f"of shape {own.shape_text(images)}" if images else "a single number"
        raise InputError(f"{data.path}: {model} takes images (H, W, C); each example in x_train is {each}")
    classes = asked.classes or data.classes or spec.classes
    feed = own.classifier_feed(data, asked.batch_size, classes)
    return ModelPlan(model, model, input_shape=list(images), classes=classes, feed=feed)
