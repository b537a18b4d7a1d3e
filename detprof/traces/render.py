"""Console renderings of ``parse`` and ``diff``: a rich table, JSON or CSV.

The JSON shape of ``parse`` is a documented interface (scripts consume it), so it is
built in one function, ``parse_document``, and tested key by key. JSON and CSV always
carry full and short kernel names; a table on a terminal labels its rows with short ones
(``kernel_names.display_kernel_names``) unless asked for full names, because a demangled
signature wraps one row over dozens of lines. Off a terminal (``console.table_console``)
nothing wraps, so a table shows every column and whole names, one row per line, as
``nsys stats`` does. rich loads only for a table: JSON and CSV, what scripts ask for,
start without it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from detprof.console import print_table, table_console, unbounded
from detprof.formatting import OutputFormat, duration_ns, percent
from detprof.store import json_safe
from detprof.traces.kernel_names import DISPLAY_CHARS, display_kernel_names
from detprof.traces.kernel_table import KernelTable
from detprof.traces.kernel_tables import GroupBy, diff, kernels_in_common, top_n

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

WIDE_TABLE = 140
SHORT_NAMES_NOTE = "--full-names shows whole kernel names"

KERNEL_FIELDS = [
    "name",
    "short_name",
    "category",
    "instances",
    "total_ns",
    "pct",
    "avg_ns",
    "med_ns",
    "min_ns",
    "max_ns",
    "std_ns",
]


def parse_document(table: KernelTable, top: int = 20, by: GroupBy = "name") -> dict[str, Any]:
    head, other_ns = top_n(table, top, by)
    return {
        "source": table.source,
        "format": table.format,
        "summary_only": table.is_summary,
        "devices": [
            {"id": d.id, "name": d.name, "sm_count": d.sm_count, "compute_capability": d.compute_capability}
            for d in table.devices
        ],
        "kernel_count": table.kernel_count,
        "total_ns": table.total_ns,
        "memory_ns": table.memory_ns,
        "other_ns": other_ns,
        "kernels": [{f: json_safe(row[f]) for f in KERNEL_FIELDS} for row in head.to_dict("records")],
    }


def row_labels(
    console: Console, names: list[str], by: GroupBy, full_names: bool, room: int = DISPLAY_CHARS
) -> tuple[list[str], bool]:
    """What a table's Name column shows, and whether that is shorter than the names themselves.

    Short labels keep a row on one line of a terminal, each at most ``room`` characters (what the other columns
    leave: ``_name_room``), so that the labels that tell kernels apart stay apart where the column ends; off a
    terminal no row wraps, so names stay whole.
    """
    if full_names or by == "short_name" or unbounded(console):
        return names, False
    labels = display_kernel_names(names, max(MIN_NAME_CHARS, min(DISPLAY_CHARS, room)))
    return labels, labels != names


def _name_room(
    console: Console, headers: Sequence[str], rows: Sequence[Sequence[str]], caps: Sequence[int | None] = ()
) -> int:
    """The characters a row's name has once the other columns (``headers`` over ``rows``, each at most its cap,
    where ``caps`` gives one) take what their cells need, each with its padding and border, as the table lays them
    out."""
    widths = [
        min(max([len(header), *(len(row[i]) for row in rows)]), (caps[i] if i < len(caps) else None) or sys.maxsize)
        for i, header in enumerate(headers)
    ]
    return console.width - sum(width + 3 for width in widths) - 4


MIN_NAME_CHARS = 18
"""The name column's least width (20) less its padding: a label no shorter still tells most kernels apart."""


def _caption(notes: list[str]) -> str | None:
    return f"({'; '.join(notes)})" if notes else None


def print_parse(table: KernelTable, top: int, by: GroupBy, fmt: OutputFormat, full_names: bool = False) -> None:
    doc = parse_document(table, top, by)
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    if fmt is OutputFormat.csv:
        pd.DataFrame(doc["kernels"], columns=KERNEL_FIELDS).to_csv(sys.stdout, index=False)
        return
    from rich.markup import escape
    from rich.table import Table

    console = table_console()
    devices = ", ".join(
        f"{d['id']}: {d['name'] or '?'}" + (f" (cc {d['compute_capability']})" if d["compute_capability"] else "")
        for d in doc["devices"]
    )
    console.print(f"[bold]{escape(doc['source'])}[/] ({doc['format']})  devices: {escape(devices) or '-'}")
    console.print(
        f"{doc['kernel_count']:,} kernel launches, {duration_ns(doc['total_ns'])} kernel time"
        + (f", {duration_ns(doc['memory_ns'])} memory activity" if doc["memory_ns"] is not None else "")
    )
    wide = console.width >= WIDE_TABLE
    columns = ["Time %", "Total", "Instances", "Avg"] if wide else ["%", "Total", "Count", "Avg"]
    columns += ["Med", "Min", "Max", "StdDev"] if wide else []
    category_cap = None if wide else 12
    rows = []
    for k in doc["kernels"]:
        cells = [f"{k['pct']:.1f}", duration_ns(k["total_ns"]), f"{k['instances']:,}", duration_ns(k["avg_ns"])]
        if wide:
            cells += [duration_ns(k[f]) for f in ("med_ns", "min_ns", "max_ns", "std_ns")]
        rows.append([*cells, str(k["category"])])
    others = []
    if doc["other_ns"]:
        share = doc["other_ns"] / doc["total_ns"] * 100 if doc["total_ns"] else 0.0
        others = [f"{share:.1f}", duration_ns(doc["other_ns"]), *[""] * (len(columns) - 2), ""]
    caps = [None] * len(columns) + [category_cap]
    room = _name_room(console, [*columns, "Category"], [*rows, *([others] if others else [])], caps)
    labels, shortened = row_labels(console, [k["name"] for k in doc["kernels"]], by, full_names, room)
    notes = [] if wide else ["a wider terminal, or --format csv/json, shows med, min, max, std"]
    notes += [SHORT_NAMES_NOTE] if shortened else []
    grid = Table(caption=_caption(notes))
    for col in columns:
        grid.add_column(col, justify="right", no_wrap=True)
    grid.add_column("Category", max_width=category_cap, no_wrap=True)
    _add_name_column(grid, "Name", whole=full_names)
    for cells, label in zip(rows, labels, strict=True):
        grid.add_row(*cells, _name_cell(label, whole=full_names))
    if others:
        grid.add_row(*others, "(all other kernels)")
    print_table(console, grid)


def print_diff(
    base: KernelTable,
    other: KernelTable,
    top: int,
    fmt: OutputFormat,
    by: GroupBy = "name",
    full_names: bool = False,
    part: str | None = None,
) -> None:
    """The diff of two traces by kernel, or by ``part`` (``op``, ``layer``: tables ``attribution.by_part`` named by
    it), whose rows then say so."""
    table = diff(base, other, by)
    common = kernels_in_common(table)
    head = table.head(top)
    if fmt is OutputFormat.json:
        doc = {
            "base": {"source": base.source, "format": base.format, "total_ns": base.total_ns},
            "other": {"source": other.source, "format": other.format, "total_ns": other.total_ns},
            "by": part or ("short" if by == "short_name" else "name"),
            "kernels_in_common": common,
            "delta_ns": other.total_ns - base.total_ns,
            "kernels": [{k: json_safe(v) for k, v in row.items()} for row in head.to_dict("records")],
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    if fmt is OutputFormat.csv:
        head.to_csv(sys.stdout, index=False)
        return
    from rich.markup import escape
    from rich.table import Table

    console = table_console()
    unit = part or "kernel"
    shown_by: GroupBy = "short_name" if part else by
    totals = (
        f"base {escape(base.source)}: {duration_ns(base.total_ns)}   "
        f"other {escape(other.source)}: {duration_ns(other.total_ns)}"
    )
    if common == 0:
        console.print(totals)
        console.print(escape(no_common_kernels_line(table, by, unit)), soft_wrap=True)  # one line, even when narrow
        _print_one_sided(console, table, "removed", top, shown_by, full_names, unit)
        _print_one_sided(console, table, "added", top, shown_by, full_names, unit)
        return
    ratio = other.total_ns / base.total_ns if base.total_ns else float("nan")
    console.print(f"{totals}   ratio {ratio:.3f}x   {unit}s in common: {common:,}")
    wide = console.width >= WIDE_TABLE
    columns = ["Status", "Delta", "Share of change", "Base total", "Other total"]
    columns += ["Base n", "Other n", "Category"] if wide else []
    rows = []
    for row in head.to_dict("records"):
        cells = [
            row["status"],
            duration_ns(row["delta_ns"]),
            percent(row["share_of_change"]),
            duration_ns(row["total_ns_base"]),
            duration_ns(row["total_ns_other"]),
        ]
        if wide:
            cells += [f"{row['instances_base']:,}", f"{row['instances_other']:,}", str(row["category"])]
        rows.append(cells)
    room = _name_room(console, columns, rows)
    labels, shortened = row_labels(console, [str(n) for n in head["name"]], shown_by, full_names, room)
    notes = [] if wide else ["a wider terminal, or --format csv/json, shows launch counts and categories"]
    notes += [SHORT_NAMES_NOTE] if shortened else []
    grid = Table(caption=_caption(notes))
    for col in columns:
        grid.add_column(col, no_wrap=True)
    whole = full_names or unit != "kernel"
    _add_name_column(grid, _name_column(unit), whole=whole)
    for cells, label in zip(rows, labels, strict=True):
        grid.add_row(*cells, _name_cell(label, whole=whole))
    print_table(console, grid)


def _add_name_column(grid: Table, header: str, *, whole: bool) -> None:
    """Whole names (``--full-names``; ops and layers, which no table shortens) fold over lines as asked; a kernel's
    short label keeps its row on one line of a terminal, cut at the table's edge."""
    grid.add_column(header, min_width=20, overflow="fold" if whole else "ellipsis")


def _name_cell(label: str, *, whole: bool) -> Text | str:
    """A row's name: a whole name as the column folds it; a kernel's short label on one line, cut with an ellipsis
    where the column ends, even where it holds spaces (a template's arguments) that a wrap would break it at. The
    column stays one that the table narrows to the terminal: only its cells keep from wrapping."""
    from rich.markup import escape
    from rich.text import Text

    return escape(label) if whole else Text(label, no_wrap=True, overflow="ellipsis")


def _name_column(unit: str) -> str:
    """A kernel's row is named by ``Name``; an op's or a layer's by what it is."""
    return "Name" if unit == "kernel" else unit.capitalize()


def no_common_kernels_line(table: pd.DataFrame, by: GroupBy, unit: str = "kernel") -> str:
    """Why a diff of two traces that share no kernel shows no changes, in one line.

    Grouped by full name, two builds of the same program can share no signature and still
    share base names; then the line says how many ``--by short`` would pair up.
    """
    removed = table[table["status"] == "removed"]
    added = table[table["status"] == "added"]
    line = (
        f"no {unit} in common: BASE has {len(removed):,} {unit}s, OTHER has {len(added):,}; "
        f"a ratio per {unit} would mean nothing"
    )
    if by == "name" and unit == "kernel":
        shared = set(removed["short_name"].dropna()) & set(added["short_name"].dropna())
        if shared:
            line += f" (--by short pairs up {len(shared):,} short names)"
    return line


def _print_one_sided(
    console: Console, table: pd.DataFrame, status: str, top: int, by: GroupBy, full_names: bool, unit: str
) -> None:
    """The kernels (ops, layers) of one side only, by their time on that side: all a diff can say without a common
    one."""
    from rich.table import Table

    side = "base" if status == "removed" else "other"
    rows = table[table["status"] == status].sort_values(
        [f"total_ns_{side}", "name"], ascending=[False, True], kind="stable"
    )
    head = rows.head(top)
    cells = [
        [duration_ns(row[f"total_ns_{side}"]), f"{row[f'instances_{side}']:,}", str(row["category"])]
        for row in head.to_dict("records")
    ]
    room = _name_room(console, ["Total", "Count", "Category"], cells)
    labels, shortened = row_labels(console, [str(n) for n in head["name"]], by, full_names, room)
    notes = [f"{len(rows) - len(head):,} more not shown"] if len(rows) > len(head) else []
    notes += [SHORT_NAMES_NOTE] if shortened else []
    title = f"Only in {'BASE' if side == 'base' else 'OTHER'} ({status})"
    grid = Table(title=title, caption=_caption(notes))
    for col in ("Total", "Count", "Category"):
        grid.add_column(col, justify="right" if col != "Category" else "left", no_wrap=True)
    whole = full_names or unit != "kernel"
    _add_name_column(grid, _name_column(unit), whole=whole)
    for row_cells, label in zip(cells, labels, strict=True):
        grid.add_row(*row_cells, _name_cell(label, whole=whole))
    print_table(console, grid)
