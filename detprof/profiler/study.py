"""The one measured-study flow: plan -> launcher -> store -> progress, for the sweep and kernels_bench.

A measured study runs one worker per (workload, mode, repeat): a fresh process per run
(determinism cannot be switched off inside a process, and cuDNN's autotune cache must not
carry from one mode into the other), the two modes back to back in each repeat so that
drift and thermals hit both alike, one atomic record per run, and ``--resume`` skipping
every run already complete. The sweep plans models, kernels_bench op cases; everything
else (settings checks, device and tracer choice, the run loop, the progress display) is
here, once.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from rich.console import Console
from rich.markup import escape

from detprof.determinism import DEFAULT_BACKEND, MODES, Backend, Mode, as_before_the_choice, require_backend
from detprof.errors import UsageError
from detprof.profiler import devices
from detprof.profiler.devices import DeviceChoice, usable_core_ids
from detprof.profiler.launcher import Measures, PairedRun, WorkerLauncher, WorkerRun, Workload
from detprof.profiler.options import RunOptions
from detprof.profiler.program_run import ProgramLauncher
from detprof.profiler.progress import RunProgress, progress_bar
from detprof.profiler.tracers import Tracer, resolve_tracer
from detprof.records import MeasuredRun
from detprof.store import ResultsStore, StudyKind

RUN_ORDER: tuple[Mode, ...] = ("deterministic", "default")
Unit = TypeVar("Unit")
Pairing = Literal["lockstep", "sequential"]
"""``lockstep``: a repeat is two warm workers, one per mode, stepped in turn (A, B, A, B, ...), so each
pair of steps shares the machine's state; used on a CPU, where both fit and load from other work
is the main noise. ``sequential``: a repeat is one worker per mode, one after the other, each with
the device to itself; used on a GPU, where device memory may not hold two processes of a large
model and kernel time is stable. Either way the repeat is the paired unit of the interval: the
worker process is a random effect, so the interval comes from the spread between repeats."""


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """How every run of a measured study is measured; the sweep and kernels_bench add what they measure."""

    steps: int = 100
    warmup: int = 10
    repeats: int = 3
    batch_size: int = 64
    input_size: int | None = None
    backend: str = DEFAULT_BACKEND
    """The Keras backend every run uses (``--backend``)."""
    compile: bool = False
    """torch: ``torch.compile`` in both modes (``--compile``)."""
    tracer: str = "tf"
    trace_api: str | None = None
    """nsys's library API traces asked for (``--trace-api``), comma-separated; None: none."""
    xla: bool = False
    gpu_label: str = "cpu"
    seed: int = 0
    preset: str | None = None
    pairing: Pairing = "sequential"
    """How the two modes of a repeat are paired: see ``Pairing``."""
    run_timeout_s: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        """One line per bad value, before any worker starts."""
        for name, value, least in (
            ("--steps", self.steps, 1),
            ("--repeats", self.repeats, 1),
            ("--batch-size", self.batch_size, 1),
            ("--warmup", self.warmup, 0),
        ):
            if value < least:
                raise UsageError(f"{name} must be at least {least}, not {value}")
        if self.input_size is not None and self.input_size < 8:
            raise UsageError(f"--input-size must be at least 8, not {self.input_size}")
        if self.run_timeout_s is not None and self.run_timeout_s <= 0:
            raise UsageError(f"--run-timeout must be positive, not {self.run_timeout_s}")

    def manifest(self) -> dict[str, Any]:
        """What identifies the measurement (a resumed study must match it exactly); not the timeout.

        TensorFlow without ``--compile`` is written as before there was a backend choice
        (``determinism.as_before_the_choice``), so that a sweep measured then still resumes.
        """
        config = as_before_the_choice(asdict(self))
        config.pop("run_timeout_s")
        config["modes"] = list(MODES)
        return config

    def worker_run(self, run: PlannedRun) -> WorkerRun:
        return WorkerRun(
            run.run_id,
            run.mode,
            self.seed,
            self.xla,
            self.steps,
            self.warmup,
            run.measures,
            backend=self.backend,
            compile=self.compile,
        )


@dataclass(frozen=True)
class MeasurementTarget:
    device: DeviceChoice
    tracer: Tracer
    preset: str
    planned_gpu: bool = False
    backend: Backend = DEFAULT_BACKEND
    """A dry run's GPU label forced on a machine without that GPU: planned as that GPU."""
    program: bool = False
    """A training program detprof did not write (``sweep --command``): run whole by ``program_run.ProgramLauncher``,
    one process at a time (detprof cannot step it), each run either traced or timed (``measured_parts``)."""

    @property
    def on_gpu(self) -> bool:
        return self.planned_gpu or (self.device.gpu is not None and not self.device.hide_gpus)

    @property
    def pairing(self) -> Pairing:
        steppable = not self.program and self.tracer.in_process != "cuda-profiler-api"
        return "lockstep" if not self.on_gpu and steppable else "sequential"

    def settings(self, options: RunOptions) -> dict[str, Any]:
        """The ``RunSettings`` fields that come from the target and the options, whatever is measured."""
        return {
            "pairing": self.pairing,
            "backend": self.backend,
            "compile": options.compile,
            "tracer": self.tracer.name,
            "trace_api": ",".join(self.tracer.api_traces) or None,
            "xla": bool(options.xla),
            "gpu_label": self.device.label,
            "seed": options.seed or 0,
            "preset": self.preset,
            "run_timeout_s": options.run_timeout,
        }


def choose_target(options: RunOptions, presets: Sequence[str], *, dry_run: bool = False) -> MeasurementTarget:
    """The device (label checked), the tracer it allows, and the preset that fits it.

    A dry run plans a GPU label forced on a machine without that GPU as that GPU, and a
    tracer that is not installed as the one asked for: the plan then says so.
    """
    backend = chosen_backend(options)
    device = devices.choose_device(options.gpu, options.force, gpu_index=options.gpu_index)
    planned_gpu = dry_run and device.forced and device.gpu is None and device.label != devices.CPU_LABEL
    on_gpu = planned_gpu or (device.gpu is not None and not device.hide_gpus)
    preset_name = options.preset or ("paper" if on_gpu else "cpu-small")
    if preset_name not in presets:
        raise UsageError(f"unknown preset {preset_name!r}; choose one of {', '.join(presets)}")
    apis = tuple(a.strip().lower() for a in (options.trace_api or "").split(",") if a.strip())
    chosen = resolve_tracer(options.tracer or "auto", on_gpu, apis, backend=backend, require_installed=not dry_run)
    if chosen.name == "nvprof" and not planned_gpu:
        devices.refuse_nvprof(device.gpu)
    return MeasurementTarget(device, chosen, preset_name, planned_gpu, backend)


def chosen_backend(options: RunOptions) -> Backend:
    """The backend asked for, installed, and with a compiler switch it has (one line otherwise).

    ``--xla`` is TensorFlow's ``jit_compile``; JAX always compiles with XLA; PyTorch compiles
    with ``--compile``. A switch a backend does not have would be silently ignored, and the
    study would not measure what its user asked for.
    """
    backend = require_backend(options.backend or DEFAULT_BACKEND)
    if options.xla and backend != "tensorflow":
        what = "JAX always compiles with XLA" if backend == "jax" else "PyTorch compiles with --compile"
        raise UsageError(f"--xla is TensorFlow's jit_compile; {what}")
    if options.compile and backend != "torch":
        raise UsageError(f"--compile is torch.compile, for --backend torch; {backend} {_COMPILER[backend]}")
    return backend


_COMPILER = {"tensorflow": "compiles with --xla", "jax": "always compiles with XLA"}


def default_results_dir(device: DeviceChoice, backend: str = DEFAULT_BACKEND) -> Path:
    """``results/<date>-<device>[-<backend>]``: the sweep, kernels and stability of one day, device and
    backend pair up; TensorFlow's folders keep the name they had before there was a choice."""
    suffix = "" if backend == DEFAULT_BACKEND else f"-{backend}"
    return Path("results") / f"{dt.date.today().isoformat()}-{device.label}{suffix}"


def preset_values(preset: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The preset's values, each replaced by the option given explicitly (``None``: not given)."""
    return {**preset, **{k: v for k, v in given.items() if v is not None}}


@dataclass(frozen=True)
class PlannedRun:
    """One worker of a measured study: what it runs, and the fields that identify it in its record."""

    run_id: str
    label: str
    mode: Mode
    repeat: int
    workload: Workload
    fields: dict[str, Any]
    measures: Measures = "both"


UNTRACED_SUFFIX = "--untraced"
"""Run id suffix of the untraced run that measures wall time beside a run traced by nsys or nvprof."""


def measured_parts(tracer: Tracer, *, whole_runs: bool = False) -> tuple[Measures, ...]:
    """What the runs of each planned run measure: wall time is never taken under a tracer.

    An in-process tracer (TensorFlow's profiler) is switched on inside the worker, so one run
    times untraced steps first and traces the next ones (``worker.run``). nsys and nvprof
    wrap the whole process, and tax every API call and launch in it (more so for a
    deterministic implementation that launches more kernels): their runs give kernel time
    only, and an untraced run of the same workload and mode gives the wall time. So do the
    runs of a program detprof did not write (``whole_runs``) under any tracer: its steps are
    its own, and detprof cannot run some untraced before tracing others.
    """
    if tracer.name == "none":
        return ("wall",)
    if tracer.wraps_process or whole_runs:
        return ("kernel", "wall")
    return ("both",)


def runs_to_measure(plan: Sequence[PlannedRun], tracer: Tracer, *, whole_runs: bool = False) -> list[PlannedRun]:
    """The plan as it runs under ``tracer``: each pair of modes traced, then, where the tracer
    wraps the process (or the runs are a program's, ``whole_runs``), the same pair untraced
    (``measured_parts``), in the same mode order."""
    parts = measured_parts(tracer, whole_runs=whole_runs)
    if len(parts) == 1:
        return [replace(run, measures=parts[0]) for run in plan]
    runs: list[PlannedRun] = []
    for i in range(0, len(plan), 2):
        pair = plan[i : i + 2]
        runs += [replace(run, measures="kernel") for run in pair]
        runs += [
            replace(run, run_id=run.run_id + UNTRACED_SUFFIX, label=f"{run.label} untraced", measures="wall")
            for run in pair
        ]
    return runs


def mode_order(repeat: int) -> tuple[Mode, ...]:
    """The order of the two modes in ``repeat``: ``RUN_ORDER`` in even repeats, reversed in odd ones.

    Whichever worker starts and steps first is not quite the same as the second: in A/A
    lockstep pairs on 2 cores, the second came out 0.5-1.5% slower (all three cpu-small
    models, two calibrations), enough to push an A/A interval off 1.00. Counterbalanced,
    that order effect falls on both modes equally and lands in the interval as spread
    between repeats instead of as a bias. The same holds for runs one after the other.
    """
    return RUN_ORDER if repeat % 2 == 0 else RUN_ORDER[::-1]


def interleaved(units: Sequence[Unit], repeats: int) -> list[tuple[int, Unit, Mode]]:
    """Repeat by repeat, unit by unit, the two modes back to back in ``mode_order`` (D, N, ..., N, D, ...)."""
    return [(repeat, unit, mode) for repeat in range(repeats) for unit in units for mode in mode_order(repeat)]


def run_planned(
    plan: Sequence[PlannedRun],
    settings: RunSettings,
    manifest: dict[str, Any],
    store: ResultsStore,
    target: MeasurementTarget,
    *,
    resume: bool,
    command: str,
    progress: RunProgress | None = None,
) -> list[MeasuredRun]:
    """Run every planned run not already complete; returns the records of this invocation."""
    progress = progress or RunProgress()
    store.open(manifest, command, resume=resume)
    launcher_type = ProgramLauncher if target.program else WorkerLauncher
    launcher = launcher_type(store, target.tracer, target.device, settings.run_timeout_s)
    records: list[MeasuredRun] = []
    plan = runs_to_measure(plan, target.tracer, whole_runs=target.program)
    if settings.pairing == "lockstep":
        return _run_lockstep_pairs(plan, settings, store, launcher, progress)
    todo = [run for run in plan if not store.is_done(run.run_id)]
    for index, run in enumerate(todo, start=len(plan) - len(todo)):
        progress.on_start(run.label, index)
        record = launcher.run(settings.worker_run(run), run.workload, run.fields)
        records.append(record)
        progress.on_done(record)
    return records


ModePair = tuple[PlannedRun, PlannedRun]


def mode_pairs(plan: Sequence[PlannedRun]) -> list[ModePair]:
    """The plan's runs two by two: the two modes (or arms) of one unit and repeat."""
    return [(plan[i], plan[i + 1]) for i in range(0, len(plan) - 1, 2)]


def lockstep_sessions(pairs: Sequence[ModePair]) -> list[list[ModePair]]:
    """The pairs of each repeat, which one pair of workers measures in turn."""
    return [list(group) for _repeat, group in itertools.groupby(pairs, key=lambda pair: pair[0].repeat)]


def session_core(index: int) -> int:
    """The core the ``index``-th session's workers are pinned to: the usable cores in turn."""
    cores = sorted(usable_core_ids())
    return cores[index % len(cores)]


def lockstep_runs(settings: RunSettings, pairs: Sequence[ModePair]) -> list[tuple[PairedRun, PairedRun]]:
    """What ``WorkerLauncher.run_pairs`` takes for ``pairs``; their records say they were paired in lockstep."""
    return [
        (
            (settings.worker_run(a), a.workload, a.fields | {"pairing": "lockstep"}),
            (settings.worker_run(b), b.workload, b.fields | {"pairing": "lockstep"}),
        )
        for a, b in pairs
    ]


def _run_lockstep_pairs(
    plan: Sequence[PlannedRun],
    settings: RunSettings,
    store: ResultsStore,
    launcher: WorkerLauncher,
    progress: RunProgress,
) -> list[MeasuredRun]:
    """Every lockstep pair not yet complete, a repeat at a time, the cores taken in turn.

    The pairs of one repeat share a pair of workers (``WorkerLauncher.run_pairs``); the next
    repeat starts fresh ones, so the worker process stays a random effect across repeats.
    One session at a time: two pairs side by side on two cores interfered through the
    shared caches and memory (A/A on a loaded 2-core machine: smallcnn +/-6.6% against
    +/-0.9%). A pair that is half done (a crash between its two records) is measured again
    whole: its two halves must share the machine's state. When a session ends early (a
    worker died, or a pair ran past ``--run-timeout``), fresh workers take the pairs left.
    """
    pairs = mode_pairs(plan)
    todo = [pair for pair in pairs if not all(store.is_done(run.run_id) for run in pair)]
    records: list[MeasuredRun] = []
    completed = 2 * (len(pairs) - len(todo))
    for n, left in enumerate(lockstep_sessions(todo)):
        while left:
            progress.on_start(" + ".join(run.label for run in left[0]), completed)
            measured = 0
            for record in launcher.run_pairs(lockstep_runs(settings, left), cpu_core=session_core(n)):
                records.append(record)
                progress.on_done(record)
                measured += 1
                completed += 1
                if measured % 2 == 0 and measured // 2 < len(left):
                    progress.on_start(" + ".join(run.label for run in left[measured // 2]), completed)
            left = left[max(measured // 2, 1) :]
    return records


def measure(
    kind: StudyKind,
    plan: Sequence[PlannedRun],
    settings: RunSettings,
    manifest: dict[str, Any],
    target: MeasurementTarget,
    out: Path,
    *,
    what: str,
    resume: bool,
    command: str,
    console: Console,
) -> ResultsStore:
    """``run_planned`` as a command runs it: a line saying what runs where, then the progress display."""
    store = ResultsStore(out, kind)
    parts = measured_parts(target.tracer, whole_runs=target.program)
    untraced = " (and untraced runs for wall time)" if len(parts) > 1 else ""
    console.print(
        f"detprof {kind}: {what} x 2 modes x {settings.repeats} repeats on {escape(target.device.label)} "
        f"with tracer {target.tracer.name}{untraced}, results in {escape(str(out))}"
    )
    total = len(runs_to_measure(plan, target.tracer, whole_runs=target.program))
    with progress_bar(console, kind, total, store.dir) as progress:
        run_planned(plan, settings, manifest, store, target, resume=resume, command=command, progress=progress)
    return store
