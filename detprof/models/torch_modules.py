"""Native PyTorch modules (``torch.nn.Module``) as a kind of model: how a worker looks at one, feeds it and trains it.

Most people who pay for determinism train PyTorch modules of their own, not Keras models. A
function that returns a module (``FILE.py:FUNCTION``, ``package.module:FUNCTION``) is that model,
trained as users train one: the module in training mode, called on a batch it takes as it is
(channels first for images, token ids where its input goes into an embedding), cross-entropy
on its logits (every position's, for a language model) and AdamW, or the loss and optimizer it
returned with it (``detprof.Training``), or the loss it computes itself given the labels (a Hugging
Face model's), ``backward`` and ``step``: eagerly, or through ``torch.compile`` (``--compile``),
in mixed precision under ``--amp``. Its submodules are the leaderboard's rows by their paths
(``named_modules``), the loss and the optimizer's update rows of their own
(``backends.torch.mark_native``). Runs in workers only: torch is imported where it is used.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from detprof import backends
from detprof.backends.base import OPTIMIZER_PART, Step
from detprof.errors import UsageError, first_line
from detprof.findings import OP_PATTERNS
from detprof.models.kinds import (
    PROBABILITIES_LOSS,
    TORCH,
    call_failed,
    classes_first,
    classes_in,
    labels_shape,
    refuse_more_inputs,
)
from detprof.models.npz_data import channels_first, probability_rows
from detprof.training import Training

TOKENS = 32
"""The sequence length a module that takes token ids is fed, unless ``--input-shape`` gives one."""
LEARNING_RATE = 1e-3
PROBE_ROWS = 2
"""The rows of the batch a module is first called on, in the parent's inspection."""
COMPILER = "inductor"
"""``torch.compile``'s back end under ``--compile``: its default, as users compile."""
AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}
"""What ``--amp`` takes (``workloads.AMP_POLICIES``), each with the dtype ``torch.autocast`` runs a module's forward
pass and loss in; float16's loss is scaled (``torch.amp.GradScaler``), as users train in it."""
SCALED = AUTOCAST["fp16"]


def is_module(value: Any) -> bool:
    """Whether ``value`` is a native ``torch.nn.Module`` (torch is loaded wherever a function returned one); not a
    Keras model, which on PyTorch is a module too."""
    torch, keras = sys.modules.get(backends.get(backends.TORCH).module), sys.modules.get("keras")
    native = torch is not None and isinstance(value, torch.nn.Module)
    return native and not (keras is not None and isinstance(value, keras.layers.Layer))


def is_native(value: Any) -> bool:
    """A native module, bare or with its loss and optimizer (``detprof.Training``)."""
    return is_module(value) or (isinstance(value, Training) and is_module(value.model))


def checked(value: Any, spec: str) -> Any:
    """``value`` as a model function returned it (a bare module, or ``detprof.Training``), one line where it is not
    what ``detprof.Training`` holds for a module: a callable loss, an optimizer over that module's parameters; or
    where the module is one ``torch.compile`` made, which would carry what it compiled from one mode to the other, or
    TorchScript (``torch.jit.script``), whose submodules take no hooks: none of its modules could be timed or
    compared."""
    import torch

    if isinstance(getattr(module_of(value), "_orig_mod", None), torch.nn.Module):
        raise UsageError(
            f"{spec}: the function returns a module compiled by torch.compile: return the module itself, and add "
            "--compile to train it compiled (each mode in a process of its own, so that neither reuses what the other "
            "compiled)"
        )
    if isinstance(module_of(value), torch.jit.ScriptModule):
        raise UsageError(
            f"{spec}: the function returns a TorchScript module (torch.jit.script or trace), whose submodules take no "
            "hooks, so none could be timed or compared: return the module before scripting it (add --compile to "
            "train it compiled)"
        )
    if not isinstance(value, Training):
        return value
    if value.example is not None:
        raise UsageError(f"{spec}: detprof.Training's example is a Linen module's; a torch.nn.Module takes none")
    if value.loss is not None and not callable(value.loss):
        raise UsageError(f"{spec}: detprof.Training's loss is {type(value.loss).__name__}, not a callable")
    if value.optimizer is not None:
        if not isinstance(value.optimizer, torch.optim.Optimizer):
            raise UsageError(
                f"{spec}: detprof.Training's optimizer is {type(value.optimizer).__name__}, not one of torch.optim's"
            )
        own = {id(p) for p in value.model.parameters()}
        if not any(id(p) in own for group in value.optimizer.param_groups for p in group["params"]):
            raise UsageError(
                f"{spec}: detprof.Training's optimizer updates none of the module's parameters: make it in the "
                "function, over model.parameters()"
            )
    return value


def module_of(value: Any) -> Any:
    """The module of what a model function returned (a bare module, or ``detprof.Training``'s)."""
    return value.model if isinstance(value, Training) else value


def takes_tokens(module: Any) -> bool:
    """A module whose input goes into an embedding takes token ids (``input_embedding``)."""
    return input_embedding(module) is not None


class _Reached(Exception):
    """Stops a probe's forward at the first submodule that its input reaches (``input_embedding``)."""

    def __init__(self, module: Any) -> None:
        super().__init__()
        self.module = module


def input_embedding(module: Any) -> Any | None:
    """The ``nn.Embedding`` (or ``nn.EmbeddingBag``) that the module's input goes into, or None where it goes into
    no embedding.

    The module is called on token ids and stopped at the first submodule they reach, before that runs, so nothing
    is computed past what precedes it in ``forward``: an image model's table of learned queries or positions is an
    embedding its input never enters, and a norm declared before the embedding is not what the ids reach first. A
    module whose input reaches no submodule as it was given (a copy, a slice) is read by its first submodule, as
    Hugging Face's models and most others register the embedding that takes their ids."""
    import torch

    leaves = _leaves(module)
    tables = (torch.nn.Embedding, torch.nn.EmbeddingBag)  # a bag of words (the text-classification tutorial's)
    if not any(isinstance(m, tables) for m in leaves):
        return None
    parameter = next(module.parameters(), None)
    ids = torch.zeros((PROBE_ROWS, TOKENS), dtype=torch.long, device=None if parameter is None else parameter.device)
    reached = _first_reached(module, leaves, ids) or leaves[0]
    return reached if isinstance(reached, tables) else None


def _leaves(module: Any) -> list[Any]:
    """The module's submodules that hold no others, in the order ``named_modules`` lists them."""
    return [m for _, m in module.named_modules() if not list(m.children())]


def _first_reached(module: Any, leaves: Sequence[Any], probe: Any) -> Any | None:
    """The first of ``leaves`` that the module's forward hands its input (``probe``, as it was given, or a view of
    it) to, stopped before that runs."""
    import torch

    def stop(leaf: Any, args: tuple[Any, ...]) -> None:
        if args and isinstance(args[0], torch.Tensor) and args[0].data_ptr() == probe.data_ptr():
            raise _Reached(leaf)

    hooks = [leaf.register_forward_pre_hook(stop) for leaf in leaves]
    try:
        with _inference(module):
            module(probe)
    except _Reached as reached:
        return reached.module
    except Exception:
        return None
    finally:
        for hook in hooks:
            hook.remove()
    return None


@contextlib.contextmanager
def _inference(module: Any) -> Iterator[None]:
    """While inside: the module in inference mode (no dropout drawn, no running statistics updated), no gradient
    kept; then in the mode it was in."""
    import torch

    training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(training)


def input_shape(module: Any, shape: Sequence[int], given: bool, spec: str) -> tuple[int, ...]:
    """The shape of one example as ``module`` takes it: ``--input-shape`` as given (the module's own layout, e.g.
    3x224x224), else the images the study would build a Keras model for (HxWxC) with their channels first; where it
    takes tokens, a sequence of ``TOKENS`` ids, or of the length a study's sequences have (a shape of one axis)."""
    if takes_tokens(module):
        if given and len(shape) != 1:
            raise UsageError(f"{spec}: the module takes token ids: --input-shape is their length (like 64)")
        return tuple(shape) if given or len(shape) == 1 else (TOKENS,)
    return tuple(shape) if given else channels_first(tuple(shape))


def _what_it_takes(module: Any, probe: Any) -> str:
    """The ``--input-shape`` to ask of a module that failed on ``probe`` (floating inputs): what its configuration or
    its first layer says it takes, else its own layout."""
    fitted = probe.is_floating_point() and (configured_images(module) or first_layer_takes(module, probe))
    return fitted or "its own layout, like 3x224x224"


def configured_images(module: Any) -> str | None:
    """The images a module's configuration says it takes (a Hugging Face vision model's ``image_size`` and
    ``num_channels``), as ``--input-shape``, with why; None where it says none."""
    config = getattr(module, "config", None)
    size, channels = getattr(config, "image_size", None), getattr(config, "num_channels", None)
    sides = [size, size] if isinstance(size, int) else list(size) if isinstance(size, list | tuple) else []
    if not isinstance(channels, int) or len(sides) != 2 or not all(isinstance(d, int) for d in sides):
        return None
    return f"{channels}x{sides[0]}x{sides[1]}: its configuration's num_channels and image_size"


def first_layer_takes(module: Any, probe: Any) -> str | None:
    """What the layer the module hands its input (``probe``) to first takes, where that is not ``probe``'s shape:
    a linear layer's features (an MLP's vector of them), a Conv1d's or Conv2d's channels (a grayscale image's one, a
    signal's), the length or height and width kept: the ``--input-shape`` to give, with why. None where that layer
    takes it, is of another kind (a ``Flatten``, a norm) or takes what it first sees (a lazy one), or where the
    input reaches no layer as it was given."""
    import torch

    shape = tuple(int(d) for d in probe.shape[1:])
    first = _first_reached(module, _leaves(module), probe)
    fitted: tuple[int, ...] = shape
    if isinstance(first, torch.nn.Linear) and first.in_features != 0:
        fitted, what = (int(first.in_features),), f"{first.in_features} features"
    convolutions = {torch.nn.Conv1d: shape[-1:], torch.nn.Conv2d: shape[-2:]}
    kept = next((kept for kind, kept in convolutions.items() if isinstance(first, kind)), None)
    if kept is not None and first.in_channels != 0 and len(kept) < len(shape):
        fitted, what = (int(first.in_channels), *kept), f"{first.in_channels} channel{'s' * (first.in_channels > 1)}"
    if fitted == shape:
        return None
    return f"{'x'.join(map(str, fitted))}: its first layer, a {type(first).__name__}, takes {what}"


def logits_of(output: Any) -> Any:
    """The module's logits: its output, its ``logits`` (a Hugging Face model's output), a dict's ``out`` (a
    torchvision segmentation model's, beside its ``aux``), or its first output."""
    logits = output.get("logits", output.get("out")) if isinstance(output, Mapping) else getattr(output, "logits", None)
    if logits is not None:
        return logits
    if isinstance(output, tuple | list):
        return output[0]
    return output


def loss_in(output: Any) -> Any:
    """The loss a module returned beside its logits, given the labels: its output's ``loss`` (a Hugging Face
    model's, or a dict's), or the one scalar among its outputs (nanoGPT's ``(logits, loss)``); None: none."""
    import torch

    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if loss is None and isinstance(output, tuple | list):
        scalars = [o for o in output if isinstance(o, torch.Tensor) and o.ndim == 0]
        loss = scalars[0] if len(scalars) == 1 else None
    return loss if isinstance(loss, torch.Tensor) and loss.ndim == 0 and loss.dtype.is_floating_point else None


def _device() -> Any:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def synthetic_inputs(module: Any, shape: Sequence[int], rows: int, seed: int) -> Any:
    """Normal inputs in the module's dtype (``input_dtype``), or uniform ids under the embedding's vocabulary where
    the module takes tokens, on the device."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    table = input_embedding(module)
    if table is not None:
        x = torch.randint(0, int(table.num_embeddings), (rows, *shape), generator=generator)
    else:
        x = torch.randn((rows, *shape), generator=generator).to(input_dtype(module))
    return x.to(_device())


def input_dtype(module: Any) -> Any:
    """The dtype a module's floating inputs are given in: its weights' (a module cast to bfloat16 as a whole is fed
    bfloat16, as its loop feeds it), float32 where it has none."""
    import torch

    floating = (p.dtype for p in module.parameters() if p.dtype.is_floating_point)
    return next(floating, torch.float32)


def probe_logits(module: Any, x: Any) -> Any:
    """The module's logits for ``x`` in inference mode (``probed``)."""
    return probed(module, x).logits


class Probe(NamedTuple):
    """What one call of a module in inference mode showed (``probed``)."""

    logits: Any
    needs_labels: bool
    """It ran only given its labels (an encoder-decoder such as T5, which builds its decoder's input from them)."""
    head: bool | None
    """Where the layer that made the logits put their classes (``kinds.classes_first``): first for a convolution's,
    last for a linear layer's; None where no such layer's output is the logits as returned."""


def probed(module: Any, x: Any) -> Probe:
    """The module's logits for ``x`` in inference mode (``_inference``), whether it ran only given its labels
    (zeros, as token ids take them), which it takes (``LABEL_KEYWORDS``), as its loop trains it, and the layer that
    made them (``Probe.head``)."""
    import torch

    with _inference(module), _outputs_made(module) as made:
        try:
            logits, needs_labels = logits_of(module(x)), False
        except Exception:
            keyword = _labels_keyword(module)
            if keyword is None or x.is_floating_point():
                raise
            logits, needs_labels = logits_of(module(x, **{keyword: torch.zeros_like(x)})), True
    return Probe(logits, needs_labels, _head(next((sub for ref, sub in made if ref() is logits), None)))


@contextlib.contextmanager
def _outputs_made(module: Any) -> Iterator[list[tuple[weakref.ref[Any], Any]]]:
    """While inside: each tensor a module or submodule returns (held weakly), with the module, innermost first."""
    import torch

    made: list[tuple[weakref.ref[Any], Any]] = []

    def keep(sub: Any, args: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            made.append((weakref.ref(output), sub))

    hooks = [sub.register_forward_hook(keep) for sub in module.modules()]
    try:
        yield made
    finally:
        for hook in hooks:
            hook.remove()


def _head(layer: Any) -> bool | None:
    """Where ``layer``'s outputs hold their classes, as scores: a convolution's on their channels, first; a linear
    layer's last; None for any other (``Probe.head``)."""
    import torch

    convolutions = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    transposed = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)
    if isinstance(layer, convolutions + transposed):
        return True
    if isinstance(layer, (torch.nn.Linear, torch.nn.Bilinear)):
        return False
    return None


def _labels_keyword(module: Any) -> str | None:
    import inspect

    parameters = inspect.signature(module.forward).parameters
    return next((k for k in LABEL_KEYWORDS if k in parameters), None)


def described(module: Any, shape: tuple[int, ...], spec: str) -> dict[str, Any]:
    """What the parent needs of a module: its input and output, per example, and its size; one line when its
    forward fails on a batch of that input."""
    import torch

    refuse_more_inputs(spec, module.forward, "forward")
    probe = synthetic_inputs(module.to(_device()), shape, PROBE_ROWS, 0)
    try:
        output = probe_logits(module, probe)
    except Exception as exc:
        taking = "token ids" if takes_tokens(module) else f"{_dtype(probe)} inputs"
        raise call_failed(spec, "forward", shape, taking, exc, _what_it_takes(module, probe)) from exc
    if not isinstance(output, torch.Tensor) or output.ndim < 2 or not output.dtype.is_floating_point:
        shape = f" of shape {tuple(output.shape)}" if isinstance(output, torch.Tensor) else ""
        raise UsageError(
            f"{spec}: the module returned {type(output).__name__}{shape}, not logits (a tensor of scores, one row per "
            f"example: a binary classifier keeps its last axis, (batch, 1)){_headless(output, module)}"
        )
    size = sum(p.numel() for p in module.parameters())
    return TORCH.described(shape, _dtype(probe), output.shape[1:], _dtype(output), size)


def _headless(output: Any, module: Any) -> str:
    """What to give instead of a model whose output names its fields but no logits: a Hugging Face base model's
    (``BertModel``'s ``last_hidden_state``), which the same model with a task head scores."""
    if not isinstance(output, Mapping) or not output:
        return ""
    return (
        f"; it holds {', '.join(str(k) for k in output)}, no logits: give the model with a task head (a "
        f"...ForSequenceClassification or ...ForCausalLM class, not {type(module).__name__}), or a module that "
        "returns scores"
    )


def _dtype(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


@dataclass
class ModuleTraining:
    """A module, its batch, its loss and optimizer, on the device, in training mode."""

    module: Any
    x: Any
    y: Any
    loss: Any
    """A module of ``(logits, labels)``: the user's loss (``detprof.Training``), else cross-entropy over every row of
    the logits (``loss_modules``)."""
    optimizer: Any
    logits_shape: tuple[int, ...]
    """The module's logits per example (``(classes,)``, ``(length, vocabulary)`` for a language model, ``(classes,
    height, width)`` for a segmentation model: ``kinds.classes_first``)."""
    loss_name: str = "cross-entropy"
    autocast: str | None = None
    """The dtype the forward pass and the loss run in under ``torch.autocast`` (``--amp``); None: the module's own."""
    forward: Any = None
    """What the step calls the module through: ``torch.compile``'s module under ``--compile``, else the module."""
    scaler: Any = None
    """``torch.amp.GradScaler`` under float16 autocast: the loss scaled before ``backward``, the gradients unscaled
    (and the step skipped where they overflowed) by the optimizer's step."""
    own_loss: bool = False
    """The module computes its own loss given the labels (``labels_keyword``) and trains on it: ``loss`` is then
    only the range around it (``own_loss_ranged``), None where none could be put."""
    targets: bool = False
    """The loss takes targets of 0 and 1 shaped as the logits, not class ids (``takes_targets``): each batch drawn
    for it (``batch``) holds them."""
    labels_keyword: str | None = None
    """The keyword ``forward`` takes the labels by where they are passed (``own_loss_call``): for its own loss, for
    logits of every position, which nanoGPT scores only given its ``targets``, or to run at all (``probed``)."""
    needs_labels: bool = False
    """Its forward runs only given the labels (an encoder-decoder: ``probed``), so it predicts nothing from its input
    alone."""
    classes_first: bool = False
    """Its logits score the classes on their first axis, not their last (``kinds.classes_first``)."""
    probabilities: bool = False
    """Its output is a probability per class, not logits (it ends in a softmax: ``scores_probabilities``), which the
    default cross-entropy takes so."""

    @property
    def classes(self) -> int:
        return classes_in(self.logits_shape, self.classes_first)

    def classes_last(self, logits: Any) -> Any:
        """A batch's ``logits`` with their classes on the last axis, where a line's or a grid's come classes first
        (``kinds.classes_first``): as a stability study reads its predictions."""
        return logits.movedim(1, -1) if self.classes_first else logits

    def step(self) -> Step:
        """One eager training step on the batch, run to completion (the device synchronised at its end)."""
        import torch

        x, y = self.x, self.y
        synchronize = torch.cuda.synchronize if x.is_cuda else (lambda: None)

        def step() -> None:
            self.train_on(x, y)
            synchronize()

        return step

    def train_on(self, x: Any, y: Any) -> tuple[Any, Any]:
        """Forward, the loss, backward, the optimizer's step: as users train. Returns the loss and the logits, off
        the graph."""
        self.optimizer.zero_grad(set_to_none=True)
        logits, loss = self.logits_and_loss(x, y)
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return loss.detach(), logits.detach()

    def loss_of(self, x: Any, y: Any) -> Any:
        return self.logits_and_loss(x, y)[1]

    def logits_and_loss(self, x: Any, y: Any) -> tuple[Any, Any]:
        """The forward pass and the loss of its logits (under autocast with ``--amp``, as users write it: the
        backward pass and the optimizer's step outside it)."""
        import torch

        dtype = getattr(torch, self.autocast or "float32")
        forward = self.module if self.forward is None else self.forward
        with torch.autocast(x.device.type, dtype=dtype, enabled=self.autocast is not None):
            output = forward(x, **self.labels_given(y))
            if self.own_loss:
                return logits_of(output), loss_in(output)
            logits = logits_of(output)
            return logits, self.loss(logits, y)

    def labels_given(self, y: Any) -> dict[str, Any]:
        """What ``forward`` is given beside the input: the labels by their keyword where they are passed."""
        return {} if self.labels_keyword is None else {self.labels_keyword: y}

    def logits(self, x: Any) -> Any:
        """The module's logits for ``x`` as the step scores them: where only labels make it score every position
        (nanoGPT), given placeholder labels (zeros, shaped as the ids), whose loss is not read."""
        import torch

        return logits_of(self.module(x, **self.labels_given(torch.zeros_like(x) if self.labels_keyword else None)))

    @property
    def dtype_policy(self) -> str:
        """What the record says the module trained in: its weights' dtype, and autocast's where it ran under it."""
        weights = str(next(self.module.parameters()).dtype).removeprefix("torch.")
        if self.autocast is None:
            return weights
        return f"{weights} weights, {self.autocast} autocast" + (", loss scaled" if self.scaler is not None else "")

    @property
    def how(self) -> str:
        return "eager PyTorch" if self.forward is None else f"torch.compile ({COMPILER})"

    def facts(self) -> dict[str, Any]:
        """What the run's record keeps of the model (``profiler.workloads._facts`` for a Keras model); what compiling
        it makes, once its step has run, is the backend's (``Backend.compiled_facts``). Its labels' shape where they
        are class ids (not a binary classifier's targets)."""
        labels = {} if self.targets else {"labels_shape": [int(d) for d in self.y.shape[1:]]}
        return labels | {
            "model_api": TORCH.api,
            "parameters": sum(p.numel() for p in self.module.parameters()),
            "train_step": f"{self.how}: forward, {self.loss_name}, backward, {type(self.optimizer).__name__}.step",
            "dtype_policy": self.dtype_policy,
            "layer_names": module_paths(self.module),
            "step_scopes": {},
            "input_shape": [int(d) for d in self.x.shape[1:]],
            "input_dtype": _dtype(self.x),
            "classes": self.classes,
        }


def module_paths(module: Any) -> list[str]:
    """Every submodule's path, in the order ``named_modules`` lists them (the module itself has none)."""
    return [path for path, _ in module.named_modules() if path]


def batch(
    module: Any,
    spec: Mapping[str, Any],
    seed: int,
    logits_shape: Sequence[int],
    targets: bool = False,
    first: bool = False,
) -> tuple[Any, Any]:
    """The spec's batch on the device: ``--data``'s leading rows, else one drawn from ``seed`` (inputs as
    ``synthetic_inputs``, a uniform label per row of the module's logits, ``logits_shape``, under the classes they
    score, on their ``first`` axis or their last (``kinds.labels_shape``); or, where the loss takes ``targets``, a 0
    or 1 per score)."""
    import torch

    shape, rows = tuple(spec["input_shape"]), int(spec["batch_size"])
    feed = spec.get("data")
    if feed is not None:
        from detprof.models.npz_data import module_batch

        x, y = (torch.from_numpy(a) for a in module_batch(feed, shape, rows, takes_tokens(module)))
        x = x.to(input_dtype(module)) if x.is_floating_point() else x
        return x.to(_device()), y.to(_device())
    x = synthetic_inputs(module, shape, rows, seed)
    if targets:
        return x, synthetic_targets((rows, *logits_shape), seed, x.device)
    generator = torch.Generator().manual_seed(seed + 1)
    classes = classes_in(logits_shape, first)
    y = torch.randint(0, classes, (rows, *labels_shape(logits_shape, first)), generator=generator)
    return x, y.to(x.device)


def training(
    given: Any,
    spec: Mapping[str, Any],
    seed: int,
    compiled: bool = False,
    learning_rate: float = LEARNING_RATE,
    own_loss: bool = True,
) -> ModuleTraining:
    """The module a model function returned (``given``: bare, or ``detprof.Training``) on the device, in training
    mode, with its batch (``batch``), its loss and optimizer (else cross-entropy and AdamW), its parts marked for
    the tracer's ranges (``backends.torch.mark_native``). The module is called once first, on one example, for the
    shape of its logits. The optimizer is made after the module moved to the device, as users make it. ``compiled``
    (``--compile``): the step calls the module through ``torch.compile``, as ``model = torch.compile(model)`` does
    in a user's loop; the loss and the optimizer's step stay eager around it. Without a loss given, a module that
    computes its own given the labels (a Hugging Face model, nanoGPT) trains on it, unless ``own_loss`` is off (a
    stability study's protocol: cross-entropy on the logits, its labels already the next tokens; a module that scores
    every position only given its labels is still given them)."""
    import torch

    from detprof.backends.torch import compiled as compiled_module
    from detprof.backends.torch import mark_native

    module = module_of(given).to(_device()).train()
    example = synthetic_inputs(module, tuple(spec["input_shape"]), 1, seed)
    probe = probed(module, example)
    logits_shape = tuple(int(d) for d in probe.logits.shape[1:])
    chosen = given if isinstance(given, Training) else Training(module)
    flat_cross_entropy, loss_of = loss_modules()
    first = classes_first(logits_shape, TORCH.api, positions_of(example), probe.head)
    call = own_loss_call(module, example, logits_shape, first)
    own = own_loss and chosen.loss is None and call is not None
    keyword = None
    if call is not None and (own or call[1] != logits_shape or probe.needs_labels):
        keyword, logits_shape = call  # given its labels, a language model may score every position, not the last
        first = classes_first(logits_shape, TORCH.api, positions_of(example), probe.head)
    targets = chosen.loss is not None and takes_targets(chosen.loss, probe.logits, seed, first)
    x, y = batch(module, spec, seed, logits_shape, targets, first)
    probabilities = not own and chosen.loss is None and scores_probabilities(probe.logits, first)
    if own:
        ranged = _calls_loss_function(module)
        name = f"its own loss ({_name(module.loss_function)})" if ranged else "its own loss"
        loss = None if compiled or not ranged else own_loss_ranged(module)
    else:
        loss = flat_cross_entropy(first, probabilities) if chosen.loss is None else chosen.loss
        loss = loss if isinstance(loss, torch.nn.Module) else loss_of(loss)
        name = PROBABILITIES_LOSS if probabilities else "cross-entropy" if chosen.loss is None else _name(chosen.loss)
    optimizer = chosen.optimizer
    if optimizer is None:
        optimizer = torch.optim.AdamW(module.parameters(), lr=learning_rate)
    forward = compiled_module(module, COMPILER) if compiled else None
    mark_native(module, loss, optimizer, forward)
    autocast = AUTOCAST[spec["amp"]] if spec.get("amp") else None
    scaler = torch.amp.GradScaler(_device().type) if autocast == SCALED else None
    return ModuleTraining(
        module,
        x,
        y,
        loss,
        optimizer,
        logits_shape,
        name,
        autocast,
        forward,
        scaler,
        own,
        targets,
        keyword,
        probe.needs_labels,
        first,
        probabilities,
    )


def scores_probabilities(logits: Any, first: bool) -> bool:
    """Whether a module's output for a probe batch (``probed``) is a probability per class, non-negative and summing
    to 1 over its classes (``first`` axis of an example or last), row by row, which a softmax at its end makes and
    no logits of a random batch ever do: cross-entropy on it then takes its log, as Keras's ``from_logits=False``
    does, not a second softmax."""
    scores = logits.detach().double().cpu().numpy()
    axis = 1 if first else -1
    return scores.ndim >= 2 and scores.shape[axis] >= 2 and probability_rows(scores, axis, atol=1e-3)


def positions_of(batch: Any) -> int | None:
    """The length of the last axis of one example of ``batch`` (a batch's rows first), None for a batch of scalars."""
    return int(batch.shape[-1]) if batch.ndim > 1 else None


def takes_targets(loss: Any, logits: Any, seed: int, first: bool = False) -> bool:
    """Whether a loss of the user's takes targets of 0 and 1 shaped as the logits, as a binary classifier's
    ``BCEWithLogitsLoss`` (or a regression's ``MSELoss``) does, where it fails on class ids: tried on the module's
    ``logits`` of one example (``probe_logits``). Where neither fits, class ids, on which ``scalar_loss`` then names
    the loss's failure."""
    import torch

    def fits(labels: Any) -> bool:
        try:
            with torch.no_grad():
                loss(logits, labels)
        except Exception:
            return False
        return True

    shape = labels_shape(logits.shape[1:], first)
    ids = torch.zeros((len(logits), *shape), dtype=torch.long, device=logits.device)
    return not fits(ids) and fits(synthetic_targets(logits.shape, seed, logits.device))


def synthetic_targets(shape: Sequence[int], seed: int, device: Any) -> Any:
    """Targets of 0 and 1 (``float32``), one per score of logits of ``shape``."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, 2, tuple(shape), generator=generator).float().to(device)


LABEL_KEYWORDS = ("labels", "targets")
"""What a module that computes its own loss calls its labels: Hugging Face's models ``labels``, nanoGPT's and
minGPT's ``targets``."""


def own_loss_call(
    module: Any, example: Any, logits_shape: Sequence[int], first: bool = False
) -> tuple[str, tuple[int, ...]] | None:
    """Whether the module computes its own loss given the labels, as a Hugging Face model does (``labels=``, its
    output's ``loss``) and nanoGPT (``targets=``, ``(logits, loss)``): the keyword and the shape of the logits it
    then returns per example, or None. Tried on one example in inference mode, with labels shaped as its logits
    score, then, for a module of tokens, as its input (nanoGPT scores only the last position without targets)."""
    import torch

    keyword = _labels_keyword(module)
    if keyword is None:
        return None
    shapes = dict.fromkeys(
        [
            labels_shape(logits_shape, first),
            *([tuple(example.shape[1:])] if takes_tokens(module) else []),
        ]
    )
    for shape in shapes:
        labels = torch.zeros((len(example), *shape), dtype=torch.long, device=example.device)
        try:
            with _inference(module):
                output = module(example, **{keyword: labels})
        except Exception:
            continue
        if loss_in(output) is not None:
            return keyword, tuple(int(d) for d in logits_of(output).shape[1:])
    return None


def _calls_loss_function(module: Any) -> bool:
    """Whether the module's ``forward`` calls its Hugging Face ``loss_function`` (GPT-2's does; T5's computes its
    cross-entropy inline, though it has one too), read from its source: the loss named and ranged is the one run."""
    import inspect

    if not callable(getattr(module, "loss_function", None)):
        return False
    try:
        return "loss_function" in inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return False


def own_loss_ranged(module: Any) -> Any:
    """A Hugging Face model's own loss (``loss_function``, which its ``forward`` calls) through a module of ours
    that the tracer ranges as the step's loss, as the default loss is; None for a module that computes its loss
    otherwise (its ops then go where the ranges around them say)."""
    function = getattr(module, "loss_function", None)
    if not callable(function):
        return None
    _, loss_of = loss_modules()
    ranged = loss_of(function)
    module.loss_function = lambda *args, **kwargs: ranged(*args, **kwargs)
    return ranged


def _name(loss: Any) -> str:
    return str(getattr(loss, "__name__", None) or type(loss).__name__)


@functools.cache
def loss_modules() -> tuple[type, type]:
    """The step's loss as a module, so that the tracer's hooks range it (``LOSS_PART``): cross-entropy over every
    row of the logits (a language model's every position; a segmentation model's every pixel and a frame tagger's
    every position, their logits taken as they come, classes first: ``kinds.classes_first``), and a loss function
    of the user's (or a Hugging Face model's own, called as the model calls it)."""
    import torch

    class FlatCrossEntropy(torch.nn.CrossEntropyLoss):
        def __init__(self, classes_first: bool = False, probabilities: bool = False) -> None:
            super().__init__()
            self.classes_first, self.probabilities = classes_first, probabilities

        def forward(self, logits: Any, labels: Any) -> Any:
            if self.probabilities:  # log p is its own log-softmax: the cross-entropy of the probabilities
                logits = logits.clamp_min(torch.finfo(logits.dtype).tiny).log()
            if self.classes_first:  # a score per class at each pixel or position
                return super().forward(logits, labels)
            return super().forward(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    class LossOf(torch.nn.Module):
        def __init__(self, function: Any) -> None:
            super().__init__()
            self.function = function

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.function(*args, **kwargs)

    return FlatCrossEntropy, LossOf


def scalar_loss(training: ModuleTraining, spec: str) -> None:
    """One line where the loss fails on the module's logits, or returns anything but a scalar."""
    import torch

    try:
        value = training.loss_of(training.x, training.y)
    except Exception as exc:
        raise UsageError(
            f"{spec}: the loss ({training.loss_name}) failed on the module's logits and the batch's labels "
            f"({first_line(exc, with_type=True)})"
        ) from exc
    if not isinstance(value, torch.Tensor) or value.ndim != 0 or not value.dtype.is_floating_point:
        shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise UsageError(f"{spec}: the loss ({training.loss_name}) returned {shape}, not a scalar to train on")


def refuse_failing_amp(training: ModuleTraining, amp: str, spec: str) -> None:
    """One line where a training step fails in the mixed precision ``--amp`` asks for, before any run starts: each
    run would fail the same way (float16 on a CPU: oneDNN has no half-precision LSTM). The inspection's module is
    thrown away after, so the step it takes does not matter."""
    import torch

    autocast = AUTOCAST[amp]
    scaler = torch.amp.GradScaler(_device().type) if autocast == SCALED else None
    try:
        replace(training, autocast=autocast, scaler=scaler).train_on(training.x, training.y)
    except Exception as exc:
        other = " or ".join(f"--amp {name}" for name in AUTOCAST if name != amp)
        raise UsageError(
            f"{spec}: a training step fails under --amp {amp} on the {_device().type} "
            f"({first_line(exc, with_type=True)}): train it without --amp, or with {other}"
        ) from exc


@contextlib.contextmanager
def outputs_taken(module: Any) -> Iterator[list[tuple[str, list[Any]]]]:
    """While inside: each submodule's output as it returns, by path, in the order the forward pass called them (a
    module called twice, twice), as host arrays (``Backend.host_array``): what ``verify`` fingerprints."""
    from detprof.backends import TORCH, get

    host = get(TORCH).host_array
    taken: list[tuple[str, list[Any]]] = []
    paths = {submodule: path for path, submodule in module.named_modules() if path}

    def take(submodule: Any, args: Any, output: Any) -> None:
        taken.append((paths[submodule], [host(t) for t in _tensors(output)]))

    handles = [submodule.register_forward_hook(take) for submodule in paths]
    try:
        yield taken
    finally:
        for handle in handles:
            handle.remove()


def _tensors(value: Any) -> list[Any]:
    """The tensors of a module's output, in order: a tensor, or those of a tuple, list or dict (a Hugging Face
    model's output) of them."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    if isinstance(value, tuple | list):
        return [t for item in value for t in _tensors(item)]
    return []


PYTORCH_ALERT = OP_PATTERNS[0]
"""How PyTorch's warning (or error) names an op that has no deterministic implementation on its device."""
_ALERT_SUFFIXES = re.compile(r"(_backward|_forward)?(_out)?(_cuda|_cpu)?$")


def nondeterministic_ops(training: ModuleTraining) -> list[dict[str, Any]]:
    """Each op without a deterministic implementation on this device, with the modules that call it, from one
    training step under ``torch.use_deterministic_algorithms(True, warn_only=True)``, before anything is measured.

    PyTorch warns as each forward op returns, so a forward op's warning goes to the module whose forward was
    running. The backward pass warns once it is over: a backward op (``adaptive_avg_pool2d_backward_cuda``) goes to
    the modules whose forward called the op it differentiates (``torch.overrides.TorchFunctionMode`` records which
    function each module called). The module's state after the step does not matter: this is the parent's
    inspection, whose module is thrown away. Determinism goes back to what it was.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    paths = {m: p for p, m in training.module.named_modules() if p}
    running: list[str] = []
    called: dict[str, set[str]] = {}
    found: dict[str, dict[str, Any]] = {}

    class Calls(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if running:
                called.setdefault(getattr(func, "__name__", ""), set()).add(running[-1])
            return func(*args, **(kwargs or {}))

    def note(caught: list[warnings.WarningMessage], start: int, where: Any) -> int:
        for warning in caught[start:]:
            message = str(warning.message)
            alert = PYTORCH_ALERT.match(message)
            if alert is not None:
                op = alert.group("op")
                entry = found.setdefault(op, {"op": op, "modules": set(), "message": message.splitlines()[0]})
                entry["modules"] |= where(op)
        return len(caught)

    was = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = 0

        def enter(submodule: Any, args: Any) -> None:
            nonlocal seen
            seen = note(caught, seen, lambda _: set(running[-1:]))
            running.append(paths[submodule])

        def leave(submodule: Any, args: Any, output: Any) -> None:
            nonlocal seen
            seen = note(caught, seen, lambda _: set(running[-1:]))
            running.pop()

        handles = [h for m in paths for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            with Calls():
                training.optimizer.zero_grad(set_to_none=True)
                value = training.loss_of(training.x, training.y)
            seen = note(caught, seen, lambda _: set())
            value.backward()
            seen = note(caught, seen, lambda op: called.get(_ALERT_SUFFIXES.sub("", op), set()))
            training.optimizer.step()
            note(caught, seen, lambda _: {OPTIMIZER_PART})
        finally:
            torch.use_deterministic_algorithms(was[0], warn_only=was[1])
            for handle in handles:
                handle.remove()
    return [entry | {"modules": sorted(entry["modules"])} for entry in found.values()]
