"""The kinds of model detprof trains, each found by what a model function returns: one registry.

A Keras model trains on any of the three backends through Keras. A native model trains on its
own framework, the way its users write the step: a ``torch.nn.Module`` on PyTorch
(``models.torch_modules``), a Flax module on JAX (``models.flax_modules``). Each native kind is
one module of workers' code with the same functions (what it is, its input, its probe, its
training step, its facts), named here once, so that the study commands ask a kind and never test
for a framework. Nothing here imports a framework: the parent plans with it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from detprof import backends
from detprof.errors import UsageError, first_line


@dataclass(frozen=True)
class ModelKind:
    """One kind of model: what records call it, how a sentence names it, where it trains and whose code trains it."""

    api: str
    """What records call the kind (``OwnModel.api``, a run's ``model_api``)."""
    what: str
    """The kind in a sentence's words: "a torch.nn.Module"."""
    backend: str | None = None
    """The backend it trains on; None: any (Keras')."""
    framework: str | None = None
    """The module whose classes tell the kind apart, loaded wherever a function returned one."""
    implementation: str | None = None
    """The module of workers' code that builds, feeds and trains a model of the kind."""
    channels_first: bool = False
    """Its image inputs hold their channels first (CxHxW, a PyTorch module's), not last (HxWxC)."""
    amp_refused: str | None = None
    """Why ``--amp`` does not apply to it, where it does not (None: it trains in mixed precision as asked)."""

    def described(
        self, shape: Sequence[int], input_dtype: str, logits: Sequence[int], logits_dtype: str, parameters: int
    ) -> dict[str, Any]:
        """What the parent's inspection answers of a module of this kind (``own.Inspected.from_answer``): one input
        of ``shape`` per example, its logits per example, no compiled loss, its size."""
        return {
            "api": self.api,
            "built_at_input_shape": True,
            "inputs": [{"name": "input", "shape": list(shape), "dtype": input_dtype}],
            "outputs": [{"name": "logits", "shape": list(logits), "dtype": logits_dtype}],
            "loss": None,
            "parameters": parameters,
        }

    def code(self) -> ModuleType:
        """The kind's workers' code, imported where a worker needs it."""
        return importlib.import_module(str(self.implementation))


KERAS = ModelKind("keras", "a Keras model")
TORCH = ModelKind(
    backends.TORCH, "a torch.nn.Module", backends.TORCH, backends.TORCH, "detprof.models.torch_modules", True
)
FLAX = ModelKind(
    "flax",
    "a Flax module",
    backends.JAX,
    "flax",
    "detprof.models.flax_modules",
    amp_refused="--amp applies to Keras models and PyTorch modules; a Flax module computes in the dtypes its layers "
    "are built with (dtype=jnp.bfloat16, param_dtype=jnp.float32)",
)
NATIVE: dict[str, ModelKind] = {kind.api: kind for kind in (TORCH, FLAX)}
"""The kinds that train without Keras, by ``api``."""


PROBABILITIES_LOSS = "cross-entropy on its probabilities"
"""The step's loss for a native module whose output is a probability per class (it ends in a softmax): the
cross-entropy of their log, not of a softmax of them again, as Keras's ``from_logits=False`` takes them."""


def native(api: object) -> ModelKind | None:
    """The native kind ``api`` names (``OwnModel.api``); None for a Keras model, or one not yet inspected."""
    return NATIVE.get(api) if isinstance(api, str) else None


def part_word(api: object) -> str:
    """What a model's parts are called where a user reads them: a Keras model's layers, a native module's
    submodules (by their paths), modules."""
    return "layer" if native(api) is None else "module"


def image_channels(shape: Sequence[int], api: object) -> int:
    """The channels of an image input of ``shape`` (one example's) to a model of kind ``api``: first for a kind
    that takes them first (``ModelKind.channels_first``), else last."""
    kind = native(api)
    return int(shape[0] if kind is not None and kind.channels_first else shape[-1])


def classes_first(shape: Sequence[int], api: object, positions: int | None = None, head: bool | None = None) -> bool:
    """Whether one example's logits of ``shape`` score the classes on their first axis, as PyTorch's cross-entropy
    takes them, from a kind that takes images channels first. The layer that made them says so where it can
    (``head``: a convolution's come classes first, a linear layer's last, whatever their lengths). Else their shape
    does: a grid's scores (a segmentation model's classes x height x width), and a line's (a Conv1d frame tagger's
    classes x length) where their last axis is as long as the input's last (``positions``) and their first is not.
    Else on their last: a classifier's, a language model's length x vocabulary, a Keras or Flax model's height x
    width x classes."""
    kind = native(api)
    if kind is None or not kind.channels_first or len(shape) < 2:
        return False
    if head is not None:
        return head
    return len(shape) >= 3 or (positions is not None and shape[-1] == positions != shape[0])


def classes_in(shape: Sequence[int], first: bool) -> int:
    """The classes that one example's logits of ``shape`` score, on their ``first`` axis or their last
    (``classes_first``)."""
    return int(shape[0] if first else shape[-1])


def labels_shape(shape: Sequence[int], first: bool) -> tuple[int, ...]:
    """One example's class ids for logits of ``shape``: one per position its logits score (``classes_first``)."""
    return tuple(int(d) for d in (shape[1:] if first else shape[:-1]))


def of_params(params: Mapping[str, Any]) -> ModelKind | None:
    """The native kind of the model a workload's parameters name; None for a Keras model or an op case."""
    return native((params.get("own_model") or {}).get("api"))


def of_value(value: Any) -> ModelKind | None:
    """The native kind of what a model function returned (bare, or with its loss and optimizer: ``detprof.Training``);
    None for anything else. Only a framework already loaded is asked: a function that returned its model loaded it."""
    for kind in NATIVE.values():
        if kind.framework in sys.modules and kind.code().is_native(value):
            return kind
    return None


class CallFailed(UsageError):
    """A module's forward (call) failed on the inspection's batch: the line asks for the ``--input-shape`` it takes,
    unless the command feeds it something else (a stability study, a dataset's images), which says what instead
    (``instead``)."""

    def __init__(self, failed: str, example: str) -> None:
        super().__init__(f"{failed}: give the --input-shape it takes ({example})")
        self.failed = failed

    def instead(self, advice: str) -> UsageError:
        return UsageError(f"{self.failed}: {advice}")


def call_failed(spec: str, method: str, shape: Sequence[int], taking: str, exc: Exception, example: str) -> CallFailed:
    """The one line for a module whose ``method`` (forward, call) failed on the inspection's batch of ``shape``
    (``taking``: token ids, or the inputs' dtype), asking for the ``--input-shape`` it takes (``example``)."""
    return CallFailed(
        f"{spec}: the module's {method} failed on a batch of {'x'.join(map(str, shape))} {taking} "
        f"({first_line(exc, with_type=True)})",
        example,
    )


def refuse_more_inputs(spec: str, method: Any, name: str) -> None:
    """One line where a module's ``method`` (its ``forward``, its ``__call__``: ``name``) needs more than one
    argument: every study feeds a model one input, a batch as it takes it, so a second one (a mask, a batch passed
    as a dict's entries) would fail the probe with advice about ``--input-shape`` that could not help."""
    import inspect

    try:
        parameters = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    required = [p.name for p in parameters if p.default is p.empty and p.kind not in variadic]
    if len(required) > 1:
        raise UsageError(
            f"{spec}: its {name} takes {len(required)} inputs ({', '.join(required)}); detprof feeds a model one, a "
            f"batch as it takes it: return a module whose {name} takes one (building the rest from it, as a mask "
            "from the ids), or measure your training program as it runs (--command)"
        )


def refuse_mixed(natives: Sequence[tuple[str, ModelKind]]) -> None:
    """One line where the native models of one study (each as given, with its kind) train on different frameworks:
    a study runs on one backend, so each implies its own and neither ``--backend`` could serve both."""
    if not natives:
        return
    given, kind = natives[0]
    other = next(((g, k) for g, k in natives if k.backend != kind.backend), None)
    if other is not None:
        frameworks = [backends.get(str(k.backend)).framework for k in (kind, other[1])]
        raise UsageError(
            f"{given} is {kind.what}, which trains on {frameworks[0]}, and {other[0]} {other[1].what}, which trains "
            f"on {frameworks[1]}: a study runs on one backend: give them to two"
        )


def refuse_other_backend(label: str, api: str, backend: str | None) -> None:
    """One line where a native model (``label``, of kind ``api``) is asked to train on another backend than its own."""
    kind = NATIVE[api]
    if backend != kind.backend:
        raise UsageError(
            f"{label} is {kind.what}, which trains on {backends.get(str(kind.backend)).framework}, not on {backend}: "
            f"pass --backend {kind.backend}, or no --backend"
        )
