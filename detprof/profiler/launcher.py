"""Launch worker processes: one measured run under a tracer, lockstep pairs, or one call that needs a framework.

Shared by the sweep (whole models) and kernels_bench (single ops): both need a fresh
process per run, the tracer wrapped around it, GPU telemetry sampled meanwhile, the trace
parsed into a KernelTable, and a record written atomically whatever happened. The parent
never imports a framework: what needs one (a workload, deriving op shapes from Keras models)
runs in ``python -m detprof.profiler.worker``, which reads a ``WorkerSpec`` and writes a JSON
result. The spec names its entry point (``module:function``), so the package that owns a
workload names it, and the worker depends on none of them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from detprof.errors import ExitCode, InputError, UsageError
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.lifeline import driver_lifeline
from detprof.profiler.lockstep import step_in_lockstep, wait_until_done
from detprof.profiler.machine_load import LoadWatch
from detprof.profiler.plan import ModePair, PlannedRun, RunSettings, arm_of
from detprof.profiler.process import (
    Outcome,
    WorkerEnvironment,
    kill_group,
    last_log_line,
    spawn,
    timeout_reason,
    wait_for_exit,
    watchdog,
    worker_command,
)
from detprof.profiler.telemetry import NoTelemetry, TelemetrySampler
from detprof.profiler.trace_fields import FAILURE, TraceRead, kernel_fields, read_trace
from detprof.profiler.tracers import NO_TRACER, Tracer
from detprof.profiler.worker_spec import WorkerSpec, sized_steps
from detprof.records import MeasuredRun, measured_run
from detprof.store import ResultsStore, atomic_write_json

SETTLING_STEPS = 1
"""Untimed steps a worker runs right after its tracer starts, so that what starting a capture
costs lands on no measured step (``worker.run``)."""


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


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass
class WorkerProcess:
    """One run of a worker process: what it runs, where its outputs go, and, once started, its process."""

    run: PlannedRun
    spec_path: Path
    result_path: Path
    log_path: Path
    trace_base: Path
    trace_path: Path | None
    fields: dict[str, Any] = field(default_factory=dict)
    """What identifies the run in its record: the planned run's fields, and how it was paired."""
    command: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    control: IO[str] | None = None
    """The worker's answers in a lockstep session (``profiler.lockstep``); None otherwise."""
    sampler: TelemetrySampler | NoTelemetry | None = None
    load: LoadWatch | None = None
    arm: str | None = None
    """Where both arms of a pair ran in one process: this run's arm in the trace they share (``step i ARM``)."""
    started: str = ""
    t0: float = 0.0
    finished: str = ""
    duration_s: float = 0.0

    @property
    def stdin(self) -> IO[bytes] | None:
        return None if self.proc is None else self.proc.stdin

    def start(self) -> None:
        self.started, self.t0 = utc_now(), time.monotonic()

    @contextlib.contextmanager
    def watched(self, sampler: TelemetrySampler | NoTelemetry) -> Iterator[None]:
        """While the run runs: its GPU's telemetry, and what else used the machine's cores."""
        with sampler as self.sampler, LoadWatch() as self.load:
            yield

    def end(self) -> None:
        """The run is over: what happens next (reading its trace, filing it) is not part of its duration."""
        self.finished, self.duration_s = utc_now(), round(time.monotonic() - self.t0, 3)

    def make_room(self) -> None:
        """The folders the run writes to, and no result left from an earlier attempt."""
        for folder in (self.spec_path.parent, self.trace_base.parent, self.log_path.parent):
            folder.mkdir(parents=True, exist_ok=True)
        self.result_path.unlink(missing_ok=True)

    def outcome(self) -> Outcome:
        """0 when the run's result is written, else the process's exit code (it died)."""
        if self.result_path.is_file():
            return 0
        assert self.proc is not None
        return self.proc.wait()


class WorkerLauncher:
    """Measures planned runs in worker processes and files each run's record in ``store``."""

    def __init__(
        self,
        store: ResultsStore,
        tracer: Tracer,
        device: DeviceChoice,
        settings: RunSettings,
        sampler_factory: Callable[[], TelemetrySampler | NoTelemetry] | None = None,
    ) -> None:
        self.store = store
        self.tracer = tracer
        self.device = device
        self.settings = settings
        self.environment = WorkerEnvironment(device)
        self.sampler_factory = sampler_factory or (lambda: TelemetrySampler.for_device(device))
        self.pinned_steps: dict[str, int] = {}
        """The steps each model's runs took so far in this study: its later repeats take the same, so that its
        repeats are alike (the first repeat's were sized to the machine, ``RunSettings.run_seconds``)."""
        if store.exists():
            for record in store.records():
                self._pin(record)

    @property
    def timeout_s(self) -> float | None:
        return self.settings.run_timeout_s

    def tracer_of(self, run: PlannedRun) -> Tracer:
        """The tracer around ``run``: none for the untraced runs that measure wall time."""
        return self.tracer if run.traced else NO_TRACER

    def worker_of(self, run: PlannedRun, **fields: Any) -> WorkerProcess:
        """A run's paths (spec, result, log, trace); nothing is written yet."""
        work = self.store.dir / "work"
        trace_base = self.store.dir / "traces" / run.run_id
        return WorkerProcess(
            run,
            spec_path=work / f"{run.run_id}.spec.json",
            result_path=work / f"{run.run_id}.result.json",
            log_path=self.store.dir / "logs" / f"{run.run_id}.log",
            trace_base=trace_base,
            trace_path=self.tracer_of(run).trace_path(trace_base),
            fields=run.fields | fields,
        )

    def _pin(self, record: Mapping[str, Any]) -> None:
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
            workload=run.workload.entry if arm is None else str(run.workload.arms_entry),
            determinism=self.settings.determinism(run.mode, run.knobs),
            warmup=self.settings.warmup,
            wall_steps=run.wall_steps(steps),
            traced_steps=run.traced_steps(steps),
            settling_steps=SETTLING_STEPS,
            tracer=self.tracer_of(run).name,
            trace_path=str(worker.trace_path) if worker.trace_path else None,
            result_path=str(worker.result_path),
            log_path=str(worker.log_path),
            params=run.workload.params,
            control_fd=control_fd,
            cpu_core=cpu_core,
            cpu_threads=None if cpu_core is None else 1,
            run_seconds=run_seconds,
            arm=arm,
        )

    def commands(self, run: PlannedRun, *, require_installed: bool = True) -> tuple[list[str], list[str]]:
        """A run of its own: the worker's command line, and the one that runs it (in its tracer, if traced)."""
        return self._commands(self.worker_of(run), require_installed)

    def _commands(self, worker: WorkerProcess, require_installed: bool = True) -> tuple[list[str], list[str]]:
        command = worker_command(worker.spec_path, worker.result_path)
        traced = self.tracer_of(worker.run).command(command, worker.trace_base, require_installed=require_installed)
        return command, traced

    def session_command(self, runs: Sequence[PlannedRun]) -> list[str]:
        """The command line of the worker that measures ``runs`` of one side of lockstep pairs."""
        return worker_command(self._session_spec_path(runs[0]))

    def _session_spec_path(self, first: PlannedRun) -> Path:
        return self.store.dir / "work" / f"{first.run_id}.session.json"

    def run(self, run: PlannedRun) -> MeasuredRun:
        """Run one worker, then file its record."""
        worker = self.worker_of(run)
        command = self._commands(worker)[1]
        worker.make_room()
        atomic_write_json(worker.spec_path, self.spec(worker).to_json())
        worker.start()
        with worker.watched(self.sampler_factory()):
            proc = spawn(command, self.environment.worker_env(), worker.log_path)
            worker.command = command
            outcome = wait_for_exit(proc, self.timeout_s)
        return self._finish(worker, outcome)

    def run_pairs(self, pairs: Sequence[ModePair], *, cpu_core: int) -> Iterator[MeasuredRun]:
        """Lockstep pairs, one after the other, measured by the same two warm workers, one per side.

        Each pair: both workers build and warm up its workload side by side; then the
        coordinator hands out one step at a time, strictly in turn (``lockstep.step_in_lockstep``),
        so that drift, other load and thermals fall on both alike. Both are pinned to the same
        core ``cpu_core`` with one compute thread each once warm: only one steps at a time,
        so they never compete, and each step sees the core (and its caches, and whatever else
        runs there) as the other worker's step beside it did: A/A intervals came out several
        times narrower than unpinned workers' or workers on a core each (docs/concepts.md, "Three ways
        to pair the two modes").

        The workers live for all of ``pairs`` (the models of one repeat): importing the
        framework and Keras is half of a pair's time, which a worker per pair would pay again.
        All of ``pairs[i][0]`` share one mode, all of ``pairs[i][1]`` the other, so a worker
        never switches determinism; each pair of the session is still its own measurement.

        Yields each run's record as its pair finishes. A workload that fails (or refuses to
        run deterministically) fails its run only: the other side finishes its steps alone
        and both go on to the next pair. When a worker dies or ``--run-timeout`` (per pair)
        expires, the session ends after that pair's records; the caller starts fresh
        workers for the pairs left.
        """
        if not pairs:
            return
        with contextlib.ExitStack() as stack:
            sessions = [stack.enter_context(self._session([pair[side] for pair in pairs], cpu_core)) for side in (0, 1)]
            for index in range(len(pairs)):
                workers = [session[index] for session in sessions]
                timer, expired = watchdog(self.timeout_s, [worker.proc for worker in workers])
                with contextlib.ExitStack() as samplers:
                    for worker in workers:
                        worker.start()
                        samplers.enter_context(worker.watched(self.sampler_factory()))
                    if timer is not None:
                        timer.start()
                    try:
                        first = workers[0].run
                        most = self.steps_of(first)[0]
                        step_in_lockstep(workers, first.wall_steps(most), first.traced_steps(most), self.size(first))
                    finally:
                        if timer is not None:
                            timer.cancel()
                for worker in workers:
                    yield self._finish(worker, "timeout" if expired.is_set() else worker.outcome())
                # A worker killed by the watchdog may not have died yet: the session ends on the timeout itself.
                if expired.is_set() or any(worker.proc is None or worker.proc.poll() is not None for worker in workers):
                    for worker in workers:
                        if worker.proc is not None:
                            kill_group(worker.proc)
                    return

    def run_in_process(self, pairs: Sequence[ModePair], *, cpu_core: int | None) -> Iterator[MeasuredRun]:
        """Pairs measured by one worker that runs both arms of each, a step of each in turn (``worker.run_arms``).

        The worker lives for all of ``pairs`` (the models of one repeat), which are measured one
        after the other, both arms of a pair in one trace; pinned to ``cpu_core`` with one
        compute thread once warm, as a lockstep pair is, where there is one (a CPU). Under a
        tracer that wraps the process (nsys), the process traces one pair. Yields each run's
        record as its pair finishes; when the worker dies or ``--run-timeout`` (per pair)
        expires, the session ends after that pair's records and the caller starts a fresh one.
        """
        if not pairs:
            return
        with self._pair_session(pairs, cpu_core) as sessions:
            for workers in sessions:
                proc = workers[0].proc
                assert proc is not None
                timer, expired = watchdog(self.timeout_s, [proc])
                for worker in workers:
                    worker.start()
                with workers[0].watched(self.sampler_factory()):
                    if timer is not None:
                        timer.start()
                    try:
                        wait_until_done(workers[0])
                    finally:
                        if timer is not None:
                            timer.cancel()
                workers[1].sampler, workers[1].load = workers[0].sampler, workers[0].load
                trace_path = workers[0].trace_path
                trace = read_trace(trace_path) if trace_path is not None and trace_path.exists() else None
                for worker in workers:
                    yield self._finish(worker, "timeout" if expired.is_set() else worker.outcome(), trace)
                if expired.is_set() or proc.poll() is not None:
                    kill_group(proc)
                    return

    @contextlib.contextmanager
    def _pair_session(
        self, pairs: Sequence[ModePair], cpu_core: int | None
    ) -> Iterator[list[tuple[WorkerProcess, WorkerProcess]]]:
        """One worker process that measures ``pairs`` in order, both arms of each, saying when each is done."""
        sessions = [self._pair_workers(pair) for pair in pairs]
        for workers in sessions:
            for worker in workers:
                worker.make_room()
            workers[0].log_path.write_bytes(b"")

        def spec(control_fd: int) -> dict[str, Any]:
            def arm(worker: WorkerProcess) -> dict[str, Any]:
                return self.spec(worker, cpu_core=cpu_core, control_fd=control_fd, arm=worker.arm).to_json()

            return {"pairs": [[arm(worker) for worker in workers] for workers in sessions]}

        first = sessions[0][0]
        spec_path = self._session_spec_path(pairs[0][0])
        command = self.tracer_of(first.run).command(worker_command(spec_path), first.trace_base)
        with self._controlled([w for ws in sessions for w in ws], spec, spec_path, command):
            yield sessions

    def _pair_workers(self, pair: ModePair) -> tuple[WorkerProcess, WorkerProcess]:
        """Both arms' paths: a record each, one log and one trace for the pair, named after both."""
        name = f"{pair[0].run_id}+{arm_of(pair[1])}"
        workers = []
        for run in pair:
            worker = self.worker_of(run, pairing="in_process")
            worker.log_path = self.store.dir / "logs" / f"{name}.log"
            worker.trace_base = self.store.dir / "traces" / name
            worker.trace_path = self.tracer_of(run).trace_path(worker.trace_base)
            worker.arm = arm_of(run)
            workers.append(worker)
        return workers[0], workers[1]

    @contextlib.contextmanager
    def _session(self, runs: Sequence[PlannedRun], cpu_core: int) -> Iterator[list[WorkerProcess]]:
        """One worker process that measures ``runs`` in order, paced over a control pipe."""
        if self.tracer.wraps_process:
            raise UsageError(f"tracer {self.tracer.name} wraps a process and cannot trace lockstep pairs")
        workers = [self.worker_of(run, pairing="lockstep") for run in runs]
        for worker in workers:
            worker.make_room()
            worker.log_path.write_bytes(b"")

        def spec(control_fd: int) -> dict[str, Any]:
            return {"runs": [self.spec(w, cpu_core=cpu_core, control_fd=control_fd).to_json() for w in workers]}

        with self._controlled(workers, spec, self._session_spec_path(runs[0]), self.session_command(runs)):
            yield workers

    @contextlib.contextmanager
    def _controlled(
        self,
        workers: Sequence[WorkerProcess],
        spec: Callable[[int], dict[str, Any]],
        spec_path: Path,
        command: list[str],
    ) -> Iterator[None]:
        """One worker process for ``workers``, answering on a control pipe: its spec (``spec`` of the pipe's end the
        worker writes to) written, the process started, and, when the caller is done, ended and its spec removed."""
        control_read, control_write = os.pipe()
        atomic_write_json(spec_path, spec(control_write))
        proc = spawn(command, self.environment.worker_env(), workers[0].log_path, control_write=control_write)
        os.close(control_write)
        control = os.fdopen(control_read)
        for worker in workers:
            worker.command, worker.spec_path, worker.proc, worker.control = command, spec_path, proc, control
        try:
            yield
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait()
        except BaseException:
            kill_group(proc)
            raise
        finally:
            control.close()
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            spec_path.unlink(missing_ok=True)

    def _finish(self, worker: WorkerProcess, outcome: Outcome, trace: TraceRead | None = None) -> MeasuredRun:
        """The run's record from its worker's result and its trace (``trace``: read once for both arms of a pair
        that shared a process and a trace)."""
        worker.end()
        run = worker.run
        result = self._worker_result(worker.result_path, outcome, worker.log_path)
        window = result.pop("measured_window_monotonic", None)
        steps = result.pop("steps", None) or self.steps_of(run)[0]
        traced_steps = len(result.get("traced_step_wall_ns") or []) or run.traced_steps(steps)
        kernels = {}
        if result["status"] == "ok" and worker.trace_path is not None:
            read = trace or read_trace(worker.trace_path)
            kernels = kernel_fields(self.store, run.run_id, read, traced_steps, SETTLING_STEPS, worker.arm)
        if FAILURE in kernels:
            result.update(status="failed", reason=kernels.pop(FAILURE))
        record = self.file_record(
            worker,
            steps=steps,
            warmup=self.settings.warmup,
            telemetry=worker.sampler.result(window=tuple(window) if window else None) if worker.sampler else None,
            **(worker.fields | result | kernels),
        )
        self._pin(record)
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
            "tracer": self.tracer_of(run).name,
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
        record = measured_run(**(common | fields))
        self.store.write_record(record)
        worker.spec_path.unlink(missing_ok=True)
        worker.result_path.unlink(missing_ok=True)
        return record

    def _worker_result(self, result_path: Path, outcome: Outcome, log_path: Path) -> dict[str, Any]:
        if outcome == "timeout":
            return {"status": "failed", "reason": timeout_reason(self.timeout_s)}
        if not result_path.is_file():
            return {"status": "failed", "reason": f"worker crashed (exit code {outcome}): {last_log_line(log_path)}"}
        return dict(json.loads(result_path.read_text()))
