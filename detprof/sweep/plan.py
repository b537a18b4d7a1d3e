"""The sweep's measurement: which models, each in both modes, repeat by repeat.

The sweep plans one run per (model, mode, repeat) and hands the plan to the measured-study
flow (``profiler.study``), which runs each in its own worker and records it atomically
whatever happened. A failing model is recorded with its reason and the sweep goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from detprof.determinism import Mode
from detprof.errors import UsageError
from detprof.models import registry
from detprof.profiler.launcher import Workload
from detprof.profiler.options import RunOptions
from detprof.profiler.study import MeasurementTarget, PlannedRun, RunSettings, choose_target, interleaved, preset_values
from detprof.sweep.presets import PRESETS

MODEL_WORKLOAD = "detprof.profiler.workloads:model_training"


@dataclass(frozen=True, kw_only=True)
class SweepConfig(RunSettings):
    models: tuple[str, ...]
    classes: int | None = None

    def __post_init__(self) -> None:
        if not self.models:
            raise UsageError("no models to sweep: pass --models")
        super().__post_init__()
        for model in self.models:
            registry.get(model)

    def manifest(self) -> dict[str, Any]:
        return super().manifest() | {"models": list(self.models)}


@dataclass(frozen=True)
class SweepRequest:
    """The sweep's options as given; ``None`` takes the preset's value (the paper's on a GPU)."""

    models: tuple[str, ...] | None
    options: RunOptions

    def resolve(self, *, dry_run: bool = False) -> tuple[SweepConfig, MeasurementTarget]:
        """The device and tracer chosen and checked, and the configuration the sweep will run."""
        run = self.options
        target = choose_target(run, list(PRESETS), dry_run=dry_run)
        given = {
            "models": self.models,
            "steps": run.steps,
            "warmup": run.warmup,
            "repeats": run.repeats,
            "batch_size": run.batch_size,
            "input_size": run.input_size,
        }
        config = SweepConfig(**preset_values(PRESETS[target.preset], given), **target.settings(run))
        return config, target


def split_models(models: str | None) -> tuple[str, ...] | None:
    if models is None:
        return None
    names = tuple(m.strip().lower() for m in models.split(",") if m.strip())
    if not names:
        raise UsageError("--models is empty: give a comma-separated list of model names (see `detprof models`)")
    return names


def _input_shape(config: SweepConfig, model: str) -> list[int] | None:
    if config.input_size is None:
        return None
    channels = registry.get(model).input_shape[-1]
    return [config.input_size, config.input_size, channels]


CALIBRATION_ARMS: dict[Mode, str] = {"deterministic": "a", "default": "b"}
"""A calibration runs deterministic mode against itself: the plan's two slots become arms a and b."""


def plan_runs(config: SweepConfig, *, calibrate: bool = False) -> list[PlannedRun]:
    """Repeat by repeat, model by model, the two modes back to back, their order alternating by repeat.

    ``calibrate``: the same plan with both slots deterministic (arms a and b), an A/A test whose
    interval shows the smallest overhead this machine and design can resolve.
    """
    runs = []
    for repeat, model, slot in interleaved(config.models, config.repeats):
        arm = CALIBRATION_ARMS[slot] if calibrate else None
        mode: Mode = "deterministic" if calibrate else slot
        side = arm or mode
        runs.append(
            PlannedRun(
                run_id=f"{model}--{side}--r{repeat}",
                label=f"{model} {side} r{repeat}",
                mode=mode,
                repeat=repeat,
                workload=Workload(
                    MODEL_WORKLOAD,
                    {
                        "model": model,
                        "batch_size": config.batch_size,
                        "input_shape": _input_shape(config, model),
                        "classes": config.classes,
                    },
                ),
                fields={"model": model, "repeat": repeat, "batch_size": config.batch_size}
                | ({"arm": arm} if arm else {}),
            )
        )
    return runs
