"""A Flax NNX module's stability runs: the Keras ``Trainer``'s protocol, for a module trained with optax.

Each noise source draws from its own seed, as for a Keras model: ``init`` folds into every
``nnx.Rngs`` the model function makes (``flax_modules.init_seeded``), so the module is built
afresh from other initial weights; ``dropout`` then reseeds every random stream the module draws
from while it trains (JAX's explicit keys: dropout's masks); ``shuffle`` and ``augment`` are the
study's numpy generators, the images channels last as Flax takes them; ``bitflip`` moves one
parameter by an ulp. The step is the sweep's (``flax_modules.FlaxTraining``): the loss and optax
optimizer the function returns with the module (``detprof.Training``), else the study's protocol,
cross-entropy on the logits and AdamW at ``--lr``. Runs in workers only: JAX and Flax are imported
where they are used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detprof.models import flax_modules
from detprof.models.own import OwnModel
from detprof.stability import metrics, variants
from detprof.stability.variants import RunSeeds


class FlaxTrainer:
    """A Flax module rebuilt from ``init`` for every run, its steps compiled anew with it."""

    outputs_probabilities = False
    """A module's output is its logits (``flax_modules.logits_of``), as the sweep trains it."""

    def __init__(self, own_model: OwnModel, data_shape: tuple[int, ...], takes: str, classes: int, lr: float) -> None:
        self.own_model, self.classes, self.lr = own_model, classes, lr
        self.input_shape = tuple(data_shape)
        self.tokens = takes == "tokens"
        self.training: flax_modules.FlaxTraining | None = None

    @property
    def _training(self) -> flax_modules.FlaxTraining:
        assert self.training is not None, "reset() builds the module"
        return self.training

    @property
    def step_name(self) -> str:
        return str(self._training.facts()["train_step"])

    def reset(self, seeds: RunSeeds) -> dict[str, Any]:
        """The module built from ``init`` (``flax_modules.init_seeded``) with its optimizer, then its random streams
        reseeded from ``dropout``; returns what was applied (the modules that draw, the flipped weight)."""
        from detprof.models.own_build import as_given

        with flax_modules.init_seeded(seeds.init):
            given = as_given(self.own_model, self.input_shape, self.classes)
        spec = {"model": self.own_model.label, "input_shape": list(self.input_shape), "batch_size": 1}
        self.training = flax_modules.training(given, spec, seeds.init, learning_rate=self.lr)
        applied: dict[str, Any] = {"seeded_stochastic_layers": self.training.reseeded(seeds.dropout)}
        if seeds.bitflip is not None:
            chosen = variants.one_weight(self.training.parameter_sizes(), seeds.bitflip)
            applied["bitflip"] = self.training.flip(*chosen)
        return applied

    def _inputs(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x).astype(np.int32 if self.tokens else np.float32)

    def train_step(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """One optimizer step: the batch's mean loss and how many of its labels the module got right."""
        labels = np.ascontiguousarray(y).astype(np.int32)
        loss, logits = self._training.train_on(self._inputs(x), labels)
        return float(loss), int((logits.argmax(axis=-1) == labels).sum())

    def infer(self, x: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """The penultimate features and the logits of every example, in inference mode."""
        features, outputs = [], []
        for start in range(0, len(x), batch_size):
            feature, logits = self._training.features_and_logits(self._inputs(x[start : start + batch_size]))
            features.append(feature.reshape(len(feature), -1).astype(np.float32))
            outputs.append(logits.astype(np.float32))
        return np.concatenate(features), np.concatenate(outputs)

    def probabilities_and_loss(self, outputs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
        return metrics.probabilities_and_loss(outputs, y, self.outputs_probabilities)

    def layer_weights(self) -> list[tuple[str, list[np.ndarray]]]:
        """Each module's own parameters and batch statistics, by path (the top module's by its class name)."""
        from flax import nnx

        found: dict[str, list[np.ndarray]] = {}
        for owner, _, value in self._training.weights(nnx.Param, nnx.BatchStat):
            found.setdefault(owner, []).append(value)
        return list(found.items())

    def trainable_vector(self) -> np.ndarray:
        from flax import nnx

        return np.concatenate([value.ravel() for _, _, value in self._training.weights(nnx.Param)])

    def named_weights(self) -> list[tuple[str, np.ndarray]]:
        from flax import nnx

        return [(name, value) for _, name, value in self._training.weights(nnx.Param, nnx.BatchStat)]
