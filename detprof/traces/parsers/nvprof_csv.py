"""nvprof ``--csv`` output: ``--print-gpu-trace`` launches or the default summary.

nvprof writes one section per profiled process (``==PID==`` lines, a header, then a
units row in which every column has its own unit, e.g. ``s,ms,,,...,KB,...``). A run
under MPI or with child processes yields several sections in one file; they all count.
In trace mode a kernel row is one with a grid size; ``[CUDA memcpy ...]``,
``[CUDA memset]`` and unified-memory transfers are memory activity, and page-fault
groups are neither. In summary mode only ``GPU activities`` rows that are not
``[CUDA ...]`` operations are kernels.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from detprof.errors import InputError
from detprof.traces.kernel_names import short_kernel_name
from detprof.traces.kernel_table import (
    KERNEL_DTYPES,
    MEMORY_DTYPES,
    SUMMARY_DTYPES,
    TIME_UNITS_NS,
    Device,
    KernelTable,
    conform,
)
from detprof.traces.kernel_tables import sum_per_kernel

# nvprof sizes are binary multiples (its MB/s and sizes agree only with 2**20).
SIZE_UNITS_B = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}
_KNOWN_UNITS = {*TIME_UNITS_NS, *SIZE_UNITS_B, "%", "GB/s", "MB/s", "KB/s", "B/s", "TB/s"}

TRACE_REQUIRED = ("Start", "Duration", "Grid X", "Name")
SUMMARY_REQUIRED = ("Time", "Calls", "Avg", "Min", "Max", "Name")

_DIMS = {
    "grid_x": "Grid X",
    "grid_y": "Grid Y",
    "grid_z": "Grid Z",
    "block_x": "Block X",
    "block_y": "Block Y",
    "block_z": "Block Z",
}
_DEVICE = re.compile(r"^(?P<name>.*?)\s*\((?P<id>\d+)\)$")
_CUDA_MEMORY = re.compile(r"^\[CUDA (?P<op>memcpy|memset)(?: (?P<dir>\w+))?\]$")
_UNIFIED_COPY = re.compile(r"^\[Unified Memory Memcpy (?P<dir>\w+)\]$")


@dataclass
class _Section:
    header: list[str]
    units: list[str] | None = None
    rows: list[list[str]] = field(default_factory=list)

    @property
    def mode(self) -> str | None:
        return _mode(self.header)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=self.header, dtype=object)

    def unit(self, column: str) -> str:
        return dict(zip(self.header, self.units or [], strict=True)).get(column, "")


def sniff(text: str) -> bool:
    """True when the text holds an nvprof trace or summary header (used for format detection)."""
    return any(_mode(fields) is not None for fields in csv.reader(_table_lines(text.splitlines())))


def load_nvprof_csv(path: Path) -> KernelTable:
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read as text ({exc})") from None
    sections = _sections(path, lines)
    if not sections:
        raise InputError(f"{path}: no nvprof CSV header (trace or summary) found")
    # A trace run can also print API summaries; its launches are in the trace sections.
    traces = [s for s in sections if s.mode == "trace"]
    if traces:
        return _trace_table(path, traces)
    return _summary_table(path, sections)


def _table_lines(lines: list[str]) -> list[str]:
    """Lines that belong to CSV tables: nvprof's own messages start with ``==PID==``."""
    return [line for line in lines if not line.startswith("==")]


def _mode(header: list[str]) -> str | None:
    names = set(header)
    if all(c in names for c in TRACE_REQUIRED):
        return "trace"
    if all(c in names for c in SUMMARY_REQUIRED) and "Duration" not in names:
        return "summary"
    return None


def _sections(path: Path, lines: list[str]) -> list[_Section]:
    sections: list[_Section] = []
    current: _Section | None = None
    for lineno, line in enumerate(lines, start=1):
        if line.startswith("==") or not line.strip():
            current = None
            continue
        fields = next(csv.reader([line]))
        if _mode(fields) is not None:
            current = _Section(header=fields)
            sections.append(current)
        elif current is None:
            continue
        elif current.units is None:
            if len(fields) != len(current.header) or not set(fields) <= _KNOWN_UNITS | {""}:
                raise InputError(f"{path}:{lineno}: expected nvprof's units row after the header")
            current.units = fields
        elif len(fields) == len(current.header):
            current.rows.append(fields)
        else:
            raise InputError(f"{path}:{lineno}: row has {len(fields)} fields, the header has {len(current.header)}")
    for section in sections:
        if section.units is None:
            raise InputError(f"{path}: nvprof header without its units row")
    return sections


def _numbers(path: Path, frame: pd.DataFrame, column: str) -> pd.Series:
    values = frame[column].str.strip().replace("", None)
    numbers = pd.to_numeric(values, errors="coerce")
    bad = values.notna() & numbers.isna()
    if bad.any():
        raise InputError(f"{path}: column {column!r} has a non-numeric value {values[bad].iloc[0]!r}")
    return numbers.astype("float64")


def _scaled(path: Path, section: _Section, frame: pd.DataFrame, column: str, units: dict[str, float]) -> pd.Series:
    """A column in base units (ns or bytes); a column that no row fills needs no unit."""
    numbers = _numbers(path, frame, column)
    if numbers.isna().all():
        return numbers
    unit = section.unit(column)
    if unit not in units:
        raise InputError(f"{path}: column {column!r} has unit {unit!r}; expected one of {sorted(units)}")
    return numbers * units[unit]


def _ns(series: pd.Series) -> np.ndarray:
    return np.rint(series.to_numpy(dtype=np.float64)).astype(np.int64)


def _trace_table(path: Path, sections: list[_Section]) -> KernelTable:
    kernels, memory, devices = [], [], {}
    for section in sections:
        frame = section.frame()
        start = _scaled(path, section, frame, "Start", TIME_UNITS_NS)
        duration = _scaled(path, section, frame, "Duration", TIME_UNITS_NS)
        name = frame["Name"]
        device_id = pd.Series(pd.NA, index=frame.index, dtype="Int64")
        if "Device" in frame.columns:
            parsed = frame["Device"].str.extract(_DEVICE)
            device_id = pd.to_numeric(parsed["id"]).astype("Int64")
            for dev_name, dev_id in parsed.dropna().drop_duplicates("id").itertuples(index=False):
                devices.setdefault(int(dev_id), Device(id=int(dev_id), name=dev_name or None))
        stream = _numbers(path, frame, "Stream").astype("Int64") if "Stream" in frame.columns else None

        is_kernel = frame["Grid X"].str.strip() != ""
        if (is_kernel & (start.isna() | duration.isna())).any():
            raise InputError(f"{path}: a kernel row has no Start or Duration")
        k = pd.DataFrame({"name": name[is_kernel], "start_ns": _ns(start[is_kernel])})
        k["dur_ns"] = _ns(duration[is_kernel])
        k["device_id"] = device_id[is_kernel]
        if stream is not None:
            k["stream_id"] = stream[is_kernel]
        if "Correlation_ID" in frame.columns:
            k["correlation_id"] = _numbers(path, frame, "Correlation_ID")[is_kernel].astype("Int64")
        for dst, src in _DIMS.items():
            if src in frame.columns:
                k[dst] = _numbers(path, frame, src)[is_kernel].astype("Int64")
        kernels.append(k)
        memory.append(_memory_rows(path, section, frame, start, duration, device_id, stream))

    table = pd.concat(kernels, ignore_index=True)
    if table.empty:
        raise InputError(f"{path}: nvprof trace without kernel rows (no row has a Grid X)")
    table["name"] = table["name"].astype("category")
    table["short_name"] = table["name"].map(short_kernel_name).astype("category")
    return KernelTable(
        source=str(path),
        format="nvprof-trace-csv",
        kernels=conform(table, KERNEL_DTYPES),
        memory=conform(pd.concat(memory, ignore_index=True), MEMORY_DTYPES),
        devices=[devices[k] for k in sorted(devices)],
    )


def _memory_rows(
    path: Path,
    section: _Section,
    frame: pd.DataFrame,
    start: pd.Series,
    duration: pd.Series,
    device_id: pd.Series,
    stream: pd.Series | None,
) -> pd.DataFrame:
    """memcpy/memset rows and unified-memory transfers; page-fault groups are not transfers."""
    cuda = frame["Name"].str.extract(_CUDA_MEMORY)
    unified = frame["Name"].str.extract(_UNIFIED_COPY)
    kind = (cuda["op"] + " " + cuda["dir"]).fillna(cuda["op"])
    is_unified = unified["dir"].notna()
    kind = kind.where(~is_unified, "unified memcpy " + unified["dir"])
    keep = kind.notna() & start.notna() & duration.notna()
    size = pd.Series(np.nan, index=frame.index)
    if "Size" in frame.columns:
        size = _scaled(path, section, frame, "Size", SIZE_UNITS_B)
    if "Unified Memory" in frame.columns:
        # The column also holds page-fault counts and PCs; only transfers have byte counts.
        transfers = frame[is_unified]
        size = size.where(~is_unified, _scaled(path, section, transfers, "Unified Memory", SIZE_UNITS_B))
    out = pd.DataFrame({"kind": kind[keep], "start_ns": _ns(start[keep]), "dur_ns": _ns(duration[keep])})
    out["bytes"] = size[keep].round().astype("Int64")
    out["device_id"] = device_id[keep]
    if stream is not None:
        out["stream_id"] = stream[keep]
    return out


def _summary_table(path: Path, sections: list[_Section]) -> KernelTable:
    parts = []
    for section in sections:
        frame = section.frame()
        is_gpu = frame["Type"].str.strip() == "GPU activities" if "Type" in frame.columns else True
        is_kernel = is_gpu & ~frame["Name"].str.startswith("[CUDA")
        part = pd.DataFrame({"name": frame["Name"][is_kernel]})
        part["instances"] = _numbers(path, frame, "Calls")[is_kernel]
        for dst, src in (("total_ns", "Time"), ("min_ns", "Min"), ("max_ns", "Max")):
            part[dst] = _scaled(path, section, frame, src, TIME_UNITS_NS)[is_kernel]
        parts.append(part)
    rows = pd.concat(parts, ignore_index=True)
    if rows.empty:
        raise InputError(f"{path}: nvprof summary without kernel rows (no non-[CUDA] GPU activities)")
    if rows[["instances", "total_ns"]].isna().any().any():
        raise InputError(f"{path}: a kernel row lacks its Calls or Time value")
    # One row per kernel: several processes (sections) may each list the same kernel.
    summary = sum_per_kernel(rows)
    summary["instances"] = summary["instances"].round().astype("int64")
    summary["total_ns"] = summary["total_ns"].round().astype("int64")
    summary["avg_ns"] = summary["total_ns"] / summary["instances"]
    summary["med_ns"] = np.nan
    summary["std_ns"] = np.nan
    summary["short_name"] = summary["name"].map(short_kernel_name)
    return KernelTable(source=str(path), format="nvprof-summary-csv", summary=conform(summary, SUMMARY_DTYPES))
