"""The ``detprof`` command line.

Commands are thin: they parse options, call the analyses and hand the results to a
renderer. Command modules import nothing heavy at module level (TensorFlow, pandas and
plotly load inside the commands that need them), so ``detprof parse`` of a SQLite or CSV
trace starts fast. ``main`` is the one place that turns a ``DetprofError`` into a single
line on stderr and its exit code.
"""

from __future__ import annotations

import os
import sys

import typer

from detprof import invocation
from detprof.check.command import CHECK_HELP, baseline, check
from detprof.errors import USAGE_EXIT, DetprofError
from detprof.kernels_bench.command import HELP as KERNELS_HELP
from detprof.kernels_bench.command import kernels
from detprof.models.command import models
from detprof.profiler.command import gpus
from detprof.reports.command import HELP as REPORT_HELP
from detprof.reports.command import report
from detprof.stability.command import HELP as STABILITY_HELP
from detprof.stability.command import stability
from detprof.sweep.command import HELP as SWEEP_HELP
from detprof.sweep.command import sweep
from detprof.traces.command import DIFF_HELP, PARSE_HELP, diff, parse

app = typer.Typer(
    name="detprof",
    help="What deterministic training costs on your GPU, where the cost comes from, and what it buys.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

app.command("parse", help=PARSE_HELP)(parse)
app.command("diff", help=DIFF_HELP)(diff)
app.command("models", help="List the models detprof can profile.")(models)
app.command("gpus", help="List the NVIDIA GPUs that NVML sees.")(gpus)
app.command("sweep", help=SWEEP_HELP)(sweep)
app.command("kernels", help=KERNELS_HELP)(kernels)
app.command("stability", help=STABILITY_HELP)(stability)
app.command("report", help=REPORT_HELP)(report)
app.command("baseline", help="Freeze a sweep's per-repeat overheads as the CI baseline (JSON).")(baseline)
app.command("check", help=CHECK_HELP)(check)


# EX_SOFTWARE (sysexits.h): a bug in detprof, never its input or measurement, so CI can tell
# a crash from `detprof check`'s exit 1 for a regression.
INTERNAL_EXIT = 70


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; every expected failure is one line on stderr and a documented exit code."""
    invocation.remember(sys.argv[1:] if argv is None else argv)
    try:
        code = app(args=argv, prog_name="detprof", standalone_mode=False)
    except typer.TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            typer.echo(exc.format_message())
            return 0
        typer.echo(f"detprof: error: {exc.format_message()}", err=True)
        return USAGE_EXIT
    except typer.Abort:
        typer.echo("detprof: interrupted", err=True)
        return 130
    except DetprofError as exc:
        typer.echo(f"detprof: error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        typer.echo("detprof: interrupted", err=True)
        return 130
    except Exception as exc:
        if os.environ.get("DETPROF_DEBUG"):
            raise
        typer.echo(
            f"detprof: internal error: {type(exc).__name__}: {exc} (DETPROF_DEBUG=1 shows the traceback)", err=True
        )
        return INTERNAL_EXIT
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
