"""``nsys stats --report cuda_gpu_kern_sum --format csv`` (and its older name ``gpukernsum``).

The report's columns were renamed across releases (``Time(%)``/``Average``/``Minimum``
in 2020-2021, ``Time (%)``/``Avg (ns)``/``Med (ns)``/``StdDev (ns)`` from 2023) and
``--timeunit`` changes every unit suffix, so columns are recognised by pattern and each
carries its own unit. Users save stdout, so the "Generating ..."/"Processing ..." lines
and the ``** CUDA GPU Kernel Summary`` title may precede the table. The report has no
launches: it becomes a summary-only KernelTable.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import pandas as pd

from detprof.errors import InputError
from detprof.traces.kernel_names import short_kernel_name
from detprof.traces.kernel_table import SUMMARY_DTYPES, TIME_UNITS_NS, KernelTable, conform

_STAT_PATTERNS = {
    "total_ns": r"Total Time",
    "avg_ns": r"Avg|Average|Mean",
    "med_ns": r"Med|Median",
    "min_ns": r"Min|Minimum",
    "max_ns": r"Max|Maximum",
    "std_ns": r"StdDev|Std Dev|Std",
}
_MISSING = ("", "-", "N/A")
_UNIT_SUFFIX = r"(?:\s*\((?P<unit>[^)%]+)\))?"
_STAT_RES = {key: re.compile(rf"^(?:{alts}){_UNIT_SUFFIX}$") for key, alts in _STAT_PATTERNS.items()}


# Lines nsys prints around the report; they identify a saved report whose table is missing.
_REPORT_MARKERS = ("cuda_gpu_kern_sum", "gpukernsum", "CUDA GPU Kernel Summary")


def sniff(text: str) -> bool:
    """True for nsys kernel-summary output, with or without its table (format detection)."""
    if any(marker in text for marker in _REPORT_MARKERS):
        return True
    return any(_header_columns(fields) is not None for fields in _rows(text.splitlines()))


def load_nsys_stats_csv(path: Path) -> KernelTable:
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read as text ({exc})") from None
    rows = _rows(lines)
    for i, fields in enumerate(rows):
        columns = _header_columns(fields)
        if columns is not None:
            summary = _summary(path, columns, len(fields), rows[i + 1 :])
            return KernelTable(source=str(path), format="nsys-stats-csv", summary=summary)
    skipped = next((line.strip() for line in lines if line.strip().startswith("SKIPPED")), None)
    if skipped:
        raise InputError(f"{path}: nsys stats wrote no kernel table ({skipped})")
    raise InputError(f"{path}: no nsys kernel summary header (cuda_gpu_kern_sum / gpukernsum) found")


def _rows(lines: list[str]) -> list[list[str]]:
    return list(csv.reader(lines))


def _header_columns(fields: list[str]) -> dict[str, tuple[int, float]] | None:
    """Map summary columns to (index, ns per unit), or None if this is not the header.

    A column without a unit suffix takes the unit of ``Total Time``; the oldest reports
    print no suffix at all and are in nanoseconds.
    """
    names = [f.strip() for f in fields]
    if "Name" not in names or "Instances" not in names:
        return None
    found: dict[str, tuple[int, str | None]] = {}
    for index, name in enumerate(names):
        for key, pattern in _STAT_RES.items():
            match = pattern.match(name)
            if match and key not in found:
                found[key] = (index, match.group("unit"))
                break
    if "total_ns" not in found:
        return None
    default_unit = found["total_ns"][1] or "ns"
    columns: dict[str, tuple[int, float]] = {}
    for key, (index, unit) in found.items():
        scale = TIME_UNITS_NS.get((unit or default_unit).strip().lower())
        if scale is None:
            return None
        columns[key] = (index, scale)
    columns["name"] = (names.index("Name"), 1.0)
    columns["instances"] = (names.index("Instances"), 1.0)
    return columns


def _summary(path: Path, columns: dict[str, tuple[int, float]], width: int, rows: list[list[str]]) -> pd.DataFrame:
    records = []
    for fields in rows:
        if len(fields) != width:
            break
        record: dict[str, object] = {}
        for key, (index, scale) in columns.items():
            raw = fields[index].strip()
            if key == "name":
                record[key] = raw
            else:
                value = _number(raw)
                if value is None and raw not in _MISSING:
                    raise InputError(f"{path}: {raw!r} in a {key} column is not a number")
                if value is None and key in ("instances", "total_ns"):
                    raise InputError(f"{path}: kernel {fields[columns['name'][0]]!r} has no {key} value")
                record[key] = math.nan if value is None else value * scale
        records.append(record)
    if not records:
        raise InputError(f"{path}: nsys kernel summary without kernel rows")
    frame = pd.DataFrame.from_records(records)
    for key in _STAT_PATTERNS.keys() - columns.keys():
        frame[key] = math.nan
    frame["instances"] = frame["instances"].round().astype("int64")
    frame["total_ns"] = frame["total_ns"].round().astype("int64")
    frame["short_name"] = frame["name"].map(short_kernel_name)
    return conform(frame, SUMMARY_DTYPES)


def _number(raw: str) -> float | None:
    """Numbers as printed by nsys; thousands separators appear when users copy the table view."""
    try:
        return None if raw in _MISSING else float(raw.replace(",", ""))
    except ValueError:
        return None
