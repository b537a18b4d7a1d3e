"""nsys SQLite exports (``nsys export --type sqlite``) -> KernelTable.

The export schema drifts between Nsight Systems releases and tables are created lazily
(a run without memcpys has no MEMCPY table), so every table and column is looked up by
name and anything optional may be absent.

Kernel launches are the bulk of a file (millions in a long run) and must load within a
time and memory budget (1M launches to a top-N table: <= 0.5 s, < 500 MB; the benchmark
``benchmarks/bench_nsys_parse.py`` checks it). So they are read with
the ADBC SQLite driver as Arrow batches, by parallel threads over rowid ranges (the driver
releases the GIL), streamed into preallocated numpy arrays; the integer name ids become
pandas Categoricals whose categories are only the strings used. No Python object is
created per launch. SQLite's cost is per value read, so only the columns a top-N table and
the device list need are read at once; the rest (start times, stream, grid, ...) are read on
first use of ``KernelTable.kernels``. The small tables (devices, memory, NVTX) go through the
standard library.
"""

from __future__ import annotations

import itertools
import os
import re
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from detprof.errors import InputError, first_line
from detprof.traces.kernel_table import (
    KERNEL_DTYPES,
    MEMORY_DTYPES,
    UNNAMED,
    Completion,
    Device,
    KernelTable,
    conform,
    empty,
    range_table,
)

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
NVTX_TABLE = "NVTX_EVENTS"
STRINGS_TABLE = "StringIds"
API_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
"""Runtime and driver API calls alike (``cudaLaunchKernel_v7000``, ``cuModuleGetLoadingMode``)."""
GRAPH_LAUNCH_CALLS = ("cudaGraphLaunch%", "cuGraphLaunch%")
GPU_TABLES = ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU")
MEMCPY_ENUM = "ENUM_CUDA_MEMCPY_OPER"

NVTX_RANGE_EVENT_TYPES = (59, 60)

# KernelTable column <- export column; names are stored as StringIds ids.
_KERNEL_INT_COLUMNS = {
    "device_id": "deviceId",
    "stream_id": "streamId",
    "correlation_id": "correlationId",
    "grid_x": "gridX",
    "grid_y": "gridY",
    "grid_z": "gridZ",
    "block_x": "blockX",
    "block_y": "blockY",
    "block_z": "blockZ",
    "graph_node_id": "graphNodeId",
}

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

# Row count below which one reader thread is as fast as several.
_PARALLEL_MIN_ROWS = 200_000
_MAX_READERS = 8
_ADBC_BATCH_ROWS = "65536"
_STRING_LOOKUP_CHUNK = 500
_EAGER_DTYPES = {c: KERNEL_DTYPES[c] for c in ("name", "short_name", "dur_ns", "device_id")}
"""The launch columns read with the file: a top-N table's and the device list's."""


def reader_cpus() -> int:
    """Cores this process may read on (its affinity mask, not the host's total)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def load_nsys_sqlite(path: Path, source: str | None = None) -> KernelTable:
    """Read an export; ``source`` names the file the user gave when it was converted first.

    A converted export lives in a temporary folder that is gone once this returns, so all
    its columns are read now; the user's own file stays, and the columns that only
    ``KernelTable.kernels`` needs are read on its first use.
    """
    shown = source or str(path)
    _check_not_truncated(path, shown)
    uri = "file:" + quote(str(path.resolve())) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise InputError(f"{shown}: cannot open SQLite file ({exc})") from None
    try:
        return _load(conn, uri, shown, defer=source is None)
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{shown}: corrupt or unreadable SQLite file ({exc})") from None
    finally:
        conn.close()


def _check_not_truncated(path: Path, shown: str) -> None:
    """Catch a cut-off copy up front: SQLite itself may only notice on the missing pages.

    The header records the page size and, when its version-valid-for counter matches
    the change counter, the database size in pages; a shorter file lost its tail.
    """
    with path.open("rb") as fh:
        header = fh.read(100)
    if len(header) < 100:
        raise InputError(f"{shown}: truncated SQLite file ({len(header)} bytes, shorter than its header)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if header[24:28] == header[92:96] and pages:
        expected = page_size * pages
        actual = path.stat().st_size
        if actual < expected:
            raise InputError(f"{shown}: truncated SQLite file ({actual} bytes, its header says {expected})")


def _load(conn: sqlite3.Connection, uri: str, shown: str, *, defer: bool) -> KernelTable:
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if KERNEL_TABLE not in tables:
        raise InputError(
            f"{shown}: no CUDA kernels in this nsys export (no {KERNEL_TABLE} table; "
            "was the profile taken with `-t cuda`?)"
        )
    if STRINGS_TABLE not in tables:
        raise InputError(f"{shown}: nsys export without a {STRINGS_TABLE} table; kernel names are unreadable")
    kernels, rest = _kernels(conn, uri, shown, defer=defer)
    if kernels.empty:
        raise InputError(f"{shown}: empty trace: {KERNEL_TABLE} has no rows")
    table = KernelTable(
        source=shown,
        format="nsys-sqlite",
        kernels=kernels,
        memory=_memory(conn, tables),
        devices=_devices(conn, tables, kernels),
        nvtx=_nvtx(conn, tables),
        graph_launches=_graph_launches(conn, tables),
    )
    return table if rest is None else table.defer_columns(rest)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


@dataclass
class _IntColumn:
    values: np.ndarray
    null: np.ndarray


def _kernels(conn: sqlite3.Connection, uri: str, shown: str, *, defer: bool) -> tuple[pd.DataFrame, Completion | None]:
    """The launches, and with ``defer`` what completes them with the columns left unread."""
    cols = _columns(conn, KERNEL_TABLE)
    if not {"start", "end"} <= cols:
        raise InputError(f"{shown}: {KERNEL_TABLE} lacks start/end columns")
    name_col = "demangledName" if "demangledName" in cols else "shortName"
    if name_col not in cols:
        raise InputError(f"{shown}: {KERNEL_TABLE} has neither demangledName nor shortName")
    select = {"start_ns": "start", "dur_ns": '"end" - start', "name": name_col}
    if "shortName" in cols:
        select["short_name"] = "shortName"
    select.update({dst: src for dst, src in _KERNEL_INT_COLUMNS.items() if src in cols})
    rows = _row_ranges(conn, KERNEL_TABLE)
    now = {dst: src for dst, src in select.items() if dst in _EAGER_DTYPES or not defer}
    data = _read_int_columns(uri, KERNEL_TABLE, now, rows, shown)
    if data["dur_ns"].null.any():  # "end" - start is null where either is
        raise InputError(f"{shown}: {KERNEL_TABLE} has kernels without start or end time")
    names = {field: _names(conn, data.pop(field)) for field in ("name", "short_name") if field in data}
    frame = pd.DataFrame({**names, **_int_arrays(data)}, copy=False)
    if "short_name" not in frame.columns:
        frame["short_name"] = frame["name"]
    if not defer:
        return conform(frame, KERNEL_DTYPES), None
    later = {dst: src for dst, src in select.items() if dst not in now}

    def complete(kernels: pd.DataFrame) -> pd.DataFrame:
        rest = _int_arrays(_read_int_columns(uri, KERNEL_TABLE, later, rows, shown))
        return conform(kernels.assign(**rest), KERNEL_DTYPES)

    return conform(frame, _EAGER_DTYPES), complete


def _int_arrays(data: dict[str, _IntColumn]) -> dict[str, object]:
    """Integer columns as KernelTable columns: times as plain int64 (never null: checked on
    ``"end" - start``), the others nullable."""
    return {
        field: column.values if field in ("start_ns", "dur_ns") else pd.arrays.IntegerArray(column.values, column.null)
        for field, column in data.items()
    }


@dataclass(frozen=True)
class _RowRanges:
    """Rowid ranges ``[start, stop)`` of a table, one per reader, and where each one's rows go."""

    bounds: list[tuple[int, int]]
    offsets: list[int]


def _row_ranges(conn: sqlite3.Connection, table: str) -> _RowRanges:
    """Split a table into one rowid range per reader, counting each range's rows.

    nsys writes rowids without gaps; then the ranges' widths are their counts and one
    ``count(*)``, which SQLite answers from the b-tree without reading rows, confirms it.
    min and max are asked apart: SQLite looks either one up in the b-tree only when it is
    the query's one aggregate, and scans the whole table for both at once.
    """
    lo, hi = conn.execute(f"SELECT (SELECT min(rowid) FROM {table}), (SELECT max(rowid) FROM {table})").fetchone()
    if lo is None:
        return _RowRanges([], [0])
    readers = max(1, min(reader_cpus(), _MAX_READERS, (hi - lo + 1) // _PARALLEL_MIN_ROWS))
    edges = np.linspace(lo, hi + 1, readers + 1).astype(np.int64)
    bounds = [(int(a), int(b)) for a, b in itertools.pairwise(edges)]
    (total,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    if total == hi - lo + 1:
        counts = [b - a for a, b in bounds]
    else:
        query = f"SELECT count(*) FROM {table} WHERE rowid >= ? AND rowid < ?"
        counts = [conn.execute(query, b).fetchone()[0] for b in bounds]
    return _RowRanges(bounds, [0, *itertools.accumulate(counts)])


def _read_int_columns(
    uri: str, table: str, select: dict[str, str], rows: _RowRanges, shown: str
) -> dict[str, _IntColumn]:
    """Integer expressions over the rows of ``table`` in ``rows``, read by parallel readers.

    Each reader streams its range batch by batch into its slice of preallocated arrays,
    so peak memory is the result plus a few batches, however many rows there are. A range
    that no longer holds the rows counted for it means the file changed since, and then
    rows read at different times would not line up.
    """
    # The driver's own API, not its DB-API module: that one imports pyarrow.dataset, tens of
    # milliseconds of every `detprof parse`.
    import adbc_driver_manager
    import adbc_driver_sqlite

    bounds, offsets = rows.bounds, rows.offsets
    out = {name: _IntColumn(np.zeros(offsets[-1], np.int64), np.zeros(offsets[-1], bool)) for name in select}
    exprs = ", ".join(f"{expr} AS {name}" for name, expr in select.items())
    query = f"SELECT {exprs} FROM {table} WHERE rowid >= {{}} AND rowid < {{}}"

    def read(part: int) -> None:
        at, stop = offsets[part], offsets[part + 1]
        with (
            adbc_driver_sqlite.connect(uri) as database,
            adbc_driver_manager.AdbcConnection(database) as connection,
            adbc_driver_manager.AdbcStatement(connection) as statement,
        ):
            statement.set_options(**{"adbc.sqlite.query.batch_rows": _ADBC_BATCH_ROWS})
            statement.set_sql_query(query.format(*bounds[part]))
            stream, _rows = statement.execute_query()
            for batch in pa.RecordBatchReader.from_stream(stream):
                n = batch.num_rows
                if at + n > stop:
                    break
                for name, column in zip(batch.schema.names, batch.columns, strict=True):
                    _store(out[name], slice(at, at + n), column, f"{shown}: {table}.{select[name]}")
                at += n
        if at != stop:
            raise InputError(f"{shown}: {table} changed while it was being read")

    try:
        with ThreadPoolExecutor(max(1, len(bounds))) as pool:
            list(pool.map(read, range(len(bounds))))
    except (adbc_driver_manager.Error, OSError, pa.ArrowException) as exc:
        raise InputError(f"{shown}: cannot read {table} ({first_line(exc)})") from None
    return out


def _store(target: _IntColumn, rows: slice, column: pa.Array, where: str) -> None:
    if pa.types.is_null(column.type):
        target.null[rows] = True
        return
    if not pa.types.is_integer(column.type):
        raise InputError(f"{where} holds {column.type} values where integers belong")
    if column.null_count:
        target.null[rows] = column.is_null().to_numpy(zero_copy_only=False)
        column = pc.fill_null(column, 0)
    target.values[rows] = column.to_numpy(zero_copy_only=False)


def _names(conn: sqlite3.Connection, ids: _IntColumn) -> pd.Categorical:
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


def _first(columns: set[str], *candidates: str) -> str | None:
    return next((c for c in candidates if c in columns), None)


def _devices(conn: sqlite3.Connection, tables: set[str], kernels: pd.DataFrame) -> list[Device]:
    found: dict[int, Device] = {}
    table = next((t for t in GPU_TABLES if t in tables), None)
    if table is not None:
        cols = _columns(conn, table)
        id_col = _first(cols, "id", "deviceId", "cuDevice")
        picks = {
            "name": _first(cols, "name"),
            "sm": _first(cols, "smCount", "numMultiprocessors"),
            "major": _first(cols, "computeMajor", "computeCapabilityMajor"),
            "minor": _first(cols, "computeMinor", "computeCapabilityMinor"),
            "memory": _first(cols, "totalMemory"),
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
    if MEMCPY_ENUM in tables and {"id", "name"} <= _columns(conn, MEMCPY_ENUM):
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
        cols = _columns(conn, table)
        if not {"start", "end"} <= cols:
            continue
        picks = [_first(cols, c) or "NULL" for c in ("bytes", "deviceId", "streamId", "copyKind")]
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


def _nvtx(conn: sqlite3.Connection, tables: set[str]) -> pd.DataFrame | None:
    if NVTX_TABLE not in tables:
        return None
    cols = _columns(conn, NVTX_TABLE)
    if not {"start", "end", "eventType"} <= cols:
        return None
    text = "e.text" if "text" in cols else "NULL"
    join = ""
    if "textId" in cols and STRINGS_TABLE in tables:
        text = f"COALESCE({text}, s.value)"
        join = f"LEFT JOIN {STRINGS_TABLE} AS s ON s.id = e.textId"
    types = ", ".join(str(t) for t in NVTX_RANGE_EVENT_TYPES)
    rows = conn.execute(
        f'SELECT {text}, e.start, e."end" FROM {NVTX_TABLE} AS e {join} '
        f'WHERE e.eventType IN ({types}) AND e."end" IS NOT NULL ORDER BY e.start'
    ).fetchall()
    return range_table(rows)


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
