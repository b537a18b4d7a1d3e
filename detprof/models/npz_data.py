"""Arrays from a user's ``.npz`` file: the whole archive for a stability study, one batch for a sweep.

``stability --dataset npz:PATH`` and ``sweep --data npz:PATH`` read the same file the same way:
the option's ``npz:`` prefix, the error lines, uint8 pixels scaled to [0, 1]. A sweep needs only
``batch_size`` examples of a file that may hold a whole dataset, so its parent reads the arrays'
headers (names, shapes, dtypes) and its workers read the leading rows alone, never the rest.
numpy only: the parent process validates the file without a framework.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from detprof.errors import InputError, UsageError, first_line

NPZ_PREFIX = "npz:"
NPY_SUFFIX = ".npy"

IMAGE_CHANNELS = (1, 3, 4)
"""The channels an image has (grey, RGB, RGBA): what tells images stored channels last from channels first."""


def channels_last(example: tuple[int, ...]) -> bool:
    """One example is an image stored HxWxC: its last axis holds a number of channels and its first does not."""
    return len(example) == 3 and example[-1] in IMAGE_CHANNELS and example[0] not in IMAGE_CHANNELS


def channels_first(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Images' HxWxC as a PyTorch module takes them, CxHxW; any other shape as it is."""
    return (shape[-1], *shape[:-1]) if len(shape) == 3 else shape


def moved_channels_first(stored: tuple[int, ...], taken: tuple[int | None, ...]) -> bool:
    """Examples stored HxWxC reach a model that takes ``taken`` moved channels first (``module_batch``)."""
    return channels_last(stored) and channels_first(stored) == tuple(taken)


def npz_path(text: str, option: str) -> Path | None:
    """The file ``npz:PATH`` names, made absolute; None when ``text`` is not an ``npz:`` value."""
    if not text.strip().lower().startswith(NPZ_PREFIX):
        return None
    raw = text.strip()[len(NPZ_PREFIX) :].strip()
    if not raw:
        raise UsageError(f"{option} npz:PATH needs a path after 'npz:'")
    path = Path(raw).expanduser()
    if not path.is_file():
        raise InputError(f"{path}: no such file ({option} npz:PATH)")
    return path.resolve()


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of the archive, loaded; one line when it is not a readable ``.npz``."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            raise InputError(f"{path}: one .npy array, not a .npz archive of named arrays")
        with loaded as archive:
            return {k: archive[k] for k in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: not a readable .npz archive ({first_line(exc)})") from exc


@dataclass(frozen=True)
class ArrayHeader:
    shape: tuple[int, ...]
    dtype: str


def headers(path: Path) -> dict[str, ArrayHeader]:
    """Each array's shape and dtype, read from its ``.npy`` header without loading its data."""
    found = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if member.endswith(NPY_SUFFIX):
                    with archive.open(member) as stream:
                        shape, _, dtype = _read_header(stream)
                    found[member[: -len(NPY_SUFFIX)]] = ArrayHeader(tuple(shape), dtype.str)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: not a readable .npz archive ({first_line(exc)})") from exc
    if not found:
        raise InputError(f"{path}: not a readable .npz archive (it holds no arrays)")
    return found


def _read_header(stream: zipfile.ZipExtFile) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(stream)
    return np.lib.format.read_array_header_2_0(stream)


def leading_rows(path: Path, name: str, rows: int) -> np.ndarray:
    """The first ``rows`` entries along the first axis of array ``name``, reading only those bytes.

    A Fortran-ordered array stores its first rows scattered over the whole file, so it is
    loaded whole and sliced.
    """
    with zipfile.ZipFile(path) as archive, archive.open(name + NPY_SUFFIX) as stream:
        shape, fortran_order, dtype = _read_header(stream)
        if dtype.hasobject:
            raise InputError(f"{path}: array {name!r} holds Python objects, not numbers")
        count = min(rows, shape[0]) if shape else 0
        if fortran_order:
            return np.load(path, allow_pickle=False)[name][:count]
        row_items = int(np.prod(shape[1:], dtype=np.int64))
        data = stream.read(count * row_items * dtype.itemsize)
    return np.frombuffer(data, dtype=dtype).reshape((count, *shape[1:])).copy()


def whole_numbers(values: np.ndarray) -> bool:
    """Whether ``values`` can be class labels: integers, or floats each a whole number (labels saved as floats)."""
    return bool(np.issubdtype(values.dtype, np.integer)) or (
        bool(np.issubdtype(values.dtype, np.floating)) and bool(np.all(values == np.round(values)))
    )


def probability_rows(scores: np.ndarray, axis: int = -1, atol: float = 1e-8) -> bool:
    """Whether ``scores`` hold a probability per class along ``axis``, row by row: non-negative, each row summing to
    1 within ``atol``. A softmax's output is (a model's that ends in one), and a one-hot label; logits of a random
    batch never are."""
    return bool(scores.min() >= 0 and np.allclose(scores.sum(axis=axis), 1.0, atol=atol))


def scaled(x: np.ndarray) -> np.ndarray:
    """uint8 pixels to [0, 1]; anything else is taken as already scaled."""
    if x.dtype == np.uint8:
        return (x.astype(np.float32) / 255.0).astype(np.float32)
    return x.astype(np.float32)


def module_batch(
    feed: Mapping[str, Any], shape: tuple[int, ...], rows: int, tokens: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The leading ``rows`` of ``--data``'s arrays as a native module takes them (``shape``, its own layout): token
    ids (int64), or pixels scaled as the Keras path scales them (images stored HxWxC moved channels first where the
    module takes them so); the labels as int64. The module's kind puts them on its framework."""
    path = feed["path"]
    ((_, x_name),) = feed["inputs"]
    ((_, y_name),) = feed["targets"]
    values = leading_rows(path, x_name, rows)
    if moved_channels_first(values.shape[1:], shape):
        values = np.ascontiguousarray(values.transpose(0, 3, 1, 2))
    values = values.reshape((len(values), *shape))
    x = values.astype(np.int64) if tokens else scaled(values)
    return x, leading_rows(path, y_name, rows).astype(np.int64)
