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
    # The embedded default on a machine without a GPU: small models, small inputs, measured in
    # lockstep pairs (profiler.plan.Pairing) on a heap that stays put (process.STEADY_HEAP_ENV),
    # the models of a repeat by one pair of workers. The worker process is a random effect, so
    # precision comes from the number of pairs and their steps; each run takes its steps twice,
    # untraced (wall time) and traced (kernel time). These are the fewest that conclude within
    # the budget (README, "How the measurement concludes", has the A/A figures).
    "cpu-small": {
        "models": ("smallcnn", "mediumcnn_k1", "mediumcnn_k3"),
        "steps": 80,
        "warmup": 5,
        "repeats": 6,
        "batch_size": 32,
        "input_size": 32,
        "classes": 10,
    },
}

STABILITY_MODELS: dict[str, tuple[str, ...] | None] = {
    "paper": None,
    # The embedded stability study trains on scikit-learn's bundled digits (8x8 images, 60
    # epochs). The medium CNNs do not learn them in that budget (mediumcnn_k1: 16% accuracy
    # against 10% chance) and take minutes each, so `sweep --stability` studies smallcnn only.
    "cpu-small": ("smallcnn",),
}
"""Per preset, the swept models ``sweep --stability`` studies (None: every swept model)."""
