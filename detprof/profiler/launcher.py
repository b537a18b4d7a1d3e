"""Launch worker processes: a study's measured runs under a tracer, or one call that needs a framework.

Shared by the sweep (whole models) and kernels_bench (single ops): both need a fresh
process per run (or a session of runs, ``sessions``), the tracer wrapped around it, GPU
telemetry sampled meanwhile, the trace parsed into a KernelTable, and a record written
atomically whatever happened (``run_records``). The parent never imports a framework: what
needs one (a workload, deriving op shapes from Keras models) runs in ``python -m
detprof.profiler.worker``, which reads a ``WorkerSpec`` and writes a JSON result. The spec
names its entry point (``module:function``), so the package that owns a workload names it, and
the worker depends on none of them.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from detprof.errors import ExitCode, InputError, UsageError
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.lifeline import driver_lifeline
from detprof.profiler.measured_runs import ModePair, PlannedRun, RunSettings
from detprof.profiler.process import (
    WorkerEnvironment,
    last_log_line,
    spawn,
    timeout_reason,
    wait_for_exit,
    worker_command,
)
from detprof.profiler.run_records import RecordFiler
from detprof.profiler.run_specs import RunSpecs
from detprof.profiler.sessions import Launch, in_process_pairs, lockstep_pairs
from detprof.profiler.telemetry import NoTelemetry, TelemetrySampler
from detprof.profiler.tracers import Tracer
from detprof.profiler.worker_process import RunFiles, WorkerProcess
from detprof.records import MeasuredRun
from detprof.store import ResultsStore, atomic_write_json


def call_in_worker(
    entry: str,
    request: Mapping[str, Any],
    what: str,
    *,
    environment: WorkerEnvironment | None = None,
    log: Path | None = None,
    timeout_s: float | None = None,
) -> Any:
    """``entry(request)`` in a fresh worker process; its answer, or its error as it was.

    For work that needs a framework but is not a measured run: building Keras models to read
    shapes off them (the worker sees no GPU), or ``detprof verify``'s runs (the worker runs in
    the measuring ``environment``, its GPU pinned, its output in ``log``). The parent stays free
    of the framework's memory and start-up chatter. A ``UsageError`` raised there is the same
    one-line ``UsageError`` here; any other failure is an ``InputError`` saying what could not
    be done, and a call that outlasts ``timeout_s`` is ended (its process group killed) and said to have timed out.
    """
    if environment is None:
        env = dict(os.environ) | {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""} | driver_lifeline()[0]
    else:
        env = environment.worker_env()
    with tempfile.TemporaryDirectory(prefix="detprof-call-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        output = log or Path(tmp) / "output.log"
        atomic_write_json(spec_path, {"call": entry, "request": dict(request)})
        code = wait_for_exit(spawn(worker_command(spec_path, result_path), env, output), timeout_s)
        answer = json.loads(result_path.read_text()) if result_path.is_file() else None
        said = last_log_line(output)
    if code == "timeout":
        raise InputError(timeout_reason(timeout_s))
    if code == ExitCode.USAGE and answer is not None:
        raise UsageError(answer["error"])
    if code != ExitCode.OK or answer is None:
        raise InputError(f"{what} failed: {said if said != 'no output' else f'exit code {code}'}")
    return answer["answer"]


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
        self.environment = WorkerEnvironment(device)
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

    def run_pairs(self, pairs: Sequence[ModePair], *, cpu_core: int) -> Iterator[MeasuredRun]:
        """Lockstep pairs, measured by two warm workers stepped in turn (``sessions.lockstep_pairs``)."""
        return lockstep_pairs(self.launch, pairs, cpu_core)

    def run_in_process(self, pairs: Sequence[ModePair], *, cpu_core: int | None) -> Iterator[MeasuredRun]:
        """Pairs measured by one worker that runs both arms of each (``sessions.in_process_pairs``)."""
        return in_process_pairs(self.launch, pairs, cpu_core)
