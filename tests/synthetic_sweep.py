"""Synthetic sweep results in the documented record format, with known injected overheads.

The check's tests need sweeps whose true overhead is known: each model's per-repeat
det/default ratios are chosen by the test, the default time drifts from repeat to repeat
(as a real GPU's does) and the deterministic time is exactly ratio x default, so the
expected log ratios are ln(ratio) whatever the drift.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detprof.records import MeasuredRun, measured_run
from detprof.store import ResultsStore

DEVICE: dict[str, Any] = {
    "label": "t4",
    "name": "Tesla T4",
    "uuid": "GPU-5fd1c0e2-0000-0000-0000-000000000000",
    "driver": "550.54.15",
    "cuda_driver": "12.4",
    "compute_capability": "7.5",
    "sm_count": 40,
    "memory_bytes": 15_843_721_216,
}
VERSIONS: dict[str, Any] = {
    "detprof": "0.1.0",
    "python": "3.11.9",
    "tensorflow": "2.21.0",
    "keras": "3.15.0",
    "cuda_build": "12.5.1",
    "cudnn_build": "9",
}
STEPS = 20


def config(models: Sequence[str], repeats: int, **overrides: Any) -> dict[str, Any]:
    base = {
        "models": list(models),
        "modes": ["default", "deterministic"],
        "steps": STEPS,
        "warmup": 5,
        "repeats": repeats,
        "batch_size": 64,
        "input_size": None,
        "classes": None,
        "tracer": "nsys",
        "xla": False,
        "gpu_label": "t4",
        "seed": 0,
        "preset": "paper",
    }
    base.update(overrides)
    return base


def settings(mode: str) -> dict[str, Any]:
    return {
        "mode": mode,
        "seed": 0,
        "xla": False,
        "op_determinism": mode == "deterministic",
        "jit_compile": False,
        "cudnn_autotune": True,
        "deprecated_tf_deterministic_ops_env": None,
    }


def noisy_overheads(median: float, sigma: float, repeats: int, seed: int) -> list[float]:
    """Per-repeat det/default ratios, log-normal around ``median`` with log-sd ``sigma``."""
    rng = np.random.default_rng(seed)
    return [float(v) for v in np.exp(np.log(median) + rng.normal(0.0, sigma, repeats))]


def records(
    overheads: Mapping[str, Sequence[float]],
    *,
    kernel_overheads: Mapping[str, Sequence[float]] | None = None,
    tracer: str = "nsys",
    device: Mapping[str, Any] | None = None,
    versions: Mapping[str, Any] | None = None,
    failed: Mapping[str, str] | None = None,
    unsupported: Mapping[str, str] | None = None,
) -> list[MeasuredRun]:
    """One record per (model, mode, repeat); ``failed``/``unsupported`` map a run_id to its reason."""
    failed = failed or {}
    unsupported = unsupported or {}
    out = []
    for model, ratios in overheads.items():
        kernel_ratios = (kernel_overheads or {}).get(model, ratios)
        for repeat, ratio in enumerate(ratios):
            default_wall = 40e6 * (1 + 0.013 * repeat)
            default_kernel = 25e6 * (1 + 0.011 * repeat)
            times = {
                "default": (default_wall, default_kernel),
                "deterministic": (default_wall * ratio, default_kernel * kernel_ratios[repeat]),
            }
            for mode, (wall, kernel) in times.items():
                out.append(_record(model, mode, repeat, wall, kernel, tracer, device, versions, failed, unsupported))
    return out


def _record(
    model: str,
    mode: str,
    repeat: int,
    wall: float,
    kernel: float,
    tracer: str,
    device: Mapping[str, Any] | None,
    versions: Mapping[str, Any] | None,
    failed: Mapping[str, str],
    unsupported: Mapping[str, str],
) -> MeasuredRun:
    run_id = f"{model}--{mode}--r{repeat}"
    status, reason = "ok", None
    if run_id in failed:
        status, reason = "failed", failed[run_id]
    elif run_id in unsupported:
        status, reason = "unsupported", unsupported[run_id]
    ok = status == "ok"
    traced = ok and tracer != "none"
    return measured_run(
        run_id=run_id,
        model=model,
        mode=mode,
        repeat=repeat,
        status=status,
        reason=reason,
        steps=STEPS,
        warmup=5,
        batch_size=64,
        input_shape=[224, 224, 3],
        classes=1000,
        tracer=tracer,
        step_wall_ns=[round(wall)] * STEPS if ok else None,
        kernel_ns_per_step=kernel if traced else None,
        kernel_count=1200 if traced else None,
        settings=settings(mode),
        versions=dict(versions or VERSIONS),
        device=dict(device or DEVICE),
        started_at="2025-01-01T00:00:00+00:00",
        finished_at="2025-01-01T00:00:10+00:00",
        duration_s=10.0,
    )


def write_sweep(root: Path, sweep_config: Mapping[str, Any], run_records: Sequence[Mapping[str, Any]]) -> Path:
    """Write a results directory exactly as the sweep does: manifest, then one record per run."""
    store = ResultsStore(root, "sweep")
    store.open(copy.deepcopy(dict(sweep_config)), "detprof sweep (synthetic test data)", resume=False)
    for record in run_records:
        store.write_record(dict(record))
    return root
