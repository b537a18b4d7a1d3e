"""Run a training program detprof did not write, once per run of the plan, and record what it measured.

``ProgramLauncher`` is the ``WorkerLauncher`` of programs: the same store, tracer, device,
telemetry, trace parsing (``trace_fields``) and record. What differs is the process and
what it leaves behind. The process is the user's command, split with ``shlex`` and never run
through a shell, in its mode's environment (``backends.program.program_environment``) with the
``sitecustomize`` hook first on ``PYTHONPATH``; its stdout goes to the run's log, its stderr
to a file of its own, whose tail the record keeps. It leaves its exit status, the hook's
reports of what was in effect (a deterministic run without determinism in effect is failed,
not measured) and, if it opened one, the measured window ``detprof.measure()`` wrote
(``program.files``).

A program cannot time untraced steps and then trace others as detprof's worker does, so each
of its runs either traces (kernel time) or is timed untraced (wall time; ``plan.measured_parts``).
Without a window its wall time is its whole process, start-up included, and there is nothing
for a tracer to trace: once a run has shown that the program opens no window, its traced runs
are recorded as failed with that reason instead of being run.

``detprof verify --command`` runs a program through the same pieces (``program_env``,
``run_process``, ``program_status``, ``program_fields``), untraced, into records of its own.
"""

from __future__ import annotations

import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from detprof.backends.program import program_environment
from detprof.determinism import Mode
from detprof.errors import last_line
from detprof.profiler.launcher import WorkerLauncher
from detprof.profiler.measured_runs import PlannedRun
from detprof.profiler.process import Outcome, WorkerEnvironment, spawn, timeout_reason, wait_for_exit
from detprof.profiler.program.files import SPEC_ENV, InEffect, ProgramSpec, Window, in_effect, read_window
from detprof.profiler.trace_fields import FAILURE, kernel_fields, read_trace
from detprof.profiler.worker import classify_failure
from detprof.profiler.worker_process import WorkerProcess
from detprof.records import MeasuredRun
from detprof.store import atomic_write_json
from detprof.version import detprof_version

HOOK_DIR = Path(__file__).resolve().parent / "hook"
"""The folder put first on the program's ``PYTHONPATH``: its ``sitecustomize`` is the hook."""
STDERR_TAIL_LINES = 20
STDERR_TAIL_CHARS = 2000
REASON_CHARS = 500
NO_WINDOW = (
    "nothing to trace: the program opens no measured window (detprof.measure()), and the tracer records only "
    "inside one; its untraced runs time its whole process"
)


def _argv_of(run: PlannedRun) -> list[str]:
    """The program's command line, as ``program.request`` put it into the run's workload."""
    return [str(arg) for arg in run.workload.params["argv"]]


class ProgramLauncher(WorkerLauncher):
    """A ``WorkerLauncher`` whose process is the user's program: the same paths, environment and record."""

    def program_spec(self, worker: WorkerProcess) -> ProgramSpec:
        return ProgramSpec(
            run_id=worker.run.run_id,
            mode=worker.run.mode,
            tracer=self.tracer_of(worker.run).name,
            trace_path=str(worker.trace_path) if worker.trace_path else None,
            window_path=str(worker.result_path),
        )

    def run(self, run: PlannedRun) -> MeasuredRun:
        worker = self.worker_of(run)
        argv = _argv_of(run)
        in_effect_dir = worker.spec_path.with_name(f"{run.run_id}.in-effect")
        stderr_path = worker.log_path.with_name(f"{run.run_id}.stderr.log")
        worker.make_room()
        shutil.rmtree(in_effect_dir, ignore_errors=True)
        in_effect_dir.mkdir()
        worker.start()
        if run.traced and self._opens_no_window():
            return self._record(worker, argv, None, None, in_effect_dir, stderr_path)
        atomic_write_json(worker.spec_path, self.program_spec(worker).to_json())
        worker.command = self.tracer_of(run).command(argv, worker.trace_base)
        env = program_env(self.environment, run.mode, worker.spec_path, in_effect_dir, self.settings.program_seed)
        with worker.watched(self.sampler_factory()):
            started = time.monotonic_ns()
            outcome = run_process(worker.command, env, worker.log_path, stderr_path, self.timeout_s)
            process_ns = time.monotonic_ns() - started
        return self._record(worker, argv, outcome, process_ns, in_effect_dir, stderr_path)

    def _opens_no_window(self) -> bool:
        """Whether a run of this study has shown that the program finishes without opening a measured window."""
        return any(
            program.get("measured_window") == "process" and program.get("exit_status") == 0
            for program in (record.get("program") or {} for record in self.store.records())
        )

    def _record(
        self,
        worker: WorkerProcess,
        argv: list[str],
        outcome: Outcome | None,
        process_ns: int | None,
        in_effect_dir: Path,
        stderr_path: Path,
    ) -> MeasuredRun:
        """The run's record, written atomically; ``outcome`` None: the run was not started (``NO_WINDOW``)."""
        worker.end()
        run = worker.run
        window = read_window(worker.result_path)
        effect = in_effect(in_effect_dir, run.mode)
        stderr = stderr_tail(stderr_path)
        status, reason = self._status(run, outcome, window, effect, stderr)
        measured: dict[str, Any] = {}
        steps = 0
        if status == "ok" and run.measures == "wall":
            assert process_ns is not None
            measured["step_wall_ns"] = window.step_wall_ns if window is not None else [process_ns]
            steps = len(measured["step_wall_ns"])
        elif status == "ok" and window is not None:
            steps = len(window.step_wall_ns)
            measured = {"traced_step_wall_ns": window.step_wall_ns}
            assert worker.trace_path is not None, "a run that measures kernels is traced"
            measured |= kernel_fields(self.store, run.run_id, read_trace(worker.trace_path), steps, settling=0)
            if FAILURE in measured:
                status, reason = "failed", measured.pop(FAILURE)
        worker.command = worker.command or argv
        span = window.monotonic if window is not None else None
        record = self.file_record(
            worker,
            backend=program_backend(self.settings.backend, effect),
            status=status,
            reason=reason,
            steps=steps,
            warmup=0,
            telemetry=None if worker.sampler is None else worker.sampler.result(window=span),
            settings=effect.settings(run.mode) if effect.processes else None,
            versions=effect.versions | {"detprof": detprof_version()},
            program=program_fields(argv, outcome, stderr, str(stderr_path.relative_to(self.store.dir)), window, effect),
            **worker.fields,
            **measured,
        )
        shutil.rmtree(in_effect_dir, ignore_errors=True)
        return record

    def _status(
        self, run: PlannedRun, outcome: Outcome | None, window: Window | None, effect: InEffect, stderr: str
    ) -> tuple[str, str | None]:
        """ok, or failed (unsupported: the framework refused to run deterministically) and the one-line reason."""
        if outcome is None:
            return "failed", NO_WINDOW
        status, reason = program_status(outcome, effect, stderr, run.mode, self.timeout_s)
        if status != "ok":
            return status, reason
        if window is not None and window.failure is not None:
            return "failed", window.failure
        if run.traced and window is None:
            return "failed", NO_WINDOW
        return "ok", None


def program_env(
    environment: WorkerEnvironment, mode: Mode, spec_path: Path, in_effect_dir: Path, seed: int | None
) -> dict[str, str]:
    """The program's whole environment: a worker's, switched to ``mode`` and seeded with ``--seed`` where given,
    with the hook first on its path."""
    env = program_environment(mode, environment.worker_env(), str(in_effect_dir), seed)
    path = [str(HOOK_DIR), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    return env | {SPEC_ENV: str(spec_path), "PYTHONPATH": os.pathsep.join(path)}


def program_status(
    outcome: Outcome, effect: InEffect, stderr: str, mode: Mode, timeout_s: float | None
) -> tuple[str, str | None]:
    """ok, or failed (unsupported: the framework refused to run deterministically) and why, in one line: what the
    process's end and the hook's reports say of any run of a program, traced or not, swept or verified."""
    if outcome == "timeout":
        return "failed", timeout_reason(timeout_s)
    if isinstance(outcome, str):
        return "failed", outcome
    if outcome != 0:
        last = last_line(stderr) or "nothing on stderr"
        status, _ = classify_failure(RuntimeError(last), mode == "deterministic")
        return status, f"exit code {outcome}: {last}"[:REASON_CHARS]
    if effect.problem is not None:
        return "failed", effect.problem
    return "ok", None


def program_fields(
    argv: list[str], outcome: Outcome | None, stderr: str, stderr_log: str, window: Window | None, effect: InEffect
) -> dict[str, Any]:
    """A record's ``program``: the command, how it ended, its stderr's tail and log, its window, its processes."""
    return {
        "command": shlex.join(argv),
        "exit_status": outcome if isinstance(outcome, int) else None,
        "stderr_tail": stderr,
        "stderr_log": stderr_log,
        "measured_window": "api" if window is not None else "process",
        "marked_steps": None if window is None else window.marked_steps,
        "processes": effect.processes,
    }


def run_process(
    command: list[str], env: dict[str, str], log_path: Path, stderr_path: Path, timeout_s: float | None
) -> Outcome:
    """The program's exit status, "timeout" (its process group killed), or why it could not start."""
    try:
        proc = spawn(command, env, log_path, stderr=stderr_path)
    except OSError as exc:
        return f"cannot start {command[0]}: {exc.strerror or exc}"
    return wait_for_exit(proc, timeout_s)


def stderr_tail(path: Path) -> str:
    """The last lines of the program's stderr, where its error is when it failed."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-STDERR_TAIL_LINES:])[-STDERR_TAIL_CHARS:]


def program_backend(asked: str, effect: InEffect) -> str:
    """The framework the program trained with: the one it loaded, else ``--backend`` (also when it loaded several)."""
    loaded = list(effect.frameworks)
    return asked if asked in loaded or not loaded else loaded[0]
