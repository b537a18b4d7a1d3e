"""The sweep's measurement: which models, each in both modes, repeat by repeat.

The sweep plans one run per (model, mode, repeat) and hands the plan to the measured-study
flow (``profiler.study``), which runs each in its own worker and records it atomically
whatever happened. A failing model is recorded with its reason and the sweep goes on. The
models themselves are resolved by ``profiler.model_plan``.
"""

from __future__ import annotations

from detprof.determinism import Mode
from detprof.profiler.model_plan import MODEL_WORKLOAD, SweepConfig
from detprof.profiler.plan import PlannedRun, Workload, interleaved

CALIBRATION_ARMS: dict[Mode, str] = {"deterministic": "a", "default": "b"}
"""A calibration runs deterministic mode against itself: the plan's two slots become arms a and b."""


def plan_runs(config: SweepConfig, *, calibrate: bool = False) -> list[PlannedRun]:
    """Repeat by repeat, model by model, the two modes back to back, their order alternating by repeat.

    ``calibrate``: the same plan with both slots deterministic (arms a and b), an A/A test whose
    interval shows the smallest overhead this machine and design can resolve.
    """
    runs = []
    for repeat, plan, slot in interleaved(config.model_plans(), config.repeats):
        arm = CALIBRATION_ARMS[slot] if calibrate else None
        mode: Mode = "deterministic" if calibrate else slot
        side = arm or mode
        model = plan.label
        runs.append(
            PlannedRun(
                run_id=f"{model}--{side}--r{repeat}",
                label=f"{model} {side} r{repeat}",
                mode=mode,
                repeat=repeat,
                workload=Workload(MODEL_WORKLOAD, plan.workload_spec(config.batch_size)),
                fields={"model": model, "repeat": repeat, "batch_size": config.batch_size}
                | ({"arm": arm} if arm else {})
                | ({"model_spec": plan.own_model.as_record()} if plan.own_model is not None else {}),
            )
        )
    return runs
