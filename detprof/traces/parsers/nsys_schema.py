"""The nsys SQLite export's tables and columns, as detprof reads them, and the launches' read in progress.

The export schema drifts between Nsight Systems releases and tables are created lazily
(a run without memcpys has no MEMCPY table), so every table and column is looked up by
name and anything optional may be absent. Both halves of the parser use these names: the
one that starts reading the launches before pandas is imported (``nsys_sqlite``) and the
one that builds the tables (``nsys_sqlite_tables``).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from detprof.traces.parsers.sqlite_columns import ColumnRead, RowRanges

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

KERNEL_INT_COLUMNS = {
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
"""KernelTable column <- export column; names are stored as StringIds ids."""

EAGER_KERNEL_COLUMNS = ("name", "short_name", "dur_ns", "device_id")
"""The launch columns read with the file: a top-N table's and the device list's. The rest
(start times, stream, grid, ...) are read on first use of ``KernelTable.kernels``: SQLite's
cost is per value read."""


def nvtx_range_rows(conn: sqlite3.Connection, tables: frozenset[str], *extra: str) -> list[tuple[object, ...]] | None:
    """The NVTX ranges that ended, push/pop and start/end alike, as ``(text, start, end, *extra)`` in start order
    (a registered string's text from ``StringIds``); None where the export has no NVTX table, or one without
    ``extra`` (rows where an ``extra`` column is null are left out)."""
    if NVTX_TABLE not in tables:
        return None
    cols = columns(conn, NVTX_TABLE)
    if not {"start", "end", "eventType", *extra} <= cols:
        return None
    text = "e.text" if "text" in cols else "NULL"
    join = ""
    if "textId" in cols and STRINGS_TABLE in tables:
        text = f"COALESCE({text}, s.value)"
        join = f"LEFT JOIN {STRINGS_TABLE} AS s ON s.id = e.textId"
    types = ", ".join(str(t) for t in NVTX_RANGE_EVENT_TYPES)
    picked = "".join(f", e.{column}" for column in extra)
    present = "".join(f" AND e.{column} IS NOT NULL" for column in extra)
    return conn.execute(
        f'SELECT {text}, e.start, e."end"{picked} FROM {NVTX_TABLE} AS e {join} '
        f'WHERE e.eventType IN ({types}) AND e."end" IS NOT NULL{present} ORDER BY e.start'
    ).fetchall()


def columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def first(present: set[str], *candidates: str) -> str | None:
    """The first of ``candidates`` (one column's names across releases) that the table has."""
    return next((c for c in candidates if c in present), None)


@dataclass(frozen=True)
class LaunchRead:
    """The kernel table's launches: every column there is to read, and the eager ones being read."""

    uri: str
    tables: frozenset[str]
    select: dict[str, str]
    """KernelTable column -> SQL expression, for every launch column the file has."""
    rows: RowRanges
    eager: ColumnRead
    """Reading the columns a top-N table needs (all of ``select`` when nothing is deferred)."""
    defer: bool

    @property
    def later(self) -> dict[str, str]:
        """The columns left for ``KernelTable.kernels`` to read on first use."""
        return {dst: src for dst, src in self.select.items() if self.defer and dst not in EAGER_KERNEL_COLUMNS}
