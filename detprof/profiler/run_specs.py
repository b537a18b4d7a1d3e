"""What each run's worker is asked (``WorkerSpec``): its workload and mode, its steps, its tracer and files.

A model's runs take the steps its first run of the study took (sized to the machine where the
study sizes them, ``RunSettings.run_seconds``), so that its repeats are alike: the steps are
pinned per model from the records as they are filed, the study's earlier ones included.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from detprof.profiler.measured_runs import PlannedRun, RunSettings
from detprof.profiler.worker_process import RunFiles, WorkerProcess
from detprof.profiler.worker_spec import WorkerSpec, sized_steps

SETTLING_STEPS = 1
"""Untimed steps a worker runs right after its tracer starts, so that what starting a capture
costs lands on no measured step (``worker.run``)."""


class RunSpecs:
    """The specs of a study's runs, their steps pinned per model."""

    def __init__(self, settings: RunSettings, files: RunFiles) -> None:
        self.settings, self.files = settings, files
        self.pinned_steps: dict[str, int] = {}
        """The steps each model's runs took so far in this study."""
        if files.store.exists():
            for record in files.store.records():
                self.pin(record)

    def pin(self, record: Mapping[str, Any]) -> None:
        model = record.get("model")
        if record.get("status") == "ok" and model is not None and record.get("steps"):
            self.pinned_steps.setdefault(str(model), int(record["steps"]))

    def steps_of(self, run: PlannedRun) -> tuple[int, float | None]:
        """The steps of the run's phases (at most), and the seconds to size them to (None: exactly those): the
        steps its model took earlier in this study, else the study's, sized where it sizes them."""
        pinned = self.pinned_steps.get(str(run.fields.get("model")))
        if pinned is not None:
            return pinned, None
        return self.settings.steps, self.settings.run_seconds

    def size(self, run: PlannedRun) -> Callable[[int], int]:
        """The steps of a lockstep pair's phases, from the step time the workers' warm-ups measured."""
        most, seconds = self.steps_of(run)
        return lambda step_ns: sized_steps(most, seconds, step_ns)

    def spec(
        self,
        worker: WorkerProcess,
        *,
        cpu_core: int | None = None,
        control_fd: int | None = None,
        arm: str | None = None,
    ) -> WorkerSpec:
        run = worker.run
        steps, run_seconds = self.steps_of(run)
        return WorkerSpec(
            run_id=run.run_id,
            workload=run.workload.entry,
            determinism=self.settings.determinism(run.mode, run.knobs),
            warmup=self.settings.warmup,
            wall_steps=run.wall_steps(steps),
            traced_steps=run.traced_steps(steps),
            settling_steps=SETTLING_STEPS,
            tracer=self.files.tracer_of(run).name,
            trace_path=str(worker.trace_path) if worker.trace_path else None,
            result_path=str(worker.result_path),
            log_path=str(worker.log_path),
            params=run.workload.params,
            control_fd=control_fd,
            cpu_core=cpu_core,
            cpu_threads=None if cpu_core is None else 1,
            run_seconds=run_seconds,
            arm=arm,
            arms_workload=None if arm is None else run.workload.arms_entry,
        )
