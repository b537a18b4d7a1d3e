"""What the sweep and kernels_bench share around their runs: settings checks, device and
tracer choice, and the progress bar that survives Ctrl-C.

Both run worker after worker through the launcher; keeping these pieces in one place keeps
their options meaning the same thing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from detprof.errors import UsageError
from detprof.profiler import gpu as gpu_info
from detprof.profiler.gpu import DeviceChoice
from detprof.profiler.tracers import Tracer, resolve_tracer


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
    device = gpu_info.choose_device(gpu, force)
    on_gpu = device.gpu is not None and not device.hide_gpus
    preset_name = preset or ("paper" if on_gpu else "cpu-small")
    if preset_name not in presets:
        raise UsageError(f"unknown preset {preset_name!r}; choose one of {', '.join(presets)}")
    chosen = resolve_tracer(tracer, on_gpu)
    if chosen.name == "nvprof":
        gpu_info.refuse_nvprof(device.gpu)
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
