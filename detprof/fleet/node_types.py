"""The one table from detprof's GPU labels to Ray's accelerator types, and what a node of a type carries.

Ray names a GPU node's type from the board's name (``Tesla T4`` is ``T4``) and gives the node
the resource ``accelerator_type:<TYPE>`` and the label ``ray.io/accelerator-type``; a test
cluster sets the resource by hand (``ray start --resources``). Ray's names are not detprof's
labels (``a4000`` is ``RTX-A4000``), and two of detprof's labels share one Ray name
(``rtx5000`` and ``rtx5000ada`` are both ``RTX-5000``): the node's own check of the label
against its GPU (``detprof doctor``) tells those apart before anything is scheduled there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from detprof.errors import UsageError

RAY_ACCELERATOR_TYPES: dict[str, str] = {
    "t4": "T4",
    "v100": "V100",
    "v100s": "V100S",
    "a100": "A100",
    "h100": "H100",
    "h200": "H200",
    "gh200": "GH200",
    "b200": "B200",
    "l4": "L4",
    "l40": "L40",
    "l40s": "L40S",
    "a10": "A10",
    "a10g": "A10G",
    "a30": "A30",
    "a40": "A40",
    "a4000": "RTX-A4000",
    "a5000": "RTX-A5000",
    "a6000": "RTX-A6000",
    "k80": "K80",
    "p4": "P4",
    "p40": "P40",
    "p100": "P100",
    "titanv": "TITAN-V",
    "rtx5000": "RTX-5000",
    "rtx6000": "RTX-6000",
    "rtx8000": "RTX-8000",
    "rtx5000ada": "RTX-5000",
    "rtx6000ada": "RTX-6000",
    "2080ti": "GeForce-RTX-2080-Ti",
    "3080": "GeForce-RTX-3080",
    "3090": "GeForce-RTX-3090",
    "3090ti": "GeForce-RTX-3090-Ti",
    "4080": "GeForce-RTX-4080",
    "4090": "GeForce-RTX-4090",
    "5090": "GeForce-RTX-5090",
}
"""Every GPU label detprof knows (``gpu_labels.KNOWN_GPUS``) and the type Ray gives its nodes."""

RESOURCE_PREFIX = "accelerator_type:"
NODE_LABEL = "ray.io/accelerator-type"


def ray_accelerator_type(label: str) -> str:
    """Ray's name for the GPU type ``label`` names; one line for a label with none (``cpu``, a typo)."""
    norm = label.strip().lower()
    if norm not in RAY_ACCELERATOR_TYPES:
        raise UsageError(
            f"--gpu {label!r} names no GPU type a Ray cluster schedules by; with --ray give one of "
            f"{', '.join(RAY_ACCELERATOR_TYPES)}"
        )
    return RAY_ACCELERATOR_TYPES[norm]


def carries(node: Mapping[str, Any], label: str) -> bool:
    """Whether a node (as ``ray.nodes()`` lists it) is of the GPU type ``label``: its resource or its label."""
    wanted = ray_accelerator_type(label)
    resources = node.get("Resources") or {}
    return resources.get(RESOURCE_PREFIX + wanted, 0) > 0 or (node.get("Labels") or {}).get(NODE_LABEL) == wanted


def types_carried(node: Mapping[str, Any]) -> set[str]:
    """The Ray accelerator types a node carries, for saying what a cluster has when a type is missing."""
    resources = node.get("Resources") or {}
    found = {name.removeprefix(RESOURCE_PREFIX) for name in resources if name.startswith(RESOURCE_PREFIX)}
    node_label = (node.get("Labels") or {}).get(NODE_LABEL)
    return found | ({node_label} if node_label else set())
