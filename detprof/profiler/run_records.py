"""A measured run's record: filed from its worker's result and its trace, atomically, whatever happened."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

from detprof.profiler.devices import DeviceChoice
from detprof.profiler.process import Outcome, WorkerEnvironment, last_log_line, timeout_reason
from detprof.profiler.run_specs import SETTLING_STEPS, RunSpecs
from detprof.profiler.trace_fields import FAILURE, TraceRead, kernel_fields, read_trace
from detprof.profiler.worker_process import WorkerProcess
from detprof.records import MeasuredRun, measured_run


class RecordFiler:
    """Files each run's record in its study's store: what every run has (its device, worker environment, timing,
    the load beside it), its worker's result, and what its trace holds."""

    def __init__(self, specs: RunSpecs, device: DeviceChoice, environment: WorkerEnvironment) -> None:
        self.specs, self.device, self.environment = specs, device, environment
        self.settings, self.files = specs.settings, specs.files
        self.store = self.files.store

    def finish(
        self, worker: WorkerProcess, outcome: Outcome, trace: TraceRead | None = None, read_s: float = 0.0
    ) -> MeasuredRun:
        """The run's record from its worker's result and its trace (``trace``: read once, in ``read_s``, for both
        arms of a pair that shared a process and a trace); the time the trace took to read is the record's
        ``parsing`` part."""
        worker.end()
        run = worker.run
        t0 = time.monotonic()
        result = self._worker_result(worker.result_path, outcome, worker.log_path)
        window = result.pop("measured_window_monotonic", None)
        steps = result.pop("steps", None) or self.specs.steps_of(run)[0]
        traced_steps = len(result.get("traced_step_wall_ns") or []) or run.traced_steps(steps)
        kernels = {}
        if result["status"] == "ok" and worker.trace_path is not None:
            read = trace or read_trace(worker.trace_path)
            kernels = kernel_fields(self.store, run.run_id, read, traced_steps, SETTLING_STEPS, worker.arm)
        if FAILURE in kernels:
            result.update(status="failed", reason=kernels.pop(FAILURE))
        if "time_parts" in result:
            result["time_parts"] = result["time_parts"] | {"parsing": round(read_s + time.monotonic() - t0, 3)}
        record = self.file_record(
            worker,
            steps=steps,
            warmup=self.settings.warmup,
            telemetry=worker.sampler.result(window=tuple(window) if window else None) if worker.sampler else None,
            **(worker.fields | result | kernels),
        )
        self.specs.pin(record)
        return record

    def file_record(self, worker: WorkerProcess, **fields: Any) -> MeasuredRun:
        """The run's record (what every run has, then ``fields``, which win), written atomically; its spec and
        result files go."""
        run = worker.run
        common = {
            "run_id": run.run_id,
            "mode": run.mode,
            "backend": self.settings.backend,
            "measures": run.measures,
            "tracer": self.files.tracer_of(run).name,
            "device": self.device.as_record(),
            "command": shlex.join(worker.command),
            "log": str(worker.log_path.relative_to(self.store.dir)),
            "started_at": worker.started,
            "finished_at": worker.finished,
            "duration_s": worker.duration_s,
            "worker_env": self.environment.timing_env(),
            "load": None if worker.load is None else worker.load.result(),
        }
        if self.settings.precision is not None:
            common |= {"precision": self.settings.precision, "first_stage": self.settings.repeats}
        if worker.earlier is not None:
            common["earlier_failures"] = list(worker.earlier.failures)
        record = measured_run(**(common | fields))
        self.store.write_record(record)
        worker.spec_path.unlink(missing_ok=True)
        worker.result_path.unlink(missing_ok=True)
        return record

    def _worker_result(self, result_path: Path, outcome: Outcome, log_path: Path) -> dict[str, Any]:
        if outcome == "timeout":
            return {"status": "failed", "reason": timeout_reason(self.settings.run_timeout_s)}
        if not result_path.is_file():
            return {"status": "failed", "reason": f"worker crashed (exit code {outcome}): {last_log_line(log_path)}"}
        return dict(json.loads(result_path.read_text()))
