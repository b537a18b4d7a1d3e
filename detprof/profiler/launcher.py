"""Launch a study's measured runs as worker processes, under a tracer.

Shared by the sweep (whole models) and kernels_bench (single ops): both need a fresh
process per run (or a session of runs, ``sessions``), the tracer wrapped around it, GPU
telemetry sampled meanwhile, the trace parsed into a KernelTable, and a record written
atomically whatever happened (``run_records``). The parent never imports a framework: what
needs one (a workload, deriving op shapes from Keras models) runs in ``python -m
detprof.profiler.worker``, which reads a ``WorkerSpec`` and writes a JSON result. The spec
names its entry point (``module:function``), so the package that owns a workload names it, and
the worker depends on none of them. One call that needs a framework but measures nothing is
``worker_call``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from detprof.profiler.devices import DeviceChoice
from detprof.profiler.measured_runs import ModePair, PlannedRun, RunSettings
from detprof.profiler.process import (
    WorkerEnvironment,
    spawn,
    wait_for_exit,
    worker_command,
)
from detprof.profiler.run_records import RecordFiler
from detprof.profiler.run_specs import RunSpecs
from detprof.profiler.sessions import Launch, Note, in_process_pairs, lockstep_pairs
from detprof.profiler.telemetry import NoTelemetry, TelemetrySampler
from detprof.profiler.tracers import Tracer
from detprof.profiler.worker_process import RunFiles, WorkerProcess
from detprof.records import MeasuredRun
from detprof.store import ResultsStore, atomic_write_json


class WorkerLauncher:
    """Measures planned runs in worker processes and files each run's record in ``store``: a process per run
    (``run``), lockstep pairs (``run_pairs``) or both arms of each pair in one process (``run_in_process``)."""

    def __init__(
        self,
        store: ResultsStore,
        tracer: Tracer,
        device: DeviceChoice,
        settings: RunSettings,
        sampler_factory: Callable[[], TelemetrySampler | NoTelemetry] | None = None,
    ) -> None:
        self.store, self.tracer, self.device, self.settings = store, tracer, device, settings
        self.environment = WorkerEnvironment(device, backend=settings.backend)
        self.sampler_factory = sampler_factory or (lambda: TelemetrySampler.for_device(device))
        records = RecordFiler(RunSpecs(settings, RunFiles(store, tracer)), device, self.environment)
        self.launch = Launch(records, self.sampler_factory)

    @property
    def timeout_s(self) -> float | None:
        return self.settings.run_timeout_s

    def tracer_of(self, run: PlannedRun) -> Tracer:
        return self.launch.files.tracer_of(run)

    def worker_of(self, run: PlannedRun, **fields: Any) -> WorkerProcess:
        return self.launch.files.worker_of(run, **fields)

    def file_record(self, worker: WorkerProcess, **fields: Any) -> MeasuredRun:
        return self.launch.records.file_record(worker, **fields)

    def commands(self, run: PlannedRun, *, require_installed: bool = True) -> tuple[list[str], list[str]]:
        """A run of its own: the worker's command line, and the one that runs it (in its tracer, if traced)."""
        return self._commands(self.worker_of(run), require_installed)

    def _commands(self, worker: WorkerProcess, require_installed: bool = True) -> tuple[list[str], list[str]]:
        command = worker_command(worker.spec_path, worker.result_path)
        traced = self.tracer_of(worker.run).command(command, worker.trace_base, require_installed=require_installed)
        return command, traced

    def session_command(self, runs: Sequence[PlannedRun]) -> list[str]:
        """The command line of the worker that measures ``runs`` of one side of lockstep pairs."""
        return self.launch.session_command(runs)

    def run(self, run: PlannedRun) -> MeasuredRun:
        """Run one worker, then file its record."""
        worker = self.worker_of(run)
        command = self._commands(worker)[1]
        worker.make_room()
        atomic_write_json(worker.spec_path, self.launch.specs.spec(worker).to_json())
        worker.start()
        with worker.watched(self.sampler_factory()):
            proc = spawn(command, self.environment.worker_env(), worker.log_path)
            worker.command = command
            outcome = wait_for_exit(proc, self.timeout_s)
        return self.launch.records.finish(worker, outcome)

    def run_pairs(self, pairs: Sequence[ModePair], *, cpu_core: int, note: Note) -> Iterator[MeasuredRun]:
        """Lockstep pairs, measured by two warm workers stepped in turn (``sessions.lockstep_pairs``)."""
        return lockstep_pairs(self.launch, pairs, cpu_core, note)

    def run_in_process(self, pairs: Sequence[ModePair], *, cpu_core: int | None, note: Note) -> Iterator[MeasuredRun]:
        """Pairs measured by one worker that runs both arms of each (``sessions.in_process_pairs``)."""
        return in_process_pairs(self.launch, pairs, cpu_core, note)
