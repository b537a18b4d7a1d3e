"""Flax NNX modules as a kind of model (``kinds.FLAX``): how a worker looks at one, feeds it and trains it.

JAX users rarely train Keras models: they write Flax NNX modules and train them with optax. A
function that returns one (``FILE.py:FUNCTION``, ``package.module:FUNCTION``) is that model,
trained as the Flax examples train one: the module in training mode, called on a batch it takes as
it is (images channels last, token ids where it holds an embedding), cross-entropy on its logits
(every position's, for a language model) and AdamW through ``nnx.Optimizer``, or the loss and optax
optimizer it returned with it (``detprof.Training``); ``nnx.value_and_grad`` and the optimizer's
update inside one ``jax.jit`` of a pure function over the split state, the state donated from step to
step. Each submodule runs under a ``jax.named_scope`` of its path (``blocks.0.attn``, as
``nnx.iter_modules`` names it), the loss and the optimizer's update under scopes of their own, so
that every kernel's op name in the trace places it, forward and backward. Runs in workers only: JAX
and Flax are imported where they are used.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from detprof.backends.base import LOSS_PART, OPTIMIZER_PART, TOP_LEVEL_PART, ArmStep, Step
from detprof.errors import UsageError, first_line
from detprof.models.kinds import FLAX
from detprof.training import Training

TOKENS = 32
"""The sequence length a module that takes token ids is fed, unless ``--input-shape`` gives one."""
LEARNING_RATE = 1e-3
PROBE_ROWS = 2
"""The rows of the batch a module is first called on, in the parent's inspection."""
_SCOPED = "__detprof_scoped__"
"""Marks the subclass that runs a submodule under its path's name scope, so that no module is wrapped twice."""


def is_module(value: Any) -> bool:
    """Whether ``value`` is a Flax NNX module (Flax is loaded wherever a function returned one)."""
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(value, nnx.Module)


def is_native(value: Any) -> bool:
    """A Flax NNX module, bare or with its loss and optimizer (``detprof.Training``)."""
    return is_module(value) or (isinstance(value, Training) and is_module(value.model))


def checked(value: Training, spec: str) -> Training:
    """``value`` as a model function returned it, one line where its loss is not callable or its optimizer is not
    an optax ``GradientTransformation`` (which ``nnx.Optimizer`` takes over the module's parameters)."""
    import optax

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
    """A module that holds an embedding (``nnx.Embed``) takes token ids."""
    return _vocabulary(module) is not None


def _vocabulary(module: Any) -> int | None:
    """The ids every embedding of the module takes (the fewest rows of any: a position table may be an embedding
    too); None: it holds none."""
    from flax import nnx

    rows = [int(m.num_embeddings) for _, m in nnx.iter_modules(module) if isinstance(m, nnx.Embed)]
    return min(rows) if rows else None


def input_shape(module: Any, shape: Sequence[int], given: bool, spec: str) -> tuple[int, ...]:
    """The shape of one example as ``module`` takes it: ``--input-shape`` as given, else the images the study would
    build a Keras model for (HxWxC, Flax's layout too); where it takes tokens, a sequence of ``TOKENS`` ids, or of
    the length a study's sequences have (a shape of one axis)."""
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


def probe_logits(module: Any, x: Any) -> Any:
    """The module's logits for ``x`` in inference mode (no dropout drawn, no running statistics updated), the
    module left in training mode."""
    module.eval()
    try:
        return logits_of(module(x))
    finally:
        module.train()


def parameters(module: Any) -> int:
    import jax
    from flax import nnx

    return sum(int(leaf.size) for leaf in jax.tree_util.tree_leaves(nnx.state(module, nnx.Param)))


def described(module: Any, shape: tuple[int, ...], spec: str) -> dict[str, Any]:
    """What the parent needs of a module: its input and output, per example, and its size; one line when its call
    fails on a batch of that input."""
    import jax.numpy as jnp

    probe = synthetic_inputs(module, shape, PROBE_ROWS, 0)
    try:
        output = probe_logits(module, probe)
    except Exception as exc:
        kind = "token ids" if takes_tokens(module) else f"{probe.dtype} inputs"
        raise UsageError(
            f"{spec}: the module's call failed on a batch of {'x'.join(map(str, shape))} {kind} "
            f"({first_line(exc, with_type=True)}): give the --input-shape it takes (like 32x32x3)"
        ) from exc
    if not hasattr(output, "ndim") or output.ndim < 2 or not jnp.issubdtype(output.dtype, jnp.floating):
        raise UsageError(f"{spec}: the module returned {type(output).__name__}, not logits (an array of scores)")
    return {
        "api": FLAX.api,
        "built_at_input_shape": True,
        "inputs": [{"name": "input", "shape": list(shape), "dtype": str(probe.dtype)}],
        "outputs": [{"name": "logits", "shape": list(output.shape[1:]), "dtype": str(output.dtype)}],
        "loss": None,
        "parameters": parameters(module),
    }


def module_paths(module: Any) -> list[str]:
    """Every submodule's path, dotted as PyTorch writes one (``blocks.0.attn``), parents before children."""
    from flax import nnx

    paths = [".".join(map(str, path)) for path, _ in nnx.iter_modules(module) if path]
    return sorted(paths, key=lambda path: (path.count("."), path))


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
        name = ".".join(map(str, path)) or TOP_LEVEL_PART

        def call(self: Any, *args: Any, _base: type = cls, _name: str = name, **kwargs: Any) -> Any:
            with jax.named_scope(_name):
                return _base.__call__(self, *args, **kwargs)

        attributes = {"__call__": call, "__module__": cls.__module__, "__qualname__": cls.__qualname__, _SCOPED: True}
        submodule.__class__ = type(cls.__name__, (cls,), attributes)


def cross_entropy(logits: Any, labels: Any) -> Any:
    """Cross-entropy over every row of the logits (a language model's every position), as the default loss."""
    import optax

    flat = logits.reshape(-1, logits.shape[-1])
    return optax.softmax_cross_entropy_with_integer_labels(flat, labels.reshape(-1)).mean()


@dataclass
class FlaxTraining:
    """A module and its ``nnx.Optimizer``, split into the state the compiled step takes and gives back, with its
    batch and loss."""

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
    compiled: Callable[[Any, Any], Any] | None = field(default=None, repr=False)

    @property
    def classes(self) -> int:
        return self.logits_shape[-1]

    def train_step(self, state: Any, data: Any) -> tuple[Any, Any]:
        """One step as a pure function of the state: forward, the loss, ``nnx.value_and_grad``'s backward, the
        optimizer's update; returns the loss and the state after it."""
        import jax
        from flax import nnx

        module, optimizer = nnx.merge(self.graph, state)
        x, y = data

        def loss_of(module: Any) -> Any:
            logits = logits_of(module(x))
            with jax.named_scope(LOSS_PART):
                return self.loss(logits, y)

        loss, grads = nnx.value_and_grad(loss_of)(module)
        with jax.named_scope(OPTIMIZER_PART):
            optimizer.update(module, grads)
        return loss, nnx.state((module, optimizer))

    def step(self) -> Step:
        """One training step on the batch, run to completion; compiled once (``jax.jit``), the state donated."""
        import jax

        if self.compiled is None:
            self.compiled = jax.jit(self.train_step, donate_argnums=0)
        compiled, data = self.compiled, (self.x, self.y)

        def step() -> None:
            loss, self.state = compiled(self.state, data)
            jax.block_until_ready(loss)

        return step

    def arms(self, arms: Sequence[frozenset[str]]) -> list[ArmStep]:
        """A step per arm of an in-process pair, each compiled with its knobs as XLA compile options, taking turns
        on the one state (``backends.jax.compiled_arms``)."""
        from detprof.backends.jax import compiled_arms

        return compiled_arms(self.train_step, self.state, (self.x, self.y), arms)

    def loss_value(self) -> Any:
        """The loss on the batch, without a step: what the parent's inspection checks is a scalar."""
        from flax import nnx

        module, _ = nnx.merge(self.graph, self.state)
        return self.loss(logits_of(module(self.x)), self.y)

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
            "classes": self.classes,
        }


def batch(module: Any, spec: Mapping[str, Any], seed: int, logits_shape: Sequence[int]) -> tuple[Any, Any]:
    """The spec's batch: ``--data``'s leading rows, else one drawn from ``seed`` (inputs as ``synthetic_inputs``, a
    uniform label per row of the module's logits, under the classes they score)."""
    import jax.numpy as jnp
    import numpy as np

    shape, rows = tuple(spec["input_shape"]), int(spec["batch_size"])
    feed = spec.get("data")
    if feed is not None:
        return _real_batch(feed, shape, rows, takes_tokens(module))
    x = synthetic_inputs(module, shape, rows, seed)
    labels = np.random.default_rng(seed + 1).integers(0, logits_shape[-1], (rows, *logits_shape[:-1]))
    return x, jnp.asarray(labels, dtype=jnp.int32)


def _real_batch(feed: Mapping[str, Any], shape: tuple[int, ...], rows: int, tokens: bool) -> tuple[Any, Any]:
    """The leading ``rows`` of ``--data``'s arrays as the module takes them: ids, or pixels scaled as the Keras path
    scales them."""
    import jax.numpy as jnp
    import numpy as np

    from detprof.models.npz_data import leading_rows, scaled

    path = feed["path"]
    ((_, x_name),) = feed["inputs"]
    ((_, y_name),) = feed["targets"]
    values = leading_rows(path, x_name, rows)
    values = values.reshape((len(values), *shape))
    x = jnp.asarray(values.astype(np.int32) if tokens else scaled(values))
    return x, jnp.asarray(leading_rows(path, y_name, rows).astype(np.int32))


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
    are PyTorch's choices: JAX always compiles the step, and a Flax module returns no loss of its own. ``--amp`` is
    refused: a Flax module computes in the dtypes its layers are built with."""
    import optax
    from flax import nnx

    del compiled, own_loss
    if spec.get("amp"):
        raise UsageError(
            f"{spec['model']}: --amp applies to Keras models and PyTorch modules; a Flax module computes in the "
            "dtypes its layers are built with (dtype=jnp.bfloat16, param_dtype=jnp.float32)"
        )
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
    optimizer_name = "adamw" if chosen.optimizer is None else _name(chosen.optimizer)
    dtypes = [", ".join(sorted({str(leaf.dtype) for leaf in _leaves(nnx.state(module, nnx.Param))}))]
    paths, size = module_paths(module), parameters(module)
    return FlaxTraining(graph, state, x, y, loss, logits_shape, loss_name, optimizer_name, size, paths, *dtypes)


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
