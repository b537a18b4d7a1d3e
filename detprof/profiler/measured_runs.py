"""What a measured study runs: its settings, its device and tracer, and its runs in the order they run.

A measured study runs one worker per (workload, mode, repeat): a fresh process per run
(determinism cannot be switched off inside a process, and cuDNN's autotune cache must not
carry from one mode into the other), the two modes back to back in each repeat so that
drift and thermals hit both alike. The sweep plans models, kernels_bench op cases and
``sweep --command`` a program; everything else (settings checks, device and tracer choice,
the order of the runs and how they pair) is decided here, before anything runs, so that
``--dry-run`` shows exactly what ``profiler.study`` would run.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

from detprof import backends
from detprof.determinism import MODES, DeterminismSettings, Mode, without_implied
from detprof.errors import UsageError
from detprof.gpu_labels import CPU_LABEL
from detprof.intervals import MIN_REPEATS
from detprof.options import RunOptions
from detprof.profiler import devices
from detprof.profiler.devices import DeviceChoice, usable_core_ids
from detprof.profiler.tracers import Tracer, refuse_nvprof, resolve_tracer
from detprof.store import place_for

RUN_ORDER: tuple[Mode, ...] = ("deterministic", "default")
Unit = TypeVar("Unit")
Pairing = Literal["in_process", "lockstep", "sequential"]
"""``in_process``: a repeat is one worker that runs both modes, a step of one then a step of the
other (A, B, A, B, ...), switching determinism between steps; where the backend can
(``Backend.shared_process_refusal``: PyTorch flips its switches, JAX compiles the step once per mode), on
any device, as it pays one process start per repeat and no offset between two processes.
``lockstep``: a repeat is two warm workers, one per mode, stepped in turn (A, B, A, B, ...), so each
pair of steps shares the machine's state; used on a CPU, where both fit and load from other work
is the main noise. ``sequential``: a repeat is one worker per mode, one after the other, each with
the device to itself; used on a GPU, where device memory may not hold two processes of a large
model and kernel time is stable. Either way the repeat is the paired unit of the interval: the
worker process is a random effect, so the interval comes from the spread between repeats."""
PAIRING_CHOICES = ("auto", "in-process", "processes")
"""``--pairing``: ``in-process`` where the backend can, ``processes`` a process per mode, ``auto`` the first."""
MAX_REPEATS = 40
"""The most repeats a sweep with ``--precision`` adds per model, budget or not: a model whose interval is not
within the precision by then needs another design (more steps, a quieter machine), not more of the same."""
Measures = Literal["both", "kernel", "wall"]
"""What a run measures: wall time from untraced steps, kernel time from traced ones, or both
(an in-process tracer: untraced steps first, then traced ones). A tracer that wraps the
process (nsys, nvprof) taxes all of it, so its runs measure kernels only and an untraced
run beside each measures the wall time (``measured_parts``)."""


SEED_MAX = 2**32 - 1
"""The largest seed every framework takes (NumPy's, and Keras's through it)."""


@dataclass(frozen=True)
class Workload:
    """What a measured worker runs: ``entry`` (``module:function``) builds the step from its spec's ``params``."""

    entry: str
    params: dict[str, Any] = field(default_factory=dict)
    arms_entry: str | None = None
    """The entry that builds both arms of a pair in one process (``worker.run_arms``); None: ``entry`` builds each
    arm's step under that arm's switches, on a backend that switches between steps (``workloads.switched_arms``)."""


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """How every run of a measured study is measured; the sweep and kernels_bench add what they measure."""

    steps: int = 100
    warmup: int = 10
    repeats: int = 3
    batch_size: int = 64
    input_size: int | None = None
    backend: str = backends.DEFAULT
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
    shared_repeats: bool = False
    """``--shared-repeats``: with ``in_process`` pairing, one process runs every repeat of a model, each re-running
    the steps the first built and compiled; the spread between repeats then leaves out what differs between
    processes (what a compiler or an autotuner picked, where memory lies), which a repeat of its own process keeps
    in the interval. False: a process per repeat."""
    apart: tuple[str, ...] = ()
    """With ``in_process`` pairing, a knob study's comparisons whose arms differ in a knob a process takes when it
    starts (``sweep.knobs.comparisons_apart``): each arm a process of its own, one after the other, while the other
    comparisons share a process."""
    precision: float | None = None
    """``--precision``: repeats are added, model by model, until each interval is within +/-this fraction (Stein's
    two-stage design, ``intervals.stein_repeats``: ``repeats`` is its first stage); None: ``repeats`` repeats."""
    run_seconds: float | None = None
    """The steps of a run are sized to this many seconds per phase (untraced, traced), from the step time its
    warm-up measured, at most ``steps``; None: ``steps`` steps."""
    run_timeout_s: float | None = field(default=None, compare=False)
    budget_s: float | None = field(default=None, compare=False)
    """``--budget``: with ``precision``, repeats are added while the next one fits in this many seconds of
    measuring; None: until every model is within the precision (or ``MAX_REPEATS``)."""

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
        if not 0 <= self.seed <= SEED_MAX:
            raise UsageError(
                f"--seed takes a whole number from 0 to {SEED_MAX:,} (the frameworks' range), not {self.seed}"
            )
        if self.input_size is not None and self.input_size < 8:
            raise UsageError(f"--input-size must be at least 8, not {self.input_size}")
        if self.run_timeout_s is not None and self.run_timeout_s <= 0:
            raise UsageError(f"--run-timeout must be positive, not {self.run_timeout_s}")
        if self.precision is not None and self.repeats < MIN_REPEATS:
            raise UsageError(f"--precision needs --repeats {MIN_REPEATS} or more: the first repeats give the spread")
        if self.shared_repeats and self.pairing != "in_process":
            raise UsageError(
                "--shared-repeats re-runs a repeat's steps in the process that built both modes: it needs "
                "--pairing in-process"
            )

    def manifest(self) -> dict[str, Any]:
        """What identifies the measurement (a resumed study must match it exactly); not the timeout or the budget.

        Settings at their implied value are left out (``determinism.without_implied``), so that a
        sweep whose manifest does not name them still resumes.
        """
        config = without_implied(asdict(self))
        for key in ("run_timeout_s", "budget_s"):
            config.pop(key)
        for key in ("precision", "run_seconds"):  # unset: left out, as in the studies made before they were
            if config[key] is None:
                config.pop(key)
        for key in ("shared_repeats", "apart"):  # unset: left out, as in the studies made before they were
            if not config[key]:
                config.pop(key)
        config["modes"] = list(MODES)
        return config

    @classmethod
    def for_target(
        cls, target: MeasurementTarget, options: RunOptions, *, in_process: bool = False, **measured: Any
    ) -> Self:
        """The settings of a study on ``target``: what comes from the target and the options, whatever is
        measured, plus ``measured`` (the steps, repeats, models or ops of the command that measures).
        ``in_process``: its workloads can run both modes in one process (``Workload.in_process``)."""
        return cls(
            **measured,
            pairing=target.pairing_for(options.pairing, in_process=in_process, compile=options.compile),
            shared_repeats=target.shared_repeats(options.shared_repeats),
            backend=target.backend,
            compile=options.compile,
            tracer=target.tracer.name,
            trace_api=target.tracer.trace_api,
            xla=bool(options.xla),
            gpu_label=target.device.label,
            seed=options.seed or 0,
            preset=target.preset,
            run_timeout_s=options.run_timeout,
        )

    def determinism(self, mode: Mode, knobs: tuple[str, ...] | None = None) -> DeterminismSettings:
        """What a run of ``mode`` switches (``determinism.apply``): its knobs, or (None) the mode's."""
        return DeterminismSettings(mode, self.seed, self.xla, self.backend, self.compile, knobs)

    def process_knobs(self, pair: Sequence[PlannedRun], on_gpu: bool) -> frozenset[str]:
        """What a process that runs ``pair``'s arms in turn starts with on the device (``Backend.process_knobs``)."""
        arms = [self.determinism(run.mode, run.knobs).knob_set() for run in pair]
        return backends.get(self.backend).process_knobs(arms, on_gpu)

    def apart_runs(self, runs: Sequence[PlannedRun]) -> tuple[list[PlannedRun], list[PlannedRun]]:
        """``runs`` as those that share a process with their pair's other arm, and those of the comparisons that
        take a process per arm (``apart``)."""
        apart = [run for run in runs if run.fields.get("comparison") in self.apart]
        return [run for run in runs if run.fields.get("comparison") not in self.apart], apart

    def in_process_sessions(self, pairs: Sequence[ModePair], on_gpu: bool) -> list[list[ModePair]]:
        """The pairs each in-process worker of this study measures in turn (``in_process_sessions``)."""
        starts_with = partial(self.process_knobs, on_gpu=on_gpu)
        return in_process_sessions(pairs, starts_with, shared_repeats=self.shared_repeats)


@dataclass(frozen=True)
class MeasurementTarget:
    device: DeviceChoice
    tracer: Tracer
    preset: str
    planned_gpu: bool = False
    backend: str = backends.DEFAULT
    """A dry run's GPU label forced on a machine without that GPU: planned as that GPU."""
    program: bool = False
    """A training program detprof did not write (``sweep --command``): run whole by ``program.run.ProgramLauncher``,
    one process at a time (detprof cannot step it), each run either traced or timed (``measured_parts``)."""

    @property
    def on_gpu(self) -> bool:
        return self.planned_gpu or (self.device.gpu is not None and not self.device.hide_gpus)

    @property
    def pairing(self) -> Pairing:
        """How a repeat pairs the modes in a process each."""
        steppable = not self.program and not self.tracer.wraps_process
        return "lockstep" if not self.on_gpu and steppable else "sequential"

    def applying(self, knobs: frozenset[str]) -> frozenset[str]:
        """Those of ``knobs`` that can matter on this device (``Knob.applies``: no cuDNN switch on a CPU)."""
        return backends.get(self.backend).applying(knobs, self.on_gpu)

    def pairing_for(self, asked: str | None, *, in_process: bool, compile: bool = False) -> Pairing:
        """``--pairing`` (``PAIRING_CHOICES``; None: auto) for a study whose workloads can share a process
        (``in_process``) or cannot: in one process where the backend and the workloads can, else ``pairing``.

        ``asked`` may be a configuration's own pairing, which ``check --run`` replays: one a process per mode stays
        one; one process was chosen because the target could, so it is again where this target can (a baseline of
        TensorFlow on a CPU, measured again on a GPU, takes a process per mode there)."""
        choice = {"in_process": "auto", "lockstep": "processes", "sequential": "processes"}.get(asked, asked)
        if choice not in (None, *PAIRING_CHOICES):
            raise UsageError(f"unknown --pairing {asked!r}; choose one of {', '.join(PAIRING_CHOICES)}")
        backend = backends.get(self.backend)
        why = (
            "a training program of your own runs whole, a process per mode"
            if self.program
            else None
            if in_process
            else "this study's workloads build one mode per process"
        )
        arms = [self.applying(backend.mode_knobs()), frozenset()]
        asked_for = choice == "in-process"
        why = why or backend.shared_process_refusal(arms, compile=compile, on_gpu=self.on_gpu, asked=asked_for)
        if choice == "in-process" and why is not None:
            raise UsageError(f"--pairing in-process: {why}; use --pairing processes")
        return "in_process" if why is None and choice != "processes" else self.pairing

    def shared_repeats(self, asked: bool) -> bool:
        """``--shared-repeats``, where the tracer leaves a process to run more than one pair."""
        if asked and self.tracer.wraps_process:
            raise UsageError(f"--shared-repeats: tracer {self.tracer.name} wraps a process, which traces one pair")
        return asked


def choose_target(options: RunOptions, presets: Sequence[str], *, dry_run: bool = False) -> MeasurementTarget:
    """The device (label checked), the tracer it allows, and the preset that fits it.

    A dry run plans a GPU label forced on a machine without that GPU as that GPU, and a
    tracer that is not installed as the one asked for: the plan then says so.
    """
    backend = chosen_backend(options)
    device = devices.choose_device(options.gpu, options.force, gpu_index=options.gpu_index)
    planned_gpu = dry_run and device.forced and device.gpu is None and device.label != CPU_LABEL
    on_gpu = planned_gpu or (device.gpu is not None and not device.hide_gpus)
    preset_name = options.preset or ("paper" if on_gpu else "cpu-small")
    if preset_name not in presets:
        raise UsageError(f"unknown preset {preset_name!r}; choose one of {', '.join(presets)}")
    apis = tuple(a.strip().lower() for a in (options.trace_api or "").split(",") if a.strip())
    chosen = resolve_tracer(options.tracer or "auto", on_gpu, apis, backend=backend, require_installed=not dry_run)
    if chosen.name == "nvprof" and not planned_gpu:
        refuse_nvprof(device.gpu)
    return MeasurementTarget(device, chosen, preset_name, planned_gpu, backend)


def chosen_backend(options: RunOptions) -> str:
    """The backend asked for, installed, and with a compiler switch it has (one line otherwise)."""
    backend = backends.require(options.backend)
    refusal = backends.compile_refusal(backend, bool(options.xla), options.compile)
    if refusal is not None:
        raise UsageError(refusal)
    return backend.name


def default_results_dir(device: DeviceChoice, backend: str = backends.DEFAULT) -> Path:
    """``results/<date>-<device>[-<backend>]``: the sweep, kernels and stability of one day, device and
    backend pair up."""
    return results_dir_of(device.label, backend)


def study_root(
    out: Path | None,
    device: DeviceChoice,
    backend: str,
    kind: str,
    config: dict[str, Any],
    subjects: Sequence[str],
) -> Path:
    """Where a study of ``kind`` and ``config`` goes: ``--out`` as given, else the day's folder for the device and
    backend, or a folder of this configuration's own in it (``store.place_for``)."""
    return out if out is not None else place_for(default_results_dir(device, backend), kind, config, subjects)


def results_dir_of(devices: str, backend: str) -> Path:
    """``results/<date>-<devices>[-<backend>]``; TensorFlow, the implied backend, adds no suffix."""
    suffix = "" if backend == backends.DEFAULT else f"-{backend}"
    return Path("results") / f"{dt.date.today().isoformat()}-{devices}{suffix}"


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
    knobs: tuple[str, ...] | None = None
    """The knobs the run sets (a knob study's arm); None: its mode's."""

    @property
    def traced(self) -> bool:
        return self.measures != "wall"

    def wall_steps(self, steps: int) -> int:
        """Untraced steps timed for wall time, of a study's ``steps``."""
        return 0 if self.measures == "kernel" else steps

    def traced_steps(self, steps: int) -> int:
        """Steps under the tracer, whose kernels are the run's kernel time."""
        return steps if self.traced else 0


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
    lockstep pairs the second came out slower, enough to push an A/A interval off 1.00.
    Counterbalanced, that order effect falls on both modes equally and lands in the interval
    as spread between repeats instead of as a bias. The same holds for runs one after the other.
    """
    return RUN_ORDER if repeat % 2 == 0 else RUN_ORDER[::-1]


def interleaved(units: Sequence[Unit], repeats: int, *, first: int = 0) -> list[tuple[int, Unit, Mode]]:
    """Repeat by repeat (``repeats`` of them from ``first``), unit by unit, the two modes back to back in
    ``mode_order`` (D, N, ..., N, D, ...)."""
    return [
        (repeat, unit, mode)
        for repeat in range(first, first + repeats)
        for unit in units
        for mode in mode_order(repeat)
    ]


ModePair = tuple[PlannedRun, PlannedRun]


def arm_of(run: PlannedRun) -> str:
    """The run's side of its pair, as its steps are named where both sides share a process: its arm (a
    calibration's or a knob comparison's) or its mode."""
    return str(run.fields.get("arm") or run.mode)


def mode_pairs(plan: Sequence[PlannedRun]) -> list[ModePair]:
    """The plan's runs two by two: the two modes (or arms) of one unit and repeat."""
    return [(plan[i], plan[i + 1]) for i in range(0, len(plan) - 1, 2)]


def lockstep_sessions(pairs: Sequence[ModePair]) -> list[list[ModePair]]:
    """The pairs of each repeat whose sides run under the same settings, which one pair of workers measures in
    turn (a worker's determinism is set once: a knob study's arms each need their own)."""

    def session(pair: ModePair) -> tuple[Any, ...]:
        return (pair[0].repeat, *((run.mode, run.knobs) for run in pair))

    return [list(group) for _key, group in itertools.groupby(pairs, key=session)]


def in_process_sessions(
    pairs: Sequence[ModePair], starts_with: Callable[[ModePair], frozenset[str]], *, shared_repeats: bool = False
) -> list[list[ModePair]]:
    """The pairs that one worker measures in turn, each arm's step setting its own knobs (``Backend.arm_steps``):
    those of a repeat whose process starts with the same knobs (``starts_with``: the knobs only a fresh process
    takes, ``RunSettings.process_knobs``), whatever else their arms set, so that a knob study's comparisons share
    a process as a sweep's models do. ``shared_repeats`` (``--shared-repeats``): every repeat, each model's (each
    comparison's) repeats one after the other, so that a repeat re-runs the arms the one before it built."""
    sessions: dict[tuple[Any, ...], list[ModePair]] = {}
    for pair in pairs:
        starts = tuple(sorted(starts_with(pair)))
        sessions.setdefault(starts if shared_repeats else (pair[0].repeat, starts), []).append(pair)
    if not shared_repeats:
        return list(sessions.values())

    def unit(pair: ModePair) -> str:
        arms = sorted((arm_of(run), run.knobs or ()) for run in pair)
        return repr((pair[0].workload, arms, pair[0].fields.get("comparison")))

    def by_unit(session: list[ModePair]) -> list[ModePair]:
        first: dict[str, int] = {}
        for pair in session:
            first.setdefault(unit(pair), len(first))
        return sorted(session, key=lambda pair: first[unit(pair)])

    return [by_unit(session) for session in sessions.values()]


def session_cores(index: int) -> list[int]:
    """The cores the ``index``-th session's workers may be pinned to, in the order preferred: the usable cores in
    turn, from the ``index``-th (a core another detprof claimed is passed over: ``locks.claimed_core``)."""
    cores = sorted(usable_core_ids())
    start = index % len(cores)
    return cores[start:] + cores[:start]
