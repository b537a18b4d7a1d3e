"""Linen modules as Flax models: each trained as an NNX module, so that the Flax kind has one training step.

A function may return a Linen module with the example input it is initialised on
(``detprof.Training(module, example=x)``). It is wrapped as Flax's bridge wraps one
(``nnx.bridge.ToNNX``), its variables initialised on that example (``init``, as a Linen user calls
it) from an ``nnx.Rngs`` that the wrapper draws its dropout keys from as it trains. What Linen takes
as arguments the wrapper gives it: its training flag (``train``, ``training``, ``is_training`` or
``deterministic``, whichever the module's ``__call__`` takes), following NNX's ``train()`` and
``eval()``, and the collections it updates in training (``batch_stats``) as mutable. Each Linen
submodule's call runs under a ``jax.named_scope`` of its path (``Block_0.Conv_0``: Linen's own names,
dotted), taken as NNX submodules' calls are (``flax_calls``), so that the module leaderboard,
``verify`` and a stability study read a Linen module as they read an NNX one. Imported only by the
Flax kind's workers' code, where Flax is loaded.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
from flax import linen, nnx
from flax.nnx import variablelib

from detprof.errors import UsageError, first_line
from detprof.models import flax_calls

TRAINING_FLAGS = {"train": True, "training": True, "is_training": True, "deterministic": False}
"""The arguments Linen modules take for training mode by convention, each with its value in training."""
INIT_SEEDS = {"params": 0, "dropout": 1}
"""The streams the wrapper's ``nnx.Rngs`` starts from (a stability study folds its ``init`` seed into them)."""


class LinenModule(nnx.bridge.ToNNX):
    """A Linen module as an NNX module: its variables NNX's (``Param``, ``BatchStat``), its training flag NNX's
    ``deterministic`` attribute (which ``train()`` and ``eval()`` set), its submodules' calls scoped by path. The
    wrapper's own attributes are named ``to_nnx__*``: the bridge takes every other attribute for a variable."""

    def __init__(self, module: linen.Module, flag: str | None, rngs: nnx.Rngs) -> None:
        super().__init__(module, rngs=rngs)
        self.to_nnx__flag = flag
        self.to_nnx__deterministic = False
        self.to_nnx__mutable: tuple[str, ...] = ()
        self.to_nnx__paths: tuple[str, ...] = ()
        self.to_nnx__vocabulary: int | None = None
        self.to_nnx__example_shape: tuple[int, ...] = ()

    @property
    def deterministic(self) -> bool:
        """NNX's inference mode (``eval()`` sets it, ``train()`` clears it)."""
        return bool(self.to_nnx__deterministic)

    @deterministic.setter
    def deterministic(self, value: bool) -> None:
        self.to_nnx__deterministic = value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The Linen module applied to ``args`` in the wrapper's mode: its flag set, in training the collections it
        updates mutable (the bridge writes their new values back into the wrapper)."""
        flag = self.to_nnx__flag
        training = not self.deterministic
        if flag is not None:
            kwargs[flag] = training if TRAINING_FLAGS[flag] else not training
        mutable = list(self.to_nnx__mutable) if training and self.to_nnx__mutable else False
        with linen.intercept_methods(_scoped_call):
            return super().__call__(*args, mutable=mutable, **kwargs)


def as_nnx(module: linen.Module, example: Any, spec: str) -> LinenModule:
    """``module`` wrapped and initialised on ``example`` (a batch as it takes it), in training mode; one line where
    its init fails on it."""
    flag = next((name for name in TRAINING_FLAGS if name in _call_parameters(module)), None)
    wrapper = LinenModule(module, flag, nnx.Rngs(**INIT_SEEDS))
    wrapper.eval()
    found: dict[str, Any] = {"paths": [], "vocabulary": []}
    try:
        with linen.intercept_methods(_found_while_initialised(found, example)):
            nnx.bridge.lazy_init(wrapper, example)
    except Exception as exc:
        shape = "x".join(map(str, getattr(example, "shape", ())))
        raise UsageError(
            f"{spec}: the Linen module's init failed on the example input ({shape}): {first_line(exc, with_type=True)}"
        ) from exc
    wrapper.to_nnx__paths = tuple(dict.fromkeys(found["paths"]))
    wrapper.to_nnx__vocabulary = next(iter(found["vocabulary"]), None)
    wrapper.to_nnx__example_shape = tuple(int(d) for d in example.shape[1:])
    wrapper.to_nnx__mutable = _updated_collections(wrapper)
    wrapper.train()
    return wrapper


def _call_parameters(module: linen.Module) -> set[str]:
    try:
        return set(inspect.signature(type(module).__call__).parameters)
    except (TypeError, ValueError):
        return set()


def _updated_collections(wrapper: LinenModule) -> tuple[str, ...]:
    """The Linen collections the module holds besides its parameters (``batch_stats``): those it may update."""
    kinds = {type(variable) for _, variable in nnx.to_flat_state(nnx.state(wrapper, nnx.Not(nnx.RngState)))}
    names = {variablelib.variable_name_from_type(kind) for kind in kinds}
    return tuple(sorted(names - {"params"}))


def _path(module: linen.Module) -> str:
    return ".".join(module.scope.path) if module.scope is not None else ""


def _scoped_call(next_fun: Any, args: tuple[Any, ...], kwargs: dict[str, Any], context: Any) -> Any:
    """A Linen submodule's ``__call__`` under a ``jax.named_scope`` of its dotted path, taken as it returns."""
    path = _path(context.module) if context.method_name == "__call__" else ""
    if not path:
        return next_fun(*args, **kwargs)
    with jax.named_scope(path):
        output = next_fun(*args, **kwargs)
    flax_calls.record(path, args, output)
    return output


def _found_while_initialised(found: dict[str, Any], example: Any) -> Any:
    """An interceptor that notes each submodule's path, parents before their children, and the rows of each
    embedding handed ``example`` as it was given."""

    def note(next_fun: Any, args: tuple[Any, ...], kwargs: dict[str, Any], context: Any) -> Any:
        path = _path(context.module)
        if path and context.method_name == "__call__":
            found["paths"].append(path)
        if isinstance(context.module, linen.Embed) and args and args[0] is example:
            found["vocabulary"].append(int(context.module.num_embeddings))
        return next_fun(*args, **kwargs)

    return note
