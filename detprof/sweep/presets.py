"""The sweep's presets, in one place: what ``detprof sweep`` runs when an option is not given."""

from __future__ import annotations

from typing import Any

from detprof.models.registry import PAPER_MODELS

PRESETS: dict[str, dict[str, Any]] = {
    # Zhuang et al.'s protocol: the Keras applications at their own input size, batch 64.
    "paper": {
        "models": tuple(PAPER_MODELS),
        "steps": 100,
        "warmup": 10,
        "repeats": 3,
        "batch_size": 64,
        "input_size": None,
        "classes": None,
    },
    # The embedded default on a machine without a GPU: small models, small inputs.
    "cpu-small": {
        "models": ("smallcnn", "mediumcnn_k1", "mediumcnn_k3"),
        "steps": 20,
        "warmup": 5,
        "repeats": 3,
        "batch_size": 32,
        "input_size": 32,
        "classes": 10,
    },
}
