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
