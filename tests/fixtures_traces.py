"""Small traces written by test code, one per format variant the parsers must handle.

The nsys column lists are those of real exports: 2024.5 (schema 3.13) for ``new`` and the
2020-2021 generation (TARGET_INFO_CUDA_GPU, EXPORT_META_DATA, no ENUM tables) for ``old``.
Names are interned into StringIds with sparse, shuffled ids, as nsys does, so a parser
that confuses ids with row numbers fails.
"""

from __future__ import annotations

import csv
import io
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest

SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
"""Real traces of other people's GPU jobs, beside the repository and never in it."""


def under_ci() -> bool:
    """Whether the suite runs as CI runs it (``CI`` set, as CI services set it): every test must then run."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def require_real_traces(*paths: Path) -> None:
    """A test that reads ``paths`` from ``SHARED_TRACES`` ends here where one is missing: skipped with the reason on
    a developer's machine, failed under CI, where a missing folder would otherwise pass as some forty skips."""
    missing = [path for path in paths if not path.exists()]
    if not missing:
        return
    reason = f"real trace not present: {', '.join(map(str, missing))}"
    if under_ci():
        pytest.fail(f"{reason} (CI reads every real trace: put ../shared/traces beside the repository)", False)
    pytest.skip(reason)


def real_traces(*paths: Path) -> pytest.MarkDecorator:
    """Marks a test that reads ``paths``: ``require_real_traces`` before it runs (``conftest.py``)."""
    return pytest.mark.real_traces(*paths)


def present_real_traces(*paths: Path) -> list[Path]:
    """Those of ``paths`` that are here, for a test that reads what real traces it finds beside its own; under CI
    all of them (``require_real_traces``)."""
    if under_ci():
        require_real_traces(*paths)
    return [path for path in paths if path.exists()]


TEXT_COLUMNS = {"value", "name", "text", "busLocation", "uuid", "chipName", "label", "jsonText"}

KERNEL_COLUMNS = {
    "new": (
        "start",
        "end",
        "deviceId",
        "contextId",
        "greenContextId",
        "streamId",
        "correlationId",
        "globalPid",
        "demangledName",
        "shortName",
        "mangledName",
        "launchType",
        "cacheConfig",
        "registersPerThread",
        "gridX",
        "gridY",
        "gridZ",
        "blockX",
        "blockY",
        "blockZ",
        "staticSharedMemory",
        "dynamicSharedMemory",
        "localMemoryPerThread",
        "localMemoryTotal",
        "gridId",
        "sharedMemoryExecuted",
        "graphNodeId",
        "sharedMemoryLimitConfig",
    ),
    "old": (
        "start",
        "end",
        "deviceId",
        "contextId",
        "streamId",
        "correlationId",
        "globalPid",
        "demangledName",
        "shortName",
        "launchType",
        "cacheConfig",
        "registersPerThread",
        "gridX",
        "gridY",
        "gridZ",
        "blockX",
        "blockY",
        "blockZ",
        "staticSharedMemory",
        "dynamicSharedMemory",
        "localMemoryPerThread",
        "localMemoryTotal",
        "gridId",
        "sharedMemoryExecuted",
    ),
}
MEMCPY_COLUMNS = (
    "start",
    "end",
    "deviceId",
    "contextId",
    "streamId",
    "correlationId",
    "globalPid",
    "bytes",
    "copyKind",
    "deprecatedSrcId",
    "srcKind",
    "dstKind",
    "srcDeviceId",
    "srcContextId",
    "dstDeviceId",
    "dstContextId",
)
MEMSET_COLUMNS = (
    "start",
    "end",
    "deviceId",
    "contextId",
    "streamId",
    "correlationId",
    "globalPid",
    "value",
    "bytes",
    "memKind",
)
NVTX_COLUMNS = (
    "start",
    "end",
    "eventType",
    "rangeId",
    "category",
    "color",
    "text",
    "globalTid",
    "endGlobalTid",
    "textId",
    "domainId",
    "uint64Value",
    "int64Value",
    "doubleValue",
    "uint32Value",
    "int32Value",
    "floatValue",
    "jsonTextId",
    "jsonText",
)
GPU_TABLES = {
    "new": (
        "TARGET_INFO_GPU",
        (
            "vmId",
            "id",
            "name",
            "busLocation",
            "isDiscrete",
            "l2CacheSize",
            "totalMemory",
            "memoryBandwidth",
            "clockRate",
            "smCount",
            "pwGpuId",
            "uuid",
            "luid",
            "chipName",
            "cuDevice",
            "computeMajor",
            "computeMinor",
            "smMajor",
            "smMinor",
        ),
    ),
    "old": (
        "TARGET_INFO_CUDA_GPU",
        (
            "id",
            "name",
            "busLocation",
            "isDiscrete",
            "l2CacheSize",
            "totalMemory",
            "memoryBandwidth",
            "clockRate",
            "numMultiprocessors",
            "numThreadsPerWarp",
            "maxWarpsPerMultiprocessor",
            "coreClockRate",
            "maxIPC",
            "computeCapabilityMajor",
            "computeCapabilityMinor",
            "uuid",
        ),
    ),
}
META_TABLES = {"new": "META_DATA_EXPORT", "old": "EXPORT_META_DATA"}
# Id 42 is not a CUPTI value: only a parser that reads the ENUM table can name it.
MEMCPY_ENUM = (
    (0, "CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"),
    (1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
    (2, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"),
    (8, "CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"),
    (11, "CUDA_MEMCPY_KIND_UVM_HTOD", "Unified Host-to-Device"),
    (42, "CUDA_MEMCPY_KIND_HTOH", "Host-to-Host"),
)


@dataclass
class Kernel:
    name: str
    short: str
    start: int
    dur: int
    device: int = 0
    stream: int = 7
    correlation: int | None = None
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (128, 1, 1)


def a100(device_id: int, schema: str = "new") -> dict[str, object]:
    if schema == "new":
        return {
            "vmId": 0,
            "id": device_id,
            "name": "NVIDIA A100-SXM4-80GB",
            "smCount": 108,
            "computeMajor": 8,
            "computeMinor": 0,
            "totalMemory": 84_990_623_744,
            "cuDevice": device_id,
        }
    return {
        "id": device_id,
        "name": "Tesla V100-SXM2-16GB",
        "numMultiprocessors": 80,
        "computeCapabilityMajor": 7,
        "computeCapabilityMinor": 0,
        "totalMemory": 16_945_512_448,
    }


class _Strings:
    """StringIds with sparse ids handed out in a scrambled order."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {f"unrelated string {i}": 90_001 + 5 * i for i in range(20)}

    def id(self, value: str) -> int:
        return self.ids.setdefault(value, 50_000 - 17 * len(self.ids))


def _create(conn: sqlite3.Connection, table: str, columns: tuple[str, ...]) -> None:
    defs = ", ".join(f'"{c}" {"TEXT" if c in TEXT_COLUMNS else "INTEGER"}' for c in columns)
    conn.execute(f"CREATE TABLE {table} ({defs})")


def _insert(conn: sqlite3.Connection, table: str, columns: tuple[str, ...], rows: list[dict]) -> None:
    marks = ", ".join("?" * len(columns))
    conn.executemany(f"INSERT INTO {table} VALUES ({marks})", [tuple(row.get(c) for c in columns) for row in rows])


def write_nsys_sqlite(
    path: Path,
    kernels: list[Kernel],
    *,
    schema: str = "new",
    gpus: list[dict[str, object]] | None = None,
    memcpys: list[dict[str, object]] | None = None,
    memsets: list[dict[str, object]] | None = None,
    nvtx: list[dict[str, object]] | None = None,
    kernel_table: bool = True,
    drop_kernel_columns: tuple[str, ...] = (),
) -> Path:
    """An nsys export; ``None`` for an optional table means the export lacks it (lazy export).

    NVTX rows may give ``registered`` (a string to intern and reference by ``textId``)
    instead of ``text``.
    """
    strings = _Strings()
    with sqlite3.connect(path) as conn:
        _create(conn, META_TABLES[schema], ("name", "value"))
        conn.execute(
            f"INSERT INTO {META_TABLES[schema]} VALUES ('EXPORT_SCHEMA_VERSION', ?)",
            ("3.13.2" if schema == "new" else "2.5.0",),
        )
        if schema == "new":
            _create(conn, "ENUM_CUDA_MEMCPY_OPER", ("id", "name", "label"))
            conn.executemany("INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (?, ?, ?)", MEMCPY_ENUM)
        if kernel_table:
            columns = tuple(c for c in KERNEL_COLUMNS[schema] if c not in drop_kernel_columns)
            _create(conn, "CUPTI_ACTIVITY_KIND_KERNEL", columns)
            rows = [
                {
                    "start": k.start,
                    "end": k.start + k.dur,
                    "deviceId": k.device,
                    "contextId": 1,
                    "streamId": k.stream,
                    "correlationId": k.correlation,
                    "globalPid": 310028053512192,
                    "demangledName": strings.id(k.name),
                    "shortName": strings.id(k.short),
                    "registersPerThread": 32,
                    "gridX": k.grid[0],
                    "gridY": k.grid[1],
                    "gridZ": k.grid[2],
                    "blockX": k.block[0],
                    "blockY": k.block[1],
                    "blockZ": k.block[2],
                    "staticSharedMemory": 0,
                    "dynamicSharedMemory": 0,
                    "localMemoryPerThread": 0,
                    "localMemoryTotal": 0,
                    "gridId": i,
                }
                for i, k in enumerate(kernels)
            ]
            _insert(conn, "CUPTI_ACTIVITY_KIND_KERNEL", columns, rows)
        if gpus is not None:
            table, columns = GPU_TABLES[schema]
            _create(conn, table, columns)
            _insert(conn, table, columns, gpus)
        if memcpys is not None:
            _create(conn, "CUPTI_ACTIVITY_KIND_MEMCPY", MEMCPY_COLUMNS)
            _insert(conn, "CUPTI_ACTIVITY_KIND_MEMCPY", MEMCPY_COLUMNS, memcpys)
        if memsets is not None:
            _create(conn, "CUPTI_ACTIVITY_KIND_MEMSET", MEMSET_COLUMNS)
            _insert(conn, "CUPTI_ACTIVITY_KIND_MEMSET", MEMSET_COLUMNS, memsets)
        if nvtx is not None:
            rows = []
            for event in nvtx:
                row = dict(event)
                if "registered" in row:
                    row["textId"] = strings.id(str(row.pop("registered")))
                rows.append(row)
            _create(conn, "NVTX_EVENTS", NVTX_COLUMNS)
            _insert(conn, "NVTX_EVENTS", NVTX_COLUMNS, rows)
        _create(conn, "StringIds", ("id", "value"))
        conn.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, v) for v, i in strings.ids.items()])
    conn.close()
    return path


NVPROF_TRACE_HEADER = (
    "Start",
    "Duration",
    "Grid X",
    "Grid Y",
    "Grid Z",
    "Block X",
    "Block Y",
    "Block Z",
    "Registers Per Thread",
    "Static SMem",
    "Dynamic SMem",
    "Size",
    "Throughput",
    "SrcMemType",
    "DstMemType",
    "Device",
    "Context",
    "Stream",
    "Unified Memory",
    "Virtual Address",
    "Name",
    "Correlation_ID",
)
NVPROF_SUMMARY_HEADER = ("Type", "Time(%)", "Time", "Calls", "Avg", "Min", "Max", "Name")


def nvprof_section(pid: int, header: tuple[str, ...], units: dict[str, str], rows: list[dict[str, object]]) -> str:
    """One nvprof ``--csv`` section: its ==PID== lines, header, units row and rows."""
    out = io.StringIO()
    out.write(f"=={pid}== NVPROF is profiling process {pid}, command: ./train --steps 3\n")
    out.write(f"=={pid}== Profiling application: ./train --steps 3\n")
    out.write(f"=={pid}== Profiling result:\n")
    out.write(",".join(f'"{h}"' for h in header) + "\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([units.get(h, "") for h in header])
    for row in rows:
        writer.writerow([row.get(h, "") for h in header])
    return out.getvalue()
