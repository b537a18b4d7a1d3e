"""``detprof sweep``: options, presets, the progress bar and the final table.

With no options on a machine without a GPU the sweep is the embedded default: the
``cpu-small`` preset with TensorFlow's profiler as tracer, results labelled ``cpu``.
Options given explicitly always win over the preset's values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from detprof.errors import UsageError
from detprof.formatting import ratio, signed_ns
from detprof.invocation import command_line
from detprof.models.registry import PAPER_MODELS
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.measured_study import (
    BatchSizeOption,
    ForceOption,
    GpuOption,
    InputSizeOption,
    OutOption,
    PresetOption,
    RepeatsOption,
    ResumeOption,
    RunTimeoutOption,
    SeedOption,
    StepsOption,
    TracerOption,
    WarmupOption,
    XlaOption,
    choose_target,
    default_results_dir,
    progress_bar,
)
from detprof.store import ResultsStore
from detprof.sweep.plan import PRESETS, SweepConfig, run_sweep

PAPER_PRESET: dict[str, Any] = {
    "models": tuple(PAPER_MODELS),
    "steps": 100,
    "warmup": 10,
    "repeats": 3,
    "batch_size": 64,
    "input_size": None,
    "classes": None,
}
ALL_PRESETS = {"paper": PAPER_PRESET, **PRESETS}
FAILURE_NOTE_CHARS = 160


def _split_models(models: str | None) -> tuple[str, ...] | None:
    if models is None:
        return None
    names = tuple(m.strip().lower() for m in models.split(",") if m.strip())
    if not names:
        raise UsageError("--models is empty: give a comma-separated list of model names (see `detprof models`)")
    return names


def sweep(
    models: Annotated[str | None, typer.Option(help="Comma-separated model names (see `detprof models`).")] = None,
    preset: PresetOption = None,
    gpu: GpuOption = None,
    force: ForceOption = False,
    tracer: TracerOption = "auto",
    steps: StepsOption = None,
    warmup: WarmupOption = None,
    repeats: RepeatsOption = None,
    batch_size: BatchSizeOption = None,
    input_size: InputSizeOption = None,
    xla: XlaOption = False,
    seed: SeedOption = 0,
    out: OutOption = None,
    resume: ResumeOption = False,
    run_timeout: RunTimeoutOption = None,
    stability: Annotated[
        bool, typer.Option(help="Also run a small stability study of each swept model (digits, 4 variants).")
    ] = False,
    report: Annotated[bool, typer.Option(help="Write report.html into the results directory at the end.")] = True,
) -> None:
    """Run each model in default and deterministic mode and report what determinism costs."""
    target = choose_target(gpu, force, tracer, preset, list(ALL_PRESETS))
    device, chosen_tracer, preset_name = target.device, target.tracer, target.preset
    values = dict(ALL_PRESETS[preset_name])
    explicit = {
        "models": _split_models(models),
        "steps": steps,
        "warmup": warmup,
        "repeats": repeats,
        "batch_size": batch_size,
        "input_size": input_size,
    }
    values.update({k: v for k, v in explicit.items() if v is not None})
    config = SweepConfig(
        **values,
        tracer=chosen_tracer.name,
        xla=xla,
        gpu_label=device.label,
        seed=seed,
        preset=preset_name,
        run_timeout_s=run_timeout,
    )
    out = out or default_results_dir(device)
    store = ResultsStore(out, "sweep")
    console = Console(stderr=True)
    total = len(config.models) * 2 * config.repeats
    console.print(
        f"detprof sweep: {len(config.models)} models x 2 modes x {config.repeats} repeats on "
        f"{escape(device.label)} with tracer {chosen_tracer.name}, results in {escape(str(out))}"
    )
    with progress_bar(console, total, store.dir) as progress:
        run_sweep(config, store, chosen_tracer, device, resume=resume, command=command_line(), progress=progress)
    print_summary(store)
    console.print(f"results: {escape(str(store.dir))}")
    if stability:
        run_stability_studies(config.models, out, device, resume=resume, console=console)
    if report:
        from detprof.reports.command import write_report

        console.print(f"report: {escape(str(write_report(out, out / 'report.html')))}")


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
