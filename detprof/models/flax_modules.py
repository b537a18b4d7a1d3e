"""Flax NNX modules as a kind of model (``kinds.FLAX``): how a worker looks at one, feeds it and trains it.

JAX users rarely train Keras models: they write Flax NNX modules and train them with optax. A
function that returns one (``FILE.py:FUNCTION``, ``package.module:FUNCTION``) is that model,
trained as the Flax examples train one: the module in training mode, called on a batch it takes as
it is (images channels last, token ids where its input goes into an embedding), cross-entropy on its logits
(every position's, for a language model) and AdamW through ``nnx.Optimizer``, or the loss and optax
optimizer it returned with it (``detprof.Training``); ``nnx.value_and_grad`` and the optimizer's
update inside one ``jax.jit`` of a pure function over the split state, the state donated from step to
step. Each submodule runs under a ``jax.named_scope`` of its path (``blocks.0.attn``, as
``nnx.iter_modules`` names it), the loss and the optimizer's update under scopes of their own, so
that every kernel's op name in the trace places it, forward and backward. Runs in workers only: JAX
and Flax are imported where they are used.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from detprof.backends.base import LOSS_PART, OPTIMIZER_PART, TOP_LEVEL_PART, ArmStep, Step
from detprof.errors import UsageError, first_line
from detprof.models import flax_calls
from detprof.models.kinds import FLAX, call_failed, refuse_more_inputs
from detprof.training import Training

TOKENS = 32
"""The sequence length a module that takes token ids is fed, unless ``--input-shape`` gives one."""
LEARNING_RATE = 1e-3
PROBE_ROWS = 2
"""The rows of the batch a module is first called on, in the parent's inspection."""
_SCOPED = "__detprof_scoped__"
"""Marks the subclass that runs a submodule under its path's name scope, so that no module is wrapped twice."""
_RNGS = ("rngs", "to_nnx__rngs")
"""The attribute that holds a module's random streams: NNX's by convention, a wrapped Linen module's."""
PENULTIMATE = "penultimate"
"""The submodule whose output a stability study reads as the model's features, where one is named so."""


def is_module(value: Any) -> bool:
    """Whether ``value`` is a Flax NNX module (Flax NNX is loaded wherever a function returned one)."""
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(value, nnx.Module)


def is_native(value: Any) -> bool:
    """A Flax module, NNX or Linen, bare or with its loss and optimizer (``detprof.Training``)."""
    model = value.model if isinstance(value, Training) else value
    return is_module(model) or _is_linen(model)


def _is_linen(value: Any) -> bool:
    linen = sys.modules.get("flax.linen")
    return linen is not None and isinstance(value, linen.Module)


def checked(value: Any, spec: str) -> Any:
    """``value`` as a model function returned it, a Linen module wrapped as an NNX one on its example input
    (``flax_linen``); one line where its loss is not callable, its optimizer is not an optax
    ``GradientTransformation`` (which ``nnx.Optimizer`` takes over the module's parameters), or a Linen module
    comes without its example input (or an NNX module with one)."""
    import optax

    if not isinstance(value, Training):
        if _is_linen(value):
            raise UsageError(
                f"{spec}: a Linen module is initialised on an example input: return "
                "detprof.Training(module, example=x), x a batch as the module takes it"
            )
        return value
    if _is_linen(value.model):
        if value.example is None:
            raise UsageError(f"{spec}: detprof.Training of a Linen module needs its example input (example=x)")
        from detprof.models import flax_linen

        value = replace(value, model=flax_linen.as_nnx(value.model, value.example, spec), example=None)
    elif value.example is not None:
        raise UsageError(f"{spec}: detprof.Training's example is a Linen module's; an NNX module takes none")
    if value.loss is not None and not callable(value.loss):
        raise UsageError(f"{spec}: detprof.Training's loss is {type(value.loss).__name__}, not a callable")
    if value.optimizer is not None and not isinstance(value.optimizer, optax.GradientTransformation):
        raise UsageError(
            f"{spec}: detprof.Training's optimizer for a Flax module is an optax transformation (like "
            f"optax.adamw(1e-3)), not {type(value.optimizer).__name__}"
        )
    return value


def module_of(value: Any) -> Any:
    return value.model if isinstance(value, Training) else value


def takes_tokens(module: Any) -> bool:
    """A module whose input goes into an embedding (``nnx.Embed``, or a wrapped Linen module's ``Embed``) takes
    token ids."""
    return _vocabulary(module) is not None


def _vocabulary(module: Any) -> int | None:
    """The rows of the embedding the module's input goes into; None where it goes into none (an image model's table
    of learned queries or positions is an embedding its input never enters). Where the probe cannot tell (its ids
    reach no submodule as they were given: a slice, a cast), the fewest rows of any embedding it holds (a position
    table may be an embedding too)."""
    from flax import nnx

    if (rows := _rows(module)) is not None:
        return rows  # a Linen module wrapped whole
    tables = {path: _rows(m) for path, m in nnx.iter_modules(module) if path and _rows(m) is not None}
    if not tables:
        return None
    reached = _input_path(module)
    return min(tables.values()) if reached is None else tables.get(reached)


def _rows(module: Any) -> int | None:
    """The ids an embedding takes: an ``nnx.Embed``'s rows, or those of the one a wrapped Linen module's input goes
    into (``flax_linen``); None for any other module."""
    from flax import nnx

    if isinstance(module, nnx.Embed):
        return int(module.num_embeddings)
    return getattr(module, "to_nnx__vocabulary", None)


class _Reached(Exception):
    """Stops a probe's trace at the first submodule that its input reaches (``_input_path``)."""

    def __init__(self, path: tuple[Any, ...]) -> None:
        super().__init__()
        self.path = path


def _input_path(module: Any) -> tuple[Any, ...] | None:
    """The path of the first submodule without submodules of its own that the module hands its input to: the module
    is traced (not run) on token ids and stopped there, before that submodule's call. None where the ids reach no
    submodule as they were given or the call fails on them first."""
    import jax.numpy as jnp
    from flax import nnx

    leaves = {path: m for path, m in nnx.iter_modules(module) if path and not list(nnx.iter_module_children(m))}
    classes = {path: type(leaf) for path, leaf in leaves.items()}
    given: list[Any] = []

    def stop(self: Any, *args: Any, _base: type, _path: tuple[Any, ...], **kwargs: Any) -> Any:
        if args and args[0] is given[0]:
            raise _Reached(_path)
        return _base.__call__(self, *args, **kwargs)

    def probe(m: Any, ids: Any) -> None:
        given.append(ids)
        m(ids)

    for path, leaf in leaves.items():
        cls = classes[path]
        call = functools.partialmethod(stop, _base=cls, _path=path)
        leaf.__class__ = type(cls.__name__, (cls,), {"__call__": call, "__module__": cls.__module__})
    try:
        nnx.eval_shape(probe, module, jnp.zeros((PROBE_ROWS, TOKENS), jnp.int32))
    except _Reached as reached:
        return reached.path
    except Exception:
        return None
    finally:
        for path, leaf in leaves.items():
            leaf.__class__ = classes[path]
    return None


def _linen_modules(module: Any) -> list[tuple[Any, Any]]:
    """Every Linen module that detprof wrapped (``flax_linen.LinenModule``) in ``module``, by path: where Flax and
    its Linen are loaded, and none otherwise."""
    from flax import nnx

    wrapper = sys.modules.get("detprof.models.flax_linen")
    if wrapper is None:
        return []
    return [(path, m) for path, m in nnx.iter_modules(module) if isinstance(m, wrapper.LinenModule)]


def input_shape(module: Any, shape: Sequence[int], given: bool, spec: str) -> tuple[int, ...]:
    """The shape of one example as ``module`` takes it: ``--input-shape`` as given, else the images the study would
    build a Keras model for (HxWxC, Flax's layout too); where it takes tokens, a sequence of ``TOKENS`` ids, or of
    the length a study's sequences have (a shape of one axis)."""
    if not given and (linen := _linen_modules(module)) and not linen[0][0]:
        return tuple(linen[0][1].to_nnx__example_shape)
    if takes_tokens(module):
        if given and len(shape) != 1:
            raise UsageError(f"{spec}: the module takes token ids: --input-shape is their length (like 64)")
        return tuple(shape) if given or len(shape) == 1 else (TOKENS,)
    return tuple(shape)


def synthetic_inputs(module: Any, shape: Sequence[int], rows: int, seed: int) -> Any:
    """Normal inputs, or uniform ids under the embedding's vocabulary where the module takes tokens."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    vocabulary = _vocabulary(module)
    if vocabulary is not None:
        return jnp.asarray(rng.integers(0, vocabulary, (rows, *shape)), dtype=jnp.int32)
    return jnp.asarray(rng.standard_normal((rows, *shape)), dtype=jnp.float32)


def logits_of(output: Any) -> Any:
    """The module's logits: its output, or its first output."""
    return output[0] if isinstance(output, tuple | list) else output


class NotAnArray(Exception):
    """A module's call returned no array, where its logits were to be: ``returned`` names what it was."""

    def __init__(self, returned: str) -> None:
        super().__init__(returned)
        self.returned = returned


def probe_logits(module: Any, x: Any) -> Any:
    """The shape and dtype of the module's logits for ``x`` in inference mode (no dropout drawn, no running
    statistics updated), the module left in training mode; ``NotAnArray`` where the call returns none. Traced, not
    run (``nnx.eval_shape``): run eagerly, JAX compiles each op of the call on its own (a tiny ResNet's call, about
    100 compilations, 1.2 s), and the compiled step traces the same call, so a call that traces is one the step can
    run."""
    import jax
    from flax import nnx

    returned: list[str] = []

    def logits(m: Any, inputs: Any) -> Any:
        output = logits_of(m(inputs))
        if isinstance(output, jax.Array):
            return output
        returned.append(type(output).__name__)
        return None

    module.eval()
    try:
        traced = nnx.eval_shape(logits, module, x)
    finally:
        module.train()
    if returned:
        raise NotAnArray(returned[0])
    return traced


def parameters(module: Any) -> int:
    import jax
    from flax import nnx

    return sum(int(leaf.size) for leaf in jax.tree_util.tree_leaves(nnx.state(module, nnx.Param)))


def described(module: Any, shape: tuple[int, ...], spec: str) -> dict[str, Any]:
    """What the parent needs of a module: its input and output, per example, and its size; one line when its call
    fails on a batch of that input."""
    import jax.numpy as jnp

    refuse_more_inputs(spec, module.__call__, "__call__")
    probe = synthetic_inputs(module, shape, PROBE_ROWS, 0)
    try:
        output = probe_logits(module, probe)
    except NotAnArray as exc:
        raise UsageError(f"{spec}: the module returned {exc.returned}, not logits (an array of scores)") from None
    except Exception as exc:
        taking = "token ids" if takes_tokens(module) else f"{probe.dtype} inputs"
        raise call_failed(spec, "call", shape, taking, exc, "HxWxC, like 64x64x1") from exc
    if output.ndim < 2 or not jnp.issubdtype(output.dtype, jnp.floating):
        array = f"a {output.dtype} array of shape {list(output.shape)}"
        raise UsageError(f"{spec}: the module returned {array}, not logits (an array of scores per example)")
    return FLAX.described(shape, str(probe.dtype), output.shape[1:], str(output.dtype), parameters(module))


def module_paths(module: Any) -> list[str]:
    """Every submodule's path, dotted as PyTorch writes one (``blocks.0.attn``), each parent before its children and
    a list's items in their order (``blocks.2`` before ``blocks.10``)."""
    from flax import nnx

    paths = [path for path, _ in nnx.iter_modules(module) if path]
    dotted = [_dotted(path) for path in sorted(paths, key=lambda path: [(isinstance(p, str), p) for p in path])]
    for path, linen in _linen_modules(module):
        inner = [".".join(filter(None, (_dotted(path), own))) for own in linen.to_nnx__paths]
        at = dotted.index(_dotted(path)) + 1 if path else 0
        dotted[at:at] = inner
    return dotted


def scoped(module: Any) -> None:
    """Each submodule's ``__call__`` run under a ``jax.named_scope`` of its path, the module's own under
    ``TOP_LEVEL_PART``: the path reaches every op's name in the compiled step (``transpose(jvp(blocks.0.attn))`` for
    its backward), which the trace parser reads as for Keras' layers. A subclass per module carries its path, so
    that ``nnx.split`` and ``nnx.merge`` keep it."""
    import jax
    from flax import nnx

    for path, submodule in list(nnx.iter_modules(module)):
        cls = type(submodule)
        if getattr(cls, _SCOPED, False):
            continue
        name = _dotted(path) or TOP_LEVEL_PART

        def call(self: Any, *args: Any, _base: type = cls, _name: str = name, **kwargs: Any) -> Any:
            with jax.named_scope(_name):
                output = _base.__call__(self, *args, **kwargs)
            if _name != TOP_LEVEL_PART:
                flax_calls.record(_name, args, output)
            return output

        attributes = {"__call__": call, "__module__": cls.__module__, "__qualname__": cls.__qualname__, _SCOPED: True}
        submodule.__class__ = type(cls.__name__, (cls,), attributes)


@contextlib.contextmanager
def init_seeded(seed: int) -> Iterator[None]:
    """While inside (a model function building its module): every ``nnx.Rngs`` made draws from its seeds folded with
    ``seed``, as if the function had been given another seed. Flax draws a module's initial weights from the keys
    its function chose, so a stability study's ``init`` source varies them here, the function's own seeds kept
    apart from one another."""
    import jax
    import numpy as np
    from flax import nnx

    original = nnx.Rngs.__init__

    def fold(value: Any) -> Any:
        if isinstance(value, int | np.integer):
            return int(np.random.SeedSequence([int(value), seed]).generate_state(1, dtype=np.uint32)[0] >> 1)
        if isinstance(value, Mapping):
            return {name: fold(inner) for name, inner in value.items()}
        if isinstance(value, jax.Array):
            return jax.random.fold_in(value, seed)
        return value

    def seeded(self: Any, default: Any = None, **streams: Any) -> None:
        original(self, fold(default), **{name: fold(value) for name, value in streams.items()})

    nnx.Rngs.__init__ = seeded  # type: ignore[method-assign]
    try:
        yield
    finally:
        nnx.Rngs.__init__ = original  # type: ignore[method-assign]


def cross_entropy(logits: Any, labels: Any) -> Any:
    """Cross-entropy over every row of the logits (a language model's every position), as the default loss."""
    import optax

    flat = logits.reshape(-1, logits.shape[-1])
    return optax.softmax_cross_entropy_with_integer_labels(flat, labels.reshape(-1)).mean()


@dataclass(frozen=True)
class TakenStep:
    """What ``verify`` fingerprints of one step (``FlaxTraining.taken_step``), as host arrays by path."""

    outputs: list[tuple[str, list[Any]]]
    gradients: list[tuple[str, Any]]
    weights: list[tuple[str, list[Any]]]


def _dotted(path: Sequence[Any]) -> str:
    return ".".join(map(str, path))


@dataclass
class FlaxTraining:
    """A module and its ``nnx.Optimizer``, split into the state the compiled steps take and give back, with its
    batch and loss. Each compiled function (the sweep's step, ``verify``'s, a stability run's and its inference) is
    compiled once, at its first call."""

    graph: Any
    """``nnx.split``'s graph of (module, optimizer): what ``nnx.merge`` rebuilds them from inside the step."""
    state: Any
    x: Any
    y: Any
    loss: Callable[[Any, Any], Any]
    logits_shape: tuple[int, ...]
    loss_name: str
    optimizer_name: str
    parameters: int
    paths: list[str]
    dtype: str
    module: Any = field(repr=False)
    """The module as built, for what it takes (its batch's shapes and ids); its values are ``state``'s."""
    compiled: dict[str, Callable[..., Any]] = field(default_factory=dict, repr=False)
    taken_paths: list[str] = field(default_factory=list, repr=False)
    """The paths of the submodule calls ``verify``'s step takes, in the order they ran (read while it is traced)."""

    @property
    def name(self) -> str:
        """The module's class (a wrapped Linen module's own)."""
        return type(getattr(self.module, "to_nnx__module", self.module)).__name__

    @property
    def classes(self) -> int:
        return self.logits_shape[-1]

    def train_step(self, state: Any, data: Any) -> tuple[Any, Any]:
        """One step as a pure function of the state: forward, the loss, ``nnx.value_and_grad``'s backward, the
        optimizer's update; returns the loss and the state after it."""
        (loss, *_), state = self._step(state, data, taking=False)
        return loss, state

    def _step(self, state: Any, data: Any, taking: bool) -> tuple[tuple[Any, Any, Any, Any, Any], Any]:
        """The step; returns the loss and the logits, and where ``taking`` (``verify``'s step) each submodule's output
        in the order they ran (their paths in ``taken_paths``), the gradients, and the weights after the update
        (parameters and batch statistics); and the state after it."""
        import jax
        from flax import nnx

        module, optimizer = nnx.merge(self.graph, state)
        x, y = data

        def loss_of(module: Any) -> tuple[Any, tuple[Any, list[Any]]]:
            with flax_calls.taken(taking) as taken:
                logits = logits_of(module(x))
            self.taken_paths = [call.path for call in taken]
            with jax.named_scope(LOSS_PART):
                return self.loss(logits, y), (logits, [call.output for call in taken])

        (loss, (logits, outputs)), grads = nnx.value_and_grad(loss_of, has_aux=True)(module)
        with jax.named_scope(OPTIMIZER_PART):
            optimizer.update(module, grads)
        weights = nnx.state(module, nnx.Any(nnx.Param, nnx.BatchStat)) if taking else None
        return (loss, logits, outputs, grads if taking else None, weights), nnx.state((module, optimizer))

    def _jitted(self, name: str, function: Callable[..., Any], donate: bool = True) -> Callable[..., Any]:
        import jax

        if name not in self.compiled:
            self.compiled[name] = jax.jit(function, donate_argnums=0 if donate else ())
        return self.compiled[name]

    def step(self) -> Step:
        """One training step on the batch, run to completion; compiled once (``jax.jit``), the state donated."""
        import jax

        compiled, data = self._jitted("step", self.train_step), (self.x, self.y)

        def step() -> None:
            loss, self.state = compiled(self.state, data)
            jax.block_until_ready(loss)

        return step

    def train_on(self, x: Any, y: Any) -> tuple[Any, Any]:
        """One training step on ``x`` and ``y``: the loss and the logits, on the host."""
        import numpy as np

        compiled = self._jitted("train_on", functools.partial(self._step, taking=False))
        (loss, logits, *_), self.state = compiled(self.state, (x, y))
        return np.asarray(loss), np.asarray(logits)

    def taken_step(self, data: Any) -> TakenStep:
        """One training step on ``data``, with what ``verify`` fingerprints of it as host arrays: each submodule's
        output by path, in the order the forward pass called them; each parameter's gradient by its path; each
        module's own parameters and batch statistics after the update, by its path (the top module's by its class
        name)."""
        import jax
        import numpy as np
        from flax import nnx

        compiled = self._jitted("taken", functools.partial(self._step, taking=True))
        (_, _, outputs, grads, weights), self.state = compiled(self.state, data)
        host = [
            (path, [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(output)])
            for path, output in zip(self.taken_paths, outputs, strict=True)
        ]
        gradients = [(_dotted(path), np.asarray(v.get_value())) for path, v in nnx.to_flat_state(grads)]
        by_module: dict[str, list[Any]] = {}
        for owner, _, value in self._named(weights):
            by_module.setdefault(owner, []).append(value)
        return TakenStep(host, gradients, list(by_module.items()))

    def _named(self, weights: Any) -> list[tuple[str, str, Any]]:
        """Each variable of ``weights`` (an ``nnx.State``) as its module's path (the top module's by its class name),
        its own dotted path, and its value on the host."""
        import numpy as np
        from flax import nnx

        return [
            (_dotted(path[:-1]) or self.name, _dotted(path), np.asarray(variable.get_value()))
            for path, variable in nnx.to_flat_state(weights)
        ]

    def weights(self, *kinds: type) -> list[tuple[str, str, Any]]:
        """The module's variables of ``kinds`` (``nnx.Param``, ``nnx.BatchStat``) as they stand (``_named``)."""
        from flax import nnx

        module, _ = nnx.merge(self.graph, self.state)
        return self._named(nnx.state(module, nnx.Any(*kinds)))

    def features_and_logits(self, x: Any) -> tuple[Any, Any]:
        """The penultimate features and the logits of ``x`` in inference mode (no dropout drawn, no running statistics
        updated), on the host: the output of a submodule named ``penultimate``, else the input of the last submodule
        call with parameters of its own (the classifier, a language model's head)."""
        import numpy as np
        from flax import nnx

        if "infer" not in self.compiled:  # which modules hold parameters is read once, for the one trace
            holders = {owner for owner, _, _ in self.weights(nnx.Param)}

            def infer(state: Any, x: Any) -> tuple[Any, Any]:
                module, _ = nnx.merge(self.graph, state)
                module.eval()
                with flax_calls.taken(True) as taken:
                    logits = logits_of(module(x))
                named = [call.output for call in taken if call.path == PENULTIMATE]
                inputs = [call.input for call in taken if call.path in holders]
                return (named or inputs or [logits])[-1], logits

            self._jitted("infer", infer, donate=False)
        features, logits = self.compiled["infer"](self.state, x)
        return np.asarray(features), np.asarray(logits)

    def reseeded(self, seed: int) -> list[str]:
        """Every random stream the module draws from while it trains (dropout's) reseeded from ``seed``, apart from
        what built it; returns the paths of the modules that hold one."""
        from flax import nnx

        module, optimizer = nnx.merge(self.graph, self.state)
        keys = list(nnx.to_flat_state(nnx.state(module, nnx.RngKey)))
        if keys:
            nnx.reseed(module, **dict.fromkeys({variable.tag for _, variable in keys}, seed))
        self.graph, self.state = nnx.split((module, optimizer))
        holders = {_dotted(path[: next((i for i, p in enumerate(path) if p in _RNGS), -1)]) for path, _ in keys}
        return sorted(holder or self.name for holder in holders)

    def parameter_sizes(self) -> list[int]:
        """Each parameter's size, in the order ``flip`` counts them."""
        from flax import nnx

        return [int(value.size) for _, _, value in self.weights(nnx.Param)]

    def flip(self, which: int, index: int, upward: bool) -> dict[str, Any]:
        """Element ``index`` of parameter ``which`` moved by an ulp, up or down; returns which and by how much."""
        import numpy as np
        from flax import nnx

        module, optimizer = nnx.merge(self.graph, self.state)
        path, variable = list(nnx.to_flat_state(nnx.state(module, nnx.Param)))[which]
        values = np.array(variable.get_value())
        flat = values.reshape(-1)
        before = flat[index].copy()
        flat[index] = np.nextafter(before, np.inf if upward else -np.inf)
        variable.set_value(values)
        self.graph, self.state = nnx.split((module, optimizer))
        return {"variable": _dotted(path), "index": index, "before": float(before), "after": float(flat[index])}

    def arms(self, arms: Sequence[frozenset[str]]) -> list[ArmStep]:
        """A step per arm of an in-process pair, each compiled with its knobs as XLA compile options, taking turns
        on the one state (``backends.jax.compiled_arms``)."""
        from detprof.backends.jax import compiled_arms

        return compiled_arms(self.train_step, self.state, (self.x, self.y), arms)

    def loss_value(self) -> Any:
        """The loss's shape and dtype on the batch, traced as ``probe_logits`` traces the call: what the parent's
        inspection checks is a scalar."""
        from flax import nnx

        module, _ = nnx.merge(self.graph, self.state)
        return nnx.eval_shape(lambda m, x, y: self.loss(logits_of(m(x)), y), module, self.x, self.y)

    def facts(self) -> dict[str, Any]:
        """What the run's record keeps of the model (``profiler.workloads._facts`` for a Keras model)."""
        return {
            "model_api": FLAX.api,
            "parameters": self.parameters,
            "train_step": (
                f"jax.jit of a pure step over nnx.split state: forward, {self.loss_name}, nnx.value_and_grad, "
                f"nnx.Optimizer({self.optimizer_name}).update"
            ),
            "dtype_policy": self.dtype,
            "layer_names": self.paths,
            "step_scopes": {},
            "input_shape": [int(d) for d in self.x.shape[1:]],
            "input_dtype": str(self.x.dtype),
            "classes": self.classes,
            "labels_shape": [int(d) for d in self.y.shape[1:]],
        }


def batch(module: Any, spec: Mapping[str, Any], seed: int, logits_shape: Sequence[int]) -> tuple[Any, Any]:
    """The spec's batch: ``--data``'s leading rows, else one drawn from ``seed`` (inputs as ``synthetic_inputs``, a
    uniform label per row of the module's logits, under the classes they score)."""
    import jax.numpy as jnp
    import numpy as np

    shape, rows = tuple(spec["input_shape"]), int(spec["batch_size"])
    feed = spec.get("data")
    if feed is not None:
        from detprof.models.npz_data import module_batch

        x, y = module_batch(feed, shape, rows, takes_tokens(module))
        return jnp.asarray(x.astype(np.int32) if x.dtype == np.int64 else x), jnp.asarray(y.astype(np.int32))
    x = synthetic_inputs(module, shape, rows, seed)
    labels = np.random.default_rng(seed + 1).integers(0, logits_shape[-1], (rows, *logits_shape[:-1]))
    return x, jnp.asarray(labels, dtype=jnp.int32)


def training(
    given: Any,
    spec: Mapping[str, Any],
    seed: int,
    compiled: bool = True,
    learning_rate: float = LEARNING_RATE,
    own_loss: bool = True,
) -> FlaxTraining:
    """The module a model function returned (``given``: bare, or ``detprof.Training``) in training mode, each
    submodule scoped by its path (``scoped``), with its batch, its loss (else cross-entropy) and its optimizer (else
    AdamW) in an ``nnx.Optimizer`` over its parameters, split for the compiled step. ``compiled`` and ``own_loss``
    are PyTorch's choices: JAX always compiles the step, and a Flax module returns no loss of its own. ``--amp`` never
    reaches it: the study refuses it before any run (``kinds.FLAX.amp_refused``)."""
    import optax
    from flax import nnx

    del compiled, own_loss
    module = module_of(given)
    chosen = given if isinstance(given, Training) else Training(module)
    scoped(module)
    module.train()
    example = synthetic_inputs(module, tuple(spec["input_shape"]), 1, seed)
    logits_shape = tuple(int(d) for d in probe_logits(module, example).shape[1:])
    x, y = batch(module, spec, seed, logits_shape)
    tx = chosen.optimizer if chosen.optimizer is not None else optax.adamw(learning_rate)
    optimizer = nnx.Optimizer(module, tx, wrt=nnx.Param)
    graph, state = nnx.split((module, optimizer))
    loss = chosen.loss or cross_entropy
    loss_name = "cross-entropy" if chosen.loss is None else _name(chosen.loss)
    # optax's transformations carry no name of the function that built them (adamw and sgd are both a chain)
    optimizer_name = "adamw" if chosen.optimizer is None else "the model function's optax transformation"
    dtypes = [", ".join(sorted({str(leaf.dtype) for leaf in _leaves(nnx.state(module, nnx.Param))}))]
    paths, size = module_paths(module), parameters(module)
    return FlaxTraining(graph, state, x, y, loss, logits_shape, loss_name, optimizer_name, size, paths, *dtypes, module)


def _leaves(tree: Any) -> list[Any]:
    import jax

    return jax.tree_util.tree_leaves(tree)


def _name(value: Any) -> str:
    return str(getattr(value, "__name__", None) or type(value).__name__)


def scalar_loss(training: FlaxTraining, spec: str) -> None:
    """One line where the loss fails on the module's logits, or returns anything but a scalar."""
    import jax.numpy as jnp

    try:
        value = training.loss_value()
    except Exception as exc:
        raise UsageError(
            f"{spec}: the loss ({training.loss_name}) failed on the module's logits and the batch's labels "
            f"({first_line(exc, with_type=True)})"
        ) from exc
    if getattr(value, "ndim", None) != 0 or not jnp.issubdtype(value.dtype, jnp.floating):
        shape = list(value.shape) if hasattr(value, "shape") else type(value).__name__
        raise UsageError(f"{spec}: the loss ({training.loss_name}) returned {shape}, not a scalar to train on")


def nondeterministic_ops(training: FlaxTraining) -> list[dict[str, Any]]:
    """None named ahead: XLA has no per-op alert. On a GPU its deterministic flag replaces what has no deterministic
    implementation (a scatter's atomics, max pooling's gradient), which the trace then shows."""
    del training
    return []
