"""Datasets for the stability study: bundled, synthetic, npz (with groups), bad inputs, augmentation."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sklearn.datasets

from detprof.errors import InputError, UsageError
from detprof.stability import datasets
from detprof.stability.training import random_crop_flip


def test_digits_is_the_bundled_set_split_once_and_stratified() -> None:
    raw = sklearn.datasets.load_digits()
    data = datasets.load("digits")
    assert data.x_train.shape[1:] == (8, 8, 1) and data.x_train.dtype == np.float32
    assert len(data.x_train) + len(data.x_test) == len(raw.target) == 1797
    assert data.x_train.min() >= 0.0 and data.x_train.max() <= 1.0
    assert data.classes == 10 and data.groups_test is None and not data.flip_preserves_label
    test_share = np.bincount(data.y_test, minlength=10) / np.bincount(raw.target, minlength=10)
    assert np.allclose(test_share, 0.25, atol=0.02)
    again = datasets.load("digits")
    np.testing.assert_array_equal(again.x_test, data.x_test)
    # Every test image is one of the originals, scaled by 1/16.
    originals = {img.tobytes() for img in (raw.images / 16.0).astype(np.float32)}
    assert all(img[..., 0].tobytes() in originals for img in data.x_test)


def test_digits_are_split_once_then_read_from_the_cache_without_scikit_learn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first load splits them and keeps the split in detprof's cache, under scikit-learn's version and the split;
    a later process reads it back, the same arrays, importing no scikit-learn; a cache that cannot be read is split
    again and rewritten."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = datasets.load("digits")
    cached = datasets.digits_cache()
    assert cached.parent == tmp_path / "detprof" / "datasets" and cached.is_file()
    split = datasets.split_digits()
    for name, fresh in zip(datasets.DIGITS_SPLITS, split, strict=True):
        np.testing.assert_array_equal(getattr(first, name), fresh)
        assert getattr(first, name).dtype == fresh.dtype
    read_back = "import sys; from detprof.stability import datasets; d = datasets.load('digits'); "
    read_back += "print(d.x_train.shape, d.y_test.dtype, 'sklearn' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", read_back], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[0] == "(1347, 8, 8, 1) int32 False"
    whole = cached.read_bytes()
    for unreadable in (b"not an archive", whole[: len(whole) // 2]):
        cached.write_bytes(unreadable)
        np.testing.assert_array_equal(datasets.load("digits").x_test, split[2])
    with np.load(cached) as arrays:
        np.testing.assert_array_equal(arrays["y_train"], split[1])


def test_synthetic_is_reproducible_and_has_test_groups() -> None:
    a, b = datasets.load("synthetic"), datasets.load("synthetic")
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.x_train.shape == (datasets.SYNTHETIC_TRAIN, *datasets.SYNTHETIC_SHAPE)
    assert a.groups_test is not None and set(np.unique(a.groups_test)) == {0, 1}
    assert set(np.unique(a.y_train)) == set(range(datasets.SYNTHETIC_CLASSES))


def _write(path: Path, **arrays: np.ndarray) -> str:
    np.savez(path, **arrays)
    return f"npz:{path}"


def _valid(n_train: int = 20, n_test: int = 10) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x_train": rng.integers(0, 256, (n_train, 6, 6, 3), dtype=np.uint8),
        "y_train": rng.integers(0, 2, n_train),
        "x_test": rng.integers(0, 256, (n_test, 6, 6, 3), dtype=np.uint8),
        "y_test": np.arange(n_test) % 2,
    }


def test_npz_with_string_groups(tmp_path: Path) -> None:
    arrays = _valid() | {"groups_test": np.array(["male", "female"] * 5)}
    data = datasets.load(_write(tmp_path / "celeba_like.npz", **arrays))
    assert data.classes == 2 and data.input_shape == (6, 6, 3)
    np.testing.assert_allclose(data.x_train, arrays["x_train"].astype(np.float32) / 255.0)
    np.testing.assert_array_equal(data.groups_test, arrays["groups_test"])
    assert data.y_test.dtype == np.int32


def test_npz_grey_images_without_channel_and_column_labels(tmp_path: Path) -> None:
    arrays = _valid()
    arrays["x_train"] = np.random.default_rng(1).random((20, 5, 5)).astype(np.float64)
    arrays["x_test"] = np.random.default_rng(2).random((10, 5, 5))
    arrays["y_train"] = arrays["y_train"].reshape(-1, 1).astype(np.float32)
    data = datasets.load(_write(tmp_path / "grey.npz", **arrays))
    assert data.x_train.shape == (20, 5, 5, 1) and data.x_train.dtype == np.float32
    np.testing.assert_allclose(data.x_train[..., 0], arrays["x_train"].astype(np.float32))
    assert data.y_train.shape == (20,)


def test_npz_images_stored_channels_first_are_held_channels_last(tmp_path: Path) -> None:
    """The file that feeds a PyTorch module in ``sweep --data`` (N, C, H, W) serves its stability study too."""
    arrays = _valid()
    first = {k: np.ascontiguousarray(v.transpose(0, 3, 1, 2)) if k.startswith("x_") else v for k, v in arrays.items()}
    last, stored_first = (
        datasets.load(_write(tmp_path / "last.npz", **arrays)),
        datasets.load(_write(tmp_path / "first.npz", **first)),
    )
    assert stored_first.input_shape == last.input_shape == (6, 6, 3)
    np.testing.assert_array_equal(stored_first.x_train, last.x_train)
    np.testing.assert_array_equal(stored_first.x_test, last.x_test)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda a: a.pop("y_test"), "missing array\\(s\\) y_test"),
        (lambda a: a.update(y_train=a["y_train"][:5]), "y_train must hold one label per image \\(20\\)"),
        (lambda a: a.update(y_test=np.full(10, 0.5)), "y_test must hold integer labels"),
        (lambda a: a.update(y_test=-np.ones(10, int)), "y_test holds negative labels"),
        (lambda a: a.update(x_test=np.zeros((10, 7, 7, 3), np.uint8)), "x_train images are \\(6, 6, 3\\)"),
        (lambda a: a.update(x_train=np.zeros((20, 6), np.float32)), "x_train must be a non-empty"),
        (lambda a: a.update(x_test=np.full((10, 6, 6, 3), np.nan)), "x_test contains NaN"),
        (lambda a: a.update(y_train=np.zeros(20, int), y_test=np.zeros(10, int)), "at least 2"),
        (lambda a: a.update(groups_test=np.zeros(3, int)), "groups_test must hold one group per test image"),
        (lambda a: a.update(groups_test=np.zeros(10, float)), "integer or string group labels"),
    ],
)
def test_npz_bad_contents_are_one_line_input_errors(tmp_path: Path, mutate, message: str) -> None:
    arrays = _valid()
    mutate(arrays)
    name = _write(tmp_path / "bad.npz", **arrays)
    with pytest.raises(InputError, match=message) as info:
        datasets.load(name)
    assert "\n" not in str(info.value) and "bad.npz" in str(info.value)


def test_npz_that_is_not_an_archive(tmp_path: Path) -> None:
    path = tmp_path / "junk.npz"
    path.write_bytes(b"this is not a zip file")
    with pytest.raises(InputError, match=r"not a readable \.npz archive"):
        datasets.load(f"npz:{path}")
    np.save(tmp_path / "one.npy", np.arange(3))
    (tmp_path / "one.npy").rename(path)
    with pytest.raises(InputError, match=r"one \.npy array, not a \.npz archive of named arrays"):
        datasets.load(f"npz:{path}")


def test_dataset_names_are_checked() -> None:
    with pytest.raises(UsageError, match="unknown dataset 'imagenet'; valid datasets: digits, cifar10"):
        datasets.canonical_name("imagenet")
    with pytest.raises(InputError, match="no such file"):
        datasets.canonical_name("npz:/no/such/file.npz")
    with pytest.raises(UsageError, match="needs a path"):
        datasets.canonical_name("npz:")
    assert datasets.canonical_name(" CIFAR10 ") == "cifar10"


def test_cifar_offline_names_the_file_and_the_cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without a network, whether or not this one has one: every connection attempt fails, as it does
    where no route leads out."""

    def unreachable(*args: object, **kwargs: object) -> None:
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "getaddrinfo", unreachable)
    monkeypatch.setattr(socket.socket, "connect", unreachable)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    with pytest.raises(InputError) as info:
        datasets.load("cifar10")
    message = str(info.value)
    assert "\n" not in message
    assert "cifar10: not in the Keras cache and cannot be downloaded (" in message and "unreachable" in message
    assert "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in message
    assert str(tmp_path / "keras" / "datasets" / "cifar-10-batches-py-target_archive") in message


def test_candidate_input_shapes() -> None:
    assert datasets.candidate_input_shapes((8, 8, 1)) == [(8, 8, 1), (32, 32, 1), (75, 75, 1), (224, 224, 1)]
    assert datasets.candidate_input_shapes((32, 32, 3)) == [(32, 32, 3), (75, 75, 3), (224, 224, 3)]
    assert datasets.candidate_input_shapes((300, 300, 3)) == [(300, 300, 3)]
    assert datasets.candidate_input_shapes((16,)) == [(16,)]  # token sequences: their own length only


def test_random_crop_is_a_window_of_the_zero_padded_image() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((50, 8, 8, 2)).astype(np.float32)
    out = random_crop_flip(x, np.random.default_rng(7), flip=False)
    assert out.shape == x.shape and out.dtype == x.dtype
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    for i in range(len(x)):
        windows = [padded[i, dy : dy + 8, dx : dx + 8] for dy in range(3) for dx in range(3)]
        assert any(np.array_equal(out[i], w) for w in windows)
    shifted = sum(not np.array_equal(out[i], x[i]) for i in range(len(x)))
    assert shifted > 30  # 8 of 9 offsets move the image
    np.testing.assert_array_equal(out, random_crop_flip(x, np.random.default_rng(7), flip=False))


def test_flip_mirrors_about_half_the_images_only_when_asked() -> None:
    x = np.random.default_rng(0).random((400, 32, 32, 3)).astype(np.float32)
    out = random_crop_flip(x, np.random.default_rng(3), flip=True)
    padded = np.pad(x, ((0, 0), (4, 4), (4, 4), (0, 0)))

    def is_window(img: np.ndarray, i: int) -> bool:
        return any(np.array_equal(img, padded[i, dy : dy + 32, dx : dx + 32]) for dy in range(9) for dx in range(9))

    mirrored = [not is_window(out[i], i) and is_window(out[i, :, ::-1], i) for i in range(len(x))]
    assert 150 < sum(mirrored) < 250


def test_the_markov_language_is_a_chain_its_sequences_follow_with_two_reference_losses() -> None:
    data = datasets.load("markov")
    again = datasets.load("markov")
    np.testing.assert_array_equal(data.x_train, again.x_train)
    assert data.takes == "tokens" and data.x_train.dtype == np.int32
    assert data.x_train.shape == (datasets.MARKOV_TRAIN, datasets.MARKOV_LENGTH) == data.y_train.shape
    assert data.input_shape == (datasets.MARKOV_LENGTH,) and data.classes == datasets.MARKOV_VOCABULARY
    np.testing.assert_array_equal(data.x_train[:, 1:], data.y_train[:, :-1])  # y is x shifted by one token
    assert data.test_labels.shape == (datasets.MARKOV_TEST * datasets.MARKOV_LENGTH,)
    # The entropy rate the generator states is what its sequences show: the conditional entropy of the next token
    # given this one, counted over the training transitions.
    counts = np.zeros((data.classes, data.classes))
    np.add.at(counts, (data.x_train.ravel(), data.y_train.ravel()), 1)
    joint = counts / counts.sum()
    conditional = joint / joint.sum(axis=1, keepdims=True).clip(1e-12)
    seen = joint > 0
    counted_rate = -(joint[seen] * np.log(conditional[seen])).sum()
    frequencies = np.bincount(data.x_train.ravel(), minlength=data.classes) / data.x_train.size
    counted_frequencies = -(frequencies[frequencies > 0] * np.log(frequencies[frequencies > 0])).sum()
    assert data.entropy_rate == pytest.approx(counted_rate, abs=0.15)
    assert data.frequency_entropy == pytest.approx(counted_frequencies, abs=0.05)
    assert data.entropy_rate < data.frequency_entropy - 1.5
    middle = (data.entropy_rate + data.frequency_entropy) / 2
    assert data.learned(middle - 0.01) is True and data.learned(middle + 0.01) is False
    assert datasets.load("digits").learned(0.1) is None


def _token_npz(path: Path, **changes: np.ndarray) -> Path:
    rng = np.random.default_rng(0)
    x_train, x_test = rng.integers(0, 50, (40, 12)), rng.integers(0, 50, (10, 12))
    arrays = {"x_train": x_train, "y_train": np.roll(x_train, -1, 1), "x_test": x_test, "y_test": x_test + 1}
    np.savez(path, **{**arrays, **changes})
    return path


def test_an_npz_of_integer_sequences_is_token_data(tmp_path: Path) -> None:
    path = _token_npz(tmp_path / "tokens.npz")
    assert datasets.takes(f"npz:{path}") == "tokens" and datasets.takes("digits") == "images"
    data = datasets.load(f"npz:{path}")
    assert (data.takes, data.input_shape, data.classes) == ("tokens", (12,), 51)
    assert data.entropy_rate is None and data.learned(1.0) is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"y_train": np.zeros((40, 11), dtype=np.int64)}, r"y_train must hold the next token at each position"),
        ({"x_test": np.zeros((10, 9), np.int64), "y_test": np.ones((10, 9), np.int64)}, r"differ in length \(12 and 9"),
        ({"y_test": -np.ones((10, 12), dtype=np.int64)}, "negative token ids"),
    ],
)
def test_bad_token_npz_is_one_line(tmp_path: Path, changes: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InputError, match=message):
        datasets.load(f"npz:{_token_npz(tmp_path / 'tokens.npz', **changes)}")
