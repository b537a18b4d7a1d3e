"""Console renderings of ``parse`` and ``diff``: a rich table, JSON or CSV.

The JSON shape of ``parse`` is a documented interface (scripts consume it), so it is
built in one function, ``parse_document``, and tested key by key.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from detprof.formatting import OutputFormat, duration_ns, percent
from detprof.store import json_safe
from detprof.traces.kernel_table import KernelTable
from detprof.traces.kernel_tables import GroupBy, diff, top_n

WIDE_TABLE = 140

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
            {k: v for k, v in d.to_dict().items() if k in ("id", "name", "sm_count", "compute_capability")}
            for d in table.devices
        ],
        "kernel_count": table.kernel_count,
        "total_ns": table.total_ns,
        "memory_ns": table.memory_ns,
        "other_ns": other_ns,
        "kernels": [{f: json_safe(row[f]) for f in KERNEL_FIELDS} for row in head.to_dict("records")],
    }


def print_parse(table: KernelTable, top: int, by: GroupBy, fmt: OutputFormat) -> None:
    doc = parse_document(table, top, by)
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    if fmt is OutputFormat.csv:
        pd.DataFrame(doc["kernels"], columns=KERNEL_FIELDS).to_csv(sys.stdout, index=False)
        return
    console = Console()
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
    grid = Table(caption=None if wide else "(a wider terminal, or --format csv/json, shows med, min, max, std)")
    for col in columns:
        grid.add_column(col, justify="right", no_wrap=True)
    grid.add_column("Category", max_width=None if wide else 12)
    grid.add_column("Name", min_width=20, overflow="fold")
    for k in doc["kernels"]:
        cells = [f"{k['pct']:.1f}", duration_ns(k["total_ns"]), f"{k['instances']:,}", duration_ns(k["avg_ns"])]
        if wide:
            cells += [duration_ns(k[f]) for f in ("med_ns", "min_ns", "max_ns", "std_ns")]
        grid.add_row(*cells, k["category"], escape(k["name"] if by == "name" else k["short_name"]))
    if doc["other_ns"]:
        share = doc["other_ns"] / doc["total_ns"] * 100 if doc["total_ns"] else 0.0
        blanks = [""] * (len(columns) - 2)
        grid.add_row(f"{share:.1f}", duration_ns(doc["other_ns"]), *blanks, "", "(all other kernels)")
    console.print(grid)


def print_diff(base: KernelTable, other: KernelTable, top: int, fmt: OutputFormat) -> None:
    table = diff(base, other)
    head = table.head(top)
    if fmt is OutputFormat.json:
        doc = {
            "base": {"source": base.source, "format": base.format, "total_ns": base.total_ns},
            "other": {"source": other.source, "format": other.format, "total_ns": other.total_ns},
            "delta_ns": other.total_ns - base.total_ns,
            "kernels": [{k: json_safe(v) for k, v in row.items()} for row in head.to_dict("records")],
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    if fmt is OutputFormat.csv:
        head.to_csv(sys.stdout, index=False)
        return
    console = Console()
    ratio = other.total_ns / base.total_ns if base.total_ns else float("nan")
    console.print(
        f"base {escape(base.source)}: {duration_ns(base.total_ns)}   other {escape(other.source)}: "
        f"{duration_ns(other.total_ns)}   ratio {ratio:.3f}x"
    )
    grid = Table()
    for col in (
        "Status",
        "Delta",
        "Share of change",
        "Base total",
        "Other total",
        "Base n",
        "Other n",
        "Category",
        "Name",
    ):
        grid.add_column(col, overflow="fold", no_wrap=col != "Name")
    for row in head.to_dict("records"):
        grid.add_row(
            row["status"],
            duration_ns(row["delta_ns"]),
            percent(row["share_of_change"]),
            duration_ns(row["total_ns_base"]),
            duration_ns(row["total_ns_other"]),
            f"{row['instances_base']:,}",
            f"{row['instances_other']:,}",
            str(row["category"]),
            escape(str(row["name"])),
        )
    console.print(grid)
