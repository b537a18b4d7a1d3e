"""One training run, inside a worker whose determinism mode is already applied.

Each noise source draws from its own seed: ``init`` seeds Keras before the initial
weights are built, ``shuffle`` and ``augment`` drive numpy generators for data order and
augmentation (of images: token sequences are trained on as they are, so ``augment`` varies
nothing there), ``dropout`` resets every stochastic layer's seed generator, ``bitflip``
picks the one weight moved by an ulp. Nothing else draws randomness, so a run is a pure
function of its seeds and, with determinism on, of nothing else.

A worker reuses one compiled model for all its runs: weights, optimizer state and seed
generators are reset to exactly what a freshly built model would hold, which saves the
framework's start-up and the step's tracing or compilation per run without changing a
single bit of the result. Only Keras APIs touch the model, so the same code trains on
TensorFlow, JAX and PyTorch, whichever backend the worker was started with. A native PyTorch
module trains through ``module_training.ModuleTrainer``, the same protocol; ``train`` runs both.
"""

from __future__ import annotations

import functools
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from detprof import backends
from detprof.determinism import DeterminismSettings, Mode
from detprof.fingerprints import digest
from detprof.models import kinds, registry
from detprof.models.own import OwnModel
from detprof.models.own_build import OwnBuilder, outputs_probabilities
from detprof.stability import datasets, metrics, variants
from detprof.stability.flax_training import FlaxTrainer
from detprof.stability.module_training import ModuleTrainer
from detprof.stability.variants import PlannedRun, RunSeeds
from detprof.store import atomic_write_bytes, json_safe

if TYPE_CHECKING:
    import keras

    from detprof.device_time import PartClock

ARRAYS_DIR = "arrays"
WEIGHTS_DIR = "weights"
MIN_EVAL_BATCH = 256
ACCURACY = "accuracy"


@dataclass(frozen=True)
class TrainConfig:
    model: str
    dataset: str
    epochs: int
    batch_size: int
    lr: float
    keep_weights: bool
    study_dir: str
    backend: str = backends.DEFAULT
    """The Keras backend the workers run; each picks it when it starts (``determinism.apply``)."""
    own_model: OwnModel | None = None
    """``model`` is your own (its label): the spec the workers build it from (``models.own_build``)."""
    keep_saved_weights: bool = False
    """A saved model of your own starts every run from its saved weights instead of fresh ones from ``init``."""

    def settings(self, mode: Mode) -> DeterminismSettings:
        """What the workers of ``mode`` apply before their framework starts."""
        return DeterminismSettings(mode, backend=self.backend)  # type: ignore[arg-type]

    @property
    def keras(self) -> bool:
        """Whether the workers train through Keras: every model but a native module."""
        return self.own_model is None or kinds.native(self.own_model.api) is None

    @property
    def jit_compile(self) -> bool:
        """Keras' ``jit_compile`` for the step: the backend's own setting, the same in both modes."""
        return self.settings("deterministic").jit_compile


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite: the run has no meaningful final model."""


@functools.lru_cache(maxsize=1)
def load_dataset(name: str) -> datasets.Dataset:
    return datasets.load(name)


def random_crop_flip(x: np.ndarray, rng: np.random.Generator, flip: bool) -> np.ndarray:
    """Zero-pad by 1/8 of the side and crop back at a random offset; mirror half the images if ``flip``.

    Cropping is label-preserving for every dataset here; mirroring only where the classes
    are mirror-symmetric (CIFAR objects): a mirrored digit is often another or no digit.
    """
    n, h, w, _ = x.shape
    pad = max(1, min(h, w) // 8)
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (h, w), axis=(1, 2))
    dy = rng.integers(0, 2 * pad + 1, size=n)
    dx = rng.integers(0, 2 * pad + 1, size=n)
    out = np.ascontiguousarray(windows[np.arange(n), dy, dx].transpose(0, 2, 3, 1))
    if flip:
        mirrored = rng.random(n) < 0.5
        out[mirrored] = out[mirrored, :, ::-1]
    return out


def all_layers(model: keras.Model) -> list[keras.layers.Layer]:
    found = []
    for layer in model.layers:
        found.append(layer)
        if hasattr(layer, "layers"):
            found.extend(all_layers(layer))
    return found


def seed_stochastic_layers(model: keras.Model, seed: int) -> list[str]:
    """Reset every layer's seed generator (Dropout and kin) from the dropout seed; returns their names.

    Without this their masks would follow the init seed, which built them. The global seeds
    are set from it too: Keras on PyTorch runs a layer built without a seed through
    torch's own dropout, which draws from torch's global generator and not from the layer's
    seed generator. Nothing else in a run draws from the global generators.
    """
    import keras

    keras.utils.set_random_seed(seed)
    seeded = []
    for index, layer in enumerate(all_layers(model)):
        generator = getattr(layer, "seed_generator", None)
        state = getattr(generator, "state", None)
        if state is None:
            continue
        layer_seed = int(np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint32)[0] >> 1)
        state.assign(np.array([layer_seed, 0], dtype=state.dtype))
        seeded.append(layer.name)
    return seeded


def flip_one_weight(model: keras.Model, seed: int) -> dict[str, Any]:
    """Move one uniformly chosen trainable weight by one ulp, up or down (``one_weight``)."""
    variables = model.trainable_variables
    which, index, upward = variants.one_weight([int(np.prod(v.shape)) for v in variables], seed)
    variable = variables[which]
    values = np.array(variable.numpy())
    flat = values.reshape(-1)
    before = flat[index]
    flat[index] = np.nextafter(before, np.array(np.inf if upward else -np.inf, dtype=values.dtype))
    variable.assign(values)
    return {"variable": variable.path, "index": index, "before": float(before), "after": float(flat[index])}


def on_data(model: keras.Model, data_shape: tuple[int, ...]) -> keras.Model:
    """``model`` taking the dataset's images: resized (bilinear) in front when the model was built at another size.

    The resize is part of the compiled step, batch by batch, so a large dataset upsampled
    for a big model never sits in memory twice; it has no weights, so the model's own
    variables stay the only ones trained. It is ``keras.ops.image.resize`` in a plain layer,
    not the ``Resizing`` preprocessing layer: that one asks TensorFlow whether it runs in a
    tf.data graph, which fails in a JAX or PyTorch worker, where TensorFlow is kept out.
    """
    import keras

    if len(data_shape) != 3 or tuple(model.inputs[0].shape[1:3]) == data_shape[:2]:
        return model
    height, width = model.inputs[0].shape[1:3]
    inputs = keras.Input(shape=data_shape)
    resized = keras.layers.Lambda(
        lambda x: keras.ops.image.resize(x, (height, width), interpolation="bilinear"), name="resize"
    )(inputs)
    return keras.Model(inputs, model(resized), name=f"{model.name}_on_data")


def penultimate_output(model: keras.Model) -> keras.KerasTensor:
    """The layer named "penultimate", else whatever feeds the last layer that has weights (the classifier).

    A model nested whole and fed the input straight (a subclassed model, which
    ``own_build.defined`` wraps) hides its layers from this graph: what feeds it is the image
    itself, the same in every run, so the model's outputs stand in for its features.
    """
    import keras

    names = {layer.name for layer in model.layers}
    if "penultimate" in names:
        return model.get_layer("penultimate").output
    classifier = next(layer for layer in reversed(model.layers) if layer.weights)
    if isinstance(classifier, keras.Model) and any(classifier.input is t for t in model.inputs):
        return model.outputs[0]
    return classifier.input


class Trainer:
    """A model compiled once per worker; ``reset`` makes it what a fresh build would be.

    The same code on every backend: Keras' own compiled step (``train_on_batch``, and
    ``predict_on_batch`` on a model that shares the weights and outputs the penultimate
    features too), with ``jit_compile`` pinned by the caller to the same value in both modes.
    Keras' ``"auto"`` would not do: on TensorFlow it resolves differently with op determinism
    on, which would compare XLA against non-XLA.
    """

    def __init__(
        self,
        model_name: str,
        data_shape: tuple[int, ...],
        classes: int,
        lr: float,
        jit_compile: bool,
        own_model: OwnModel | None = None,
        keep_saved_weights: bool = False,
    ) -> None:
        import keras

        self.spec: registry.ModelSpec | OwnBuilder = (
            registry.get(model_name) if own_model is None else OwnBuilder(own_model, keep_saved_weights)
        )
        self.classes = classes
        self.input_shape, self.model = self._build(data_shape)
        self.outputs_probabilities = outputs_probabilities(self.model)
        self.training = on_data(self.model, data_shape)
        self.features = on_data(
            keras.Model(self.model.input, [penultimate_output(self.model), self.model.outputs[0]]), data_shape
        )
        optimizer = keras.optimizers.Adam(learning_rate=lr)
        optimizer.build(self.model.trainable_variables)
        self._optimizer_initial = [keras.ops.convert_to_numpy(v) for v in optimizer.variables]
        self.training.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=not self.outputs_probabilities),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name=ACCURACY)],
            jit_compile=jit_compile,
        )
        self.features.jit_compile = jit_compile
        self.optimizer = optimizer

    @property
    def step_name(self) -> str:
        """What trains, for the record: Keras may refuse XLA for a model and fall back, so this is what it kept."""
        return f"keras train_on_batch (jit_compile={self.training.jit_compile})"

    def _build(self, data_shape: tuple[int, ...]) -> tuple[tuple[int, ...], keras.Model]:
        """The model at the first candidate shape it accepts; the shape is the model's own (yours may fix it)."""
        errors = []
        for shape in datasets.candidate_input_shapes(data_shape):
            try:
                model = self.spec.build(shape, self.classes)
            except ValueError as exc:
                errors.append(f"{shape}: {exc}")
                continue
            return tuple(model.inputs[0].shape[1:]), model
        raise ValueError(f"{self.spec.name} cannot be built for {data_shape} images: {'; '.join(errors)}")

    def reset(self, seeds: RunSeeds) -> dict[str, Any]:
        import keras

        keras.utils.set_random_seed(seeds.init)
        fresh = self.spec.build(self.input_shape, self.classes)
        for target, source in zip(self.model.weights, fresh.weights, strict=True):
            target.assign(source.value)
        for variable, initial in zip(self.optimizer.variables, self._optimizer_initial, strict=True):
            variable.assign(initial)
        seeded = seed_stochastic_layers(self.model, seeds.dropout)
        applied: dict[str, Any] = {"seeded_stochastic_layers": seeded}
        if seeds.bitflip is not None:
            applied["bitflip"] = flip_one_weight(self.model, seeds.bitflip)
        return applied

    def train_step(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """One optimizer step: the batch's mean loss and how many of its labels (an image's, or each next
        token's) the model got right.

        Keras resets its metrics at every ``train_on_batch``, so the accuracy it returns is this
        batch's alone; times the batch's labels it is the count of hits (exact: a float32 ratio of
        two integers under 2**24 rounds back to the numerator).
        """
        logs = self.training.train_on_batch(x, y, return_dict=True)
        return float(logs["loss"]), round(float(logs[ACCURACY]) * y.size)

    def infer(self, x: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        feats, outs = [], []
        for start in range(0, len(x), batch_size):
            f, o = self.features.predict_on_batch(x[start : start + batch_size])
            feats.append(f.reshape(len(f), -1))
            outs.append(o)
        return np.concatenate(feats), np.concatenate(outs)

    def probabilities_and_loss(self, outputs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
        return metrics.probabilities_and_loss(outputs, y, self.outputs_probabilities)

    def layer_weights(self) -> list[tuple[str, list[np.ndarray]]]:
        """Each layer's weights by its name, in model order: what the digests and ``layer_digests`` cover."""
        return [(layer.name, [w.numpy() for w in layer.weights]) for layer in self.model.layers if layer.weights]

    def trainable_vector(self) -> np.ndarray:
        return np.concatenate([v.numpy().ravel() for v in self.model.trainable_variables])

    def named_weights(self) -> list[tuple[str, np.ndarray]]:
        """Every weight by its path, in layer order: the weights file of ``--keep-weights``."""
        return [(w.path, w.numpy()) for layer in self.model.layers for w in layer.weights]


trainer_for = functools.lru_cache(maxsize=1)(Trainer)
"""The worker's trainer, built once for the runs of one study: the same arguments give the same ``Trainer``."""


@functools.lru_cache(maxsize=1)
def native_trainer_for(
    trainer: type[ModuleTrainer | FlaxTrainer],
    own_model: OwnModel,
    shape: tuple[int, ...],
    takes: str,
    classes: int,
    lr: float,
) -> ModuleTrainer | FlaxTrainer:
    """The worker's trainer of a native module, made once for the runs of one study."""
    return trainer(own_model, shape, takes, classes, lr)


def _trainer(config: TrainConfig, data: datasets.Dataset) -> Trainer | ModuleTrainer | FlaxTrainer:
    """The worker's trainer for the study's model: a Keras model's, compiled once for all its runs (``trainer_for``),
    or a native module's (rebuilt every run)."""
    if not config.keras:
        assert config.own_model is not None
        native = FlaxTrainer if config.own_model.api == kinds.FLAX.api else ModuleTrainer
        return native_trainer_for(native, config.own_model, data.input_shape, data.takes, data.classes, config.lr)
    return trainer_for(
        config.model,
        data.input_shape,
        data.classes,
        config.lr,
        config.jit_compile,
        config.own_model,
        config.keep_saved_weights,
    )


def train(run: PlannedRun, config: TrainConfig, clock: PartClock) -> dict[str, Any]:
    """Train one run and store its arrays; returns the run's record (without status). On ``clock``: the data and
    the model as ``build``, the epochs (training and evaluating) as ``steps`` but the first training step's excess
    over the others as ``compile`` (a worker's first run compiles its step; compiling the evaluation, at its first
    call, stays in ``steps``), what it stores after them as ``other``."""
    started = time.perf_counter()
    data = load_dataset(config.dataset)
    trainer = _trainer(config, data)
    applied = trainer.reset(run.seeds)
    clock.lap("build")
    step_s: list[float] = []
    shuffle_rng = np.random.default_rng(run.seeds.shuffle)
    augment_rng = np.random.default_rng(run.seeds.augment)
    eval_batch = max(config.batch_size, MIN_EVAL_BATCH)
    n = len(data.x_train)
    curve = []
    for epoch in range(1, config.epochs + 1):
        order = shuffle_rng.permutation(n)
        x = data.x_train[order]
        if data.takes == "images":
            x = random_crop_flip(x, augment_rng, flip=data.flip_preserves_label)
        y = data.y_train[order]
        loss_sum, correct = 0.0, 0
        for start in range(0, n, config.batch_size):
            batch = slice(start, start + config.batch_size)
            step_started = time.monotonic()
            loss, hits = trainer.train_step(x[batch], y[batch])
            step_s.append(time.monotonic() - step_started)
            loss_sum += loss * len(y[batch])
            correct += hits
        if not np.isfinite(loss_sum):
            raise TrainingDiverged(f"training loss is not finite at epoch {epoch}")
        features, outputs = trainer.infer(data.x_test, eval_batch)
        probabilities, test_loss = trainer.probabilities_and_loss(outputs, data.y_test)
        predictions = probabilities.argmax(axis=1).astype(np.int32)
        curve.append(
            {
                "epoch": epoch,
                "train_loss": loss_sum / n,
                "train_accuracy": correct / data.y_train.size,
                "test_loss": test_loss,
                "test_accuracy": metrics.accuracy(data.test_labels, predictions),
            }
        )
    clock.lap("steps")
    clock.first_step_compiled(step_s)
    layers = trainer.layer_weights()
    digests = metrics.layer_digests(layers)
    per_class = metrics.per_class_accuracy(data.test_labels, predictions, data.classes)
    trainable = trainer.trainable_vector()
    study_dir = Path(config.study_dir)
    arrays_rel = f"{ARRAYS_DIR}/{run.run_id}.npz"
    _save_npz(
        study_dir / arrays_rel,
        predictions=predictions,
        probabilities=probabilities,
        representations=features.astype(np.float32),
        trainable_weights=trainable.astype(np.float32),
    )
    record: dict[str, Any] = {
        "accuracy": curve[-1]["test_accuracy"],
        "cross_entropy": curve[-1]["test_loss"],
        "per_class_accuracy": json_safe(per_class.astype(float)),
        "curve": curve,
        "weights_sha256": digest(w for _, ws in layers for w in ws),
        "layer_digests": [list(d) for d in digests],
        "input_shape": list(trainer.input_shape),
        "data_shape": list(data.input_shape),
        "outputs": "probabilities" if trainer.outputs_probabilities else "logits",
        "arrays": arrays_rel,
        "train_step": trainer.step_name,
        **applied,
    }
    if config.keep_weights:
        weights_rel = f"{WEIGHTS_DIR}/{run.run_id}.npz"
        named = trainer.named_weights()
        _save_npz(study_dir / weights_rel, **{f"{i:04d}_{name}": w for i, (name, w) in enumerate(named)})
        record["weights_file"] = weights_rel
    record["train_seconds"] = time.perf_counter() - started
    return record


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())
