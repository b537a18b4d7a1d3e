"""The sweep as the core runs it, for ``detprof sweep`` and ``detprof check --run`` alike: requests in, outcomes out.

``measure_sweep`` measures a request's models (on this machine, or per GPU type on a Ray
fleet), ``measure_program`` a training program, ``study_stability`` adds the stability side
of the swept models; each returns what it wrote and prints only its progress. The command
(``sweep.command``) prints the tables and writes the report.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from detprof import locks
from detprof.errors import UsageError
from detprof.invocation import Invocation, command_line
from detprof.options import RunOptions
from detprof.profiler.measured_runs import MeasurementTarget, study_root
from detprof.profiler.presets import PRESETS, STABILITY_MODELS, STABILITY_RUNS
from detprof.profiler.study import MeasuredStudy, measure
from detprof.profiler.sweep_request import SweepConfig, SweepRequest
from detprof.store import ResultsStore, StudyKind
from detprof.sweep.sweep_runs import plan_repeat, plan_runs

if TYPE_CHECKING:
    from detprof.profiler.devices import DeviceChoice
    from detprof.profiler.program.request import ProgramRequest
    from detprof.sweep.knobs import KnobDesign
    from detprof.verify.run import VerifyArm


@dataclass(frozen=True)
class SweepOutcome:
    """What a sweep wrote: its results folder and, per device label, the study measured there."""

    out: Path
    kind: StudyKind
    studies: dict[str, ResultsStore]
    models: tuple[str, ...] = ()
    """The models swept (none for a program)."""
    registry_models: tuple[str, ...] = ()
    """Those of ``models`` that detprof's registry builds: what ``--stability`` can train on its embedded data."""
    preset: str | None = None
    device: DeviceChoice | None = None
    """The device measured on this machine; None on a fleet."""
    backend: str | None = None
    resume: bool = False

    @property
    def fleet(self) -> bool:
        return self.device is None


def measure_sweep(request: SweepRequest, *, calibrate: bool = False, console: Console) -> SweepOutcome:
    """The models of ``request`` in both modes (or, ``calibrate``, deterministic against itself)."""
    kind: StudyKind = "calibration" if calibrate else "sweep"
    if request.options.ray is not None:
        if request.options.precision is not None or request.options.budget is not None:
            raise UsageError("--precision and --budget add repeats on this machine; on a fleet give --repeats")
        return _measure_on_fleet(request, kind, console)
    config, target = request.resolve()
    config.say_before(console)
    manifest = config.manifest()
    out = study_root(request.options.out, target.device, target.backend, kind, manifest, config.labels())
    plan = plan_runs(config, calibrate=calibrate)
    extend = partial(plan_repeat, config, calibrate=calibrate)
    study = MeasuredStudy(kind, plan, config, manifest, target, out, _given(request.options), extend)
    store = measure(study, what=_models_text(config.models), console=console)
    return _outcome(out, kind, store, config, target, request.options)


def refuse_knobs_that_cannot_matter(plan: KnobDesign, target: MeasurementTarget) -> None:
    """One line where no knob studied can matter on the device: the study would only compare full determinism with
    none, which the sweep does (the knob study's dry run says so too)."""
    if len(plan.comparisons) > 1 or plan.helpers:
        return
    from detprof.analysis.knobs import by_reason

    reasons = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in by_reason(plan.not_applicable).items())
    raise UsageError(f"no knob of {target.backend} studied can matter on {target.device.label} ({reasons})")


def measure_knobs(request: SweepRequest, only: tuple[str, ...] | None, *, console: Console) -> SweepOutcome:
    """Each knob's arms measured (``sweep.knobs``), then full determinism and every arm without one knob verified
    bitwise into the study's ``knob_checks``."""
    from detprof import backends
    from detprof.sweep.knobs import knob_design, knob_settings, knobs_manifest, plan_knob_runs
    from detprof.verify.run import manifest, run_arms

    config, target = request.resolve()
    config.say_before(console)
    plan = knob_design(backends.get(target.backend), target.on_gpu, only, config.models, config.compile)
    config = knob_settings(config, target, plan)
    refuse_knobs_that_cannot_matter(plan, target)
    manifest_of_knobs = knobs_manifest(config, plan)
    out = study_root(request.options.out, target.device, target.backend, "knobs", manifest_of_knobs, config.labels())
    device = (target.device.lock_key, target.device.label)
    with locks.holding(out / "knobs", device, wait=request.options.wait):
        names = [c.name for c in plan.comparisons]
        what = f"{_models_text(config.models)} x {len(names)} comparisons ({', '.join(names)})"
        runs = plan_knob_runs(config, plan)
        study = MeasuredStudy("knobs", runs, config, manifest_of_knobs, target, out, _given(request.options))
        store = measure(study, what=what, console=console)
        checks, steps = ResultsStore(store.dir, "knob_checks"), knob_check_steps(config)
        checks.open(manifest(config, target, steps, False) | {"without": plan.dropped()}, command_line(), resume=True)
        arms = check_arms(plan)
        console.print(
            f"detprof knobs: full determinism and {len(arms) - 1} other arm(s), verified bitwise "
            f"{checks_in_processes(arms, config, target)}"
        )
        run_arms(checks, config, target, arms, steps, False, console=console)
    return _outcome(out, "knobs", store, config, target, request.options)


def check_arms(plan: KnobDesign) -> list[VerifyArm]:
    """What a knob study verifies bitwise: full determinism, every switch on (where the study has more than full
    determinism), each of them without each knob it drops, and each helper priced by a comparison of its own."""
    from detprof.backends.base import HELPER_COMPARISON
    from detprof.sweep.knobs import EVERY
    from detprof.verify.run import VerifyArm

    without = [(knob, tuple(sorted(plan.left_out_of - {knob}))) for knob in plan.dropped()]
    helpers = [c for c in plan.comparisons if c.name.startswith(HELPER_COMPARISON)]
    every = [VerifyArm(EVERY, "deterministic", tuple(sorted(plan.every)), every=True)] if plan.every else []
    return [
        VerifyArm("deterministic", "deterministic"),
        *every,
        *(VerifyArm(f"without-{knob}", "deterministic", knobs, knob) for knob, knobs in without),
        *(
            VerifyArm(c.slug, "deterministic", c.knobs("b"), helper=c.name.removeprefix(HELPER_COMPARISON))
            for c in helpers
        ),
    ]


def checks_in_processes(arms: list[VerifyArm], config: SweepConfig, target: MeasurementTarget) -> str:
    """How many processes each replica of the checks takes (``verify.run.arm_groups``), as the console says it."""
    from detprof.verify.run import arm_groups

    groups = len(arm_groups(arms, config, target))
    return "(each replica's runs in one process)" if groups == 1 else f"(each replica's runs in {groups} processes)"


def knob_check_steps(config: SweepConfig) -> int:
    """The steps each bitwise check of a knob study trains: as many as its arms measured, up to ``verify``'s default.

    Every step runs the same kernels, so a study measured over a few steps (a quick look, ``gpu-study``'s tiny
    scale) is checked over as few; the cap keeps the paper's 100 measured steps from making each check five times
    ``verify``'s, though more steps would give a rare race more chances to show."""
    from detprof.verify.run import DEFAULT_STEPS

    return min(config.steps, DEFAULT_STEPS)


def _outcome(
    out: Path,
    kind: StudyKind,
    store: ResultsStore,
    config: SweepConfig,
    target: MeasurementTarget,
    options: RunOptions,
) -> SweepOutcome:
    """What a study of models measured on this machine wrote."""
    # Without plans, every model is a registry model built at its defaults (``SweepConfig.plans``).
    registry_models = tuple(p.given for p in config.plans if p.own_model is None) if config.plans else config.models
    return SweepOutcome(
        out,
        kind,
        {target.device.label: store},
        config.models,
        registry_models,
        target.preset,
        target.device,
        target.backend,
        options.resume,
    )


def _given(options: RunOptions) -> Invocation:
    return Invocation.of(options.resume, options.wait)


def _models_text(models: tuple[str, ...] | None) -> str:
    return "each model" if models is None else f"{len(models)} model{'' if len(models) == 1 else 's'}"


def _measure_on_fleet(request: SweepRequest, kind: StudyKind, console: Console) -> SweepOutcome:
    """Each GPU type's study in ``OUT/<label>`` on a Ray cluster (``--ray``).

    Every option is checked here first, as a dry run of each type would check it, so that a
    mistake is one line before anything connects; each type's nodes then resolve the rest.
    """
    from detprof.fleet.study import FleetOptions, FleetStudy, measure_on_fleet, print_lost

    fleet = FleetOptions.of(request.options)
    requests = {
        label: SweepRequest(request.models, fleet.label_options(request.options, label)) for label in fleet.labels
    }
    for labelled in requests.values():
        SweepRequest(labelled.models, replace(labelled.options, force=True)).resolve(dry_run=True)
    out = request.options.out or fleet.results_dir()
    study = FleetStudy(
        kind,
        {label: labelled.resolve for label, labelled in requests.items()},
        partial(plan_runs, calibrate=kind == "calibration"),
        fleet,
        out,
        what=f"{_models_text(requests[fleet.labels[0]].models)} on {', '.join(fleet.labels)}",
        command=command_line(),
    )
    fleet_outcome = measure_on_fleet(study, console=console)
    print_lost(console, fleet_outcome.lost)
    return SweepOutcome(out, kind, {label: study.store for label, study in fleet_outcome.studies.items()})


def measure_program(request: ProgramRequest, *, console: Console) -> SweepOutcome:
    """A training program (``--command``) measured as a model named ``--name``: the same store and tables."""
    from detprof.profiler.program.request import plan_program_runs

    settings, target = request.resolve(list(PRESETS))
    manifest = settings.manifest()
    out = study_root(request.options.out, target.device, target.backend, "sweep", manifest, [settings.name])
    what = f"program {settings.name}"
    runs, given = plan_program_runs(settings), _given(request.options)
    study = MeasuredStudy("sweep", runs, settings, manifest, target, out, given)
    store = measure(study, what=what, console=console)
    return SweepOutcome(out, "sweep", {target.device.label: store}, device=target.device, backend=target.backend)


def _left_out(outcome: SweepOutcome, skipped: list[str]) -> str:
    """Why the sweep studies none of ``skipped`` (a model of one's own, whose data and budget the preset cannot know;
    a registry model that cannot learn its embedded study in the preset's budget), and the command that studies each."""
    from detprof.reports.headline import suggested

    own = [m for m in skipped if m not in outcome.registry_models]
    slow = [m for m in skipped if m in outcome.registry_models]
    reasons = []
    if own:
        what = "is a model" if len(own) == 1 else "are models"
        reasons.append(f"{', '.join(own)} {what} of your own, which the sweep does not study")
    if slow:
        whose = "its" if len(slow) == 1 else "their"
        budget = f"in the budget of preset {outcome.preset}"
        reasons.append(f"{', '.join(slow)} cannot learn {whose} embedded study {budget}")
    studies = ", ".join(suggested("stability", [model], outcome.backend) for model in skipped)
    return f"{'; '.join(reasons)}: {studies} {'studies it' if len(skipped) == 1 else 'study them'}"


def study_stability(outcome: SweepOutcome, *, console: Console) -> list[Path]:
    """The stability side for the report's overhead-versus-variance pairing, one study per swept model that can
    learn its embedded study in its budget; returns each study's summary.

    The preset's study size (``STABILITY_RUNS`` per variant on the built-in data the model takes: digits, or the
    Markov language for a model of tokens; that data's default epochs) for every swept model: it must fit in the
    embedded default's time;
    ``detprof stability --runs 10`` runs the full protocol.
    """
    from detprof.stability import study

    assert outcome.device is not None and outcome.backend is not None, "the command refuses --stability on a fleet"
    studied = STABILITY_MODELS.get(outcome.preset or "")
    registry_models = outcome.registry_models
    models = registry_models if studied is None else tuple(m for m in registry_models if m in studied)
    skipped = [m for m in outcome.models if m not in models]
    if skipped:
        console.print(f"stability: studying {', '.join(models) or 'no model'}; {escape(_left_out(outcome, skipped))}")
    summaries = []
    for model in models:
        runs = STABILITY_RUNS.get(outcome.preset or "", study.EMBEDDED_RUNS)
        dataset = study.default_dataset(model)
        config = study.StudyConfig(
            model=model, dataset=dataset, runs=runs, epochs=study.default_epochs(dataset), backend=outcome.backend
        )
        workers = study.Workers(outcome.device, study.default_jobs(outcome.device))
        given = Invocation(command_line(), outcome.resume)
        result = study.run_study(config, outcome.out / "stability" / model, given, workers, console)
        console.print(f"stability of {model}: {escape(str(result.summary_path))}")
        summaries.append(result.summary_path)
    return summaries
