"""``detprof sweep``: options, the run, the final table, and what the embedded default adds.

With no options on a machine without a GPU the sweep is the embedded default: the
``cpu-small`` preset with TensorFlow's profiler as tracer, results labelled ``cpu``.
Options given explicitly always win over the preset's values. ``run_sweep`` is what the
command does once its options are read; ``detprof check --run`` calls it too.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from detprof.console import print_table, table_console
from detprof.errors import UsageError
from detprof.formatting import floor, ratio
from detprof.invocation import command_line
from detprof.models.own import is_own
from detprof.options import FLEET, MEASURED_STUDY, MODEL_INPUTS, ModelsOption, RunOptions, with_run_options
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.plan import default_results_dir
from detprof.profiler.study import measure
from detprof.store import ResultsStore
from detprof.sweep.plan import SweepRequest, plan_runs, split_models
from detprof.sweep.presets import PRESETS, STABILITY_MODELS

if TYPE_CHECKING:
    from detprof.profiler.program.plan import ProgramRequest

HELP = "Run each model in default and deterministic mode; report the overhead."
FAILURE_NOTE_CHARS = 160
ProgramOption = Annotated[
    str | None,
    typer.Option(
        "--command",
        help="Instead of models, sweep any training program: its command line (split like a shell's, never run "
        "through one), run once per mode and repeat; mark its steps with detprof.measure()/step(). Needs --name.",
    ),
]
NameOption = Annotated[str | None, typer.Option(help="--command: the name its results go under, as a model's.")]
PROGRAM_OPTIONS = frozenset(
    ("backend", "gpu", "gpus", "gpu_index", "force", "tracer", "trace_api", "repeats", "out", "resume", "run_timeout")
)
"""The shared options that apply to a program (``--command``); it decides its own steps, data and model."""


@with_run_options(*MEASURED_STUDY, *MODEL_INPUTS, *FLEET)
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
    dry_run: Annotated[
        bool,
        typer.Option(
            help="Print the plan (each run's worker and tracer command line, the environment detprof sets) "
            "and exit without running it; works with --force and a tracer that is not installed."
        ),
    ] = False,
    program: ProgramOption = None,
    name: NameOption = None,
) -> None:
    """Run each model in default and deterministic mode and report what determinism costs."""
    if name is not None and program is None:
        raise UsageError("--name names the program of --command: give both, or neither for models")
    if program is not None:
        from detprof.profiler.program.plan import ProgramRequest

        asked = {"--models": models is not None, "--stability": stability, "--calibrate": calibrate}
        refuse_for_programs(options, [flag for flag, given in (asked | {"--dry-run": dry_run}).items() if given])
        run_program_sweep(ProgramRequest(program, name, options), report=report)
        return
    request = SweepRequest(split_models(models), options)
    if dry_run:
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
    out = request.options.out or default_results_dir(target.device, target.backend)
    kind = "calibration" if calibrate else "sweep"
    lines = plan_lines(kind, plan_runs(config, calibrate=calibrate), config, target, out)
    if stability:
        lines += ["", f"Then the stability study of each swept model that can learn it, into {out / 'stability'}."]
    typer.echo("\n".join(lines))


def _refuse_calibrated_stability(calibrate: bool, stability: bool) -> None:
    if calibrate and stability:
        raise UsageError("--calibrate measures the noise floor only: run --stability with the sweep itself")


def run_sweep(request: SweepRequest, *, stability: bool = False, report: bool = True, calibrate: bool = False) -> Path:
    """Measure, print the per-model table, then the stability studies and the report; returns the results folder."""
    if request.options.ray is not None:
        return run_fleet_sweep(request, stability=stability, report=report, calibrate=calibrate)
    config, target = request.resolve()
    out = request.options.out or default_results_dir(target.device, target.backend)
    resume = request.options.resume
    console = Console(stderr=True)
    _refuse_calibrated_stability(calibrate, stability)
    store = measure(
        "calibration" if calibrate else "sweep",
        plan_runs(config, calibrate=calibrate),
        config,
        config.manifest(),
        target,
        out,
        what=f"{len(config.models)} model{'' if len(config.models) == 1 else 's'}",
        resume=resume,
        command=command_line(),
        console=console,
    )
    if calibrate:
        print_noise_floor(store)
    else:
        print_summary(store)
    console.print(f"results: {escape(str(store.dir))}")
    if stability:
        studied = STABILITY_MODELS.get(target.preset)
        registry_models = tuple(m for m in config.models if not is_own(m))
        models = registry_models if studied is None else tuple(m for m in registry_models if m in studied)
        skipped = [m for m in config.models if m not in models]
        if skipped:
            console.print(
                f"stability: studying {', '.join(models) or 'no model'}; {', '.join(skipped)} cannot learn the "
                f"embedded digits study in its budget (preset {target.preset}): run `detprof stability --model "
                "NAME --dataset ...` for them"
            )
        run_stability_studies(models, out, target.device, backend=target.backend, resume=resume, console=console)
    if report:
        from detprof.reports.command import write_report

        console.print(f"report: {escape(str(write_report(out, out / 'report.html')))}")
    return out


def refuse_for_programs(options: RunOptions, flags: list[str]) -> None:
    """One line naming every option given that a program (``--command``) cannot take."""
    given = [
        f"--{field.name.replace('_', '-')}"
        for field in fields(options)
        if field.name not in PROGRAM_OPTIONS and getattr(options, field.name) not in (None, False, ())
    ]
    if flags or given:
        raise UsageError(
            f"{', '.join([*flags, *given])}: not with --command, which runs a program as it is (it decides its "
            "own model, data and steps; see README, 'Any training program')"
        )


def run_program_sweep(request: ProgramRequest, *, report: bool) -> Path:
    """A training program (``--command``) measured as a model named ``--name``: the same table, store and report."""
    from detprof.profiler.program.plan import plan_program_runs

    settings, target = request.resolve(list(PRESETS))
    out = request.options.out or default_results_dir(target.device, target.backend)
    console = Console(stderr=True)
    store = measure(
        "sweep",
        plan_program_runs(settings),
        settings,
        settings.manifest(),
        target,
        out,
        what=f"program {settings.name}",
        resume=request.options.resume,
        command=command_line(),
        console=console,
    )
    print_summary(store)
    console.print(f"results: {escape(str(store.dir))}")
    if report:
        from detprof.reports.command import write_report

        console.print(f"report: {escape(str(write_report(out, out / 'report.html')))}")
    return out


def run_fleet_sweep(request: SweepRequest, *, stability: bool, report: bool, calibrate: bool) -> Path:
    """The sweep across GPU types on a Ray cluster (``--ray``): one study per type in ``OUT/<label>``, one report.

    Every option is checked here first, as a dry run of each type would check it, so that a
    mistake is one line before anything connects; each type's nodes then resolve the rest.
    """
    from functools import partial

    from detprof.fleet.study import FleetOptions, measure_on_fleet, print_lost

    if stability:
        raise UsageError("--stability runs on one machine; on a fleet, run `detprof stability --ray` beside the sweep")
    fleet = FleetOptions.of(request.options)
    requests = {
        label: SweepRequest(request.models, fleet.label_options(request.options, label)) for label in fleet.labels
    }
    for labelled in requests.values():
        SweepRequest(labelled.models, replace(labelled.options, force=True)).resolve(dry_run=True)
    out = request.options.out or fleet.results_dir()
    console = Console(stderr=True)
    models = requests[fleet.labels[0]].models
    what = "each model" if models is None else f"{len(models)} model{'' if len(models) == 1 else 's'}"
    outcome = measure_on_fleet(
        "calibration" if calibrate else "sweep",
        {label: labelled.resolve for label, labelled in requests.items()},
        partial(plan_runs, calibrate=calibrate),
        fleet,
        out,
        what=f"{what} on {', '.join(fleet.labels)}",
        command=command_line(),
        console=console,
    )
    print_lost(console, outcome.lost)
    for label, study in outcome.studies.items():
        table_console().print(f"[bold]{escape(label)}[/] ({escape(str(study.store.dir))})")
        (print_noise_floor if calibrate else print_summary)(study.store)
    console.print(f"results: {escape(str(out))}")
    if report:
        from detprof.reports.command import write_report

        console.print(f"report: {escape(str(write_report(out, out / 'report.html')))}")
    return out


def print_noise_floor(store: ResultsStore) -> None:
    """The A/A ratios (deterministic against itself, 95% CI over repeats) and what they mean."""
    from detprof.profiler.overhead import model_overheads, noise_floors

    records = list(store.records())
    floors = noise_floors(records)
    table = Table(title="Noise floor: deterministic against itself (A/A, 95% CI over repeats; true ratio 1)")
    for col in ("Model", "Kernel time", "Wall time", "Smallest resolvable overhead"):
        table.add_column(col, overflow="fold")
    for model, overhead in model_overheads(records).items():
        table.add_row(model, ratio(overhead.kernel), ratio(overhead.wall), floor(floors.get(model)))
    print_table(table_console(), table)


def run_stability_studies(
    models: tuple[str, ...], out: Path, device: DeviceChoice, *, backend: str, resume: bool, console: Console
) -> None:
    """The stability side for the report's overhead-versus-variance pairing, one study per model.

    The embedded default study's size (5 runs per variant on the bundled digits data, the
    default epochs) for every swept model: it must fit in the embedded default's time;
    ``detprof stability --runs 10`` runs the full protocol.
    """
    from detprof.stability import study

    for model in models:
        config = study.StudyConfig(model=model, runs=study.EMBEDDED_RUNS, backend=backend)
        outcome = study.run_study(
            config,
            out / "stability" / model,
            jobs=study.default_jobs(device),
            resume=resume,
            device=device,
            command=command_line(),
            console=console,
        )
        console.print(f"stability of {model}: {escape(str(outcome.summary_path))}")


def print_summary(store: ResultsStore) -> None:
    """The closing table: overheads and the report's verdict, then the report's attribution, word for word.

    The verdict (``reports.verdict``) and the sentence on where the added time went
    (``reports.attribution``) are the ones the report prints, from the same per-step kernel
    diff, so the console and the report cannot name different kernels or numbers. The
    sentences follow the table, one per model, where a terminal has the width to show them.
    """
    from detprof.intervals import headline
    from detprof.profiler.study_results import summarize
    from detprof.reports.attribution import attribution
    from detprof.reports.verdict import verdict

    summaries = summarize(store)
    notes = {s.model: s.overhead.failure_note() for s in summaries}
    table = Table(title="Overhead of determinism (deterministic / default, 95% CI over repeats)")
    table.add_column("Model", no_wrap=True)
    for col in ("Kernel time", "Wall time", "Verdict"):
        table.add_column(col, overflow="fold")
    if any(notes.values()):
        table.add_column("Failed runs", overflow="fold")
    sentences = []
    for summary in summaries:
        overhead = summary.overhead
        metric, measured = headline(overhead.kernel, overhead.wall)
        read = verdict(measured)
        verdict_text = read.text if read.reading is None else f"{read.text} ({metric} time)"
        row = [summary.model, ratio(overhead.kernel), ratio(overhead.wall), escape(verdict_text)]
        if any(notes.values()):
            note = notes[summary.model]
            row.append("-" if note is None else escape(note[:FAILURE_NOTE_CHARS]))
        table.add_row(*row)
        if summary.kernel_diff is not None:
            sentences.append(f"  {escape(summary.model)}: {escape(attribution(summary.kernel_diff).sentence)}")
    console = table_console()
    print_table(console, table)
    if sentences:
        console.print("Where the added time went:")
        for line in sentences:
            console.print(line)
