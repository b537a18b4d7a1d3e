"""``detprof verify``: whether determinism holds for a model on this device, and where default runs part ways.

The verification itself is ``verify.run``'s and its comparison ``analysis.verification``'s;
this module reads the options and prints. Not holding is the answer the command exists to
give, so it is ``ExitCode.CHECK_FAILED`` (1), as ``check`` ends for a regression.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from detprof.errors import ExitCode
from detprof.formatting import OutputFormat
from detprof.options import ModelsOption, RunOptions, with_run_options

HELP = (
    "Prove that determinism holds: train each model twice in deterministic mode and twice in default mode, "
    "fingerprint every layer's output and weights at every step, and say where runs part ways. "
    "Exit 0 held, 1 not, 3 unusable input."
)
VERIFY_OPTIONS = (
    "backend",
    "gpu",
    "gpu_index",
    "force",
    "batch_size",
    "input_size",
    "seed",
    "out",
    "resume",
    "input_shape",
    "classes",
)


@with_run_options(*VERIFY_OPTIONS)
def verify(
    options: RunOptions,
    models: ModelsOption = None,
    steps: Annotated[int, typer.Option(help="Training steps each run takes and fingerprints.")] = 20,
    gradients: Annotated[bool, typer.Option(help="Fingerprint every variable's gradient at every step too.")] = False,
    fmt: Annotated[OutputFormat, typer.Option("--format", help="table: a line per finding; json for scripts.")] = (
        OutputFormat.table
    ),
) -> None:
    """Whether deterministic mode is bitwise reproducible, and where default runs part ways."""
    from rich.console import Console

    from detprof.sweep.plan import split_models
    from detprof.verify.run import VerifyRequest, run_verify

    outcome = run_verify(VerifyRequest(split_models(models), options, steps, gradients), console=Console(stderr=True))
    if fmt is OutputFormat.json:
        typer.echo(json.dumps({"models": [m.to_json() for m in outcome.models]}, indent=2))
    else:
        for model in outcome.models:
            for line in model.lines():
                typer.echo(line)
        typer.echo(f"results: {outcome.out}")
    if not outcome.held:
        raise typer.Exit(ExitCode.CHECK_FAILED)
