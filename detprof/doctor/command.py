"""``detprof doctor``: the readiness checklist, one line per check, and exit 0 (ready) or 1 (not).

Not being ready is the answer the command exists to give, not a usage or input error, so it
is exit 1 (as ``detprof check`` exits 1 for a regression), with the reason in the lines that
say ``missing`` or ``failed`` and how to fix each. A label that is no label stays exit 2.
"""

from __future__ import annotations

import csv
import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from detprof.errors import ExitCode
from detprof.formatting import OutputFormat
from detprof.option_values import comma_separated
from detprof.options import BackendsOption

if TYPE_CHECKING:
    from rich.console import Console

    from detprof.doctor.checks import Readiness

STATUS_STYLES = {"ok": "green", "missing": "red", "failed": "red", "skipped": "dim"}


def doctor(
    gpu: Annotated[
        str | None,
        typer.Option(help="GPU label to check for (t4, v100, a100, ..., or cpu); default this machine's device."),
    ] = None,
    backends: BackendsOption = None,
    force: Annotated[
        bool,
        typer.Option(help="Show the GPU checks without enforcing them (a CPU node standing in for a GPU label)."),
    ] = False,
    smoke: Annotated[
        bool, typer.Option(help="Run the smoke runs (the checks that need a framework running come from them).")
    ] = True,
    fmt: Annotated[OutputFormat, typer.Option("--format", help="table: the checklist; json or csv for machines.")] = (
        OutputFormat.table
    ),
) -> None:
    """The checklist for ``--gpu`` (default: this machine's own device, ``cpu`` without a GPU); exit 1 if not ready."""

    from detprof.console import status_console, table_console
    from detprof.doctor.checks import readiness

    with status_console().status("checking this machine (the smoke runs take a few seconds each)"):
        result = readiness(gpu, comma_separated(backends, lower=True) or None, force=force, smoke=smoke)
    if fmt is OutputFormat.json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    elif fmt is OutputFormat.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["check", "status", "required", "detail", "fix"])
        writer.writerows([c.name, c.status, c.required, c.detail, c.fix] for c in result.checks)
    else:
        _print_checklist(table_console(), result)
    if not result.ready:
        raise typer.Exit(ExitCode.CHECK_FAILED)


def _print_checklist(console: Console, result: Readiness) -> None:
    """One line per check: its status, name and finding, then how to fix it where it is not ok."""
    from rich.markup import escape

    width = max(len(check.name) for check in result.checks)
    for check in result.checks:
        optional = " (optional)" if not check.required and check.status != "ok" else ""
        fix = f"; [bold]fix:[/bold] {escape(check.fix)}" if check.fix and check.status != "ok" else ""
        console.print(
            f"[{STATUS_STYLES[check.status]}]{check.status:<8}[/] {escape(check.name):<{width}}  "
            f"{escape(check.detail)}{optional}{fix}",
            soft_wrap=True,
            highlight=False,
        )
    forced = " (forced: GPU checks shown, not enforced)" if result.forced else ""
    verdict = "[green]ready[/]" if result.ready else "[red]not ready[/]"
    console.print(f"detprof doctor: {verdict} for {escape(result.target)}{forced}", highlight=False)
