"""Your own model built inside a worker, whose Keras backend and determinism mode are already chosen.

A factory is imported from its file (its folder first on ``sys.path``, as Python runs a
script) or from its module (the folder it was named from, then ``PYTHONPATH``), and called
with ``(input_shape, classes)`` when it takes two arguments, else with none. A ``.keras``
file loads under whichever backend the worker runs, where Keras can, once the modules of
the custom classes its config names are imported (Keras imports only its own). Whatever
form the model takes (functional, Sequential with or without ``keras.Input``, subclassed),
``defined`` makes it a functional model with symbolic inputs and named outputs, which is
what everything downstream reads. For a stability study (``OwnBuilder``) a saved model is
its architecture: every build is a clone with freshly initialised weights, drawn from the
seed Keras was given, unless the saved weights are kept on purpose. Every problem is one
``UsageError`` line naming the spec, which ``worker_call.call_in_worker`` carries to the
parent as it is.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect as pyinspect
import json
import os
import sys
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detprof import backends
from detprof.determinism import DeterminismSettings, apply
from detprof.errors import UsageError, first_line
from detprof.models import kinds, registry
from detprof.models.npz_data import channels_first, probability_rows
from detprof.models.own import KERAS_API, KERAS_ARCHIVE_CONFIG, OwnModel, file_sha256, shape_text
from detprof.training import Training

if TYPE_CHECKING:
    import keras

KERAS_INITIALIZERS_MODULE = "keras.initializers"
KERAS_OWN_PACKAGES = frozenset({"keras", "keras_hub", "keras_cv", "keras_nlp", "builtins"})
"""Packages whose classes Keras finds itself when it loads a model (``serialization_lib``)."""
SCRIPT_MODULE = "__main__"
REGISTER = "@keras.saving.register_keras_serializable()"
PROBE_ROWS = 4
PROBE_FREE_SIZE = 32
"""The size a probe batch gives an axis the model leaves free (None)."""
KERAS_MODULES = ("keras", backends.TENSORFLOW)
"""What a model's inspection loads only once the model's code imports it (``_keras_when_asked``)."""
PROBABILITY_TOLERANCE = 1e-2
"""How far from 1 a row of probabilities may sum: float16 outputs round that much."""


def factory(model: OwnModel) -> Callable[..., Any]:
    """The function the spec names, its module imported (once per process); one line naming the install where it
    needs a model package that is missing (``registry.MODEL_PACKAGES``)."""
    try:
        module = _import(model)
    except Exception as exc:
        missing = (exc.name or "") if isinstance(exc, ModuleNotFoundError) else ""
        package = missing.partition(".")[0]
        if package in registry.MODEL_PACKAGES:
            raise UsageError(registry.not_installed(model.given, package)) from exc
        raise UsageError(f"{model.given}: importing {model.path or model.module} failed: {first_line(exc)}") from exc
    function = getattr(module, str(model.function), None)
    if not callable(function):
        own = [name for name, value in vars(module).items() if callable(value) and not name.startswith("_")]
        close = difflib.get_close_matches(str(model.function), own, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"{model.given}: {model.path or model.module} has no function {model.function!r}{hint}")
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
    """True for ``FUNCTION(input_shape, classes)``, False for ``FUNCTION()``; one line for anything else. A function
    that can be called either way (every argument has a default: a module's class, ``Net(vocab=64, width=32)``) takes
    them only where its first is named ``input_shape``: its own arguments mean something else."""
    try:
        signature = pyinspect.signature(function)
    except (TypeError, ValueError):
        return False
    binds = {arguments: _binds(signature, arguments) for arguments in ((None, None), ())}
    if binds[None, None] and binds[()]:
        return next(iter(signature.parameters), None) == "input_shape"
    if binds[None, None] or binds[()]:
        return binds[None, None]
    taken = f"no arguments or (input_shape, classes), not {signature}"
    raise UsageError(f"{given}: the function must take {taken}{_configured(function)}")


def _configured(function: Callable[..., Any]) -> str:
    """What to give instead of a Hugging Face model class, which takes its configuration: a function that builds it
    from one, as the registry's ``hf_*`` models are built."""
    config = getattr(function, "config_class", None)
    if not isinstance(function, type) or config is None:
        return ""
    return (
        f": a Hugging Face model class is built from its configuration; give a function of your own that returns "
        f"{function.__name__}({config.__name__}(...)) (or its from_pretrained of a folder here)"
    )


def _binds(signature: pyinspect.Signature, arguments: tuple[Any, ...]) -> bool:
    try:
        signature.bind(*arguments)
    except TypeError:
        return False
    return True


def build(model: OwnModel, input_shape: Sequence[int], classes: int) -> keras.Model:
    """The Keras model the spec names as a functional model (``defined``), built at ``input_shape`` where it fixes
    none."""
    given = as_given(model, input_shape, classes)
    kind = kinds.of_value(given)
    if kind is not None:
        raise UsageError(f"{model.given}: {kind.what}, which this command does not train yet")
    return defined(given, input_shape, model.given)


def as_given(model: OwnModel, input_shape: Sequence[int], classes: int) -> Any:
    """The model as the spec gives it: the factory's (called as it takes it: a Keras model, or a native module of a
    kind of ``kinds.NATIVE``, bare or with its loss and optimizer as ``detprof.Training``), or the saved one, loaded.
    Keras is what the factory loaded, if anything: a worker that trains a native module loads none of its own."""
    if model.kind == "saved":
        return load_saved(model)
    function = factory(model)
    try:
        built = function(tuple(input_shape), classes) if takes_arguments(function, model.given) else function()
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"{model.given}: building the model failed: {first_line(exc, with_type=True)}") from exc
    keras = sys.modules.get("keras")
    kind = kinds.of_value(built)
    if kind is not None:
        return kind.code().checked(built, model.given)
    if isinstance(built, Training):
        raise UsageError(
            f"{model.given}: detprof.Training holds a torch.nn.Module or a Flax module, not "
            f"{type(built.model).__name__} (a Keras model trains with the loss and optimizer it is compiled with)"
        )
    if isinstance(built, tuple | list) and built and kinds.of_value(built[0]) is not None:
        raise UsageError(
            f"{model.given}: {model.function} returned a {type(built).__name__} "
            f"({', '.join(type(value).__name__ for value in built)}): return the module alone, or with its loss "
            "and optimizer as detprof.Training(module, loss, optimizer)"
        )
    if not (keras is not None and isinstance(built, keras.Model)):
        raise UsageError(
            f"{model.given}: {model.function} returned {type(built).__name__}, not a keras.Model, a torch.nn.Module, "
            "a Flax module or a detprof.Training"
        )
    return built


def native_training(spec: Mapping[str, Any], seed: int, compiled: bool = False) -> Any:
    """The native module a workload spec names, built from ``seed`` (each arm of an in-process pair alike), trained
    as its kind's ``training`` sets it up (a PyTorch module through ``torch.compile`` where ``compiled``)."""
    kind = kinds.of_params(spec)
    assert kind is not None, "a workload of a Keras model"
    if kind is kinds.TORCH:
        import torch

        torch.manual_seed(seed)
    module = as_given(OwnModel.from_record(spec["own_model"]), spec["input_shape"], spec["classes"])
    return kind.code().training(module, spec, seed, compiled)


def load_saved(model: OwnModel) -> keras.Model:
    import keras

    import_custom_modules(Path(str(model.path)))
    try:
        return keras.saving.load_model(str(model.path))
    except Exception as exc:
        raise UsageError(
            f"{model.path}: Keras {keras.__version__} on {keras.backend.backend()} cannot load it "
            f"({first_line(exc, with_type=True)})"
        ) from exc


@dataclass(frozen=True)
class SavedObject:
    """A custom class or function a saved model's config names, as Keras serialized it."""

    module: str | None
    """None: defined in the script that saved the model (Keras writes ``__main__`` so)."""
    class_name: str
    registered_name: str
    """The key Keras looks it up by: ``package>Name`` once registered, else the bare name."""

    def __str__(self) -> str:
        if self.class_name == "function":
            return f"function {self.registered_name.rpartition('>')[2]}"
        return f"class {self.class_name}"


def import_custom_modules(path: Path) -> None:
    """Import the module of every custom class or function the saved config names, so that it registers itself.

    Keras imports only its own packages when it loads a model; a custom class (a subclassed
    model, a layer of your own) is found only when its module ran its
    ``register_keras_serializable`` decorator. The module is looked for as a factory's is: the
    ``.keras`` file's folder first, then the current one, then ``PYTHONPATH``.
    """
    import keras

    for saved in custom_objects_named(path):
        if keras.saving.get_registered_object(saved.registered_name) is not None:
            continue
        if saved.module in (None, SCRIPT_MODULE):
            raise UsageError(
                f"{path}: {saved} was defined in the script that saved the model (module {SCRIPT_MODULE}), which "
                f"cannot be imported: move it into a module of its own, decorate it with {REGISTER} and save again"
            )
        _put_first_on_path([str(path.parent), os.getcwd()])
        try:
            importlib.import_module(saved.module)
        except Exception as exc:
            reason = first_line(exc, with_type=True)
            raise UsageError(
                f"{path}: {saved} comes from module {saved.module}, which cannot be imported ({reason}): put its "
                "file beside the .keras file, in the current folder or on PYTHONPATH"
            ) from exc
        if keras.saving.get_registered_object(saved.registered_name) is None:
            raise UsageError(
                f"{path}: {saved} of module {saved.module} is not registered with Keras: decorate it with {REGISTER} "
                "and save the model again"
            )


def custom_objects_named(path: Path) -> list[SavedObject]:
    """The custom objects (outside Keras' own packages) a ``.keras`` file's config names, each once.

    An archive whose config cannot be read names none here: ``keras.saving.load_model`` says what is wrong with it.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read(KERAS_ARCHIVE_CONFIG))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return []
    named = dict.fromkeys(_serialized_objects(config))
    return [s for s in named if s.module is None or s.module.split(".")[0] not in KERAS_OWN_PACKAGES]


def _serialized_objects(config: Any) -> Iterator[SavedObject]:
    """Every object of a config that Keras looks up by a registered name (Keras' own public ones have none)."""
    if isinstance(config, dict):
        module, class_name, registered = (config.get(k) for k in ("module", "class_name", "registered_name"))
        named = isinstance(class_name, str) and isinstance(registered, str)
        if named and "module" in config and isinstance(module, str | None):
            yield SavedObject(module, str(class_name), str(registered))
        for value in config.values():
            yield from _serialized_objects(value)
    elif isinstance(config, list):
        for value in config:
            yield from _serialized_objects(value)


def _put_first_on_path(folders: Sequence[str]) -> None:
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)


def defined(model: keras.Model, input_shape: Sequence[int], given: str) -> keras.Model:
    """``model`` as a functional model of the same layers and weights: symbolic inputs and outputs, outputs by name.

    detprof reads a model's inputs and outputs before it trains it (the batch it takes, the
    data that fits it, the stability study's features), which only a functional model has
    for every form. A Sequential becomes the functional model of its layers, built at
    ``input_shape`` when it starts without ``keras.Input``; a subclassed model, whose
    ``call`` no graph describes, is called on ``keras.Input`` at the shape it was built at,
    else at ``input_shape``. A compiled model's loss, loss weights and optimizer carry over.
    """
    import keras

    if is_functional(model):
        return model
    built_at = _built_shape(model)
    try:
        if isinstance(model, keras.Sequential):
            if not model.built:
                model.build((None, *input_shape))
            functional = keras.Model(model.inputs[0], model.outputs[0], name=model.name)
        else:
            shape = built_at or (None, *input_shape)
            inputs = keras.tree.map_shape_structure(lambda s: keras.Input(batch_shape=(None, *s[1:])), shape)
            functional = keras.Model(inputs, model(inputs), name=model.name)
    except Exception as exc:
        at = "the input shape it was built at" if built_at else f"{shape_text(input_shape)} inputs"
        raise UsageError(
            f"{given}: {type(model).__name__} cannot be built for {at} ({first_line(exc, with_type=True)}): start "
            "it with keras.Input(shape=...), or give the sweep the --input-shape it takes"
        ) from exc
    if getattr(model, "compiled", False):
        loss_weights = model.get_compile_config().get("loss_weights")
        functional.compile(optimizer=model.optimizer, loss=model.loss, loss_weights=loss_weights)
    return functional


def is_functional(model: keras.Model) -> bool:
    """A functional model (Keras keeps its class private): the one kind with its outputs' names."""
    import keras

    return not isinstance(model, keras.Sequential) and hasattr(model, "output_names")


def fixes_input_shape(model: keras.Model) -> bool:
    """Whether ``model`` has an input shape of its own: not a Sequential without an Input, nor an unbuilt subclass."""
    return is_functional(model) or _built_shape(model) is not None


def _built_shape(model: keras.Model) -> Any:
    """The input shape (batch axis first) a model was built at: one shape, or their nest; None if it is unbuilt."""
    config = model.get_build_config() if model.built else None
    return None if not config else config.get("input_shape")


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


def outputs_probabilities(model: keras.Model) -> bool:
    """Whether the model's (first) output is a probability per class, which its loss must know, or logits.

    Read off what the model outputs, not off its last layer: the softmax may be a layer's
    activation, an ``Activation`` or ``Softmax`` layer, or ``keras.ops.softmax`` inside a
    subclassed model's ``call``. Probabilities are non-negative and sum to 1 over the last
    axis, row by row, for any input; logits of a random probe batch never all do.
    """
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    probe = [_probe_array(t, rng) for t in model.inputs]
    outputs = model(probe[0] if len(probe) == 1 else probe, training=False)
    first = keras.ops.convert_to_numpy(keras.tree.flatten(outputs)[0]).astype(np.float64)
    if first.ndim < 2 or first.shape[-1] < 2:
        return False
    return probability_rows(first, atol=PROBABILITY_TOLERANCE)


def _probe_array(tensor: keras.KerasTensor, rng: Any) -> Any:
    """A small batch for ``tensor``: normal values for a float input, zeros for another (token ids, flags)."""
    import numpy as np

    shape = (PROBE_ROWS, *(PROBE_FREE_SIZE if d is None else d for d in tensor.shape[1:]))
    dtype = np.dtype(str(tensor.dtype))
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def inspect(
    models: list[dict[str, Any]],
    backend: str,
    input_shape: list[int],
    classes: int,
    shape_given: bool = False,
    sizes: Mapping[str, list[Any]] | None = None,
    fed: str | None = None,
    images_last: bool = False,
    amp: str | None = None,
) -> list[dict[str, Any]]:
    """``call_in_worker``'s entry: each model loaded once, and what the parent needs of it (at its own shape and
    classes where ``sizes`` gives them: ``own.inspect_with``); Keras on ``backend`` where a model asks for it.
    ``fed``: what to give a module whose call fails on its batch, where that is not ``--input-shape``. ``amp``:
    ``--amp``, in which a native module that trains in mixed precision takes one step first."""
    answers = []
    for record in models:
        model = OwnModel.from_record(record)
        own_size = (sizes or {}).get(model.given)
        if own_size is None:
            described = partial(describe, model, input_shape, classes, shape_given, images_last, amp)
        else:
            described = partial(describe, model, own_size[0], int(own_size[1]), shape_given=True, amp=amp)
        try:
            answers.append(_keras_when_asked(backend, described))
        except kinds.CallFailed as exc:
            if fed is None:
                raise
            raise exc.instead(fed) from exc
    return answers


def _keras_when_asked(backend: str, described: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``described()`` with Keras and TensorFlow held back until the model's code imports them, then loaded on
    ``backend`` in default mode (``determinism.apply``) and ``described()`` again. Without ``--backend`` the parent
    names the installed default, TensorFlow: a PyTorch or Flax module's inspection would load it and Keras (6-7 s
    here) only to find a module that needs neither."""
    if "keras" in sys.modules:
        return described()
    held = backends.HeldBack(KERAS_MODULES)
    sys.meta_path.insert(0, held)
    try:
        answer = described()
    except (backends.Asked, UsageError):
        if not held.asked:
            raise
    finally:
        sys.meta_path.remove(held)
    if not held.asked:
        return answer
    apply(DeterminismSettings("default", backend=backend))  # type: ignore[arg-type]
    return described()


def describe(
    model: OwnModel,
    input_shape: Sequence[int],
    classes: int,
    shape_given: bool = False,
    images_last: bool = False,
    amp: str | None = None,
) -> dict[str, Any]:
    """The model built once, as JSON: its kind, its file and hash, whether it is built at the input shape given, its
    inputs, outputs, loss and size. ``images_last``: ``input_shape`` is images stored HxWxC, given to a kind that
    takes its channels first moved so (as its batches are fed). ``amp``: a native module that trains in mixed
    precision takes a step in it, refused in one line where that fails."""
    original = as_given(model, input_shape, classes)
    takes = model.kind == "factory" and takes_arguments(factory(model), model.given)
    path = model.path or str(getattr(sys.modules.get(str(model.module)), "__file__", "") or "")
    source = {"path": path or None, "sha256": model.sha256 or (file_sha256(path) if path else None)}
    kind = kinds.of_value(original)
    if kind is not None:
        code = kind.code()
        asked = channels_first(tuple(input_shape)) if images_last and kind.channels_first else input_shape
        shape = code.input_shape(code.module_of(original), asked, shape_given, model.given)
        given = as_given(model, shape, classes) if takes and shape != tuple(input_shape) else original
        answer = code.described(code.module_of(given), shape, model.given)
        probe = {"model": model.label, "input_shape": list(shape), "batch_size": code.PROBE_ROWS, "classes": classes}
        training = code.training(given, probe, 0)
        code.scalar_loss(training, model.given)
        if amp is not None and kind.amp_refused is None:
            code.refuse_failing_amp(training, amp, model.given)
        # A PyTorch module's loss may take targets, not class ids; its forward may run only given its labels; its
        # logits may score the classes first.
        found = {name: bool(getattr(training, name, False)) for name in ("targets", "needs_labels", "classes_first")}
        return source | answer | {"nondeterministic_ops": _first_step(code, training, model.given)} | found
    built_at_input_shape = takes or not fixes_input_shape(original)
    built = defined(original, input_shape, model.given)
    return source | {
        "api": KERAS_API,
        "built_at_input_shape": built_at_input_shape,
        "inputs": [{"name": t.name, "shape": list(t.shape[1:]), "dtype": str(t.dtype)} for t in built.inputs],
        "outputs": [
            {"name": name, "shape": list(t.shape[1:]), "dtype": str(t.dtype)}
            for name, t in zip(built.output_names, built.outputs, strict=True)
        ],
        "loss": loss_name(built),
        "parameters": int(built.count_params()),
    }


def _first_step(code: Any, training: Any, given: str) -> list[dict[str, Any]]:
    """The ops without a deterministic implementation that the model's first training step calls; one line where that
    step fails (AdamW on an embedding's sparse gradients), saying what it trained with and how to change that."""
    try:
        return list(code.nondeterministic_ops(training))
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(
            f"{given}: its first training step failed ({first_line(exc, with_type=True)}); a model trains with "
            "AdamW and its own or a cross-entropy loss unless its function returns detprof.Training(model, loss, "
            "optimizer) with those your loop uses"
        ) from exc


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
            self._saved = build(self.model, input_shape, classes)
        clone = keras.models.clone_model(self._saved, clone_function=_fresh_layer)
        if self.keep_saved_weights:
            clone.set_weights(self._saved.get_weights())
        return clone
