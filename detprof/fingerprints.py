"""Fingerprints of tensors: a digest for bitwise equality, and what sizes a difference when two are not equal.

Two runs are the same run only if every tensor they computed is the same to the bit, so a
fingerprint's ``digest`` hashes the tensor's bytes (with its shape and dtype). When two digests
differ, their ``max_abs`` and ``l2`` say how large the tensors are, and the ``sample`` (the
values at positions fixed by the tensor's size, the same in every run) sizes the difference:
the largest absolute difference over the sample, exact for a tensor no larger than the sample.
A stability study's weight digests and ``detprof verify``'s fingerprints are both made here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

import detprof.backends as backends
from detprof.errors import InputError, first_line

SAMPLE_SIZE = 1024
"""Values kept per tensor per step to size a difference: 4 KiB for a float32 tensor, so that 20 steps of
ResNet50 (about 290 tensors a step) keep 23 MB a run."""
Kind = Literal["output", "weights", "gradients", "tensor"]
"""A layer's output, its weights, a variable's gradient (``detprof verify``'s models), or another tensor that a
training program fingerprinted (``detprof.fingerprint``)."""


def digest(arrays: Iterable[np.ndarray]) -> str:
    """sha256 of the arrays' bytes in order: equal digests mean bitwise-equal arrays."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@functools.cache
def sample_positions(size: int) -> np.ndarray:
    """The flat positions every run samples of a tensor of ``size`` elements: all of them up to ``SAMPLE_SIZE``."""
    if size <= SAMPLE_SIZE:
        return np.arange(size)
    return np.sort(np.random.default_rng(size).choice(size, SAMPLE_SIZE, replace=False))


@dataclass(frozen=True)
class Fingerprint:
    """One tensor of one step: a layer's output, a layer's weights after the update, a variable's gradient, or
    what a program fingerprinted (``detprof.fingerprint``)."""

    name: str
    """The layer's name (``layer.name``), the variable's path for gradients; a program's name for the value,
    then the layer's or the tensor's (``model/dense``)."""
    kind: Kind
    digest: str
    shape: tuple[int, ...]
    max_abs: float
    l2: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fingerprint:
        return cls(
            str(data["name"]),
            data["kind"],
            str(data["digest"]),
            tuple(int(d) for d in data["shape"]),
            float(data["max_abs"]),
            float(data["l2"]),
        )


def fingerprint(name: str, kind: Kind, arrays: list[np.ndarray]) -> tuple[Fingerprint, np.ndarray]:
    """The fingerprint of ``arrays`` (one tensor, or a layer's weights in order) and its sample.

    Sizes are summed over a layer's weights, taken as one flat tensor: what a difference in
    any of them does to the layer. They are computed array by array, in float32 or float64 as
    the arrays come (other types widened to float64: float16 would overflow a sum of squares),
    and the sample gathered from them in place: a copy of every weight of a large model in
    float64 would cost more memory and time than the training step.
    """
    size = sum(int(a.size) for a in arrays)
    shape = tuple(arrays[0].shape) if len(arrays) == 1 else (size,)
    floats = [a if a.dtype in (np.float32, np.float64) else a.astype(np.float64) for a in arrays]
    found = Fingerprint(
        name,
        kind,
        digest(arrays),
        shape,
        max((max(float(a.max()), -float(a.min())) for a in floats if a.size), default=0.0),
        float(np.sqrt(sum(float(np.vdot(a, a)) for a in floats))),
    )
    return found, _sample(floats, size)


def _sample(arrays: list[np.ndarray], size: int) -> np.ndarray:
    """The values at ``sample_positions(size)`` of the arrays taken as one flat tensor, in the widest of their
    types (float32 for most: half the file of float64, and every float32 value held exactly)."""
    positions = sample_positions(size)
    starts = np.cumsum([0, *(a.size for a in arrays)])
    dtype = np.result_type(np.float32, *(a.dtype for a in arrays)) if arrays else np.float32
    parts = [
        np.ravel(a)[positions[(positions >= start) & (positions < start + a.size)] - start]
        for a, start in zip(arrays, starts, strict=False)
    ]
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


def tensors_of(name: str, value: Any) -> Iterator[tuple[str, Kind, list[np.ndarray]]]:
    """What ``detprof.fingerprint(name, value)`` fingerprints: each tensor's name, kind and arrays.

    A ``keras.Model``: each layer's weights as one fingerprint (``name/layer``), as ``verify``
    fingerprints a model's layers; a framework's own model (a ``torch.nn.Module``): each of its
    tensors (``name/0.weight``, ``Backend.named_tensors``); a mapping: each of its values as
    ``name/key``; anything else is one tensor (``name``). Each is read by the framework the
    program loaded (a framework not in ``sys.modules`` cannot have made ``value``, and importing
    it would put a framework into a program that does not use it).
    """
    keras = sys.modules.get("keras")
    if keras is not None and isinstance(value, keras.Model):
        for layer in value.layers:
            if layer.weights:
                yield f"{name}/{layer.name}", "weights", [keras.ops.convert_to_numpy(w.value) for w in layer.weights]
        return
    for backend in backends.loaded():
        named = backend.named_tensors(value)
        if named is not None:
            for key, tensor in named:
                yield f"{name}/{key}", "weights", [_array(f"{name}/{key}", tensor)]
            return
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from tensors_of(f"{name}/{key}", item)
    else:
        yield name, "tensor", [_array(name, value)]


def _array(name: str, value: Any) -> np.ndarray:
    """One array or tensor as NumPy: through its framework where ``np.asarray`` cannot read it (a torch tensor), the
    rest through their own ``__array__`` (TensorFlow, JAX, Keras variables, NumPy, numbers)."""
    for backend in backends.loaded():
        host = backend.host_array(value)
        if host is not None:
            return host
    array = np.asarray(value)
    if array.dtype == object:
        raise TypeError(
            f"detprof.fingerprint({name!r}, ...): cannot fingerprint a value of type {type(value).__name__}: give a "
            "keras.Model, a torch.nn.Module, a mapping of names to values, or an array or tensor"
        )
    return array


def sampled_difference(a: np.ndarray, b: np.ndarray) -> float:
    """The largest absolute difference between two runs' samples of one tensor (inf where their sizes differ)."""
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


FINGERPRINTS_FILE = "fingerprints.json"
SAMPLES_FILE = "samples.npz"


@dataclass
class RunFingerprints:
    """One run's fingerprints, step by step, and the samples that size a difference: a run's folder holds
    them as ``FINGERPRINTS_FILE`` and ``SAMPLES_FILE``."""

    steps: list[list[Fingerprint]] = field(default_factory=list)
    samples: dict[str, np.ndarray] = field(default_factory=dict)

    def begin_step(self) -> None:
        self.steps.append([])

    def add(self, name: str, kind: Kind, arrays: list[np.ndarray]) -> None:
        """The fingerprint of ``arrays`` in the step begun last; a name taken in that step already is numbered
        (``name#2``), so that a program fingerprinting one value twice in a step keeps both."""
        step = len(self.steps) - 1
        numbered, count = name, 1
        while _sample_key(step, kind, numbered) in self.samples:
            count += 1
            numbered = f"{name}#{count}"
        found, sample = fingerprint(numbered, kind, arrays)
        self.steps[-1].append(found)
        self.samples[_sample_key(step, kind, numbered)] = sample

    def sample(self, step: int, found: Fingerprint) -> np.ndarray:
        return self.samples[_sample_key(step, found.kind, found.name)]

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        steps = [[f.to_json() for f in step] for step in self.steps]
        (folder / FINGERPRINTS_FILE).write_text(json.dumps({"steps": steps}))
        np.savez(folder / SAMPLES_FILE, **self.samples)

    @classmethod
    def load(cls, folder: Path) -> RunFingerprints:
        """A run's fingerprints as ``save`` wrote them; one line naming the folder where they are missing or damaged
        (a crash, a hand edit): the run is measured anew once its record is gone."""
        try:
            steps = json.loads((folder / FINGERPRINTS_FILE).read_text())["steps"]
            with np.load(folder / SAMPLES_FILE, allow_pickle=False) as samples:
                loaded = {key: samples[key] for key in samples.files}
            return cls([[Fingerprint.from_json(f) for f in step] for step in steps], loaded)
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
            record = folder.parent.parent / "runs" / f"{folder.name}.json"
            raise InputError(
                f"{folder}: unreadable fingerprints ({first_line(exc, with_type=True)}): delete {record} and run "
                "the study again with --resume to measure that run anew"
            ) from exc


def _sample_key(step: int, kind: Kind, name: str) -> str:
    return f"{step}/{kind}/{name}"
