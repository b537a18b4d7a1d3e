"""Launch worker processes: one measured run under a tracer, or one call that needs TensorFlow.

Shared by the sweep (whole models) and kernels_bench (single ops): both need a fresh
process per run, the tracer wrapped around it, GPU telemetry sampled meanwhile, the trace
parsed into a KernelTable, and a record written atomically whatever happened. The parent
never imports TensorFlow: what needs it (a workload, deriving op shapes from Keras models)
runs in ``python -m detprof.profiler.worker``, which reads a JSON spec and writes a JSON
result. The spec names its entry point (``module:function``), so the package that owns a
workload names it, and the worker depends on none of them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detprof.determinism import Mode
from detprof.errors import USAGE_EXIT, DetprofError, InputError, UsageError, last_line
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.telemetry import NoTelemetry, TelemetrySampler
from detprof.profiler.tracers import Tracer
from detprof.records import MeasuredRun, measured_run
from detprof.store import ResultsStore, atomic_write_json
from detprof.traces.step_split import kernel_ns_by_step


@dataclass(frozen=True)
class WorkerRun:
    """What every measured run has, whatever its workload."""

    run_id: str
    mode: Mode
    seed: int
    xla: bool
    steps: int
    warmup: int


@dataclass(frozen=True)
class Workload:
    """What a measured worker runs: ``entry`` (``module:function``) builds the step from ``spec``."""

    entry: str
    spec: dict[str, Any] = field(default_factory=dict)


def worker_command(spec_path: Path, result_path: Path) -> list[str]:
    return [sys.executable, "-m", "detprof.profiler.worker", str(spec_path), str(result_path)]


def call_in_worker(entry: str, request: Mapping[str, Any], what: str, *, hide_gpus: bool = True) -> Any:
    """``entry(request)`` in a fresh worker process that sees no GPU; its answer, or its error as it was.

    For work that needs TensorFlow but measures nothing (building Keras models to read shapes
    off them): the parent stays free of TensorFlow's memory and start-up chatter. A
    ``UsageError`` raised there is the same one-line ``UsageError`` here; any other failure
    is an ``InputError`` saying what could not be done.
    """
    import tempfile

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory(prefix="detprof-call-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        atomic_write_json(spec_path, {"call": entry, "request": dict(request)})
        proc = subprocess.run(
            worker_command(spec_path, result_path), capture_output=True, text=True, env=env, check=False
        )
        answer = json.loads(result_path.read_text()) if result_path.is_file() else None
    if proc.returncode == USAGE_EXIT and answer is not None:
        raise UsageError(answer["error"])
    if proc.returncode != 0 or answer is None:
        raise InputError(f"{what} failed: {last_line(proc.stderr) or f'exit code {proc.returncode}'}")
    return answer["answer"]


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class WorkerLauncher:
    def __init__(
        self,
        store: ResultsStore,
        tracer: Tracer,
        device: DeviceChoice,
        timeout_s: float | None,
        sampler_factory: Callable[[], TelemetrySampler | NoTelemetry] | None = None,
    ) -> None:
        self.store = store
        self.tracer = tracer
        self.device = device
        self.timeout_s = timeout_s
        self.sampler_factory = sampler_factory or (lambda: TelemetrySampler.for_device(device))

    def worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONUNBUFFERED"] = "1"
        if self.device.hide_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def run(self, run: WorkerRun, workload: Workload, fields: Mapping[str, Any]) -> MeasuredRun:
        """Run one worker: ``workload`` says what it measures, ``fields`` identify the run in its record."""
        work = self.store.dir / "work"
        work.mkdir(parents=True, exist_ok=True)
        trace_base = self.store.dir / "traces" / run.run_id
        trace_base.parent.mkdir(parents=True, exist_ok=True)
        trace_path = self.tracer.trace_path(trace_base)
        spec = {
            **workload.spec,
            "workload": workload.entry,
            "run_id": run.run_id,
            "mode": run.mode,
            "seed": run.seed,
            "xla": run.xla,
            "steps": run.steps,
            "warmup": run.warmup,
            "in_process": self.tracer.in_process,
            "nvtx_steps": self.tracer.nvtx_steps,
            "trace_path": str(trace_path) if trace_path else None,
        }
        spec_path = work / f"{run.run_id}.spec.json"
        result_path = work / f"{run.run_id}.result.json"
        atomic_write_json(spec_path, spec)
        result_path.unlink(missing_ok=True)
        command = self.tracer.command(worker_command(spec_path, result_path), trace_base)
        log_path = self.store.dir / "logs" / f"{run.run_id}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        started, t0 = _now(), time.monotonic()
        with open(log_path, "wb") as log, self.sampler_factory() as sampler:
            proc = subprocess.Popen(
                command, env=self.worker_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            outcome = _wait(proc, self.timeout_s)
        finished, duration = _now(), round(time.monotonic() - t0, 3)
        result = self._worker_result(result_path, outcome, log_path)
        window = result.pop("measured_window_monotonic", None)
        kernels = self._kernels(run.run_id, trace_path, run.steps) if result["status"] == "ok" else {}
        if "failure" in kernels:
            result.update(status="failed", reason=kernels.pop("failure"))
        record = measured_run(
            run_id=run.run_id,
            mode=run.mode,
            steps=run.steps,
            warmup=run.warmup,
            tracer=self.tracer.name,
            device=self.device.as_record(),
            command=shlex.join(command),
            log=str(log_path.relative_to(self.store.dir)),
            started_at=started,
            finished_at=finished,
            duration_s=duration,
            telemetry=sampler.result(window=tuple(window) if window else None),
            **(dict(fields) | result | kernels),
        )
        self.store.write_record(record)
        spec_path.unlink(missing_ok=True)
        result_path.unlink(missing_ok=True)
        return record

    def _worker_result(self, result_path: Path, outcome: str | int, log_path: Path) -> dict[str, Any]:
        if outcome == "timeout":
            return {"status": "failed", "reason": f"timed out after {self.timeout_s:g} s (--run-timeout)"}
        if not result_path.is_file():
            return {
                "status": "failed",
                "reason": f"worker crashed (exit code {outcome}): {_last_log_line(log_path)}",
            }
        return json.loads(result_path.read_text())

    def _kernels(self, run_id: str, trace_path: Path | None, steps: int) -> dict[str, Any]:
        """The record's kernel fields from the trace; ``{"failure": reason}`` when it is unusable."""
        if trace_path is None:
            return {}
        from detprof.traces.parsers import load_trace

        found: dict[str, Any] = {"trace_file": str(trace_path.relative_to(self.store.dir))}
        try:
            table = load_trace(trace_path)
        except DetprofError as exc:
            return found | {"failure": f"trace unusable: {exc}"}
        if table.kernel_count == 0:
            return found | {"failure": "the measured window holds no kernels"}
        frame = table.summary if table.is_summary else table.kernels
        return found | {
            "kernel_table": self.store.write_table(run_id, frame),
            "kernel_table_kind": "summary" if table.is_summary else "launches",
            "kernel_count": table.kernel_count,
            "kernel_ns_per_step": table.total_ns / steps,
            "step_kernel_ns": kernel_ns_by_step(table),
        }


def _wait(proc: subprocess.Popen[bytes], timeout: float | None) -> str | int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return "timeout"
    except BaseException:
        _kill_group(proc)
        raise


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _last_log_line(log_path: Path) -> str:
    try:
        line = last_line(log_path.read_text(errors="replace"))
    except OSError:
        return "no output"
    return line[:300] or "no output"
