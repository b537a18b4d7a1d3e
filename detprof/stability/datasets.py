"""The data a stability study trains on: image classes (float32 NHWC) or next tokens (int32 ids).

The split is fixed (never drawn from a run's seeds): every run of every variant is scored
on the same test examples, which is what makes churn and per-example comparisons mean
anything. Loading is numpy-only except for the CIFAR downloads (through Keras), so the
parent process can validate ``--dataset`` without starting TensorFlow.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from detprof.errors import InputError, UsageError, first_line
from detprof.models.npz_data import (
    IMAGE_CHANNELS,
    NPZ_PREFIX,
    headers,
    npz_path,
    read_arrays,
    scaled,
    whole_numbers,
)
from detprof.store import atomic_write_bytes, user_cache_dir

NAMES: tuple[str, ...] = ("digits", "cifar10", "cifar100", "synthetic", "markov", "npz:PATH")
BUILT_IN = ("digits", "cifar10", "cifar100", "synthetic", "markov")
TOKEN_DATASETS = frozenset({"markov"})
NPZ_REQUIRED = ("x_train", "y_train", "x_test", "y_test")

CIFAR_ORIGINS = {
    "cifar10": ("cifar-10-batches-py-target", "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
    "cifar100": ("cifar-100-python-target", "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
}

SYNTHETIC_SHAPE = (16, 16, 3)
DEFAULT_IMAGES = "digits"
"""What a stability study of images trains on unless ``--dataset`` says otherwise."""
IMAGE_SHAPES = {"digits": (8, 8, 1), "synthetic": SYNTHETIC_SHAPE, "cifar10": (32, 32, 3), "cifar100": (32, 32, 3)}
"""The built-in datasets' images (HxWxC), known without loading them: what a model that takes others is told."""
SYNTHETIC_CLASSES = 10
SYNTHETIC_TRAIN = 2000
SYNTHETIC_TEST = 500
DIGITS_TEST_FRACTION = 0.25
MARKOV_VOCABULARY, MARKOV_LENGTH = 64, 16
"""gpt_tiny's and moe_tiny's vocabulary and sequence length, so that they train on it as built."""
MARKOV_CONCENTRATION = 0.1
"""Each token's next-token distribution is drawn from a symmetric Dirichlet of this concentration: a few likely
successors per token, so the chain's entropy rate (2.35 nats) sits far below its tokens' frequency entropy (4.08)
and a model that learned the transitions is told from one that learned the frequencies."""
MARKOV_TRAIN, MARKOV_TEST = 2048, 256


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    groups_test: np.ndarray | None = None
    flip_preserves_label: bool = False
    """Mirror images keep their label (CIFAR objects), unlike digits or arbitrary npz data."""
    takes: str = "images"
    """``images`` (one label each) or ``tokens`` (sequences, a next token per position; ``classes``: the vocabulary)."""
    entropy_rate: float | None = None
    """A generated language's entropy rate, nats per token: the held-out loss of a model that knows its rules."""
    frequency_entropy: float | None = None
    """Its tokens' frequency entropy: the loss of a model that learned which tokens are common, nothing more."""

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def test_labels(self) -> np.ndarray:
        """One label per scored example: an image's class, or each position's next token, flattened."""
        return self.y_test.reshape(-1)

    def learned(self, test_loss: float) -> bool | None:
        """Whether a held-out loss is closer to the entropy rate than to the frequency entropy (None: no reference)."""
        if self.entropy_rate is None or self.frequency_entropy is None:
            return None
        return abs(test_loss - self.entropy_rate) < abs(test_loss - self.frequency_entropy)


def canonical_name(name: str) -> str:
    """Validate ``--dataset`` without loading anything heavy."""
    path = npz_path(name, "--dataset")
    if path is not None:
        return f"{NPZ_PREFIX}{path}"
    key = name.strip().lower()
    if key not in BUILT_IN:
        raise UsageError(f"unknown dataset {name!r}; valid datasets: {', '.join(NAMES)}")
    return key


def load(name: str) -> Dataset:
    key = canonical_name(name)
    if key.startswith(NPZ_PREFIX):
        return load_npz(Path(key[len(NPZ_PREFIX) :]))
    if key == "digits":
        return load_digits()
    if key == "synthetic":
        return make_synthetic()
    if key == "markov":
        return make_markov()
    return load_cifar(key)


DIGITS_SPLITS = ("x_train", "y_train", "x_test", "y_test")


def load_digits() -> Dataset:
    """scikit-learn's digits, split as ``split_digits`` splits them; read from detprof's cache where a process split
    them before (``digits_cache``): importing scikit-learn to split them again took a stability worker 1.2 s of CPU,
    every worker of every study."""
    cached = digits_cache()
    try:
        with np.load(cached) as arrays:
            split = tuple(arrays[name] for name in DIGITS_SPLITS)
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        split = split_digits()
        with contextlib.suppress(OSError):
            buffer = io.BytesIO()
            np.savez(buffer, **dict(zip(DIGITS_SPLITS, split, strict=True)))
            atomic_write_bytes(cached, buffer.getvalue())
    return Dataset("digits", *split, classes=10)


def digits_cache() -> Path:
    """The split digits under what they depend on: scikit-learn's version (its copy of the data) and the split."""
    version = importlib.metadata.version("scikit-learn")
    return user_cache_dir() / "datasets" / f"digits-sklearn{version}-test{DIGITS_TEST_FRACTION}-seed0.npz"


def split_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x_train, y_train, x_test, y_test: the images scaled to [0, 1] (8x8x1), a stratified split."""
    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    digits = sk_load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., np.newaxis]
    y = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=DIGITS_TEST_FRACTION, random_state=0, stratify=y
    )
    return x_train, y_train, x_test, y_test


def make_synthetic(seed: int = 0) -> Dataset:
    """Each class a colour and a stripe frequency under pixel noise; test group 1 is twice as noisy.

    Learnable in a few epochs by a small CNN (colour and texture survive global pooling) and
    needing no download, it exercises every metric, including the sub-group ones, anywhere.
    """
    rng = np.random.default_rng(seed)
    h, w, c = SYNTHETIC_SHAPE
    colours = rng.normal(0.0, 0.5, size=(SYNTHETIC_CLASSES, 1, 1, c))
    rows = np.arange(h)[:, None, None]
    frequencies = np.linspace(0.5, 3.0, SYNTHETIC_CLASSES)
    stripes = np.stack([np.sin(2 * np.pi * f * rows / h) * np.ones((h, w, 1)) for f in frequencies])
    templates = (colours + stripes).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        y = rng.integers(0, SYNTHETIC_CLASSES, size=n).astype(np.int32)
        groups = rng.integers(0, 2, size=n).astype(np.int32)
        noise_scale = np.where(groups == 1, 2.0, 1.0)[:, None, None, None]
        x = templates[y] + noise_scale * rng.normal(0.0, 1.0, size=(n, h, w, c))
        return x.astype(np.float32), y, groups

    x_train, y_train, _ = draw(SYNTHETIC_TRAIN)
    x_test, y_test, groups_test = draw(SYNTHETIC_TEST)
    return Dataset("synthetic", x_train, y_train, x_test, y_test, SYNTHETIC_CLASSES, groups_test)


def takes(name: str) -> str:
    """What the canonical dataset ``name`` holds, without loading it: ``tokens`` or ``images`` (an npz file's
    integer (N, L) ``x_train`` is tokens)."""
    if name in TOKEN_DATASETS:
        return "tokens"
    if name.startswith(NPZ_PREFIX):
        header = headers(Path(name[len(NPZ_PREFIX) :])).get("x_train")
        if header is not None and _token_ids(header.shape, header.dtype):
            return "tokens"
    return "images"


def _token_ids(shape: tuple[int, ...], dtype: np.dtype | str) -> bool:
    """An integer (N, L) ``x_train`` holds token ids; images are (N, H, W[, C])."""
    return len(shape) == 2 and np.dtype(dtype).kind in "iu"


def make_markov(seed: int = 0) -> Dataset:
    """Sequences of a fixed random Markov chain: a small language generated by code, learnable in seconds.

    Every sequence starts from the chain's stationary distribution, so every position follows the same
    statistics and the two reference losses hold at each of them.
    """
    rng = np.random.default_rng(seed)
    transitions = rng.dirichlet(np.full(MARKOV_VOCABULARY, MARKOV_CONCENTRATION), size=MARKOV_VOCABULARY)
    stationary = _stationary(transitions)
    successors = np.log(np.where(transitions > 0, transitions, 1.0))
    entropy_rate = float(-(stationary[:, None] * transitions * successors).sum())
    frequency_entropy = float(-(stationary * np.log(stationary)).sum())
    cumulative = np.cumsum(transitions, axis=1)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.empty((n, MARKOV_LENGTH + 1), dtype=np.int32)
        tokens[:, 0] = rng.choice(MARKOV_VOCABULARY, size=n, p=stationary)
        for t in range(1, MARKOV_LENGTH + 1):
            drawn = (rng.random(n)[:, None] > cumulative[tokens[:, t - 1]]).sum(axis=1)
            tokens[:, t] = np.minimum(drawn, MARKOV_VOCABULARY - 1)
        return tokens[:, :-1], tokens[:, 1:]

    x_train, y_train = draw(MARKOV_TRAIN)
    x_test, y_test = draw(MARKOV_TEST)
    return Dataset(
        "markov",
        x_train,
        y_train,
        x_test,
        y_test,
        MARKOV_VOCABULARY,
        takes="tokens",
        entropy_rate=entropy_rate,
        frequency_entropy=frequency_entropy,
    )


def _stationary(transitions: np.ndarray) -> np.ndarray:
    """The distribution the chain keeps: the left eigenvector of eigenvalue 1, normalised."""
    values, vectors = np.linalg.eig(transitions.T)
    stationary = np.abs(np.real(vectors[:, np.argmin(np.abs(values - 1.0))]))
    return stationary / stationary.sum()


def keras_cache_dir() -> Path:
    """Where ``keras.utils.get_file`` looks: $KERAS_HOME or ~/.keras, /tmp/.keras when unwritable."""
    base = Path(os.environ.get("KERAS_HOME", "~/.keras")).expanduser()
    if base.exists() and not os.access(base, os.W_OK):
        base = Path("/tmp/.keras")
    return base / "datasets"


def load_cifar(key: str) -> Dataset:
    import keras

    archive_name, origin = CIFAR_ORIGINS[key]
    module = keras.datasets.cifar10 if key == "cifar10" else keras.datasets.cifar100
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            (x_train, y_train), (x_test, y_test) = module.load_data()
    except Exception as exc:
        place = keras_cache_dir() / f"{archive_name}_archive"
        raise InputError(
            f"{key}: not in the Keras cache and cannot be downloaded ({first_line(exc)}); "
            f"download {origin} and place it as {place}"
        ) from exc
    return Dataset(
        key,
        scaled(x_train),
        y_train.reshape(-1).astype(np.int32),
        scaled(x_test),
        y_test.reshape(-1).astype(np.int32),
        classes=10 if key == "cifar10" else 100,
        flip_preserves_label=True,
    )


def load_npz(path: Path) -> Dataset:
    arrays = read_arrays(path)
    missing = [k for k in NPZ_REQUIRED if k not in arrays]
    if missing:
        raise InputError(f"{path}: missing array(s) {', '.join(missing)} (needs {', '.join(NPZ_REQUIRED)})")
    if _token_ids(arrays["x_train"].shape, arrays["x_train"].dtype):
        return _token_npz(path, arrays)
    x_train = _images(path, "x_train", arrays["x_train"])
    x_test = _images(path, "x_test", arrays["x_test"])
    y_train = _labels(path, "y_train", arrays["y_train"], len(x_train))
    y_test = _labels(path, "y_test", arrays["y_test"], len(x_test))
    if x_train.shape[1:] != x_test.shape[1:]:
        raise InputError(f"{path}: x_train images are {x_train.shape[1:]} but x_test images are {x_test.shape[1:]}")
    classes = int(max(y_train.max(), y_test.max())) + 1
    if classes < 2:
        raise InputError(f"{path}: the labels name a single class; a classifier needs at least 2")
    groups = None
    if "groups_test" in arrays:
        groups = _groups(path, arrays["groups_test"], len(x_test))
    return Dataset(f"npz:{path}", x_train, y_train, x_test, y_test, classes, groups)


def _token_npz(path: Path, arrays: dict[str, np.ndarray]) -> Dataset:
    """Integer (N, L) ``x_*`` are token ids; ``y_*`` the next token at each position, the same shape."""
    split = {}
    for part in ("train", "test"):
        x, y = arrays[f"x_{part}"], arrays[f"y_{part}"]
        if x.ndim != 2 or np.dtype(x.dtype).kind not in "iu" or len(x) == 0:
            raise InputError(f"{path}: x_{part} must be a non-empty (N, L) array of token ids, got {x.shape} {x.dtype}")
        if y.shape != x.shape or np.dtype(y.dtype).kind not in "iu":
            raise InputError(
                f"{path}: y_{part} must hold the next token at each position of x_{part} ({x.shape}), got {y.shape}"
            )
        if min(x.min(), y.min()) < 0:
            raise InputError(f"{path}: x_{part} or y_{part} holds negative token ids")
        split[part] = (x.astype(np.int32), y.astype(np.int32))
    if split["train"][0].shape[1] != split["test"][0].shape[1]:
        lengths = f"{split['train'][0].shape[1]} and {split['test'][0].shape[1]}"
        raise InputError(f"{path}: x_train's and x_test's sequences differ in length ({lengths} tokens)")
    vocabulary = int(max(a.max() for pair in split.values() for a in pair)) + 1
    (x_train, y_train), (x_test, y_test) = split["train"], split["test"]
    return Dataset(f"npz:{path}", x_train, y_train, x_test, y_test, vocabulary, takes="tokens")


def _images(path: Path, key: str, x: np.ndarray) -> np.ndarray:
    """The images as a study holds them, (N, H, W, C): stored so, or (N, H, W) with one channel, or channels first
    as a PyTorch module takes them (the file that feeds ``sweep --data``), told apart by which axis holds a number of
    channels."""
    if x.ndim == 3:
        x = x[..., np.newaxis]
    if x.ndim != 4 or len(x) == 0:
        raise InputError(
            f"{path}: {key} must be a non-empty (N,H,W), (N,H,W,C) or (N,C,H,W) image array, got {x.shape}"
        )
    if x.shape[1] in IMAGE_CHANNELS and x.shape[3] not in IMAGE_CHANNELS:
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise InputError(f"{path}: {key} must be numeric, got {x.dtype}")
    values = scaled(x)
    if not np.isfinite(values).all():
        raise InputError(f"{path}: {key} contains NaN or infinite values")
    return values


def _labels(path: Path, key: str, y: np.ndarray, n: int) -> np.ndarray:
    flat = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
    if flat.ndim != 1 or len(flat) != n:
        raise InputError(f"{path}: {key} must hold one label per image ({n}), got shape {y.shape}")
    if not whole_numbers(flat):
        raise InputError(f"{path}: {key} must hold integer labels, got {y.dtype}")
    if flat.min() < 0:
        raise InputError(f"{path}: {key} holds negative labels")
    return flat.astype(np.int32)


def _groups(path: Path, groups: np.ndarray, n: int) -> np.ndarray:
    """Group labels may be integers or strings ("male", "female"): they only name sub-groups."""
    if groups.ndim != 1 or len(groups) != n:
        raise InputError(f"{path}: groups_test must hold one group per test image ({n}), got {groups.shape}")
    if not (np.issubdtype(groups.dtype, np.integer) or np.issubdtype(groups.dtype, np.str_)):
        raise InputError(f"{path}: groups_test must hold integer or string group labels, got {groups.dtype}")
    return groups


def candidate_input_shapes(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The data's own shape first, then the minimum sizes Keras applications insist on.

    Fully convolutional models (the small CNN, ResNet-18) train at the data's own size;
    Keras applications refuse inputs under 32x32 (75x75 for Inception, 71x71 for Xception),
    so the caller tries these in order and keeps the first the builder accepts. Images are
    resized batch by batch inside the training step, never the whole set at once, so a
    large dataset upsampled for a big model does not have to fit in memory twice. Token sequences
    have one shape, their own.
    """
    if len(shape) != 3:
        return [shape]
    h, w, c = shape
    shapes = [shape]
    for side in (32, 75, 224):
        if side > min(h, w):
            candidate = (max(h, side), max(w, side), c)
            if candidate not in shapes:
                shapes.append(candidate)
    return shapes
