"""The sweep's measurement: which models, each in both modes, repeat by repeat.

The sweep plans one run per (model, mode, repeat) and hands the plan to the measured-study
flow (``profiler.study``), which runs each in its own worker and records it atomically
whatever happened. A failing model is recorded with its reason and the sweep goes on. The
models themselves are resolved by ``profiler.sweep_request``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from detprof.determinism import Mode
from detprof.models.plans import ModelPlan
from detprof.profiler.measured_runs import PlannedRun, Workload, interleaved
from detprof.profiler.sweep_request import MODEL_ARMS_WORKLOAD, MODEL_WORKLOAD, SweepConfig

CALIBRATION_ARMS: dict[Mode, str] = {"deterministic": "a", "default": "b"}
"""A calibration runs deterministic mode against itself: the plan's two slots become arms a and b."""


def plan_runs(config: SweepConfig, *, calibrate: bool = False) -> list[PlannedRun]:
    """Repeat by repeat, model by model, the two modes back to back, their order alternating by repeat.

    ``calibrate``: the same plan with both slots deterministic (arms a and b), an A/A test whose
    interval shows the smallest overhead this machine and design can resolve.
    """
    return [run for repeat in range(config.repeats) for run in plan_repeat(config, repeat, calibrate=calibrate)]


def plan_repeat(
    config: SweepConfig, repeat: int, models: Collection[str] | None = None, *, calibrate: bool = False
) -> list[PlannedRun]:
    """Repeat ``repeat`` of ``models`` (default every one), as ``plan_runs`` plans it: how a sweep with a precision
    adds a repeat (``profiler.study.Extend``)."""
    plans = [plan for plan in config.model_plans() if models is None or plan.label in models]
    runs = []
    for _repeat, plan, slot in interleaved(plans, 1, first=repeat):
        arm = CALIBRATION_ARMS[slot] if calibrate else None
        mode: Mode = "deterministic" if calibrate else slot
        runs.append(model_run(config, plan, repeat, RunSlot(mode, arm or mode, fields={"arm": arm} if arm else {})))
    return runs


@dataclass(frozen=True)
class RunSlot:
    """What one run of a model is within its repeat: its mode; ``side`` (its mode, a calibration's arm, a knob
    comparison's arm) names it in its run id, ``shown`` (default ``side``) in the progress; ``fields`` add to its
    record's; ``knobs``, where given, are the switches it sets instead of its mode's."""

    mode: Mode
    side: str
    shown: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    knobs: tuple[str, ...] | None = None


def model_run(config: SweepConfig, plan: ModelPlan, repeat: int, slot: RunSlot) -> PlannedRun:
    """One run of a model, in ``slot`` of repeat ``repeat``."""
    own = {"model_spec": plan.own_model.as_record()} if plan.own_model is not None else {}
    return PlannedRun(
        run_id=f"{plan.label}--{slot.side}--r{repeat}",
        label=f"{plan.label} {slot.shown or slot.side} r{repeat}",
        mode=slot.mode,
        repeat=repeat,
        workload=Workload(MODEL_WORKLOAD, plan.workload_spec(config.batch_size, config.amp), MODEL_ARMS_WORKLOAD),
        fields={"model": plan.label, "repeat": repeat, "batch_size": config.batch_size, **slot.fields, **own},
        knobs=slot.knobs,
    )
