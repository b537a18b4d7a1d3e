"""``detprof parse`` and ``detprof diff``: one trace's top kernels, and two traces kernel by kernel."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from detprof.errors import UsageError
from detprof.formatting import OutputFormat

if TYPE_CHECKING:
    from detprof.traces.kernel_table import KernelTable

PARSE_DETAILS = (
    "The table labels kernels by short name (with abbreviated template arguments where several "
    "share one); --full-names shows whole demangled names. JSON and CSV always carry both."
)
DIFF_DETAILS = (
    "Kernels are paired by full name, or by short name with --by short (template instances "
    "merged). The table labels kernels by short name; --full-names shows whole demangled names; "
    "JSON and CSV always carry both.\n\n"
    "Two traces that share no kernel are a result, not an error (exit 0): the table says so in "
    "one line and lists the kernels only in BASE and only in OTHER instead of changes; JSON has "
    "kernels_in_common: 0. Exit 2: bad options; exit 3: a trace that cannot be read."
)
ByOption = Annotated[str, typer.Option(help="Group kernels by full name or short name: name|short.")]
FullNamesOption = Annotated[
    bool, typer.Option("--full-names", help="Table: show whole demangled kernel names instead of short ones.")
]
RankOption = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="PyTorch profiler trace folder with one file per rank: the rank to read (default: the only one).",
    ),
]


def parse(
    trace: Annotated[
        Path,
        typer.Argument(
            help="nsys .sqlite/.nsys-rep, nsys stats CSV, nvprof CSV, .xplane.pb or log dir, "
            "PyTorch profiler .json/.json.gz or trace dir"
        ),
    ],
    top: Annotated[int, typer.Option(min=1, help="How many kernels to list.")] = 20,
    by: ByOption = "name",
    device: Annotated[str, typer.Option(help="'all' or one device id.")] = "all",
    fmt: Annotated[OutputFormat, typer.Option("--format", help="table|json|csv")] = OutputFormat.table,
    full_names: FullNamesOption = False,
    rank: RankOption = None,
) -> None:
    from detprof.traces.parsers import load_trace

    group = _group_by(by)
    table = load_trace(trace, rank=rank)
    # The renderer (and pandas with it) after the trace: an nsys export is read while pandas loads.
    from detprof.traces import render as output

    output.print_parse(on_device(table, trace, device), top=top, by=group, fmt=fmt, full_names=full_names)


def on_device(table: KernelTable, trace: Path, device: str) -> KernelTable:
    """The kernels of one device (``--device ID``), or all of them; a device that ran none is refused, naming those
    that did."""
    if device == "all":
        return table
    if table.is_summary:
        raise UsageError(f"{trace}: a summary-only trace has no per-device kernels; use --device all")
    try:
        device_id = int(device)
    except ValueError as exc:
        raise UsageError(f"--device must be 'all' or an integer device id, not {device!r}") from exc
    present = sorted({int(d) for d in table.launches("device_id")["device_id"].dropna().unique()})
    if device_id not in present:
        raise UsageError(f"{trace}: no kernels on device {device_id}; devices with kernels: {present}")
    return table.on_device(device_id)


def diff(
    base: Annotated[Path, typer.Argument(help="The reference trace (e.g. default mode).")],
    other: Annotated[Path, typer.Argument(help="The trace to compare (e.g. deterministic mode).")],
    top: Annotated[int, typer.Option(min=1, help="How many kernels to list.")] = 20,
    by: Annotated[
        str,
        typer.Option(
            help="Group kernels by full name, short name, the framework op that launched them, or the model layer "
            "they ran in: name|short|op|layer."
        ),
    ] = "name",
    device: Annotated[str, typer.Option(help="'all' or one device id, the same in both traces.")] = "all",
    fmt: Annotated[OutputFormat, typer.Option("--format", help="table|json|csv")] = OutputFormat.table,
    full_names: FullNamesOption = False,
    rank: Annotated[
        int | None, typer.Option(min=0, help="PyTorch profiler trace folders: the rank to read in both.")
    ] = None,
) -> None:
    from detprof.traces.parsers import load_trace

    group = _group_by(by, parts=True)
    tables = tuple(on_device(load_trace(path, rank=rank), path, device) for path in (base, other))
    from detprof.traces import render as output

    if tables[0].cpu_ops != tables[1].cpu_ops:
        cpu, gpu = (base, other) if tables[0].cpu_ops else (other, base)
        typer.echo(
            f"detprof: warning: {cpu} holds a CPU's ops, {gpu} a GPU's kernels: the two name different work, and "
            "their times do not compare",
            err=True,
        )

    if group in PARTS:
        from detprof.traces.attribution import by_part

        tables = (by_part(tables[0], group), by_part(tables[1], group))
        output.print_diff(*tables, top=top, fmt=fmt, full_names=full_names, part=group)
        return
    output.print_diff(*tables, top=top, fmt=fmt, by=group, full_names=full_names)


PARTS = ("op", "layer")
"""``diff --by``: the framework op that launched each kernel, or the layer it ran in (``traces.attribution``)."""


def _group_by(by: str, parts: bool = False) -> str:
    mapping = {"name": "name", "short": "short_name", "short_name": "short_name"} | (
        {part: part for part in PARTS} if parts else {}
    )
    if by not in mapping:
        allowed = "'name', 'short', 'op' or 'layer'" if parts else "'name' or 'short'"
        raise UsageError(f"--by must be {allowed}, not {by!r}")
    return mapping[by]
