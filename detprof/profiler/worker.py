"""The worker process: ``python -m detprof.profiler.worker SPEC [RESULT]``, JSON in, JSON out.

A measured run gets a process of its own mode because determinism cannot be switched
off inside a process and cuDNN's autotune cache must not carry from one mode into the
other: a fresh process per run, or, in a lockstep session (a spec with ``runs``), one
process per mode that measures the runs of one repeat in turn, each written to its own
result path. The spec (``WorkerSpec``) names the workload's entry point (``module:function``,
chosen by the package that owns it: a model training on synthetic data, one kernels_bench
op case on random inputs). The worker excludes the warm-up steps where autotuning happens,
times untraced steps for wall time and traces others for kernel time (``run``). It always
writes a result, also when the workload fails: a failure is a finding, not a crash, and an op
that refuses to run deterministically is recorded as one (``findings.Finding``: the op, the
layer that called it, what to do), so the report can say which of the model's layers to change.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from detprof import backends
from detprof.determinism import apply, software_versions
from detprof.errors import ExitCode, UsageError, first_line
from detprof.findings import finding_of, refuses_determinism
from detprof.profiler.lifeline import end_with_driver, inherited_lifeline
from detprof.profiler.lockstep import Message, Pacer
from detprof.profiler.tracers import TRACERS, Capture
from detprof.profiler.worker_spec import WorkerSpec
from detprof.store import atomic_write_json

_REASON_CHARS = 500


def classify_failure(exc: BaseException, deterministic: bool) -> tuple[str, str]:
    """``("unsupported", reason)`` only for the framework refusing to run an op deterministically.

    "unsupported" is reported as "not supported under determinism", so it must not cover an
    op that fails in both modes (a depth-wise MaxPoolGrad raises UnimplementedError either
    way) nor any other crash of a deterministic run. TensorFlow's, XLA's and PyTorch's
    refusals all say so in words ("... does not have a deterministic implementation",
    "Determinism is not yet supported for ..."): ``findings.refuses_determinism`` is the one
    rule, which ``detprof verify`` applies too; everything else is "failed".
    """
    reason = first_line(exc, with_type=True)[:_REASON_CHARS]
    if deterministic and refuses_determinism(exc):
        return "unsupported", reason
    return "failed", reason


def pin_threads(cpus: set[int]) -> None:
    """Move every thread of this process to ``cpus``."""
    for thread_id in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(thread_id), cpus)


def entry_point(entry: str) -> Callable[..., Any]:
    """The function ``module:function`` names."""
    module, _, attr = entry.partition(":")
    return getattr(importlib.import_module(module), attr)


def _timed_steps(step: Callable[[], None], count: int, pacer: Pacer, capture: Capture | None) -> list[int]:
    """``count`` steps, each timed and, under a tracer's ``capture``, marked as step ``i`` in the trace."""
    wall_ns: list[int] = []
    for i in range(count):
        if not pacer.wait_for(Message.STEP):
            break
        with capture.step(i) if capture is not None else contextlib.nullcontext():
            t0 = time.perf_counter_ns()
            step()
            wall_ns.append(time.perf_counter_ns() - t0)
        pacer.answer(str(wall_ns[-1]))
    return wall_ns


def run(spec: WorkerSpec, pacer: Pacer | None = None) -> dict[str, Any]:
    """One measured run; ``pacer`` paces its steps (a lockstep session), else they run at once.

    Two phases after the warm-up: ``wall_steps`` untraced steps, whose wall times are the
    run's wall time, then, with the tracer on, the settling steps and ``traced_steps`` steps,
    whose kernels are the run's kernel time. The settling step takes what starting a
    capture costs (nsys beginning to record, NVTX loading, the profiler's first events); it
    is timed by no one and lies outside every ``step i`` range, so the kernel table leaves
    it out wherever the tracer marks steps. Wall time is never taken under a tracer: a
    tracer taxes every launch, and deterministic kernels are often more launches.
    """
    settings = spec.determinism
    backend = backends.get(settings.backend)
    result: dict[str, Any] = {"settings": apply(settings), "versions": software_versions(settings.backend)}
    if spec.cpu_threads and backend.limit_threads(spec.cpu_threads):
        result["cpu_threads"] = spec.cpu_threads
    capture = TRACERS[spec.tracer].capture(spec.trace_path, settings.backend)
    pacer = pacer or Pacer(None)
    try:
        step, facts = entry_point(spec.workload)(spec)
        result.update(facts)
        for _ in range(spec.warmup):
            step()
        window_start = time.monotonic()
        if spec.cpu_core is not None:
            pin_threads({spec.cpu_core})
            result["cpu_core"] = spec.cpu_core
        pacer.answer(Message.READY)
        wall_ns = _timed_steps(step, spec.wall_steps, pacer, None)
        traced_ns: list[int] = []
        if spec.traced_steps and pacer.wait_for(Message.TRACE):
            capture.start()
            try:
                for _ in range(spec.settling_steps):
                    step()
                pacer.answer(Message.TRACED)
                traced_ns = _timed_steps(step, spec.traced_steps, pacer, capture)
            finally:
                capture.stop()
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
        if backends.out_of_memory(exc):
            status, reason = "failed", f"out of memory: {reason}"
        if status == "unsupported":
            finding = finding_of(exc, settings.backend)
            result["finding"] = finding.to_json()
            reason = finding.message
        result.update(status=status, reason=reason)
    return result


def session(runs: list[WorkerSpec]) -> int:
    """Several runs of one mode in this process, one after the other, each paced by the coordinator.

    Each run logs to its own file and starts on every core this process may use (its warm-up
    runs beside the other worker's) before ``run`` pins it for the measured steps; Keras's
    session is cleared in between, so layer names (and the kernel names built from them) are
    the same as in a process of their own.
    """
    pacer = Pacer(runs[0].control_fd)
    cpus = os.sched_getaffinity(0)
    for spec in runs:
        _log_to(Path(spec.log_path))
        pin_threads(cpus)
        keras = sys.modules.get("keras")
        if keras is not None:  # Keras is first imported by the first run, once its backend is chosen
            keras.backend.clear_session()
        pacer.begin()
        atomic_write_json(Path(spec.result_path), run(spec, pacer))
        pacer.written()
    return ExitCode.OK


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
        return ExitCode.USAGE
    atomic_write_json(result_path, {"answer": answer})
    return ExitCode.OK


def main(argv: list[str]) -> int:
    lifeline = inherited_lifeline(os.environ)
    if lifeline is not None:
        end_with_driver(lifeline)
    spec = json.loads(Path(argv[0]).read_text())
    if "runs" in spec:
        return session([WorkerSpec.from_json(run_spec) for run_spec in spec["runs"]])
    result_path = Path(argv[1])
    if "call" in spec:
        return call(spec, result_path)
    atomic_write_json(result_path, run(WorkerSpec.from_json(spec)))
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
