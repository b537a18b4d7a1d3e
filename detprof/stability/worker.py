"""What runs inside a stability worker process.

A worker serves one backend and one determinism mode for its whole life: both are applied
in the pool initializer, before the framework does any work, because Keras picks its
backend when it is imported and determinism cannot be switched off again inside a
process. Runs then execute one after another in the same process. Any exception in a run
becomes a "failed" record with its reason, so the worker and the study go on. Ctrl-C is
left to the parent, which stops the pool; a worker interrupted mid-run would otherwise
report a half-finished run as failed.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from detprof import backends, determinism
from detprof.device_time import clock_since, running_clock
from detprof.errors import first_line
from detprof.profiler.lifeline import end_with_driver
from detprof.records import StabilityRun, stability_run
from detprof.stability import training
from detprof.stability.variants import PlannedRun

LOGS_DIR = "logs"

_context: dict[str, Any] = {}


def initialize(
    settings: determinism.DeterminismSettings,
    study_dir: str,
    env: Mapping[str, str],
    keras: bool = True,
    threads: int | None = None,
) -> None:
    """Pool initializer: end with the driver, quiet Ctrl-C, set the GPU environment, log the framework's
    chatter to a file, apply the mode (loading Keras unless the study trains a native PyTorch module, ``keras``),
    give the framework its share of the CPU's cores (``threads``, ``study.cpu_threads``; None: its own default),
    and compile in this process (``Backend.compile_in_this_process``: the
    runs of two workers can then differ in what compiling chose, as two processes on a GPU do).

    ``env`` (``gpu_env``: which GPU, if any, and memory growth when workers share it) must
    act before the framework loads, which ``determinism.apply`` does. A pool's worker would
    outlive a killed driver, blocked on its task queue or training on: it watches the pipe
    that ``multiprocessing`` gives every child it spawns from its parent, whose other end
    closes when the parent dies (``parent_process().sentinel``).
    """
    clock = clock_since(_process_started())
    parent = multiprocessing.parent_process()
    if parent is not None:
        end_with_driver(parent.sentinel)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)
    log_path = Path(study_dir) / LOGS_DIR / f"worker-{settings.mode}-{os.getpid()}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    effective = determinism.apply(settings, keras=keras)
    clock.lap("start")
    backend = backends.get(settings.backend)
    if threads is not None and backend.limit_threads(threads):
        _context["cpu_threads"] = threads
    backend.init_device()
    clock.lap("device")
    _context.update(
        backend=settings.backend,
        determinism=effective,
        software=determinism.software_versions(settings.backend),
        device_name=backend.device_name(),
        log=str(log_path.relative_to(study_dir)),
        **backend.compile_in_this_process(settings.compile, compared=True),
    )


def _process_started() -> float:
    """When this process started, on the monotonic clock: the pool started it, so no ``device_time.spawn_env`` says
    when, and its start and imports count from the system's record of it."""
    return time.monotonic() - (time.time() - psutil.Process().create_time())


def loaded_frameworks() -> dict[str, str]:
    """Every deep-learning framework this process has imported, with its version.

    Read after each run, when whatever the run needed is loaded: a JAX or PyTorch worker
    must show its own framework alone (TensorFlow's start-up, thread pools and GPU memory
    would be paid for nothing).
    """
    modules = (sys.modules[backend.module] for backend in backends.loaded())
    return {module.__name__: str(getattr(module, "__version__", "")) for module in modules}


def execute(run: PlannedRun, config: training.TrainConfig) -> StabilityRun:
    """Train one run; never raises, so one bad run cannot take the pool down.

    Running out of memory is named as such ("out of memory: ..."), as in the sweep's worker,
    so the reason says what to change: fewer --jobs or a smaller batch.
    """
    identity = {"run_id": run.run_id, "variant": run.variant, "run": run.run_index, "mode": run.mode}
    clock = running_clock()
    clock.lap("other")
    try:
        outcome = {"status": "ok", **training.train(run, config, clock)}
    except Exception as exc:
        traceback.print_exc()
        outcome = {"status": "failed", "reason": backends.failure_reason(exc, first_line(exc, with_type=True))}
    clock.lap("other")
    fields = _worker_fields() | outcome | {"time_parts": clock.take()}
    return _plain(stability_run(**identity, seeds=run.seeds.as_dict(), **fields))


def _plain(record: StabilityRun) -> StabilityRun:
    """The record as the store will write it (JSON, anything else as its text), before it goes to the parent.

    A framework's own type in it (PyTorch's version string is one) would make unpickling it
    import that framework into detprof's own process, which trains nothing.
    """
    return json.loads(json.dumps(record, default=str))  # type: ignore[no-any-return]


def _worker_fields() -> dict[str, Any]:
    """What the worker adds to each record; ``software`` is completed after the run, once it loaded all it needed."""
    fields = {"pid": os.getpid(), **_context}
    if "software" in fields:
        fields["software"] = {**loaded_frameworks(), **fields["software"]}
    return fields
