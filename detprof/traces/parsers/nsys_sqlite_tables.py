"""The pandas half of the nsys SQLite parser: launches, names, devices, memory and NVTX as a KernelTable.

``nsys_sqlite`` checks the file and starts reading the launches before this module (and
with it pandas) is imported; here the read is awaited and the tables are built. The
integer name ids become pandas Categoricals whose categories are only the strings used, so
no Python object is created per launch. The small tables (devices, memory, NVTX) go through
the standard library.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from dataclasses import replace

import numpy as np
import pandas as pd

from detprof.errors import InputError
from detprof.traces.kernel_table import (
    KERNEL_DTYPES,
    MEMORY_DTYPES,
    UNNAMED,
    Device,
    KernelTable,
    conform,
    empty,
    range_table,
)
from detprof.traces.parsers.nsys_ops import NvtxRanges
from detprof.traces.parsers.nsys_schema import (
    API_TABLE,
    EAGER_KERNEL_COLUMNS,
    GPU_TABLES,
    GRAPH_LAUNCH_CALLS,
    KERNEL_TABLE,
    MEMCPY_ENUM,
    MEMCPY_TABLE,
    MEMSET_TABLE,
    STRINGS_TABLE,
    LaunchRead,
    columns,
    first,
    nvtx_range_rows,
)
from detprof.traces.parsers.sqlite_columns import IntColumn, read_int_columns

# copyKind values of CUPTI's CUpti_ActivityMemcpyKind, for exports without the ENUM tables
# (before 2022); the spelling is nvprof's, so kinds compare across trace formats.
_COPY_KINDS = {
    0: "unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
}
_UNIFIED_COPY_KINDS = {11: "HtoD", 12: "DtoH", 13: "DtoD"}
_ENUM_COPY = re.compile(r"^CUDA_MEMCPY_KIND_(UVM_)?([A-Z])TO([A-Z])$")


_STRING_LOOKUP_CHUNK = 500
_EAGER_DTYPES = {c: KERNEL_DTYPES[c] for c in EAGER_KERNEL_COLUMNS}


def kernel_table(conn: sqlite3.Connection, launches: LaunchRead, shown: str) -> KernelTable:
    """The KernelTable of an export whose launches ``launches`` is reading."""
    kernels = _kernels(conn, launches, shown)
    if kernels.empty:
        raise InputError(f"{shown}: empty trace: {KERNEL_TABLE} has no rows")
    tables = set(launches.tables)
    table = KernelTable(
        source=shown,
        format="nsys-sqlite",
        kernels=kernels,
        memory=_memory(conn, tables),
        devices=_devices(conn, tables, kernels),
        nvtx=_nvtx(conn, launches.tables),
        graph_launches=_graph_launches(conn, tables),
    )
    later = launches.later
    ranges = NvtxRanges.read(conn, launches.tables)
    if ranges is not None and not launches.defer:
        return replace(table, kernels=conform(kernels.assign(**ranges.launching_ops(conn)), KERNEL_DTYPES))
    if not later and ranges is None:
        return table

    def complete(kernels: pd.DataFrame) -> pd.DataFrame:
        if later:
            rest = read_int_columns(launches.uri, KERNEL_TABLE, later, launches.rows, shown)
            kernels = kernels.assign(**_int_arrays(rest))
        if ranges is not None:
            with contextlib.closing(sqlite3.connect(launches.uri, uri=True)) as again:
                kernels = kernels.assign(**ranges.launching_ops(again))
        return conform(kernels, KERNEL_DTYPES)

    return table.defer_columns(complete)


def _kernels(conn: sqlite3.Connection, launches: LaunchRead, shown: str) -> pd.DataFrame:
    """The launches read at once: with deferred columns, only those of a top-N table."""
    data = launches.eager.result()
    if data["dur_ns"].null.any():  # "end" - start is null where either is
        raise InputError(f"{shown}: {KERNEL_TABLE} has kernels without start or end time")
    names = {field: _names(conn, data.pop(field)) for field in ("name", "short_name") if field in data}
    frame = pd.DataFrame({**names, **_int_arrays(data)}, copy=False)
    if "short_name" not in frame.columns:
        frame["short_name"] = frame["name"]
    return conform(frame, _EAGER_DTYPES if launches.later else KERNEL_DTYPES)


def _int_arrays(data: dict[str, IntColumn]) -> dict[str, object]:
    """Integer columns as KernelTable columns: times as plain int64 (never null: checked on
    ``"end" - start``), the others nullable."""
    return {
        field: column.values if field in ("start_ns", "dur_ns") else pd.arrays.IntegerArray(column.values, column.null)
        for field, column in data.items()
    }


def _names(conn: sqlite3.Connection, ids: IntColumn) -> pd.Categorical:
    """StringIds ids -> a Categorical of their strings, one string object per distinct id."""
    codes, distinct = pd.factorize(pd.arrays.IntegerArray(ids.values, ids.null))
    wanted = [int(i) for i in distinct]
    strings = _strings(conn, wanted)
    values = [strings.get(i, f"<string id {i}>") for i in wanted]
    if ids.null.any():
        codes = np.where(codes < 0, len(values), codes)
        values.append(UNNAMED)
    categories, remap = np.unique(np.array(values, dtype=object), return_inverse=True)
    return pd.Categorical.from_codes(remap[codes], categories=pd.Index(categories, dtype="str"))


def _strings(conn: sqlite3.Connection, wanted: list[int]) -> dict[int, str]:
    found: dict[int, str] = {}
    for start in range(0, len(wanted), _STRING_LOOKUP_CHUNK):
        chunk = wanted[start : start + _STRING_LOOKUP_CHUNK]
        marks = ", ".join("?" * len(chunk))
        found.update(conn.execute(f"SELECT id, value FROM {STRINGS_TABLE} WHERE id IN ({marks})", chunk))
    return found


def _devices(conn: sqlite3.Connection, tables: set[str], kernels: pd.DataFrame) -> list[Device]:
    found: dict[int, Device] = {}
    table = next((t for t in GPU_TABLES if t in tables), None)
    if table is not None:
        cols = columns(conn, table)
        id_col = first(cols, "id", "deviceId", "cuDevice")
        picks = {
            "name": first(cols, "name"),
            "sm": first(cols, "smCount", "numMultiprocessors"),
            "major": first(cols, "computeMajor", "computeCapabilityMajor"),
            "minor": first(cols, "computeMinor", "computeCapabilityMinor"),
            "memory": first(cols, "totalMemory"),
        }
        if id_col is not None:
            select = ", ".join([id_col] + [c if c else "NULL" for c in picks.values()])
            for dev_id, name, sm, major, minor, memory in conn.execute(f"SELECT {select} FROM {table}"):
                if dev_id is None or int(dev_id) in found:
                    continue
                found[int(dev_id)] = Device(
                    id=int(dev_id),
                    name=name,
                    sm_count=None if sm is None else int(sm),
                    compute_capability=None if major is None else f"{major}.{minor or 0}",
                    memory_bytes=None if memory is None else int(memory),
                )
    for dev_id in kernels["device_id"].dropna().unique():
        found.setdefault(int(dev_id), Device(id=int(dev_id)))
    return [found[k] for k in sorted(found)]


def _copy_kinds(conn: sqlite3.Connection, tables: set[str]) -> dict[int, str]:
    kinds = {k: f"memcpy {v}" for k, v in _COPY_KINDS.items()}
    kinds.update({k: f"unified memcpy {v}" for k, v in _UNIFIED_COPY_KINDS.items()})
    if MEMCPY_ENUM in tables and {"id", "name"} <= columns(conn, MEMCPY_ENUM):
        for enum_id, enum_name in conn.execute(f"SELECT id, name FROM {MEMCPY_ENUM}"):
            match = _ENUM_COPY.match(enum_name or "")
            if match:
                prefix = "unified memcpy" if match.group(1) else "memcpy"
                kinds[enum_id] = f"{prefix} {match.group(2)}to{match.group(3)}"
            elif enum_id not in kinds:
                kinds[enum_id] = f"memcpy {enum_name}"
    return kinds


def _memory(conn: sqlite3.Connection, tables: set[str]) -> pd.DataFrame:
    frames = []
    for table in (MEMCPY_TABLE, MEMSET_TABLE):
        if table not in tables:
            continue
        cols = columns(conn, table)
        if not {"start", "end"} <= cols:
            continue
        picks = [first(cols, c) or "NULL" for c in ("bytes", "deviceId", "streamId", "copyKind")]
        rows = conn.execute(f'SELECT start, "end" - start, {", ".join(picks)} FROM {table}').fetchall()
        frame = pd.DataFrame(rows, columns=["start_ns", "dur_ns", "bytes", "device_id", "stream_id", "copy_kind"])
        if table == MEMCPY_TABLE:
            kinds = _copy_kinds(conn, tables)
            frame["kind"] = [kinds.get(k, f"memcpy kind {k}") for k in frame["copy_kind"]]
        else:
            frame["kind"] = "memset"
        frames.append(frame)
    if not frames:
        return empty(MEMORY_DTYPES)
    return conform(pd.concat(frames, ignore_index=True), MEMORY_DTYPES)


def _nvtx(conn: sqlite3.Connection, tables: frozenset[str]) -> pd.DataFrame | None:
    rows = nvtx_range_rows(conn, tables)
    return None if rows is None else range_table(rows)


def _graph_launches(conn: sqlite3.Connection, tables: set[str]) -> int | None:
    """How many CUDA graphs the process launched in the capture; None when no API call was recorded.

    TensorFlow launches through the driver API (``cuGraphLaunch``), the runtime's users
    through ``cudaGraphLaunch``; nsys records both in one table, names versioned
    (``cudaGraphLaunch_v10000``). The API table has a row per call, a million for a million
    launches, so the few matching name ids are looked up first: a join would look a string up
    per call, and a trace without a graph launch needs no pass over the calls at all.
    """
    if API_TABLE not in tables or STRINGS_TABLE not in tables:
        return None
    like = " OR ".join("value LIKE ?" for _ in GRAPH_LAUNCH_CALLS)
    ids = [row[0] for row in conn.execute(f"SELECT id FROM {STRINGS_TABLE} WHERE {like}", GRAPH_LAUNCH_CALLS)]
    if not ids:
        return 0
    marks = ", ".join("?" * len(ids))
    (count,) = conn.execute(f"SELECT count(*) FROM {API_TABLE} WHERE nameId IN ({marks})", ids).fetchone()
    return int(count)
