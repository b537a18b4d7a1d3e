"""Synthetic sweep results in the documented record format, with known injected overheads.

The check's tests need sweeps whose true overhead is known: each model's per-repeat
det/default ratios are chosen by the test, the default time drifts from repeat to repeat
(as a real GPU's does) and the deterministic time is exactly ratio x default, so the
expected log ratios are ln(ratio) whatever the drift.

``backend`` (tensorflow, jax or torch) writes what a sweep on that Keras backend writes: the
record's ``backend`` field, its framework's versions and the settings it reports in effect
(``determinism.effective_settings``), and the backend in the configuration. Left out, the
records are those of a sweep from before there was a choice: no ``backend`` anywhere, which
readers take for TensorFlow.
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
BACKEND_VERSIONS: dict[str, dict[str, Any]] = {
    "tensorflow": VERSIONS,
    "jax": {
        "detprof": "0.1.0",
        "python": "3.11.9",
        "keras": "3.15.0",
        "jax": "0.4.38",
        "jaxlib": "0.4.38",
        "is_cuda_build": True,
        "gpus_visible": 1,
    },
    "torch": {
        "detprof": "0.1.0",
        "python": "3.11.9",
        "keras": "3.15.0",
        "torch": "2.6.0",
        "cuda_build": "12.4",
        "cudnn_build": 90100,
        "is_cuda_build": True,
        "gpus_visible": 1,
    },
}
"""What ``determinism.software_versions`` reports on each backend."""
STEPS = 20


def config(models: Sequence[str], repeats: int, backend: str | None = None, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
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
    if backend is not None:
        base |= {"backend": backend, "compile": False}
    base.update(overrides)
    return base


def settings(mode: str, backend: str | None = None) -> dict[str, Any]:
    """What the worker's framework reports in effect; without a backend, as TensorFlow runs reported it before."""
    deterministic = mode == "deterministic"
    tensorflow = {"jit_compile": False, "cudnn_autotune": True, "deprecated_tf_deterministic_ops_env": None}
    common = {"mode": mode, "seed": 0, "xla": False, "op_determinism": deterministic}
    if backend is None:
        return common | tensorflow
    own = {
        "tensorflow": tensorflow,
        "jax": {"jit_compile": True, "xla_flags": "--xla_gpu_deterministic_ops=true" if deterministic else ""},
        "torch": {
            "jit_compile": False,
            "deterministic_warn_only": False,
            "cudnn_deterministic": deterministic,
            "cudnn_benchmark": False,
            "cublas_workspace_config": ":4096:8" if deterministic else None,
        },
    }[backend]
    return common | {"backend": backend, "compile": False} | own


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
    backend: str | None = None,
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
                out.append(
                    _record(model, mode, repeat, wall, kernel, tracer, device, versions, failed, unsupported, backend)
                )
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
    backend: str | None,
) -> MeasuredRun:
    run_id = f"{model}--{mode}--r{repeat}"
    on_backend = {} if backend is None else {"backend": backend}
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
        settings=settings(mode, backend),
        versions=dict(versions or BACKEND_VERSIONS[backend or "tensorflow"]),
        device=dict(device or DEVICE),
        started_at="2025-01-01T00:00:00+00:00",
        finished_at="2025-01-01T00:00:10+00:00",
        duration_s=10.0,
        **on_backend,
    )


def write_sweep(root: Path, sweep_config: Mapping[str, Any], run_records: Sequence[Mapping[str, Any]]) -> Path:
    """Write a results directory exactly as the sweep does: manifest, then one record per run."""
    store = ResultsStore(root, "sweep")
    store.open(copy.deepcopy(dict(sweep_config)), "detprof sweep (synthetic test data)", resume=False)
    for record in run_records:
        store.write_record(dict(record))
    return root
