"""Your own model, as ``--models``/``--model`` name it: a factory function in a file or a module, or a saved ``.keras``.

The paper's zoo is a reference; what a user needs to know is what determinism costs for their
model. Everything here runs in detprof's own process, which never imports TensorFlow: a spec
is parsed and its file checked here, the model itself is loaded and looked at once in a
worker (``own_build.inspect``, called through ``inspect_with``), and what that worker reports
(inputs, outputs, loss) decides here, in one line, before any run starts, whether the model
can train on synthetic data or on the ``--data`` given. The spec travels to the workers as
plain JSON (``OwnModel.as_record``), and every run's record keeps it with the file's hash,
so that ``check`` can tell when the model itself changed.
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from detprof.errors import InputError, UsageError
from detprof.models import kinds
from detprof.models.npz_data import (
    ArrayHeader,
    headers,
    leading_rows,
    moved_channels_first,
    probability_rows,
    whole_numbers,
)

Kind = Literal["factory", "saved"]
KERAS_SUFFIX = ".keras"
PY_SUFFIX = ".py"
KERAS_ARCHIVE_CONFIG = "config.json"
DEFAULT_INPUT_SHAPE: tuple[int, ...] = (32, 32, 3)
DEFAULT_CLASSES = 10
SPARSE_CLASSIFICATION_LOSS = "sparse_categorical_crossentropy"
SINGLE_INPUT_ARRAY = "x_train"
SINGLE_TARGET_ARRAY = "y_train"
INSPECT_ENTRY = "detprof.models.own_build:inspect"
SPEC_FORMS = "FILE.py:FUNCTION, package.module:FUNCTION or FILE.keras"
KERAS_API = kinds.KERAS.api
REGISTRY_SOURCE = "registry"
"""``model_source`` of a registry model: its code is detprof's own, versioned with detprof."""

Call = Callable[[str, Mapping[str, Any], str], Any]
"""``worker_call.call_in_worker``'s shape: ``entry(request)`` in a fresh worker, its answer, errors as one line."""


@dataclass(frozen=True)
class OwnModel:
    """A user's model: where it comes from, the label it goes by, and the hash of its file."""

    given: str
    """The spec as typed: what the manifest keeps, so that ``check --run`` and ``--resume`` name it again."""
    kind: Kind
    label: str
    """The function's name, or the ``.keras`` file's name without its suffix: the model in records and reports."""
    path: str | None = None
    """The file, absolute: the ``.py`` or ``.keras`` given, or a module's source once inspected."""
    module: str | None = None
    """``package.module`` of a factory given by module name, which the worker imports: its file is known only then."""
    function: str | None = None
    search_path: str | None = None
    """The folder a module is imported from besides ``PYTHONPATH``: the current one when it was given."""
    sha256: str | None = None
    """The file's hash (a module's once a worker has imported it): what ``check`` compares to tell whether the model
    changed."""
    api: str | None = None
    """The kind of model (``kinds.ModelKind.api``: keras, torch, flax), read off what the function returned once a
    worker called it; None: not yet inspected."""

    def as_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> OwnModel:
        return cls(**{f.name: record.get(f.name) for f in fields(cls)})

    @property
    def source(self) -> str:
        """What ``check`` compares to tell whether the model changed: the hash of its file."""
        return f"sha256:{self.sha256}"


def is_native(params: Mapping[str, Any]) -> bool:
    """Whether a workload's parameters name a native model (``kinds.NATIVE``: a PyTorch or Flax module), which trains
    without Keras, rather than a Keras model or an op case."""
    return kinds.of_params(params) is not None


def is_own(name: str) -> bool:
    """A spec of a model of your own rather than a registry name: it names a function or a ``.keras`` file."""
    text = name.strip()
    return ":" in text or text.lower().endswith(KERAS_SUFFIX)


def parse(name: str) -> OwnModel:
    """The spec checked as far as it can be without loading it: the file exists, the names are names."""
    text = name.strip()
    if text.lower().endswith(KERAS_SUFFIX):
        path = _existing_file(text, "a saved Keras model")
        _refuse_non_keras_archive(path)
        return OwnModel(text, "saved", safe_label(path.stem), path=str(path), sha256=file_sha256(path))
    where, _, function = text.rpartition(":")
    if not where or not function.isidentifier():
        raise UsageError(f"{text!r}: not a model name (see `detprof models`) nor a model of your own ({SPEC_FORMS})")
    if where.lower().endswith(PY_SUFFIX):
        path = _existing_file(where, "a model factory")
        return OwnModel(text, "factory", function, path=str(path), function=function, sha256=file_sha256(path))
    if not all(part.isidentifier() for part in where.split(".")):
        raise UsageError(f"{text!r}: {where!r} is neither a .py file nor a module name (package.module:FUNCTION)")
    return OwnModel(text, "factory", function, module=where, function=function, search_path=os.getcwd())


def _existing_file(text: str, what: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_file():
        raise InputError(f"{path}: no such file ({what}, --models {SPEC_FORMS})")
    return path.resolve()


def _refuse_non_keras_archive(path: Path) -> None:
    """A ``.keras`` file is a zip archive holding the model's ``config.json``: anything else is refused here."""
    try:
        with zipfile.ZipFile(path) as archive:
            holds_config = KERAS_ARCHIVE_CONFIG in archive.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: not a saved Keras model (not a .keras archive: {exc})") from exc
    if not holds_config:
        raise InputError(f"{path}: not a saved Keras model (the archive has no {KERAS_ARCHIVE_CONFIG})")


def safe_label(stem: str) -> str:
    """A file name as a label: it names run ids and files, so nothing but letters, digits, ``_``, ``.`` and ``-``."""
    return re.sub(r"[^\w.-]+", "_", stem).strip("_") or "model"


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def refuse_duplicate_labels(labels: Sequence[str], given: Sequence[str]) -> None:
    """Two models under one label would pool their runs in records, reports and ``check``."""
    seen: dict[str, str] = {}
    for label, spec in zip(labels, given, strict=True):
        if label in seen and seen[label] == spec:
            raise UsageError(f"--models names {spec} twice: name each model once")
        if label in seen:
            raise UsageError(
                f"{seen[label]} and {spec} both go by the name {label!r}: rename one (the function or the file)"
            )
        seen[label] = spec


def parse_input_shape(text: str | None) -> tuple[int, ...] | None:
    """``--input-shape HxWxC`` (any rank: ``20`` for a vector of 20 features)."""
    if text is None:
        return None
    parts = text.strip().lower().split("x")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"--input-shape must be positive sizes joined by x, like 32x32x3 (HxWxC), not {text!r}")
    return tuple(int(p) for p in parts)


def shape_text(shape: Sequence[int | None]) -> str:
    return "x".join("?" if d is None else str(d) for d in shape)


@dataclass(frozen=True)
class TensorFacts:
    name: str
    shape: tuple[int | None, ...]
    """Without the batch axis; None where the model takes any size."""
    dtype: str

    @classmethod
    def from_answer(cls, answer: Mapping[str, Any]) -> TensorFacts:
        return cls(str(answer["name"]), tuple(answer["shape"]), str(answer["dtype"]))


@dataclass(frozen=True)
class Inspected:
    """What a worker saw of a user's model, once, before any run."""

    model: OwnModel
    built_at_input_shape: bool
    """Built at the input shape it was given: a factory that takes ``(input_shape, classes)``, or a model that fixes
    no input of its own (a Sequential without ``keras.Input``, an unbuilt subclassed model); else the model's own."""
    inputs: tuple[TensorFacts, ...]
    outputs: tuple[TensorFacts, ...]
    loss: str | None
    """The loss it is compiled with (its function's name); None: not compiled, so SGD and sparse cross-entropy."""
    parameters: int
    nondeterministic_ops: tuple[Mapping[str, Any], ...] = ()
    """A native module's ops without a deterministic implementation on the device, each with the modules that call
    it (``torch_modules.nondeterministic_ops``)."""
    targets: bool = False
    """A native module's loss of the user's takes targets shaped as its logits, not class ids (a binary
    classifier's ``BCEWithLogitsLoss``): synthetic targets of 0 and 1 fit it, one score per example too
    (``torch_modules.takes_targets``)."""
    needs_labels: bool = False
    """A native module whose forward runs only given its labels (an encoder-decoder such as T5): it trains as its
    loop trains it, but predicts nothing from its input alone (``torch_modules.probed``)."""
    classes_first: bool = False
    """A native module's logits score the classes on their first axis (a segmentation model's, a Conv1d tagger's:
    ``kinds.classes_first``), not their last."""

    @classmethod
    def from_answer(cls, model: OwnModel, answer: Mapping[str, Any]) -> Inspected:
        """``model`` as ``own_build.describe`` found it, its file and hash filled in (a module's come from there)."""
        return cls(
            replace(model, path=answer["path"], sha256=answer["sha256"], api=answer.get("api", KERAS_API)),
            bool(answer["built_at_input_shape"]),
            tuple(TensorFacts.from_answer(t) for t in answer["inputs"]),
            tuple(TensorFacts.from_answer(t) for t in answer["outputs"]),
            answer["loss"],
            int(answer["parameters"]),
            tuple(answer.get("nondeterministic_ops") or ()),
            bool(answer.get("targets")),
            bool(answer.get("needs_labels")),
            bool(answer.get("classes_first")),
        )

    @property
    def label(self) -> str:
        return self.model.label

    @property
    def compiled(self) -> bool:
        return self.loss is not None

    @property
    def sparse_classifier(self) -> bool:
        """One output trained against integer labels: synthetic labels fit it."""
        return len(self.outputs) == 1 and self.loss in (None, SPARSE_CLASSIFICATION_LOSS)

    @property
    def classes(self) -> int | None:
        shape = self.outputs[0].shape if self.sparse_classifier else ()
        return kinds.classes_in(shape, self.classes_first) if shape else None


def inspect_with(
    call: Call,
    models: Sequence[OwnModel],
    *,
    backend: str,
    input_shape: Sequence[int],
    classes: int,
    shape_given: bool = False,
    sizes: Mapping[str, tuple[Sequence[int], int]] | None = None,
    fed: str | None = None,
    images_last: bool = False,
    amp: str | None = None,
) -> list[Inspected]:
    """Load each model once in a worker of ``backend`` (``call`` is ``worker_call.call_in_worker``).

    A factory that takes ``(input_shape, classes)`` is built with these, and a model that fixes no input shape of
    its own at ``input_shape``; a native PyTorch module takes ``input_shape`` as it is where ``shape_given``
    (``--input-shape``, or ``--data``'s examples: both in the module's own layout), else with its channels first
    (the HxWxC a Keras model would be built at). ``sizes``: the models (by ``OwnModel.given``) built at a shape and
    classes of their own instead, as given (a native registry model's, in its own layout). A module's file and hash
    come back from the worker that imported it: this process never imports it. ``fed``: what a module whose call
    fails on its batch is told to take instead, where the command has no ``--input-shape``. ``images_last``: the
    given shape is ``--data``'s images stored HxWxC, which a kind that takes its channels first is fed moved so.
    ``amp``: ``--amp``, a step in which a native module that trains in mixed precision takes first.
    """
    if not models:
        return []
    request = {
        "models": [m.as_record() for m in models],
        "backend": backend,
        "input_shape": list(input_shape),
        "classes": classes,
        "shape_given": shape_given,
        "sizes": {given: [list(shape), count] for given, (shape, count) in (sizes or {}).items()},
        "fed": fed,
        "images_last": images_last,
        "amp": amp,
    }
    answers = call(INSPECT_ENTRY, request, f"loading {', '.join(m.given for m in models)}")
    return [Inspected.from_answer(model, answer) for model, answer in zip(models, answers, strict=True)]


def without_deterministic_implementation(label: str, ops: Sequence[Mapping[str, Any]]) -> str | None:
    """One line naming the ops of ``label`` that have no deterministic implementation on the device and the modules
    that call them; None where there are none."""
    if not ops:
        return None
    named = "; ".join(f"{op['op']} (in {', '.join(op['modules']) or 'no module found'})" for op in ops)
    return (
        f"{label}: no deterministic implementation on this device for {named}: its deterministic runs stop there "
        "(torch.use_deterministic_algorithms(True, warn_only=True) would run them with a warning, not "
        "deterministically)"
    )


def refuse_synthetic(item: Inspected) -> None:
    """One line when synthetic data cannot train ``item``, saying what it needs instead."""
    need = "pass --data npz:PATH with a batch for it (an array per input and output, by name)"
    if len(item.inputs) != 1 or len(item.outputs) != 1:
        names = ", ".join(t.name for t in item.inputs)
        compile_too = "" if item.compiled else ", and compile it with its loss and optimizer"
        raise UsageError(
            f"{item.label} has {len(item.inputs)} input(s) ({names}) and {len(item.outputs)} output(s): "
            f"synthetic data fits one input and one classifier output; {need}{compile_too}"
        )
    (tensor,) = item.inputs
    if None in tensor.shape:
        raise UsageError(f"{item.label}'s input {tensor.name} has no fixed shape ({shape_text(tensor.shape)}): {need}")
    tokens = kinds.native(item.model.api) is not None and tensor.dtype.startswith("int")
    if not tensor.dtype.startswith(("float", "bfloat")) and not tokens:
        raise UsageError(f"{item.label}'s input {tensor.name} takes {tensor.dtype} values, not images: {need}")
    if not item.sparse_classifier:
        raise UsageError(
            f"{item.label} is compiled with the loss {item.loss}, not {SPARSE_CLASSIFICATION_LOSS}: synthetic class "
            f"labels would not fit it; {need}"
        )
    if (item.classes is None or item.classes < 2) and not item.targets:
        shape = shape_text(item.outputs[0].shape)
        raise UsageError(f"{item.label}'s output ({shape}) is not a score per class: {need}")


def data_feed(item: Inspected, path: Path, arrays: Mapping[str, ArrayHeader], batch_size: int) -> dict[str, Any]:
    """Which array of ``path`` feeds each input and target of ``item`` (the worker reads ``batch_size`` rows).

    An array named as the input or output it feeds; a model with one input and one output
    also takes ``x_train`` and ``y_train``, the arrays of ``stability --dataset npz:PATH``.
    """
    if not item.compiled and not item.sparse_classifier:
        raise UsageError(
            f"{item.label} has {len(item.outputs)} outputs and is not compiled: compile it with its loss and "
            "optimizer (detprof trains a model that is not compiled as a classifier)"
        )
    inputs = [
        [t.name, _array_for(item, t, "input", SINGLE_INPUT_ARRAY if len(item.inputs) == 1 else None, path, arrays)]
        for t in item.inputs
    ]
    targets = [
        [t.name, _array_for(item, t, "output", SINGLE_TARGET_ARRAY if len(item.outputs) == 1 else None, path, arrays)]
        for t in item.outputs
    ]
    for _, name in inputs + targets:
        refuse_short(path, name, arrays[name], batch_size)
    refuse_unfit_rows(path, arrays, [name for _, name in inputs + targets], batch_size)
    for tensor, (_, name) in zip(item.inputs, inputs, strict=True):
        moved = moved_channels_first(tuple(int(d) for d in arrays[name].shape[1:]), tuple(tensor.shape))
        if example_shape(arrays[name].shape, tensor.shape) is None and not moved:
            which = "input" if tensor.name == "input" else f"input {tensor.name}"
            raise InputError(
                f"{path}: array {name} holds {shape_text(arrays[name].shape[1:])} examples; {item.label}'s {which} "
                f"takes {shape_text(tensor.shape)}"
            )
    if item.sparse_classifier:
        refuse_one_hot(item, path, arrays, targets[0][1])
        refuse_fractional_labels(path, arrays, targets[0][1])
    if item.sparse_classifier and item.classes is not None:
        found = label_classes(path, arrays, targets[0][1])
        if found is not None and found > item.classes:
            raise InputError(
                f"{path}: array {targets[0][1]} holds labels up to {found - 1}; "
                f"{item.label} scores {item.classes} classes"
            )
    return {"path": str(path), "inputs": inputs, "targets": targets}


def _array_for(
    item: Inspected,
    tensor: TensorFacts,
    role: str,
    single: str | None,
    path: Path,
    arrays: Mapping[str, ArrayHeader],
) -> str:
    for name in (tensor.name, single):
        if name is not None and name in arrays:
            return name
    wanted = " or ".join(repr(n) for n in (tensor.name, single) if n)
    which = role if tensor.name == role else f"{role} {tensor.name}"
    raise InputError(f"{path}: no array {wanted} for {item.label}'s {which} (it holds {', '.join(sorted(arrays))})")


def refuse_short(path: Path, name: str, header: ArrayHeader, batch_size: int) -> None:
    rows = header.shape[0] if header.shape else 0
    if rows < batch_size:
        raise InputError(f"{path}: array {name} holds {rows} examples, fewer than the batch size {batch_size}")


def example_shape(array_shape: Sequence[int], model_shape: Sequence[int | None]) -> tuple[int, ...] | None:
    """An array's example shape as the model takes it, or None when it does not fit.

    Grey images without a channel axis, (N, H, W), feed a model that takes (H, W, 1), as
    ``stability --dataset npz:PATH`` reads them.
    """
    shape = tuple(int(d) for d in array_shape[1:])
    if len(shape) == len(model_shape) - 1 and model_shape[-1] == 1:
        shape = (*shape, 1)
    if len(shape) != len(model_shape) or any(m is not None and m != d for d, m in zip(shape, model_shape, strict=True)):
        return None
    return shape


@dataclass(frozen=True)
class NpzData:
    """``--data``'s file read once: its arrays' headers, and what a model built for it takes: one ``x_train``
    example's shape (None: it holds no such array) and the classes its integer labels name (None: none)."""

    path: Path
    arrays: Mapping[str, ArrayHeader]
    images: tuple[int, ...] | None
    classes: int | None

    @classmethod
    def read(cls, path: Path) -> NpzData:
        arrays = headers(path)
        images = image_shape(path, arrays) if SINGLE_INPUT_ARRAY in arrays else None
        return cls(path, arrays, images, label_classes(path, arrays))


def image_shape(path: Path, arrays: Mapping[str, ArrayHeader]) -> tuple[int, ...]:
    """The shape of one ``x_train`` example, grey images given a channel axis (as the stability study reads them)."""
    if SINGLE_INPUT_ARRAY not in arrays:
        raise InputError(f"{path}: no array {SINGLE_INPUT_ARRAY} (it holds {', '.join(sorted(arrays))})")
    shape = tuple(int(d) for d in arrays[SINGLE_INPUT_ARRAY].shape[1:])
    return (*shape, 1) if len(shape) == 2 else shape


def refuse_one_hot(item: Inspected, path: Path, arrays: Mapping[str, ArrayHeader], name: str) -> None:
    """A classifier trains on a class id per example: labels stored one-hot (or as probabilities), a row per example
    as long as its scores that sums to 1, would be read as that many ids each; refused in one line that says how to
    store them."""
    header, scores = arrays[name], item.outputs[0].shape
    if len(scores) != 1 or tuple(header.shape[1:]) != scores or not header.shape[0]:
        return
    if probability_rows(leading_rows(path, name, header.shape[0]).astype(np.float64), axis=1):
        raise InputError(
            f"{path}: array {name} holds one-hot labels ({scores[0]} per example, summing to 1): {item.label} trains "
            f"on a class id per example; store y.argmax(axis=1)"
        )


def refuse_fractional_labels(path: Path, arrays: Mapping[str, ArrayHeader], name: str) -> None:
    """Class labels stored as floats train as the integers they hold; one that is not a whole number would be cut to
    one, training on classes the file does not hold: refused in one line."""
    header = arrays[name]
    if not np.issubdtype(np.dtype(header.dtype), np.floating) or not header.shape:
        return
    labels = leading_rows(path, name, header.shape[0])
    if not whole_numbers(labels):
        first = labels[labels != np.round(labels)].flat[0]
        raise InputError(
            f"{path}: array {name} holds labels that are not whole numbers (such as {first:g}): a classifier trains "
            "on integer class labels"
        )


def label_classes(path: Path, arrays: Mapping[str, ArrayHeader], name: str = SINGLE_TARGET_ARRAY) -> int | None:
    """How many classes an array of integer labels names (its largest plus one); None when it holds no such labels.
    A negative label names no class: refused in one line."""
    header = arrays.get(name)
    if header is None or not np.issubdtype(np.dtype(header.dtype), np.integer) or not header.shape:
        return None
    labels = leading_rows(path, name, header.shape[0])
    if labels.size and labels.min() < 0:
        raise InputError(f"{path}: array {name} holds negative labels (such as {labels.min()}): a class is 0 or more")
    return int(labels.max()) + 1 if labels.size else None


def refuse_unfit_rows(path: Path, arrays: Mapping[str, ArrayHeader], names: Sequence[str], batch_size: int) -> None:
    """One line where the arrays feeding one model hold different numbers of examples (an example without its
    label), or where the batch a worker reads of them holds a NaN or an infinity (a step on it trains on nothing)."""
    rows = {name: arrays[name].shape[0] if arrays[name].shape else 0 for name in names}
    if len(set(rows.values())) > 1:
        held = ", ".join(f"{name} {count}" for name, count in rows.items())
        raise InputError(f"{path}: the arrays feeding one model hold different numbers of examples ({held})")
    floating = [name for name in names if np.issubdtype(np.dtype(arrays[name].dtype), np.floating)]
    for name in floating:
        if not np.isfinite(leading_rows(path, name, batch_size)).all():
            raise InputError(f"{path}: the first {batch_size} rows of array {name} hold NaN or infinite values")


def classifier_feed(data: NpzData, batch_size: int, classes: int) -> dict[str, Any]:
    """``x_train`` and ``y_train`` feeding a registry model: images (``data.images``, which the caller checked) and
    integer labels under ``classes``, read once when ``data`` was."""
    path, arrays, found = data.path, data.arrays, data.classes
    if found is None:
        raise InputError(f"{path}: a registry model trains on integer class labels in {SINGLE_TARGET_ARRAY}")
    if found > classes:
        raise InputError(f"{path}: {SINGLE_TARGET_ARRAY} holds labels up to {found - 1}: pass --classes {found}")
    for name in (SINGLE_INPUT_ARRAY, SINGLE_TARGET_ARRAY):
        refuse_short(path, name, arrays[name], batch_size)
    refuse_unfit_rows(path, arrays, [SINGLE_INPUT_ARRAY, SINGLE_TARGET_ARRAY], batch_size)
    return {
        "path": str(path),
        "inputs": [[SINGLE_INPUT_ARRAY, SINGLE_INPUT_ARRAY]],
        "targets": [[SINGLE_TARGET_ARRAY, SINGLE_TARGET_ARRAY]],
    }
