"""``detprof report``: results directories in, one self-contained HTML (or Markdown, or JSON) file out.

``-o -`` writes to stdout, in every format. ``write_report`` is the same thing for callers
inside detprof (the end of ``detprof sweep``). Nothing heavy is imported at module level,
so ``detprof --help`` stays fast.
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from detprof.errors import UsageError
from detprof.store import write_output

STDOUT = "-"
FORMATS = ("html", "md", "json")


class ReportFormat(StrEnum):
    html = "html"
    md = "md"
    json = "json"


class PlotlyJsMode(StrEnum):
    embed = "embed"
    cdn = "cdn"


def render_report(results_dirs: list[Path], fmt: str = "html", plotlyjs: str = "embed") -> str:
    from detprof import bundle
    from detprof.reports.report_data import build_report

    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if plotlyjs not in ("embed", "cdn"):
        raise UsageError(f"--plotlyjs must be embed or cdn, not {plotlyjs!r}")
    with bundle.unpacked(results_dirs) as folders:
        report = replace(build_report(folders), sources=[Path(p) for p in results_dirs])
        if fmt == "md":
            from detprof.reports import markdown

            return markdown.render(report)
        if fmt == "json":
            from detprof.reports import json_report

            return json_report.render(report)
        from detprof.reports import html

        return html.render(report, "cdn" if plotlyjs == "cdn" else "embed")


def _write(output: Path, text: str) -> Path:
    """Written to a temporary name and renamed, so a reader never sees half a report."""
    output = Path(output)
    write_output(output, text.encode("utf-8"), "the report")
    return output


def write_report(results_dir: Path, output: Path, fmt: str = "html", plotlyjs: str = "embed") -> Path:
    """The report of everything under ``results_dir``, written to ``output``; returns ``output``."""
    return _write(output, render_report([Path(results_dir)], fmt, plotlyjs))


SUFFIXES = {".md": ReportFormat.md, ".markdown": ReportFormat.md, ".json": ReportFormat.json}
"""The report file suffixes that name a format other than HTML's."""


def format_named_by(output: Path | None) -> ReportFormat:
    """The format ``-o report.md`` asks for without ``--format``: a Markdown file that held HTML would be read as
    neither."""
    return SUFFIXES.get(output.suffix.lower(), ReportFormat.html) if output is not None else ReportFormat.html


def report(
    results_dirs: Annotated[
        list[Path],
        typer.Argument(
            help="Results directories (sweep, kernels and/or stability; several GPUs at once), or the bundles "
            "`detprof gpu-study` writes (.zip), or a folder that holds such bundles and no results."
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Report file (default report.html, .md or .json); - for stdout."),
    ] = None,
    fmt: Annotated[
        ReportFormat | None,
        typer.Option(
            "--format",
            help="html | md (Markdown headline tables) | json (headline numbers for scripts). Default: the one -o's "
            "suffix names (.md, .json), else html.",
        ),
    ] = None,
    plotlyjs: Annotated[
        PlotlyJsMode, typer.Option(help="embed: plotly.js inside the file (works offline); cdn: a script tag.")
    ] = PlotlyJsMode.embed,
) -> None:
    """Write one self-contained report from results directories."""
    fmt = fmt or format_named_by(output)
    text = render_report(list(results_dirs), fmt.value, plotlyjs.value)
    if output is not None and str(output) == STDOUT:
        typer.echo(text, nl=False)
        return
    written = _write(output or Path(f"report.{fmt.value}"), text)
    typer.echo(str(written))
