"""Your own model built inside a worker, whose Keras backend and determinism mode are already chosen.

A factory is imported from its file (its folder first on ``sys.path``, as Python runs a
script) or from its module (the folder it was named from, then ``PYTHONPATH``), and called
with ``(input_shape, classes)`` when it takes two arguments, else with none. A ``.keras``
file loads under whichever backend the worker runs, where Keras can. For a stability study
(``OwnBuilder``) a saved model is its architecture: every build is a clone with freshly
initialised weights, drawn from the seed Keras was given, unless the saved weights are kept
on purpose. Every problem is one ``UsageError`` line naming the spec, which
``launcher.call_in_worker`` carries to the parent as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect as pyinspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detprof.determinism import DeterminismSettings, apply
from detprof.errors import UsageError, first_line
from detprof.models.own import OwnModel, file_sha256

if TYPE_CHECKING:
    import keras

KERAS_INITIALIZERS_MODULE = "keras.initializers"


def factory(model: OwnModel) -> Callable[..., Any]:
    """The function the spec names, its module imported (once per process)."""
    try:
        module = _import(model)
    except Exception as exc:
        raise UsageError(f"{model.given}: importing {model.path or model.module} failed: {first_line(exc)}") from exc
    function = getattr(module, str(model.function), None)
    if not callable(function):
        raise UsageError(f"{model.given}: {model.path or model.module} has no function {model.function!r}")
    return function


def _import(model: OwnModel) -> Any:
    if model.module is not None:
        if model.search_path and model.search_path not in sys.path:
            sys.path.insert(0, model.search_path)
        return importlib.import_module(model.module)
    path = Path(str(model.path))
    name = f"detprof_own_{model.label}_{file_sha256(path)[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def takes_arguments(function: Callable[..., Any], given: str) -> bool:
    """True for ``FUNCTION(input_shape, classes)``, False for ``FUNCTION()``; one line for anything else."""
    try:
        signature = pyinspect.signature(function)
    except (TypeError, ValueError):
        return False
    for arguments in ((None, None), ()):
        try:
            signature.bind(*arguments)
        except TypeError:
            continue
        return bool(arguments)
    raise UsageError(f"{given}: the function must take no arguments or (input_shape, classes), not {signature}")


def build(model: OwnModel, input_shape: Sequence[int], classes: int) -> keras.Model:
    """The model the spec names: the factory's (called as it takes it), or the saved one, loaded."""
    import keras

    if model.kind == "saved":
        return load_saved(model)
    function = factory(model)
    try:
        built = function(tuple(input_shape), classes) if takes_arguments(function, model.given) else function()
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"{model.given}: building the model failed: {first_line(exc, with_type=True)}") from exc
    if not isinstance(built, keras.Model):
        raise UsageError(f"{model.given}: {model.function} returned {type(built).__name__}, not a keras.Model")
    return built


def load_saved(model: OwnModel) -> keras.Model:
    import keras

    try:
        return keras.saving.load_model(str(model.path))
    except Exception as exc:
        raise UsageError(
            f"{model.path}: Keras {keras.__version__} on {keras.backend.backend()} cannot load it "
            f"({first_line(exc, with_type=True)})"
        ) from exc


def symbolic_inputs(model: keras.Model, given: str) -> list[keras.KerasTensor]:
    """The model's inputs; a model without any (subclassed, or Sequential without an Input) is one line."""
    try:
        return list(model.inputs)
    except (AttributeError, ValueError) as exc:
        raise UsageError(
            f"{given}: the model has no defined inputs ({first_line(exc)}): detprof needs a functional or "
            "Sequential model that starts with keras.Input(shape=...)"
        ) from exc


def loss_name(model: keras.Model) -> str | None:
    """The name of the loss function the model is compiled with; None when it is not compiled with one."""
    import keras

    loss = getattr(model, "loss", None) if getattr(model, "compiled", False) else None
    if loss is None:
        return None
    if isinstance(loss, dict | list | tuple):
        return f"{len(loss)} losses, one per output"
    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except ValueError:
            return loss
    function = getattr(loss, "fn", loss)
    return str(getattr(function, "__name__", type(loss).__name__))


def ends_in_softmax(model: keras.Model) -> bool:
    """Keras applications end in a softmax; detprof's own models output logits."""
    activation = getattr(model.layers[-1], "activation", None)
    return getattr(activation, "__name__", "") == "softmax"


def inspect(models: list[dict[str, Any]], backend: str, input_shape: list[int], classes: int) -> list[dict[str, Any]]:
    """``launcher.call_in_worker``'s entry: each model loaded once on ``backend``, and what the parent needs of it."""
    apply(DeterminismSettings("default", backend=backend))  # type: ignore[arg-type]
    return [describe(OwnModel.from_record(record), input_shape, classes) for record in models]


def describe(model: OwnModel, input_shape: Sequence[int], classes: int) -> dict[str, Any]:
    """The model built once, as JSON: its file and hash, how it is called, its inputs, outputs, loss and size."""
    built = build(model, input_shape, classes)
    inputs = symbolic_inputs(built, model.given)
    path = model.path or str(getattr(sys.modules.get(str(model.module)), "__file__", "") or "")
    return {
        "path": path or None,
        "sha256": model.sha256 or (file_sha256(path) if path else None),
        "takes_arguments": model.kind == "factory" and takes_arguments(factory(model), model.given),
        "inputs": [{"name": t.name, "shape": list(t.shape[1:]), "dtype": str(t.dtype)} for t in inputs],
        "outputs": [
            {"name": name, "shape": list(t.shape[1:]), "dtype": str(t.dtype)}
            for name, t in zip(built.output_names, built.outputs, strict=True)
        ],
        "loss": loss_name(built),
        "parameters": int(built.count_params()),
    }


def _unseeded(config: Any) -> Any:
    """A layer's config with every initializer's own seed removed, so that it draws from Keras' seed."""
    if isinstance(config, dict):
        inner = config.get("config")
        if config.get("module") == KERAS_INITIALIZERS_MODULE and isinstance(inner, dict) and "seed" in inner:
            return {**config, "config": {**inner, "seed": None}}
        return {key: _unseeded(value) for key, value in config.items()}
    if isinstance(config, list):
        return [_unseeded(value) for value in config]
    return config


def _fresh_layer(layer: keras.layers.Layer) -> keras.layers.Layer:
    return layer.__class__.from_config(_unseeded(layer.get_config()))


class OwnBuilder:
    """A user's model for a stability study, with ``registry.ModelSpec``'s ``name`` and ``build``.

    ``init`` must really vary: a saved model's weights would make every run start from the
    same point, and an initializer seeded in the saved config would draw the same weights
    whatever the run's seed. So every build of a saved model is a clone of its architecture,
    each initializer's own seed removed, initialised from the seed Keras was last given
    (``training.Trainer.reset`` sets it per run); ``keep_saved_weights`` starts every run
    from the saved weights instead. A factory is called afresh each time, as a registry
    builder is.
    """

    def __init__(self, model: OwnModel, keep_saved_weights: bool) -> None:
        self.model = model
        self.name = model.label
        self.keep_saved_weights = keep_saved_weights
        self._saved: keras.Model | None = None

    def build(self, input_shape: Sequence[int], classes: int) -> keras.Model:
        import keras

        if self.model.kind == "factory":
            return build(self.model, input_shape, classes)
        if self._saved is None:
            self._saved = load_saved(self.model)
        clone = keras.models.clone_model(self._saved, clone_function=_fresh_layer)
        if self.keep_saved_weights:
            clone.set_weights(self._saved.get_weights())
        return clone
