"""Launch worker processes: one measured run under a tracer, or one call that needs TensorFlow.

Shared by the sweep (whole models) and kernels_bench (single ops): both need a fresh
process per run, the tracer wrapped around it, GPU telemetry sampled meanwhile, the trace
parsed into a KernelTable, and a record written atomically whatever happened. The parent
never imports TensorFlow: what needs it (a workload, deriving op shapes from Keras models)
runs in ``python -m detprof.profiler.worker``, which reads a JSON spec and writes a JSON
result. The spec names its entry point (``module:function``), so the package that owns a
workload names it, and the worker depends on none of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from detprof.determinism import Mode
from detprof.errors import USAGE_EXIT, DetprofError, InputError, UsageError, last_line
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.telemetry import NoTelemetry, TelemetrySampler
from detprof.profiler.tracers import Tracer
from detprof.records import MeasuredRun, measured_run
from detprof.store import ResultsStore, atomic_write_json
from detprof.traces.step_split import kernel_ns_by_step


@dataclass(frozen=True)
class WorkerRun:
    """What every measured run has, whatever its workload."""

    run_id: str
    mode: Mode
    seed: int
    xla: bool
    steps: int
    warmup: int


@dataclass(frozen=True)
class Workload:
    """What a measured worker runs: ``entry`` (``module:function``) builds the step from ``spec``."""

    entry: str
    spec: dict[str, Any] = field(default_factory=dict)


def worker_command(spec_path: Path, result_path: Path) -> list[str]:
    return [sys.executable, "-m", "detprof.profiler.worker", str(spec_path), str(result_path)]


def call_in_worker(entry: str, request: Mapping[str, Any], what: str, *, hide_gpus: bool = True) -> Any:
    """``entry(request)`` in a fresh worker process that sees no GPU; its answer, or its error as it was.

    For work that needs TensorFlow but measures nothing (building Keras models to read shapes
    off them): the parent stays free of TensorFlow's memory and start-up chatter. A
    ``UsageError`` raised there is the same one-line ``UsageError`` here; any other failure
    is an ``InputError`` saying what could not be done.
    """
    import tempfile

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory(prefix="detprof-call-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        atomic_write_json(spec_path, {"call": entry, "request": dict(request)})
        proc = subprocess.run(
            worker_command(spec_path, result_path), capture_output=True, text=True, env=env, check=False
        )
        answer = json.loads(result_path.read_text()) if result_path.is_file() else None
    if proc.returncode == USAGE_EXIT and answer is not None:
        raise UsageError(answer["error"])
    if proc.returncode != 0 or answer is None:
        raise InputError(f"{what} failed: {last_line(proc.stderr) or f'exit code {proc.returncode}'}")
    return answer["answer"]


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class WorkerLauncher:
    def __init__(
        self,
        store: ResultsStore,
        tracer: Tracer,
        device: DeviceChoice,
        timeout_s: float | None,
        sampler_factory: Callable[[], TelemetrySampler | NoTelemetry] | None = None,
    ) -> None:
        self.store = store
        self.tracer = tracer
        self.device = device
        self.timeout_s = timeout_s
        self.sampler_factory = sampler_factory or (lambda: TelemetrySampler.for_device(device))

    def worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONUNBUFFERED"] = "1"
        if self.device.hide_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def run(self, run: WorkerRun, workload: Workload, fields: Mapping[str, Any]) -> MeasuredRun:
        """Run one worker: ``workload`` says what it measures, ``fields`` identify the run in its record."""
        with self._started(run, workload, fields, lockstep=False) as worker:
            outcome = _wait(worker.proc, self.timeout_s)
        return self._finish(worker, outcome)

    def run_pair(self, first: PairedRun, second: PairedRun, *, cpu_core: int) -> list[MeasuredRun]:
        """Two warm workers stepped in lockstep (A, B, A, B, ...): each pair of steps shares the machine's state.

        Both start at once and warm up side by side; then the coordinator hands out one step
        at a time, strictly in turn, so that drift, other load and thermals fall on both alike
        and every step follows one of the other worker (A, B, B, A would give each worker a
        warm-cache step after its own every other round: a bimodal per-step ratio). Both are
        pinned to the same core ``cpu_core`` with one TensorFlow thread each, once warm: only
        one steps at a time, so they never compete, and each step sees the core (and its
        caches, and whatever else runs there) as the other worker's step beside it did.
        Measured on a loaded 2-core machine (A/A, mediumcnn_k3, 5 pairs): +/-2.8% with one
        shared core, +/-8% unpinned, +/-10% on a core each. A worker that fails (or refuses to
        run deterministically) drops out and the other finishes its steps alone; each gets its
        own record. ``--run-timeout`` covers the pair.
        """
        with contextlib.ExitStack() as stack:
            workers = [
                stack.enter_context(self._started(*paired, lockstep=True, cpu_core=cpu_core))
                for paired in (first, second)
            ]
            expired = threading.Event()

            def expire() -> None:
                expired.set()
                for w in workers:
                    _kill_group(w.proc)

            watchdog = threading.Timer(self.timeout_s, expire) if self.timeout_s is not None else None
            if watchdog is not None:
                watchdog.start()
            try:
                _step_in_lockstep(workers, first[0].steps)
                outcomes: list[str | int] = [w.proc.wait() for w in workers]
            except BaseException:
                for w in workers:
                    _kill_group(w.proc)
                raise
            finally:
                if watchdog is not None:
                    watchdog.cancel()
        return [self._finish(w, "timeout" if expired.is_set() else o) for w, o in zip(workers, outcomes, strict=True)]

    @contextlib.contextmanager
    def _started(
        self,
        run: WorkerRun,
        workload: Workload,
        fields: Mapping[str, Any],
        *,
        lockstep: bool,
        cpu_core: int | None = None,
    ) -> Iterator[_Worker]:
        """A worker process running under the tracer, its log and telemetry open until the block ends."""
        work = self.store.dir / "work"
        work.mkdir(parents=True, exist_ok=True)
        trace_base = self.store.dir / "traces" / run.run_id
        trace_base.parent.mkdir(parents=True, exist_ok=True)
        trace_path = self.tracer.trace_path(trace_base)
        control_read, control_write = os.pipe() if lockstep else (None, None)
        spec = {
            **workload.spec,
            "workload": workload.entry,
            "run_id": run.run_id,
            "mode": run.mode,
            "seed": run.seed,
            "xla": run.xla,
            "steps": run.steps,
            "warmup": run.warmup,
            "in_process": self.tracer.in_process,
            "nvtx_steps": self.tracer.nvtx_steps,
            "trace_path": str(trace_path) if trace_path else None,
            "control_fd": control_write,
            "cpu_core": cpu_core,
            "cpu_threads": None if cpu_core is None else 1,
        }
        spec_path = work / f"{run.run_id}.spec.json"
        result_path = work / f"{run.run_id}.result.json"
        atomic_write_json(spec_path, spec)
        result_path.unlink(missing_ok=True)
        command = self.tracer.command(worker_command(spec_path, result_path), trace_base)
        log_path = self.store.dir / "logs" / f"{run.run_id}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        started, t0 = _now(), time.monotonic()
        with open(log_path, "wb") as log, self.sampler_factory() as sampler:
            proc = subprocess.Popen(
                command,
                env=self.worker_env(),
                stdin=subprocess.PIPE if lockstep else subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=() if control_write is None else (control_write,),
                preexec_fn=_same_address_layout if lockstep else None,
            )
            control = None
            if control_write is not None and control_read is not None:
                os.close(control_write)
                control = os.fdopen(control_read)
            paths = (spec_path, result_path, log_path, trace_path)
            worker = _Worker(run, dict(fields), command, *paths, started, t0, proc, control, sampler)
            try:
                yield worker
            finally:
                if control is not None:
                    control.close()
                if proc.stdin is not None:
                    with contextlib.suppress(OSError):
                        proc.stdin.close()

    def _finish(self, worker: _Worker, outcome: str | int) -> MeasuredRun:
        run = worker.run
        finished, duration = _now(), round(time.monotonic() - worker.t0, 3)
        result = self._worker_result(worker.result_path, outcome, worker.log_path)
        window = result.pop("measured_window_monotonic", None)
        steps = len(result.get("step_wall_ns") or []) or run.steps
        kernels = self._kernels(run.run_id, worker.trace_path, steps) if result["status"] == "ok" else {}
        if "failure" in kernels:
            result.update(status="failed", reason=kernels.pop("failure"))
        record = measured_run(
            run_id=run.run_id,
            mode=run.mode,
            steps=steps,
            warmup=run.warmup,
            tracer=self.tracer.name,
            device=self.device.as_record(),
            command=shlex.join(worker.command),
            log=str(worker.log_path.relative_to(self.store.dir)),
            started_at=worker.started,
            finished_at=finished,
            duration_s=duration,
            telemetry=worker.sampler.result(window=tuple(window) if window else None),
            **(worker.fields | result | kernels),
        )
        self.store.write_record(record)
        worker.spec_path.unlink(missing_ok=True)
        worker.result_path.unlink(missing_ok=True)
        return record

    def _worker_result(self, result_path: Path, outcome: str | int, log_path: Path) -> dict[str, Any]:
        if outcome == "timeout":
            return {"status": "failed", "reason": f"timed out after {self.timeout_s:g} s (--run-timeout)"}
        if not result_path.is_file():
            return {
                "status": "failed",
                "reason": f"worker crashed (exit code {outcome}): {_last_log_line(log_path)}",
            }
        return json.loads(result_path.read_text())

    def _kernels(self, run_id: str, trace_path: Path | None, steps: int) -> dict[str, Any]:
        """The record's kernel fields from the trace; ``{"failure": reason}`` when it is unusable."""
        if trace_path is None:
            return {}
        from detprof.traces.parsers import load_trace

        found: dict[str, Any] = {"trace_file": str(trace_path.relative_to(self.store.dir))}
        try:
            table = load_trace(trace_path)
        except DetprofError as exc:
            return found | {"failure": f"trace unusable: {exc}"}
        if table.kernel_count == 0:
            return found | {"failure": "the measured window holds no kernels"}
        frame = table.summary if table.is_summary else table.kernels
        return found | {
            "kernel_table": self.store.write_table(run_id, frame),
            "kernel_table_kind": "summary" if table.is_summary else "launches",
            "kernel_count": table.kernel_count,
            "kernel_ns_per_step": table.total_ns / steps,
            "step_kernel_ns": kernel_ns_by_step(table),
        }


PairedRun = tuple[WorkerRun, Workload, Mapping[str, Any]]


@dataclass
class _Worker:
    """A started worker: what it runs and where its outputs go, its process and its control pipe."""

    run: WorkerRun
    fields: dict[str, Any]
    command: list[str]
    spec_path: Path
    result_path: Path
    log_path: Path
    trace_path: Path | None
    started: str
    t0: float
    proc: subprocess.Popen[bytes]
    control: IO[str] | None
    """The worker's answers in a lockstep pair ("ready", then one line per step); None otherwise."""
    sampler: TelemetrySampler | NoTelemetry


ADDR_NO_RANDOMIZE = 0x0040000


def _same_address_layout() -> None:
    """Start the worker without address-space randomization (Linux ``personality``), as ``setarch -R`` does.

    Where code and buffers land changes cache and TLB behaviour enough to make one process
    persistently faster than another running the same thing (Mytkowicz et al., "Producing
    wrong data without doing anything obviously wrong", ASPLOS 2009). A/A pairs of
    mediumcnn_k3 on this 2-core machine: step times 20-30 ms from process to process with
    randomization, 20-23 ms without, and the pair ratios' interval +/-1.7% over 8 pairs.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).personality(ADDR_NO_RANDOMIZE)


def _step_in_lockstep(workers: list[_Worker], steps: int) -> None:
    """Wait until each is warm, then one step each in turn.

    A worker that fails (a refusal to run deterministically, out of memory) drops out and the
    other goes on alone: its run is no longer paired, but its kernels are still what the
    report shows of that mode.
    """
    alive = [w for w in workers if w.control is not None and w.control.readline().strip() == "ready"]
    for _step in range(steps):
        for worker in list(alive):
            assert worker.proc.stdin is not None and worker.control is not None
            try:
                worker.proc.stdin.write(b"step\n")
                worker.proc.stdin.flush()
                answered = bool(worker.control.readline())
            except OSError:
                answered = False
            if not answered:
                alive.remove(worker)
        if not alive:
            return


def _wait(proc: subprocess.Popen[bytes], timeout: float | None) -> str | int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return "timeout"
    except BaseException:
        _kill_group(proc)
        raise


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _last_log_line(log_path: Path) -> str:
    try:
        line = last_line(log_path.read_text(errors="replace"))
    except OSError:
        return "no output"
    return line[:300] or "no output"
