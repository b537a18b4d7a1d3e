"""What the documentation shows from detprof itself, made at build time so that it cannot drift from the code or data.

- ``detprof-help``: every command's ``--help`` as the CLI prints it (the reference's options);
- ``detprof-record TYPE``: a record type's fields from ``detprof/records.py``, with their comments;
- ``detprof-gpu-results``: what detprof measured on GPUs, from the package's ``gpu_reference.json`` (itself read
  from ``reference/`` by ``make reference``), each row with its GPU, date, versions and source folder;
- ``detprof-benchmarks``: each benchmark's last recorded result from ``benchmarks/results/*.json``
  (``benchmarks.results.record``), with the date, commit and machine it was measured on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_type_hints

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK_RESULTS = ROOT / "benchmarks" / "results"
HELP_WIDTH = 100


def _table(headers: list[str], rows: list[list[str]]) -> nodes.table:
    table = nodes.table()
    group = nodes.tgroup(cols=len(headers))
    table += group
    group.extend(nodes.colspec(colwidth=1) for _ in headers)
    head, body = nodes.thead(), nodes.tbody()
    group += head
    group += body
    for target, cells in ((head, headers), *((body, row) for row in rows)):
        row_node = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += nodes.paragraph(text=cell)
            row_node += entry
        target += row_node
    return table


def command_help(name: str) -> str:
    """``detprof NAME --help`` as a user's terminal of ``HELP_WIDTH`` columns shows it."""
    from typer.testing import CliRunner

    from detprof import cli

    app = cli.build_app([name])
    result = CliRunner().invoke(app, [name, "--help"], prog_name="detprof", terminal_width=HELP_WIDTH)
    if result.exit_code != 0:
        raise RuntimeError(f"detprof {name} --help ended {result.exit_code}: {result.output}")
    return result.output


class CommandHelp(SphinxDirective):
    """Every command of ``detprof``, in the order ``detprof --help`` lists them, each with its whole help."""

    def run(self) -> list[nodes.Node]:
        from detprof import cli

        found: list[nodes.Node] = []
        for name in cli.command_names():
            section = nodes.section(ids=[f"detprof-{name}"])
            section += nodes.title(text=f"detprof {name}")
            section += nodes.literal_block(text=command_help(name).rstrip(), language="text")
            found.append(section)
        return found


class RecordFields(SphinxDirective):
    """A record type of ``detprof.records``: each field, its type and the comment the code gives it."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        import detprof.records as records

        name = self.arguments[0]
        kind = getattr(records, name, None)
        if kind is None:
            raise self.error(f"detprof.records has no record type {name!r}")
        comments = ModuleAnalyzer.for_module("detprof.records").find_attr_docs()
        rows = [
            [field, _type_name(hint), " ".join(comments.get((name, field), [])).strip()]
            for field, hint in get_type_hints(kind).items()
        ]
        return [_table(["Field", "Type", "What it holds"], rows)]


def _type_name(hint: Any) -> str:
    """``int``, ``list[str]``, ``dict[str, Any] | None``: a field's type as its annotation reads."""
    if getattr(hint, "__args__", None) is None and hasattr(hint, "__name__"):
        return str(hint.__name__)
    return str(hint).replace("typing.", "")


class GpuResults(SphinxDirective):
    """One table per GPU run that ``make reference`` shipped: each model's kernel-time overhead per framework."""

    def run(self) -> list[nodes.Node]:
        from detprof.reports import cells, gpu_reference

        found: list[nodes.Node] = []
        for run in cells.gpu_reference_tables(gpu_reference.shipped()):
            found.append(nodes.paragraph(text=f"{run.title}: {run.versions}"))
            found.append(_table(list(run.headers), [[str(cell) for cell in row] for row in run.rows]))
        if not found:
            found.append(nodes.paragraph(text="No GPU run is shipped with this installation."))
        return found


class BenchmarkResults(SphinxDirective):
    """Each benchmark's last result as its JSON file records it: target, figures, verdict, where and when."""

    def run(self) -> list[nodes.Node]:
        folder = BENCHMARK_RESULTS
        rows = []
        for path in sorted(folder.glob("*.json")):
            self.env.note_dependency(str(path))
            result = json.loads(path.read_text())
            machine = result["machine"]
            where = f"{result['date']}, {result['commit']}, {machine['cores']} cores, load {machine['load']}"
            checks = "; ".join(f"{label} ({'met' if ok else 'missed'})" for label, ok in result["checks"].items())
            rows.append([result["benchmark"], result["target"], checks, where])
        if not rows:
            return [nodes.paragraph(text="No benchmark result is recorded in benchmarks/results/ yet.")]
        return [_table(["Benchmark", "What it measures", "Measured against each target", "Measured on"], rows)]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("detprof-help", CommandHelp)
    app.add_directive("detprof-record", RecordFields)
    app.add_directive("detprof-gpu-results", GpuResults)
    app.add_directive("detprof-benchmarks", BenchmarkResults)
    return {"parallel_read_safe": True, "version": "1"}
