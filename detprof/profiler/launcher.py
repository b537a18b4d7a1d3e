"""Launch worker processes: one measured run under a tracer, or one call that needs a framework.

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
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from detprof.determinism import Mode
from detprof.errors import USAGE_EXIT, DetprofError, InputError, UsageError, last_line
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.gpu_env import gpu_env
from detprof.profiler.lifeline import driver_lifeline
from detprof.profiler.telemetry import NoTelemetry, TelemetrySampler
from detprof.profiler.tracers import TRACERS, Tracer
from detprof.records import MeasuredRun, measured_run
from detprof.store import ResultsStore, atomic_write_json
from detprof.traces.graphs import cuda_graph_use
from detprof.traces.step_split import kernel_ns_by_step, within_steps

STEADY_HEAP_ENV: dict[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
    "MALLOC_TRIM_THRESHOLD_": str((1 << 32) - 1),
    "MALLOC_TOP_PAD_": str(1 << 28),
}
"""glibc malloc settings under which a worker's tensors reuse heap memory from step to step.

By default glibc hands buffers over 128 KiB (up to 32 MiB as its threshold adapts) to
mmap and gives freed memory back to the kernel, so each step page-faults its large
tensors afresh, and how much it does depends on the process: the same model ran 20-40%
slower in one worker than in the other of a lockstep pair for a whole run, and
mediumcnn_k3's A/A interval over 6 pairs was +/-3-12%. Kept on the heap, every step after
the warm-up touches memory it already has: +/-0.9-1.7% (README, "How the measurement
concludes"). Both modes get the same settings; a user's own value wins (``setdefault``).

Address-space randomization stays on. Turned off, it steadied the step times while the heap
still moved, but it fixes each mode's layout by its command line (the two modes' run ids
differ in length), a bias between the modes that no A/A test can see. With the heap kept,
randomized layouts cost little (A/A over 6 pairs, all within +/-2.2%) and are a random
effect the interval over pairs covers (Mytkowicz et al., "Producing wrong data without
doing anything obviously wrong", ASPLOS 2009).
"""


SETTLING_STEPS = 1
"""Untimed steps a worker runs right after its tracer starts, so that what starting a capture
costs lands on no measured step (``worker.run``)."""

Measures = Literal["both", "kernel", "wall"]
"""What a run measures: wall time from untraced steps, kernel time from traced ones, or both
(an in-process tracer: untraced steps first, then traced ones). A tracer that wraps the
process (nsys, nvprof) taxes all of it, so its runs measure kernels only and an untraced
run beside each measures the wall time (``profiler.study.measured_parts``)."""


@dataclass(frozen=True)
class WorkerRun:
    """What every measured run has, whatever its workload."""

    run_id: str
    mode: Mode
    seed: int
    xla: bool
    steps: int
    warmup: int
    measures: Measures = "both"
    backend: str = "tensorflow"
    """The Keras backend the worker runs (``determinism.Backend``)."""
    compile: bool = False
    """torch only: ``torch.compile`` in both modes (``determinism.DeterminismSettings.compile``)."""

    @property
    def traced(self) -> bool:
        return self.measures != "wall"

    @property
    def wall_steps(self) -> int:
        """Untraced steps timed for wall time."""
        return 0 if self.measures == "kernel" else self.steps

    @property
    def traced_steps(self) -> int:
        """Steps under the tracer, whose kernels are the run's kernel time."""
        return self.steps if self.traced else 0


@dataclass(frozen=True)
class Workload:
    """What a measured worker runs: ``entry`` (``module:function``) builds the step from ``spec``."""

    entry: str
    spec: dict[str, Any] = field(default_factory=dict)


def worker_command(spec_path: Path, result_path: Path | None = None) -> list[str]:
    """The worker's command line; a session's spec names each run's result path itself."""
    return [
        sys.executable,
        "-m",
        "detprof.profiler.worker",
        str(spec_path),
        *([str(result_path)] if result_path else []),
    ]


def call_in_worker(entry: str, request: Mapping[str, Any], what: str, *, hide_gpus: bool = True) -> Any:
    """``entry(request)`` in a fresh worker process that sees no GPU; its answer, or its error as it was.

    For work that needs TensorFlow but measures nothing (building Keras models to read shapes
    off them): the parent stays free of TensorFlow's memory and start-up chatter. A
    ``UsageError`` raised there is the same one-line ``UsageError`` here; any other failure
    is an ``InputError`` saying what could not be done.
    """
    import tempfile

    lifeline_env, lifeline_fds = driver_lifeline()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **lifeline_env}
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory(prefix="detprof-call-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        atomic_write_json(spec_path, {"call": entry, "request": dict(request)})
        proc = subprocess.run(
            worker_command(spec_path, result_path),
            capture_output=True,
            text=True,
            env=env,
            pass_fds=lifeline_fds,
            check=False,
        )
        answer = json.loads(result_path.read_text()) if result_path.is_file() else None
    if proc.returncode == USAGE_EXIT and answer is not None:
        raise UsageError(answer["error"])
    if proc.returncode != 0 or answer is None:
        raise InputError(f"{what} failed: {last_line(proc.stderr) or f'exit code {proc.returncode}'}")
    return answer["answer"]


def utc_now() -> str:
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

    def detprof_env(self) -> dict[str, str]:
        """What detprof sets in a worker's environment, as it takes effect (a user's own logging and
        heap settings win); the GPU pinning always comes from ``gpu_env``."""
        env = {
            name: os.environ.get(name, value)
            for name, value in {"TF_CPP_MIN_LOG_LEVEL": "2", **STEADY_HEAP_ENV}.items()
        }
        return env | {"PYTHONUNBUFFERED": "1"} | gpu_env(self.device, shares_gpu=False)

    def worker_env(self) -> dict[str, str]:
        """The worker's whole environment: this process's, what detprof sets, and the lifeline it ends with."""
        return dict(os.environ) | self.detprof_env() | driver_lifeline()[0]

    def timing_env(self) -> dict[str, str]:
        """The heap settings the workers run with, as they take effect (a user's own value wins)."""
        env = self.detprof_env()
        return {name: env[name] for name in STEADY_HEAP_ENV}

    def commands(
        self, run: WorkerRun, workload: Workload, fields: Mapping[str, Any], *, require_installed: bool = True
    ) -> tuple[list[str], list[str]]:
        """A run of its own: the worker's command line, and the one that runs it (in its tracer, if traced)."""
        return self._commands(self._prepare(run, workload, fields, cpu_core=None, control_fd=None), require_installed)

    def _commands(self, worker: WorkerProcess, require_installed: bool = True) -> tuple[list[str], list[str]]:
        command = worker_command(worker.spec_path, worker.result_path)
        if not worker.run.traced:
            return command, command
        return command, self.tracer.command(command, worker.trace_base, require_installed=require_installed)

    def session_command(self, runs: Sequence[PairedRun]) -> list[str]:
        """The command line of the worker that measures ``runs`` of one side of lockstep pairs."""
        return worker_command(self._session_spec_path(runs[0][0]))

    def _session_spec_path(self, first: WorkerRun) -> Path:
        return self.store.dir / "work" / f"{first.run_id}.session.json"

    def run(self, run: WorkerRun, workload: Workload, fields: Mapping[str, Any]) -> MeasuredRun:
        """Run one worker: ``workload`` says what it measures, ``fields`` identify the run in its record."""
        worker = self._prepare(run, workload, fields, cpu_core=None, control_fd=None)
        command = self._commands(worker)[1]
        worker.make_room()
        atomic_write_json(worker.spec_path, worker.spec)
        worker.start()
        with self.sampler_factory() as worker.sampler:
            proc = self._spawn(command, worker.log_path, control_write=None)
            worker.command = command
            outcome = wait_for_exit(proc, self.timeout_s)
        return self._finish(worker, outcome)

    def run_pairs(self, pairs: Sequence[tuple[PairedRun, PairedRun]], *, cpu_core: int) -> Iterator[MeasuredRun]:
        """Lockstep pairs, one after the other, measured by the same two warm workers, one per side.

        Each pair: both workers build and warm up its workload side by side; then the
        coordinator hands out one step at a time, strictly in turn (``_step_in_lockstep``), so
        that drift, other load and thermals fall on both alike. Both are pinned to the same
        core ``cpu_core`` with one TensorFlow thread each once warm: only one steps at a time,
        so they never compete, and each step sees the core (and its caches, and whatever else
        runs there) as the other worker's step beside it did. Measured on a loaded 2-core
        machine (A/A, mediumcnn_k3, 5 pairs): +/-2.8% with one shared core, +/-8% unpinned,
        +/-10% on a core each.

        The workers live for all of ``pairs`` (the models of one repeat): importing TensorFlow
        and Keras took 5 of a pair's 10 s, so a worker per pair spent half the sweep starting.
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
                watchdog, expired = _watchdog(self.timeout_s, [worker.proc for worker in workers])
                with contextlib.ExitStack() as samplers:
                    for worker in workers:
                        worker.start()
                        worker.sampler = samplers.enter_context(self.sampler_factory())
                    if watchdog is not None:
                        watchdog.start()
                    try:
                        _step_in_lockstep(workers, workers[0].run.wall_steps, workers[0].run.traced_steps)
                    finally:
                        if watchdog is not None:
                            watchdog.cancel()
                for worker in workers:
                    yield self._finish(worker, "timeout" if expired.is_set() else worker.outcome())
                if any(worker.proc is None or worker.proc.poll() is not None for worker in workers):
                    for worker in workers:
                        if worker.proc is not None:
                            _kill_group(worker.proc)
                    return

    def _prepare(
        self,
        run: WorkerRun,
        workload: Workload,
        fields: Mapping[str, Any],
        *,
        cpu_core: int | None,
        control_fd: int | None,
    ) -> WorkerProcess:
        """A run's spec and the paths of its spec, result, log and trace; nothing is written yet."""
        work = self.store.dir / "work"
        trace_base = self.store.dir / "traces" / run.run_id
        tracer = self.tracer_of(run)
        trace_path = tracer.trace_path(trace_base)
        log_path = self.store.dir / "logs" / f"{run.run_id}.log"
        result_path = work / f"{run.run_id}.result.json"
        spec = {
            **workload.spec,
            "workload": workload.entry,
            "run_id": run.run_id,
            "mode": run.mode,
            "seed": run.seed,
            "xla": run.xla,
            "backend": run.backend,
            "compile": run.compile,
            "wall_steps": run.wall_steps,
            "traced_steps": run.traced_steps,
            "settling_steps": SETTLING_STEPS,
            "warmup": run.warmup,
            "in_process": tracer.in_process,
            "nvtx_steps": tracer.nvtx_steps,
            "trace_path": str(trace_path) if trace_path else None,
            "control_fd": control_fd,
            "cpu_core": cpu_core,
            "cpu_threads": None if cpu_core is None else 1,
            "result_path": str(result_path),
            "log_path": str(log_path),
        }
        spec_path = work / f"{run.run_id}.spec.json"
        return WorkerProcess(run, dict(fields), spec, spec_path, result_path, log_path, trace_base, trace_path)

    def tracer_of(self, run: WorkerRun) -> Tracer:
        """The tracer around ``run``: none for the untraced runs that measure wall time."""
        return self.tracer if run.traced else TRACERS["none"]

    def _spawn(self, command: list[str], log_path: Path, control_write: int | None) -> subprocess.Popen[bytes]:
        with open(log_path, "wb") as log:
            return subprocess.Popen(
                command,
                env=self.worker_env(),
                stdin=subprocess.DEVNULL if control_write is None else subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=driver_lifeline()[1] + (() if control_write is None else (control_write,)),
            )

    @contextlib.contextmanager
    def _session(self, runs: Sequence[PairedRun], cpu_core: int) -> Iterator[list[WorkerProcess]]:
        """One worker process that measures ``runs`` in order, paced over a control pipe."""
        if self.tracer.wraps_process:
            raise UsageError(f"tracer {self.tracer.name} wraps a process and cannot trace lockstep pairs")
        control_read, control_write = os.pipe()
        workers = [self._prepare(*paired, cpu_core=cpu_core, control_fd=control_write) for paired in runs]
        for worker in workers:
            worker.make_room()
            worker.log_path.write_bytes(b"")
        spec_path = self._session_spec_path(runs[0][0])
        atomic_write_json(spec_path, {"runs": [worker.spec for worker in workers]})
        command = self.session_command(runs)
        proc = self._spawn(command, workers[0].log_path, control_write)
        os.close(control_write)
        control = os.fdopen(control_read)
        for worker in workers:
            worker.command, worker.spec_path, worker.proc, worker.control = command, spec_path, proc, control
        try:
            yield workers
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait()
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            control.close()
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            spec_path.unlink(missing_ok=True)

    def _finish(self, worker: WorkerProcess, outcome: str | int) -> MeasuredRun:
        run = worker.run
        finished, duration = utc_now(), round(time.monotonic() - worker.t0, 3)
        result = self._worker_result(worker.result_path, outcome, worker.log_path)
        window = result.pop("measured_window_monotonic", None)
        traced_steps = len(result.get("traced_step_wall_ns") or []) or run.traced_steps
        kernels = self._kernels(run.run_id, worker.trace_path, traced_steps) if result["status"] == "ok" else {}
        if "failure" in kernels:
            result.update(status="failed", reason=kernels.pop("failure"))
        record = measured_run(
            run_id=run.run_id,
            mode=run.mode,
            backend=run.backend,
            steps=run.steps,
            warmup=run.warmup,
            measures=run.measures,
            tracer=self.tracer_of(run).name,
            device=self.device.as_record(),
            command=shlex.join(worker.command),
            log=str(worker.log_path.relative_to(self.store.dir)),
            started_at=worker.started,
            finished_at=finished,
            duration_s=duration,
            worker_env=self.timing_env(),
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

    def _kernels(
        self, run_id: str, trace_path: Path | None, steps: int, settling: int = SETTLING_STEPS
    ) -> dict[str, Any]:
        """The record's kernel fields from the trace; ``{"failure": reason}`` when it is unusable.

        Where the tracer marks steps (nsys's NVTX ranges, TensorFlow's step events), only
        the kernels inside the ``steps`` measured steps count, so the settling step after the
        capture started is left out; nvprof marks none, and its table keeps the ``settling``
        step (``kernel_table_steps`` says so, and per-step figures divide by it). A program's
        window (``profiler.program_run``) has no settling step.
        """
        if trace_path is None:
            return {}
        from detprof.traces.parsers import load_trace

        found: dict[str, Any] = {"trace_file": str(trace_path.relative_to(self.store.dir))}
        try:
            table = load_trace(trace_path)
        except DetprofError as exc:
            return found | {"failure": f"trace unusable: {exc}"}
        measured = within_steps(table)
        table_steps = steps if measured is not None else steps + settling
        table = measured if measured is not None else table
        if table.kernel_count == 0:
            return found | {"failure": "the measured window holds no kernels"}
        graphs = cuda_graph_use(table)
        if graphs.hidden:
            return found | {"failure": graphs.hidden}
        frame = table.summary if table.is_summary else table.kernels
        return found | {
            "kernel_table": self.store.write_table(run_id, frame),
            "kernel_table_kind": "summary" if table.is_summary else "launches",
            "kernel_table_format": table.format,
            "kernel_table_steps": table_steps,
            "kernel_count": table.kernel_count,
            "kernel_ns_per_step": table.total_ns / table_steps,
            "step_kernel_ns": kernel_ns_by_step(table),
            **graphs.record(),
        }


PairedRun = tuple[WorkerRun, Workload, Mapping[str, Any]]


@dataclass
class WorkerProcess:
    """One run of a worker process: what it runs, where its outputs go, and, once started, its process."""

    run: WorkerRun
    fields: dict[str, Any]
    spec: dict[str, Any]
    spec_path: Path
    result_path: Path
    log_path: Path
    trace_base: Path
    trace_path: Path | None
    command: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    control: IO[str] | None = None
    """The worker's answers in a lockstep session (see ``_step_in_lockstep``); None otherwise."""
    sampler: TelemetrySampler | NoTelemetry | None = None
    started: str = ""
    t0: float = 0.0

    def start(self) -> None:
        self.started, self.t0 = utc_now(), time.monotonic()

    def make_room(self) -> None:
        """The folders the run writes to, and no result left from an earlier attempt."""
        for folder in (self.spec_path.parent, self.trace_base.parent, self.log_path.parent):
            folder.mkdir(parents=True, exist_ok=True)
        self.result_path.unlink(missing_ok=True)

    def outcome(self) -> str | int:
        """0 when the run's result is written, else the process's exit code (it died)."""
        if self.result_path.is_file():
            return 0
        assert self.proc is not None
        return self.proc.wait()


def _step_in_lockstep(workers: list[WorkerProcess], wall_steps: int, traced_steps: int) -> None:
    """Wait until each is warm, then one step each in turn, always in the same order (A, B, A, B, ...).

    The same order keeps the pair symmetric: each step follows a step of the other worker on
    the same core. Alternating who goes first (A, B, B, A, ...) lets a worker step twice in a
    row, on caches it had just warmed: in A/A pairs (smallcnn, mediumcnn_k1) a step that
    followed the worker's own step was 4-6% faster than one that followed the other's, and
    the order of the steps then decides the ratio.

    First ``wall_steps`` untraced steps, then each worker in turn starts its tracer (and
    its settling step) while the other waits, then ``traced_steps`` traced steps: starting a
    profiler beside the other worker's step would disturb that step.

    Each worker answers on its control pipe, per run: "ready" once warm (or "failed"), one
    line per "step" (its wall time, or "failed"), "traced" once its tracer runs, and "done"
    once the run's result is written. A worker whose run fails (a refusal to run
    deterministically, out of memory) drops out and the other goes on alone: its run is no
    longer paired, but its kernels are still what the report shows of that mode.
    """
    alive = [w for w in workers if _answer(w) == "ready"]
    alive = _in_turn(alive, "step", wall_steps, str.isdigit)
    if traced_steps:
        alive = _in_turn(alive, "trace", 1, lambda answer: answer == "traced")
        alive = _in_turn(alive, "step", traced_steps, str.isdigit)
    for worker in workers:
        while _answer(worker) not in ("done", ""):
            pass


def _in_turn(
    alive: list[WorkerProcess], command: str, times: int, accepted: Callable[[str], bool]
) -> list[WorkerProcess]:
    """``command`` to each worker in turn, ``times`` rounds; the workers whose answers were all accepted."""
    alive = list(alive)
    for _round in range(times):
        for worker in list(alive):
            assert worker.proc is not None and worker.proc.stdin is not None
            try:
                worker.proc.stdin.write(f"{command}\n".encode())
                worker.proc.stdin.flush()
            except OSError:
                alive.remove(worker)
                continue
            if not accepted(_answer(worker)):
                alive.remove(worker)
        if not alive:
            break
    return alive


def _answer(worker: WorkerProcess) -> str:
    """The worker's next line on its control pipe; "" once it has gone."""
    assert worker.control is not None
    try:
        return worker.control.readline().strip()
    except (OSError, ValueError):
        return ""


def _watchdog(
    timeout_s: float | None, procs: Sequence[subprocess.Popen[bytes] | None]
) -> tuple[threading.Timer | None, threading.Event]:
    """A timer (None without a timeout) that kills ``procs`` when it fires, and the event it sets."""
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        for proc in procs:
            if proc is not None:
                _kill_group(proc)

    return (None if timeout_s is None else threading.Timer(timeout_s, expire)), expired


def wait_for_exit(proc: subprocess.Popen[bytes], timeout: float | None) -> str | int:
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
