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

from detprof.formatting import ratio, signed_ns
from detprof.invocation import command_line
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.options import MEASURED_STUDY, ModelsOption, RunOptions, with_run_options
from detprof.profiler.study import default_results_dir, measure
from detprof.store import ResultsStore
from detprof.sweep.plan import SweepRequest, plan_runs, split_models

HELP = "Run each model in default and deterministic mode; report the overhead."
FAILURE_NOTE_CHARS = 160


@with_run_options(*MEASURED_STUDY)
def sweep(
    options: RunOptions,
    models: ModelsOption = None,
    stability: Annotated[
        bool, typer.Option(help="Also run a small stability study of each swept model (digits, 4 variants).")
    ] = False,
    report: Annotated[bool, typer.Option(help="Write report.html into the results directory at the end.")] = True,
) -> None:
    """Run each model in default and deterministic mode and report what determinism costs."""
    run_sweep(SweepRequest(split_models(models), options), stability=stability, report=report)


def run_sweep(request: SweepRequest, *, stability: bool = False, report: bool = True) -> Path:
    """Measure, print the per-model table, then the stability studies and the report; returns the results folder."""
    config, target = request.resolve()
    out = request.options.out or default_results_dir(target.device)
    resume = request.options.resume
    console = Console(stderr=True)
    store = measure(
        "sweep",
        plan_runs(config),
        config,
        config.manifest(),
        target,
        out,
        what=f"{len(config.models)} models",
        resume=resume,
        command=command_line(),
        console=console,
    )
    print_summary(store)
    console.print(f"results: {escape(str(store.dir))}")
    if stability:
        run_stability_studies(config.models, out, target.device, resume=resume, console=console)
    if report:
        from detprof.reports.command import write_report

        console.print(f"report: {escape(str(write_report(out, out / 'report.html')))}")
    return out


def run_stability_studies(
    models: tuple[str, ...], out: Path, device: DeviceChoice, *, resume: bool, console: Console
) -> None:
    """The stability side for the report's overhead-versus-variance pairing, one study per model.

    The embedded default study's size (5 runs per variant on the bundled digits data, the
    default epochs) for every swept model: it must fit in the embedded default's time;
    ``detprof stability --runs 10`` runs the full protocol.
    """
    from detprof.stability import study

    for model in models:
        config = study.StudyConfig(model=model, runs=study.EMBEDDED_RUNS)
        outcome = study.run_study(
            config,
            out / "stability" / model,
            jobs=study.default_jobs(),
            resume=resume,
            device=device,
            command=command_line(),
            console=console,
        )
        console.print(f"stability of {model}: {escape(str(outcome.summary_path))}")


def print_summary(store: ResultsStore) -> None:
    from detprof.profiler.study_results import summarize

    table = Table(title="Overhead of determinism (deterministic / default, 95% CI over repeats)")
    for col in ("Model", "Kernel time", "Wall time", "Kernel determinism adds most time to", "Failed runs"):
        table.add_column(col, overflow="fold")
    for summary in summarize(store):
        top = summary.top_added_kernel
        top_text = "-"
        if top is not None:
            top_text = f"{escape(str(top['name']))} ({signed_ns(top['delta_ns'])}/step, {top['status']})"
        note = summary.overhead.failure_note()
        table.add_row(
            summary.model,
            ratio(summary.overhead.kernel),
            ratio(summary.overhead.wall),
            top_text,
            "-" if note is None else escape(note[:FAILURE_NOTE_CHARS]),
        )
    Console().print(table)
