"""The sweep's presets, in one place: what ``detprof sweep`` runs when an option is not given."""

from __future__ import annotations

from typing import Any

from detprof.models.registry import PAPER_MODELS

PAPER_PROTOCOL: dict[str, Any] = {"steps": 100, "warmup": 10, "repeats": 3, "batch_size": 64, "input_size": None}
"""Zhuang et al.'s protocol, which the sweep and the kernels bench (``kernels_bench.presets``) both follow under
``--preset paper``: each model at its own input size, batch 64."""

PRESETS: dict[str, dict[str, Any]] = {
    "paper": {
        "models": tuple(PAPER_MODELS),
        **PAPER_PROTOCOL,
        "classes": None,
        "precision": None,
        "budget_s": None,
        "run_seconds": None,
    },
    # The embedded default on a machine without a GPU: small models, small inputs, paired in one
    # process where the backend can switch between steps, else in lockstep pairs
    # (profiler.measured_runs.Pairing), on a heap that stays put (process.STEADY_HEAP_ENV), the models of a
    # repeat by one process (or pair of them). After a first stage of 4 repeats, each model gets
    # repeats until its interval is within +/-2% or the next would pass 90 s. Each run takes its
    # steps twice, untraced (wall time) and traced (kernel time), as many as fill a run length on
    # this machine (at most 80), so a slow machine takes fewer steps, not more time. The run length
    # follows the pairing (``run_seconds`` per ``Pairing``): between two processes of a lockstep pair
    # the process's own speed is most of what varies from repeat to repeat, so their runs are short
    # and the time goes to repeats; in one process that cancels, the steps' own noise is what is
    # left, and longer runs pay (docs/concepts.md says why).
    "cpu-small": {
        "models": ("smallcnn", "mediumcnn_k1", "mediumcnn_k3"),
        "steps": 80,
        "warmup": 5,
        "repeats": 4,
        "batch_size": 32,
        "input_size": 32,
        "classes": 10,
        "precision": 0.02,
        "budget_s": 90.0,
        "run_seconds": {"in_process": 2.0, "lockstep": 0.25, "sequential": 2.0},
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

STABILITY_RUNS: dict[str, int] = {
    "paper": 5,
    # `make sweep` (the sweep, this study and the report) must end within 3 minutes on a 2-core machine
    # whatever its speed: on one where importing TensorFlow takes 7 s, 5 runs per variant took 2 minutes
    # alone, 3 take about 75 s. `detprof stability` runs 5 (10 off the embedded digits).
    "cpu-small": 3,
}
"""Per preset, the runs per variant of ``sweep --stability``'s study (3 or more: a spread needs them)."""
