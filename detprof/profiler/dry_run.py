"""``--dry-run``: a measured study's plan as it would run, printed instead of run.

Every decision that shapes a measurement on a GPU (which card a worker sees, whether it
shares it, what the tracer records and which runs are traced at all) is taken before a
worker starts, so it can be shown without a GPU and reviewed before a sweep of hours. The
command lines and environments come from the launcher that would run them, not from a
copy of its logic. A tracer that is not installed here is named in the plan rather than
refused; a GPU label forced on a machine without that GPU is planned as that GPU.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from detprof import backends
from detprof.models import kinds
from detprof.profiler import measured_runs as planned
from detprof.profiler.launcher import WorkerLauncher
from detprof.profiler.measured_runs import MeasurementTarget, PlannedRun, RunSettings
from detprof.profiler.run_specs import SETTLING_STEPS
from detprof.store import ResultsStore, StudyKind

MEASURES_TEXT = {
    "both": "wall time from {steps} untraced steps, then kernel time from {steps} traced steps",
    "kernel": "kernel time from {steps} traced steps (wall time: its untraced run)",
    "wall": "wall time from {steps} untraced steps (not traced)",
}


def plan_lines(
    kind: StudyKind, plan: Sequence[PlannedRun], settings: RunSettings, target: MeasurementTarget, out: Path
) -> list[str]:
    """The plan, in the order it would run: device, tracer, timing, environment, then every run."""
    launcher = WorkerLauncher(ResultsStore(out, kind), target.tracer, target.device, settings)
    runs = planned.runs_to_measure(plan, target.tracer)
    lines = [f"detprof {kind} --dry-run: the plan, in order; nothing runs and nothing is written", ""]
    lines += _setting_lines(target, settings, runs)
    lines += ["", "Environment detprof sets in every worker:"]
    lines += [f"  {line}" for line in _env_lines(launcher, target)]
    lines += ["", f"Runs ({len(runs)}):"]
    if settings.pairing == "lockstep":
        lines += _lockstep_lines(launcher, settings, runs)
    elif settings.pairing == "in_process":
        shared, apart = settings.apart_runs(runs)
        lines += _in_process_lines(launcher, settings, shared, target)
        if apart:
            lines.append(f"  then {', '.join(settings.apart)}: a process per arm, one after the other")
            lines += _sequential_lines(launcher, settings, apart)
    else:
        lines += _sequential_lines(launcher, settings, runs)
    if settings.precision is not None:
        within = (
            f", while the next repeat fits in {settings.budget_s:g} s after the first {settings.repeats}"
            if settings.budget_s is not None
            else ""
        )
        lines += [
            "",
            f"Then repeats {settings.repeats}, {settings.repeats + 1}, ... of each model whose interval is not yet "
            f"within +/-{settings.precision:.1%}, as many as its first {settings.repeats} repeats' spread asks for "
            f"(at most {planned.MAX_REPEATS}){within}.",
        ]
    return lines


def _setting_lines(target: MeasurementTarget, settings: RunSettings, runs: Sequence[PlannedRun]) -> list[str]:
    device = target.device
    if target.planned_gpu:
        where = f"{device.label} (--force: no such GPU is detected here; planned as if it were)"
    elif device.gpu is not None and not device.hide_gpus:
        where = f"{device.label}: GPU {device.gpu.index} ({device.gpu.name}, {device.gpu.uuid or 'no UUID'})"
    else:
        where = f"{device.label} (CPU{', GPUs hidden' if device.hide_gpus else ''})"
    tracer = target.tracer
    installed = "" if tracer.installed else f"; NOT INSTALLED here ({tracer.name} is not on PATH): the run would refuse"
    parts = planned.measured_parts(tracer)
    if parts == ("both",):
        timing = f"each run times untraced steps (wall time), then traces as many with {tracer.name} (kernel time)"
    elif parts == ("wall",):
        timing = "untraced runs: wall time only, no kernel tables"
    else:
        timing = f"runs traced by {tracer.name} give kernel time; an untraced run beside each gives wall time"
    settle = f"; {SETTLING_STEPS} untimed settling step after the tracer starts" if parts != ("wall",) else ""
    pairing = {
        "in_process": "in-process: one worker per repeat runs both modes, a step of each in turn",
        "lockstep": "lockstep: two warm workers per repeat, one per mode, stepping in turn on one core",
        "sequential": "sequential: one worker at a time, each with the device to itself",
    }[settings.pairing]
    backend = backends.get(settings.backend)
    if settings.pairing == "in_process":
        shared = backend.process_knobs([backend.mode_knobs(), frozenset()], target.on_gpu)
        if shared and not settings.apart:
            pairing += f"; the process starts with {', '.join(sorted(shared))}, which both modes share"
        if settings.shared_repeats:
            pairing = pairing.replace("one worker per repeat", "one worker for every repeat of a model")
            pairing += "; a model's later repeats re-run the steps its first built and compiled (--shared-repeats)"
        if settings.apart:
            pairing += (
                "; a process per arm for the comparisons whose arms differ in a knob a process takes when it starts "
                f"({', '.join(settings.apart)})"
            )
    sized = []
    if settings.run_seconds is not None:
        sized = [
            f"  steps        as many per phase as take {settings.run_seconds:g} s (at most {settings.steps}), "
            "sized on a model's first repeat from its warm-up, and the same on its later repeats"
        ]
    return [
        f"  device       {where}",
        f"  backend      {settings.backend} ({_framework_words(runs)})",
        f"  tracer       {tracer.name}{installed}",
        f"  timing       {timing}{settle}",
        *sized,
        f"  pairing      {pairing}",
        f"  determinism  deterministic mode: {backend.switch_words} in the worker, "
        "before the framework does any work; seeds set in both modes",
        f"  compiler     {backend.compiler_words(settings.xla, settings.compile)}",
        *_precision_lines(settings),
    ]


def _framework_words(runs: Sequence[PlannedRun]) -> str:
    """How a worker's framework is chosen: Keras' by ``KERAS_BACKEND``; a native module's is its own, and its
    workers load no Keras."""
    found = [kinds.of_params(run.workload.params) for run in runs]
    native = {kind.what for kind in found if kind is not None}
    keras = None in found
    if not native:
        return "KERAS_BACKEND, set in the worker before Keras loads"
    words = f"what {' and '.join(sorted(native))} trains on; its workers load no Keras"
    return f"{words}; the Keras models' KERAS_BACKEND, set in the worker before Keras loads" if keras else words


def _precision_lines(settings: RunSettings) -> list[str]:
    """``--amp``'s line: the mixed precision every model trains in, in both modes."""
    amp = getattr(settings, "amp", None)
    if amp is None:
        return []
    return [
        f"  precision    {amp} in both modes: a PyTorch module's forward and loss under torch.autocast, a Keras "
        "model built under its mixed dtype policy"
    ]


def _env_lines(launcher: WorkerLauncher, target: MeasurementTarget) -> list[str]:
    env = launcher.environment.detprof_env()
    if target.planned_gpu:
        env["CUDA_VISIBLE_DEVICES"] = f"<UUID of the {target.device.label} GPU, read from NVML when it runs>"
    return [f"{name}={value}" if value else f"{name}= (empty)" for name, value in sorted(env.items())]


def _sequential_lines(launcher: WorkerLauncher, settings: RunSettings, runs: Sequence[PlannedRun]) -> list[str]:
    lines = []
    for number, run in enumerate(runs, start=1):
        worker, full = launcher.commands(run, require_installed=False)
        tracer = launcher.tracer_of(run)
        lines.append(f"  {number}. {run.run_id}: {_switched(run)}, {_measures(run, settings)}")
        lines.append(f"     worker: {shlex.join(worker)}")
        if tracer.wraps_process:
            lines.append(f"     tracer: {shlex.join(full[: len(full) - len(worker)])} <worker>")
        elif tracer.name != "none":
            lines.append(f"     tracer: {tracer.name}, started inside the worker after the untraced steps")
    return lines


def _lockstep_lines(launcher: WorkerLauncher, settings: RunSettings, runs: Sequence[PlannedRun]) -> list[str]:
    lines = []
    for n, session in enumerate(planned.lockstep_sessions(planned.mode_pairs(runs))):
        core = planned.session_cores(n)[0]
        lines.append(f"  repeat {session[0][0].repeat}: two workers on core {core}, one per side")
        for side in (0, 1):
            command = launcher.session_command([pair[side] for pair in session])
            lines.append(f"    {_switched(session[0][side])} worker: {shlex.join(command)}")
            for pair in session:
                run = pair[side]
                lines.append(f"      {run.run_id}: {_measures(run, settings)}")
    return lines


def _in_process_lines(
    launcher: WorkerLauncher, settings: RunSettings, runs: Sequence[PlannedRun], target: MeasurementTarget
) -> list[str]:
    lines = []
    sessions = settings.in_process_sessions(planned.mode_pairs(runs), target.on_gpu)
    for n, session in enumerate(sessions):
        core = "" if target.on_gpu else f" on core {planned.session_cores(n)[0]}"
        command = launcher.session_command([pair[0] for pair in session])
        which = "every repeat" if settings.shared_repeats else f"repeat {session[0][0].repeat}"
        sides = "both arms of each pair" if session[0][0].knobs is not None else "both modes"
        starts = settings.process_knobs(session[0], target.on_gpu) if settings.apart else frozenset()
        sides += f", started with {', '.join(sorted(starts))}" if starts else ""
        lines.append(f"  {which}: one worker{core}, {sides}: {shlex.join(command)}")
        for pair in session:
            sides = " + ".join(_switched(run) for run in pair)
            lines.append(f"    {pair[0].run_id} + {pair[1].run_id}: {sides} in turn, {_measures(pair[0], settings)}")
    return lines


def _switched(run: PlannedRun) -> str:
    """A run's mode, and the knobs it sets where it names them (a knob study's arm)."""
    if run.knobs is None:
        return run.mode
    return f"{run.mode} ({', '.join(run.knobs) or 'no knob'})"


def _measures(run: PlannedRun, settings: RunSettings) -> str:
    steps = str(settings.steps) if settings.run_seconds is None else f"up to {settings.steps}"
    text = MEASURES_TEXT[run.measures].format(steps=steps)
    return f"{text}, after {settings.warmup} warm-up steps"
