"""The worker process: ``python -m detprof.profiler.worker SPEC RESULT``, JSON in, JSON out.

A measured run gets a fresh process per (workload, mode, repeat) because determinism
cannot be switched off inside a process and cuDNN's autotune cache must not carry from
one mode into the other. The spec names the workload's entry point (``module:function``,
chosen by the package that owns it: a model training on synthetic data, one kernels_bench
op case on random inputs). The worker excludes the warm-up steps where autotuning happens
and traces only the measured steps. It always writes a result, also when the workload
fails: a failure is a finding, not a crash.

A spec with ``call`` instead runs one function that needs TensorFlow but measures nothing
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
from detprof.store import atomic_write_json
from detprof.traces.step_split import step_range_name

_REASON_CHARS = 500


def classify_failure(exc: BaseException, deterministic: bool) -> tuple[str, str]:
    """``("unsupported", reason)`` only for TensorFlow refusing to run an op deterministically.

    "unsupported" is reported as "not supported under determinism", so it must not cover an
    op that fails in both modes (a depth-wise MaxPoolGrad raises UnimplementedError either
    way) nor any other crash of a deterministic run. TensorFlow's and XLA's refusals all
    say so in words ("... does not have a deterministic implementation", "Determinism is
    not yet supported for ..."); everything else is "failed".
    """
    reason = first_line(exc, with_type=True)[:_REASON_CHARS]
    if deterministic and "determinis" in str(exc).lower():
        return "unsupported", reason
    return "failed", reason


class _StepTracer:
    """The in-process half of a tracer: what to switch on and off around the measured steps."""

    def __init__(self, in_process: str, trace_path: str | None, nvtx_steps: bool) -> None:
        self.in_process = in_process
        self.trace_path = trace_path
        self.nvtx_steps = nvtx_steps
        self._cuda = None

    def start(self) -> None:
        if self.in_process == "tf-profiler":
            import tensorflow as tf

            tf.profiler.experimental.start(self.trace_path)
        elif self.in_process == "cuda-profiler-api":
            from detprof.profiler.cuda_profiler_api import CudaProfilerRange

            self._cuda = CudaProfilerRange()
            self._cuda.start()

    def stop(self) -> None:
        if self.in_process == "tf-profiler":
            import tensorflow as tf

            tf.profiler.experimental.stop()
        elif self._cuda is not None:
            self._cuda.stop()

    @contextlib.contextmanager
    def step(self, index: int) -> Iterator[None]:
        """Mark step ``index`` in the trace (NVTX range under nsys, a TraceMe under TF's profiler)."""
        if self.nvtx_steps:
            import nvtx

            with nvtx.annotate(step_range_name(index), domain="detprof"):
                yield
        elif self.in_process == "tf-profiler":
            import tensorflow as tf

            with tf.profiler.experimental.Trace(step_range_name(index)):
                yield
        else:
            yield


class _Pacer:
    """When each measured step may run: at once, or when the coordinator of a lockstep pair says so.

    In a lockstep pair the coordinator steps the deterministic and the default worker in turn
    (A, B, A, B, ...), so that every pair of steps shares the machine's state. The worker says
    "ready" once warmed up and traced, then runs one step per "step" line on its stdin and
    answers on the control pipe.
    """

    def __init__(self, control_fd: int | None) -> None:
        self._control = None if control_fd is None else os.fdopen(control_fd, "w", buffering=1)

    def ready(self) -> None:
        if self._control is not None:
            self._control.write("ready\n")

    def wait_turn(self) -> bool:
        """True when the next step should run; False when the coordinator has gone (its pipe closed)."""
        return self._control is None or sys.stdin.readline().strip() == "step"

    def done(self, wall_ns: int) -> None:
        if self._control is not None:
            self._control.write(f"{wall_ns}\n")


def pin_to_core(core: int) -> int:
    """Move every thread of this process to ``core`` (start-up and warm-up ran wherever they liked)."""
    for thread_id in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(thread_id), {core})
    return core


def entry_point(entry: str) -> Callable[..., Any]:
    """The function ``module:function`` names."""
    module, _, attr = entry.partition(":")
    return getattr(importlib.import_module(module), attr)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    settings = DeterminismSettings(spec["mode"], int(spec["seed"]), bool(spec["xla"]))
    result: dict[str, Any] = {"settings": apply(settings), "versions": software_versions()}
    import tensorflow as tf

    if spec.get("cpu_threads"):
        tf.config.threading.set_intra_op_parallelism_threads(int(spec["cpu_threads"]))
        tf.config.threading.set_inter_op_parallelism_threads(1)
        result["cpu_threads"] = int(spec["cpu_threads"])
    tracer = _StepTracer(spec["in_process"], spec.get("trace_path"), bool(spec.get("nvtx_steps")))
    pacer = _Pacer(spec.get("control_fd"))
    try:
        step, facts = entry_point(spec["workload"])(spec)
        result.update(facts)
        for _ in range(spec["warmup"]):
            step()
        step_wall_ns: list[int] = []
        window_start = time.monotonic()
        if spec.get("cpu_core") is not None:
            result["cpu_core"] = pin_to_core(int(spec["cpu_core"]))
        tracer.start()
        pacer.ready()
        try:
            for i in range(spec["steps"]):
                if not pacer.wait_turn():
                    break
                with tracer.step(i):
                    t0 = time.perf_counter_ns()
                    step()
                    step_wall_ns.append(time.perf_counter_ns() - t0)
                pacer.done(step_wall_ns[-1])
        finally:
            tracer.stop()
        result.update(
            status="ok",
            reason=None,
            step_wall_ns=step_wall_ns,
            measured_window_monotonic=[window_start, time.monotonic()],
        )
    except (tf.errors.ResourceExhaustedError, MemoryError) as exc:
        result.update(status="failed", reason=f"out of memory: {first_line(exc, with_type=True)[:_REASON_CHARS]}")
    except Exception as exc:
        traceback.print_exc()
        status, reason = classify_failure(exc, settings.deterministic)
        result.update(status=status, reason=reason)
    return result


def call(spec: dict[str, Any], result_path: Path) -> int:
    try:
        answer = entry_point(spec["call"])(**spec["request"])
    except UsageError as exc:
        atomic_write_json(result_path, {"error": str(exc)})
        return USAGE_EXIT
    atomic_write_json(result_path, {"answer": answer})
    return 0


def main(argv: list[str]) -> int:
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    spec = json.loads(spec_path.read_text())
    if "call" in spec:
        return call(spec, result_path)
    atomic_write_json(result_path, run(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
