"""The worker process: ``python -m detprof.profiler.worker SPEC [RESULT]``, JSON in, JSON out.

A measured run gets a process of its own mode because determinism cannot be switched
off inside a process and cuDNN's autotune cache must not carry from one mode into the
other: a fresh process per run, or, in a lockstep session (a spec with ``runs``), one
process per mode that measures the runs of one repeat in turn, each written to its own
result path. The spec names the workload's entry point (``module:function``,
chosen by the package that owns it: a model training on synthetic data, one kernels_bench
op case on random inputs). The worker excludes the warm-up steps where autotuning happens,
times untraced steps for wall time and traces others for kernel time (``run``). It always
writes a result, also when the workload fails: a failure is a finding, not a crash.

A spec with ``call`` instead runs one function that needs a framework but measures nothing
(``launcher.call_in_worker``), and writes its answer, or the one-line usage error it raised.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from detprof.determinism import DeterminismSettings, apply, software_versions
from detprof.errors import USAGE_EXIT, UsageError, first_line
from detprof.profiler.lifeline import end_with_driver, inherited_lifeline
from detprof.store import atomic_write_json
from detprof.traces.step_split import step_range_name

_REASON_CHARS = 500


def classify_failure(exc: BaseException, deterministic: bool) -> tuple[str, str]:
    """``("unsupported", reason)`` only for the framework refusing to run an op deterministically.

    "unsupported" is reported as "not supported under determinism", so it must not cover an
    op that fails in both modes (a depth-wise MaxPoolGrad raises UnimplementedError either
    way) nor any other crash of a deterministic run. TensorFlow's, XLA's and PyTorch's
    refusals all say so in words ("... does not have a deterministic implementation",
    "Determinism is not yet supported for ..."); everything else is "failed".
    """
    reason = first_line(exc, with_type=True)[:_REASON_CHARS]
    if deterministic and "determinis" in str(exc).lower():
        return "unsupported", reason
    return "failed", reason


class StepTracer:
    """The in-process half of a tracer: what to switch on and off around the measured steps.

    Each framework's profiler marks step ``i`` with its own annotation named ``step i``
    (``step_range_name``), which its trace keeps beside the ops, so that the parsers split
    kernel time into steps the same way for every backend; under nsys an NVTX range does.
    """

    def __init__(self, in_process: str, trace_path: str | None, nvtx_steps: bool) -> None:
        self.in_process = in_process
        self.trace_path = trace_path
        self.nvtx_steps = nvtx_steps
        self._cuda = None
        self._torch: Any = None

    def start(self) -> None:
        if self.in_process == "tf-profiler":
            import tensorflow as tf

            tf.profiler.experimental.start(self.trace_path)
        elif self.in_process == "jax-profiler":
            import jax

            options = jax.profiler.ProfileOptions()
            options.python_tracer_level = 0  # every Python call traced would tax the traced steps for nothing
            jax.profiler.start_trace(self.trace_path, profiler_options=options)
        elif self.in_process == "torch-profiler":
            import torch

            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._torch = torch.profiler.profile(activities=activities)
            self._torch.start()
        elif self.in_process == "cuda-profiler-api":
            from detprof.profiler.cuda_profiler_api import CudaProfilerRange

            self._cuda = CudaProfilerRange()
            self._cuda.start()

    def stop(self) -> None:
        if self.in_process == "tf-profiler":
            import tensorflow as tf

            tf.profiler.experimental.stop()
        elif self.in_process == "jax-profiler":
            import jax

            jax.profiler.stop_trace()
        elif self._torch is not None:
            self._torch.stop()
            self._torch.export_chrome_trace(self.trace_path)
        elif self._cuda is not None:
            self._cuda.stop()

    @contextlib.contextmanager
    def step(self, index: int) -> Iterator[None]:
        """Mark step ``index`` in the trace (NVTX range under nsys, the framework's annotation under its profiler)."""
        name = step_range_name(index)
        if self.nvtx_steps:
            import nvtx

            with nvtx.annotate(name, domain="detprof"):
                yield
        elif self.in_process == "tf-profiler":
            import tensorflow as tf

            with tf.profiler.experimental.Trace(name):
                yield
        elif self.in_process == "jax-profiler":
            import jax

            with jax.profiler.TraceAnnotation(name):
                yield
        elif self.in_process == "torch-profiler":
            import torch

            with torch.profiler.record_function(name):
                yield
        else:
            yield


class _Pacer:
    """When each measured step may run: at once, or when the coordinator of a lockstep session says so.

    In a lockstep pair the coordinator steps the deterministic and the default worker in turn
    (A, B, A, B, ...), so that every pair of steps shares the machine's state. Per run the
    worker says "ready" once warmed up (or "failed"), then runs one step per "step" line on
    its stdin and answers with the step's wall time (or "failed"); a "trace" line starts
    its tracer and its settling step, answered by "traced"; it says "done" once the run's
    result is written (``launcher._step_in_lockstep``).
    """

    def __init__(self, control_fd: int | None) -> None:
        self._control = None if control_fd is None else os.fdopen(control_fd, "w", buffering=1)
        self._owed = True

    def _say(self, line: str) -> None:
        if self._control is not None:
            self._control.write(f"{line}\n")
        self._owed = False

    def begin(self) -> None:
        self._owed = True

    def wait_for(self, command: str) -> bool:
        """True when the coordinator says ``command`` next; False when it has gone (its pipe closed)."""
        if self._control is None:
            return True
        self._owed = True
        return sys.stdin.readline().strip() == command

    def answer(self, line: str) -> None:
        """ "ready", "traced", or a step's wall time in nanoseconds."""
        self._say(line)

    def failed(self) -> None:
        """The run failed: answer what the coordinator is waiting for (the start, a step, the tracer)."""
        if self._owed:
            self._say("failed")

    def written(self) -> None:
        self._say("done")


def pin_threads(cpus: set[int]) -> None:
    """Move every thread of this process to ``cpus``."""
    for thread_id in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(thread_id), cpus)


def entry_point(entry: str) -> Callable[..., Any]:
    """The function ``module:function`` names."""
    module, _, attr = entry.partition(":")
    return getattr(importlib.import_module(module), attr)


def _timed_steps(step: Callable[[], None], count: int, pacer: _Pacer, tracer: StepTracer | None) -> list[int]:
    """``count`` steps, each timed and, under ``tracer``, marked as step ``i`` in the trace."""
    wall_ns: list[int] = []
    for i in range(count):
        if not pacer.wait_for("step"):
            break
        with tracer.step(i) if tracer is not None else contextlib.nullcontext():
            t0 = time.perf_counter_ns()
            step()
            wall_ns.append(time.perf_counter_ns() - t0)
        pacer.answer(str(wall_ns[-1]))
    return wall_ns


def run(spec: dict[str, Any], pacer: _Pacer | None = None) -> dict[str, Any]:
    """One measured run; ``pacer`` paces its steps (a lockstep session), else they run at once.

    Two phases after the warm-up: ``wall_steps`` untraced steps, whose wall times are the
    run's wall time, then, with the tracer on, a settling step (``settling_steps``) and ``traced_steps`` steps,
    whose kernels are the run's kernel time. The settling step takes what starting a
    capture costs (nsys beginning to record, NVTX loading, the profiler's first events); it
    is timed by no one and lies outside every ``step i`` range, so the kernel table leaves
    it out wherever the tracer marks steps. Wall time is never taken under a tracer: a
    tracer taxes every launch, and deterministic kernels are often more launches.
    """
    settings = settings_of(spec)
    result: dict[str, Any] = {"settings": apply(settings), "versions": software_versions(settings.backend)}
    if spec.get("cpu_threads") and _limit_threads(settings.backend, int(spec["cpu_threads"])):
        result["cpu_threads"] = int(spec["cpu_threads"])
    tracer = StepTracer(spec["in_process"], spec.get("trace_path"), bool(spec.get("nvtx_steps")))
    pacer = pacer or _Pacer(None)
    try:
        step, facts = entry_point(spec["workload"])(spec)
        result.update(facts)
        for _ in range(spec["warmup"]):
            step()
        window_start = time.monotonic()
        if spec.get("cpu_core") is not None:
            pin_threads({int(spec["cpu_core"])})
            result["cpu_core"] = int(spec["cpu_core"])
        pacer.answer("ready")
        wall_ns = _timed_steps(step, spec["wall_steps"], pacer, None)
        traced_ns: list[int] = []
        if spec["traced_steps"] and pacer.wait_for("trace"):
            tracer.start()
            try:
                for _ in range(spec["settling_steps"]):
                    step()
                pacer.answer("traced")
                traced_ns = _timed_steps(step, spec["traced_steps"], pacer, tracer)
            finally:
                tracer.stop()
        result.update(
            status="ok",
            reason=None,
            step_wall_ns=wall_ns or None,
            traced_step_wall_ns=traced_ns or None,
            measured_window_monotonic=[window_start, time.monotonic()],
        )
    except Exception as exc:
        pacer.failed()
        traceback.print_exc()
        status, reason = classify_failure(exc, settings.deterministic)
        if out_of_memory(exc):
            status, reason = "failed", f"out of memory: {reason}"
        result.update(status=status, reason=reason)
    return result


def settings_of(spec: dict[str, Any]) -> DeterminismSettings:
    """The determinism settings a run's spec asks for (specs written before the backend choice: TensorFlow)."""
    return DeterminismSettings(
        spec["mode"], int(spec["seed"]), bool(spec["xla"]), spec.get("backend", "tensorflow"), bool(spec.get("compile"))
    )


def _limit_threads(backend: str, threads: int) -> bool:
    """Give the framework ``threads`` compute threads (a lockstep pair's one core each); False where it cannot.

    XLA:CPU sizes its thread pool when JAX starts and offers no switch afterwards, so a JAX
    worker keeps its pool; pinned to one core, its threads take turns on it.
    """
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        return True
    if backend == "torch":
        import torch

        torch.set_num_threads(threads)
        if torch.get_num_interop_threads() != 1:  # settable once per process; a session's later runs keep it
            torch.set_num_interop_threads(1)
        return True
    return False


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the device (or host) running out of memory, in whichever framework raised it.

    Each framework's error type exists only once it is loaded, so none is imported here.
    """
    if isinstance(exc, MemoryError):
        return True
    tf, jax, torch = (sys.modules.get(name) for name in ("tensorflow", "jax", "torch"))
    if tf is not None and isinstance(exc, tf.errors.ResourceExhaustedError):
        return True
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    return jax is not None and isinstance(exc, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(exc)


def session(runs: list[dict[str, Any]]) -> int:
    """Several runs of one mode in this process, one after the other, each paced by the coordinator.

    Each run logs to its own file and starts on every core this process may use (its warm-up
    runs beside the other worker's) before ``run`` pins it for the measured steps; Keras's
    session is cleared in between, so layer names (and the kernel names built from them) are
    the same as in a process of their own.
    """
    pacer = _Pacer(runs[0]["control_fd"])
    cpus = os.sched_getaffinity(0)
    for spec in runs:
        _log_to(Path(spec["log_path"]))
        pin_threads(cpus)
        keras = sys.modules.get("keras")
        if keras is not None:  # Keras is first imported by the first run, once its backend is chosen
            keras.backend.clear_session()
        pacer.begin()
        atomic_write_json(Path(spec["result_path"]), run(spec, pacer))
        pacer.written()
    return 0


def _log_to(path: Path) -> None:
    """Send this process's stdout and stderr (TensorFlow's C++ logs included) to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)


def call(spec: dict[str, Any], result_path: Path) -> int:
    try:
        answer = entry_point(spec["call"])(**spec["request"])
    except UsageError as exc:
        atomic_write_json(result_path, {"error": str(exc)})
        return USAGE_EXIT
    atomic_write_json(result_path, {"answer": answer})
    return 0


def main(argv: list[str]) -> int:
    lifeline = inherited_lifeline(os.environ)
    if lifeline is not None:
        end_with_driver(lifeline)
    spec = json.loads(Path(argv[0]).read_text())
    if "runs" in spec:
        return session(spec["runs"])
    result_path = Path(argv[1])
    if "call" in spec:
        return call(spec, result_path)
    atomic_write_json(result_path, run(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
