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

import atexit
import contextlib
import importlib
import itertools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from detprof import backends
from detprof.backends.base import ArmStep, Backend
from detprof.determinism import (
    DeterminismSettings,
    apply,
    apply_shared,
    arm_settings,
    restore_shared,
    software_versions,
)
from detprof.device_time import PartClock, spawned_clock
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


def _warmed_up(clock: PartClock, rounds_ns: Sequence[int], steps: int) -> int:
    """The warm-up's time charged: its first round's excess over a typical round (``steps`` steps each) is the
    framework compiling and autotuning at the first call, the rest warm-up. Returns the typical step."""
    step_ns = typical_step_ns(list(rounds_ns))
    clock.lap("warmup")
    if rounds_ns:
        clock.move((rounds_ns[0] - step_ns) * steps / 1e9, "warmup", "compile")
    return step_ns


class _PeakMemory:
    """The framework allocator's peak on the device for each run of a process: per run where the framework can
    start its peak again between runs' steps (``Backend.peak_memory_per_arm``), else the process's, for every run
    it ran; none on a device without allocator statistics, with why."""

    def __init__(self, backend: Backend, runs: int) -> None:
        self.backend = backend
        self.tracked = backend.peak_memory() is not None
        self.per_run = self.tracked and backend.peak_memory_per_arm
        self.peaks = [0] * runs

    def before(self, k: int) -> None:
        if self.per_run:
            self.backend.reset_peak_memory()

    def after(self, k: int) -> None:
        if self.per_run:
            self.peaks[k] = max(self.peaks[k], self.backend.peak_memory() or 0)

    def field(self, k: int, *, shared: bool) -> dict[str, Any]:
        """Run ``k``'s record field; ``shared``: another run's steps ran in this process too."""
        if not self.tracked:
            return {"bytes": None, "covers": None, "why": self.backend.no_peak_memory}
        if self.per_run:
            return {"bytes": self.peaks[k], "covers": "run", "why": None}
        covers = "process" if shared else "run"
        return {"bytes": self.backend.peak_memory(), "covers": covers, "why": None}


def _device_ready(backend: Backend, clock: PartClock) -> None:
    """The device initialised, once the framework's threads are set (TensorFlow takes them only before), timed
    apart: what came before it is the process's start, or the last run's end."""
    clock.lap("other")
    backend.init_device()
    clock.lap("device")


def run(spec: WorkerSpec, clock: PartClock, pacer: Pacer | None = None) -> dict[str, Any]:
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
    result: dict[str, Any] = {"settings": apply(settings, keras=spec.keras)}
    clock.lap("start")
    if spec.cpu_threads and backend.limit_threads(spec.cpu_threads):
        result["cpu_threads"] = spec.cpu_threads
    _device_ready(backend, clock)
    result["versions"] = software_versions(settings.backend)
    capture = TRACERS[spec.tracer].capture(spec.trace_path, settings.backend)
    result.update(backend.compile_in_this_process(settings.compile, compared=False))
    pacer = pacer or Pacer(None)
    memory = _PeakMemory(backend, 1)
    memory.before(0)
    try:
        step, facts = entry_point(spec.workload)(spec)
        result.update(facts)
        clock.lap("build")
        step_ns = _warmed_up(clock, _warm_up([step], spec.warmup), 1)
        window_start = time.monotonic()
        if spec.cpu_core is not None:
            pin_threads({spec.cpu_core})
            result["cpu_core"] = spec.cpu_core
        pacer.answer(f"{Message.READY} {step_ns}")
        steps = sized_steps(spec.most_steps, spec.run_seconds, step_ns)
        wall_ns = _timed_steps(step, min(spec.wall_steps, steps), pacer, None)
        clock.lap("steps")
        traced_ns: list[int] = []
        if spec.traced_steps and pacer.wait_for(Message.TRACE):
            capture.start()
            try:
                for _ in range(spec.settling_steps):
                    step()
                pacer.answer(Message.TRACED)
                clock.lap("tracing")
                traced_ns = _timed_steps(step, min(spec.traced_steps, steps), pacer, capture)
                clock.lap("steps")
            finally:
                capture.stop()
                clock.lap("tracing")
        result.update(_measured(wall_ns, traced_ns, window_start) | backend.compiled_facts())
    except Exception as exc:
        pacer.failed()
        traceback.print_exc()
        result.update(_failure(exc, settings))
    memory.after(0)
    clock.lap("other")
    return result | {"peak_memory": memory.field(0, shared=False), "time_parts": clock.take()}


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
        status, reason = "failed", f"{backends.OUT_OF_MEMORY}{reason}"
    found: dict[str, Any] = {}
    if status == "unsupported":
        finding = finding_of(exc, settings.backend)
        found["finding"] = finding.to_json()
        reason = finding.message
    return found | {"status": status, "reason": reason}


@dataclass(frozen=True)
class _Built:
    """A pair's arms as built and compiled, kept for the next repeat of the same model in this process
    (``--shared-repeats``): its steps by arm, and what the workload said about itself."""

    key: str
    arms: dict[str | None, ArmStep]
    facts: dict[str, Any]

    def of(self, specs: Sequence[WorkerSpec]) -> tuple[list[ArmStep], dict[str, Any]] | None:
        """The arms of ``specs`` in their order, where they are this build's; else None."""
        return ([self.arms[spec.arm] for spec in specs], self.facts) if build_key(specs) == self.key else None


_PER_RUN = frozenset({"run_id", "trace_path", "result_path", "log_path"})
"""A spec's fields that name one run's files: two repeats of one model differ only in them."""


def build_key(specs: Sequence[WorkerSpec]) -> str:
    """What a pair's arms are built from, whatever order its repeat puts them in."""
    arms = (
        json.dumps({k: v for k, v in spec.to_json().items() if k not in _PER_RUN}, sort_keys=True) for spec in specs
    )
    return json.dumps(sorted(arms))


REUSED_WARMUP = 1
"""Warm-up rounds of steps an earlier repeat built and warmed: one, to size the phases by the step's time now."""


def run_arms(
    specs: Sequence[WorkerSpec], pacer: Pacer, clock: PartClock, built: _Built | None = None
) -> tuple[list[dict[str, Any]], _Built | None]:
    """The arms of one pair in this process, a step of each in turn (A, B, A, B, ...): their results, in order, and
    the arms as built (None where building failed).

    As ``run``, after a warm-up of both, untraced steps for wall time and then traced ones for
    kernel time, each arm's marked ``step i ARM`` in the one trace, so that every pair of steps
    saw the same moment of the process and the machine, and no start-up or offset between two
    processes lies between the arms. An arm whose step raises drops out with its failure (an op
    that refuses determinism is a finding) and the other goes on alone. ``built``: an earlier
    repeat's arms, re-run where they are this pair's (their compiled steps and their weights as
    that repeat left them), with one warm-up round.
    """
    first = specs[0]
    backend = backends.get(first.determinism.backend)
    threads = first.cpu_threads and backend.limit_threads(first.cpu_threads)
    _device_ready(backend, clock)
    common: dict[str, Any] = {"versions": software_versions(backend.name)}
    if threads:
        common["cpu_threads"] = first.cpu_threads
    capture = TRACERS[first.tracer].capture(first.trace_path, backend.name)
    common.update(backend.compile_in_this_process(first.determinism.compile, compared=False))
    memory = _PeakMemory(backend, len(specs))
    reused = built.of(specs) if built is not None else None
    try:
        arms, facts = reused or _arms_of(specs)
    except Exception as exc:
        pacer.failed()
        traceback.print_exc()
        clock.lap("build")
        parts = {"time_parts": clock.take()}
        return [common | {"settings": None} | _failure(exc, spec.determinism) | parts for spec in specs], None
    clock.lap("build")
    results = [
        common | facts | {"settings": arm_settings(spec.determinism, effect)}
        for spec, (_, effect) in zip(specs, arms, strict=True)
    ]
    steps = _Turns([step for step, _ in arms], [spec.arm for spec in specs], memory)
    _warmed_up(clock, steps.warm_up(REUSED_WARMUP if reused else first.warmup), len(specs))
    window_start = time.monotonic()
    if first.cpu_core is not None:
        pin_threads({first.cpu_core})
        common["cpu_core"] = first.cpu_core
    count = sized_steps(first.most_steps, first.run_seconds, steps.step_ns)
    wall_ns = steps.timed(min(first.wall_steps, count))
    clock.lap("steps")
    traced_ns: list[list[int]] = [[] for _ in specs]
    if first.traced_steps and steps.alive:
        capture.start()
        try:
            steps.untimed(first.settling_steps)
            clock.lap("tracing")
            traced_ns = steps.timed(min(first.traced_steps, count), capture)
            clock.lap("steps")
        finally:
            capture.stop()
            clock.lap("tracing")
    parts = clock.take()
    for k, result in enumerate(results):
        failed = steps.failures.get(k)
        result.update(common)
        measured = _measured(wall_ns[k], traced_ns[k], window_start)
        result.update(measured if failed is None else _failure(failed, specs[k].determinism))
        result.update(peak_memory=memory.field(k, shared=True), time_parts=parts)
    return results, _Built(build_key(specs), {spec.arm: arm for spec, arm in zip(specs, arms, strict=True)}, facts)


class _Turns:
    """Steps of several arms taken in turn, one round at a time; an arm whose step raises leaves the rotation."""

    def __init__(self, steps: list[Callable[[], None]], arms: list[str | None], memory: _PeakMemory) -> None:
        self.steps = steps
        self.arms = arms
        self.memory = memory
        self.alive = list(range(len(steps)))
        self.failures: dict[int, Exception] = {}
        self.step_ns = 0

    def _one(self, k: int, timed: list[int] | None, mark: contextlib.AbstractContextManager[None]) -> None:
        """Arm ``k``'s step, timed alone: its allocator peak is read around it, outside the time."""
        try:
            self.memory.before(k)
            with mark:
                t0 = time.perf_counter_ns()
                self.steps[k]()
                elapsed = time.perf_counter_ns() - t0
            self.memory.after(k)
        except Exception as exc:
            traceback.print_exc()
            self.failures[k] = exc
            self.alive.remove(k)
            return
        if timed is not None:
            timed.append(elapsed)

    def warm_up(self, rounds: int) -> list[int]:
        """``rounds`` untimed rounds; the step time of their later half, for sizing. Returns each round's mean
        step."""
        times: list[int] = []
        for _ in range(rounds):
            round_ns: list[int] = []
            for k in list(self.alive):
                self._one(k, round_ns, contextlib.nullcontext())
            if round_ns:
                times.append(sum(round_ns) // len(round_ns))
        self.step_ns = typical_step_ns(times)
        return times

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


def session(runs: list[WorkerSpec], clock: PartClock) -> int:
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
        clock.lap("other")
        atomic_write_json(Path(spec.result_path), run(spec, clock, pacer))
        pacer.written()
    return ExitCode.OK


def pair_session(
    pairs: list[list[WorkerSpec]], clock: PartClock, process_knobs: Sequence[str], *, shared_repeats: bool = False
) -> int:
    """Pairs of arms in this one process, one pair after the other (the models of a repeat), both arms of each
    a step of each in turn (``run_arms``); each result written, then ``DONE`` to the coordinator.

    The process is switched once, when it starts, for the knobs that can only be set then (``process_knobs``, as the
    launcher read them for the device: ``determinism.apply_shared``); each arm's step sets the rest of its knobs, and
    each model is built back under those the process started with (``determinism.restore_shared``).
    ``shared_repeats``: the pairs are every repeat of each model in turn, and a repeat re-runs the arms the one
    before it built (``--shared-repeats``), where it is the same model's.
    """
    pacer = Pacer(pairs[0][0].control_fd)
    keras = any(spec.keras for specs in pairs for spec in specs)
    apply_shared([spec.determinism for spec in pairs[0]], process_knobs, keras=keras)
    clock.lap("start")
    cpus = os.sched_getaffinity(0)
    built: _Built | None = None
    for specs in pairs:
        _log_to(Path(specs[0].log_path))
        pin_threads(cpus)
        if built is None or built.of(specs) is None:
            built = None  # another model's arms: let them go before this one's are built
            restore_shared([spec.determinism for spec in specs], process_knobs)
            keras = sys.modules.get("keras")
            if keras is not None:
                keras.backend.clear_session()
        pacer.begin()
        clock.lap("other")
        results, made = run_arms(specs, pacer, clock, built)
        for spec, result in zip(specs, results, strict=True):
            reused = {"steps_reused": built is not None} if shared_repeats else {}
            atomic_write_json(Path(spec.result_path), result | reused)
        built = made if shared_repeats else None
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
    clock = spawned_clock()
    spec = json.loads(Path(argv[0]).read_text())
    clock.lap("start")
    code = _serve(spec, argv, clock)
    if not _traced_from_outside(spec):
        end_now(code)
    return code


def _serve(spec: dict[str, Any], argv: list[str], clock: PartClock) -> int:
    if "runs" in spec:
        return session([WorkerSpec.from_json(run_spec) for run_spec in spec["runs"]], clock)
    if "pairs" in spec:
        pairs = [[WorkerSpec.from_json(arm) for arm in pair] for pair in spec["pairs"]]
        return pair_session(
            pairs, clock, spec.get("process_knobs", ()), shared_repeats=bool(spec.get("shared_repeats"))
        )
    result_path = Path(argv[1])
    if "call" in spec:
        return call(spec, result_path)
    atomic_write_json(result_path, run(WorkerSpec.from_json(spec), clock))
    return ExitCode.OK


def _traced_from_outside(spec: dict[str, Any]) -> bool:
    """Whether a tracer that wraps the process (nsys, nvprof) runs this worker: it reads the process's end."""
    runs = spec.get("runs") or [arm for pair in spec.get("pairs", ()) for arm in pair] or [spec]
    return any(TRACERS[run["tracer"]].wraps_process for run in runs if "tracer" in run)


def end_now(code: int) -> NoReturn:
    """End the process once its results are written, without the interpreter's teardown.

    The parent waits for the worker to exit before it reads the results and starts the next run, and tearing down
    an interpreter that loaded a framework (every module's objects freed, one by one) took 0.4 s (JAX) to 0.7 s
    (PyTorch) on a quiet 2-core machine, and more on a busy one: time on the device's lease that measures nothing
    (``benchmarks/bench_worker_exit.py``).
    What the process registered to run at its end still runs (``atexit``: the compile workers' pool shut, logs
    flushed); a tracer that wraps the process reads its normal end and keeps it (``_traced_from_outside``).
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
