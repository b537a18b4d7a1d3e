"""``detprof sweep``: its options, and what it prints; the sweep itself is ``sweep.run``'s.

With no options on a machine without a GPU the sweep is the embedded default: the
``cpu-small`` preset with the framework's own profiler as tracer, results labelled ``cpu``.
Options given explicitly always win over the preset's values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from detprof.console import status_console
from detprof.errors import UsageError
from detprof.models.plans import split_models
from detprof.options import (
    FLEET,
    MEASURED_STUDY,
    MODEL_INPUTS,
    TIME_TO_ANSWER,
    ModelsOption,
    RunOptions,
    with_run_options,
)
from detprof.profiler.measured_runs import study_root
from detprof.profiler.program.request import refuse_for_programs
from detprof.profiler.sweep_request import SweepRequest
from detprof.sweep.knobs import split_knobs
from detprof.sweep.render import print_outcome
from detprof.sweep.run import (
    check_arms,
    checks_in_processes,
    knob_check_steps,
    measure_knobs,
    measure_program,
    measure_sweep,
    refuse_knobs_that_cannot_matter,
    study_stability,
)
from detprof.sweep.sweep_runs import plan_runs

ProgramOption = Annotated[
    str | None,
    typer.Option(
        "--command",
        help="Instead of models, sweep any training program: its command line (split like a shell's, never run "
        "through one), run once per mode and repeat; mark its steps with detprof.measure()/step(). Needs --name.",
    ),
]
NameOption = Annotated[str | None, typer.Option(help="--command: the name its results go under, as a model's.")]
KnobsOption = Annotated[
    str | None,
    typer.Option(
        "--knobs",
        help="Instead of the sweep, price each determinism switch into OUT/knobs: added to the default alone, and "
        "left out of full determinism (then verified bitwise). Alone (or 'all'): every knob; or KNOB,... (see "
        "`detprof knobs`).",
    ),
]


@with_run_options(*MEASURED_STUDY, *TIME_TO_ANSWER, *MODEL_INPUTS, *FLEET)
def sweep(
    options: RunOptions,
    models: ModelsOption = None,
    stability: Annotated[
        bool,
        typer.Option(
            help="Also run a small stability study (digits, 4 variants) of each swept model that can learn it "
            "(cpu-small: smallcnn)."
        ),
    ] = False,
    report: Annotated[bool, typer.Option(help="Write report.html into the results directory at the end.")] = True,
    calibrate: Annotated[
        bool,
        typer.Option(
            help="Instead of the sweep, run deterministic mode against itself (an A/A test) into OUT/calibration: "
            "this machine's noise floor, the smallest overhead it can resolve, which the report and check show."
        ),
    ] = False,
    program: ProgramOption = None,
    name: NameOption = None,
    knobs: KnobsOption = None,
) -> None:
    """Run each model in default and deterministic mode and report what determinism costs."""
    if name is not None and program is None:
        raise UsageError("--name names the program of --command: give both, or neither for models")
    if program is not None:
        from detprof.profiler.program.request import ProgramRequest

        asked = {
            "--models": models is not None,
            "--stability": stability,
            "--calibrate": calibrate,
            "--knobs": knobs is not None,
        }
        refuse_for_programs(options, [flag for flag, given in asked.items() if given])
        console = status_console()
        outcome = measure_program(ProgramRequest(program, name, options), console=console)
        print_outcome(outcome, console)
        if report:
            _write_report(outcome.out, console)
        return
    request = SweepRequest(split_models(models), options)
    if knobs is not None:
        asked = {"--stability": stability, "--calibrate": calibrate, "--ray": options.ray is not None}
        refused = [flag for flag, given in asked.items() if given]
        if refused:
            raise UsageError(f"--knobs is a study of its own: not with {', '.join(refused)}")
        if options.dry_run:
            print_knob_plan(request, split_knobs(knobs))
            return
        run_knob_study(request, split_knobs(knobs), report=report)
        return
    if options.dry_run:
        if options.ray is not None:
            raise UsageError("--dry-run prints one machine's plan: leave out --ray (a fleet runs the same plan)")
        print_sweep_plan(request, stability=stability, calibrate=calibrate)
        return
    run_sweep(request, stability=stability, report=report, calibrate=calibrate)


def print_sweep_plan(request: SweepRequest, *, stability: bool, calibrate: bool) -> None:
    """What ``run_sweep`` would measure, as ``profiler.dry_run`` prints it."""
    from detprof.profiler.dry_run import plan_lines

    _refuse_calibrated_stability(calibrate, stability)
    config, target = request.resolve(dry_run=True)
    kind = "calibration" if calibrate else "sweep"
    out = study_root(request.options.out, target.device, target.backend, kind, config.manifest(), config.labels())
    lines = [*config.model_warnings(), *plan_lines(kind, plan_runs(config, calibrate=calibrate), config, target, out)]
    if stability:
        lines += ["", f"Then the stability study of each swept model that can learn it, into {out / 'stability'}."]
    typer.echo("\n".join(lines))


def _refuse_calibrated_stability(calibrate: bool, stability: bool) -> None:
    if calibrate and stability:
        raise UsageError("--calibrate measures the noise floor only: run --stability with the sweep itself")


def run_sweep(request: SweepRequest, *, stability: bool = False, report: bool = True, calibrate: bool = False) -> None:
    """Measure, print each study's table, then the stability studies and the report."""
    _refuse_calibrated_stability(calibrate, stability)
    if stability and request.options.ray is not None:
        raise UsageError("--stability runs on one machine; on a fleet, run `detprof stability --ray` beside the sweep")
    console = status_console()
    outcome = measure_sweep(request, calibrate=calibrate, console=console)
    print_outcome(outcome, console)
    if stability:
        study_stability(outcome, console=console)
    if report:
        _write_report(outcome.out, console)


def print_knob_plan(request: SweepRequest, only: tuple[str, ...] | None) -> None:
    """What ``run_knob_study`` would measure and verify."""
    from detprof import backends
    from detprof.analysis.knobs import by_reason
    from detprof.profiler.dry_run import plan_lines
    from detprof.sweep.knobs import knob_design, knob_settings, knobs_manifest, plan_knob_runs

    config, target = request.resolve(dry_run=True)
    plan = knob_design(backends.get(target.backend), target.on_gpu, only, config.models, config.compile)
    config = knob_settings(config, target, plan)
    refuse_knobs_that_cannot_matter(plan, target)
    manifest = knobs_manifest(config, plan)
    out = study_root(request.options.out, target.device, target.backend, "knobs", manifest, config.labels())
    lines = [*config.model_warnings(), *plan_lines("knobs", plan_knob_runs(config, plan), config, target, out)]
    lines += ["", f"Comparisons (arm b against arm a): {', '.join(c.name for c in plan.comparisons)}"]
    lines += [f"Not run: {', '.join(names)}: {reason}" for reason, names in by_reason(plan.not_applicable).items()]
    without = f", and without {', '.join(plan.dropped())}" if plan.dropped() else ""
    lines += [
        f"Then verified bitwise ({knob_check_steps(config)} steps, two runs each): full determinism{without}, into "
        f"{out / 'knobs' / 'knob_checks'} "
        f"{checks_in_processes(check_arms(plan), config, target)}."
    ]
    typer.echo("\n".join(lines))


def run_knob_study(request: SweepRequest, only: tuple[str, ...] | None, *, report: bool) -> None:
    console = status_console()
    outcome = measure_knobs(request, only, console=console)
    print_outcome(outcome, console)
    if report:
        _write_report(outcome.out, console)


def _write_report(out: Path, console: Console) -> None:
    from detprof.reports.command import write_report

    console.print(f"report: {escape(str(write_report(out, out / 'report.html')))}")
