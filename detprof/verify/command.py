"""``detprof verify``: whether determinism holds for a model on this device, and where default runs part ways.

The verification itself is ``verify.run``'s (a training program's, ``--command``:
``verify.program``'s) and its comparison ``analysis.verification``'s; this module reads the
options and prints. Not holding is the answer the command exists to give, so it is
``ExitCode.CHECK_FAILED`` (1), as ``check`` ends for a regression.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from detprof.errors import ExitCode, UsageError
from detprof.options import ModelsOption, RunOptions, with_run_options

if TYPE_CHECKING:
    from detprof.verify.run import VerifyOutcome


class Shown(StrEnum):
    """What verify prints: its findings, a line each (not a table, so no csv), or JSON."""

    table = "table"
    json = "json"


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
    "wait",
    "input_shape",
    "classes",
    "data",
    "amp",
    "compile",
    "run_timeout",
)


@with_run_options(*VERIFY_OPTIONS)
def verify(
    options: RunOptions,
    models: ModelsOption = None,
    steps: Annotated[
        int | None, typer.Option(help="Training steps each run takes and fingerprints (default 20).")
    ] = None,
    gradients: Annotated[bool, typer.Option(help="Fingerprint every variable's gradient at every step too.")] = False,
    fmt: Annotated[Shown, typer.Option("--format", help="table: a line per finding; json for scripts.")] = Shown.table,
    program: Annotated[
        str | None,
        typer.Option(
            "--command",
            help="Instead of models, verify any training program: its command line (split like a shell's, never "
            "run through one), run twice per mode; it marks what to compare with detprof.fingerprint() inside "
            "detprof.measure(). Needs --name.",
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="--command: the name its results go under, as a model's.")] = None,
) -> None:
    """Whether deterministic mode is bitwise reproducible, and where default runs part ways."""
    from detprof.console import status_console

    outcome: VerifyOutcome
    if program is not None:
        from detprof.profiler.program.request import refuse_for_programs
        from detprof.verify.program import ProgramVerifyRequest, verify_program

        asked = {"--models": models is not None, "--steps": steps is not None, "--gradients": gradients}
        refuse_for_programs(options, [flag for flag, given in asked.items() if given])
        outcome = verify_program(ProgramVerifyRequest(program, name, options), console=status_console())
    elif name is not None:
        raise UsageError("--name names the program of --command: give both, or neither for models")
    else:
        from detprof.models.plans import split_models
        from detprof.verify.run import DEFAULT_STEPS, VerifyRequest, run_verify

        request = VerifyRequest(split_models(models), options, DEFAULT_STEPS if steps is None else steps, gradients)
        outcome = run_verify(request, console=status_console())
    if fmt is Shown.json:
        typer.echo(json.dumps({"models": [m.to_json() for m in outcome.models]}, indent=2))
    else:
        for model in outcome.models:
            for line in model.lines():
                typer.echo(line)
        typer.echo(f"results: {outcome.out}")
    if not outcome.held:
        raise typer.Exit(ExitCode.CHECK_FAILED)
