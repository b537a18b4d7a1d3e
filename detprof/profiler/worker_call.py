"""One call that needs a framework but measures nothing, in a fresh worker process.

Building Keras models to read shapes off them, loading a user's model to check it, or
``detprof verify``'s runs: the parent stays free of the framework's memory and start-up
chatter, and the worker (``python -m detprof.profiler.worker``) runs the named entry point
(``module:function``) of the package that owns the work.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from detprof.errors import ExitCode, InputError, UsageError
from detprof.profiler.lifeline import driver_lifeline
from detprof.profiler.process import (
    WorkerEnvironment,
    last_log_line,
    spawn,
    timeout_reason,
    wait_for_exit,
    worker_command,
)
from detprof.store import atomic_write_json


class CallTimedOut(InputError):
    """A call that outlasted its ``timeout_s``: its process group was killed."""


def call_in_worker(
    entry: str,
    request: Mapping[str, Any],
    what: str,
    *,
    environment: WorkerEnvironment | None = None,
    log: Path | None = None,
    timeout_s: float | None = None,
) -> Any:
    """``entry(request)`` in a fresh worker process; its answer, or its error as it was.

    For work that needs a framework but is not a measured run: building Keras models to read
    shapes off them (the worker sees no GPU), or ``detprof verify``'s runs (the worker runs in
    the measuring ``environment``, its GPU pinned, its output in ``log``). The parent stays free
    of the framework's memory and start-up chatter. A ``UsageError`` raised there is the same
    one-line ``UsageError`` here; any other failure is an ``InputError`` saying what could not
    be done, and a call that outlasts ``timeout_s`` is ended (its process group killed) and said to have timed out.
    """
    if environment is None:
        env = dict(os.environ) | {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""} | driver_lifeline()[0]
    else:
        env = environment.worker_env()
    with tempfile.TemporaryDirectory(prefix="detprof-call-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        output = log or Path(tmp) / "output.log"
        atomic_write_json(spec_path, {"call": entry, "request": dict(request)})
        code = wait_for_exit(spawn(worker_command(spec_path, result_path), env, output), timeout_s)
        answer = json.loads(result_path.read_text()) if result_path.is_file() else None
        said = last_log_line(output)
    if code == "timeout":
        raise CallTimedOut(timeout_reason(timeout_s))
    if code == ExitCode.USAGE and answer is not None:
        raise UsageError(answer["error"])
    if code != ExitCode.OK or answer is None:
        raise InputError(f"{what} failed: {said if said != 'no output' else f'exit code {code}'}")
    return answer["answer"]
