"""What a worker measures: one training step of a registry model.

A workload turns the worker's spec into a zero-argument ``step`` that runs one step to
completion (synchronously, so that wall time per step is real), plus facts to record.
kernels_bench contributes its own op workloads through the same shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Step = Callable[[], None]


def model_training(spec: dict[str, Any]) -> tuple[Step, dict[str, Any]]:
    """One SGD step on synthetic data of the model's input shape (content does not change kernel time).

    The step is our own ``tf.function`` rather than Keras's ``train_on_batch``: Keras 3 turns
    ``jit_compile=True`` into False whenever op determinism is on (``model_supports_jit``),
    which would compare XLA in default mode against no XLA in deterministic mode. Here
    ``jit_compile`` is exactly the spec's value in both modes.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from detprof.models import registry

    model_spec = registry.get(spec["model"])
    shape = tuple(spec["input_shape"] or model_spec.input_shape)
    classes = int(spec["classes"] or model_spec.classes)
    model = model_spec.build(shape, classes)
    optimizer = keras.optimizers.SGD(learning_rate=0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(int(spec["seed"]))
    x = tf.constant(rng.standard_normal((spec["batch_size"], *shape), dtype=np.float32))
    y = tf.constant(rng.integers(0, classes, size=spec["batch_size"]), dtype=tf.int32)

    @tf.function(jit_compile=bool(spec["xla"]))
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    def step() -> None:
        train_step(x, y).numpy()

    return step, {"input_shape": list(shape), "classes": classes, "parameters": int(model.count_params())}
