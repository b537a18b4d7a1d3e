"""A ``WorkerSpec`` for calling a workload in the test's own process, as the worker would."""

from __future__ import annotations

from typing import Any

from detprof.determinism import DeterminismSettings
from detprof.profiler.worker_spec import WorkerSpec


def spec_for(params: dict[str, Any], settings: DeterminismSettings | None = None) -> WorkerSpec:
    """``params`` for the workload, run in ``settings`` (default mode on TensorFlow), untraced."""
    return WorkerSpec(
        run_id="test",
        workload="",
        determinism=settings or DeterminismSettings("default"),
        warmup=0,
        wall_steps=1,
        traced_steps=0,
        settling_steps=0,
        tracer="none",
        trace_path=None,
        result_path="",
        log_path="",
        params=params,
    )
