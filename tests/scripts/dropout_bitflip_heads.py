"""Dropout seeding, the one-weight bit flip and Keras-application heads, under op determinism.

Run in its own interpreter: determinism, once switched on, cannot be switched off in a
process, so it must never leak into pytest's. Prints one JSON object (the last line of
stdout) with what was observed; the test asserts on it.
"""

from __future__ import annotations

import json

import numpy as np

from detprof import determinism

determinism.apply(determinism.DeterminismSettings("deterministic"))

import keras  # noqa: E402  (determinism must be switched on before Keras is imported)

from detprof.stability import training  # noqa: E402


def main() -> dict:
    inputs = keras.Input((16,))
    hidden = keras.layers.Dropout(0.5, name="drop")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3, name="logits")(hidden))
    x = np.ones((4, 16), np.float32)

    def mask(seed: int) -> np.ndarray:
        training.seed_stochastic_layers(model, seed)
        return model.get_layer("drop")(x, training=True).numpy() != 0

    out = {
        "seeded": training.seed_stochastic_layers(model, 1),
        "same_seed_same_mask": bool((mask(1) == mask(1)).all()),
        "other_seed_other_mask": bool((mask(1) != mask(2)).any()),
    }
    before = [w.numpy().copy() for w in model.trainable_variables]
    flip = training.flip_one_weight(model, 5)
    after = [w.numpy() for w in model.trainable_variables]
    changed = [(b != a) for b, a in zip(before, after, strict=True)]
    out["changed_elements"] = int(sum(c.sum() for c in changed))
    k = next(i for i, c in enumerate(changed) if c.any())
    old, new = before[k][changed[k]][0], after[k][changed[k]][0]
    out["one_ulp"] = bool(new in (np.nextafter(old, np.float32(np.inf)), np.nextafter(old, np.float32(-np.inf))))
    out["flip"] = flip
    out["variable"] = model.trainable_variables[k].path

    app = keras.applications.MobileNet(weights=None, input_shape=(32, 32, 1), classes=10)
    out["app_softmax"] = training.outputs_probabilities(app)
    out["app_features"] = training.penultimate_output(app).shape[-1]
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
