"""What a worker measures: one training step of a registry model, on whichever Keras backend the worker runs.

A workload turns the worker's spec into a zero-argument ``step`` that runs one step to
completion (synchronously, so that wall time per step is real), plus facts to record.
kernels_bench contributes its own op workloads through the same shape. The workload is the
same on every backend (the registry model, one synthetic batch, SGD, sparse cross-entropy);
only the compiled step is each backend's own, and the record says which it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from detprof.profiler.worker import settings_of

if TYPE_CHECKING:
    import keras
    import numpy as np

Step = Callable[[], None]
LEARNING_RATE = 0.01


def model_training(spec: dict[str, Any]) -> tuple[Step, dict[str, Any]]:
    """One SGD step on synthetic data of the model's input shape (content does not change kernel time)."""
    import keras
    import numpy as np

    from detprof.models import registry

    model_spec = registry.get(spec["model"])
    shape = tuple(spec["input_shape"] or model_spec.input_shape)
    classes = int(spec["classes"] or model_spec.classes)
    model = model_spec.build(shape, classes)
    rng = np.random.default_rng(int(spec["seed"]))
    x = rng.standard_normal((spec["batch_size"], *shape), dtype=np.float32)
    y = rng.integers(0, classes, size=spec["batch_size"]).astype(np.int32)
    settings = settings_of(spec)
    build = _tensorflow_step if keras.backend.backend() == "tensorflow" else _keras_step
    step, train_step = build(model, x, y, settings.jit_compile)
    facts = {"input_shape": list(shape), "classes": classes, "parameters": int(model.count_params())}
    return step, facts | {"train_step": train_step}


def _tensorflow_step(model: keras.Model, x: np.ndarray, y: np.ndarray, jit_compile: bool) -> tuple[Step, str]:
    """Our own ``tf.function``, not Keras's ``train_on_batch``.

    Keras 3 turns ``jit_compile=True`` into False on TensorFlow whenever op determinism is on
    (``model_supports_jit``), which would compare XLA in default mode against no XLA in
    deterministic mode. Here ``jit_compile`` is exactly the same value in both modes.
    """
    import keras
    import tensorflow as tf

    optimizer = keras.optimizers.SGD(learning_rate=LEARNING_RATE)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x_t, y_t = tf.constant(x), tf.constant(y)

    @tf.function(jit_compile=jit_compile)
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    def step() -> None:
        train_step(x_t, y_t).numpy()

    return step, f"tf.function (jit_compile={jit_compile})"


def _keras_step(model: keras.Model, x: np.ndarray, y: np.ndarray, jit_compile: bool) -> tuple[Step, str]:
    """Keras' own compiled step (``train_on_batch``) on JAX and PyTorch: their idiomatic training step.

    ``jit_compile`` is pinned in both modes: always on for JAX (``jax.jit``), ``torch.compile``
    only when asked for. The batch is converted to backend tensors once, on the backend's
    device, so a step does not copy it from the host; ``train_on_batch`` returns the loss as
    a Python float, so the step has finished when it returns.
    """
    import keras

    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=LEARNING_RATE),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    x_t, y_t = keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(y)

    def step() -> None:
        model.train_on_batch(x_t, y_t)

    return step, f"keras train_on_batch (jit_compile={jit_compile})"
