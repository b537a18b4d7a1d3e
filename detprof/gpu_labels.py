"""GPU labels: the names results are filed and compared under, whether a label names a GPU's board, and whether a
run's device was a CPU at all.

A label (``t4``, ``a100-80gb``, ``cpu``) is what a results directory, a baseline and a fleet's
node type are keyed by; the sweep checks it against the device (``profiler.devices``), and the
report holds measured labels against published figures (``reports.published``). Nothing here
needs a GPU or NVML.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from detprof.errors import UsageError

CPU_LABEL = "cpu"
GPU_ONLY_FIELDS = ("uuid", "driver", "cuda_driver", "compute_capability", "sm_count", "memory_bytes")
"""The ``device`` fields of a run record that only a GPU fills (None on a CPU)."""
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro"})
_MODEL_SUFFIXES = frozenset({"ti", "super", "ada", "d"})
_LABEL_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

KNOWN_GPUS: dict[str, tuple[str, ...]] = {
    "t4": ("Tesla T4",),
    "v100": (
        "Tesla V100-SXM2-16GB",
        "Tesla V100-SXM2-32GB",
        "Tesla V100-PCIE-16GB",
        "Tesla V100-PCIE-32GB",
        "Tesla V100-DGXS-32GB",
    ),
    "a100": (
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A100-PCIE-40GB",
        "NVIDIA A100 80GB PCIe",
    ),
    "h100": ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL"),
    "h200": ("NVIDIA H200", "NVIDIA H200 NVL"),
    "gh200": ("NVIDIA GH200 480GB",),
    "b200": ("NVIDIA B200",),
    "l4": ("NVIDIA L4",),
    "l40": ("NVIDIA L40",),
    "l40s": ("NVIDIA L40S",),
    "a10": ("NVIDIA A10",),
    "a10g": ("NVIDIA A10G",),
    "a30": ("NVIDIA A30",),
    "a40": ("NVIDIA A40",),
    "a4000": ("NVIDIA RTX A4000",),
    "a5000": ("NVIDIA RTX A5000",),
    "a6000": ("NVIDIA RTX A6000",),
    "k80": ("Tesla K80",),
    "p4": ("Tesla P4",),
    "p40": ("Tesla P40",),
    "p100": ("Tesla P100-PCIE-12GB", "Tesla P100-PCIE-16GB", "Tesla P100-SXM2-16GB"),
    "v100s": ("Tesla V100S-PCIE-32GB",),
    "titanv": ("NVIDIA TITAN V",),
    "rtx5000": ("Quadro RTX 5000",),
    "rtx6000": ("Quadro RTX 6000",),
    "rtx8000": ("Quadro RTX 8000",),
    "rtx5000ada": ("NVIDIA RTX 5000 Ada Generation",),
    "rtx6000ada": ("NVIDIA RTX 6000 Ada Generation",),
    "2080ti": ("NVIDIA GeForce RTX 2080 Ti",),
    "3080": ("NVIDIA GeForce RTX 3080",),
    "3090": ("NVIDIA GeForce RTX 3090",),
    "3090ti": ("NVIDIA GeForce RTX 3090 Ti",),
    "4080": ("NVIDIA GeForce RTX 4080",),
    "4090": ("NVIDIA GeForce RTX 4090",),
    "5090": ("NVIDIA GeForce RTX 5090",),
}
"""The GPU labels detprof knows, each with the names NVML gives those boards.

A label is known when it names one of these boards in ``label_matches``'s sense, so the
longer spellings work too (``tesla-t4``, ``a100-80gb``, ``nvidia-a100-sxm4-80gb``,
``rtx-5000``). The table exists to catch typos before anything runs; a board missing from
it is still accepted whenever it is the GPU detected, so it never blocks a truthful label.
"""


GENERATIONS: dict[str, tuple[str, ...]] = {
    "Kepler": ("k80",),
    "Pascal": ("p4", "p40", "p100"),
    "Volta": ("v100", "v100s", "titanv"),
    "Turing": ("t4", "rtx5000", "rtx6000", "rtx8000", "2080ti"),
    "Ampere": ("a100", "a10", "a10g", "a30", "a40", "a4000", "a5000", "a6000", "3080", "3090", "3090ti"),
    "Ada Lovelace": ("l4", "l40", "l40s", "rtx5000ada", "rtx6000ada", "4080", "4090"),
    "Hopper": ("h100", "h200", "gh200"),
    "Blackwell": ("b200", "5090"),
}
"""The architecture of each label of ``KNOWN_GPUS``: where detprof measured nothing on a board, what it measured on
another board of its architecture is the nearest estimate it has (``gpu_study.study.measured_costs``)."""


def generation(gpu: str) -> str | None:
    """The architecture of a GPU (its name as NVML gives it, or a label), where ``KNOWN_GPUS`` knows it."""
    return next((name for name, labels in GENERATIONS.items() for label in labels if label_matches(label, gpu)), None)


def _model_tokens(text: str) -> list[str]:
    """The words of a GPU name that tell models apart: vendor and product-line words
    carry no information, and a suffix such as Ti or Super is part of the model number."""
    tokens: list[str] = []
    for word in re.split(r"[^a-z0-9]+", text.lower()):
        if not word or word in _VENDOR_WORDS:
            continue
        if word in _MODEL_SUFFIXES and tokens:
            tokens[-1] += word
        else:
            tokens.append(word)
    return tokens


def _runs_match(wanted: list[str], tokens: list[str]) -> bool:
    """Each wanted word is one name word or several adjacent ones joined, in order."""
    if not wanted:
        return True
    first = wanted[0]
    for start in range(len(tokens)):
        joined = ""
        for end in range(start, len(tokens)):
            joined += tokens[end]
            if joined == first and _runs_match(wanted[1:], tokens[end + 1 :]):
                return True
    return False


def label_matches(label: str, gpu_name: str) -> bool:
    """True when the label spells whole words of the name, in order: ``t4`` matches
    ``Tesla T4``, ``rtx5000`` matches ``Quadro RTX 5000`` and ``a100-80gb`` matches
    ``NVIDIA A100-SXM4-80GB``, but ``l4`` never matches ``L40S``, ``a10`` never ``A100``
    and ``a100-40gb`` never an 80 GB card."""
    wanted = _model_tokens(label)
    return bool(wanted) and _runs_match(wanted, _model_tokens(gpu_name))


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def normalize_label(label: str) -> str:
    norm = label.strip().lower()
    if not _LABEL_RE.match(norm):
        raise UsageError(
            f"--gpu {label!r} is not a usable label: use letters, digits, '.', '_' or '-' (e.g. t4, a100, cpu)"
        )
    if norm != CPU_LABEL and not _model_tokens(norm):
        raise UsageError(f"--gpu {label!r} names no GPU model (e.g. t4, v100, a100, h100, or cpu)")
    return norm


def known_label(label: str) -> bool:
    """True when ``label`` names a board of ``KNOWN_GPUS`` (``cpu`` is checked apart)."""
    return any(label_matches(label, name) for names in KNOWN_GPUS.values() for name in names)


def refuse_unknown(label: str) -> None:
    known = ", ".join([*KNOWN_GPUS, CPU_LABEL])
    raise UsageError(f"unknown GPU label {label!r} (known: {known})")


def is_cpu(label: str, device: Mapping[str, Any]) -> bool:
    """A CPU device: labelled ``cpu``, or its record names no GPU (none of ``GPU_ONLY_FIELDS`` filled)."""
    return label.lower() == CPU_LABEL or not any(device.get(k) for k in GPU_ONLY_FIELDS)
