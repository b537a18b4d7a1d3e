"""What runs inside a stability worker process.

A worker serves one determinism mode for its whole life: the mode is applied in the pool
initializer, before TensorFlow does any work, because op determinism cannot be switched
off again inside a process. Runs then execute one after another in the same process. Any
exception in a run becomes a "failed" record with its reason, so the worker and the
study go on. Ctrl-C is left to the parent, which stops the pool; a worker interrupted
mid-run would otherwise report a half-finished run as failed.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from detprof import determinism
from detprof.errors import first_line
from detprof.records import StabilityRun, stability_run
from detprof.stability import training
from detprof.stability.variants import PlannedRun

LOGS_DIR = "logs"

_context: dict[str, Any] = {}


def initialize(settings: determinism.DeterminismSettings, study_dir: str, env: Mapping[str, str]) -> None:
    """Pool initializer: quiet Ctrl-C, set the GPU environment, log TensorFlow's chatter to a file, apply the mode.

    ``env`` (``gpu_env``: which GPU, if any, and memory growth when workers share it) must
    act before TensorFlow loads, which ``determinism.apply`` does.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)
    log_path = Path(study_dir) / LOGS_DIR / f"worker-{settings.mode}-{os.getpid()}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    effective = determinism.apply(settings)
    _context.update(
        determinism=effective,
        software=determinism.software_versions(),
        device_name=_device_name(),
        log=str(log_path.relative_to(study_dir)),
    )


def _device_name() -> str:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "cpu"
    return str(tf.config.experimental.get_device_details(gpus[0]).get("device_name", gpus[0].name))


def execute(run: PlannedRun, config: training.TrainConfig) -> StabilityRun:
    """Train one run; never raises, so one bad run cannot take the pool down.

    Running out of memory is named as such ("out of memory: ..."), as in the sweep's worker,
    so the reason says what to change: fewer --jobs or a smaller batch.
    """
    identity = {"run_id": run.run_id, "variant": run.variant, "run": run.run_index, "mode": run.mode}
    context = {"pid": os.getpid(), **_context}
    try:
        measured = training.train(run, config)
    except Exception as exc:
        traceback.print_exc()
        reason = first_line(exc, with_type=True)
        if _out_of_memory(exc):
            reason = f"out of memory: {reason}"
        return stability_run(**identity, seeds=run.seeds.as_dict(), status="failed", reason=reason, **context)
    return stability_run(**identity, seeds=run.seeds.as_dict(), status="ok", **context, **measured)


def _out_of_memory(exc: Exception) -> bool:
    """TensorFlow's out-of-memory error exists only once TensorFlow is loaded, so it is not imported here."""
    if isinstance(exc, MemoryError):
        return True
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(exc, tf.errors.ResourceExhaustedError)
