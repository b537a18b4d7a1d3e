"""What the sweep and kernels_bench share around their runs: settings checks, device and
tracer choice, and the progress bar that survives Ctrl-C.

Both run worker after worker through the launcher; keeping these pieces in one place keeps
their options meaning the same thing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from detprof.errors import UsageError
from detprof.profiler import devices
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.tracers import Tracer, resolve_tracer

PresetOption = Annotated[
    str | None, typer.Option(help="paper | cpu-small (default: cpu-small without a GPU, else paper).")
]
GpuOption = Annotated[
    str | None,
    typer.Option(help="GPU label for the results (t4, v100, a100, ..., or cpu); checked against the device."),
]
ForceOption = Annotated[bool, typer.Option(help="Accept a --gpu label that does not match the detected device.")]
TracerOption = Annotated[str, typer.Option(help="auto | nsys | nvprof | tf | none.")]
StepsOption = Annotated[int | None, typer.Option(help="Measured steps per run (paper: 100).")]
WarmupOption = Annotated[
    int | None, typer.Option(help="Warm-up steps excluded from measurement (autotuning happens here).")
]
RepeatsOption = Annotated[int | None, typer.Option(help="Repeats per mode (>= 2 for a confidence interval).")]
BatchSizeOption = Annotated[int | None, typer.Option(help="Batch size (paper: 64).")]
InputSizeOption = Annotated[
    int | None, typer.Option(help="Square input size in pixels the models are built at (default: their own).")
]
XlaOption = Annotated[bool, typer.Option(help="Compile with XLA in both modes (jit_compile is always pinned).")]
SeedOption = Annotated[int, typer.Option(help="Seed set in both modes.")]
OutOption = Annotated[Path | None, typer.Option(help="Results directory (default results/<date>-<device>).")]
ResumeOption = Annotated[bool, typer.Option(help="Continue the study in --out, skipping completed runs.")]
RunTimeoutOption = Annotated[
    float | None, typer.Option(help="Seconds after which a run is stopped and recorded as failed.")
]


def default_results_dir(device: DeviceChoice) -> Path:
    """``results/<date>-<device>``: the sweep, kernels and stability of one day and device pair up."""
    return Path("results") / f"{dt.date.today().isoformat()}-{device.label}"


@dataclass(frozen=True)
class RunProgress:
    """Callbacks through which a driver reports progress without knowing how it is shown."""

    on_start: Callable[[str, int], None] = lambda label, index: None
    on_done: Callable[[dict[str, Any]], None] = lambda record: None


def check_run_settings(
    steps: int, warmup: int, repeats: int, batch_size: int, input_size: int | None, run_timeout_s: float | None
) -> None:
    """One line per bad value, before any worker starts."""
    for name, value, least in (
        ("--steps", steps, 1),
        ("--repeats", repeats, 1),
        ("--batch-size", batch_size, 1),
        ("--warmup", warmup, 0),
    ):
        if value < least:
            raise UsageError(f"{name} must be at least {least}, not {value}")
    if input_size is not None and input_size < 8:
        raise UsageError(f"--input-size must be at least 8, not {input_size}")
    if run_timeout_s is not None and run_timeout_s <= 0:
        raise UsageError(f"--run-timeout must be positive, not {run_timeout_s}")


@dataclass(frozen=True)
class MeasurementTarget:
    device: DeviceChoice
    tracer: Tracer
    preset: str


def choose_target(
    gpu: str | None, force: bool, tracer: str, preset: str | None, presets: list[str]
) -> MeasurementTarget:
    """The device (label checked), the tracer it allows, and the preset that fits it."""
    device = devices.choose_device(gpu, force)
    on_gpu = device.gpu is not None and not device.hide_gpus
    preset_name = preset or ("paper" if on_gpu else "cpu-small")
    if preset_name not in presets:
        raise UsageError(f"unknown preset {preset_name!r}; choose one of {', '.join(presets)}")
    chosen = resolve_tracer(tracer, on_gpu)
    if chosen.name == "nvprof":
        devices.refuse_nvprof(device.gpu)
    return MeasurementTarget(device, chosen, preset_name)


@contextmanager
def progress_bar(console: Console, total: int, results_dir: Path) -> Iterator[RunProgress]:
    """Runs done/total, the run in flight and an ETA; Ctrl-C ends with exit 130, records kept."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("starting", total=total)

        def on_start(label: str, index: int) -> None:
            bar.update(task, completed=index, description=escape(label))

        def on_done(record: dict[str, Any]) -> None:
            bar.advance(task)
            if record["status"] != "ok":
                bar.console.print(f"  {escape(record['run_id'])}: {record['status']}: {escape(str(record['reason']))}")

        try:
            yield RunProgress(on_start, on_done)
        except KeyboardInterrupt:
            bar.stop()
            console.print(f"interrupted: every completed run is kept in {escape(str(results_dir))}; --resume continues")
            raise typer.Exit(130) from None
        bar.update(task, completed=total, description="done")
