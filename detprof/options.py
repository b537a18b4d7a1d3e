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
from typing import Annotated, Any, TypeVar, get_type_hints

import typer

from detprof.errors import UsageError

ModelsOption = Annotated[
    str | None,
    typer.Option(
        "--models",
        "--model",
        help="Comma-separated models: names from `detprof models`, or your own: FILE.py:FUNCTION, "
        "package.module:FUNCTION (a function returning a keras.Model, a torch.nn.Module or a Flax module) or "
        "FILE.keras (a saved model). Default: the preset's models (cpu-small: smallcnn, mediumcnn_k1, mediumcnn_k3).",
    ),
]
"""``--models``, which ``--model`` spells too: every command that takes models takes either word."""
BackendsOption = Annotated[
    str | None,
    typer.Option(
        "--backends",
        "--backend",
        help="Comma-separated Keras backends: tensorflow, jax, torch (default: every one installed here).",
    ),
]
"""``--backends`` of the commands that go over several backends (``doctor``, ``gpu-study``), either word."""
OPTION = "option"


@dataclass(frozen=True)
class Declared:
    """How a ``RunOptions`` field reads on the command line: its help, and its flags or type where Typer's differ."""

    help: str
    flags: tuple[str, ...] = ()
    cli_type: Any = None
    """The type the command line gives, where ``RunOptions`` holds it otherwise (``--gpu``: a list of labels)."""


def option(help: str, default: Any = None, *, flags: tuple[str, ...] = (), cli_type: Any = None) -> Any:
    """A ``RunOptions`` field that is a command-line option: its default and its declaration, in one place."""
    return field(default=default, metadata={OPTION: Declared(help, flags, cli_type)})


@dataclass(frozen=True)
class RunOptions:
    """The shared options as one value: what a command that measures was given (``None``: not given)."""

    preset: str | None = option("paper | cpu-small (default: cpu-small without a GPU, else paper).")
    backend: str | None = option(
        "Keras backend that runs the models: tensorflow | jax | torch (default: the framework installed, "
        "TensorFlow where several are). Each comes with its extra: detprof[tensorflow], detprof[jax], detprof[torch]."
    )
    compile: bool = option(
        "torch: run the training step under torch.compile in both modes (default off, as in eager).", False
    )
    gpu: str | None = option(
        "GPU label for the results (t4, v100, a100, ..., or cpu); checked against the device. "
        "With --ray, once per GPU type of the fleet (--gpu t4 --gpu a100).",
        cli_type=list[str] | None,
    )
    gpu_index: str | None = option(
        "Which GPU runs the workers: its NVML index (as `detprof gpus` lists it) or UUID, or a UUID prefix "
        "(GPU-...); default the first visible one. The workers see that GPU only."
    )
    force: bool = option("Accept a --gpu label that does not match the detected device.", False)
    tracer: str | None = option(
        "auto | nsys | nvprof | tf | jax | torch | none (default auto: nsys on a GPU where it is installed, "
        "else the backend's own profiler)."
    )
    trace_api: str | None = option(
        "nsys only: library API traces to add to cuda,nvtx (cudnn, cublas; comma-separated). "
        "Each taxes every call it records; kernel time is unaffected."
    )
    steps: int | None = option("Measured steps per run (paper: 100).")
    warmup: int | None = option("Warm-up steps excluded from measurement (autotuning happens here).")
    repeats: int | None = option("Repeats per mode (>= 2 for a confidence interval).")
    batch_size: int | None = option("Batch size (paper: 64).")
    input_size: int | None = option("Square input size in pixels the models are built at (default: their own).")
    xla: bool | None = option(
        "Compile with XLA in both modes (jit_compile is always pinned).", flags=("--xla/--no-xla",)
    )
    seed: int | None = option("Seed set in both modes (default 0).")
    out: Path | None = option(
        "Results directory (default results/<date>-<device>; where that holds a study of another configuration, a "
        "folder named for this one's models inside it)."
    )
    resume: bool = option("Continue the study in --out, skipping completed runs.", False)
    wait: bool = option(
        "When another detprof is measuring on the same device: wait for it to finish (default), or refuse at once.",
        True,
        flags=("--wait/--no-wait",),
    )
    run_timeout: float | None = option("Seconds after which a run is stopped and recorded as failed.")
    precision: str | None = option(
        "Add repeats, model by model, until each model's 95% interval of the overhead is within +/-this "
        "(2%, 0.02; off: exactly --repeats), --repeats being the first of them "
        "(default: the preset's, cpu-small 2%; paper off)."
    )
    budget: str | None = option(
        "With --precision: the time the repeats added after the first --repeats may take (90s, 10m, 1h); a repeat "
        "is added only while it fits, and the models left wider than the precision are named with the repeats they "
        "would need (default: the preset's, cpu-small 90s; paper none)."
    )
    pairing: str | None = option(
        "auto | in-process | processes: how a repeat pairs the two modes. in-process: one process runs both, a step "
        "of each in turn, switching determinism between steps (PyTorch, JAX); processes: a process per mode "
        "(stepped in turn on a CPU, one after the other on a GPU). Default auto: in-process where the backend can; "
        "in-process asked for by name also runs PyTorch's modes in one process on a GPU, both with deterministic "
        "mode's cuBLAS workspace."
    )
    shared_repeats: bool = option(
        "With --pairing in-process: one process runs every repeat of a model, each re-running the steps the first "
        "built and compiled, instead of a process per repeat: a start, a build and a compile per model, not per "
        "repeat. The interval then leaves out what differs between processes (a compiler's or an autotuner's picks); "
        "use it where a comparison with a process per repeat agrees (detprof gpu-study checks).",
        False,
    )
    dry_run: bool = option(
        "Print the plan (each run's worker and tracer command line, the environment detprof sets) and exit without "
        "running it; works with --force and a tracer that is not installed.",
        False,
    )
    input_shape: str | None = option(
        "The input shape your own models are built at when they take one: HxWxC for factories of "
        "(input_shape, classes), a Sequential without keras.Input, an unbuilt subclassed model; a PyTorch "
        "module's own layout (3x224x224), a token model's length (default: --data's examples, else 32x32x3)."
    )
    classes: int | None = option(
        "Classes the models are built for (default: the preset's, else --data's labels, else 10)."
    )
    amp: str | None = option(
        "bf16 or fp16: train every model in bfloat16 (or float16) mixed precision in both modes, as models are "
        "trained on GPUs now: a PyTorch module's forward and loss under torch.autocast, a Keras model built under the "
        "mixed_bfloat16 (mixed_float16) dtype policy; float16's loss scaled (GradScaler, LossScaleOptimizer) "
        "(default: each model's own precision: float32, the registry's Keras transformers in mixed_bfloat16 on a GPU)."
    )
    data: str | None = option(
        "npz:PATH: train on a real batch from this file instead of synthetic data: x_train/y_train "
        "(as stability --dataset npz:PATH names them), or an array per input and output of your model, by name; "
        "examples as the model takes them; images stored HxWxC reach a PyTorch module channels first."
    )
    ray: str | None = option(
        "Run on a Ray cluster (auto, HOST:PORT or ray://HOST:10001): each --gpu type on the nodes of that "
        "Ray accelerator type, results brought home into --out (docs/fleet.md). Needs detprof[ray]."
    )
    max_trace_mb: float | None = option(
        "--ray: traces up to this size (MB) come home with their runs; larger ones stay on the node, "
        "their path recorded (default 64)."
    )
    gpus: tuple[str, ...] = ()
    """Every ``--gpu`` given: one label, or with ``--ray`` the GPU types of a fleet (``gpu`` is then None)."""


def _option_types() -> dict[str, Any]:
    """Each shared option's Typer declaration, built from its ``RunOptions`` field, in the fields' order."""
    hints = get_type_hints(RunOptions)
    declared = {f.name: f.metadata[OPTION] for f in fields(RunOptions) if OPTION in f.metadata}
    return {
        name: Annotated[d.cli_type or hints[name], typer.Option(*d.flags, help=d.help)]  # type: ignore[valid-type]
        for name, d in declared.items()
    }


OPTION_TYPES: dict[str, Any] = _option_types()

FLEET = ("ray", "max_trace_mb")
"""What runs a study on a Ray cluster (``detprof.fleet``): the sweep and ``check --run`` take these."""
MODEL_INPUTS = ("input_shape", "classes", "data", "amp")
"""How the sweep's models are built and fed (``profiler.sweep_request``): the sweep and ``check --run`` take these."""
TIME_TO_ANSWER = ("precision", "budget", "pairing", "shared_repeats")
"""How the sweep reaches its answer (``profiler.study``): repeats until precise enough, within a budget, paired in
one process where it can; kernels_bench's op cases take a fixed number of repeats in a process per mode."""
MEASURED_STUDY = tuple(n for n in OPTION_TYPES if n not in FLEET + MODEL_INPUTS + TIME_TO_ANSWER)
"""What the sweep and kernels_bench both take."""
CHECK_RUN = tuple(n for n in OPTION_TYPES if n not in ("preset", "out", "resume", "dry_run", "wait"))
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
