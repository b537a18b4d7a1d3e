"""The sweep driver: every (model, mode, repeat) in its own worker, interleaved, stored as it ends.

The parent never imports TensorFlow to run workers: it plans the runs, launches each
worker (under nsys or nvprof when those trace), samples GPU telemetry meanwhile, parses
the trace into a KernelTable and writes one atomic record per run. A failing model is
recorded with its reason and the sweep goes on; Ctrl-C stops the worker in flight and
keeps every completed record.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from detprof.determinism import MODES, Mode
from detprof.errors import DetprofError, UsageError
from detprof.models import registry
from detprof.profiler.gpu import DeviceChoice
from detprof.profiler.telemetry import NoTelemetry, TelemetrySampler
from detprof.profiler.tracers import Tracer
from detprof.store import ResultsStore

RUN_ORDER: tuple[Mode, ...] = ("deterministic", "default")


@dataclass(frozen=True)
class SweepConfig:
    models: tuple[str, ...]
    steps: int = 100
    warmup: int = 10
    repeats: int = 3
    batch_size: int = 64
    input_size: int | None = None
    classes: int | None = None
    tracer: str = "tf"
    xla: bool = False
    gpu_label: str = "cpu"
    seed: int = 0
    preset: str | None = None
    run_timeout_s: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.models:
            raise UsageError("no models to sweep: pass --models")
        for name, value, least in (
            ("--steps", self.steps, 1),
            ("--repeats", self.repeats, 1),
            ("--batch-size", self.batch_size, 1),
            ("--warmup", self.warmup, 0),
        ):
            if value < least:
                raise UsageError(f"{name} must be at least {least}, not {value}")
        if self.input_size is not None and self.input_size < 8:
            raise UsageError(f"--input-size must be at least 8, not {self.input_size}")
        if self.run_timeout_s is not None and self.run_timeout_s <= 0:
            raise UsageError(f"--run-timeout must be positive, not {self.run_timeout_s}")
        for model in self.models:
            registry.get(model)

    def manifest(self) -> dict[str, Any]:
        """What identifies the measurement: a resumed sweep must match it exactly."""
        config = asdict(self)
        config.pop("run_timeout_s")
        config["models"] = list(self.models)
        config["modes"] = list(MODES)
        return config


PRESETS: dict[str, dict[str, Any]] = {
    "cpu-small": {
        "models": ("smallcnn", "mediumcnn_k1", "mediumcnn_k3"),
        "steps": 20,
        "warmup": 5,
        "repeats": 3,
        "batch_size": 32,
        "input_size": 32,
        "classes": 10,
    },
}


@dataclass(frozen=True)
class RunSpec:
    model: str
    mode: Mode
    repeat: int

    @property
    def run_id(self) -> str:
        return f"{self.model}--{self.mode}--r{self.repeat}"


def plan_runs(config: SweepConfig) -> list[RunSpec]:
    """Repeat by repeat, model by model, the two modes back to back (D, N, D, N, ...)."""
    return [
        RunSpec(model, mode, repeat)
        for repeat in range(config.repeats)
        for model in config.models
        for mode in RUN_ORDER
    ]


def _input_shape(config: SweepConfig, model: str) -> list[int] | None:
    if config.input_size is None:
        return None
    channels = registry.get(model).input_shape[-1]
    return [config.input_size, config.input_size, channels]


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class SweepRunner:
    """Runs the planned workers one after another and records each as it ends."""

    def __init__(
        self,
        config: SweepConfig,
        store: ResultsStore,
        tracer: Tracer,
        device: DeviceChoice,
        sampler_factory: Callable[[], TelemetrySampler | NoTelemetry] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.tracer = tracer
        self.device = device
        self.sampler_factory = sampler_factory or (lambda: TelemetrySampler.for_device(device))

    def worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONUNBUFFERED"] = "1"
        if self.device.hide_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def run_one(self, run: RunSpec) -> dict[str, Any]:
        work = self.store.dir / "work"
        work.mkdir(parents=True, exist_ok=True)
        trace_base = self.store.dir / "traces" / run.run_id
        trace_base.parent.mkdir(parents=True, exist_ok=True)
        trace_path = self.tracer.trace_path(trace_base)
        spec = {
            "run_id": run.run_id,
            "model": run.model,
            "mode": run.mode,
            "repeat": run.repeat,
            "seed": self.config.seed,
            "xla": self.config.xla,
            "steps": self.config.steps,
            "warmup": self.config.warmup,
            "batch_size": self.config.batch_size,
            "input_shape": _input_shape(self.config, run.model),
            "classes": self.config.classes,
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
            outcome = _wait(proc, self.config.run_timeout_s)
        record: dict[str, Any] = {
            "run_id": run.run_id,
            "model": run.model,
            "mode": run.mode,
            "repeat": run.repeat,
            "steps": self.config.steps,
            "warmup": self.config.warmup,
            "batch_size": self.config.batch_size,
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
            "trace_file": None,
        }
        record.update(self._worker_result(result_path, outcome, log_path))
        window = record.pop("measured_window_monotonic", None)
        record["telemetry"] = sampler.result(window=tuple(window) if window else None)
        if record["status"] == "ok":
            record["wall_ns_per_step"] = sum(record["step_wall_ns"]) / len(record["step_wall_ns"])
            if trace_path is not None:
                self._attach_kernels(record, trace_path)
        self.store.write_record(record)
        spec_path.unlink(missing_ok=True)
        result_path.unlink(missing_ok=True)
        return record

    def _worker_result(self, result_path: Path, outcome: str | int, log_path: Path) -> dict[str, Any]:
        if outcome == "timeout":
            return {
                "status": "failed",
                "reason": f"timed out after {self.config.run_timeout_s:g} s (--run-timeout)",
            }
        if not result_path.is_file():
            return {
                "status": "failed",
                "reason": f"worker crashed (exit code {outcome}): {_last_line(log_path)}",
            }
        result = json.loads(result_path.read_text())
        return result

    def _attach_kernels(self, record: dict[str, Any], trace_path: Path) -> None:
        from detprof.profiler.parsers import load_trace

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
        record["kernel_ns_per_step"] = table.total_ns / self.config.steps


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


def _last_line(log_path: Path) -> str:
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no output"
    return lines[-1][:300] if lines else "no output"


@dataclass(frozen=True)
class SweepProgress:
    """Callbacks through which the driver reports progress without knowing how it is shown."""

    on_start: Callable[[RunSpec, int, int], None] = lambda run, index, total: None
    on_done: Callable[[dict[str, Any]], None] = lambda record: None


def run_sweep(
    config: SweepConfig,
    store: ResultsStore,
    tracer: Tracer,
    device: DeviceChoice,
    *,
    resume: bool,
    command: str,
    progress: SweepProgress | None = None,
) -> list[dict[str, Any]]:
    """Run every planned run not already complete; returns the records of this invocation."""
    progress = progress or SweepProgress()
    store.open(config.manifest(), command, resume=resume)
    runner = SweepRunner(config, store, tracer, device)
    plan = plan_runs(config)
    todo = [run for run in plan if not store.is_done(run.run_id)]
    done_before = len(plan) - len(todo)
    records = []
    for index, run in enumerate(todo, start=done_before):
        progress.on_start(run, index, len(plan))
        record = runner.run_one(run)
        records.append(record)
        progress.on_done(record)
    return records
