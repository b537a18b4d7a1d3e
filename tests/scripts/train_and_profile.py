"""Train a tiny Keras CNN on the CPU and profile its second epoch with TensorFlow's profiler.

usage: train_and_profile.py LOGDIR {graph,xla}

The first epoch warms up (tracing, compilation); the profiler then records a second one
into LOGDIR, as ``tf.profiler.experimental`` lays it out (plugins/profile/<run>/*.xplane.pb).
"""

from __future__ import annotations

import sys

import keras
import numpy as np
import tensorflow as tf


def main(argv: list[str]) -> None:
    logdir, compiler = argv
    if compiler not in ("graph", "xla"):
        raise SystemExit(f"compiler must be graph or xla, not {compiler!r}")
    model = keras.Sequential(
        [
            keras.Input((12, 12, 1)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=compiler == "xla",
    )
    x = np.random.default_rng(0).normal(size=(16, 12, 12, 1)).astype("float32")
    y = np.arange(16) % 3
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    tf.profiler.experimental.start(logdir)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    tf.profiler.experimental.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
