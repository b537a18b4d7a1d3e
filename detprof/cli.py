"""The ``detprof`` command line.

Commands are thin: they parse options, call the analyses and hand the results to a
renderer. Heavy imports (TensorFlow above all) happen inside the commands that need them,
so that ``detprof parse`` of a SQLite or CSV trace starts fast. ``main`` is the one place
that turns a ``DetprofError`` into a single line on stderr and its exit code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from detprof.errors import USAGE_EXIT, DetprofError, UsageError
from detprof.profiler.output import OutputFormat

app = typer.Typer(
    name="detprof",
    help="What deterministic training costs on your GPU, where the cost comes from, and what it buys.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.command(help="Parse a kernel trace (nsys, nvprof, TensorFlow profiler) and show its top kernels.")
def parse(
    trace: Annotated[Path, typer.Argument(help="nsys .sqlite/.nsys-rep, nsys stats CSV, nvprof CSV, .xplane.pb or log dir")],
    top: Annotated[int, typer.Option(min=1, help="How many kernels to list.")] = 20,
    by: Annotated[str, typer.Option(help="Group kernels by full name or short name: name|short.")] = "name",
    device: Annotated[str, typer.Option(help="'all' or one device id.")] = "all",
    fmt: Annotated[OutputFormat, typer.Option("--format", help="table|json|csv")] = OutputFormat.table,
) -> None:
    from detprof.profiler import output
    from detprof.profiler.parsers import load_trace

    group = _group_by(by)
    table = load_trace(trace)
    if device != "all":
        if table.is_summary:
            raise UsageError(f"{trace}: a summary-only trace has no per-device kernels; use --device all")
        try:
            device_id = int(device)
        except ValueError as exc:
            raise UsageError(f"--device must be 'all' or an integer device id, not {device!r}") from exc
        present = sorted({int(d) for d in table.kernels["device_id"].dropna().unique()})
        if device_id not in present:
            raise UsageError(f"{trace}: no kernels on device {device_id}; devices with kernels: {present}")
        table = table.on_device(device_id)
    output.print_parse(table, top=top, by=group, fmt=fmt)


@app.command(help="Compare two traces kernel by kernel: what was added, removed, slowed down.")
def diff(
    base: Annotated[Path, typer.Argument(help="The reference trace (e.g. default mode).")],
    other: Annotated[Path, typer.Argument(help="The trace to compare (e.g. deterministic mode).")],
    top: Annotated[int, typer.Option(min=1, help="How many kernels to list.")] = 20,
    fmt: Annotated[OutputFormat, typer.Option("--format", help="table|json|csv")] = OutputFormat.table,
) -> None:
    from detprof.profiler import output
    from detprof.profiler.parsers import load_trace

    output.print_diff(load_trace(base), load_trace(other), top=top, fmt=fmt)


def _group_by(by: str) -> str:
    mapping = {"name": "name", "short": "short_name", "short_name": "short_name"}
    if by not in mapping:
        raise UsageError(f"--by must be 'name' or 'short', not {by!r}")
    return mapping[by]


from detprof.models.command import models as models_command  # noqa: E402
# SWEEPTMP

# SWEEPTMP2
app.command("models", help="List the models detprof can profile.")(models_command)

# --- helper-registered commands ---


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; every expected failure is one line on stderr and a documented exit code."""
    try:
        code = app(args=argv, prog_name="detprof", standalone_mode=False)
    except typer.TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            typer.echo(exc.format_message())
            return 0
        typer.echo(f"detprof: error: {exc.format_message()}", err=True)
        return USAGE_EXIT
    except typer.Abort:
        typer.echo("detprof: interrupted; every completed run is kept", err=True)
        return 130
    except DetprofError as exc:
        typer.echo(f"detprof: error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        typer.echo("detprof: interrupted; every completed run is kept", err=True)
        return 130
    except Exception as exc:
        if os.environ.get("DETPROF_DEBUG"):
            raise
        typer.echo(f"detprof: internal error: {type(exc).__name__}: {exc} (DETPROF_DEBUG=1 shows the traceback)", err=True)
        return 1
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
