"""Launch one measured worker process under a tracer and turn what it leaves into a record.

Shared by the sweep (whole models) and kernels_bench (single ops): both need a fresh
process per run, the tracer wrapped around it, GPU telemetry sampled meanwhile, the trace
parsed into a KernelTable, and a record written atomically whatever happened. The parent
never imports TensorFlow for this.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detprof.determinism import Mode
from detprof.errors import DetprofError, last_line
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.telemetry import NoTelemetry, TelemetrySampler
from detprof.profiler.tracers import Tracer
from detprof.store import ResultsStore
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

    def run(self, run: WorkerRun, payload: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
        """Run one worker: ``payload`` is the workload's part of the spec, ``fields`` join the record."""
        work = self.store.dir / "work"
        work.mkdir(parents=True, exist_ok=True)
        trace_base = self.store.dir / "traces" / run.run_id
        trace_base.parent.mkdir(parents=True, exist_ok=True)
        trace_path = self.tracer.trace_path(trace_base)
        spec = {
            **payload,
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
        spec_path.write_text(json.dumps(spec))
        result_path.unlink(missing_ok=True)
        worker = [sys.executable, "-m", "detprof.profiler.worker", str(spec_path), str(result_path)]
        command = self.tracer.command(worker, trace_base)
        log_path = self.store.dir / "logs" / f"{run.run_id}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        started, t0 = _now(), time.monotonic()
        with open(log_path, "wb") as log, self.sampler_factory() as sampler:
            proc = subprocess.Popen(
                command, env=self.worker_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            outcome = _wait(proc, self.timeout_s)
        record: dict[str, Any] = {
            "run_id": run.run_id,
            "mode": run.mode,
            **fields,
            "steps": run.steps,
            "warmup": run.warmup,
            "tracer": self.tracer.name,
            "device": self.device.as_record(),
            "command": shlex.join(command),
            "log": str(log_path.relative_to(self.store.dir)),
            "started_at": started,
            "finished_at": _now(),
            "duration_s": round(time.monotonic() - t0, 3),
            "step_wall_ns": None,
            "wall_ns_per_step": None,
            "kernel_ns_per_step": None,
            "kernel_count": None,
            "kernel_table": None,
            "kernel_table_kind": None,
            "step_kernel_ns": None,
            "trace_file": None,
        }
        record.update(self._worker_result(result_path, outcome, log_path))
        window = record.pop("measured_window_monotonic", None)
        record["telemetry"] = sampler.result(window=tuple(window) if window else None)
        if record["status"] == "ok":
            record["wall_ns_per_step"] = sum(record["step_wall_ns"]) / len(record["step_wall_ns"])
            if trace_path is not None:
                self._attach_kernels(record, trace_path, run.steps)
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

    def _attach_kernels(self, record: dict[str, Any], trace_path: Path, steps: int) -> None:
        from detprof.traces.parsers import load_trace

        record["trace_file"] = str(trace_path.relative_to(self.store.dir))
        try:
            table = load_trace(trace_path)
        except DetprofError as exc:
            record.update(status="failed", reason=f"trace unusable: {exc}")
            return
        if table.kernel_count == 0:
            record.update(status="failed", reason="the measured window holds no kernels")
            return
        frame = table.summary if table.is_summary else table.kernels
        record["kernel_table"] = self.store.write_table(record["run_id"], frame)
        record["kernel_table_kind"] = "summary" if table.is_summary else "launches"
        record["kernel_count"] = table.kernel_count
        record["kernel_ns_per_step"] = table.total_ns / steps
        record["step_kernel_ns"] = kernel_ns_by_step(table)


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
