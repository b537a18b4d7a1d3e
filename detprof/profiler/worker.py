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
(``worker_call.call_in_worker``), and writes its answer, or the one-line usage error it raised.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from detprof import backends
from detprof.backends.base import ArmStep
from detprof.determinism import DeterminismSettings, apply, apply_shared, arm_settings, software_versions
from detprof.errors import ExitCode, UsageError, first_line
from detprof.findings import finding_of, refuses_determinism
from detprof.profiler.lifeline import end_with_driver, inherited_lifeline
from detprof.profiler.lockstep import Message, Pacer
from detprof.profiler.tracers import TRACERS, Capture
from detprof.profiler.worker_spec import WorkerSpec, sized_steps, typical_step_ns
from detprof.profiler.workloads import switched_arms
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
    """``count`` steps (paced: as many as the coordinator asks for), each timed and, under a tracer's ``capture``,
    marked as step ``i`` in the trace."""
    wall_ns: list[int] = []
    for i in itertools.count() if pacer.paced and count else range(count):
        if not pacer.wait_for(Message.STEP):
            break
        with capture.step(i) if capture is not None else contextlib.nullcontext():
            t0 = time.perf_counter_ns()
            step()
            wall_ns.append(time.perf_counter_ns() - t0)
        pacer.answer(str(wall_ns[-1]))
    return wall_ns


def _warm_up(steps: Sequence[Callable[[], None]], count: int) -> list[int]:
    """``count`` rounds of ``steps`` in turn, untimed as a measurement; each round's wall time, for sizing."""
    rounds = []
    for _ in range(count):
        t0 = time.perf_counter_ns()
        for step in steps:
            step()
        rounds.append((time.perf_counter_ns() - t0) // len(steps))
    return rounds


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
    result.update(backend.compile_in_this_process())
    pacer = pacer or Pacer(None)
    try:
        step, facts = entry_point(spec.workload)(spec)
        result.update(facts)
        step_ns = typical_step_ns(_warm_up([step], spec.warmup))
        window_start = time.monotonic()
        if spec.cpu_core is not None:
            pin_threads({spec.cpu_core})
            result["cpu_core"] = spec.cpu_core
        pacer.answer(f"{Message.READY} {step_ns}")
        steps = sized_steps(spec.most_steps, spec.run_seconds, step_ns)
        wall_ns = _timed_steps(step, min(spec.wall_steps, steps), pacer, None)
        traced_ns: list[int] = []
        if spec.traced_steps and pacer.wait_for(Message.TRACE):
            capture.start()
            try:
                for _ in range(spec.settling_steps):
                    step()
                pacer.answer(Message.TRACED)
                traced_ns = _timed_steps(step, min(spec.traced_steps, steps), pacer, capture)
            finally:
                capture.stop()
        result.update(_measured(wall_ns, traced_ns, window_start))
    except Exception as exc:
        pacer.failed()
        traceback.print_exc()
        result.update(_failure(exc, settings))
    return result


def _measured(wall_ns: list[int], traced_ns: list[int], window_start: float) -> dict[str, Any]:
    """A run's result once its steps ran: their times, and how many a phase took."""
    return {
        "status": "ok",
        "reason": None,
        "steps": max(len(wall_ns), len(traced_ns)),
        "step_wall_ns": wall_ns or None,
        "traced_step_wall_ns": traced_ns or None,
        "measured_window_monotonic": [window_start, time.monotonic()],
    }


def _failure(exc: Exception, settings: DeterminismSettings) -> dict[str, Any]:
    """A run's result when its workload raised: failed, or unsupported with the op that refused (a finding)."""
    status, reason = classify_failure(exc, settings.deterministic)
    if backends.out_of_memory(exc):
        status, reason = "failed", f"out of memory: {reason}"
    found: dict[str, Any] = {}
    if status == "unsupported":
        finding = finding_of(exc, settings.backend)
        found["finding"] = finding.to_json()
        reason = finding.message
    return found | {"status": status, "reason": reason}


def run_arms(specs: Sequence[WorkerSpec], pacer: Pacer) -> list[dict[str, Any]]:
    """The arms of one pair in this process, a step of each in turn (A, B, A, B, ...): their results, in order.

    As ``run``, after a warm-up of both, untraced steps for wall time and then traced ones for
    kernel time, each arm's marked ``step i ARM`` in the one trace, so that every pair of steps
    saw the same moment of the process and the machine, and no start-up or offset between two
    processes lies between the arms. An arm whose step raises drops out with its failure (an op
    that refuses determinism is a finding) and the other goes on alone.
    """
    first = specs[0]
    backend = backends.get(first.determinism.backend)
    common: dict[str, Any] = {"versions": software_versions(backend.name)}
    if first.cpu_threads and backend.limit_threads(first.cpu_threads):
        common["cpu_threads"] = first.cpu_threads
    capture = TRACERS[first.tracer].capture(first.trace_path, backend.name)
    common.update(backend.compile_in_this_process())
    try:
        arms, facts = _arms_of(specs)
    except Exception as exc:
        pacer.failed()
        traceback.print_exc()
        return [common | {"settings": None} | _failure(exc, spec.determinism) for spec in specs]
    results = [
        common | facts | {"settings": arm_settings(spec.determinism, effect)}
        for spec, (_, effect) in zip(specs, arms, strict=True)
    ]
    steps = _Turns([step for step, _ in arms], [spec.arm for spec in specs])
    steps.warm_up(first.warmup)
    window_start = time.monotonic()
    if first.cpu_core is not None:
        pin_threads({first.cpu_core})
        common["cpu_core"] = first.cpu_core
    count = sized_steps(first.most_steps, first.run_seconds, steps.step_ns)
    wall_ns = steps.timed(min(first.wall_steps, count))
    traced_ns: list[list[int]] = [[] for _ in specs]
    if first.traced_steps and steps.alive:
        capture.start()
        try:
            steps.untimed(first.settling_steps)
            traced_ns = steps.timed(min(first.traced_steps, count), capture)
        finally:
            capture.stop()
    for k, result in enumerate(results):
        failed = steps.failures.get(k)
        result.update(common)
        measured = _measured(wall_ns[k], traced_ns[k], window_start)
        result.update(measured if failed is None else _failure(failed, specs[k].determinism))
    return results


class _Turns:
    """Steps of several arms taken in turn, one round at a time; an arm whose step raises leaves the rotation."""

    def __init__(self, steps: list[Callable[[], None]], arms: list[str | None]) -> None:
        self.steps = steps
        self.arms = arms
        self.alive = list(range(len(steps)))
        self.failures: dict[int, Exception] = {}
        self.step_ns = 0

    def _one(self, k: int, timed: list[int] | None, mark: contextlib.AbstractContextManager[None]) -> None:
        try:
            with mark:
                t0 = time.perf_counter_ns()
                self.steps[k]()
                elapsed = time.perf_counter_ns() - t0
        except Exception as exc:
            traceback.print_exc()
            self.failures[k] = exc
            self.alive.remove(k)
            return
        if timed is not None:
            timed.append(elapsed)

    def warm_up(self, rounds: int) -> None:
        """``rounds`` untimed rounds; the step time of their later half, for sizing."""
        times: list[int] = []
        for _ in range(rounds):
            round_ns: list[int] = []
            for k in list(self.alive):
                self._one(k, round_ns, contextlib.nullcontext())
            if round_ns:
                times.append(sum(round_ns) // len(round_ns))
        self.step_ns = typical_step_ns(times)

    def untimed(self, rounds: int) -> None:
        for _ in range(rounds):
            for k in list(self.alive):
                self._one(k, None, contextlib.nullcontext())

    def timed(self, rounds: int, capture: Capture | None = None) -> list[list[int]]:
        """``rounds`` timed rounds, each arm's step ``i`` marked ``step i ARM`` under ``capture``."""
        times: list[list[int]] = [[] for _ in self.steps]
        for i in range(rounds):
            for k in list(self.alive):
                mark = capture.step(i, self.arms[k]) if capture is not None else contextlib.nullcontext()
                self._one(k, times[k], mark)
        return times


def _arms_of(specs: Sequence[WorkerSpec]) -> tuple[list[ArmStep], dict[str, Any]]:
    """Both arms' steps: from the workload's own arms entry, else its one-mode step built under each arm's switches."""
    first = specs[0]
    if first.arms_workload is not None:
        return entry_point(first.arms_workload)(specs)
    return switched_arms(specs, entry_point(first.workload))


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


def pair_session(pairs: list[list[WorkerSpec]]) -> int:
    """Pairs of arms in this one process, one pair after the other (the models of a repeat), both arms of each
    a step of each in turn (``run_arms``); each result written, then ``DONE`` to the coordinator.

    The process is switched once for what every arm shares and can only be set at start
    (``determinism.apply_shared``); each arm's step sets the rest of its knobs itself.
    """
    pacer = Pacer(pairs[0][0].control_fd)
    apply_shared([spec.determinism for spec in pairs[0]])
    cpus = os.sched_getaffinity(0)
    for specs in pairs:
        _log_to(Path(specs[0].log_path))
        pin_threads(cpus)
        keras = sys.modules.get("keras")
        if keras is not None:
            keras.backend.clear_session()
        pacer.begin()
        for spec, result in zip(specs, run_arms(specs, pacer), strict=True):
            atomic_write_json(Path(spec.result_path), result)
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
    if "pairs" in spec:
        return pair_session([[WorkerSpec.from_json(arm) for arm in pair] for pair in spec["pairs"]])
    result_path = Path(argv[1])
    if "call" in spec:
        return call(spec, result_path)
    atomic_write_json(result_path, run(WorkerSpec.from_json(spec)))
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
