"""``detprof sweep``: options, the run, the final table, and what the embedded default adds.

With no options on a machine without a GPU the sweep is the embedded default: the
``cpu-small`` preset with TensorFlow's profiler as tracer, results labelled ``cpu``.
Options given explicitly always win over the preset's values. ``run_sweep`` is what the
command does once its options are read; ``detprof check --run`` calls it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from detprof.errors import UsageError
from detprof.formatting import ratio
from detprof.invocation import command_line
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.options import MEASURED_STUDY, ModelsOption, RunOptions, with_run_options
from detprof.profiler.study import default_results_dir, measure
from detprof.store import ResultsStore
from detprof.sweep.plan import SweepRequest, plan_runs, split_models
from detprof.sweep.presets import STABILITY_MODELS

HELP = "Run each model in default and deterministic mode; report the overhead."
FAILURE_NOTE_CHARS = 160


@with_run_options(*MEASURED_STUDY)
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
) -> None:
    """Run each model in default and deterministic mode and report what determinism costs."""
    request = SweepRequest(split_models(models), options)
    if dry_run:
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
        models = config.models if studied is None else tuple(m for m in config.models if m in studied)
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


def print_noise_floor(store: ResultsStore) -> None:
    """The A/A ratios (deterministic against itself, 95% CI over repeats) and what they mean."""
    from detprof.profiler.overhead import model_overheads, noise_floors

    records = list(store.records())
    floors = noise_floors(records)
    table = Table(title="Noise floor: deterministic against itself (A/A, 95% CI over repeats; true ratio 1)")
    for col in ("Model", "Kernel time", "Wall time", "Smallest resolvable overhead"):
        table.add_column(col, overflow="fold")
    for model, overhead in model_overheads(records).items():
        floor = floors.get(model)
        table.add_row(
            model,
            ratio(overhead.kernel),
            ratio(overhead.wall),
            "-" if floor is None else f"+/-{floor:.1%}",
        )
    Console().print(table)


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
    console = Console()
    console.print(table)
    if sentences:
        console.print("Where the added time went:")
        for line in sentences:
            console.print(line)
