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
    """Synthetic data of the model's input shape: data content does not change kernel time."""
    import keras
    import numpy as np
    import tensorflow as tf

    from detprof.models import registry

    model_spec = registry.get(spec["model"])
    shape = tuple(spec["input_shape"] or model_spec.input_shape)
    classes = int(spec["classes"] or model_spec.classes)
    model = model_spec.build(shape, classes)
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=bool(spec["xla"]),
    )
    rng = np.random.default_rng(int(spec["seed"]))
    x = tf.constant(rng.standard_normal((spec["batch_size"], *shape), dtype=np.float32))
    y = tf.constant(rng.integers(0, classes, size=spec["batch_size"]), dtype=tf.int32)

    def step() -> None:
        model.train_on_batch(x, y)

    return step, {"input_shape": list(shape), "classes": classes, "parameters": int(model.count_params())}
