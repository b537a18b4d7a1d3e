"""Sessions: one worker process that measures several runs in order, paced over a control pipe.

Two ways to pair the modes run that way: lockstep pairs (a worker per mode, the coordinator handing
out one step at a time to each in turn) and pairs in one process (one worker that runs both arms of
each pair, a step of each in turn). The sequential way, a process per run, needs no session
(``WorkerLauncher.run``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detprof.errors import UsageError
from detprof.profiler.lockstep import step_in_lockstep, wait_until_done
from detprof.profiler.measured_runs import ModePair, PlannedRun
from detprof.profiler.process import WorkerEnvironment, kill_group, spawn, watchdog, worker_command
from detprof.profiler.run_records import RecordFiler
from detprof.profiler.run_specs import RunSpecs
from detprof.profiler.telemetry import NoTelemetry, TelemetrySampler
from detprof.profiler.trace_fields import read_trace
from detprof.profiler.worker_process import RunFiles, WorkerProcess
from detprof.records import MeasuredRun
from detprof.store import atomic_write_json

Note = Callable[[str], None]
"""Where a session says what no record holds: a worker that ended before its last pair (``RunProgress.note``)."""


@dataclass(frozen=True)
class Launch:
    """What every way of launching a study's workers shares: the runs' records (and through them their files, specs
    and the workers' environment), and the telemetry sampled beside each run."""

    records: RecordFiler
    sampler_factory: Callable[[], TelemetrySampler | NoTelemetry]

    @property
    def files(self) -> RunFiles:
        return self.records.files

    @property
    def specs(self) -> RunSpecs:
        return self.records.specs

    @property
    def environment(self) -> WorkerEnvironment:
        return self.records.environment

    @property
    def timeout_s(self) -> float | None:
        """How long a run (a session's pair) may take: ``--run-timeout``."""
        return self.records.settings.run_timeout_s

    def process_knobs(self, pair: Sequence[WorkerProcess]) -> frozenset[str]:
        """What a process that runs ``pair``'s arms starts with, on this study's device (``Backend.process_knobs``)."""
        on_gpu = self.records.device.gpu is not None and not self.records.device.hide_gpus
        return self.records.settings.process_knobs([worker.run for worker in pair], on_gpu)

    def session_command(self, runs: Sequence[PlannedRun]) -> list[str]:
        """The command line of the worker that measures ``runs`` of one side of lockstep pairs."""
        return worker_command(self.files.session_spec_path(runs[0]))


def lockstep_pairs(launch: Launch, pairs: Sequence[ModePair], cpu_core: int, note: Note) -> Iterator[MeasuredRun]:
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
    workers for the pairs left, and a line names each worker that died (``note``, ``_ended_early``).
    """
    if not pairs:
        return
    with contextlib.ExitStack() as stack:
        sessions = [stack.enter_context(_session(launch, [pair[side] for pair in pairs], cpu_core)) for side in (0, 1)]
        for index in range(len(pairs)):
            workers = [session[index] for session in sessions]
            timer, expired = watchdog(launch.timeout_s, [worker.proc for worker in workers])
            with contextlib.ExitStack() as samplers:
                for worker in workers:
                    worker.start()
                    samplers.enter_context(worker.watched(launch.sampler_factory()))
                if timer is not None:
                    timer.start()
                try:
                    first, specs = workers[0].run, launch.specs
                    most = specs.steps_of(first)[0]
                    step_in_lockstep(workers, first.wall_steps(most), first.traced_steps(most), specs.size(first))
                finally:
                    if timer is not None:
                        timer.cancel()
            outcomes = ["timeout" if expired.is_set() else worker.outcome() for worker in workers]
            for worker, outcome in zip(workers, outcomes, strict=True):
                yield launch.records.finish(worker, outcome)
            # A worker killed by the watchdog may not have died yet: the session ends on the timeout itself.
            if any(outcome != 0 for outcome in outcomes):
                for side, (worker, outcome) in enumerate(zip(workers, outcomes, strict=True)):
                    if outcome not in (0, "timeout"):
                        _ended_early(launch, sessions[side], [w.run.label for w in sessions[side]], index, note)
                    if worker.proc is not None:
                        kill_group(worker.proc)
                return


def in_process_pairs(
    launch: Launch, pairs: Sequence[ModePair], cpu_core: int | None, note: Note
) -> Iterator[MeasuredRun]:
    """Pairs measured by one worker that runs both arms of each, a step of each in turn (``worker.run_arms``).

    The worker lives for all of ``pairs`` (the models of one repeat, or with ``--shared-repeats`` every repeat of
    each model in turn), which are measured one after the other, both arms of a pair in one trace; pinned to
    ``cpu_core`` with one compute thread once warm, as a lockstep pair is, where there is one (a CPU). Under a
    tracer that wraps the process (nsys), the process traces one pair. Yields each run's
    record as its pair finishes; when the worker dies or ``--run-timeout`` (per pair)
    expires, the session ends after that pair's records and the caller starts a fresh one; a line names a worker
    that died before its last pair (``note``, ``_ended_early``).
    """
    if not pairs:
        return
    with _pair_session(launch, pairs, cpu_core) as sessions:
        for index, workers in enumerate(sessions):
            proc = workers[0].proc
            assert proc is not None
            timer, expired = watchdog(launch.timeout_s, [proc])
            for worker in workers:
                worker.start()
            with workers[0].watched(launch.sampler_factory()):
                if timer is not None:
                    timer.start()
                try:
                    wait_until_done(workers[0])
                finally:
                    if timer is not None:
                        timer.cancel()
            workers[1].sampler, workers[1].load = workers[0].sampler, workers[0].load
            trace_path = workers[0].trace_path
            t0 = time.monotonic()
            trace = read_trace(trace_path) if trace_path is not None and trace_path.exists() else None
            read_s = time.monotonic() - t0
            outcomes = ["timeout" if expired.is_set() else worker.outcome() for worker in workers]
            for worker, outcome in zip(workers, outcomes, strict=True):
                yield launch.records.finish(worker, outcome, trace, read_s)
                read_s = 0.0
            # The worker runs ahead while this pair is read and filed, and may have ended having written every pair
            # left: only a pair it wrote no result for ends the session.
            if any(outcome != 0 for outcome in outcomes):
                if not expired.is_set():
                    labels = [" + ".join(w.run.label for w in pair) for pair in sessions]
                    _ended_early(launch, [pair[0] for pair in sessions], labels, index, note)
                kill_group(proc)
                return


def _ended_early(launch: Launch, runs: Sequence[WorkerProcess], labels: Sequence[str], index: int, note: Note) -> None:
    """A session's worker that died in its run ``index`` of ``runs`` (a pair's first worker, for a pair in one
    process) with runs left, which fresh workers measure: one line says so, with the log of its last output."""
    proc = runs[index].proc
    if proc is None or index + 1 == len(runs):
        return
    note(
        f"the worker measuring {labels[index]} ({index + 1} of {len(runs)}) exited with code {proc.returncode}; "
        f"fresh workers measure the {len(runs) - index - 1} left; its last output is in "
        f"{runs[index].log_path.relative_to(launch.files.store.dir)}"
    )


@contextlib.contextmanager
def _pair_session(
    launch: Launch, pairs: Sequence[ModePair], cpu_core: int | None
) -> Iterator[list[tuple[WorkerProcess, WorkerProcess]]]:
    """One worker process that measures ``pairs`` in order, both arms of each, saying when each is done."""
    sessions = [launch.files.pair_workers(pair) for pair in pairs]
    for workers in sessions:
        for worker in workers:
            worker.make_room()
        workers[0].log_path.write_bytes(b"")

    def spec(control_fd: int) -> dict[str, Any]:
        def arm(worker: WorkerProcess) -> dict[str, Any]:
            return launch.specs.spec(worker, cpu_core=cpu_core, control_fd=control_fd, arm=worker.arm).to_json()

        pairs = [[arm(worker) for worker in workers] for workers in sessions]
        shared = launch.records.settings.shared_repeats
        return {"pairs": pairs, "process_knobs": sorted(launch.process_knobs(sessions[0]))} | (
            {"shared_repeats": True} if shared else {}
        )

    first = sessions[0][0]
    spec_path = launch.files.session_spec_path(pairs[0][0])
    command = launch.files.tracer_of(first.run).command(worker_command(spec_path), first.trace_base)
    with controlled(launch.environment, [w for ws in sessions for w in ws], spec, spec_path, command):
        yield sessions


@contextlib.contextmanager
def _session(launch: Launch, runs: Sequence[PlannedRun], cpu_core: int) -> Iterator[list[WorkerProcess]]:
    """One worker process that measures ``runs`` of one side of lockstep pairs in order."""
    if launch.files.tracer.wraps_process:
        raise UsageError(f"tracer {launch.files.tracer.name} wraps a process and cannot trace lockstep pairs")
    workers = [launch.files.worker_of(run, pairing="lockstep") for run in runs]
    for worker in workers:
        worker.make_room()
        worker.log_path.write_bytes(b"")

    def spec(control_fd: int) -> dict[str, Any]:
        return {"runs": [launch.specs.spec(w, cpu_core=cpu_core, control_fd=control_fd).to_json() for w in workers]}

    spec_path = launch.files.session_spec_path(runs[0])
    with controlled(launch.environment, workers, spec, spec_path, launch.session_command(runs)):
        yield workers


@contextlib.contextmanager
def controlled(
    environment: WorkerEnvironment,
    workers: Sequence[WorkerProcess],
    spec: Callable[[int], dict[str, Any]],
    spec_path: Path,
    command: list[str],
) -> Iterator[None]:
    """One worker process for ``workers``, answering on a control pipe: its spec (``spec`` of the pipe's end the
    worker writes to) written, the process started, and, when the caller is done, ended and its spec removed."""
    control_read, control_write = os.pipe()
    atomic_write_json(spec_path, spec(control_write))
    proc = spawn(command, environment.worker_env(), workers[0].log_path, control_write=control_write)
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
