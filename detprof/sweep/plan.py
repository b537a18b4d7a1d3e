"""The sweep driver: every (model, mode, repeat) in its own worker, interleaved, stored as it ends.

The sweep plans the runs and hands each to the worker launcher, which records it atomically
whatever happened. A failing model is recorded with its reason and the sweep goes on;
Ctrl-C stops the worker in flight and keeps every completed record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from detprof.determinism import MODES, Mode
from detprof.errors import UsageError
from detprof.models import registry
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.launcher import WorkerLauncher, WorkerRun
from detprof.profiler.measured_study import RunProgress, check_run_settings
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
        check_run_settings(self.steps, self.warmup, self.repeats, self.batch_size, self.input_size, self.run_timeout_s)
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


def sweep_payload(config: SweepConfig, run: RunSpec) -> dict[str, Any]:
    """What the worker needs to train ``run.model`` for the sweep."""
    return {
        "workload": "model",
        "model": run.model,
        "batch_size": config.batch_size,
        "input_shape": _input_shape(config, run.model),
        "classes": config.classes,
    }


def run_sweep(
    config: SweepConfig,
    store: ResultsStore,
    tracer: Tracer,
    device: DeviceChoice,
    *,
    resume: bool,
    command: str,
    progress: RunProgress | None = None,
) -> list[dict[str, Any]]:
    """Run every planned run not already complete; returns the records of this invocation."""
    progress = progress or RunProgress()
    store.open(config.manifest(), command, resume=resume)
    launcher = WorkerLauncher(store, tracer, device, config.run_timeout_s)
    plan = plan_runs(config)
    todo = [run for run in plan if not store.is_done(run.run_id)]
    done_before = len(plan) - len(todo)
    records = []
    for index, run in enumerate(todo, start=done_before):
        progress.on_start(f"{run.model} {run.mode} r{run.repeat}", index)
        record = launcher.run(
            WorkerRun(run.run_id, run.mode, config.seed, config.xla, config.steps, config.warmup),
            sweep_payload(config, run),
            {"model": run.model, "repeat": run.repeat, "batch_size": config.batch_size},
        )
        records.append(record)
        progress.on_done(record)
    return records
