"""What a worker measures: one training step of a model, on whichever Keras backend the worker runs.

A workload turns the worker's spec into a zero-argument ``step`` that runs one step to
completion (synchronously, so that wall time per step is real), plus facts to record.
kernels_bench contributes its own op workloads through the same shape. A registry model
trains on one synthetic batch (content does not change kernel time) with SGD and sparse
cross-entropy; a model of your own (``models.own``) trains with the loss and optimizer it is
compiled with, else the same; ``--data`` feeds a real batch instead (``models.npz_data``).
Only the compiled step is each backend's own, and the record says which it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from detprof import backends
from detprof.backends.base import COMPILED_LOSS_SCOPE, LOSS_PART, OPTIMIZER_PART, ArmStep, Step
from detprof.errors import UsageError
from detprof.models import kinds
from detprof.profiler.worker_spec import WorkerSpec

if TYPE_CHECKING:
    import keras

Batch = Any
"""One array, or a dict of arrays by input (or output) name for a model with several."""
LEARNING_RATE = 0.01


@dataclass
class Training:
    """The model a spec names, built, and what it trains with."""

    model: keras.Model
    loss: Any
    optimizer: keras.optimizers.Optimizer
    compiled: bool
    """A model of your own compiled with its loss: that loss (and its weights) and optimizer, kept."""
    classes: int


AMP_POLICIES = {"bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
"""What ``--amp`` takes, each with the Keras dtype policy it builds a model in (a native module's autocast dtype:
``torch_modules.AUTOCAST``). float16's narrow range needs its loss scaled: a Keras model's optimizer is wrapped in
``LossScaleOptimizer`` (as ``Model.compile`` does by itself), a module's step takes ``torch.amp.GradScaler``."""
LOSS_SCALED = AMP_POLICIES["fp16"]


def training_of(spec: Mapping[str, Any]) -> Training:
    """The registry model or your own the spec names, built at its shape (in ``--amp``'s dtype policy where given),
    with its loss and optimizer."""
    import keras

    from detprof.models import registry
    from detprof.models.own import DEFAULT_CLASSES, DEFAULT_INPUT_SHAPE, OwnModel
    from detprof.models.own_build import build, outputs_probabilities

    own = spec.get("own_model")
    amp = AMP_POLICIES.get(spec.get("amp") or "")
    if own is None:
        model_spec = registry.get(spec["model"])
        shape = tuple(spec["input_shape"] or model_spec.input_shape)
        classes = int(spec["classes"] or model_spec.classes)
        with dtype_policy(amp or _policy_here(model_spec.gpu_dtype_policy)):
            model = model_spec.build(shape, classes)
        from_logits = True
    else:
        shape = tuple(spec["input_shape"] or DEFAULT_INPUT_SHAPE)
        classes = int(spec["classes"] or DEFAULT_CLASSES)
        with dtype_policy(amp):
            model = build(OwnModel.from_record(own), shape, classes)
        from_logits = not outputs_probabilities(model)
    if amp is not None and model.dtype_policy.name != amp:
        raise UsageError(
            f"{spec['model']} keeps the dtype policy {model.dtype_policy.name} it was saved or built with: --amp "
            "applies to the models built here"
        )
    compiled = own is not None and getattr(model, "compiled", False) and getattr(model, "loss", None) is not None
    if compiled:
        return Training(model, model.loss, model.optimizer, True, classes)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)
    optimizer = keras.optimizers.SGD(learning_rate=LEARNING_RATE)
    if amp == LOSS_SCALED:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return Training(model, loss, optimizer, False, classes)


def _policy_here(gpu_policy: str | None) -> str | None:
    """A registry model's dtype policy on this process's device: its GPU policy where Keras trains on a GPU."""
    import keras

    if gpu_policy is None or backends.get(keras.config.backend()).device_name() == "cpu":
        return None
    return gpu_policy


@contextlib.contextmanager
def dtype_policy(policy: str | None) -> Iterator[None]:
    """Models built inside take ``policy`` (None: the policy as it is); the global policy is put back after, so
    that the next model a worker builds starts from its own."""
    import keras

    if policy is None:
        yield
        return
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def model_training(worker: WorkerSpec) -> tuple[Step, dict[str, Any]]:
    """One training step of the model the spec names, on its batch; facts about what was run."""
    spec, settings = worker.params, worker.determinism
    if not worker.keras:
        from detprof.models.own_build import native_training

        module = native_training(spec, settings.seed, settings.jit_compile)
        return module.step(), module.facts()
    training = training_of(spec)
    x, y = batch_of(training.model, spec, training.classes, settings.seed)
    if settings.backend == backends.TENSORFLOW:
        step, train_step = _tensorflow_step(training, x, y, settings.jit_compile)
    else:
        step, train_step = _keras_step(training, x, y, settings.jit_compile)
    return step, _facts(training, x, y, train_step)


def model_training_arms(workers: Sequence[WorkerSpec]) -> tuple[list[ArmStep], dict[str, Any]]:
    """The arms of an in-process pair (``worker.run_arms``): one model on one batch, compiled by Keras as for
    ``train_on_batch``, and a step of it per arm, each under that arm's knobs (``Backend.arm_steps``). A Flax module
    likewise (its step compiled per arm: ``backends.jax.compiled_arms``); a native PyTorch module is built per arm
    from the same seed, each under its arm's switches (``switched_arms``)."""
    spec, settings = workers[0].params, workers[0].determinism
    kind = kinds.of_params(spec)
    if kind is kinds.FLAX:
        from detprof.models.own_build import native_training

        module = native_training(spec, settings.seed)
        return module.arms([worker.determinism.knob_set() for worker in workers]), module.facts()
    if kind is not None:
        return switched_arms(workers, model_training)
    training = training_of(spec)
    x, y = batch_of(training.model, spec, training.classes, settings.seed)
    x_t, y_t = _keras_compiled(training, x, y, settings.jit_compile)
    knobs = [worker.determinism.knob_set() for worker in workers]
    arms = backends.get(settings.backend).arm_steps(training.model, x_t, y_t, knobs)
    train_step = f"keras train_step (jit_compile={settings.jit_compile}), the arms in turn in one process"
    return arms, _facts(training, x, y, train_step)


def switched_arms(
    workers: Sequence[WorkerSpec], single: Callable[[WorkerSpec], tuple[Step, dict[str, Any]]]
) -> tuple[list[ArmStep], dict[str, Any]]:
    """The arms of an in-process pair of a workload that builds a step of one mode (``single``, an op case), on a
    backend that switches between steps (``Backend.arm_switch``): each arm's step built under its switches, which
    are set again before each of its steps. An arm whose step cannot be built (an op that refuses determinism when
    it is set up) fails at its first step, alone."""
    backend = backends.get(workers[0].determinism.backend)
    arms: list[ArmStep] = []
    facts: dict[str, Any] = {}
    for worker in workers:
        switch = backend.arm_switch(worker.determinism.knob_set())
        switch()
        try:
            step, facts = single(worker)
        except Exception as exc:
            step = _raising(exc)
        arms.append((_switched(switch, step), backend.in_effect()))
    return arms, facts


def _switched(switch: Step, step: Step) -> Step:
    def run() -> None:
        switch()
        step()

    return run


def _raising(exc: Exception) -> Step:
    def fail() -> None:
        raise exc

    return fail


def _facts(training: Training, x: Batch, y: Batch, train_step: str) -> dict[str, Any]:
    """What a model workload records of itself: its size, its layers, the scopes of the step's other parts, its
    input and classes, its step."""
    import numpy as np

    model = training.model
    facts: dict[str, Any] = {"model_api": kinds.KERAS.api, "parameters": int(model.count_params())}
    facts["train_step"] = train_step
    facts["dtype_policy"] = model.dtype_policy.name
    facts["layer_names"] = [layer.name for layer in model._flatten_layers(include_self=False)]
    facts["step_scopes"] = step_scopes(training)
    if not isinstance(x, dict):
        facts["input_shape"] = [int(d) for d in x.shape[1:]]
        facts["input_dtype"] = str(x.dtype)
    if not isinstance(y, list) and np.issubdtype(y.dtype, np.integer) and _output_classes(model) is not None:
        facts["classes"] = _output_classes(model)
        facts["labels_shape"] = [int(d) for d in y.shape[1:]]
    return facts


def step_scopes(training: Training) -> dict[str, str]:
    """The name scopes under which the step's parts that are no layer run, by their row in the layer leaderboard:
    Keras's compiled loss and the loss's own name, the optimizer's name, and the framework's own (``step_scopes``)."""
    import keras

    scopes = backends.get(keras.config.backend()).step_scopes()
    scopes |= {COMPILED_LOSS_SCOPE: LOSS_PART, training.optimizer.name: OPTIMIZER_PART}
    name = getattr(training.loss, "name", None)
    return scopes | ({name: LOSS_PART} if isinstance(name, str) else {})


def _output_classes(model: keras.Model) -> int | None:
    last = model.outputs[0].shape[-1] if len(model.outputs) == 1 else None
    return None if last is None else int(last)


def batch_of(model: keras.Model, spec: Mapping[str, Any], classes: int, seed: int) -> tuple[Batch, Batch]:
    """The spec's real batch (``--data``), else a synthetic one: normal inputs (uniform ids where the model takes
    tokens, its output classes being the vocabulary), uniform labels per output."""
    import numpy as np

    feed = spec.get("data")
    if feed is not None:
        return _real_batch(model, feed, int(spec["batch_size"]))
    rng = np.random.default_rng(seed)
    (tensor,) = model.inputs
    shape = (spec["batch_size"], *tensor.shape[1:])
    if np.issubdtype(np.dtype(str(tensor.dtype)), np.integer):
        x = rng.integers(0, _output_classes(model) or classes, size=shape).astype(str(tensor.dtype))
    else:
        x = rng.standard_normal(shape, dtype=np.float32)
    labels = (spec["batch_size"], *model.outputs[0].shape[1:-1])
    return x, rng.integers(0, _output_classes(model) or classes, size=labels).astype(np.int32)


def _real_batch(model: keras.Model, feed: Mapping[str, Any], batch_size: int) -> tuple[Batch, Batch]:
    """``batch_size`` leading rows of the arrays ``feed`` names, shaped and typed as the model takes them."""
    import numpy as np

    from detprof.models.npz_data import leading_rows, scaled
    from detprof.models.own import example_shape

    path = feed["path"]
    tensors = {t.name: t for t in model.inputs}
    xs = {}
    for (name, array), tensor in zip(feed["inputs"], model.inputs, strict=True):
        tensor = tensors.get(name, tensor)
        values = leading_rows(path, array, batch_size)
        shape = example_shape(values.shape, tensor.shape[1:]) or values.shape[1:]
        values = values.reshape((len(values), *shape))
        dtype = np.dtype(str(tensor.dtype))
        xs[tensor.name] = scaled(values).astype(dtype) if np.issubdtype(dtype, np.floating) else values.astype(dtype)
    ys = {}
    for name, array in feed["targets"]:
        values = leading_rows(path, array, batch_size)
        ys[name] = values.astype(np.int32) if np.issubdtype(values.dtype, np.integer) else values.astype(np.float32)
    x = next(iter(xs.values())) if len(xs) == 1 else xs
    y = next(iter(ys.values())) if len(ys) == 1 else [ys[name] for name in model.output_names]
    return x, y


def _tensorflow_step(training: Training, x: Batch, y: Batch, jit_compile: bool) -> tuple[Step, str]:
    """Our own ``tf.function``, not Keras's ``train_on_batch``.

    Keras 3 turns ``jit_compile=True`` into False on TensorFlow whenever op determinism is on
    (``model_supports_jit``), which would compare XLA in default mode against no XLA in
    deterministic mode. Here ``jit_compile`` is exactly the same value in both modes. A
    model compiled with its own loss computes it as its ``fit`` would (``compute_loss``:
    the compiled loss, its weights, and the model's added losses); a registry model adds its
    added losses (a mixture of experts' load balancing) to the cross-entropy, as Keras' own
    step does on the other backends.
    """
    import tensorflow as tf

    x_t, y_t = tf.nest.map_structure(tf.constant, x), tf.nest.map_structure(tf.constant, y)

    model, optimizer = training.model, training.optimizer

    def loss_of(y: Any, y_pred: Any) -> tf.Tensor:
        if training.compiled:
            return model.compute_loss(y=y, y_pred=y_pred)
        added = model.losses
        return training.loss(y, y_pred) + (tf.add_n(added) if added else 0.0)

    @tf.function(jit_compile=jit_compile)
    def train_step(x: Any, y: Any) -> tf.Tensor:
        with tf.GradientTape() as tape:
            value = loss_of(y, model(x, training=True))
            scaled = optimizer.scale_loss(value)  # as Keras's own step: the loss itself but under float16's scaling
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return value

    def step() -> None:
        train_step(x_t, y_t).numpy()

    return step, f"tf.function (jit_compile={jit_compile})"


def _keras_step(training: Training, x: Batch, y: Batch, jit_compile: bool) -> tuple[Step, str]:
    """Keras' own compiled step (``train_on_batch``) on JAX and PyTorch: their idiomatic training step.

    ``jit_compile`` is pinned in both modes: always on for JAX (``jax.jit``), ``torch.compile``
    only when asked for. The batch is converted to backend tensors once, on the backend's
    device, so a step does not copy it from the host; ``train_on_batch`` returns the loss as
    a Python float, so the step has finished when it returns. A model of your own that was
    compiled keeps its loss (and loss weights) and optimizer; only its metrics are left out.
    """
    model = training.model
    x_t, y_t = _keras_compiled(training, x, y, jit_compile)

    def step() -> None:
        model.train_on_batch(x_t, y_t)

    return step, f"keras train_on_batch (jit_compile={jit_compile})"


def _keras_compiled(training: Training, x: Batch, y: Batch, jit_compile: bool) -> tuple[Batch, Batch]:
    """The model compiled by Keras with its loss (and loss weights) and optimizer, and the batch as backend tensors."""
    import keras

    model = training.model
    loss_weights = model.get_compile_config().get("loss_weights") if getattr(model, "compiled", False) else None
    model.compile(optimizer=training.optimizer, loss=training.loss, loss_weights=loss_weights, jit_compile=jit_compile)
    return keras.tree.map_structure(keras.ops.convert_to_tensor, x), keras.tree.map_structure(
        keras.ops.convert_to_tensor, y
    )
