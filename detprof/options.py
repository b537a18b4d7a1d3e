"""Command-line options that several commands share, declared once so that they mean one thing.

The sweep, kernels_bench, the stability study and ``check --run`` all pick a device (its
label and which GPU) and a results folder; the sweep, kernels_bench and ``check --run`` all
set the measured run's steps, repeats and tracer. ``None`` means "the preset's value" (or,
for ``check --run``, the baseline's).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from detprof.errors import UsageError

PresetOption = Annotated[
    str | None, typer.Option(help="paper | cpu-small (default: cpu-small without a GPU, else paper).")
]
GpuOption = Annotated[
    list[str] | None,
    typer.Option(
        help="GPU label for the results (t4, v100, a100, ..., or cpu); checked against the device. "
        "With --ray, once per GPU type of the fleet (--gpu t4 --gpu a100)."
    ),
]
GpuIndexOption = Annotated[
    str | None,
    typer.Option(
        help="Which GPU runs the workers: its NVML index (as `detprof gpus` lists it) or UUID, or a UUID prefix "
        "(GPU-...); default the first visible one. The workers see that GPU only."
    ),
]
ForceOption = Annotated[bool, typer.Option(help="Accept a --gpu label that does not match the detected device.")]
TracerOption = Annotated[
    str | None,
    typer.Option(
        help="auto | nsys | nvprof | tf | jax | torch | none (default auto: nsys on a GPU where it is installed, "
        "else the backend's own profiler)."
    ),
]
TraceApiOption = Annotated[
    str | None,
    typer.Option(
        help="nsys only: library API traces to add to cuda,nvtx (cudnn, cublas; comma-separated). "
        "Each taxes every call it records; kernel time is unaffected."
    ),
]
StepsOption = Annotated[int | None, typer.Option(help="Measured steps per run (paper: 100).")]
WarmupOption = Annotated[
    int | None, typer.Option(help="Warm-up steps excluded from measurement (autotuning happens here).")
]
RepeatsOption = Annotated[int | None, typer.Option(help="Repeats per mode (>= 2 for a confidence interval).")]
BatchSizeOption = Annotated[int | None, typer.Option(help="Batch size (paper: 64).")]
InputSizeOption = Annotated[
    int | None, typer.Option(help="Square input size in pixels the models are built at (default: their own).")
]
XlaOption = Annotated[
    bool | None, typer.Option("--xla/--no-xla", help="Compile with XLA in both modes (jit_compile is always pinned).")
]
SeedOption = Annotated[int | None, typer.Option(help="Seed set in both modes (default 0).")]
OutOption = Annotated[Path | None, typer.Option(help="Results directory (default results/<date>-<device>).")]
ResumeOption = Annotated[bool, typer.Option(help="Continue the study in --out, skipping completed runs.")]
RunTimeoutOption = Annotated[
    float | None, typer.Option(help="Seconds after which a run is stopped and recorded as failed.")
]
BackendOption = Annotated[
    str | None,
    typer.Option(
        help="Keras backend that runs the models: tensorflow | jax | torch (default: the framework installed, "
        "TensorFlow where several are). Each comes with its extra: detprof[tensorflow], detprof[jax], detprof[torch]."
    ),
]
CompileOption = Annotated[
    bool,
    typer.Option(help="torch: run the training step under torch.compile in both modes (default off, as in eager)."),
]
ModelsOption = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated models: names from `detprof models`, or your own: FILE.py:FUNCTION, "
        "package.module:FUNCTION (a function returning a keras.Model) or FILE.keras (a saved model)."
    ),
]
InputShapeOption = Annotated[
    str | None,
    typer.Option(
        help="HxWxC: the input shape your own models are built at when they take one: factories of "
        "(input_shape, classes), a Sequential without keras.Input, an unbuilt subclassed model "
        "(default: --data's images, else 32x32x3)."
    ),
]
ClassesOption = Annotated[
    int | None,
    typer.Option(help="Classes the models are built for (default: the preset's, else --data's labels, else 10)."),
]
DataOption = Annotated[
    str | None,
    typer.Option(
        help="npz:PATH: train on a real batch from this file instead of synthetic data: x_train/y_train "
        "(as stability --dataset npz:PATH), or an array per input and output of your model, by name."
    ),
]
RayOption = Annotated[
    str | None,
    typer.Option(
        help="Run on a Ray cluster (auto, HOST:PORT or ray://HOST:10001): each --gpu type on the nodes of that "
        "Ray accelerator type, results brought home into --out (docs/fleet.md). Needs detprof[ray]."
    ),
]
MaxTraceMbOption = Annotated[
    float | None,
    typer.Option(
        help="--ray: traces up to this size (MB) come home with their runs; larger ones stay on the node, "
        "their path recorded (default 64)."
    ),
]


OPTION = "option"


def option(declaration: Any, default: Any = None) -> Any:
    """A ``RunOptions`` field that is a command-line option: its default and its Typer declaration, in one place."""
    return field(default=default, metadata={OPTION: declaration})


@dataclass(frozen=True)
class RunOptions:
    """The shared options as one value: what a command that measures was given (``None``: not given)."""

    preset: str | None = option(PresetOption)
    backend: str | None = option(BackendOption)
    compile: bool = option(CompileOption, False)
    gpu: str | None = option(GpuOption)
    gpu_index: str | None = option(GpuIndexOption)
    force: bool = option(ForceOption, False)
    tracer: str | None = option(TracerOption)
    trace_api: str | None = option(TraceApiOption)
    steps: int | None = option(StepsOption)
    warmup: int | None = option(WarmupOption)
    repeats: int | None = option(RepeatsOption)
    batch_size: int | None = option(BatchSizeOption)
    input_size: int | None = option(InputSizeOption)
    xla: bool | None = option(XlaOption)
    seed: int | None = option(SeedOption)
    out: Path | None = option(OutOption)
    resume: bool = option(ResumeOption, False)
    run_timeout: float | None = option(RunTimeoutOption)
    input_shape: str | None = option(InputShapeOption)
    classes: int | None = option(ClassesOption)
    data: str | None = option(DataOption)
    ray: str | None = option(RayOption)
    max_trace_mb: float | None = option(MaxTraceMbOption)
    gpus: tuple[str, ...] = ()
    """Every ``--gpu`` given: one label, or with ``--ray`` the GPU types of a fleet (``gpu`` is then None)."""


OPTION_TYPES: dict[str, Any] = {f.name: f.metadata[OPTION] for f in fields(RunOptions) if OPTION in f.metadata}
"""Each shared option's name and its declaration, in ``RunOptions``' order."""

FLEET = ("ray", "max_trace_mb")
"""What runs a study on a Ray cluster (``detprof.fleet``): the sweep and ``check --run`` take these."""
MODEL_INPUTS = ("input_shape", "classes", "data")
"""How the sweep's models are built and fed (``sweep.plan``): the sweep and ``check --run`` take these."""
MEASURED_STUDY = tuple(n for n in OPTION_TYPES if n not in FLEET + MODEL_INPUTS)
"""What the sweep and kernels_bench both take."""
CHECK_RUN = tuple(n for n in OPTION_TYPES if n not in ("preset", "out", "resume"))
"""What ``check --run`` may override of the baseline's sweep."""

Command = TypeVar("Command", bound=Callable[..., None])


def with_run_options(*names: str) -> Callable[[Command], Command]:
    """Give a command the shared options ``names``; it receives them as one ``RunOptions`` argument, ``options``.

    The command's own options come first in ``--help``, the shared ones after, each
    declared once above. Typer reads a command's options off its signature, so the
    wrapper's signature is the command's own parameters (without ``options``) plus these.
    """
    defaults = {f.name: f.default for f in fields(RunOptions)}

    def decorate(command: Command) -> Command:
        own = inspect.signature(command, eval_str=True)
        params = [p for p in own.parameters.values() if p.name != "options"]
        shared = [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=defaults[n], annotation=OPTION_TYPES[n])
            for n in names
        ]

        @functools.wraps(command)
        def wrapper(**given: Any) -> None:
            shared = {n: given.pop(n) for n in names}
            if "gpu" in shared:
                shared |= gpu_labels(shared["gpu"], fleet=shared.get("ray") is not None)
            command(options=RunOptions(**shared), **given)

        wrapper.__signature__ = own.replace(parameters=params + shared)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params + shared} | {"return": None}
        return wrapper  # type: ignore[return-value]

    return decorate


def gpu_labels(given: list[str] | None, *, fleet: bool) -> dict[str, Any]:
    """``--gpu`` as ``RunOptions`` holds it: the one label as ``gpu``, and every label given as ``gpus``.

    One machine measures one device, so a second ``--gpu`` is a mistake there; a fleet
    (``--ray``) measures every GPU type given, each on its own nodes.
    """
    labels = tuple(given or ())
    if len(labels) > 1 and not fleet:
        raise UsageError(f"--gpu is given once ({', '.join(labels)} given): several GPU types need --ray (a fleet)")
    return {"gpu": labels[0] if len(labels) == 1 else None, "gpus": labels}
